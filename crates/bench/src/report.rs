//! The reproduction report: `dmkit sim reproduce --all --report DIR`.
//!
//! One self-contained HTML page (`DIR/index.html`, every figure inline as
//! SVG, no file or network beside it needed) and the same as Markdown
//! (`DIR/report.md`, its figures in `DIR/figures/`), with, for every figure
//! run: the plot beside the paper's numbers, the ratio reproduced/paper per
//! point, whether it is inside the band (±30 % by default, what the README
//! quotes for `smart-fig7`), the device profile, seed, wall time, and the
//! command that reruns the figure alone. Each figure's JSON is written to
//! `DIR/json/`. A figure that failed has a section saying why.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::harness::Provenance;
use crate::sim_repro::Figure;

/// One figure of the report: what ran and how to rerun it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The figure's name, e.g. `smart-fig3a`.
    pub name: String,
    /// The reproduced figure, or why it failed.
    pub outcome: Result<Figure, String>,
    /// The command that reruns this figure alone.
    pub command: String,
}

/// What the report says about the whole run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Quick figures (fewer points, shorter windows): ratios check that the
    /// model runs, they are not a reproduction; the report says so.
    pub quick: bool,
    /// A point is in band when |reproduced − paper| ≤ band × |paper|.
    pub band: f64,
    /// The command line of the whole run.
    pub command: String,
}

/// Where a point falls against the paper.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// The paper states no value here.
    NoPaper,
    /// Within the band.
    In(f64),
    /// Outside the band.
    Out(f64),
}

/// Ratio reproduced/paper and the band's verdict for one point.
pub fn verdict(value: f64, published: Option<f64>, band: f64) -> Verdict {
    match published {
        None => Verdict::NoPaper,
        Some(p) => {
            let ratio = if p == 0.0 {
                if value == 0.0 {
                    1.0
                } else {
                    f64::INFINITY
                }
            } else {
                value / p
            };
            if (value - p).abs() <= band * p.abs() {
                Verdict::In(ratio)
            } else {
                Verdict::Out(ratio)
            }
        }
    }
}

/// Points with a paper value, and how many of them are in band.
pub fn score(f: &Figure, band: f64) -> (usize, usize) {
    f.rows.iter().fold((0, 0), |(n, k), r| {
        match verdict(r.value, r.published, band) {
            Verdict::NoPaper => (n, k),
            Verdict::In(_) => (n + 1, k + 1),
            Verdict::Out(_) => (n + 1, k),
        }
    })
}

/// The points of `f` outside the band, each as `series at x: ratio`.
pub fn out_of_band(f: &Figure, band: f64) -> Vec<String> {
    f.rows
        .iter()
        .filter_map(|r| match verdict(r.value, r.published, band) {
            Verdict::Out(ratio) => Some(format!("{} at {}: {ratio:.2}", r.series, num(r.x))),
            _ => None,
        })
        .collect()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn num(v: f64) -> String {
    if v == 0.0 || (1e-3..1e6).contains(&v.abs()) {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.3e}")
    }
}

fn ratio_text(v: Verdict) -> (String, &'static str) {
    match v {
        Verdict::NoPaper => ("–".into(), ""),
        Verdict::In(r) => (format!("{r:.2}"), "in"),
        Verdict::Out(r) => (format!("{r:.2}"), "out"),
    }
}

/// Writes `DIR/index.html`, `DIR/report.md`, `DIR/figures/NAME.svg` and
/// `DIR/json/NAME.json`; returns the HTML page's path.
pub fn write(dir: &Path, entries: &[Entry], o: &Options) -> Result<PathBuf, String> {
    let io = |p: &Path, e: std::io::Error| format!("writing {}: {e}", p.display());
    for sub in ["figures", "json"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(|e| io(&d, e))?;
    }
    let prov = Provenance::new(
        0,
        std::time::Duration::ZERO,
        std::time::Duration::ZERO,
        o.quick,
    );
    let band_pct = o.band * 100.0;
    let mut html = String::new();
    let mut md = String::new();
    let title = "dmkit: reproduced figures";
    let _ = write!(
        html,
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: "DejaVu Sans", Verdana, sans-serif; margin: 2em; color: #222; max-width: 1800px; }}
h1 {{ font-size: 1.6em; }} h2 {{ font-size: 1.3em; margin-top: 2em; border-top: 1px solid #ccc; padding-top: 1em; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
th {{ background: #f0f0f0; }} td.s {{ text-align: left; }}
td.in {{ background: #d9f2d9; }} td.out {{ background: #f8d0d0; }}
.fig {{ display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }}
.fig svg {{ max-width: 100%; height: auto; }}
.rows {{ max-height: 700px; overflow-y: auto; }}
pre {{ background: #f6f6f6; padding: 0.5em; white-space: pre-wrap; }}
.warn {{ background: #fff3cd; padding: 0.5em 1em; border: 1px solid #e0c36c; }}
.err {{ background: #f8d0d0; padding: 0.5em 1em; }}
</style>
</head>
<body>
<h1>{title}</h1>
"#
    );
    let _ = writeln!(md, "# {title}\n");
    let meta = format!(
        "dmkit {} (commit {}), {} ({} cores), {}; band: a point is in band when within ±{band_pct:.0} % of the paper's value.",
        prov.version, prov.commit, prov.host.cpu_model, prov.host.cores, prov.host.os
    );
    let _ = writeln!(html, "<p>{}</p>", esc(&meta));
    let _ = writeln!(html, "<p>Run as: <code>{}</code></p>", esc(&o.command));
    let _ = writeln!(md, "{meta}\n\nRun as: `{}`\n", o.command);
    if o.quick {
        let w = "Quick run: fewer points and shorter windows than the paper's. The ratios check that each model runs; they are not a reproduction (rerun without --quick for that).";
        let _ = writeln!(html, r#"<p class="warn">{w}</p>"#);
        let _ = writeln!(md, "> **{w}**\n");
    }
    // Summary.
    let _ = writeln!(
        html,
        "<h2>Summary</h2>\n<table>\n<tr><th>figure</th><th>profile</th><th>points with a paper value</th><th>in band</th><th>out of band</th><th>wall time (s)</th></tr>"
    );
    let _ = writeln!(
        md,
        "## Summary\n\n| figure | profile | points with a paper value | in band | out of band | wall time (s) |\n|---|---|---:|---:|---:|---:|"
    );
    for e in entries {
        match &e.outcome {
            Ok(f) => {
                let (n, k) = score(f, o.band);
                let _ = writeln!(
                    html,
                    "<tr><td class=\"s\"><a href=\"#{n0}\">{n0}</a></td><td class=\"s\">{}</td><td>{n}</td><td>{k}</td><td>{}</td><td>{:.1}</td></tr>",
                    esc(&f.profile),
                    n - k,
                    f.wall_seconds,
                    n0 = esc(&e.name)
                );
                let _ = writeln!(
                    md,
                    "| [{0}](#{0}) | {1} | {n} | {k} | {2} | {3:.1} |",
                    e.name,
                    f.profile,
                    n - k,
                    f.wall_seconds
                );
            }
            Err(err) => {
                let _ = writeln!(
                    html,
                    "<tr><td class=\"s\"><a href=\"#{n0}\">{n0}</a></td><td class=\"s err\" colspan=\"5\">failed: {}</td></tr>",
                    esc(err),
                    n0 = esc(&e.name)
                );
                let _ = writeln!(md, "| [{0}](#{0}) | failed: {1} | | | | |", e.name, err);
            }
        }
    }
    let _ = writeln!(html, "</table>");
    let _ = writeln!(md);
    // The check of every figure against the band: which points fall out,
    // and by how much (the table a note quotes).
    let run = if o.quick { "quick" } else { "full" };
    let _ = writeln!(
        html,
        "<h2 id=\"band\">Points in and out of band</h2>\n<table>\n<tr><th>figure</th><th>run</th><th>in band / with a paper value</th><th>out of band (series at x: reproduced/paper)</th></tr>"
    );
    let _ = writeln!(
        md,
        "## Points in and out of band\n\n| figure | run | in band / with a paper value | out of band (series at x: reproduced/paper) |\n|---|---|---:|---|"
    );
    for e in entries {
        let Ok(f) = &e.outcome else { continue };
        let (n, k) = score(f, o.band);
        let out = out_of_band(f, o.band);
        let _ = writeln!(
            html,
            "<tr><td class=\"s\">{}</td><td class=\"s\">{run}</td><td>{k} / {n}</td><td class=\"s\">{}</td></tr>",
            esc(&e.name),
            esc(&out.join("; "))
        );
        let _ = writeln!(
            md,
            "| {} | {run} | {k} / {n} | {} |",
            e.name,
            out.join("; ").replace('|', "\\|")
        );
    }
    let _ = writeln!(html, "</table>");
    let _ = writeln!(md);
    // One section per figure.
    for e in entries {
        let _ = writeln!(html, "<section id=\"{0}\">\n<h2>{0}</h2>", esc(&e.name));
        let _ = writeln!(md, "## {}\n", e.name);
        let f = match &e.outcome {
            Ok(f) => f,
            Err(err) => {
                let _ = writeln!(html, "<p class=\"err\">failed: {}</p>", esc(err));
                let _ = writeln!(
                    html,
                    "<p>Rerun:</p><pre>{}</pre>\n</section>",
                    esc(&e.command)
                );
                let _ = writeln!(md, "Failed: {err}\n\nRerun: `{}`\n", e.command);
                continue;
            }
        };
        let (n, k) = score(f, o.band);
        let info = format!(
            "Profile {}, seed {}, {} job{}: {:.1} s wall, {:.1} core-seconds. x: {}. {k} of {n} points with a paper value in band.",
            f.profile,
            f.seed,
            f.jobs,
            if f.jobs == 1 { "" } else { "s" },
            f.wall_seconds,
            f.core_seconds,
            f.x_label
        );
        let _ = writeln!(html, "<p>{}</p>", esc(&info));
        let _ = writeln!(html, "<p>Rerun:</p><pre>{}</pre>", esc(&e.command));
        let _ = writeln!(md, "{info}\n\nRerun: `{}`\n", e.command);
        let svg = crate::plot::svg(&crate::sim_repro::chart(f, o.quick));
        let svg_path = dir.join("figures").join(format!("{}.svg", e.name));
        std::fs::write(&svg_path, &svg).map_err(|err| io(&svg_path, err))?;
        let json_path = dir.join("json").join(format!("{}.json", e.name));
        let json = serde_json::to_string_pretty(f).map_err(|err| err.to_string())?;
        std::fs::write(&json_path, json + "\n").map_err(|err| io(&json_path, err))?;
        // Inline SVGs share the page's ids: make each figure's its own.
        let inline = svg
            .replace("id=\"clip", &format!("id=\"{}-clip", e.name))
            .replace("url(#clip", &format!("url(#{}-clip", e.name));
        let _ = writeln!(html, "<div class=\"fig\">\n<div>{inline}</div>");
        let _ = writeln!(
            md,
            "![{0}](figures/{0}.svg)\n\n| series | x | unit | reproduced | paper | ratio | band |\n|---|---:|---|---:|---:|---:|---|",
            e.name
        );
        let _ = writeln!(
            html,
            "<div class=\"rows\"><table>\n<tr><th>series</th><th>x</th><th>unit</th><th>reproduced</th><th>paper</th><th>ratio</th><th>band</th></tr>"
        );
        for r in &f.rows {
            let v = verdict(r.value, r.published, o.band);
            let (ratio, class) = ratio_text(v);
            let paper = r.published.map_or("–".into(), num);
            let mark = match v {
                Verdict::NoPaper => "",
                Verdict::In(_) => "in",
                Verdict::Out(_) => "out",
            };
            let _ = writeln!(
                html,
                "<tr><td class=\"s\">{}</td><td>{}</td><td class=\"s\">{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{ratio}</td><td class=\"{class}\">{mark}</td></tr>",
                esc(&r.series),
                num(r.x),
                esc(&r.unit),
                num(r.value),
                paper
            );
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.series.replace('|', "\\|"),
                num(r.x),
                r.unit,
                num(r.value),
                paper,
                ratio,
                if mark == "out" { "**out**" } else { mark }
            );
        }
        let _ = writeln!(html, "</table></div>\n</div>\n</section>");
        let _ = writeln!(md);
    }
    let _ = writeln!(html, "</body>\n</html>");
    let html_path = dir.join("index.html");
    std::fs::write(&html_path, html).map_err(|e| io(&html_path, e))?;
    let md_path = dir.join("report.md");
    std::fs::write(&md_path, md).map_err(|e| io(&md_path, e))?;
    Ok(html_path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim_repro::{self, ReproOptions};

    #[test]
    fn verdicts_follow_the_band() {
        assert_eq!(verdict(1.0, None, 0.3), Verdict::NoPaper);
        assert_eq!(verdict(1.2, Some(1.0), 0.3), Verdict::In(1.2));
        assert_eq!(verdict(0.5, Some(1.0), 0.3), Verdict::Out(0.5));
        assert_eq!(verdict(0.0, Some(0.0), 0.3), Verdict::In(1.0));
        assert!(matches!(verdict(1.0, Some(0.0), 0.3), Verdict::Out(_)));
    }

    /// Two quick figures into a temporary directory: one section each with
    /// its plot and table, ratios where the paper has values, a summary,
    /// a failed figure reported as such, and a Markdown twin.
    #[test]
    fn report_of_two_quick_figures() {
        let opts = ReproOptions {
            quick: true,
            jobs: 2,
            ..ReproOptions::default()
        };
        let mut entries: Vec<Entry> = ["smart-fig3a", "smart-fig4a"]
            .iter()
            .map(|n| Entry {
                name: n.to_string(),
                outcome: sim_repro::reproduce(n, &opts, &|_, _| {}).map_err(|e| e.to_string()),
                command: format!("dmkit sim reproduce {n} --quick"),
            })
            .collect();
        entries.push(Entry {
            name: "no-such-fig".into(),
            outcome: Err("unknown figure".into()),
            command: "dmkit sim reproduce no-such-fig --quick".into(),
        });
        let dir = std::env::temp_dir().join(format!("dmkit-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let html_path = write(
            &dir,
            &entries,
            &Options {
                quick: true,
                band: 0.3,
                command: "dmkit sim reproduce --all --quick --report x".into(),
            },
        )
        .unwrap();
        let html = std::fs::read_to_string(&html_path).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.trim_end().ends_with("</html>"));
        for tag in ["html", "body", "table", "section", "svg"] {
            assert_eq!(
                html.matches(&format!("<{tag}")).count(),
                html.matches(&format!("</{tag}>")).count(),
                "<{tag}> balanced"
            );
        }
        assert_eq!(
            html.matches("<section id=").count(),
            3,
            "one section per figure"
        );
        assert_eq!(
            html.matches("<svg").count(),
            2,
            "one inline plot per figure run"
        );
        assert!(html.contains("Quick run"));
        assert!(html.contains("failed: unknown figure"));
        assert!(html.contains("dmkit sim reproduce smart-fig4a --quick"));
        // smart-fig4a states paper values: each gets a ratio and a verdict.
        let fig4a = entries[1].outcome.as_ref().unwrap();
        let (n, k) = score(fig4a, 0.3);
        assert!(n > 0);
        let marked = html.matches("<td class=\"in\">in</td>").count()
            + html.matches("<td class=\"out\">out</td>").count();
        let (n3, _) = score(entries[0].outcome.as_ref().unwrap(), 0.3);
        assert_eq!(marked, n + n3, "every paper point marked in or out");
        let first = fig4a.rows.iter().find(|r| r.published.is_some()).unwrap();
        let ratio = format!("{:.2}", first.value / first.published.unwrap());
        assert!(
            html.contains(&format!(">{ratio}</td>")),
            "ratio {ratio} shown"
        );
        assert!(html.contains(&format!("<td>{k}</td>")));
        // Inline figures do not share clip-path ids.
        assert!(html.contains("id=\"smart-fig3a-clip") && html.contains("id=\"smart-fig4a-clip"));
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert_eq!(
            md.matches("\n## ").count(),
            5,
            "summary, the band's table and three figures"
        );
        // The band's table: every figure run, its score, and each point
        // out of band with its ratio.
        for (e, name) in entries.iter().zip(["smart-fig3a", "smart-fig4a"]) {
            let f = e.outcome.as_ref().unwrap();
            let (n, k) = score(f, 0.3);
            let line = md
                .lines()
                .find(|l| l.starts_with(&format!("| {name} | quick | ")))
                .unwrap_or_else(|| panic!("no band row for {name}"));
            assert!(line.contains(&format!("| {k} / {n} |")), "{line}");
            for p in out_of_band(f, 0.3) {
                assert!(line.contains(&p), "{line} lacks {p}");
            }
        }
        // A point moved out of the band is listed with its ratio.
        let mut moved = entries[1].outcome.clone().unwrap();
        let i = moved
            .rows
            .iter()
            .position(|r| r.published.is_some())
            .unwrap();
        moved.rows[i].published = Some(2.0 * moved.rows[i].value);
        let out = out_of_band(&moved, 0.3);
        assert_eq!(out.len(), out_of_band(fig4a, 0.3).len() + 1, "{out:?}");
        assert!(out
            .iter()
            .any(|p| p.starts_with(&moved.rows[i].series) && p.ends_with(": 0.50")));
        assert!(md.contains("![smart-fig4a](figures/smart-fig4a.svg)"));
        assert!(dir.join("figures/smart-fig4a.svg").exists());
        let j: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("json/smart-fig3a.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(j["figure"], "smart-fig3a");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

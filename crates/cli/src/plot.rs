//! `dmkit plot`: plot the JSON files dmkit writes — any benchmark's results
//! (`bench ycsb`, `micro`, `txn`, `corm`, `vector-io`, `app`, sweeps and
//! `--repeat`) and `sim reproduce` figures — as PNG, SVG or PDF.

use std::path::PathBuf;

use clap::Args;
use dmkit_bench::plot;

use crate::Res;

#[derive(Args)]
#[command(after_help = "EXAMPLES:
  dmkit plot ycsb.json -o ycsb.pdf                       # mops vs the swept field
  dmkit plot micro.json --x size --y gbps -o bw.svg      # any numeric field, dotted paths reach nested ones
  dmkit plot race.json art.json -o c.png                 # several files: one series per file and setting
  dmkit plot fig4a.json -o fig4a.pdf                     # a `sim reproduce --json` figure, as --plot draws it")]
pub(crate) struct PlotArgs {
    /// Result files written by --json.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The figure to write: .png, .svg or .pdf.
    #[arg(short, long)]
    output: PathBuf,
    /// The x axis: any numeric field of the results [default: the first
    /// swept field that varies: threads, coros, tasks, size, value_size,
    /// batch, depth, theta, zipf, …].
    #[arg(long)]
    x: Option<String>,
    /// The y axis: any numeric field ("a.b" for a nested one).
    #[arg(long, default_value = "mops")]
    y: String,
    /// Fields whose values name the series (comma-separated) [default: index,
    /// workload, system, method, backend… as present, and the swept fields
    /// that vary other than --x].
    #[arg(long, value_delimiter = ',')]
    series: Option<Vec<String>>,
}

pub(crate) fn plot(a: PlotArgs) -> Res {
    plot::Format::of_path(&a.output).map_err(|e| crate::bad_input(format!("--output {e}")))?;
    dmkit_bench::harness::check_output("--output", &a.output).map_err(crate::bad_input)?;
    let mut docs = Vec::new();
    for f in &a.files {
        let text =
            std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        docs.push((f.display().to_string(), v));
    }
    let sel = plot::Select {
        x: a.x,
        y: Some(a.y),
        series: a.series,
    };
    let p = plot::of_json(&docs, &sel).map_err(crate::bad_input)?;
    plot::write(&p, &a.output).map_err(|e| e.to_string())
}

//! `dmkit plot`: plot benchmark results (JSON files of `bench ycsb`),
//! throughput vs threads, to a PNG.

use std::path::PathBuf;

use clap::Args;
use dmkit_bench::plot;

use crate::Res;

#[derive(Args)]
pub(crate) struct PlotArgs {
    /// Result files written by --json.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The PNG to write.
    #[arg(short, long)]
    output: PathBuf,
}

pub(crate) fn plot(a: PlotArgs) -> Res {
    let mut rs = Vec::new();
    for f in &a.files {
        let text =
            std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        // A sweep or --repeat keeps every point's result under "runs".
        let runs = match v.get("runs").and_then(|r| r.as_array()) {
            Some(runs) => runs.iter().collect(),
            None => vec![&v],
        };
        for r in runs {
            rs.push(plot::Point::from_json(r).map_err(|e| format!("{}: {e}", f.display()))?);
        }
    }
    plot::write_png(&plot::chart_of_points(&rs), &a.output)
        .map_err(|e| format!("writing {}: {e}", a.output.display()))
}

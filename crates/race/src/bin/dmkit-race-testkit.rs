//! Child-process helper for dmkit-race's multi-process tests. Not a user
//! tool; see `dmkit_lincheck::stress::testkit_main` for the arguments.

use dmkit_race::{RaceConfig, RaceTable};

fn main() -> std::process::ExitCode {
    dmkit_lincheck::stress::testkit_main(|fabric, name| {
        let cfg = RaceConfig {
            grace: 2_000_000,
            ..Default::default()
        };
        let table = RaceTable::open(fabric, name, cfg).map_err(|e| e.to_string())?;
        Ok(move |id| table.client(id))
    })
}

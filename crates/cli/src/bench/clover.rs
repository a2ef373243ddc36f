//! The flags of `dmkit bench ycsb --index clover`: Clover's own switches
//! and SwordBox's steering of it on the simulator.

use clap::Args;
use dmkit_bench::ycsb_bench::{CloverBench, CloverShare};
use dmkit_switch::Steer;

#[derive(Args)]
pub(crate) struct CloverArgs {
    /// Clover's switches (dmkit_clover::CloverConfig).
    #[command(flatten)]
    config: dmkit_clover::CloverConfig,
    /// SwordBox: steer Clover's requests at a P4 switch in front of the
    /// memory node: off, write or read-write. Simulator only: on shm there
    /// is no wire for a switch to sit on.
    #[arg(long, default_value = "off")]
    steer: Steer,
    /// SwordBox: steer only the workload's N hottest keys (partial
    /// steering; 0: every key).
    #[arg(long, default_value_t = 0)]
    steer_keys: usize,
    /// Run on the Clover store NAME shared with other client processes
    /// (one per host): the first creates it, the others open it; the last
    /// to finish checks every chain with all processes' linked versions
    /// and removes the store. Needs --gc off and --clover-clients.
    #[arg(long, value_name = "NAME")]
    clover_store: Option<String>,
    /// Client processes on --clover-store (the last of them checks).
    #[arg(long, value_name = "N", requires = "clover_store")]
    clover_clients: Option<u32>,
    /// SwordBox: slots of the switch's address → key table for read
    /// steering (0: four times the keys, at least 1,024). Simulator only.
    #[arg(long, default_value_t = 0, value_name = "SLOTS")]
    steer_table: usize,
    /// Before the warm-up, every client looks up every key once, unmeasured:
    /// the hint caches of a long run (simulator only; a simulated run lasts
    /// milliseconds, too short for each client to meet each key).
    #[arg(long)]
    warm_hints: bool,
}

impl CloverArgs {
    /// The harness's settings.
    pub(crate) fn bench(&self) -> Result<CloverBench, String> {
        let share = match (&self.clover_store, self.clover_clients) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(crate::bad_input(
                    "--clover-store needs --clover-clients N (how many processes share it)",
                ))
            }
            (Some(name), Some(clients)) => Some(CloverShare {
                name: name.clone(),
                clients,
            }),
        };
        Ok(CloverBench {
            config: self.config.clone(),
            steer: self.steer,
            steer_keys: self.steer_keys,
            share,
            steer_table: self.steer_table,
            warm_hints: self.warm_hints,
        })
    }
}

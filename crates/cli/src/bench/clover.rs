//! The flags of `dmkit bench ycsb --index clover`: Clover's own switches
//! and SwordBox's steering of it on the simulator.

use clap::Args;
use dmkit_bench::ycsb_bench::CloverBench;
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
        Ok(CloverBench {
            config: self.config.clone(),
            steer: self.steer,
            steer_keys: self.steer_keys,
            steer_table: self.steer_table,
            warm_hints: self.warm_hints,
        })
    }
}

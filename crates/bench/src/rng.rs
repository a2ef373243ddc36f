//! The workload generator's PRNG: dmkit's one deterministic generator,
//! defined in the runtime so the simulator and the runtime share it.

pub use dmkit_runtime::rng::Rng;

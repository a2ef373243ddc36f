//! The simulation's random numbers: dmkit's one deterministic generator
//! (xorshift64* seeded by SplitMix64, defined in the runtime). Every fault
//! and tie-break comes from one instance, so a seed replays a run.

pub use dmkit_runtime::rng::Rng as SimRng;

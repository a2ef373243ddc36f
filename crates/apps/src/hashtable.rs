//! The disaggregated hash table's optimisation breakdown (RDMA
//! memory-semantics study, §IV-B, Fig. 11–12): front ends update 64-byte
//! values of a skewed (zipfian 0.99) key set in back-end memory, and the
//! study switches its optimisations on one after the other. dmkit's hash
//! table is RACE (`dmkit_race`, which passes the index layer's
//! conformance suite, linearizability included); each step is a switch of
//! it, of the runtime or of the placement:
//!
//! 1. **basic**: front ends on both sockets of their machines, every queue
//!    pair through the first NIC port (the study's testbed: one dual-port
//!    NIC on socket 1), table spread over both sockets' memory;
//! 2. **+ NUMA**: each socket its own port, connections between matched
//!    sockets (the simulator's [`dmkit_sim::PortRule::Matched`]): no
//!    crossing at the requester, the other socket's memory across the
//!    remote link;
//! 3. **+ IO consolidation**: the hot keys (the most frequent, as the study
//!    warms its table up) in race's hot area — blocks written back once per
//!    `θ` modifications through the runtime's
//!    [`dmkit_runtime::consolidate::SharedRegions`];
//! 4. **+ atomics**: the study's multi-version cold entries — an update
//!    takes a version number with one FAA on the key's block and WRITEs
//!    its slot `version mod K` (RACE's [`dmkit_race::RaceConfig::cold_versions`];
//!    the protocol, its version check and what bounds a reader's retries
//!    are in `dmkit_race`'s crate doc, "Multi-version cold entries") — and
//!    exponential backoff on the hot blocks' remote spinlocks and on every
//!    remaining CAS retry (§III-E's backoff spinlock; the runtime's conflict
//!    avoidance). Hot blocks keep their locks. `K` is a switch
//!    ([`DEFAULT_VERSIONS`]; `dmkit app hashtable --cold-versions 0` runs
//!    the step as backoff alone, as before the entries were built).
//!
//! One choice differs from the study, and is said where it shows: step 2
//! reaches the other socket's memory across the remote link rather than
//! through a proxy thread (race's clients post their own verbs; the
//! runtime's [`dmkit_runtime::numa::ProxyQueue`] is the proxy path the log
//! and tests use). On a single-socket host step 2 changes nothing: the
//! proxy is off. And the study's table finds a key's entry directly, where
//! RACE first READs the key's buckets (no client cache in the breakdown):
//! an update is three round trips (buckets; FAA ∥ READ of the block's
//! header, key and commit words; WRITE of the slot, then of its commit
//! word) where the study's is two.
//!
//! The runs themselves are YCSB runs of `dmkit-bench` (`dmkit app
//! hashtable`, `dmkit sim reproduce memsem-fig12`); this module names the
//! steps and what each switches.

use dmkit_sim::{NumaLayout, PortRule};
use serde::Serialize;

/// Versions kept per cold entry in the +atomics step. The study says
/// "several available versions for each key-value entry" (§IV-B) without a
/// number; four lets four writers of one key be in flight at once (a front
/// end's thread runs four coroutines in the breakdown) while a 64-byte
/// value's block stays at six 64-byte units.
pub const DEFAULT_VERSIONS: u32 = 4;

/// A step of the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// The study's baseline: no optimisation.
    Basic,
    /// + NUMA: a port per socket, matched connections.
    Numa,
    /// + IO consolidation: the hot keys in race's hot area.
    Consolidation,
    /// + atomics: backoff on the hot locks and CAS retries.
    Atomics,
}

impl Step {
    /// The steps in the study's order.
    pub const ALL: [Step; 4] = [Step::Basic, Step::Numa, Step::Consolidation, Step::Atomics];

    /// Its name in figures and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Step::Basic => "basic",
            Step::Numa => "+numa",
            Step::Consolidation => "+io-consolidation",
            Step::Atomics => "+atomics",
        }
    }

    /// What the step (with the ones before it) switches on.
    pub fn switches(self) -> StepSwitches {
        let n = self as u8;
        StepSwitches {
            numa_aware: n >= Step::Numa as u8,
            hot_area: n >= Step::Consolidation as u8,
            backoff: n >= Step::Atomics as u8,
            multi_version: n >= Step::Atomics as u8,
        }
    }
}

impl std::str::FromStr for Step {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Step::ALL
            .into_iter()
            .find(|x| x.name() == s || x.name().trim_start_matches('+') == s)
            .ok_or_else(|| format!("{s:?}: expected basic, numa, io-consolidation or atomics"))
    }
}

/// The switches of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepSwitches {
    /// Matched ports (and, on a multi-socket host, proxies).
    pub numa_aware: bool,
    /// Hot keys in race's hot area (IO consolidation).
    pub hot_area: bool,
    /// Exponential backoff on remote locks and CAS retries.
    pub backoff: bool,
    /// Multi-version cold entries (FAA version, WRITE of its slot).
    pub multi_version: bool,
}

impl StepSwitches {
    /// The simulated machines' sockets for this step: two sockets; the
    /// testbed's NIC (both ports on socket 1) unless NUMA-aware, then a port
    /// per socket with matched connections.
    pub fn numa_layout(&self) -> NumaLayout {
        if self.numa_aware {
            NumaLayout {
                sockets: 2,
                ports: vec![0, 1],
                rule: PortRule::Matched,
            }
        } else {
            NumaLayout {
                sockets: 2,
                ports: vec![1, 1],
                rule: PortRule::First,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_accumulate() {
        let s: Vec<_> = Step::ALL.iter().map(|s| s.switches()).collect();
        assert!(!s[0].numa_aware && !s[0].hot_area && !s[0].backoff);
        assert!(s[1].numa_aware && !s[1].hot_area);
        assert!(s[2].numa_aware && s[2].hot_area && !s[2].backoff);
        assert!(s[3].numa_aware && s[3].hot_area && s[3].backoff);
        assert!(s[3].multi_version && !s[2].multi_version);
        assert_eq!("numa".parse::<Step>(), Ok(Step::Numa));
        assert!(s[0].numa_layout().validate().is_ok() && s[3].numa_layout().validate().is_ok());
    }
}

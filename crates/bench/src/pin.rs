//! Thread placement for shm benchmarks whose memory node is embedded in
//! the process: the client threads on some CPUs, the node's RPC workers
//! (and a CoRM compaction's leader, which is one of them) on the others,
//! so the two sides stop taking turns on one core.
//!
//! The CPUs are those the process may run on (`sched_getaffinity`): the
//! first `client` of them go to the clients, the rest to the node. The
//! node's workers are found by their thread names (`dmkit-rpc-…`, as
//! `dmkit_memnode` names them) in `/proc/self/task` and placed with
//! `sched_setaffinity` on their thread ids; a client thread places itself.
//! With fewer CPUs than the plan needs, nothing is placed and the
//! [`Pinning`] says so.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use serde::Serialize;

use crate::micro::BenchError;

/// The prefix of a memory node's RPC worker threads' names.
const NODE_WORKER: &str = "dmkit-rpc-";

/// Where a run's threads were placed (carried in its JSON).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Pinning {
    /// Placement was asked for.
    pub requested: bool,
    /// It was done (false: not asked for, or too few CPUs).
    pub applied: bool,
    /// CPUs the process may run on.
    pub cpus: Vec<usize>,
    /// CPUs of the client threads.
    pub client_cpus: Vec<usize>,
    /// CPUs of the node's RPC workers.
    pub node_cpus: Vec<usize>,
    /// The node's worker threads placed.
    pub node_threads: usize,
    /// Why nothing was placed, if so.
    pub note: Option<String>,
}

impl Pinning {
    /// The plan for `client_threads` client threads (one CPU each, at
    /// least one CPU left for the node), or an unapplied record when not
    /// `requested` or the process has too few CPUs.
    pub fn plan(requested: bool, client_threads: usize) -> Result<Self, BenchError> {
        let cpus = allowed_cpus()?;
        let mut p = Pinning {
            requested,
            cpus: cpus.clone(),
            ..Default::default()
        };
        if !requested {
            return Ok(p);
        }
        let k = client_threads.max(1);
        if cpus.len() <= k {
            p.note = Some(format!(
                "{} CPU{} for {k} client thread{} and the node: not pinned",
                cpus.len(),
                if cpus.len() == 1 { "" } else { "s" },
                if k == 1 { "" } else { "s" }
            ));
            return Ok(p);
        }
        p.client_cpus = cpus[..k].to_vec();
        p.node_cpus = cpus[k..].to_vec();
        p.applied = true;
        Ok(p)
    }

    /// Places the calling thread, client thread `i`, on its CPU (nothing
    /// when the plan is not applied).
    pub fn place_client(&self, i: usize) -> Result<(), BenchError> {
        if !self.applied {
            return Ok(());
        }
        let cpu = self.client_cpus[i % self.client_cpus.len()];
        set(Pid::from_raw(0), &[cpu])
    }

    /// Places the calling thread with the node (a thread that mostly
    /// sleeps, e.g. one asking for a compaction).
    pub fn place_with_node(&self) -> Result<(), BenchError> {
        if !self.applied {
            return Ok(());
        }
        set(Pid::from_raw(0), &self.node_cpus)
    }

    /// Places every RPC worker thread of the process's embedded nodes on
    /// the node's CPUs; at least `expected` must exist (they start with
    /// the node's first channel, and name themselves once running: the
    /// search waits up to a second for them).
    pub fn place_node_workers(&mut self, expected: usize) -> Result<(), BenchError> {
        if !self.applied {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let tids = loop {
            let tids = node_worker_tids()?;
            if tids.len() >= expected || std::time::Instant::now() >= deadline {
                break tids;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        for &tid in &tids {
            set(Pid::from_raw(tid), &self.node_cpus)?;
        }
        self.node_threads = tids.len();
        if tids.len() < expected {
            return Err(BenchError::Run(format!(
                "pinning: found {} of the node's {expected} RPC worker threads",
                tids.len()
            )));
        }
        Ok(())
    }
}

/// Gives the thread that made it back the CPUs it had (those of the
/// plan's `cpus`) when dropped: a run that placed its calling thread
/// leaves it as it found it.
pub struct Restore(Option<Vec<usize>>);

impl Pinning {
    /// A guard that, dropped on this thread, returns it to every CPU the
    /// process had (nothing when the plan is not applied).
    pub fn restore_on_drop(&self) -> Restore {
        Restore(self.applied.then(|| self.cpus.clone()))
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(cpus) = &self.0 {
            let _ = set(Pid::from_raw(0), cpus);
        }
    }
}

/// The thread ids of this process's memory-node RPC workers.
fn node_worker_tids() -> Result<Vec<i32>, BenchError> {
    let tasks = std::fs::read_dir("/proc/self/task")
        .map_err(|e| BenchError::Run(format!("listing /proc/self/task: {e}")))?;
    Ok(tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.starts_with(NODE_WORKER))
        })
        .filter_map(|t| t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .collect())
}

/// The CPUs this process may run on, ascending.
pub fn allowed_cpus() -> Result<Vec<usize>, BenchError> {
    let set = sched_getaffinity(Pid::from_raw(0))
        .map_err(|e| BenchError::Run(format!("sched_getaffinity: {e}")))?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

fn set(pid: Pid, cpus: &[usize]) -> Result<(), BenchError> {
    let mut s = CpuSet::new();
    for &c in cpus {
        s.set(c)
            .map_err(|e| BenchError::Run(format!("CPU {c}: {e}")))?;
    }
    sched_setaffinity(pid, &s)
        .map_err(|e| BenchError::Run(format!("sched_setaffinity({pid}, {cpus:?}): {e}")))
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`; `None` where
/// it cannot be read): how quiet the machine was.
pub fn load_average() -> Option<[f64; 3]> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_leaves_the_node_a_cpu_or_is_not_applied() {
        let cpus = allowed_cpus().unwrap();
        assert!(!cpus.is_empty());
        let p = Pinning::plan(true, 1).unwrap();
        if cpus.len() >= 2 {
            assert!(p.applied);
            assert_eq!(p.client_cpus, vec![cpus[0]]);
            assert_eq!(p.node_cpus, cpus[1..].to_vec());
        } else {
            assert!(!p.applied && p.note.is_some());
        }
        let off = Pinning::plan(false, 1).unwrap();
        assert!(!off.applied && off.client_cpus.is_empty());
        let too_many = Pinning::plan(true, cpus.len()).unwrap();
        assert!(!too_many.applied && too_many.note.is_some());
    }

    #[test]
    fn the_load_average_reads() {
        let l = load_average().unwrap();
        assert!(l.iter().all(|x| *x >= 0.0));
    }
}

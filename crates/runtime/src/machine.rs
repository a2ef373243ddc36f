//! State shared by the clients of one compute machine.
//!
//! Some techniques coordinate every thread of a compute node, not only the
//! tasks of one worker: Sherman's hierarchical lock table (HOCL), SMART-BT's
//! speculative-lookup cache, the radix tree's read-delegation and
//! write-combining windows (OSDI'23 §4.2), and both trees' caches of
//! internal nodes. A data structure keeps one table
//! per machine in a [`PerMachine`] and hands it to each client made for
//! that machine. On shm every client of a process is machine 0; the
//! simulator numbers its compute machines.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One `T` per compute machine, made on first use.
pub struct PerMachine<T>(Mutex<HashMap<usize, Arc<T>>>);

impl<T> Default for PerMachine<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T> PerMachine<T> {
    /// Machine `machine`'s table, made by `make` if it has none yet.
    pub fn get(&self, machine: usize, make: impl FnOnce() -> T) -> Arc<T> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(machine)
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_per_machine() {
        let p = PerMachine::<u32>::default();
        let a = p.get(0, || 1);
        let b = p.get(0, || 2);
        let c = p.get(1, || 3);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((*a, *c), (1, 3));
    }
}

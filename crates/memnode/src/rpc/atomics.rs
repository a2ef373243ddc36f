//! The built-in RPC atomics service ([`ATOMICS`]): a spinlock and a
//! sequencer served by the memory node's CPU — the RPC-based baseline of the
//! remote-atomics comparison in "Understanding the Idiosyncrasies of Emerging
//! RDMA Memory Semantics" (the RDMA memory-semantics study), §III-E, Fig. 10,
//! whose RPC spinlock and sequencer run over channel-semantic verbs.
//!
//! The node keeps [`ATOMIC_SLOTS`] lock words and as many counters, apart
//! (so a counter's value is never mistaken for a lock's owner). A worker
//! serves each request with one CPU atomic:
//!
//! - [`AtomicsRequest::TryLock`]: compare-and-swap `0 → session + 1` on the
//!   lock word; the reply is 1 if the caller now holds it, 0 if someone else
//!   does, its own session included (the lock is not re-entrant; the caller
//!   spins by calling again, as the study's RPC lock does).
//! - [`AtomicsRequest::Unlock`]: compare-and-swap `session + 1 → 0`; a
//!   session that does not hold the lock gets a typed refusal
//!   ([`AtomicsFault::NotHolder`]) and the word is unchanged.
//! - [`AtomicsRequest::FetchAdd`]: fetch-and-add on a counter; the reply is
//!   the value before.
//! - [`AtomicsRequest::Read`]: a lock word (0 free, else holder session + 1)
//!   or a counter.
//!
//! Crash safety: when a session ends (its client exited or died) the
//! node releases every lock it held, so no client waits for ever on a dead
//! one — what RDMA CAS locks need leases for comes free where the node's CPU
//! sees connections end.
//!
//! Replies are one `u64` in the node's codec (bincode, fixed-width
//! integers); refusals are an encoded [`AtomicsFault`].

use std::sync::atomic::{AtomicU64, Ordering};

use bincode::Options;
use serde::{Deserialize, Serialize};

use super::{Service, ServiceError, ServiceId, WorkerCtx, WorkerId};
use crate::node::SessionId;

/// The atomics service's id (always registered, like [`super::ECHO`]).
pub const ATOMICS: ServiceId = 1;

/// How many lock words and how many counters the service keeps.
pub const ATOMIC_SLOTS: u32 = 1024;

/// A request to the atomics service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AtomicsRequest {
    /// Try to take lock `slot`: reply 1 if taken, 0 if held by another.
    TryLock {
        /// Which lock word.
        slot: u32,
    },
    /// Release lock `slot`, held by the calling session: reply 1.
    Unlock {
        /// Which lock word.
        slot: u32,
    },
    /// Add `delta` to counter `slot`: reply the value before.
    FetchAdd {
        /// Which counter.
        slot: u32,
        /// What to add (wrapping).
        delta: u64,
    },
    /// Read lock word `slot` (`lock: true`; 0 = free, else holder
    /// session + 1) or counter `slot`.
    Read {
        /// Which word.
        slot: u32,
        /// A lock word rather than a counter.
        lock: bool,
    },
}

/// Why the atomics service refused a request (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AtomicsFault {
    /// The request did not decode.
    #[error("malformed atomics request: {0}")]
    BadRequest(String),
    /// The slot is past [`ATOMIC_SLOTS`].
    #[error("slot {slot} out of range (the node keeps {slots})")]
    NoSuchSlot {
        /// The slot asked for.
        slot: u32,
        /// How many there are.
        slots: u32,
    },
    /// An unlock by a session that does not hold the lock.
    #[error("lock {slot} is not held by this session (word {word:#x})")]
    NotHolder {
        /// The lock word.
        slot: u32,
        /// Its value (0 = free, else holder session + 1).
        word: u64,
    },
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(64)
}

/// Decodes a reply of the atomics service (a `u64`) or its refusal's bytes
/// (an [`AtomicsFault`]).
pub fn decode_fault(bytes: &[u8]) -> Option<AtomicsFault> {
    codec().deserialize(bytes).ok()
}

/// Encodes a request (for callers without the runtime's typed calls).
pub fn encode_request(r: &AtomicsRequest) -> Vec<u8> {
    codec().serialize(r).expect("requests encode")
}

/// The node side: lock words and counters shared by every worker.
pub struct AtomicsService {
    locks: Box<[AtomicU64]>,
    counters: Box<[AtomicU64]>,
}

impl std::fmt::Debug for AtomicsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtomicsService")
            .field("slots", &self.locks.len())
            .finish()
    }
}

impl Default for AtomicsService {
    fn default() -> Self {
        let words = || (0..ATOMIC_SLOTS).map(|_| AtomicU64::new(0)).collect();
        Self {
            locks: words(),
            counters: words(),
        }
    }
}

fn fault(f: AtomicsFault) -> ServiceError {
    ServiceError::encode(&f)
}

impl AtomicsService {
    fn slot(&self, slot: u32) -> Result<usize, ServiceError> {
        if slot < ATOMIC_SLOTS {
            Ok(slot as usize)
        } else {
            Err(fault(AtomicsFault::NoSuchSlot {
                slot,
                slots: ATOMIC_SLOTS,
            }))
        }
    }

    fn serve(&self, session: SessionId, req: AtomicsRequest) -> Result<u64, ServiceError> {
        let me = session.wrapping_add(1);
        match req {
            AtomicsRequest::TryLock { slot } => {
                let w = &self.locks[self.slot(slot)?];
                Ok(u64::from(
                    w.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok(),
                ))
            }
            AtomicsRequest::Unlock { slot } => {
                let w = &self.locks[self.slot(slot)?];
                w.compare_exchange(me, 0, Ordering::AcqRel, Ordering::Acquire)
                    .map(|_| 1)
                    .map_err(|word| fault(AtomicsFault::NotHolder { slot, word }))
            }
            AtomicsRequest::FetchAdd { slot, delta } => {
                Ok(self.counters[self.slot(slot)?].fetch_add(delta, Ordering::AcqRel))
            }
            AtomicsRequest::Read { slot, lock } => {
                let i = self.slot(slot)?;
                let w = if lock {
                    &self.locks[i]
                } else {
                    &self.counters[i]
                };
                Ok(w.load(Ordering::Acquire))
            }
        }
    }
}

impl Service for AtomicsService {
    type Worker = ();
    type Message = ();

    fn name(&self) -> &'static str {
        "atomics"
    }

    fn start_worker(&self, _worker: WorkerId, _workers: usize) {}

    fn handle(
        &self,
        cx: &mut WorkerCtx<'_, Self>,
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<(), ServiceError> {
        let req: AtomicsRequest = codec()
            .deserialize(request)
            .map_err(|e| fault(AtomicsFault::BadRequest(e.to_string())))?;
        let v = self.serve(cx.session(), req)?;
        reply.extend_from_slice(&codec().serialize(&v).expect("a u64 encodes"));
        Ok(())
    }

    fn session_closed(&self, _cx: &mut WorkerCtx<'_, Self>, session: SessionId) {
        let me = session.wrapping_add(1);
        for w in self.locks.iter() {
            let _ = w.compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &AtomicsService, session: SessionId, r: AtomicsRequest) -> u64 {
        s.serve(session, r).unwrap()
    }

    fn refusal(s: &AtomicsService, session: SessionId, r: AtomicsRequest) -> AtomicsFault {
        let e = s.serve(session, r).unwrap_err();
        decode_fault(&e.0).expect("a refusal decodes")
    }

    #[test]
    fn a_lock_excludes_other_sessions_and_only_its_holder_unlocks() {
        let s = AtomicsService::default();
        let (lock, unlock) = (
            AtomicsRequest::TryLock { slot: 3 },
            AtomicsRequest::Unlock { slot: 3 },
        );
        assert_eq!(ok(&s, 7, lock), 1);
        assert_eq!(ok(&s, 8, lock), 0);
        assert_eq!(ok(&s, 7, lock), 0, "not re-entrant");
        assert_eq!(
            refusal(&s, 8, unlock),
            AtomicsFault::NotHolder { slot: 3, word: 8 }
        );
        assert_eq!(
            ok(
                &s,
                8,
                AtomicsRequest::Read {
                    slot: 3,
                    lock: true
                }
            ),
            8
        );
        assert_eq!(ok(&s, 7, unlock), 1);
        assert_eq!(ok(&s, 8, lock), 1);
        // Another slot is independent.
        assert_eq!(ok(&s, 7, AtomicsRequest::TryLock { slot: 4 }), 1);
    }

    #[test]
    fn counters_count_apart_from_locks() {
        let s = AtomicsService::default();
        for i in 0..5 {
            assert_eq!(
                ok(&s, 1, AtomicsRequest::FetchAdd { slot: 0, delta: 2 }),
                2 * i
            );
        }
        assert_eq!(
            ok(
                &s,
                1,
                AtomicsRequest::Read {
                    slot: 0,
                    lock: false
                }
            ),
            10
        );
        assert_eq!(
            ok(
                &s,
                1,
                AtomicsRequest::Read {
                    slot: 0,
                    lock: true
                }
            ),
            0
        );
    }

    #[test]
    fn bad_slots_are_refused() {
        let s = AtomicsService::default();
        let r = AtomicsRequest::TryLock { slot: ATOMIC_SLOTS };
        assert_eq!(
            refusal(&s, 1, r),
            AtomicsFault::NoSuchSlot {
                slot: ATOMIC_SLOTS,
                slots: ATOMIC_SLOTS
            }
        );
    }
}

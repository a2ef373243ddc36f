//! Remote synchronisation primitives on one-sided atomics — the remote
//! spinlock with exponential backoff and the FAA sequencer of the RDMA
//! memory-semantics study (§III-E), plus a lease in the lock word so a lock
//! whose holder died can be recovered.
//!
//! Lock word (one aligned 8-byte word in remote memory):
//!
//! ```text
//!  63            48 47                                           0
//! +----------------+----------------------------------------------+
//! |  owner (16)    |  lease deadline, µs of the shared clock (48) |
//! +----------------+----------------------------------------------+
//! 0 = free. owner ≠ 0 for a held lock.
//! ```
//!
//! ## The lease rule
//! - Acquire: CAS `0 → (owner, now + lease)`.
//! - A waiter that reads a held word whose deadline has passed by more than
//!   `skew` may *break* it: CAS `old → (me, now + lease)`. The CAS compares the
//!   whole word, so only one breaker wins, and a holder that renewed in the
//!   meantime (new deadline → new word) makes the break fail.
//! - A holder must finish its critical section (its last write posted) before
//!   `deadline − skew`, or renew first; [`LockGuard::check`] says whether it
//!   still may. Release is CAS `mine → 0`; if it fails, the lease had expired
//!   and the lock was broken ([`LockError::Lost`]).
//! - Time is the runtime's [`crate::Clock`]. On one host (shm) every process
//!   reads the same `CLOCK_MONOTONIC`, so `skew` may be 0; across machines,
//!   `skew` must bound the clocks' disagreement.
//! - Ordering: release after the critical section's writes on the same
//!   memory node is safe when posted in the same queue pair order (sync the
//!   writes first if they go to other nodes).

use dmkit_fabric::{FabricError, GlobalAddr, RemoteRef};

use crate::clock::Nanos;
use crate::ctx::Ctx;

const DEADLINE_BITS: u32 = 48;
const DEADLINE_MASK: u64 = (1 << DEADLINE_BITS) - 1;

/// Packs a lock word.
pub fn pack(owner: u16, deadline_us: u64) -> u64 {
    assert!(owner != 0, "owner 0 is reserved for a free lock");
    ((owner as u64) << DEADLINE_BITS) | (deadline_us & DEADLINE_MASK)
}

/// Unpacks a lock word into `(owner, deadline_us)`.
pub fn unpack(word: u64) -> (u16, u64) {
    ((word >> DEADLINE_BITS) as u16, word & DEADLINE_MASK)
}

/// Lock failures.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// A verb on the lock word failed (the fabric's error names it).
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The release CAS found another word: the holder's lease expired and a
    /// waiter broke it, so the critical section may have overlapped another.
    #[error("lock at {addr} was lost: its lease expired and another client broke it (word now {now:#x})")]
    Lost {
        /// The lock word.
        addr: GlobalAddr,
        /// The word the release CAS found (`owner:16 | deadline µs:48`).
        now: u64,
    },
}

/// Parameters of a [`RemoteLock`].
#[derive(Debug, Clone, Copy)]
pub struct LockConfig {
    /// How long an acquisition is valid.
    pub lease: Nanos,
    /// Bound on clock disagreement between clients (0 on one host).
    pub skew: Nanos,
    /// First backoff delay between attempts (doubles per failure).
    pub backoff_min: Nanos,
    /// Longest backoff delay.
    pub backoff_max: Nanos,
}

impl Default for LockConfig {
    fn default() -> Self {
        Self {
            lease: 100_000_000,
            skew: 0,
            backoff_min: 1_000,
            backoff_max: 1_000_000,
        }
    }
}

/// A spinlock in remote memory.
#[derive(Debug, Clone, Copy)]
pub struct RemoteLock {
    /// The lock word.
    pub at: RemoteRef,
    /// Its lease, skew allowance and backoff.
    pub cfg: LockConfig,
}

/// Proof of holding a [`RemoteLock`]. Release it with [`LockGuard::unlock`];
/// dropping it without unlocking leaves the lock to expire with its lease.
#[derive(Debug)]
#[must_use = "a held lock is released with unlock(); dropping it waits for the lease"]
pub struct LockGuard {
    lock: RemoteLock,
    word: u64,
    /// The acquisition broke an expired lease.
    pub broke_lease: bool,
    /// Failed attempts before this acquisition.
    pub attempts: u32,
}

impl RemoteLock {
    /// A lock at `at` (an aligned word, 0 when free).
    pub fn new(at: RemoteRef, cfg: LockConfig) -> Self {
        Self { at, cfg }
    }

    fn word_for(&self, ctx: &Ctx, owner: u16) -> u64 {
        pack(owner, (ctx.now() + self.cfg.lease) / 1000)
    }

    /// Acquires the lock for `owner` (non-zero, unique among live holders),
    /// backing off exponentially between attempts and breaking a lease that
    /// expired more than `skew` ago.
    pub async fn lock(&self, ctx: &Ctx, owner: u16) -> Result<LockGuard, LockError> {
        let mut attempts = 0u32;
        loop {
            let mine = self.word_for(ctx, owner);
            let old = ctx.backoff_cas(self.at, 0, mine).await?;
            if old == 0 {
                return Ok(self.guard(mine, false, attempts));
            }
            let (_, deadline_us) = unpack(old);
            if ctx.now() / 1000 > deadline_us + self.cfg.skew / 1000 {
                // Expired: try to take it over from the dead (or late) holder.
                let mine = self.word_for(ctx, owner);
                if ctx.cas_sync(self.at, old, mine).await? == old {
                    return Ok(self.guard(mine, true, attempts));
                }
            }
            attempts += 1;
            if !ctx.conflict_avoidance() {
                // backoff_cas did not wait: the lock's own exponential backoff.
                let shift = attempts.min(20);
                let d = (self.cfg.backoff_min << shift).min(self.cfg.backoff_max);
                ctx.sleep(d).await;
            }
        }
    }

    fn guard(&self, word: u64, broke_lease: bool, attempts: u32) -> LockGuard {
        LockGuard {
            lock: *self,
            word,
            broke_lease,
            attempts,
        }
    }
}

impl LockGuard {
    /// Time left before the holder must be done (`deadline − skew − now`).
    pub fn remaining(&self, ctx: &Ctx) -> Nanos {
        let (_, d) = unpack(self.word);
        (d * 1000)
            .saturating_sub(self.lock.cfg.skew)
            .saturating_sub(ctx.now())
    }

    /// Whether at least `need` of the lease is left.
    pub fn check(&self, ctx: &Ctx, need: Nanos) -> bool {
        self.remaining(ctx) >= need
    }

    /// Extends the lease to `now + lease`.
    pub async fn renew(&mut self, ctx: &Ctx) -> Result<(), LockError> {
        let (owner, _) = unpack(self.word);
        let next = self.lock.word_for(ctx, owner);
        let old = ctx.cas_sync(self.lock.at, self.word, next).await?;
        if old != self.word {
            return Err(LockError::Lost {
                addr: self.lock.at.addr,
                now: old,
            });
        }
        self.word = next;
        Ok(())
    }

    /// Releases the lock. Fails with [`LockError::Lost`] if the lease had
    /// expired and someone broke it.
    pub async fn unlock(self, ctx: &Ctx) -> Result<(), LockError> {
        let old = ctx.cas_sync(self.lock.at, self.word, 0).await?;
        if old == self.word {
            Ok(())
        } else {
            Err(LockError::Lost {
                addr: self.lock.at.addr,
                now: old,
            })
        }
    }
}

/// A sequencer: a remote counter handing out increasing numbers with FAA.
#[derive(Debug, Clone, Copy)]
pub struct Sequencer {
    /// The counter word.
    pub at: RemoteRef,
}

impl Sequencer {
    /// A sequencer on the aligned word at `at`.
    pub fn new(at: RemoteRef) -> Self {
        Self { at }
    }

    /// The next number.
    pub async fn next(&self, ctx: &Ctx) -> Result<u64, FabricError> {
        ctx.faa_sync(self.at, 1).await
    }

    /// Reserves `n` consecutive numbers; returns the first.
    pub async fn reserve(&self, ctx: &Ctx, n: u64) -> Result<u64, FabricError> {
        ctx.faa_sync(self.at, n).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_words_pack() {
        let w = pack(0xBEEF, 123_456_789);
        assert_eq!(unpack(w), (0xBEEF, 123_456_789));
        assert_ne!(w, 0);
        assert!(std::panic::catch_unwind(|| pack(0, 1)).is_err());
    }
}

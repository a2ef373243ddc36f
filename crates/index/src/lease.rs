//! Leases on the locks a remote structure takes: a client that dies
//! holding one never blocks it for ever.
//!
//! Every lock word an index takes in remote memory (RACE's insert, split
//! and directory locks, the radix tree's leaf and node locks, the B+tree's
//! node locks) holds its owner and the deadline of its lease — the format
//! of `dmkit_runtime::lock` (the memory-semantics study's remote spinlock,
//! §III-E, with a lease):
//!
//! ```text
//!  63            48 47                                           0
//! +----------------+----------------------------------------------+
//! |  owner (16)    |  lease deadline, µs of the shared clock (48) |
//! +----------------+----------------------------------------------+
//! 0 = free; a held lock has owner ≠ 0.
//! ```
//!
//! The rules ([`LeaseConfig`]):
//! - acquire: CAS `0 → (owner, now + lease)`, as before the lease: the
//!   common path is the same one CAS;
//! - a waiter that reads a held word whose deadline passed more than
//!   `skew` ago may *break* it — CAS `old → (me, now + lease)`, so one
//!   breaker wins — and must then *repair* what the dead holder may have
//!   left half-done before it goes on (each structure says how);
//! - a holder publishes its last write only while [`LeaseConfig::holds`]
//!   says enough of its lease is left; otherwise it backs out and tries
//!   again. Release stays a WRITE of 0 batched with the data.
//!
//! What it assumes: the clients' clocks disagree by at most `skew` (one
//! host: `CLOCK_MONOTONIC`, `skew` may be 0; across machines a bound, the
//! same assumption as RACE's grace period), and a live holder is not
//! stalled for longer than `lease − margin` between its check and its
//! write landing (the default 100 ms lease against operations of
//! microseconds).

use dmkit_fabric::{FabricError, RemoteRef};
use dmkit_runtime::lock::{pack, unpack};
use dmkit_runtime::{Ctx, Local, Nanos};

/// How long a lock is held before others may break it, and the clock
/// disagreement allowed between clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Length of a lease (ns).
    pub lease: Nanos,
    /// Bound on the disagreement of the clients' clocks (ns): a lease is
    /// broken only `skew` after its deadline, and a holder stops `skew`
    /// before it.
    pub skew: Nanos,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            lease: 100_000_000,
            skew: 1_000_000,
        }
    }
}

/// The part of a lease a holder keeps in hand: it publishes only while
/// more than a quarter of the lease is left.
const MARGIN_DIV: Nanos = 4;

impl LeaseConfig {
    /// The word of a lock that `owner` takes now.
    #[inline]
    pub fn word(&self, ctx: &Ctx, owner: u16) -> u64 {
        self.word_at(ctx.now(), owner)
    }

    /// The word of a lock that `owner` takes at `now` (a clock reading the
    /// caller already has).
    #[inline]
    pub fn word_at(&self, now: Nanos, owner: u16) -> u64 {
        pack(owner.max(1), (now + self.lease) / 1000)
    }

    /// Whether the lease of held word `word` ended more than `skew` ago
    /// (a free word, 0, is not expired: it is free).
    #[inline]
    pub fn expired(&self, ctx: &Ctx, word: u64) -> bool {
        if word == 0 {
            return false;
        }
        let (_, deadline_us) = unpack(word);
        ctx.now() / 1000 > deadline_us + self.skew / 1000
    }

    /// Whether a holder of `word` may still publish: more than a quarter of
    /// the lease left before `deadline − skew`.
    #[inline]
    pub fn holds(&self, ctx: &Ctx, word: u64) -> bool {
        let (_, deadline_us) = unpack(word);
        let end = (deadline_us * 1000).saturating_sub(self.skew);
        ctx.now() + self.lease / MARGIN_DIV < end
    }

    /// Breaks held word `seen` of lock `lock` for `mine` if its lease ran
    /// out (one CAS, so one breaker wins); `Ok(true)`: the lock is ours.
    /// A word whose lease runs is left alone (no verb).
    pub async fn break_expired(
        &self,
        ctx: &Ctx,
        lock: RemoteRef,
        seen: u64,
        mine: u64,
    ) -> Result<bool, FabricError> {
        if !self.expired(ctx, seen) {
            return Ok(false);
        }
        Ok(ctx.cas_sync(lock, seen, mine).await? == seen)
    }

    /// Keeps lock `lock`, held as `word` by `owner`, before a write under
    /// it: `word` itself while enough of its lease is left (no verb), else
    /// a fresh word swapped in by CAS; `None` when another client broke it
    /// meanwhile (the lock is not ours any more).
    pub async fn renew(
        &self,
        ctx: &Ctx,
        lock: RemoteRef,
        word: u64,
        owner: u16,
    ) -> Result<Option<u64>, FabricError> {
        if self.holds(ctx, word) {
            return Ok(Some(word));
        }
        let fresh = self.word(ctx, owner);
        Ok((ctx.cas_sync(lock, word, fresh).await? == word).then_some(fresh))
    }

    /// Releases lock `lock` held as `word` and waits for it: a WRITE of 0
    /// (staged in `scratch`, one word of task-local memory), in one batch
    /// with whatever the caller queued, while the lease holds; else, once
    /// that landed, a CAS — the lease may have been broken, and the word be
    /// another client's by now.
    pub async fn release(
        &self,
        ctx: &Ctx,
        lock: RemoteRef,
        word: u64,
        scratch: Local,
    ) -> Result<(), FabricError> {
        if self.holds(ctx, word) {
            ctx.set_local_u64(scratch, 0);
            ctx.write(lock, scratch);
            ctx.sync().await
        } else {
            // What the caller queued under the lock lands first.
            ctx.sync().await?;
            ctx.cas_sync(lock, word, 0).await.map(|_| ())
        }
    }

    /// The deadline of a lease taken now, in the short form a mark
    /// embedded in a data word carries (the radix tree's out-of-place
    /// "replaced" mark): 32 bits of µs of the shared clock, wrapping every
    /// 71 minutes; read modulo 2³² by [`LeaseConfig::short_expired`] and
    /// [`LeaseConfig::short_holds`].
    #[inline]
    pub fn short_deadline(&self, ctx: &Ctx) -> u32 {
        self.short_deadline_at(ctx.now())
    }

    /// [`LeaseConfig::short_deadline`] at clock reading `now`.
    #[inline]
    pub fn short_deadline_at(&self, now: Nanos) -> u32 {
        ((now + self.lease).div_ceil(1000) & u64::from(u32::MAX)) as u32
    }

    /// Whether short deadline `d` passed more than `skew` ago.
    #[inline]
    pub fn short_expired(&self, ctx: &Ctx, d: u32) -> bool {
        self.short_expired_at(ctx.now(), d)
    }

    /// [`LeaseConfig::short_expired`] at clock reading `now`. A deadline
    /// further ahead than any live holder can have set — more than `lease +
    /// skew` and [`WRAP_SLACK_US`] besides, a margin no clock bound comes
    /// near — is one that wrapped (a mark left for over half an hour) and
    /// counts as passed too, so a wrapped mark blocks for at most a lease
    /// and a second.
    #[inline]
    pub fn short_expired_at(&self, now: Nanos, d: u32) -> bool {
        let left = short_left_us(now, d);
        let skew = (self.skew / 1000) as i64 + 1;
        left < -skew || left > (self.lease / 1000) as i64 + skew + WRAP_SLACK_US
    }

    /// Whether the holder of a mark with short deadline `d` may still
    /// publish: more than a quarter of the lease left before `d − skew`
    /// (the rule of [`LeaseConfig::holds`]).
    #[inline]
    pub fn short_holds(&self, ctx: &Ctx, d: u32) -> bool {
        self.short_holds_at(ctx.now(), d)
    }

    /// [`LeaseConfig::short_holds`] at clock reading `now`.
    #[inline]
    pub fn short_holds_at(&self, now: Nanos, d: u32) -> bool {
        short_left_us(now, d) > ((self.lease / MARGIN_DIV + self.skew) / 1000) as i64
    }

    /// Checks the configuration: a lease longer than twice the skew.
    pub fn validate(&self) -> Result<(), String> {
        if self.lease == 0 || self.lease <= 2 * self.skew {
            return Err(format!(
                "lease {} ns must be positive and more than twice the clock skew {} ns",
                self.lease, self.skew
            ));
        }
        Ok(())
    }
}

/// How far (µs) beyond `lease + skew` a short deadline may lie ahead
/// before it is taken for one that wrapped: a second.
pub const WRAP_SLACK_US: i64 = 1_000_000;

/// µs from clock reading `now` to short deadline `d`, modulo 2³²
/// (negative: passed).
#[inline]
fn short_left_us(now: Nanos, d: u32) -> i64 {
    let now = ((now / 1000) & u64::from(u32::MAX)) as u32;
    i64::from(d.wrapping_sub(now) as i32)
}

/// A lock owner id from a client id (non-zero; two live clients may share
/// one: mutual exclusion comes from the CAS, the owner only names who held
/// a word for reports and repairs).
pub fn owner_of(id: u64) -> u16 {
    let h = dmkit_runtime::hash::fmix64(id ^ 0x0D15_EA5E);
    (h % 65_535) as u16 + 1
}

/// The owner of a held lock word (0 for a free one).
pub fn owner_in(word: u64) -> u16 {
    unpack(word).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_never_zero() {
        for id in 0..10_000 {
            assert_ne!(owner_of(id), 0);
        }
        assert!(LeaseConfig::default().validate().is_ok());
        assert!(LeaseConfig { lease: 10, skew: 5 }.validate().is_err());
    }

    #[test]
    fn short_deadlines_expire_after_the_lease_and_survive_wrapping() {
        let c = LeaseConfig {
            lease: 2_000_000,
            skew: 200_000,
        };
        // Around a wrap of the 32-bit µs clock, and far from one.
        for t0 in [5_000_000u64, (1u64 << 32) * 1000 - 500_000, 7 << 40] {
            let d = c.short_deadline_at(t0);
            assert!(c.short_holds_at(t0, d) && !c.short_expired_at(t0, d));
            // Past three quarters of the lease less the skew: no publishing,
            // but not broken either.
            let late = t0 + 1_400_000;
            assert!(!c.short_holds_at(late, d) && !c.short_expired_at(late, d));
            assert!(!c.short_expired_at(t0 + 2_200_000, d));
            assert!(c.short_expired_at(t0 + 2_203_000, d));
            // A deadline ahead by more than a lease (a clock ahead of this
            // one) is not taken for a wrapped one below the slack.
            let ahead = c.short_deadline_at(t0 + 600_000);
            assert!(!c.short_expired_at(t0, ahead));
            // A mark left half a wrap (35 min) and more: expired.
            assert!(c.short_expired_at(t0 + (1u64 << 31) * 1000, d));
            assert!(c.short_expired_at(t0 + (1u64 << 32) * 1000 - 1_500_000_000, d));
            assert!(!c.short_expired_at(t0 + (1u64 << 32) * 1000 - 3_000_000, d));
        }
    }
}

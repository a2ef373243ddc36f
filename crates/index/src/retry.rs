//! The retry budget of an operation, on the runtime's backoff.
//!
//! Every retry loop of a remote structure — a lock found held, a torn or
//! stale read, a lost CAS — counts its lost races in a [`Retry`] and backs
//! off through the runtime ([`dmkit_runtime::Ctx::backoff`], SMART's single
//! backoff, so `--conflict-avoid` switches it for every structure). The
//! budget is configuration ([`RetryPolicy`], part of each structure's
//! config), not a constant: an operation gives up with
//! [`IndexError::Timeout`] once it has lost more than `max_attempts` races
//! *and* spent more than `give_up_after` of its worker's time — a spin
//! lock is not fair, and behind many machines' hand-over queues on slow
//! memory nodes a live waiter can lose thousands of rounds in a row, so a
//! count alone would call healthy holders dead.

use dmkit_runtime::{Ctx, Nanos};

use crate::error::IndexError;

/// How long an operation keeps retrying: it gives up once it has lost
/// more than `max_attempts` races *and* more than `give_up_after` has
/// passed since its first lost race.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Lost races an operation may count before it may give up.
    pub max_attempts: u32,
    /// Time (ns of the worker's clock) an operation keeps trying before
    /// it may give up.
    pub give_up_after: Nanos,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 10_000,
            give_up_after: 1_000_000_000,
        }
    }
}

/// One operation's retries.
#[derive(Debug, Clone)]
pub struct Retry {
    op: &'static str,
    policy: RetryPolicy,
    attempts: u32,
    /// When the first race was lost (the clock is read only then: an
    /// operation that never retries pays nothing).
    since: Nanos,
}

impl Retry {
    /// Starts counting the retries of operation `op` (named in the error).
    pub fn new(op: &'static str, policy: RetryPolicy) -> Self {
        Retry {
            op,
            policy,
            attempts: 0,
            since: 0,
        }
    }

    /// Lost races so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Counts a lost race; [`IndexError::Timeout`] once the budget is spent.
    pub fn lost(&mut self, ctx: &Ctx) -> Result<(), IndexError> {
        if self.attempts == 0 {
            self.since = ctx.now();
        }
        self.attempts = self.attempts.saturating_add(1);
        if self.attempts <= self.policy.max_attempts {
            return Ok(());
        }
        let elapsed = ctx.now().saturating_sub(self.since);
        if elapsed > self.policy.give_up_after {
            return Err(IndexError::Timeout {
                op: self.op,
                attempts: self.attempts,
                elapsed_ns: elapsed,
            });
        }
        Ok(())
    }

    /// Counts a lost race and backs off through the runtime before the
    /// caller retries.
    pub async fn backoff(&mut self, ctx: &Ctx) -> Result<(), IndexError> {
        self.lost(ctx)?;
        ctx.backoff().await;
        Ok(())
    }

    /// Counts a lost race retried at once (a re-read that needs no wait,
    /// e.g. after refreshing a stale pointer): a retry in the statistics,
    /// no sleep.
    pub fn again(&mut self, ctx: &Ctx) -> Result<(), IndexError> {
        self.lost(ctx)?;
        ctx.note_retry();
        Ok(())
    }
}

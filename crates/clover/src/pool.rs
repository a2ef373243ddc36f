//! The free-block pool: a ring in remote memory through which the
//! metadata server hands the blocks it reclaimed back to clients, in
//! batches (Clover's "free space handed to clients in batches").
//!
//! One producer, many consumers, no lock:
//! - the producer (the metadata server, alone) reads `cons`, writes block
//!   addresses into the free positions `[prod, cons + slots)`, then writes
//!   `prod` (queue-pair order puts the slots first);
//! - a consumer reads `prod`/`cons`, then the slots `[cons, cons + k)`,
//!   then claims them with a CAS of `cons` from `cons` to `cons + k`. The
//!   producer only overwrites positions below `cons`, so the slots a
//!   consumer read before its successful CAS were still the ones for its
//!   positions: it owns exactly those blocks. A failed CAS (another
//!   consumer was first) claims nothing.

use dmkit_fabric::{GlobalAddr, RemoteRef};
use dmkit_index::IndexError;
use dmkit_runtime::{Ctx, Local};

use crate::layout::{PoolHeader, POOL_CONS, POOL_HEADER};

/// Where the pool lives and how big it is.
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    /// The pool header (slots follow it).
    pub at: RemoteRef,
    /// Slots (a power of two).
    pub slots: u64,
}

impl Pool {
    fn slot(&self, pos: u64) -> RemoteRef {
        self.at.add(POOL_HEADER + 8 * (pos & (self.slots - 1)))
    }

    /// Reads the slots of positions `[from, from + n)` into `dst` (one or
    /// two READs: the ring may wrap).
    fn read_slots(&self, ctx: &Ctx, from: u64, n: u64, dst: Local) {
        let first = n.min(self.slots - (from & (self.slots - 1)));
        ctx.read(self.slot(from), dst.prefix(8 * first as usize));
        if first < n {
            ctx.read(
                self.slot(from + first),
                dst.slice(8 * first as usize, 8 * (n - first) as usize),
            );
        }
    }

    /// Claims up to `max` blocks (three round trips: header, slots, CAS);
    /// empty if the pool is empty or another consumer won the race.
    /// `head` is a 16-byte local range, `slots` room for `max` words.
    pub async fn claim(
        &self,
        ctx: &Ctx,
        head: Local,
        slots: Local,
        max: u64,
    ) -> Result<Vec<GlobalAddr>, IndexError> {
        ctx.read(self.at, head.prefix(16));
        ctx.sync().await?;
        let (prod, cons) = (ctx.local_u64(head.word(0)), ctx.local_u64(head.word(8)));
        if prod <= cons || prod - cons > self.slots {
            return Ok(Vec::new());
        }
        let k = (prod - cons).min(max).min((slots.len() / 8) as u64);
        self.read_slots(ctx, cons, k, slots);
        ctx.sync().await?;
        let got: Vec<GlobalAddr> = (0..k as usize)
            .map(|i| GlobalAddr::from_raw(ctx.local_u64(slots.word(8 * i))))
            .collect();
        let old = ctx.cas_sync(self.at.add(POOL_CONS), cons, cons + k).await?;
        if old != cons {
            return Ok(Vec::new());
        }
        debug_assert!(
            got.iter().all(|a| !a.is_null()),
            "a produced slot holds a block"
        );
        Ok(got)
    }

    /// Adds `blocks` (the producer alone calls this); returns how many fit
    /// (the rest stay with the caller). `word` is an 8-byte local range,
    /// `slots` room for the blocks.
    pub async fn produce(
        &self,
        ctx: &Ctx,
        prod: &mut u64,
        word: Local,
        slots: Local,
        blocks: &[GlobalAddr],
    ) -> Result<usize, IndexError> {
        ctx.read(self.at.add(POOL_CONS), word);
        ctx.sync().await?;
        let cons = ctx.local_u64(word);
        debug_assert!(cons <= *prod, "consumers claim only what was produced");
        let room = (self.slots - (*prod - cons)) as usize;
        let n = blocks.len().min(room).min(slots.len() / 8);
        if n == 0 {
            return Ok(0);
        }
        for (i, b) in blocks[..n].iter().enumerate() {
            ctx.set_local_u64(slots.word(8 * i), b.raw());
        }
        let first = (n as u64).min(self.slots - (*prod & (self.slots - 1))) as usize;
        ctx.write(self.slot(*prod), slots.prefix(8 * first));
        if first < n {
            ctx.write(
                self.slot(*prod + first as u64),
                slots.slice(8 * first, 8 * (n - first)),
            );
        }
        *prod += n as u64;
        ctx.set_local_u64(word, *prod);
        // Queue-pair order: the slots land before the count that shows them.
        ctx.write(self.at, word);
        ctx.sync().await?;
        Ok(n)
    }
}

/// The header of a fresh pool.
pub fn empty_header() -> PoolHeader {
    PoolHeader::default()
}

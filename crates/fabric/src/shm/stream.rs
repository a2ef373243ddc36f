//! The write prefetch's stream detector ([`super::WritePrefetch::Stream`]):
//! a queue pair remembers where its last few WRITEs ended, and a WRITE
//! that starts exactly where one of them ended continues a stream — the
//! next WRITE of that stream is likely right after it, so its lines are
//! worth fetching for writing. Scattered WRITEs (a hash table's key-value
//! blocks) start nowhere remembered and are not hinted.

/// Stream ends remembered: enough for the interleaved partition buffers of
/// an unbatched shuffle (one per partition a source pushes to) and a log.
pub(crate) const STREAMS: usize = 8;

/// Where a queue pair's recent WRITEs ended (remote offsets on its node),
/// roughly most recent first.
#[derive(Debug, Clone)]
pub(crate) struct StreamDetector {
    /// End offsets: a continued stream's entry moves to the front (a swap),
    /// a new end is inserted at the front and the others shift back, the
    /// last dropping out; `u64::MAX` is an empty entry (no WRITE ends there:
    /// a node's offsets are far below it). Fixed-size moves only: a slice
    /// rotation of run-time length costs more than an unbatched WRITE's
    /// copy.
    ends: [u64; STREAMS],
}

impl Default for StreamDetector {
    fn default() -> Self {
        Self {
            ends: [u64::MAX; STREAMS],
        }
    }
}

impl StreamDetector {
    /// Notes a WRITE of `[off, off + len)` and tells whether it continues
    /// a remembered stream (it starts where a recent WRITE ended).
    #[inline]
    pub(crate) fn continues(&mut self, off: u64, len: u64) -> bool {
        let end = off.saturating_add(len);
        match self.ends.iter().position(|&e| e == off) {
            Some(i) => {
                self.ends[i] = self.ends[0];
                self.ends[0] = end;
                true
            }
            None => {
                self.ends.copy_within(0..STREAMS - 1, 1);
                self.ends[0] = end;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_continues_after_its_first_write() {
        let mut d = StreamDetector::default();
        let fired: Vec<bool> = (0..6).map(|i| d.continues(4096 + i * 64, 64)).collect();
        assert_eq!(fired, [false, true, true, true, true, true]);
    }

    #[test]
    fn interleaved_streams_each_continue() {
        // Four partition buffers written round robin, a batch of 16
        // entries at a time (the unbatched shuffle), plus a log tail.
        let mut d = StreamDetector::default();
        let base = |j: u64| (1 << 20) * (j + 1);
        let mut next = [0u64; 5];
        let mut hits = 0;
        let mut writes = 0;
        for round in 0..10 {
            for j in 0..5u64 {
                for _ in 0..16 {
                    let off = base(j) + next[j as usize];
                    let hit = d.continues(off, 64);
                    // Only each stream's very first WRITE is new.
                    assert_eq!(hit, round > 0 || next[j as usize] > 0, "{j} {round}");
                    hits += usize::from(hit);
                    writes += 1;
                    next[j as usize] += 64;
                }
            }
        }
        assert_eq!(hits, writes - 5);
    }

    #[test]
    fn scattered_writes_do_not_continue() {
        // Key-value blocks at pseudo-random 64-byte-aligned offsets of a
        // 1 GiB node: none starts where a recent one ended.
        let mut d = StreamDetector::default();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut hits = 0;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (1 << 24)) * 64;
            hits += usize::from(d.continues(off, 128));
        }
        assert!(hits <= 1, "{hits} scattered writes taken for streams");
    }

    #[test]
    fn a_stream_survives_fewer_scattered_writes_than_entries() {
        let mut d = StreamDetector::default();
        assert!(!d.continues(0, 256));
        for i in 0..STREAMS as u64 - 1 {
            assert!(!d.continues(1 << 30 | i << 12, 64));
        }
        assert!(d.continues(256, 256));
        // STREAMS scattered WRITEs since its last one forget it.
        for i in 0..STREAMS as u64 {
            assert!(!d.continues(1 << 31 | i << 12, 64));
        }
        assert!(!d.continues(512, 256));
    }

    #[test]
    fn empty_entries_match_nothing() {
        let mut d = StreamDetector::default();
        assert!(!d.continues(0, 64));
        assert!(!d.continues(u64::MAX - 64, 64));
    }
}

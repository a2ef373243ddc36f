//! The probability that two blocks can be merged (CoRM §3.4).
//!
//! With `s` slots per block, `n` possible names per object (CoRM-x:
//! `n = 2^x` random ids; Mesh: `n = s` offsets) and blocks holding `b1`
//! and `b2` objects with names drawn uniformly without repetition:
//!
//! ```text
//! p(B1, B2) = C(n − b1, b2) / C(n, b2)   if b1 + b2 ≤ s,   0 otherwise
//! ```
//!
//! computed as `∏_{i<b2} (n − b1 − i)/(n − i)` (no huge binomials).

/// The §3.4 probability that blocks of `b1` and `b2` objects (of `s`
/// slots, names from `n`) have no name in common and fit in one block.
pub fn compaction_probability(n: u64, s: u64, b1: u64, b2: u64) -> f64 {
    if b1 + b2 > s || b1 > n || b2 > n {
        return 0.0;
    }
    let mut p = 1.0f64;
    for i in 0..b2 {
        if n - b1 <= i {
            return 0.0;
        }
        p *= (n - b1 - i) as f64 / (n - i) as f64;
        if p == 0.0 {
            break;
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corm::block::Block;
    use crate::corm::class::{IdKind, SizeClasses, Strategy};
    use crate::corm::rng::Rng;

    #[test]
    fn closed_forms() {
        assert_eq!(compaction_probability(100, 10, 6, 5), 0.0, "does not fit");
        assert_eq!(compaction_probability(100, 10, 0, 5), 1.0);
        // One object each: the second avoids the first's name.
        let p = compaction_probability(256, 64, 1, 1);
        assert!((p - 255.0 / 256.0).abs() < 1e-12);
        // Mesh at 50 %: only the exact complement fits: 1 / C(s, s/2).
        let p = compaction_probability(4, 4, 2, 2);
        assert!((p - 1.0 / 6.0).abs() < 1e-12);
    }

    /// Measured success of the store's own merge condition between two
    /// random blocks (Fig. 7: 4 KiB blocks, occupancies 25/50/75 %, size
    /// classes swept, CoRM-8/16 and Mesh) against the formula.
    #[test]
    fn formula_matches_measured_merges_of_random_blocks() {
        let classes = SizeClasses::new(4096);
        let mut rng = Rng::new(0x5EED);
        let trials = 2000u32;
        let mut checked = 0;
        for (c, info) in classes.iter() {
            let s = info.slots as u64;
            for strategy in [Strategy::Mesh, Strategy::Corm(8), Strategy::Corm(16)] {
                let pol = strategy.policy(info);
                if !pol.compact {
                    continue;
                }
                let n = match pol.id {
                    IdKind::Offset => s,
                    IdKind::Random(b) => 1 << b,
                };
                for occ in [0.25, 0.5, 0.75] {
                    let b = (occ * s as f64).round() as u64;
                    if b == 0 {
                        continue;
                    }
                    let mut ok = 0;
                    for _ in 0..trials {
                        let mut x = Block::new(0, c, pol.id, info.slots);
                        let mut y = Block::new(1, c, pol.id, info.slots);
                        for _ in 0..b {
                            x.alloc(&mut rng, 1);
                            y.alloc(&mut rng, 1);
                        }
                        ok += x.can_absorb(&y) as u32;
                    }
                    let measured = ok as f64 / trials as f64;
                    let p = compaction_probability(n, s, b, b);
                    let sd = (p * (1.0 - p) / trials as f64).sqrt();
                    assert!(
                        (measured - p).abs() <= 5.0 * sd + 0.01,
                        "{} class {c} ({s} slots) at {occ}: measured {measured}, formula {p}",
                        strategy.name()
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 100, "the sweep covers the classes ({checked})");
    }
}

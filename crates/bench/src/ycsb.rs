//! YCSB workload generation (Cooper et al., SoCC'10), as the SMART and
//! radix-tree papers run it: key choosers (zipfian after Gray et al.,
//! scrambled zipfian, latest, uniform), the standard workloads LOAD and A–F,
//! and two key types. Deterministic: the same seed gives the same stream.
//! The harness that drives an index with these lives with the indexes.

use crate::rng::Rng;

/// Gray et al.'s zipfian over `[0, n)`, rank 0 most popular ("Quickly
/// generating billion-record synthetic databases", SIGMOD'94), as YCSB's
/// `ZipfianGenerator`. Ranks 0 and 1 get their exact probabilities; the rest
/// follow the continuous power-law approximation of the method (so rank 2 is
/// ~20 % above its exact share at θ = 0.99 — YCSB's behaviour, kept).
#[derive(Debug, Clone)]
pub struct Zipfian {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    half_pow_theta: f64,
}

/// ζ(n, θ) = Σ_{i=1..n} 1/i^θ: exact up to 10⁷ terms; beyond, the first
/// 10⁷ terms plus the Euler–Maclaurin tail ∫ x^-θ dx + (f(n) − f(m))/2
/// (error below 10⁻⁹ of the sum; YCSB's 10¹⁰-item constant for θ = 0.99,
/// 26.46902820178302, is reproduced to 9 digits).
pub fn zeta(n: u64, theta: f64) -> f64 {
    const EXACT: u64 = 10_000_000;
    let head = n.min(EXACT);
    let mut sum: f64 = (1..=head).map(|i| 1.0 / (i as f64).powf(theta)).sum();
    if n > EXACT {
        let (m, nf) = (EXACT as f64, n as f64);
        sum += (nf.powf(1.0 - theta) - m.powf(1.0 - theta)) / (1.0 - theta)
            + (nf.powf(-theta) - m.powf(-theta)) / 2.0;
    }
    sum
}

/// Items of the zipfian behind YCSB's scrambled zipfian
/// (`ScrambledZipfianGenerator.ITEM_COUNT`).
pub const SCRAMBLED_ITEMS: u64 = 10_000_000_000;

impl Zipfian {
    /// Zipfian over `n ≥ 1` items with skew `0 < θ < 1`. Computes ζ(n, θ) in
    /// O(n) once.
    pub fn new(n: u64, theta: f64) -> Self {
        Self::with_zetan(n, theta, zeta(n, theta))
    }

    /// As [`Zipfian::new`] with ζ(n, θ) precomputed.
    pub fn with_zetan(n: u64, theta: f64, zetan: f64) -> Self {
        assert!(
            n >= 1 && theta > 0.0 && theta < 1.0,
            "zipfian needs n ≥ 1 and 0 < θ < 1"
        );
        let zeta2 = zeta(2, theta);
        Self {
            n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
            half_pow_theta: 0.5f64.powf(theta),
        }
    }

    /// The next rank.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + self.half_pow_theta {
            return 1.min(self.n - 1);
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }

    /// The skew θ.
    pub fn theta(&self) -> f64 {
        self.theta
    }
}

/// 64-bit FNV-1a of a number (YCSB's `fnvhash64`), used to scatter ranks.
pub fn fnv64(v: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for i in 0..8 {
        h ^= (v >> (8 * i)) & 0xFF;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// How keys are chosen.
#[derive(Debug, Clone)]
pub enum Chooser {
    /// Every key equally likely.
    Uniform,
    /// Zipfian over key numbers: key 0 hottest, neighbours next.
    Zipfian(Zipfian),
    /// YCSB's scrambled zipfian (its default for A, B, C, E, F): ranks of
    /// a zipfian over 10¹⁰ items, scattered over the key space by FNV. The
    /// hottest key's share (≈3.8 % at θ = 0.99) does not grow as the table
    /// shrinks, as a zipfian over the table's own keys would.
    Scrambled(Zipfian),
    /// Recently inserted keys hottest (YCSB's workload D).
    Latest(Zipfian),
    /// The exact zipfian over the keys, for skews of 1 and more (Gray's
    /// method needs θ < 1): cumulative probabilities of the ranks (SwordBox
    /// Fig. 14 runs θ = 1.5 over 1,024 keys).
    Exact(std::sync::Arc<[f64]>),
}

impl Chooser {
    /// A scrambled zipfian whose ranks are drawn over `items` items
    /// (instead of YCSB's 10¹⁰) and scattered over the keys: a small table
    /// with the hot-key shares of a table of `items` keys (e.g. the 100 M
    /// keys SMART loads, reproduced with fewer).
    pub fn scrambled_over(items: u64, theta: f64) -> Self {
        Chooser::Scrambled(zipfian_cached(items, theta))
    }
}

/// The zipfian over [`SCRAMBLED_ITEMS`].
fn scrambled(theta: f64) -> Zipfian {
    zipfian_cached(SCRAMBLED_ITEMS, theta)
}

/// A zipfian over `items` with ζ computed once per (items, θ).
fn zipfian_cached(items: u64, theta: f64) -> Zipfian {
    use std::sync::Mutex;
    static CACHE: Mutex<Vec<((u64, u64), f64)>> = Mutex::new(Vec::new());
    let key = (items, theta.to_bits());
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let zetan = match c.iter().find(|(k, _)| *k == key) {
        Some(&(_, z)) => z,
        None => {
            let z = zeta(items, theta);
            c.push((key, z));
            z
        }
    };
    Zipfian::with_zetan(items, theta, zetan)
}

/// Key distributions by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    /// Every existing key equally likely.
    Uniform,
    /// Zipfian over key numbers, key 0 hottest (the generator of Gray et
    /// al., SIGMOD'94, that YCSB uses).
    Zipfian,
    /// YCSB's scrambled zipfian: zipfian ranks scattered over the key space by
    /// FNV.
    Scrambled,
    /// The most recently inserted keys hottest (workload D).
    Latest,
}

impl Chooser {
    /// A chooser over `keys` keys with skew `theta`.
    pub fn new(d: Distribution, keys: u64, theta: f64) -> Self {
        match d {
            Distribution::Uniform => Chooser::Uniform,
            Distribution::Zipfian if theta >= 1.0 => Chooser::Exact(exact_zipf(keys, theta)),
            Distribution::Zipfian => Chooser::Zipfian(Zipfian::new(keys, theta)),
            Distribution::Scrambled => Chooser::Scrambled(scrambled(theta)),
            Distribution::Latest => Chooser::Latest(Zipfian::new(keys, theta)),
        }
    }

    /// The key numbers of the `count` likeliest keys among `keys` (distinct,
    /// likeliest first): the memory-semantics study's warm-up "selecting
    /// frequent access keys into the hot memory area" (§IV-B). Uniform has
    /// no likelier keys; it gives the first `count`.
    pub fn hottest(&self, keys: u64, count: usize) -> Vec<u64> {
        let n = keys.max(1);
        let count = count.min(n as usize);
        let of_rank = |r: u64| match self {
            Chooser::Uniform | Chooser::Zipfian(_) | Chooser::Exact(_) => r % n,
            Chooser::Scrambled(_) => fnv64(r) % n,
            Chooser::Latest(_) => n - 1 - r % n,
        };
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(count);
        let mut r = 0u64;
        // Scrambled ranks can collide on a key; 4× the ranks always suffice
        // in practice, and the loop stops there regardless.
        while out.len() < count && r < 4 * n.max(count as u64) {
            let k = of_rank(r);
            if seen.insert(k) {
                out.push(k);
            }
            r += 1;
        }
        out
    }

    /// A key number in `[0, inserted)` (`inserted` = keys that exist now).
    pub fn next(&self, rng: &mut Rng, inserted: u64) -> u64 {
        let n = inserted.max(1);
        match self {
            Chooser::Uniform => rng.below(n),
            Chooser::Zipfian(z) => z.next(rng) % n,
            Chooser::Scrambled(z) => fnv64(z.next(rng)) % n,
            Chooser::Latest(z) => n - 1 - z.next(rng) % n,
            Chooser::Exact(cdf) => {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let r = cdf.partition_point(|&c| c <= u).min(cdf.len() - 1);
                r as u64 % n
            }
        }
    }
}

/// Cumulative probabilities of ranks `0..n` of the zipfian with skew
/// `theta` (P(rank i) ∝ 1/(i+1)^θ), the last one exactly 1.
fn exact_zipf(n: u64, theta: f64) -> std::sync::Arc<[f64]> {
    let n = n.max(1) as usize;
    let w: Vec<f64> = (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = w
        .iter()
        .map(|x| {
            acc += x / total;
            acc
        })
        .collect();
    *cdf.last_mut().expect("n ≥ 1") = 1.0;
    cdf.into()
}

/// One operation of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YcsbOp {
    /// Read the value of the key with this number.
    Read(u64),
    /// Overwrite the value of an existing key.
    Update(u64),
    /// Insert a new key (each client inserts disjoint key numbers).
    Insert(u64),
    /// Scan `len` keys from a start key.
    Scan(u64, u32),
    /// Read a key's value, then write it back modified (workload F).
    ReadModifyWrite(u64),
}

/// The standard workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// 100 % inserts: loads the keys.
    Load,
    /// 50 % reads, 50 % updates (update heavy).
    A,
    /// 95 % reads, 5 % updates (read mostly).
    B,
    /// 100 % reads (read only).
    C,
    /// 95 % reads, 5 % inserts, latest keys hottest (read latest).
    D,
    /// 95 % scans of 1..=100 keys, 5 % inserts (short ranges; ordered indexes
    /// only).
    E,
    /// 50 % reads, 50 % read-modify-writes.
    F,
    /// 100 % updates (not a YCSB workload: SMART §6.3's conflict-avoidance
    /// experiment, Fig. 14).
    U,
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "load" => Workload::Load,
            "a" => Workload::A,
            "b" => Workload::B,
            "c" => Workload::C,
            "d" => Workload::D,
            "e" => Workload::E,
            "f" => Workload::F,
            "u" => Workload::U,
            _ => return Err(format!("{s:?}: expected load, a, b, c, d, e, f or u")),
        })
    }
}

/// Operation mix of a workload, in percent: (read, update, insert, scan, rmw).
pub fn mix(w: Workload) -> (u32, u32, u32, u32, u32) {
    match w {
        Workload::Load => (0, 0, 100, 0, 0),
        Workload::A => (50, 50, 0, 0, 0),
        Workload::B => (95, 5, 0, 0, 0),
        Workload::C => (100, 0, 0, 0, 0),
        Workload::D => (95, 0, 5, 0, 0),
        Workload::E => (0, 0, 5, 95, 0),
        Workload::F => (50, 0, 0, 0, 50),
        Workload::U => (0, 100, 0, 0, 0),
    }
}

/// The default key distribution of a workload.
pub fn default_distribution(w: Workload) -> Distribution {
    match w {
        Workload::D => Distribution::Latest,
        Workload::Load => Distribution::Uniform,
        _ => Distribution::Scrambled,
    }
}

/// A deterministic stream of operations for one client.
#[derive(Debug, Clone)]
pub struct Generator {
    workload: Workload,
    chooser: Chooser,
    rng: Rng,
    /// Keys that exist (loaded + inserted by this client's view).
    inserted: u64,
    /// Next key number this client inserts; clients insert disjoint keys
    /// (key = next_insert, advancing by `stride`).
    next_insert: u64,
    stride: u64,
    max_scan: u32,
}

impl Generator {
    /// A client's stream: `loaded` keys exist; new keys are `loaded + client
    /// + k·clients` so clients never insert the same key.
    pub fn new(
        workload: Workload,
        chooser: Chooser,
        loaded: u64,
        client: u64,
        clients: u64,
        seed: u64,
    ) -> Self {
        Self {
            workload,
            chooser,
            rng: Rng::new(seed ^ client.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            inserted: loaded,
            next_insert: loaded + client,
            stride: clients.max(1),
            max_scan: 100,
        }
    }

    /// The next operation.
    pub fn next_op(&mut self) -> YcsbOp {
        let (r, u, i, s, _) = mix(self.workload);
        let p = self.rng.below(100) as u32;
        if p < i + r + u + s && p >= r + u + s || self.workload == Workload::Load {
            let k = self.next_insert;
            self.next_insert += self.stride;
            self.inserted = self.inserted.max(k + 1);
            return YcsbOp::Insert(k);
        }
        let key = self.chooser.next(&mut self.rng, self.inserted);
        if p < r {
            YcsbOp::Read(key)
        } else if p < r + u {
            YcsbOp::Update(key)
        } else if p < r + u + s {
            YcsbOp::Scan(key, 1 + self.rng.below(self.max_scan as u64) as u32)
        } else {
            YcsbOp::ReadModifyWrite(key)
        }
    }
}

/// Key encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// 8-byte integers (the key number, scattered by FNV so neighbours in
    /// number are not neighbours in key order).
    Int,
    /// 32-byte synthetic e-mail-like strings with the host reversed
    /// (`com.example.mail.host:user.name42…`), deterministic from the seed.
    String,
    /// Integer keys of `n` bytes ([`KeyType::MIN_WIDE`] ..=
    /// [`KeyType::MAX_WIDE`]): the 8-byte integer key behind `n − 8` zero
    /// bytes, as SMART's artifact widens its integer keys (`int2key`) for
    /// the radix-tree paper's key-size sweep (OSDI'23 Fig. 18b).
    WideInt(u16),
}

impl KeyType {
    /// Shortest wide integer key.
    pub const MIN_WIDE: u16 = 8;
    /// Longest wide integer key: the indexes' longest (254 B; a tree key
    /// of 254 B takes a 256-byte field in the B+tree's fixed-key slots and
    /// the radix tree's leaves, as a 256-byte key would).
    pub const MAX_WIDE: u16 = 254;

    /// Bytes of every key (all keys of a type have one length).
    pub fn bytes(self) -> usize {
        match self {
            KeyType::Int => 8,
            KeyType::String => 32,
            KeyType::WideInt(n) => n as usize,
        }
    }

    /// Whether the keys are integers (of any width).
    pub fn is_int(self) -> bool {
        matches!(self, KeyType::Int | KeyType::WideInt(_))
    }
}

const TLDS: [&str; 6] = ["com", "org", "net", "edu", "io", "de"];
const HOSTS: [&str; 8] = [
    "gmail", "yahoo", "outlook", "proton", "fastmail", "icloud", "zoho", "mailbox",
];

/// The bytes of key number `k`.
pub fn key_bytes(t: KeyType, k: u64, seed: u64) -> Vec<u8> {
    match t {
        KeyType::Int => fnv64(k ^ seed).to_be_bytes().to_vec(),
        KeyType::WideInt(n) => {
            assert!(
                (KeyType::MIN_WIDE..=KeyType::MAX_WIDE).contains(&n),
                "wide integer keys of {n} B"
            );
            let mut b = vec![0u8; n as usize - 8];
            b.extend_from_slice(&fnv64(k ^ seed).to_be_bytes());
            b
        }
        KeyType::String => {
            let h = fnv64(k ^ seed.rotate_left(17));
            let mut s = format!(
                "{}.{}.u{:x}@{:016x}",
                TLDS[(h % 6) as usize],
                HOSTS[((h >> 8) % 8) as usize],
                (h >> 16) & 0xFFF,
                k ^ (h & 0xFFFF_0000_0000_0000)
            );
            s.truncate(32);
            let mut b = s.into_bytes();
            b.resize(32, b'.');
            b
        }
    }
}

#[cfg(test)]
mod exact_tests {
    use super::*;

    #[test]
    fn the_exact_zipfian_has_the_skews_shares() {
        let c = Chooser::new(Distribution::Zipfian, 1024, 1.5);
        let mut rng = Rng::new(5);
        let mut count = vec![0u64; 1024];
        for _ in 0..200_000 {
            count[c.next(&mut rng, 1024) as usize] += 1;
        }
        // P(0) = 1/ζ(1024, 1.5) ≈ 0.385, P(1) = P(0)/2^1.5.
        let p0 = count[0] as f64 / 200_000.0;
        let p1 = count[1] as f64 / 200_000.0;
        assert!((p0 - 0.385).abs() < 0.01, "{p0}");
        assert!((p1 - p0 / 2f64.powf(1.5)).abs() < 0.01, "{p1}");
        assert_eq!(c.hottest(1024, 3), vec![0, 1, 2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn zeta_of_ycsb_item_count_matches_ycsb_constant() {
        let z = zeta(SCRAMBLED_ITEMS, 0.99);
        assert!((z - 26.469_028_201_783_02).abs() < 1e-6, "{z}");
        // The tail approximation agrees with the exact sum where both exist.
        let exact: f64 = (1..=20_000_000u64)
            .map(|i| 1.0 / (i as f64).powf(0.99))
            .sum();
        assert!((zeta(20_000_000, 0.99) - exact).abs() < 1e-6);
    }

    #[test]
    fn scrambled_zipfian_hottest_share_is_ycsbs() {
        let mut rng = Rng::new(9);
        let n = 1_000_000;
        let sc = Chooser::new(Distribution::Scrambled, n, 0.99);
        let hot = fnv64(0) % n;
        let draws = 400_000;
        let hits = (0..draws).filter(|_| sc.next(&mut rng, n) == hot).count();
        let share = hits as f64 / draws as f64;
        assert!((share - 1.0 / 26.469).abs() < 0.004, "{share}");
    }

    #[test]
    fn zipfian_matches_its_distribution() {
        let n = 10_000;
        let z = Zipfian::new(n, 0.99);
        let zn = zeta(n, 0.99);
        let mut rng = Rng::new(42);
        let mut hist = vec![0u64; n as usize];
        let draws = 400_000;
        for _ in 0..draws {
            hist[z.next(&mut rng) as usize] += 1;
        }
        // P(rank r) = 1 / ((r+1)^θ ζ(n)): exact for ranks 0 and 1, the
        // method's continuous approximation beyond.
        for (r, tol) in [(0usize, 0.05), (1, 0.05), (2, 0.30), (9, 0.30), (99, 0.35)] {
            let p = 1.0 / (((r + 1) as f64).powf(0.99) * zn);
            let got = hist[r] as f64 / draws as f64;
            assert!((got - p).abs() < tol * p + 0.0003, "rank {r}: {got} vs {p}");
        }
        let head: u64 = hist[..100].iter().sum();
        let want: f64 = (1..=100).map(|i| 1.0 / (i as f64).powf(0.99)).sum::<f64>() / zn;
        assert!(
            (head as f64 / draws as f64 - want).abs() < 0.05,
            "mass of the top 100 ranks"
        );
        assert!(hist[0] > hist[1] && hist[1] > hist[9]);
    }

    #[test]
    fn choosers_and_workload_mixes() {
        let mut rng = Rng::new(7);
        let n = 5_000;
        // Scrambled zipfian: skewed, but the hottest keys are not 0, 1, 2.
        // `hottest` names the keys it draws most.
        let top = Chooser::new(Distribution::Scrambled, n, 0.99).hottest(n, 3);
        assert_eq!(top.len(), 3);
        let sc = Chooser::new(Distribution::Scrambled, n, 0.99);
        let mut hist = vec![0u32; n as usize];
        for _ in 0..100_000 {
            hist[sc.next(&mut rng, n) as usize] += 1;
        }
        let hottest = (0..n as usize).max_by_key(|&i| hist[i]).unwrap();
        assert_eq!(
            hottest as u64,
            fnv64(0) % n,
            "rank 0 lands where FNV sends it"
        );
        assert!(hist[hottest] > 20 * (100_000 / n as u32));
        assert_eq!(top[0], hottest as u64);
        // The three keys `hottest` names are drawn more than any other.
        let mut by_count: Vec<usize> = (0..n as usize).collect();
        by_count.sort_by_key(|&i| std::cmp::Reverse(hist[i]));
        let mut top3: Vec<u64> = by_count[..3].iter().map(|&i| i as u64).collect();
        let mut want = top.clone();
        top3.sort();
        want.sort();
        assert_eq!(top3, want);
        // Latest: the newest keys dominate.
        let la = Chooser::new(Distribution::Latest, n, 0.99);
        let recent = (0..10_000)
            .filter(|_| la.next(&mut rng, n) >= n - 100)
            .count();
        assert!(recent > 5_000, "{recent}");
        // Mixes.
        for (w, read, upd, ins, scan, rmw) in [
            (Workload::A, 50, 50, 0, 0, 0),
            (Workload::B, 95, 5, 0, 0, 0),
            (Workload::D, 95, 0, 5, 0, 0),
            (Workload::E, 0, 0, 5, 95, 0),
            (Workload::F, 50, 0, 0, 0, 50),
        ] {
            let mut g = Generator::new(
                w,
                Chooser::new(default_distribution(w), 1000, 0.99),
                1000,
                0,
                1,
                3,
            );
            let mut c = [0u32; 5];
            for _ in 0..20_000 {
                match g.next_op() {
                    YcsbOp::Read(_) => c[0] += 1,
                    YcsbOp::Update(_) => c[1] += 1,
                    YcsbOp::Insert(_) => c[2] += 1,
                    YcsbOp::Scan(_, l) => {
                        assert!((1..=100).contains(&l));
                        c[3] += 1
                    }
                    YcsbOp::ReadModifyWrite(_) => c[4] += 1,
                }
            }
            for (got, want) in c.iter().zip([read, upd, ins, scan, rmw]) {
                let pct = *got as f64 / 200.0;
                assert!((pct - want as f64).abs() < 1.5, "{w:?}: {c:?}");
            }
        }
    }

    #[test]
    fn inserts_are_disjoint_across_clients_and_streams_are_deterministic() {
        let mk = |client| Generator::new(Workload::Load, Chooser::Uniform, 100, client, 3, 9);
        let mut seen = HashSet::new();
        for client in 0..3 {
            let mut g = mk(client);
            for _ in 0..1000 {
                let YcsbOp::Insert(k) = g.next_op() else {
                    panic!()
                };
                assert!(k >= 100 && seen.insert(k), "key {k} inserted twice");
            }
        }
        let (mut a, mut b) = (
            Generator::new(
                Workload::A,
                Chooser::new(Distribution::Scrambled, 1000, 0.99),
                1000,
                1,
                2,
                5,
            ),
            Generator::new(
                Workload::A,
                Chooser::new(Distribution::Scrambled, 1000, 0.99),
                1000,
                1,
                2,
                5,
            ),
        );
        for _ in 0..1000 {
            assert_eq!(a.next_op(), b.next_op());
        }
        assert_eq!("c".parse::<Workload>(), Ok(Workload::C));
        assert!("z".parse::<Workload>().is_err());
    }

    #[test]
    fn key_types() {
        let mut seen = HashSet::new();
        for k in 0..100_000u64 {
            let s = key_bytes(KeyType::String, k, 1);
            assert_eq!(s.len(), 32);
            assert!(s.iter().all(|b| b.is_ascii_graphic()));
            assert!(seen.insert(s), "string key {k} collides");
        }
        assert_eq!(
            key_bytes(KeyType::String, 5, 1),
            key_bytes(KeyType::String, 5, 1)
        );
        assert_ne!(
            key_bytes(KeyType::String, 5, 1),
            key_bytes(KeyType::String, 5, 2)
        );
        assert_eq!(key_bytes(KeyType::Int, 5, 1).len(), 8);
        // Wide integers: the 8-byte key behind zeros, so they order as the
        // 8-byte keys do.
        let w = key_bytes(KeyType::WideInt(40), 5, 1);
        assert_eq!(w.len(), 40);
        assert!(w[..32].iter().all(|&b| b == 0));
        assert_eq!(&w[32..], key_bytes(KeyType::Int, 5, 1).as_slice());
        assert_eq!(
            key_bytes(KeyType::WideInt(8), 5, 1),
            key_bytes(KeyType::Int, 5, 1)
        );
        let (a, b) = (key_bytes(KeyType::Int, 6, 1), key_bytes(KeyType::Int, 7, 1));
        let (wa, wb) = (
            key_bytes(KeyType::WideInt(254), 6, 1),
            key_bytes(KeyType::WideInt(254), 7, 1),
        );
        assert_eq!(a.cmp(&b), wa.cmp(&wb));
        assert_eq!(KeyType::WideInt(254).bytes(), 254);
        let first = String::from_utf8(key_bytes(KeyType::String, 12, 1)).unwrap();
        assert!(
            TLDS.iter().any(|t| first.starts_with(&format!("{t}."))),
            "{first}"
        );
    }
}

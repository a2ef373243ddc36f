//! The switch's own cost per packet on the host, fed captured frames (no
//! sockets): `cargo run --release -p dmkit-switch --example wire_cost
//! [CAPTURE.pcap] [ROUNDS]` (default: the test fixture). Prints ns per
//! frame for the pass-through path (learn, parse, count, ICRC check), the
//! same without the ICRC check, and the rewrite path of a CAS (parse,
//! rewrite the AtomicETH, serialize, reseal IP checksum and ICRC), and
//! CAS→WRITE's two rewrites (a CAS into a WRITE ONLY, an ACK into an
//! atomic ACK: parse, rebuild, relength, serialize, reseal).

use std::hint::black_box;
use std::time::Instant;

use dmkit_switch::hub::Core;
use dmkit_switch::wire::{self, Frame};
use pcap_file::pcap::PcapReader;

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rxe.pcap").to_string()
    });
    let rounds: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().expect("ROUNDS"))
        .unwrap_or(0);
    let mut r = PcapReader::new(std::fs::File::open(&path).expect("capture")).expect("pcap");
    let mut frames = Vec::new();
    while let Some(p) = r.next_packet() {
        frames.push(p.expect("packet").data.into_owned());
    }
    let bytes: usize = frames.iter().map(Vec::len).sum();
    // About 2 million frames per measurement unless told.
    let rounds = if rounds == 0 {
        (2_000_000 / frames.len().max(1)).max(1)
    } else {
        rounds
    };
    println!(
        "{path}: {} frames, {:.0} B average; {rounds} rounds",
        frames.len(),
        bytes as f64 / frames.len() as f64
    );
    for check in [true, false] {
        let mut core = Core::new(vec!["a".into(), "b".into()]);
        core.check_icrc = check;
        let t = Instant::now();
        for _ in 0..rounds {
            for (i, f) in frames.iter().enumerate() {
                black_box(core.on_frame(i & 1, f));
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / (rounds * frames.len()) as f64;
        println!(
            "pass-through{}: {ns:.0} ns/frame ({:.2} Mframes/s on one core)",
            if check { " + ICRC check" } else { "" },
            1e3 / ns
        );
    }
    let cas: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|f| {
            matches!(wire::parse(f), Ok(Frame::Roce(p, _)) if p.bth.opcode == wire::opcode::COMPARE_SWAP)
        })
        .collect();
    if cas.is_empty() {
        println!("no CAS in the capture: rewrite path not measured");
        return;
    }
    let n = (2_000_000 / cas.len()).max(1);
    let t = Instant::now();
    for _ in 0..n {
        for f in &cas {
            let Ok(Frame::Roce(mut p, _)) = wire::parse(f) else {
                unreachable!()
            };
            if let Some(dmkit_switch::Verb::Cas {
                addr,
                compare,
                swap,
            }) = wire::verb_of(&p)
            {
                wire::set_verb(
                    &mut p,
                    &dmkit_switch::Verb::Cas {
                        addr: addr ^ 64,
                        compare,
                        swap,
                    },
                );
            }
            let mut out = p.to_bytes();
            wire::seal(&mut out).expect("seal");
            black_box(out);
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / (n * cas.len()) as f64;
    println!(
        "CAS rewrite (parse, rewrite, serialize, reseal): {ns:.0} ns/packet ({:.2} Mpackets/s)",
        1e3 / ns
    );
    let t = Instant::now();
    for _ in 0..n {
        for f in &cas {
            let Ok(Frame::Roce(p, _)) = wire::parse(f) else {
                unreachable!()
            };
            black_box(dmkit_switch::caswrite::cas_as_write(&p).expect("converts"));
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / (n * cas.len()) as f64;
    println!("CAS→WRITE (parse, rebuild as WRITE ONLY, reseal): {ns:.0} ns/packet");
    let acks: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|f| {
            matches!(wire::parse(f), Ok(Frame::Roce(p, _)) if p.bth.opcode == wire::opcode::ACKNOWLEDGE)
        })
        .collect();
    let n = (2_000_000 / acks.len().max(1)).max(1);
    let t = Instant::now();
    for _ in 0..n {
        for f in &acks {
            let Ok(Frame::Roce(p, _)) = wire::parse(f) else {
                unreachable!()
            };
            black_box(dmkit_switch::caswrite::atomic_ack(&p, p.bth.psn, 1).expect("builds"));
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / (n * acks.len().max(1)) as f64;
    println!("ACK→atomic ACK (parse, rebuild, reseal): {ns:.0} ns/packet");
}

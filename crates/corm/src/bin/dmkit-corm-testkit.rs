//! Child-process helper for dmkit-corm's kill tests. Not a user tool.
//!
//! ```text
//! dmkit-corm-testkit churn SOCKET OBJECTS SIZE
//! ```
//! Connects to the shm node at SOCKET (serving CoRM), allocates OBJECTS
//! objects of SIZE bytes and writes each ("obj ADDR META" per object, in
//! hex, then "ready"), then until killed: overwrites them round-robin by
//! RPC, and allocates, writes and frees one more object per round,
//! announcing each step before it starts ("alloc", "free ADDR META") and
//! after it ends ("got ADDR META", "freed"), so the parent knows what a
//! kill may have cut short. Values: byte `i` of tag `t` is `13t + 7i`
//! (mod 256): a reader recognises a whole object by its 7-byte steps.

use std::io::Write;
use std::process::ExitCode;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_fabric::{Fabric, RpcChannel, RpcFailure};
use dmkit_memnode::corm::service::{
    decode_answer, decode_fault, encode_request, CormAnswer, CormRequest, CORM,
};
use dmkit_memnode::corm::{ObjPtr, Op, Reply};

fn value(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag as usize * 13 + i * 7) as u8)
        .collect()
}

fn op(ch: &mut dyn RpcChannel, o: Op) -> Result<Reply, String> {
    match ch.call(CORM, &encode_request(&CormRequest::Op(o))) {
        Ok(bytes) => match decode_answer(&bytes)? {
            CormAnswer::Done(r) => Ok(r),
            other => Err(format!("unexpected answer {other:?}")),
        },
        Err(RpcFailure::Service(e)) => Err(format!("{:?}", decode_fault(&e))),
        Err(f) => Err(f.to_string()),
    }
}

fn line(out: &mut impl Write, s: std::fmt::Arguments<'_>) {
    writeln!(out, "{s}").expect("stdout");
    out.flush().expect("stdout");
}

fn churn(ch: &mut dyn RpcChannel, objects: usize, size: usize) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    let mut objs: Vec<ObjPtr> = Vec::new();
    for i in 0..objects {
        let Reply::Allocated(p) = op(ch, Op::Alloc(size as u32))? else {
            return Err("alloc answered something else".into());
        };
        op(ch, Op::Write(p, value(i as u64, size)))?;
        line(&mut out, format_args!("obj {:x} {:x}", p.addr, p.meta));
        objs.push(p);
    }
    line(&mut out, format_args!("ready"));
    for round in 0u64.. {
        for (i, p) in objs.iter().enumerate() {
            op(ch, Op::Write(*p, value(round + i as u64, size)))?;
        }
        line(&mut out, format_args!("alloc"));
        let Reply::Allocated(q) = op(ch, Op::Alloc(size as u32))? else {
            return Err("alloc answered something else".into());
        };
        line(&mut out, format_args!("got {:x} {:x}", q.addr, q.meta));
        op(ch, Op::Write(q, value(round, size)))?;
        line(&mut out, format_args!("free {:x} {:x}", q.addr, q.meta));
        op(ch, Op::Free(q))?;
        line(&mut out, format_args!("freed"));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 4 || args[0] != "churn" {
        eprintln!("usage: dmkit-corm-testkit churn SOCKET OBJECTS SIZE");
        return ExitCode::from(2);
    }
    let (objects, size) = match (args[2].parse(), args[3].parse()) {
        (Ok(o), Ok(s)) => (o, s),
        _ => {
            eprintln!("OBJECTS and SIZE are numbers");
            return ExitCode::from(2);
        }
    };
    let cfg = ShmConfig {
        rpc_max_message: 8192,
        ..Default::default()
    };
    let r = ShmFabric::open(cfg, &[Target::new(&args[1])])
        .map_err(|e| e.to_string())
        .and_then(|f| {
            let mut ch = f.connect_rpc(0).map_err(|e| e.to_string())?;
            churn(&mut *ch, objects, size)
        });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dmkit-corm-testkit: {e}");
            ExitCode::from(1)
        }
    }
}

//! A hash table on a memory node process, shared by every program that
//! opens it by name: each run adds ten keys to what earlier runs left.
//!
//! ```text
//! dmkit memnode --size 1GiB --listen unix:/tmp/dm0.sock &
//! cargo run --release -p dmkit-examples --example shared_node -- /tmp/dm0.sock
//! ```

use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_index::{IndexError, MapClient, RemoteMap};
use dmkit_race::{RaceConfig, RaceTable};
use dmkit_runtime::Worker;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(socket) = std::env::args().nth(1) else {
        eprintln!("usage: shared_node SOCKET   (a node from `dmkit memnode --listen unix:SOCKET`)");
        std::process::exit(2);
    };
    // Connects with the secret in SOCKET.token, written by the node.
    let fabric = Arc::new(ShmFabric::open(
        ShmConfig::default(),
        &[Target::new(&socket)],
    )?);
    // Open the shared table, or make it if this is the first run.
    let table = match RaceTable::open(fabric.clone(), "shared", RaceConfig::default()) {
        Err(IndexError::NotFound { .. }) => {
            RaceTable::create(fabric.clone(), "shared", RaceConfig::default())?
        }
        other => other?,
    };
    let mut worker = Worker::builder(fabric.as_ref())
        .local(table.local_layout())
        .build()?;
    // A client id unique among the table's live clients: the process id.
    let client = table.client(std::process::id() as u64);
    worker.spawn(move |ctx| async move {
        let run = async {
            let mut n = 0;
            while client
                .search(&ctx, format!("run-{n}").as_bytes())
                .await?
                .is_some()
            {
                n += 1;
            }
            client
                .insert(&ctx, format!("run-{n}").as_bytes(), b"")
                .await?;
            for i in 0..10 {
                let key = format!("run-{n}-key-{i}");
                client.insert(&ctx, key.as_bytes(), &[i as u8]).await?;
            }
            println!(
                "run {n}: the table holds {} keys",
                client.entries(&ctx).await?.len()
            );
            Ok::<_, IndexError>(())
        };
        if let Err(e) = run.await {
            eprintln!("{e}");
        }
    });
    worker.run();
    // The table stays on the node for the next run; `destroy` would end it.
    Ok(())
}

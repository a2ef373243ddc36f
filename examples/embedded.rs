//! A radix tree on an embedded memory node: create it, run four tasks on
//! one worker, read it back in key order, destroy it.
//!
//! `cargo run --release -p dmkit-examples --example embedded`

use std::sync::Arc;

use dmkit_art::{ArtConfig, ArtTree};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_index::{IndexError, MapClient, RemoteMap};
use dmkit_memnode::NodeConfig;
use dmkit_runtime::Worker;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A 256 MiB memory node living in this process (shm backend).
    let node = NodeConfig {
        size: 256 << 20,
        ..Default::default()
    };
    let fabric = Arc::new(ShmFabric::embedded(ShmConfig::default(), &[node])?);
    let tree = ArtTree::create(fabric.clone(), "example", ArtConfig::default())?;

    // One worker (one OS thread's queue pairs), four tasks, each with the
    // task-local memory the tree declared.
    let mut worker = Worker::builder(fabric.as_ref())
        .tasks(4)
        .local(tree.local_layout())
        .build()?;
    let client = tree.client(1);
    for t in 0..4u32 {
        let client = client.clone();
        worker.spawn(move |ctx| async move {
            let run = async {
                for i in (t..1000).step_by(4) {
                    let key = format!("user{i:04}");
                    client
                        .insert(&ctx, key.as_bytes(), &i.to_le_bytes())
                        .await?;
                }
                Ok::<_, IndexError>(())
            };
            if let Err(e) = run.await {
                eprintln!("task {t}: {e}");
            }
        });
    }
    worker.run();

    // One more task reads back: a point lookup, a range scan, a delete.
    worker.spawn(move |ctx| async move {
        let run = async {
            let v = client.search(&ctx, b"user0042").await?;
            println!(
                "user0042 -> {:?}",
                v.map(|b| u32::from_le_bytes(b[..4].try_into().unwrap()))
            );
            for (k, _) in client.scan(&ctx, b"user0995", 10).await? {
                println!("scan: {}", String::from_utf8_lossy(&k));
            }
            println!(
                "deleted user0000: {}",
                client.delete(&ctx, b"user0000").await?
            );
            Ok::<_, IndexError>(())
        };
        if let Err(e) = run.await {
            eprintln!("reader: {e}");
        }
    });
    worker.run();
    let s = worker.stats();
    println!(
        "{} round trips, {} READs, {} CAS",
        s.counters.round_trips, s.counters.reads, s.counters.cas
    );
    tree.destroy()?;
    Ok(())
}

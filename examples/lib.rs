//! # dmkit's examples
//!
//! Using an index as a library, in a few dozen lines each:
//!
//! - `embedded` — a memory node in the program's own process (the shm
//!   backend's embedded node), a radix tree on it, one worker of four
//!   tasks inserting, reading, scanning and deleting:
//!   `cargo run --release -p dmkit-examples --example embedded`
//! - `shared_node` — a memory node as its own process (`dmkit memnode`),
//!   and a hash table that every run of the example opens (or creates) by
//!   name and adds to, so several programs share it:
//!   ```text
//!   dmkit memnode --size 1GiB --listen unix:/tmp/dm0.sock &
//!   cargo run --release -p dmkit-examples --example shared_node -- /tmp/dm0.sock
//!   cargo run --release -p dmkit-examples --example shared_node -- /tmp/dm0.sock
//!   ```
//!
//! Both are written against the index layer's contract
//! (`dmkit_index::RemoteMap`, `MapClient`): swapping the radix tree for the
//! hash table or the B+tree changes one type name.

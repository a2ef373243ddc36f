//! Child-process helper for dmkit-btree's multi-process tests. Not a user
//! tool; see `dmkit_lincheck::stress::testkit_main` for the arguments.

use dmkit_btree::{Btree, BtreeConfig};

fn main() -> std::process::ExitCode {
    dmkit_lincheck::stress::testkit_main(|fabric, name| {
        let tree = Btree::open(fabric, name, BtreeConfig::default()).map_err(|e| e.to_string())?;
        Ok(move |id| tree.client(id))
    })
}

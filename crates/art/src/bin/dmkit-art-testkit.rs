//! Child-process helper for dmkit-art's multi-process tests. Not a user
//! tool; see `dmkit_lincheck::stress::testkit_main` for the arguments.

use dmkit_art::{ArtConfig, ArtTree};

fn main() -> std::process::ExitCode {
    dmkit_lincheck::stress::testkit_main(|fabric, name| {
        let tree = ArtTree::open(fabric, name, ArtConfig::default()).map_err(|e| e.to_string())?;
        Ok(move |id| tree.client(id))
    })
}

//! Records the commit the benchmarks were built from (`DMKIT_COMMIT`),
//! for the provenance every result carries ([`harness::Provenance`]).
//!
//! `git rev-parse HEAD` at build time; `DMKIT_COMMIT` in the environment
//! overrides it (builds from a tarball), and "unknown" is the answer
//! without git. The script reruns when HEAD or the branch it names moves,
//! so a commit is never stale; uncommitted changes are not detected.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn watch(path: &str) {
    if Path::new(path).exists() {
        println!("cargo:rerun-if-changed={path}");
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=DMKIT_COMMIT");
    let commit = std::env::var("DMKIT_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        watch(&format!("{dir}/HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(&format!("{common}/{branch}"));
        }
        watch(&format!("{common}/packed-refs"));
    }
    println!("cargo:rustc-env=DMKIT_COMMIT={commit}");
}

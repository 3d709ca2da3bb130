//! What the example binaries' tests share.

use std::path::PathBuf;

/// The quickstart example binary, built by `scripts/test` before the tests run
/// (`--all-targets` builds examples only as test harnesses).
pub fn quickstart() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|debug| debug.join("examples").join("quickstart"))
        .unwrap();
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p examples --example quickstart` (scripts/test builds it first)",
        bin.display()
    );
    bin
}

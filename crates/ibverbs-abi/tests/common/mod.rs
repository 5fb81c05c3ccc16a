//! Helpers shared by the integration tests: tool detection and loud skipping.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The header the layout test compiles against (Debian package `libibverbs-dev`).
pub const VERBS_H: &str = "/usr/include/infiniband/verbs.h";

/// Whether CI asked for every cross-check to run (`SOFTVERBS_REQUIRE_TOOLS=1`).
pub fn tools_required() -> bool {
    std::env::var("SOFTVERBS_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Skips loudly, or panics when `SOFTVERBS_REQUIRE_TOOLS=1`.
pub fn skip(why: &str) {
    if tools_required() {
        panic!("{why} (SOFTVERBS_REQUIRE_TOOLS=1, so this is an error)");
    }
    eprintln!("SKIPPED: {why}");
    eprintln!("SKIPPED: set SOFTVERBS_REQUIRE_TOOLS=1 to make this an error");
}

/// Whether `tool --version` runs.
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A scratch directory for this test's files (under cargo's per-crate test tmpdir).
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Runs `cmd`, panicking with its output unless it succeeds; returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

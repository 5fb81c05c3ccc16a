//! The extended verbs as an unmodified C program sees them: `tests/extended.c`, compiled
//! against rdma-core 44's `<infiniband/verbs.h>` and linked (`-z now`) against the built
//! cdylib, drives `ibv_create_cq_ex` (start/next/end_poll, the `ibv_wc_read_*` readers,
//! completion timestamps), `ibv_create_qp_ex` with send_ops_flags and the `ibv_wr_*`
//! post-send API (SEND, SEND with immediate, inline data, SGE lists, RDMA WRITE and READ,
//! both atomics, `wr_abort`, failing batches, memory-window binds and LOCAL_INV) on two RC
//! QPs over loopback, and UD SENDs with `wr_set_ud_addr`; it checks data, atomic results and
//! completions itself and exits non-zero with a message on any mismatch.
//!
//! Needs `cc` and the `libibverbs-dev` headers; skips loudly without them, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const LIB: &str = "libsoftverbs_ibverbs.so";

/// The cdylib cargo built alongside the rlib this test links. `cargo test` writes it to the
/// `deps` directory holding this test's executable and does not refresh the copy in the
/// profile directory (`target/debug`), which `cargo build` leaves there and which may be
/// stale: the newer of the two is taken.
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    let found = [deps, deps.parent().expect("profile dir")]
        .into_iter()
        .map(|d| d.join(LIB))
        .filter_map(|so| Some((so.metadata().ok()?.modified().ok()?, so)))
        .max_by_key(|(t, _)| *t);
    match found {
        Some((_, so)) => so,
        None => panic!("{LIB} not found next to {}", deps.display()),
    }
}

#[test]
fn extended_verbs_from_c() {
    if !common::have("cc") {
        common::skip("`cc` not available");
        return;
    }
    if !Path::new(common::VERBS_H).exists() {
        common::skip(&format!(
            "{} not found (apt-get install libibverbs-dev)",
            common::VERBS_H
        ));
        return;
    }
    let so = cdylib();
    let lib_dir = so.parent().expect("cdylib dir");
    let run_dir = common::scratch("extended");
    let link = run_dir.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&so, &link).expect("symlink libibverbs.so.1");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/extended.c");
    let exe = run_dir.join("extended");
    // Real rdma-core headers; linked against our cdylib by file name, found at run time by
    // its SONAME (libibverbs.so.1) through the rpath; `-z now` as the rdma-core tools use.
    common::run(
        Command::new("cc")
            .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-L")
            .arg(lib_dir)
            .arg(format!("-l:{LIB}"))
            .arg(format!("-Wl,-rpath,{}", run_dir.display()))
            .arg("-Wl,-z,now"),
    );
    let out = Command::new(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("SOFTVERBS_ADDR")
        .env_remove("SOFTVERBS_PORT")
        .env_remove("SOFTVERBS_FAULTS")
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "C program failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("extended verbs: ok"), "{stdout}\n{stderr}");
}

//! Helpers for the integration tests: the built library, a drop-in directory, and C programs
//! built as rdma-core applications are (installed headers, rdma-core's link libraries,
//! `-z now`) and run on the drop-in libraries through `LD_LIBRARY_PATH`.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use softverbs_stub_support::testing::{run, skip, tools_present, StubLib};

/// ibverbs-abi's two-process harness (sides, deadlines, network namespaces), shared by
/// path rather than copied.
#[path = "../../../ibverbs-abi/tests/common/mod.rs"]
pub mod procs;

pub mod cm_run;

/// librdmacm as its tests see it.
pub const LIB: StubLib = StubLib {
    file: "libsoftverbs_rdmacm.so",
    soname: "librdmacm.so.1",
    exports: include_str!("../../exports.txt"),
    nodes: include_str!("../../nodes.txt"),
};

/// The drop-in libibverbs cargo builds (package softverbs-ibverbs-abi).
pub const IBVERBS: &str = "libsoftverbs_ibverbs.so";

/// The header C programs include (Debian package librdmacm-dev).
pub const RDMA_CMA_H: &str = "/usr/include/rdma/rdma_cma.h";

/// `len` reproducible bytes with no pattern a transport could favour (xorshift64 from
/// `seed`), for files copied across and compared.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// A scratch directory for this test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Points `dir/name` at `target` (replacing what is there).
fn link_into(dir: &Path, name: &str, target: &Path) {
    let link = dir.join(name);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(target, &link)
        .unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
}

/// A directory holding `librdmacm.so.1` -> this crate's cdylib and, when `ibverbs`, also
/// `libibverbs.so.1` -> softverbs' (which `cargo test -p` does not build: it comes from
/// `cargo build --workspace`, and this panics saying so when it is missing). Without it, the
/// loader finds the system's libibverbs.so.1 (rdma-core's).
pub fn dropin(name: &str, ibverbs: bool) -> PathBuf {
    let ours = LIB.cdylib();
    let dir = scratch(name).join("dropin");
    std::fs::create_dir_all(&dir).expect("create drop-in dir");
    link_into(
        &dir,
        LIB.soname,
        &ours.canonicalize().expect("library path"),
    );
    let _ = std::fs::remove_file(dir.join("libibverbs.so.1"));
    if ibverbs {
        let so = ours.parent().expect("profile dir").join(IBVERBS);
        assert!(
            so.exists(),
            "{} not found: run `cargo build --workspace` first (`cargo test -p` does not build it)",
            so.display()
        );
        link_into(
            &dir,
            "libibverbs.so.1",
            &so.canonicalize().expect("library path"),
        );
    }
    dir
}

/// Whether C programs against rdma-core's headers can be built here; skips loudly if not.
pub fn can_build_programs() -> bool {
    if !tools_present(&["cc"]) {
        return false;
    }
    if !Path::new(RDMA_CMA_H).exists() {
        skip(&format!(
            "{RDMA_CMA_H} not installed (apt-get install librdmacm-dev)"
        ));
        return false;
    }
    true
}

/// Compiles `source` in `scratch(name)` exactly as an rdma-core application is built: the
/// installed headers, rdma-core's own `librdmacm.so` / `libibverbs.so` to link against, and
/// `-z now` as rdma-core's tools use.
pub fn build_program(name: &str, source: &str) -> PathBuf {
    let dir = scratch(name);
    let src = dir.join("main.c");
    let exe = dir.join("main");
    std::fs::write(&src, source).expect("write the C program");
    run(Command::new("cc")
        .arg("-Wall")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs", "-lpthread", "-Wl,-z,now"]));
    exe
}

/// What a program printed.
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `exe` with `dir` first on `LD_LIBRARY_PATH`, killing it after 60 s.
pub fn run_on(exe: &Path, dir: &Path) -> Output {
    run_bounded(Command::new(exe).env("LD_LIBRARY_PATH", dir), exe)
}

/// Runs `exe` as [`run_on`] does, under valgrind's memcheck: fails on any memory error or
/// definite leak (`--error-exitcode`), whoever's.
pub fn run_on_under_memcheck(exe: &Path, dir: &Path) -> Output {
    run_bounded(
        Command::new("valgrind")
            .args([
                "-q",
                "--error-exitcode=99",
                "--leak-check=full",
                "--errors-for-leak-kinds=definite",
            ])
            .arg(exe)
            .env("LD_LIBRARY_PATH", dir),
        exe,
    )
}

fn run_bounded(cmd: &mut Command, exe: &Path) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", exe.display()));
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} still running after 60 s; killed", exe.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        success: status.success(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// The part of every C program that names errno values.
pub const C_PRELUDE: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <infiniband/ib.h>

static const char *e(int v) {
    switch (v) {
    case 0: return "0";
    case EINVAL: return "EINVAL";
    case EAGAIN: return "EAGAIN";
    case EINTR: return "EINTR";
    case ENOSYS: return "ENOSYS";
    case ENODEV: return "ENODEV";
    case EBADF: return "EBADF";
    case ENOTSUP: return "ENOTSUP";
    case ENOMEM: return "ENOMEM";
    default: return "other";
    }
}

/* "name result errno" with errno only when the result is not 0. */
#define SHOW(name, call) do { \
    errno = 0; long r_ = (long)(call); \
    printf("%s %ld %s\n", name, r_, r_ ? e(errno) : "-"); } while (0)
"#;

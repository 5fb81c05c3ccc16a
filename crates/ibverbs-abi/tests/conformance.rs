//! Provider conformance as an unmodified C program sees it: `tests/conformance.c`, compiled
//! against rdma-core 44's `<infiniband/verbs.h>` and linked (`-z now`) against the built
//! cdylib, runs each case in a process of its own (see the C file for what each checks):
//! two contexts of softverbs0 talking to each other through their shared port's GID and LID,
//! the event calls on non-blocking fds and under signals, destroy calls waiting for event
//! acknowledgements, no event for a destroyed object, memory registration refusals,
//! `num_sge` refusals, and `fork()`.
//!
//! Needs `cc` and the `libibverbs-dev` headers; skips loudly without them, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const LIB: &str = "libsoftverbs_ibverbs.so";

/// The cdylib cargo built alongside the rlib this test links (the newer of the `deps` and
/// profile directory copies, as in `tests/extended.rs`).
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

/// The compiled program (built once per test binary), or None when it cannot be built here.
fn program() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| {
        if !common::have("cc") {
            common::skip("`cc` not available");
            return None;
        }
        if !Path::new(common::VERBS_H).exists() {
            common::skip(&format!(
                "{} not found (apt-get install libibverbs-dev)",
                common::VERBS_H
            ));
            return None;
        }
        let so = cdylib();
        let lib_dir = so.parent().expect("cdylib dir");
        let run_dir = common::scratch("conformance");
        let link = run_dir.join("libibverbs.so.1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&so, &link).expect("symlink libibverbs.so.1");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance.c");
        let exe = run_dir.join("conformance");
        common::run(
            Command::new("cc")
                .args([
                    "-std=gnu11",
                    "-O1",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-pthread",
                    "-o",
                ])
                .arg(&exe)
                .arg(&src)
                .arg("-L")
                .arg(lib_dir)
                .arg(format!("-l:{LIB}"))
                .arg(format!("-Wl,-rpath,{}", run_dir.display()))
                .arg("-Wl,-z,now"),
        );
        Some(exe)
    })
    .as_deref()
}

/// Runs one case with the default addressing (each process its own loopback address) and
/// `env`; it must print `conformance CASE: ok`.
fn case(name: &str, env: &[(&str, &str)]) {
    let Some(exe) = program() else {
        return;
    };
    let mut cmd = Command::new(exe);
    cmd.arg(name).env_remove("LD_LIBRARY_PATH");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SOFTVERBS_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the C program");
    let pid = child.id();
    // A case that hangs (a wait that is never interrupted) is killed, not waited for.
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        // SAFETY: kill(2) of our own child; at worst it exited already.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    });
    let out = child.wait_with_output().expect("wait for the C program");
    drop(watchdog);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "conformance {name} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains(&format!("conformance {name}: ok")),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn two_contexts_share_the_port() {
    case("two-contexts", &[]);
}

#[test]
fn many_contexts_share_one_device_and_one_thread() {
    case("many-contexts", &[]);
}

#[test]
fn limits_fail_with_the_kernels_errno() {
    case("limits", &[]);
}

#[test]
fn event_calls_on_nonblocking_fds_say_eagain() {
    case("nonblock", &[]);
}

#[test]
fn event_calls_interrupted_by_a_signal_say_eintr() {
    case("signal", &[]);
}

#[test]
fn destroy_waits_for_unacknowledged_events() {
    case("destroy-waits", &[]);
}

#[test]
fn no_event_for_a_destroyed_object() {
    case("no-stale-events", &[]);
}

#[test]
fn reg_mr_refuses_what_the_kernel_refuses() {
    case("reg-mr", &[("SOFTVERBS_MAX_MR_BYTES", "268435456")]);
}

#[test]
fn num_sge_is_checked_before_sg_list_is_read() {
    case("num-sge", &[]);
}

#[test]
fn fork_leaves_inherited_contexts_dead_and_the_parent_working() {
    case("fork", &[]);
}

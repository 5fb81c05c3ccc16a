//! Scale-out stacks on softverbs, unmodified, as Debian 12 ships them: UCX 1.13 (`ucx_info`,
//! `ucx_perftest`), Open MPI 4.1 (`mpirun` over `pml ucx`, and over `pml cm` / `mtl ofi` with
//! libfabric's verbs provider), libfabric 1.17 (`fi_pingpong`) and NetPIPE. Every program
//! runs under `softverbs run`, which gives it the drop-in libraries and, in a private mount
//! namespace, the `/dev/infiniband/softverbs0` node UCX wants (docs/scale-out.md).
//!
//! Only the transport is chosen (`UCX_TLS=rc_verbs,ud_verbs`, `--mca pml ucx`,
//! `mtl_ofi_provider_include`, `fi_pingpong -p`); UCX's UD destination GID check stays on.
//! As nothing else than softverbs offers those transports here, a run that succeeds went
//! over softverbs. `--allow-run-as-root` and `--oversubscribe` are environment (root, 2 cores).
//!
//! Two processes on one host over loopback; UCX also between two network namespaces (root
//! and iproute2). Every run is bounded in time; the processes of a run that overstays are
//! killed and the test fails. The validating MPI programs (`scale_out/*.c`, compiled with
//! `mpicc`) check every byte; UCX's own figures must be non-zero. Cases run one at a time
//! (the tools busy-poll). Without the tools the tests skip loudly, or fail under
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI). The libraries come from `cargo build --workspace`.

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::procs::Netns;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
/// Longest any one program may run.
const TIMEOUT: Duration = Duration::from_secs(60);
/// What the acceptance criteria choose: RC for data, UD for UCX's wire-up.
const UCX_TLS: &str = "rc_verbs,ud_verbs";

// ---------------------------------------------------------------------------------------------
// Tools, skipping, serialisation
// ---------------------------------------------------------------------------------------------

fn required() -> bool {
    std::env::var("SOFTVERBS_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Skips loudly, or panics when `SOFTVERBS_REQUIRE_TOOLS=1`.
fn skip(test: &str, why: &str) {
    assert!(
        !required(),
        "{test}: {why} (SOFTVERBS_REQUIRE_TOOLS=1, so this is an error)"
    );
    eprintln!("\n*** SKIPPED {test}: {why} ***\n");
}

/// Whether every `(program, Debian package)` is installed; skips for the first that is not.
fn tools(test: &str, needed: &[(&str, &str)]) -> bool {
    for (program, package) in needed {
        if !Path::new("/usr/bin").join(program).is_file() {
            skip(
                test,
                &format!("`{program}` not installed (apt-get install {package})"),
            );
            return false;
        }
    }
    true
}

const UCX: (&str, &str) = ("ucx_perftest", "ucx-utils");
const MPI: [(&str, &str); 2] = [("mpirun", "openmpi-bin"), ("mpicc", "libopenmpi-dev")];

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn scratch() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("scale_out");
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// A started program whose output is collected as it comes (so a full pipe never stalls it).
struct Running {
    what: String,
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

/// How a program ended: its status (None: killed at the deadline) and output.
struct Outcome {
    what: String,
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    fn report(&self) -> String {
        let status = self
            .status
            .map_or("killed at the deadline".to_string(), |s| s.to_string());
        format!(
            "--- {} ({status})\n--- stdout:\n{}\n--- stderr:\n{}",
            self.what, self.stdout, self.stderr
        )
    }

    fn assert_ok(&self) -> &Outcome {
        assert!(self.ok(), "{}", self.report());
        self
    }
}

fn reader(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// A command for `softverbs run -- program args...`, optionally inside network namespace
/// `ns` with the device on `addr`.
fn softverbs_run(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
    ns: Option<(&str, &str)>,
) -> Command {
    let mut cmd = match ns {
        Some((ns, addr)) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, BIN])
                .env("SOFTVERBS_ADDR", addr);
            c
        }
        None => Command::new(BIN),
    };
    cmd.args(["run", "--", program]).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn start(what: &str, mut cmd: Command) -> Running {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .current_dir(scratch())
        // Its own process group, so nothing it leaves behind shares the test's.
        .process_group(0);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let stdout = reader(child.stdout.take().expect("piped stdout"));
    let stderr = reader(child.stderr.take().expect("piped stderr"));
    Running {
        what: what.to_string(),
        child,
        stdout,
        stderr,
    }
}

/// The processes `pid` started, and theirs (mpirun puts each rank in a process group of
/// its own, so a group kill would miss them).
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                all.push(c);
                todo.push(c);
            }
        }
    }
    all
}

impl Running {
    /// Waits until `deadline`; past it, kills the program and everything it started.
    fn finish(mut self, deadline: Instant) -> Outcome {
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                break Some(st);
            }
            if Instant::now() > deadline {
                self.kill_all();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.outcome(status)
    }

    /// Stops a program that runs until killed (a server): kills it and everything it
    /// started; its status is None.
    fn stop(mut self) -> Outcome {
        if let Ok(Some(status)) = self.child.try_wait() {
            return self.outcome(Some(status));
        }
        self.kill_all();
        self.outcome(None)
    }

    fn kill_all(&mut self) {
        for pid in descendants(self.child.id()) {
            // SAFETY: kill has no memory preconditions; pid is a process this test
            // started (directly or through the program it ran).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn outcome(self, status: Option<ExitStatus>) -> Outcome {
        Outcome {
            what: self.what,
            status,
            stdout: self.stdout.join().unwrap_or_default(),
            stderr: self.stderr.join().unwrap_or_default(),
        }
    }
}

/// Runs a command to its end (at most `TIMEOUT`).
fn run(what: &str, cmd: Command) -> Outcome {
    start(what, cmd).finish(Instant::now() + TIMEOUT)
}

/// Waits until process `pid` listens on TCP `port` in its network namespace (read from
/// `/proc/PID/net/tcp{,6}`), or it exits, or the deadline passes.
fn wait_listening(server: &mut Running, port: u16, deadline: Instant) {
    let pid = server.child.id();
    let needle = format!(":{port:04X} ");
    while Instant::now() < deadline {
        let listening = ["tcp", "tcp6"].iter().any(|f| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
                })
        });
        if listening || server.child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Runs a server and, once it listens on `port`, a client; returns (server, client).
fn pair(what: &str, server: Command, client: Command, port: u16) -> (Outcome, Outcome) {
    let deadline = Instant::now() + TIMEOUT;
    let mut srv = start(&format!("{what} server"), server);
    wait_listening(&mut srv, port, deadline);
    let cli = start(&format!("{what} client"), client).finish(deadline);
    // A server whose client failed may wait for it forever: give it a moment, not a minute.
    let srv_deadline = if cli.ok() {
        deadline
    } else {
        Instant::now() + Duration::from_secs(2)
    };
    (srv.finish(srv_deadline), cli)
}

// ---------------------------------------------------------------------------------------------
// Network namespaces
// ---------------------------------------------------------------------------------------------

/// Side `i` of `link` as `(namespace, address)`.
fn side(link: &Netns, i: usize) -> Option<(&str, &str)> {
    Some((&link.ns[i], &link.addr[i]))
}

// ---------------------------------------------------------------------------------------------
// UCX
// ---------------------------------------------------------------------------------------------

/// The figures of ucx_perftest's `Final:` row: iterations, latency (50th percentile, average,
/// overall; µs), bandwidth (average, overall; MB/s), message rate (average, overall; msg/s).
fn final_row(out: &Outcome) -> Vec<f64> {
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("no `Final:` row\n{}", out.report()));
    let row: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(f64::NAN))
        .collect();
    assert_eq!(row.len(), 8, "bad `Final:` row {line:?}\n{}", out.report());
    row
}

/// One ucx_perftest test between two processes (on loopback, or across `link`), checked:
/// both exit 0, all `iters` iterations ran, bandwidth and message rate are non-zero.
fn ucx_perftest(test: &str, args: &[&str], iters: u32, link: Option<&Netns>) -> Vec<f64> {
    let port = free_tcp_port().to_string();
    let n = iters.to_string();
    let mut common = vec!["-p", &port, "-n", &n];
    common.extend_from_slice(args);
    let env = [("UCX_TLS", UCX_TLS)];
    let (server_ns, client_ns, peer) = match link {
        Some(l) => (side(l, 0), side(l, 1), l.addr[0].as_str()),
        None => (None, None, "127.0.0.1"),
    };
    let server = softverbs_run("ucx_perftest", &common, &env, server_ns);
    let mut client_args = common.clone();
    client_args.push(peer);
    let client = softverbs_run("ucx_perftest", &client_args, &env, client_ns);
    let (srv, cli) = pair(
        &format!("{test}: ucx_perftest {}", args.join(" ")),
        server,
        client,
        port.parse().expect("port"),
    );
    cli.assert_ok();
    srv.assert_ok();
    let row = final_row(&cli);
    let report = cli.report();
    assert_eq!(row[0], f64::from(iters), "iterations\n{report}");
    assert!(
        row.iter().all(|v| v.is_finite() && *v >= 0.0),
        "{row:?}\n{report}"
    );
    assert!(
        row[6] > 0.0 && row[7] > 0.0,
        "zero message rate: {row:?}\n{report}"
    );
    // Bandwidth is printed with two decimals: small messages at a low rate show 0.00 MB/s.
    let size: u32 = args
        .iter()
        .position(|&a| a == "-s")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(8);
    if size >= 4096 {
        assert!(
            row[4] > 0.0 && row[5] > 0.0,
            "zero bandwidth: {row:?}\n{report}"
        );
    }
    eprintln!("{test}: {}: {row:?}", args.join(" "));
    row
}

/// Transports and devices `ucx_info -d` lists, as (transport, device) pairs.
fn ucx_devices(out: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut transport = None;
    for line in out.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(t) = line.strip_prefix("Transport:") {
            transport = Some(t.trim().to_string());
        } else if let (Some(d), Some(t)) = (line.strip_prefix("Device:"), &transport) {
            pairs.push((t.clone(), d.trim().to_string()));
        }
    }
    pairs
}

#[test]
fn ucx_info_lists_softverbs0_with_rc_verbs_and_ud_verbs() {
    let test = "ucx_info_lists_softverbs0_with_rc_verbs_and_ud_verbs";
    if !tools(test, &[("ucx_info", "ucx-utils")]) {
        return;
    }
    let _one = serial();
    let out = run(test, softverbs_run("ucx_info", &["-d"], &[], None));
    out.assert_ok();
    let devices = ucx_devices(&out.stdout);
    for tl in ["rc_verbs", "ud_verbs"] {
        assert!(
            devices.contains(&(tl.to_string(), "softverbs0:1".to_string())),
            "no {tl} on softverbs0:1 in {devices:?}\n{}",
            out.report()
        );
    }
    // The node is what makes UCX take the device: without it (unless the host has one of
    // its own), no softverbs0.
    if !Path::new("/dev/infiniband/softverbs0").exists() {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--dev-node", "off", "--", "ucx_info", "-d"]);
        let out = run(test, cmd);
        out.assert_ok();
        assert!(
            !out.stdout.contains("softverbs0"),
            "softverbs0 listed without its node\n{}",
            out.report()
        );
    }
}

/// What a program under `softverbs run` sees: the node as UCX checks it, and /dev intact.
#[test]
fn run_gives_the_program_a_private_device_node() {
    let test = "run_gives_the_program_a_private_device_node";
    let host_had_it = Path::new("/dev/infiniband/softverbs0").exists();
    let script = "stat -L -c %F /dev/infiniband/softverbs0 && test -r /dev/infiniband/softverbs0 \
                  && test -w /dev/infiniband/softverbs0 && echo hello > /dev/null \
                  && test -d /dev/shm && test -e /dev/pts && ls /dev | wc -l";
    let out = run(test, softverbs_run("sh", &["-c", script], &[], None));
    out.assert_ok();
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next(),
        Some("character special file"),
        "{}",
        out.report()
    );
    let inside: usize = lines
        .next()
        .and_then(|n| n.trim().parse().ok())
        .expect("count");
    let outside = std::fs::read_dir("/dev").expect("read /dev").count();
    // Every entry of /dev, plus infiniband/ when the host has none.
    let extra = usize::from(!Path::new("/dev/infiniband").exists());
    assert_eq!(inside, outside + extra, "{}", out.report());
    assert_eq!(
        Path::new("/dev/infiniband/softverbs0").exists(),
        host_had_it,
        "the host's /dev changed"
    );
}

/// The same without privileges: an unprivileged user namespace (where the host allows them).
#[test]
fn run_gives_an_unprivileged_user_the_device_node() {
    let test = "run_gives_an_unprivileged_user_the_device_node";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("\n*** SKIPPED {test}: needs root (to become nobody) and setpriv ***\n");
        return;
    }
    let nobody = |args: &[&str]| {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(args);
        cmd
    };
    let userns = run(test, nobody(&["unshare", "--user", "true"]));
    let exe = run(test, nobody(&[BIN, "--version"]));
    if !userns.ok() || !exe.ok() {
        // A host policy (user namespaces off) or a checkout nobody may not read.
        eprintln!(
            "\n*** SKIPPED {test}: as nobody, {} ***\n",
            if userns.ok() {
                "the softverbs binary cannot run (checkout not readable)"
            } else {
                "no user namespace may be made (host policy)"
            }
        );
        return;
    }
    // The drop-in directory exists (made by root) so nobody need not write it.
    run(test, softverbs_run("true", &[], &[], None)).assert_ok();
    let out = run(
        test,
        nobody(&[
            BIN,
            "run",
            "--dev-node",
            "required",
            "--",
            "sh",
            "-c",
            "id -u; stat -L -c %F /dev/infiniband/softverbs0",
        ]),
    );
    out.assert_ok();
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        ["65534", "character special file"],
        "{}",
        out.report()
    );
    if tools(test, &[("ucx_info", "ucx-utils")]) {
        let out = run(test, nobody(&[BIN, "run", "--", "ucx_info", "-d"]));
        out.assert_ok();
        assert!(
            ucx_devices(&out.stdout).contains(&("rc_verbs".into(), "softverbs0:1".into())),
            "{}",
            out.report()
        );
    }
}

/// UCT, the transport layer, on each transport alone: active messages, RDMA WRITE (put),
/// RDMA READ (get), 64-bit atomics.
#[test]
fn ucx_perftest_uct_over_rc_verbs_and_ud_verbs() {
    let test = "ucx_perftest_uct_over_rc_verbs_and_ud_verbs";
    if !tools(test, &[UCX]) {
        return;
    }
    let _one = serial();
    let rc = ["-x", "rc_verbs", "-d", "softverbs0:1"];
    let ud = ["-x", "ud_verbs", "-d", "softverbs0:1"];
    let cases: [(&[&str], &[&str], u32); 10] = [
        (&rc, &["-t", "am_lat"], 1000),
        (&rc, &["-t", "put_bw"], 1000),
        (&rc, &["-t", "put_bw", "-D", "zcopy", "-s", "1048576"], 100),
        (&rc, &["-t", "get", "-D", "zcopy", "-s", "65536"], 500),
        (&rc, &["-t", "get", "-D", "bcopy", "-s", "4000"], 500),
        (&rc, &["-t", "am_bw", "-D", "bcopy", "-s", "8000"], 1000),
        (&rc, &["-t", "fadd"], 1000),
        (&rc, &["-t", "cswap"], 1000),
        (&ud, &["-t", "am_lat"], 1000),
        (&ud, &["-t", "am_bw", "-D", "bcopy", "-s", "3000"], 1000),
    ];
    for (tl, args, iters) in cases {
        let all: Vec<&str> = tl.iter().chain(args).copied().collect();
        ucx_perftest(test, &all, iters, None);
    }
}

/// UCP, the protocol layer MPI uses, with UCX_TLS=rc_verbs,ud_verbs: eager and rendezvous.
#[test]
fn ucx_perftest_ucp_over_rc_verbs_and_ud_verbs() {
    let test = "ucx_perftest_ucp_over_rc_verbs_and_ud_verbs";
    if !tools(test, &[UCX]) {
        return;
    }
    let _one = serial();
    let cases: [(&[&str], u32); 9] = [
        (&["-t", "tag_lat"], 1000),
        (&["-t", "tag_bw"], 1000),
        (&["-t", "tag_bw", "-s", "1048576"], 100),
        (&["-t", "ucp_put_bw", "-s", "65536"], 500),
        (&["-t", "ucp_get"], 1000),
        (&["-t", "ucp_get", "-s", "1048576"], 100),
        (&["-t", "ucp_am_bw"], 1000),
        (&["-t", "stream_bw"], 1000),
        (&["-t", "stream_bw", "-s", "65536"], 200),
    ];
    for (args, iters) in cases {
        ucx_perftest(test, args, iters, None);
    }
}

/// UCX between two network namespaces: real addresses, so the GIDs in the UD GRH are the
/// ones UCX's destination check compares with its own.
#[test]
fn ucx_perftest_between_two_network_namespaces() {
    let test = "ucx_perftest_between_two_network_namespaces";
    if !tools(test, &[UCX]) {
        return;
    }
    let _one = serial();
    let Some(link) = Netns::create(test) else {
        return;
    };
    let cases: [(&[&str], u32); 6] = [
        (
            &["-x", "ud_verbs", "-d", "softverbs0:1", "-t", "am_lat"],
            1000,
        ),
        (
            &[
                "-x",
                "rc_verbs",
                "-d",
                "softverbs0:1",
                "-t",
                "put_bw",
                "-D",
                "zcopy",
                "-s",
                "65536",
            ],
            200,
        ),
        (&["-t", "tag_lat"], 1000),
        (&["-t", "tag_bw", "-s", "1048576"], 50),
        (&["-t", "ucp_get", "-s", "65536"], 200),
        (&["-t", "stream_bw"], 1000),
    ];
    for (args, iters) in cases {
        ucx_perftest(test, args, iters, Some(&link));
    }
}

// ---------------------------------------------------------------------------------------------
// Open MPI, NetPIPE, libfabric
// ---------------------------------------------------------------------------------------------

/// The validating MPI programs, compiled once.
fn mpi_programs() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scale_out");
        let build = |name: &str| {
            let exe = scratch().join(name);
            let out = Command::new("mpicc")
                .args(["-O2", "-Wall", "-Werror", "-o"])
                .arg(&exe)
                .arg(src.join(format!("{name}.c")))
                .output()
                .expect("run mpicc");
            assert!(
                out.status.success(),
                "mpicc {name}.c:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            exe
        };
        (build("mpi_pingpong"), build("mpi_allreduce"))
    })
}

/// How MPI reaches the network: UCX (rc_verbs, ud_verbs) or libfabric's verbs provider,
/// with its reliable-datagram layer over UD (`ofi_rxd`) or over RC (`ofi_rxm`, whose
/// connections are made with rdma_cm).
#[derive(Clone, Copy, Debug)]
enum Stack {
    Ucx,
    OfiVerbs,
    OfiVerbsRxm,
}

impl Stack {
    fn mca(self) -> &'static [&'static str] {
        match self {
            Stack::Ucx => &["--mca", "pml", "ucx"],
            Stack::OfiVerbs => &[
                "--mca",
                "pml",
                "cm",
                "--mca",
                "mtl",
                "ofi",
                "--mca",
                "mtl_ofi_provider_include",
                "verbs;ofi_rxd",
            ],
            Stack::OfiVerbsRxm => &[
                "--mca",
                "pml",
                "cm",
                "--mca",
                "mtl",
                "ofi",
                "--mca",
                "mtl_ofi_provider_include",
                "verbs;ofi_rxm",
            ],
        }
    }
}

/// `softverbs run -- mpirun -np NP (stack) program args...`.
fn mpirun(stack: Stack, np: u32, program: &Path, args: &[&str]) -> Outcome {
    let np = np.to_string();
    let mut all = vec!["--allow-run-as-root", "--oversubscribe", "-np", &np];
    all.extend_from_slice(stack.mca());
    let program = program.to_str().expect("utf-8 path");
    all.push(program);
    all.extend_from_slice(args);
    let env = [("UCX_TLS", UCX_TLS)];
    run(
        &format!("mpirun {}", all.join(" ")),
        softverbs_run("mpirun", &all, &env, None),
    )
}

/// The line rank 0 prints, `"{what} ok: ranks {np} ..."`, asserted present.
fn assert_validated(out: &Outcome, what: &str, np: u32) {
    out.assert_ok();
    let want = format!("{what} ok: ranks {np} ");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with(&want) && l.ends_with(" wrong 0")),
        "no `{want}... wrong 0`\n{}",
        out.report()
    );
}

fn mpi_validated(test: &str, stack: Stack) {
    if !tools(test, &MPI) {
        return;
    }
    let _one = serial();
    let (pingpong, allreduce) = mpi_programs();
    for np in [2, 4] {
        // Sizes 0 B to 4 MiB, 3 round trips each: eager and rendezvous.
        assert_validated(&mpirun(stack, np, pingpong, &["3"]), "pingpong", np);
        assert_validated(&mpirun(stack, np, allreduce, &["2"]), "allreduce", np);
    }
}

#[test]
fn mpi_over_ucx_validates_every_byte() {
    mpi_validated("mpi_over_ucx_validates_every_byte", Stack::Ucx);
}

#[test]
fn mpi_over_libfabric_verbs_validates_every_byte() {
    let test = "mpi_over_libfabric_verbs_validates_every_byte";
    if tools(test, &[("fi_info", "libfabric-bin")]) {
        mpi_validated(test, Stack::OfiVerbs);
    }
}

/// NetPIPE (two ranks: it pairs ranks 0 and 1 only), once with its integrity check and once
/// measuring: every size passes the check, and the measured throughput is non-zero.
fn netpipe(test: &str, stack: Stack) {
    if !tools(test, &[MPI[0], ("NPopenmpi", "netpipe-openmpi")]) {
        return;
    }
    let _one = serial();
    let npi = Path::new("/usr/bin/NPopenmpi");
    let out_file = scratch().join(format!("{test}.np"));
    let out_arg = out_file.to_str().expect("utf-8 path");
    let out = mpirun(
        stack,
        2,
        npi,
        &["-i", "-u", "1048576", "-n", "3", "-o", out_arg],
    );
    out.assert_ok();
    // Rank 0 reports each size's check on stderr.
    let checks: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains(" bytes "))
        .collect();
    assert!(
        checks.len() > 20 && checks.iter().all(|l| l.ends_with("Integrity check passed")),
        "{}",
        out.report()
    );
    let out = mpirun(stack, 2, npi, &["-u", "1048576", "-n", "10", "-o", out_arg]);
    out.assert_ok();
    let table = std::fs::read_to_string(&out_file).expect("NetPIPE output file");
    let rows: Vec<Vec<f64>> = table
        .lines()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .collect();
    assert!(rows.len() > 20, "{table}\n{}", out.report());
    assert!(
        rows.iter()
            .all(|r| r.len() == 3 && r[1] > 0.0 && r[2] > 0.0),
        "a zero figure:\n{table}"
    );
    let last = rows.last().expect("rows");
    assert_eq!(last[0], 1048579.0, "NetPIPE stopped early:\n{table}");
}

#[test]
fn netpipe_over_ucx() {
    netpipe("netpipe_over_ucx", Stack::Ucx);
}

#[test]
fn netpipe_over_libfabric_verbs() {
    netpipe("netpipe_over_libfabric_verbs", Stack::OfiVerbs);
}

/// fi_pingpong over libfabric's verbs provider, each `(provider, endpoint type)` with its
/// data check (`-c`) on every size.
fn fi_pingpong(test: &str, cases: &[(&str, &str)]) {
    if !tools(test, &[("fi_pingpong", "libfabric-bin")]) {
        return;
    }
    let _one = serial();
    for &(provider, endpoint) in cases {
        // fi_pingpong's own out-of-band TCP connection uses this port, so `pair` sees the
        // server listen on it.
        let port = free_tcp_port();
        let p = port.to_string();
        let common = ["-p", provider, "-e", endpoint, "-I", "100", "-c"];
        let mut server_args = common.to_vec();
        server_args.extend(["-B", &p]);
        let mut client_args = common.to_vec();
        client_args.extend(["-P", &p, "127.0.0.1"]);
        let (srv, cli) = pair(
            &format!("{test}: {provider} {endpoint}"),
            softverbs_run("fi_pingpong", &server_args, &[], None),
            softverbs_run("fi_pingpong", &client_args, &[], None),
            port,
        );
        cli.assert_ok();
        srv.assert_ok();
        // Rows: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec.
        let rows: Vec<&str> = cli.stdout.lines().filter(|l| l.contains("=100")).collect();
        // 64 B to 1 MiB; a datagram endpoint stops at the MTU (64 B to 4 KiB).
        assert!(rows.len() >= 4, "{}", cli.report());
        for row in rows {
            let mbps: f64 = row
                .split_whitespace()
                .nth(5)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            assert!(mbps > 0.0, "zero throughput in {row:?}\n{}", cli.report());
        }
    }
}

/// The RDM endpoint of `verbs;ofi_rxd` and the datagram endpoint underneath.
#[test]
fn fi_pingpong_over_verbs_rxd_and_dgram() {
    fi_pingpong(
        "fi_pingpong_over_verbs_rxd_and_dgram",
        &[("verbs;ofi_rxd", "rdm"), ("verbs", "dgram")],
    );
}

// ---------------------------------------------------------------------------------------------
// What needs rdma_cm connections (librdmacm with a connection manager: issue 12)
// ---------------------------------------------------------------------------------------------

/// The `verbs` MSG endpoint (connected with rdma_cm) and the `verbs;ofi_rxm` RDM endpoint
/// built on it.
#[test]
fn fi_pingpong_over_verbs_msg_and_rxm() {
    fi_pingpong(
        "fi_pingpong_over_verbs_msg_and_rxm",
        &[("verbs", "msg"), ("verbs;ofi_rxm", "rdm")],
    );
}

/// Open MPI over `mtl ofi` with `verbs;ofi_rxm`: the validating programs at -np 2 and 4.
#[test]
fn mpi_over_libfabric_verbs_rxm_validates_every_byte() {
    let test = "mpi_over_libfabric_verbs_rxm_validates_every_byte";
    if tools(test, &[("fi_info", "libfabric-bin")]) {
        mpi_validated(test, Stack::OfiVerbsRxm);
    }
}

/// UCX's rdmacm connection manager: io_demo's UCP client connects to its listener by
/// socket address, only the rdmacm CM allowed (`UCX_SOCKADDR_TLS_PRIORITY=rdmacm` chooses
/// it among UCX's connection managers, as `UCX_TLS` chooses the transports), and runs
/// reads and writes with io_demo's data check (`-q`: a corrupt byte aborts it). The
/// listener is an rdma_cm id, not a TCP socket, so the client retries until it is up.
#[test]
fn ucx_rdmacm_connection_manager_connects() {
    let test = "ucx_rdmacm_connection_manager_connects";
    if !tools(test, &[("io_demo", "ucx-utils")]) {
        return;
    }
    let _one = serial();
    let port = free_tcp_port().to_string();
    let env = [
        ("UCX_TLS", UCX_TLS),
        ("UCX_SOCKADDR_TLS_PRIORITY", "rdmacm"),
    ];
    // Both sides must know the largest message.
    const SIZES: &str = "1:65536";
    let deadline = Instant::now() + TIMEOUT;
    let server = start(
        &format!("{test}: io_demo server"),
        softverbs_run("io_demo", &["-p", &port, "-q", "-d", SIZES], &env, None),
    );
    let server_addr = format!("127.0.0.1:{port}");
    let client_args = [
        "-q",
        "-i",
        "200",
        "-o",
        "read,write",
        "-d",
        "1:65536",
        "-c",
        "40",
        "-y",
        "0.25s",
        "-t",
        "30s",
        &server_addr,
    ];
    let cli = start(
        &format!("{test}: io_demo client"),
        softverbs_run("io_demo", &client_args, &env, None),
    )
    .finish(deadline);
    let srv = server.stop();
    let report = format!("{}\n{}", cli.report(), srv.report());
    assert!(cli.ok(), "{report}");
    assert!(
        cli.stdout.contains("Client exit with status 'OK'"),
        "{report}"
    );
    // Each progress report counts the operations completed since the last one
    // (`[DEMO] total min:.. max:.. total:N | read ... | write ...`): all 200 ran.
    let done: u64 = cli
        .stdout
        .lines()
        .filter_map(|l| l.split_once("[DEMO] total min:"))
        .filter_map(|(_, rest)| {
            rest.split_whitespace()
                .nth(2)?
                .strip_prefix("total:")?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(done, 200, "{report}");
    assert!(
        srv.status.is_none(),
        "the server exited on its own:\n{report}"
    );
    // The connection went through rdmacm: no other connection manager was allowed, and
    // neither side reports an error.
    for out in [&cli, &srv] {
        assert!(
            !out.stdout.contains("ERROR") && !out.stderr.contains("ERROR"),
            "{report}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Teardown
// ---------------------------------------------------------------------------------------------

/// 50 consecutive UCX runs (UCP over rc_verbs and ud_verbs: both kinds of QP made and
/// destroyed while the peer may still be sending) and 50 MPI runs, each tiny: none crashes
/// or hangs.
#[test]
fn fifty_ucx_and_fifty_mpi_runs_tear_down_cleanly() {
    let test = "fifty_ucx_and_fifty_mpi_runs_tear_down_cleanly";
    if !tools(test, &[UCX]) || !tools(test, &MPI) {
        return;
    }
    let _one = serial();
    let (pingpong, _) = mpi_programs();
    let started = Instant::now();
    for i in 0..50 {
        let t = if i % 2 == 0 { "tag_lat" } else { "ucp_am_bw" };
        ucx_perftest(&format!("{test} ucx run {i}"), &["-t", t], 100, None);
    }
    let ucx = started.elapsed();
    for i in 0..50 {
        let out = mpirun(Stack::Ucx, 2, pingpong, &["1", "65536"]);
        assert!(out.ok(), "MPI run {i}:\n{}", out.report());
        assert_validated(&out, "pingpong", 2);
    }
    eprintln!(
        "{test}: 50 UCX runs {:.1} s, 50 MPI runs {:.1} s",
        ucx.as_secs_f64(),
        (started.elapsed() - ucx).as_secs_f64()
    );
}

//! Helpers shared by the integration tests: tool detection and loud skipping, and a harness
//! that runs unmodified rdma-core programs (Debian's own binaries) as two processes, server
//! and client, on the drop-in libraries cargo built in the same profile as the test: on
//! loopback or between two network namespaces joined by a veth pair.

#![allow(dead_code)]

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The header the layout test compiles against (Debian package `libibverbs-dev`).
pub const VERBS_H: &str = "/usr/include/infiniband/verbs.h";

/// Loud skipping (a failure under `SOFTVERBS_REQUIRE_TOOLS=1`) and running a command that
/// must succeed, as the stub libraries' tests do.
#[allow(unused_imports)] // each test binary uses some of them
pub use softverbs_stub_support::testing::{run, skip};

/// Whether `tool --version` runs.
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether the program at `path` (from Debian package `package`) is installed; skips loudly
/// (or fails under `SOFTVERBS_REQUIRE_TOOLS=1`) when it is not.
pub fn tool_present(path: &str, package: &str) -> bool {
    if Path::new(path).is_file() {
        return true;
    }
    skip(&format!(
        "`{path}` not available (apt-get install {package})"
    ));
    false
}

/// A scratch directory for this test's files (under cargo's per-crate test tmpdir).
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

// ---------------------------------------------------------------------------------------------
// The drop-in directory
// ---------------------------------------------------------------------------------------------

/// What cargo builds (file name, package) and the SONAME each stands in for: the drop-in
/// libibverbs, and the provider stubs perftest links (libmlx5, libefa) so that the system's
/// real providers, which need the kernel, are never loaded.
pub const LIBS: [(&str, &str, &str); 3] = [
    (
        "libsoftverbs_ibverbs.so",
        "libibverbs.so.1",
        "softverbs-ibverbs-abi",
    ),
    (
        "libsoftverbs_mlx5.so",
        "libmlx5.so.1",
        "softverbs-mlx5-stub",
    ),
    ("libsoftverbs_efa.so", "libefa.so.1", "softverbs-efa-stub"),
];

/// The directories of this test's cargo profile a cdylib may be in: the profile directory
/// itself (`target/debug`), then `deps` (where the test executable is).
fn profile_dirs() -> [PathBuf; 2] {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    let profile = deps.parent().expect("profile dir").to_path_buf();
    [profile, deps]
}

/// Points `dir/name` at `target`, atomically (tests of several binaries may share `dir`).
fn link_into(dir: &Path, name: &str, target: &Path) {
    let link = dir.join(name);
    if std::fs::read_link(&link).ok().as_deref() == Some(target) {
        return;
    }
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .unwrap_or_else(|e| panic!("symlink {}: {e}", tmp.display()));
    std::fs::rename(&tmp, &link).unwrap_or_else(|e| panic!("rename to {}: {e}", link.display()));
}

/// A directory holding `libibverbs.so.1`, `libmlx5.so.1` and `libefa.so.1`, symlinks to the
/// cdylibs cargo built in this test's profile; put it first on `LD_LIBRARY_PATH`.
///
/// Panics when a library is missing: `cargo test` builds only the packages under test, so the
/// stub libraries come from `cargo build --workspace`.
pub fn dropin(name: &str) -> PathBuf {
    let dirs = profile_dirs();
    let (ibverbs, _, _) = LIBS[0];
    let home = dirs
        .iter()
        .find(|d| d.join(ibverbs).exists())
        .unwrap_or_else(|| {
            panic!(
                "{ibverbs} not found in {} or {}: run `cargo build --workspace` first",
                dirs[0].display(),
                dirs[1].display()
            )
        })
        .clone();
    let out = scratch(name).join("dropin");
    std::fs::create_dir_all(&out).expect("create drop-in dir");
    for (built, soname, package) in LIBS {
        // Same profile as the libibverbs cdylib: its directory first, then the other one.
        let so = std::iter::once(&home)
            .chain(dirs.iter())
            .map(|d| d.join(built))
            .find(|p| p.exists())
            .unwrap_or_else(|| {
                panic!(
                    "{built} (package {package}, stands in for {soname}) not found next to {}: \
                     run `cargo build --workspace` first (`cargo test -p` does not build it)",
                    home.join(ibverbs).display()
                )
            });
        let so = so.canonicalize().expect("canonical library path");
        link_into(&out, soname, &so);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Ports and serialisation
// ---------------------------------------------------------------------------------------------

/// A TCP port nobody listens on right now (the tools' out-of-band exchange, `-p`).
pub fn free_tcp_port() -> u16 {
    let s = TcpListener::bind("0.0.0.0:0").expect("bind");
    s.local_addr().expect("addr").port()
}

/// A UDP port nobody uses right now.
pub fn free_udp_port() -> u16 {
    let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
    s.local_addr().expect("addr").port()
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the cases of one test binary to one at a time: the tools busy-poll their completion
/// queues, and on a 2-core CI machine two pairs at once starve each other.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Running programs
// ---------------------------------------------------------------------------------------------

/// One process to run: a program, its arguments and environment, optionally inside a
/// network namespace (`ip netns exec NS program args...`).
#[derive(Clone, Debug)]
pub struct Side {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub netns: Option<String>,
}

impl Side {
    pub fn new<S: AsRef<str>>(program: &str, args: &[S]) -> Side {
        Side {
            program: program.to_string(),
            args: args.iter().map(|a| a.as_ref().to_string()).collect(),
            env: Vec::new(),
            netns: None,
        }
    }

    /// Appends arguments.
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Side {
        self.args
            .extend(args.iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// Sets an environment variable (after the defaults, so it wins).
    pub fn env(mut self, key: &str, value: &str) -> Side {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Runs the program inside network namespace `ns`.
    pub fn netns(mut self, ns: &str) -> Side {
        self.netns = Some(ns.to_string());
        self
    }

    /// The command line, for reports.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.env {
            s += &format!("{k}={v} ");
        }
        if let Some(ns) = &self.netns {
            s += &format!("ip netns exec {ns} ");
        }
        s += &self.program;
        for a in &self.args {
            s += " ";
            s += a;
        }
        s
    }

    /// The command: the drop-in directory alone on `LD_LIBRARY_PATH`, no inherited
    /// `SOFTVERBS_*` setting (so the device takes its own loopback address, as for a user)
    /// unless `env` says otherwise.
    pub fn command(&self, dropin: &Path) -> Command {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, &self.program]);
                c
            }
            None => Command::new(&self.program),
        };
        cmd.args(&self.args);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SOFTVERBS_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("LD_LIBRARY_PATH", dropin);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// How one process ended.
#[derive(Debug)]
pub struct Outcome {
    pub pid: u32,
    /// None when it was killed at the deadline.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// When it exited (or was killed).
    pub ended: Instant,
}

impl Outcome {
    /// Exited by itself with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub fn timed_out(&self) -> bool {
        self.status.is_none()
    }

    /// The exit code, if it exited by itself.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// Standard output then standard error.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Whether it failed in perftest's own clock calibration ([`CLOCK_CHECK_FAILED`]).
    pub fn failed_clock_check(&self) -> bool {
        !self.success() && self.output().contains(CLOCK_CHECK_FAILED)
    }

    fn report(&self, who: &str) -> String {
        let how = match self.status {
            Some(s) => s.to_string(),
            None => "KILLED at the deadline".to_string(),
        };
        format!(
            "--- {who} (pid {}): {how} after {:.1} s\n--- stdout:\n{}\n--- stderr:\n{}\n",
            self.pid,
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }
}

/// Drains `r` on a thread; the whole text arrives on the channel at end of file.
fn reader(mut r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

/// How long to wait for the end of a finished process's output: a descendant that outlived
/// it may hold its pipes open.
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

/// A started process whose output is drained as it comes (so a chatty one never blocks on a
/// full pipe) and whose exit is noted the moment it happens, by a thread that waits for it.
/// It leads a process group of its own, which is killed at the deadline, or if this is
/// dropped before the process finished (a panicking test leaves nothing behind).
pub struct Running {
    pid: u32,
    exit: Receiver<(ExitStatus, Instant)>,
    exited: Option<(ExitStatus, Instant)>,
    out: Receiver<String>,
    err: Receiver<String>,
    started: Instant,
    done: bool,
}

impl Running {
    pub fn spawn(side: &Side, dropin: &Path) -> Running {
        let mut child = side
            .command(dropin)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{}`: {e}", side.describe()));
        let started = Instant::now();
        let out = reader(child.stdout.take().expect("piped stdout"));
        let err = reader(child.stderr.take().expect("piped stderr"));
        let pid = child.id();
        let (tx, exit) = mpsc::channel();
        std::thread::spawn(move || {
            let status = child.wait().expect("wait for child");
            let _ = tx.send((status, Instant::now()));
        });
        Running {
            pid,
            exit,
            exited: None,
            out,
            err,
            started,
            done: false,
        }
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        if self.exited.is_none() {
            self.exited = self.exit.try_recv().ok();
        }
        self.exited.is_none()
    }

    /// Kills its process group (it and whatever it started) unless it exited already, and
    /// waits until it is reaped.
    fn kill(&mut self) {
        if self.running() {
            // SAFETY: kill(2) on the process group this child leads (process_group(0) at
            // spawn); it has not been seen to exit, so the group id is still its own.
            unsafe { libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL) };
            let _ = self.exit.recv_timeout(OUTPUT_GRACE);
        }
    }

    /// Waits for it until `deadline`, killing it then; its outcome.
    pub fn finish(mut self, deadline: Instant) -> Outcome {
        if self.exited.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            self.exited = self.exit.recv_timeout(left).ok();
        }
        let (status, ended) = match self.exited {
            Some((status, at)) => (Some(status), at),
            None => {
                self.kill();
                (None, Instant::now())
            }
        };
        self.done = true;
        let text = |rx: &Receiver<String>| {
            rx.recv_timeout(OUTPUT_GRACE)
                .unwrap_or_else(|_| "(output still open: a descendant holds the pipe)".into())
        };
        Outcome {
            pid: self.pid,
            status,
            stdout: text(&self.out),
            stderr: text(&self.err),
            elapsed: ended - self.started,
            ended,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            self.kill();
        }
    }
}

/// How long one server/client case may run before the client is killed.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// What the client prints (ibverbs-utils and perftest alike) when nobody listens yet.
pub const NOT_LISTENING: &str = "Couldn't connect";

/// How long the server may take to finish once the client did.
const SERVER_GRACE: Duration = Duration::from_secs(30);
/// ... and once the client failed (the server is then usually stuck waiting for it).
const SERVER_GRACE_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// Before the first client start, and between starts while the server is not listening.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What perftest prints when its own clock calibration fails: before its report it fits
/// TSC cycles against `gettimeofday` over a few busy-waited steps, and a step stretched by a
/// preemption (a vCPU descheduled by the hypervisor, say) drops the fit under r^2 0.9;
/// the tool then exits 1 with "Can't produce a report" after a transfer that completed.
/// Nothing of ours is measured there, so such a pair runs again ([`CLOCK_CHECK_RUNS`]).
pub const CLOCK_CHECK_FAILED: &str = "Correlation coefficient r^2";

/// Runs of a pair at most while perftest's clock calibration fails ([`CLOCK_CHECK_FAILED`]).
const CLOCK_CHECK_RUNS: u32 = 3;

/// How a server/client pair ended.
#[derive(Debug)]
pub struct PairOutcome {
    pub server: Outcome,
    pub client: Outcome,
    /// Client starts, counting those that found no server listening.
    pub client_attempts: u32,
    /// Earlier runs of the pair that ended in perftest's failed clock calibration
    /// ([`CLOCK_CHECK_FAILED`]).
    pub clock_check_reruns: u32,
    pub elapsed: Duration,
    pub commands: String,
}

impl PairOutcome {
    pub fn both_ok(&self) -> bool {
        self.server.success() && self.client.success()
    }

    /// Everything known about the run, for assertion messages.
    pub fn report(&self) -> String {
        format!(
            "{}\n{} client start(s), {} rerun(s) after perftest's clock check failed, {:.1} s in all\n{}{}",
            self.commands,
            self.client_attempts,
            self.clock_check_reruns,
            self.elapsed.as_secs_f64(),
            self.server.report("server"),
            self.client.report("client"),
        )
    }

    /// Panics with the report unless both exited 0.
    pub fn assert_ok(&self, what: &str) {
        assert!(
            self.both_ok(),
            "{what}: server and client must both exit 0\n{}",
            self.report()
        );
    }
}

/// Runs `server`, then `client` (restarted while it finds nobody listening on the
/// out-of-band TCP port yet: a refused connection does not use up the server's single
/// accept), both on the libraries in `dropin`. The client is killed at `timeout` after the
/// start, the server 30 s after the client finished (5 s if the client failed). A pair
/// whose perftest failed its own clock calibration runs again, each run with its own
/// `timeout` ([`CLOCK_CHECK_FAILED`]).
pub fn run_pair(dropin: &Path, server: &Side, client: &Side, timeout: Duration) -> PairOutcome {
    let mut reruns = 0;
    loop {
        let mut outcome = run_pair_once(dropin, server, client, timeout);
        outcome.clock_check_reruns = reruns;
        let clock_failed =
            outcome.server.failed_clock_check() || outcome.client.failed_clock_check();
        if !clock_failed || reruns + 1 >= CLOCK_CHECK_RUNS {
            return outcome;
        }
        eprintln!(
            "perftest's clock calibration failed: running the pair again\n{}",
            outcome.report()
        );
        reruns += 1;
    }
}

fn run_pair_once(dropin: &Path, server: &Side, client: &Side, timeout: Duration) -> PairOutcome {
    let start = Instant::now();
    let deadline = start + timeout;
    let commands = format!(
        "server: {}\nclient: {}\nLD_LIBRARY_PATH={}",
        server.describe(),
        client.describe(),
        dropin.display()
    );
    let mut srv = Running::spawn(server, dropin);
    let mut client_attempts = 0;
    std::thread::sleep(RETRY_PAUSE);
    let client = loop {
        client_attempts += 1;
        let c = Running::spawn(client, dropin).finish(deadline);
        let retry = !c.success() && c.output().contains(NOT_LISTENING) && srv.running();
        if !retry || Instant::now() + RETRY_PAUSE >= deadline {
            break c;
        }
        std::thread::sleep(RETRY_PAUSE);
    };
    let grace = if client.success() {
        SERVER_GRACE
    } else {
        SERVER_GRACE_AFTER_FAILURE
    };
    let server = srv.finish(Instant::now() + grace);
    PairOutcome {
        server,
        client,
        client_attempts,
        clock_check_reruns: 0,
        elapsed: start.elapsed(),
        commands,
    }
}

// ---------------------------------------------------------------------------------------------
// perftest output
// ---------------------------------------------------------------------------------------------

/// The result table perftest prints: the column names of the `#bytes` header line (split at
/// runs of two or more blanks, as names like `BW average[MB/sec]` contain one), and the rows
/// after it up to the closing `----` line.
pub fn perftest_table(out: &str) -> Option<(Vec<String>, Vec<Vec<String>>)> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    let header = lines.next()?;
    let columns = header
        .replace('\t', "  ")
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect();
    let rows = lines
        .take_while(|l| !l.trim_start().starts_with("---"))
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    Some((columns, rows))
}

// ---------------------------------------------------------------------------------------------
// Network namespaces
// ---------------------------------------------------------------------------------------------

/// Whether a skipped namespace test is a failure here (`CI=true` or
/// `SOFTVERBS_REQUIRE_NETNS=1`, as in crates/cli/tests/netns.rs).
pub fn netns_required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("SOFTVERBS_REQUIRE_NETNS").is_ok_and(|v| v == "1")
}

fn netns_skip(test: &str, why: &str) {
    assert!(
        !netns_required(),
        "{test}: network namespace test required here (CI=true or SOFTVERBS_REQUIRE_NETNS=1) \
         but {why}"
    );
    eprintln!(
        "\n*** SKIPPED {test}: {why}; network namespace tests need root and iproute2 \
         (CI=true or SOFTVERBS_REQUIRE_NETNS=1 makes this a failure) ***\n"
    );
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Prefix of the namespaces these tests create: `svacc-<pid>-<n>-a`/`-b`.
const NS_PREFIX: &str = "svacc-";

/// Removes namespaces left behind by test processes that no longer exist (killed before
/// their drop ran).
fn remove_stale_namespaces() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(NS_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

static NEXT_LINK: AtomicU32 = AtomicU32::new(0);

/// Two network namespaces joined by a veth pair, names unique to this process and call,
/// addresses `10.253.N.1/24` and `10.253.N.2/24`; deleted (with the pair) on drop.
pub struct Netns {
    pub ns: [String; 2],
    pub addr: [String; 2],
}

impl Netns {
    /// Creates the pair, or skips loudly (None) where namespaces cannot be made; under
    /// `CI=true` or `SOFTVERBS_REQUIRE_NETNS=1` a skip is a failure.
    pub fn create(test: &str) -> Option<Netns> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            netns_skip(test, "not running as root");
            return None;
        }
        if !Command::new("ip")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            netns_skip(test, "iproute2 (ip) not installed");
            return None;
        }
        remove_stale_namespaces();
        let pid = std::process::id();
        let n = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
        let ns = [
            format!("{NS_PREFIX}{pid}-{n}-a"),
            format!("{NS_PREFIX}{pid}-{n}-b"),
        ];
        // Interface names: at most 15 bytes ("va" + 7-digit pid + "x" + n + side).
        let dev = [
            format!("va{}x{}a", pid % 10_000_000, n % 100),
            format!("va{}x{}b", pid % 10_000_000, n % 100),
        ];
        let subnet = 1 + n % 250;
        let addr = [format!("10.253.{subnet}.1"), format!("10.253.{subnet}.2")];
        let link = Netns {
            ns: ns.clone(),
            addr: addr.clone(),
        };
        let setup = || -> Result<(), String> {
            for name in &ns {
                let _ = ip(&["netns", "del", name]);
                ip(&["netns", "add", name])?;
            }
            let _ = ip(&["link", "del", &dev[0]]);
            ip(&[
                "link", "add", &dev[0], "type", "veth", "peer", "name", &dev[1],
            ])?;
            for i in 0..2 {
                ip(&["link", "set", &dev[i], "netns", &ns[i]])?;
                ip(&[
                    "-n",
                    &ns[i],
                    "addr",
                    "add",
                    &format!("{}/24", addr[i]),
                    "dev",
                    &dev[i],
                ])?;
                ip(&["-n", &ns[i], "link", "set", &dev[i], "up"])?;
                ip(&["-n", &ns[i], "link", "set", "lo", "up"])?;
            }
            Ok(())
        };
        match setup() {
            Ok(()) => Some(link),
            Err(why) => {
                drop(link);
                netns_skip(test, &format!("cannot set up namespaces: {why}"));
                None
            }
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it the pair.
        for n in &self.ns {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

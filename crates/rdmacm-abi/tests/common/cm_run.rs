//! Running Debian's unmodified rdma_cm programs (rdmacm-utils, perftest `-R`) as separate
//! processes on the drop-in `librdmacm.so.1` + softverbs' `libibverbs.so.1` (and the provider
//! stubs perftest links), with ibverbs-abi's process harness ([`super::procs`]): some
//! "servers" started first (a listener, or multicast receivers), then some "clients" started
//! together, every process killed at a deadline.
//!
//! Retrying: an rdma_cm client that reaches its server before it listens fails at once with
//! REJECTED status 8 (REQ) or UNREACHABLE status 1 (SIDR_REQ), as against Linux with nobody
//! listening. Nothing tells a test when a server listens, and perftest has such a window of
//! its own in the middle of its run (after its control connection it opens the data
//! listener while the client, past the same handshake, already connects; perftest's own
//! retry loop reuses the ids it has just destroyed). So a case whose client failed that way
//! while its server still ran is run again from scratch, on a new port and with a longer head
//! start for the servers, a few times; the report says how many attempts it took. So is a
//! case where a perftest failed its own clock calibration (`procs::CLOCK_CHECK_FAILED`).

use super::procs::{self, Outcome, Running, Side};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long one attempt may run before everything still running is killed.
pub const TIMEOUT: Duration = Duration::from_secs(180);

/// How long servers that exit by themselves may take once the clients finished.
const SERVER_GRACE: Duration = Duration::from_secs(20);

/// Before the clients start: the servers get this long to listen (unless the case says),
/// times the attempt's number.
const SERVER_HEAD_START: Duration = Duration::from_millis(300);

/// Attempts of one case (see the module comment). perftest `-R`'s own window (its client
/// connects to the data listener right after the handshake that precedes the server's
/// listen) is lost by about a third of the attempts on an idle machine here (27 retries in
/// 8 runs of `perftest_cm`'s 7 cases) and more under load; CI once lost five in a row,
/// and later all ten of one case: since then a thread that turns to the connection
/// manager sends the ACK it held first, and `perftest_cm` pins its two programs to two
/// CPUs (its `on_cpu` says why), which took its retries from 11-18 to 0 per run of the
/// binary at load 7-10.
const ATTEMPTS: u32 = 10;

/// What a client prints when it reached the server before it listened.
const NOT_LISTENING_YET: [&str; 10] = [
    "RDMA_CM_EVENT_REJECTED, error 8",
    "RDMA_CM_EVENT_REJECTED, error: 8",
    "RDMA_CM_EVENT_REJECTED; error: 8",
    "RDMA_CM_EVENT_UNREACHABLE, error 1",
    "RDMA_CM_EVENT_UNREACHABLE, error: 1",
    "RDMA_CM_EVENT_UNREACHABLE; error: 1",
    "rdma_connect: Connection refused",
    // rstream, riostream, rcopy (rsockets).
    "rconnect: Connection refused",
    "rconnect failed\n: Connection refused",
    // Socket programs under librspreload (which falls back to TCP when rconnect fails).
    "connect: Connection refused",
];

/// A directory with `librdmacm.so.1`, `libibverbs.so.1`, `libmlx5.so.1` and `libefa.so.1`
/// pointing at the cdylibs of this test's profile (`cargo build --workspace` first).
pub fn dropin(name: &str) -> PathBuf {
    let dir = procs::dropin(name);
    let so = super::LIB
        .cdylib()
        .canonicalize()
        .expect("canonical library path");
    let link = dir.join(super::LIB.soname);
    if std::fs::read_link(&link).ok().as_deref() != Some(so.as_path()) {
        let tmp = dir.join(format!(".rdmacm.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&so, &tmp).expect("symlink librdmacm.so.1");
        std::fs::rename(&tmp, &link).expect("rename librdmacm.so.1");
    }
    dir
}

/// Whether `/usr/bin/TOOL` is there; skips loudly (fails under
/// `SOFTVERBS_REQUIRE_TOOLS=1`) when it is not.
pub fn have_tool(tool: &str, package: &str) -> bool {
    procs::tool_present(&format!("/usr/bin/{tool}"), package)
}

/// The processes of one case.
pub struct Case {
    pub servers: Vec<Side>,
    pub clients: Vec<Side>,
    /// Whether the servers end by themselves (rping `-P` and cmtime's server never do: they
    /// must still be running when the clients are done, and are then killed).
    pub servers_exit: bool,
    /// Start each client only when the one before it has finished (otherwise all at once).
    pub clients_one_by_one: bool,
    /// How long the servers run before the clients start, when not the default 300 ms.
    pub head_start: Option<Duration>,
}

impl Case {
    /// `servers` and `clients`, the clients all started together after the default head
    /// start, the servers ending by themselves.
    pub fn new(servers: Vec<Side>, clients: Vec<Side>) -> Self {
        Case {
            servers,
            clients,
            servers_exit: true,
            clients_one_by_one: false,
            head_start: None,
        }
    }

    /// One server and one client.
    pub fn pair(server: Side, client: Side) -> Self {
        Case::new(vec![server], vec![client])
    }

    /// The servers serve until they are killed once the clients are done.
    pub fn servers_run_until_killed(mut self) -> Self {
        self.servers_exit = false;
        self
    }

    /// Each client starts only when the one before it has finished.
    pub fn clients_one_by_one(mut self) -> Self {
        self.clients_one_by_one = true;
        self
    }

    /// The servers run for `head_start` before the clients start.
    pub fn head_start(mut self, head_start: Duration) -> Self {
        self.head_start = Some(head_start);
        self
    }
}

/// How a case ended.
pub struct CaseOutcome {
    pub servers: Vec<Outcome>,
    pub clients: Vec<Outcome>,
    /// For servers that never exit: whether each was still running when the clients ended.
    pub servers_alive: Vec<bool>,
    pub servers_exit: bool,
    pub attempts: u32,
    pub commands: String,
}

impl CaseOutcome {
    /// Everything known, for assertion messages.
    pub fn report(&self) -> String {
        let mut s = format!("{}\n{} attempt(s)\n", self.commands, self.attempts);
        let describe = |who: String, o: &Outcome| {
            let how = match o.status {
                Some(st) => st.to_string(),
                None => "killed".to_string(),
            };
            format!(
                "--- {who} (pid {}): {how} after {:.1} s\n--- stdout:\n{}\n--- stderr:\n{}\n",
                o.pid,
                o.elapsed.as_secs_f64(),
                tail(&o.stdout),
                tail(&o.stderr)
            )
        };
        for (i, o) in self.servers.iter().enumerate() {
            s += &describe(format!("server {i}"), o);
        }
        for (i, o) in self.clients.iter().enumerate() {
            s += &describe(format!("client {i}"), o);
        }
        s
    }

    /// Panics with the report unless every client exited 0 and every server either exited 0
    /// or (for servers that never exit) was still running at the end.
    pub fn assert_ok(&self, what: &str) {
        let clients_ok = self.clients.iter().all(Outcome::success);
        let servers_ok = if self.servers_exit {
            self.servers.iter().all(Outcome::success)
        } else {
            self.servers_alive.iter().all(|&a| a)
        };
        assert!(
            clients_ok && servers_ok,
            "{what}: every process must succeed\n{}",
            self.report()
        );
    }
}

/// The last 3000 bytes of a (possibly huge, e.g. `rping -v -S 65535`) output.
fn tail(s: &str) -> &str {
    let mut start = s.len().saturating_sub(3000);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn not_listening_yet(o: &Outcome) -> bool {
    !o.success() && NOT_LISTENING_YET.iter().any(|m| o.output().contains(m))
}

/// Runs the case `make(port)` builds (on a fresh UDP port per attempt), retrying as the
/// module comment says.
pub fn run_case(dropin: &Path, make: impl Fn(u16) -> Case) -> CaseOutcome {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let case = make(procs::free_udp_port());
        let (outcome, retry) = run_once(dropin, &case, attempt);
        let clock_failed = outcome
            .servers
            .iter()
            .chain(&outcome.clients)
            .any(Outcome::failed_clock_check);
        if !(retry || clock_failed) || attempt == ATTEMPTS {
            return outcome;
        }
        if clock_failed {
            eprintln!(
                "perftest's clock calibration failed; again (attempt {})\n{}",
                attempt + 1,
                outcome.report()
            );
        } else {
            eprintln!(
                "a client reached its server before it listened; again (attempt {})",
                attempt + 1
            );
        }
    }
}

fn run_once(dropin: &Path, case: &Case, attempts: u32) -> (CaseOutcome, bool) {
    let deadline = Instant::now() + TIMEOUT;
    let mut commands = format!("LD_LIBRARY_PATH={}\n", dropin.display());
    for s in &case.servers {
        commands += &format!("server: {}\n", s.describe());
    }
    for c in &case.clients {
        commands += &format!("client: {}\n", c.describe());
    }
    let mut servers: Vec<Running> = case
        .servers
        .iter()
        .map(|s| Running::spawn(s, dropin))
        .collect();
    // Each attempt after a client came too early gives the servers longer: a slow start
    // (a busy machine, a cold cache) is not lost five times in a row.
    std::thread::sleep(case.head_start.unwrap_or(SERVER_HEAD_START) * attempts);
    let clients: Vec<Outcome> = if case.clients_one_by_one {
        case.clients
            .iter()
            .map(|c| Running::spawn(c, dropin).finish(deadline))
            .collect()
    } else {
        let running: Vec<Running> = case
            .clients
            .iter()
            .map(|c| Running::spawn(c, dropin))
            .collect();
        running.into_iter().map(|c| c.finish(deadline)).collect()
    };
    let servers_alive: Vec<bool> = servers.iter_mut().map(Running::running).collect();
    let retry = clients.iter().any(not_listening_yet) && servers_alive.iter().any(|&a| a);
    let server_deadline = if case.servers_exit && !retry {
        (Instant::now() + SERVER_GRACE).min(deadline + SERVER_GRACE)
    } else {
        Instant::now()
    };
    let servers = servers
        .into_iter()
        .map(|s| s.finish(server_deadline))
        .collect();
    (
        CaseOutcome {
            servers,
            clients,
            servers_alive,
            servers_exit: case.servers_exit,
            attempts,
            commands,
        },
        retry,
    )
}

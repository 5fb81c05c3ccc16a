//! The set-up the real-socket tests share: two devices of one process on loopback, each
//! with a PD, a CQ, an RC QP and a 1 MiB region, connected to each other.

#![allow(dead_code)] // each test binary uses its own part of it

use softverbs::*;

pub struct End {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub mr: Mr<Vec<u8>>,
}

pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// These tests are about the UDP path: the same-host path (which two devices of one
/// process would negotiate) is off; it has its own tests (`tests/samehost.rs`).
pub fn end(config: Config) -> End {
    end_on(config, |ctx| ctx.create_cq(256, None).unwrap())
}

/// [`end`] whose CQ (16 entries) signals a completion channel, which comes with it.
pub fn end_with_channel(config: Config) -> (End, CompletionChannel) {
    let mut channel = None;
    let end = end_on(config, |ctx| {
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(16, Some(&ch)).unwrap();
        channel = Some(ch);
        cq
    });
    (end, channel.unwrap())
}

fn end_on(config: Config, create_cq: impl FnOnce(&Context) -> Cq) -> End {
    let config = Config {
        same_host: SameHostMode::Off,
        ..config
    };
    let ctx = Device::with_config("test", config).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = create_cq(&ctx);
    let qp = QpBuilder::new(&pd, &cq).build().unwrap();
    let mr = pd.reg_mr(vec![0u8; 1 << 20], all_access()).unwrap();
    End {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

pub fn connect(a: &End, b: &End, mtu: Mtu) {
    connect_with_rnr_timer(a, b, mtu, 1);
}

/// `min_rnr_timer`: the IBA code of the wait both ends ask for in their RNR NAKs.
pub fn connect_with_rnr_timer(a: &End, b: &End, mtu: Mtu, min_rnr_timer: u8) {
    connect_with_timers(a, b, mtu, min_rnr_timer, RtsAttr::default().timeout);
}

/// [`connect_with_rnr_timer`] with both ends' local ACK timeout code `ack_timeout`
/// (4.096 µs × 2^code, IBA 9.7.6.1.3; `RtsAttr`'s default is 14, 67 ms).
pub fn connect_with_timers(a: &End, b: &End, mtu: Mtu, min_rnr_timer: u8, ack_timeout: u8) {
    for (x, y, psn) in [(a, b, 100u32), (b, a, 200u32)] {
        x.qp.to_init(InitAttr {
            access: all_access(),
        })
        .unwrap();
        let remote =
            RemoteQp::from_gid(y.ctx.gid(), y.qp.qpn(), if psn == 100 { 200 } else { 100 });
        x.qp.to_rtr(RtrAttr {
            remote,
            mtu,
            max_dest_rd_atomic: 16,
            min_rnr_timer,
        })
        .unwrap();
        x.qp.to_rts(RtsAttr {
            sq_psn: psn,
            timeout: ack_timeout,
            ..RtsAttr::default()
        })
        .unwrap();
    }
}

pub fn pair(config: Config) -> (End, End) {
    let a = end(config.clone());
    let b = end(config);
    connect(&a, &b, Mtu::Mtu4096);
    (a, b)
}

/// Posts a signalled RDMA WRITE of `len` bytes at `local` in `from`'s region to `remote`
/// in `to`'s.
pub fn post_write(from: &End, to: &End, id: u64, local: usize, remote: usize, len: u32) {
    post_write_with(from, to, id, (local, remote, len), SendFlags::SIGNALED);
}

/// [`post_write`] with no completion (the WR stays on the send queue until a later
/// signalled one completes).
pub fn post_unsignalled_write(
    from: &End,
    to: &End,
    id: u64,
    local: usize,
    remote: usize,
    len: u32,
) {
    post_write_with(from, to, id, (local, remote, len), SendFlags::EMPTY);
}

fn post_write_with(
    from: &End,
    to: &End,
    id: u64,
    (local, remote, len): (usize, usize, u32),
    flags: SendFlags,
) {
    let sges = [from.mr.sge(local, len)];
    let mut wr = SendWr::new(
        id,
        SendOp::RdmaWrite {
            remote_addr: to.mr.addr() + remote as u64,
            rkey: Rkey(to.mr.rkey()),
        },
        &sges,
    );
    wr.flags = flags;
    from.qp.post_send(&wr).unwrap();
}

/// [`pair`] with the given poll hand-off (`Config::poll_handoff`): the hand-off tests set
/// it long, so that only the rule under test can end it, or to zero.
pub fn pair_with_handoff(poll_handoff: std::time::Duration) -> (End, End) {
    pair(Config {
        poll_handoff,
        ..Config::default()
    })
}

/// [`pair_with_handoff`] with a hand-off longer than any test, so that only the threads
/// polling the CQs receive (the progress threads, which answer where pollers stop, never
/// do), and a local ACK timeout of code 18 (1.07 s; `RtsAttr`'s default 14 is 67 ms) on
/// both QPs: for a ping-pong of two threads, each spinning on its end's CQ, the only
/// readers of their sockets. Beside busy loops such a poller waits long for a CPU
/// (runnable, not run: 133-436 ms in traced runs at load 12; each of its `sched_yield`s
/// costs it a whole slice under the kernel's EEVDF scheduler), and at code 14 a wait
/// past eight timeouts (0.54 s) failed the peer's SEND with RetryExcErr
/// (docs/loss-recovery.md, session 15). At code 18 the budget is 8.6 s, within the
/// tests' 20 s wait.
pub fn pollers_only_pair() -> (End, End) {
    let config = Config {
        poll_handoff: std::time::Duration::from_secs(3600),
        ..Config::default()
    };
    let a = end(config.clone());
    let b = end(config);
    connect_with_timers(&a, &b, Mtu::Mtu4096, 1, 18);
    (a, b)
}

/// Held by a test that asserts on the driver's counters (wake-ups, system calls, who
/// received), so that such tests of one binary run one at a time: cargo runs a binary's
/// tests in parallel, and a bulk transfer beside a counted ping-pong takes the cores the
/// ping-pong's threads need to keep the socket (CI saw 36 wake-ups in 290 rounds where
/// alone there are a handful). Tests that only check data need not take it.
pub fn counted() -> std::sync::MutexGuard<'static, ()> {
    static COUNTED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A counting test that failed poisoned the lock; the next one may still run.
    COUNTED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A second process for a test: one test of this same test binary, run alone in a
/// child (`samehost.rs`'s target, `stopped_peer.rs`'s peer), driven line by line: the
/// test writes lines to its stdin and hears the lines it prints after `@@ ` (libtest's
/// own "test NAME ... " may precede one on the same line). Dropping it says `quit` and
/// waits for the child, killing it if it is still there after `wait`.
pub struct TestChild {
    pub child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    wait: std::time::Duration,
}

impl TestChild {
    /// Spawns `cmd` (this test binary, maybe under a prefix command, with the test's
    /// name and environment already given) with its stdin and stdout piped to the test.
    pub fn spawn(cmd: &mut std::process::Command, wait: std::time::Duration) -> TestChild {
        use std::io::{BufRead, BufReader};
        use std::process::Stdio;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(at) = line.find("@@ ") {
                    if tx.send(line[at + 3..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        TestChild {
            child,
            stdin,
            lines,
            wait,
        }
    }

    /// Writes `line` to the child.
    pub fn say(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The child's next `@@ ` line; `what` names it when none comes in time.
    pub fn hear(&self, what: &str) -> String {
        self.lines
            .recv_timeout(self.wait)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }
}

impl Drop for TestChild {
    fn drop(&mut self) {
        use std::io::Write;
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = std::time::Instant::now() + self.wait;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The calling thread's id (as `/proc/self/task/TID`) and the CPUs it may run on (a list
/// such as `0-1`).
pub fn this_thread() -> (String, String) {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    let tid = link.file_name().unwrap().to_str().unwrap().to_string();
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    (tid, cpus)
}

/// Sets the CPUs thread `tid` may run on (`taskset`, a CPU list such as `0` or `0-1`).
pub fn allow_cpus(tid: &str, cpus: &str) {
    let out = std::process::Command::new("taskset")
        .args(["-p", "-c", cpus, tid])
        .output()
        .expect("taskset (util-linux)");
    assert!(out.status.success(), "taskset -p -c {cpus} {tid}: {out:?}");
}

/// The CPU time (ns) thread `tid` of this process has run so far (the first field of
/// its `schedstat`).
pub fn thread_cpu_ns(tid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    stat.split_whitespace().next().unwrap().parse().unwrap()
}

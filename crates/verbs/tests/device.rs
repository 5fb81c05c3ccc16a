//! The device model over real sockets: contexts sharing one device, LID and GID
//! addressing, one batch per list of work requests, backpressure from a full socket
//! buffer, memory registration checks, and events of destroyed objects.

use softverbs::error::{RegMrError, ResourceError};
use softverbs::*;
use std::time::Duration;

mod common;
use common::{allow_cpus, this_thread};

const WAIT: Duration = Duration::from_secs(20);
const QKEY: u32 = 0x1234_5678;

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// Moves an RC QP to RTS towards `remote`.
fn connect(qp: &Qp, remote: RemoteQp) {
    qp.to_init(InitAttr {
        access: all_access(),
    })
    .unwrap();
    qp.to_rtr(RtrAttr {
        remote,
        mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
    })
    .unwrap();
    qp.to_rts(RtsAttr {
        sq_psn: remote.psn,
        ..RtsAttr::default()
    })
    .unwrap();
}

/// A UD QP in RTS with a registered buffer.
struct Ud {
    ctx: Context,
    cq: Cq,
    qp: Qp,
    mr: Mr<Vec<u8>>,
    _pd: Pd,
}

fn ud(ctx: Context, cqe: u32, depth: u32) -> Ud {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(cqe, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq)
        .qp_type(QpType::Ud)
        .cap(QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        })
        .build()
        .unwrap();
    qp.ud_to_init(QKEY).unwrap();
    qp.ud_to_rtr().unwrap();
    qp.to_rts(RtsAttr::default()).unwrap();
    let mr = pd
        .reg_mr(vec![0u8; 1 << 20], AccessFlags::LOCAL_WRITE)
        .unwrap();
    Ud {
        ctx,
        cq,
        qp,
        mr,
        _pd: pd,
    }
}

#[test]
fn contexts_of_one_device_share_its_endpoint_and_keep_their_events() {
    let dev = Device::with_config("shared", Config::default());
    let a = dev.open().unwrap();
    let b = dev.open().unwrap();
    assert!(a.same_device(&b));
    assert_eq!(a.local_addr(), b.local_addr());
    assert_eq!((a.gid(), a.lid()), (b.gid(), b.lid()));
    // Loopback by default: the standard RoCEv2 GID of the process's own address.
    if a.local_addr().port() == ROCE_PORT {
        assert_eq!(a.gid().0[..12], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(&a.gid().0[12..14], &[127, 83]);
    }
    assert_ne!(a.lid(), 0);
    // Only the context that brought the port up saw it come up.
    assert_eq!(a.poll_async_event(), Some(AsyncEvent::PortActive));
    assert_eq!(b.poll_async_event(), None);
    // Another device has another endpoint.
    let other = Device::with_config("other", Config::default())
        .open()
        .unwrap();
    assert!(!other.same_device(&a));
    assert_ne!(other.local_addr(), a.local_addr());

    // An RC QP in each context, each addressing the other with its own port's LID (A) or
    // GID (B), as programs do on hardware where contexts share the port.
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        a.create_cq(16, None).unwrap(),
        b.create_cq(16, None).unwrap(),
    );
    let qa = QpBuilder::new(&pa, &ca).build().unwrap();
    let qb = QpBuilder::new(&pb, &cb).build().unwrap();
    assert_ne!(qa.qpn(), qb.qpn(), "one QPN space");
    let by_lid = a.lid_to_addr(a.lid()).unwrap();
    connect(
        &qa,
        RemoteQp {
            addr: by_lid,
            qpn: qb.qpn(),
            psn: 7,
        },
    );
    connect(&qb, RemoteQp::from_gid(b.gid(), qa.qpn(), 7));
    let ma = pa.reg_mr(vec![0u8; 4096], all_access()).unwrap();
    let mb = pb.reg_mr(vec![0u8; 4096], all_access()).unwrap();
    ma.write(0, b"to b");
    qb.post_recv(1, &[mb.sge(0, 64)]).unwrap();
    let sges = [ma.sge(0, 4)];
    qa.post_send(&SendWr::new(2, SendOp::Send, &sges)).unwrap();
    assert_eq!(ca.wait_for(1, WAIT)[0].status, WcStatus::Success);
    let wc = cb.wait_for(1, WAIT)[0];
    assert_eq!(
        (wc.status, wc.byte_len, wc.src_qp),
        (WcStatus::Success, 4, qa.qpn())
    );
    let mut got = [0u8; 4];
    mb.read(0, &mut got);
    assert_eq!(&got, b"to b");

    // A WRITE with a bad rkey into B: the access error is B's QP's, so it arrives on B's
    // async events and not on A's.
    let wr = SendWr::new(
        3,
        SendOp::RdmaWrite {
            remote_addr: mb.addr(),
            rkey: Rkey(mb.rkey() ^ 0x100),
        },
        &sges,
    );
    qa.post_send(&wr).unwrap();
    assert_eq!(ca.wait_for(1, WAIT)[0].status, WcStatus::RemAccessErr);
    let mut ev = None;
    let deadline = std::time::Instant::now() + WAIT;
    while ev.is_none() && std::time::Instant::now() < deadline {
        ev = b.poll_async_event();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ev, Some(AsyncEvent::QpAccessError(qb.handle())));
    b.ack_async_event(&ev.unwrap());
    assert_eq!(a.poll_async_event(), None);
    no_system_call_under_the_device_lock();
}

/// The driver's self-check: every send, receive and event fd write of this process (all
/// the tests of this file) happened without the device lock held.
fn no_system_call_under_the_device_lock() {
    assert_eq!(softverbs::syscalls_under_device_lock(), 0);
}

#[test]
fn events_of_a_destroyed_object_are_never_delivered() {
    let dev = Device::with_config("gone", Config::default());
    let a = dev.open().unwrap();
    let b = dev.open().unwrap();
    let _ = a.poll_async_event();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        a.create_cq(16, None).unwrap(),
        b.create_cq(16, None).unwrap(),
    );
    let qa = QpBuilder::new(&pa, &ca).build().unwrap();
    let qb = QpBuilder::new(&pb, &cb).build().unwrap();
    connect(&qa, RemoteQp::from_gid(b.gid(), qb.qpn(), 1));
    connect(&qb, RemoteQp::from_gid(a.gid(), qa.qpn(), 1));
    let ma = pa.reg_mr(vec![0u8; 64], all_access()).unwrap();
    let sges = [ma.sge(0, 8)];
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: Rkey(0xdead),
        },
        &sges,
    );
    qa.post_send(&wr).unwrap();
    assert_eq!(ca.wait_for(1, WAIT)[0].status, WcStatus::RemAccessErr);
    // The event is pending on B's fd; destroying the QP drops it.
    let deadline = std::time::Instant::now() + WAIT;
    while !fd_readable(b.async_fd()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(fd_readable(b.async_fd()), "the access error is pending");
    qb.close_events();
    drop(qb);
    assert!(!fd_readable(b.async_fd()));
    assert_eq!(b.poll_async_event(), None);
    no_system_call_under_the_device_lock();
}

fn fd_readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
fn a_list_of_32_work_requests_is_one_lock_one_batch_one_sendmmsg() {
    let dev = Device::with_config("batch", Config::default());
    let rx = ud(dev.open().unwrap(), 64, 64);
    let tx = ud(dev.open().unwrap(), 64, 64);
    for i in 0..32u64 {
        rx.qp
            .post_recv(i, &[rx.mr.sge(i as usize * 128, 128)])
            .unwrap();
    }
    let ah = AddressHandle::from_gid(rx.ctx.gid());
    let payload: Vec<u8> = (0..32u8).collect();
    let wrs: Vec<SendWr<'_>> = (0..32)
        .map(|i| {
            let mut wr = SendWr::new(i, ah.send(rx.qp.qpn(), QKEY, None), &[]);
            wr.payload = Payload::Inline(&payload[i as usize..i as usize + 1]);
            wr
        })
        .collect();
    let before = tx.ctx.device_counters();
    tx.qp.post_send_list(&wrs).unwrap();
    let after = tx.ctx.device_counters();
    // UD sends produce nothing else on this device (no ACKs): one sendmmsg carried all 32.
    assert_eq!(after.tx_datagrams - before.tx_datagrams, 32);
    assert_eq!(
        after.tx_syscalls - before.tx_syscalls,
        1,
        "{before:?} -> {after:?}"
    );
    let wcs = rx.cq.wait_for(32, WAIT);
    assert_eq!(wcs.len(), 32);
    for wc in &wcs {
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 41));
        let mut b = [0u8; 1];
        rx.mr.read(wc.wr_id as usize * 128 + 40, &mut b);
        assert_eq!(u64::from(b[0]), wc.wr_id);
    }
    no_system_call_under_the_device_lock();
}

/// Whether a skipped namespace test is a failure here (as crates/cli/tests/netns.rs).
fn netns_required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("SOFTVERBS_REQUIRE_NETNS").is_ok_and(|v| v == "1")
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A network namespace whose loopback is rate-limited by a token bucket, so that a socket
/// that sends faster than the bucket drains fills its send buffer (on a plain loopback the
/// kernel frees a datagram's buffer space as soon as it is sent); deleted on drop.
struct SlowLoopback(String);

impl SlowLoopback {
    fn create() -> Result<SlowLoopback, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not running as root".into());
        }
        let name = format!("svbp-{}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let ns = SlowLoopback(name);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"])?;
        let out = std::process::Command::new("ip")
            .args([
                "netns", "exec", &ns.0, "tc", "qdisc", "add", "dev", "lo", "root",
            ])
            .args([
                "tbf", "rate", "200mbit", "burst", "64kb", "latency", "500ms",
            ])
            .output()
            .map_err(|e| format!("cannot run tc: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "no token bucket qdisc here (tc: {})",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(ns)
    }

    /// Moves the calling thread into the namespace (sockets it creates live there).
    fn enter(&self) -> std::io::Result<()> {
        let f = std::fs::File::open(format!("/var/run/netns/{}", self.0))?;
        use std::os::fd::AsRawFd;
        // SAFETY: setns with an open namespace fd; affects this thread only.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for SlowLoopback {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

#[test]
fn a_full_socket_buffer_is_backpressure_not_loss() {
    let ns = match SlowLoopback::create() {
        Ok(ns) => ns,
        Err(why) => {
            // A kernel without sch_tbf cannot slow a loopback down: say so loudly, but only
            // a missing root or iproute2 fails where namespaces are required.
            let tbf_missing = why.starts_with("no token bucket");
            assert!(
                tbf_missing || !netns_required(),
                "backpressure test required here but {why}"
            );
            eprintln!("\n*** SKIPPED a_full_socket_buffer_is_backpressure_not_loss: {why} ***\n");
            return;
        }
    };
    // A thread of its own in the namespace: the devices' sockets are made there.
    let c = std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter().expect("setns");
            burst_through_a_small_send_buffer()
        })
        .join()
        .unwrap()
    });
    assert!(c.tx_backpressure > 0, "the send buffer never filled: {c:?}");
    no_system_call_under_the_device_lock();
}

/// Sends UD datagrams from a device with a tiny send buffer to one with a large receive
/// buffer. UD has no retransmission, so every datagram the sender gave up on would be
/// missing at the receiver: all must arrive, none refused. The sender's counters.
fn burst_through_a_small_send_buffer() -> DeviceCounters {
    const N: u64 = 3000;
    let small = Config {
        socket_buffer: 4096,
        gso: false,
        ..Config::default()
    };
    let big = Config {
        socket_buffer: 32 << 20,
        ..Config::default()
    };
    let tx = ud(
        Device::with_config("small", small).open().unwrap(),
        4096,
        4096,
    );
    let rx = ud(Device::with_config("big", big).open().unwrap(), 4096, 4096);
    for i in 0..N {
        rx.qp
            .post_recv(i, &[rx.mr.sge((i % 200) as usize * 4096, 1024 + 40)])
            .unwrap();
    }
    let ah = AddressHandle::from_gid(rx.ctx.gid());
    let sges = [tx.mr.sge(0, 1024)];
    let (mut posted, mut done) = (0, 0);
    while done < N {
        // Keep the send queue full: lists of 64 datagrams of 1 KiB.
        while posted < N && posted - done < 2048 {
            let wrs: Vec<SendWr<'_>> = (posted..N.min(posted + 64))
                .map(|i| SendWr::new(i, ah.send(rx.qp.qpn(), QKEY, None), &sges))
                .collect();
            tx.qp.post_send_list(&wrs).unwrap();
            posted += wrs.len() as u64;
        }
        let wcs = tx.cq.wait_for((posted - done) as usize, WAIT);
        assert!(!wcs.is_empty(), "the sender stalled after {done}");
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
        done += wcs.len() as u64;
    }
    let got = rx.cq.wait_for(N as usize, WAIT);
    let c = tx.ctx.device_counters();
    eprintln!("sender: {c:?}");
    assert_eq!(c.tx_errors, 0, "{c:?}");
    assert_eq!(c.tx_datagrams, N, "{c:?}");
    assert_eq!(got.len() as u64, N, "every datagram arrived ({c:?})");
    c
}

#[test]
fn registration_refuses_what_the_kernel_refuses() {
    let cap = 1 << 20;
    let ctx = Device::with_config(
        "reg",
        Config {
            max_mr_bytes: cap,
            ..Config::default()
        },
    )
    .open()
    .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    assert_eq!(ctx.query_device().max_mr_size, cap);
    let page = 4096;
    // SAFETY: a fresh private anonymous mapping of two pages, owned by this test.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let base = map.cast::<u8>();
    // SAFETY: the second page of our mapping becomes read-only.
    assert_eq!(
        unsafe { libc::mprotect(base.add(page).cast(), page, libc::PROT_READ) },
        0
    );
    let fault = |r: Result<RawMr, RegMrError>| matches!(r, Err(RegMrError::Fault { .. }));
    // SAFETY (each reg_mr_raw below): the ranges are this test's mapping, alive until the
    // end of the test; the regions are dropped before it is unmapped.
    unsafe {
        // Writable page: fine. Read-only page: fine to read, not to write.
        let ok = pd.reg_mr_raw(base, page, all_access()).unwrap();
        let ro = pd
            .reg_mr_raw(base.add(page), page, AccessFlags::REMOTE_READ)
            .unwrap();
        assert!(fault(pd.reg_mr_raw(
            base.add(page),
            page,
            AccessFlags::LOCAL_WRITE
        )));
        assert!(fault(pd.reg_mr_raw(
            base,
            2 * page,
            AccessFlags::REMOTE_WRITE
        )));
        assert!(fault(pd.reg_mr_raw(
            base.add(page),
            page,
            AccessFlags::REMOTE_ATOMIC
        )));
        // Empty.
        assert!(matches!(
            pd.reg_mr_raw(base, 0, AccessFlags::LOCAL_WRITE),
            Err(RegMrError::Resource(ResourceError::InvalidArgument(_)))
        ));
        drop((ok, ro));
        // Unmapped (the mapping is gone).
        assert_eq!(libc::munmap(map, 2 * page), 0);
        assert!(fault(pd.reg_mr_raw(base, page, AccessFlags::REMOTE_READ)));
    }
    // The cap counts every registered byte, and frees them on deregistration.
    let half = pd
        .reg_mr(vec![0u8; cap as usize / 2], all_access())
        .unwrap();
    let err = pd
        .reg_mr(vec![0u8; cap as usize / 2 + 1], all_access())
        .unwrap_err();
    assert!(matches!(err, RegMrError::TooMuch { .. }), "{err}");
    drop(half);
    let full = pd.reg_mr(vec![0u8; cap as usize], all_access()).unwrap();
    drop(full);
}

/// The `sched_runtime` (the EEVDF slice of a fair task) thread `tid` reports, in ns.
fn sched_runtime(tid: libc::pid_t) -> Option<u64> {
    softverbs::sched_slice(tid).map(|d| d.as_nanos() as u64)
}

/// Whether this kernel takes a fair task's `sched_runtime` as its slice (Linux 6.12+):
/// a scratch thread asks for 300 µs and reads back what it got.
fn kernel_takes_fair_slices() -> bool {
    std::thread::spawn(|| {
        softverbs::set_sched_slice(Duration::from_micros(300)) == Some(Duration::from_micros(300))
    })
    .join()
    .unwrap()
}

/// The slices the progress threads of this process's devices report, by thread.
fn progress_thread_slices() -> Vec<(libc::pid_t, Option<u64>)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let tid: libc::pid_t = e.ok()?.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
            comm.starts_with("softverbs-")
                .then(|| (tid, sched_runtime(tid)))
        })
        .collect()
}

/// `SOFTVERBS_PROGRESS_SLICE`: the progress thread asks the scheduler for that slice, so a
/// datagram that wakes it on a busy CPU waits less for it (docs/loss-recovery.md,
/// session 7). No other test configures one, so a thread with exactly this slice is this
/// device's.
#[test]
fn the_progress_thread_asks_for_the_configured_slice() {
    if !kernel_takes_fair_slices() {
        eprintln!(
            "SKIPPED the_progress_thread_asks_for_the_configured_slice: this kernel does not \
             take sched_runtime as a fair task's slice (Linux 6.12+ does)"
        );
        return;
    }
    const SLICE: u64 = 170_000;
    let before = progress_thread_slices();
    assert!(before.iter().all(|(_, s)| *s != Some(SLICE)), "{before:?}");
    let ctx = Device::with_config(
        "slice",
        Config {
            progress_slice: Duration::from_nanos(SLICE),
            ..Config::default()
        },
    )
    .open()
    .unwrap();
    // The thread sets it as it starts: give it a moment (bounded), on counters, not time.
    let mut found = Vec::new();
    for _ in 0..2000 {
        found = progress_thread_slices();
        if found.iter().any(|(_, s)| *s == Some(SLICE)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        found.iter().any(|(_, s)| *s == Some(SLICE)),
        "no progress thread asked for {SLICE} ns: {found:?}"
    );
    drop(ctx);
}

/// The first CPU of a list such as `0-1` or `3,5`.
fn first_cpu(list: &str) -> String {
    list.split([',', '-']).next().unwrap().to_string()
}

/// Each of two threads spins on its own device's empty CQ: for `phase` pinned to the
/// first CPU this process may use, then allowed every CPU again until `phase` is over or
/// `stop` says so. Returns the devices' CPU moves (`poll_cpu_moves`) at the release and
/// at the end.
fn two_spinners(phase: Duration, stop: impl Fn(&[Context]) -> bool + Sync) -> (u64, u64) {
    let devices: Vec<Context> = (0..2)
        .map(|i| {
            let config = Config {
                poll_spread: Duration::from_micros(20),
                ..Config::default()
            };
            Device::with_config(format!("spread{i}"), config)
                .open()
                .unwrap()
        })
        .collect();
    let cqs: Vec<Cq> = devices
        .iter()
        .map(|ctx| ctx.create_cq(16, None).unwrap())
        .collect();
    let moves = |devs: &[Context]| -> u64 {
        devs.iter()
            .map(|d| d.device_counters().poll_cpu_moves)
            .sum()
    };
    let (_, allowed) = this_thread();
    let one = first_cpu(&allowed);
    let pinned = std::sync::Barrier::new(3);
    let released = std::sync::Barrier::new(3);
    let counted = std::sync::Barrier::new(3);
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut at_release = 0;
    std::thread::scope(|s| {
        for cq in &cqs {
            let (pinned, released, counted) = (&pinned, &released, &counted);
            let (done, one, allowed) = (&done, &one, &allowed);
            s.spawn(move || {
                let (tid, _) = this_thread();
                allow_cpus(&tid, one);
                pinned.wait();
                let start = std::time::Instant::now();
                while start.elapsed() < phase {
                    assert_eq!(cq.poll(&mut []), 0);
                }
                released.wait();
                counted.wait();
                // Allowed everywhere again, still on the one CPU: nothing moves it but
                // the scheduler and the poller itself.
                allow_cpus(&tid, allowed);
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    assert_eq!(cq.poll(&mut []), 0);
                }
            });
        }
        pinned.wait();
        released.wait();
        at_release = moves(&devices);
        counted.wait();
        let start = std::time::Instant::now();
        while start.elapsed() < phase && !stop(&devices) {
            std::thread::sleep(Duration::from_millis(1));
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let end = moves(&devices);
    (at_release, end)
}

/// Two threads spinning on CQs on one CPU take turns at their yields: the one that sees
/// its involuntary context switches come fast sleeps briefly so that the kernel may wake
/// it on an idle CPU (`crate::spread`; on this 2-core host both ends of `perf send --lat`
/// were left sharing a CPU while the other idled: 14.6-17.4 µs one way, 6.6-8.3 µs
/// pinned apart). Pinned to one CPU it has nowhere to go and never tries.
#[test]
fn spinners_sharing_a_cpu_step_apart_and_pinned_ones_stay() {
    let (_, allowed) = this_thread();
    if first_cpu(&allowed) == allowed {
        eprintln!("SKIPPED spinners_sharing_a_cpu_step_apart: this process may use one CPU only");
        return;
    }
    let mut tries = Vec::new();
    for _ in 0..3 {
        let (pinned, end) = two_spinners(Duration::from_millis(300), |devs| {
            devs.iter().any(|d| d.device_counters().poll_cpu_moves > 0)
        });
        assert_eq!(pinned, 0, "a spinner pinned to one CPU tried to move");
        tries.push(end - pinned);
        if end > pinned {
            return;
        }
    }
    panic!("two spinners let on every CPU never moved off the one they shared: {tries:?}");
}

//! The same-host path between two real processes: this test binary runs itself as the
//! target process (`target_process`, doing nothing unless `SAMEHOST_TARGET` is set),
//! driven line by line over its stdin/stdout.

use softverbs::*;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::TestChild;

const WAIT: Duration = Duration::from_secs(20);
const LEN: usize = 65536;

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(31).wrapping_add(seed * 7 + 1) >> 1) as u8)
        .collect()
}

fn connect_with(qp: &Qp, addr: SocketAddr, qpn: u32, access: AccessFlags) {
    connect_rts(qp, addr, qpn, access, RtsAttr::default());
}

fn connect_rts(qp: &Qp, addr: SocketAddr, qpn: u32, access: AccessFlags, rts: RtsAttr) {
    qp.to_init(InitAttr { access }).unwrap();
    qp.to_rtr(RtrAttr {
        remote: RemoteQp {
            addr,
            qpn: Qpn::new(qpn),
            psn: 0,
        },
        mtu: Mtu::Mtu4096,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
    })
    .unwrap();
    qp.to_rts(rts).unwrap();
}

/// The target process: a QP, MR1 (all access, LEN bytes), MR2 (remote read only),
/// receive buffers; answers commands.
#[test]
fn target_process() {
    if std::env::var_os("SAMEHOST_TARGET").is_none() {
        return;
    }
    if std::env::var_os("SAMEHOST_UNDUMPABLE").is_some() {
        // The kernel then refuses other processes of ours process_vm_readv/writev.
        // SAFETY: prctl with integer arguments only.
        assert_eq!(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }, 0);
    }
    let ctx = Device::list().unwrap().remove(0).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    // SAMEHOST_UC: a UC QP.
    let qp_type = if std::env::var_os("SAMEHOST_UC").is_some() {
        QpType::Uc
    } else {
        QpType::Rc
    };
    let qp = QpBuilder::new(&pd, &cq).qp_type(qp_type).build().unwrap();
    let mr1 = pd.reg_mr(vec![0u8; LEN], all_access()).unwrap();
    let mr2 = pd
        .reg_mr(vec![0u8; 4096], AccessFlags::REMOTE_READ)
        .unwrap();
    let mr3 = pd
        .reg_mr(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
        .unwrap();
    println!(
        "@@ hello {} {} {} {} {} {}",
        ctx.local_addr(),
        qp.qpn().value(),
        mr1.addr(),
        mr1.rkey(),
        mr2.addr(),
        mr2.rkey()
    );
    let mut lines = std::io::stdin().lock().lines();
    let peer = lines.next().unwrap().unwrap();
    let mut it = peer.split_whitespace();
    let addr: SocketAddr = it.next().unwrap().parse().unwrap();
    let qpn: u32 = it.next().unwrap().parse().unwrap();
    // SAMEHOST_QP_READ_ONLY: the QP lets its peer READ, not WRITE.
    let access = if std::env::var_os("SAMEHOST_QP_READ_ONLY").is_some() {
        AccessFlags::REMOTE_READ
    } else {
        all_access()
    };
    connect_with(&qp, addr, qpn, access);
    for i in 0..16 {
        qp.post_recv(i, &[mr3.sge(0, 4096)]).unwrap();
    }
    println!("@@ connected");
    let mut mr1 = Some(mr1);
    let mut kept: Option<Vec<u8>> = None;
    for line in lines {
        let line = line.unwrap();
        match line.trim() {
            "recv" => {
                let wc = cq.wait_for(1, WAIT);
                let mut now = vec![0u8; LEN];
                mr1.as_ref().unwrap().read(0, &mut now);
                match wc.first() {
                    Some(w) => println!(
                        "@@ recv {:?} {:?} {} {} {}",
                        w.status,
                        w.opcode,
                        w.byte_len,
                        w.imm_data.unwrap_or(0),
                        checksum(&now)
                    ),
                    None => println!("@@ recv none"),
                }
            }
            "dereg" => {
                let buf = mr1.take().unwrap().into_inner();
                println!("@@ dereg {}", checksum(&buf));
                kept = Some(buf);
            }
            "check" => println!("@@ check {}", checksum(kept.as_ref().unwrap())),
            "error" => {
                qp.to_error().unwrap();
                println!("@@ error");
            }
            "sum" => {
                let mut now = vec![0u8; LEN];
                mr1.as_ref().unwrap().read(0, &mut now);
                println!("@@ sum {}", checksum(&now));
            }
            "quit" => break,
            other => panic!("unknown command {other:?}"),
        }
        std::io::stdout().flush().unwrap();
    }
}

struct Target {
    process: TestChild,
    addr: SocketAddr,
    qpn: u32,
    mr1: (u64, u32),
    mr2: (u64, u32),
}

impl Target {
    fn spawn(env: &[(&str, &str)]) -> Target {
        Target::spawn_via(&[], env)
    }

    /// Runs the target under `prefix` (a command that runs its arguments).
    fn spawn_via(prefix: &[&str], env: &[(&str, &str)]) -> Target {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.args([
            "target_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SAMEHOST_TARGET", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let process = TestChild::spawn(&mut cmd, WAIT);
        let hello = process.hear("target started");
        let f: Vec<&str> = hello.split_whitespace().collect();
        assert_eq!(f[0], "hello");
        Target {
            process,
            addr: f[1].parse().unwrap(),
            qpn: f[2].parse().unwrap(),
            mr1: (f[3].parse().unwrap(), f[4].parse().unwrap()),
            mr2: (f[5].parse().unwrap(), f[6].parse().unwrap()),
        }
    }

    fn say(&mut self, line: &str) {
        self.process.say(line);
    }

    fn hear(&self) -> String {
        self.process.hear("the target answers")
    }

    fn ask(&mut self, line: &str) -> Vec<String> {
        self.say(line);
        self.hear().split_whitespace().map(String::from).collect()
    }
}

struct Requester {
    ctx: Context,
    cq: Cq,
    qp: Qp,
    mr: Mr<Vec<u8>>,
    _pd: Pd,
}

fn requester(t: &mut Target, config: Config) -> Requester {
    requester_with(t, config, RtsAttr::default(), |_| {})
}

/// A requester with a UC QP (the target must have one too).
fn uc_requester(t: &mut Target) -> Requester {
    requester_of(t, QpType::Uc, Config::default(), RtsAttr::default(), |_| {})
}

/// A requester whose QP is connected with `rts`; `before_peer` runs before the target
/// connects its QP (so before the same-host path can be up).
fn requester_with(
    t: &mut Target,
    config: Config,
    rts: RtsAttr,
    before_peer: impl FnOnce(&Requester),
) -> Requester {
    requester_of(t, QpType::Rc, config, rts, before_peer)
}

fn requester_of(
    t: &mut Target,
    qp_type: QpType,
    config: Config,
    rts: RtsAttr,
    before_peer: impl FnOnce(&Requester),
) -> Requester {
    let ctx = Device::with_config("req", config).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq)
        .qp_type(qp_type)
        .cap(QpCap {
            max_send_wr: 128,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        })
        .build()
        .unwrap();
    let mr = pd.reg_mr(vec![0u8; 4 * LEN], all_access()).unwrap();
    connect_rts(&qp, t.addr, t.qpn, all_access(), rts);
    let r = Requester {
        ctx,
        cq,
        qp,
        mr,
        _pd: pd,
    };
    before_peer(&r);
    let line = format!("{} {}", r.ctx.local_addr(), r.qp.qpn().value());
    t.say(&line);
    assert_eq!(t.hear(), "connected");
    r
}

fn counter(ctx: &Context, name: &str) -> u64 {
    ctx.same_host_counters()
        .into_iter()
        .find(|(k, _)| k == name)
        .map_or(0, |(_, v)| v)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn write_wr(wr_id: u64, sges: &[Sge], (addr, rkey): (u64, u32), imm: Option<u32>) -> SendWr<'_> {
    let op = match imm {
        None => SendOp::RdmaWrite {
            remote_addr: addr,
            rkey: Rkey(rkey),
        },
        Some(imm) => SendOp::RdmaWriteWithImm {
            remote_addr: addr,
            rkey: Rkey(rkey),
            imm,
        },
    };
    SendWr::new(wr_id, op, sges)
}

fn one(cq: &Cq) -> WorkCompletion {
    let wc = cq.wait_for(1, WAIT);
    assert_eq!(wc.len(), 1, "a completion");
    wc[0]
}

/// WRITE then SEND, WRITE_WITH_IMM, READ: the bytes move by the same-host path, are
/// there when the target sees the SEND or the immediate, and come back by READ.
/// Returns the requester for the counters.
fn ordered_exchange(r: &Requester, t: &mut Target) {
    let data = pattern(LEN, 1);
    r.mr.write(0, &data);
    let sges = [r.mr.sge(0, LEN as u32)];
    r.qp.post_send(&write_wr(1, &sges, t.mr1, None)).unwrap();
    let small = [r.mr.sge(0, 8)];
    r.qp.post_send(&SendWr::new(2, SendOp::Send, &small))
        .unwrap();
    let got = t.ask("recv");
    assert_eq!(&got[1..4], ["Success", "Recv", "8"], "{got:?}");
    assert_eq!(
        got[5],
        checksum(&data).to_string(),
        "WRITE visible before the SEND"
    );
    for id in [1, 2] {
        let wc = one(&r.cq);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }

    let data = pattern(LEN, 2);
    r.mr.write(LEN, &data);
    let sges = [r.mr.sge(LEN, LEN as u32)];
    r.qp.post_send(&write_wr(3, &sges, t.mr1, Some(0x0102_0304)))
        .unwrap();
    let got = t.ask("recv");
    assert_eq!(
        &got[1..5],
        [
            "Success",
            "RecvRdmaWithImm",
            "65536",
            &0x0102_0304u32.to_string()
        ],
        "{got:?}"
    );
    assert_eq!(
        got[5],
        checksum(&data).to_string(),
        "data before its immediate"
    );
    assert_eq!(one(&r.cq).status, WcStatus::Success);

    let sges = [r.mr.sge(2 * LEN, LEN as u32)];
    let rd = SendWr::new(
        4,
        SendOp::RdmaRead {
            remote_addr: t.mr1.0,
            rkey: Rkey(t.mr1.1),
        },
        &sges,
    );
    r.qp.post_send(&rd).unwrap();
    let wc = one(&r.cq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, LEN as u32));
    let mut back = vec![0u8; LEN];
    r.mr.read(2 * LEN, &mut back);
    assert_eq!(back, data);
}

#[test]
fn write_send_write_imm_read_by_the_same_host_path() {
    let mut t = Target::spawn(&[]);
    let r = requester(&mut t, Config::default());
    wait_until("the same-host path", || r.qp.uses_same_host());
    ordered_exchange(&r, &mut t);
    // The bytes moved by system calls made without the device lock.
    assert_eq!(softverbs::syscalls_under_device_lock(), 0);
    assert_eq!(counter(&r.ctx, "same_host_qps"), 1);
    assert_eq!(counter(&r.ctx, "same_host_writes"), 2);
    assert_eq!(counter(&r.ctx, "same_host_bytes_written"), 2 * LEN as u64);
    assert_eq!(counter(&r.ctx, "same_host_bytes_read"), LEN as u64);
    let qp_line = format!("same_host_qp_{:#x}", r.qp.qpn().value());
    assert_eq!(counter(&r.ctx, &qp_line), 1);
    // `softverbs stat` sees them too (published by the device's counter writer).
    let pid = std::process::id();
    wait_until("published counters", || {
        softverbs::published::read_published().iter().any(|p| {
            p.pid == pid
                && p.counters
                    .iter()
                    .any(|(k, v)| k == "same_host_bytes_read" && *v == LEN as u64)
        })
    });
}

#[test]
fn refusals_complete_as_on_the_udp_path() {
    // (target region, offset, length): no remote write; past the end; unknown key;
    // the target QP does not enable remote writes (an invalid request there).
    for case in 0..4 {
        let env: &[(&str, &str)] = if case == 3 {
            &[("SAMEHOST_QP_READ_ONLY", "1")]
        } else {
            &[]
        };
        let mut t = Target::spawn(env);
        let r = requester(&mut t, Config::default());
        wait_until("the same-host path", || r.qp.uses_same_host());
        let (target, len) = match case {
            0 => (t.mr2, 64),
            1 => ((t.mr1.0 + LEN as u64 - 100, t.mr1.1), 200),
            2 => ((t.mr1.0, t.mr1.1 ^ 0x100), 64),
            _ => (t.mr1, 64),
        };
        let before = t.ask("sum");
        r.mr.write(0, &pattern(len as usize, 5));
        let sges = [r.mr.sge(0, len)];
        r.qp.post_send(&write_wr(9, &sges, target, None)).unwrap();
        let wc = one(&r.cq);
        let want = if case == 3 {
            WcStatus::RemInvReqErr
        } else {
            WcStatus::RemAccessErr
        };
        assert_eq!(wc.status, want, "case {case}");
        assert_eq!(t.ask("sum"), before, "case {case}: nothing written");
        assert_eq!(r.qp.query().qp_state, QpState::Err, "case {case}");
        assert_eq!(counter(&r.ctx, "same_host_refusals"), 1, "case {case}");
        assert_eq!(counter(&r.ctx, "same_host_writes"), 0, "case {case}");
    }
}

#[test]
fn no_write_lands_after_dereg_returns() {
    let mut t = Target::spawn(&[]);
    let r = Arc::new(requester(&mut t, Config::default()));
    wait_until("the same-host path", || r.qp.uses_same_host());
    let target = t.mr1;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (r, stop) = (Arc::clone(&r), Arc::clone(&stop));
        std::thread::spawn(move || -> (u64, WcStatus) {
            // WRITEs with changing bytes until one fails (the region went away) or
            // the bound.
            let mut posted = 0u64;
            let mut done = 0u64;
            let mut last = WcStatus::Success;
            while posted < 200_000 && !stop.load(Ordering::Relaxed) {
                while posted - done < 32 {
                    r.mr.write(0, &posted.to_le_bytes());
                    let sges = [r.mr.sge(0, 4096)];
                    if r.qp
                        .post_send(&write_wr(posted, &sges, target, None))
                        .is_err()
                    {
                        return (posted, last);
                    }
                    posted += 1;
                }
                let wc = r.cq.wait_for(1, WAIT);
                let Some(w) = wc.first() else {
                    return (posted, WcStatus::GeneralErr);
                };
                done += 1;
                last = w.status;
                if w.status != WcStatus::Success {
                    return (posted, last);
                }
            }
            (posted, last)
        })
    };
    wait_until("writes under way", || {
        counter(&r.ctx, "same_host_writes") > 200
    });
    let at_dereg = t.ask("dereg");
    assert_eq!(at_dereg[0], "dereg");
    let (posted, last) = writer.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    assert_eq!(
        last,
        WcStatus::RemAccessErr,
        "writes after the deregistration are refused ({posted} posted)"
    );
    let after = t.ask("check");
    assert_eq!(after[1], at_dereg[1], "nothing landed after dereg returned");
}

/// The handshake travels in plain datagrams: with the requester's first three lost
/// (its offer, its answer to the target's offer, its offer again), an offer is
/// resent (the target's, unanswered, or the requester's) and the QP still takes the
/// path.
#[test]
fn a_lost_handshake_is_resent() {
    let mut t = Target::spawn(&[]);
    let lossy = Config {
        drop_first_hellos: 3,
        ..Config::default()
    };
    let r = requester(&mut t, lossy);
    wait_until("the same-host path", || r.qp.uses_same_host());
    ordered_exchange(&r, &mut t);
    assert_eq!(counter(&r.ctx, "same_host_bytes_written"), 2 * LEN as u64);
}

/// A placed WRITE completes at the requester without a packet, but only while the
/// target's QP accepts it: once that QP is in ERR, a WRITE goes by UDP and fails as
/// there (the target drops it; the requester retries, then gives up), writing nothing.
#[test]
fn writes_complete_locally_only_while_the_target_qp_accepts_them() {
    let mut t = Target::spawn(&[]);
    let r = requester(&mut t, Config::default());
    wait_until("the same-host path", || r.qp.uses_same_host());
    let data = pattern(4096, 3);
    r.mr.write(0, &data);
    let sges = [r.mr.sge(0, 4096)];
    let before = r.ctx.counters().tx_packets;
    for id in 0..8 {
        r.qp.post_send(&write_wr(id, &sges, t.mr1, None)).unwrap();
        let wc = one(&r.cq);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    assert_eq!(r.ctx.counters().tx_packets, before, "no packet per WRITE");
    assert_eq!(counter(&r.ctx, "same_host_writes"), 8);

    assert_eq!(t.ask("error")[0], "error");
    let sum = t.ask("sum");
    r.mr.write(0, &pattern(4096, 4));
    r.qp.post_send(&write_wr(9, &sges, t.mr1, None)).unwrap();
    let wc = one(&r.cq);
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    assert_eq!(counter(&r.ctx, "same_host_writes"), 8, "not placed");
    assert_eq!(t.ask("sum"), sum, "nothing written");
}

/// READs posted before the path is up go by UDP; an application that keeps its send
/// queue full (as perftest does) must not keep the QP off the path for good: a later READ
/// is held until those complete, then placed.
#[test]
fn reads_sent_by_udp_before_the_path_do_not_keep_the_queue_off_it() {
    let mut t = Target::spawn(&[]);
    // The handshake ends only after a resend (20 ms): the first READs go by UDP.
    let late = Config {
        drop_first_hellos: 3,
        ..Config::default()
    };
    let r = requester(&mut t, late);
    // perftest's ib_read_bw: 64 KiB READs, 64 outstanding, one in 16 signaled, new ones
    // posted as soon as a signaled one completes: the queue never empties by itself.
    let sge = r.mr.sge(0, LEN as u32);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut wcs = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + WAIT;
    while counter(&r.ctx, "same_host_reads") == 0 && posted < 20_000 {
        assert!(Instant::now() < deadline, "timed out");
        while posted - done < 64 {
            let mut rd = SendWr::new(
                posted + 1,
                SendOp::RdmaRead {
                    remote_addr: t.mr1.0,
                    rkey: Rkey(t.mr1.1),
                },
                std::slice::from_ref(&sge),
            );
            rd.flags = if (posted + 1) % 16 == 0 {
                SendFlags::SIGNALED
            } else {
                SendFlags::EMPTY
            };
            r.qp.post_send(&rd).unwrap();
            posted += 1;
        }
        let n = r.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success);
            done = wc.wr_id;
        }
    }
    assert!(
        counter(&r.ctx, "same_host_reads") > 0,
        "{posted} READs posted, none by the same-host path"
    );
}

/// READs land straight in local registered memory, outside the device lock: once
/// `dereg_mr` of that memory returns, none lands there any more.
#[test]
fn no_read_lands_after_the_local_dereg_returns() {
    let mut t = Target::spawn(&[]);
    let r = Arc::new(requester(&mut t, Config::default()));
    wait_until("the same-host path", || r.qp.uses_same_host());
    // Something other than zeros to read.
    let data = pattern(LEN, 9);
    r.mr.write(0, &data);
    let sges = [r.mr.sge(0, LEN as u32)];
    r.qp.post_send(&write_wr(1, &sges, t.mr1, None)).unwrap();
    assert_eq!(one(&r.cq).status, WcStatus::Success);
    let sink = r._pd.reg_mr(vec![0u8; LEN], all_access()).unwrap();
    let sge = sink.sge(0, LEN as u32);
    let source = t.mr1;
    let reads = {
        let r = Arc::clone(&r);
        std::thread::spawn(move || -> (u64, WcStatus) {
            let (mut posted, mut done) = (0u64, 0u64);
            while posted < 200_000 {
                while posted - done < 16 {
                    let rd = SendWr::new(
                        posted,
                        SendOp::RdmaRead {
                            remote_addr: source.0,
                            rkey: Rkey(source.1),
                        },
                        std::slice::from_ref(&sge),
                    );
                    if r.qp.post_send(&rd).is_err() {
                        return (posted, WcStatus::GeneralErr);
                    }
                    posted += 1;
                }
                let wc = r.cq.wait_for(1, WAIT);
                let Some(w) = wc.first() else {
                    return (posted, WcStatus::GeneralErr);
                };
                done += 1;
                if w.status != WcStatus::Success {
                    return (posted, w.status);
                }
            }
            (posted, WcStatus::Success)
        })
    };
    wait_until("reads under way", || {
        counter(&r.ctx, "same_host_reads") > 200
    });
    let mut buf = sink.into_inner();
    buf.fill(0);
    let (posted, last) = reads.join().unwrap();
    assert_eq!(
        last,
        WcStatus::LocProtErr,
        "reads into the deregistered region fail ({posted} posted)"
    );
    assert!(
        buf.iter().all(|&b| b == 0),
        "nothing landed after dereg returned"
    );
    assert_eq!(softverbs::syscalls_under_device_lock(), 0);
}

#[test]
fn falls_back_to_udp_when_off_or_refused_by_the_kernel() {
    // The target turns the path off: no table, no offer either way.
    let mut t = Target::spawn(&[("SOFTVERBS_SAME_HOST", "0")]);
    let r = requester(&mut t, Config::default());
    ordered_exchange(&r, &mut t);
    assert!(!r.qp.uses_same_host());
    assert_eq!(counter(&r.ctx, "same_host_bytes_written"), 0);
    drop(t);

    // The kernel does not let us read the target: the probe fails. Without privileges,
    // a target that is not dumpable; as root (CAP_SYS_PTRACE reads anything of its own
    // namespace), a target in another PID namespace, as in another container.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut t = if !root {
        Target::spawn(&[("SAMEHOST_UNDUMPABLE", "1")])
    } else if Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        Target::spawn_via(&["unshare", "--pid", "--fork"], &[])
    } else {
        eprintln!("SKIPPED: root without `unshare --pid`: no way to make the probe fail");
        return;
    };
    let r = requester(&mut t, Config::default());
    wait_until("the failed probe", || {
        counter(&r.ctx, "same_host_probe_failures") > 0
    });
    ordered_exchange(&r, &mut t);
    assert!(!r.qp.uses_same_host());
    assert_eq!(counter(&r.ctx, "same_host_bytes_written"), 0);
    drop(t);

    // We turn it off.
    let mut t = Target::spawn(&[]);
    let off = Config {
        same_host: SameHostMode::Off,
        ..Config::default()
    };
    let r = requester(&mut t, off);
    ordered_exchange(&r, &mut t);
    assert!(!r.qp.uses_same_host());
}

/// Every datagram the requester sends is lost (the same-host handshake excepted).
fn all_lost() -> Option<FaultConfig> {
    Some(FaultConfig {
        loss: 1.0,
        ..FaultConfig::default()
    })
}

/// A requester whose WRITE 1 (4 KiB of pattern 11 to the target's MR1 at 0) went by
/// UDP before the same-host path was up, and cannot complete: every datagram of the
/// requester is lost until the test says otherwise. The path is up on return.
fn requester_with_a_write_stuck_on_udp(t: &mut Target) -> Requester {
    let config = Config {
        faults: all_lost(),
        ..Config::default()
    };
    // A local ACK timeout of 537 ms: its (retry_cnt + 1) expiries leave the test time
    // to do its part before the WRITE would fail.
    let rts = RtsAttr {
        timeout: 17,
        ..RtsAttr::default()
    };
    let target = t.mr1;
    let r = requester_with(t, config, rts, |r| {
        r.mr.write(0, &pattern(4096, 11));
        let sges = [r.mr.sge(0, 4096)];
        r.qp.post_send(&write_wr(1, &sges, target, None)).unwrap();
    });
    wait_until("the same-host path", || r.qp.uses_same_host());
    assert_eq!(
        counter(&r.ctx, "same_host_writes"),
        0,
        "WRITE 1 went by UDP"
    );
    r
}

/// Issue 16: a WRITE posted after the path is up, while a WRITE that went by UDP is
/// still in flight, is held in the send queue: the post returns at once (the UDP
/// WRITE cannot complete meanwhile), and once the UDP WRITE completes the held one is
/// placed by the thread that saw the completion; completions in post order.
#[test]
fn a_write_behind_a_udp_write_is_held_and_the_post_returns() {
    let mut t = Target::spawn(&[]);
    let r = requester_with_a_write_stuck_on_udp(&mut t);
    let before = t.ask("sum");
    r.mr.write(4096, &pattern(4096, 12));
    let sges = [r.mr.sge(4096, 4096)];
    let second = (t.mr1.0 + 8192, t.mr1.1);
    r.qp.post_send(&write_wr(2, &sges, second, None)).unwrap();
    // Returned with WRITE 1 still in flight (its datagrams are all lost): held.
    assert_eq!(counter(&r.ctx, "same_host_held"), 1);
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(r.cq.poll(&mut wc), 0, "nothing completed");
    assert_eq!(counter(&r.ctx, "same_host_writes"), 0, "not placed yet");
    assert_eq!(t.ask("sum"), before, "nothing written yet");
    // The network works again: WRITE 1 is retransmitted and acknowledged, then
    // WRITE 2 placed, with no further post.
    r.ctx.set_faults(None);
    let first = one(&r.cq);
    assert_eq!((first.wr_id, first.status), (1, WcStatus::Success));
    let second_wc = one(&r.cq);
    assert_eq!((second_wc.wr_id, second_wc.status), (2, WcStatus::Success));
    assert_eq!(counter(&r.ctx, "same_host_writes"), 1, "WRITE 2 placed");
    let mut want = vec![0u8; LEN];
    want[..4096].copy_from_slice(&pattern(4096, 11));
    want[8192..12288].copy_from_slice(&pattern(4096, 12));
    assert_eq!(t.ask("sum")[1], checksum(&want).to_string());
}

/// Held WRs flush when the QP enters ERR before they could be placed; a held WRITE
/// the target's table refuses goes by UDP and fails as there.
#[test]
fn held_writes_flush_on_error_and_refused_ones_fail_as_on_udp() {
    let mut t = Target::spawn(&[]);
    let r = requester_with_a_write_stuck_on_udp(&mut t);
    let before = t.ask("sum");
    let sges = [r.mr.sge(4096, 4096)];
    for id in [2, 3] {
        r.qp.post_send(&write_wr(id, &sges, t.mr1, None)).unwrap();
    }
    assert_eq!(counter(&r.ctx, "same_host_held"), 2);
    r.qp.to_error().unwrap();
    for id in [1, 2, 3] {
        let wc = one(&r.cq);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::WrFlushErr));
    }
    r.ctx.set_faults(None);
    assert_eq!(t.ask("sum"), before, "nothing written");
    assert_eq!(counter(&r.ctx, "same_host_writes"), 0);
    drop(r);
    drop(t);

    let mut t = Target::spawn(&[]);
    let r = requester_with_a_write_stuck_on_udp(&mut t);
    let sges = [r.mr.sge(4096, 64)];
    let bad = (t.mr1.0, t.mr1.1 ^ 0x100);
    r.qp.post_send(&write_wr(2, &sges, bad, None)).unwrap();
    assert_eq!(counter(&r.ctx, "same_host_held"), 1);
    r.ctx.set_faults(None);
    assert_eq!(one(&r.cq).status, WcStatus::Success);
    let wc = one(&r.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RemAccessErr));
    assert_eq!(counter(&r.ctx, "same_host_refusals"), 1);
    assert_eq!(counter(&r.ctx, "same_host_writes"), 0);
}

/// UC QPs take the path too: a WRITE is placed (no packet) and visible before a later
/// SEND is received; a WRITE with immediate's data is there before its completion at
/// the target.
#[test]
fn uc_writes_take_the_same_host_path() {
    let mut t = Target::spawn(&[("SAMEHOST_UC", "1")]);
    let r = uc_requester(&mut t);
    wait_until("the same-host path", || r.qp.uses_same_host());
    let data = pattern(LEN, 21);
    r.mr.write(0, &data);
    let sges = [r.mr.sge(0, LEN as u32)];
    let before = r.ctx.counters().tx_packets;
    r.qp.post_send(&write_wr(1, &sges, t.mr1, None)).unwrap();
    assert_eq!(one(&r.cq).status, WcStatus::Success);
    assert_eq!(r.ctx.counters().tx_packets, before, "no packet");
    let small = [r.mr.sge(0, 8)];
    r.qp.post_send(&SendWr::new(2, SendOp::Send, &small))
        .unwrap();
    let got = t.ask("recv");
    assert_eq!(&got[1..4], ["Success", "Recv", "8"], "{got:?}");
    assert_eq!(got[5], checksum(&data).to_string(), "WRITE before the SEND");
    assert_eq!(one(&r.cq).status, WcStatus::Success);

    let data = pattern(LEN, 22);
    r.mr.write(LEN, &data);
    let sges = [r.mr.sge(LEN, LEN as u32)];
    r.qp.post_send(&write_wr(3, &sges, t.mr1, Some(0x0a0b_0c0d)))
        .unwrap();
    let got = t.ask("recv");
    assert_eq!(
        &got[1..5],
        [
            "Success",
            "RecvRdmaWithImm",
            "65536",
            &0x0a0b_0c0du32.to_string()
        ],
        "{got:?}"
    );
    assert_eq!(
        got[5],
        checksum(&data).to_string(),
        "data before its immediate"
    );
    assert_eq!(one(&r.cq).status, WcStatus::Success);
    assert_eq!(counter(&r.ctx, "same_host_writes"), 2);
    assert_eq!(counter(&r.ctx, "same_host_bytes_written"), 2 * LEN as u64);
}

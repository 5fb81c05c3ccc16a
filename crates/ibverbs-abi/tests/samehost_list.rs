//! `ibv_post_send` with a list of RDMA WRITEs on a QP with the same-host path
//! (`softverbs::samehost`): the list is posted as one list, and a WR refused in the
//! middle stops it as rdma-core's providers do: the WRs before it are posted, `*bad_wr`
//! points at it, nothing after it is posted. The target is this test binary run again
//! (`target_process`, with the Rust API), driven over its stdin/stdout.

use core::ffi::c_int;
use core::ptr;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softverbs_ibverbs::abi::*;
use softverbs_ibverbs::ctx::{ibv_close_device, ibv_open_device, soft};
use softverbs_ibverbs::exports::{ibv_free_device_list, ibv_get_device_list};
use softverbs_ibverbs::verbs::*;

const WAIT: Duration = Duration::from_secs(20);
const CHUNK: usize = 4096;
const N: usize = 8;

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The target: an RC QP and N chunks of memory open to remote writes; "sums" prints
/// each chunk's checksum.
#[test]
fn target_process() {
    use softverbs::*;
    if std::env::var_os("SAMEHOST_LIST_TARGET").is_none() {
        return;
    }
    let ctx = Device::list().unwrap().remove(0).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq).build().unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.reg_mr(vec![0u8; N * CHUNK], access).unwrap();
    println!(
        "@@ {} {} {} {}",
        ctx.lid(),
        qp.qpn().value(),
        mr.addr(),
        mr.rkey()
    );
    let mut lines = std::io::stdin().lock().lines();
    let peer = lines.next().unwrap().unwrap();
    let mut it = peer.split_whitespace();
    let addr: std::net::SocketAddr = it.next().unwrap().parse().unwrap();
    let qpn: u32 = it.next().unwrap().parse().unwrap();
    qp.to_init(InitAttr { access }).unwrap();
    qp.to_rtr(RtrAttr {
        remote: RemoteQp {
            addr,
            qpn: Qpn::new(qpn),
            psn: 0,
        },
        mtu: Mtu::Mtu4096,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
    })
    .unwrap();
    qp.to_rts(RtsAttr::default()).unwrap();
    println!("@@ connected");
    for line in lines {
        match line.unwrap().trim() {
            "sums" => {
                let mut now = vec![0u8; N * CHUNK];
                mr.read(0, &mut now);
                let sums: Vec<String> =
                    now.chunks(CHUNK).map(|c| checksum(c).to_string()).collect();
                println!("@@ {}", sums.join(" "));
            }
            _ => break,
        }
        std::io::stdout().flush().unwrap();
    }
}

/// Polls one completion of `cq` (WAIT at most).
///
/// # Safety
/// `ctx` and `cq` live.
unsafe fn poll_one(ctx: *mut ibv_context, cq: *mut ibv_cq) -> Option<ibv_wc> {
    // SAFETY: the op polls a live CQ.
    let poll = unsafe { (*ctx).ops.poll_cq.expect("poll_cq op") };
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        let mut wc = ibv_wc::zeroed();
        // SAFETY: one writable wc.
        if unsafe { poll(cq, 1, &mut wc) } == 1 {
            return Some(wc);
        }
    }
    None
}

#[test]
fn a_list_of_writes_with_a_bad_wr_in_the_middle() {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "target_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SAMEHOST_LIST_TARGET", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(at) = line.find("@@ ") {
                if tx.send(line[at + 3..].to_string()).is_err() {
                    break;
                }
            }
        }
    });
    let hear = || -> Vec<String> {
        let l = rx.recv_timeout(WAIT).expect("the target answers");
        l.split_whitespace().map(String::from).collect()
    };
    let hello = hear();
    let lid: u16 = hello[0].parse().unwrap();
    let tqpn: u32 = hello[1].parse().unwrap();
    let (taddr, trkey): (u64, u32) = (hello[2].parse().unwrap(), hello[3].parse().unwrap());

    // SAFETY: the test drives the C API with valid, live objects in order.
    unsafe {
        let list = ibv_get_device_list(ptr::null_mut());
        let ctx = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!ctx.is_null());
        let s = soft(ctx).expect("context");
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 64, ptr::null_mut(), ptr::null_mut(), 0);
        let mut buf: Vec<u8> = (0..N * CHUNK).map(|i| (i * 7 + i / CHUNK) as u8).collect();
        let base = buf.as_mut_ptr();
        let mr = ibv_reg_mr(pd, base.cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
        assert!(!pd.is_null() && !cq.is_null() && !mr.is_null());
        let mut init = ibv_qp_init_attr::zeroed();
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = 32;
        init.cap.max_recv_wr = 4;
        init.cap.max_send_sge = 2;
        init.cap.max_recv_sge = 1;
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null());
        let mut at = ibv_qp_attr::zeroed();
        at.qp_state = IBV_QPS_INIT;
        at.port_num = 1;
        let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
        let mut at = ibv_qp_attr::zeroed();
        at.qp_state = IBV_QPS_RTR;
        at.path_mtu = IBV_MTU_4096;
        at.dest_qp_num = tqpn;
        at.max_dest_rd_atomic = 1;
        at.min_rnr_timer = 1;
        at.ah_attr.dlid = lid;
        at.ah_attr.port_num = 1;
        let m = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
        let mut at = ibv_qp_attr::zeroed();
        at.qp_state = IBV_QPS_RTS;
        at.timeout = 14;
        at.retry_cnt = 7;
        at.rnr_retry = 7;
        at.max_rd_atomic = 1;
        let m = IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC;
        assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
        writeln!(stdin, "{} {}", s.ctx.local_addr(), (*qp).qp_num).unwrap();
        stdin.flush().unwrap();
        assert_eq!(hear(), ["connected"]);
        let counter = |name: &str| {
            s.ctx
                .same_host_counters()
                .into_iter()
                .find(|(k, _)| k == name)
                .map_or(0, |(_, v)| v)
        };
        let end = Instant::now() + WAIT;
        while counter("same_host_qps") == 0 {
            assert!(Instant::now() < end, "the same-host path");
            std::thread::sleep(Duration::from_millis(2));
        }

        // N WRITEs, chunk i to chunk i, each from two SGEs; WR 4 has one SGE too many.
        let mut sges: Vec<[ibv_sge; 3]> = (0..N)
            .map(|i| {
                let at = base as u64 + (i * CHUNK) as u64;
                let half = (CHUNK / 2) as u32;
                let sge = |off: u64| ibv_sge {
                    addr: at + off,
                    length: half,
                    lkey: (*mr).lkey,
                };
                [sge(0), sge(u64::from(half)), sge(0)]
            })
            .collect();
        let mut wrs: Vec<ibv_send_wr> = (0..N).map(|_| ibv_send_wr::zeroed()).collect();
        for (i, w) in wrs.iter_mut().enumerate() {
            w.wr_id = i as u64;
            w.sg_list = sges[i].as_mut_ptr();
            w.num_sge = if i == 4 { 3 } else { 2 };
            w.opcode = IBV_WR_RDMA_WRITE;
            w.send_flags = IBV_SEND_SIGNALED;
            w.wr.rdma = ibv_send_wr_rdma {
                remote_addr: taddr + (i * CHUNK) as u64,
                rkey: trkey,
            };
        }
        for i in 0..N - 1 {
            let next: *mut ibv_send_wr = &mut wrs[i + 1];
            wrs[i].next = next;
        }
        let post_send = (*ctx).ops.post_send.expect("op");
        let tx_before = s.ctx.device_counters().tx_datagrams;
        let posts_before = counter("same_host_posts");
        let mut bad = ptr::null_mut();
        assert_eq!(post_send(qp, &mut wrs[0], &mut bad), libc::EINVAL);
        assert_eq!(
            bad, &mut wrs[4] as *mut ibv_send_wr,
            "bad_wr: the refused WR"
        );
        // The four WRs before it went as one list (one placement and device lock).
        assert_eq!(counter("same_host_posts") - posts_before, 1);
        assert_eq!(counter("same_host_writes"), 4);
        for id in 0..4 {
            let wc = poll_one(ctx, cq).expect("a completion");
            assert_eq!((wc.wr_id, wc.status), (id, IBV_WC_SUCCESS));
        }
        // Nothing after the refused WR was posted: the next completion is this one's.
        wrs[3].next = ptr::null_mut();
        assert_eq!(post_send(qp, &mut wrs[3], &mut bad), 0);
        let wc = poll_one(ctx, cq).expect("a completion");
        assert_eq!((wc.wr_id, wc.status), (3, IBV_WC_SUCCESS));
        // Placed, all of them: not a datagram.
        assert_eq!(counter("same_host_writes"), 5);
        assert_eq!(s.ctx.device_counters().tx_datagrams, tx_before);
        writeln!(stdin, "sums").unwrap();
        stdin.flush().unwrap();
        let sums = hear();
        for (i, sum) in sums.iter().enumerate() {
            let want = if i < 4 {
                checksum(&buf[i * CHUNK..(i + 1) * CHUNK])
            } else {
                checksum(&[0u8; CHUNK])
            };
            assert_eq!(sum, &want.to_string(), "chunk {i}");
        }

        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
    drop(stdin);
    let _ = child.wait();
}

//! `ibv_post_send` with a list of 32 work requests, through the `post_send` op the header
//! inline calls: one device lock, one pump of the engine and one `sendmmsg` for the whole
//! list (the device's counters), and no heap allocation on the posting thread (a counting
//! allocator). Inline data is gathered straight into the send queue.

use core::ffi::c_int;
use core::ptr;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use softverbs_ibverbs::abi::*;
use softverbs_ibverbs::ah::{ibv_create_ah, ibv_destroy_ah};
use softverbs_ibverbs::ctx::{ibv_close_device, ibv_open_device, soft};
use softverbs_ibverbs::exports::{ibv_free_device_list, ibv_get_device_list};
use softverbs_ibverbs::verbs::*;

/// Counts the allocations each thread makes.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a thread-local Cell with a const
// initialiser, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, layout) }
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, layout, size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const QKEY: u32 = 0x0abc_def0;
const N: usize = 32;

/// Polls `n` completions of `cq` (10 s at most).
///
/// # Safety
/// `ctx` and `cq` live.
unsafe fn poll_n(ctx: *mut ibv_context, cq: *mut ibv_cq, n: usize) -> Vec<ibv_wc> {
    // SAFETY: the op polls a live CQ.
    let poll = unsafe { (*ctx).ops.poll_cq.expect("poll_cq op") };
    let end = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < end {
        let mut wc = ibv_wc::zeroed();
        // SAFETY: one writable wc.
        if unsafe { poll(cq, 1, &mut wc) } == 1 {
            out.push(wc);
        }
    }
    out
}

#[test]
fn a_list_of_32_wrs_is_one_lock_one_batch_no_allocation() {
    // SAFETY: the test drives the C API with valid, live objects in order.
    unsafe {
        let list = ibv_get_device_list(ptr::null_mut());
        let ctx = ibv_open_device(*list);
        ibv_free_device_list(list);
        assert!(!ctx.is_null());
        let s = soft(ctx).expect("context");
        let pd = ibv_alloc_pd(ctx);
        let cq = ibv_create_cq(ctx, 256, ptr::null_mut(), ptr::null_mut(), 0);
        let mut buf = vec![0u8; 64 * 1024];
        let base = buf.as_mut_ptr();
        let mr = ibv_reg_mr(pd, base.cast(), buf.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
        assert!(!pd.is_null() && !cq.is_null() && !mr.is_null());
        let mut init = ibv_qp_init_attr::zeroed();
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = IBV_QPT_UD;
        init.cap.max_send_wr = 64;
        init.cap.max_recv_wr = 128;
        init.cap.max_send_sge = 2;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = 64;
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null());
        let mut at = ibv_qp_attr::zeroed();
        at.qp_state = IBV_QPS_INIT;
        at.port_num = 1;
        at.qkey = QKEY;
        let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        assert_eq!(ibv_modify_qp(qp, &mut at, m), 0);
        at.qp_state = IBV_QPS_RTR;
        assert_eq!(ibv_modify_qp(qp, &mut at, IBV_QP_STATE), 0);
        at.qp_state = IBV_QPS_RTS;
        assert_eq!(ibv_modify_qp(qp, &mut at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
        let mut gid = ibv_gid { raw: [0; 16] };
        assert_eq!(
            softverbs_ibverbs::ctx::ibv_query_gid(ctx, 1, 0, &mut gid),
            0
        );
        let mut aa = ibv_ah_attr::zeroed();
        aa.is_global = 1;
        aa.grh.dgid = gid;
        aa.port_num = 1;
        let ah = ibv_create_ah(pd, &mut aa);
        assert!(!ah.is_null());

        let ops = (*ctx).ops;
        let (post_send, post_recv) = (ops.post_send.expect("op"), ops.post_recv.expect("op"));
        // Receives for two rounds of N datagrams (each lands after its 40-byte GRH area).
        let mut rsges: Vec<ibv_sge> = (0..2 * N)
            .map(|i| ibv_sge {
                addr: base as u64 + (i as u64) * 256,
                length: 256,
                lkey: (*mr).lkey,
            })
            .collect();
        let mut rwrs: Vec<ibv_recv_wr> = (0..2 * N).map(|_| ibv_recv_wr::zeroed()).collect();
        for (i, w) in rwrs.iter_mut().enumerate() {
            w.wr_id = 1000 + i as u64;
            w.sg_list = &mut rsges[i];
            w.num_sge = 1;
        }
        for i in 0..2 * N - 1 {
            let next: *mut ibv_recv_wr = &mut rwrs[i + 1];
            rwrs[i].next = next;
        }
        let mut rbad = ptr::null_mut();
        assert_eq!(post_recv(qp, &mut rwrs[0], &mut rbad), 0);

        // N datagrams, each from two SGEs (8 + 8 bytes); every fourth inline.
        let payload = 32 * 1024;
        for i in 0..N {
            for j in 0..16 {
                buf[payload + i * 16 + j] = (i * 16 + j) as u8;
            }
        }
        let mut ssges: Vec<[ibv_sge; 2]> = (0..N)
            .map(|i| {
                let at = base as u64 + (payload + i * 16) as u64;
                [
                    ibv_sge {
                        addr: at,
                        length: 8,
                        lkey: (*mr).lkey,
                    },
                    ibv_sge {
                        addr: at + 8,
                        length: 8,
                        lkey: (*mr).lkey,
                    },
                ]
            })
            .collect();
        let mut swrs: Vec<ibv_send_wr> = (0..N).map(|_| ibv_send_wr::zeroed()).collect();
        for (i, w) in swrs.iter_mut().enumerate() {
            w.wr_id = i as u64;
            w.sg_list = ssges[i].as_mut_ptr();
            w.num_sge = 2;
            w.opcode = IBV_WR_SEND;
            w.send_flags = IBV_SEND_SIGNALED | if i % 4 == 0 { IBV_SEND_INLINE } else { 0 };
            w.wr.ud = ibv_send_wr_ud {
                ah,
                remote_qpn: (*qp).qp_num,
                remote_qkey: QKEY,
            };
        }
        for i in 0..N - 1 {
            let next: *mut ibv_send_wr = &mut swrs[i + 1];
            swrs[i].next = next;
        }

        for round in 0..2 {
            let before = s.ctx.device_counters();
            let allocs = allocations();
            let mut bad = ptr::null_mut();
            assert_eq!(post_send(qp, &mut swrs[0], &mut bad), 0);
            let allocated = allocations() - allocs;
            let after = s.ctx.device_counters();
            // UD produces nothing else on this device: the whole list went out in one
            // sendmmsg, by this thread or the progress thread.
            assert_eq!(
                after.tx_datagrams - before.tx_datagrams,
                N as u64,
                "round {round}"
            );
            assert_eq!(
                after.tx_syscalls - before.tx_syscalls,
                1,
                "round {round}: {before:?} -> {after:?}"
            );
            eprintln!("round {round}: {allocated} allocation(s), {before:?} -> {after:?}");
            // The first round may grow the driver's buffers; after that, nothing.
            if round == 1 {
                assert_eq!(allocated, 0, "heap allocations while posting {N} WRs");
            }
            let wcs = poll_n(ctx, cq, 2 * N);
            assert_eq!(wcs.len(), 2 * N, "round {round}");
            for wc in wcs.iter().filter(|w| w.opcode == IBV_WC_RECV) {
                assert_eq!((wc.status, wc.byte_len), (IBV_WC_SUCCESS, 40 + 16));
                let i = (wc.wr_id - 1000) as usize;
                let at = i * 256 + 40;
                let sent = &buf[at..at + 16];
                let k = sent[0] as usize / 16;
                let want: Vec<u8> = (0..16).map(|j| (k * 16 + j) as u8).collect();
                assert_eq!(sent, &want[..], "datagram {k} (inline: {})", k % 4 == 0);
            }
        }

        assert_eq!(ibv_destroy_ah(ah), 0);
        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_close_device(ctx), 0);
    }
    // Every send, receive and event fd write happened without the device lock held.
    assert_eq!(softverbs::syscalls_under_device_lock(), 0);
}

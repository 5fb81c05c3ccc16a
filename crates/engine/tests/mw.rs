//! Memory windows (IBA 10.6.7): type 1 windows bound with `bind_mw`, type 2
//! windows bound with a BIND_MW work request and invalidated with LOCAL_INV or a
//! peer's SEND with Invalidate; peers' RDMA through window rkeys succeeds inside
//! the window only, with the window's rights; bind errors complete with
//! MW_BIND_ERR.

mod common;
use common::*;
use softverbs_engine::*;

/// Where B's window-backing region starts in B's buffer, and its length.
const REG_OFF: usize = 16_384;
const REG_LEN: usize = 4096;
/// The window: this part of that region.
const WIN_OFF: usize = REG_OFF + 1024;
const WIN_LEN: usize = 1024;
/// Where A takes data from and puts READ results.
const SRC: usize = 0;
const READ_DST: usize = 8192;

fn wr_rights() -> AccessFlags {
    AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// Registers `REG_LEN` bytes of B's buffer at `REG_OFF` in `pd` with `access`.
fn reg_b(p: &mut Pair, pd: PdHandle, access: AccessFlags) -> MrInfo {
    let ptr = p.b.buf[REG_OFF..].as_mut_ptr();
    // SAFETY: inside B's boxed buffer, which outlives the engine (Pair drops the
    // simulator first).
    unsafe { p.engine(End::B).reg_mr(pd, ptr, REG_LEN, access) }.unwrap()
}

/// The region windows are bound to: B may write it locally and bind windows,
/// but it grants peers nothing itself.
fn window_region(p: &mut Pair) -> MrInfo {
    let pd = p.b.pd;
    reg_b(p, pd, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
}

fn bind_info(mr: &MrInfo, offset: usize, len: usize, access: AccessFlags) -> MwBindInfo {
    MwBindInfo {
        mr: mr.handle,
        addr: mr.addr + (offset - REG_OFF) as u64,
        length: len as u64,
        access,
    }
}

/// The same window key with the next key byte (as `ibv_inc_rkey`).
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Runs until B's send queue reports one completion and returns it.
fn b_send_wc(p: &mut Pair) -> WorkCompletion {
    p.run_until_send_cqes(End::B, 1).unwrap();
    let wcs = p.poll_send(End::B);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0]
}

/// Binds a type 1 window with `bind_mw` on B's QP; returns the new rkey after
/// checking the bind completed.
fn bind1(p: &mut Pair, mw: MwHandle, info: MwBindInfo) -> Rkey {
    let qp = p.b.qp;
    let rkey = p
        .engine(End::B)
        .bind_mw(qp, mw, 77, SendFlags::SIGNALED, info)
        .unwrap();
    let wc = b_send_wc(p);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (77, WcStatus::Success, WcOpcode::BindMw)
    );
    rkey
}

/// A Type 1 window on B, bound over the whole window range for remote READ and WRITE, in
/// the region `mr`: the window and its R_Key.
fn bound_type1(p: &mut Pair, mr: &MrInfo) -> (MwInfo, Rkey) {
    let pd = p.b.pd;
    let mw = p.engine(End::B).alloc_mw(pd, MwType::Type1).unwrap();
    let rkey = bind1(p, mw.handle, bind_info(mr, WIN_OFF, WIN_LEN, wr_rights()));
    (mw, rkey)
}

/// Binds a type 2 window with a BIND_MW work request on B's QP; returns the
/// new rkey.
fn bind2(p: &mut Pair, mw: &MwInfo, info: MwBindInfo) -> Rkey {
    let rkey = Rkey(inc_rkey(mw.rkey));
    let op = SendOp::BindMw {
        mw: mw.handle,
        rkey,
        info,
    };
    p.post_send(End::B, &SendWr::new(78, op, &[])).unwrap();
    let wc = b_send_wc(p);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (78, WcStatus::Success, WcOpcode::BindMw)
    );
    rkey
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
    FetchAdd,
}

/// A does `op` on `len` bytes at B's buffer offset `offset` through `rkey`;
/// returns the completion status. After an error both QPs are reconnected.
fn access(p: &mut Pair, op: Op, offset: usize, len: u32, rkey: Rkey) -> WcStatus {
    let remote_addr = p.addr(End::B, offset);
    let (op, sge) = match op {
        Op::Write => (
            SendOp::RdmaWrite { remote_addr, rkey },
            p.sge(End::A, SRC, len),
        ),
        Op::Read => (
            SendOp::RdmaRead { remote_addr, rkey },
            p.sge(End::A, READ_DST, len),
        ),
        Op::FetchAdd => (
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            p.sge(End::A, READ_DST, 8),
        ),
    };
    p.post_send(End::A, &SendWr::new(5, op, &[sge])).unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    let wcs = p.poll_send(End::A);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(wcs[0].wr_id, 5);
    if wcs[0].status != WcStatus::Success {
        reconnect(p);
    }
    wcs[0].status
}

/// After an error: lets the network go quiet, drops every completion, and takes
/// both QPs back through RESET to RTS. Windows and regions are untouched.
fn reconnect(p: &mut Pair) {
    p.settle();
    for end in [End::A, End::B] {
        p.poll_send(end);
        p.poll_recv(end);
        let qp = p.side(end).qp;
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        p.engine(end)
            .modify_qp(qp, &reset, QpAttrMask::STATE, Instant::ZERO)
            .unwrap();
    }
    let opts = p.opts.clone();
    let (addr_a, addr_b) = (ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap());
    let (qp_a, qpn_a, qp_b, qpn_b) = (p.a.qp, p.a.qpn, p.b.qp, p.b.qpn);
    connect(p.engine(End::A), qp_a, addr_b, qpn_b, 0x100, 0x200, &opts);
    connect(p.engine(End::B), qp_b, addr_a, qpn_a, 0x200, 0x100, &opts);
}

#[test]
fn type1_window_grants_its_range_and_rights_only() {
    let mut p = Pair::lossless();
    let mr = window_region(&mut p);
    let pd = p.b.pd;
    let mw = p.engine(End::B).alloc_mw(pd, MwType::Type1).unwrap();
    assert_ne!(mw.rkey, mr.rkey);

    // Unbound: nothing goes through it; the region grants peers nothing itself.
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, Rkey(mw.rkey)),
        WcStatus::RemAccessErr
    );
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, Rkey(mr.rkey)),
        WcStatus::RemAccessErr
    );

    let rkey = bind1(
        &mut p,
        mw.handle,
        bind_info(&mr, WIN_OFF, WIN_LEN, wr_rights()),
    );
    assert_ne!(rkey.0, mw.rkey, "a bind gives the window a new rkey");

    // WRITE at the window's start, READ at its end: both succeed.
    p.fill(End::A, SRC, 64, 3);
    p.b.buf[REG_OFF..REG_OFF + REG_LEN].fill(0);
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::Success
    );
    assert_eq!(p.bytes(End::B, WIN_OFF, 64), p.bytes(End::A, SRC, 64));
    p.fill(End::B, WIN_OFF + WIN_LEN - 64, 64, 9);
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF + WIN_LEN - 64, 64, rkey),
        WcStatus::Success
    );
    assert_eq!(
        p.bytes(End::A, READ_DST, 64),
        p.bytes(End::B, WIN_OFF + WIN_LEN - 64, 64)
    );
    // The whole window at once.
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, WIN_LEN as u32, rkey),
        WcStatus::Success
    );

    // Outside the window, though inside the region: refused, nothing written.
    p.b.buf[REG_OFF..REG_OFF + REG_LEN].fill(0xe7);
    for (offset, len) in [
        (WIN_OFF - 64, 64),           // just before
        (WIN_OFF - 1, 64),            // straddling the start
        (WIN_OFF + WIN_LEN - 32, 64), // straddling the end
        (WIN_OFF + WIN_LEN, 1),       // just after
        (REG_OFF, 8),                 // the region's first bytes
    ] {
        for op in [Op::Write, Op::Read] {
            assert_eq!(
                access(&mut p, op, offset, len, rkey),
                WcStatus::RemAccessErr,
                "{op:?} at {offset} len {len}"
            );
        }
    }
    assert!(p.bytes(End::B, REG_OFF, REG_LEN).iter().all(|&b| b == 0xe7));

    // The window does not grant atomics.
    assert_eq!(
        access(&mut p, Op::FetchAdd, WIN_OFF, 8, rkey),
        WcStatus::RemAccessErr
    );
    // Still works after all those errors.
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF, 8, rkey),
        WcStatus::Success
    );
}

#[test]
fn window_rkey_is_not_an_lkey() {
    let mut p = Pair::lossless();
    let mr = window_region(&mut p);
    let (_, rkey) = bound_type1(&mut p, &mr);
    let sge = Sge {
        addr: p.addr(End::B, WIN_OFF),
        length: 16,
        lkey: rkey.0,
    };
    p.post_recv(End::A, 1, &[p.sge(End::A, SRC, 64)]).unwrap();
    p.post_send(End::B, &SendWr::new(9, SendOp::Send, &[sge]))
        .unwrap();
    // (A local error sends nothing, so run until quiet rather than until the
    // completion.)
    p.settle();
    let wcs = p.poll_send(End::B);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::LocProtErr));
}

#[test]
fn type1_rebind_changes_the_rkey_and_the_old_one_dies() {
    let mut p = Pair::lossless();
    let mr = window_region(&mut p);
    let (mw, k1) = bound_type1(&mut p, &mr);
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, k1),
        WcStatus::Success
    );
    // Rebind (while bound) to another range.
    let k2 = bind1(&mut p, mw.handle, bind_info(&mr, REG_OFF, 256, wr_rights()));
    assert_ne!(k1, k2);
    assert_eq!(k1.0 & !0xff, k2.0 & !0xff, "same window, new key byte");
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, k1),
        WcStatus::RemAccessErr
    );
    assert_eq!(
        access(&mut p, Op::Write, REG_OFF, 64, k1),
        WcStatus::RemAccessErr
    );
    assert_eq!(
        access(&mut p, Op::Write, REG_OFF, 64, k2),
        WcStatus::Success
    );
    // The new range only.
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, k2),
        WcStatus::RemAccessErr
    );
    // Binding with length 0 unbinds.
    let k3 = bind1(&mut p, mw.handle, bind_info(&mr, REG_OFF, 0, wr_rights()));
    assert_ne!(k3, k2);
    assert_eq!(
        access(&mut p, Op::Write, REG_OFF, 64, k2),
        WcStatus::RemAccessErr
    );
    assert_eq!(
        access(&mut p, Op::Write, REG_OFF, 64, k3),
        WcStatus::RemAccessErr
    );
}

#[test]
fn bind_mw_completes_in_order_with_other_work() {
    let mut p = Pair::lossless();
    let mr = window_region(&mut p);
    let pd = p.b.pd;
    let mw = p.engine(End::B).alloc_mw(pd, MwType::Type1).unwrap();
    // B: WRITE, bind, WRITE; completions in posting order.
    let rkey_a = p.rkey(End::A);
    let dst = p.addr(End::A, 4096);
    let sge = [p.sge(End::B, 0, 2048)];
    let w1 = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst,
            rkey: rkey_a,
        },
        &sge,
    );
    p.post_send(End::B, &w1).unwrap();
    let qp = p.b.qp;
    let info = bind_info(&mr, WIN_OFF, WIN_LEN, wr_rights());
    let rkey = p
        .engine(End::B)
        .bind_mw(qp, mw.handle, 2, SendFlags::SIGNALED, info)
        .unwrap();
    p.post_send(End::B, &w1).unwrap();
    p.run_until_send_cqes(End::B, 3).unwrap();
    let wcs = p.poll_send(End::B);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::BindMw),
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
        ]
    );
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::Success
    );
}

#[test]
fn type2_bind_by_work_request_and_local_invalidate() {
    let mut p = Pair::lossless();
    let mr = window_region(&mut p);
    let pd = p.b.pd;
    let mw = p.engine(End::B).alloc_mw(pd, MwType::Type2).unwrap();
    let qp = p.b.qp;
    let info = bind_info(&mr, WIN_OFF, WIN_LEN, wr_rights());
    // Type 2 windows are not bound with bind_mw, type 1 not with post_send.
    assert_eq!(
        p.engine(End::B)
            .bind_mw(qp, mw.handle, 1, SendFlags::SIGNALED, info),
        Err(BindMwError::WrongType)
    );
    let mw1 = p.engine(End::B).alloc_mw(pd, MwType::Type1).unwrap();
    let op = SendOp::BindMw {
        mw: mw1.handle,
        rkey: Rkey(inc_rkey(mw1.rkey)),
        info,
    };
    assert_eq!(
        p.post_send(End::B, &SendWr::new(1, op, &[])),
        Err(PostError::InvalidOpcode)
    );

    let rkey = bind2(&mut p, &mw, info);
    assert_eq!(rkey.0, inc_rkey(mw.rkey), "the key the consumer chose");
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::Success
    );
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF + WIN_LEN, 64, rkey),
        WcStatus::RemAccessErr
    );
    // The key before the bind does not work.
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, Rkey(mw.rkey)),
        WcStatus::RemAccessErr
    );

    p.post_send(End::B, &SendWr::new(79, SendOp::LocalInv { rkey }, &[]))
        .unwrap();
    let wc = b_send_wc(&mut p);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (79, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::RemAccessErr
    );

    // Invalidated, it can be bound again (with yet another key).
    let mw_now = MwInfo { rkey: rkey.0, ..mw };
    let rkey2 = bind2(&mut p, &mw_now, info);
    assert_ne!(rkey2, rkey);
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF, 64, rkey2),
        WcStatus::Success
    );
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF, 64, rkey),
        WcStatus::RemAccessErr
    );
}

#[test]
fn local_invalidate_errors() {
    for which in ["type 1 window", "unbound type 2 window", "ordinary region"] {
        let mut p = Pair::lossless();
        let mr = window_region(&mut p);
        let pd = p.b.pd;
        let rkey = match which {
            "type 1 window" => {
                let mw = p.engine(End::B).alloc_mw(pd, MwType::Type1).unwrap();
                bind1(
                    &mut p,
                    mw.handle,
                    bind_info(&mr, WIN_OFF, WIN_LEN, wr_rights()),
                )
            }
            "unbound type 2 window" => {
                Rkey(p.engine(End::B).alloc_mw(pd, MwType::Type2).unwrap().rkey)
            }
            _ => p.rkey(End::B),
        };
        p.post_send(End::B, &SendWr::new(79, SendOp::LocalInv { rkey }, &[]))
            .unwrap();
        let wc = b_send_wc(&mut p);
        assert_eq!((wc.wr_id, wc.status), (79, WcStatus::LocQpOpErr), "{which}");
    }
}

#[test]
fn send_with_invalidate_from_the_peer_invalidates_a_type2_window() {
    let mut p = Pair::lossless();
    let mr = window_region(&mut p);
    let pd = p.b.pd;
    let mw = p.engine(End::B).alloc_mw(pd, MwType::Type2).unwrap();
    let rkey = bind2(&mut p, &mw, bind_info(&mr, WIN_OFF, WIN_LEN, wr_rights()));
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::Success
    );

    let r = p.sge(End::B, 30_000, 4096);
    p.post_recv(End::B, 100, &[r]).unwrap();
    let sge = p.sge(End::A, SRC, 64);
    p.post_send(
        End::A,
        &SendWr::new(2, SendOp::SendWithInv { rkey }, &[sge]),
    )
    .unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    p.run_until_cqes(End::B, 0, 1).unwrap();
    let s = p.poll_send(End::A);
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::Success));
    let rc = p.poll_recv(End::B);
    assert_eq!((rc[0].wr_id, rc[0].status), (100, WcStatus::Success));
    assert_eq!(rc[0].invalidated_rkey, Some(rkey));
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::RemAccessErr
    );
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF, 64, rkey),
        WcStatus::RemAccessErr
    );
}

#[test]
fn send_with_invalidate_of_a_type1_window_is_an_invalid_request() {
    let mut p = Pair::lossless();
    let mr = window_region(&mut p);
    let (_, rkey) = bound_type1(&mut p, &mr);
    let r = p.sge(End::B, 30_000, 4096);
    p.post_recv(End::B, 100, &[r]).unwrap();
    let sge = p.sge(End::A, SRC, 64);
    p.post_send(
        End::A,
        &SendWr::new(2, SendOp::SendWithInv { rkey }, &[sge]),
    )
    .unwrap();
    p.run_until_send_cqes(End::A, 1).unwrap();
    let s = p.poll_send(End::A);
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::RemInvReqErr));
    reconnect(&mut p);
    // The window still works.
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::Success
    );
}

#[test]
fn bind_errors_complete_with_mw_bind_err() {
    let cases: [(&str, MwType); 8] = [
        ("region without MW_BIND", MwType::Type1),
        ("range starts before the region", MwType::Type1),
        ("range ends past the region", MwType::Type1),
        (
            "remote write on a region without local write",
            MwType::Type1,
        ),
        (
            "remote atomic on a region without local write",
            MwType::Type2,
        ),
        ("region of another PD", MwType::Type1),
        ("deregistered region", MwType::Type2),
        ("type 2 window already bound", MwType::Type2),
    ];
    for (which, kind) in cases {
        let mut p = Pair::lossless();
        let pd = p.b.pd;
        let mut mr = window_region(&mut p);
        let mut info = bind_info(&mr, WIN_OFF, WIN_LEN, wr_rights());
        let mw = p.engine(End::B).alloc_mw(pd, kind).unwrap();
        let mut mw_now = mw;
        match which {
            "region without MW_BIND" => {
                // B's own region grants every access but MW_BIND.
                mr = p.b.mr;
                info.mr = mr.handle;
                info.addr = mr.addr + 128;
            }
            "range starts before the region" => info.addr = mr.addr - 1,
            "range ends past the region" => {
                info.addr = mr.addr + REG_LEN as u64 - 100;
                info.length = 101;
            }
            "remote write on a region without local write" => {
                let b = p.engine(End::B).dereg_mr(mr.handle);
                b.unwrap();
                mr = reg_b(&mut p, pd, AccessFlags::MW_BIND);
                info = bind_info(&mr, WIN_OFF, WIN_LEN, AccessFlags::REMOTE_WRITE);
            }
            "remote atomic on a region without local write" => {
                p.engine(End::B).dereg_mr(mr.handle).unwrap();
                mr = reg_b(&mut p, pd, AccessFlags::MW_BIND);
                info = bind_info(&mr, WIN_OFF, WIN_LEN, AccessFlags::REMOTE_ATOMIC);
            }
            "region of another PD" => {
                let pd2 = p.engine(End::B).alloc_pd().unwrap();
                p.engine(End::B).dereg_mr(mr.handle).unwrap();
                mr = reg_b(&mut p, pd2, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
                info = bind_info(&mr, WIN_OFF, WIN_LEN, wr_rights());
            }
            "deregistered region" => p.engine(End::B).dereg_mr(mr.handle).unwrap(),
            _ => {
                let k = bind2(&mut p, &mw, info);
                mw_now.rkey = k.0;
            }
        }
        let qp = p.b.qp;
        let rkey = match kind {
            MwType::Type1 => p
                .engine(End::B)
                .bind_mw(qp, mw.handle, 80, SendFlags::SIGNALED, info)
                .unwrap(),
            MwType::Type2 => {
                let rkey = Rkey(inc_rkey(mw_now.rkey));
                let op = SendOp::BindMw {
                    mw: mw.handle,
                    rkey,
                    info,
                };
                p.post_send(End::B, &SendWr::new(80, op, &[])).unwrap();
                rkey
            }
        };
        let wc = b_send_wc(&mut p);
        assert_eq!((wc.wr_id, wc.status), (80, WcStatus::MwBindErr), "{which}");
        // The QP is in error (IBA 10.8.3.3, local errors); the window is as it was.
        assert_eq!(p.qp_state(End::B), QpState::Err, "{which}");
        reconnect(&mut p);
        assert_eq!(
            access(&mut p, Op::Write, WIN_OFF, 64, rkey),
            WcStatus::RemAccessErr,
            "{which}"
        );
        if which == "type 2 window already bound" {
            assert_eq!(
                access(&mut p, Op::Write, WIN_OFF, 64, Rkey(mw_now.rkey)),
                WcStatus::Success,
                "{which}: the first binding stands"
            );
        }
    }
}

#[test]
fn dealloc_mw_and_dereg_mr_end_access() {
    let mut p = Pair::lossless();
    let mr = window_region(&mut p);
    let (mw, rkey) = bound_type1(&mut p, &mr);
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::Success
    );

    p.engine(End::B).dereg_mr(mr.handle).unwrap();
    // A window whose region is gone grants nothing.
    assert_eq!(
        access(&mut p, Op::Write, WIN_OFF, 64, rkey),
        WcStatus::RemAccessErr
    );

    let mr2 = window_region(&mut p);
    let rkey2 = bind1(
        &mut p,
        mw.handle,
        bind_info(&mr2, WIN_OFF, WIN_LEN, wr_rights()),
    );
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF, 64, rkey2),
        WcStatus::Success
    );
    p.engine(End::B).dealloc_mw(mw.handle).unwrap();
    assert_eq!(
        p.engine(End::B).dealloc_mw(mw.handle),
        Err(ResourceError::UnknownObject)
    );
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF, 64, rkey2),
        WcStatus::RemAccessErr
    );
    // A new window in the same slot does not answer to the old key.
    let pd = p.b.pd;
    let mw2 = p.engine(End::B).alloc_mw(pd, MwType::Type1).unwrap();
    assert_ne!(mw2.rkey, rkey2.0);
    assert_eq!(
        access(&mut p, Op::Read, WIN_OFF, 64, rkey2),
        WcStatus::RemAccessErr
    );

    // The PD stays busy until every window is gone.
    let e = p.engine(End::B);
    e.dereg_mr(mr2.handle).unwrap();
    let other = e.alloc_pd().unwrap();
    let mw3 = e.alloc_mw(other, MwType::Type2).unwrap();
    assert_eq!(e.dealloc_pd(other), Err(ResourceError::Busy));
    e.dealloc_mw(mw3.handle).unwrap();
    e.dealloc_pd(other).unwrap();
    assert_eq!(
        e.alloc_mw(other, MwType::Type1),
        Err(ResourceError::UnknownObject)
    );
}

#[test]
fn binds_and_invalidates_keep_their_place_under_loss() {
    for seed in 0..16 {
        let mut p = Pair::new(seed, softverbs_sim::Faults::lossy(0.2), PairOpts::default());
        let mr = window_region(&mut p);
        let pd = p.b.pd;
        let mw1 = p.engine(End::B).alloc_mw(pd, MwType::Type1).unwrap();
        let mw2 = p.engine(End::B).alloc_mw(pd, MwType::Type2).unwrap();
        let rkey_a = p.rkey(End::A);
        let sge = [p.sge(End::B, 0, 3000)];
        let write = |id, off: usize| {
            SendWr::new(
                id,
                SendOp::RdmaWrite {
                    remote_addr: p.addr(End::A, off),
                    rkey: rkey_a,
                },
                &sge,
            )
        };
        let (w1, w3, w5, w7) = (write(1, 4096), write(3, 8192), write(5, 12288), write(7, 0));
        let qp = p.b.qp;
        let info = bind_info(&mr, WIN_OFF, WIN_LEN, wr_rights());
        let k2 = Rkey(inc_rkey(mw2.rkey));
        p.post_send(End::B, &w1).unwrap();
        let k1 = p
            .engine(End::B)
            .bind_mw(qp, mw1.handle, 2, SendFlags::SIGNALED, info)
            .unwrap();
        p.post_send(End::B, &w3).unwrap();
        let bind = SendOp::BindMw {
            mw: mw2.handle,
            rkey: k2,
            info,
        };
        p.post_send(End::B, &SendWr::new(4, bind, &[])).unwrap();
        p.post_send(End::B, &w5).unwrap();
        let inv = SendOp::LocalInv { rkey: k2 };
        p.post_send(End::B, &SendWr::new(6, inv, &[])).unwrap();
        p.post_send(End::B, &w7).unwrap();
        p.run_until_send_cqes(End::B, 7).unwrap();
        let got: Vec<_> = p
            .poll_send(End::B)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect();
        let want: Vec<_> = (1..=7).map(|i| (i, WcStatus::Success)).collect();
        assert_eq!(got, want, "seed {seed}");
        // Check the windows without loss: a lost NAK of a refused access ends in
        // RETRY_EXC_ERR, the responder having gone to ERR.
        p.settle();
        p.sim.set_faults(softverbs_sim::Faults::none());
        assert_eq!(
            access(&mut p, Op::Write, WIN_OFF, 64, k1),
            WcStatus::Success,
            "seed {seed}"
        );
        assert_eq!(
            access(&mut p, Op::Write, WIN_OFF, 64, k2),
            WcStatus::RemAccessErr,
            "seed {seed}"
        );
    }
}

//! The QP state machine through `modify_qp` (IBA 10.3.1 and 11.2.4.2), posting
//! in each state, flushing and resetting, SQ drain, and the lifetime rules of
//! QPs, PDs, CQs and MRs.

mod common;
use common::*;
use softverbs_engine::*;
use softverbs_sim::Faults;
use std::net::SocketAddr;
use std::time::Duration;

/// Fills message buffers with bytes that do not repeat with any short period
/// (unlike `Pair::fill`, whose pattern repeats every 256 bytes and so cannot see
/// a packet placed at the wrong multiple of the MTU).
trait Pattern {
    fn pattern(&mut self, end: End, offset: usize, len: usize, seed: u8);
}

impl Pattern for Pair {
    fn pattern(&mut self, end: End, offset: usize, len: usize, seed: u8) {
        let salt = u32::from(seed).wrapping_mul(0x85eb_ca6b);
        for (i, b) in self.side_mut(end).buf[offset..offset + len]
            .iter_mut()
            .enumerate()
        {
            *b = ((i as u32 ^ salt).wrapping_mul(0x9e37_79b1) >> 24) as u8;
        }
    }
}

type M = QpAttrMask;

fn mask(parts: &[M]) -> M {
    parts.iter().fold(M::EMPTY, |acc, &m| acc | m)
}

fn init_mask() -> M {
    mask(&[M::STATE, M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS])
}

fn rtr_mask() -> M {
    mask(&[
        M::STATE,
        M::AV,
        M::PATH_MTU,
        M::DEST_QPN,
        M::RQ_PSN,
        M::MAX_DEST_RD_ATOMIC,
        M::MIN_RNR_TIMER,
    ])
}

fn rts_mask() -> M {
    mask(&[
        M::STATE,
        M::SQ_PSN,
        M::TIMEOUT,
        M::RETRY_CNT,
        M::RNR_RETRY,
        M::MAX_QP_RD_ATOMIC,
    ])
}

fn peer_addr() -> SocketAddr {
    ADDR_B.parse().unwrap()
}

fn init_attr() -> QpAttr {
    QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        port_num: 1,
        pkey_index: 0,
        ..QpAttr::default()
    }
}

fn rtr_attr() -> QpAttr {
    QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu2048,
        dest_qp_num: 0x1234,
        rq_psn: 0x100,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        av: Some(peer_addr()),
        ..QpAttr::default()
    }
}

fn rts_attr() -> QpAttr {
    QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0x200,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 6,
        max_rd_atomic: 4,
        ..QpAttr::default()
    }
}

fn state_attr(state: QpState) -> QpAttr {
    QpAttr {
        qp_state: state,
        ..QpAttr::default()
    }
}

/// One engine with a PD, a CQ and an RC QP in RESET; not on any network.
struct Solo {
    e: Engine,
    cq: CqHandle,
    qp: QpHandle,
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 32,
    }
}

fn solo() -> Solo {
    let mut e = Engine::new(EngineConfig::new(ADDR_A.parse().unwrap()));
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(256).unwrap();
    let (qp, _) = e
        .create_qp(QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            qp_type: QpType::Rc,
            cap: cap(),
            sq_sig_all: false,
        })
        .unwrap();
    Solo { e, cq, qp }
}

impl Solo {
    fn modify(&mut self, attr: &QpAttr, mask: M) -> Result<(), ModifyQpError> {
        self.e.modify_qp(self.qp, attr, mask, Instant::ZERO)
    }

    fn attr(&self) -> QpAttr {
        self.e.query_qp(self.qp).unwrap().0
    }

    fn state(&self) -> QpState {
        self.attr().qp_state
    }

    /// Everything `query_qp` says, for before/after comparisons.
    fn snapshot(&self) -> String {
        format!("{:?}", self.e.query_qp(self.qp).unwrap())
    }

    /// Moves a fresh QP along RESET → INIT → RTR → RTS → SQD, or to ERR.
    fn drive_to(&mut self, target: QpState) {
        if target == QpState::Err {
            self.modify(&state_attr(QpState::Err), M::STATE).unwrap();
            return;
        }
        let path = [
            (QpState::Init, init_attr(), init_mask()),
            (QpState::Rtr, rtr_attr(), rtr_mask()),
            (QpState::Rts, rts_attr(), rts_mask()),
            (QpState::Sqd, state_attr(QpState::Sqd), M::STATE),
        ];
        let done = path
            .iter()
            .position(|(state, _, _)| *state == self.state())
            .map_or(0, |i| i + 1);
        for (state, attr, mask) in path.into_iter().skip(done) {
            if self.state() == target {
                break;
            }
            self.modify(&attr, mask).unwrap();
            assert_eq!(self.state(), state);
        }
        assert_eq!(self.state(), target);
    }

    /// Asserts `modify_qp` is refused and changes nothing; returns the error.
    fn refused(&mut self, attr: &QpAttr, mask: M, ctx: &str) -> ModifyQpError {
        let before = self.snapshot();
        let err = self
            .modify(attr, mask)
            .expect_err(&format!("{ctx}: accepted"));
        assert_eq!(self.snapshot(), before, "{ctx}: refused but changed the QP");
        err
    }

    fn post_send(&mut self, wr_id: u64, flags: SendFlags) -> Result<(), PostError> {
        self.e.post_send(
            self.qp,
            &SendWr {
                wr_id,
                op: SendOp::Send,
                payload: Payload::Sges(&[]),
                flags,
            },
        )
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), PostError> {
        self.e.post_recv(self.qp, &RecvWr { wr_id, sges: &[] })
    }

    fn poll(&mut self) -> Vec<WorkCompletion> {
        let mut out = [WorkCompletion::default(); 64];
        let n = self.e.poll_cq(self.cq, &mut out).unwrap();
        out[..n].to_vec()
    }
}

const STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

/// States an RC QP can be driven into through `modify_qp` (SQE is not one).
const REACHABLE: [QpState; 6] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Err,
];

#[test]
fn rc_valid_transitions_apply_their_attributes() {
    let mut s = solo();
    assert_eq!(s.state(), QpState::Reset);
    assert_eq!(s.attr().cap, cap());

    // RESET → RESET.
    s.modify(&state_attr(QpState::Reset), M::STATE).unwrap();
    assert_eq!(s.state(), QpState::Reset);

    // RESET → INIT.
    s.modify(&init_attr(), init_mask()).unwrap();
    let a = s.attr();
    assert_eq!(a.qp_state, QpState::Init);
    assert_eq!(
        a.qp_access_flags,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
    );
    assert_eq!((a.port_num, a.pkey_index), (1, 0));

    // INIT → INIT changes optional attributes.
    let attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    s.modify(&attr, M::STATE | M::ACCESS_FLAGS).unwrap();
    assert_eq!(s.state(), QpState::Init);
    assert_eq!(s.attr().qp_access_flags, AccessFlags::REMOTE_ATOMIC);

    // INIT → RTR.
    s.modify(&rtr_attr(), rtr_mask()).unwrap();
    let a = s.attr();
    assert_eq!(a.qp_state, QpState::Rtr);
    assert_eq!(a.path_mtu, Mtu::Mtu2048);
    assert_eq!(a.dest_qp_num, 0x1234);
    assert_eq!(a.rq_psn, 0x100);
    assert_eq!(a.max_dest_rd_atomic, 4);
    assert_eq!(a.min_rnr_timer, 12);
    assert_eq!(a.av, Some(peer_addr()));

    // RTR → RTS.
    s.modify(&rts_attr(), rts_mask()).unwrap();
    let a = s.attr();
    assert_eq!(a.qp_state, QpState::Rts);
    assert_eq!(a.sq_psn, 0x200);
    assert_eq!(
        (a.timeout, a.retry_cnt, a.rnr_retry, a.max_rd_atomic),
        (14, 7, 6, 4)
    );

    // RTS → RTS with the optional attributes, naming the current state.
    let attr = QpAttr {
        qp_state: QpState::Rts,
        cur_qp_state: QpState::Rts,
        min_rnr_timer: 20,
        qp_access_flags: AccessFlags::REMOTE_READ,
        ..QpAttr::default()
    };
    s.modify(
        &attr,
        M::STATE | M::CUR_STATE | M::MIN_RNR_TIMER | M::ACCESS_FLAGS,
    )
    .unwrap();
    let a = s.attr();
    assert_eq!(a.qp_state, QpState::Rts);
    assert_eq!(a.min_rnr_timer, 20);
    assert_eq!(a.qp_access_flags, AccessFlags::REMOTE_READ);
    // Without STATE in the mask the QP stays where it is.
    let attr = QpAttr {
        min_rnr_timer: 21,
        ..QpAttr::default()
    };
    s.modify(&attr, M::MIN_RNR_TIMER).unwrap();
    assert_eq!((s.state(), s.attr().min_rnr_timer), (QpState::Rts, 21));

    // RTS → SQD, asking for the drained event; nothing is outstanding, so it
    // comes at once.
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    s.modify(&attr, M::STATE | M::EN_SQD_ASYNC_NOTIFY).unwrap();
    assert_eq!(s.state(), QpState::Sqd);
    assert!(s.attr().en_sqd_async_notify);
    assert_eq!(s.e.poll_event(), Some(AsyncEvent::SqDrained(s.qp)));
    assert_eq!(s.e.poll_event(), None);

    // SQD → SQD changes path and retry attributes, up to the device limits.
    let max = s.e.config().max_qp_rd_atom;
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        timeout: 31,
        retry_cnt: 3,
        rnr_retry: 7,
        max_rd_atomic: max,
        max_dest_rd_atomic: max,
        min_rnr_timer: 31,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        av: Some("10.0.0.9:4791".parse().unwrap()),
        pkey_index: 0,
        port_num: 1,
        ..QpAttr::default()
    };
    s.modify(
        &attr,
        mask(&[
            M::STATE,
            M::TIMEOUT,
            M::RETRY_CNT,
            M::RNR_RETRY,
            M::MAX_QP_RD_ATOMIC,
            M::MAX_DEST_RD_ATOMIC,
            M::MIN_RNR_TIMER,
            M::ACCESS_FLAGS,
            M::AV,
            M::PKEY_INDEX,
            M::PORT,
        ]),
    )
    .unwrap();
    let a = s.attr();
    assert_eq!(a.qp_state, QpState::Sqd);
    assert_eq!(
        (a.timeout, a.retry_cnt, a.rnr_retry, a.min_rnr_timer),
        (31, 3, 7, 31)
    );
    assert_eq!((a.max_rd_atomic, a.max_dest_rd_atomic), (max, max));
    assert_eq!(a.av, Some("10.0.0.9:4791".parse().unwrap()));
    assert_eq!(a.qp_access_flags, AccessFlags::REMOTE_WRITE);

    // SQD → RTS.
    s.modify(&state_attr(QpState::Rts), M::STATE).unwrap();
    assert_eq!(s.state(), QpState::Rts);
    // Attributes set on the way survive.
    assert_eq!(s.attr().sq_psn, 0x200);
    assert_eq!(s.attr().rq_psn, 0x100);

    // RTS → ERR → ERR → RESET, and up again.
    s.modify(&state_attr(QpState::Err), M::STATE).unwrap();
    assert_eq!(s.state(), QpState::Err);
    s.modify(&state_attr(QpState::Err), M::STATE).unwrap();
    assert_eq!(s.state(), QpState::Err);
    s.modify(&state_attr(QpState::Reset), M::STATE).unwrap();
    assert_eq!(s.state(), QpState::Reset);
    assert_eq!(s.attr().cap, cap(), "capacities survive RESET");
    s.drive_to(QpState::Rts);
}

#[test]
fn every_state_moves_to_err_and_to_reset() {
    for from in REACHABLE {
        for to in [QpState::Err, QpState::Reset] {
            let ctx = format!("{from:?} → {to:?}");
            let mut s = solo();
            s.drive_to(from);
            s.modify(&state_attr(to), M::STATE)
                .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
            assert_eq!(s.state(), to, "{ctx}");
            // From either, the QP can be brought up again (ERR via RESET).
            if to == QpState::Err {
                s.modify(&state_attr(QpState::Reset), M::STATE).unwrap();
            }
            s.drive_to(QpState::Rts);
        }
    }
}

#[test]
fn undefined_transitions_are_refused() {
    // (from, to) pairs with no row in the RC table: skipping states, going
    // backwards, leaving ERR other than to RESET, entering SQE.
    let invalid = [
        (QpState::Reset, QpState::Rtr),
        (QpState::Reset, QpState::Rts),
        (QpState::Reset, QpState::Sqd),
        (QpState::Reset, QpState::Sqe),
        (QpState::Init, QpState::Rts),
        (QpState::Init, QpState::Sqd),
        (QpState::Init, QpState::Sqe),
        (QpState::Rtr, QpState::Init),
        (QpState::Rtr, QpState::Rtr),
        (QpState::Rtr, QpState::Sqd),
        (QpState::Rtr, QpState::Sqe),
        (QpState::Rts, QpState::Init),
        (QpState::Rts, QpState::Rtr),
        (QpState::Rts, QpState::Sqe),
        (QpState::Sqd, QpState::Init),
        (QpState::Sqd, QpState::Rtr),
        (QpState::Sqd, QpState::Sqe),
        (QpState::Err, QpState::Init),
        (QpState::Err, QpState::Rtr),
        (QpState::Err, QpState::Rts),
        (QpState::Err, QpState::Sqd),
        (QpState::Err, QpState::Sqe),
    ];
    // Masks to try: just STATE, and everything the target would need had it been
    // reached the normal way.
    let all_required = init_mask() | rtr_mask() | rts_mask();
    for (from, to) in invalid {
        for m in [M::STATE, all_required] {
            let ctx = format!("{from:?} → {to:?} with {m:?}");
            let mut s = solo();
            s.drive_to(from);
            let mut attr = init_attr();
            attr.qp_state = to;
            let r = rtr_attr();
            let t = rts_attr();
            attr.av = r.av;
            attr.path_mtu = r.path_mtu;
            attr.dest_qp_num = r.dest_qp_num;
            attr.rq_psn = r.rq_psn;
            attr.max_dest_rd_atomic = r.max_dest_rd_atomic;
            attr.sq_psn = t.sq_psn;
            attr.timeout = t.timeout;
            attr.retry_cnt = t.retry_cnt;
            attr.rnr_retry = t.rnr_retry;
            attr.max_rd_atomic = t.max_rd_atomic;
            let err = s.refused(&attr, m, &ctx);
            assert_eq!(err, ModifyQpError::InvalidTransition { from, to }, "{ctx}");
        }
    }
    // Every (from, to) not listed above, nor to ERR/RESET, is one of the table's.
    for from in REACHABLE {
        for to in STATES {
            let listed = invalid.contains(&(from, to));
            let to_any = matches!(to, QpState::Err | QpState::Reset);
            let valid = matches!(
                (from, to),
                (QpState::Reset, QpState::Init)
                    | (QpState::Init, QpState::Init)
                    | (QpState::Init, QpState::Rtr)
                    | (QpState::Rtr, QpState::Rts)
                    | (QpState::Rts, QpState::Rts)
                    | (QpState::Rts, QpState::Sqd)
                    | (QpState::Sqd, QpState::Rts)
                    | (QpState::Sqd, QpState::Sqd)
            );
            assert!(
                listed || to_any || valid,
                "{from:?} → {to:?} is not covered"
            );
        }
    }
}

#[test]
fn missing_required_attributes_are_named() {
    let steps = [
        (QpState::Reset, init_attr(), init_mask()),
        (QpState::Init, rtr_attr(), rtr_mask()),
        (QpState::Rtr, rts_attr(), rts_mask()),
    ];
    for (from, attr, full) in steps {
        let required = full.without(M::STATE);
        // Each required attribute left out on its own, and all of them.
        let mut omissions: Vec<M> = (0..32)
            .map(|bit| QpAttrMask(1 << bit))
            .filter(|&m| required.contains(m))
            .collect();
        omissions.push(required);
        for left_out in omissions {
            let ctx = format!("{from:?} → {:?} without {left_out:?}", attr.qp_state);
            let mut s = solo();
            s.drive_to(from);
            let err = s.refused(&attr, full.without(left_out), &ctx);
            assert_eq!(err, ModifyQpError::MissingAttributes(left_out), "{ctx}");
        }
    }
}

#[test]
fn forbidden_attributes_are_named() {
    let qkey = QpAttr {
        qkey: 0x1111_1111,
        ..QpAttr::default()
    };
    // (from, the transition's attributes and mask, an attribute it does not allow)
    let cases = [
        (QpState::Reset, init_attr(), init_mask(), M::QKEY),
        (QpState::Reset, init_attr(), init_mask(), M::PATH_MTU),
        (QpState::Reset, init_attr(), init_mask(), M::SQ_PSN),
        (QpState::Init, rtr_attr(), rtr_mask(), M::SQ_PSN),
        (QpState::Init, rtr_attr(), rtr_mask(), M::TIMEOUT),
        (QpState::Init, rtr_attr(), rtr_mask(), M::QKEY),
        (QpState::Rtr, rts_attr(), rts_mask(), M::RQ_PSN),
        (QpState::Rtr, rts_attr(), rts_mask(), M::PATH_MTU),
        (QpState::Rtr, rts_attr(), rts_mask(), M::DEST_QPN),
        (QpState::Rtr, rts_attr(), rts_mask(), M::AV),
        (QpState::Rts, state_attr(QpState::Rts), M::STATE, M::SQ_PSN),
        (
            QpState::Rts,
            state_attr(QpState::Rts),
            M::STATE,
            M::PATH_MTU,
        ),
        (QpState::Rts, state_attr(QpState::Rts), M::STATE, M::TIMEOUT),
        (QpState::Rts, state_attr(QpState::Sqd), M::STATE, M::TIMEOUT),
        (QpState::Sqd, state_attr(QpState::Rts), M::STATE, M::SQ_PSN),
        (QpState::Sqd, state_attr(QpState::Sqd), M::STATE, M::SQ_PSN),
        (
            QpState::Sqd,
            state_attr(QpState::Sqd),
            M::STATE,
            M::DEST_QPN,
        ),
        (
            QpState::Rts,
            state_attr(QpState::Err),
            M::STATE,
            M::PATH_MTU,
        ),
        (
            QpState::Init,
            state_attr(QpState::Reset),
            M::STATE,
            M::ACCESS_FLAGS,
        ),
        (
            QpState::Reset,
            state_attr(QpState::Reset),
            M::STATE,
            M::ACCESS_FLAGS,
        ),
    ];
    for (from, mut attr, m, extra) in cases {
        let ctx = format!("{from:?} → {:?} with {extra:?}", attr.qp_state);
        attr.qkey = qkey.qkey;
        let mut s = solo();
        s.drive_to(from);
        let err = s.refused(&attr, m | extra, &ctx);
        assert_eq!(err, ModifyQpError::ForbiddenAttributes(extra), "{ctx}");
        // Naming the current state alongside, where the transition allows
        // CUR_STATE (the moves to RTS), does not change what is reported.
        if attr.qp_state == QpState::Rts {
            attr.cur_qp_state = from;
            let err = s.refused(&attr, m | extra | M::CUR_STATE, &ctx);
            assert_eq!(
                err,
                ModifyQpError::ForbiddenAttributes(extra),
                "{ctx}, CUR_STATE"
            );
        }
    }
}

#[test]
fn cur_qp_state_must_match() {
    for from in REACHABLE {
        for given in STATES {
            if given == from {
                continue;
            }
            let ctx = format!("QP in {from:?}, caller says {given:?}");
            let mut s = solo();
            s.drive_to(from);
            // A move to ERR would otherwise be valid from anywhere.
            let attr = QpAttr {
                qp_state: QpState::Err,
                cur_qp_state: given,
                ..QpAttr::default()
            };
            let err = s.refused(&attr, M::STATE | M::CUR_STATE, &ctx);
            assert_eq!(
                err,
                ModifyQpError::CurrentStateMismatch {
                    given,
                    actual: from
                },
                "{ctx}"
            );
        }
    }
}

/// Asserts `err` is an `InvalidValue` naming `field`.
fn assert_invalid_value(err: ModifyQpError, field: &str, ctx: &str) {
    match err {
        ModifyQpError::InvalidValue(what) => {
            assert!(what.contains(field), "{ctx}: names {what:?}, not {field}")
        }
        other => panic!("{ctx}: expected InvalidValue({field}), got {other:?}"),
    }
}

#[test]
fn out_of_range_values_are_refused() {
    let max = EngineConfig::new(ADDR_A.parse().unwrap()).max_qp_rd_atom;
    type Tweak = fn(&mut QpAttr);
    // RESET → INIT.
    let init: [(&str, Tweak); 2] = [
        ("port_num", |a| a.port_num = 2),
        ("pkey_index", |a| a.pkey_index = 1),
    ];
    for (field, tweak) in init {
        let mut s = solo();
        let mut attr = init_attr();
        tweak(&mut attr);
        let err = s.refused(&attr, init_mask(), field);
        assert_invalid_value(err, field, "RESET → INIT");
    }
    // INIT → RTR.
    let rtr: [(&str, Tweak); 5] = [
        ("ah_attr", |a| a.av = None),
        ("dest_qp_num", |a| a.dest_qp_num = 1 << 24),
        ("max_dest_rd_atomic", |a| {
            a.max_dest_rd_atomic = EngineConfig::new(ADDR_A.parse().unwrap()).max_qp_rd_atom + 1
        }),
        ("min_rnr_timer", |a| a.min_rnr_timer = 32),
        ("pkey_index", |a| a.pkey_index = 1),
    ];
    for (field, tweak) in rtr {
        let mut s = solo();
        s.drive_to(QpState::Init);
        let mut attr = rtr_attr();
        tweak(&mut attr);
        let err = s.refused(&attr, rtr_mask() | M::PKEY_INDEX, field);
        assert_invalid_value(err, field, "INIT → RTR");
    }
    // RTR → RTS.
    let rts: [(&str, Tweak); 4] = [
        ("retry_cnt", |a| a.retry_cnt = 8),
        ("rnr_retry", |a| a.rnr_retry = 8),
        ("timeout", |a| a.timeout = 32),
        ("max_rd_atomic", |a| {
            a.max_rd_atomic = EngineConfig::new(ADDR_A.parse().unwrap()).max_qp_rd_atom + 1
        }),
    ];
    for (field, tweak) in rts {
        let mut s = solo();
        s.drive_to(QpState::Rtr);
        let mut attr = rts_attr();
        tweak(&mut attr);
        let err = s.refused(&attr, rts_mask(), field);
        assert_invalid_value(err, field, "RTR → RTS");
        // The boundary values are accepted.
        let mut ok = rts_attr();
        ok.retry_cnt = 7;
        ok.rnr_retry = 7;
        ok.timeout = 31;
        ok.max_rd_atomic = max;
        s.modify(&ok, rts_mask()).unwrap();
    }
    // SQD → SQD: the same limits apply.
    let sqd: [(&str, M, Tweak); 4] = [
        ("timeout", M::TIMEOUT, |a| a.timeout = 255),
        ("retry_cnt", M::RETRY_CNT, |a| a.retry_cnt = 200),
        ("max_rd_atomic", M::MAX_QP_RD_ATOMIC, |a| {
            a.max_rd_atomic = 255
        }),
        ("port_num", M::PORT, |a| a.port_num = 2),
    ];
    for (field, m, tweak) in sqd {
        let mut s = solo();
        s.drive_to(QpState::Sqd);
        let mut attr = state_attr(QpState::Sqd);
        tweak(&mut attr);
        let err = s.refused(&attr, M::STATE | m, field);
        assert_invalid_value(err, field, "SQD → SQD");
    }
}

#[test]
fn unsupported_attributes_are_refused() {
    // ALT_PATH is optional in INIT → RTR, RTR → RTS and RTS → RTS, but softverbs
    // has no alternate path.
    let mut s = solo();
    s.drive_to(QpState::Init);
    let err = s.refused(&rtr_attr(), rtr_mask() | M::ALT_PATH, "INIT → RTR");
    assert!(matches!(err, ModifyQpError::Unsupported(_)), "{err:?}");
    s.drive_to(QpState::Rts);
    for extra in [M::ALT_PATH, M::PATH_MIG_STATE] {
        let err = s.refused(&state_attr(QpState::Rts), M::STATE | extra, "RTS → RTS");
        assert!(
            matches!(err, ModifyQpError::Unsupported(_)),
            "{extra:?}: {err:?}"
        );
    }
    // Capacities are fixed at creation: no transition takes CAP.
    let err = s.refused(&state_attr(QpState::Rts), M::STATE | M::CAP, "CAP");
    assert_eq!(err, ModifyQpError::ForbiddenAttributes(M::CAP));
    // Without ALT_PATH the same transitions work.
    s.modify(&state_attr(QpState::Rts), M::STATE).unwrap();
}

#[test]
fn refused_modifies_leave_a_live_connection_working() {
    let mut p = Pair::lossless();
    let qp = p.a.qp;
    let before = format!("{:?}", p.engine(End::A).query_qp(qp).unwrap());
    let attempts: Vec<(QpAttr, M)> = vec![
        // A new send PSN would desynchronise the connection.
        (
            QpAttr {
                qp_state: QpState::Rts,
                sq_psn: 0x777,
                ..QpAttr::default()
            },
            M::STATE | M::SQ_PSN,
        ),
        // A new receive PSN likewise.
        (
            QpAttr {
                qp_state: QpState::Rts,
                rq_psn: 0x777,
                ..QpAttr::default()
            },
            M::STATE | M::RQ_PSN,
        ),
        (
            QpAttr {
                qp_state: QpState::Rts,
                min_rnr_timer: 40,
                ..QpAttr::default()
            },
            M::STATE | M::MIN_RNR_TIMER,
        ),
        (
            QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            },
            M::STATE,
        ),
        (
            QpAttr {
                qp_state: QpState::Err,
                cur_qp_state: QpState::Init,
                ..QpAttr::default()
            },
            M::STATE | M::CUR_STATE,
        ),
    ];
    for (attr, m) in &attempts {
        let r = p.engine(End::A).modify_qp(qp, attr, *m, Instant::ZERO);
        assert!(r.is_err(), "{attr:?} {m:?}");
    }
    assert_eq!(
        format!("{:?}", p.engine(End::A).query_qp(qp).unwrap()),
        before
    );
    // Traffic both ways still flows.
    p.pattern(End::A, 0, 3000, 1);
    p.pattern(End::B, 0, 3000, 2);
    for end in [End::A, End::B] {
        let rs = [p.sge(end, 8192, 4096)];
        p.post_recv(end, 1, &rs).unwrap();
    }
    for end in [End::A, End::B] {
        let s = [p.sge(end, 0, 3000)];
        p.post_send(end, &SendWr::new(2, SendOp::Send, &s)).unwrap();
    }
    p.settle();
    for end in [End::A, End::B] {
        let s = p.poll_send(end);
        let r = p.poll_recv(end);
        assert_eq!((s.len(), s[0].status), (1, WcStatus::Success), "{end:?}");
        assert_eq!(
            (r.len(), r[0].status, r[0].byte_len),
            (1, WcStatus::Success, 3000)
        );
    }
    assert_eq!(p.bytes(End::B, 8192, 3000), p.bytes(End::A, 0, 3000));
    assert_eq!(p.bytes(End::A, 8192, 3000), p.bytes(End::B, 0, 3000));
}

#[test]
fn posting_depends_on_the_state() {
    let mut s = solo();
    // RESET: neither queue.
    assert_eq!(
        s.post_send(1, SendFlags::SIGNALED),
        Err(PostError::InvalidState(QpState::Reset))
    );
    assert_eq!(s.post_recv(1), Err(PostError::InvalidState(QpState::Reset)));
    // INIT and RTR: receives only.
    for state in [QpState::Init, QpState::Rtr] {
        s.drive_to(state);
        assert_eq!(
            s.post_send(2, SendFlags::SIGNALED),
            Err(PostError::InvalidState(state))
        );
        s.post_recv(2).unwrap();
    }
    // RTS and SQD: both.
    for state in [QpState::Rts, QpState::Sqd] {
        s.drive_to(state);
        s.post_send(3, SendFlags::SIGNALED).unwrap();
        s.post_recv(3).unwrap();
    }
    // Nothing completed: the QP is not on a network.
    assert!(s.poll().is_empty());
}

#[test]
fn posting_in_err_flushes_at_once() {
    let mut s = solo();
    s.drive_to(QpState::Rts);
    s.modify(&state_attr(QpState::Err), M::STATE).unwrap();
    let depth = u64::from(cap().max_send_wr);
    // Many more than the queue depth: each completes as it is posted, signaled
    // or not.
    for i in 0..3 * depth {
        let flags = if i % 2 == 0 {
            SendFlags::SIGNALED
        } else {
            SendFlags::EMPTY
        };
        s.post_send(i, flags).unwrap();
        let wcs = s.poll();
        assert_eq!(wcs.len(), 1, "{wcs:?}");
        assert_eq!((wcs[0].wr_id, wcs[0].status), (i, WcStatus::WrFlushErr));
        assert_eq!(wcs[0].qp_num, s.e.qp_num(s.qp).unwrap());
    }
    for i in 0..3 * depth {
        s.post_recv(1000 + i).unwrap();
        let wcs = s.poll();
        assert_eq!(wcs.len(), 1, "{wcs:?}");
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
            (1000 + i, WcStatus::WrFlushErr, WcOpcode::Recv)
        );
    }
    // Nothing goes on the wire.
    let mut buf = vec![0u8; MAX_DATAGRAM];
    assert!(s.e.poll_transmit(Instant::ZERO, &mut buf).is_none());
}

/// Posts on A: receives 100.., then a mix of signaled and unsignaled send WRs
/// 0.., with the network to B cut so none completes; lets A send what it can.
fn post_stuck_work(p: &mut Pair) -> (Vec<u64>, Vec<u64>) {
    let (na, nb) = (p.a.node, p.b.node);
    p.sim.partition(na, nb, true);
    let recvs: Vec<u64> = (100..104).collect();
    for &id in &recvs {
        let rs = [p.sge(End::A, 40_000 + 1000 * (id as usize - 100), 1000)];
        p.post_recv(End::A, id, &rs).unwrap();
    }
    let rkey = p.rkey(End::B);
    let remote_addr = p.addr(End::B, 0);
    let ops = [
        SendOp::Send,
        SendOp::RdmaWrite { remote_addr, rkey },
        SendOp::RdmaRead { remote_addr, rkey },
        SendOp::Send,
        SendOp::SendWithImm { imm: 1 },
        SendOp::RdmaWrite { remote_addr, rkey },
    ];
    let mut sends = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        let sg = [p.sge(End::A, 2000 * i, 2000)];
        let flags = if i % 3 == 1 {
            SendFlags::EMPTY
        } else {
            SendFlags::SIGNALED
        };
        p.post_send(
            End::A,
            &SendWr {
                wr_id: i as u64,
                op,
                payload: Payload::Sges(&sg),
                flags,
            },
        )
        .unwrap();
        sends.push(i as u64);
    }
    let tx0 = p.engine(End::A).counters().tx_packets;
    p.sim.run_for(Duration::from_micros(100), limits()).unwrap();
    assert!(
        p.engine(End::A).counters().tx_packets > tx0,
        "A started its work"
    );
    assert!(p.poll_send(End::A).is_empty());
    assert!(p.poll_recv(End::A).is_empty());
    (sends, recvs)
}

#[test]
fn moving_to_err_flushes_outstanding_work_in_order() {
    let mut p = Pair::lossless();
    let (sends, recvs) = post_stuck_work(&mut p);
    let qp = p.a.qp;
    p.engine(End::A)
        .modify_qp(qp, &state_attr(QpState::Err), M::STATE, Instant::ZERO)
        .unwrap();
    // Every WR, signaled or not, completes with a flush error, in order.
    let wcs = p.poll_send(End::A);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        sends
            .iter()
            .map(|&i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    let wcs = p.poll_recv(End::A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        recvs
            .iter()
            .map(|&i| (i, WcStatus::WrFlushErr, WcOpcode::Recv))
            .collect::<Vec<_>>()
    );
    // Nothing more happens once the network heals.
    let (na, nb) = (p.a.node, p.b.node);
    p.sim.partition(na, nb, false);
    p.settle();
    assert!(p.poll_send(End::A).is_empty());
    assert!(p.poll_recv(End::A).is_empty());
    assert_eq!(p.qp_state(End::A), QpState::Err);
    assert_eq!(p.qp_state(End::B), QpState::Rts);
    assert!(p.poll_recv(End::B).is_empty());
}

#[test]
fn reset_discards_queues_without_completions() {
    let mut p = Pair::lossless();
    post_stuck_work(&mut p);
    let qp = p.a.qp;
    p.engine(End::A)
        .modify_qp(qp, &state_attr(QpState::Reset), M::STATE, Instant::ZERO)
        .unwrap();
    assert!(p.poll_send(End::A).is_empty());
    assert!(p.poll_recv(End::A).is_empty());
    let (na, nb) = (p.a.node, p.b.node);
    p.sim.partition(na, nb, false);
    p.settle();
    assert!(p.poll_send(End::A).is_empty());
    assert!(p.poll_recv(End::A).is_empty());
    assert_eq!(p.qp_state(End::A), QpState::Reset);

    // Reconnect A to B (which received nothing, so still expects psn_a), with
    // a receive posted while in INIT: it is kept for when the QP is connected.
    let opts = p.opts.clone();
    let (addr_b, b_qpn) = (p.sim.addr(nb), p.b.qpn);
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: opts.qp_access,
        ..QpAttr::default()
    };
    p.engine(End::A)
        .modify_qp(qp, &init, init_mask(), Instant::ZERO)
        .unwrap();
    let rs = [p.sge(End::A, 30_000, 1000)];
    p.post_recv(End::A, 555, &rs).unwrap();
    // (connect() starts with RESET → INIT's attributes, here INIT → INIT.)
    connect(
        p.engine(End::A),
        qp,
        addr_b,
        b_qpn,
        opts.psn_b,
        opts.psn_a,
        &opts,
    );
    p.pattern(End::A, 0, 500, 4);
    p.pattern(End::B, 0, 600, 5);
    let rs = [p.sge(End::B, 30_000, 1000)];
    p.post_recv(End::B, 7, &rs).unwrap();
    let s = [p.sge(End::A, 0, 500)];
    p.post_send(End::A, &SendWr::new(9, SendOp::Send, &s))
        .unwrap();
    let s = [p.sge(End::B, 0, 600)];
    p.post_send(End::B, &SendWr::new(8, SendOp::Send, &s))
        .unwrap();
    p.settle();
    // Only the new work completes: the old WQEs are gone.
    let ids =
        |wcs: Vec<WorkCompletion>| wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>();
    assert_eq!(ids(p.poll_send(End::A)), vec![(9, WcStatus::Success)]);
    assert_eq!(ids(p.poll_recv(End::A)), vec![(555, WcStatus::Success)]);
    assert_eq!(ids(p.poll_send(End::B)), vec![(8, WcStatus::Success)]);
    assert_eq!(ids(p.poll_recv(End::B)), vec![(7, WcStatus::Success)]);
    assert_eq!(p.bytes(End::A, 30_000, 600), p.bytes(End::B, 0, 600));
    assert_eq!(p.bytes(End::B, 30_000, 500), p.bytes(End::A, 0, 500));
}

fn post_sends(p: &mut Pair, ids: std::ops::Range<u64>, len: u32) {
    for id in ids {
        let s = [p.sge(End::A, 0, len)];
        p.post_send(End::A, &SendWr::new(id, SendOp::Send, &s))
            .unwrap();
    }
}

#[test]
fn sqd_finishes_started_work_holds_new_work_and_notifies() {
    let mut p = Pair::lossless();
    let (qp, na) = (p.a.qp, p.a.node);
    p.pattern(End::A, 0, 2000, 3);
    for i in 0..5 {
        let rs = [p.sge(End::B, 10_000 * i, 4000)];
        p.post_recv(End::B, 100 + i as u64, &rs).unwrap();
    }
    // Three two-packet SENDs; one step puts all six packets on the wire.
    post_sends(&mut p, 0..3, 2000);
    assert!(p.sim.step());
    let tx = p.engine(End::A).counters().tx_packets;
    assert_eq!(tx, 6);
    assert!(p.poll_send(End::A).is_empty());

    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    p.engine(End::A)
        .modify_qp(qp, &attr, M::STATE | M::EN_SQD_ASYNC_NOTIFY, Instant::ZERO)
        .unwrap();
    let a = p.engine(End::A).query_qp(qp).unwrap().0;
    assert_eq!((a.qp_state, a.sq_draining), (QpState::Sqd, true));
    assert_eq!(p.engine(End::A).poll_event(), None, "work is outstanding");

    // WRs posted in SQD are accepted but not started.
    post_sends(&mut p, 3..5, 2000);

    let mut events = Vec::new();
    let send_cq = p.a.send_cq;
    let mut done_at_event = None;
    p.sim
        .run_until(limits(), |sim| {
            while let Some(ev) = sim.node_mut(na).poll_event() {
                events.push(ev);
                done_at_event.get_or_insert(sim.node(na).cq_len(send_cq).unwrap());
            }
            !events.is_empty()
        })
        .unwrap();
    assert_eq!(events, vec![AsyncEvent::SqDrained(qp)]);
    assert_eq!(
        done_at_event,
        Some(3),
        "SQ_DRAINED comes once the started WRs are complete"
    );
    p.settle();
    assert_eq!(p.engine(End::A).poll_event(), None, "only once");
    assert_eq!(
        p.engine(End::A).counters().tx_packets,
        tx,
        "nothing new started in SQD"
    );
    let ids =
        |wcs: Vec<WorkCompletion>| wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>();
    assert_eq!(
        ids(p.poll_send(End::A)),
        (0..3).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(p.poll_recv(End::B)),
        (100..103)
            .map(|i| (i, WcStatus::Success))
            .collect::<Vec<_>>()
    );
    let a = p.engine(End::A).query_qp(qp).unwrap().0;
    assert_eq!((a.qp_state, a.sq_draining), (QpState::Sqd, false));

    // Back to RTS: the held WRs go.
    p.engine(End::A)
        .modify_qp(qp, &state_attr(QpState::Rts), M::STATE, Instant::ZERO)
        .unwrap();
    p.settle();
    assert_eq!(
        ids(p.poll_send(End::A)),
        (3..5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(p.poll_recv(End::B)),
        (103..105)
            .map(|i| (i, WcStatus::Success))
            .collect::<Vec<_>>()
    );
    assert_eq!(p.bytes(End::B, 40_000, 2000), p.bytes(End::A, 0, 2000));
    assert_eq!(p.engine(End::A).poll_event(), None);
}

#[test]
fn leaving_sqd_for_err_flushes_held_work() {
    let mut p = Pair::lossless();
    let qp = p.a.qp;
    p.pattern(End::A, 0, 2000, 3);
    for i in 0..2 {
        let rs = [p.sge(End::B, 10_000 * i, 4000)];
        p.post_recv(End::B, 100 + i as u64, &rs).unwrap();
    }
    post_sends(&mut p, 0..2, 2000);
    assert!(p.sim.step());
    p.engine(End::A)
        .modify_qp(qp, &state_attr(QpState::Sqd), M::STATE, Instant::ZERO)
        .unwrap();
    post_sends(&mut p, 2..5, 2000);
    p.settle();
    let ids =
        |wcs: Vec<WorkCompletion>| wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>();
    assert_eq!(
        ids(p.poll_send(End::A)),
        vec![(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    p.engine(End::A)
        .modify_qp(qp, &state_attr(QpState::Err), M::STATE, Instant::ZERO)
        .unwrap();
    assert_eq!(
        ids(p.poll_send(End::A)),
        (2..5)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    p.settle();
    assert_eq!(
        ids(p.poll_recv(End::B)).len(),
        2,
        "the held SENDs never left"
    );
}

#[test]
fn sqd_without_notify_raises_no_event_and_still_responds() {
    let mut p = Pair::lossless();
    let (qa, qb) = (p.a.qp, p.b.qp);
    p.pattern(End::A, 0, 3000, 3);
    let rs = [p.sge(End::B, 8000, 4000)];
    p.post_recv(End::B, 1, &rs).unwrap();
    post_sends(&mut p, 0..1, 3000);
    assert!(p.sim.step());
    p.engine(End::A)
        .modify_qp(qa, &state_attr(QpState::Sqd), M::STATE, Instant::ZERO)
        .unwrap();
    // B drains too (it has nothing outstanding) and keeps answering as responder.
    p.engine(End::B)
        .modify_qp(qb, &state_attr(QpState::Sqd), M::STATE, Instant::ZERO)
        .unwrap();
    p.settle();
    assert_eq!(p.engine(End::A).poll_event(), None);
    assert_eq!(p.engine(End::B).poll_event(), None);
    let s = p.poll_send(End::A);
    assert_eq!((s.len(), s[0].status), (1, WcStatus::Success));
    let r = p.poll_recv(End::B);
    assert_eq!(
        (r.len(), r[0].status, r[0].byte_len),
        (1, WcStatus::Success, 3000)
    );
    assert_eq!(p.bytes(End::B, 8000, 3000), p.bytes(End::A, 0, 3000));
    for (end, qp) in [(End::A, qa), (End::B, qb)] {
        let a = p.engine(end).query_qp(qp).unwrap().0;
        assert_eq!(
            (a.qp_state, a.sq_draining),
            (QpState::Sqd, false),
            "{end:?}"
        );
    }
    // RDMA READ of B (in SQD) from A (back in RTS).
    p.engine(End::A)
        .modify_qp(qa, &state_attr(QpState::Rts), M::STATE, Instant::ZERO)
        .unwrap();
    let d = [p.sge(End::A, 20_000, 3000)];
    let remote_addr = p.addr(End::B, 8000);
    let rkey = p.rkey(End::B);
    p.post_send(
        End::A,
        &SendWr::new(2, SendOp::RdmaRead { remote_addr, rkey }, &d),
    )
    .unwrap();
    p.settle();
    let s = p.poll_send(End::A);
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::Success));
    assert_eq!(p.bytes(End::A, 20_000, 3000), p.bytes(End::A, 0, 3000));
}

#[test]
fn destroyed_qp_is_unreachable_and_its_qpn_is_not_reused() {
    let opts = PairOpts {
        timeout: 8,
        retry_cnt: 2,
        ..PairOpts::default()
    };
    let mut p = Pair::new(3, Faults::none(), opts.clone());
    let (na, nb) = (p.a.node, p.b.node);
    let (addr_a, addr_b) = (p.sim.addr(na), p.sim.addr(nb));
    let (qa, old_qb, old_qpn) = (p.a.qp, p.b.qp, p.b.qpn);
    let init = p.engine(End::B).query_qp(old_qb).unwrap().1;
    p.engine(End::B).destroy_qp(old_qb).unwrap();
    assert_eq!(
        p.engine(End::B).destroy_qp(old_qb),
        Err(ResourceError::UnknownObject)
    );
    assert!(p.engine(End::B).query_qp(old_qb).is_none());
    assert_eq!(
        p.engine(End::B).post_recv(
            old_qb,
            &RecvWr {
                wr_id: 1,
                sges: &[]
            }
        ),
        Err(PostError::UnknownQp)
    );
    assert_eq!(
        p.engine(End::B)
            .modify_qp(old_qb, &state_attr(QpState::Err), M::STATE, Instant::ZERO),
        Err(ModifyQpError::UnknownQp)
    );

    // A's SEND goes nowhere: B drops every copy, A runs out of retries.
    let a_tx = p.engine(End::A).counters().tx_packets;
    let b_drops = p.engine(End::B).counters().drop_unknown_qp;
    post_sends(&mut p, 1..2, 100);
    p.settle();
    let s = p.poll_send(End::A);
    assert_eq!(
        (s.len(), s[0].wr_id, s[0].status),
        (1, 1, WcStatus::RetryExcErr)
    );
    // One copy per attempt, and the tail-loss probe that goes before any
    // round trip is measured.
    let sent = p.engine(End::A).counters().tx_packets - a_tx;
    assert_eq!(sent, u64::from(opts.retry_cnt) + 2);
    assert_eq!(p.engine(End::B).counters().drop_unknown_qp - b_drops, sent);

    // A new QP takes the same slot but not the same QPN.
    let (new_qb, new_qpn) = p.engine(End::B).create_qp(init).unwrap();
    assert_ne!(new_qpn, old_qpn);
    assert_eq!(
        new_qpn.value() & 0x3fff,
        old_qpn.value() & 0x3fff,
        "the freed slot is reused"
    );
    assert!(
        p.engine(End::B).query_qp(old_qb).is_none(),
        "old handle stays dead"
    );
    let qpn_a = p.a.qpn;
    connect(p.engine(End::B), new_qb, addr_a, qpn_a, 0x500, 0x600, &opts);
    let rs = [p.sge(End::B, 1000, 1000)];
    p.engine(End::B)
        .post_recv(
            new_qb,
            &RecvWr {
                wr_id: 77,
                sges: &rs,
            },
        )
        .unwrap();

    let reconnect = |p: &mut Pair, dest: Qpn| {
        p.engine(End::A)
            .modify_qp(qa, &state_attr(QpState::Reset), M::STATE, Instant::ZERO)
            .unwrap();
        connect(p.engine(End::A), qa, addr_b, dest, 0x600, 0x500, &opts);
    };

    // A peer still using the old QPN does not reach the new QP.
    reconnect(&mut p, old_qpn);
    let b_drops = p.engine(End::B).counters().drop_unknown_qp;
    post_sends(&mut p, 2..3, 100);
    p.settle();
    let s = p.poll_send(End::A);
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::RetryExcErr));
    assert!(p.engine(End::B).counters().drop_unknown_qp > b_drops);
    assert!(p.poll_recv(End::B).is_empty());

    // With the new QPN it does.
    reconnect(&mut p, new_qpn);
    p.pattern(End::A, 0, 100, 8);
    post_sends(&mut p, 3..4, 100);
    p.settle();
    let s = p.poll_send(End::A);
    assert_eq!((s[0].wr_id, s[0].status), (3, WcStatus::Success));
    let r = p.poll_recv(End::B);
    assert_eq!(
        (r.len(), r[0].wr_id, r[0].status),
        (1, 77, WcStatus::Success)
    );
    assert_eq!(r[0].qp_num, new_qpn);
    assert_eq!(p.bytes(End::B, 1000, 100), p.bytes(End::A, 0, 100));
}

#[test]
fn objects_in_use_cannot_be_freed() {
    let mut buf = vec![0u8; 4096].into_boxed_slice();
    let mut e = Engine::new(EngineConfig::new(ADDR_A.parse().unwrap()));
    let pd = e.alloc_pd().unwrap();
    let scq = e.create_cq(16).unwrap();
    let rcq = e.create_cq(16).unwrap();
    // SAFETY: `buf` is declared before `e`, so it outlives it, and it does not
    // move.
    let mr =
        unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
    let init = QpInitAttr {
        pd,
        send_cq: scq,
        recv_cq: rcq,
        qp_type: QpType::Rc,
        cap: cap(),
        sq_sig_all: false,
    };
    let (qp1, _) = e.create_qp(init).unwrap();
    // A second QP using one CQ for both queues.
    let (qp2, _) = e
        .create_qp(QpInitAttr {
            send_cq: rcq,
            ..init
        })
        .unwrap();

    assert_eq!(e.dealloc_pd(pd), Err(ResourceError::Busy));
    assert_eq!(e.destroy_cq(scq), Err(ResourceError::Busy));
    assert_eq!(e.destroy_cq(rcq), Err(ResourceError::Busy));
    e.destroy_qp(qp1).unwrap();
    // scq is free now; rcq and the PD are still used by qp2, the PD by the MR.
    e.destroy_cq(scq).unwrap();
    assert_eq!(e.destroy_cq(rcq), Err(ResourceError::Busy));
    assert_eq!(e.dealloc_pd(pd), Err(ResourceError::Busy));
    e.destroy_qp(qp2).unwrap();
    e.destroy_cq(rcq).unwrap();
    assert_eq!(e.dealloc_pd(pd), Err(ResourceError::Busy), "the MR uses it");
    e.dereg_mr(mr.handle).unwrap();
    e.dealloc_pd(pd).unwrap();
    // Everything is gone.
    assert_eq!(e.dealloc_pd(pd), Err(ResourceError::UnknownObject));
    assert_eq!(e.destroy_cq(scq), Err(ResourceError::UnknownObject));
    assert_eq!(e.dereg_mr(mr.handle), Err(ResourceError::UnknownObject));
    assert_eq!(e.destroy_qp(qp1), Err(ResourceError::UnknownObject));
    drop(e);
    drop(buf);
}

#[test]
fn dereg_mr_revokes_its_keys() {
    let mut p = Pair::lossless();
    let region = 48 * 1024;
    let len = 4096;
    let pd = p.b.pd;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let reg = |p: &mut Pair| {
        // SAFETY: inside B's boxed buffer, which outlives the engine.
        let addr = unsafe { p.b.buf.as_mut_ptr().add(region) };
        // SAFETY: as above.
        unsafe { p.engine(End::B).reg_mr(pd, addr, len, access) }.unwrap()
    };
    let write = |p: &mut Pair, wr_id: u64, rkey: u32, seed: u8| {
        p.pattern(End::A, 0, 64, seed);
        let s = [p.sge(End::A, 0, 64)];
        let remote_addr = p.addr(End::B, region);
        p.post_send(
            End::A,
            &SendWr::new(
                wr_id,
                SendOp::RdmaWrite {
                    remote_addr,
                    rkey: Rkey(rkey),
                },
                &s,
            ),
        )
        .unwrap();
        p.settle();
        let wcs = p.poll_send(End::A);
        assert_eq!(wcs.len(), 1, "{wcs:?}");
        assert_eq!(wcs[0].wr_id, wr_id);
        wcs[0].status
    };

    let old = reg(&mut p);
    assert_eq!(write(&mut p, 1, old.rkey, 1), WcStatus::Success);
    assert_eq!(p.bytes(End::B, region, 64), p.bytes(End::A, 0, 64));
    p.engine(End::B).dereg_mr(old.handle).unwrap();
    assert_eq!(
        p.engine(End::B).dereg_mr(old.handle),
        Err(ResourceError::UnknownObject)
    );

    // The next registration (same memory, likely the same table slot) has new keys.
    let new = reg(&mut p);
    assert_ne!(new.lkey, old.lkey);
    assert_ne!(new.rkey, old.rkey);
    assert_eq!(write(&mut p, 2, new.rkey, 2), WcStatus::Success);
    let kept = p.bytes(End::B, region, 64).to_vec();
    assert_eq!(&kept[..], p.bytes(End::A, 0, 64));

    // The old rkey no longer works and writes nothing.
    assert_eq!(write(&mut p, 3, old.rkey, 3), WcStatus::RemAccessErr);
    assert_eq!(p.bytes(End::B, region, 64), &kept[..]);
    assert_eq!(p.qp_state(End::A), QpState::Err);
}

#[test]
fn create_qp_and_cq_refuse_what_they_cannot_do() {
    let cfg = EngineConfig::new(ADDR_A.parse().unwrap());
    let mut e = Engine::new(cfg.clone());
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(16).unwrap();
    let base = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: QpType::Rc,
        cap: cap(),
        sq_sig_all: false,
    };
    type Tweak = fn(&mut QpCap, &EngineConfig);
    let bad: [(&str, Tweak); 8] = [
        ("max_send_wr 0", |c, _| c.max_send_wr = 0),
        ("max_recv_wr 0", |c, _| c.max_recv_wr = 0),
        ("max_send_wr too big", |c, g| {
            c.max_send_wr = g.max_qp_wr + 1
        }),
        ("max_recv_wr too big", |c, g| {
            c.max_recv_wr = g.max_qp_wr + 1
        }),
        ("max_send_sge too big", |c, g| {
            c.max_send_sge = g.max_sge + 1
        }),
        ("max_recv_sge too big", |c, g| {
            c.max_recv_sge = g.max_sge + 1
        }),
        ("max_inline_data too big", |c, g| {
            c.max_inline_data = g.max_inline_data + 1
        }),
        ("both depths 0", |c, _| {
            c.max_send_wr = 0;
            c.max_recv_wr = 0;
        }),
    ];
    for (what, tweak) in bad {
        let mut init = base;
        tweak(&mut init.cap, &cfg);
        assert!(
            matches!(e.create_qp(init), Err(ResourceError::InvalidArgument(_))),
            "{what}"
        );
    }
    // The limits themselves are fine.
    let mut init = base;
    init.cap = QpCap {
        max_send_wr: cfg.max_qp_wr,
        max_recv_wr: cfg.max_qp_wr,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let (qp, _) = e.create_qp(init).unwrap();
    let mut init = base;
    init.cap.max_send_sge = cfg.max_sge;
    init.cap.max_recv_sge = cfg.max_sge;
    init.cap.max_inline_data = cfg.max_inline_data;
    let (qp2, _) = e.create_qp(init).unwrap();
    e.destroy_qp(qp).unwrap();
    e.destroy_qp(qp2).unwrap();

    // CQ depth: 1..=max_cqe.
    assert!(matches!(
        e.create_cq(0),
        Err(ResourceError::InvalidArgument(_))
    ));
    assert!(matches!(
        e.create_cq(cfg.max_cqe + 1),
        Err(ResourceError::InvalidArgument(_))
    ));
    let one = e.create_cq(1).unwrap();
    e.destroy_cq(one).unwrap();

    // Refused creations took no references: everything can be freed.
    e.destroy_cq(cq).unwrap();
    e.dealloc_pd(pd).unwrap();
    // And objects that no longer exist cannot be used.
    assert_eq!(e.create_qp(base).err(), Some(ResourceError::UnknownObject));
}

#[test]
fn cq_overrun_raises_cq_error() {
    let mut p = Pair::new(
        5,
        Faults::none(),
        PairOpts {
            cqe: 4,
            ..PairOpts::default()
        },
    );
    for i in 0..10 {
        let rs = [p.sge(End::B, 100 * i, 100)];
        p.post_recv(End::B, 100 + i as u64, &rs).unwrap();
    }
    post_sends(&mut p, 0..10, 50);
    p.settle();
    for (end, cq) in [(End::A, p.a.send_cq), (End::B, p.b.recv_cq)] {
        let events: Vec<_> = std::iter::from_fn(|| p.engine(end).poll_event()).collect();
        assert_eq!(events, vec![AsyncEvent::CqError(cq)], "{end:?}");
        assert_eq!(p.engine(end).counters().cq_overruns, 6, "{end:?}");
        // The first four completions are there, in order.
        let wcs = p.poll(end, cq);
        let first = if end == End::A { 0 } else { 100 };
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            (first..first + 4)
                .map(|i| (i, WcStatus::Success))
                .collect::<Vec<_>>(),
            "{end:?}"
        );
    }
    // The other two CQs saw nothing and did not overrun.
    assert!(p.poll_recv(End::A).is_empty());
    assert!(p.poll_send(End::B).is_empty());
}

#[test]
fn sqd_finishes_a_message_it_has_begun() {
    let mut p = Pair::lossless();
    let (qp, na, nb) = (p.a.qp, p.a.node, p.b.node);
    let (addr_a, now) = (p.sim.addr(na), p.sim.now());
    p.pattern(End::A, 0, 3000, 6);
    for i in 0..2 {
        let rs = [p.sge(End::B, 10_000 * (i + 1), 4000)];
        p.post_recv(End::B, 100 + i as u64, &rs).unwrap();
    }
    // A three-packet SEND and one more after it.
    post_sends(&mut p, 0..2, 3000);
    // Take only the first packet of the first SEND off A by hand and give it
    // to B, then ask A to drain.
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let t = p.engine(End::A).poll_transmit(now, &mut buf).unwrap();
    assert_eq!(t.dst, p.sim.addr(nb));
    t.seal(&mut buf, 0);
    p.engine(End::B).handle_datagram(now, addr_a, &buf[..t.len]);
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    p.engine(End::A)
        .modify_qp(qp, &attr, M::STATE | M::EN_SQD_ASYNC_NOTIFY, Instant::ZERO)
        .unwrap();
    assert_eq!(
        p.engine(End::A).poll_event(),
        None,
        "a message is half sent"
    );
    p.settle();
    // The begun message was finished; the next one was not started.
    assert_eq!(
        p.engine(End::A).poll_event(),
        Some(AsyncEvent::SqDrained(qp))
    );
    assert_eq!(p.engine(End::A).counters().tx_packets, 3);
    let s = p.poll_send(End::A);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(0, WcStatus::Success)]
    );
    let r = p.poll_recv(End::B);
    assert_eq!(
        r.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 3000)]
    );
    assert_eq!(p.bytes(End::B, 10_000, 3000), p.bytes(End::A, 0, 3000));
    p.engine(End::A)
        .modify_qp(qp, &state_attr(QpState::Rts), M::STATE, Instant::ZERO)
        .unwrap();
    p.settle();
    assert_eq!(p.poll_send(End::A)[0].wr_id, 1);
    assert_eq!(p.poll_recv(End::B)[0].wr_id, 101);
}

#[test]
fn access_flags_changed_in_rts_take_effect() {
    let mut p = Pair::lossless();
    let qb = p.b.qp;
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: AccessFlags::REMOTE_READ,
        ..QpAttr::default()
    };
    p.engine(End::B)
        .modify_qp(qb, &attr, M::STATE | M::ACCESS_FLAGS, Instant::ZERO)
        .unwrap();
    p.pattern(End::B, 0, 1000, 9);
    let remote_addr = p.addr(End::B, 0);
    let rkey = p.rkey(End::B);
    // READ is still allowed.
    let d = [p.sge(End::A, 0, 1000)];
    p.post_send(
        End::A,
        &SendWr::new(1, SendOp::RdmaRead { remote_addr, rkey }, &d),
    )
    .unwrap();
    p.settle();
    let s = p.poll_send(End::A);
    assert_eq!((s[0].wr_id, s[0].status), (1, WcStatus::Success));
    assert_eq!(p.bytes(End::A, 0, 1000), p.bytes(End::B, 0, 1000));
    // WRITE no longer is: the responder refuses the operation as an invalid
    // request (IBA 9.7.5.1: an operation the QP does not support).
    let before = p.bytes(End::B, 0, 1000).to_vec();
    p.pattern(End::A, 2000, 1000, 10);
    let s = [p.sge(End::A, 2000, 1000)];
    p.post_send(
        End::A,
        &SendWr::new(2, SendOp::RdmaWrite { remote_addr, rkey }, &s),
    )
    .unwrap();
    p.settle();
    let s = p.poll_send(End::A);
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::RemInvReqErr));
    assert_eq!(p.bytes(End::B, 0, 1000), &before[..]);
}

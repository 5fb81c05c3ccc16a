//! Send-queue accounting: a send WQE's slot is free again only once its completion
//! was polled (for an unsignaled WQE: once a later signaled completion of the same
//! send queue was polled), as on hardware (IBA 10.8.3.1, 11.4.1.1: the WQE belongs to
//! the queue until its completion is retrieved). So `post_send` beyond max_send_wr
//! with unpolled completions fails with the queue-full error, and a CQ sized for the
//! send queues it serves cannot overrun. When a CQ does overrun, the CQ error event is
//! raised and every QP that then completes work into it goes to ERR: completions are
//! never lost silently.

mod common;

use common::*;
use softverbs_engine::*;
use softverbs_sim::Faults;

fn write(p: &Pair, wr_id: u64, flags: SendFlags) -> SendWr<'static> {
    SendWr {
        wr_id,
        op: SendOp::RdmaWrite {
            remote_addr: p.addr(End::B, 8 * (wr_id as usize % 1024)),
            rkey: p.rkey(End::B),
        },
        payload: Payload::Inline(b"8 bytes!"),
        flags,
    }
}

fn events(p: &mut Pair, end: End) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| p.engine(end).poll_event()).collect()
}

fn ids(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn depth_64(cqe: u32, sq_sig_all: bool) -> Pair {
    let mut opts = PairOpts {
        cqe,
        sq_sig_all,
        ..PairOpts::default()
    };
    opts.cap.max_send_wr = 64;
    Pair::new(9, Faults::none(), opts)
}

/// The reproduction: a 64-deep send queue whose 64-entry CQ is never polled,
/// posted to until it refuses, the network run in between. Before, it accepted 400
/// posts and 336 completions were lost to the overrun CQ without anyone noticing.
#[test]
fn unpolled_completions_hold_their_send_queue_slots() {
    let mut p = depth_64(64, true);
    let mut accepted = 0u64;
    for attempt in 0..400 {
        match p.post_send(End::A, &write(&p, attempt, SendFlags::SIGNALED)) {
            Ok(()) => accepted += 1,
            Err(e) => assert_eq!(e, PostError::QueueFull),
        }
        if attempt % 16 == 15 {
            p.settle();
        }
    }
    p.settle();
    let c = p.engine(End::A).counters();
    assert_eq!(
        (accepted, c.cq_overruns),
        (64, 0),
        "posts accepted and completions lost"
    );
    assert_eq!(p.qp_state(End::A), QpState::Rts);
    // Polling one completion frees one slot, in order.
    let cq = p.a.send_cq;
    let mut one = [WorkCompletion::default(); 1];
    assert_eq!(p.engine(End::A).poll_cq(cq, &mut one), Ok(1));
    assert_eq!((one[0].wr_id, one[0].status), (0, WcStatus::Success));
    p.post_send(End::A, &write(&p, 500, SendFlags::SIGNALED))
        .unwrap();
    assert_eq!(
        p.post_send(End::A, &write(&p, 501, SendFlags::SIGNALED)),
        Err(PostError::QueueFull)
    );
    p.settle();
    let wcs = p.poll_send(End::A);
    assert_eq!(wcs.len(), 64);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(wcs.last().unwrap().wr_id, 500);
    assert!(events(&mut p, End::A).is_empty());
    // All polled: the whole queue is free again.
    for i in 0..64 {
        p.post_send(End::A, &write(&p, 600 + i, SendFlags::SIGNALED))
            .unwrap();
    }
}

/// Unsignaled WQEs produce no completion: their slots come back when a later signaled
/// WQE's completion is polled.
#[test]
fn unsignaled_slots_come_back_with_a_later_signaled_completion() {
    let mut p = depth_64(1024, false);
    for i in 0..63 {
        p.post_send(End::A, &write(&p, i, SendFlags::EMPTY))
            .unwrap();
    }
    p.post_send(End::A, &write(&p, 63, SendFlags::SIGNALED))
        .unwrap();
    p.settle();
    assert_eq!(
        p.post_send(End::A, &write(&p, 64, SendFlags::SIGNALED)),
        Err(PostError::QueueFull),
        "all 64 done on the wire, but the completion is not polled yet"
    );
    assert_eq!(ids(&p.poll_send(End::A)), vec![(63, WcStatus::Success)]);
    for i in 64..128 {
        p.post_send(End::A, &write(&p, i, SendFlags::EMPTY))
            .unwrap();
    }
    // Unsignaled WQEs done on the wire with nothing signaled after them stay held.
    p.settle();
    assert_eq!(
        p.post_send(End::A, &write(&p, 128, SendFlags::SIGNALED)),
        Err(PostError::QueueFull)
    );
    assert_eq!(p.qp_state(End::A), QpState::Rts);
}

/// A QP moved to ERR flushes its send queue; each flush completion frees its slot when
/// polled, and posting in ERR (which completes at once with a flush error) takes a slot
/// until that completion is polled too.
#[test]
fn flushed_slots_come_back_as_flush_completions_are_polled() {
    let mut p = depth_64(1024, false);
    for i in 0..40 {
        let flags = if i % 8 == 7 {
            SendFlags::SIGNALED
        } else {
            SendFlags::EMPTY
        };
        p.post_send(End::A, &write(&p, i, flags)).unwrap();
    }
    let qp = p.a.qp;
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.engine(End::A)
        .modify_qp(qp, &err, QpAttrMask::STATE, Instant::ZERO)
        .unwrap();
    for i in 40..64 {
        p.post_send(End::A, &write(&p, i, SendFlags::EMPTY))
            .unwrap();
    }
    assert_eq!(
        p.post_send(End::A, &write(&p, 64, SendFlags::EMPTY)),
        Err(PostError::QueueFull)
    );
    let wcs = p.poll_send(End::A);
    assert_eq!(wcs.len(), 64, "every WQE flushed, signaled or not");
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushErr));
    for i in 64..128 {
        p.post_send(End::A, &write(&p, i, SendFlags::EMPTY))
            .unwrap();
    }
    assert_eq!(p.poll_send(End::A).len(), 64);
}

/// A CQ smaller than the send queue feeding it overruns: the CQ error event is raised
/// once, the QP that completes into the full CQ goes to ERR (its later WQEs are not
/// lost silently: the QP stops), and QPs completing elsewhere carry on.
#[test]
fn a_cq_overrun_moves_the_qp_completing_into_it_to_err() {
    let mut p = depth_64(4, true);
    for i in 0..10 {
        p.post_send(End::A, &write(&p, i, SendFlags::SIGNALED))
            .unwrap();
    }
    p.settle();
    let cq = p.a.send_cq;
    assert_eq!(events(&mut p, End::A), vec![AsyncEvent::CqError(cq)]);
    assert_eq!(
        p.qp_state(End::A),
        QpState::Err,
        "the QP went on as if nothing was lost"
    );
    assert_eq!(
        ids(&p.poll_send(End::A)),
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(p.qp_state(End::B), QpState::Rts);
}

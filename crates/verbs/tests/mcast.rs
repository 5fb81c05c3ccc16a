//! Multicast over real UDP sockets: contexts in one process attach UD QPs to an
//! IP multicast group on loopback and one UD SEND to QPN 0xFFFFFF reaches them
//! all; a detached QP gets nothing.

use softverbs::error::McastError;
use softverbs::*;
use std::net::SocketAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);
const QKEY: u32 = 0x0123_4567;

/// A group of our own, so concurrent test processes do not hear each other.
fn group(salt: u8) -> Gid {
    let pid = std::process::id();
    let addr: SocketAddr = (
        [239, 77, salt, (pid % 251) as u8],
        20000 + (pid % 20000) as u16,
    )
        .into();
    Gid::from_socket_addr(addr).unwrap()
}

struct Member {
    ctx: Context,
    cq: Cq,
    qp: Qp,
    mr: Mr<Vec<u8>>,
    _pd: Pd,
}

fn member() -> Member {
    let ctx = Device::with_config("mc", Config::default()).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq)
        .qp_type(QpType::Ud)
        .build()
        .unwrap();
    qp.ud_to_init(QKEY).unwrap();
    qp.ud_to_rtr().unwrap();
    qp.to_rts(RtsAttr::default()).unwrap();
    let mr = pd
        .reg_mr(vec![0u8; 8192], AccessFlags::LOCAL_WRITE)
        .unwrap();
    qp.post_recv(1, &[mr.sge(0, 4096)]).unwrap();
    Member {
        ctx,
        cq,
        qp,
        mr,
        _pd: pd,
    }
}

#[test]
fn one_send_reaches_three_contexts_and_not_a_detached_one() {
    let g = group(1);
    assert!(g.is_multicast());
    let members: Vec<Member> = (0..3).map(|_| member()).collect();
    for m in &members {
        m.qp.attach_mcast(g).unwrap();
    }
    let gone = member();
    gone.qp.attach_mcast(g).unwrap();
    gone.qp.detach_mcast(g).unwrap();
    assert!(matches!(
        gone.qp.detach_mcast(g),
        Err(McastError::Resource(_))
    ));

    let sender = member();
    let msg = b"one datagram for the whole group";
    sender.mr.write(4096, msg);
    let ah = AddressHandle::from_gid(g);
    let sges = [sender.mr.sge(4096, msg.len() as u32)];
    sender
        .qp
        .post_send(&SendWr::new(
            7,
            ah.send(Qpn::MULTICAST, QKEY, Some(42)),
            &sges,
        ))
        .unwrap();
    assert_eq!(sender.cq.wait_for(1, WAIT)[0].status, WcStatus::Success);
    for m in &members {
        let wc = m.cq.wait_for(1, WAIT);
        assert_eq!(wc.len(), 1, "every attached QP receives the send");
        let wc = wc[0];
        assert_eq!(
            (wc.status, wc.imm_data, wc.src_qp, wc.qp_num),
            (WcStatus::Success, Some(42), sender.qp.qpn(), m.qp.qpn())
        );
        assert_eq!(wc.byte_len as usize, 40 + msg.len());
        assert_eq!(
            AddressHandle::from_wc(&wc).unwrap().addr(),
            sender.ctx.local_addr()
        );
        let mut got = vec![0u8; msg.len()];
        m.mr.read(40, &mut got);
        assert_eq!(&got, msg);
        assert_eq!(m.ctx.counters().drop_icrc, 0);
    }
    // The detached QP got nothing (its receive is still posted).
    std::thread::sleep(Duration::from_millis(200));
    let mut out = [WorkCompletion::default(); 4];
    assert_eq!(gone.cq.poll(&mut out), 0);
}

#[test]
fn only_ud_qps_attach_to_multicast_gids() {
    let ctx = Device::with_config("mc", Config::default()).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let rc = QpBuilder::new(&pd, &cq).build().unwrap();
    assert!(matches!(
        rc.attach_mcast(group(2)),
        Err(McastError::Resource(_))
    ));
    let ud = QpBuilder::new(&pd, &cq)
        .qp_type(QpType::Ud)
        .build()
        .unwrap();
    // A unicast GID is no group.
    assert!(matches!(
        ud.attach_mcast(ctx.gid()),
        Err(McastError::Resource(_))
    ));
    ud.attach_mcast(group(2)).unwrap();
    // Destroying an attached QP leaves the group.
    drop(ud);
}

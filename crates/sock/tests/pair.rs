//! Two stream cores joined by a model of RC RDMA: writes land in the peer's registered
//! regions in order (checked against the region's rkey and bounds, as an RNIC checks an
//! R_Key), WRITE WITH IMM consumes a posted receive (none posted: the message waits, as an
//! RNR retry would), completions come back in order. Send-ring bytes are gathered when the
//! write is delivered, not when it is posted, so a send ring reused too early corrupts the
//! stream and fails the check. With the "bytes placed" word on, a data write also writes
//! the writer's count into the reader's word when it is delivered (after its bytes, as
//! the same-host copy does), and a reader reads up to it before the messages arrive.

use proptest::prelude::*;
use softverbs_sock::*;
use std::collections::VecDeque;

const RBUF_BASE: u64 = 0x10_0000_0000;
const TARGET_BASE: u64 = 0x20_0000_0000;

struct Side {
    core: StreamCore,
    rbuf: Vec<u8>,
    target: Vec<u8>,
    sbuf: Vec<u8>,
    iomap_region: Vec<u8>,
    recv_posted: u32,
    next_send_byte: u64,
    next_recv_byte: u64,
    // Early room (`StreamCore::set_early_grants`, as the same-host path): writes copy
    // their bytes when posted and give their send ring back; grants are taken from the
    // target area, before their message when `take_before_message`.
    early: bool,
    take_before_message: bool,
    // This side offered a "bytes placed" word (`StreamCore::set_placed_word`).
    word: bool,
}

fn regions(side: usize) -> LocalRegions {
    LocalRegions {
        rbuf_addr: RBUF_BASE + side as u64 * 0x1_0000_0000,
        rbuf_rkey: 0x100 + side as u32,
        target_addr: TARGET_BASE + side as u64 * 0x1_0000_0000,
        target_rkey: 0x200 + side as u32,
    }
}

const IOMAP_ADDR: u64 = 0x30_0000_0000;
const IOMAP_RKEY: u32 = 0x300;

enum Payload {
    Bytes(Vec<u8>),
    Ring {
        offset: u32,
        first: u32,
        second: u32,
    },
}

struct InFlight {
    remote_addr: u64,
    rkey: u32,
    imm: Option<u32>,
    payload: Payload,
    wr_id: u64,
    // The count to write into the peer's word after the bytes (address, key, count).
    word: Option<(u64, u32, u64)>,
}

struct Pair {
    sides: [Side; 2],
    // wire[i]: posted by side i, not yet delivered.
    wire: [VecDeque<InFlight>; 2],
}

fn byte_at(pos: u64) -> u8 {
    (pos.wrapping_mul(0x9e37_79b9) >> 13) as u8
}

impl Pair {
    fn new(cfg: [Config; 2]) -> Pair {
        let mut sides = [0, 1].map(|i| {
            let c = cfg[i].normalized().unwrap();
            Side {
                core: StreamCore::new(c, regions(i)),
                rbuf: vec![0; c.rbuf_size as usize],
                target: vec![0; c.target_area_len()],
                sbuf: vec![0; c.sbuf_size as usize],
                iomap_region: vec![0; 4096],
                recv_posted: u32::from(c.rq_size),
                next_send_byte: 0,
                next_recv_byte: 0,
                early: false,
                take_before_message: false,
                word: false,
            }
        });
        let d0 = ConnData::parse(&sides[0].core.conn_data().to_bytes()).unwrap();
        let d1 = ConnData::parse(&sides[1].core.conn_data().to_bytes()).unwrap();
        sides[0].core.handle_connected(&d1);
        sides[1].core.handle_connected(&d0);
        Pair {
            sides,
            wire: [VecDeque::new(), VecDeque::new()],
        }
    }

    /// Side `i` offers a "bytes placed" word (16 bytes after its target area's slots);
    /// the other side is told where, as by the connection data's extension.
    fn offer_word(&mut self, i: usize) {
        let side = &mut self.sides[i];
        let at = side.core.config().placed_word_offset();
        side.target.resize(at + PLACED_WORD_LEN, 0);
        side.core.set_placed_word(true);
        side.word = true;
        let r = regions(i);
        let ad = PlacedWordAd {
            addr: r.target_addr + at as u64,
            key: r.target_rkey,
        };
        self.sides[1 - i].core.set_peer_placed_word(Some(ad));
    }

    /// Side `i` reads its word (the check, then the count) and tells its core.
    fn look_at_word(&mut self, i: usize) {
        let side = &mut self.sides[i];
        if !side.word {
            return;
        }
        let at = side.core.config().placed_word_offset();
        let check = u64::from_ne_bytes(side.target[at + 8..at + 16].try_into().unwrap());
        let count = u64::from_ne_bytes(side.target[at..at + 8].try_into().unwrap());
        if let Some(count) = placed_word_count(count, check) {
            side.core.note_placed(count);
        }
    }

    /// A nonblocking send of up to `len` bytes; returns what was taken.
    fn send(&mut self, i: usize, len: usize) -> usize {
        // Control first; a due announcement goes with the data (`start_data` merges it).
        self.pump_ctrl(i);
        let mut chunks = SendChunks::default();
        let mut done = 0;
        while done < len {
            let want = chunks.next(len - done);
            let side = &mut self.sides[i];
            let Some(w) = side.core.start_data(want) else {
                break;
            };
            let bytes: Vec<u8> = (0..w.len as u64)
                .map(|k| byte_at(side.next_send_byte + k))
                .collect();
            side.next_send_byte += u64::from(w.len);
            if w.imm.is_none() {
                side.core.note_held_tail_byte(*bytes.last().unwrap());
            }
            let mut wr_id = w.wr_id;
            let word = side.core.placed_word_after(&w);
            let payload = match w.stage {
                SendStage::Inline => Payload::Bytes(bytes),
                SendStage::Ring { .. } if side.early => {
                    wr_id = side.core.unstage(&w);
                    Payload::Bytes(bytes)
                }
                SendStage::Ring {
                    offset,
                    first,
                    second,
                } => {
                    let (o, f) = (offset as usize, first as usize);
                    side.sbuf[o..o + f].copy_from_slice(&bytes[..f]);
                    side.sbuf[..second as usize].copy_from_slice(&bytes[f..]);
                    Payload::Ring {
                        offset,
                        first,
                        second,
                    }
                }
            };
            self.wire[i].push_back(InFlight {
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                imm: w.imm,
                payload,
                wr_id,
                word,
            });
            done += w.len as usize;
        }
        done
    }

    /// Reads up to `max` bytes at side `i`, checking each.
    fn recv(&mut self, i: usize, max: usize) -> usize {
        self.look_at_word(i);
        let side = &mut self.sides[i];
        let mut got = 0;
        while got < max {
            let Some(chunk) = side.core.recv_chunk() else {
                break;
            };
            let n = chunk.len.min((max - got) as u32);
            for k in 0..n {
                let b = side.rbuf[(chunk.offset + k) as usize];
                assert_eq!(
                    b,
                    byte_at(side.next_recv_byte),
                    "side {i} byte {}",
                    side.next_recv_byte
                );
                side.next_recv_byte += 1;
            }
            side.core.consume(n);
            got += n as usize;
        }
        self.pump(i);
        got
    }

    /// Posts what side `i`'s core wants posted (credits, control, iomap, an announcement
    /// of held data once nothing announced is in flight).
    fn pump(&mut self, i: usize) {
        self.announce(i, false);
        self.pump_ctrl(i);
    }

    /// Posts side `i`'s credits, control and iomap messages.
    fn pump_ctrl(&mut self, i: usize) {
        let side = &mut self.sides[i];
        while let Some(c) = side.core.poll_iomap() {
            self.wire[i].push_back(ctrl(c));
        }
        while let Some(c) = side.core.poll_ctrl() {
            self.wire[i].push_back(ctrl(c));
        }
    }

    /// Posts side `i`'s announcement of held bytes, if one is due (`now`: whatever is in
    /// flight, as the device's completion hook does).
    fn announce(&mut self, i: usize, now: bool) {
        let side = &mut self.sides[i];
        if let Some(a) = side.core.poll_announcement(now) {
            self.wire[i].push_back(InFlight {
                remote_addr: a.remote_addr,
                rkey: a.rkey,
                imm: Some(a.imm),
                payload: Payload::Bytes(vec![a.byte]),
                wr_id: a.wr_id,
                word: None,
            });
        }
    }

    /// Delivers up to `n` messages posted by side `i`; returns how many went.
    fn deliver(&mut self, i: usize, n: usize) -> usize {
        let j = 1 - i;
        for k in 0..n {
            let Some(m) = self.wire[i].front() else {
                return k;
            };
            if m.imm.is_some() && self.sides[j].recv_posted == 0 {
                return k; // RNR: the peer has not reposted yet
            }
            let m = self.wire[i].pop_front().unwrap();
            let bytes = match m.payload {
                Payload::Bytes(b) => b,
                Payload::Ring {
                    offset,
                    first,
                    second,
                } => {
                    let s = &self.sides[i].sbuf;
                    let o = offset as usize;
                    let mut b = s[o..o + first as usize].to_vec();
                    b.extend_from_slice(&s[..second as usize]);
                    b
                }
            };
            if !bytes.is_empty() {
                let peer = &mut self.sides[j];
                let r = regions(j);
                let (base, mem) = if m.rkey == r.rbuf_rkey {
                    (r.rbuf_addr, &mut peer.rbuf)
                } else if m.rkey == r.target_rkey {
                    (r.target_addr, &mut peer.target)
                } else if m.rkey == IOMAP_RKEY {
                    (IOMAP_ADDR, &mut peer.iomap_region)
                } else {
                    panic!("write with unknown rkey {:#x}", m.rkey);
                };
                let off = m
                    .remote_addr
                    .checked_sub(base)
                    .expect("write below the region") as usize;
                assert!(
                    off + bytes.len() <= mem.len(),
                    "write of {} at {off} past a region of {}",
                    bytes.len(),
                    mem.len()
                );
                mem[off..off + bytes.len()].copy_from_slice(&bytes);
            }
            if let Some((addr, key, count)) = m.word {
                // After the bytes, the count and its check, into the word the peer offered.
                let peer = &mut self.sides[j];
                let r = regions(j);
                assert_eq!(key, r.target_rkey, "the word is in the target area");
                let at = (addr - r.target_addr) as usize;
                assert!(peer.word && at + PLACED_WORD_LEN <= peer.target.len());
                peer.target[at..at + 8].copy_from_slice(&count.to_ne_bytes());
                peer.target[at + 8..at + 16]
                    .copy_from_slice(&placed_word_check(count).to_ne_bytes());
            }
            if let Some(imm) = m.imm {
                if self.sides[j].take_before_message {
                    self.take_grant(j);
                }
                let peer = &mut self.sides[j];
                peer.recv_posted -= 1;
                peer.core
                    .handle_recv(Some(imm), bytes.len() as u32, &peer.target)
                    .expect("a well-behaved peer");
                if let Some(at) = peer.core.take_slot_to_clear() {
                    peer.target[at..at + RS_SGE_LEN].fill(0);
                }
                if peer.core.is_connected() {
                    peer.recv_posted += 1;
                }
            }
            self.sides[i]
                .core
                .handle_send_completion(m.wr_id, true)
                .unwrap();
            self.pump(j);
        }
        n
    }

    /// Side `i` looks for a grant in its target area (early room), clearing its slot.
    fn take_grant(&mut self, i: usize) {
        let side = &mut self.sides[i];
        if let Some(at) = side.core.awaited_grant_slot() {
            if side
                .core
                .take_grant_from_area(&side.target[at..at + RS_SGE_LEN])
            {
                side.target[at..at + RS_SGE_LEN].fill(0);
            }
        }
    }

    /// Runs both directions and both readers until nothing moves.
    fn settle(&mut self) {
        loop {
            let mut moved = 0;
            for i in 0..2 {
                self.pump(i);
                moved += self.deliver(i, usize::MAX);
                moved += self.recv(i, usize::MAX);
            }
            if moved == 0 {
                return;
            }
        }
    }
}

fn ctrl(c: CtrlWrite) -> InFlight {
    InFlight {
        remote_addr: c.remote_addr,
        rkey: c.rkey,
        imm: c.imm,
        payload: Payload::Bytes(c.payload),
        wr_id: c.wr_id,
        word: None,
    }
}

fn cfg(sq: u16, rq: u16, rbuf: u32, sbuf: u32, inline: u32) -> Config {
    Config {
        sq_size: sq,
        rq_size: rq,
        rbuf_size: rbuf,
        sbuf_size: sbuf,
        inline_size: inline,
        iomap_size: 1,
    }
}

#[derive(Debug, Clone)]
enum Step {
    Send(usize, usize),
    Recv(usize, usize),
    Deliver(usize, usize),
    Announce(usize),
    TakeGrant(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..2usize, 1..40_000usize).prop_map(|(s, n)| Step::Send(s, n)),
        (0..2usize, 1..40_000usize).prop_map(|(s, n)| Step::Recv(s, n)),
        (0..2usize, 1..50usize).prop_map(|(s, n)| Step::Deliver(s, n)),
        (0..2usize).prop_map(Step::Announce),
        (0..2usize).prop_map(Step::TakeGrant),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (
        16..40u16,
        16..40u16,
        prop_oneof![Just(4096u32), Just(10_000), Just(65_536), Just(131_072)],
        prop_oneof![Just(2048u32), Just(5000), Just(65_536)],
        prop_oneof![Just(0u32), Just(64), Just(3000)],
    )
        .prop_map(|(sq, rq, rbuf, sbuf, inline)| cfg(sq, rq, rbuf, sbuf, inline))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Whatever the sizes and interleaving: every byte arrives once, in order, nothing is
    /// written outside a registered region, and once both sides drain, every send completed
    /// and nothing is left unread.
    #[test]
    fn streams_arrive_intact(
        c0 in config(),
        c1 in config(),
        coalesce in any::<[bool; 2]>(),
        early in any::<[(bool, bool); 2]>(),
        word in any::<[bool; 2]>(),
        steps in prop::collection::vec(step(), 1..120),
    ) {
        let mut p = Pair::new([c0, c1]);
        for (i, on) in word.into_iter().enumerate() {
            if on {
                p.offer_word(i);
            }
        }
        for ((side, on), (early, first)) in p.sides.iter_mut().zip(coalesce).zip(early) {
            side.core.set_coalescing(on);
            side.core.set_early_grants(early);
            side.early = early;
            side.take_before_message = early && first;
        }
        for s in steps {
            match s {
                Step::Send(i, n) => { p.send(i, n); }
                Step::Recv(i, n) => { p.recv(i, n); }
                Step::Deliver(i, n) => { p.deliver(i, n); }
                Step::Announce(i) => p.announce(i, true),
                Step::TakeGrant(i) => p.take_grant(i),
            }
        }
        p.settle();
        for i in 0..2 {
            let j = 1 - i;
            prop_assert_eq!(p.sides[j].next_recv_byte, p.sides[i].next_send_byte);
            prop_assert!(p.sides[i].core.all_sends_done());
            prop_assert_eq!(p.sides[i].core.available(), 0);
            // And the pipe still flows afterwards.
            let sent = p.send(i, 3000);
            prop_assert!(sent > 0, "side {} cannot send after draining", i);
        }
    }
}

#[test]
fn a_megabyte_through_small_rings() {
    let mut p = Pair::new([cfg(16, 16, 4096, 2048, 0), cfg(16, 16, 4096, 2048, 0)]);
    let total = 1 << 20;
    let mut sent = 0;
    while sent < total {
        sent += p.send(0, total - sent);
        p.settle();
    }
    assert_eq!(p.sides[1].next_recv_byte, total as u64);
}

#[test]
fn shutdown_write_gives_the_peer_eof_after_the_data() {
    let mut p = Pair::new([Config::default(), Config::default()]);
    assert_eq!(p.send(0, 5000), 5000);
    p.sides[0].core.shutdown(Shutdown::Write);
    p.pump(0);
    p.deliver(0, usize::MAX);
    // The data is still readable, then EOF.
    assert!(p.sides[1].core.read_ready());
    assert!(!p.sides[1].core.is_readable());
    assert_eq!(p.recv(1, usize::MAX), 5000);
    assert!(p.sides[1].core.read_ready() && p.sides[1].core.recv_chunk().is_none());
    // The other direction still works.
    assert_eq!(p.send(1, 100), 100);
    p.settle();
    assert_eq!(p.sides[0].next_recv_byte, 100);
    // Side 1 closes too: DISCONNECT, both ends see the end.
    p.sides[1].core.shutdown(Shutdown::Both);
    p.settle();
    assert!(!p.sides[0].core.is_connected());
    assert!(!p.sides[1].core.is_connected());
}

#[test]
fn riowrite_lands_in_the_published_region() {
    let mut p = Pair::new([cfg(384, 384, 131_072, 131_072, 64), Config::default()]);
    // Side 1 maps 4096 bytes at offset 1 << 20 into side 0's iomap slot 0.
    assert!(p.sides[1].core.queue_iomap(
        0,
        IomapEntry {
            offset: 1 << 20,
            sge: RsSge {
                addr: IOMAP_ADDR,
                key: IOMAP_RKEY,
                length: 4096,
            },
        },
    ));
    assert!(
        !p.sides[1].core.queue_iomap(1, IomapEntry::default()),
        "one slot"
    );
    p.pump(1);
    p.settle();
    let e = p.sides[0].core.peer_iomap_entry((1 << 20) + 100).unwrap();
    assert_eq!(e.sge.addr, IOMAP_ADDR);
    // riowrite of 200 bytes at offset +4000 is cut at the mapping's end.
    let w = p.sides[0]
        .core
        .start_riowrite((1 << 20) + 4000, 200)
        .unwrap();
    assert_eq!((w.len, w.remote_addr, w.imm), (96, IOMAP_ADDR + 4000, None));
    p.wire[0].push_back(InFlight {
        remote_addr: w.remote_addr,
        rkey: w.rkey,
        imm: w.imm,
        payload: Payload::Bytes(vec![0xab; 96]),
        wr_id: w.wr_id,
        word: None,
    });
    p.settle();
    assert!(p.sides[1].iomap_region[4000..].iter().all(|&b| b == 0xab));
    assert!(p.sides[1].iomap_region[..4000].iter().all(|&b| b == 0));
    assert!(p.sides[0].core.all_sends_done());
    assert_eq!(p.sides[0].core.start_riowrite(1 << 21, 10), None);
}

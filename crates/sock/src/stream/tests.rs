use super::*;

fn regions() -> LocalRegions {
    LocalRegions {
        rbuf_addr: 0x1000_0000,
        rbuf_rkey: 0x11,
        target_addr: 0x2000_0000,
        target_rkey: 0x22,
    }
}

fn small() -> Config {
    Config {
        sq_size: 16,
        rq_size: 16,
        rbuf_size: 8192,
        sbuf_size: 4096,
        inline_size: 64,
        iomap_size: 2,
    }
}

fn connected(cfg: Config) -> StreamCore {
    let mut a = StreamCore::new(cfg, regions());
    let b = StreamCore::new(cfg, regions());
    a.handle_connected(&b.conn_data());
    a
}

#[test]
fn advertises_what_rsocket_expects() {
    let core = StreamCore::new(Config::default(), regions());
    let d = core.conn_data();
    assert_eq!(d.flags & CONN_FLAG_IOMAP, CONN_FLAG_IOMAP);
    assert_eq!(d.credits, 384);
    assert_eq!(d.target_sgl.length, 2);
    // The first half of the receive ring.
    assert_eq!(d.data_buf.length, DEFAULT_RING / 2);
    assert_eq!(d.data_buf.addr, 0x1000_0000);
}

#[test]
fn first_write_goes_to_the_peer_data_buf_and_grants_follow_in_slot_one() {
    let mut a = connected(small());
    let w = a.start_data(100).unwrap();
    assert_eq!(w.remote_addr, 0x1000_0000);
    assert_eq!(w.rkey, 0x11);
    assert_eq!(w.imm, Some(100));
    assert_eq!(
        w.stage,
        SendStage::Ring {
            offset: 0,
            first: 100,
            second: 0
        }
    );
    // The first credit update grants the second half into the peer's slot 1.
    let c = a.poll_ctrl().unwrap();
    assert_eq!(c.remote_addr, 0x2000_0000 + 16);
    assert_eq!(c.imm, Some(Msg::Sgl(16).to_imm()));
    assert_eq!(
        RsSge::read(&c.payload, SgeOrder::Little),
        Some(RsSge {
            addr: 0x1000_0000 + 4096,
            key: 0x11,
            length: 4096
        })
    );
    // No more to give until data is read.
    assert_eq!(a.poll_ctrl(), None);
}

#[test]
fn a_write_never_crosses_a_grant_and_stops_without_credits() {
    let mut a = connected(Config {
        rq_size: 16,
        ..small()
    });
    // 4096 bytes granted: two writes of 4000 and 96, then the grant is used up.
    assert_eq!(a.start_data(4000).unwrap().len, 4000);
    let w = a.start_data(4000);
    assert!(w.is_none(), "send ring full until completions: {w:?}");
    a.handle_send_completion(WrKind::Data(4000).to_wr_id(), true)
        .unwrap();
    assert_eq!(a.start_data(4000).unwrap().len, 96);
    assert!(!a.can_send(), "no grant left");
}

#[test]
fn credits_bound_the_messages_in_flight() {
    let mut a = connected(Config {
        sq_size: 64,
        ..small()
    });
    let mut sent = 0;
    while let Some(w) = a.start_data(1) {
        a.handle_send_completion(w.wr_id, true).unwrap();
        sent += 1;
    }
    assert_eq!(sent, 16, "the peer granted rq_size credits");
    // A credit update (no buffer) raises the limit.
    let area = vec![0u8; small().target_area_len()];
    a.handle_recv(Some(Msg::Sgl(20).to_imm()), 0, &area)
        .unwrap();
    assert!(a.can_send());
}

#[test]
fn send_ring_wraps_into_two_pieces() {
    let mut a = connected(Config {
        sbuf_size: 4096,
        ..small()
    });
    let w = a.start_data(3000).unwrap();
    a.handle_send_completion(w.wr_id, true).unwrap();
    let w = a.start_data(1000).unwrap();
    assert_eq!(
        w.stage,
        SendStage::Ring {
            offset: 3000,
            first: 1000,
            second: 0
        }
    );
    a.handle_send_completion(w.wr_id, true).unwrap();
    let w = a.start_data(96).unwrap();
    assert_eq!(
        w.stage,
        SendStage::Ring {
            offset: 4000,
            first: 96,
            second: 0
        }
    );
}

#[test]
fn hostile_data_lengths_end_the_connection() {
    let mut a = connected(small());
    let area = vec![0u8; small().target_area_len()];
    // 4096 bytes are granted at first.
    let e = a.handle_recv(Some(Msg::Data(4097).to_imm()), 4097, &area);
    assert_eq!(
        e,
        Err(ProtocolError::DataBeyondGrant {
            len: 4097,
            room: 4096
        })
    );
    assert!(!a.is_connected());
    assert!(a.read_ready(), "a reader sees the end at once");
    assert_eq!(a.recv_chunk(), None);
}

#[test]
fn peeking_spans_every_queued_message_and_leaves_them() {
    let mut a = connected(small());
    let area = vec![0u8; small().target_area_len()];
    for len in [100, 200, 50] {
        a.handle_recv(Some(Msg::Data(len).to_imm()), len, &area)
            .unwrap();
    }
    let chunk = |offset, len| RecvChunk { offset, len };
    assert_eq!(
        a.peek_chunks(1000),
        [chunk(0, 100), chunk(100, 200), chunk(300, 50)]
    );
    assert_eq!(a.peek_chunks(250), [chunk(0, 100), chunk(100, 150)]);
    assert_eq!(a.peek_chunks(0), []);
    // Peeking took nothing; a partly read message peeks from where reading stopped.
    assert_eq!(a.available(), 350);
    a.consume(40);
    assert_eq!(
        a.peek_chunks(usize::MAX),
        [chunk(40, 60), chunk(100, 200), chunk(300, 50)]
    );
}

#[test]
fn more_messages_than_credits_end_the_connection() {
    let mut a = connected(small());
    let area = vec![0u8; small().target_area_len()];
    for _ in 0..16 {
        a.handle_recv(Some(Msg::Data(1).to_imm()), 1, &area)
            .unwrap();
    }
    assert_eq!(
        a.handle_recv(Some(Msg::Data(1).to_imm()), 1, &area),
        Err(ProtocolError::TooManyMessages)
    );
}

#[test]
fn iomap_index_and_area_are_checked() {
    let mut a = connected(small());
    let area = vec![0u8; small().target_area_len()];
    assert_eq!(
        a.handle_recv(Some(Msg::IomapSgl(2).to_imm()), 24, &area),
        Err(ProtocolError::IomapIndex(2))
    );
    let mut a = connected(small());
    assert_eq!(
        a.handle_recv(Some(Msg::IomapSgl(1).to_imm()), 24, &area[..40]),
        Err(ProtocolError::TargetArea)
    );
    let mut a = connected(small());
    assert_eq!(
        a.handle_recv(None, 0, &area),
        Err(ProtocolError::NoImmediate)
    );
}

#[test]
fn shutdown_rules_follow_rsocket() {
    let mut a = connected(small());
    a.shutdown(Shutdown::Write);
    assert!(!a.is_writable() && a.is_readable());
    let c = a.poll_ctrl().unwrap();
    assert_eq!(c.imm, Some(Msg::Ctrl(Ctrl::Shutdown).to_imm()));
    assert!(a.write_ready(), "a write fails at once");
    a.shutdown(Shutdown::Write);
    assert_eq!(
        a.poll_ctrl().map(|c| c.imm),
        Some(Some(Msg::Sgl(16).to_imm())),
        "no second SHUTDOWN"
    );
    assert_eq!(a.start_data(10), None);

    // SHUT_RD while writable sends nothing.
    let mut b = connected(small());
    b.shutdown(Shutdown::Read);
    assert!(!b.is_readable() && b.is_writable());
    assert_eq!(
        b.poll_ctrl().map(|c| c.imm),
        Some(Some(Msg::Sgl(16).to_imm()))
    );

    // Receiving SHUTDOWN while writable: EOF for reads, writes go on.
    let mut c = connected(small());
    c.handle_recv(Some(Msg::Ctrl(Ctrl::Shutdown).to_imm()), 0, &[])
        .unwrap();
    assert!(!c.is_readable() && c.is_writable() && c.read_ready());

    // The DISCONNECT's completion ends the connection.
    let mut d = connected(small());
    d.shutdown(Shutdown::Both);
    let w = d.poll_ctrl().unwrap();
    assert_eq!(w.imm, Some(Msg::Ctrl(Ctrl::Disconnect).to_imm()));
    assert!(d.is_connected());
    d.handle_send_completion(w.wr_id, true).unwrap();
    assert!(!d.is_connected() && d.all_sends_done());
}

#[test]
fn keepalive_is_a_plain_zero_length_write_on_a_control_slot() {
    let mut a = connected(small());
    a.set_keepalive(Some(Duration::from_secs(10)), Duration::ZERO);
    assert_eq!(a.poll_keepalive(Duration::from_secs(9)), None);
    let k = a.poll_keepalive(Duration::from_secs(10)).unwrap();
    assert_eq!(k.imm, None);
    assert!(k.payload.is_empty() && k.remote_addr == 0 && k.rkey == 0);
    assert_eq!(a.next_keepalive(), Some(Duration::from_secs(20)));
    assert!(!a.all_sends_done());
    a.handle_send_completion(k.wr_id, true).unwrap();
    assert!(a.all_sends_done());
}

#[test]
fn failed_send_is_an_error_and_unknown_ids_are_refused() {
    let mut a = connected(small());
    let w = a.start_data(10).unwrap();
    assert_eq!(
        a.handle_send_completion(w.wr_id, false),
        Err(ProtocolError::Transport)
    );
    assert_eq!(a.error(), Some(ProtocolError::Transport));
    assert!(a.handle_send_completion(9 << 32, true).is_err());
}

#[test]
fn chunks_double_from_2048_to_the_maximum() {
    let mut c = SendChunks::default();
    let sizes: Vec<u32> = (0..8).map(|_| c.next(1 << 20)).collect();
    assert_eq!(sizes, [2048, 4096, 8192, 16384, 32768, 65536, 65536, 65536]);
    assert_eq!(c.next(100), 100);
}

#[test]
fn coalescing_holds_writes_behind_one_in_flight_and_announces_them_once() {
    let mut c = connected(small());
    c.set_coalescing(true);
    let credits = |c: &StreamCore| c.sseq_comp.wrapping_sub(c.sseq_no);
    let before = credits(&c);
    // Nothing in flight: the first write goes announced at once.
    let first = c.start_data(100).unwrap();
    assert_eq!(first.imm, Some(Msg::Data(100).to_imm()));
    // Behind it, plain writes; the first of them reserves the announcement's credit.
    let a = c.start_data(200).unwrap();
    let b = c.start_data(300).unwrap();
    assert_eq!((a.imm, b.imm), (None, None));
    assert_eq!(b.remote_addr, a.remote_addr + 200);
    assert_eq!(credits(&c), before - 2);
    assert_eq!(c.held_bytes(), 500);
    // Not due while the first is in flight, unless asked for now.
    assert_eq!(c.poll_announcement(false), None);
    c.handle_send_completion(first.wr_id, true).unwrap();
    let ann = c.poll_announcement(false).unwrap();
    assert_eq!(ann.imm, Msg::Data(500).to_imm());
    assert_eq!(
        ann.remote_addr,
        b.remote_addr + 299,
        "rewrites the last held byte"
    );
    assert_eq!(c.held_bytes(), 0);
    assert_eq!(c.poll_announcement(true), None, "announced once");
    // While the announcement is in flight, the next write is held again.
    let d = c.start_data(10).unwrap();
    assert_eq!(d.imm, None);
    for w in [a.wr_id, b.wr_id, ann.wr_id, d.wr_id] {
        c.handle_send_completion(w, true).unwrap();
    }
    let ann2 = c.poll_announcement(false).unwrap();
    assert_eq!(ann2.imm, Msg::Data(10).to_imm());
    c.handle_send_completion(ann2.wr_id, true).unwrap();
    assert!(c.all_sends_done());
    // Everything completed: the next write goes announced at once again.
    assert!(c.start_data(1).unwrap().imm.is_some());
}

#[test]
fn without_coalescing_every_write_is_announced() {
    let mut c = connected(small());
    let first = c.start_data(100).unwrap();
    let second = c.start_data(100).unwrap();
    assert!(first.imm.is_some() && second.imm.is_some());
    assert_eq!(c.poll_announcement(true), None);
}

#[test]
fn a_write_after_the_one_in_flight_completed_announces_the_held_bytes_itself() {
    let mut c = connected(small());
    c.set_coalescing(true);
    let first = c.start_data(100).unwrap();
    let held = c.start_data(200).unwrap();
    assert_eq!(held.imm, None);
    c.handle_send_completion(first.wr_id, true).unwrap();
    c.handle_send_completion(held.wr_id, true).unwrap();
    // Due now; the next write carries it: one WRITE WITH IMM of 300 + 50 bytes.
    let next = c.start_data(50).unwrap();
    assert_eq!(next.imm, Some(Msg::Data(250).to_imm()));
    assert_eq!(c.held_bytes(), 0);
    assert_eq!(c.poll_announcement(true), None);
    c.handle_send_completion(next.wr_id, true).unwrap();
    assert!(c.all_sends_done(), "the reservation's entry came back");
}

/// The grant the peer of `connected(small())` gives next into slot `slot`, as bytes.
fn grant_bytes(addr: u64) -> [u8; RS_SGE_LEN] {
    RsSge {
        addr,
        key: 0x11,
        length: 4096,
    }
    .to_bytes(SgeOrder::Little)
}

#[test]
fn an_early_grant_is_taken_once_and_its_message_then_gives_credits_only() {
    let mut a = connected(small());
    a.set_early_grants(true);
    // The peer's first half is used up.
    assert_eq!(a.start_data(4096).unwrap().len, 4096);
    a.handle_send_completion(WrKind::Data(4096).to_wr_id(), true)
        .unwrap();
    assert!(!a.can_send());
    // The peer's grant of its second half lands in slot 1 before its message.
    assert_eq!(a.awaited_grant_slot(), Some(RS_SGE_LEN));
    assert!(!a.take_grant_from_area(&[0; RS_SGE_LEN]), "an empty slot");
    assert!(a.take_grant_from_area(&grant_bytes(0x1000_0000 + 4096)));
    assert!(a.can_send());
    let w = a.start_data(100).unwrap();
    assert_eq!(w.remote_addr, 0x1000_0000 + 4096);
    // The message arrives later: its slot (cleared, or by now the next grant) is not
    // read again; its credits count.
    let mut area = vec![0u8; small().target_area_len()];
    area[RS_SGE_LEN..2 * RS_SGE_LEN].copy_from_slice(&grant_bytes(0x1000_0000 + 4096));
    a.handle_recv(Some(Msg::Sgl(40).to_imm()), 16, &area)
        .unwrap();
    assert_eq!(a.take_slot_to_clear(), None);
    assert_eq!(a.sseq_comp, 40);
    // Only 3996 bytes left in that grant: nothing was granted twice.
    assert_eq!(a.start_data(8192).unwrap().len, 3996);
    assert!(!a.can_send());
    // The next grant (slot 0) comes by its message: read, and its slot to clear.
    area[..RS_SGE_LEN].copy_from_slice(&grant_bytes(0x1000_0000));
    a.handle_recv(Some(Msg::Sgl(41).to_imm()), 16, &area)
        .unwrap();
    assert_eq!(a.take_slot_to_clear(), Some(0));
    assert_eq!(a.awaited_grant_slot(), Some(RS_SGE_LEN));
}

#[test]
fn only_a_whole_half_of_the_peer_ring_is_taken_as_a_grant() {
    let mut a = connected(small());
    a.set_early_grants(true);
    let good = grant_bytes(0x1000_0000 + 4096);
    // A torn slot (part of it still the cleared zeroes), another key, length or address.
    let mut torn = good;
    torn[0..4].fill(0);
    let mut other_key = good;
    other_key[8] = 0x12;
    let mut short = good;
    short[12] = 0xFF;
    let odd = grant_bytes(0x1000_0000 + 100);
    for slot in [torn, other_key, short, odd] {
        assert!(!a.take_grant_from_area(&slot), "{slot:?}");
    }
    assert!(a.take_grant_from_area(&good));
    // Off: never.
    let mut b = connected(small());
    assert_eq!(b.awaited_grant_slot(), None);
    assert!(!b.take_grant_from_area(&good));
}

#[test]
fn an_unstaged_write_gives_its_send_ring_back_at_once() {
    let mut a = connected(Config {
        sbuf_size: 4096,
        ..small()
    });
    let w = a.start_data(4000).unwrap();
    assert!(a.start_data(4000).is_none(), "send ring used up");
    let id = a.unstage(&w);
    assert_ne!(id, w.wr_id);
    // Its completion gives back nothing more.
    a.handle_send_completion(id, true).unwrap();
    assert_eq!(a.sbuf_bytes_avail, 4096);
    assert_eq!(
        a.start_data(96).unwrap().stage,
        SendStage::Ring {
            offset: 0,
            first: 96,
            second: 0
        }
    );
    // A write that must be staged after all takes its bytes again.
    let mut b = connected(small());
    let w = b.start_data(3000).unwrap();
    let _ = b.unstage(&w);
    b.restage(&w);
    assert_eq!(b.sbuf_bytes_avail, 4096 - 3000);
    b.handle_send_completion(w.wr_id, true).unwrap();
    assert_eq!(b.sbuf_bytes_avail, 4096);
}

/// A reader with the "bytes placed" word offered.
fn word_reader() -> StreamCore {
    let mut a = connected(small());
    a.set_placed_word(true);
    a
}

fn data(a: &mut StreamCore, len: u32) -> Result<(), ProtocolError> {
    a.handle_recv(Some(Msg::Data(len).to_imm()), len, &[])
}

#[test]
fn bytes_read_ahead_are_the_first_of_their_message_when_it_arrives() {
    let mut a = word_reader();
    assert!(!a.read_ready());
    assert!(a.note_placed(300));
    assert!(a.read_ready());
    assert_eq!(a.available(), 300);
    assert_eq!(
        a.recv_chunk(),
        Some(RecvChunk {
            offset: 0,
            len: 300
        })
    );
    a.consume(200);
    assert_eq!(
        a.recv_chunk(),
        Some(RecvChunk {
            offset: 200,
            len: 100
        })
    );
    // The message of the 300: only its last 100 are left to read, once.
    data(&mut a, 300).unwrap();
    assert_eq!(a.available(), 100);
    assert_eq!(
        a.recv_chunk(),
        Some(RecvChunk {
            offset: 200,
            len: 100
        })
    );
    a.consume(100);
    assert_eq!(a.recv_chunk(), None);
    assert!(!a.read_ready());
    assert_eq!(
        a.take_ahead_stats(),
        AheadStats {
            bytes: 200,
            whole_messages: 0,
            announced_messages: 1
        }
    );
    assert_eq!(a.take_ahead_stats(), AheadStats::default());
}

#[test]
fn a_message_wholly_read_ahead_gives_its_credit_back_at_once() {
    let mut a = word_reader();
    // The first credit update (the second half) goes at once, as ever.
    assert_eq!(
        a.poll_ctrl().map(|c| c.imm),
        Some(Some(Msg::Sgl(16).to_imm()))
    );
    // 8 messages of 100 bytes, all read before any arrives: each then counts read at
    // once, and half the credits used means a credit update is due (8 + 16).
    assert!(a.note_placed(800));
    a.consume(800);
    assert_eq!(
        a.poll_ctrl(),
        None,
        "no half free, no half of the credits used"
    );
    for _ in 0..8 {
        data(&mut a, 100).unwrap();
        assert!(!a.read_ready());
    }
    assert_eq!(a.available(), 0);
    assert_eq!(
        a.poll_ctrl().map(|c| c.imm),
        Some(Some(Msg::Sgl(24).to_imm()))
    );
    assert_eq!(a.take_ahead_stats().whole_messages, 8);
    // 150 read ahead: a message of 100 wholly, then 50 of one of 250.
    assert!(a.note_placed(950));
    a.consume(150);
    data(&mut a, 100).unwrap();
    data(&mut a, 250).unwrap();
    assert_eq!(
        a.recv_chunk(),
        Some(RecvChunk {
            offset: 950,
            len: 200
        })
    );
    assert_eq!(
        a.take_ahead_stats(),
        AheadStats {
            bytes: 150,
            whole_messages: 1,
            announced_messages: 1
        }
    );
}

#[test]
fn the_word_is_believed_only_within_the_room_granted_and_when_offered() {
    let mut a = word_reader();
    // 4096 granted (the first half): a larger count is torn or a peer's lie.
    assert!(!a.note_placed(4097));
    assert_eq!(a.available(), 0);
    assert!(a.note_placed(4096));
    assert!(!a.note_placed(10), "a count never goes back");
    assert_eq!(a.available(), 4096);
    // Queued messages are read first; the word's bytes after them.
    let mut b = word_reader();
    data(&mut b, 100).unwrap();
    assert!(b.note_placed(300));
    assert_eq!(b.available(), 100);
    assert_eq!(
        b.recv_chunk(),
        Some(RecvChunk {
            offset: 0,
            len: 100
        })
    );
    b.consume(100);
    assert_eq!(
        b.recv_chunk(),
        Some(RecvChunk {
            offset: 100,
            len: 200
        })
    );
    // Without the word offered, a value is ignored.
    let mut c = connected(small());
    assert!(!c.note_placed(100));
    assert!(!c.read_ready());
    assert_eq!(c.recv_chunk(), None);
}

#[test]
fn reading_ahead_wraps_the_ring() {
    let mut a = word_reader();
    a.poll_ctrl().unwrap();
    data(&mut a, 4096).unwrap();
    data(&mut a, 3904).unwrap();
    while let Some(c) = a.recv_chunk() {
        a.consume(c.len);
    }
    // The first half is free again: granted.
    assert!(a.poll_ctrl().is_some());
    assert!(a.note_placed(8000 + 300));
    assert_eq!(
        a.recv_chunk(),
        Some(RecvChunk {
            offset: 8000,
            len: 192
        })
    );
    a.consume(192);
    assert_eq!(
        a.recv_chunk(),
        Some(RecvChunk {
            offset: 0,
            len: 108
        })
    );
    let chunk = |offset, len| RecvChunk { offset, len };
    assert_eq!(a.peek_chunks(1000), [chunk(0, 108)]);
    a.consume(108);
    data(&mut a, 300).unwrap();
    assert!(!a.read_ready());
}

#[test]
fn end_of_stream_after_bytes_read_ahead() {
    // Everything read ahead, then the message and the SHUTDOWN: EOF, nothing more.
    let mut a = word_reader();
    assert!(a.note_placed(100));
    a.consume(100);
    data(&mut a, 100).unwrap();
    a.handle_recv(Some(Msg::Ctrl(Ctrl::Shutdown).to_imm()), 0, &[])
        .unwrap();
    assert!(a.read_ready() && !a.is_readable());
    assert_eq!(a.recv_chunk(), None);
    assert_eq!(a.available(), 0);
    // Part read ahead: the rest of the message is read before the end.
    let mut b = word_reader();
    assert!(b.note_placed(100));
    b.consume(60);
    data(&mut b, 100).unwrap();
    b.handle_recv(Some(Msg::Ctrl(Ctrl::Shutdown).to_imm()), 0, &[])
        .unwrap();
    assert_eq!(
        b.recv_chunk(),
        Some(RecvChunk {
            offset: 60,
            len: 40
        })
    );
    b.consume(40);
    assert_eq!(b.recv_chunk(), None);
    assert!(b.read_ready());
    // A message longer than the room left after what was read ahead is still refused.
    let mut c = word_reader();
    assert!(c.note_placed(4000));
    c.consume(4000);
    assert!(matches!(
        data(&mut c, 4096 + 1),
        Err(ProtocolError::DataBeyondGrant { .. })
    ));
}

#[test]
fn a_writer_gives_its_cumulative_count_after_each_data_write() {
    let mut a = connected(small());
    let w = a.start_data(100).unwrap();
    assert_eq!(a.placed_word_after(&w), None, "the peer offered no word");
    let ad = PlacedWordAd {
        addr: 0x2000_0000 + 80,
        key: 0x22,
    };
    a.set_peer_placed_word(Some(ad));
    let w = a.start_data(200).unwrap();
    assert_eq!(a.placed_word_after(&w), Some((ad.addr, ad.key, 300)));
    a.set_coalescing(true);
    let w = a.start_data(50).unwrap();
    assert_eq!(w.imm, None, "held");
    assert_eq!(a.placed_word_after(&w), Some((ad.addr, ad.key, 350)));
}

#[test]
fn a_placed_word_is_believed_only_when_its_check_matches_its_count() {
    // Whole pairs, the zeroed word included, give their count back.
    for count in [0, 1, 4096, 65536 * 3 + 17, u64::MAX] {
        assert_eq!(
            placed_word_count(count, placed_word_check(count)),
            Some(count)
        );
    }
    assert_ne!(placed_word_check(0), 0, "a zeroed word is no valid pair");
    // A count beside the check of an earlier or later count (a reader between the two
    // halves of a write), and every count torn between two neighbouring counts byte by
    // byte, beside either count's check: none is believed unless it is that count.
    let (old, new) = (0x0000_0001_ffff_f000_u64, 0x0000_0002_0000_f000_u64);
    assert_eq!(placed_word_count(new, placed_word_check(old)), None);
    assert_eq!(placed_word_count(old, placed_word_check(new)), None);
    let (o, n) = (old.to_ne_bytes(), new.to_ne_bytes());
    for mask in 0u32..256 {
        let torn: Vec<u8> = (0..8)
            .map(|i| if mask & (1 << i) != 0 { n[i] } else { o[i] })
            .collect();
        let torn = u64::from_ne_bytes(torn.try_into().unwrap());
        for check in [placed_word_check(old), placed_word_check(new)] {
            let believed = placed_word_count(torn, check);
            assert!(
                believed.is_none() || check == placed_word_check(torn),
                "torn {torn:#x} believed"
            );
        }
    }
}

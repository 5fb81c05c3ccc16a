//! A hostile rsocket peer.
//!
//! The first 40 bytes are the peer's connection data (parsed; on refusal the rest is still
//! played against a core connected to a well-formed peer). The rest is a script of 9-byte
//! records: an immediate value and byte length as the peer's RDMA WRITE WITH IMM would
//! deliver them, with the target area overwritten by fuzzed bytes first (as the peer may
//! write anything there), or application reads, sends, announcements of held writes and
//! completions. A script whose length is not a multiple of 9 turns notification
//! coalescing on (`StreamCore::set_coalescing`); an odd number of records, early room
//! (`StreamCore::set_early_grants`: grants taken from the fuzzed target area before their
//! message, writes unstaged); a number of records whose remainder by 4 is 2 or 3, the
//! "bytes placed" word (`StreamCore::set_placed_word`: each read first notes a fuzzed
//! count, as the peer may write anything there; the 16 bytes after the connection data
//! are parsed as its advertisement). Nothing may panic, every receive chunk
//! must lie inside the receive ring, every write the core asks for must stay inside the
//! peer's advertised grants, and an announcement must announce exactly the held bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_sock::*;

fuzz_target!(|data: &[u8]| {
    let cfg = Config {
        sq_size: 16,
        rq_size: 16,
        rbuf_size: 8192,
        sbuf_size: 4096,
        inline_size: 64,
        iomap_size: 2,
    };
    let local = LocalRegions {
        rbuf_addr: 0x1000,
        rbuf_rkey: 1,
        target_addr: 0x10_0000,
        target_rkey: 2,
    };
    let mut core = StreamCore::new(cfg, local);
    let fallback = StreamCore::new(cfg, local).conn_data();
    let (head, script) = data.split_at(data.len().min(CONN_DATA_LEN));
    let peer = ConnData::parse(head).unwrap_or(fallback);
    let ad = PlacedWordAd::parse(data);
    core.handle_connected(&peer);
    let coalescing = script.len() % 9 != 0;
    core.set_coalescing(coalescing);
    let early = (script.len() / 9) % 2 == 1;
    core.set_early_grants(early);
    let word = (script.len() / 9) % 4 >= 2;
    core.set_placed_word(word);
    core.set_peer_placed_word(ad);
    let mut target = vec![0u8; cfg.target_area_len()];
    let mut posted: Vec<u64> = Vec::new();
    for rec in script.chunks_exact(9) {
        let imm = u32::from_be_bytes([rec[1], rec[2], rec[3], rec[4]]);
        let len = u32::from_be_bytes([rec[5], rec[6], rec[7], rec[8]]);
        match rec[0] % 7 {
            0 | 1 => {
                // The peer scribbles over the target area, then sends a message.
                let at = (len as usize) % target.len();
                let end = (at + 9).min(target.len());
                target[at..end].copy_from_slice(&rec[..end - at]);
                if let Some(slot) = core.awaited_grant_slot() {
                    assert!(early);
                    if core.take_grant_from_area(&target[slot..slot + RS_SGE_LEN]) {
                        target[slot..slot + RS_SGE_LEN].fill(0);
                    }
                }
                let _ = core.handle_recv(Some(imm), len, &target);
                if let Some(slot) = core.take_slot_to_clear() {
                    target[slot..slot + RS_SGE_LEN].fill(0);
                }
            }
            2 => {
                if word {
                    let _ = core.note_placed(u64::from(imm) << 8 | u64::from(len % 4096));
                }
                if let Some(c) = core.recv_chunk() {
                    assert!(c.offset.checked_add(c.len).unwrap() <= cfg.rbuf_size);
                    core.consume(len % (c.len + 1));
                }
            }
            3 => {
                if let Some(w) = core.start_data(len) {
                    assert!(w.len <= len && w.len > 0);
                    if let Some((addr, _, _)) = core.placed_word_after(&w) {
                        assert_eq!(Some(addr), ad.map(|a| a.addr));
                    }
                    // Only a coalescing stream holds a write back (no immediate).
                    assert!(coalescing || w.imm.is_some());
                    // An announced write never leaves held bytes behind it: the peer
                    // would read its bytes where the held ones are.
                    assert!(w.imm.is_none() || core.held_bytes() == 0);
                    if let SendStage::Ring {
                        offset,
                        first,
                        second,
                    } = w.stage
                    {
                        assert!(offset + first <= cfg.sbuf_size && second <= offset);
                    }
                    // Early room: a write placed when posted gives its ring back.
                    let wr_id = if early && imm & 2 == 0 {
                        core.unstage(&w)
                    } else {
                        w.wr_id
                    };
                    posted.push(wr_id);
                }
                while let Some(c) = core.poll_ctrl() {
                    posted.push(c.wr_id);
                }
            }
            4 => {
                if !posted.is_empty() {
                    let wr = posted.remove(0);
                    let _ = core.handle_send_completion(wr, imm & 1 == 0);
                }
            }
            5 => {
                let held = core.held_bytes();
                if let Some(a) = core.poll_announcement(imm & 1 == 0) {
                    assert!(coalescing && held > 0);
                    assert_eq!(a.imm, Msg::Data(held).to_imm());
                    assert_eq!(core.held_bytes(), 0);
                    posted.push(a.wr_id);
                }
            }
            _ => {
                if let Some(w) = core.start_riowrite(u64::from(imm), len) {
                    let e = core.peer_iomap_entry(u64::from(imm)).unwrap();
                    assert!(w.remote_addr >= e.sge.addr);
                    assert!(
                        w.remote_addr - e.sge.addr + u64::from(w.len) <= u64::from(e.sge.length)
                    );
                    posted.push(w.wr_id);
                }
            }
        }
        assert!(core.available() <= u64::from(cfg.rbuf_size));
    }
});

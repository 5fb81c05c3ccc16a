//! The CM MADs of `cm-sample.pcap` (the project's CM reference capture, one message of
//! each type; `tests/data/cm-sample.pcap` is a copy, and the test below checks these
//! bytes against it), as the nonzero 16-byte rows of each 256-byte MAD.
//!
//! Values: TID 0x0000123411223344 (DREQ/DREP 0x0000123400000099, SIDR 0x000012340a0b0c0d),
//! active comm ID 0x11223344, passive 0x55667788, service ID RDMA_PS_TCP port 7174
//! (SIDR: RDMA_PS_UDP port 7174), GIDs ::ffff:192.0.2.1 -> ::ffff:192.0.2.2, CMA
//! header source port 40000 (SIDR 40001).

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("not a lowercase hex digit"),
    }
}

/// A MAD from (offset, "16 hex bytes separated by spaces") rows; the rest is zero.
const fn mad(rows: &[(usize, &str)]) -> [u8; 256] {
    let mut out = [0u8; 256];
    let mut i = 0;
    while i < rows.len() {
        let (at, row) = rows[i];
        let s = row.as_bytes();
        let mut j = 0;
        while j < 16 {
            out[at + j] = (nibble(s[3 * j]) << 4) | nibble(s[3 * j + 1]);
            j += 1;
        }
        i += 1;
    }
    out
}

/// The sample REQ.
pub const REQ: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 11 22 33 44"),
    (16, "00 10 00 00 00 00 00 00 11 22 33 44 00 00 00 00"),
    (32, "00 00 00 00 01 06 1c 06 02 00 c0 ff fe 00 02 01"),
    (48, "00 00 00 00 00 00 00 00 00 01 23 01 00 00 00 01"),
    (64, "00 00 00 a1 ab cd ef a7 ff ff 37 f0 ff ff ff ff"),
    (80, "00 00 00 00 00 00 00 00 00 00 ff ff c0 00 02 01"),
    (96, "00 00 00 00 00 00 00 00 00 00 ff ff c0 00 02 02"),
    (112, "12 34 50 00 00 40 00 98 00 00 00 00 00 00 00 00"),
    (160, "00 00 00 00 00 40 9c 40 00 00 00 00 00 00 00 00"),
    (176, "00 00 00 00 c0 00 02 01 00 00 00 00 00 00 00 00"),
    (192, "00 00 00 00 c0 00 02 02 68 65 6c 6c 6f 2d 70 72"),
    (208, "69 76 61 74 65 00 00 00 00 00 00 00 00 00 00 00"),
]);

/// The sample REP.
pub const REP: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 11 22 33 44"),
    (16, "00 13 00 00 00 00 00 00 55 66 77 88 11 22 33 44"),
    (32, "00 00 00 00 00 04 56 00 00 00 00 00 65 43 21 00"),
    (48, "01 01 79 e0 02 00 c0 ff fe 00 02 02 72 65 70 2d"),
    (64, "70 72 69 76 61 74 65 00 00 00 00 00 00 00 00 00"),
]);

/// The sample RTU.
pub const RTU: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 11 22 33 44"),
    (16, "00 14 00 00 00 00 00 00 11 22 33 44 55 66 77 88"),
]);

/// The sample REJ.
pub const REJ: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 11 22 33 44"),
    (16, "00 12 00 00 00 00 00 00 00 00 00 00 11 22 33 44"),
    (32, "00 00 00 1c 00 00 00 00 00 00 00 00 00 00 00 00"),
    (96, "00 00 00 00 00 00 00 00 00 00 00 00 72 65 6a 2d"),
    (112, "70 72 69 76 61 74 65 00 00 00 00 00 00 00 00 00"),
]);

/// The sample MRA.
pub const MRA: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 11 22 33 44"),
    (16, "00 11 00 00 00 00 00 00 55 66 77 88 11 22 33 44"),
    (32, "00 c0 00 00 00 00 00 00 00 00 00 00 00 00 00 00"),
]);

/// The sample DREQ.
pub const DREQ: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 00 00 00 99"),
    (16, "00 15 00 00 00 00 00 00 11 22 33 44 55 66 77 88"),
    (32, "00 04 56 00 00 00 00 00 00 00 00 00 00 00 00 00"),
]);

/// The sample DREP.
pub const DREP: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 00 00 00 99"),
    (16, "00 16 00 00 00 00 00 00 55 66 77 88 11 22 33 44"),
]);

/// The sample SIDR_REQ.
pub const SIDR_REQ: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 0a 0b 0c 0d"),
    (16, "00 17 00 00 00 00 00 00 0a 0b 0c 0d ff ff 00 00"),
    (32, "00 00 00 00 01 11 1c 06 00 40 9c 41 00 00 00 00"),
    (48, "00 00 00 00 00 00 00 00 c0 00 02 01 00 00 00 00"),
    (64, "00 00 00 00 00 00 00 00 c0 00 02 02 00 00 00 00"),
]);

/// The sample SIDR_REP.
pub const SIDR_REP: [u8; 256] = mad(&[
    (0, "01 07 02 03 00 00 00 00 00 00 12 34 0a 0b 0c 0d"),
    (16, "00 18 00 00 00 00 00 00 0a 0b 0c 0d 00 00 00 00"),
    (32, "00 07 89 00 00 00 00 00 01 11 1c 06 01 23 45 67"),
]);

/// The MADs inside `tests/data/cm-sample.pcap`, in capture order (classic pcap,
/// Ethernet / IPv4 / UDP / BTH / DETH / MAD / ICRC).
fn capture_mads() -> Vec<[u8; 256]> {
    let pcap = include_bytes!("../../tests/data/cm-sample.pcap");
    let mut mads = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes([pcap[at + 8], pcap[at + 9], pcap[at + 10], pcap[at + 11]]);
        let frame = &pcap[at + 16..at + 16 + len as usize];
        let start = 14 + 20 + 8 + 12 + 8;
        let mut mad = [0u8; 256];
        mad.copy_from_slice(&frame[start..start + 256]);
        mads.push(mad);
        at += 16 + len as usize;
    }
    mads
}

#[test]
fn the_vectors_are_the_capture() {
    let ours = [REQ, REP, RTU, REJ, MRA, DREQ, DREP, SIDR_REQ, SIDR_REP];
    assert_eq!(capture_mads(), ours);
}

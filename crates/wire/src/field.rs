//! Byte ranges and big-endian helpers shared by the header views.

use core::ops::Range;

/// A range of bytes within a header.
pub type Field = Range<usize>;

/// Reads a big-endian 16-bit value. `b` must be at least 2 bytes long.
pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// Reads a big-endian 24-bit value. `b` must be at least 3 bytes long.
pub(crate) fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

/// Reads a big-endian 32-bit value. `b` must be at least 4 bytes long.
pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Reads a big-endian 64-bit value. `b` must be at least 8 bytes long.
pub(crate) fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Writes a big-endian 24-bit value (the top byte of `v` is ignored).
pub(crate) fn put_be24(b: &mut [u8], v: u32) {
    b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
}

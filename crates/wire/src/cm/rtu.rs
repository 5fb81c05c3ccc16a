//! RTU, ReadyToUse (IBA 12.6.9, Table 111; attribute 0x0014): the active side
//! confirms the REP; the connection is established. Its body is the two
//! communication IDs and private data ([`super::comm_ids`]), as a DREP's is.

use super::comm_ids::{CommIds, CommIdsRepr, COMM_IDS_PRIVATE_DATA_LEN};

/// Bytes of private data an RTU carries.
pub const RTU_PRIVATE_DATA_LEN: usize = COMM_IDS_PRIVATE_DATA_LEN;

/// A view of an RTU message (the 232 bytes after the MAD header).
pub type Rtu<T> = CommIds<T>;

/// The fields of an RTU.
pub type RtuRepr = CommIdsRepr;

#[cfg(test)]
mod tests {
    use crate::cm::comm_ids::check_vector;
    use crate::cm::mad::MAD_HEADER_LEN;
    use crate::cm::vectors;

    #[test]
    fn sample_vector() {
        check_vector(&vectors::RTU[MAD_HEADER_LEN..], 0x1122_3344, 0x5566_7788);
    }
}

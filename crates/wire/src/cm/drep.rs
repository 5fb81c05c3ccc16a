//! DREP, DisconnectReply (IBA 12.6.11, Table 113; attribute 0x0016): answers a
//! DREQ; both sides then wait out the timewait. Its body is the two
//! communication IDs and private data ([`super::comm_ids`]), as an RTU's is.

use super::comm_ids::{CommIds, CommIdsRepr, COMM_IDS_PRIVATE_DATA_LEN};

/// Bytes of private data a DREP carries.
pub const DREP_PRIVATE_DATA_LEN: usize = COMM_IDS_PRIVATE_DATA_LEN;

/// A view of a DREP message (the 232 bytes after the MAD header).
pub type Drep<T> = CommIds<T>;

/// The fields of a DREP.
pub type DrepRepr = CommIdsRepr;

#[cfg(test)]
mod tests {
    use crate::cm::comm_ids::check_vector;
    use crate::cm::mad::MAD_HEADER_LEN;
    use crate::cm::vectors;

    #[test]
    fn sample_vector() {
        check_vector(&vectors::DREP[MAD_HEADER_LEN..], 0x5566_7788, 0x1122_3344);
    }
}

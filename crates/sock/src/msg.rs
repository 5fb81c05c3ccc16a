//! The 32-bit immediate value of every rsocket message (CM reference §5.2): the top three
//! bits are the operation, the low 29 its argument.

const OP_SHIFT: u32 = 29;
const DATA_MASK: u32 = (1 << OP_SHIFT) - 1;
/// The longest data message the immediate value can describe (29 bits of length).
pub const MAX_DATA_LEN: u32 = DATA_MASK;

const OP_DATA: u32 = 0;
const OP_WRITE: u32 = 2;
const OP_SGL: u32 = 4;
const OP_IOMAP_SGL: u32 = 6;
const OP_CTRL: u32 = 7;

const CTRL_DISCONNECT: u32 = 0;
const CTRL_KEEPALIVE: u32 = 1;
const CTRL_SHUTDOWN: u32 = 2;

/// A control message's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctrl {
    /// The sender is done both ways.
    Disconnect,
    /// Keep-alive (rdma-core sends keep-alives as plain 0-length writes; this code exists).
    Keepalive,
    /// The sender will send no more data (SHUT_WR).
    Shutdown,
    /// A value rdma-core 44 does not define; ignored on receipt, as rsocket.c does.
    Other(u32),
}

/// An rsocket message, as its immediate value says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// `len` bytes of stream data were written at the receiver's ring position. Reserved
    /// operations 1, 3 and 5 are read as data too, as rsocket.c's receive path does.
    Data(u32),
    /// Operation 2: a local marker for riowrite completions, never meant for the wire;
    /// ignored on receipt.
    Write(u32),
    /// A credit update (the sender's new credit limit; only its low 16 bits count), with or
    /// without a 16-byte buffer grant written into the receiver's target SGL.
    Sgl(u32),
    /// An iomap entry was written into slot `index` of the receiver's iomap array.
    IomapSgl(u32),
    /// A control message.
    Ctrl(Ctrl),
}

impl Msg {
    /// Reads an immediate value (as carried, i.e. the big-endian number).
    pub fn from_imm(imm: u32) -> Msg {
        let data = imm & DATA_MASK;
        match imm >> OP_SHIFT {
            OP_WRITE => Msg::Write(data),
            OP_SGL => Msg::Sgl(data),
            OP_IOMAP_SGL => Msg::IomapSgl(data),
            OP_CTRL => Msg::Ctrl(match data {
                CTRL_DISCONNECT => Ctrl::Disconnect,
                CTRL_KEEPALIVE => Ctrl::Keepalive,
                CTRL_SHUTDOWN => Ctrl::Shutdown,
                other => Ctrl::Other(other),
            }),
            _ => Msg::Data(data),
        }
    }

    /// The immediate value (arguments are cut to 29 bits).
    pub fn to_imm(self) -> u32 {
        let (op, data) = match self {
            Msg::Data(n) => (OP_DATA, n),
            Msg::Write(n) => (OP_WRITE, n),
            Msg::Sgl(n) => (OP_SGL, n),
            Msg::IomapSgl(n) => (OP_IOMAP_SGL, n),
            Msg::Ctrl(c) => (
                OP_CTRL,
                match c {
                    Ctrl::Disconnect => CTRL_DISCONNECT,
                    Ctrl::Keepalive => CTRL_KEEPALIVE,
                    Ctrl::Shutdown => CTRL_SHUTDOWN,
                    Ctrl::Other(v) => v,
                },
            ),
        };
        (op << OP_SHIFT) | (data & DATA_MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(Msg::Data(4096).to_imm(), 0x0000_1000);
        assert_eq!(Msg::Sgl(0x1_0180).to_imm(), 0x8001_0180);
        assert_eq!(Msg::IomapSgl(0).to_imm(), 0xc000_0000);
        assert_eq!(Msg::Ctrl(Ctrl::Disconnect).to_imm(), 0xe000_0000);
        assert_eq!(Msg::Ctrl(Ctrl::Shutdown).to_imm(), 0xe000_0002);
        assert_eq!(Msg::from_imm(0x2000_0010), Msg::Data(16));
        assert_eq!(Msg::from_imm(0x6000_0010), Msg::Data(16));
        assert_eq!(Msg::from_imm(0xa000_0010), Msg::Data(16));
        assert_eq!(Msg::from_imm(0x4000_0010), Msg::Write(16));
        assert_eq!(Msg::from_imm(0xe000_0009), Msg::Ctrl(Ctrl::Other(9)));
    }

    #[test]
    fn every_imm_round_trips_through_its_meaning() {
        // Reserved data operations fold into Data, so compare meanings, not values.
        for imm in (0..=u32::MAX).step_by(0x0100_0ff1) {
            let m = Msg::from_imm(imm);
            assert_eq!(Msg::from_imm(m.to_imm()), m);
        }
    }
}

//! Handles, flags and enums shared across the engine's API.

use crate::slab::RawHandle;
use core::fmt;

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub(crate) RawHandle);

        impl $name {
            /// A number naming this object for as long as it lives (its slot and the
            /// slot's generation): what a peer is told, e.g. a PD in the same-host
            /// memory-region table.
            pub fn id(&self) -> u64 {
                (u64::from(self.0.generation) << 32) | u64::from(self.0.index)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({}/{})"), self.0.index, self.0.generation)
            }
        }
    };
}

handle!(
    /// A protection domain.
    PdHandle
);
handle!(
    /// A completion queue.
    CqHandle
);
handle!(
    /// A queue pair.
    QpHandle
);
handle!(
    /// A registered memory region.
    MrHandle
);
handle!(
    /// A memory window.
    MwHandle
);
handle!(
    /// A shared receive queue.
    SrqHandle
);

macro_rules! flags {
    ($(#[$doc:meta])* $name:ident : $ty:ty { $( $(#[$fdoc:meta])* $flag:ident = $value:expr; )* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $ty);

        impl $name {
            $( $(#[$fdoc])* pub const $flag: $name = $name($value); )*
            /// No flag set.
            pub const EMPTY: $name = $name(0);

            /// Whether every flag of `other` is set.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any flag of `other` is set.
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }

            /// `self` without the flags of `other`.
            pub const fn without(self, other: $name) -> $name {
                $name(self.0 & !other.0)
            }
        }

        impl core::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl core::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                let mut set = f.debug_set();
                $( if self.contains($name::$flag) && $value != 0 { set.entry(&format_args!(stringify!($flag))); } )*
                set.finish()
            }
        }
    };
}
pub(crate) use flags;

flags!(
    /// Memory and QP access rights (values as `enum ibv_access_flags`).
    AccessFlags: u32 {
        /// The local HCA may write (receive buffers, READ/atomic results).
        LOCAL_WRITE = 1;
        /// Peers may RDMA WRITE.
        REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA READ.
        REMOTE_READ = 1 << 2;
        /// Peers may do atomics.
        REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to the region (IBV_ACCESS_MW_BIND).
        MW_BIND = 1 << 4;
    }
);

/// Transport service of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

impl QpType {
    pub(crate) fn index(self) -> usize {
        match self {
            QpType::Rc => 0,
            QpType::Uc => 1,
            QpType::Ud => 2,
        }
    }
}

/// QP states (IBA 10.3.1, values as `enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    /// Reset: created, nothing configured.
    #[default]
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error (UC and UD only).
    Sqe,
    /// Error: everything outstanding is flushed.
    Err,
}

/// Path MTU (IBA 9.7.7.1; softverbs supports 256 to 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    #[default]
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The MTU of `bytes`, if it is one of the five IBA sizes.
    pub const fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// A registered memory region's keys and extent, as returned by `reg_mr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    /// Handle for deregistration.
    pub handle: MrHandle,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// First address.
    pub addr: u64,
    /// Length in bytes.
    pub length: usize,
}

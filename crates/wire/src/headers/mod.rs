//! Views and reprs of the base and extended transport headers (IBA 9.2-9.5).
//!
//! Each module holds a view `Name<T: AsRef<[u8]>>` over the header's bytes, its
//! `NameRepr` (where the header has more than one field), and byte test vectors.

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod deth;
pub mod immdt;
pub mod reth;

/// Defines a fixed-length header view with `new_unchecked`, `new_checked`,
/// `into_inner` and `LEN`. Accessors are written out per header.
macro_rules! header_view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of the header in bytes.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length; accessors may panic
            /// if it is shorter than [`Self::LEN`].
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking that it holds the whole header.
            pub fn new_checked(buffer: T) -> crate::Result<Self> {
                if buffer.as_ref().len() < Self::LEN {
                    Err(crate::Error::Truncated)
                } else {
                    Ok(Self { buffer })
                }
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
pub(crate) use header_view;

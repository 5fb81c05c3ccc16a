//! `SOCK_STREAM` rsockets.

/// A stream rsocket (not implemented yet: `rsocket` fails with `ENOSYS`).
pub struct StreamSocket {}

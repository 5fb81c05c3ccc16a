//! softverbs' drop-in `librdmacm.so.1` for unmodified rdma-core 44 programs.
//!
//! - [`abi`]: `#[repr(C)]` mirrors of the public structs and constants of `<rdma/rdma_cma.h>`
//!   (and what it embeds), checked against the installed headers by `tests/layout.rs`.
//! - [`exports`]: every symbol rdma-core 44's librdmacm exports, at its version node
//!   (RDMACM_1.0 ... 1.3), through `softverbs_stub_support`'s trampolines (see
//!   `softverbs-ibverbs-abi`'s crate documentation for how and why).
//! - [`api`]: the rdma_cm functions; [`rsocket`]: the rsocket functions.
//! - [`channel`], [`id`], [`event`], [`registry`]: event channels (real, pollable fds), ids
//!   and events with rdma_cm's lifetimes; [`devices`], [`addrinfo`]: `rdma_get_devices`,
//!   `rdma_getaddrinfo`.
//! - [`ibverbs`], [`cm`]: how this library reaches the device. It contains no driver: the
//!   process's one softverbs device lives in `libibverbs.so.1`, which this library depends on
//!   and calls at run time, through the public verbs and, for the connection manager, the
//!   private table of `softverbs-private-abi` (docs/c-programs.md, "How librdmacm reaches
//!   the device").
//!
//! Stream rsockets live in `libibverbs.so.1` too (`softverbs::sock`, through the private
//! table's `stream` part); [`rsocket`] keeps their C-facing state per descriptor. Datagram
//! rsockets are a UDP socket and a UD QP made through the public verbs
//! (`rsocket/dgram.rs`). When the
//! loaded `libibverbs.so.1` is not softverbs', what needs the connection manager (rsockets
//! included) fails with `ENOSYS`.

// Events stay boxed in every collection: C holds pointers into them (their private data).
#![allow(clippy::vec_box)]

pub mod abi;
pub mod addrinfo;
pub mod api;
pub mod channel;
pub mod cm;
pub mod devices;
pub mod errno;
pub mod event;
pub mod exports;
pub mod ibverbs;
pub mod id;
pub mod mcast;
pub mod qp;
pub mod registry;
pub mod rsocket;

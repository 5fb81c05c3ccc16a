//! softverbs: RDMA verbs in user space.
//!
//! The InfiniBand/RoCE verbs model — devices, protection domains, registered
//! memory with lkey/rkey, completion queues and channels, queue pairs — over
//! RoCEv2 packets in UDP, with no RDMA NIC, kernel module or privileges.
//!
//! ```no_run
//! use softverbs::*;
//! let ctx = Device::list()?.remove(0).open()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64, None)?;
//! let mr = pd.reg_mr(vec![0u8; 4096], AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let qp = QpBuilder::new(&pd, &cq).build()?;
//! println!("qpn {} gid {} rkey {:#x}", qp.qpn(), ctx.gid(), mr.rkey());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod ack_hold;
pub mod addressing;
pub mod cm;
pub mod config;
mod context;
mod cq;
mod device;
mod driver;
pub mod error;
mod events;
mod faults;
mod fork;
mod gid;
mod move_backoff;
mod mw;
mod pd;
pub mod published;
mod publisher;
mod qp;
pub mod samehost;
pub mod sock;
mod spread;
mod srq;
#[cfg(feature = "tokio")]
mod stream;
mod sys;
pub mod trace;

pub use config::{Config, ConfigError, FaultConfig, SameHostMode};
pub use context::{Context, Device, DeviceAttr, DeviceCounters, LinkLayer, PortAttr, PortState};
pub use cq::{CompletionChannel, Cq};
pub use driver::syscalls_under_device_lock;
pub use gid::{Gid, ROCE_PORT};
pub use mw::Mw;
pub use pd::{Mr, PageAligned, Pd, RawMr, StableBuffer};
pub use qp::{AddressHandle, InitAttr, Poster, Qp, QpBuilder, RemoteQp, RtrAttr, RtsAttr};
pub use softverbs_engine::{
    AccessFlags, AsyncEvent, Counters, CqHandle, IcrcPolicy, Mtu, Payload, QpAttr, QpAttrMask,
    QpCap, QpHandle, QpState, QpType, Qpn, Rkey, SendFlags, SendOp, SendWr, Sge, SrqHandle,
    WcOpcode, WcStatus, WorkCompletion,
};
pub use softverbs_engine::{BindMwError, MwBindInfo, MwHandle, MwType};
pub use srq::{Srq, SrqPoster};
#[cfg(feature = "tokio")]
pub use stream::CompletionStream;
/// The scheduler slice calls the progress thread uses (`Config::progress_slice`), for
/// tests that check what a thread got.
#[doc(hidden)]
pub use sys::{sched_slice, set_sched_slice};

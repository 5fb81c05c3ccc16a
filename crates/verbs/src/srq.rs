//! Shared receive queues: one pool of receives for many QPs.

use crate::error::{PostError, ResourceError};
use crate::pd::{Pd, PdInner};
use softverbs_engine::{RecvWr, Sge, SrqAttr, SrqHandle, SrqInitAttr};
use std::sync::Arc;

pub(crate) struct SrqInner {
    pub pd: Arc<PdInner>,
    pub srq: SrqHandle,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let _ = self.pd.handle.0.lock().engine.destroy_srq(self.srq);
    }
}

/// A shared receive queue. QPs built with [`crate::QpBuilder::srq`] take their
/// receives from it and keep it alive.
#[derive(Clone)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Srq").field(&self.inner.srq).finish()
    }
}

impl Pd {
    /// Creates an SRQ of `max_wr` receives with up to `max_sge` SGEs each.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq, ResourceError> {
        let attr = SrqInitAttr {
            max_wr,
            max_sge,
            srq_limit: 0,
        };
        let srq = self
            .inner
            .handle
            .0
            .lock()
            .engine
            .create_srq(self.inner.pd, attr)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: Arc::clone(&self.inner),
                srq,
            }),
        })
    }
}

impl Srq {
    /// Posts a receive.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        self.inner
            .pd
            .handle
            .0
            .lock()
            .engine
            .post_srq_recv(self.inner.srq, &RecvWr { wr_id, sges })
    }

    /// Arms the limit: when fewer than `limit` receives remain,
    /// `AsyncEvent::SrqLimitReached` is raised once (0 disarms).
    pub fn arm_limit(&self, limit: u32) -> Result<(), ResourceError> {
        self.inner
            .pd
            .handle
            .0
            .lock()
            .engine
            .modify_srq_limit(self.inner.srq, limit)
    }

    /// Capacity and the armed limit.
    pub fn query(&self) -> Result<SrqAttr, ResourceError> {
        self.inner
            .pd
            .handle
            .0
            .lock()
            .engine
            .query_srq(self.inner.srq)
    }

    /// Whether QPs still take their receives from this SRQ.
    pub fn in_use(&self) -> bool {
        let inner = &self.inner;
        inner.pd.handle.0.lock().engine.srq_in_use(inner.srq)
    }

    /// The engine handle.
    pub fn handle(&self) -> SrqHandle {
        self.inner.srq
    }
}

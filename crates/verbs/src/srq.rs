//! Shared receive queues: one pool of receives for many QPs.

use crate::device::Inherited;
use crate::error::{PostError, ResourceError};
use crate::events::Source;
use crate::pd::{Pd, PdInner};
use softverbs_engine::{RecvWr, Sge, SrqAttr, SrqHandle, SrqInitAttr};
use std::sync::Arc;

pub(crate) struct SrqInner {
    pub pd: Arc<PdInner>,
    pub srq: SrqHandle,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let ctx = &self.pd.ctx;
        let _ = ctx.read(|st| {
            ctx.disown(st, Source::Srq(self.srq));
            st.engine.destroy_srq(self.srq)
        });
        ctx.forget(Source::Srq(self.srq));
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
        let ctx = &self.inner.ctx;
        let srq = ctx.read(|st| -> Result<SrqHandle, ResourceError> {
            let srq = st.engine.create_srq(self.inner.pd, attr)?;
            ctx.adopt(st, Source::Srq(srq));
            Ok(srq)
        })??;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: Arc::clone(&self.inner),
                srq,
            }),
        })
    }
}

/// Posts receives to one SRQ under one device lock: see [`Srq::post_recvs`].
pub struct SrqPoster<'a> {
    engine: &'a mut softverbs_engine::Engine,
    srq: SrqHandle,
}

impl SrqPoster<'_> {
    /// Posts one receive.
    pub fn post(&mut self, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        self.engine.post_srq_recv(self.srq, &RecvWr { wr_id, sges })
    }
}

impl Srq {
    /// Posts a receive.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<(), PostError> {
        self.post_recvs(|p| p.post(wr_id, sges))?
    }

    /// Runs `f`, which posts receives through the [`SrqPoster`], under one device lock.
    pub fn post_recvs<R>(&self, f: impl FnOnce(&mut SrqPoster<'_>) -> R) -> Result<R, Inherited> {
        self.inner.pd.ctx.read(|st| {
            f(&mut SrqPoster {
                engine: &mut st.engine,
                srq: self.inner.srq,
            })
        })
    }

    /// Arms the limit: when fewer than `limit` receives remain,
    /// `AsyncEvent::SrqLimitReached` is raised once (0 disarms).
    pub fn arm_limit(&self, limit: u32) -> Result<(), ResourceError> {
        self.inner
            .pd
            .ctx
            .with(|st| st.engine.modify_srq_limit(self.inner.srq, limit))?
    }

    /// Capacity and the armed limit.
    pub fn query(&self) -> Result<SrqAttr, ResourceError> {
        self.inner
            .pd
            .ctx
            .read(|st| st.engine.query_srq(self.inner.srq))?
    }

    /// Whether QPs still take their receives from this SRQ.
    pub fn in_use(&self) -> bool {
        let inner = &self.inner;
        inner
            .pd
            .ctx
            .read(|st| st.engine.srq_in_use(inner.srq))
            .unwrap_or(false)
    }

    /// Stops this SRQ's asynchronous events: pending ones are dropped and no new one is
    /// delivered (the first step of destroying it).
    pub fn close_events(&self) {
        self.inner.pd.ctx.events.close(Source::Srq(self.inner.srq));
    }

    /// Waits until every asynchronous event of this SRQ handed out was acknowledged (as
    /// `ibv_destroy_srq` does).
    pub fn wait_events_acked(&self) {
        self.inner
            .pd
            .ctx
            .events
            .wait_acked(Source::Srq(self.inner.srq));
    }

    /// The engine handle.
    pub fn handle(&self) -> SrqHandle {
        self.inner.srq
    }
}

//! Verbs calls on protection domains, memory regions and windows, completion queues
//! and shared receive queues.

use super::{Engine, PostError, ResourceError};
use crate::cq::Cq;
use crate::event::AsyncEvent;
use crate::memory::MemorySpan;
use crate::mr::{Mr, Pd};
use crate::srq::{SrqAttr, SrqInitAttr};
use crate::types::{AccessFlags, CqHandle, MrHandle, MrInfo, PdHandle, QpHandle, SrqHandle};
use crate::wc::WorkCompletion;
use crate::wr::{Payload, RecvWr, SendFlags, SendWr};

impl Engine {
    /// Counts one more object using `pd` (so `dealloc_pd` reports Busy).
    pub(super) fn hold_pd(&mut self, pd: PdHandle) {
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users += 1;
        }
    }

    /// Counts one object fewer using `pd`.
    pub(super) fn release_pd(&mut self, pd: PdHandle) {
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users -= 1;
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> Result<PdHandle, ResourceError> {
        self.pds
            .insert(Pd { users: 0 })
            .map(PdHandle)
            .ok_or(ResourceError::LimitReached)
    }

    /// Whether MRs, MWs, QPs or SRQs still use `pd` (`dealloc_pd` would fail with Busy).
    pub fn pd_in_use(&self, pd: PdHandle) -> bool {
        self.pds.get(pd.0).is_some_and(|p| p.users > 0)
    }

    /// Frees a protection domain no MR or QP uses.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), ResourceError> {
        let p = self.pds.get(pd.0).ok_or(ResourceError::UnknownObject)?;
        if p.users > 0 {
            return Err(ResourceError::Busy);
        }
        self.pds.remove(pd.0);
        Ok(())
    }

    /// Registers `len` bytes at `addr`. The region's keys work until
    /// [`Engine::dereg_mr`]; its remote address is `addr` itself.
    ///
    /// # Safety
    /// `addr..addr + len` must stay valid for reads and writes, from any thread,
    /// until the region is deregistered (or the engine dropped). The engine reads
    /// and writes it whenever local work requests or peers' RDMA operations
    /// address it, as a NIC would by DMA.
    pub unsafe fn reg_mr(
        &mut self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, ResourceError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.reg_mr_with(pd, addr, len, access, false) }
    }

    /// Like [`Engine::reg_mr`], and a peer may invalidate the rkey with SEND with
    /// Invalidate (as for fast-registered memory).
    ///
    /// # Safety
    /// As for [`Engine::reg_mr`].
    pub unsafe fn reg_mr_remote_invalidate(
        &mut self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, ResourceError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.reg_mr_with(pd, addr, len, access, true) }
    }

    unsafe fn reg_mr_with(
        &mut self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        remote_invalidate: bool,
    ) -> Result<MrInfo, ResourceError> {
        if self.pds.get(pd.0).is_none() {
            return Err(ResourceError::UnknownObject);
        }
        if addr.is_null() && len > 0 {
            return Err(ResourceError::InvalidArgument("null address"));
        }
        if (addr as usize).checked_add(len).is_none() {
            return Err(ResourceError::InvalidArgument(
                "region wraps the address space",
            ));
        }
        // IBA 10.6.3.1: remote write or atomic access requires local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(ResourceError::InvalidArgument(
                "remote write/atomic access requires LOCAL_WRITE",
            ));
        }
        // SAFETY: the caller promises the range stays valid while registered.
        let span = unsafe { MemorySpan::new(addr, len) };
        let mr = Mr {
            pd,
            span,
            access,
            key_byte: 0,
            remote_invalidate,
            invalidated: false,
        };
        let (h, key) = self
            .shared
            .mrs
            .insert(mr)
            .ok_or(ResourceError::LimitReached)?;
        self.hold_pd(pd);
        Ok(MrInfo {
            handle: MrHandle(h),
            lkey: key,
            rkey: key,
            addr: addr as u64,
            length: len,
        })
    }

    /// Deregisters a region: its keys stop working at once.
    pub fn dereg_mr(&mut self, mr: MrHandle) -> Result<(), ResourceError> {
        let m = self
            .shared
            .mrs
            .remove(mr.0)
            .ok_or(ResourceError::UnknownObject)?;
        self.release_pd(m.pd);
        Ok(())
    }

    // ----- memory windows (IBA 10.6.7; see mw.rs) -----

    /// Allocates an unbound memory window in `pd`; every access through its
    /// rkey fails until it is bound.
    pub fn alloc_mw(
        &mut self,
        pd: PdHandle,
        kind: crate::mw::MwType,
    ) -> Result<crate::mw::MwInfo, ResourceError> {
        if self.pds.get(pd.0).is_none() {
            return Err(ResourceError::UnknownObject);
        }
        let (h, rkey) = self
            .shared
            .mrs
            .alloc_mw(pd, kind)
            .ok_or(ResourceError::LimitReached)?;
        self.hold_pd(pd);
        Ok(crate::mw::MwInfo {
            handle: crate::types::MwHandle(h),
            rkey,
        })
    }

    /// Frees a memory window (bound or not): its rkey stops working at once.
    pub fn dealloc_mw(&mut self, mw: crate::types::MwHandle) -> Result<(), ResourceError> {
        let w = self
            .shared
            .mrs
            .dealloc_mw(mw.0)
            .ok_or(ResourceError::UnknownObject)?;
        self.release_pd(w.pd);
        Ok(())
    }

    /// Binds a type 1 memory window (ibv_bind_mw): posts a bind work request
    /// to `qp`'s send queue and returns the rkey the window will have once it
    /// executes (a new one on every call). The bind takes effect in order with
    /// the QP's other work requests and completes with `WcOpcode::BindMw`, or
    /// `MwBindErr` if the region is not in the QP's PD, lacks MW_BIND, does
    /// not hold the range, or does not allow the rights. `info.length == 0`
    /// unbinds the window.
    pub fn bind_mw(
        &mut self,
        qp: QpHandle,
        mw: crate::types::MwHandle,
        wr_id: u64,
        flags: SendFlags,
        info: crate::mw::MwBindInfo,
    ) -> Result<softverbs_wire::Rkey, crate::mw::BindMwError> {
        use crate::mw::{BindMwError, MwType};
        match self.shared.mrs.mw_type(mw) {
            None => return Err(BindMwError::UnknownMw),
            Some(MwType::Type2) => return Err(BindMwError::WrongType),
            Some(MwType::Type1) => {}
        }
        if self.qps.get(qp.0).is_none() {
            return Err(BindMwError::Post(PostError::UnknownQp));
        }
        let rkey = self
            .shared
            .mrs
            .issue_type1_key(mw)
            .ok_or(BindMwError::UnknownMw)?;
        let rkey = softverbs_wire::Rkey(rkey);
        let wr = SendWr {
            wr_id,
            op: crate::wr::SendOp::BindMw { mw, rkey, info },
            payload: Payload::Sges(&[]),
            flags: flags.without(SendFlags::INLINE),
        };
        self.post_send_wr(qp, &wr)?;
        Ok(rkey)
    }

    // ----- completion queues -----

    /// Creates a CQ holding `cqe` completions.
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqHandle, ResourceError> {
        if cqe == 0 || cqe > self.shared.config.max_cqe {
            return Err(ResourceError::InvalidArgument("cqe"));
        }
        self.shared
            .cqs
            .insert(Cq::new(cqe as usize))
            .map(CqHandle)
            .ok_or(ResourceError::LimitReached)
    }

    /// Whether QPs still use `cq` (`destroy_cq` would fail with Busy).
    pub fn cq_in_use(&self, cq: CqHandle) -> bool {
        self.shared.cqs.get(cq.0).is_some_and(|c| c.users > 0)
    }

    /// Destroys a CQ no QP uses.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), ResourceError> {
        let c = self
            .shared
            .cqs
            .get(cq.0)
            .ok_or(ResourceError::UnknownObject)?;
        if c.users > 0 {
            return Err(ResourceError::Busy);
        }
        self.shared.cqs.remove(cq.0);
        Ok(())
    }

    /// Takes up to `out.len()` completions, oldest first; returns how many.
    pub fn poll_cq(
        &mut self,
        cq: CqHandle,
        out: &mut [WorkCompletion],
    ) -> Result<usize, ResourceError> {
        let c = self
            .shared
            .cqs
            .get_mut(cq.0)
            .ok_or(ResourceError::UnknownObject)?;
        let mut n = 0;
        while n < out.len() {
            let Some((wc, reclaim)) = c.pop() else {
                break;
            };
            out[n] = wc;
            n += 1;
            if let Some(r) = reclaim {
                if let Some(q) = self.qps.get_mut(r.qp.0) {
                    q.sq.reclaim(r.upto);
                }
            }
        }
        Ok(n)
    }

    /// Completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqHandle) -> Result<usize, ResourceError> {
        Ok(self
            .shared
            .cqs
            .get(cq.0)
            .ok_or(ResourceError::UnknownObject)?
            .len())
    }

    /// Arms a CQ: the next completion (only solicited or error ones when
    /// `solicited_only`) queues a notification for [`Engine::poll_cq_notification`]. A
    /// completion of that kind already waiting in the CQ, not yet polled, queues it at
    /// once, as an RNIC's arm against its consumer index does.
    pub fn req_notify_cq(
        &mut self,
        cq: CqHandle,
        solicited_only: bool,
    ) -> Result<(), ResourceError> {
        let c = self
            .shared
            .cqs
            .get_mut(cq.0)
            .ok_or(ResourceError::UnknownObject)?;
        if c.arm(solicited_only) {
            self.shared.notifications.push_back(cq);
        }
        Ok(())
    }

    /// The next CQ whose armed notification fired.
    pub fn poll_cq_notification(&mut self) -> Option<CqHandle> {
        self.shared.notifications.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.shared.events.pop_front()
    }

    /// Creates a shared receive queue in `pd`.
    pub fn create_srq(
        &mut self,
        pd: PdHandle,
        attr: SrqInitAttr,
    ) -> Result<SrqHandle, ResourceError> {
        let cfg = &self.shared.config;
        if attr.max_wr == 0 || attr.max_wr > cfg.max_qp_wr {
            return Err(ResourceError::InvalidArgument("SRQ max_wr"));
        }
        if attr.max_sge == 0 || attr.max_sge > cfg.max_sge {
            return Err(ResourceError::InvalidArgument("SRQ max_sge"));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(ResourceError::InvalidArgument("srq_limit beyond max_wr"));
        }
        self.pds.get(pd.0).ok_or(ResourceError::UnknownObject)?;
        let srq = crate::srq::Srq {
            pd,
            rq: crate::qp::queues::RecvQueue::new(attr.max_wr as usize, attr.max_sge as usize),
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            limit: attr.srq_limit,
            users: 0,
        };
        let h = self
            .shared
            .srqs
            .insert(srq)
            .ok_or(ResourceError::LimitReached)?;
        self.hold_pd(pd);
        Ok(SrqHandle(h))
    }

    /// Arms (or disarms, with 0) the SRQ limit: when the SRQ falls below
    /// `srq_limit` WQEs, AsyncEvent::SrqLimitReached fires once (IBA 10.2.9.3).
    /// Resizing an SRQ is not supported.
    pub fn modify_srq_limit(
        &mut self,
        srq: SrqHandle,
        srq_limit: u32,
    ) -> Result<(), ResourceError> {
        let s = self
            .shared
            .srqs
            .get_mut(srq.0)
            .ok_or(ResourceError::UnknownObject)?;
        if srq_limit > s.max_wr {
            return Err(ResourceError::InvalidArgument("srq_limit beyond max_wr"));
        }
        s.limit = srq_limit;
        Ok(())
    }

    /// The SRQ's attributes.
    pub fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr, ResourceError> {
        let s = self
            .shared
            .srqs
            .get(srq.0)
            .ok_or(ResourceError::UnknownObject)?;
        Ok(SrqAttr {
            max_wr: s.max_wr,
            max_sge: s.max_sge,
            srq_limit: s.limit,
        })
    }

    /// Whether QPs still use `srq` (`destroy_srq` would fail with Busy).
    pub fn srq_in_use(&self, srq: SrqHandle) -> bool {
        self.shared.srqs.get(srq.0).is_some_and(|s| s.users > 0)
    }

    /// Destroys an SRQ no QP uses.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), ResourceError> {
        let s = self
            .shared
            .srqs
            .get(srq.0)
            .ok_or(ResourceError::UnknownObject)?;
        if s.users > 0 {
            return Err(ResourceError::Busy);
        }
        let pd = s.pd;
        self.shared.srqs.remove(srq.0);
        self.release_pd(pd);
        Ok(())
    }

    /// Queues a receive work request on an SRQ.
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let s = self
            .shared
            .srqs
            .get_mut(srq.0)
            .ok_or(PostError::UnknownQp)?;
        s.rq.post(wr.wr_id, wr.sges)?;
        Ok(())
    }
}

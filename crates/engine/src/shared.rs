//! State every QP touches: memory regions, CQs, event queues, counters.

use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::cq::{Cq, Pushed, Reclaim};
use crate::event::AsyncEvent;
use crate::mr::{KeyError, MrTable};
use crate::slab::Slab;
use crate::types::{AccessFlags, CqHandle, PdHandle};
use crate::wc::WorkCompletion;
use crate::wr::Sge;
use std::collections::VecDeque;

pub(crate) struct Shared {
    pub config: EngineConfig,
    pub mrs: MrTable,
    pub cqs: Slab<Cq>,
    pub events: VecDeque<AsyncEvent>,
    pub notifications: VecDeque<CqHandle>,
    pub counters: Counters,
    /// Shared receive queues (QPs take receive WQEs from them).
    pub srqs: Slab<crate::srq::Srq>,
    /// QPs whose acceptance of same-host placed WRITEs may have changed (state,
    /// access flags, the acceptance itself): the driver republishes them
    /// (`engine/placed.rs`).
    pub placed_changes: VecDeque<crate::types::QpHandle>,
}

impl Shared {
    /// Delivers a completion to `cq`, raising the notification or the CQ error the
    /// push calls for; `reclaim` is what polling it frees. Returns false if the
    /// completion was lost to a full CQ (IBA 11.4.2.1: CQ overrun), the CQ is in
    /// error from then on.
    pub fn complete(&mut self, cq: CqHandle, wc: WorkCompletion, reclaim: Option<Reclaim>) -> bool {
        let Some(queue) = self.cqs.get_mut(cq.0) else {
            return true;
        };
        let first_overrun = !queue.overrun;
        match queue.push(wc, reclaim) {
            Pushed::Stored { notify } => {
                if notify {
                    self.notifications.push_back(cq);
                }
                true
            }
            Pushed::Overrun => {
                self.counters.cq_overruns += 1;
                if first_overrun {
                    self.events.push_back(AsyncEvent::CqError(cq));
                }
                false
            }
        }
    }

    /// Copies message bytes `offset..offset + out.len()` of an SGE list into `out`.
    pub fn gather(
        &self,
        pd: PdHandle,
        sges: &[Sge],
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), KeyError> {
        self.walk(
            pd,
            sges,
            offset,
            out.len(),
            AccessFlags::EMPTY,
            |mem, at, range| {
                if mem.read(at, &mut out[range]) {
                    Ok(())
                } else {
                    Err(KeyError::OutOfBounds)
                }
            },
        )
    }

    /// Copies `data` to message bytes `offset..` of an SGE list (needs LOCAL_WRITE).
    pub fn scatter(
        &self,
        pd: PdHandle,
        sges: &[Sge],
        offset: u32,
        data: &[u8],
    ) -> Result<(), KeyError> {
        self.walk(
            pd,
            sges,
            offset,
            data.len(),
            AccessFlags::LOCAL_WRITE,
            |mem, at, range| {
                if mem.write(at, &data[range]) {
                    Ok(())
                } else {
                    Err(KeyError::OutOfBounds)
                }
            },
        )
    }

    /// Checks every SGE of a list resolves with `access`.
    pub fn check_sges(
        &self,
        pd: PdHandle,
        sges: &[Sge],
        access: AccessFlags,
    ) -> Result<(), KeyError> {
        for sge in sges {
            self.mrs
                .resolve(sge.lkey, pd, sge.addr, sge.length as usize, access)?;
        }
        Ok(())
    }

    /// Visits the pieces of message bytes `offset..offset + len` as they fall in
    /// the SGEs: `f(memory, offset within the piece's MemRef, range within the
    /// caller's buffer)`.
    fn walk(
        &self,
        pd: PdHandle,
        sges: &[Sge],
        offset: u32,
        len: usize,
        access: AccessFlags,
        mut f: impl FnMut(&crate::mr::MemRef, usize, core::ops::Range<usize>) -> Result<(), KeyError>,
    ) -> Result<(), KeyError> {
        let mut skip = offset as usize;
        let mut done = 0usize;
        for sge in sges {
            if done == len {
                break;
            }
            let sge_len = sge.length as usize;
            if skip >= sge_len {
                skip -= sge_len;
                continue;
            }
            let n = (sge_len - skip).min(len - done);
            let mem = self.mrs.resolve(sge.lkey, pd, sge.addr, sge_len, access)?;
            f(&mem, skip, done..done + n)?;
            done += n;
            skip = 0;
        }
        if done == len {
            Ok(())
        } else {
            Err(KeyError::OutOfBounds)
        }
    }
}

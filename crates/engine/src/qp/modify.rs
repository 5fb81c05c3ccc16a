//! `modify_qp` (IBA 11.2.4.2): validate against the transition table and the device
//! limits, then apply; on error nothing changes.

use super::attr::{QpAttr, QpAttrMask as M};
use super::completer::Completer;
use super::{state, Qp, Requester, Responder};
use crate::shared::Shared;
use crate::time::Instant;
use crate::types::QpState;
use softverbs_wire::Psn;

/// Why `modify_qp` refused; the QP is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ModifyQpError {
    /// The QP does not exist.
    #[error("no such QP")]
    UnknownQp,
    /// `cur_qp_state` does not match the QP's state.
    #[error("cur_qp_state {given:?} does not match the QP's state {actual:?}")]
    CurrentStateMismatch {
        /// What the caller said.
        given: QpState,
        /// What the QP is in.
        actual: QpState,
    },
    /// IBA defines no transition between these states for this QP type.
    #[error("no transition from {from:?} to {to:?}")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The transition requires attributes the mask lacks.
    #[error("transition requires attributes {0:?}")]
    MissingAttributes(M),
    /// The mask names attributes the transition does not allow.
    #[error("transition does not allow attributes {0:?}")]
    ForbiddenAttributes(M),
    /// An attribute's value is out of range.
    #[error("invalid value for {0}")]
    InvalidValue(&'static str),
    /// The attribute is valid but softverbs does not implement it.
    #[error("{0} is not supported")]
    Unsupported(&'static str),
}

impl Qp {
    /// Validates and applies `modify_qp`; on error nothing changes.
    pub fn modify(
        &mut self,
        shared: &mut Shared,
        attr: &QpAttr,
        mask: M,
        now: Instant,
    ) -> Result<(), ModifyQpError> {
        let from = self.state();
        if mask.contains(M::CUR_STATE) && attr.cur_qp_state != from {
            return Err(ModifyQpError::CurrentStateMismatch {
                given: attr.cur_qp_state,
                actual: from,
            });
        }
        let to = if mask.contains(M::STATE) {
            attr.qp_state
        } else {
            from
        };
        state::check(self.init.qp_type, from, to, mask).map_err(|e| match e {
            state::TransitionError::Invalid => ModifyQpError::InvalidTransition { from, to },
            state::TransitionError::Missing(m) => ModifyQpError::MissingAttributes(m),
            state::TransitionError::Forbidden(m) => ModifyQpError::ForbiddenAttributes(m),
        })?;
        self.validate(shared, attr, mask)?;

        // Everything checked: apply.
        let a = &mut self.attr;
        if mask.contains(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(M::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(M::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(M::AV) {
            a.av = attr.av;
        }
        if mask.contains(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn & 0xff_ffff;
        }
        if mask.contains(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn & 0xff_ffff;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }

        if mask.contains(M::RQ_PSN) {
            self.resp = Responder::new(self.attr.rq_psn);
            self.resp.accept_placed = self.same_host;
        }
        // A new responder (RQ_PSN) is sized too: its answer queue's bounds come
        // from what it reserved.
        if mask.contains(M::MAX_DEST_RD_ATOMIC) || mask.contains(M::RQ_PSN) {
            self.resp.reserve(usize::from(self.attr.max_dest_rd_atomic));
        }
        if mask.contains(M::SQ_PSN) {
            let psn = Psn::new(self.attr.sq_psn);
            self.req.reset(psn, self.sq.head);
            self.comp.reset(psn);
        }
        if mask.intersects(M::RETRY_CNT | M::RNR_RETRY) {
            self.comp.set_retries(&self.attr);
        }

        self.attr.qp_state = to;
        if to == QpState::Rtr && from != QpState::Rtr {
            self.comm_established = false;
        }
        self.attr.sq_draining = to == QpState::Sqd;
        match to {
            QpState::Reset if from != QpState::Reset => self.reset(),
            QpState::Err if from != QpState::Err => self.enter_error(shared),
            QpState::Sqd => {
                self.req.sqd_notified = false;
                self.check_drained(shared);
            }
            _ => {}
        }
        let _ = now;
        Ok(())
    }

    fn validate(&self, shared: &Shared, attr: &QpAttr, mask: M) -> Result<(), ModifyQpError> {
        let cfg = &shared.config;
        if mask.contains(M::ALT_PATH) {
            return Err(ModifyQpError::Unsupported("alternate path (APM)"));
        }
        if mask.contains(M::PATH_MIG_STATE) {
            return Err(ModifyQpError::Unsupported("path migration state"));
        }
        if mask.contains(M::CAP) {
            return Err(ModifyQpError::Unsupported("resizing QP capacities"));
        }
        if mask.contains(M::PORT) && attr.port_num != 1 {
            return Err(ModifyQpError::InvalidValue(
                "port_num (softverbs devices have port 1)",
            ));
        }
        if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
            return Err(ModifyQpError::InvalidValue(
                "pkey_index (the P_Key table has one entry)",
            ));
        }
        if mask.contains(M::AV) && attr.av.is_none() {
            return Err(ModifyQpError::InvalidValue(
                "ah_attr (no destination address)",
            ));
        }
        if mask.contains(M::DEST_QPN) && attr.dest_qp_num > 0xff_ffff {
            return Err(ModifyQpError::InvalidValue("dest_qp_num"));
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > cfg.max_qp_rd_atom {
            return Err(ModifyQpError::InvalidValue("max_rd_atomic"));
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > cfg.max_qp_rd_atom {
            return Err(ModifyQpError::InvalidValue("max_dest_rd_atomic"));
        }
        if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
            return Err(ModifyQpError::InvalidValue("timeout"));
        }
        if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
            return Err(ModifyQpError::InvalidValue("retry_cnt"));
        }
        if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
            return Err(ModifyQpError::InvalidValue("rnr_retry"));
        }
        if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return Err(ModifyQpError::InvalidValue("min_rnr_timer"));
        }
        Ok(())
    }

    /// Back to RESET: queues emptied without completions (IBA 10.3.1).
    pub(super) fn reset(&mut self) {
        self.sq.head = self.sq.tail;
        self.sq.reclaimed = self.sq.tail;
        self.sq.held = 0;
        self.rq.head = self.rq.tail;
        let cap = self.attr.cap;
        self.attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
        self.req = Requester::default();
        self.req.reset(Psn::new(0), self.sq.head);
        self.comp = Completer::new(self.comp.timing(), self.comp.offers_sr());
        self.comp.reset(Psn::new(0));
        self.resp = Responder::new(0);
        self.same_host = false;
    }
}

//! The QP state machine as data: which transitions exist and which attributes
//! each requires and allows, per transport (IBA 10.3.1 and 11.2.4.2, table 91 —
//! the same table rdma-core and the kernel's `ib_modify_qp_is_ok` encode).

use super::attr::QpAttrMask as M;
use crate::types::{QpState, QpType};

/// One row of the table.
struct Transition {
    from: QpState,
    to: QpState,
    /// Required attributes for RC, UC, UD.
    required: [M; 3],
    /// Optional attributes for RC, UC, UD.
    optional: [M; 3],
}

const fn m(bits: u32) -> M {
    M(bits)
}

const NONE: M = M(0);
const STATE_OPT_RTS_RC: u32 =
    M::CUR_STATE.0 | M::ACCESS_FLAGS.0 | M::ALT_PATH.0 | M::PATH_MIG_STATE.0 | M::MIN_RNR_TIMER.0;
const STATE_OPT_RTS_UC: u32 =
    M::CUR_STATE.0 | M::ACCESS_FLAGS.0 | M::ALT_PATH.0 | M::PATH_MIG_STATE.0;
const STATE_OPT_RTS_UD: u32 = M::CUR_STATE.0 | M::QKEY.0;

static TABLE: &[Transition] = &[
    Transition {
        from: QpState::Reset,
        to: QpState::Reset,
        required: [NONE; 3],
        optional: [NONE; 3],
    },
    Transition {
        from: QpState::Reset,
        to: QpState::Init,
        required: [
            m(M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0),
            m(M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0),
            m(M::PKEY_INDEX.0 | M::PORT.0 | M::QKEY.0),
        ],
        optional: [NONE; 3],
    },
    Transition {
        from: QpState::Init,
        to: QpState::Init,
        required: [NONE; 3],
        optional: [
            m(M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0),
            m(M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0),
            m(M::PKEY_INDEX.0 | M::PORT.0 | M::QKEY.0),
        ],
    },
    Transition {
        from: QpState::Init,
        to: QpState::Rtr,
        required: [
            m(M::AV.0
                | M::PATH_MTU.0
                | M::DEST_QPN.0
                | M::RQ_PSN.0
                | M::MAX_DEST_RD_ATOMIC.0
                | M::MIN_RNR_TIMER.0),
            m(M::AV.0 | M::PATH_MTU.0 | M::DEST_QPN.0 | M::RQ_PSN.0),
            NONE,
        ],
        optional: [
            m(M::ALT_PATH.0 | M::ACCESS_FLAGS.0 | M::PKEY_INDEX.0),
            m(M::ALT_PATH.0 | M::ACCESS_FLAGS.0 | M::PKEY_INDEX.0),
            m(M::PKEY_INDEX.0 | M::QKEY.0),
        ],
    },
    Transition {
        from: QpState::Rtr,
        to: QpState::Rts,
        required: [
            m(
                M::SQ_PSN.0
                    | M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::MAX_QP_RD_ATOMIC.0,
            ),
            M::SQ_PSN,
            M::SQ_PSN,
        ],
        optional: [
            m(STATE_OPT_RTS_RC),
            m(STATE_OPT_RTS_UC),
            m(STATE_OPT_RTS_UD),
        ],
    },
    Transition {
        from: QpState::Rts,
        to: QpState::Rts,
        required: [NONE; 3],
        optional: [
            m(STATE_OPT_RTS_RC),
            m(STATE_OPT_RTS_UC),
            m(STATE_OPT_RTS_UD),
        ],
    },
    Transition {
        from: QpState::Rts,
        to: QpState::Sqd,
        required: [NONE; 3],
        optional: [M::EN_SQD_ASYNC_NOTIFY; 3],
    },
    Transition {
        from: QpState::Sqd,
        to: QpState::Rts,
        required: [NONE; 3],
        optional: [
            m(STATE_OPT_RTS_RC),
            m(STATE_OPT_RTS_UC),
            m(STATE_OPT_RTS_UD),
        ],
    },
    Transition {
        from: QpState::Sqd,
        to: QpState::Sqd,
        required: [NONE; 3],
        optional: [
            // RC may also name the primary path's port along with its AV.
            m(M::PKEY_INDEX.0
                | M::PORT.0
                | M::AV.0
                | M::ALT_PATH.0
                | M::ACCESS_FLAGS.0
                | M::MIN_RNR_TIMER.0
                | M::MAX_QP_RD_ATOMIC.0
                | M::MAX_DEST_RD_ATOMIC.0
                | M::PATH_MIG_STATE.0
                | M::TIMEOUT.0
                | M::RETRY_CNT.0
                | M::RNR_RETRY.0),
            m(M::AV.0 | M::ALT_PATH.0 | M::ACCESS_FLAGS.0 | M::PKEY_INDEX.0 | M::PATH_MIG_STATE.0),
            m(M::PKEY_INDEX.0 | M::QKEY.0),
        ],
    },
    Transition {
        from: QpState::Sqe,
        to: QpState::Rts,
        // SQE exists for UC and UD only; RC errors go straight to ERR.
        required: [NONE; 3],
        optional: [
            NONE,
            m(M::CUR_STATE.0 | M::ACCESS_FLAGS.0),
            m(M::CUR_STATE.0 | M::QKEY.0),
        ],
    },
];

/// Why a transition is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionError {
    /// No such transition from this state.
    Invalid,
    /// Attributes the transition requires are missing.
    Missing(M),
    /// Attributes the transition does not allow were given.
    Forbidden(M),
}

/// Checks a transition from `from` to `to` with `mask` (excluding STATE) against
/// the table.
pub fn check(qp_type: QpType, from: QpState, to: QpState, mask: M) -> Result<(), TransitionError> {
    let mask = mask.without(M::STATE);
    // Any state may move to RESET or ERR with no other attribute (IBA 10.3.1).
    // CUR_STATE is allowed only where the table lists it as optional (the
    // kernel's ib_modify_qp_is_ok applies the same rule).
    if matches!(to, QpState::Reset | QpState::Err)
        && !(from == QpState::Reset && to == QpState::Reset)
    {
        return if mask.0 == 0 {
            Ok(())
        } else {
            Err(TransitionError::Forbidden(mask))
        };
    }
    let row = TABLE
        .iter()
        .find(|t| t.from == from && t.to == to)
        .ok_or(TransitionError::Invalid)?;
    if from == QpState::Sqe && qp_type == QpType::Rc {
        return Err(TransitionError::Invalid);
    }
    let i = qp_type.index();
    let (required, optional) = (row.required[i], row.optional[i]);
    let missing = required.without(mask);
    if missing.0 != 0 {
        return Err(TransitionError::Missing(missing));
    }
    let forbidden = mask.without(required | optional);
    if forbidden.0 != 0 {
        return Err(TransitionError::Forbidden(forbidden));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_STATES: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    #[test]
    fn rc_connection_sequence() {
        let init = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        assert_eq!(
            check(QpType::Rc, QpState::Reset, QpState::Init, init),
            Ok(())
        );
        let rtr = M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        assert_eq!(check(QpType::Rc, QpState::Init, QpState::Rtr, rtr), Ok(()));
        let rts = M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        assert_eq!(check(QpType::Rc, QpState::Rtr, QpState::Rts, rts), Ok(()));
        assert_eq!(
            check(QpType::Rc, QpState::Rtr, QpState::Rts, M::SQ_PSN),
            Err(TransitionError::Missing(
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
            ))
        );
        assert_eq!(
            check(QpType::Rc, QpState::Reset, QpState::Init, init | M::QKEY),
            Err(TransitionError::Forbidden(M::QKEY))
        );
    }

    #[test]
    fn skipping_states_is_invalid() {
        assert_eq!(
            check(QpType::Rc, QpState::Reset, QpState::Rts, M::EMPTY),
            Err(TransitionError::Invalid)
        );
        assert_eq!(
            check(QpType::Rc, QpState::Init, QpState::Rts, M::EMPTY),
            Err(TransitionError::Invalid)
        );
        assert_eq!(
            check(QpType::Rc, QpState::Err, QpState::Rts, M::EMPTY),
            Err(TransitionError::Invalid)
        );
        assert_eq!(
            check(QpType::Rc, QpState::Sqe, QpState::Rts, M::EMPTY),
            Err(TransitionError::Invalid)
        );
        assert_eq!(
            check(QpType::Uc, QpState::Sqe, QpState::Rts, M::EMPTY),
            Ok(())
        );
    }

    #[test]
    fn reset_and_error_reachable_from_everywhere() {
        for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
            for from in ALL_STATES {
                assert_eq!(
                    check(qp_type, from, QpState::Err, M::EMPTY),
                    Ok(()),
                    "{from:?}"
                );
                assert_eq!(
                    check(qp_type, from, QpState::Reset, M::EMPTY),
                    Ok(()),
                    "{from:?}"
                );
                assert!(check(qp_type, from, QpState::Err, M::PATH_MTU).is_err());
            }
        }
    }

    #[test]
    fn ud_needs_qkey_not_path() {
        assert_eq!(
            check(
                QpType::Ud,
                QpState::Reset,
                QpState::Init,
                M::PKEY_INDEX | M::PORT | M::QKEY
            ),
            Ok(())
        );
        assert_eq!(
            check(QpType::Ud, QpState::Init, QpState::Rtr, M::EMPTY),
            Ok(())
        );
        assert_eq!(
            check(QpType::Ud, QpState::Init, QpState::Rtr, M::AV),
            Err(TransitionError::Forbidden(M::AV))
        );
    }
}

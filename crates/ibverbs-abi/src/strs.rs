//! The enum-to-string helpers of libibverbs (`ibv_wc_status_str` and friends) and the rate
//! conversions, as plain Rust over the ABI constants. Strings are the ones rdma-core prints,
//! so tools' output reads the same on softverbs.

use core::ffi::CStr;
use libc::c_int;

use crate::abi::*;

const UNKNOWN: &CStr = c"unknown";

fn pick(table: &'static [&'static CStr], index: c_int) -> &'static CStr {
    usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i).copied())
        .unwrap_or(UNKNOWN)
}

/// `ibv_wc_status_str`
pub fn wc_status_str(status: c_int) -> &'static CStr {
    const T: &[&CStr] = &[
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
        c"TM software rendezvous",
    ];
    pick(T, status)
}

/// `ibv_node_type_str`
pub fn node_type_str(node_type: c_int) -> &'static CStr {
    const T: &[&CStr] = &[
        UNKNOWN,
        c"InfiniBand channel adapter",
        c"InfiniBand switch",
        c"InfiniBand router",
        c"iWARP NIC",
        c"usNIC",
        c"usNIC UDP",
        c"unspecified",
    ];
    pick(T, node_type)
}

/// `ibv_port_state_str`
pub fn port_state_str(state: c_int) -> &'static CStr {
    const T: &[&CStr] = &[
        c"no state change (NOP)",
        c"down",
        c"init",
        c"armed",
        c"active",
        c"active defer",
    ];
    pick(T, state)
}

/// `ibv_event_type_str`
pub fn event_type_str(event: c_int) -> &'static CStr {
    const T: &[&CStr] = &[
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    pick(T, event)
}

/// (rate, multiple of 2.5 Gb/s) for the rates `ibv_rate_to_mult` knows.
const RATE_MULT: &[(c_int, c_int)] = &[
    (IBV_RATE_2_5_GBPS, 1),
    (IBV_RATE_5_GBPS, 2),
    (IBV_RATE_10_GBPS, 4),
    (IBV_RATE_20_GBPS, 8),
    (IBV_RATE_30_GBPS, 12),
    (IBV_RATE_40_GBPS, 16),
    (IBV_RATE_60_GBPS, 24),
    (IBV_RATE_80_GBPS, 32),
    (IBV_RATE_120_GBPS, 48),
];

/// `ibv_rate_to_mult`: -1 for rates that are not a multiple of 2.5 Gb/s.
pub fn rate_to_mult(rate: c_int) -> c_int {
    RATE_MULT
        .iter()
        .find(|&&(r, _)| r == rate)
        .map_or(-1, |&(_, m)| m)
}

/// `mult_to_ibv_rate`: `IBV_RATE_MAX` for multiples without a rate.
pub fn mult_to_rate(mult: c_int) -> c_int {
    RATE_MULT
        .iter()
        .find(|&&(_, m)| m == mult)
        .map_or(IBV_RATE_MAX, |&(r, _)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_out_of_range() {
        assert_eq!(wc_status_str(IBV_WC_SUCCESS), c"success");
        assert_eq!(
            wc_status_str(IBV_WC_RETRY_EXC_ERR),
            c"transport retry counter exceeded"
        );
        assert_eq!(
            wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE),
            c"TM software rendezvous"
        );
        assert_eq!(wc_status_str(-1), c"unknown");
        assert_eq!(wc_status_str(24), c"unknown");
        assert_eq!(node_type_str(IBV_NODE_CA), c"InfiniBand channel adapter");
        assert_eq!(node_type_str(IBV_NODE_UNKNOWN), c"unknown");
        assert_eq!(node_type_str(IBV_NODE_UNSPECIFIED), c"unspecified");
        assert_eq!(port_state_str(IBV_PORT_ACTIVE), c"active");
        assert_eq!(port_state_str(99), c"unknown");
        assert_eq!(event_type_str(IBV_EVENT_WQ_FATAL), c"WQ fatal");
        assert_eq!(
            event_type_str(IBV_EVENT_COMM_EST),
            c"communication established"
        );
        assert_eq!(event_type_str(20), c"unknown");
    }

    #[test]
    fn rates_round_trip() {
        for &(rate, mult) in RATE_MULT {
            assert_eq!(rate_to_mult(rate), mult);
            assert_eq!(mult_to_rate(mult), rate);
        }
        assert_eq!(rate_to_mult(IBV_RATE_MAX), -1);
        assert_eq!(mult_to_rate(3), IBV_RATE_MAX);
    }
}

//! A stub `libefa.so.1` for softverbs: every function rdma-core 44's libefa exports, at its
//! version node, failing cleanly.
//!
//! perftest links `libefa.so.1` (C-ABI.md) but reaches its functions only with the SRD
//! option, which needs an AWS EFA device. With softverbs installed in place of rdma-core, this
//! library lets such tools start (`-z now` resolves every import at its node) and makes that
//! option fail with `EOPNOTSUPP` instead of crashing.
//!
//! # Return values
//!
//! The prototypes are those of Debian's `<infiniband/efadv.h>` (rdma-core 44): functions
//! returning a pointer return NULL with `errno = EOPNOTSUPP`; functions returning `int`
//! return `EOPNOTSUPP` (the efadv convention: a positive errno value) and also set `errno`.
//! Every function ignores its arguments, so each is declared without parameters: in the C
//! calling conventions of x86_64 and aarch64 the caller owns argument registers and stack.
//!
//! # Symbol versions
//!
//! As in `softverbs-ibverbs-abi` (see its crate documentation): each function is an ordinary,
//! mangled Rust `extern "C" fn`; `stubs!` emits a `global_asm!` trampoline that jumps to it and
//! a `.symver softverbs_v_<name>, <name>@@<NODE>` naming it at its node; `build.rs` passes a
//! version script declaring only the nodes (`libefa.map`) and the SONAME. The list of
//! expected symbols, `exports.txt`, is checked against the built library by `tests/cdylib.rs`.
//!
//! rdma-core 44's libefa (`libefa.so.1.2.44.0`) defines the nodes EFA_1.0 to EFA_1.2; the
//! `efa.map` in the shared reference also declares an empty EFA_1.3, which later rdma-core
//! releases added (44 has no symbol there), so it is not defined here.

use softverbs_stub_support::stubs;

stubs! {
    "EFA_1.0" {
        ptr efadv_create_driver_qp;
    }
    "EFA_1.1" {
        ptr efadv_create_qp_ex;
        int efadv_query_ah;
        int efadv_query_device;
    }
    "EFA_1.2" {
        ptr efadv_cq_from_ibv_cq_ex;
        ptr efadv_create_cq;
    }
}

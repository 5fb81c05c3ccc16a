//! softverbs' C ABI: the drop-in `libibverbs.so.1` for unmodified rdma-core 44 programs.
//!
//! - [`abi`]: `#[repr(C)]` mirrors of rdma-core 44's public structs and constants. The hot
//!   paths (`ibv_post_send`, `ibv_poll_cq`, ...) are inlines in the C headers that jump through
//!   these structs, so their layout *is* the ABI. `tests/layout.rs` compiles a C program
//!   against the installed `<infiniband/verbs.h>` and checks every field's offset and size.
//! - [`exports`]: the exported functions.
//! - [`private_cm`]: the one export beyond rdma-core's, `softverbs_private_cm` at the private
//!   node `SOFTVERBS_PRIVATE_1`: the connection manager as the table softverbs'
//!   `librdmacm.so.1` drives (crate `softverbs-private-abi`).
//!
//! # Symbol versions
//!
//! Programs linked against rdma-core import e.g. `ibv_get_device_list@IBVERBS_1.1`, and tools
//! linked with `-z now` refuse to start unless every import resolves at its node. What works
//! (checked by `tests/cdylib.rs`):
//!
//! 1. Each C function is an ordinary Rust `extern "C" fn` named like its C counterpart
//!    (`exports::ibv_get_device_list`), *not* `#[no_mangle]`: rustc does not export it.
//! 2. [`exports!`](exports) emits, per function, a `global_asm!` trampoline
//!    `softverbs_v_<name>: jmp <mangled Rust fn>` (a `sym` operand; `b` on aarch64) followed
//!    by `.symver softverbs_v_<name>, <name>@@<NODE>`, so the assembler gives the trampoline
//!    its public name at its node (the default version, `@@`).
//! 3. `build.rs` passes `-Wl,--version-script=libibverbs.map`, which only declares the nodes
//!    (`IBVERBS_1.1 { } IBVERBS_1.0;` ...), and `-Wl,-soname,libibverbs.so.1`, both as
//!    `cargo:rustc-cdylib-link-arg` so they apply to the cdylib only.
//!
//! The dynamic symbol table then holds exactly the `name@@NODE` symbols: rustc's own,
//! anonymous version script (`{ global: <no_mangle symbols>; local: *; }`) localises the
//! `softverbs_v_*` labels but does not touch symbols that carry an explicit version.
//!
//! What did not work:
//! - Naming the public symbol in the map (`IBVERBS_1.1 { global: ibv_x; }`) with a
//!   `#[no_mangle] fn ibv_x`: rustc's anonymous script also lists `ibv_x` and wins, so the
//!   symbol ends up unversioned (at the base version), as C-ABI.md warns.
//! - `#[export_name = "ibv_x@@IBVERBS_1.1"]`: rustc copies the name into its version script,
//!   which the linker cannot parse.
//! - `.symver` pointing straight at a `#[no_mangle]` Rust function: the assembler needs the
//!   `@@` target defined in the same object, and rustc may place the `global_asm!` and the
//!   function in different codegen units (it did for the `--test` build). The trampoline is
//!   defined in the same `global_asm!` as its `.symver`, so it cannot be split.
//! - GNU ld (`-Clinker-features=-lld`): it refuses to combine rustc's anonymous version tag
//!   with named nodes ("anonymous version tag cannot be combined with other version tags").
//!   This needs rust-lld, the default linker for x86_64-unknown-linux-gnu since Rust 1.90
//!   (the toolchain used here). Where only GNU ld is available, the other route C-ABI.md
//!   names (build a staticlib and link the `.so` with `cc` and a complete version script)
//!   would be needed.
//!
//! The same objects also link into the rlib used by the unit and integration tests, where the
//! versioned aliases are harmless.

pub mod abi;
pub mod ah;
pub mod cq_ex;
pub mod ctx;
pub mod device;
pub mod ex;
pub mod exports;
pub mod marshall;
pub mod mw;
pub mod private_cm;
pub mod private_sock;
pub mod srq;
pub mod strs;
pub mod stubs;
pub mod verbs;

#[cfg(test)]
mod testing;

pub use exports::{Export, EXPORTS};

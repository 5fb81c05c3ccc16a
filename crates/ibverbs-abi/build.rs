//! Link arguments for the cdylib: the version nodes of rdma-core 44's libibverbs and its SONAME.
//! See the crate documentation (`src/lib.rs`) for how the exports get their version nodes.

fn main() {
    softverbs_stub_support::cdylib_link_args("libibverbs.map", "libibverbs.so.1");
}

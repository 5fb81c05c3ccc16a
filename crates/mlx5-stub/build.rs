//! Link arguments for the cdylib: the version nodes of rdma-core 44's libmlx5 and its SONAME.
//! See the crate documentation (`src/lib.rs`) for how the exports get their version nodes.

fn main() {
    softverbs_stub_support::cdylib_link_args("libmlx5.map", "libmlx5.so.1");
}

//! Link arguments for the cdylib: the version nodes of rdma-core 44's libmlx5 and its SONAME.
//! See the crate documentation (`src/lib.rs`) for how the exports get their version nodes.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let map = format!("{dir}/libmlx5.map");
    println!("cargo:rerun-if-changed=libmlx5.map");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={map}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmlx5.so.1");
}

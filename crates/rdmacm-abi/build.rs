//! Link arguments for the cdylib: the version nodes of rdma-core 44's librdmacm and its
//! SONAME (see `src/lib.rs` for how the exports get their nodes), and `DT_NEEDED
//! libibverbs.so.1`.
//!
//! librdmacm.so.1 calls into libibverbs.so.1, but resolves every function at run time with
//! `dlvsym` (src/ibverbs.rs), so it imports no symbol from it at link time. The dependency
//! itself is still recorded, as rdma-core's librdmacm records it, so the loader brings in the
//! `libibverbs.so.1` found on the same search path (softverbs' drop-in directory) before the
//! program starts. The linker records `DT_NEEDED` from a library's SONAME, so it is given an
//! empty shared object named `libibverbs.so.1` (built here, in OUT_DIR) whose only content
//! is that SONAME; it is never installed or loaded.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    softverbs_stub_support::cdylib_link_args("librdmacm.map", "librdmacm.so.1");

    let dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("needed");
    std::fs::create_dir_all(&dir).expect("create OUT_DIR/needed");
    let soname_only = dir.join("libibverbs.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-shared", "-nostdlib", "-Wl,-soname,libibverbs.so.1", "-o"])
        .arg(&soname_only)
        .args(["-x", "c", "/dev/null"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc} (the C compiler rustc links with): {e}"));
    assert!(
        status.success(),
        "{cc} failed to build {}",
        soname_only.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg={}", soname_only.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--as-needed");
}

//! Debian's rdmacm-utils binaries (linked `-z now` against rdma-core) load on the drop-in
//! librdmacm.so.1 + softverbs' libibverbs.so.1 with every import bound at its version node,
//! as `ldd -r` (the loader with `LD_BIND_NOW`, reporting what does not resolve) shows. Running
//! them is tested in rping.rs, cm_tools.rs and perftest_cm.rs.
//!
//! Needs rdmacm-utils and `ldd`; skips loudly without them, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::path::Path;
use std::process::Command;

/// Every binary of Debian 12's rdmacm-utils.
const TOOLS: [&str; 13] = [
    "cmtime",
    "mckey",
    "rcopy",
    "rdma_client",
    "rdma_server",
    "rdma_xclient",
    "rdma_xserver",
    "riostream",
    "rping",
    "rstream",
    "ucmatose",
    "udaddy",
    "udpong",
];

#[test]
fn every_rdmacm_utils_binary_binds_all_its_imports() {
    if !Path::new("/usr/bin/rping").is_file() {
        common::skip("rdmacm-utils not installed (apt-get install rdmacm-utils)");
        return;
    }
    if !common::tools_present(&["ldd"]) {
        return;
    }
    let dir = common::dropin("tools", true);
    for tool in TOOLS {
        let path = Path::new("/usr/bin").join(tool);
        let out = common::run(
            Command::new("ldd")
                .arg("-r")
                .arg(&path)
                .env("LD_LIBRARY_PATH", &dir),
        );
        for lib in ["librdmacm.so.1", "libibverbs.so.1"] {
            assert!(
                out.contains(&format!("{lib} => {}", dir.join(lib).display())),
                "{tool} does not load {lib} from {}:\n{out}",
                dir.display()
            );
        }
        assert!(
            !out.contains("undefined symbol") && !out.contains("not found"),
            "{tool}:\n{out}"
        );
    }
}

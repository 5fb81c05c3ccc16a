//! Checks the built `libsoftverbs_rdmacm.so` as a drop-in `librdmacm.so.1`:
//!
//! - it exports exactly the symbols rdma-core 44's librdmacm does, each at its version node
//!   (`exports.txt`), defines every node (`nodes.txt`) and has the SONAME `librdmacm.so.1`
//!   (`readelf`);
//! - it depends on `libibverbs.so.1` and contains no copy of the softverbs driver (no code
//!   of the `softverbs`, `softverbs-engine` or `softverbs-wire` crates);
//! - a C program built against Debian's `<rdma/rdma_cma.h>` and linked against it (run
//!   through a `librdmacm.so.1` symlink found by rpath, `-z now`) imports its symbols at
//!   their nodes and runs.
//!
//! Needs `readelf`, `cc` and librdmacm-dev; skips loudly without them, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::process::Command;

use common::{run, tools_present, LIB, RDMA_CMA_H};

#[test]
fn exports_match_rdma_core_44_librdmacm() {
    LIB.check_exports(68);
}

#[test]
fn depends_on_libibverbs_and_holds_no_driver() {
    if !tools_present(&["readelf"]) {
        return;
    }
    let so = LIB.cdylib();
    let dynamic = run(Command::new("readelf").arg("-d").arg(&so));
    assert!(
        dynamic.contains("Shared library: [libibverbs.so.1]"),
        "no DT_NEEDED libibverbs.so.1:\n{dynamic}"
    );
    // Every symbol of the library, local ones included (cargo's profiles keep them), by
    // mangled name: none may come from the driver's crates.
    let symbols = run(Command::new("readelf").args(["--syms", "-W"]).arg(&so));
    for krate in ["9softverbs", "16softverbs_engine", "14softverbs_wire"] {
        let found: Vec<&str> = symbols
            .lines()
            .filter(|l| l.contains(krate))
            .take(3)
            .collect();
        assert!(
            found.is_empty(),
            "code of crate {krate} in {}: {found:?}",
            so.display()
        );
    }
    // The check can see crates: this library's own code is there.
    assert!(
        symbols.contains("16softverbs_rdmacm"),
        "symbol table without crate names"
    );
}

const PROGRAM: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <rdma/rdma_cma.h>

int main(void) {
    printf("%s\n", rdma_event_str(RDMA_CM_EVENT_CONNECT_REQUEST));
    printf("%s\n", rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT));
    printf("%s\n", rdma_event_str(16));
    errno = 0;
    int r = rdma_getaddrinfo(NULL, NULL, NULL, NULL);
    printf("getaddrinfo %d %s\n", r, errno == EINVAL ? "EINVAL" : "other");
    errno = 0;
    r = rdma_establish(NULL);
    printf("establish %d %s\n", r, errno == EINVAL ? "EINVAL" : "other");
    return 0;
}
"#;

const EXPECTED: &str = "\
RDMA_CM_EVENT_CONNECT_REQUEST
RDMA_CM_EVENT_TIMEWAIT_EXIT
UNKNOWN EVENT
getaddrinfo -1 EINVAL
establish -1 EINVAL
";

#[test]
fn c_program_with_rdma_cma_h_links_and_runs() {
    LIB.check_c_program(
        RDMA_CMA_H,
        &std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("rdmacm-c-program"),
        PROGRAM,
        &[
            "rdma_event_str@RDMACM_1.0",
            "rdma_getaddrinfo@RDMACM_1.0",
            "rdma_establish@RDMACM_1.2",
        ],
        EXPECTED,
    );
}

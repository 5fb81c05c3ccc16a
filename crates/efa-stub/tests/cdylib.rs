//! Checks the built `libsoftverbs_efa.so` as a drop-in `libefa.so.1`:
//!
//! - it exports exactly the symbols rdma-core 44's libefa does, each at its version node
//!   (`exports.txt`), defines every node (`nodes.txt`) and has the SONAME `libefa.so.1`
//!   (`readelf`);
//! - a C program built against Debian's `<infiniband/efadv.h>` and linked against it (run
//!   through a `libefa.so.1` symlink found by rpath, `-z now`) gets the stub results.
//!
//! Needs `readelf`, `cc` and libibverbs-dev; skips loudly without them, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

use softverbs_stub_support::testing::StubLib;
use std::path::Path;

const LIB: StubLib = StubLib {
    file: "libsoftverbs_efa.so",
    soname: "libefa.so.1",
    exports: include_str!("../exports.txt"),
    nodes: include_str!("../nodes.txt"),
};

#[test]
fn exports_match_rdma_core_44_libefa() {
    LIB.check_exports(6);
}

const PROGRAM: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <infiniband/efadv.h>

static const char *err(long v) { return v == EOPNOTSUPP ? "EOPNOTSUPP" : v == 0 ? "0" : "other"; }

int main(void) {
    struct efadv_device_attr attr = {0};
    errno = 0;
    int ret = efadv_query_device(NULL, &attr, sizeof(attr));
    printf("query_device %s errno %s\n", err(ret), err(errno));
    errno = 0;
    struct ibv_qp *qp = efadv_create_qp_ex(NULL, NULL, NULL, 0);
    printf("create_qp_ex %s errno %s\n", qp ? "non-null" : "null", err(errno));
    return 0;
}
"#;

const EXPECTED: &str = "\
query_device EOPNOTSUPP errno EOPNOTSUPP
create_qp_ex null errno EOPNOTSUPP
";

#[test]
fn c_program_with_efadv_h_gets_stub_results() {
    LIB.check_c_program(
        "/usr/include/infiniband/efadv.h",
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("efa-c-program"),
        PROGRAM,
        &["efadv_query_device@EFA_1.1", "efadv_create_qp_ex@EFA_1.1"],
        EXPECTED,
    );
}

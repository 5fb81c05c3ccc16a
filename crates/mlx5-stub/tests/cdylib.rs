//! Checks the built `libsoftverbs_mlx5.so` as a drop-in `libmlx5.so.1`:
//!
//! - it exports exactly the symbols rdma-core 44's libmlx5 does, each at its version node
//!   (`exports.txt`), defines every node (`nodes.txt`) and has the SONAME `libmlx5.so.1`
//!   (`readelf`);
//! - a C program built against Debian's `<infiniband/mlx5dv.h>` and linked against it (run
//!   through a `libmlx5.so.1` symlink found by rpath, `-z now`) gets the stub results.
//!
//! Needs `readelf`, `cc` and libibverbs-dev; skips loudly without them, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

use softverbs_stub_support::testing::StubLib;
use std::path::Path;

const LIB: StubLib = StubLib {
    file: "libsoftverbs_mlx5.so",
    soname: "libmlx5.so.1",
    exports: include_str!("../exports.txt"),
    nodes: include_str!("../nodes.txt"),
};

#[test]
fn exports_match_rdma_core_44_libmlx5() {
    LIB.check_exports(129);
}

const PROGRAM: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <sys/types.h>
#include <infiniband/mlx5dv.h>

static const char *err(long v) { return v == EOPNOTSUPP ? "EOPNOTSUPP" : v == 0 ? "0" : "other"; }

int main(void) {
    struct mlx5dv_context attr = {0};
    struct mlx5dv_obj obj = {0};
    printf("is_supported %d\n", (int)mlx5dv_is_supported(NULL));
    errno = 0;
    int ret = mlx5dv_query_device(NULL, &attr);
    printf("query_device %s errno %s\n", err(ret), err(errno));
    printf("init_obj %s\n", err(mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP)));
    errno = 0;
    struct ibv_qp *qp = mlx5dv_create_qp(NULL, NULL, NULL);
    printf("create_qp %s errno %s\n", qp ? "non-null" : "null", err(errno));
    errno = 0;
    ssize_t n = mlx5dv_devx_get_event(NULL, NULL, 0);
    printf("devx_get_event %zd errno %s\n", n, err(errno));
    return 0;
}
"#;

const EXPECTED: &str = "\
is_supported 0
query_device EOPNOTSUPP errno EOPNOTSUPP
init_obj EOPNOTSUPP
create_qp null errno EOPNOTSUPP
devx_get_event -1 errno EOPNOTSUPP
";

#[test]
fn c_program_with_mlx5dv_h_gets_stub_results() {
    LIB.check_c_program(
        "/usr/include/infiniband/mlx5dv.h",
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("mlx5-c-program"),
        PROGRAM,
        &[
            "mlx5dv_is_supported@MLX5_1.8",
            "mlx5dv_query_device@MLX5_1.0",
            "mlx5dv_init_obj@MLX5_1.2",
            "mlx5dv_create_qp@MLX5_1.3",
            "mlx5dv_devx_get_event@MLX5_1.11",
        ],
        EXPECTED,
    );
}

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

use std::path::{Path, PathBuf};
use std::process::Command;

const LIB: &str = "libsoftverbs_mlx5.so";
const SONAME: &str = "libmlx5.so.1";
const HEADER: &str = "/usr/include/infiniband/mlx5dv.h";
const EXPORTS: &str = include_str!("../exports.txt");
const NODES: &str = include_str!("../nodes.txt");

/// The lines of a data file, without comments and blank lines.
fn facts(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

fn tools_required() -> bool {
    std::env::var("SOFTVERBS_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Skips loudly, or panics when `SOFTVERBS_REQUIRE_TOOLS=1`.
fn skip(why: &str) {
    if tools_required() {
        panic!("{why} (SOFTVERBS_REQUIRE_TOOLS=1, so this is an error)");
    }
    eprintln!("SKIPPED: {why}");
    eprintln!("SKIPPED: set SOFTVERBS_REQUIRE_TOOLS=1 to make this an error");
}

fn tools_present(tools: &[&str]) -> bool {
    for tool in tools {
        let ok = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            skip(&format!("`{tool}` not available"));
            return false;
        }
    }
    true
}

/// Runs `cmd`, panicking with its output unless it succeeds; returns stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The cdylib cargo built alongside the rlib: in the profile directory (`target/debug`), the
/// parent of the `deps` directory holding this test's executable.
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    for dir in [deps.parent().expect("profile dir"), deps] {
        let so = dir.join(LIB);
        if so.exists() {
            return so;
        }
    }
    panic!("{LIB} not found next to {}", deps.display());
}

/// A scratch directory holding `libmlx5.so.1` -> our cdylib, as an installation would.
fn dropin_dir(so: &Path, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    let link = dir.join(SONAME);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(so, &link).expect("symlink SONAME");
    dir
}

/// Defined, non-local dynamic symbols (`name@@NODE` / `name@NODE`) of an ELF file.
fn defined_dyn_syms(elf: &Path) -> Vec<String> {
    let syms = run(Command::new("readelf").args(["--dyn-syms", "-W"]).arg(elf));
    let mut names: Vec<String> = syms
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            let entry = f.first()?.strip_suffix(':')?.parse::<u32>().is_ok();
            (entry && f.len() >= 8 && f[4] != "LOCAL" && f[6] != "UND").then(|| f[7].to_string())
        })
        .collect();
    names.sort();
    names
}

#[test]
fn exports_match_rdma_core_44_libmlx5() {
    if !tools_present(&["readelf"]) {
        return;
    }
    let so = cdylib();
    let mut expected: Vec<String> = facts(EXPORTS).into_iter().map(String::from).collect();
    expected.sort();
    assert_eq!(expected.len(), 129, "exports.txt");
    assert_eq!(
        defined_dyn_syms(&so),
        expected,
        "exported symbols of {}",
        so.display()
    );

    let dynamic = run(Command::new("readelf").arg("-d").arg(&so));
    assert!(
        dynamic.contains(&format!("Library soname: [{SONAME}]")),
        "SONAME:\n{dynamic}"
    );

    let versions = run(Command::new("readelf").args(["-V", "-W"]).arg(&so));
    for node in facts(NODES) {
        assert!(
            versions.contains(&format!("Name: {node}\n")),
            "version node {node} not defined:\n{versions}"
        );
    }
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
    if !tools_present(&["cc", "readelf"]) {
        return;
    }
    if !Path::new(HEADER).exists() {
        skip(&format!(
            "{HEADER} not installed (Debian package libibverbs-dev)"
        ));
        return;
    }
    let so = cdylib();
    let lib_dir = so.parent().unwrap();
    let run_dir = dropin_dir(&so, "mlx5-c-program");
    let src = run_dir.join("main.c");
    let exe = run_dir.join("main");
    std::fs::write(&src, PROGRAM).unwrap();
    // Link against the cdylib by file name; at run time its SONAME (libmlx5.so.1) is looked
    // up, which the rpath finds as our symlink. `-z now` as the rdma-core tools use.
    run(Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-L")
        .arg(lib_dir)
        .arg(format!("-l:{LIB}"))
        .arg(format!("-Wl,-rpath,{}", run_dir.display()))
        .arg("-Wl,-z,now"));

    let imports = run(Command::new("readelf").args(["--dyn-syms", "-W"]).arg(&exe));
    for want in [
        "mlx5dv_is_supported@MLX5_1.8",
        "mlx5dv_query_device@MLX5_1.0",
        "mlx5dv_init_obj@MLX5_1.2",
        "mlx5dv_create_qp@MLX5_1.3",
        "mlx5dv_devx_get_event@MLX5_1.11",
    ] {
        assert!(
            imports.contains(want),
            "program does not import {want}:\n{imports}"
        );
    }
    let needed = run(Command::new("readelf").arg("-d").arg(&exe));
    assert!(
        needed.contains(&format!("Shared library: [{SONAME}]")),
        "{needed}"
    );

    assert_eq!(run(&mut Command::new(&exe)), EXPECTED);
}

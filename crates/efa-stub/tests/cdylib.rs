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

use std::path::{Path, PathBuf};
use std::process::Command;

const LIB: &str = "libsoftverbs_efa.so";
const SONAME: &str = "libefa.so.1";
const HEADER: &str = "/usr/include/infiniband/efadv.h";
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

/// A scratch directory holding `libefa.so.1` -> our cdylib, as an installation would.
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
fn exports_match_rdma_core_44_libefa() {
    if !tools_present(&["readelf"]) {
        return;
    }
    let so = cdylib();
    let mut expected: Vec<String> = facts(EXPORTS).into_iter().map(String::from).collect();
    expected.sort();
    assert_eq!(expected.len(), 6, "exports.txt");
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
    let run_dir = dropin_dir(&so, "efa-c-program");
    let src = run_dir.join("main.c");
    let exe = run_dir.join("main");
    std::fs::write(&src, PROGRAM).unwrap();
    // Link against the cdylib by file name; at run time its SONAME (libefa.so.1) is looked
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
    for want in ["efadv_query_device@EFA_1.1", "efadv_create_qp_ex@EFA_1.1"] {
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

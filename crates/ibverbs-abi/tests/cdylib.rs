//! Checks the built `libsoftverbs_ibverbs.so` as a drop-in `libibverbs.so.1`:
//!
//! - every symbol in `EXPORTS` is exported at its rdma-core version node (`name@@NODE`)
//!   (plus `softverbs_private_cm@@SOFTVERBS_PRIVATE_1`, which `EXPORTS` lists and its unit
//!   test pins as the only addition), nothing else is exported, all rdma-core 44 nodes are
//!   defined, and the SONAME is `libibverbs.so.1` (`readelf`);
//! - a C program linked against it (no rdma-core headers needed) imports the symbols at their
//!   nodes, starts under `-z now`, and gets the softverbs device and rdma-core's strings;
//! - a C program built against the real rdma-core headers and `libibverbs.so` runs unchanged
//!   on softverbs when `LD_LIBRARY_PATH` points at a `libibverbs.so.1` symlink to ours.
//!
//! Needs `cc` and `readelf` (and libibverbs-dev for the last check); skips loudly without
//! them, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use softverbs_ibverbs::EXPORTS;

/// Version nodes of rdma-core 44's libibverbs (rdma-core-44-exports.txt), and softverbs'
/// private one.
const NODES: &[&str] = &[
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
    "IBVERBS_PRIVATE_34",
    // softverbs' own node: the entry point of its connection manager, for its librdmacm.
    "SOFTVERBS_PRIVATE_1",
];

const LIB: &str = "libsoftverbs_ibverbs.so";

/// The cdylib cargo built alongside the rlib this test links: in the profile directory
/// (`target/debug`), the parent of the `deps` directory holding this test's executable.
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

/// A directory holding `libibverbs.so.1` -> our cdylib, as an installation would.
fn dropin_dir(so: &Path, name: &str) -> PathBuf {
    let dir = common::scratch(name);
    let link = dir.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(so, &link).expect("symlink libibverbs.so.1");
    dir
}

fn tools_present(tools: &[&str]) -> bool {
    for tool in tools {
        if !common::have(tool) {
            common::skip(&format!("`{tool}` not available"));
            return false;
        }
    }
    true
}

/// The program's expected output, shared by both C programs below.
const EXPECTED: &str = "\
devices 1
name softverbs0
index 0
guid 020000fffe000000
status success
status12 transport retry counter exceeded
node InfiniBand channel adapter
port active
event communication established
mult 4
rate 3
";

const MAIN: &str = r#"
int main(void) {
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list) return 1;
    printf("devices %d\n", n);
    printf("name %s\n", ibv_get_device_name(list[0]));
    printf("index %d\n", ibv_get_device_index(list[0]));
    printf("guid %016llx\n", (unsigned long long)be64toh(ibv_get_device_guid(list[0])));
    printf("status %s\n", ibv_wc_status_str(IBV_WC_SUCCESS));
    printf("status12 %s\n", ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
    printf("node %s\n", ibv_node_type_str(IBV_NODE_CA));
    printf("port %s\n", ibv_port_state_str(IBV_PORT_ACTIVE));
    printf("event %s\n", ibv_event_type_str(IBV_EVENT_COMM_EST));
    printf("mult %d\n", ibv_rate_to_mult(IBV_RATE_10_GBPS));
    printf("rate %d\n", (int)mult_to_ibv_rate(4));
    ibv_free_device_list(list);
    return 0;
}
"#;

/// Declarations of just what `MAIN` uses, so this program needs no rdma-core headers.
const OWN_DECLS: &str = r#"
#include <endian.h>
#include <stdint.h>
#include <stdio.h>
struct ibv_device;
enum { IBV_WC_SUCCESS = 0, IBV_WC_RETRY_EXC_ERR = 12, IBV_NODE_CA = 1, IBV_PORT_ACTIVE = 4,
       IBV_EVENT_COMM_EST = 4, IBV_RATE_10_GBPS = 3 };
struct ibv_device **ibv_get_device_list(int *num_devices);
void ibv_free_device_list(struct ibv_device **list);
const char *ibv_get_device_name(struct ibv_device *device);
int ibv_get_device_index(struct ibv_device *device);
uint64_t ibv_get_device_guid(struct ibv_device *device);
const char *ibv_wc_status_str(int status);
const char *ibv_node_type_str(int node_type);
const char *ibv_port_state_str(int port_state);
const char *ibv_event_type_str(int event);
int ibv_rate_to_mult(int rate);
int mult_to_ibv_rate(int mult);
"#;

#[test]
fn exports_carry_rdma_core_version_nodes() {
    if !tools_present(&["readelf"]) {
        return;
    }
    let so = cdylib();
    let syms = common::run(Command::new("readelf").args(["--dyn-syms", "-W"]).arg(&so));
    // Defined, global symbols: the exports and nothing else.
    let mut exported: Vec<String> = syms
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            let entry = f.first()?.strip_suffix(':')?.parse::<u32>().is_ok();
            (entry && f.len() >= 8 && f[4] != "LOCAL" && f[6] != "UND").then(|| f[7].to_string())
        })
        .collect();
    exported.sort();
    let mut expected: Vec<String> = EXPORTS
        .iter()
        .map(|e| match e.default {
            true => format!("{}@@{}", e.name, e.node),
            false => format!("{}@{}", e.name, e.node),
        })
        .collect();
    expected.sort();
    assert_eq!(exported, expected, "exported symbols of {}", so.display());

    let dynamic = common::run(Command::new("readelf").arg("-d").arg(&so));
    assert!(
        dynamic.contains("Library soname: [libibverbs.so.1]"),
        "SONAME:\n{dynamic}"
    );

    let versions = common::run(Command::new("readelf").args(["-V", "-W"]).arg(&so));
    for node in NODES {
        assert!(
            versions.contains(&format!("Name: {node}\n")),
            "version node {node} not defined:\n{versions}"
        );
    }
}

#[test]
fn c_program_links_and_runs() {
    if !tools_present(&["cc", "readelf"]) {
        return;
    }
    let so = cdylib();
    let lib_dir = so.parent().unwrap();
    let run_dir = dropin_dir(&so, "cdylib-link");
    let src = run_dir.join("main.c");
    let exe = run_dir.join("main");
    std::fs::write(&src, format!("{OWN_DECLS}{MAIN}")).unwrap();
    // Link against the cdylib by file name; at run time the SONAME (libibverbs.so.1) is
    // looked up, which the rpath finds as our symlink. `-z now` as the rdma-core tools use.
    common::run(
        Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .arg("-L")
            .arg(lib_dir)
            .arg(format!("-l:{LIB}"))
            .arg(format!("-Wl,-rpath,{}", run_dir.display()))
            .arg("-Wl,-z,now"),
    );

    let imports = common::run(Command::new("readelf").args(["--dyn-syms", "-W"]).arg(&exe));
    // Every default export the program calls is imported at its node.
    for e in EXPORTS
        .iter()
        .filter(|e| e.default && MAIN.contains(&format!("{}(", e.name)))
    {
        let want = format!("{}@{}", e.name, e.node);
        assert!(
            imports.contains(&want),
            "program does not import {want}:\n{imports}"
        );
    }
    let needed = common::run(Command::new("readelf").arg("-d").arg(&exe));
    assert!(needed.contains("Shared library: [libibverbs.so.1]"));

    let out = common::run(Command::new(&exe).env_remove("LD_LIBRARY_PATH"));
    assert_eq!(out, EXPECTED);
}

#[test]
fn rdma_core_program_runs_on_softverbs() {
    if !tools_present(&["cc"]) {
        return;
    }
    if !Path::new(common::VERBS_H).exists() {
        common::skip(&format!(
            "{} not found (apt-get install libibverbs-dev)",
            common::VERBS_H
        ));
        return;
    }
    let so = cdylib();
    let run_dir = dropin_dir(&so, "cdylib-dropin");
    let src = run_dir.join("real.c");
    let exe = run_dir.join("real");
    let program =
        format!("#include <endian.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n{MAIN}");
    std::fs::write(&src, program).unwrap();
    // Built exactly like an rdma-core application: real headers, real libibverbs.so.
    common::run(
        Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .arg("-libverbs")
            .arg("-Wl,-z,now"),
    );
    // LD_LIBRARY_PATH makes the loader pick our libibverbs.so.1 instead of rdma-core's.
    let out = common::run(Command::new(&exe).env("LD_LIBRARY_PATH", &run_dir));
    assert_eq!(out, EXPECTED);
}

//! How librdmacm finds the connection manager in the libibverbs.so.1 it depends on: the
//! private entry point `softverbs_private_cm@SOFTVERBS_PRIVATE_1`, asked for the table version
//! librdmacm was built for. Each case is a small C library standing in for libibverbs.so.1.
//!
//! Needs `cc`; skips loudly without it, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::process::Command;

use softverbs_private_abi::{ABI_VERSION, OPS_SIZE};
use softverbs_rdmacm::ibverbs::{connection_manager, Handle};

/// Builds a shared library whose entry point (when `node` is given) answers `accept` with a
/// table of `version` and `size`, and returns its path.
fn fake_libibverbs(
    name: &str,
    node: Option<&str>,
    accept: u32,
    version: u32,
    size: usize,
) -> String {
    let dir = common::scratch(&format!("hook-{name}"));
    let src = dir.join("fake.c");
    let map = dir.join("fake.map");
    let so = dir.join("libfake.so");
    std::fs::write(
        &src,
        format!(
            "#include <stddef.h>\n#include <stdint.h>\n\
             struct table {{ uint32_t abi_version, size; void *ops[64]; }};\n\
             static struct table table = {{ {version}, {size} }};\n\
             const struct table *softverbs_private_cm(uint32_t v) {{\n\
                 return v == {accept} ? &table : NULL;\n\
             }}\n"
        ),
    )
    .unwrap();
    let script = match node {
        Some(node) => format!("{node} {{ global: softverbs_private_cm; local: *; }};\n"),
        None => "{ local: *; };\n".to_string(),
    };
    std::fs::write(&map, script).unwrap();
    common::run(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src)
            .arg(format!("-Wl,--version-script={}", map.display())),
    );
    so.to_string_lossy().into_owned()
}

fn lookup(path: &str) -> Result<u32, String> {
    let handle = Handle::open(path).unwrap();
    connection_manager(handle, path).map(|ops| ops.abi_version)
}

#[test]
fn the_entry_point_is_found_at_its_private_node() {
    if !common::tools_present(&["cc"]) {
        return;
    }
    let ok = fake_libibverbs(
        "ok",
        Some("SOFTVERBS_PRIVATE_1"),
        ABI_VERSION,
        ABI_VERSION,
        OPS_SIZE + 64,
    );
    assert_eq!(lookup(&ok), Ok(ABI_VERSION));
}

#[test]
fn a_library_without_it_is_not_softverbs() {
    if !common::tools_present(&["cc"]) {
        return;
    }
    for (name, node) in [
        ("absent", None),
        ("other-node", Some("SOFTVERBS_PRIVATE_2")),
    ] {
        let lib = fake_libibverbs(name, node, ABI_VERSION, ABI_VERSION, OPS_SIZE);
        let err = lookup(&lib).unwrap_err();
        assert!(
            err.contains(&format!(
                "{lib} has no softverbs_private_cm@SOFTVERBS_PRIVATE_1"
            )) && err.contains("not softverbs' libibverbs.so.1"),
            "{name}: {err}"
        );
    }
}

#[test]
fn a_table_of_another_build_is_refused() {
    if !common::tools_present(&["cc"]) {
        return;
    }
    // Does not offer our version at all.
    let lib = fake_libibverbs(
        "refuses",
        Some("SOFTVERBS_PRIVATE_1"),
        ABI_VERSION + 1,
        ABI_VERSION,
        OPS_SIZE,
    );
    let err = lookup(&lib).unwrap_err();
    assert!(
        err.contains(&format!("does not offer table version {ABI_VERSION}")),
        "{err}"
    );
    // Answers with a table of another version, or one too small for ours.
    for (name, version, size) in [
        ("other-version", ABI_VERSION + 1, OPS_SIZE),
        ("too-small", ABI_VERSION, OPS_SIZE - 8),
    ] {
        let lib = fake_libibverbs(
            name,
            Some("SOFTVERBS_PRIVATE_1"),
            ABI_VERSION,
            version,
            size,
        );
        let err = lookup(&lib).unwrap_err();
        assert!(
            err.contains("come from different softverbs builds"),
            "{name}: {err}"
        );
    }
}

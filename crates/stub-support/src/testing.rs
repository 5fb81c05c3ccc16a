//! Checks a stub library's integration tests run against the built cdylib: that it
//! exports exactly rdma-core's symbols at their version nodes with the right SONAME,
//! and that a C program built against the real header gets the stub results; and
//! ([`layout`]) that `#[repr(C)]` mirrors match the installed headers.
//!
//! They need `readelf`, `cc` and the header; without them they skip loudly, or fail
//! when `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod layout;

/// A stub library as its tests see it.
#[derive(Debug, Clone, Copy)]
pub struct StubLib {
    /// The file cargo builds, e.g. `libsoftverbs_efa.so`.
    pub file: &'static str,
    /// The SONAME it is installed under, e.g. `libefa.so.1`.
    pub soname: &'static str,
    /// `name@@NODE` / `name@NODE` lines (`#` comments allowed).
    pub exports: &'static str,
    /// The version nodes it must define, one per line.
    pub nodes: &'static str,
}

/// The lines of a data file, without comments and blank lines.
pub fn facts(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

fn tools_required() -> bool {
    std::env::var("SOFTVERBS_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Skips loudly, or panics when `SOFTVERBS_REQUIRE_TOOLS=1`.
pub fn skip(why: &str) {
    if tools_required() {
        panic!("{why} (SOFTVERBS_REQUIRE_TOOLS=1, so this is an error)");
    }
    eprintln!("SKIPPED: {why}");
    eprintln!("SKIPPED: set SOFTVERBS_REQUIRE_TOOLS=1 to make this an error");
}

/// Whether every tool runs; skips (or fails) for the first that does not.
pub fn tools_present(tools: &[&str]) -> bool {
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
pub fn run(cmd: &mut Command) -> String {
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

impl StubLib {
    /// The cdylib cargo built alongside the rlib: in the profile directory
    /// (`target/debug`), the parent of the `deps` directory holding the running test.
    pub fn cdylib(&self) -> PathBuf {
        let exe = std::env::current_exe().expect("test executable path");
        let deps = exe.parent().expect("deps dir");
        for dir in [deps.parent().expect("profile dir"), deps] {
            let so = dir.join(self.file);
            if so.exists() {
                return so;
            }
        }
        panic!("{} not found next to {}", self.file, deps.display());
    }

    /// A directory `dir` holding `SONAME -> so`, as an installation would.
    fn dropin_dir(&self, so: &Path, dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).expect("create scratch dir");
        let link = dir.join(self.soname);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(so, &link).expect("symlink SONAME");
        dir.to_path_buf()
    }

    /// Checks the built library exports exactly `exports` (`expected_count` of them),
    /// defines every node of `nodes`, and has the SONAME.
    pub fn check_exports(&self, expected_count: usize) {
        if !tools_present(&["readelf"]) {
            return;
        }
        let so = self.cdylib();
        let mut expected: Vec<String> = facts(self.exports).into_iter().map(String::from).collect();
        expected.sort();
        assert_eq!(expected.len(), expected_count, "exports.txt");
        assert_eq!(
            defined_dyn_syms(&so),
            expected,
            "exported symbols of {}",
            so.display()
        );
        let dynamic = run(Command::new("readelf").arg("-d").arg(&so));
        assert!(
            dynamic.contains(&format!("Library soname: [{}]", self.soname)),
            "SONAME:\n{dynamic}"
        );
        let versions = run(Command::new("readelf").args(["-V", "-W"]).arg(&so));
        for node in facts(self.nodes) {
            assert!(
                versions.contains(&format!("Name: {node}\n")),
                "version node {node} not defined:\n{versions}"
            );
        }
    }

    /// Builds `program` (which includes `header`) in `scratch` against the library by
    /// file name, runs it through a SONAME symlink found by rpath with `-z now` as
    /// rdma-core's tools use, and checks it imports `imports` and prints `expected`.
    pub fn check_c_program(
        &self,
        header: &str,
        scratch: &Path,
        program: &str,
        imports: &[&str],
        expected: &str,
    ) {
        if !tools_present(&["cc", "readelf"]) {
            return;
        }
        if !Path::new(header).exists() {
            skip(&format!(
                "{header} not installed (Debian package libibverbs-dev)"
            ));
            return;
        }
        let so = self.cdylib();
        let lib_dir = so.parent().expect("library directory");
        let run_dir = self.dropin_dir(&so, scratch);
        let src = run_dir.join("main.c");
        let exe = run_dir.join("main");
        std::fs::write(&src, program).expect("write the C program");
        run(Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .arg("-L")
            .arg(lib_dir)
            .arg(format!("-l:{}", self.file))
            .arg(format!("-Wl,-rpath,{}", run_dir.display()))
            .arg("-Wl,-z,now"));
        let symbols = run(Command::new("readelf").args(["--dyn-syms", "-W"]).arg(&exe));
        for want in imports {
            assert!(
                symbols.contains(want),
                "program does not import {want}:\n{symbols}"
            );
        }
        let needed = run(Command::new("readelf").arg("-d").arg(&exe));
        assert!(
            needed.contains(&format!("Shared library: [{}]", self.soname)),
            "{needed}"
        );
        assert_eq!(run(&mut Command::new(&exe)), expected);
    }
}

/// Defined, non-local dynamic symbols (`name@@NODE` / `name@NODE`) of an ELF file.
pub fn defined_dyn_syms(elf: &Path) -> Vec<String> {
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

//! `softverbs run -- CMD ARGS...`: runs an unmodified rdma-core program on the drop-in
//! `libibverbs.so.1` (crate softverbs-ibverbs-abi) and `librdmacm.so.1` (crate
//! softverbs-rdmacm-abi) built next to this binary; with `--sockets`, also with
//! rdma-core's `librspreload.so` preloaded, so an unmodified socket program's sockets become
//! rsockets of that librdmacm.

use std::error::Error;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;

use crate::devnode::{self, DevNodeMode};

/// The cdylib cargo builds beside the `softverbs` binary.
const LIB: &str = "libsoftverbs_ibverbs.so";

/// The other libraries rdma-core programs link besides libibverbs, linked in when built so
/// the system's real ones, which need the kernel, are never loaded: the drop-in librdmacm
/// (crate softverbs-rdmacm-abi, which reaches the device through the libibverbs beside it),
/// and the provider libraries perftest links (crates softverbs-mlx5-stub and
/// softverbs-efa-stub).
const ALSO: [(&str, &str); 3] = [
    ("libsoftverbs_rdmacm.so", "librdmacm.so.1"),
    ("libsoftverbs_mlx5.so", "libmlx5.so.1"),
    ("libsoftverbs_efa.so", "libefa.so.1"),
];

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Give the program /dev/infiniband/softverbs0, the device node UCX requires before it
    /// uses a device, in a private mount namespace (see docs/scale-out.md).
    #[arg(long, value_enum, default_value_t = DevNodeMode::Auto)]
    dev_node: DevNodeMode,
    /// Also preload rdma-core's librspreload.so (Debian package librdmacm1), which turns the
    /// program's TCP and UDP sockets into rsockets over softverbs.
    #[arg(long)]
    sockets: bool,
    /// The program to run, then its arguments (put `--` before them).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<OsString>,
}

/// Where distributions install rdma-core's socket preload library (package librdmacm1).
const RSPRELOAD_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/rsocket",
    "/usr/lib/aarch64-linux-gnu/rsocket",
    "/usr/lib64/rsocket",
    "/usr/lib/rsocket",
];

/// Names a librspreload.so to use instead of searching [`RSPRELOAD_DIRS`].
const RSPRELOAD_ENV: &str = "SOFTVERBS_RSPRELOAD";

/// rdma-core's librspreload.so: `$SOFTVERBS_RSPRELOAD` when set (it must exist), else the
/// first of the usual places that has it.
fn rspreload() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(RSPRELOAD_ENV).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "{RSPRELOAD_ENV}={} is not a file: --sockets needs rdma-core's librspreload.so",
                p.display()
            ))
        };
    }
    RSPRELOAD_DIRS
        .iter()
        .map(|d| Path::new(d).join("librspreload.so"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "--sockets needs rdma-core's librspreload.so, found in none of {}: install it \
                 (Debian: apt-get install librdmacm1) or name it with {RSPRELOAD_ENV}",
                RSPRELOAD_DIRS.join(", ")
            )
        })
}

/// Points `dir/name` at `target`, atomically, unless it already does.
fn link_into(dir: &Path, name: &str, target: &Path) -> std::io::Result<()> {
    let link = dir.join(name);
    if std::fs::read_link(&link).ok().as_deref() != Some(target) {
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(())
}

/// The directory holding `libibverbs.so.1` -> the drop-in library (and librdmacm and the
/// provider stubs, when built), created if needed.
fn dropin_dir() -> Result<PathBuf, Box<dyn Error + Send + Sync>> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or("cannot locate the softverbs binary's directory")?;
    let lib = [dir, dir.parent().unwrap_or(dir)]
        .iter()
        .map(|d| d.join(LIB))
        .find(|p| p.exists())
        .ok_or_else(|| {
            format!(
                "{LIB} not found next to {} (build it: cargo build -p softverbs-ibverbs-abi)",
                exe.display()
            )
        })?;
    let lib = lib.canonicalize()?;
    let libdir = lib.parent().unwrap_or(Path::new("."));
    let dropin = libdir.join("dropin");
    std::fs::create_dir_all(&dropin)?;
    link_into(&dropin, "libibverbs.so.1", &lib)?;
    for (built, soname) in ALSO {
        let lib = libdir.join(built);
        if lib.exists() {
            link_into(&dropin, soname, &lib)?;
        }
    }
    Ok(dropin)
}

/// Execs the program; returns only on failure.
pub fn run(a: &RunArgs) -> Result<(), Box<dyn Error + Send + Sync>> {
    let preload = if a.sockets { Some(rspreload()?) } else { None };
    let dropin = dropin_dir()?;
    match devnode::provide(a.dev_node) {
        Ok(_) => {}
        Err(e) if a.dev_node == DevNodeMode::Required => return Err(e.into()),
        Err(e) => eprintln!(
            "softverbs run: {e}; running without {} (UCX will not list softverbs0; \
             see docs/scale-out.md)",
            devnode::node_path().display()
        ),
    }
    let mut path = OsString::from(dropin.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut cmd = Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]).env("LD_LIBRARY_PATH", path);
    if let Some(lib) = preload {
        // First, so its socket calls win; what the caller preloads stays after it.
        let mut list = OsString::from(lib.as_os_str());
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            list.push(":");
            list.push(old);
        }
        cmd.env("LD_PRELOAD", list);
    }
    let err = cmd.exec();
    Err(format!("cannot run {}: {err}", a.cmd[0].to_string_lossy()).into())
}

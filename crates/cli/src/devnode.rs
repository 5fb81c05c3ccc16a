//! The device node UCX looks for, provided in a private mount namespace.
//!
//! UCX 1.13 lists an IB device only if `/dev/infiniband/<ibv_device.dev_name>` is a
//! character device the process may open for reading and writing
//! (`uct_ib_device_is_accessible` in `src/uct/ib/base/ib_md.c`: `stat` + `S_ISCHR` +
//! `access(R_OK | W_OK)`); it never opens it, as the verbs library does that. softverbs has
//! no kernel device, so `softverbs run` gives the program a private view of `/dev`: a tmpfs
//! holding every entry of the real `/dev` (bind mounts, so devices, `/dev/shm` and `/dev/pts`
//! are the host's own) plus `infiniband/softverbs0`, a bind mount of `/dev/null`. Nothing
//! outside the program and its children sees it.
//!
//! As root this needs only a new mount namespace; otherwise a new user namespace in which the
//! caller's uid and gid map to themselves (where the host allows unprivileged user
//! namespaces), so the program keeps its identity and gains no privilege on the host. Nothing
//! else UCX reads needs faking: its sysfs reads (`/sys/class/infiniband/<dev>/device/...`,
//! `realpath(ibdev_path)`) fall back to "NUMA node unknown, every CPU local" when absent.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::ValueEnum;

/// The device name softverbs' `libibverbs.so.1` gives `ibv_device.dev_name` (crate
/// softverbs-ibverbs-abi, `device.rs`).
pub const DEV_NAME: &str = "softverbs0";

/// Where UCX looks for the node.
const DEV_DIR: &str = "/dev/infiniband";

/// What `softverbs run` does about the device node.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DevNodeMode {
    /// Provide it in a private mount namespace if the host has none; if no namespace can be
    /// made, say so on stderr and run the program without it.
    Auto,
    /// As `auto`, but fail instead of running without it.
    Required,
    /// Leave /dev alone.
    Off,
}

/// What happened to the device node.
#[derive(Debug, PartialEq, Eq)]
pub enum Provided {
    /// The host already has a node UCX accepts (the one-time root step of docs/scale-out.md).
    OnHost,
    /// In a new mount namespace (as root).
    MountNamespace,
    /// In new user and mount namespaces (unprivileged).
    UserNamespace,
    /// `--dev-node off`.
    Off,
}

/// Why no node could be provided.
#[derive(Debug, thiserror::Error)]
pub enum DevNodeError {
    #[error("cannot make a private mount namespace ({root}): {source}")]
    Unshare {
        root: &'static str,
        source: io::Error,
    },
    #[error("cannot map the user and group ids in the new user namespace: {0}")]
    IdMap(io::Error),
    #[error("cannot build a private /dev with {node} ({step}): {source}")]
    Mount {
        node: String,
        step: String,
        source: io::Error,
    },
}

/// The path UCX checks for a device.
pub fn node_path() -> PathBuf {
    Path::new(DEV_DIR).join(DEV_NAME)
}

/// Whether `path` passes UCX's test: a character device this process may read and write.
pub fn ucx_accepts(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    meta.file_type().is_char_device()
        && unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) } == 0
}

/// Makes `/dev/infiniband/softverbs0` visible to this process and the children it execs.
/// Must run while the process is single-threaded (a user namespace cannot be entered
/// otherwise).
pub fn provide(mode: DevNodeMode) -> Result<Provided, DevNodeError> {
    if mode == DevNodeMode::Off {
        return Ok(Provided::Off);
    }
    let node = node_path();
    if ucx_accepts(&node) {
        return Ok(Provided::OnHost);
    }
    let how = enter_namespaces()?;
    private_dev(&node)?;
    Ok(how)
}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// Enters a new mount namespace, inside a new user namespace unless root (or unless root
/// may not make one, as in a container without CAP_SYS_ADMIN), and stops mount events
/// from leaving it.
fn enter_namespaces() -> Result<Provided, DevNodeError> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let how = 'how: {
        if root {
            // SAFETY: unshare only changes this process's namespaces.
            if unsafe { libc::unshare(libc::CLONE_NEWNS) } == 0 {
                break 'how Provided::MountNamespace;
            }
        }
        // SAFETY: geteuid/getegid have no preconditions; read before the ids change.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        // SAFETY: as above; fails with EINVAL if the process has more than one thread.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
            return Err(DevNodeError::Unshare {
                root: if root {
                    "as root, neither a mount namespace nor a user namespace"
                } else {
                    "an unprivileged user namespace; the host may not allow them"
                },
                source: last_error(),
            });
        }
        // user_namespaces(7): an unprivileged process maps exactly its own ids, and must
        // deny setgroups before it may write gid_map.
        let write = |file: &str, text: String| std::fs::write(format!("/proc/self/{file}"), text);
        write("setgroups", "deny".into())
            .and_then(|()| write("uid_map", format!("{uid} {uid} 1\n")))
            .and_then(|()| write("gid_map", format!("{gid} {gid} 1\n")))
            .map_err(DevNodeError::IdMap)?;
        Provided::UserNamespace
    };
    // Mounts made from here on stay in this namespace (mount_namespaces(7)); the host's
    // later mounts still propagate in.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_SLAVE,
        None,
    )
    .map_err(|e| DevNodeError::Mount {
        node: node_path().display().to_string(),
        step: "making / a slave mount".into(),
        source: e,
    })?;
    Ok(how)
}

fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(|s| cstr(s.as_os_str())).transpose()?;
    let target = cstr(target.as_os_str())?;
    let fstype = fstype.map(|s| cstr(OsStr::new(s))).transpose()?;
    let data = data.map(|s| cstr(OsStr::new(s))).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is NULL or a NUL-terminated string alive for the call.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// One entry of a directory to rebuild: its name and what to recreate it as.
enum Entry {
    Dir(OsString),
    Other(OsString),
    Symlink(OsString, PathBuf),
}

fn entries(dir: &Path) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let ty = e.file_type()?;
        out.push(if ty.is_symlink() {
            Entry::Symlink(name, std::fs::read_link(e.path())?)
        } else if ty.is_dir() {
            Entry::Dir(name)
        } else {
            Entry::Other(name)
        });
    }
    Ok(out)
}

/// Replaces `/dev` (in this mount namespace) by a tmpfs holding bind mounts of every entry
/// of the real one, plus the device node; if any step fails, the real `/dev` comes back.
fn private_dev(node: &Path) -> Result<(), DevNodeError> {
    let dev = Path::new("/dev");
    let step_err = |step: String| {
        let node = node.display().to_string();
        move |source| DevNodeError::Mount { node, step, source }
    };
    let old_dev = entries(dev).map_err(step_err("reading /dev".into()))?;
    let old_ib = entries(Path::new(DEV_DIR)).ok();
    // The real /dev stays reachable through this descriptor once the tmpfs covers it.
    let dev_fd = std::fs::File::open(dev).map_err(step_err("opening /dev".into()))?;
    let real = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&dev_fd)
    ));
    let mode = std::fs::metadata(dev).map_or(0o755, |m| m.permissions().mode() & 0o7777);
    mount(
        Some(Path::new("tmpfs")),
        dev,
        Some("tmpfs"),
        libc::MS_NOSUID,
        Some(&format!("mode={mode:o}")),
    )
    .map_err(step_err("mounting a tmpfs on /dev".into()))?;
    let built = rebuild(&real, dev, &old_dev, old_ib.as_deref(), node);
    if let Err((step, source)) = built {
        // Unmounting the tmpfs (and the binds under it) gives the real /dev back.
        let c = cstr(dev.as_os_str()).expect("/dev has no NUL");
        // SAFETY: `c` is a valid path; MNT_DETACH detaches the tmpfs tree lazily.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        return Err(step_err(step)(source));
    }
    Ok(())
}

/// Fills the new `/dev` (`new`) from the real one (`real`): each entry bound over a
/// placeholder of its kind, symlinks copied; `infiniband/` is made here, its own entries
/// bound one by one, so the node is never created on the host's /dev.
fn rebuild(
    real: &Path,
    new: &Path,
    old_dev: &[Entry],
    old_ib: Option<&[Entry]>,
    node: &Path,
) -> Result<(), (String, io::Error)> {
    let ib_name = Path::new(DEV_DIR).file_name().expect("DEV_DIR has a name");
    bind_entries(real, new, old_dev, Some(ib_name))?;
    let ib_dir = new.join(ib_name);
    std::fs::create_dir(&ib_dir).map_err(|e| (format!("creating {}", ib_dir.display()), e))?;
    if let Some(old_ib) = old_ib {
        bind_entries(&real.join(ib_name), &ib_dir, old_ib, node.file_name())?;
    }
    std::fs::write(node, b"").map_err(|e| (format!("creating {}", node.display()), e))?;
    mount(Some(&real.join("null")), node, None, libc::MS_BIND, None)
        .map_err(|e| (format!("binding /dev/null on {}", node.display()), e))
}

fn bind_entries(
    from: &Path,
    to: &Path,
    entries: &[Entry],
    skip: Option<&OsStr>,
) -> Result<(), (String, io::Error)> {
    for e in entries {
        let (name, at) = match e {
            Entry::Dir(n) | Entry::Other(n) | Entry::Symlink(n, _) => (n, to.join(n)),
        };
        if Some(name.as_os_str()) == skip {
            continue;
        }
        let made = match e {
            Entry::Symlink(_, target) => std::os::unix::fs::symlink(target, &at),
            Entry::Dir(_) => std::fs::create_dir(&at),
            Entry::Other(_) => std::fs::write(&at, b""),
        };
        made.map_err(|err| (format!("creating {}", at.display()), err))?;
        if !matches!(e, Entry::Symlink(..)) {
            // MS_REC: submounts come along (/dev/pts, /dev/shm); a user namespace may not
            // bind a mount without its locked submounts anyway.
            mount(
                Some(&from.join(name)),
                &at,
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            )
            .map_err(|err| (format!("binding {}", at.display()), err))?;
        }
    }
    Ok(())
}

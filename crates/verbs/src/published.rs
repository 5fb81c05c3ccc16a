//! Counters published for other processes: each open device keeps a small text
//! file `<dir>/<address>-<port>.stat` up to date (name/value lines), so `softverbs stat`
//! can show every live device on the host. `<dir>` is `$XDG_RUNTIME_DIR/softverbs`
//! or `/tmp/softverbs-<uid>`.

use std::fmt::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The directory devices publish their counters in.
pub fn stats_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("softverbs"),
        // SAFETY: getuid has no preconditions and cannot fail.
        _ => PathBuf::from(format!("/tmp/softverbs-{}", unsafe { libc::getuid() })),
    }
}

/// The file name stem of a device: its address and port (devices share ports: 4791).
fn stem(local: SocketAddr) -> String {
    format!("{}-{}", local.ip(), local.port())
}

fn file_for(local: SocketAddr) -> PathBuf {
    stats_dir().join(format!("{}.stat", stem(local)))
}

/// Writes `lines` as the device's counter file (atomically: temp file + rename).
pub(crate) fn publish(local: SocketAddr, lines: &[(&str, u64)]) -> std::io::Result<()> {
    let dir = stats_dir();
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".{}.{}.tmp", stem(local), std::process::id()));
    // The whole text in one write: an unbuffered line at a time was some 200 system
    // calls per publication, ten times a second per device, on the data path's threads.
    let mut text = format!("pid {}\naddr {local}\n", std::process::id());
    for (name, value) in lines {
        let _ = writeln!(text, "{name} {value}");
    }
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file_for(local))
}

/// Removes the device's counter file.
pub(crate) fn unpublish(local: SocketAddr) {
    let _ = std::fs::remove_file(file_for(local));
}

/// One device's published counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedCounters {
    /// The process that owns the device.
    pub pid: u32,
    /// The device's UDP endpoint.
    pub addr: String,
    /// Counter names and values, in file order.
    pub counters: Vec<(String, u64)>,
}

/// The counters of every device on this host whose process is still alive.
pub fn read_published() -> Vec<PublishedCounters> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(stats_dir()) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("stat") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let mut p = PublishedCounters {
            pid: 0,
            addr: String::new(),
            counters: Vec::new(),
        };
        for line in text.lines() {
            let Some((k, v)) = line.split_once(' ') else {
                continue;
            };
            match k {
                "pid" => p.pid = v.parse().unwrap_or(0),
                "addr" => p.addr = v.to_string(),
                _ => {
                    if let Ok(n) = v.parse() {
                        p.counters.push((k.to_string(), n));
                    }
                }
            }
        }
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = p.pid != 0 && unsafe { libc::kill(p.pid as libc::pid_t, 0) } == 0;
        if alive {
            out.push(p);
        } else {
            let _ = std::fs::remove_file(&path); // left behind by a crashed process
        }
    }
    out.sort_by(|a, b| a.addr.cmp(&b.addr));
    out
}

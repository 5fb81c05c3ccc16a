//! A responder whose counter file cannot be written still answers (issue 15, session 7).
//!
//! Lossless `ib_read_bw` runs failed with `RETRY_EXC_ERR` on a loaded host: the
//! responder's progress thread published its counters (`softverbs stat`) itself, and the
//! rename that replaced the old file waited 0.7 s for the disk (a file system mounted
//! with `discard`), while READ requests waited unread in its socket. Here the write
//! blocks for good: the temporary file the responder writes its counters to is a FIFO
//! nobody reads, so opening it blocks until a reader comes. The responder's application
//! does nothing, as `ib_read_bw`'s server: only its progress thread can answer.
//!
//! One test in this binary: it points `XDG_RUNTIME_DIR` (where counter files go) at a
//! directory of its own before any device opens.

use softverbs::*;
use std::ffi::CString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

mod common;
use common::*;

const WAIT: Duration = Duration::from_secs(20);

/// Makes a FIFO at `path`: opening it to write blocks until someone opens it to read.
fn make_fifo(path: &std::path::Path) {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a live NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {path:?}"
    );
}

/// Dropped before the devices (declared after them, and dropped first by the test), it
/// unblocks a writer stuck on the FIFO and removes it, so that the devices can close
/// whether the test passed or not.
struct Unblock(PathBuf);

impl Drop for Unblock {
    fn drop(&mut self) {
        let c = CString::new(self.0.to_str().unwrap()).unwrap();
        // Opening a FIFO read-write never blocks and gives a blocked writer its reader;
        // once the path is gone, later writes create a plain file.
        // SAFETY: `c` is a live NUL-terminated path; the descriptor is closed below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_NONBLOCK) };
        let _ = std::fs::remove_file(&self.0);
        if fd >= 0 {
            // SAFETY: `fd` was opened above and is closed once.
            unsafe { libc::close(fd) };
        }
    }
}

#[test]
fn a_responder_whose_counter_file_blocks_still_answers_reads() {
    let dir = std::env::temp_dir().join(format!("softverbs-stall-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("softverbs")).unwrap();
    // Before any device (and thread of the library) exists: counter files go there.
    std::env::set_var("XDG_RUNTIME_DIR", &dir);
    // The responder's address of its own, so the name of its counter file is known
    // before it opens (`crate::published`: `.ADDR-PORT.PID.tmp`, renamed to `ADDR-PORT.stat`).
    let addr: IpAddr = [127, 97, (std::process::id() % 250) as u8, 1].into();
    let stem = format!("{addr}-4791");
    let fifo = dir
        .join("softverbs")
        .join(format!(".{stem}.{}.tmp", std::process::id()));
    make_fifo(&fifo);
    // Its first publication, as it opens, blocks on the FIFO.
    let responder = end(Config {
        addr: Some(addr),
        port: Some(4791),
        ..Config::default()
    });
    let requester = end(Config::default());
    let unblock = Unblock(fifo);
    connect(&requester, &responder, Mtu::Mtu4096);
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 + 3) as u8).collect();
    responder.mr.write(0, &data);
    // Several READs, 64 KiB each, as ib_read_bw posts them.
    let n = 16u64;
    for i in 0..n {
        let sges = [requester.mr.sge(i as usize * 65536 % (1 << 20), 65536)];
        requester
            .qp
            .post_send(&SendWr::new(
                i,
                SendOp::RdmaRead {
                    remote_addr: responder.mr.addr() + (i % 4) * 65536,
                    rkey: Rkey(responder.mr.rkey()),
                },
                &sges,
            ))
            .unwrap();
    }
    let wcs = requester.cq.wait_for(n as usize, WAIT);
    let statuses: Vec<WcStatus> = wcs.iter().map(|w| w.status).collect();
    // The writer is still blocked: no counter file of the responder was ever written.
    let stat = dir.join("softverbs").join(format!("{stem}.stat"));
    assert!(
        !stat.exists(),
        "the responder's counter file was written: the FIFO did not block its writer"
    );
    assert_eq!(wcs.len() as u64, n, "READs completed: {statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == WcStatus::Success),
        "READs failed while the counter file blocked: {statuses:?}"
    );
    let mut got = vec![0u8; 65536];
    requester.mr.read(0, &mut got);
    assert_eq!(got[..], data[..65536]);
    drop(unblock);
    drop((requester, responder));
    let _ = std::fs::remove_dir_all(&dir);
}

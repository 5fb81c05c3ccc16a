//! copy-limits: how fast this host copies one message, as the anchors of a
//! same-host RDMA path (issue 16).
//!
//!   memcpy             within this process, both buffers warm in cache
//!   process_vm_writev  from this process into a child process's buffer
//!   process_vm_readv   from the child's buffer into this process
//!
//! The child is this program started again with `--child SIZE`: it allocates
//! its buffer, prints its pid and the buffer's address, and answers `check N`
//! lines on stdin with `ok` when its buffer holds pattern N (`bad` otherwise).
//! After the timed loops the parent writes a fresh pattern with
//! process_vm_writev and has the child check it, and reads it back with
//! process_vm_readv and checks it itself, so a figure is only printed for
//! copies that really happened.
//!
//! Usage: copy-limits [--size BYTES] [--secs S] [--warmup S]
//! Prints key=value lines: size, memcpy_gbs, process_vm_writev_gbs,
//! process_vm_readv_gbs (GB = 10^9 bytes), and check=ok.

use softverbs_bench_tools::{
    error, fill_pattern, holds_pattern, run_for, seconds, Options, Result,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};

const HELP: &str = "\
copy-limits [--size BYTES] [--secs S] [--warmup S]
  memcpy, process_vm_writev and process_vm_readv of one message of BYTES
  (default 65536), each timed for S seconds (default 2) after a warm-up
  (default 0.2 s). Prints key=value lines; GB/s are 10^9 bytes per second.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("--child") {
        child(&args[1..])
    } else if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{HELP}");
        Ok(())
    } else {
        parent(Options::new(args))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("copy-limits: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Page size assumed for placing the buffers.
const PAGE: usize = 4096;

/// The `size` bytes of `store` (which has `size + PAGE`) that start at a page boundary.
///
/// Every buffer of this program starts at a page, as `softverbs perf`'s and perftest's
/// memory regions do: the distance between a copy's source and destination modulo 4096
/// decides its speed on some hosts (1-63 bytes ahead: 3-20x slower, session 18's 4K
/// aliasing, `softverbs_engine::copy`), and two heap vectors of 64 KiB in a row sat 16
/// bytes apart, so this program's memcpy and process_vm_writev limits read 1.6-1.9 GB/s
/// where the host does 26-39 and 5-8.
fn at_page_start(store: &mut [u8], size: usize) -> &mut [u8] {
    let skip = (PAGE - store.as_ptr() as usize % PAGE) % PAGE;
    &mut store[skip..skip + size]
}

/// The child: owns the target buffer until its stdin closes.
fn child(args: &[String]) -> Result<()> {
    let size: usize = args
        .first()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| error!("--child needs a size"))?;
    // Touched now, so the parent's copies never take page faults.
    let mut store = vec![0u8; size + PAGE];
    let buf = at_page_start(&mut store, size);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{} {:#x}", std::process::id(), buf.as_ptr() as usize)?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let round: u64 = line
            .strip_prefix("check ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| error!("child: unexpected request {line:?}"))?;
        // The parent writes into `buf` behind the compiler's back: black_box
        // makes the compiler assume the bytes behind it may have changed.
        let seen = std::hint::black_box(&*buf);
        let verdict = if holds_pattern(seen, round) {
            "ok"
        } else {
            "bad"
        };
        writeln!(out, "{verdict}")?;
        out.flush()?;
    }
    Ok(())
}

/// The child process and where its buffer is.
struct Target {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pid: libc::pid_t,
    addr: usize,
}

impl Target {
    fn start(size: usize) -> Result<Target> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["--child", &size.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| error!("cannot start the child process: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let parsed = line.split_once(' ').and_then(|(pid, addr)| {
            let pid = pid.parse().ok()?;
            let addr = usize::from_str_radix(addr.trim().trim_start_matches("0x"), 16).ok()?;
            Some((pid, addr))
        });
        let Some((pid, addr)) = parsed else {
            return Err(error!("the child said {line:?}, not its pid and address"));
        };
        Ok(Target {
            child,
            stdin,
            stdout,
            pid,
            addr,
        })
    }

    /// Asks the child whether its buffer holds pattern `round`.
    fn holds(&mut self, round: u64) -> Result<bool> {
        writeln!(self.stdin, "check {round}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line.trim() == "ok")
    }

    fn finish(self) -> Result<()> {
        let Target {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let status = child.wait()?;
        if !status.success() {
            return Err(error!("the child process failed ({status})"));
        }
        Ok(())
    }

    /// Copies `local` into the child's buffer.
    fn write(&self, local: &[u8]) -> Result<()> {
        let liov = libc::iovec {
            iov_base: local.as_ptr() as *mut libc::c_void,
            iov_len: local.len(),
        };
        let riov = libc::iovec {
            iov_base: self.addr as *mut libc::c_void,
            iov_len: local.len(),
        };
        // SAFETY: the local iovec describes `local`, which lives for the call and
        // which the kernel only reads; the remote range is the child's, and the
        // kernel checks it against the child's mappings (EFAULT otherwise).
        let n = unsafe { libc::process_vm_writev(self.pid, &liov, 1, &riov, 1, 0) };
        check_transfer("process_vm_writev", n, local.len())
    }

    /// Copies the child's buffer into `local`.
    fn read(&self, local: &mut [u8]) -> Result<()> {
        let liov = libc::iovec {
            iov_base: local.as_mut_ptr().cast(),
            iov_len: local.len(),
        };
        let riov = libc::iovec {
            iov_base: self.addr as *mut libc::c_void,
            iov_len: local.len(),
        };
        // SAFETY: the local iovec describes `local`, exclusively borrowed for the
        // call, so the kernel may write all of it; the remote range is checked by
        // the kernel against the child's mappings.
        let n = unsafe { libc::process_vm_readv(self.pid, &liov, 1, &riov, 1, 0) };
        check_transfer("process_vm_readv", n, local.len())
    }
}

fn check_transfer(what: &str, n: isize, want: usize) -> Result<()> {
    if n < 0 {
        let e = std::io::Error::last_os_error();
        let hint = if matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) {
            " (not permitted here: needs ptrace rights over the child, i.e. the same user and \
             kernel.yama.ptrace_scope <= 1, and no seccomp filter refusing the call)"
        } else {
            ""
        };
        return Err(error!("{what}: {e}{hint}"));
    }
    if n as usize != want {
        return Err(error!("{what}: moved {n} of {want} bytes"));
    }
    Ok(())
}

fn parent(mut o: Options) -> Result<()> {
    let size: usize = o.value("--size", 65536)?;
    let span = seconds(o.value("--secs", 2.0)?)?;
    let warmup = seconds(o.value("--warmup", 0.2)?)?;
    o.finish()?;
    if size == 0 || size > 1 << 30 {
        return Err(error!("--size must be between 1 byte and 1 GiB"));
    }
    println!("size={size}");

    let (mut src_store, mut dst_store) = (vec![0u8; size + PAGE], vec![0u8; size + PAGE]);
    let (src, dst) = (
        at_page_start(&mut src_store, size),
        at_page_start(&mut dst_store, size),
    );
    fill_pattern(src, 1);
    let memcpy = run_for(warmup, span, || {
        // black_box on both sides: the copy is neither hoisted nor dropped.
        std::hint::black_box(&mut *dst).copy_from_slice(std::hint::black_box(&*src));
        Ok(())
    })?;
    if !holds_pattern(dst, 1) {
        return Err(error!("memcpy: the destination does not hold the source"));
    }
    println!("memcpy_gbs={:.3}", memcpy.gb_per_sec(size));

    let mut target = Target::start(size)?;
    let writes = run_for(warmup, span, || target.write(src))?;
    println!("process_vm_writev_gbs={:.3}", writes.gb_per_sec(size));
    let reads = run_for(warmup, span, || target.read(dst))?;
    println!("process_vm_readv_gbs={:.3}", reads.gb_per_sec(size));

    // Proof that the copies reach the other process: a fresh pattern there and back.
    fill_pattern(src, 2);
    target.write(src)?;
    if !target.holds(2)? {
        return Err(error!(
            "process_vm_writev: the child does not see what was written"
        ));
    }
    dst.fill(0);
    target.read(dst)?;
    if !holds_pattern(dst, 2) {
        return Err(error!(
            "process_vm_readv: did not read back what was written"
        ));
    }
    target.finish()?;
    println!("check=ok");
    Ok(())
}

//! Progress on stderr for long runs: at most one update per second.

use std::io::Write;
use std::time::{Duration, Instant};

pub struct Progress {
    enabled: bool,
    tty: bool,
    label: String,
    started: Instant,
    last: Instant,
    shown: bool,
}

impl Progress {
    /// Shows progress when `force`, or when stderr is a terminal.
    pub fn new(force: bool) -> Progress {
        use std::io::IsTerminal;
        let tty = std::io::stderr().is_terminal();
        let now = Instant::now();
        Progress {
            enabled: force || tty,
            tty,
            label: String::new(),
            started: now,
            last: now,
            shown: false,
        }
    }

    /// Starts a new task.
    pub fn start(&mut self, label: String) {
        self.label = label;
        self.started = Instant::now();
        self.last = self.started;
    }

    /// Reports `done` of `total`, at most once a second and only after the task
    /// ran for a second.
    pub fn update(&mut self, done: u64, total: u64) {
        if !self.enabled || self.last.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last = Instant::now();
        let pct = if total == 0 {
            100.0
        } else {
            100.0 * done as f64 / total as f64
        };
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{}: {pct:.0}%", self.label);
        } else {
            let _ = writeln!(err, "{}: {pct:.0}%", self.label);
        }
        let _ = err.flush();
        self.shown = true;
    }

    /// Clears the line of a finished task.
    pub fn finish(&mut self) {
        if self.shown && self.tty {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
        self.shown = false;
    }
}

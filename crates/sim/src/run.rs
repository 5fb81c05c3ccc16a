//! Bounds on a simulation run, and how a run ends.

use core::fmt;
use core::time::Duration;
use softverbs_engine::Instant;

/// Bounds that stop a run that would otherwise go on forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// The most [`Sim::step`](crate::Sim::step)s the run may take.
    pub max_steps: u64,
    /// The most virtual time the run may cover, from when it starts.
    pub max_time: Duration,
}

impl Limits {
    /// Limits of `max_steps` steps and `max_time` of virtual time.
    pub const fn new(max_steps: u64, max_time: Duration) -> Self {
        Limits {
            max_steps,
            max_time,
        }
    }
}

impl Default for Limits {
    /// Ten million steps and ten minutes of virtual time: generous for any
    /// unit test, while still catching a run that never ends.
    fn default() -> Self {
        Limits::new(10_000_000, Duration::from_secs(600))
    }
}

/// How a successful run went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunReport {
    /// Steps that did some work.
    pub steps: u64,
    /// Virtual time when the run started.
    pub start: Instant,
    /// Virtual time when the run ended.
    pub now: Instant,
}

impl RunReport {
    /// Virtual time the run covered.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }
}

/// Why a run stopped before its goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimError {
    /// The run took [`Limits::max_steps`] steps and still had work to do:
    /// the nodes keep exchanging datagrams or firing timers without reaching
    /// the goal.
    Livelock {
        /// Steps taken.
        steps: u64,
        /// Virtual time when the run stopped.
        now: Instant,
    },
    /// The next event lies beyond [`Limits::max_time`]; the clock was moved
    /// to the deadline and the run stopped.
    Deadline {
        /// Virtual time when the run stopped (the deadline).
        now: Instant,
    },
    /// Nothing is in flight and no node has a timer, yet the goal is not
    /// reached: the system hangs.
    Idle {
        /// Virtual time when the run stopped.
        now: Instant,
    },
}

impl SimError {
    /// Virtual time when the run stopped.
    pub fn now(&self) -> Instant {
        match *self {
            SimError::Livelock { now, .. }
            | SimError::Deadline { now }
            | SimError::Idle { now } => now,
        }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Livelock { steps, now } => write!(
                f,
                "livelock: still busy after {steps} steps (at {} ns virtual time)",
                now.as_nanos()
            ),
            SimError::Deadline { now } => write!(
                f,
                "virtual time limit reached at {} ns without finishing",
                now.as_nanos()
            ),
            SimError::Idle { now } => write!(
                f,
                "hang: network idle with no timers at {} ns, goal not reached",
                now.as_nanos()
            ),
        }
    }
}

impl std::error::Error for SimError {}

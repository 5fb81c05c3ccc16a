//! Small nodes for exercising the simulator.

use softverbs_engine::{Instant, Node, Transmit};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// The address of toy node `n`.
pub fn addr(n: u8) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, n), 4791))
}

/// What happened to a toy node, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Datagram {
        at: Instant,
        src: SocketAddr,
        data: Vec<u8>,
    },
    Timer {
        at: Instant,
    },
}

/// A node that sends what is in its outbox, optionally echoes everything it
/// receives back to the sender, and has an optional (re-arming) timer.
#[derive(Debug)]
pub struct Toy {
    pub addr: SocketAddr,
    pub outbox: VecDeque<(SocketAddr, Vec<u8>)>,
    pub echo: bool,
    pub timer: Option<Instant>,
    pub period: Option<Duration>,
    pub events: Vec<Event>,
}

impl Toy {
    pub fn new(n: u8) -> Self {
        Toy {
            addr: addr(n),
            outbox: VecDeque::new(),
            echo: false,
            timer: None,
            period: None,
            events: Vec::new(),
        }
    }

    /// An echoing node.
    pub fn echo(n: u8) -> Self {
        Toy {
            echo: true,
            ..Toy::new(n)
        }
    }

    /// Queues `count` datagrams of `len` bytes (at least 4) to `dst`, each
    /// starting with its number (big-endian u32), the rest a fixed pattern.
    pub fn queue_numbered(&mut self, dst: SocketAddr, count: u32, len: usize) {
        for i in 0..count {
            self.outbox.push_back((dst, numbered(i, len)));
        }
    }

    /// A timer firing at `at`, then every `period` if given.
    pub fn with_timer(mut self, at: Instant, period: Option<Duration>) -> Self {
        self.timer = Some(at);
        self.period = period;
        self
    }

    /// The datagrams received, in order.
    pub fn received(&self) -> Vec<(Instant, SocketAddr, &[u8])> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Datagram { at, src, data } => Some((*at, *src, data.as_slice())),
                Event::Timer { .. } => None,
            })
            .collect()
    }

    /// The numbers of the datagrams received, in order.
    pub fn received_numbers(&self) -> Vec<u32> {
        self.received().iter().map(|(_, _, d)| number(d)).collect()
    }

    /// When the timer fired.
    pub fn fired(&self) -> Vec<Instant> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Timer { at } => Some(*at),
                Event::Datagram { .. } => None,
            })
            .collect()
    }
}

/// Datagram number `i`, `len` bytes long.
pub fn numbered(i: u32, len: usize) -> Vec<u8> {
    assert!(len >= 4);
    let mut data: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(37)).collect();
    data[..4].copy_from_slice(&i.to_be_bytes());
    data
}

/// The number a datagram starts with.
pub fn number(data: &[u8]) -> u32 {
    u32::from_be_bytes(data[..4].try_into().unwrap())
}

impl Node for Toy {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, data: &[u8]) {
        self.events.push(Event::Datagram {
            at: now,
            src,
            data: data.to_vec(),
        });
        if self.echo {
            self.outbox.push_back((src, data.to_vec()));
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.timer.is_some_and(|at| at <= now) {
            self.events.push(Event::Timer { at: now });
            self.timer = self.period.map(|p| now + p);
        }
    }

    fn poll_transmit(&mut self, _now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let (dst, data) = self.outbox.pop_front()?;
        buf[..data.len()].copy_from_slice(&data);
        Some(Transmit {
            src: self.addr,
            dst,
            len: data.len(),
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timer
    }
}

//! Deadlines by key: at most one per key, the earliest first.

use crate::time::Instant;
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// A set of deadlines, one per key.
#[derive(Debug)]
pub(crate) struct Timers<K: Copy + Ord + Hash> {
    by_key: HashMap<K, Instant>,
    queue: BTreeSet<(Instant, K)>,
}

impl<K: Copy + Ord + Hash> Timers<K> {
    pub fn new() -> Self {
        Timers {
            by_key: HashMap::new(),
            queue: BTreeSet::new(),
        }
    }

    /// Sets (or moves) `key`'s deadline to `at`.
    pub fn set(&mut self, key: K, at: Instant) {
        if let Some(old) = self.by_key.insert(key, at) {
            self.queue.remove(&(old, key));
        }
        self.queue.insert((at, key));
    }

    /// Removes `key`'s deadline, if any.
    pub fn cancel(&mut self, key: K) {
        if let Some(old) = self.by_key.remove(&key) {
            self.queue.remove(&(old, key));
        }
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Takes the earliest key whose deadline is at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<K> {
        let &(at, key) = self.queue.first()?;
        if at > now {
            return None;
        }
        self.queue.remove(&(at, key));
        self.by_key.remove(&key);
        Some(key)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_deadline_per_key_earliest_first() {
        let mut t = Timers::new();
        let at = Instant::from_nanos;
        t.set(1u32, at(50));
        t.set(2, at(10));
        t.set(1, at(5));
        assert_eq!(t.len(), 2);
        assert_eq!(t.next(), Some(at(5)));
        assert_eq!(t.pop_due(at(4)), None);
        assert_eq!(t.pop_due(at(10)), Some(1));
        t.cancel(2);
        assert_eq!(t.next(), None);
        assert_eq!(t.pop_due(at(100)), None);
    }
}

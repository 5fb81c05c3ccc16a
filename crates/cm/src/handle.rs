//! rdma_cm ids as generational handles: a destroyed id's handle never names a later
//! one.

use core::fmt;

/// Names one rdma_cm id of a [`Cm`](crate::Cm).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmIdHandle {
    index: u32,
    generation: u32,
}

impl CmIdHandle {
    /// The handle as one nonzero number (index + 1 in the high half, generation in
    /// the low half), for callers that keep ids as integers (the C ABI).
    pub const fn to_raw(self) -> u64 {
        ((self.index as u64 + 1) << 32) | self.generation as u64
    }

    /// The handle [`CmIdHandle::to_raw`] gave; `None` for 0 and numbers no handle
    /// gives. A handle of a destroyed id still names nothing.
    pub const fn from_raw(raw: u64) -> Option<CmIdHandle> {
        let high = (raw >> 32) as u32;
        if high == 0 {
            return None;
        }
        Some(CmIdHandle {
            index: high - 1,
            generation: raw as u32,
        })
    }
}

impl fmt::Debug for CmIdHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CmId({}/{})", self.index, self.generation)
    }
}

struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// A table of `T` addressed by [`CmIdHandle`]s.
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    pub fn new() -> Self {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
        }
    }

    pub fn insert(&mut self, value: T) -> CmIdHandle {
        let index = self.free.pop().unwrap_or_else(|| {
            self.entries.push(Entry {
                generation: 0,
                value: None,
            });
            (self.entries.len() - 1) as u32
        });
        let e = &mut self.entries[index as usize];
        e.value = Some(value);
        CmIdHandle {
            index,
            generation: e.generation,
        }
    }

    pub fn get(&self, h: CmIdHandle) -> Option<&T> {
        let e = self.entries.get(h.index as usize)?;
        (e.generation == h.generation).then_some(e.value.as_ref()?)
    }

    pub fn get_mut(&mut self, h: CmIdHandle) -> Option<&mut T> {
        let e = self.entries.get_mut(h.index as usize)?;
        if e.generation != h.generation {
            return None;
        }
        e.value.as_mut()
    }

    pub fn remove(&mut self, h: CmIdHandle) -> Option<T> {
        let e = self.entries.get_mut(h.index as usize)?;
        if e.generation != h.generation {
            return None;
        }
        let v = e.value.take()?;
        e.generation = e.generation.wrapping_add(1);
        self.free.push(h.index);
        Some(v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (CmIdHandle, &T)> {
        self.entries.iter().enumerate().filter_map(|(i, e)| {
            e.value.as_ref().map(|v| {
                (
                    CmIdHandle {
                        index: i as u32,
                        generation: e.generation,
                    },
                    v,
                )
            })
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_handles_do_not_resolve() {
        let mut s = Slab::new();
        let a = s.insert(1);
        assert_eq!(s.get(a), Some(&1));
        assert_eq!(s.remove(a), Some(1));
        let b = s.insert(2);
        assert_ne!(a, b);
        assert_eq!(s.get(a), None);
        assert_eq!(s.get_mut(a), None);
        assert_eq!(s.remove(a), None);
        assert_eq!(s.get(b), Some(&2));
        assert_eq!(s.len(), 1);
        assert_eq!(s.iter().count(), 1);
    }

    #[test]
    fn raw_handles_round_trip_and_are_nonzero() {
        let mut s = Slab::new();
        let a = s.insert(1);
        s.remove(a);
        let b = s.insert(2);
        for h in [a, b] {
            assert_ne!(h.to_raw(), 0);
            assert_eq!(CmIdHandle::from_raw(h.to_raw()), Some(h));
        }
        assert_eq!(CmIdHandle::from_raw(0), None);
        assert_eq!(CmIdHandle::from_raw(7), None);
        assert_eq!(s.get(CmIdHandle::from_raw(a.to_raw()).unwrap()), None);
    }
}

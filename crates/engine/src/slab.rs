//! Object tables with generational handles.
//!
//! A handle names a slot and the generation the slot had when the object was put
//! there; once the object is removed the slot's generation moves on, so every old
//! handle (and every key or QPN derived from it) stops resolving. Objects are only
//! inserted once fully built, so nothing on the wire can reach a half-made object.

/// A slot index and the generation it was issued for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawHandle {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// A table of `T` addressed by [`RawHandle`]s.
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    len: usize,
    limit: usize,
}

impl<T> Slab<T> {
    /// A table that will hold at most `limit` objects; the first `reserved` slot
    /// indices are never used (QPN 0 and 1 are special, IBA 10.2.1).
    pub fn new(limit: usize, reserved: u32) -> Self {
        let entries = (0..reserved)
            .map(|_| Entry {
                generation: 0,
                value: None,
            })
            .collect();
        Slab {
            entries,
            free: Vec::new(),
            len: 0,
            limit,
        }
    }

    /// Stores `value`; `None` when the table is full.
    pub fn insert(&mut self, value: T) -> Option<RawHandle> {
        if self.len >= self.limit {
            return None;
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.entries.len()).ok()?;
                self.entries.push(Entry {
                    generation: 0,
                    value: None,
                });
                i
            }
        };
        let entry = &mut self.entries[index as usize];
        entry.value = Some(value);
        self.len += 1;
        Some(RawHandle {
            index,
            generation: entry.generation,
        })
    }

    pub fn get(&self, h: RawHandle) -> Option<&T> {
        let e = self.entries.get(h.index as usize)?;
        if e.generation == h.generation {
            e.value.as_ref()
        } else {
            None
        }
    }

    pub fn get_mut(&mut self, h: RawHandle) -> Option<&mut T> {
        let e = self.entries.get_mut(h.index as usize)?;
        if e.generation == h.generation {
            e.value.as_mut()
        } else {
            None
        }
    }

    /// The live object in slot `index`, with its handle.
    pub fn get_by_index(&self, index: u32) -> Option<(RawHandle, &T)> {
        let e = self.entries.get(index as usize)?;
        let v = e.value.as_ref()?;
        Some((
            RawHandle {
                index,
                generation: e.generation,
            },
            v,
        ))
    }

    pub fn remove(&mut self, h: RawHandle) -> Option<T> {
        let e = self.entries.get_mut(h.index as usize)?;
        if e.generation != h.generation || e.value.is_none() {
            return None;
        }
        let value = e.value.take();
        e.generation = e.generation.wrapping_add(1);
        self.free.push(h.index);
        self.len -= 1;
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_handles_do_not_resolve() {
        let mut s = Slab::new(4, 2);
        let a = s.insert("a").unwrap();
        assert_eq!(a.index, 2);
        assert_eq!(s.get(a), Some(&"a"));
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.get(a), None);
        let b = s.insert("b").unwrap();
        assert_eq!(b.index, a.index);
        assert_ne!(b.generation, a.generation);
        assert_eq!(s.get(a), None);
        assert_eq!(s.remove(a), None);
        assert_eq!(s.get(b), Some(&"b"));
    }

    #[test]
    fn limit_is_enforced() {
        let mut s = Slab::new(2, 0);
        assert!(s.insert(1).is_some());
        assert!(s.insert(2).is_some());
        assert!(s.insert(3).is_none());
    }
}

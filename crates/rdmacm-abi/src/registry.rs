//! The objects librdmacm has handed to C (ids, channels, fetched events), by address.
//!
//! Every call that receives one of its pointers back looks it up here first, so a pointer
//! that is unknown, already destroyed or already acknowledged gets `EINVAL` instead of being
//! used; and the lookup returns a counted reference, so an object stays valid for the length
//! of a call even if another thread destroys it meanwhile.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Live objects of one kind, keyed by the address C knows them by.
pub struct Registry<T> {
    map: Mutex<BTreeMap<usize, Arc<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Registry<T> {
        Registry::new()
    }
}

impl<T> Registry<T> {
    /// An empty registry.
    pub const fn new() -> Registry<T> {
        Registry {
            map: Mutex::new(BTreeMap::new()),
        }
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<usize, Arc<T>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `object` under `Arc::as_ptr` (the address C gets: every registered type is
    /// `#[repr(C)]` with its C struct first).
    pub fn insert(&self, object: &Arc<T>) {
        self.map()
            .insert(Arc::as_ptr(object) as usize, Arc::clone(object));
    }

    /// The live object at `ptr`.
    pub fn get<P>(&self, ptr: *const P) -> Option<Arc<T>> {
        self.map().get(&(ptr as usize)).cloned()
    }

    /// Unregisters the object at `ptr`; returns it if it was live.
    pub fn remove<P>(&self, ptr: *const P) -> Option<Arc<T>> {
        self.map().remove(&(ptr as usize))
    }
}

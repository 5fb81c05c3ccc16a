//! The devices rdma_cm hands out: `rdma_get_devices` / `rdma_free_devices`, and the
//! "are there any devices" check rdma-core's librdmacm makes before most calls
//! (`ucma_init`).
//!
//! As rdma-core does, librdmacm opens each device once, through libibverbs' public
//! `ibv_open_device`, and keeps those contexts for the life of the process; the lists it
//! returns point to them. With softverbs there is one device, and its contexts all share the
//! process's one endpoint, so these contexts reach the same device as the program's own.

use core::ffi::c_int;
use core::ptr;
use std::sync::Mutex;

use crate::abi::{ibv_context, ibv_device, ibv_pd};
use crate::errno::{set_errno, Errno};
use crate::ibverbs::libibverbs;

/// A pointer libibverbs handed out, valid for the life of the process.
#[derive(Clone, Copy)]
struct Ptr<T>(*mut T);

// SAFETY: device list entries and contexts are libibverbs objects any thread may use.
unsafe impl<T> Send for Ptr<T> {}

/// What librdmacm holds of libibverbs' devices.
struct Devices {
    /// The list `ibv_get_device_list` returned, kept (never freed, as rdma-core's librdmacm
    /// keeps it) so its entries stay valid.
    _kept: Ptr<*mut ibv_device>,
    /// Its entries.
    list: Vec<Ptr<ibv_device>>,
    /// One context per device that opened, in list order; opened on first use.
    contexts: Option<Vec<Ptr<ibv_context>>>,
}

static DEVICES: Mutex<Option<Devices>> = Mutex::new(None);

fn devices() -> std::sync::MutexGuard<'static, Option<Devices>> {
    DEVICES.lock().unwrap_or_else(|e| e.into_inner())
}

/// rdma-core's `ucma_init`: lists libibverbs' devices once; `ENODEV` when there are none (or
/// libibverbs.so.1 is unusable). Retried on every call until it succeeds.
pub fn init() -> Result<(), Errno> {
    list_devices().inspect_err(|_| crate::ibverbs::explain_no_device())
}

fn list_devices() -> Result<(), Errno> {
    let mut guard = devices();
    if guard.is_some() {
        return Ok(());
    }
    let verbs = libibverbs().map_err(|_| libc::ENODEV)?;
    let mut n: c_int = 0;
    // SAFETY: resolved `ibv_get_device_list`; `n` is writable.
    let list = unsafe { (verbs.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(libc::ENODEV);
    }
    if n <= 0 {
        // SAFETY: the list came from `ibv_get_device_list` and is freed once.
        unsafe { (verbs.free_device_list)(list) };
        return Err(libc::ENODEV);
    }
    let entries = (0..n as usize)
        // SAFETY: the list holds `n` entries.
        .map(|i| Ptr(unsafe { *list.add(i) }))
        .collect();
    *guard = Some(Devices {
        _kept: Ptr(list),
        list: entries,
        contexts: None,
    });
    Ok(())
}

/// The contexts of every device that opens (rdma-core's `ucma_init_all`), opening them on
/// first use.
pub fn contexts() -> Result<Vec<*mut ibv_context>, Errno> {
    init()?;
    let verbs = libibverbs().map_err(|_| libc::ENODEV)?;
    let mut guard = devices();
    let devices = guard.as_mut().expect("initialised above");
    let contexts = devices.contexts.get_or_insert_with(|| {
        devices
            .list
            .iter()
            // SAFETY: each entry is a device from the kept list.
            .map(|d| Ptr(unsafe { (verbs.open_device)(d.0) }))
            // A device that does not open is left out, as rdma-core marks it dead.
            .filter(|c| !c.0.is_null())
            .collect()
    });
    Ok(contexts.iter().map(|c| c.0).collect())
}

/// `rdma_get_devices`: a NULL-terminated array of the open device contexts (freed with
/// `rdma_free_devices`), or NULL; `*num_devices` (if given) gets the count, 0 on failure.
///
/// # Safety
/// `num_devices` is NULL or writable.
pub unsafe fn get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    let (list, n) = match contexts() {
        Ok(contexts) => {
            let n = contexts.len();
            // SAFETY: malloc of n + 1 pointers; checked for NULL below.
            let list = unsafe { libc::malloc((n + 1) * size_of::<*mut ibv_context>()) }
                .cast::<*mut ibv_context>();
            if list.is_null() {
                set_errno(libc::ENOMEM);
                (ptr::null_mut(), 0)
            } else {
                for (i, c) in contexts.into_iter().chain([ptr::null_mut()]).enumerate() {
                    // SAFETY: `list` has room for n + 1 entries.
                    unsafe { list.add(i).write(c) };
                }
                (list, n)
            }
        }
        Err(e) => {
            set_errno(e);
            (ptr::null_mut(), 0)
        }
    };
    if !num_devices.is_null() {
        // SAFETY: the caller passes a writable int or NULL.
        unsafe { *num_devices = n as c_int };
    }
    list
}

/// `rdma_free_devices`: frees a list from `rdma_get_devices` (the contexts stay open).
///
/// # Safety
/// `list` is NULL or a list from [`get_devices`], not yet freed.
pub unsafe fn free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the list was malloc'ed by `get_devices` (or is NULL, which free ignores).
    unsafe { libc::free(list.cast()) };
}

/// The PD librdmacm shares among the ids of one device (`id->pd` until the program gives
/// its own), with how many ids hold the device: rdma-core's `cma_device.pd` and `refcnt`.
struct SharedPd {
    context: Ptr<ibv_context>,
    pd: Ptr<ibv_pd>,
    holders: u32,
}

static SHARED_PDS: Mutex<Vec<SharedPd>> = Mutex::new(Vec::new());

/// The open context of the device whose node GUID (network order, as
/// `ibv_get_device_guid` gives it) is `guid`.
pub fn context_for(guid: u64) -> Result<*mut ibv_context, Errno> {
    let verbs = libibverbs().map_err(|_| libc::ENODEV)?;
    contexts()?
        .into_iter()
        .find(|&ctx| {
            // SAFETY: `device` is the first field of every `struct ibv_context`; the context
            // is one librdmacm opened and keeps open.
            let dev = unsafe { *ctx.cast::<*mut ibv_device>() };
            // SAFETY: a device from libibverbs' list.
            unsafe { (verbs.get_device_guid)(dev) == guid }
        })
        .ok_or(libc::ENODEV)
}

/// Takes a reference to `context` for an id: its shared PD, allocated with the first
/// (rdma-core's `ucma_get_device`).
pub(crate) fn acquire(context: *mut ibv_context) -> Result<*mut ibv_pd, Errno> {
    let verbs = libibverbs().map_err(|_| libc::ENODEV)?;
    let mut pds = SHARED_PDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = pds.iter_mut().find(|s| s.context.0 == context) {
        s.holders += 1;
        return Ok(s.pd.0);
    }
    // SAFETY: a context librdmacm opened.
    let pd = unsafe { (verbs.alloc_pd)(context) };
    if pd.is_null() {
        return Err(crate::errno::errno());
    }
    pds.push(SharedPd {
        context: Ptr(context),
        pd: Ptr(pd),
        holders: 1,
    });
    Ok(pd)
}

/// Drops an id's reference to `context`; the last one frees the shared PD (rdma-core's
/// `ucma_put_device`, which likewise ignores a PD the program still uses).
pub(crate) fn release(context: *mut ibv_context) {
    let Ok(verbs) = libibverbs() else { return };
    let mut pds = SHARED_PDS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(i) = pds.iter().position(|s| s.context.0 == context) else {
        return;
    };
    pds[i].holders -= 1;
    if pds[i].holders == 0 {
        let s = pds.remove(i);
        // SAFETY: the PD librdmacm allocated, freed once.
        let _ = unsafe { (verbs.dealloc_pd)(s.pd.0) };
    }
}

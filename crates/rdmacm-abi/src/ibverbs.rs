//! How librdmacm.so.1 reaches libibverbs.so.1.
//!
//! There is one softverbs device per process and it lives in libibverbs.so.1 (crate
//! `softverbs-ibverbs-abi`, which statically contains the driver). librdmacm.so.1 contains
//! no driver: QPs made through rdma_cm must be ordinary QPs of that libibverbs (programs post
//! to them with the header inlines), and connection management must run on the device that
//! carries the data. So this library:
//!
//! - depends on `libibverbs.so.1` (`DT_NEEDED`, see `build.rs`): the loader loads it from the
//!   same search path as the program's own, i.e. softverbs' drop-in directory under
//!   `softverbs run`, and a process has exactly one;
//! - opens that already-loaded library with `dlopen("libibverbs.so.1", RTLD_NOW)` and
//!   resolves each public verb it calls with `dlvsym` at its rdma-core version node
//!   (`ibv_get_device_list@IBVERBS_1.1`, ...), the same symbols a program linked against
//!   rdma-core imports;
//! - finds the connection manager through the private entry point
//!   `softverbs_private_cm@SOFTVERBS_PRIVATE_1` of that same library (crate
//!   `softverbs-private-abi`), asking for the table version it was built with.
//!
//! Resolving at run time instead of importing at link time keeps two things possible: the
//! rlib and its unit tests link without any libibverbs, and a libibverbs.so.1 that is not
//! softverbs' (rdma-core's, picked up when the drop-in directory is not first on the search
//! path) still loads, so librdmacm can say clearly what is wrong instead of the loader
//! refusing to start the program over a missing private version node.

use core::ffi::{c_int, c_void, CStr};
use std::ffi::CString;
use std::sync::{Once, OnceLock};

use softverbs_private_abi::{CmOps, EntryFn, ABI_VERSION, ENTRY_SYMBOL, OPS_SIZE, VERSION_NODE};

use crate::abi::*;

/// `ibv_get_device_list`
pub type GetDeviceListFn = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
/// `ibv_free_device_list`
pub type FreeDeviceListFn = unsafe extern "C" fn(*mut *mut ibv_device);
/// `ibv_open_device`
pub type OpenDeviceFn = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
/// `ibv_destroy_*`: one object, 0 or an errno value.
pub type DestroyFn<T> = unsafe extern "C" fn(*mut T) -> c_int;
/// `ibv_get_device_guid`
pub type DeviceGuidFn = unsafe extern "C" fn(*mut ibv_device) -> u64;
/// `ibv_alloc_pd`
pub type AllocPdFn = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
/// `ibv_create_comp_channel`
pub type CreateCompChannelFn = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
/// `ibv_create_cq`
pub type CreateCqFn = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
/// `ibv_create_qp`
pub type CreateQpFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
/// The `create_qp_ex` op of a `struct verbs_context` (behind the inline `ibv_create_qp_ex`).
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
/// `ibv_create_srq`
pub type CreateSrqFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;
/// `ibv_query_qp`
pub type QueryQpFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;

/// The public verbs librdmacm calls, resolved at their rdma-core 44 version nodes.
pub struct Verbs {
    /// Where the library was loaded from (for messages).
    pub path: String,
    pub get_device_list: GetDeviceListFn,
    pub free_device_list: FreeDeviceListFn,
    pub open_device: OpenDeviceFn,
    pub destroy_qp: DestroyFn<ibv_qp>,
    pub destroy_srq: DestroyFn<ibv_srq>,
    pub destroy_cq: DestroyFn<ibv_cq>,
    pub destroy_comp_channel: DestroyFn<ibv_comp_channel>,
    pub get_device_guid: DeviceGuidFn,
    pub alloc_pd: AllocPdFn,
    pub dealloc_pd: DestroyFn<ibv_pd>,
    pub create_comp_channel: CreateCompChannelFn,
    pub create_cq: CreateCqFn,
    pub create_qp: CreateQpFn,
    pub create_srq: CreateSrqFn,
    pub query_qp: QueryQpFn,
    /// The connection manager's table, or why there is none.
    pub cm: Result<&'static CmOps, String>,
}

/// A `dlopen` handle, kept for the life of the process (never `dlclose`d).
#[derive(Clone, Copy)]
pub struct Handle(*mut c_void);

// SAFETY: a dlopen handle is an opaque token glibc lets any thread use.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Handle {
    /// `dlopen(name, RTLD_NOW)`: returns the already-loaded library of that SONAME or path
    /// when there is one.
    pub fn open(name: &str) -> Result<Handle, String> {
        let c = CString::new(name).map_err(|_| format!("bad library name {name:?}"))?;
        // SAFETY: `c` is a NUL-terminated string; dlopen has no other preconditions.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            return Err(format!("cannot load {name}: {}", dlerror()));
        }
        Ok(Handle(h))
    }

    /// `dlvsym(handle, name, node)`, or NULL.
    pub fn symbol(self, name: &CStr, node: &CStr) -> *mut c_void {
        // SAFETY: the handle came from dlopen and is never closed; both strings are
        // NUL-terminated.
        unsafe { libc::dlvsym(self.0, name.as_ptr(), node.as_ptr()) }
    }
}

/// The last `dlerror()` message.
fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "unknown error".to_string();
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

/// The file the loader loaded the code at `addr` from.
fn file_of(addr: *const c_void) -> Option<String> {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `info` is writable; dladdr only inspects the address.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) } != 0;
    // SAFETY: dladdr filled `info` when it returned nonzero.
    let fname = unsafe { info.assume_init() }.dli_fname;
    // SAFETY: a non-NULL dli_fname is a NUL-terminated path owned by the loader.
    (found && !fname.is_null()).then(|| {
        unsafe { CStr::from_ptr(fname) }
            .to_string_lossy()
            .into_owned()
    })
}

/// Resolves `$name@$node` in `$handle` as the function pointer type `$ty`.
macro_rules! resolve {
    ($handle:expr, $name:literal @ $node:literal as $ty:ty) => {{
        let name = concat!($name, "\0");
        let node = concat!($node, "\0");
        let p = $handle.symbol(
            CStr::from_bytes_with_nul(name.as_bytes()).expect("NUL-terminated"),
            CStr::from_bytes_with_nul(node.as_bytes()).expect("NUL-terminated"),
        );
        if p.is_null() {
            return Err(format!("it has no {}@{}", $name, $node));
        }
        // SAFETY: the symbol is rdma-core's public function of that name at that node, whose
        // C prototype (verbs.h) is the field's function pointer type.
        unsafe { core::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

/// The `create_qp_ex` op of `context`, as the header inline `ibv_create_qp_ex` finds it
/// (`verbs_get_ctx_op`): NULL unless the context is an extended one whose `verbs_context`
/// reaches back to the op.
///
/// # Safety
/// `context` is a live context from libibverbs' `ibv_open_device`.
pub unsafe fn create_qp_ex_op(context: *mut ibv_context) -> Option<CreateQpExFn> {
    let ctx = context.cast::<u8>();
    // SAFETY: `abi_compat` is a pointer-sized field of every `struct ibv_context`.
    let compat = unsafe {
        ctx.add(IBV_CONTEXT_ABI_COMPAT_OFFSET)
            .cast::<usize>()
            .read()
    };
    if compat != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    // SAFETY: an extended context is the `context` member of a `struct verbs_context`, whose
    // `sz` (how many bytes of it the library fills, counted back from its end) is readable.
    let vctx = unsafe { ctx.sub(VERBS_CONTEXT_CONTEXT_OFFSET) };
    // SAFETY: as above.
    let sz = unsafe { vctx.add(VERBS_CONTEXT_SZ_OFFSET).cast::<usize>().read() };
    if sz < VERBS_CONTEXT_SIZE - VERBS_CONTEXT_CREATE_QP_EX_OFFSET {
        return None;
    }
    // SAFETY: `sz` covers the op; a function pointer or NULL, which `Option` maps.
    unsafe {
        vctx.add(VERBS_CONTEXT_CREATE_QP_EX_OFFSET)
            .cast::<Option<CreateQpExFn>>()
            .read()
    }
}

impl Verbs {
    /// Resolves the verbs and the connection manager in the library behind `handle`.
    pub fn resolve(handle: Handle) -> Result<Verbs, String> {
        let get_device_list =
            resolve!(handle, "ibv_get_device_list" @ "IBVERBS_1.1" as GetDeviceListFn);
        let path = file_of(get_device_list as *const c_void).unwrap_or_default();
        Ok(Verbs {
            get_device_list,
            free_device_list: resolve!(
                handle, "ibv_free_device_list" @ "IBVERBS_1.1" as FreeDeviceListFn),
            open_device: resolve!(handle, "ibv_open_device" @ "IBVERBS_1.1" as OpenDeviceFn),
            destroy_qp: resolve!(handle, "ibv_destroy_qp" @ "IBVERBS_1.1" as DestroyFn<ibv_qp>),
            destroy_srq: resolve!(
                handle, "ibv_destroy_srq" @ "IBVERBS_1.1" as DestroyFn<ibv_srq>),
            destroy_cq: resolve!(handle, "ibv_destroy_cq" @ "IBVERBS_1.1" as DestroyFn<ibv_cq>),
            destroy_comp_channel: resolve!(
                handle, "ibv_destroy_comp_channel" @ "IBVERBS_1.0" as DestroyFn<ibv_comp_channel>),
            get_device_guid: resolve!(
                handle, "ibv_get_device_guid" @ "IBVERBS_1.1" as DeviceGuidFn),
            alloc_pd: resolve!(handle, "ibv_alloc_pd" @ "IBVERBS_1.1" as AllocPdFn),
            dealloc_pd: resolve!(handle, "ibv_dealloc_pd" @ "IBVERBS_1.1" as DestroyFn<ibv_pd>),
            create_comp_channel: resolve!(
                handle, "ibv_create_comp_channel" @ "IBVERBS_1.0" as CreateCompChannelFn),
            create_cq: resolve!(handle, "ibv_create_cq" @ "IBVERBS_1.1" as CreateCqFn),
            create_qp: resolve!(handle, "ibv_create_qp" @ "IBVERBS_1.1" as CreateQpFn),
            create_srq: resolve!(handle, "ibv_create_srq" @ "IBVERBS_1.1" as CreateSrqFn),
            query_qp: resolve!(handle, "ibv_query_qp" @ "IBVERBS_1.1" as QueryQpFn),
            cm: connection_manager(handle, &path),
            path,
        })
    }
}

/// The connection manager's table in the library behind `handle`, or what is wrong with it.
pub fn connection_manager(handle: Handle, path: &str) -> Result<&'static CmOps, String> {
    let entry = handle.symbol(ENTRY_SYMBOL, VERSION_NODE);
    let name = format!(
        "{}@{}",
        ENTRY_SYMBOL.to_string_lossy(),
        VERSION_NODE.to_string_lossy()
    );
    if entry.is_null() {
        return Err(format!(
            "{path} has no {name}: it is not softverbs' libibverbs.so.1 (or one built \
             before its connection manager)"
        ));
    }
    // SAFETY: softverbs' libibverbs exports this symbol with the `EntryFn` prototype.
    let entry: EntryFn = unsafe { core::mem::transmute::<*mut c_void, EntryFn>(entry) };
    // SAFETY: calling the entry point has no preconditions.
    let ops = unsafe { entry(ABI_VERSION) };
    if ops.is_null() {
        return Err(format!(
            "{path}'s {name} does not offer table version {ABI_VERSION}: librdmacm.so.1 \
             and libibverbs.so.1 come from different softverbs builds"
        ));
    }
    // SAFETY: a non-NULL result points to a table that lives as long as the library, which
    // is never unloaded (this library depends on it, and the handle is never closed).
    let ops: &'static CmOps = unsafe { &*ops };
    if ops.abi_version != ABI_VERSION || (ops.size as usize) < OPS_SIZE {
        return Err(format!(
            "{path}'s connection manager table is version {} ({} bytes), this librdmacm.so.1 \
             needs version {ABI_VERSION} ({OPS_SIZE} bytes): they come from different \
             softverbs builds",
            ops.abi_version, ops.size
        ));
    }
    Ok(ops)
}

static LIBIBVERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();

/// The libibverbs.so.1 of this process, resolved once.
pub fn libibverbs() -> Result<&'static Verbs, &'static str> {
    LIBIBVERBS
        .get_or_init(|| {
            Handle::open("libibverbs.so.1").and_then(|h| {
                Verbs::resolve(h).map_err(|e| format!("libibverbs.so.1 is unusable: {e}"))
            })
        })
        .as_ref()
        .map_err(String::as_str)
}

/// What librdmacm says on stderr (once per process) when a program needs something the
/// loaded libibverbs.so.1 cannot provide: `what` is missing, because `why`.
pub fn explanation(what: &str, why: &str) -> String {
    format!(
        "librdmacm.so.1 (softverbs): {what}: {why}. Run the program with \
         `softverbs run -- PROGRAM`, or put softverbs' drop-in directory first in \
         LD_LIBRARY_PATH, so that softverbs' libibverbs.so.1 is loaded."
    )
}

/// Prints [`explanation`] once per process.
fn explain_once(what: &str, why: &str) {
    static SAID: Once = Once::new();
    SAID.call_once(|| eprintln!("{}", explanation(what, why)));
}

/// Why the loaded libibverbs.so.1 is not a usable softverbs one, if it is not.
fn why_not_softverbs() -> Option<&'static str> {
    match libibverbs() {
        Ok(v) => v.cm.as_ref().err().map(String::as_str),
        Err(why) => Some(why),
    }
}

/// Says why there is no device, when the reason is the libibverbs.so.1 that was loaded.
pub fn explain_no_device() {
    if let Some(why) = why_not_softverbs() {
        explain_once("no RDMA device", why);
    }
}

/// The connection manager, or `ENOSYS` after saying once on stderr why there is none.
pub fn cm_ops() -> Result<&'static CmOps, crate::errno::Errno> {
    match why_not_softverbs() {
        None => Ok(cm_if_present().expect("present when nothing is wrong")),
        Some(why) => {
            explain_once("no connection manager", why);
            Err(libc::ENOSYS)
        }
    }
}

/// The connection manager when there is one, silently.
pub fn cm_if_present() -> Option<&'static CmOps> {
    #[cfg(test)]
    if let Some(fake) = FAKE_CM.get() {
        return Some(fake);
    }
    libibverbs().ok().and_then(|v| v.cm.as_ref().ok().copied())
}

/// Unit tests stand a table of their own in for the connection manager.
#[cfg(test)]
pub static FAKE_CM: OnceLock<&'static CmOps> = OnceLock::new();

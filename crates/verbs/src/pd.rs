//! Protection domains and memory regions.
//!
//! A [`Mr`] owns the buffer it registers. The engine (and every peer with the
//! rkey) may write the buffer at any time while it is registered, so the region
//! hands out no `&`/`&mut` references into it; data goes in and out by copying
//! ([`Mr::read`], [`Mr::write`]), and [`Mr::into_inner`] deregisters first and
//! then returns the buffer. That makes registration sound by construction: the
//! memory cannot move, be freed or be aliased by a Rust reference while the keys
//! work.

use crate::context::{Context, ContextInner};
use crate::error::{RegMrError, ResourceError};
use softverbs_engine::{AccessFlags, MrHandle, MrInfo, PdHandle, Sge};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) struct PdInner {
    pub ctx: Arc<ContextInner>,
    pub pd: PdHandle,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let _ = self.ctx.read(|st| st.engine.dealloc_pd(self.pd));
    }
}

impl PdInner {
    /// Counts `len` more registered bytes against the device's cap.
    fn charge(&self, len: usize) -> Result<(), RegMrError> {
        let d = self.ctx.device.info();
        let len64 = len as u64;
        let before = d.mr_bytes.fetch_add(len64, Ordering::AcqRel);
        if before.saturating_add(len64) > d.max_mr_bytes {
            d.mr_bytes.fetch_sub(len64, Ordering::AcqRel);
            return Err(RegMrError::TooMuch {
                len,
                cap: d.max_mr_bytes,
            });
        }
        Ok(())
    }

    /// Gives back what [`PdInner::charge`] counted.
    fn refund(&self, len: usize) {
        self.ctx
            .device
            .info()
            .mr_bytes
            .fetch_sub(len as u64, Ordering::AcqRel);
    }

    /// Registers `len` bytes at `ptr` in the engine, within the cap.
    ///
    /// # Safety
    /// As [`Pd::reg_mr_raw`].
    unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, RegMrError> {
        self.charge(len)?;
        // SAFETY: forwarded from the caller's contract.
        let r = self
            .ctx
            .read(|st| unsafe { st.engine.reg_mr(self.pd, ptr, len, access) });
        match r {
            Ok(Ok(info)) => {
                if let Ok(d) = self.ctx.device.driver() {
                    d.same_host
                        .publish(info.rkey, info.addr, info.length, access, self.pd.id());
                }
                Ok(info)
            }
            Ok(Err(e)) => {
                self.refund(len);
                Err(e.into())
            }
            Err(e) => {
                self.refund(len);
                Err(e.into())
            }
        }
    }

    /// Deregisters a region made by [`PdInner::register`].
    fn deregister(&self, info: &MrInfo) {
        // Peers on this host stop touching the region before the engine forgets it
        // (the fence: `crate::samehost::table`).
        if let Ok(d) = self.ctx.device.driver() {
            d.same_host.withdraw(info.rkey);
        }
        if let Ok(Ok(())) = self.ctx.read(|st| st.engine.dereg_mr(info.handle)) {
            self.refund(info.length);
        }
        // A same-host READ may be landing in it: wait until it is in.
        if let Ok(d) = self.ctx.device.driver() {
            d.same_host.quiesce_local();
        }
    }
}

/// A protection domain. Memory regions and QPs keep it alive.
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pd").field(&self.inner.pd).finish()
    }
}

/// Memory whose address does not change while it is owned, whatever happens to
/// the owner value itself (a heap allocation).
///
/// # Safety
/// `as_mut_ptr` must return the same pointer, valid for `len` bytes of reads and
/// writes, for as long as the value lives and is not accessed otherwise.
pub unsafe trait StableBuffer: Send + 'static {
    /// Start of the memory.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a Vec's heap buffer stays put while the Vec is not resized, and the Mr
// never resizes it; moving the Vec moves only its header.
unsafe impl StableBuffer for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: a boxed slice's heap buffer never moves.
unsafe impl StableBuffer for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// A page-aligned heap allocation (what perftest-style benchmarks register).
pub struct PageAligned {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the allocation is owned exclusively and has no thread affinity.
unsafe impl Send for PageAligned {}

const PAGE: usize = 4096;

impl PageAligned {
    /// `len` zeroed bytes aligned to 4096.
    pub fn new(len: usize) -> PageAligned {
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), PAGE).expect("size fits a layout");
        // SAFETY: the layout has nonzero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        PageAligned { ptr, len }
    }

    /// The bytes (only while not registered: a registered one is inside an [`Mr`]
    /// that offers no references).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes for the allocation's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageAligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), PAGE)
            .expect("same layout as alloc");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

// SAFETY: the allocation never moves and is only freed on drop.
unsafe impl StableBuffer for PageAligned {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A registered memory region owning its buffer `T`.
pub struct Mr<T: StableBuffer> {
    buf: Option<T>,
    info: MrInfo,
    pd: Arc<PdInner>,
}

impl<T: StableBuffer> std::fmt::Debug for Mr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("lkey", &self.info.lkey)
            .field("addr", &self.info.addr)
            .field("len", &self.info.length)
            .finish()
    }
}

impl Pd {
    /// The context the PD belongs to.
    pub fn context(&self) -> crate::Context {
        crate::Context {
            inner: Arc::clone(&self.inner.ctx),
        }
    }
}

impl Pd {
    /// Whether memory regions, memory windows, QPs or SRQs still use this PD.
    pub fn in_use(&self) -> bool {
        let inner = &self.inner;
        inner
            .ctx
            .read(|st| st.engine.pd_in_use(inner.pd))
            .unwrap_or(false)
    }

    pub(crate) fn new(ctx: &Context) -> Result<Pd, ResourceError> {
        let pd = ctx.inner.read(|st| st.engine.alloc_pd())??;
        Ok(Pd {
            inner: Arc::new(PdInner {
                ctx: Arc::clone(&ctx.inner),
                pd,
            }),
        })
    }

    /// Registers `buf` with `access`; the region owns it until
    /// [`Mr::into_inner`].
    pub fn reg_mr<T: StableBuffer>(
        &self,
        mut buf: T,
        access: AccessFlags,
    ) -> Result<Mr<T>, RegMrError> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is moved into the returned Mr, which deregisters before it
        // gives the buffer back or drops it; StableBuffer promises the pointer
        // stays valid while owned.
        let info = unsafe { self.inner.register(ptr, len, access) }?;
        Ok(Mr {
            buf: Some(buf),
            info,
            pd: Arc::clone(&self.inner),
        })
    }

    /// Registers raw memory, as `ibv_reg_mr` does: the range must be mapped, and writable
    /// when `access` lets the region be written (local or remote write, remote atomics, or
    /// window binds), else [`RegMrError::Fault`]; it must not be empty; and it must fit the
    /// device's cap on registered bytes ([`RegMrError::TooMuch`]).
    ///
    /// # Safety
    /// `addr..addr + len` must stay valid for reads and writes, from any thread,
    /// until the returned [`RawMr`] is dropped, and must not be accessed through
    /// Rust references meanwhile (peers may write it at any time).
    pub unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr, RegMrError> {
        if len == 0 {
            // The kernel's providers refuse a region with no pages behind it.
            return Err(ResourceError::InvalidArgument("a memory region cannot be empty").into());
        }
        let writable = access.intersects(
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_ATOMIC
                | AccessFlags::MW_BIND,
        );
        crate::sys::check_mapped(addr as usize, len, writable).map_err(|why| {
            RegMrError::Fault {
                addr: addr as u64,
                len,
                why,
            }
        })?;
        // SAFETY: forwarded from this function's contract.
        let info = unsafe { self.inner.register(addr, len, access) }?;
        Ok(RawMr {
            info,
            pd: Arc::clone(&self.inner),
        })
    }
}

/// The accessors every registration has, read from its `info: MrInfo` field.
macro_rules! region_accessors {
    () => {
        /// Local key.
        pub fn lkey(&self) -> u32 {
            self.info.lkey
        }

        /// Remote key, to hand to peers.
        pub fn rkey(&self) -> u32 {
            self.info.rkey
        }

        /// Start address (what peers use as the remote address).
        pub fn addr(&self) -> u64 {
            self.info.addr
        }

        /// Length in bytes.
        pub fn len(&self) -> usize {
            self.info.length
        }

        /// Whether the region is empty.
        pub fn is_empty(&self) -> bool {
            self.info.length == 0
        }
    };
}

impl<T: StableBuffer> Mr<T> {
    region_accessors!();

    /// An SGE over `len` bytes at `offset`. Bounds are checked when the engine
    /// uses it (LOC_PROT_ERR), as verbs does.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.info.addr + offset as u64,
            length: len,
            lkey: self.info.lkey,
        }
    }

    /// The whole region as one SGE.
    pub fn sge_all(&self) -> Sge {
        self.sge(0, u32::try_from(self.info.length).unwrap_or(u32::MAX))
    }

    fn check(&self, offset: usize, len: usize) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.info.length)
    }

    /// Copies bytes out of the region; `false` if out of range.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if !self.check(offset, out.len()) {
            return false;
        }
        // SAFETY: in range of the registered buffer, which the Mr owns; the
        // source may be written concurrently by the engine (like DMA), which can
        // only make the copied bytes stale, never unsafe for u8 data.
        unsafe {
            softverbs_engine::copy::copy_bytes(
                (self.info.addr as *const u8).add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        true
    }

    /// Copies bytes into the region; `false` if out of range.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        if !self.check(offset, data.len()) {
            return false;
        }
        // SAFETY: in range of the owned, registered buffer; no Rust reference to
        // it exists (the Mr hands none out).
        unsafe {
            softverbs_engine::copy::copy_bytes(
                data.as_ptr(),
                (self.info.addr as *mut u8).add(offset),
                data.len(),
            )
        };
        true
    }

    /// Deregisters the region and returns its buffer.
    pub fn into_inner(mut self) -> T {
        self.deregister();
        self.buf
            .take()
            .expect("buffer present until into_inner or drop")
    }

    fn deregister(&mut self) {
        self.pd.deregister(&self.info);
    }

    /// The engine handle (for tests and the C ABI).
    pub fn handle(&self) -> MrHandle {
        self.info.handle
    }
}

impl<T: StableBuffer> Drop for Mr<T> {
    fn drop(&mut self) {
        if self.buf.is_some() {
            // Keys stop working before the buffer is freed (fields drop after this).
            self.deregister();
        }
    }
}

/// A registered region of caller-managed memory.
pub struct RawMr {
    info: MrInfo,
    pd: Arc<PdInner>,
}

impl RawMr {
    region_accessors!();

    /// The engine handle (for memory-window binds, [`MwBindInfo::mr`]).
    ///
    /// [`MwBindInfo::mr`]: softverbs_engine::MwBindInfo
    pub fn handle(&self) -> MrHandle {
        self.info.handle
    }
}

impl Drop for RawMr {
    fn drop(&mut self) {
        self.pd.deregister(&self.info);
    }
}

//! What the C libraries of softverbs share: the stub libraries (`libmlx5.so.1`,
//! `libefa.so.1`) entirely, the drop-in `libibverbs.so.1` / `librdmacm.so.1` the versioned
//! trampolines, [`Zeroed`], the [`verbs_h`] mirrors both embed, and the test checks.
//!
//! Each stub crate lists its functions with [`stubs!`] (and [`compat!`] for extra,
//! non-default versions), passes [`cdylib_link_args`] from its `build.rs`, and checks
//! the built library with [`testing`] from its integration tests.
//!
//! # Symbol versions
//!
//! As in `softverbs-ibverbs-abi` (see its crate documentation): each function is an
//! ordinary, mangled Rust `extern "C" fn`; [`stubs!`] emits a `global_asm!` trampoline
//! that jumps to it and a `.symver softverbs_v_<name>, <name>@@<NODE>` naming it at its
//! node; the version script passed by [`cdylib_link_args`] declares only the nodes.
//!
//! # Return values
//!
//! Every stub ignores its arguments, so each is declared without parameters: in the C
//! calling conventions of x86_64 and aarch64 the caller owns argument registers and
//! stack. What it returns depends on the kind of its C return type, see [`stub_fn!`].

use core::ffi::c_int;

pub use libc;

/// rdma-core's `EOPNOTSUPP` (Linux: 95).
pub const EOPNOTSUPP: c_int = libc::EOPNOTSUPP;

/// Sets this thread's `errno` to `EOPNOTSUPP`.
pub fn set_errno() {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for writes.
    unsafe { *libc::__errno_location() = EOPNOTSUPP };
}

/// Types every byte of which may be zero: `#[repr(C)]` mirrors of C structs holding only
/// integers, raw pointers, `Option`s of function pointers, and arrays, unions and structs of
/// those. Gives them the C idiom `struct x v = {0};` / `calloc`.
///
/// # Safety
/// Implement only for types whose every field accepts all-zero bytes.
pub unsafe trait Zeroed: Sized {
    /// A value with every byte zero.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract says all-zero bytes are a valid `Self`.
        unsafe { core::mem::zeroed() }
    }
}

/// Implements [`Zeroed`] for C-mirror types that hold only integers, raw pointers, `Option`s
/// of function pointers, and arrays, unions and structs of those.
#[macro_export]
macro_rules! zeroed {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: `$t` holds only integers, raw pointers, `Option`s of function pointers, and
        // arrays, unions and structs of those (the macro's contract), all valid as zero bytes.
        unsafe impl $crate::Zeroed for $t {}
    )* };
}

/// Prints the cargo directives a stub library's `build.rs` needs: the version script
/// `map` (a file in the crate declaring the version nodes) and the SONAME.
pub fn cdylib_link_args(map: &str, soname: &str) {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed={map}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/{map}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}

/// The jump from a trampoline to its Rust function (`{f}` is the `sym` operand).
#[doc(hidden)]
#[cfg(target_arch = "x86_64")]
#[macro_export]
macro_rules! tail_jump {
    () => {
        "jmp {f}"
    };
}

/// The jump from a trampoline to its Rust function (`{f}` is the `sym` operand).
#[doc(hidden)]
#[cfg(target_arch = "aarch64")]
#[macro_export]
macro_rules! tail_jump {
    () => {
        "b {f}"
    };
}

/// A global function label `$label` that jumps to `$f`, published as `$public`
/// (`name@@NODE` or `name@NODE`).
#[macro_export]
macro_rules! trampoline {
    ($label:expr, $public:expr, $f:path) => {
        #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
        core::arch::global_asm!(
            ".pushsection .text",
            ".p2align 4",
            concat!(".globl ", $label),
            concat!(".type ", $label, ", STT_FUNC"),
            concat!($label, ":"),
            $crate::tail_jump!(),
            concat!(".size ", $label, ", . - ", $label),
            concat!(".symver ", $label, ", ", $public),
            ".popsection",
            f = sym $f,
        );
    };
}

/// One stub function, by the kind of its C return type: `ptr` returns NULL, `int`
/// returns `EOPNOTSUPP`, `fd` and `ssize` return -1 (each of these also sets `errno =
/// EOPNOTSUPP`), `bool` returns false, `void` does nothing.
#[macro_export]
macro_rules! stub_fn {
    (ptr $name:ident) => {
        #[doc = concat!("`", stringify!($name), "`: returns NULL, `errno = EOPNOTSUPP`.")]
        pub extern "C" fn $name() -> *mut core::ffi::c_void {
            $crate::set_errno();
            core::ptr::null_mut()
        }
    };
    (int $name:ident) => {
        #[doc = concat!("`", stringify!($name), "`: returns `EOPNOTSUPP` (and sets `errno`).")]
        pub extern "C" fn $name() -> core::ffi::c_int {
            $crate::set_errno();
            $crate::EOPNOTSUPP
        }
    };
    (fd $name:ident) => {
        #[doc = concat!("`", stringify!($name), "` (returns an fd): -1, `errno = EOPNOTSUPP`.")]
        pub extern "C" fn $name() -> core::ffi::c_int {
            $crate::set_errno();
            -1
        }
    };
    (ssize $name:ident) => {
        #[doc = concat!("`", stringify!($name), "` (`ssize_t`): -1, `errno = EOPNOTSUPP`.")]
        pub extern "C" fn $name() -> $crate::libc::ssize_t {
            $crate::set_errno();
            -1
        }
    };
    (bool $name:ident) => {
        #[doc = concat!("`", stringify!($name), "`: returns `false`.")]
        pub extern "C" fn $name() -> bool {
            false
        }
    };
    (void $name:ident) => {
        #[doc = concat!("`", stringify!($name), "` (`void`): does nothing.")]
        pub extern "C" fn $name() {}
    };
}

/// Stub functions grouped by version node; each is exported as `name@@NODE`.
#[macro_export]
macro_rules! stubs {
    ($( $node:literal { $( $kind:ident $name:ident; )* } )*) => {
        $($(
            $crate::stub_fn!($kind $name);
        )*)*
        $crate::exports! {
            $( $node { $( $name ),* } )*
        }
    };
}

/// Existing `extern "C"` functions (in scope by their C names) grouped by version node;
/// each is exported as `name@@NODE` through a trampoline (see the crate documentation).
#[macro_export]
macro_rules! exports {
    ($( $node:literal { $( $name:ident ),* $(,)? } )*) => {
        $($(
            $crate::trampoline!(
                concat!("softverbs_v_", stringify!($name)),
                concat!(stringify!($name), "@@", $node),
                $name
            );
        )*)*
    };
}

/// An additional, non-default version `name@NODE` of an already stubbed function.
#[macro_export]
macro_rules! compat {
    ($name:ident @ $node:literal) => {
        $crate::trampoline!(
            concat!("softverbs_c_", stringify!($name)),
            concat!(stringify!($name), "@", $node),
            $name
        );
    };
}

pub mod testing;
pub mod verbs_h;

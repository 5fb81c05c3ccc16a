//! The devices softverbs presents through `ibv_get_device_list`.
//!
//! rdma-core finds devices through netlink and sysfs; softverbs has no kernel device, so each
//! device is a [`SoftDevice`] built here: an [`ibv_device`] (first field, so a pointer to one
//! is a pointer to the other) plus softverbs' own data. Devices live for the whole process,
//! as rdma-core's do once listed, so pointers handed to C never dangle.

use std::sync::OnceLock;

use libc::{c_char, c_int};

use crate::abi::{ibv_device, Zeroed, IBV_NODE_CA, IBV_TRANSPORT_IB};

/// A softverbs device as C sees it.
#[repr(C)]
pub struct SoftDevice {
    /// What `struct ibv_device *` points at. Must stay the first field.
    pub ibv: ibv_device,
    /// Position in the device list (`ibv_get_device_index`).
    pub index: c_int,
    /// Node GUID, host order (`ibv_get_device_guid` returns it big-endian).
    pub guid: u64,
}

/// Raw pointers to the leaked devices; the pointees are never freed or moved.
struct Devices(Vec<*mut SoftDevice>);

// SAFETY: the pointers refer to leaked, never-freed `SoftDevice`s that softverbs only reads
// after construction; sharing the addresses between threads is sound.
unsafe impl Send for Devices {}
// SAFETY: as above; `Devices` itself is immutable after initialisation.
unsafe impl Sync for Devices {}

/// Copies `s` into a fixed C char array, NUL-terminated and truncated to fit.
fn set_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    dst[n..].fill(0);
}

fn build(index: c_int) -> SoftDevice {
    let name = format!("softverbs{index}");
    let mut ibv = ibv_device::zeroed();
    ibv.node_type = IBV_NODE_CA;
    ibv.transport_type = IBV_TRANSPORT_IB;
    set_cstr(&mut ibv.name, &name);
    set_cstr(&mut ibv.dev_name, &name);
    // No sysfs directories exist for a softverbs device: dev_path and ibdev_path stay empty.
    SoftDevice {
        ibv,
        index,
        guid: guid(index),
    }
}

/// The node GUID: the interface id of the device's GID when its UDP port is configured
/// (`SOFTVERBS_PORT`, so the GID is known before the device is opened); otherwise a locally
/// administered EUI-64 (02:00:00:ff:fe:...) numbered by index.
fn guid(index: c_int) -> u64 {
    softverbs::Config::from_env()
        .ok()
        .and_then(|c| {
            let port = c.port?;
            softverbs::Gid::from_socket_addr(std::net::SocketAddr::new(
                softverbs::addressing::base_addr(c.addr),
                port,
            ))
        })
        .map_or(
            0x0200_00ff_fe00_0000 | u64::from(index.unsigned_abs()),
            |g| g.interface_id(),
        )
}

fn devices() -> &'static [*mut SoftDevice] {
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    &DEVICES
        .get_or_init(|| Devices(vec![Box::into_raw(Box::new(build(0)))]))
        .0
}

/// The process-wide device list, in index order. Each pointer is valid for the whole process.
pub fn list() -> &'static [*mut SoftDevice] {
    devices()
}

/// The [`SoftDevice`] around `dev`, if `dev` is one of ours.
pub fn lookup(dev: *const ibv_device) -> Option<&'static SoftDevice> {
    devices()
        .iter()
        .find(|&&d| d.cast_const().cast::<ibv_device>() == dev)
        // SAFETY: `d` is one of the leaked devices, valid for 'static and never written after
        // construction by softverbs.
        .map(|&d| unsafe { &*d })
}

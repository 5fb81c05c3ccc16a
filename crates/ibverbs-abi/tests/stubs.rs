//! Every export softverbs does not implement returns exactly what rdma-core 44 returns when
//! the provider lacks the operation: one table, checked through the built
//! `libsoftverbs_ibverbs.so` (each symbol looked up at its version node with `dlvsym`, as a
//! program linked against rdma-core finds it).
//!
//! Where the expectations come from (rdma-core v44.0, `libibverbs/`):
//! - `dummy_ops.c`: what every op a provider leaves out does (NULL + errno EOPNOTSUPP for
//!   objects, the value EOPNOTSUPP for ints, nothing for voids; `query_qp_data_in_order`
//!   0; `rereg_mr` errno EOPNOTSUPP and `IBV_REREG_MR_ERR_INPUT`).
//! - `verbs.c`: `ibv_rereg_mr` checks its arguments (`IBV_REREG_MR_ERR_INPUT`, EINVAL) and
//!   turns an op failure into `IBV_REREG_MR_ERR_CMD`; `ibv_set_ece` sets errno EOPNOTSUPP for
//!   a zero vendor id; `ibv_resolve_eth_l2_from_gid` fails with -1 (query_gid) or a
//!   negative errno.
//! - `device.c`: `ibv_import_device` (EINVAL for a non-character fd, ENODEV for no device,
//!   EOPNOTSUPP for a device that cannot import); `verbs_open_device` is `ibv_open_device`.
//! - `sysfs.c`, `memory.c`, `marshall.c`: sysfs helpers, fork calls, struct copies.

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::ffi::{CStr, CString};
use std::path::PathBuf;

use softverbs_ibverbs::abi::*;
use softverbs_ibverbs::marshall::*;
use softverbs_ibverbs::stubs::NOT_IMPLEMENTED;

const LIB: &str = "libsoftverbs_ibverbs.so";

fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    [deps, deps.parent().expect("profile dir")]
        .into_iter()
        .map(|d| d.join(LIB))
        .filter_map(|so| Some((so.metadata().ok()?.modified().ok()?, so)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, so)| so)
        .unwrap_or_else(|| panic!("{LIB} not found next to {}", deps.display()))
}

/// The library, loaded once.
struct Lib(*mut c_void);

impl Lib {
    fn load() -> Lib {
        let path = CString::new(cdylib().to_string_lossy().into_owned()).unwrap();
        // SAFETY: dlopen with a valid path; the handle is checked.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", cdylib().display());
        Lib(h)
    }

    /// `name@node`.
    fn sym(&self, name: &str, node: &str) -> *mut c_void {
        let (n, v) = (CString::new(name).unwrap(), CString::new(node).unwrap());
        // SAFETY: a live handle and NUL-terminated strings.
        let p = unsafe { libc::dlvsym(self.0, n.as_ptr(), v.as_ptr()) };
        assert!(!p.is_null(), "{name}@{node} is not exported");
        p
    }
}

/// The node a default-version export is at.
fn node(name: &str) -> &'static str {
    softverbs_ibverbs::EXPORTS
        .iter()
        .find(|e| e.default && e.name == name)
        .unwrap_or_else(|| panic!("{name} not in EXPORTS"))
        .node
}

fn errno() -> c_int {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// What a call returned: its value (pointers as integers, voids 0) and errno afterwards
/// (set to a marker, 12345, before the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Got(i64, c_int);

const UNSET: c_int = 12345;

/// The objects the calls are made on: a context, PD, CQ and QP of the loaded library.
struct Objs {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    dev: *mut ibv_device,
}

macro_rules! f {
    ($lib:expr, $name:expr, fn($($t:ty),*) -> $r:ty) => {{
        let p = $lib.sym($name, node($name));
        // The symbol has this C prototype (rdma-core 44's headers); every use is inside an
        // unsafe block or fn whose SAFETY comment covers it.
        core::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> $r>(p)
    }};
}

/// Calls `name` with representative arguments; what it returned.
fn call(lib: &Lib, o: &Objs, name: &str) -> Got {
    set_errno(UNSET);
    let mut ece = [0u32; 3];
    let mut buf = [0 as c_char; 64];
    // SAFETY (every call below): each symbol is called with its rdma-core prototype and
    // live objects or buffers; the unsupported ones read nothing.
    let v: i64 = unsafe {
        match name {
            "ibv_rereg_mr" => f!(
                lib,
                name,
                fn(*mut ibv_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int
            )(
                o.mr,
                1 << 2,
                o.pd,
                core::ptr::null_mut(),
                0,
                IBV_ACCESS_LOCAL_WRITE as c_int,
            ) as i64,
            "ibv_resize_cq" => f!(lib, name, fn(*mut ibv_cq, c_int) -> c_int)(o.cq, 100) as i64,
            "ibv_query_ece" => {
                f!(lib, name, fn(*mut ibv_qp, *mut u32) -> c_int)(o.qp, ece.as_mut_ptr()) as i64
            }
            "ibv_set_ece" => {
                ece[0] = 0x1234;
                f!(lib, name, fn(*mut ibv_qp, *mut u32) -> c_int)(o.qp, ece.as_mut_ptr()) as i64
            }
            "ibv_import_device" => f!(lib, name, fn(c_int) -> *mut ibv_context)(-1) as i64,
            "ibv_import_pd" => {
                f!(lib, name, fn(*mut ibv_context, u32) -> *mut ibv_pd)(o.ctx, 1) as i64
            }
            "ibv_import_mr" => f!(lib, name, fn(*mut ibv_pd, u32) -> *mut ibv_mr)(o.pd, 1) as i64,
            "ibv_import_dm" => {
                f!(lib, name, fn(*mut ibv_context, u32) -> *mut c_void)(o.ctx, 1) as i64
            }
            "ibv_unimport_pd" | "ibv_unimport_mr" | "ibv_unimport_dm" => {
                f!(lib, name, fn(*mut c_void) -> ())(o.pd.cast());
                0
            }
            "ibv_reg_dmabuf_mr" => {
                f!(
                    lib,
                    name,
                    fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr
                )(o.pd, 0, 4096, 0, 0, IBV_ACCESS_LOCAL_WRITE as c_int) as i64
            }
            "ibv_resolve_eth_l2_from_gid" => {
                let mut a = ibv_ah_attr::zeroed();
                a.port_num = 1;
                a.is_global = 1;
                let mut mac = [0u8; 6];
                let mut vid = 0u16;
                f!(
                    lib,
                    name,
                    fn(*mut ibv_context, *mut ibv_ah_attr, *mut u8, *mut u16) -> c_int
                )(o.ctx, &mut a, mac.as_mut_ptr(), &mut vid) as i64
            }
            "ibv_get_sysfs_path" => {
                let p = f!(lib, name, fn() -> *const c_char)();
                let want = std::env::var("SYSFS_PATH")
                    .map(|v| v.trim_end_matches('/').to_string())
                    .unwrap_or_else(|_| "/sys".into());
                i64::from(CStr::from_ptr(p).to_str() == Ok(want.as_str()))
            }
            "ibv_read_sysfs_file" => {
                let n = f!(
                    lib,
                    name,
                    fn(*const c_char, *const c_char, *mut c_char, usize) -> c_int
                )(
                    c"/proc/sys/kernel".as_ptr(),
                    c"ostype".as_ptr(),
                    buf.as_mut_ptr(),
                    64,
                );
                assert_eq!(
                    CStr::from_ptr(buf.as_ptr()),
                    c"Linux",
                    "ibv_read_sysfs_file text"
                );
                n as i64
            }
            "ibv_read_ibdev_sysfs_file" => f!(
                lib,
                name,
                fn(*mut c_char, usize, *mut c_void, *const c_char) -> c_int
            )(
                buf.as_mut_ptr(),
                64,
                core::ptr::null_mut(),
                c"ports/1/lid".as_ptr(),
            ) as i64,
            "ibv_fork_init" | "ibv_is_fork_initialized" => f!(lib, name, fn() -> c_int)() as i64,
            "ibv_dontfork_range" | "ibv_dofork_range" => {
                f!(lib, name, fn(*mut c_void, usize) -> c_int)(buf.as_mut_ptr().cast(), 64) as i64
            }
            "ibv_query_qp_data_in_order" => {
                f!(lib, name, fn(*mut ibv_qp, c_int, u32) -> c_int)(o.qp, IBV_WR_RDMA_WRITE, 0)
                    as i64
            }
            "ibv_copy_ah_attr_from_kern" => copy_ah(lib),
            "ibv_copy_qp_attr_from_kern" => copy_qp(lib),
            "ibv_copy_path_rec_from_kern" | "ibv_copy_path_rec_to_kern" => copy_path(lib),
            "verbs_open_device" => {
                let c = f!(
                    lib,
                    name,
                    fn(*mut ibv_device, *mut c_void) -> *mut ibv_context
                )(o.dev, core::ptr::null_mut());
                let close = f!(lib, "ibv_close_device", fn(*mut ibv_context) -> c_int);
                i64::from(!c.is_null() && close(c) == 0)
            }
            "_verbs_init_and_alloc_context" => {
                f!(
                    lib,
                    name,
                    fn(*mut ibv_device, c_int, usize, *mut c_void, u32) -> *mut c_void
                )(o.dev, -1, 1024, core::ptr::null_mut(), 0) as i64
            }
            "verbs_init_cq"
            | "verbs_register_driver_34"
            | "verbs_set_ops"
            | "verbs_uninit_context"
            | "__verbs_log" => {
                f!(lib, name, fn() -> ())();
                0
            }
            "verbs_allow_disassociate_destroy" => {
                i64::from(f!(lib, name, fn(c_int) -> bool)(-libc::EIO))
            }
            "__ioctl_final_num_attrs" => {
                f!(lib, name, fn(c_uint, *mut c_void) -> c_uint)(0, core::ptr::null_mut()) as i64
            }
            // The provider-side commands (IBVERBS_PRIVATE_34): no kernel to run them.
            _ if name == "execute_ioctl" || name.starts_with("ibv_cmd_") => {
                f!(lib, name, fn() -> c_int)() as i64
            }
            _ => panic!("no call for {name}"),
        }
    };
    Got(v, errno())
}

/// `ibv_copy_ah_attr_from_kern` copies every field: 1 if it did.
///
/// # Safety
/// `lib` loaded.
unsafe fn copy_ah(lib: &Lib) -> i64 {
    let f = f!(
        lib,
        "ibv_copy_ah_attr_from_kern",
        fn(*mut ibv_ah_attr, *const ib_uverbs_ah_attr) -> ()
    );
    let src = kern_ah(3);
    let mut dst = ibv_ah_attr::zeroed();
    // SAFETY: live structs of the prototype's types.
    unsafe { f(&mut dst, &src) };
    i64::from(ah_matches(&dst, &src))
}

fn kern_ah(seed: u8) -> ib_uverbs_ah_attr {
    ib_uverbs_ah_attr {
        grh: ib_uverbs_global_route {
            dgid: [seed; 16],
            flow_label: 0x12345 + u32::from(seed),
            sgid_index: seed + 1,
            hop_limit: seed + 2,
            traffic_class: seed + 3,
            reserved: 0,
        },
        dlid: 0x1234 + u16::from(seed),
        sl: seed + 4,
        src_path_bits: seed + 5,
        static_rate: seed + 6,
        is_global: 1,
        port_num: seed + 7,
        reserved: 0,
    }
}

fn ah_matches(d: &ibv_ah_attr, s: &ib_uverbs_ah_attr) -> bool {
    // SAFETY: every bit pattern of the GID union is a valid byte array.
    let dgid = unsafe { d.grh.dgid.raw };
    dgid == s.grh.dgid
        && (
            d.grh.flow_label,
            d.grh.sgid_index,
            d.grh.hop_limit,
            d.grh.traffic_class,
        ) == (
            s.grh.flow_label,
            s.grh.sgid_index,
            s.grh.hop_limit,
            s.grh.traffic_class,
        )
        && (
            d.dlid,
            d.sl,
            d.src_path_bits,
            d.static_rate,
            d.is_global,
            d.port_num,
        ) == (
            s.dlid,
            s.sl,
            s.src_path_bits,
            s.static_rate,
            s.is_global,
            s.port_num,
        )
}

/// `ibv_copy_qp_attr_from_kern` copies every field but `qp_state`: 1 if it did.
///
/// # Safety
/// `lib` loaded.
unsafe fn copy_qp(lib: &Lib) -> i64 {
    let f = f!(
        lib,
        "ibv_copy_qp_attr_from_kern",
        fn(*mut ibv_qp_attr, *const ib_uverbs_qp_attr) -> ()
    );
    let src = ib_uverbs_qp_attr {
        qp_attr_mask: 0xffff,
        qp_state: 3,
        cur_qp_state: 2,
        path_mtu: 3,
        path_mig_state: 1,
        qkey: 0x1111,
        rq_psn: 0x2222,
        sq_psn: 0x3333,
        dest_qp_num: 0x4444,
        qp_access_flags: 7,
        ah_attr: kern_ah(10),
        alt_ah_attr: kern_ah(20),
        max_send_wr: 11,
        max_recv_wr: 12,
        max_send_sge: 13,
        max_recv_sge: 14,
        max_inline_data: 15,
        pkey_index: 16,
        alt_pkey_index: 17,
        en_sqd_async_notify: 1,
        sq_draining: 1,
        max_rd_atomic: 18,
        max_dest_rd_atomic: 19,
        min_rnr_timer: 20,
        port_num: 21,
        timeout: 22,
        retry_cnt: 23,
        rnr_retry: 24,
        alt_port_num: 25,
        alt_timeout: 26,
        reserved: [0; 5],
    };
    let mut d = ibv_qp_attr::zeroed();
    d.qp_state = 6;
    // SAFETY: live structs of the prototype's types.
    unsafe { f(&mut d, &src) };
    let ok = d.qp_state == 6 // not copied, as in rdma-core
        && (d.cur_qp_state, d.path_mtu, d.path_mig_state) == (2, 3, 1)
        && (d.qkey, d.rq_psn, d.sq_psn, d.dest_qp_num, d.qp_access_flags)
            == (0x1111, 0x2222, 0x3333, 0x4444, 7)
        && (d.cap.max_send_wr, d.cap.max_recv_wr, d.cap.max_send_sge, d.cap.max_recv_sge)
            == (11, 12, 13, 14)
        && d.cap.max_inline_data == 15
        && ah_matches(&d.ah_attr, &src.ah_attr)
        && ah_matches(&d.alt_ah_attr, &src.alt_ah_attr)
        && (d.pkey_index, d.alt_pkey_index) == (16, 17)
        && (d.en_sqd_async_notify, d.sq_draining, d.max_rd_atomic, d.max_dest_rd_atomic)
            == (1, 1, 18, 19)
        && (d.min_rnr_timer, d.port_num, d.timeout, d.retry_cnt, d.rnr_retry)
            == (20, 21, 22, 23, 24)
        && (d.alt_port_num, d.alt_timeout) == (25, 26);
    i64::from(ok)
}

/// Path records copied to the kernel form and back are unchanged: 1 if they are.
///
/// # Safety
/// `lib` loaded.
unsafe fn copy_path(lib: &Lib) -> i64 {
    let to = f!(
        lib,
        "ibv_copy_path_rec_to_kern",
        fn(*mut ib_user_path_rec, *const ibv_sa_path_rec) -> ()
    );
    let from = f!(
        lib,
        "ibv_copy_path_rec_from_kern",
        fn(*mut ibv_sa_path_rec, *const ib_user_path_rec) -> ()
    );
    let rec = ibv_sa_path_rec {
        dgid: ibv_gid { raw: [1; 16] },
        sgid: ibv_gid { raw: [2; 16] },
        dlid: 3,
        slid: 4,
        raw_traffic: 1,
        flow_label: 5,
        hop_limit: 6,
        traffic_class: 7,
        reversible: 1,
        numb_path: 8,
        pkey: 0xffff,
        sl: 9,
        mtu_selector: 2,
        mtu: 5,
        rate_selector: 2,
        rate: 10,
        packet_life_time_selector: 2,
        packet_life_time: 11,
        preference: 12,
    };
    // SAFETY: plain old data; all-zero is valid.
    let mut kern: ib_user_path_rec = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut back: ibv_sa_path_rec = unsafe { core::mem::zeroed() };
    // SAFETY: live structs of the prototypes' types.
    unsafe {
        to(&mut kern, &rec);
        from(&mut back, &kern);
    }
    let bytes = |r: &ibv_sa_path_rec| {
        // SAFETY: the GID unions are byte arrays.
        let (d, s) = unsafe { (r.dgid.raw, r.sgid.raw) };
        (
            d,
            s,
            (
                r.dlid,
                r.slid,
                r.raw_traffic,
                r.flow_label,
                r.hop_limit,
                r.traffic_class,
            ),
            (
                r.reversible,
                r.numb_path,
                r.pkey,
                r.sl,
                r.mtu_selector,
                r.mtu,
            ),
            (
                r.rate_selector,
                r.rate,
                r.packet_life_time_selector,
                r.packet_life_time,
                r.preference,
            ),
        )
    };
    i64::from(kern.mtu == 5 && kern.dgid == [1; 16] && bytes(&back) == bytes(&rec))
}

/// What rdma-core 44 returns for each call of [`call`] (a provider without the op).
fn expected(name: &str) -> Got {
    const OPNOTSUPP: i64 = libc::EOPNOTSUPP as i64;
    match name {
        // verbs.c: valid arguments, then the op fails: IBV_REREG_MR_ERR_CMD, errno from
        // dummy_ops.c.
        "ibv_rereg_mr" => Got(-4, libc::EOPNOTSUPP),
        "ibv_resize_cq" | "ibv_query_ece" => Got(OPNOTSUPP, UNSET),
        // verbs.c: a vendor id is set, so dummy_ops.c's set_ece answers (errno untouched).
        "ibv_set_ece" => Got(OPNOTSUPP, UNSET),
        // device.c: fd -1 fails fstat.
        "ibv_import_device" => Got(0, libc::EINVAL),
        "ibv_import_pd"
        | "ibv_import_mr"
        | "ibv_import_dm"
        | "ibv_reg_dmabuf_mr"
        | "_verbs_init_and_alloc_context" => Got(0, libc::EOPNOTSUPP),
        "ibv_unimport_pd" | "ibv_unimport_mr" | "ibv_unimport_dm" => Got(0, UNSET),
        "ibv_resolve_eth_l2_from_gid" => Got(-(libc::EINVAL as i64), UNSET),
        // sysfs.c: "/sys" (or $SYSFS_PATH); "Linux" is 5 bytes once the newline is cut;
        // no sysfs device: -1, EINVAL.
        "ibv_get_sysfs_path" => Got(1, UNSET),
        "ibv_read_sysfs_file" => Got(5, UNSET),
        "ibv_read_ibdev_sysfs_file" => Got(-1, libc::EINVAL),
        // memory.c with a kernel that copies registered pages on fork: IBV_FORK_UNNEEDED.
        "ibv_fork_init" | "ibv_dontfork_range" | "ibv_dofork_range" => Got(0, UNSET),
        "ibv_is_fork_initialized" => Got(2, UNSET),
        "ibv_query_qp_data_in_order" => Got(0, UNSET),
        // marshall.c: the copies (1: every field arrived).
        "ibv_copy_ah_attr_from_kern"
        | "ibv_copy_qp_attr_from_kern"
        | "ibv_copy_path_rec_from_kern"
        | "ibv_copy_path_rec_to_kern" => Got(1, UNSET),
        // device.c: ibv_open_device.
        "verbs_open_device" => Got(1, UNSET),
        "verbs_init_cq"
        | "verbs_register_driver_34"
        | "verbs_set_ops"
        | "verbs_uninit_context"
        | "__verbs_log" => Got(0, UNSET),
        "verbs_allow_disassociate_destroy" | "__ioctl_final_num_attrs" => Got(0, UNSET),
        _ if name == "execute_ioctl" || name.starts_with("ibv_cmd_") => Got(OPNOTSUPP, UNSET),
        _ => panic!("no expectation for {name}"),
    }
}

/// Opens a context of the loaded library and makes a PD, MR, CQ and QP on it.
fn objects(lib: &Lib, buf: &mut [u8]) -> Objs {
    // SAFETY: the symbols have these prototypes; the calls are made in order on live objects.
    unsafe {
        let list = f!(
            lib,
            "ibv_get_device_list",
            fn(*mut c_int) -> *mut *mut ibv_device
        )(core::ptr::null_mut());
        let dev = *list;
        let ctx = f!(
            lib,
            "ibv_open_device",
            fn(*mut ibv_device) -> *mut ibv_context
        )(dev);
        assert!(!ctx.is_null());
        let pd = f!(lib, "ibv_alloc_pd", fn(*mut ibv_context) -> *mut ibv_pd)(ctx);
        let mr = f!(
            lib,
            "ibv_reg_mr",
            fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr
        )(
            pd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            IBV_ACCESS_LOCAL_WRITE as c_int,
        );
        let cq = f!(
            lib,
            "ibv_create_cq",
            fn(*mut ibv_context, c_int, *mut c_void, *mut c_void, c_int) -> *mut ibv_cq
        )(ctx, 8, core::ptr::null_mut(), core::ptr::null_mut(), 0);
        let mut init = ibv_qp_init_attr::zeroed();
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = 1;
        init.cap.max_recv_wr = 1;
        let qp = f!(
            lib,
            "ibv_create_qp",
            fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp
        )(pd, &mut init);
        assert!(!pd.is_null() && !mr.is_null() && !cq.is_null() && !qp.is_null());
        Objs {
            ctx,
            pd,
            cq,
            qp,
            mr,
            dev,
        }
    }
}

#[test]
fn every_unimplemented_export_fails_as_rdma_core_does() {
    let lib = Lib::load();
    let mut buf = vec![0u8; 4096];
    let o = objects(&lib, &mut buf);
    let mut wrong = Vec::new();
    for &name in NOT_IMPLEMENTED {
        let (got, want) = (call(&lib, &o, name), expected(name));
        if got != want {
            wrong.push(format!("{name}: got {got:?}, rdma-core returns {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

/// The other arms of the functions with logic in front of the op.
#[test]
fn the_checks_in_front_of_the_ops_are_rdma_core_s() {
    let lib = Lib::load();
    let mut buf = vec![0u8; 4096];
    let o = objects(&lib, &mut buf);
    // SAFETY: the symbols have these prototypes; the objects are live.
    unsafe {
        let rereg = f!(
            lib,
            "ibv_rereg_mr",
            fn(*mut ibv_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int
        );
        // Unknown flags; CHANGE_TRANSLATION without an address or length; access flags
        // without CHANGE_ACCESS: IBV_REREG_MR_ERR_INPUT (-1) with errno EINVAL.
        for (flags, addr, len, access) in [
            (1 << 3, core::ptr::null_mut(), 0, 0),
            (1, core::ptr::null_mut(), 4096, 0),
            (1, buf.as_mut_ptr().cast(), 0, 0),
            (
                1 << 1,
                core::ptr::null_mut(),
                0,
                IBV_ACCESS_LOCAL_WRITE as c_int,
            ),
        ] {
            set_errno(UNSET);
            assert_eq!(
                (rereg(o.mr, flags, o.pd, addr, len, access), errno()),
                (-1, libc::EINVAL),
                "flags {flags:#x}"
            );
        }
        // Valid translation change: the op (missing) fails: IBV_REREG_MR_ERR_CMD.
        set_errno(UNSET);
        let r = rereg(o.mr, 1, o.pd, buf.as_mut_ptr().cast(), 4096, 0);
        assert_eq!((r, errno()), (-4, libc::EOPNOTSUPP));

        // ibv_set_ece with a zero vendor id: errno EOPNOTSUPP too.
        let set_ece = f!(lib, "ibv_set_ece", fn(*mut ibv_qp, *mut u32) -> c_int);
        let mut ece = [0u32; 3];
        set_errno(UNSET);
        assert_eq!(
            (set_ece(o.qp, ece.as_mut_ptr()), errno()),
            (libc::EOPNOTSUPP, libc::EOPNOTSUPP)
        );

        // ibv_import_device: a character device that is no RDMA device: ENODEV; a
        // softverbs context's cmd_fd finds the device, which cannot import: EOPNOTSUPP.
        let import = f!(lib, "ibv_import_device", fn(c_int) -> *mut ibv_context);
        let null = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsRawFd;
        set_errno(UNSET);
        assert!(import(null.as_raw_fd()).is_null());
        assert_eq!(errno(), libc::ENODEV);
        set_errno(UNSET);
        assert!(import((*o.ctx).cmd_fd).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        let dup = libc::dup((*o.ctx).cmd_fd);
        assert!(dup >= 0, "cmd_fd can be dup'ed");
        set_errno(UNSET);
        assert!(import(dup).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        libc::close(dup);

        // ibv_resolve_eth_l2_from_gid with a GID index the port does not have: -1, as
        // ibv_query_gid answers.
        let resolve = f!(
            lib,
            "ibv_resolve_eth_l2_from_gid",
            fn(*mut ibv_context, *mut ibv_ah_attr, *mut u8, *mut u16) -> c_int
        );
        let mut a = ibv_ah_attr::zeroed();
        a.port_num = 1;
        a.grh.sgid_index = 5;
        let mut mac = [0u8; 6];
        let mut vid = 0u16;
        assert_eq!(resolve(o.ctx, &mut a, mac.as_mut_ptr(), &mut vid), -1);

        // ibv_read_sysfs_file: a missing file is -1.
        let read = f!(
            lib,
            "ibv_read_sysfs_file",
            fn(*const c_char, *const c_char, *mut c_char, usize) -> c_int
        );
        let mut text = [0 as c_char; 16];
        assert_eq!(
            read(
                c"/proc".as_ptr(),
                c"no-such-file".as_ptr(),
                text.as_mut_ptr(),
                16
            ),
            -1
        );
    }
}

/// The hidden `@IBVERBS_1.0` versions (rdma-core 1.0's structs), which softverbs does not
/// support, fail cleanly: NULL or -1 with errno EOPNOTSUPP, EOPNOTSUPP, or nothing.
#[test]
fn the_1_0_compat_versions_fail_cleanly() {
    let lib = Lib::load();
    for e in softverbs_ibverbs::EXPORTS.iter().filter(|e| !e.default) {
        let p = lib.sym(e.name, e.node);
        set_errno(UNSET);
        // SAFETY: the compat stubs take no arguments and read none.
        let got = unsafe {
            match e.name {
                "ibv_alloc_pd"
                | "ibv_create_ah"
                | "ibv_create_cq"
                | "ibv_create_qp"
                | "ibv_create_srq"
                | "ibv_get_device_list"
                | "ibv_open_device"
                | "ibv_reg_mr"
                | "ibv_get_device_name" => {
                    let f: unsafe extern "C" fn() -> *mut c_void = core::mem::transmute(p);
                    Got(f() as i64, errno())
                }
                "ibv_get_async_event" | "ibv_get_cq_event" => {
                    let f: unsafe extern "C" fn() -> c_int = core::mem::transmute(p);
                    Got(i64::from(f()), errno())
                }
                "ibv_ack_async_event"
                | "ibv_ack_cq_events"
                | "ibv_free_device_list"
                | "ibv_register_driver" => {
                    let f: unsafe extern "C" fn() = core::mem::transmute(p);
                    f();
                    Got(0, errno())
                }
                "ibv_get_device_guid" => {
                    let f: unsafe extern "C" fn() -> u64 = core::mem::transmute(p);
                    Got(f() as i64, errno())
                }
                _ => {
                    let f: unsafe extern "C" fn() -> c_int = core::mem::transmute(p);
                    Got(i64::from(f()), errno())
                }
            }
        };
        let want = match e.name {
            "ibv_alloc_pd"
            | "ibv_create_ah"
            | "ibv_create_cq"
            | "ibv_create_qp"
            | "ibv_create_srq"
            | "ibv_get_device_list"
            | "ibv_open_device"
            | "ibv_reg_mr"
            | "ibv_get_device_name" => Got(0, libc::EOPNOTSUPP),
            "ibv_get_async_event" | "ibv_get_cq_event" => Got(-1, libc::EOPNOTSUPP),
            "ibv_ack_async_event"
            | "ibv_ack_cq_events"
            | "ibv_free_device_list"
            | "ibv_register_driver"
            | "ibv_get_device_guid" => Got(0, UNSET),
            _ => Got(i64::from(libc::EOPNOTSUPP), UNSET),
        };
        assert_eq!(got, want, "{}@{}", e.name, e.node);
    }
}

//! Debian's real `ibv_devices` and `ibv_devinfo -v` (package ibverbs-utils) run unchanged on
//! the drop-in `libibverbs.so.1` (LD_LIBRARY_PATH to the drop-in directory, `common::dropin`).
//!
//! Skips loudly without the tools, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::net::UdpSocket;
use std::process::Command;

/// Runs `tool args` on the drop-in with a fixed loopback endpoint; its stdout, or None when
/// the tool is missing (skipped).
fn run_tool(tool: &str, args: &[&str], port: u16) -> Option<String> {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if !found {
        common::skip(&format!(
            "`{tool}` not available (apt-get install ibverbs-utils)"
        ));
        return None;
    }
    let out = Command::new(tool)
        .args(args)
        .env("LD_LIBRARY_PATH", common::dropin(tool))
        .env_remove("SOFTVERBS_ADDR")
        .env("SOFTVERBS_PORT", port.to_string())
        .output()
        .expect("run tool");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{tool} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout)
}

fn free_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("addr").port()
}

/// The GID softverbs gives 127.0.0.1:`port` and its interface id (the node GUID).
fn expected_gid(port: u16) -> ([u8; 16], u64) {
    let gid = softverbs::Gid::from_socket_addr(([127, 0, 0, 1], port).into()).expect("gid");
    (gid.0, gid.interface_id())
}

#[test]
fn ibv_devices_lists_softverbs0() {
    let port = free_port();
    let Some(out) = run_tool("ibv_devices", &[], port) else {
        return;
    };
    let (_, guid) = expected_gid(port);
    let line = out
        .lines()
        .find(|l| l.contains("softverbs0"))
        .unwrap_or_else(|| panic!("no softverbs0 in:\n{out}"));
    assert!(
        line.contains(&format!("{guid:016x}")),
        "GUID {guid:016x}:\n{out}"
    );
}

#[test]
fn ibv_devinfo_verbose_shows_port_and_gid() {
    let port = free_port();
    let Some(out) = run_tool("ibv_devinfo", &["-v"], port) else {
        return;
    };
    let (gid, guid) = expected_gid(port);
    assert!(out.contains("hca_id:\tsoftverbs0"), "{out}");
    let g = format!("{guid:016x}");
    let guid_str = format!("{}:{}:{}:{}", &g[0..4], &g[4..8], &g[8..12], &g[12..16]);
    assert!(
        out.contains(&format!("node_guid:\t\t\t{guid_str}")),
        "{out}"
    );
    assert!(out.contains("phys_port_cnt:\t\t\t1"), "{out}");
    assert_eq!(out.matches("\tport:\t").count(), 1, "one port:\n{out}");
    assert!(out.contains("state:\t\t\tPORT_ACTIVE (4)"), "{out}");
    assert!(out.contains("link_layer:\t\tEthernet"), "{out}");
    assert!(out.contains("active_mtu:\t\t"), "{out}");
    assert!(out.contains("num_comp_vectors:\t\t1"), "{out}");
    let gid_text = std::net::Ipv6Addr::from(gid).to_string();
    assert!(
        out.contains(&format!("GID[  0]:\t\t{gid_text}, RoCE v2")),
        "GID {gid_text}:\n{out}"
    );
}

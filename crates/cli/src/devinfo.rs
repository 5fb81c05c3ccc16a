//! `softverbs devinfo`: the device as `ibv_devinfo` shows an RDMA device.

use crate::conn::open_device;
use crate::Result;
use softverbs::{LinkLayer, Mtu, PortState};

fn guid(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// `enum ibv_mtu` value of an MTU.
fn mtu_code(m: Mtu) -> u32 {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

pub fn run(verbose: bool) -> Result<()> {
    let ctx = open_device(None, None)?;
    let dev = ctx.query_device();
    let port = ctx.query_port(1)?;
    let version = env!("CARGO_PKG_VERSION");
    println!("hca_id:\t{}", ctx.name());
    println!("\ttransport:\t\t\tInfiniBand (0)");
    println!("\tfw_ver:\t\t\t\t{version} (softverbs: software device, no firmware)");
    println!("\tnode_guid:\t\t\t{}", guid(dev.node_guid));
    println!("\tsys_image_guid:\t\t\t{}", guid(dev.node_guid));
    println!("\tvendor_id:\t\t\t0x0000 (softverbs: no PCI vendor)");
    println!("\tvendor_part_id:\t\t\t0 (softverbs)");
    println!("\thw_ver:\t\t\t\t0x0 (softverbs)");
    println!("\tboard_id:\t\t\tsoftverbs (RoCEv2 in UDP, user space)");
    println!("\tphys_port_cnt:\t\t\t{}", dev.phys_port_cnt);
    if verbose {
        let limits: [(&str, String); 13] = [
            ("max_mr_size", format!("{:#x}", dev.max_mr_size)),
            ("max_qp", dev.max_qp.to_string()),
            ("max_qp_wr", dev.max_qp_wr.to_string()),
            ("max_sge", dev.max_sge.to_string()),
            ("max_cq", dev.max_cq.to_string()),
            ("max_cqe", dev.max_cqe.to_string()),
            ("max_mr", dev.max_mr.to_string()),
            ("max_pd", dev.max_pd.to_string()),
            ("max_qp_rd_atom", dev.max_qp_rd_atom.to_string()),
            ("max_qp_init_rd_atom", dev.max_qp_init_rd_atom.to_string()),
            ("max_inline_data", dev.max_inline_data.to_string()),
            ("max_msg_sz", format!("{:#x}", dev.max_msg_size)),
            (
                "atomic_cap",
                if dev.atomic_cap_hca {
                    "ATOMIC_HCA (1)".to_string()
                } else {
                    "ATOMIC_NONE (0)".to_string()
                },
            ),
        ];
        for (name, value) in limits {
            let tabs = match name.len() {
                0..=6 => "\t\t\t\t",
                7..=14 => "\t\t\t",
                _ => "\t\t",
            };
            println!("\t{name}:{tabs}{value}");
        }
    }
    let state = match port.state {
        PortState::Active => "PORT_ACTIVE (4)",
    };
    let link = match port.link_layer {
        LinkLayer::Ethernet => "Ethernet",
    };
    println!("\t\tport:\t1");
    println!("\t\t\tstate:\t\t\t{state}");
    println!(
        "\t\t\tmax_mtu:\t\t{} ({})",
        port.max_mtu.bytes(),
        mtu_code(port.max_mtu)
    );
    println!(
        "\t\t\tactive_mtu:\t\t{} ({})",
        port.active_mtu.bytes(),
        mtu_code(port.active_mtu)
    );
    println!("\t\t\tsm_lid:\t\t\t0");
    println!("\t\t\tport_lid:\t\t{}", port.lid);
    println!("\t\t\tport_lmc:\t\t0x00");
    println!("\t\t\tlink_layer:\t\t{link}");
    println!(
        "\t\t\tudp_endpoint:\t\t{} (softverbs; see SOFTVERBS_ADDR and SOFTVERBS_PORT)",
        ctx.local_addr()
    );
    if verbose {
        println!("\t\t\tgid_tbl_len:\t\t{}", port.gid_tbl_len);
        for i in 0..port.gid_tbl_len {
            let Ok(idx) = u16::try_from(i) else { break };
            let gid = ctx.query_gid(1, idx)?;
            println!("\t\t\tGID[{i:>3}]:\t\t{gid}, RoCE v2");
        }
    }
    println!();
    Ok(())
}

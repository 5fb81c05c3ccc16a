#!/usr/bin/python3
"""Builds RoCEv2 packets with scapy, independently of softverbs-wire.

Used by tests/scapy_crosscheck.rs. Reads one JSON object per line on stdin, each
describing one packet by its field values (see `build` below), and prints one line
per input: the hex of the UDP payload scapy builds (BTH, extension headers, payload,
pad, ICRC).

scapy.contrib.roce (scapy 2.5) provides BTH, AETH and CNPPadding. The other extension
headers are defined here as scapy layers from IBA 9.3 and stacked after its BTH, so
scapy's own ICRC code (BTH.compute_icrc) covers them. That code only handles IPv4: for
IPv6 it warns and writes an ICRC of zero. For IPv6 this script therefore computes the
ICRC itself (IBA Annex A17.4.1), on a copy of the scapy packet with the variant fields
set to ones; the same function is checked against scapy's result on every IPv4
packet, so the two paths cannot drift apart unnoticed.
"""

import ipaddress
import json
import logging
import struct
import sys
import zlib

logging.getLogger("scapy").setLevel(logging.ERROR)

from scapy.compat import raw  # noqa: E402
from scapy.contrib.roce import AETH, BTH, CNPPadding, _bth_opcodes  # noqa: E402
from scapy.fields import (  # noqa: E402
    ByteField,
    IntField,
    X3BytesField,
    XIntField,
    XLongField,
)
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.packet import Packet, Raw  # noqa: E402


class DETH(Packet):
    """Datagram ETH (IBA 9.3.2): Q_Key, reserved byte, source QP."""

    name = "DETH"
    fields_desc = [XIntField("qkey", 0), ByteField("reserved", 0), X3BytesField("srcqp", 0)]


class RETH(Packet):
    """RDMA ETH (IBA 9.3.3): virtual address, R_Key, DMA length."""

    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dlen", 0)]


class AtomicETH(Packet):
    """Atomic ETH (IBA 9.3.4): VA, R_Key, swap (add) data, compare data."""

    name = "AtomicETH"
    fields_desc = [
        XLongField("va", 0),
        XIntField("rkey", 0),
        XLongField("swap", 0),
        XLongField("cmp", 0),
    ]


class AtomicAckETH(Packet):
    """Atomic acknowledge ETH (IBA 9.5.3): original remote data."""

    name = "AtomicAckETH"
    fields_desc = [XLongField("orig", 0)]


class ImmDt(Packet):
    """Immediate data (IBA 9.3.6)."""

    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


class IETH(Packet):
    """Invalidate ETH (IBA 9.3.7): R_Key to invalidate."""

    name = "IETH"
    fields_desc = [XIntField("rkey", 0)]


# Opcodes scapy's table lacks (IBA 9.2.1 table 38).
EXTRA_OPCODES = {
    "RC_SEND_LAST_WITH_INVALIDATE": 0x16,
    "RC_SEND_ONLY_WITH_INVALIDATE": 0x17,
}
# IBA spells these two as "CmpSwap" and "FetchAdd".
NAME_ALIASES = {"RC_CMPSWAP": "RC_COMPARE_SWAP", "RC_FETCHADD": "RC_FETCH_ADD"}
# AETH syndrome bits 6-5 (IBA 9.7.5.2.1 table 44) and NAK codes (table 45).
AETH_KINDS = {"ack": 0, "rnr": 1, "nak": 3}
NAK_CODES = {
    "psn_sequence_error": 0,
    "invalid_request": 1,
    "remote_access_error": 2,
    "remote_operational_error": 3,
    "invalid_rd_request": 4,
}


def opcode_value(iba_name):
    name = iba_name.upper().replace(" ", "_")
    name = NAME_ALIASES.get(name, name)
    by_name = {v: k for k, v in _bth_opcodes.items()}
    if name in by_name:
        return by_name[name]
    if name in EXTRA_OPCODES:
        return EXTRA_OPCODES[name]
    raise SystemExit("scapy_build.py: no opcode named %r" % iba_name)


def masked_icrc(pkt):
    """CRC-32 over 8 bytes of ones, the IP/UDP/BTH headers with variant fields set
    to ones, and the rest of the packet without its ICRC; as carried (LSB first)."""
    p = pkt.copy()
    if IP in p:
        p[IP].tos = 0xFF
        p[IP].ttl = 0xFF
        p[IP].chksum = 0xFFFF
    else:
        p[IPv6].tc = 0xFF
        p[IPv6].fl = 0xFFFFF
        p[IPv6].hlim = 0xFF
    p[UDP].chksum = 0xFFFF
    p[BTH].fecn = 1
    p[BTH].becn = 1
    p[BTH].resv6 = 0x3F
    p[BTH].icrc = 0
    crc = zlib.crc32(b"\xff" * 8 + raw(p)[:-4]) & 0xFFFFFFFF
    return struct.pack("<I", crc)


def build(d):
    src = ipaddress.ip_address(d["ip"]["src"])
    dst = ipaddress.ip_address(d["ip"]["dst"])
    if src.version == 4:
        ip = IP(src=str(src), dst=str(dst), id=d["ip"]["id"], flags="DF")
        ip_len = 20
    else:
        ip = IPv6(src=str(src), dst=str(dst))
        ip_len = 40
    b = d["bth"]
    opcode = opcode_value(b["opcode_name"])
    payload = bytes.fromhex(d["payload"])
    pad = (4 - len(payload) % 4) % 4
    pkt = ip / UDP(sport=d["udp"]["sport"], dport=d["udp"]["dport"]) / BTH(
        opcode=opcode,
        solicited=b["se"],
        migreq=b["m"],
        padcount=pad,
        version=0,
        pkey=b["pkey"],
        fecn=b["fecn"],
        becn=b["becn"],
        dqpn=b["dqpn"],
        ackreq=b["a"],
        resv7=b.get("resv7", 0),
        psn=b["psn"],
    )
    # Extension headers in the order IBA 9.2 puts them.
    if "deth" in d:
        pkt = pkt / DETH(qkey=d["deth"]["qkey"], srcqp=d["deth"]["srcqp"])
    if "reth" in d:
        r = d["reth"]
        pkt = pkt / RETH(va=r["va"], rkey=r["rkey"], dlen=r["dlen"])
    if "atomiceth" in d:
        a = d["atomiceth"]
        pkt = pkt / AtomicETH(va=a["va"], rkey=a["rkey"], swap=a["swap"], cmp=a["cmp"])
    if "aeth" in d:
        a = d["aeth"]
        value = NAK_CODES[a["nak"]] if a["kind"] == "nak" else a["value"]
        pkt = pkt / AETH(syndrome=(AETH_KINDS[a["kind"]] << 5) | value, msn=a["msn"])
    if "atomicacketh" in d:
        pkt = pkt / AtomicAckETH(orig=d["atomicacketh"]["orig"])
    if "immdt" in d:
        pkt = pkt / ImmDt(imm=d["immdt"])
    if "ieth" in d:
        pkt = pkt / IETH(rkey=d["ieth"])
    if opcode == 0x81:
        # scapy's CNP layer: 16 reserved bytes.
        if len(payload) != 16:
            raise SystemExit("scapy_build.py: a CNP carries 16 bytes")
        pkt = pkt / CNPPadding(
            reserved1=int.from_bytes(payload[:8], "big"),
            reserved2=int.from_bytes(payload[8:], "big"),
        )
    elif payload or pad:
        pkt = pkt / Raw(payload + b"\x00" * pad)

    if src.version == 4:
        wire = raw(pkt)  # scapy's BTH computes the ICRC itself
        mine = masked_icrc(pkt)
        if wire[-4:] != mine:
            raise SystemExit(
                "scapy_build.py: own ICRC %s differs from scapy's %s"
                % (mine.hex(), wire[-4:].hex())
            )
    else:
        pkt[BTH].icrc = struct.unpack(">I", masked_icrc(pkt))[0]
        wire = raw(pkt)
    udp_payload = wire[ip_len + 8 :]
    udp_len = struct.unpack(">H", wire[ip_len + 4 : ip_len + 6])[0]
    if udp_len != len(udp_payload) + 8:
        raise SystemExit("scapy_build.py: UDP length %d is wrong" % udp_len)
    return udp_payload


def main():
    lines = sys.stdin.read().splitlines()
    out = []
    for line in lines:
        if line.strip():
            out.append(build(json.loads(line)).hex())
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

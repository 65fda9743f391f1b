#!/usr/bin/env python3
"""Checks the ICRC of every RoCEv2 frame in a pcap file (Ethernet, IPv4, UDP, BTH ...).

    pcap_icrc.py FILE            one line per bad frame; a summary; exit 1 if any is bad
    pcap_icrc.py --print FILE    each frame's carried ICRC as tshark's infiniband.invariant.crc
                                 field shows it (the 4 wire bytes read big-endian, 0x%08x)

The ICRC (IBTA vol. 1 annex A17.3.3, Linux rxe_icrc.c, wire/icrc.h): CRC-32 (zlib's) over
eight 0xFF bytes standing for the LRH, then the IPv4 header with TOS, TTL and header checksum
masked to ones, the UDP header with its checksum masked to ones, the BTH with its reserved
byte (resv8a) masked to ones, the rest of the packet up to the ICRC; carried little-endian.
The IPv4 identification is not masked: a capture on the wire has it, so every frame can be
checked exactly. Used by tools/tests/topo_test.sh (case capture).
"""
import struct
import sys
import zlib

ETH_IPV4 = 0x0800
ROCEV2_PORT = 4791


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    if magic in (0xA1B2C3D4, 0xA1B23C4D):
        e = "<"
    elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
        e = ">"
    else:
        sys.exit(f"{path}: not a pcap file")
    linktype = struct.unpack(e + "I", data[20:24])[0]
    if linktype != 1:
        sys.exit(f"{path}: link type {linktype}, expected 1 (Ethernet)")
    off = 24
    while off + 16 <= len(data):
        incl, orig = struct.unpack(e + "II", data[off + 8:off + 16])
        yield incl, orig, data[off + 16:off + 16 + incl]
        off += 16 + incl


def roce(frame):
    """(masked ICRC input, carried ICRC) of a RoCEv2 frame; raises ValueError otherwise."""
    if len(frame) < 14 + 20 + 8 + 12 + 4 or struct.unpack(">H", frame[12:14])[0] != ETH_IPV4:
        raise ValueError("not Ethernet/IPv4")
    ip = frame[14:]
    ihl = (ip[0] & 15) * 4
    total = struct.unpack(">H", ip[2:4])[0]
    if ip[9] != 17 or total > len(ip):
        raise ValueError("not UDP, or truncated")
    udp = ip[ihl:ihl + 8]
    if struct.unpack(">H", udp[2:4])[0] != ROCEV2_PORT:
        raise ValueError("not to UDP port 4791")
    ib = ip[ihl + 8:total]
    m_ip = bytearray(ip[:ihl])
    m_ip[1] = 0xFF  # TOS
    m_ip[8] = 0xFF  # TTL
    m_ip[10:12] = b"\xff\xff"  # header checksum
    m_udp = bytearray(udp)
    m_udp[6:8] = b"\xff\xff"  # UDP checksum
    m_ib = bytearray(ib[:-4])
    m_ib[4] = 0xFF  # BTH resv8a
    return b"\xff" * 8 + bytes(m_ip) + bytes(m_udp) + bytes(m_ib), ib[-4:]


def main():
    args = sys.argv[1:]
    show = args[:1] == ["--print"]
    if show:
        args = args[1:]
    if len(args) != 1:
        sys.exit(__doc__)
    n = bad = 0
    for incl, orig, frame in frames(args[0]):
        n += 1
        if incl != orig:
            print(f"frame {n}: truncated capture ({incl} of {orig} bytes)")
            bad += 1
            continue
        try:
            data, carried = roce(frame)
        except ValueError as err:
            print(f"frame {n}: {err}")
            bad += 1
            continue
        if show:
            print(f"0x{struct.unpack('>I', carried)[0]:08x}")
            continue
        want = zlib.crc32(data)
        got = struct.unpack("<I", carried)[0]
        if want != got:
            bad += 1
            print(f"frame {n}: ICRC 0x{got:08x} on the wire, 0x{want:08x} computed")
    if not show:
        print(f"{n} frames, {n - bad} with a valid ICRC, {bad} bad")
    sys.exit(1 if bad or n == 0 else 0)


if __name__ == "__main__":
    main()

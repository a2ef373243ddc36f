"""The RoCEv2 packets of a pcap file written by `dmkit switch --pcap`, for the pcap_*.py scripts.
read(path) gives, in capture order, (source IP, destination IP, BTH opcode, destination QP, PSN)
of every IPv4/UDP packet to port 4791; NAMES names the opcodes dmkit's traffic uses."""
import struct

NAMES = {0x04: 'SEND_ONLY', 0x06: 'WRITE_FIRST', 0x07: 'WRITE_MIDDLE', 0x08: 'WRITE_LAST',
         0x0a: 'WRITE_ONLY', 0x0c: 'READ_REQUEST', 0x0d: 'READ_RESPONSE_FIRST',
         0x0e: 'READ_RESPONSE_MIDDLE', 0x0f: 'READ_RESPONSE_LAST', 0x10: 'READ_RESPONSE_ONLY',
         0x11: 'ACKNOWLEDGE', 0x12: 'ATOMIC_ACKNOWLEDGE', 0x13: 'COMPARE_SWAP', 0x14: 'FETCH_ADD'}


def read(path):
    data = open(path, 'rb').read()
    end = '>' if data[:4] == b'\xa1\xb2\xc3\xd4' else '<'
    pos, pkts = 24, []
    while pos + 16 <= len(data):
        _, _, incl, _ = struct.unpack(end + 'IIII', data[pos:pos + 16])
        f = data[pos + 16:pos + 16 + incl]
        pos += 16 + incl
        if len(f) < 54 or f[12:14] != b'\x08\x00' or f[23] != 17:
            continue
        u = 14 + (f[14] & 15) * 4
        if struct.unpack('>H', f[u + 2:u + 4])[0] != 4791:
            continue
        b = f[u + 8:u + 20]
        src, dst = '.'.join(map(str, f[26:30])), '.'.join(map(str, f[30:34]))
        pkts.append((src, dst, b[0], int.from_bytes(b[5:8], 'big'), int.from_bytes(b[9:12], 'big')))
    return pkts

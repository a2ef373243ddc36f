#!/usr/bin/env python3
"""What a capture of `dmkit switch --pcap --cas-to-write` shows: RoCEv2 packets per direction and
BTH opcode, and the CASes the clients sent that reached the server as WRITEs (a WRITE ONLY from
the same client to the same QP at the same PSN, made by the switch right after the CAS) and the
atomic ACKs the clients got for the server's plain ACKs.
usage: pcap_caswrite.py FILE.pcap"""
import collections, struct, sys

NAMES = {0x04: 'SEND_ONLY', 0x0a: 'WRITE_ONLY', 0x0c: 'READ_REQUEST', 0x10: 'READ_RESPONSE_ONLY',
         0x11: 'ACKNOWLEDGE', 0x12: 'ATOMIC_ACKNOWLEDGE', 0x13: 'COMPARE_SWAP', 0x14: 'FETCH_ADD'}
data = open(sys.argv[1], 'rb').read()
end = '>' if data[:4] == b'\xa1\xb2\xc3\xd4' else '<'
pos, pkts = 24, []
while pos + 16 <= len(data):
    _, _, incl, _ = struct.unpack(end + 'IIII', data[pos:pos + 16])
    f = data[pos + 16:pos + 16 + incl]
    pos += 16 + incl
    if len(f) < 54 or f[12:14] != b'\x08\x00' or f[23] != 17:
        continue
    ihl = (f[14] & 15) * 4
    u = 14 + ihl
    if struct.unpack('>H', f[u + 2:u + 4])[0] != 4791:
        continue
    b = f[u + 8:u + 20]
    src, dst = '.'.join(map(str, f[26:30])), '.'.join(map(str, f[30:34]))
    pkts.append((src, dst, b[0], int.from_bytes(b[5:8], 'big'), int.from_bytes(b[9:12], 'big')))
count = collections.Counter((s, d, NAMES.get(op, hex(op))) for s, d, op, _, _ in pkts)
for (s, d, op), n in sorted(count.items()):
    print(f"{s:>12} -> {d:<12} {op:<20} {n}")
converted = sum(1 for a, b in zip(pkts, pkts[1:])
                if a[2] == 0x13 and b[2] == 0x0a and a[0] == b[0] and a[3:] == b[3:])
made_acks = sum(1 for a, b in zip(pkts, pkts[1:])
                if a[2] == 0x11 and b[2] == 0x12 and a[1] == b[1] and a[3] == b[3])
print(f"CASes from clients that reached the server as WRITEs: {converted}")
print(f"server ACKs followed by the switch's atomic ACK (same client QP): {made_acks}")

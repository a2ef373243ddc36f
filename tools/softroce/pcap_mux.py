#!/usr/bin/env python3
"""What a capture of `dmkit switch --pcap --mux [--cas-to-write]` shows: RoCEv2 packets per
direction, destination QP and BTH opcode (the capture holds every frame the switch received and,
after it, every frame it made from it), the clients' CASes that reached the server as WRITEs on
the switch's queue pair (a CAS from a client, followed by the WRITE ONLY the switch made from it,
sent from SWITCH_IP), and the server's ACKs on the switch's queue pair that went back to a client
as an atomic ACK.
usage: pcap_mux.py FILE.pcap [SWITCH_IP (10.77.0.254)]"""
import collections, struct, sys

NAMES = {0x04: 'SEND_ONLY', 0x06: 'WRITE_FIRST', 0x07: 'WRITE_MIDDLE', 0x08: 'WRITE_LAST',
         0x0a: 'WRITE_ONLY', 0x0c: 'READ_REQUEST', 0x0d: 'READ_RESPONSE_FIRST',
         0x0e: 'READ_RESPONSE_MIDDLE', 0x0f: 'READ_RESPONSE_LAST', 0x10: 'READ_RESPONSE_ONLY',
         0x11: 'ACKNOWLEDGE', 0x12: 'ATOMIC_ACKNOWLEDGE', 0x13: 'COMPARE_SWAP', 0x14: 'FETCH_ADD'}
sw = sys.argv[2] if len(sys.argv) > 2 else '10.77.0.254'
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
count = collections.Counter((s, d, q, NAMES.get(op, hex(op))) for s, d, op, q, _ in pkts)
print(f"{'source':>12}    {'destination':<12} {'dest QP':>8} {'opcode':<22} packets")
for (s, d, q, op), n in sorted(count.items()):
    print(f"{s:>12} -> {d:<12} {q:>8} {op:<22} {n}")
cas_to_write = sum(1 for a, b in zip(pkts, pkts[1:])
                   if a[2] == 0x13 and a[0] != sw and b[2] == 0x0a and b[0] == sw)
cas_as_cas = sum(1 for a, b in zip(pkts, pkts[1:])
                 if a[2] == 0x13 and a[0] != sw and b[2] == 0x13 and b[0] == sw)
acks = sum(1 for a, b in zip(pkts, pkts[1:])
           if a[2] == 0x11 and a[1] == sw and b[2] == 0x12 and b[1] != sw)
print(f"client CASes sent on as WRITEs from {sw}: {cas_to_write}; as CASes from {sw}: {cas_as_cas}")
print(f"server ACKs to {sw} that went to a client as an atomic ACK: {acks}")

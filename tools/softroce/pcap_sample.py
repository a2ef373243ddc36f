#!/usr/bin/env python3
"""Samples a capture of `dmkit switch --pcap` into a small test fixture: the first K RoCEv2
packets of each BTH opcode (and of each size class of payload), in capture order.
usage: pcap_sample.py IN.pcap OUT.pcap [K]"""
import struct, sys

src, dst = sys.argv[1], sys.argv[2]
k = int(sys.argv[3]) if len(sys.argv) > 3 else 3
data = open(src, 'rb').read()
magic = data[:4]
end = '>' if magic == b'\xa1\xb2\xc3\xd4' else '<'
out, seen, pos = [data[:24]], {}, 24
while pos + 16 <= len(data):
    ts_s, ts_u, incl, orig = struct.unpack(end + 'IIII', data[pos:pos + 16])
    frame = data[pos + 16:pos + 16 + incl]
    pos += 16 + incl
    if len(frame) < 14 + 20 + 8 + 12 or frame[12:14] != b'\x08\x00' or frame[23] != 17:
        continue
    ihl = (frame[14] & 15) * 4
    if struct.unpack('>H', frame[14 + ihl + 2:14 + ihl + 4])[0] != 4791:
        continue
    key = (frame[14 + ihl + 8], min(len(frame) // 256, 4))
    if seen.get(key, 0) < k:
        seen[key] = seen.get(key, 0) + 1
        out.append(struct.pack(end + 'IIII', ts_s, ts_u, incl, orig) + frame)
open(dst, 'wb').write(b''.join(out))
print(f"{len(out) - 1} packets, {sum(len(x) for x in out)} bytes, opcodes "
      + ' '.join(sorted({f'{o:#04x}' for o, _ in seen})))

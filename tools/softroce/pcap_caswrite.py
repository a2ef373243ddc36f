#!/usr/bin/env python3
"""What a capture of `dmkit switch --pcap --cas-to-write` shows: RoCEv2 packets per direction and
BTH opcode, and the CASes the clients sent that reached the server as WRITEs (a WRITE ONLY from
the same client to the same QP at the same PSN, made by the switch right after the CAS) and the
atomic ACKs the clients got for the server's plain ACKs.
usage: pcap_caswrite.py FILE.pcap"""
import collections, sys

from roce_pcap import NAMES, read

pkts = read(sys.argv[1])
count = collections.Counter((s, d, NAMES.get(op, hex(op))) for s, d, op, _, _ in pkts)
for (s, d, op), n in sorted(count.items()):
    print(f"{s:>12} -> {d:<12} {op:<20} {n}")
converted = sum(1 for a, b in zip(pkts, pkts[1:])
                if a[2] == 0x13 and b[2] == 0x0a and a[0] == b[0] and a[3:] == b[3:])
made_acks = sum(1 for a, b in zip(pkts, pkts[1:])
                if a[2] == 0x11 and b[2] == 0x12 and a[1] == b[1] and a[3] == b[3])
print(f"CASes from clients that reached the server as WRITEs: {converted}")
print(f"server ACKs followed by the switch's atomic ACK (same client QP): {made_acks}")

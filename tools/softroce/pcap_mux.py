#!/usr/bin/env python3
"""What a capture of `dmkit switch --pcap --mux [--cas-to-write]` shows: RoCEv2 packets per
direction, destination QP and BTH opcode (the capture holds every frame the switch received and,
after it, every frame it made from it), the clients' CASes that reached the server as WRITEs on
the switch's queue pair (a CAS from a client, followed by the WRITE ONLY the switch made from it,
sent from SWITCH_IP), and the server's ACKs on the switch's queue pair that went back to a client
as an atomic ACK.
usage: pcap_mux.py FILE.pcap [SWITCH_IP (10.77.0.254)]"""
import collections, sys

from roce_pcap import NAMES, read

sw = sys.argv[2] if len(sys.argv) > 2 else '10.77.0.254'
pkts = read(sys.argv[1])
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

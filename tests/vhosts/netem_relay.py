#!/usr/bin/env python3
"""A user-space stand-in for `tc netem delay D ms J ms loss L%` on one virtual host's cable
(issue 32, item 3: this VM's kernel has no sch_netem, no sch_fq for EDT pacing, and no
act_bpf, so neither netem nor a BPF program can delay packets here; see docs/ELASTIC.md).

Runs inside the bridge namespace of scripts/vhosts.sh hosts (netem_calls.sh sets it up): the
host's veth end A (detached from the bridge) on one side, a veth B whose peer is on the bridge
on the other. Every Ethernet frame that arrives on either side is dropped with probability
L/100, or sent out of the other side D +- J ms later (uniform; frames may overtake each other,
as with netem's jitter). Both sockets use PACKET_VNET_HDR, so the large GSO frames a veth carries
(TSO/GRO on) are passed whole, with their offload header, as a tap would.

    netem_relay.py A B DELAY_MS JITTER_MS LOSS_PERCENT STATS_FILE

Runs until SIGTERM; then writes "frames F dropped X" to STATS_FILE.
"""
import heapq
import random
import select
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_PROMISC = 0x8913, 0x8914, 0x100


def open_side(ifname):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.bind((ifname, ETH_P_ALL))
    s.setblocking(False)
    # Promiscuous: frames for any MAC (the relay is a wire, not a host).
    import fcntl
    req = struct.pack("16sH14s", ifname.encode(), 0, b"")
    flags = struct.unpack("16sH14s", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", ifname.encode(), flags | IFF_PROMISC, b""))
    return s


def main():
    a_name, b_name = sys.argv[1], sys.argv[2]
    delay, jitter, loss = float(sys.argv[3]) / 1e3, float(sys.argv[4]) / 1e3, float(sys.argv[5])
    stats = sys.argv[6]
    a, b = open_side(a_name), open_side(b_name)
    other = {a.fileno(): b, b.fileno(): a}
    due = []  # (time, seq, socket, bytes)
    seq = frames = dropped = 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    poller = select.poll()
    poller.register(a, select.POLLIN)
    poller.register(b, select.POLLIN)
    while not stop:
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, data = heapq.heappop(due)
            try:
                out.send(data)
            except OSError:
                dropped += 1  # a full queue or a cable down: a loss, as on a wire
        wait_ms = 50 if not due else max(0, int((due[0][0] - now) * 1e3))
        for fd, _ in poller.poll(wait_ms):
            src = a if fd == a.fileno() else b
            for _ in range(256):  # bounded: the other side and the due frames get their turn
                try:
                    data, addr = src.recvfrom(70000)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue  # our own sends, seen again on the way out
                frames += 1
                if random.random() * 100 < loss:
                    dropped += 1
                    continue
                seq += 1
                at = time.monotonic() + delay + random.uniform(-jitter, jitter)
                heapq.heappush(due, (at, seq, other[fd], data))
    with open(stats, "w") as f:
        f.write(f"frames {frames} dropped {dropped}\n")


if __name__ == "__main__":
    main()

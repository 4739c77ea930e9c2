#!/usr/bin/env python3
"""Junk TCP connections against a peer's ports: a stand-in for someone on the internet knocking on a
peer's gossip and link ports.

  junk_flood.py PORT[,PORT...] SECONDS [HOST]          knock: 8 threads open connections as fast as
                                                       they can (64 random bytes each, then close)
  junk_flood.py PORT[,PORT...] SECONDS [HOST] --hold N hold: keep N connections open per port (a few
                                                       junk bytes, then silence), opening a new one
                                                       whenever the peer closes one
  --from IP                                            connect from this source address (on one
                                                       machine: 127.0.0.2, another host than the
                                                       peers' 127.0.0.1)

Prints how many connections it opened."""
import os
import selectors
import socket
import sys
import threading
import time

def option(name, convert):
    if name not in sys.argv:
        return None
    return convert(sys.argv[sys.argv.index(name) + 1])


hold = option("--hold", int)
source = option("--from", str)
args = []
skip = False
for a in sys.argv[1:]:
    if skip:
        skip = False
    elif a in ("--hold", "--from"):
        skip = True
    else:
        args.append(a)
bind_to = (source, 0) if source else None
ports = [int(p) for p in args[0].split(",")]
seconds = float(args[1])
host = args[2] if len(args) > 2 else "127.0.0.1"
stop = time.time() + seconds


def knock_flood():
    opened = [0] * 8

    def knock(slot):
        n = 0
        while time.time() < stop:
            port = ports[n % len(ports)]
            n += 1
            try:
                with socket.create_connection((host, port), timeout=1, source_address=bind_to) as s:
                    s.sendall(os.urandom(64))
                opened[slot] += 1
            except OSError:
                pass

    threads = [threading.Thread(target=knock, args=(i,)) for i in range(len(opened))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(opened)


def hold_flood(per_port):
    sel = selectors.DefaultSelector()
    opened = 0
    held = {p: 0 for p in ports}

    def open_one(port):
        nonlocal opened
        try:
            s = socket.create_connection((host, port), timeout=1, source_address=bind_to)
            s.sendall(b"GS")  # the start of something, never finished
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, port)
            held[port] += 1
            opened += 1
        except OSError:
            time.sleep(0.001)

    while time.time() < stop:
        for port in ports:
            while held[port] < per_port and time.time() < stop:
                open_one(port)
        for key, _ in sel.select(timeout=0.05):
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            if not data:  # closed by the peer: its place is taken again
                sel.unregister(key.fileobj)
                key.fileobj.close()
                held[key.data] -= 1
    return opened


print(hold_flood(hold) if hold else knock_flood())

#!/usr/bin/env python3
"""Opens junk TCP connections (64 random bytes each, then close) against local ports for a while,
from 8 threads, and prints how many it opened: a stand-in for someone on the internet knocking on a
peer's gossip and link ports. Usage: junk_flood.py PORT[,PORT...] SECONDS [HOST]"""
import os
import socket
import sys
import threading
import time

ports = [int(p) for p in sys.argv[1].split(",")]
seconds = float(sys.argv[2])
host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
stop = time.time() + seconds
opened = [0] * 8


def knock(slot):
    n = 0
    while time.time() < stop:
        port = ports[n % len(ports)]
        n += 1
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                s.sendall(os.urandom(64))
            opened[slot] += 1
        except OSError:
            pass


threads = [threading.Thread(target=knock, args=(i,)) for i in range(len(opened))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(sum(opened))

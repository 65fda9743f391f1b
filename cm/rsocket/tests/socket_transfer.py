#!/usr/bin/env python3
"""An unmodified TCP program (python3's socket module): `server ADDR PORT` receives a stream
and prints its length and SHA-256; `client ADDR PORT BYTES` sends BYTES of pseudo-random data
(seeded) and checks the SHA-256 the server echoes. Blocking sockets without timeouts
(settimeout would use ioctl(FIONBIO), which librspreload does not intercept); the caller
bounds the time. Used under
`softrdma run --rsockets` (LD_PRELOAD librspreload) and over kernel TCP for comparison; exits
non-zero on a short transfer. Prints `MB/s` of the transfer as seen by the receiver."""
import hashlib
import random
import socket
import sys
import time

CHUNK = 1 << 20


def data(total):
    rng = random.Random(1234)
    block = rng.randbytes(CHUNK)
    sent = 0
    while sent < total:
        n = min(CHUNK, total - sent)
        yield block[:n] if n < CHUNK else block
        sent += n


def main():
    role, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "server":
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as ls:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((addr, port))
            ls.listen(1)
            conn, peer = ls.accept()
            h = hashlib.sha256()
            total = 0
            start = None
            with conn:
                while True:
                    b = conn.recv(CHUNK)
                    if start is None:
                        start = time.monotonic()
                    if not b:
                        break
                    h.update(b)
                    total += len(b)
                conn.sendall(h.hexdigest().encode())  # the client checks it
            secs = max(time.monotonic() - (start or time.monotonic()), 1e-9)
            print(f"server: received {total} bytes sha256 {h.hexdigest()} "
                  f"{total / secs / 1e6:.1f} MB/s")
    else:
        total = int(sys.argv[4])
        h = hashlib.sha256()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.connect((addr, port))
            for b in data(total):
                s.sendall(b)
                h.update(b)
            s.shutdown(socket.SHUT_WR)
            echoed = b""
            while len(echoed) < 64:
                b = s.recv(64 - len(echoed))
                if not b:
                    break
                echoed += b
        print(f"client: sent {total} bytes sha256 {h.hexdigest()}")
        if echoed.decode() != h.hexdigest():
            print(f"client: MISMATCH, server saw {echoed.decode()!r}")
            return 1
        print("client: server's sha256 matches")
    return 0


if __name__ == "__main__":
    sys.exit(main())

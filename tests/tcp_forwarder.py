"""A TCP forwarder in its own process: ``python tests/tcp_forwarder.py LISTEN_HOST LISTEN_PORT
TO_HOST TO_PORT`` accepts on the first address and pipes each connection to the second,
both ways, printing ``ready`` once it listens. Killed, its connections end as the kernel
ends them (a database link that drops); run in a network namespace, it is a database
reached over a link a test can take down (a database gone silent)."""

from __future__ import annotations

import socket
import sys
import threading


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def main(listen_host: str, listen_port: int, to_host: str, to_port: int) -> None:
    server = socket.create_server((listen_host, listen_port), reuse_port=False)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            up = socket.create_connection((to_host, to_port), timeout=10)
        except OSError:
            conn.close()
            continue
        up.settimeout(None)
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))

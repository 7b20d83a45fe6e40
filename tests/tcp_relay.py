"""A TCP relay a test owns between one process and a server, to cut that link alone.

    relay = TcpRelay(("127.0.0.1", zk_port)).start()   # connect the process to relay.port
    relay.cut(); ...; relay.heal(); relay.close()

``cut`` stops moving bytes both ways on every connection, open or opened later, without
closing any: the peers see what a network partition shows them (silence; TCP's buffers fill).
``heal`` moves what was held and everything after it, as TCP retransmission would.
"""

from __future__ import annotations

import socket
import threading


class TcpRelay:
    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> "TcpRelay":
        threading.Thread(target=self._accept, name=f"relay-{self.port}", daemon=True).start()
        return self

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()   # held pumps wake and end
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in [self._listener, *sockets]:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> "TcpRelay":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return   # closed
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                self._flowing.wait()   # cut: held here, and the kernel's buffers fill behind
                if self._closed:
                    return
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            pass

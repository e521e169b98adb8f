"""A TCP peer on 127.0.0.1 that accepts every connection and never sends a byte: a rendezvous (a
torch.distributed store, a server) that hangs instead of answering."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# How often the accepting thread looks whether the peer should close, in seconds.
_POLL_S = 0.1


@contextmanager
def silent_peer() -> Iterator[int]:
    """The port of a listener that accepts and stays silent; on exit it closes every connection it
    accepted (their other ends then read end-of-file)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(_POLL_S)
    accepted: list[socket.socket] = []
    closing = threading.Event()

    def accept() -> None:
        while not closing.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(connection)

    thread = threading.Thread(target=accept, name="silent-peer", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        closing.set()
        thread.join()
        listener.close()
        for connection in accepted:
            connection.close()

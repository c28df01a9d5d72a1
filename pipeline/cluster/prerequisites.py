"""What a cluster command needs before it runs: the packages of the ``[cluster]`` extra, imported
only where a command runs (so the plain install's CLI works and says what to install), and a live
service at an address, told from a silent port in seconds."""

from __future__ import annotations

import importlib
import socket


def need(module: str, what: str):
    """Import an optional dependency of the ``[cluster]`` extra, or fail with the line that says how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise RuntimeError(f"{what} needs {module.split('.')[0]}: pip install 'sapiens2-stream[cluster]'") from None


# An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, the Ray client
# server) answers with a SETTINGS frame of its own (frame type 4 in the 4th byte of its header).
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def unanswered(host: str, port: int, speaks: str, timeout_s: float = 3.0) -> str | None:
    """Why HOST:PORT is not the service we need, or None when it answers in its protocol.

    speaks: ``grpc`` (a Ray head), ``zmtp`` (a ZeroMQ socket: it greets first) or ``tcp`` (a
    connect is all we check). A TCP connect alone proves little where a proxy or firewall accepts
    every connection: the protocol's first bytes tell a live service from a silent one in
    ``timeout_s`` instead of a client library's minute of retries."""
    try:
        conn = socket.create_connection((host.strip("[]"), port), timeout=timeout_s)
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    with conn:
        try:
            if speaks == "grpc":
                conn.sendall(_HTTP2_HELLO)
                head = _read(conn, 9)
                if len(head) < 9 or head[3] != 4:
                    return "something listens there, but it does not answer as a Ray head (gRPC)"
            elif speaks == "zmtp":
                greeting = _read(conn, 10)
                if len(greeting) < 10 or greeting[0] != 0xFF or greeting[9] != 0x7F:
                    return "something listens there, but it does not greet as a ZeroMQ socket"
        except TimeoutError:
            return f"something listens there, but sent nothing within {timeout_s:.0f} s"
        except OSError as exc:
            return exc.strerror or str(exc) or type(exc).__name__
    return None

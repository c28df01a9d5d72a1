"""Helpers of the cluster tests: a real redis-server (Debian's) on a free loopback port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(folder: Path, port: int, deadline_s: float = 30.0) -> subprocess.Popen:
    """redis-server on 127.0.0.1:``port`` (no persistence, its files in ``folder``), once it answers PING."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is missing: .ci/run installs Debian's redis-server"
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(folder), "--protected-mode", "yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > end:
            stop_redis(proc)
            raise AssertionError("redis-server exited at start" if proc.returncode else
                                 "redis-server did not answer PING")
        time.sleep(0.1)


def stop_redis(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def redis_server(folder: Path, deadline_s: float = 30.0) -> Iterator[str]:
    """Start redis-server on a free loopback port; yields its URL (``redis://127.0.0.1:PORT/0``)."""
    proc = start_redis(folder, free_port(), deadline_s)
    try:
        yield f"redis://127.0.0.1:{proc.args[4]}/0"
    finally:
        stop_redis(proc)

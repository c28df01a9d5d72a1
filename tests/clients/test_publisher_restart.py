"""A publisher that goes away while its messages are still queued in a subscriber: every subscriber (the
library's ``Subscriber``, ``sapiens2-client subscribe``, ``sapiens2-stream subscribe``, with ``--record``)
keeps running, and receives the restarted publisher's messages.

The sequence that used to abort them (SIGABRT, ``Assertion failed: !_more (src/fq.cpp:80)``): the
subscribers are stopped (SIGSTOP) while the publisher runs, so that its messages queue up for them; the
publisher is stopped (SIGINT, then SIGKILL the second time); the subscribers resume (SIGCONT) with a
backlog and a dropped connection; a publisher starts again on the same endpoint."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sapiens2_client.subscriber import Subscriber
from tests.cliutil import CLI, OFFLINE, decode_video, make_video, wait_for

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

# The library's Subscriber as a user's program would use it: every kind, one JSON line per message.
LIBRARY_SUBSCRIBER = r"""
import json, signal, sys, threading
from sapiens2_client.subscriber import ReceiveTimeout, StatusMessage, Subscriber
stop = threading.Event()
signal.signal(signal.SIGINT, lambda *_: stop.set())
with Subscriber(sys.argv[1], [""]) as sub:
    while not stop.is_set():
        try:
            msg = sub.recv(timeout_s=0.2)
        except ReceiveTimeout:
            continue
        if not isinstance(msg, StatusMessage):
            print(json.dumps({"topic": msg.topic, "capture_ns": msg.meta.capture_ns}), flush=True)
    print(json.dumps({"disconnects": sub.stats.disconnects, "received": sub.stats.received}), file=sys.stderr)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _captures(out: Path) -> list[int]:
    """capture_ns of every whole JSON line a subscriber wrote so far."""
    values = []
    for line in out.read_text(errors="replace").splitlines(keepends=True):
        if line.endswith("\n") and line.startswith("{"):
            with contextlib.suppress(ValueError):
                values.append(json.loads(line).get("capture_ns") or 0)
    return values


class Subscribers:
    """The four subscribers, each writing its stdout and stderr to files of its own."""

    def __init__(self, endpoint: str, folder: Path, env: dict[str, str]) -> None:
        bin_dir = Path(sys.executable).parent
        self.record = folder / "recorded.mp4"
        commands = {
            "library Subscriber": [sys.executable, "-c", LIBRARY_SUBSCRIBER, endpoint],
            "sapiens2-client subscribe": [str(bin_dir / "sapiens2-client"), "subscribe", "--endpoint", endpoint,
                                          "--topic", "", "--json"],
            "sapiens2-stream subscribe": [*CLI, "subscribe", "--endpoint", endpoint, "--json"],
            "sapiens2-stream subscribe --record": [*CLI, "subscribe", "--endpoint", endpoint, "--json",
                                                   "--record", str(self.record)],
        }
        self.out = {name: folder / f"sub{i}.out" for i, name in enumerate(commands)}
        self.err = {name: folder / f"sub{i}.err" for i, name in enumerate(commands)}
        self.procs = {name: subprocess.Popen(cmd, stdout=self.out[name].open("w"), stderr=self.err[name].open("w"),
                                             env=env, cwd=folder)
                      for name, cmd in commands.items()}

    def signal(self, sig: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(sig)

    def check_alive(self) -> None:
        if all(proc.poll() is None for proc in self.procs.values()):
            return
        time.sleep(2)  # when one died, the others' fate belongs in the report too
        dead = [f"{name} died with rc {proc.returncode}:\n{self.err[name].read_text(errors='replace')[-800:]}"
                for name, proc in self.procs.items() if proc.poll() is not None]
        if dead:
            pytest.fail("(rc -6 is SIGABRT, exit status 134)\n" + "\n".join(dead))

    def all_received_after(self, since_ns: int) -> bool:
        self.check_alive()
        return all(any(ns > since_ns for ns in _captures(out)) for out in self.out.values())

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def _subscribers(endpoint: str, folder: Path, env: dict[str, str]) -> Iterator[Subscribers]:
    subs = Subscribers(endpoint, folder, env)
    try:
        yield subs
    finally:
        subs.kill()


def test_every_subscriber_survives_a_publisher_gone_with_messages_queued(cli_env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    clip = make_video(tmp_path / "clip.mp4", 30, w=160, h=120, fps=10)  # --realtime: 10 fps, a light load
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    logs: list[Path] = []

    def publisher() -> subprocess.Popen:
        logs.append(tmp_path / f"publisher{len(logs)}.err")
        return subprocess.Popen([*CLI, "--source", f"loop:{clip}", "--realtime", "--tasks", "pose", *OFFLINE,
                                 "--publish", endpoint], env=cli_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=logs[-1].open("w"))

    pub = publisher()
    try:
        with _subscribers(endpoint, tmp_path, cli_env) as subs:
            started = time.time_ns()
            wait_for(lambda: subs.all_received_after(0) or pub.poll() is not None, "the first publisher's messages",
                     deadline_s=240, every_s=0.2)
            assert pub.poll() is None, logs[-1].read_text()[-2000:]
            for stop in (signal.SIGINT, signal.SIGKILL):
                subs.signal(signal.SIGSTOP)
                with Subscriber(endpoint, ["keypoints"]) as observer:  # the publisher goes on: messages queue up
                    for _ in range(20):
                        observer.recv(timeout_s=60)
                pub.send_signal(stop)
                pub.wait(timeout=120)
                subs.signal(signal.SIGCONT)  # a backlog, and a connection that is gone
                started = time.time_ns()
                pub = publisher()
                wait_for(lambda: subs.all_received_after(started) or pub.poll() is not None,
                         f"every subscriber to receive the publisher started after {signal.Signals(stop).name}",
                         deadline_s=240, every_s=0.2)
                assert pub.poll() is None, logs[-1].read_text()[-2000:]
            subs.signal(signal.SIGINT)
            for name, proc in subs.procs.items():
                proc.wait(timeout=60)
                err = subs.err[name].read_text(errors="replace")
                assert proc.returncode == 0, f"{name}: rc {proc.returncode}\n{err[-2000:]}"
                assert "Traceback" not in err, err
                if name == "library Subscriber":
                    assert json.loads(err.strip().splitlines()[-1])["disconnects"] == 2, err
                else:  # the summary line counts the connections the publishers' exits dropped
                    assert "disconnects 2" in err.strip().splitlines()[-1], err
            assert decode_video(subs.record).count >= 3  # finished and playable
    finally:
        if pub.poll() is None:
            pub.send_signal(signal.SIGINT)
            try:
                pub.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pub.kill()
                pub.wait()

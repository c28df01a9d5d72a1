"""Adding and removing sources of a running pipeline: a ZeroMQ REQ/REP endpoint (``--control``).

Requests and replies are JSON objects, one per message (any ZeroMQ REQ socket can drive it;
``sapiens2-stream control`` is the command-line client)::

    {"cmd": "list"}                                   -> {"ok": true, "sources": [{"id", "health", ...}]}
    {"cmd": "add", "source": "lobby=rtsp://cam/1"}    -> {"ok": true, "id": "lobby"}   (opened, then batched in)
        optional: "realtime": bool, "stall_timeout_s": number (checked as in a YAML sources entry)
    {"cmd": "remove", "id": "lobby"}                  -> {"ok": true}                 (its outputs are finished)

A bad request gets ``{"ok": false, "error": "..."}``; the endpoint is loopback by default (it can
open files and streams on this machine, so binding elsewhere is warned about). Opening a source
happens on the control thread: a slow camera delays that reply, never the pipeline.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import zmq

from pipeline.cli.config import ConfigError
from pipeline.cli.sourcespecs import SOURCE_KEYS, SourceSpec, check_source_name, check_source_settings, split_source
from sapiens2_client.endpoints import is_loopback

from ..sources import Source, SourceError

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 64 * 1024
ADD_KEYS = {"cmd", "source"} | SOURCE_KEYS - {"id", "uri"}  # a YAML sources entry's settings


class ControlServer:
    """Serves list/add/remove for ``runner`` on ``endpoint`` until close(); ``opener(spec)`` opens a source."""

    def __init__(self, endpoint: str, runner, opener: Callable[[SourceSpec], Source]) -> None:
        self.runner, self.opener = runner, opener
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self._sock.close()
            self._ctx.term()
            raise ConfigError(f"control: cannot bind {endpoint}: {exc}; choose another endpoint") from None
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if not is_loopback(self.endpoint):
            log.warning("control endpoint %s is reachable from other machines and can open sources here; "
                        "bind it to 127.0.0.1 unless that is meant", self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="control", daemon=True)
        self._thread.start()
        log.info("control: add/remove/list sources on %s", self.endpoint)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(100):
                continue
            try:
                request = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                continue
            try:
                reply = self.handle(request)
            except Exception as exc:  # a request must never kill the endpoint; the reply says what failed
                log.debug("control request failed", exc_info=True)
                reply = {"ok": False, "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
            self._sock.send(json.dumps(reply).encode())

    def handle(self, request: bytes) -> dict[str, Any]:
        """One request -> its reply (see the module docstring)."""
        try:
            message = json.loads(request.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return {"ok": False, "error": "the request is not a JSON object; send e.g. {\"cmd\": \"list\"}"}
        if not isinstance(message, dict):
            return {"ok": False, "error": "the request must be a JSON object with a cmd"}
        cmd = message.get("cmd")
        if cmd == "list":
            return {"ok": True, "sources": self.runner.describe()}
        if cmd == "add":
            text = message.get("source")
            if not isinstance(text, str) or not text.strip():
                return {"ok": False, "error": "add needs source: \"[NAME=]SPEC\""}
            unknown = sorted(set(message) - ADD_KEYS)
            if unknown:
                takes = ", ".join(sorted(ADD_KEYS))
                return {"ok": False, "error": f"add: unknown key {unknown[0]!r}; add takes {takes}"}
            try:
                check_source_settings(message, "add")
                name, uri = split_source(text, "add")
                if name is not None:
                    check_source_name(name, "add")
                    self.runner.check_new_id(name)  # before a slow open; the runner checks again when it adds
            except (ConfigError, ValueError) as exc:
                return {"ok": False, "error": str(exc)}
            try:
                source = self.opener(SourceSpec(name, uri, message.get("realtime"), message.get("stall_timeout_s"),
                                                "add"))
            except SourceError as exc:
                return {"ok": False, "error": str(exc)}
            try:
                self.runner.add_source(source)
            except (ValueError, RuntimeError, TimeoutError) as exc:
                source.stop()
                return {"ok": False, "error": str(exc)}
            return {"ok": True, "id": source.info.source_id}
        if cmd == "remove":
            sid = message.get("id")
            if not isinstance(sid, str):
                return {"ok": False, "error": "remove needs id: the source's name"}
            try:
                self.runner.remove_source(sid)
            except (KeyError, RuntimeError, TimeoutError) as exc:
                return {"ok": False, "error": exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)}
            return {"ok": True}
        return {"ok": False, "error": f"unknown cmd {cmd!r}; use list, add or remove"}


def request(endpoint: str, message: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """Send one request to a control endpoint and return the reply; TimeoutError when none comes."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(json.dumps(message).encode())
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no reply from {endpoint} within {timeout_s:.0f} s; is a pipeline running with "
                               f"--control {endpoint}?")
        return json.loads(sock.recv())
    finally:
        sock.close(linger=0)
        ctx.term()

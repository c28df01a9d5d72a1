"""Broker: ZeroMQ's own XSUB/XPUB proxy so many cameras publish into one endpoint.

Pipelines connect their publisher (``--publish-connect``, ``ZmqPublisher(..., connect=True)``) to the XSUB side;
subscribers connect to the XPUB side as if it were a single publisher. Subscriptions travel
upstream through the proxy, so publishers still encode only what somebody reads. Source ids
in topics and headers keep the streams apart.

Endpoints are checked before any socket sees them (a port out of range or a missing ``tcp://`` is
one BrokerError, never a random port or "Invalid argument"); binding a non-loopback address
without CURVE logs a warning; with CURVE, a client whose key is not authorised is refused and
logged as a warning (a ZAP callback that re-reads ``authorized/``, so added clients need no restart),
and so is a handshake that fails before any key is checked (a client with no CURVE keys, or with
another server's public key), which a socket monitor sees.
"""

from __future__ import annotations

import logging
import threading

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from sapiens2_client.endpoints import check_endpoint, is_loopback
from sapiens2_client.keys import CurveKeyring, CurveServerKeys
from sapiens2_client.wire import BROKER_XPUB, BROKER_XSUB

from .monitoring import Throttle

log = logging.getLogger(__name__)
_HANDSHAKE_FAILED = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "failed (protocol: a client without CURVE keys, or with another server's "
                                         "public key?)",
}


class BrokerError(RuntimeError):
    """The broker could not bind its endpoints (malformed, or taken)."""


class Broker:
    """An XSUB (publishers) -> XPUB (subscribers) proxy run with zmq.proxy_steerable.

    Bind happens in the constructor so ``xsub_endpoint``/``xpub_endpoint`` report the real
    ports when ``*`` was asked for. start() runs the proxy in a thread, run() in the caller's.
    """

    def __init__(
        self,
        xsub: str = BROKER_XSUB,
        xpub: str = BROKER_XPUB,
        *,
        hwm: int = 1000,
        linger_ms: int = 200,
        curve: CurveServerKeys | None = None,
    ) -> None:
        for flag, endpoint in (("--xsub", xsub), ("--xpub", xpub)):
            try:
                check_endpoint(endpoint, bind=True)
            except ValueError as e:
                raise BrokerError(f"broker {flag}: {e}") from None
        port = xsub.rpartition(":")[2]
        if xsub.startswith("tcp://") and xpub.startswith("tcp://") and port not in ("*", "0") \
                and xpub.rpartition(":")[2] == port:
            raise BrokerError(f"broker: --xsub and --xpub both use port {port}; give each side its own")
        self._ctx = zmq.Context()
        self._auth: ThreadAuthenticator | None = None
        self._linger_ms = linger_ms
        self._control_addr = f"inproc://broker-control-{id(self)}"
        self._thread: threading.Thread | None = None
        self._xsub = self._ctx.socket(zmq.XSUB)
        self._xpub = self._ctx.socket(zmq.XPUB)
        self._control = self._ctx.socket(zmq.PAIR)  # the proxy's end, read by zmq.proxy_steerable
        self._stopper = self._ctx.socket(zmq.PAIR)  # our end: sends TERMINATE
        for s in (self._xsub, self._xpub, self._control, self._stopper):
            s.setsockopt(zmq.LINGER, linger_ms)
        self._xsub.setsockopt(zmq.RCVHWM, hwm)
        self._xpub.setsockopt(zmq.SNDHWM, hwm)
        if curve is not None:  # the CURVE server on both sides: publishers and subscribers are its clients
            self._auth = ThreadAuthenticator(self._ctx)
            self._auth.start()
            self._auth.configure_curve_callback(domain="*", credentials_provider=CurveKeyring(
                curve.authorized_dir, server="broker"))
            curve.apply(self._xsub)
            curve.apply(self._xpub)
        self._monitors: list[tuple[str, zmq.Socket]] = []
        self._watching = threading.Event()
        self._watcher: threading.Thread | None = None
        if curve is not None:
            events = sum(_HANDSHAKE_FAILED)
            self._monitors = [("publisher", self._xsub.get_monitor_socket(events)),
                              ("subscriber", self._xpub.get_monitor_socket(events))]
            self._watcher = threading.Thread(target=self._watch_handshakes, name="broker-handshakes", daemon=True)
            self._watcher.start()
        try:
            self._xsub.bind(xsub)
            self._xpub.bind(xpub)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise BrokerError(
                f"cannot bind broker endpoints {xsub} / {xpub}: {e}; pick free ports with --xsub/--xpub"
            ) from e
        self._control.bind(self._control_addr)
        self._stopper.connect(self._control_addr)
        self.xsub_endpoint = self._xsub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.xpub_endpoint = self._xpub.getsockopt_string(zmq.LAST_ENDPOINT)
        if curve is None:
            for endpoint in (self.xsub_endpoint, self.xpub_endpoint):
                if not is_loopback(endpoint):
                    log.warning("broker: %s is bound without CURVE: anyone who can reach it reads (or feeds) the "
                                "streams unencrypted; create keys with `sapiens2-stream keys DIR` and pass "
                                "--curve-dir DIR", endpoint)

    def run(self) -> None:
        """Forward messages and subscriptions until stop() is called; then close everything."""
        log.debug("broker: publishers -> %s, subscribers -> %s", self.xsub_endpoint, self.xpub_endpoint)
        try:
            zmq.proxy_steerable(self._xsub, self._xpub, None, self._control)
        except zmq.ContextTerminated:
            pass
        finally:
            for s in (self._xsub, self._xpub, self._control):
                s.close(linger=self._linger_ms)

    def start(self) -> Broker:
        """Run the proxy in a daemon thread (sockets move to it; the caller must not use them)."""
        self._thread = threading.Thread(target=self.run, name="zmq-broker", daemon=True)
        self._thread.start()
        return self

    def _watch_handshakes(self) -> None:
        """Log failed CURVE handshakes on either side at warning level (rate-limited: a misconfigured
        client retries every few hundred milliseconds); the monitors close when the broker stops."""
        poller = zmq.Poller()
        for _, monitor in self._monitors:
            poller.register(monitor, zmq.POLLIN)
        side_of = {monitor: side for side, monitor in self._monitors}
        throttle = Throttle()
        try:
            while not self._watching.is_set():
                for monitor, _ in poller.poll(200):
                    event = recv_monitor_message(monitor)
                    what = _HANDSHAKE_FAILED.get(event["event"])
                    more = throttle.due() if what is not None else None
                    if more is not None:
                        log.warning("broker: a %s's CURVE handshake %s%s", side_of[monitor], what, more)
        finally:
            for _, monitor in self._monitors:
                monitor.close(linger=0)

    def _stop_watching(self) -> None:
        self._watching.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the proxy to terminate, wait for it (bounded), release the context."""
        if self._stopper.closed:
            return
        self._stop_watching()
        self._stopper.send(b"TERMINATE")
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive():
                log.warning("broker thread did not stop within %.1f s", timeout_s)
        self._stopper.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._thread is None or not self._thread.is_alive():
            self._ctx.term()

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _close_sockets(self) -> None:
        self._stop_watching()
        for s in (self._xsub, self._xpub, self._control, self._stopper):
            s.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

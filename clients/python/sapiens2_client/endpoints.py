"""ZeroMQ endpoints: checked before any socket sees them, so a typo is one clear line, not "Invalid argument".

Accepted: ``tcp://HOST:PORT`` (PORT 1..65535, or ``*`` / ``0`` to bind a free port), ``ipc://PATH`` and
``inproc://NAME``. HOST is a name, an IPv4 address, ``[IPv6]``, or ``*`` / an interface when binding.
"""

from __future__ import annotations

import ipaddress
import re

_TCP = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]+):(?P<port>\*|\d+)$")
_LOOPBACK_NAMES = {"localhost", "lo", "ip6-localhost"}


def check_endpoint(endpoint: str, *, bind: bool) -> str:
    """Return ``endpoint`` when ZeroMQ can use it (``bind`` allows ``*`` host and port); ValueError
    naming what is wrong and an example otherwise."""
    example = "tcp://127.0.0.1:5555"
    if not isinstance(endpoint, str) or "://" not in endpoint:
        if isinstance(endpoint, str) and _TCP.match(f"tcp://{endpoint}"):
            raise ValueError(f"{endpoint!r} has no transport; did you mean tcp://{endpoint}")
        raise ValueError(f"{endpoint!r} has no transport; write it as {example}")
    scheme = endpoint.split("://", 1)[0]
    if scheme in ("ipc", "inproc"):
        if len(endpoint) <= len(scheme) + 3:
            raise ValueError(f"{endpoint!r} names no {scheme} address; e.g. {scheme}:///tmp/sapiens2.sock")
        return endpoint
    if scheme != "tcp":
        raise ValueError(f"{endpoint!r}: transport {scheme!r} is not supported; use tcp://, ipc:// or inproc://")
    match = _TCP.match(endpoint)
    if match is None:
        raise ValueError(f"{endpoint!r} is not tcp://HOST:PORT; e.g. {example}")
    host, port = match["host"], match["port"]
    if port == "*" or host == "*" or (bind and port == "0"):  # port 0 binds a free port, as '*' does
        if not bind:
            raise ValueError(f"{endpoint!r}: '*' works only when binding; connect to a host and port, e.g. {example}")
    elif not 1 <= int(port) <= 65535:
        raise ValueError(f"{endpoint!r}: port {port} is out of range 1..65535")
    return endpoint


def is_loopback(endpoint: str) -> bool:
    """True when the endpoint is reachable from this machine only (loopback tcp, ipc, inproc)."""
    if not endpoint.startswith("tcp://"):
        return True
    match = _TCP.match(endpoint)
    if match is None:
        return False
    host = match["host"].strip("[]")
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or an interface: possibly reachable from elsewhere

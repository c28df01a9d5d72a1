"""A small aiohttp server on a thread of its own (its own event loop): the viewer and the metrics.

``HttpService(make_app, "127.0.0.1:8080").start()`` binds (a taken port is one clear ConfigError,
before any model loads), serves until ``stop()``. Loopback by default; another address is warned about.

Every app it serves refuses, with 403, what a web page elsewhere could make a browser send:
- a request whose ``Origin`` is not the server itself (a foreign page opening the WebSocket or
  fetching the figures: browsers apply no same-origin rule to WebSockets);
- on loopback, a request whose ``Host`` is not a loopback name (DNS rebinding: a foreign name that
  resolves to 127.0.0.1 makes the browser treat the server as that page's own origin).
Programs that send neither header (curl, Prometheus, the clients) are not affected.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
from collections.abc import Awaitable, Callable

from aiohttp import web
from yarl import URL

from stages.errors import ConfigError

log = logging.getLogger(__name__)


def parse_listen(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); port 0 picks a free one. ConfigError naming ``what`` otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: {text!r} is not HOST:PORT; e.g. 127.0.0.1:8080")
    return host, int(port)


def is_loopback_host(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def foreign_request(request: web.Request, listen_host: str) -> str | None:
    """Why a browser request came from (or through) another site, or None when it did not. The
    Origin must name the Host the request was sent to (as a browser's own page does)."""
    host_header = request.headers.get("Host")
    if host_header is None:
        return None
    try:
        hostname = (URL(f"http://{host_header}").host or "").lower()
    except ValueError:
        return f"Host {host_header!r} is not an address"
    if is_loopback_host(listen_host) and not is_loopback_host(hostname):
        return f"Host {host_header!r} is not a loopback name (open it as {request.scheme}://127.0.0.1:...)"
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    try:
        url = URL(origin)
        if url.scheme in ("http", "https") and url.raw_authority.lower() == host_header.lower():
            return None
    except ValueError:
        pass
    return f"Origin {origin!r} is another site"


class HttpService:
    """Serves the app ``make_app()`` builds (inside the service's loop) on ``listen``."""

    def __init__(self, make_app: Callable[[], Awaitable[web.Application] | web.Application], listen: str,
                 what: str) -> None:
        self.host, self.port = parse_listen(listen, what)
        self.what = what
        self._make_app = make_app
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.refused = 0  # browser requests from other sites (see the module docstring)
        if not is_loopback_host(self.host):
            log.warning("%s listens on %s: reachable from other machines", what, self.host)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self) -> HttpService:
        self._thread = threading.Thread(target=self._run, name=f"http-{self.what}", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise ConfigError(f"{self.what}: cannot listen on {self.host}:{self.port} ({self._error}); choose "
                              "another address") from None
        log.info("%s on %s", self.what, self.url)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except (OSError, RuntimeError) as exc:
            self._error = exc
            self._stop_tasks()  # what the app started (the viewer's reader) ends with the loop, quietly
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._cleanup())
        self._loop.close()

    async def _start(self) -> None:
        app = self._make_app()
        if asyncio.iscoroutine(app):
            app = await app
        app.middlewares.insert(0, self._same_site)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])

    @web.middleware
    async def _same_site(self, request: web.Request, handler):
        why = foreign_request(request, self.host)
        if why is not None:
            self.refused += 1  # a hostile page can repeat this at will: the log says it a few times only
            log.log(logging.WARNING if self.refused <= 5 else logging.DEBUG, "%s: refused %s %s: %s", self.what,
                    request.method, request.path, why)
            return web.Response(status=403, text=f"refused: {why}\n")
        return await handler(request)

    def _stop_tasks(self) -> None:
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        if self._runner is not None:
            self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

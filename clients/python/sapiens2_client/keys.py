"""CURVE keys: creating a key folder, adding clients to it, and loading the pairs each side needs.

Layout of a key folder (``sapiens2-stream keys DIR``)::

    DIR/server.key, DIR/server.key_secret      the publisher's (or broker's) pair
    DIR/clients/NAME.key, NAME.key_secret      one pair per client
    DIR/authorized/NAME.key                    public keys the server accepts

Running ``keys DIR --client NAME`` again adds clients and never replaces an existing key: a
replaced server key would lock out every client that holds the old ``server.key``.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq.auth

log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


class KeysError(ValueError):
    """A key folder that cannot be used or extended; the message says what to do."""


@dataclass(frozen=True)
class CurveClientKeys:
    """A client's CURVE key pair plus the server's public key."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def from_dir(cls, keys_dir: str | Path, name: str = "client") -> CurveClientKeys:
        """Load ``clients/<name>.key_secret`` and ``server.key`` made by ``sapiens2-stream keys``."""
        keys_dir = Path(keys_dir)
        secret_file, server_file = keys_dir / "clients" / f"{name}.key_secret", keys_dir / "server.key"
        for f in (secret_file, server_file):
            if not f.is_file():
                raise KeysError(f"{f} not found; create keys with `sapiens2-stream keys {keys_dir} --client {name}`")
        public, secret = zmq.auth.load_certificate(secret_file)
        server_public, _ = zmq.auth.load_certificate(server_file)
        if secret is None:
            raise KeysError(f"{secret_file} holds no secret key")
        return cls(public=public, secret=secret, server_public=server_public)

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the server (before connect)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.server_public


@dataclass(frozen=True)
class CurveServerKeys:
    """A server's CURVE key pair and the folder of client public keys it accepts."""

    public: bytes
    secret: bytes
    authorized_dir: Path

    @classmethod
    def from_dir(cls, keys_dir: str | Path) -> CurveServerKeys:
        """Load ``server.key_secret`` and ``authorized/`` made by ``sapiens2-stream keys DIR``."""
        keys_dir = Path(keys_dir)
        secret_file, authorized = keys_dir / "server.key_secret", keys_dir / "authorized"
        if not secret_file.is_file() or not authorized.is_dir():
            raise KeysError(
                f"{keys_dir} lacks server.key_secret or authorized/; create it with `sapiens2-stream keys {keys_dir}`"
            )
        public, secret = zmq.auth.load_certificate(secret_file)
        if secret is None:
            raise KeysError(f"{secret_file} holds no secret key")
        return cls(public=public, secret=secret, authorized_dir=authorized)

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server (before bind)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True


class CurveKeyring:
    """ZAP credentials provider (``ThreadAuthenticator.configure_curve_callback``): a client key is
    accepted when its public key is in ``folder`` (``authorized/``); an unknown key makes the folder
    be read again (clients added while running need no restart), and a refusal is logged as a
    warning naming ``server`` (at most every ``warn_every_s``: a refused client retries often)."""

    def __init__(self, folder: str | Path, server: str = "the CURVE server", warn_every_s: float = 10.0) -> None:
        self.folder = Path(folder)
        self.server = server
        self.warn_every_s = warn_every_s
        self.refused = 0
        self._keys = self._load()
        self._warned_at: float | None = None
        self._since_warning = 0

    def _load(self) -> set[bytes]:
        return set(zmq.auth.load_certificates(str(self.folder))) if self.folder.is_dir() else set()

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self._keys:
            return True
        self._keys = self._load()
        if key in self._keys:
            return True
        self.refused += 1
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < self.warn_every_s:
            self._since_warning += 1
            return False
        more = f" ({self._since_warning} more refused since the last warning)" if self._since_warning else ""
        log.warning("%s refused a CURVE client: its public key %s is not in %s%s", self.server,
                    key.decode(errors="replace"), self.folder, more)
        self._warned_at, self._since_warning = now, 0
        return False


def existing_clients(directory: str | Path, clients: Sequence[str]) -> list[str]:
    """The named clients that have a key (either half) in ``directory`` already."""
    directory = Path(directory)
    return [n for n in clients if (directory / "clients" / f"{n}.key_secret").exists()
            or (directory / "authorized" / f"{n}.key").exists()]


def make_keys(directory: str | Path, clients: Sequence[str] = ("client",)) -> list[Path]:
    """Create the server pair if the folder has none, and a pair for each client it lacks.

    Existing keys are never replaced (that would revoke their holders' access): a client named
    again keeps its keys, so the same command can be run again with a new name added. Returns the
    files created.
    """
    directory = Path(directory)
    for name in clients:
        if not _NAME_RE.match(name):
            raise KeysError(f"client name {name!r} must be 1-64 letters, digits, '_' or '-'")
    if len(set(clients)) != len(clients):
        raise KeysError(f"client names repeat: {list(clients)}")
    server, server_secret = directory / "server.key", directory / "server.key_secret"
    if server.exists() != server_secret.exists():
        raise KeysError(f"{directory} has only one of server.key / server.key_secret; restore the other, or remove "
                        "both and hand every client the new server.key")
    existing = existing_clients(directory, clients)
    (directory / "clients").mkdir(parents=True, exist_ok=True)
    (directory / "authorized").mkdir(exist_ok=True)
    made: list[Path] = []
    if not server.exists():
        made += [Path(p) for p in zmq.auth.create_certificates(directory, "server")]
        server_secret.chmod(0o600)
    for name in clients:
        if name in existing:
            continue
        public, secret = zmq.auth.create_certificates(directory / "clients", name)
        Path(secret).chmod(0o600)
        made += [Path(public), Path(secret), Path(shutil.copy(public, directory / "authorized"))]
    return made

"""CURVE keys: creating a key folder, adding clients to it, and loading the pairs each side needs.

Layout of a key folder (``sapiens2-stream keys DIR``)::

    DIR/server.key, DIR/server.key_secret      the publisher's (or broker's) pair
    DIR/clients/NAME.key, NAME.key_secret      one pair per client
    DIR/authorized/NAME.key                    public keys the server accepts

Running ``keys DIR --client NAME`` again adds clients and never replaces an existing key: a
replaced server key would lock out every client that holds the old ``server.key``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq.auth

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


def make_keys(directory: str | Path, clients: Sequence[str] = ("client",)) -> list[Path]:
    """Create the server pair if the folder has none, and a pair for each client it lacks.

    Existing keys are never replaced: naming a client that exists is an error, so that a typo
    cannot silently revoke someone's access. Returns the files created.
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
    existing = [n for n in clients if (directory / "clients" / f"{n}.key_secret").exists()
                or (directory / "authorized" / f"{n}.key").exists()]
    if existing:
        raise KeysError(f"client key {existing[0]!r} already exists in {directory}; pick another name "
                        f"(existing keys are never replaced)")
    (directory / "clients").mkdir(parents=True, exist_ok=True)
    (directory / "authorized").mkdir(exist_ok=True)
    made: list[Path] = []
    if not server.exists():
        made += [Path(p) for p in zmq.auth.create_certificates(directory, "server")]
        server_secret.chmod(0o600)
    for name in clients:
        public, secret = zmq.auth.create_certificates(directory / "clients", name)
        Path(secret).chmod(0o600)
        made += [Path(public), Path(secret), Path(shutil.copy(public, directory / "authorized"))]
    return made

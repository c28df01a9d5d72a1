"""The CURVE keys of a publisher, from a keys folder (``sapiens2-stream keys DIR``)."""

from __future__ import annotations

from sapiens2_client.keys import CurveClientKeys, CurveServerKeys, KeysError

from .publisher import PublishError


def curve_for(cfg_curve_dir: str | None, connect: bool, client_name: str) -> CurveServerKeys | CurveClientKeys | None:
    """The CURVE keys of a publisher from a keys folder: the server pair when binding, the client
    pair ``client_name`` (and the broker's public key) when connecting. PublishError when missing."""
    if not cfg_curve_dir:
        return None
    try:
        if connect:
            return CurveClientKeys.from_dir(cfg_curve_dir, client_name)
        return CurveServerKeys.from_dir(cfg_curve_dir)
    except KeysError as exc:
        raise PublishError(str(exc)) from None

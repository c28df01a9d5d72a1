"""The declared version floors are the versions tested: constraints.txt pins them for `make`, and the
environment the tests run in has exactly those."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            pins[_norm(name)] = pinned
    return pins


def _floors() -> dict[str, str]:
    floors = {}
    for path in (REPO / "pyproject.toml", REPO / "clients" / "python" / "pyproject.toml"):
        project = tomllib.loads(path.read_text())["project"]
        requirements = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values()
                                                        for r in extra]
        for requirement in requirements:
            match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(>=|==)\s*([0-9][^,;\s]*)", requirement)
            assert match, f"{path.name}: {requirement!r} has no version floor"
            name = _norm(match[1])
            if name != "sapiens2-stream-client":
                assert floors.get(name, match[3]) == match[3], f"{name}: two different floors"
                floors[name] = match[3]
    return floors


def test_every_floor_is_pinned_to_itself_for_the_tests() -> None:
    assert _floors() == _pins(), "pyproject floors and constraints.txt differ: keep them equal"


@pytest.mark.parametrize("name", sorted(_pins()))
def test_the_environment_has_the_tested_versions(name: str) -> None:
    try:
        installed = version(name)
    except PackageNotFoundError:
        pytest.skip(f"{name} is not installed here (an optional extra)")
    assert installed == _pins()[name], f"{name} {installed} is installed; the floor tested is {_pins()[name]}"

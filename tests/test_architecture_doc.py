"""docs/ARCHITECTURE.md stays true: every file or folder it names in backticks exists, and every
dotted name of ours it names (``pipeline.run.runner.Runner``, ``sapiens2_client.wire``) imports, down
to the attribute."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("pipeline", "stages", "sapiens2_client")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*/?$")
_SUFFIXES = (".py", ".md", ".js", ".mjs", ".json", ".yaml", ".toml", ".sh")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def spans(text: str) -> list[str]:
    """The inline code spans of a Markdown text (fenced blocks left out: they are pictures)."""
    return _SPAN.findall(_FENCE.sub("", text))


def paths_named(text: str) -> list[str]:
    """The spans that are repository paths, from its root: with a slash, or a file name with a known
    suffix (placeholders such as ``pipeline/<part>/commands.py`` and flags are not paths)."""
    return [s for s in spans(text) if _PATH.match(s) and ("/" in s or s.endswith(_SUFFIXES))]


def dotted_named(text: str) -> list[str]:
    """The spans that are dotted names in our packages (a module, or a module and its attributes)."""
    return [s for s in spans(text) if _DOTTED.match(s) and s.split(".")[0] in PACKAGES]


def missing_paths(text: str, root: Path) -> list[str]:
    return sorted({p for p in paths_named(text) if not (root / p).exists()})


def unresolved(name: str) -> str | None:
    """Why ``name`` does not resolve (the longest importable module prefix, then attributes), or None."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module_name.startswith(exc.name):
                return f"importing {module_name} failed: {exc}"  # the module exists; something it needs does not
            continue
        for i in range(cut, len(parts)):
            if not hasattr(obj, parts[i]):
                return f"{'.'.join(parts[:i])} has no attribute {parts[i]!r}"
            obj = getattr(obj, parts[i])
        return None
    return f"no module {parts[0]}"


def test_the_document_names_things() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert len(paths_named(text)) > 30 and len(dotted_named(text)) > 15, "the checks below would check little"
    assert "## Motion capture" in text


def test_every_path_it_names_exists() -> None:
    missing = missing_paths(DOC.read_text(encoding="utf-8"), ROOT)
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {', '.join(missing)}"


def test_every_module_it_names_imports() -> None:
    names = sorted(set(dotted_named(DOC.read_text(encoding="utf-8"))))
    wrong = [f"{name}: {why}" for name in names if (why := unresolved(name)) is not None]
    assert not wrong, "docs/ARCHITECTURE.md names what does not import:\n" + "\n".join(wrong)


@pytest.mark.parametrize("span, path, dotted", [
    ("pipeline/run/runner.py", True, False),
    ("pipeline/sinks/", True, False),
    ("WIRE.md", True, False),
    ("pipeline/<part>/commands.py", False, False),
    ("--source", False, False),
    ("tcp://127.0.0.1:5555", False, False),
    ("pipeline.run.engine.FrameEngine", False, True),
    ("threading.Event", False, False),
    ("func(args) -> int", False, False),
])
def test_what_counts_as_a_path_or_a_name(span: str, path: bool, dotted: bool) -> None:
    text = f"see `{span}` here\n```\n`pipeline/in/a/fence.py`\n```\n"
    assert paths_named(text) == ([span] if path else [])
    assert dotted_named(text) == ([span] if dotted else [])


def test_a_stale_name_is_reported(tmp_path: Path) -> None:
    (tmp_path / "pipeline").mkdir()
    assert missing_paths("`pipeline/` and `pipeline/gone.py`", tmp_path) == ["pipeline/gone.py"]
    assert unresolved("pipeline.run.runner.Runner") is None
    assert unresolved("pipeline.run.runner.NoSuchThing") == "pipeline.run.runner has no attribute 'NoSuchThing'"
    assert unresolved("pipeline.no_such_module") == "pipeline has no attribute 'no_such_module'"


def test_every_package_folder_is_placed() -> None:
    """The folder table keeps up with the layout: each package folder of pipeline/ and stages/ is named
    (a new wing of the code gets its line, with what it holds)."""
    text = DOC.read_text()
    folders = sorted(str(p.parent.relative_to(ROOT)) + "/" for top in ("pipeline", "stages")
                     for p in (ROOT / top).rglob("__init__.py") if p.parent != ROOT / "pipeline")
    assert not [f for f in folders if f"`{f}`" not in text], "docs/ARCHITECTURE.md does not place these folders"

"""The import graph of ``pipeline``, ``stages`` and ``sapiens2_client`` has no cycle, and keeps the
layering of docs (DESIGN.md): ``stages`` never imports ``pipeline``; the Python client imports neither;
within ``pipeline`` the command modules and the data path (``pipeline/run/``) sit above the parts.

The graph is read from the source with ``ast``, not by importing it: every ``import`` and ``from ...
import`` counts, absolute or relative, at module level or inside a function or an ``if TYPE_CHECKING``
block (a lazy import that closes a loop is still a circle: it only moves the failure to the call that
first runs it), plus ``importlib.import_module`` with a literal name and the registries of modules
imported by name (a module-level tuple, list or dict whose strings all name modules of the
packages, such as pipeline.cli.main's COMMAND_MODULES).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"pipeline": ROOT / "pipeline", "stages": ROOT / "stages",
            "sapiens2_client": ROOT / "clients" / "python" / "sapiens2_client"}
# Layering (DESIGN.md, "Layout"): files under the folder may not import these top-level packages.
FORBIDDEN = {ROOT / "stages": ("pipeline",), ROOT / "clients" / "python": ("pipeline", "stages")}


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def module_files(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of each package folder."""
    modules = {}
    for name, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[tuple[str, ...], int]]:
    """(candidate dotted names, line) of everything the module's source imports, wherever it appears.

    The first candidate that is a module is the one imported: ``from X import Y`` is ``X.Y`` when Y
    is a submodule, else ``X`` (as for ``import a.b``, the parent packages that run first are not
    edges: they are the ancestors of the importing module or of the imported one)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield (alias.name,), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                yield (f"{origin}.{alias.name}", origin), node.lineno
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield (_resolve(node.args[0].value, package),), node.lineno  # import_module(".x", __name__)


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id == "import_module")


def registry_names(tree: ast.Module, module: str, is_package: bool,
                   modules: dict[str, Path]) -> Iterator[tuple[tuple[str, ...], int]]:
    """The modules named in a module-level registry: a tuple, list or dict (its values) of strings
    that all resolve (absolutely, or relative to this package as ``import_module(".x", __name__)``
    resolves them) to modules of the packages. All, so that a tuple of file suffixes is no registry."""
    package = module if is_package else module.rpartition(".")[0]
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        items = value.values if isinstance(value, ast.Dict) else getattr(value, "elts", None)
        if not items or not all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            continue
        names = [_resolve(i.value, package) for i in items]
        if all(n in modules for n in names):
            for item, name in zip(items, names):
                yield (name,), item.lineno


def _resolve(name: str, package: str) -> str:
    """``name`` absolute; a leading dot is relative to ``package``."""
    if not name.startswith("."):
        return name
    dots = len(name) - len(name.lstrip("."))
    base = package.split(".")
    return ".".join(base[:len(base) - (dots - 1)] + ([name.lstrip(".")] if name.lstrip(".") else []))


def import_graph(packages: dict[str, Path]) -> dict[str, list[Edge]]:
    """Module -> its edges to other modules of ``packages`` (each target once, at its first line)."""
    modules = module_files(packages)
    graph: dict[str, list[Edge]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        seen: dict[str, Edge] = {}
        is_package = path.name == "__init__.py"
        for names, line in [*imported_names(tree, module, is_package),
                            *registry_names(tree, module, is_package, modules)]:
            name = next((n for n in names if n in modules), None)
            if name is not None and name != module and name not in seen:
                seen[name] = Edge(module, name, path, line)
        graph[module] = sorted(seen.values(), key=lambda e: e.line)
    return graph


def cycles(graph: dict[str, list[Edge]]) -> list[tuple[set[str], list[Edge]]]:
    """Each strongly connected component of more than one module, with one cycle in it (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:  # the graph has ~100 nodes: recursion depth is no concern
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in graph.get(node, []):
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in on_stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(component, _cycle_in(graph, component)) for component in components]


def _cycle_in(graph: dict[str, list[Edge]], component: set[str]) -> list[Edge]:
    """The shortest cycle through the component's first module (breadth-first, inside the component)."""
    start = min(component)
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for edge in graph[node]:
                if edge.target not in component:
                    continue
                if edge.target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if edge.target not in came:
                    came[edge.target] = edge
                    nxt.append(edge.target)
        frontier = nxt
    raise AssertionError(f"no cycle found in the strongly connected component {sorted(component)}")


def describe(component: set[str], cycle: list[Edge]) -> str:
    """``a -> b -> a`` with where each import is, then every module caught in the same tangle."""
    chain = " -> ".join([cycle[0].source, *(e.target for e in cycle)])
    return "\n".join([chain, *(f"    {e.source} -> {e.target}  ({e.where()})" for e in cycle),
                      f"    ({len(component)} modules reach each other: {', '.join(sorted(component))})"])


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph(PACKAGES)
    assert len(graph) > 50, f"only {len(graph)} modules found: is PACKAGES still where the code is?"
    found = cycles(graph)
    if found:  # pytest.fail: the message alone, without the repr of the edges after it
        pytest.fail(f"{len(found)} import cycle(s):\n" + "\n".join(describe(*c) for c in found), pytrace=False)


@pytest.mark.parametrize("folder", sorted(FORBIDDEN), ids=lambda p: str(p.relative_to(ROOT)))
def test_layering(folder: Path) -> None:
    banned = FORBIDDEN[folder]
    wrong = []
    for path in sorted(folder.rglob("*.py")):
        if any(part.endswith(".egg-info") for part in path.parts):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        # "_": a relative import resolves inside the file's own package, never to a banned top-level name
        for names, line in imported_names(tree, "_", False):
            if names[-1].split(".")[0] in banned:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {names[-1]}")
    if wrong:
        pytest.fail(f"{folder.relative_to(ROOT)} may not import {' or '.join(banned)}:\n" + "\n".join(sorted(set(wrong))),
                    pytrace=False)


# The wings of pipeline/ (docs/ARCHITECTURE.md, "Folders"): a command module (pipeline.cli.main's
# COMMAND_MODULES) is imported by the entry point only; the data path (pipeline/run/) by the commands that
# run it only: `run` (pipeline.cli.commands) and the cluster's fleet and archive workers. Everything
# else (sources, sinks, net, viewer, metrics, mocap, the config and check of pipeline/cli/) lies below.
ENTRY = "pipeline.cli.main"
RUNS_THE_DATA_PATH = ("pipeline.cli.commands", "pipeline.cluster")


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _wrong_edges(graph: dict[str, list[Edge]], targets: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    return sorted(f"{e.where()}: {e.source} imports {e.target}" for edges in graph.values() for e in edges
                  if _within(e.target, targets) and not _within(e.source, targets + allowed))


def test_the_command_modules_are_imported_by_the_entry_point_only() -> None:
    graph = import_graph(PACKAGES)
    commands = tuple(e.target for e in graph[ENTRY] if e.target.split(".")[-1] == "commands")
    assert "pipeline.cli.commands" in commands and len(commands) >= 4, commands
    wrong = _wrong_edges(graph, (ENTRY, *commands), ())
    assert not wrong, "a command module is the top of its wing:\n" + "\n".join(wrong)


def test_the_data_path_is_imported_by_the_commands_that_run_it_only() -> None:
    wrong = _wrong_edges(import_graph(PACKAGES), ("pipeline.run",), (ENTRY, *RUNS_THE_DATA_PATH))
    assert not wrong, "pipeline/run/ lies above the parts it runs:\n" + "\n".join(wrong)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_through_a_lazy_relative_import_is_found_and_named(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/cli.py": "def main():\n    from .sub.commands import add\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/commands.py": "from . import archive\n",
        "pkg/sub/archive.py": "import os\n\n\ndef f():\n    from pkg.cli import main\n",
        "pkg/leaf.py": "from pkg.sub import commands\n",
    })
    found = cycles(import_graph({"pkg": tmp_path / "pkg"}))
    assert len(found) == 1
    text = describe(*found[0])
    assert text.splitlines()[0] == "pkg.cli -> pkg.sub.commands -> pkg.sub.archive -> pkg.cli"
    assert "pkg/sub/archive.py:5" in text


@pytest.mark.parametrize("source, edge", [
    ("import pkg.b", "pkg.b"),
    ("from pkg import b", "pkg.b"),
    ("from . import b", "pkg.b"),
    ("from .b import thing", "pkg.b"),
    ("if True:\n    from .b import thing", "pkg.b"),
    ("import importlib\nimportlib.import_module('.b', __name__)", "pkg.b"),
    ("from pkg.b import thing as other", "pkg.b"),
    ("COMMANDS = (\n    'pkg.b',  # a registry\n)", "pkg.b"),
    ("_LAZY = {'B': '.b'}", "pkg.b"),
    ("SUFFIXES = ('.b', '.mp4')", None),
])
def test_every_form_of_import_is_an_edge(tmp_path: Path, source: str, edge: str | None) -> None:
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": source + "\n", "pkg/b.py": ""})
    graph = import_graph({"pkg": tmp_path / "pkg"})
    assert [e.target for e in graph["pkg.a"]] == ([edge] if edge else [])


def test_a_run_imports_neither_torchvision_nor_scipy() -> None:
    """What every run (and every CLI process of the tests) imports stays lean: torchvision pulls in
    torch._dynamo (1.3 s of CPU per process; our resize and blur weights are its arithmetic written out,
    tests/stages/sapiens2/test_sapiens2_parity.py), scipy is for a rig's steps only (0.45 s), aiohttp and
    prometheus_client for --metrics and --view (0.2 s). The person detector (Ultralytics) still brings
    torchvision when a run asks for it."""
    import subprocess
    import sys

    probe = ("import sys, pipeline.run.app, pipeline.cli.main, pipeline.run.engine, stages.sapiens2.estimators; "
             "print(sorted(m for m in ('torchvision', 'torch._dynamo', 'scipy', 'aiohttp', 'prometheus_client') "
             "if m in sys.modules))")
    ran = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]", ran.stdout

"""The package layout shows the architecture (issue 23): dependencies point one way, no
import cycle.

The layers, each importing only from itself and the layers before it:

    compaction (pure) <- stores <- coordination <- agent <- worker <- api <- cli, demo

``offpath.events`` and ``offpath.metrics`` sit with the pure core (they import nothing of
offpath's); ``offpath`` itself (the public ``from offpath import OffPathCompaction``) is the
facade over all of them.

The graph is read from the installed package: every package ``pyproject.toml`` lists is
found with :func:`importlib.util.find_spec` (so ``offpath.api`` and ``offpath.worker`` come
from ``api/`` and ``worker/`` through the package-dir mapping, as a wheel installs them),
and every ``import`` in its modules counts, a lazy one inside a function too: a layer that
imports a later one only when called still depends on it.
"""

from __future__ import annotations

import ast
import graphlib
import importlib.util
import tomllib
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Layer of each top-level part, in dependency order (a module may import its own layer
#: and the ones before it).
LAYERS: list[tuple[str, ...]] = [
    ("offpath.compaction", "offpath.events", "offpath.metrics"),
    ("offpath.stores",),
    ("offpath.coordination",),
    ("offpath.agent",),
    ("offpath.worker",),
    ("offpath.api",),
    ("offpath.cli", "offpath.demo"),
    ("offpath",),  # the facade: `from offpath import OffPathCompaction`
]


@cache
def setuptools_config() -> dict:
    """pyproject.toml's ``[tool.setuptools]``: the packages and their folders."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def declared_packages() -> list[str]:
    return setuptools_config()["packages"]


def package_folder(package: str) -> Path:
    """Where the installed ``package`` is. A data-only package (``offpath.demo.sre``, the
    demo's fixtures) has no ``__init__`` to find: its folder is the one pyproject maps."""
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    folder = ROOT / setuptools_config()["package-dir"][package]
    assert not list(folder.glob("*.py")), f"{package} has modules but is not installed"
    return folder


@cache
def modules() -> dict[str, Path]:
    """Every module of the installed package: dotted name -> file."""
    found: dict[str, Path] = {}
    for package in declared_packages():
        folder = package_folder(package)
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module ``name`` is in (``a.b.c`` may be a name defined in module ``a.b``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


@cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the offpath modules it imports (anywhere in its body)."""
    known = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.split(".")
                    parts = parts if is_package else parts[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                # `from a.b import c`: module a.b.c if it is one, else a name in a.b
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            for target in targets:
                if target == "offpath" or target.startswith("offpath."):
                    resolved = _resolve(target, known)
                    if resolved and resolved != module:
                        graph[module].add(resolved)
    return graph


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, parts in enumerate(LAYERS):
        for part in parts:
            if (module == part or module.startswith(part + ".")) and len(part) > best:
                best, rank = len(part), i
    return rank


def test_every_package_directory_is_declared_so_the_wheel_installs_it():
    """A new package must be listed in pyproject.toml, or a wheel installs without it (the
    editable install of the tests would still find it)."""
    declared = set(declared_packages())
    for package in list(declared):
        for init in package_folder(package).glob("*/__init__.py"):
            child = f"{package}.{init.parent.name}"
            assert child in declared, f"{child} ({init.parent}) is missing from pyproject.toml"


def test_every_module_belongs_to_a_layer():
    assert len(modules()) > 50  # the graph is read, not empty
    assert [m for m in modules() if layer_of(m) < 0] == []


def wrong_layers(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` that point to a later layer."""
    return [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]


def test_imports_point_only_to_the_same_or_an_earlier_layer():
    assert wrong_layers(import_graph()) == []


def test_the_pure_core_imports_nothing_else_of_offpath():
    """compaction/ is pure: it may import itself, and nothing of the layers that do I/O."""
    for module, targets in import_graph().items():
        if module.startswith("offpath.compaction"):
            assert {t for t in targets if not t.startswith("offpath.compaction")} == set(), module


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """An import cycle of ``graph`` if it has one (the modules on it, sorted), found by the
    standard library's topological sort (:class:`graphlib.TopologicalSorter`)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return [sorted(set(exc.args[1]))]
    return []


def test_no_import_cycle():
    """No module reaches itself through its imports (a package's ``__init__`` importing its
    own submodules is not a cycle unless one of them imports the package back)."""
    assert cycles(import_graph()) == []


def test_the_checks_see_a_wrong_import():
    """The layer and cycle checks are not vacuous: a store importing the agent side is a
    wrong layer, and modules importing each other in a ring are a cycle."""
    wrong = {"offpath.stores.db": {"offpath.agent.middleware", "offpath.compaction.settings"}}
    assert wrong_layers(wrong) == [
        "offpath.stores.db (offpath.stores) imports offpath.agent.middleware (offpath.agent)"
    ]
    ring = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert cycles(ring) == [["a.x", "a.y", "a.z"]]
    assert cycles({"a.x": {"a.y"}, "a.y": set()}) == []
    graph = import_graph()
    assert "offpath.stores.db" in graph["offpath.stores.archive"]  # imports are read
    assert "offpath.coordination.queue" in graph["offpath.coordination.runtime"]  # lazy too


def test_an_agent_tools_setting_written_before_the_move_still_loads():
    """``AGENT_TOOLS=offpath.demo.sre_tools:SRE_TOOLS`` (the default before the toolset moved
    to the agent side) loads the same tools as today's default."""
    from offpath.agent.graph import load_tools
    from offpath.compaction.settings import Settings

    default = Settings(_env_file=None).agent_tools
    assert default == "offpath.agent.sre_tools:SRE_TOOLS"
    before = load_tools("offpath.demo.sre_tools:SRE_TOOLS")
    assert before == load_tools(default) and len(before) == 4

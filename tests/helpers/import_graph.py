"""The import graph of the ``attnlab`` package and of the stage scripts, read with :mod:`ast`.

Nothing is imported. Every ``import``/``from ... import`` statement counts, at module level
or inside a function, class or ``if``: a lazy import still ties two modules together.
``from attnlab.x import y`` is an edge to ``attnlab.x.y`` when ``y`` is a submodule, else
to ``attnlab.x``. Used by tests/test_layout.py (cycles, private names) and
tests/test_dvc_deps.py (what each stage script runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = "attnlab"
SRC = Path(__file__).resolve().parents[2] / "src"


def module_files(package_dir: Path = SRC / PACKAGE, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name → its file, for every ``.py`` file under ``package_dir``."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, modules: set[str]) -> list[tuple[str, str | None, int]]:
    """(imported package module, imported name or None, line) for each import in ``path``.

    Only targets inside the package (``modules``) are kept. For ``from X import y`` the
    target is ``X.y`` with name None when ``X.y`` is a module, else ``X`` with name ``y``.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from ..x import y
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.append((f"{base}.{alias.name}", None, node.lineno))
                elif base in modules:
                    found.append((base, None if alias.name == "*" else alias.name, node.lineno))
    return found


def import_graph(package_dir: Path = SRC / PACKAGE, package: str = PACKAGE):
    """(the package's import graph, a :class:`networkx.DiGraph` of dotted names,
    [(importer, line, source, name)] of every name imported from another package module)."""
    files = module_files(package_dir, package)
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    names = []
    for module, path in files.items():
        for target, name, line in imports_of(module, path, set(files)):
            if target != module:
                graph.add_edge(module, target)
                if name is not None:
                    names.append((module, line, target, name))
    return graph, names


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Every elementary cycle, as ``[a, b, ..., a]`` starting from its smallest name."""
    out = []
    for cycle in nx.simple_cycles(graph):
        i = cycle.index(min(cycle))
        out.append([*cycle[i:], *cycle[:i], min(cycle)])
    return sorted(out)


def runs(script: Path, stop: set[str] = frozenset()) -> set[Path]:
    """The package files that running ``script`` (e.g. src/train.py) may import, transitively,
    not following the imports of the modules in ``stop`` (nor counting those). Importing
    ``attnlab.a.b`` runs ``attnlab/__init__.py`` and ``attnlab/a/__init__.py`` too."""
    return _reached([target for target, _, _ in imports_of(script.stem, script, set(module_files()))], stop)


def runs_module(module: str, stop: set[str] = frozenset()) -> set[Path]:
    """The package files that importing ``module`` (a dotted name, e.g. one a config names for
    Hydra to load) runs: the module's own file and what :func:`runs` would follow from it."""
    return _reached([module], stop)


def _reached(todo: list[str], stop: set[str]) -> set[Path]:
    files = module_files()
    graph, _ = import_graph()
    reached: set[str] = set()
    while todo:
        module = todo.pop()
        if module in reached or module in stop:
            continue
        reached.add(module)
        parents = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
        todo += [*graph.successors(module), *parents]
    return {files[m] for m in reached}

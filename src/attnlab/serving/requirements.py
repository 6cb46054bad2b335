"""The served model's ``requirements.txt``, derived from what its code imports.

:func:`served_requirements` pins everything the served code imports
(:func:`served_imports`: ``src/attnlab/serving/model.py`` and, transitively, the attnlab
modules it reaches), so the model that :func:`attnlab.serving.registry.log_served_model`
logs loads in a fresh environment built from that file alone.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.errors import UserError

SERVING_CODE = Path(__file__).with_name("model.py")  # the "models from code" file, beside this one
PACKAGE_DIR = SERVING_CODE.parents[1]  # the attnlab package: the served model's code path
# Top-level module → its pip distribution, for modules that several installed distributions
# provide and that are not named like one of them (see served_requirements).
SERVED_DISTRIBUTIONS: dict[str, str] = {}


class ServedRequirementsError(UserError, RuntimeError):
    """The served code imports a module that no installed pip distribution provides."""


def _module_file(package_dir: Path, module: str) -> Path | None:
    """The file of ``module`` (dotted, inside the package at ``package_dir``), or None."""
    parts = module.split(".")
    if parts[0] != package_dir.name:
        return None
    base = package_dir.parent.joinpath(*parts)
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _catches_import_error(node) -> bool:
    import ast

    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if handler.type is None or any(isinstance(k, ast.Name) and k.id in names for k in kinds):
            return True
    return False


def _imports_in(path: Path, module: str) -> list[tuple[str, bool]]:
    """(absolute dotted module, optional) for every import statement of file ``path``.

    ``module`` is the file's own dotted name (for resolving relative imports).
    For ``from X import a`` both ``X`` and ``X.a`` are returned (``a`` may be a submodule).
    An import inside ``try`` whose ``except`` catches ImportError is optional.
    """
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[tuple[str, bool]] = []

    def visit(node, optional: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, optional) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.append((base, optional))
            found.extend((f"{base}.{alias.name}", optional) for alias in node.names if alias.name != "*")
        for child in ast.iter_child_nodes(node):
            in_try = isinstance(node, ast.Try) and child in node.body and _catches_import_error(node)
            visit(child, optional or in_try)

    visit(tree, False)
    return found


def served_imports(entry: Path = SERVING_CODE, package_dir: Path = PACKAGE_DIR) -> dict[str, bool]:
    """Third-party top-level modules the served code may import → whether all are optional.

    Reads (never runs) ``entry`` and, transitively, every module of the package at
    ``package_dir`` (``src/attnlab``) that it imports, parent packages' ``__init__.py``
    included, as Python runs them. Imports inside functions count (a lazy
    ``import sentencepiece`` is still needed when that function runs); standard-library
    modules and the package itself are left out. An import in a ``try`` whose
    ``except`` catches ImportError is optional (True) unless it is also imported
    unconditionally somewhere.

    Returns:
        ``{top-level module name: optional}``, e.g. ``{"torch": False, ...}``.
    Raises:
        SyntaxError: a reached file does not parse.
    """
    import sys

    package_dir = Path(package_dir).resolve()
    package = package_dir.name
    entry = Path(entry).resolve()
    module = (
        ".".join((package, *entry.relative_to(package_dir).with_suffix("").parts))
        if entry.is_relative_to(package_dir)
        else entry.stem
    )
    todo = [(entry, module)]
    seen: set[Path] = set()
    third_party: dict[str, bool] = {}
    while todo:
        path, module = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name, optional in _imports_in(path, module):
            top = name.split(".")[0]
            if top == package:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
                    sub = ".".join(parts[:i])
                    file = _module_file(package_dir, sub)
                    if file is not None:
                        todo.append((file, sub))
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                third_party[top] = third_party.get(top, True) and optional
    return third_party


def served_requirements(entry: Path = SERVING_CODE, package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Pip requirements of the served model, derived from what its code imports.

    One exact pin ``<distribution>==<installed version>`` per distribution that provides
    a module of :func:`served_imports` (when several distributions provide it:
    :data:`SERVED_DISTRIBUTIONS`, else the one named like the module, e.g. ``mlflow``
    over ``mlflow-skinny`` and ``mlflow-tracing``), sorted by name.
    A local version label is dropped (torch ``2.13.0+cpu`` → ``torch==2.13.0``): such
    labels do not install from PyPI. Optional imports that are not installed are left out.
    Deriving them means a new import in the served code is a new requirement, not a
    model that fails to load elsewhere; ``tests/test_served_env.py`` installs exactly
    this list into a fresh virtualenv and translates with it.

    Returns:
        e.g. ``["mlflow==3.17.2", "numpy==2.4.6", "omegaconf==2.3.1", ...]``.
    Raises:
        ServedRequirementsError: a module is not installed, or no single distribution
            provides it (names the module and the fix).
    """
    import re
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    providers = packages_distributions()
    pins: dict[str, str] = {}
    for module, optional in sorted(served_imports(entry, package_dir).items()):
        dists = sorted({norm(d) for d in providers.get(module, [])})
        if not dists:
            if optional:
                continue
            raise ServedRequirementsError(
                f"the served code ({package_dir}) imports `{module}`, which no installed "
                "distribution provides, so the served model's requirements.txt cannot pin it. "
                f"Install it in this environment (add it to pyproject.toml) or remove the import"
            )
        dist = (
            norm(SERVED_DISTRIBUTIONS[module])
            if module in SERVED_DISTRIBUTIONS
            else norm(module)
            if norm(module) in dists
            else dists[0]
            if len(dists) == 1
            else None
        )
        if dist is None:
            raise ServedRequirementsError(
                f"the served code imports `{module}`, which several installed distributions "
                f"provide ({', '.join(dists)}); add the one to install to "
                "attnlab.serving.requirements.SERVED_DISTRIBUTIONS"
            )
        try:
            pins[dist] = version(dist).split("+")[0]
        except PackageNotFoundError as e:  # metadata without a version: a broken install
            raise ServedRequirementsError(
                f"`{module}` comes from {dist}, whose version is unknown; reinstall it ({e})"
            ) from e
    return [f"{dist}=={v}" for dist, v in sorted(pins.items())]

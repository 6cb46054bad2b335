"""The package's module layout: no import cycles, no private names across modules.

The import graph is read from the source with :mod:`ast` (nothing is imported): every
``import``/``from ... import`` statement counts, at module level or inside a function,
class or ``if``, because a lazy import still ties the two modules together (the cycle
only hides until that function runs). ``from attnlab.x import y`` is an edge to
``attnlab.x.y`` when ``y`` is a submodule, else to ``attnlab.x``. Importing a module does
not add edges to its parent packages (Python runs those first, so they cannot close a
cycle through a child).
"""

import networkx as nx

from helpers.import_graph import PACKAGE, SRC, cycles, import_graph


def test_the_package_has_no_import_cycles():
    graph, _ = import_graph()
    assert len(graph) > 20 and f"{PACKAGE}.console" in graph, f"no package read at {SRC / PACKAGE}"
    found = cycles(graph)
    assert not found, "import cycles (function-level imports included): " + "; ".join(repr(c) for c in found)


def test_no_module_imports_a_private_name_from_another():
    _, names = import_graph()
    private = [
        f"{importer}:{line} imports {name} from {source}"
        for importer, line, source, name in names
        if name.startswith("_")
    ]
    assert not private, "private names imported across modules: " + "; ".join(private)


def test_the_graph_sees_lazy_submodule_and_relative_imports(tmp_path):
    """The checker itself, on a made-up package: a cycle closed by an import inside a
    function, ``from pkg import sub`` read as an edge to the submodule, relative imports,
    and a private name."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\nX = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import _hidden\n    return _hidden\n")
    (pkg / "c.py").write_text("_hidden = 2\n\n\ndef g():\n    if True:\n        from . import a\n")
    (pkg / "d.py").write_text("import pkg.a\nfrom pkg.sub import *\n")
    graph, names = import_graph(pkg, "pkg")
    assert {m: set(graph[m]) for m in graph} == {
        "pkg": set(),
        "pkg.a": {"pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.c"},
        "pkg.c": {"pkg.a"},
        "pkg.d": {"pkg.a", "pkg.sub"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    assert names == [("pkg.sub.b", 2, "pkg.c", "_hidden")]
    assert cycles(nx.DiGraph({"x": ["x"], "y": []})) == [["x", "x"]]


def _top_level_imports(path) -> set[str]:
    """The top-level names of every module ``path`` imports (``torch`` for ``torch.nn``)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_the_books_models_import_torch_and_nothing_of_the_lab():
    """attnlab.models (attention, Nadaraya–Watson, Bahdanau, the Transformer) reads like the
    book: torch, the standard library and itself, no framework and no other attnlab module."""
    import sys

    folder = SRC / PACKAGE / "models"
    files = sorted(folder.glob("*.py"))
    assert {f.name for f in files} >= {"attention.py", "nadaraya_watson.py", "bahdanau.py", "transformer.py"}
    allowed = {"torch", "__future__", PACKAGE} | set(sys.stdlib_module_names)
    outside = {f.name: sorted(_top_level_imports(f) - allowed) for f in files}
    assert not any(outside.values()), f"the book's models import {outside}"
    graph, _ = import_graph()
    lab = {
        t
        for m in graph
        if m.startswith(f"{PACKAGE}.models")
        for t in graph[m]
        if not t.startswith(f"{PACKAGE}.models")
    }
    assert not lab, f"attnlab.models imports {sorted(lab)}"


def test_no_stage_or_module_asks_which_task_or_tokenizer_it_holds():
    """Dispatch lives in the config (conf/model/*.yaml ``task``, conf/data/*.yaml), not in code:
    no comparison of a config's ``task`` or ``tokenizer`` to a string, and no ``hasattr`` probe."""
    import re

    pattern = re.compile(
        r"""(\.task|\btask\b|\.tokenizer)\s*[!=]=|get\(\s*["'](task|tokenizer)["'][^)]*\)\s*[!=]="""
        r"""|hasattr\(\s*(self\.)?tokenizer"""
    )
    files = [*sorted((SRC / PACKAGE).rglob("*.py")), *sorted(SRC.glob("*.py"))]
    found = [
        f"{f.relative_to(SRC)}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "string dispatch on the task or tokenizer: " + "; ".join(found)


def test_inference_and_serving_import_no_trainer():
    """Inference needs no trainer: evaluate's module, the decoding loops and the served
    translator run without Lightning (devices are resolved by attnlab.device, torch alone)."""
    import subprocess
    import sys

    code = (
        "import sys, attnlab.inference.evaluation, attnlab.serving.translator, attnlab.device; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'lightning_fabric')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout == "[]\n"
    graph, _ = import_graph()
    upward = {
        (m, t)
        for m in graph
        if m.startswith((f"{PACKAGE}.inference", f"{PACKAGE}.serving", f"{PACKAGE}.device"))
        for t in graph[m]
        if t.startswith(f"{PACKAGE}.lit")
    }
    assert not upward, f"inference or serving imports the training package: {sorted(upward)}"


def test_a_d2l_reader_imports_the_books_names_from_one_place():
    import attnlab.models as book
    from attnlab.models.attention import (
        AdditiveAttention,
        DotProductAttention,
        MultiHeadAttention,
        masked_softmax,
    )
    from attnlab.models.bahdanau import Bahdanau
    from attnlab.models.nadaraya_watson import NadarayaWatson
    from attnlab.models.positional_encoding import PositionalEncoding
    from attnlab.models.transformer import AddNorm, PositionWiseFFN, Transformer

    for obj in (
        masked_softmax,
        AdditiveAttention,
        DotProductAttention,
        MultiHeadAttention,
        PositionalEncoding,
        PositionWiseFFN,
        AddNorm,
        Bahdanau,
        Transformer,
        NadarayaWatson,
    ):
        assert getattr(book, obj.__name__) is obj
    assert sorted(book.__all__) == sorted(n for n in book.__all__ if hasattr(book, n))


def test_the_package_is_grouped_by_concern():
    """No loose module at the top of attnlab but the few shared by training and inference."""
    top = sorted(p.stem for p in (SRC / PACKAGE).glob("*.py") if p.stem != "__init__")
    assert top == ["checkpoint", "cli", "config", "device", "errors", "files", "loss", "metrics"]
    groups = sorted(p.name for p in (SRC / PACKAGE).iterdir() if (p / "__init__.py").is_file())
    assert groups == [
        "analysis",
        "console",
        "data",
        "export",
        "inference",
        "lit",
        "models",
        "serving",
        "tracking",
        "vision",  # the image task (ViT, CNN): the translation pipeline neither imports nor depends on it
    ]

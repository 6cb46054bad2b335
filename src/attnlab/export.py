"""Self-contained exported models: TorchScript + sentencepiece + JSON, no Lightning, no Hydra.

A translation export folder ``models/<model>/`` holds
``init_state.pt`` and ``step.pt`` (TorchScript traces of the model's decoding
interface, see :mod:`attnlab.decoding`), ``spm.model`` and ``config.json``.
:func:`load_translator` needs only torch and sentencepiece; the decoding loops
are :mod:`attnlab.decoding`'s, the same ones evaluation uses, so an export
decodes exactly the tokens its checkpoint does. :class:`Translator` is the
text-in, text-out front end (``src/translate.py`` and the MLflow model of
:mod:`attnlab.serving` use it): the export's beam settings, its input limits
(``config.json`` → ``serving``: per sentence, and per request for the served model),
and "" → "".
:func:`log_served_model` logs an export folder as an MLflow pyfunc model and
registers it (the export stage calls it for every translation model); the newest
version has the alias ``champion``, and the model's ``requirements.txt`` pins
everything its code imports (:func:`served_requirements`), so it loads in a fresh
environment built from that file alone.
NW exports ``model.pt`` mapping x (Q,) float32 → ŷ (Q,), with its training
points baked in.
"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from attnlab.decoding import encode_sources, has_text, translate_text
from attnlab.files import staged_dir

FORMAT_VERSION = 1
# Longest source sentence a served/translated export accepts, in characters (Unicode code
# points). Multi30k's longest English sentence has about 220 (test_2017_flickr); beam search
# time grows with the length.
DEFAULT_MAX_INPUT_CHARS = 500
# Most the served model decodes in one request (Translator.check_request), so that a request
# at the limit is answered well inside the scoring server's MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT
# (default 60 s). Decoding time grows with the source tokens of the request (each sentence
# decodes up to 1.5 × its tokens + 10 steps): the token budget bounds it whatever the text; the
# characters (a cheap check before tokenizing; 32 sentences of twice Multi30k's mean 61
# characters) and the sentence count bound the work around it.
# Measured with a d_model 256, 2+2-layer, 5,000-piece Transformer with random weights (every
# sentence decodes to its length cap, the worst case), beam 5, on a 2-core machine at load
# average 4-6. Served (`mlflow models serve`), one request at each limit: 32 Multi30k test
# sentences (1,974 characters, 481 tokens) 1.7-1.8 s; 4 × 500 characters (428 tokens)
# 1.9-2.6 s; 3 token-dense sentences (1,230 characters, 993 tokens) 4.5-6.1 s (English at
# the 4,000-character limit is about 860 tokens). In-process with
# two threads on the busy cores, 5-10× slower: 32 test sentences 12-18 s, 4 × 500 characters
# 11-21 s, 4 token-dense × 500 characters (1,610 tokens, over the limit) 37-42 s. See README
# "Serving a model over HTTP".
DEFAULT_MAX_REQUEST_SENTENCES = 32
DEFAULT_MAX_REQUEST_CHARS = 4000
DEFAULT_MAX_REQUEST_TOKENS = 1000


class _InitState(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, src, src_valid_lens):
        return self.net.init_state(src, src_valid_lens)


class _Step(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, ys, *state):
        return self.net.step(ys, *state)


class _NWPredictor(nn.Module):
    def __init__(self, net, x_train, y_train):
        super().__init__()
        self.net = net
        self.register_buffer("x_train", x_train)
        self.register_buffer("y_train", y_train)

    def forward(self, x):
        return self.net(x, self.x_train, self.y_train)


def _trace(module: nn.Module, example: tuple) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():  # tracer warnings about Python ints are expected here
        warnings.simplefilter("ignore")
        return torch.jit.trace(module, example, check_trace=False)


def _max_source_tokens(net: nn.Module) -> int | None:
    """Most source tokens (without <eos>) the net can encode: its positional table − 1, or None."""
    table = getattr(getattr(net, "pos_encoding", None), "P", None)
    return None if table is None else int(table.shape[1]) - 1


def export_translation(net: nn.Module, tokenizer_path: Path, out_dir: Path, config: dict,
                       max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
                       max_request_sentences: int = DEFAULT_MAX_REQUEST_SENTENCES,
                       max_request_chars: int = DEFAULT_MAX_REQUEST_CHARS,
                       max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS) -> Path:
    """Trace ``net`` (a Transformer or Bahdanau in eval mode) and write the export folder.

    ``config.json`` holds ``config`` plus ``format_version``, ``task`` and
    ``serving = {max_input_chars, max_input_tokens, max_request_sentences,
    max_request_chars, max_request_tokens}``: the longest source :class:`Translator`
    accepts, in characters, and in sentencepiece tokens (the Transformer's positional
    table − 1 for <eos>; null for the GRU, which has none); and the most one request
    to the served model may hold (:meth:`Translator.check_request`).

    Args:
        net: model with ``init_state``/``step`` (see :mod:`attnlab.decoding`).
        tokenizer_path: its ``spm.model``.
        out_dir: target folder, replaced atomically.
        config: JSON-serializable facts stored as ``config.json`` (model name, sizes,
            optionally ``decoding = {beam_size, alpha}``, the settings :class:`Translator` uses).
        max_input_chars: input limit per sentence in characters, ≥ 1.
        max_request_sentences, max_request_chars, max_request_tokens: limits per request
            of the served model: sentences, characters and sentencepiece tokens of all its
            sentences together, each ≥ 1.
    Raises:
        ValueError: a limit < 1, or a per-request limit below what one sentence may have
            (``max_request_chars`` < ``max_input_chars``, ``max_request_tokens`` <
            ``max_input_tokens``, or < ``max_input_chars`` + 1 for a model without a token
            limit), so a sentence could be accepted by itself yet fit no request.
    """
    import sentencepiece as spm

    limits = {"max_input_chars": max_input_chars, "max_request_sentences": max_request_sentences,
              "max_request_chars": max_request_chars, "max_request_tokens": max_request_tokens}
    for key, value in limits.items():
        if int(value) < 1:
            raise ValueError(f"serving.{key} must be ≥ 1, got {value}")
    if max_request_chars < max_input_chars:
        raise ValueError(f"serving.max_request_chars ({max_request_chars}) is below "
                         f"serving.max_input_chars ({max_input_chars}): a sentence of "
                         f"{max_input_chars} characters would fit no request. Raise "
                         "max_request_chars or lower max_input_chars")
    max_input_tokens = _max_source_tokens(net)
    one_sentence, which = ((max_input_tokens, "max_input_tokens") if max_input_tokens is not None
                           else (max_input_chars + 1, "max_input_chars + 1"))
    if max_request_tokens < one_sentence:
        raise ValueError(f"serving.max_request_tokens ({max_request_tokens}) is below the "
                         f"{one_sentence} tokens one sentence may have ({which}): such a "
                         "sentence would fit no request. Raise max_request_tokens")

    net = net.eval().cpu()
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    src, valid = encode_sources(sp, ["a first example sentence .", "two"])
    out_dir = Path(out_dir)
    with staged_dir(out_dir) as tmp, torch.no_grad():
        state = net.init_state(src, valid)
        ys = torch.full((src.shape[0], 3), 4, dtype=torch.long)
        _trace(_InitState(net), (src, valid)).save(str(tmp / "init_state.pt"))
        _trace(_Step(net), (ys, *state)).save(str(tmp / "step.pt"))
        shutil.copy(tokenizer_path, tmp / "spm.model")
        serving = {**{k: int(v) for k, v in limits.items()}, "max_input_tokens": max_input_tokens}
        (tmp / "config.json").write_text(json.dumps(
            {"format_version": FORMAT_VERSION, "task": "translation", **config, "serving": serving},
            indent=2))
    return out_dir


def export_regression(net: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor,
                      out_dir: Path, config: dict) -> Path:
    """Trace a NW model with its training points as keys/values into ``out_dir/model.pt``."""
    out_dir = Path(out_dir)
    predictor = _NWPredictor(net.eval(), x_train, y_train)
    with staged_dir(out_dir) as tmp:
        with torch.no_grad():
            _trace(predictor, (x_train[:3].clone(),)).save(str(tmp / "model.pt"))
        (tmp / "config.json").write_text(json.dumps(
            {"format_version": FORMAT_VERSION, "task": "regression", **config}, indent=2))
    return out_dir


def load_translator(export_dir: Path):
    """Load an export folder: (init_state, step, tokenizer, config), with torch and sentencepiece only.

    Raises:
        FileNotFoundError: if the folder is not a translation export (names the stage to run).
    """
    import sentencepiece as spm

    d = Path(export_dir)
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found; export first with "
                                "`python src/export.py model=<name>` or `dvc repro`")
    config = json.loads(cfg_path.read_text())
    if config.get("task") != "translation":
        raise ValueError(f"{d} holds a {config.get('task')} model, not a translation model")
    init_state = torch.jit.load(str(d / "init_state.pt"), map_location="cpu")
    step = torch.jit.load(str(d / "step.pt"), map_location="cpu")
    tokenizer = spm.SentencePieceProcessor(model_file=str(d / "spm.model"))
    return init_state, step, tokenizer, config


class InputTooLongError(ValueError):
    """A sentence is longer than the export's input limit (``config.json`` → ``serving``)."""


class InvalidRequestError(ValueError):
    """A request to the served model is not a list of strings (:meth:`Translator.check_request`)."""


class RequestTooLargeError(InvalidRequestError):
    """A request to the served model holds more sentences, characters or tokens than its
    per-request limits (``config.json`` → ``serving``) allow."""


class EmptyRequestError(InvalidRequestError):
    """A request to the served model holds no sentence."""


class Translator:
    """An export folder as a text-in, text-out translator.

    Decodes with the export's ``decoding`` settings (``config.json`` → ``decoding``,
    else ``model_config.decoding``, else greedy) unless ``beam_size``/``alpha`` are
    given, through :func:`attnlab.decoding.translate_text`, so it returns exactly
    the strings that function returns for the non-empty sentences.
    A sentence with nothing to translate (empty, whitespace, control or invisible format
    characters alone: :func:`attnlab.decoding.has_text`) translates to "" without decoding.

    Args:
        export_dir: a folder written by :func:`export_translation`.
        beam_size, alpha: override the export's decoding settings (beam_size 1 is greedy).
        batch_size: sentences decoded together.
    Attributes:
        max_input_chars: longest accepted sentence in characters (Unicode code points).
        max_input_tokens: longest accepted sentence in sentencepiece tokens, or None.
        max_request_sentences, max_request_chars, max_request_tokens: most sentences,
            characters and tokens per request of the served model (:meth:`serve`).
        beam_size, alpha, config: the settings in use and the export's ``config.json``.
    Raises:
        FileNotFoundError, ValueError: as :func:`load_translator`.
    """

    def __init__(self, export_dir: Path, beam_size: int | None = None, alpha: float | None = None,
                 batch_size: int = 128):
        self.init_state, self.step, self.tokenizer, self.config = load_translator(export_dir)
        dec = self.config.get("decoding") or self.config.get("model_config", {}).get("decoding") or {}
        self.beam_size = int(beam_size if beam_size is not None else dec.get("beam_size", 1))
        self.alpha = float(alpha if alpha is not None else dec.get("alpha", 0.0))
        limits = self.config.get("serving") or {}  # exports older than the limit get the default
        self.max_input_chars = int(limits.get("max_input_chars") or DEFAULT_MAX_INPUT_CHARS)
        self.max_input_tokens = limits.get("max_input_tokens")
        self.max_request_sentences = int(limits.get("max_request_sentences")
                                         or DEFAULT_MAX_REQUEST_SENTENCES)
        self.max_request_chars = int(limits.get("max_request_chars") or DEFAULT_MAX_REQUEST_CHARS)
        self.max_request_tokens = int(limits.get("max_request_tokens") or DEFAULT_MAX_REQUEST_TOKENS)
        self.batch_size = batch_size

    def check_lengths(self, sentences: Sequence[str]) -> list[list[int]] | None:
        """Raise :class:`InputTooLongError` naming the first sentence over a limit (index from 0).

        Returns the sentences' token ids when the token limit needed them, else None.
        """
        for i, text in enumerate(sentences):
            if len(text) > self.max_input_chars:
                raise InputTooLongError(
                    f"input {i} has {len(text)} characters; this model translates at most "
                    f"{self.max_input_chars} characters per sentence (max_input_chars). "
                    "Split the text into sentences and send each as its own input.")
        if self.max_input_tokens is None:
            return None
        ids = self.tokenizer.encode(list(sentences))
        for i, seq in enumerate(ids):
            if len(seq) > self.max_input_tokens:
                raise InputTooLongError(
                    f"input {i} has {len(seq)} sentencepiece tokens; this model encodes at most "
                    f"{self.max_input_tokens} tokens per sentence (max_input_tokens). "
                    "Split the text into shorter sentences.")
        return ids

    def check_request(self, sentences: Sequence[str]) -> None:
        """Check one request of the served model against every limit, cheapest first.

        ``sentences`` must be a non-empty list of str; then at most
        ``max_request_sentences`` of them, ``max_request_chars`` characters together,
        each within :meth:`check_lengths`, and ``max_request_tokens`` sentencepiece
        tokens together. Nothing is decoded; the count and type checks run before any
        sentence is read, the token checks after the character checks.

        Raises:
            InvalidRequestError: ``sentences`` is not a list/tuple, or an item is not a str
                (names its index and type).
            EmptyRequestError: no sentence.
            RequestTooLargeError: over a per-request limit (names the count, the limit,
                its ``serving.*`` setting and how to split).
            InputTooLongError: a sentence over a per-sentence limit.
        """
        if not isinstance(sentences, (list, tuple)):
            raise InvalidRequestError(
                f"expected a list of sentences (strings), got {type(sentences).__name__}; "
                'send {"inputs": ["sentence 1", "sentence 2", ...]}')
        if not sentences:
            raise EmptyRequestError(
                "the request has no sentences (an empty list); send at least one: "
                '{"inputs": ["A man rides a bike."]}')
        n = len(sentences)
        if n > self.max_request_sentences:
            raise RequestTooLargeError(
                f"the request has {n} sentences; this model translates at most "
                f"{self.max_request_sentences} sentences per request "
                f"(serving.max_request_sentences). Split it into "
                f"{-(-n // self.max_request_sentences)} or more requests of at most "
                f"{self.max_request_sentences} sentences each.")
        for i, text in enumerate(sentences):
            if not isinstance(text, str):
                kind = "null" if text is None else type(text).__name__
                raise InvalidRequestError(
                    f"input {i} is {kind}, not a string; send each sentence as a JSON string: "
                    '{"inputs": ["sentence 1", "sentence 2", ...]}')
        chars = sum(len(s) for s in sentences)
        if chars > self.max_request_chars:
            raise RequestTooLargeError(
                f"the request has {chars} characters in its {n} sentences; this model "
                f"translates at most {self.max_request_chars} characters per request "
                f"(serving.max_request_chars). Split it into requests of at most "
                f"{self.max_request_chars} characters (and {self.max_request_sentences} "
                "sentences) each.")
        ids = self.check_lengths(sentences)
        if ids is None:
            ids = self.tokenizer.encode(list(sentences))
        tokens = sum(len(seq) for seq in ids)
        if tokens > self.max_request_tokens:
            raise RequestTooLargeError(
                f"the request has {tokens} sentencepiece tokens in its {n} sentences; this "
                f"model decodes at most {self.max_request_tokens} tokens per request "
                f"(serving.max_request_tokens; text without spaces, digits and rare scripts "
                "take more tokens per character). Split it into requests of fewer sentences.")

    def __call__(self, sentences: Sequence[str]) -> list[str]:
        """Translate ``sentences`` (list of str) → one str per sentence, input order.

        Raises:
            InputTooLongError: a sentence exceeds ``max_input_chars`` or ``max_input_tokens``;
                nothing is decoded then.
        """
        sentences = list(sentences)
        self.check_lengths(sentences)
        return self._decode(sentences)

    def serve(self, sentences: Sequence[str]) -> list[str]:
        """One request of the served model: :meth:`check_request`, then translate like :meth:`__call__`.

        Raises:
            InvalidRequestError (EmptyRequestError, RequestTooLargeError), InputTooLongError:
                as :meth:`check_request`; nothing is decoded then.
        """
        self.check_request(sentences)
        return self._decode(list(sentences))

    def _decode(self, sentences: list[str]) -> list[str]:
        """Translate checked sentences; those without text (:func:`has_text`) give "" undecoded."""
        todo = [i for i, s in enumerate(sentences) if has_text(s)]
        out = [""] * len(sentences)
        if todo:
            done = translate_text(self.init_state, self.step, self.tokenizer,
                                  [sentences[i] for i in todo], batch_size=self.batch_size,
                                  beam_size=self.beam_size, alpha=self.alpha)
            for i, text in zip(todo, done):
                out[i] = text
        return out


# --- MLflow serving: the export folder as a registered pyfunc model -------------------------

SERVING_CODE = Path(__file__).with_name("serving.py")  # the "models from code" file
PACKAGE_DIR = SERVING_CODE.parent  # this package: the served model's code path
EXPORT_ARTIFACT = "export"  # key of the export folder in the pyfunc's context.artifacts
SERVING_EXAMPLE = ["A man rides a bike."]
CHAMPION = "champion"  # registry alias of the newest version of each registered model
# Top-level module → its pip distribution, for modules that several installed distributions
# provide and that are not named like one of them (see served_requirements).
SERVED_DISTRIBUTIONS: dict[str, str] = {}


class ServingExportError(RuntimeError):
    """Logging or registering the served model in MLflow failed."""


class ServedRequirementsError(RuntimeError):
    """The served code imports a module that no installed pip distribution provides."""


def registered_model_name(model: str) -> str:
    """Name of the MLflow registered model of architecture ``model``: ``attnlab-<model>``."""
    return f"attnlab-{model}"


def served_model_uri(name: str, version: int | str | None = None) -> str:
    """``models:/<name>@champion`` (the newest version), or ``models:/<name>/<version>``."""
    return f"models:/{name}@{CHAMPION}" if version is None else f"models:/{name}/{version}"


def serve_command(name: str, tracking_uri: str, version: int | str | None = None) -> str:
    """The shell command that serves registered model ``name``: its ``champion`` alias
    (the newest version), or ``version`` when given.

    No ``--env-manager``: MLflow's default (``virtualenv``) builds the model's own
    environment from its ``requirements.txt`` (:func:`served_requirements`), so the
    command works on any machine that reaches the store (it needs pyenv; from the
    project's virtualenv ``--env-manager local`` skips the build).
    """
    return (f"MLFLOW_TRACKING_URI={tracking_uri} mlflow models serve "
            f"-m {served_model_uri(name, version)}")


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
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.append((base, optional))
            found.extend((f"{base}.{alias.name}", optional)
                         for alias in node.names if alias.name != "*")
        for child in ast.iter_child_nodes(node):
            in_try = (isinstance(node, ast.Try) and child in node.body
                      and _catches_import_error(node))
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
    module = (".".join((package, *entry.relative_to(package_dir).with_suffix("").parts))
              if entry.is_relative_to(package_dir) else entry.stem)
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
                f"Install it in this environment (add it to pyproject.toml) or remove the import")
        dist = (norm(SERVED_DISTRIBUTIONS[module]) if module in SERVED_DISTRIBUTIONS
                else norm(module) if norm(module) in dists else dists[0] if len(dists) == 1
                else None)
        if dist is None:
            raise ServedRequirementsError(
                f"the served code imports `{module}`, which several installed distributions "
                f"provide ({', '.join(dists)}); add the one to install to "
                "attnlab.export.SERVED_DISTRIBUTIONS")
        try:
            pins[dist] = version(dist).split("+")[0]
        except PackageNotFoundError as e:  # metadata without a version: a broken install
            raise ServedRequirementsError(f"`{module}` comes from {dist}, whose version is "
                                          f"unknown; reinstall it ({e})") from e
    return [f"{dist}=={v}" for dist, v in sorted(pins.items())]


def log_served_model(export_dir: Path, model: str, run_id: str, tracking_uri: str) -> tuple[str, int]:
    """Log a translation export folder to MLflow run ``run_id`` as a pyfunc model and register it.

    The pyfunc is a "model from code" (:mod:`attnlab.serving`, not a pickle) with
    the export folder as its artifact and this package as its code path, so a
    registered version keeps the decoding code it was logged with. Signature:
    list of str → list of str (from the type hints). Its metadata and the
    version's description state the input limit. The logged model is loaded
    back and run on :data:`SERVING_EXAMPLE` before it is registered, so only a
    model that translates gets a version. Every call adds a new version and moves
    the alias ``champion`` (:data:`CHAMPION`) to it, so ``models:/<name>@champion``
    is the newest. Its ``requirements.txt`` is :func:`served_requirements`: exact
    pins of everything the logged code imports, so the model loads in a fresh
    environment built from that file alone (``--env-manager virtualenv``, Docker).
    Sets this process's MLflow tracking URI to ``tracking_uri``.

    Args:
        export_dir: folder written by :func:`export_translation`.
        model: architecture name (``transformer``, ``bahdanau``); the registered
            model is :func:`registered_model_name` of it.
        run_id: the training run to attach the model to (``runs/<model>.json``).
        tracking_uri: the store holding that run; its registry gets the version.
    Returns:
        (registered model name, version number).
    Raises:
        FileNotFoundError, ValueError: ``export_dir`` is not a translation export.
        ServedRequirementsError: the served code imports a module that cannot be pinned
            (nothing is logged then).
        ServingExportError: logging, loading back, registering or setting the alias failed
            (names run, store, fix).
    """
    import mlflow

    export_dir = Path(export_dir).resolve()
    translator = Translator(export_dir)
    requirements = served_requirements()
    name = registered_model_name(model)
    limits = {key: getattr(translator, key) for key in (
        "max_input_chars", "max_input_tokens", "max_request_sentences", "max_request_chars",
        "max_request_tokens")}
    metadata = {"model": model, **limits, "beam_size": translator.beam_size,
                "alpha": translator.alpha, "too_long_input": "HTTP 400 (INVALID_PARAMETER_VALUE)",
                "too_large_request": "HTTP 400 (INVALID_PARAMETER_VALUE), nothing decoded",
                "empty_request": "HTTP 400 (INVALID_PARAMETER_VALUE)",
                "empty_input": "translates to an empty string"}
    step = "logging"
    try:
        mlflow.set_tracking_uri(tracking_uri)
        status = mlflow.MlflowClient(tracking_uri).get_run(run_id).info.status
        mlflow.start_run(run_id=run_id)
        try:
            info = mlflow.pyfunc.log_model(
                name="translator", python_model=str(SERVING_CODE),
                artifacts={EXPORT_ARTIFACT: str(export_dir)}, code_paths=[str(SERVING_CODE.parent)],
                input_example=SERVING_EXAMPLE, pip_requirements=requirements,
                metadata=metadata, tags={"model": model})
        finally:  # the training run keeps its status (a failed export is not a failed training)
            mlflow.end_run(status if status in ("FINISHED", "FAILED", "KILLED") else "FINISHED")
        step = "loading back"
        answer = mlflow.pyfunc.load_model(info.model_uri).predict(SERVING_EXAMPLE)
        if not (isinstance(answer, list) and len(answer) == 1 and isinstance(answer[0], str)):
            raise ValueError(f"the logged model answered {answer!r} to {SERVING_EXAMPLE!r}, "
                             "expected a list of one string")
        step = "registering"
        version = int(mlflow.register_model(info.model_uri, name).version)
        client = mlflow.MlflowClient(tracking_uri)
        client.update_model_version(name, version, description=(
            f"{model} translation model of run {run_id}. Input: a list of sentences, each at most "
            f"{translator.max_input_chars} characters (longer: HTTP 400, INVALID_PARAMETER_VALUE); "
            f"per request 1 to {translator.max_request_sentences} sentences, at most "
            f"{translator.max_request_chars} characters and {translator.max_request_tokens} "
            "tokens together (else HTTP 400; split the request); "
            f"an empty sentence translates to \"\". Beam size {translator.beam_size}, "
            f"alpha {translator.alpha}. Serve: {serve_command(name, tracking_uri, version)}"))
        step = f"setting the alias {CHAMPION} of"
        client.set_registered_model_alias(name, CHAMPION, version)
    except Exception as e:  # noqa: BLE001 - any failure means "not served"; the cause is chained
        raise ServingExportError(
            f"{step} the served model {name} (export {export_dir}) in MLflow run {run_id} at "
            f"{tracking_uri} failed: {type(e).__name__}: {e}. The export folder itself is written; "
            "check that the store is reachable and holds the run (runs/<model>.json), then "
            f"re-run `python src/export.py model={model}` (or `dvc repro export@{model}`)") from e
    return name, version

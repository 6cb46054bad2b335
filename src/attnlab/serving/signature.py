"""The served model's MLflow signature, and the checks MLflow 3.17 leaves out of it.

Input: one string column, named ``text`` (:data:`INPUT_COLUMN`): over HTTP
``{"inputs": ["sentence", ...]}`` (MLflow's scoring server puts a list into the one column
of a one-column signature), ``instances``, ``dataframe_split`` / ``dataframe_records`` with
the column ``text``, or a ``text/csv`` body whose first line is the header ``text``; in
Python a list of strings or a DataFrame with the one column ``text``.
Params (:func:`served_signature`): ``alignments`` and ``details`` (booleans, default false),
``engine`` (string, default the export's) and ``beam_size`` (integer, default the export's, 1
to :data:`MAX_BEAM_SIZE`).

MLflow enforces the signature in ``PyFuncModel.predict`` (``_enforce_schema``: the column
``text`` must be there; ``_enforce_params_schema``: each declared param must have its
type), but it drops a column or a param the signature does not declare with a logged
warning alone, before the model can see it, and it refuses a plain list for a named column.
:func:`input_frame` and :func:`check_params` hold a request to the whole signature first;
:mod:`attnlab.serving.guard` runs them before MLflow's enforcement.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

from attnlab.serving.translator import InvalidRequestError

INPUT_COLUMN = "text"  # the one input column of the served model
# Largest beam a request may ask for (the param beam_size; an export whose own beam is larger
# allows that one). Decoding time grows about linearly with the beam: the per-request limits
# (translator.py) were measured at beam 5, and at 16 a request at the token limit still ends
# well inside the scoring server's 60 s timeout.
MAX_BEAM_SIZE = 16
_KINDS = {"boolean": "true or false", "long": "an integer", "integer": "an integer", "string": "a string"}


class InputColumnsError(InvalidRequestError):
    """A request whose input is not the one column ``text`` (other, extra or no columns)."""


class UnknownParamError(InvalidRequestError):
    """A request param the model's signature does not declare."""


class InvalidParamError(InvalidRequestError):
    """A declared param with a value of the wrong type or out of its bounds."""


def served_signature(engine: str, beam_size: int) -> ModelSignature:
    """The served model's signature: input one string column ``text``; params ``alignments``
    and ``details`` (booleans, false), ``engine`` (string, ``engine``) and ``beam_size``
    (integer, ``beam_size``). Outputs are not declared: a list of strings, or of objects with
    ``details`` or ``alignments``."""
    return ModelSignature(
        inputs=Schema([ColSpec("string", INPUT_COLUMN)]),
        params=ParamSchema(
            [
                ParamSpec("alignments", "boolean", False),
                ParamSpec("details", "boolean", False),
                ParamSpec("engine", "string", engine),
                ParamSpec("beam_size", "long", int(beam_size)),
            ]
        ),
    )


def _expected(column: str) -> str:
    return (
        f"this model takes one string column, named {column!r}: send "
        '{"inputs": ["sentence 1", "sentence 2", ...]}, a DataFrame with the one column '
        f"{column}, or a text/csv body whose first line is the header {column}"
    )


def _missing_to_none(values: list) -> list:
    """``values`` with pandas' missing values (NaN, NA, NaT) as None, so a check names them null."""
    return [
        None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v for v in values
    ]


def input_frame(data: Any, column: str = INPUT_COLUMN) -> pd.DataFrame:
    """The sentences of a request as a DataFrame with the one object column ``column``.

    Takes a list, tuple or 1-D array of sentences, a Series (unnamed or named ``column``),
    a dict ``{column: sentences}`` or a DataFrame with exactly the column ``column``. The items
    are kept as they are (a non-string is for :meth:`~attnlab.serving.translator.Translator.check_request`
    to name), except that missing values become None.

    Raises:
        InputColumnsError: other, extra or no columns (names them and what is expected).
        InvalidRequestError: ``data`` is none of the above (a string, a number, ...).
    """
    if isinstance(data, (pd.DataFrame, dict)):
        columns = [str(c) for c in data]
        if columns != [column]:
            noun = "no column" if not columns else "column " if len(columns) == 1 else "columns "
            got = noun + ", ".join(repr(c) for c in columns)
            raise InputColumnsError(f"the input has {got}; {_expected(column)}")
        values = data[column]
    elif isinstance(data, pd.Series):
        if data.name is not None and str(data.name) != column:
            raise InputColumnsError(f"the input has column {str(data.name)!r}; {_expected(column)}")
        values = data
    elif isinstance(data, (list, tuple)) or (isinstance(data, np.ndarray) and data.ndim == 1):
        values = data
    else:
        kind = type(data.item() if isinstance(data, (np.ndarray, np.generic)) else data).__name__
        raise InvalidRequestError(f"expected a list of sentences (strings), got {kind}; {_expected(column)}")
    if isinstance(values, str) or (isinstance(values, np.ndarray) and values.ndim == 0):
        values = [values.item() if isinstance(values, np.ndarray) else values]  # {column: "one sentence"}
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return pd.DataFrame({column: pd.Series(_missing_to_none(items), dtype=object)})


def _describe(spec: ParamSpec) -> str:
    default = spec.default
    shown = str(default).lower() if isinstance(default, bool) else repr(default)
    return f"{spec.name} ({_KINDS.get(spec.dtype.name, spec.dtype.name)}, default {shown})"


def _has_type(value: Any, dtype: str) -> bool:
    if dtype == "boolean":
        return isinstance(value, (bool, np.bool_))
    if dtype in ("long", "integer"):
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if dtype == "string":
        return isinstance(value, str)
    return True  # other types: MLflow's own check


def check_params(params: Any, schema: ParamSchema | None) -> None:
    """Refuse request params that ``schema`` (the model's signature) does not declare, or whose
    value does not have the declared type; None means the default.

    Raises:
        UnknownParamError: a param not in ``schema`` (names it, lists those accepted).
        InvalidParamError: ``params`` is not a mapping, or a value of the wrong type.
    """
    specs = {spec.name: spec for spec in (schema.params if schema is not None else [])}
    accepted = ", ".join(_describe(s) for s in specs.values()) or "none"
    if params is None:
        return
    if not isinstance(params, dict):
        raise InvalidParamError(
            f"params must be an object of name → value, got {type(params).__name__}; this model "
            f"accepts {accepted}"
        )
    unknown = [str(name) for name in params if name not in specs]
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise UnknownParamError(
            f"unknown param{'s' if len(unknown) > 1 else ''} {names}; this model accepts {accepted}"
        )
    for name, value in params.items():
        spec = specs[name]
        if value is not None and not _has_type(value, spec.dtype.name):
            raise InvalidParamError(
                f"param {name} must be {_KINDS.get(spec.dtype.name, spec.dtype.name)}, got {value!r} "
                f"({type(value).__name__}); this model accepts {accepted}"
            )


def check_beam_size(beam_size: int | None, default: int) -> int:
    """The beam of a request: ``beam_size``, or ``default`` (the export's) when None.

    Raises:
        InvalidParamError: outside 1 to max(:data:`MAX_BEAM_SIZE`, ``default``) (names the bounds).
    """
    if beam_size is None:
        return int(default)
    high = max(MAX_BEAM_SIZE, int(default))
    if not 1 <= int(beam_size) <= high:
        raise InvalidParamError(
            f"param beam_size is {beam_size}; this model decodes with a beam of 1 to {high} "
            f"(1 is greedy; default {default})"
        )
    return int(beam_size)

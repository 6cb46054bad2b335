"""HTTP request bodies of the served model: what MLflow's scoring server would change unseen.

Before the model sees a request, MLflow's scoring server (3.17) turns every ``inputs`` or
``instances`` item into a string for a string column (``7`` → ``"7"``, ``null`` →
``"None"``), and pandas reads a ``text/csv`` body with rules of its own: a line with one
field more than the header gives its first field to the index (``A man, a dog.`` becomes
`` a dog.``), an empty line is skipped, and ``NA``, ``null``, ``None`` and the other
``pandas.read_csv`` missing-value markers become missing values. :func:`check_body` refuses
those bodies first, naming the item or the line and what to send instead; everything else
(bad JSON, a CSV pandas cannot read) is left to MLflow's own 400.
"""

from __future__ import annotations

import csv
import io
import json

from attnlab.serving.translator import InvalidRequestError

# pandas.read_csv's default na_values (its documentation): a field that is exactly one of these
# ("" is a quoted empty field, `""`) is read as a missing value.
CSV_NA_VALUES = frozenset(
    ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>"]
    + ["N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
)
JSON_HINT = 'send each sentence as a JSON string: {"inputs": ["sentence 1", "sentence 2", ...]}'


def _kind(item) -> str:
    return "null" if item is None else type(item).__name__


def check_json_body(body: bytes | str, column: str) -> None:
    """Refuse an ``inputs``/``instances`` item (or its ``column`` value) that is not a string.

    Raises:
        InvalidRequestError: names the item (index from 0) and its type.
    """
    try:
        request = json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError: MLflow answers them
        return
    if not isinstance(request, dict):
        return
    for key in ("inputs", "instances"):
        items = request.get(key)
        if isinstance(items, dict) and list(items) == [column]:  # {"inputs": {"text": [...]}}
            items = items[column]
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            value = item.get(column) if isinstance(item, dict) and key == "instances" else item
            if not isinstance(value, str):
                raise InvalidRequestError(f"input {i} is {_kind(value)}, not a string; {JSON_HINT}")


def check_csv_body(body: bytes | str, column: str) -> None:
    """Refuse a ``text/csv`` body (header ``column``) that pandas would read as other text.

    Raises:
        InvalidRequestError: a line with more than one field, an empty line between
            sentences, or a line that is a pandas missing-value marker (names the line,
            counting the header as line 1).
    """
    try:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
    except UnicodeDecodeError:  # MLflow answers it
        return
    lines = io.StringIO(text).readlines()  # as the reader reads them: line_num indexes them
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, None)
        if header != [column]:  # no header, or other columns: attnlab.serving.signature.input_frame
            return
        blank = None
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not lines[line - 1].strip()):  # pandas skips it
                blank = blank or line
                continue
            if blank is not None:
                raise InvalidRequestError(
                    f"text/csv line {blank} is empty (or spaces alone), and pandas skips such a line "
                    'without a word; leave it out, or send an empty sentence in JSON ("")'
                )
            if len(row) > 1:
                raise InvalidRequestError(
                    f"text/csv line {line} has {len(row)} fields, the header {column} one: quote a "
                    'sentence that holds a comma or a quote, as pandas.DataFrame.to_csv does ("A '
                    'man, a dog.")'
                )
            if row[0] in CSV_NA_VALUES:
                raise InvalidRequestError(
                    f"text/csv line {line} is {row[0]!r}, which pandas reads as a missing value, "
                    f"not text; {JSON_HINT}"
                )
    except csv.Error:  # a quote left open: pandas refuses it too, MLflow answers
        return


def check_body(body: bytes | str, content_type: str | None, column: str) -> None:
    """:func:`check_json_body` or :func:`check_csv_body`, by ``content_type``'s media type.

    Raises:
        InvalidRequestError: as those, or no ``Content-Type`` at all.
    """
    if not content_type:
        raise InvalidRequestError(
            "the request has no Content-Type header; send application/json "
            f'({{"inputs": [...]}}) or text/csv (a header line {column}, then one sentence a line)'
        )
    media_type = content_type.split(";")[0].strip().lower()
    if media_type == "application/json":
        check_json_body(body, column)
    elif media_type == "text/csv":
        check_csv_body(body, column)

"""The served model: export → MLflow pyfunc ("models from code") → registry → `mlflow models serve`.

A tiny Transformer learns the 48 sentence pairs of ``corpus_fixture`` (about
2 s on one thread), is exported with :mod:`attnlab.export.trace` (input limit 80
characters, beam 3, α = 1) and logged + registered twice by
:func:`attnlab.serving.registry.log_served_model` in a real temporary SQLite store, as two
runs of the export stage would: versions 1 and 2, the alias ``champion`` on 2.
The reference for every prediction is the export decoded the way
``src/translate.py`` decodes it (:func:`attnlab.inference.decoding.translate_text`).
"""

import io
import json
import re
import shutil
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import sentencepiece as spm
import torch
from mlflow.exceptions import MlflowException

from attnlab.data.tokenizer import train_sentencepiece
from attnlab.export.trace import export_translation
from attnlab.inference.decoding import translate_text
from attnlab.models.transformer import Transformer
from attnlab.serving.guard import INTERNAL_MESSAGE
from attnlab.serving.registry import CHAMPION, SERVE_WORKERS, log_served_model, serve_command
from attnlab.serving.translator import (
    EmptyRequestError,
    InputTooLongError,
    InvalidRequestError,
    InvalidTextError,
    RequestTooLargeError,
    Translator,
    load_translator,
)
from helpers.serve_harness import PAIRS, learned_transformer, post, start_server, stop_server

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_CHARS = 80
DECODING = {"beam_size": 3, "alpha": 1.0}
SOURCES = [en for en, _ in PAIRS[:6]]
TOO_LONG = ("a dog watches the sea and " * 4)[: MAX_CHARS + 1]  # one sentence of 81 characters
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Export, log and register the model; yield facts about the temporary store."""
    tmp = tmp_path_factory.mktemp("serving")
    sp = train_sentencepiece([s for pair in PAIRS for s in pair], tmp / "spm", vocab_size=120)
    export_dir = export_translation(
        learned_transformer(sp),
        tmp / "spm.model",
        tmp / "export",
        {"model": "transformer", "decoding": DECODING},
        MAX_CHARS,
        ctranslate2=["float32"],
    )
    uri = f"sqlite:///{tmp}/mlflow.db"  # tmp is absolute: sqlite:////…
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)  # restored afterwards, whatever log_served_model sets
        client = mlflow.MlflowClient(uri)
        experiment = client.create_experiment("attnlab", artifact_location=str(tmp / "mlruns"))
        run_id = client.create_run(experiment, tags={"model": "transformer"}).info.run_id
        client.set_terminated(run_id)  # a finished training run, as train.py leaves it
        t0 = time.perf_counter()
        name, version = log_served_model(export_dir, "transformer", run_id, uri)
        log_s = time.perf_counter() - t0
        alias_after_first = client.get_model_version_by_alias(name, CHAMPION).version
        second = log_served_model(export_dir, "transformer", run_id, uri)  # the stage re-run
        init_state, step, tok, _ = load_translator(export_dir)
        expected = translate_text(init_state, step, tok, SOURCES, **DECODING)
        yield {
            "uri": uri,
            "run_id": run_id,
            "name": name,
            "version": version,
            "client": client,
            "second": second,
            "alias_after_first": alias_after_first,
            "expected": expected,
            "log_s": log_s,
            "tmp": tmp,
            "export_dir": export_dir,
        }
        mlflow.set_tracking_uri(None)


def test_registered_once_per_architecture_in_the_training_run(store):
    assert (store["name"], store["version"]) == ("attnlab-transformer", 1)
    client = store["client"]
    mv = client.get_model_version("attnlab-transformer", "1")
    assert mv.run_id == store["run_id"]
    assert f"at most {MAX_CHARS} characters" in mv.description
    assert mv.description.endswith(
        f"Serve: MLFLOW_TRACKING_URI={store['uri']} mlflow models serve -m models:/attnlab-transformer/1 -w 2"
    )
    assert client.get_run(store["run_id"]).info.status == "FINISHED"  # resumed, not failed
    print(f"log + load-back check + register: {store['log_s']:.1f} s")


def test_champion_alias_follows_the_newest_version(store):
    client = store["client"]
    assert int(store["alias_after_first"]) == 1
    assert store["second"] == ("attnlab-transformer", 2)
    assert int(client.get_model_version_by_alias("attnlab-transformer", CHAMPION).version) == 2
    assert {k: int(v) for k, v in client.get_registered_model("attnlab-transformer").aliases.items()} == {
        CHAMPION: 2
    }
    model = mlflow.pyfunc.load_model(f"models:/attnlab-transformer@{CHAMPION}")
    assert model.predict(SOURCES) == store["expected"]
    # what the export stage prints: the champion, in this environment, as the README serves it
    served = (
        f"MLFLOW_TRACKING_URI={store['uri']} mlflow models serve -m models:/attnlab-transformer@champion -w 2"
    )
    assert serve_command("attnlab-transformer", store["uri"]) == f"{served} -p 5001 --env-manager local"
    # the registry's description: the model's own environment, built from its requirements.txt
    assert serve_command("attnlab-transformer", store["uri"], local=False) == served


def test_pyfunc_translates_like_translate_py(store):
    # The learned model reproduces its training targets, so the reference is real French.
    assert store["expected"] == [fr for _, fr in PAIRS[:6]]
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    assert model.predict(SOURCES) == store["expected"]
    assert model.predict(pd.DataFrame({"text": SOURCES})) == store["expected"]  # one column
    assert model.predict(["", SOURCES[0], "   "]) == ["", store["expected"][0], ""]
    # Nothing to translate (invisible characters that strip() keeps, DEL, NUL): "" without decoding
    nothing = ["\u200b", "\ufeff", "\u200e\u200f", "\x7f", "\u2060", "\x00"]
    assert model.predict(nothing + [SOURCES[0]]) == [""] * len(nothing) + [store["expected"][0]]
    # An input of several sentences: each translated, joined with the input's own separators
    both = f"{SOURCES[0]}  {SOURCES[1]}\n{SOURCES[2]}"
    assert model.predict([both]) == [
        f"{store['expected'][0]}  {store['expected'][1]}\n{store['expected'][2]}"
    ]
    assert model.metadata.metadata["max_input_chars"] == MAX_CHARS
    assert model.metadata.get_input_schema().input_types()[0].name == "string"
    assert model.metadata.get_input_schema().input_names() == ["text"]  # one column, named text


def test_pyfunc_returns_alignments_only_when_asked(store):
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    params = model.metadata.get_params_schema().params
    assert [(p.name, p.dtype.name, p.default) for p in params] == [
        ("alignments", "boolean", False),
        ("details", "boolean", False),
        ("engine", "string", "torch"),
        ("beam_size", "long", DECODING["beam_size"]),  # the export's
    ]
    expected = [t.as_json() for t in Translator(store["export_dir"]).align(SOURCES[:2])]
    assert model.predict(SOURCES[:2], params={"alignments": True}) == expected
    assert [t["translation"] for t in expected] == store["expected"][:2]
    assert [[s["translation"] for s in t["sentences"]] for t in expected] == [
        [e] for e in store["expected"][:2]
    ]
    assert model.predict(SOURCES[:2], params={"alignments": False}) == store["expected"][:2]
    # details: each input's sentences and their translations, without the attention
    two = f"{SOURCES[0]} {SOURCES[1]}"
    assert model.predict([two], params={"details": True}) == [
        {
            "translation": f"{store['expected'][0]} {store['expected'][1]}",
            "sentences": [
                {"source": SOURCES[0], "translation": store["expected"][0]},
                {"source": SOURCES[1], "translation": store["expected"][1]},
            ],
        }
    ]


def test_pyfunc_refuses_input_over_the_limit(store):
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    assert len(model.predict([TOO_LONG[:MAX_CHARS]])) == 1  # exactly the limit is accepted
    with pytest.raises(
        MlflowException, match=f"input 1 has {MAX_CHARS + 1} characters.*at most {MAX_CHARS} characters"
    ) as e:
        model.predict([SOURCES[0], TOO_LONG])
    assert e.value.error_code == "INVALID_PARAMETER_VALUE"


def test_export_stores_the_request_limits(store):
    # conf/config.yaml's defaults, through export_translation's, into config.json and MLflow.
    serving = json.loads((store["export_dir"] / "config.json").read_text())["serving"]
    assert serving == {
        "max_input_chars": MAX_CHARS,
        "max_input_tokens": 511,  # 512 positions − <eos>
        "max_request_sentences": 32,
        "max_request_chars": 4000,
        "max_request_tokens": 1000,
    }
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    assert {k: model.metadata.metadata[k] for k in serving} == serving
    description = store["client"].get_model_version("attnlab-transformer", "1").description
    assert "per request 1 to 32 sentences, at most 4000 characters and 1000 tokens" in description


def test_check_request_names_the_problem_and_decodes_nothing(store, monkeypatch):
    tr = Translator(store["export_dir"])
    tr.max_request_chars = 2000  # 32 sentences of 80 characters cannot reach the default 4,000
    monkeypatch.setattr(tr, "_decode", lambda *a: pytest.fail("decoded a refused request"))
    cases = [
        ([], EmptyRequestError, "the request has no sentences (an empty list); send at least one"),
        ("A dog.", InvalidRequestError, "expected a list of sentences (strings), got str"),
        (["A dog.", 7], InvalidRequestError, "input 1 is int, not a string"),
        ([None], InvalidRequestError, "input 0 is null, not a string"),
        (
            ["A dog."] * 33,
            RequestTooLargeError,
            "the request has 33 sentences; this model translates at most 32 sentences per request "
            "(serving.max_request_sentences). Split it into 2 or more requests of at most 32 "
            "sentences each.",
        ),
        (
            [("A dog. " * 12)[:MAX_CHARS]] * 26,
            RequestTooLargeError,  # with the limit at 2,000
            "the request has 2080 characters in its 26 sentences; this model translates at most "
            "2000 characters per request (serving.max_request_chars). Split it into requests of at "
            "most 2000 characters (and 32 sentences) each.",
        ),
        ([SOURCES[0], TOO_LONG], InputTooLongError, f"input 1 has {MAX_CHARS + 1} characters"),
        (
            [SOURCES[0], "A \ud800 dog."],  # JSON's "\ud800": half of a UTF-16 pair
            InvalidTextError,
            "input 1 holds U+D800 at character 2, a lone surrogate, which is not text",
        ),
        (["A caf\udce9."], InvalidTextError, "input 0 holds U+DCE9 at character 5"),  # surrogateescape
    ]
    for sentences, error, message in cases:
        with pytest.raises(error) as e:
            tr.serve(sentences)
        assert message in str(e.value), (sentences, str(e.value))
    # Token-dense text: under the character limit, over the token limit.
    dense = [("eaoinst" * 12)[:MAX_CHARS]] * 25  # 2,000 characters, 81 tokens each
    tokens = sum(map(len, tr.tokenizer.encode(dense)))
    assert tokens > 1000
    with pytest.raises(
        RequestTooLargeError,
        match=f"the request has {tokens} sentencepiece tokens "
        r"in its 25 sentences; this model decodes at most 1000 tokens per request "
        r"\(serving.max_request_tokens",
    ):
        tr.serve(dense)
    tr.check_request((SOURCES * 6)[:32])  # exactly at the sentence limit: accepted


def test_pyfunc_refuses_an_empty_request(store):
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    with pytest.raises(MlflowException, match="the request has no sentences") as e:
        model.predict([])
    assert e.value.error_code == "INVALID_PARAMETER_VALUE"


def test_export_refuses_request_limits_a_sentence_cannot_fit(store, tmp_path):
    sp_path = store["tmp"] / "spm.model"
    net = Transformer(
        spm.SentencePieceProcessor(model_file=str(sp_path)).get_piece_size(), 8, 2, 1, 16, 0.0
    )  # 512 positions: 511 source tokens
    for kwargs, message in [
        (
            {"max_request_chars": MAX_CHARS - 1},
            "serving.max_request_chars (79) is below serving.max_input_chars (80)",
        ),
        (
            {"max_request_tokens": 510},
            "serving.max_request_tokens (510) is below the 511 tokens "
            "one sentence may have (max_input_tokens)",
        ),
        ({"max_request_sentences": 0}, "serving.max_request_sentences must be ≥ 1, got 0"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            export_translation(net, sp_path, tmp_path / "x", {"model": "transformer"}, MAX_CHARS, **kwargs)
        assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def served(store):
    """``mlflow models serve`` of the champion with the README's workers; yields its base URL
    and its log file."""
    log = store["tmp"] / "serve.log"
    t0 = time.perf_counter()
    server, base = start_server(
        f"models:/attnlab-transformer@{CHAMPION}", store["uri"], log, workers=SERVE_WORKERS
    )
    try:
        yield {"base": base, "log": log, "up_s": time.perf_counter() - t0}
    finally:
        stop_server(server)


def test_mlflow_models_serve_answers_requests(store, served):
    base = served["base"]
    status, body = post(f"{base}/invocations", {"inputs": SOURCES + [""]})
    assert status == 200, body
    assert body == {"predictions": store["expected"] + [""]}

    two = [f"{SOURCES[0]} {SOURCES[1]}", SOURCES[2]]  # two sentences in the first input
    status, body = post(f"{base}/invocations", {"inputs": two, "params": {"alignments": True}})
    assert status == 200, body
    expected = [t.as_json() for t in Translator(store["export_dir"]).align(two)]
    want = store["expected"]
    assert [t["translation"] for t in body["predictions"]] == [f"{want[0]} {want[1]}", want[2]]
    assert [[s["source"] for s in t["sentences"]] for t in body["predictions"]] == [SOURCES[:2], SOURCES[2:3]]
    for got_input, want_input in zip(body["predictions"], expected):
        for got, want in zip(got_input["sentences"], want_input["sentences"]):  # JSON floats: float32 eps
            assert {k: v for k, v in got.items() if k not in ("alignment", "attention")} == {
                k: v for k, v in want.items() if k not in ("alignment", "attention")
            }
            for key in ("alignment", "attention"):
                assert torch.allclose(torch.tensor(got[key]), torch.tensor(want[key]), atol=1e-7)

    status, body = post(f"{base}/invocations", {"inputs": SOURCES, "params": {"engine": "ctranslate2"}})
    assert status == 200, body
    assert body == {"predictions": Translator(store["export_dir"], engine="ctranslate2")(SOURCES)}
    status, body = post(f"{base}/invocations", {"inputs": SOURCES, "params": {"engine": "ctranslate2_int8"}})
    assert status == 400 and "'ctranslate2_int8' is not in this export" in body["message"]

    status, body = post(f"{base}/invocations", {"inputs": [SOURCES[0], TOO_LONG]})
    assert status == 400
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    assert f"at most {MAX_CHARS} characters" in body["message"]

    status, body = post(f"{base}/invocations", {"inputs": []})  # MLflow alone answers 200 []
    assert status == 400 and "the request has no sentences" in body["message"]
    print(f"server up in {served['up_s']:.1f} s")


# --- The signature: one string column `text`, the declared params, nothing else -------------

ACCEPTED = (
    "this model accepts alignments (true or false, default false), details (true or false, default "
    "false), engine (a string, default "
    "'torch'), beam_size (an integer, default 3)"
)
ONE_COLUMN = "this model takes one string column, named 'text'"
# Nonsense for the tiny model: beam 3 (the export's) and beam 1 (greedy) translate these differently.
BEAM_DIFFERS = ["car ball likes car.", "a car.", "man red Two."]


def test_pyfunc_takes_a_list_or_the_column_text_and_refuses_other_columns(store):
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    expected = store["expected"]
    assert model.predict(SOURCES) == expected
    assert model.predict(pd.DataFrame({"text": SOURCES})) == expected
    assert model.predict(pd.Series(SOURCES, name="text")) == expected
    assert model.predict({"text": SOURCES}) == expected  # MLflow alone: one row holding the list
    for data, message in [
        # MLflow alone translates `en` (the first string column) and drops `en2` without a word
        (pd.DataFrame({"en": SOURCES, "en2": SOURCES}), "the input has columns 'en', 'en2'; "),
        (pd.DataFrame({"text": SOURCES, "en2": SOURCES}), "the input has columns 'text', 'en2'; "),
        (pd.DataFrame({"en": SOURCES}), "the input has column 'en'; "),
        (pd.Series(SOURCES, name="en"), "the input has column 'en'; "),
        (pd.DataFrame(), "the input has no column; "),
        (SOURCES[0], "expected a list of sentences (strings), got str; "),
    ]:
        with pytest.raises(MlflowException) as e:
            model.predict(data)
        assert e.value.error_code == "INVALID_PARAMETER_VALUE"
        assert str(e.value).startswith(message + ONE_COLUMN), str(e.value)


def test_pyfunc_accepts_the_declared_params_and_refuses_any_other(store):
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    greedy = Translator(store["export_dir"], beam_size=1)(BEAM_DIFFERS)
    assert greedy != Translator(store["export_dir"])(BEAM_DIFFERS)  # else this test proves nothing
    assert model.predict(BEAM_DIFFERS, params={"beam_size": 1}) == greedy
    assert model.predict(BEAM_DIFFERS, params={"beam_size": None}) == model.predict(BEAM_DIFFERS)
    assert model.predict(BEAM_DIFFERS, params={"beam_size": 16}) == Translator(
        store["export_dir"], beam_size=16
    )(BEAM_DIFFERS)  # the upper bound
    for params, message in [
        ({"beam": 1}, "unknown param 'beam'; " + ACCEPTED),  # MLflow alone: ignored, beam 3
        ({"beam": 1, "alpha": 0.5}, "unknown params 'beam', 'alpha'; " + ACCEPTED),
        (
            {"beam_size": 0},
            "param beam_size is 0; this model decodes with a beam of 1 to 16 (1 is greedy; default 3)",
        ),
        ({"beam_size": 17}, "param beam_size is 17; this model decodes with a beam of 1 to 16"),
        ({"beam_size": "1"}, "param beam_size must be an integer, got '1' (str); " + ACCEPTED),
        ({"beam_size": True}, "param beam_size must be an integer, got True (bool)"),
        ({"alignments": "yes"}, "param alignments must be true or false, got 'yes' (str)"),
        ({"engine": "marian"}, "engine 'marian' is not an engine; this model has torch, ctranslate2"),
        (["beam_size", 1], "params must be an object of name → value, got list; " + ACCEPTED),
    ]:
        with pytest.raises(MlflowException) as e:
            model.predict(SOURCES[:1], params=params)
        assert e.value.error_code == "INVALID_PARAMETER_VALUE"
        assert str(e.value).startswith(message), str(e.value)


def _one_line_error(served: dict, store: dict, status: int, body, expected_status: int = 400) -> str:
    """Check an error answer of the served model; return its message without the error id.

    One JSON object {error_code, message, error_id}; the message is one line ending in
    "(error id <12 hex>)"; no traceback and no file of the server anywhere in the body; the
    server's log has that id, then the traceback.
    """
    assert status == expected_status, body
    assert isinstance(body, dict) and set(body) == {"error_code", "message", "error_id"}, body
    error_id, message = body["error_id"], body["message"]
    assert re.fullmatch(r"[0-9a-f]{12}", error_id), error_id
    assert "\n" not in message and message.endswith(f" (error id {error_id})"), message
    text = json.dumps(body, ensure_ascii=False)
    for leak in ("Traceback", "stack_trace", 'File "', ".py", str(store["tmp"]), sys.prefix, str(ROOT)):
        assert leak not in text, (leak, text)
    log = served["log"].read_text()
    entry = log[log.index(f"error id {error_id}") :]
    entry = entry[: entry.find("error id ", 1)] if "error id " in entry[1:] else entry
    assert "Traceback (most recent call last)" in entry, entry[:2000]
    return message.removesuffix(f" (error id {error_id})")


def test_served_model_answers_every_content_type_mlflow_serves(store, served):
    url, want = f"{served['base']}/invocations", {"predictions": store["expected"]}
    frame = pd.DataFrame({"text": SOURCES})
    parquet = io.BytesIO()
    frame.to_parquet(parquet)
    for payload, content_type in [
        ({"inputs": SOURCES}, "application/json"),
        ({"inputs": {"text": SOURCES}}, "application/json"),
        ({"instances": SOURCES}, "application/json"),
        ({"instances": [{"text": s} for s in SOURCES]}, "application/json"),
        ({"dataframe_split": {"columns": ["text"], "data": [[s] for s in SOURCES]}}, "application/json"),
        ({"dataframe_records": frame.to_dict(orient="records")}, "application/json; charset=utf-8"),
        (frame.to_csv(index=False), "text/csv"),
        (frame.to_csv(index=False, lineterminator="\r\n"), "text/csv; charset=utf-8"),
        (parquet.getvalue(), "application/vnd.apache.parquet"),
    ]:
        assert post(url, payload, content_type=content_type) == (200, want), (payload, content_type)
    # the how-to's curl (docs/how-to/serve.md): a quoted sentence holds a comma
    csv_body = 'text\nA man rides a bike.\n"A man, a dog."\n'
    want = {"predictions": Translator(store["export_dir"])(["A man rides a bike.", "A man, a dog."])}
    assert post(url, csv_body, content_type="text/csv") == (200, want)
    # CSV as pandas.DataFrame.to_csv writes it: a comma or a quote inside a quoted field
    hard = ["A man, a dog.", 'A dog "sees" a ball.']
    status, body = post(url, pd.DataFrame({"text": hard}).to_csv(index=False), content_type="text/csv")
    assert (status, body) == (200, {"predictions": Translator(store["export_dir"])(hard)})


def test_served_model_refuses_what_its_signature_does_not_declare(store, served):
    url = f"{served['base']}/invocations"
    json_type, csv_type = "application/json", "text/csv"
    cases = [
        # MLflow alone: 200, `en` translated and `en2` dropped
        (
            {"dataframe_split": {"columns": ["en", "en2"], "data": [[SOURCES[0], SOURCES[1]]]}},
            json_type,
            "the input has columns 'en', 'en2'; " + ONE_COLUMN,
        ),
        (
            {"dataframe_records": [{"text": SOURCES[0], "en2": SOURCES[1]}]},
            json_type,
            "the input has columns 'text', 'en2'; " + ONE_COLUMN,
        ),
        # MLflow alone: 200 with 2 translations, the first line read as the header
        ("\n".join(SOURCES[:3]) + "\n", csv_type, f"the input has column {SOURCES[0]!r}; " + ONE_COLUMN),
        (f"text,en2\n{SOURCES[0]},{SOURCES[1]}\n", csv_type, "the input has columns 'text', 'en2'; "),
        ("text\nA man, a dog.\n", csv_type, "text/csv line 2 has 2 fields, the header text one: quote"),
        (
            "text\nA dog.\n\nA cat.\n",
            csv_type,
            "text/csv line 3 is empty (or spaces alone), and pandas skips",
        ),
        ("text\nA dog.\n   \nA cat.\n", csv_type, "text/csv line 3 is empty (or spaces alone)"),
        ('text\nA dog.\n""\n', csv_type, "text/csv line 3 is '', which pandas reads as a missing value"),
        ("text\nA dog.\nNA\n", csv_type, "text/csv line 3 is 'NA', which pandas reads as a missing value"),
        ({"inputs": [SOURCES[0], 7]}, json_type, "input 1 is int, not a string"),  # MLflow alone: "7"
        ({"inputs": [None]}, json_type, "input 0 is null, not a string"),  # MLflow alone: "None"
        ({"instances": [{"text": 7}]}, json_type, "input 0 is int, not a string"),
        ({"inputs": SOURCES[:1], "params": {"beam": 1}}, json_type, "unknown param 'beam'; " + ACCEPTED),
        (
            {"inputs": SOURCES[:1], "params": {"beam_size": 17}},
            json_type,
            "param beam_size is 17; this model decodes with a beam of 1 to 16",
        ),
        ({"inputs": ["A \ud800 dog."]}, json_type, "input 0 holds U+D800 at character 2, a lone surrogate"),
        ({"inputs": [SOURCES[0], TOO_LONG]}, json_type, f"input 1 has {MAX_CHARS + 1} characters"),
        # MLflow's own refusals, without its stack trace or its dump of the request
        (b'{"inputs": ["A dog runs.",', json_type, "Invalid input. Ensure that input is a valid JSON"),
        ("", csv_type, "Failed to parse input as a Pandas DataFrame"),
        (b"not parquet", "application/vnd.apache.parquet", "Failed to parse input as a Pandas DataFrame"),
    ]
    for payload, content_type, message in cases:
        status, body = post(url, payload, content_type=content_type)
        got = _one_line_error(served, store, status, body)
        assert got.startswith(message), (payload, got)
        assert body["error_code"] in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST"), body


def test_served_beam_size_decodes_like_a_translator_with_that_beam(store, served):
    url = f"{served['base']}/invocations"
    greedy = Translator(store["export_dir"], beam_size=1)(BEAM_DIFFERS)
    assert greedy != Translator(store["export_dir"])(BEAM_DIFFERS)
    assert post(url, {"inputs": BEAM_DIFFERS, "params": {"beam_size": 1}}) == (200, {"predictions": greedy})
    status, body = post(url, {"inputs": BEAM_DIFFERS[:1], "params": {"beam_size": 1, "alignments": True}})
    assert status == 200 and body["predictions"][0]["translation"] == greedy[0]


def test_an_internal_fault_is_a_500_with_an_id_and_its_trace_in_the_log(store, tmp_path):
    # A model folder served in place; its CTranslate2 model loads on first use, so deleting it
    # after the server started is a real fault inside predict.
    model_dir = Path(
        mlflow.artifacts.download_artifacts("models:/attnlab-transformer/1", dst_path=str(tmp_path / "model"))
    )
    log = tmp_path / "serve.log"
    server, base = start_server(str(model_dir), store["uri"], log)
    try:
        shutil.rmtree(model_dir / "artifacts" / "export" / "ctranslate2")
        status, body = post(
            f"{base}/invocations", {"inputs": SOURCES[:1], "params": {"engine": "ctranslate2"}}
        )
        served = {"log": log}
        assert _one_line_error(served, {"tmp": tmp_path}, status, body, 500) == INTERNAL_MESSAGE
        assert body["error_code"] == "INTERNAL_ERROR"
        entry = log.read_text()[log.read_text().index(f"error id {body['error_id']}") :]
        assert "ctranslate2" in entry  # the cause, for whoever reads the log
        # the server answers the next request
        assert post(f"{base}/invocations", {"inputs": SOURCES[:1]}) == (
            200,
            {"predictions": store["expected"][:1]},
        )
    finally:
        stop_server(server)

"""The served model: export → MLflow pyfunc ("models from code") → registry → `mlflow models serve`.

A tiny Transformer learns the 48 sentence pairs of ``corpus_fixture`` (about
2 s on one thread), is exported with :mod:`attnlab.export.trace` (input limit 80
characters, beam 3, α = 1) and logged + registered twice by
:func:`attnlab.serving.registry.log_served_model` in a real temporary SQLite store, as two
runs of the export stage would: versions 1 and 2, the alias ``champion`` on 2.
The reference for every prediction is the export decoded the way
``src/translate.py`` decodes it (:func:`attnlab.inference.decoding.translate_text`).
"""

import json
import time

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
from attnlab.serving.registry import CHAMPION, log_served_model, serve_command
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
TOO_LONG = ("A dog watches the sea. " * 4)[: MAX_CHARS + 1]  # 81 characters


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
        f"Serve: MLFLOW_TRACKING_URI={store['uri']} mlflow models serve -m models:/attnlab-transformer/1"
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
    # what the export stage prints: the champion, in the model's own environment
    assert serve_command("attnlab-transformer", store["uri"]) == (
        f"MLFLOW_TRACKING_URI={store['uri']} mlflow models serve -m models:/attnlab-transformer@champion"
    )


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
    assert model.metadata.metadata["max_input_chars"] == MAX_CHARS
    assert model.metadata.get_input_schema().input_types()[0].name == "string"


def test_pyfunc_returns_alignments_only_when_asked(store):
    model = mlflow.pyfunc.load_model("models:/attnlab-transformer/1")
    params = model.metadata.get_params_schema().params
    assert [(p.name, p.dtype.name, p.default) for p in params] == [
        ("alignments", "boolean", False),
        ("engine", "string", "torch"),
    ]
    expected = [a.as_json() for a in Translator(store["export_dir"]).align(SOURCES[:2])]
    assert model.predict(SOURCES[:2], params={"alignments": True}) == expected
    assert [a["translation"] for a in expected] == store["expected"][:2]
    assert model.predict(SOURCES[:2], params={"alignments": False}) == store["expected"][:2]


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
    monkeypatch.setattr(tr, "_decode", lambda s: pytest.fail("decoded a refused request"))
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


def test_mlflow_models_serve_answers_requests(store):
    t0 = time.perf_counter()
    server, base = start_server(
        f"models:/attnlab-transformer@{CHAMPION}", store["uri"], store["tmp"] / "serve.log"
    )
    up_s = time.perf_counter() - t0
    try:
        status, body = post(f"{base}/invocations", {"inputs": SOURCES + [""]})
        assert status == 200, body
        assert body == {"predictions": store["expected"] + [""]}

        status, body = post(f"{base}/invocations", {"inputs": SOURCES[:2], "params": {"alignments": True}})
        assert status == 200, body
        expected = [a.as_json() for a in Translator(store["export_dir"]).align(SOURCES[:2])]
        assert [a["translation"] for a in body["predictions"]] == store["expected"][:2]
        for got, want in zip(body["predictions"], expected):  # JSON floats: equal to float32 eps
            assert {k: v for k, v in got.items() if k not in ("alignment", "attention")} == {
                k: v for k, v in want.items() if k not in ("alignment", "attention")
            }
            for key in ("alignment", "attention"):
                assert torch.allclose(torch.tensor(got[key]), torch.tensor(want[key]), atol=1e-7)

        status, body = post(f"{base}/invocations", {"inputs": SOURCES, "params": {"engine": "ctranslate2"}})
        assert status == 200, body
        assert body == {"predictions": Translator(store["export_dir"], engine="ctranslate2")(SOURCES)}
        status, body = post(
            f"{base}/invocations", {"inputs": SOURCES, "params": {"engine": "ctranslate2_int8"}}
        )
        assert status == 400 and "'ctranslate2_int8' is not in this export" in body["message"]

        status, body = post(f"{base}/invocations", {"inputs": [SOURCES[0], TOO_LONG]})
        assert status == 400
        assert body["error_code"] == "INVALID_PARAMETER_VALUE"
        assert f"at most {MAX_CHARS} characters" in body["message"]

        status, body = post(f"{base}/invocations", {"inputs": []})  # MLflow alone answers 200 []
        assert status == 400 and "the request has no sentences" in body["message"]
        print(f"server up in {up_s:.1f} s")
    finally:
        stop_server(server)

"""benchmarks/scoring_throughput.py: its hand-counted multiply-adds, and the results file it writes
(results/scoring_speed.csv), read back by scripts/results_tables.py. No timing is asserted."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load(ROOT / "benchmarks" / "scoring_throughput.py", "scoring_throughput")
rt = _load(ROOT / "scripts" / "results_tables.py", "results_tables_for_benchmarks")


def test_multiply_adds_are_counted_as_by_hand():
    # B=2, Q=1, K=3, d=h=4, keys projected once per sentence (Bahdanau's decoder step):
    # additive W_q q 2·1·4·4 = 32, w_vᵀ tanh 2·1·3·4 = 24, weights × values 2·1·3·4 = 24 → 80;
    # dot Q Kᵀ 24 + weights × values 24 → 48
    assert bench.layer_macs(2, 1, 3, 4, 4, keys_projected=True) == {"additive": 80, "dot": 48}
    # every position a query (Q = K = 3), keys projected in the layer: + W_k k 2·3·4·4 = 96 and
    # W_q q 96, w_v 2·3·3·4 = 72, weights × values 72 → 336; dot 72 + 72 = 144
    assert bench.layer_macs(2, 3, 3, 4, 4, keys_projected=False) == {"additive": 336, "dot": 144}


def test_the_benchmark_records_rows_the_results_tables_render(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    path = tmp_path / rt.SPEED_CSV
    args = ["--batch", "2", "--len", "4", "--d", "8", "--vocab", "50", "--rounds", "1", "--steps", "1"]
    result = bench.main([*args, "--record", str(path), "--machine", "xeon-amx", "--concurrent", "pytest"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["bahdanau_train_step"] == pytest.approx(
        result["bahdanau_train_step"]
    )
    bench.main([*args, "--record", str(path), "--machine", "xeon-amx"])  # appends, one header
    assert bench.RECORD_COLUMNS == rt.SPEED_COLUMNS
    rows = rt._speed(tmp_path)
    assert [r["case"] for r in rows] == [*bench.CASES, *bench.CASES]
    first = rows[0]
    assert (first["machine"], first["concurrent"], first["batch"], first["len"], first["d"]) == (
        "xeon-amx", "pytest", "2", "4", "8",
    )  # fmt: skip
    assert float(first["time_ratio"]) == pytest.approx(
        float(first["additive_ms"]) / float(first["dot_ms"]), rel=1e-3
    )
    # Bahdanau with dot scoring has no attention parameters: W_q, W_k (h × h) and w_v (h) fewer
    h = 256  # conf/model/bahdanau.yaml's num_hiddens
    step = result["bahdanau_train_step"]
    assert step["additive_params"] - step["dot_params"] == 2 * h * h + h
    page = rt.render_index([], [], speed=rows)
    assert "### Additive against dot-product scoring: time" in page
    assert f"| {rt.SPEED_CASES['layer_one_query']} | 2 × 4, d 8 |" in page


def test_a_malformed_speed_file_stops_the_generator(tmp_path):
    (tmp_path / "results").mkdir()
    path = tmp_path / rt.SPEED_CSV
    good = {**dict.fromkeys(rt.SPEED_COLUMNS, "1"), "case": "layer_one_query"}
    rt.write_csv(path, rt.SPEED_COLUMNS, [{**good, "case": "warp"}])
    with pytest.raises(ValueError, match=r"scoring_speed.csv:2: case 'warp' is none of"):
        rt._speed(tmp_path)
    rt.write_csv(path, rt.SPEED_COLUMNS, [good, {**good, "dot_ms": "0"}])
    with pytest.raises(ValueError, match=r"scoring_speed.csv:3: dot_ms '0' is no positive number"):
        rt._speed(tmp_path)
    rt.write_csv(path, ["case", "ms"], [])
    with pytest.raises(ValueError, match="columns"):
        rt._speed(tmp_path)
    with pytest.raises(ValueError, match="expected"):
        bench.record({}, path, "xeon-amx", "nothing")  # a file of other columns is not appended to


def test_the_corpus_scale_benchmark_runs_at_a_tiny_size(tmp_path, capsys, monkeypatch):
    """benchmarks/corpus_scale.py at 2,000 pairs (tokenize and training subprocesses): the keys of
    its last line, figures that make sense, and the row it records. No timing is asserted."""
    import csv
    import sys

    corpus_scale = _load(ROOT / "benchmarks" / "corpus_scale.py", "corpus_scale")
    monkeypatch.setitem(sys.modules, "corpus_scale", corpus_scale)  # its process pool pickles its functions
    assert [corpus_scale.parse_size(s) for s in ("2000", "100k", "0.1M", "5M")] == [
        2000,
        100_000,
        100_000,
        5_000_000,
    ]
    record = tmp_path / "corpus_scale.csv"
    args = ["--sizes", "2000", "--workdir", str(tmp_path / "work"), "--steps", "2", "--loader-batches", "5"]
    result = corpus_scale.main(
        [*args, "--encode-sentences", "2000", "--record", str(record), "--machine", "xeon-amx"]
    )
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (
        printed.keys()
        == result.keys()
        >= {"sizes", "tokenize_rss_ratio", "train_rss_ratio", "encoding", "cpu_flags"}
    )
    (row,) = printed["sizes"]
    held_out = 2 * 100  # val and test: 2000 // 20 pairs each
    assert row["pairs"] == 2000 and row["train_pairs"] == row["train_pairs_kept"] == 2000 - held_out
    positive = ("tokenize_pairs_per_s", "tokenize_rss_mb", "train_rss_mb", "first_batch_s", "model_step_ms")
    for key in (*positive, "loader_batches_per_s"):
        assert row[key] > 0, key
    assert 20 < row["tokenize_rss_mb"] < 4000 and 50 < row["train_rss_mb"] < 8000  # MiB, not KiB or bytes
    assert printed["tokenize_rss_ratio"] == printed["train_rss_ratio"] == 1.0  # one size: itself
    encoding = printed["encoding"]
    assert (
        encoding["sentences"] == 2000
        and encoding["threads_1_sentences_per_s"] > 0 < encoding["processes_vs_1"]
    )
    (recorded,) = list(csv.DictReader(record.open(encoding="utf-8")))
    assert list(recorded) == corpus_scale.RECORD_COLUMNS
    assert (recorded["machine"], recorded["pairs"]) == ("xeon-amx", "2000")
    assert float(recorded["tokenize_s"]) == pytest.approx(row["tokenize_s"], rel=1e-3)


def test_serve_load_records_rows_the_results_tables_read(tmp_path):
    serve_load = _load(ROOT / "benchmarks" / "serve_load.py", "serve_load")
    assert serve_load.RECORD_COLUMNS == rt.SERVE_COLUMNS
    (tmp_path / "results").mkdir()
    level = {
        "p50_ms": 100.0, "p95_ms": 150.0, "p99_ms": 190.0, "wrong_answers": 0,
        "by_status": {"200": 9, "400": 3},
    }  # fmt: skip
    result = {
        "model": "models:/attnlab-transformer/3", "engine": "torch", "beam_size": 5, "workers": 2,
        "threads_per_worker": 1, "offline_sentences_per_s": 200.0, "clients": 8,
        "by_status": {"200": 30, "504": 1}, "saturation_requests_per_s": 10.0, "sentences_per_s": 170.0,
        "served_vs_offline": 0.85, "wrong_answers": 0, "rss_growth": 0.01,
        **{k: v for k, v in level.items() if k.startswith("p")},
        "by_load": [{**level, "fraction": 0.5, "requests_per_s": 5.0, "sentences_per_s": 85.0}],
    }  # fmt: skip
    serve_load.record(result, tmp_path / rt.SERVE_CSV, "xeon-amx", "pytest", "this change")
    rows = rt._serve(tmp_path)
    assert [(r["load"], r["status_5xx"], r["served_vs_offline"]) for r in rows] == [
        ("saturation (8 closed-loop clients)", "1", "0.85"),
        ("0.5 of saturation (open loop)", "0", ""),
    ]
    assert {(r["machine"], r["workers"], r["served_code"], r["sentences_per_s"]) for r in rows} == {
        ("xeon-amx", "2", "this change", "170.0"), ("xeon-amx", "2", "this change", "85.0"),
    }  # fmt: skip

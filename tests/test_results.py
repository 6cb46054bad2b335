"""Results as data: results/*.csv, and the tables scripts/results_tables.py writes from them
(README.md between its results markers, docs/results/*.md)."""

import csv
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("results_tables", ROOT / "scripts" / "results_tables.py")
assert _spec and _spec.loader
rt = importlib.util.module_from_spec(_spec)
sys.modules["results_tables"] = rt
_spec.loader.exec_module(rt)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


RUNS = _rows(ROOT / "results" / "runs.csv")
MACHINES = _rows(ROOT / "results" / "machines.csv")


# ------------------------------------------------------------------------- the project's own


def test_the_generated_tables_are_not_stale():
    assert rt.stale(ROOT) == [], "run: python scripts/results_tables.py"


def test_the_csvs_are_well_formed():
    assert list(RUNS[0]) == rt.RUN_COLUMNS
    assert list(MACHINES[0]) == rt.MACHINE_COLUMNS
    assert rt.problems(RUNS, MACHINES) == []
    # the same rules, spelled out
    machines = {m["machine"] for m in MACHINES}
    assert len(machines) == len(MACHINES)
    for r in RUNS:
        assert r["machine"] in machines, r
        assert re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]), r
        for column in rt.REQUIRED:
            assert r[column], (column, r)
        for column in rt.BLEU_COLUMNS:
            if r[column]:
                assert 0 <= float(r[column]) <= 100, (column, r)
        if r["model"] == "nw":
            assert float(r["nw_mse"]) >= 0
    # every machine is used, and every profile the headline shows has rows
    assert machines == {r["machine"] for r in RUNS}
    assert {"default", "full"} <= {r["profile"] for r in RUNS}


def test_problems_names_each_broken_rule():
    good = next(r for r in RUNS if r["model"] == "transformer" and r["test_2016_flickr_bleu"])
    bad = [
        good | {"machine": "cray-1"},
        good | {"run": "x2", "commit": "HEAD~1"},
        good | {"run": "x3", "test_2016_flickr_bleu": "101"},
        good | {"run": "x4", "source": ""},
        good | {"run": "x5", "model": "nw"},
    ]
    found = "\n".join(rt.problems([good, *bad], MACHINES))
    assert "machine 'cray-1' is not in results/machines.csv" in found
    assert "commit 'HEAD~1' is not 7 to 40 lowercase hex digits" in found
    assert "test_2016_flickr_bleu = 101.0 is outside 0-100" in found
    assert "source is empty" in found
    assert "a Nadaraya–Watson row has nw_mse and no BLEU" in found
    assert f"run {good['run']!r} has two rows for 'transformer'" in found


@pytest.mark.parametrize("model", ["transformer", "bahdanau"])
def test_the_committed_translation_metrics_are_a_row(model):
    m = json.loads((ROOT / "metrics" / f"{model}.json").read_text())
    more = m["more_test_sets"]["test_2017_flickr"]
    want = {
        "test_2016_flickr_bleu": m["bleu"],
        "test_2016_flickr_bleu_lc": m["bleu_lc"],
        "test_2016_flickr_chrf": m["chrf"],
        "test_2017_flickr_bleu": more["bleu"],
        "test_2017_flickr_bleu_lc": more["bleu_lc"],
        "test_2017_flickr_chrf": more["chrf"],
    }
    rows = [
        r
        for r in RUNS
        if r["model"] == model
        and (r["corpus"], r["src_lang"], r["tgt_lang"]) == (m["corpus"], m["src_lang"], m["tgt_lang"])
        and all(r[k] and float(r[k]) == v for k, v in want.items())
        and (r["signature_bleu"], r["signature_bleu_lc"], r["signature_chrf"])
        == (m["signature"]["bleu"], m["signature"]["bleu_lc"], m["signature"]["chrf"])
    ]
    assert rows, f"metrics/{model}.json is in no row of results/runs.csv: add it (CONTRIBUTING.md)"


def test_the_committed_nw_metrics_are_a_row():
    mse = json.loads((ROOT / "metrics" / "nw.json").read_text())["mse"]
    assert any(r["model"] == "nw" and r["nw_mse"] and float(r["nw_mse"]) == mse for r in RUNS)


# ------------------------------------------------------------------ the generator on its own


MACHINES_CSV = """\
machine,cpu_model,cores,memory,avx2,avx512f,avx512_bf16,amx_bf16,seen,notes,source
box-a,CPU A,2,8 GiB,yes,no,no,no,day 1,a test machine,by hand
box-b,CPU B,4,,yes,yes,yes,yes,day 2,another,by hand
"""


def _run(run, model="transformer", **values):
    row = dict.fromkeys(rt.RUN_COLUMNS, "")
    row |= {
        "run": run, "commit": "abc1234", "commit_is": "code", "date": "2026-01-02", "profile": "default",
        "recipe": "r2", "corpus": "multi30k", "src_lang": "en", "tgt_lang": "fr", "model": model,
        "machine": "box-a", "source": "by hand",
    }  # fmt: skip
    if model == "nw":
        row |= {"corpus": "synthetic", "src_lang": "", "tgt_lang": ""}
    return row | {k: str(v) for k, v in values.items()}


def _tiny_project(tmp_path: Path, runs: list[dict[str, str]]) -> Path:
    (tmp_path / "results").mkdir(parents=True)
    (tmp_path / "results" / "machines.csv").write_text(MACHINES_CSV)
    rt.write_csv(tmp_path / "results" / "runs.csv", rt.RUN_COLUMNS, runs)
    (tmp_path / "README.md").write_text(f"# Tiny\n\nBefore.\n\n{rt.START}\nold table\n{rt.END}\n\nAfter.\n")
    return tmp_path


TINY_RUNS = [
    _run(
        "a1",
        test_2016_flickr_bleu=52.43,
        test_2017_flickr_bleu=43.83,
        threads=2,
        test_2016_flickr_bleu_tok_lc=53.5,
    ),
    _run("a1", "nw", nw_mse=0.09552028775215149, threads=2),
    _run("a2", test_2016_flickr_bleu=51.62, test_2017_flickr_bleu=44.46, machine="box-b", threads=1),
    _run(
        "a3",
        test_2016_flickr_bleu=52.0149,
        machine="box-b",
        threads=2,
        date="2026-01-03",
        test_2016_flickr_bleu_tok_lc=53.141,
    ),
    _run("a4", test_2016_flickr_bleu=51.95, date="2026-01-03"),
    _run("a5", test_2016_flickr_bleu=34.39, tgt_lang="de"),
    _run("old", test_2016_flickr_bleu=49.39, recipe="r1", date="2026-01-01"),
    _run("f1", test_2016_flickr_bleu=59.73, profile="full", recipe="p1", threads=1),
]


def test_the_headline_is_the_range_of_the_current_recipe(tmp_path):
    root = _tiny_project(tmp_path, TINY_RUNS)
    assert rt.stale(root) == ["docs/results/index.md", "docs/results/runs.md", "docs/results/machines.md",
                              "README.md"]  # fmt: skip
    assert len(rt.write(root)) == 4
    assert rt.stale(root) == []

    index = (root / "docs/results/index.md").read_text()
    assert index.startswith(rt.GENERATED + "\n")
    assert "The recipe as of `r2`: 5 runs on 2 machines (box-a, box-b)." in index
    row = "| Transformer | en→fr | 51.62–52.43 (4 runs) | — | 43.83–44.46 (2 runs) | 53.14–53.50 (2 runs) | {} |"  # noqa: E501 - one table row, as generated
    assert row.format("box-a (2, ?), box-b (1, 2)") in index
    assert "| Transformer | en→de | 34.39 (1 run) | — | — | — | box-a (?) |" in index
    assert "| Nadaraya–Watson | (synthetic) | 0.0955 (1 run) | — | — | — | box-a (2) |" in index
    assert "| Transformer | en→fr | 59.73 (1 run) | — | — | — | box-a (1) |" in index  # the full profile
    assert "| default | `r1` | Transformer | en→fr | 49.39 (1 run) | — | box-a (?) |" in index
    assert "49.39" not in index.split("## Earlier recipes")[0]  # an older recipe is not in the headline

    readme = (root / "README.md").read_text()
    before, block = readme.split(rt.START + "\n")
    block, after = block.split(rt.END)
    assert before == "# Tiny\n\nBefore.\n\n" and after == "\n\nAfter.\n"
    assert block.startswith(rt.GENERATED)
    # the README names no machine and no thread count: those are on the docs' results pages
    headline = "| default | Transformer | en→fr | 51.62–52.43 (4 runs) | 43.83–44.46 (2 runs) | 53.14–53.50 (2 runs) |"  # noqa: E501 - one table row, as generated
    assert headline + "\n" in block
    assert "| full | Transformer | en→fr | 59.73 (1 run) | — | — |\n" in block
    assert "box-a" not in block and "box-b" not in block
    assert "old table" not in block

    runs_md = (root / "docs/results/runs.md").read_text()
    assert runs_md.index("## default, recipe `r2`") < runs_md.index("## default, recipe `r1`")
    # sacreBLEU / lowercased / the papers' BLEU / chrF
    assert (
        "| a3 | 2026-01-03 | abc1234 | Transformer | en→fr | box-b | 2 |  | 52.01 / – / 53.14 / – |"
        in runs_md
    )
    machines_md = (root / "docs/results/machines.md").read_text()
    assert "| box-a | CPU A | 2 | 8 GiB | yes | no | no | no | 5 | day 1 |" in machines_md
    assert "| box-b | CPU B | 4 |  | yes | yes | yes | yes | 2 | day 2 |" in machines_md


def test_an_ablation_sits_beside_the_default_run_of_its_own_recipe_machine_and_threads(tmp_path):
    runs = [
        *TINY_RUNS,
        _run("a6", test_2016_flickr_bleu=52.2, machine="box-b", threads=1, date="2026-01-04"),  # newer
        _run("x1", test_2016_flickr_bleu=36.08, profile="ablation", recipe="r2+model.net.scaled=false",
             machine="box-b", threads=1, val_bleu_epochs="13.00 24.35"),
        _run("x2", test_2016_flickr_bleu=40.0, profile="ablation", recipe="r1+model.net.norm_first=true"),
        _run("x3", test_2016_flickr_bleu=30.0, profile="ablation", recipe="r2+model.net.scaled=false",
             machine="box-b", threads=4),
    ]  # fmt: skip
    root = _tiny_project(tmp_path, runs)
    rt.write(root)
    index = (root / "docs/results/index.md").read_text().split("## Ablations")[1].split("\n## ")[0]
    # the newest default run of recipe r2 on box-b at 1 thread is a6 (not a2): Δ = 36.08 − 52.2
    assert "| Transformer | (default `r2`) | 52.20 |  |  |  | box-b (1) |  |" in index
    assert (
        "| Transformer | `model.net.scaled=false` | 36.08 | -16.12 |  | 13.00 24.35 | box-b (1) |  |" in index
    )
    # the base recipe r1's default run on box-a, not the current recipe's
    assert "| Transformer | (default `r1`) | 49.39 |" in index
    assert "| Transformer | `model.net.norm_first=true` | 40.00 | -9.39 |" in index
    # the attention-free model is set beside Bahdanau's default run
    rows = [
        _run("b1", "bahdanau", test_2016_flickr_bleu=28.23),
        _run("s1", "seq2seq", test_2016_flickr_bleu=10.91, profile="ablation", recipe="r2+model=seq2seq"),
    ]
    assert rt.ablation_baseline(rows, rows[1]) is rows[0]
    # no default run on box-b at 4 threads: no Δ
    assert "| Transformer | `model.net.scaled=false` | 30.00 |  |  |  | box-b (4) |  |" in index
    machines = list(csv.DictReader(MACHINES_CSV.splitlines()))
    found = rt.problems([_run("x", profile="ablation", recipe="model.net.scaled=false")], machines)
    assert any("'<default recipe>+<switch>', not 'model.net.scaled=false'" in f for f in found), found
    # a recipe trial is named "trial: ...": "ablation: ..." would read as a chapter switch
    old_style = _run("t", profile="ablation: 36 epochs", recipe="ad61121", val_bleu_beam5=58.0)
    found = rt.problems([old_style], machines)
    assert found == [
        f"{rt.RUNS_CSV} line 2 (t, transformer): profile 'ablation: 36 epochs': a recipe trial's "
        "profile is 'trial: <what was changed>' ('ablation' alone is a chapter switch)"
    ]


def test_an_ablation_that_adds_a_switch_to_another_is_compared_with_it(tmp_path):
    big = "model.net.d_model=512 model.net.ffn_hidden=1024"
    runs = [
        *TINY_RUNS,
        _run("a6", test_2016_flickr_bleu=52.0, machine="box-b", threads=1),
        _run("d1", test_2016_flickr_bleu=50.5, profile="ablation", recipe=f"r2+{big}", machine="box-b",
             threads=1),
        _run("d2", test_2016_flickr_bleu=30.25, profile="ablation", recipe=f"r2+{big} model.net.scaled=false",
             machine="box-b", threads=1),
        _run("s1", test_2016_flickr_bleu=51.0, profile="ablation", recipe=f"r2+{big} seed=1", machine="box-b",
             threads=1),
    ]  # fmt: skip
    assert rt.ablation_baseline(runs, runs[-3]) is runs[-4]  # d_model=512 against the default
    assert rt.ablation_baseline(runs, runs[-2]) is runs[-3]  # + scaled=false against d_model=512
    assert rt.ablation_baseline(runs, runs[-1]) is runs[-4]  # another seed: against the default
    root = _tiny_project(tmp_path, runs)
    rt.write(root)
    index = (root / "docs/results/index.md").read_text().split("## Ablations")[1].split("\n## ")[0]
    assert f"| Transformer | `{big}` | 50.50 | -1.50 |" in index  # 50.5 − 52.0
    # 30.25 − 50.5, named
    assert f"| Transformer | `{big} model.net.scaled=false` | 30.25 | -20.25 (vs `{big}`) |" in index
    assert index.count("(default `r2`)") == 1
    # a compared_to overrides the baseline the recipe implies, in both tables
    d1 = runs[-3]
    d1["val_bleu_beam5"] = "40.0"
    runs.append(_run("s2", test_2016_flickr_bleu=49.75, profile="ablation", recipe=f"r2+{big} seed=2",
                     machine="box-b", threads=1, compared_to="d1", val_bleu_beam5=40.5))  # fmt: skip
    assert rt.ablation_baseline(runs, runs[-1]) is d1
    root = _tiny_project(tmp_path / "with_compared_to", runs)
    rt.write(root)
    index = (root / "docs/results/index.md").read_text()
    assert f"| Transformer | `{big} seed=2` | 49.75 | -0.75 (vs `{big}`) |" in index  # 49.75 − 50.5
    trial = f"| Transformer | en→fr | `{big} seed=2` | `s2` | `d1` |  | beam 5: 40.50 | +0.50 (beam 5) |"
    assert trial in index


TRIAL = "trial: "


def test_a_recipe_trial_is_set_beside_the_run_it_changed_with_its_validation_gain(tmp_path):
    runs = [
        *TINY_RUNS,
        _run("g1", profile="full", recipe="p1", tgt_lang="de", epochs=3, val_bleu_beam5=40.31,
             val_bleu_epochs="30.00 35.00 38.00", test_2016_flickr_bleu=40.16),
        _run("g2", profile=TRIAL + "36 epochs", recipe="p1", tgt_lang="de", epochs=36, val_bleu_beam5=40.62,
             test_2016_flickr_bleu=39.08, test_2016_flickr_bleu_tok_lc=39.5572, compared_to="g1"),
        _run("g3", profile=TRIAL + "ensemble", recipe="p1", tgt_lang="de", epochs=36, val_bleu_beam5=42.64,
             test_2016_flickr_bleu=40.77, compared_to="g2"),
        # stopped after epoch 2: its greedy val_bleu against g1's after epoch 2
        _run("g4", profile=TRIAL + "dropout 0.3", recipe="p1", tgt_lang="de", epochs=2,
             val_bleu_epochs="? 33.50", compared_to="g1"),
        # beam 5 against a run with greedy figures only: the val cell shows the greedy figure of its Δ too
        _run("g5", profile=TRIAL + "3 epochs", recipe="p1", tgt_lang="de", epochs=3, val_bleu_beam5=41.0,
             val_bleu_epochs="31.00 36.00 39.00", compared_to="g4"),
        # trained longer than the run it changed: its last epoch against that run's last
        _run("b1", "bahdanau", profile=TRIAL + "1 epoch", recipe="r2", epochs=1, val_bleu_epochs="11.92"),
        _run("b2", "bahdanau", profile=TRIAL + "2 epochs", recipe="r2", epochs=2,
             val_bleu_epochs="17.63 27.03", compared_to="b1"),
    ]  # fmt: skip
    g1, g2, g3, g4, g5, b1, b2 = runs[-7:]
    assert rt.problems(runs, list(csv.DictReader(MACHINES_CSV.splitlines()))) == []
    assert rt.validation_gain(g2, g1) == ("beam 5", pytest.approx(0.31), None)
    assert rt.validation_gain(g4, g1) == ("greedy, epoch 2: 33.50 vs 35.00", pytest.approx(-1.5), 33.5)
    assert rt.validation_gain(b2, b1) == ("greedy, epoch 2 vs 1: 27.03 vs 11.92", pytest.approx(15.11), 27.03)
    assert rt.validation_gain(g3, g4) is None  # beam 5 against greedy only: nothing recorded alike
    root = _tiny_project(tmp_path, runs)
    rt.write(root)
    index = (root / "docs/results/index.md").read_text()
    table = index.split("## Recipe trials")[1].split("\n## ")[0]
    # one table per profile a chain tunes: b1's recipe r2 is the default profile's, g1 is a full-profile run
    assert [line for line in table.splitlines() if line.startswith("### ")] == [
        "### Trials of the default profile",
        "### Trials of the full profile",
    ]
    assert rt.trial_profile(runs, b1) == "default" and rt.trial_profile(runs, g1) == "full"
    assert rt.trial_profile(runs, _run("x", profile=TRIAL + "x", recipe="nowhere")) is None
    default_table, full_table = table.split("### Trials of the full profile")
    assert "`b1`" in default_table and "`g1`" not in default_table and "`b1`" not in full_table
    lines = [line for line in table.splitlines() if line.startswith(("| Transformer", "| Bahdanau"))]
    rows = lines[2:] + lines[:2]  # the full profile's chain first below, as before the split
    # each chain from its first run down: g1, then what changed it (g2, then g3 which changed g2), g4
    assert [row.split(" | ")[3] for row in rows] == ["`g1`", "`g2`", "`g3`", "`g4`", "`g5`", "`b1`", "`b2`"]
    first = "| Transformer | en→de | the full profile, recipe `p1` | `g1` |  | 3 | beam 5: 40.31 |  | 40.16 / – | – / – |  | box-a (?) |"  # noqa: E501 - one table row, as generated
    assert rows[0] == first
    assert "| `g2` | `g1` | 36 | beam 5: 40.62 | +0.31 (beam 5) | 39.08 / 39.56 | – / – |" in rows[1]
    assert "| `g3` | `g2` | 36 | beam 5: 42.64 | +2.02 (beam 5) | 40.77 / – |" in rows[2]
    assert "| `g4` | `g1` | 2 | greedy, epoch 2: 33.50 | -1.50 (greedy, epoch 2: 33.50 vs 35.00) |" in rows[3]
    assert (
        "| `b2` | `b1` | 2 | greedy, epoch 2: 27.03 | +15.11 (greedy, epoch 2 vs 1: 27.03 vs 11.92) |"
        in rows[6]
    )
    g5_row = "| `g5` | `g4` | 3 | beam 5: 41.00; greedy, epoch 3: 39.00 | +5.50 (greedy, epoch 3 vs 2: 39.00 vs 33.50) |"  # noqa: E501 - one table row, as generated
    assert g5_row in rows[4]
    assert "| dropout 0.3 | `g4` |" in rows[3]
    assert "| 36 epochs | `g2` |" in rows[1] and "| 2 epochs | `b2` |" in rows[6]
    # the runs page keeps the column, so the comparison is in the data, not only in the table
    assert rt.read_csv(root / "results" / "runs.csv")[1][-5]["compared_to"] == "g2"


def test_compared_to_names_another_run_of_the_same_model_and_direction_without_a_cycle():
    machines = list(csv.DictReader(MACHINES_CSV.splitlines()))
    base = _run("c1", test_2016_flickr_bleu=50)

    def found(*rows):
        return "\n".join(rt.problems([base, *rows], machines))

    assert "compared_to 'nope' is not a run with a transformer row of the same corpus and direction" in found(
        _run("c2", test_2016_flickr_bleu=50, compared_to="nope")
    )
    assert "compared_to 'c1' is not a run with a bahdanau row" in found(
        _run("c2", "bahdanau", test_2016_flickr_bleu=30, compared_to="c1")
    )
    assert "compared_to 'c1' is not a run with a transformer row of the same corpus and direction" in found(
        _run("c2", test_2016_flickr_bleu=30, tgt_lang="de", compared_to="c1")
    )
    assert "compared_to names the run itself" in found(_run("c2", test_2016_flickr_bleu=50, compared_to="c2"))
    cycle = found(
        _run("c2", test_2016_flickr_bleu=50, compared_to="c3"),
        _run("c3", test_2016_flickr_bleu=50, compared_to="c2"),
    )
    assert "compared_to comes back to 'c2' (a cycle)" in cycle
    assert found(_run("c2", test_2016_flickr_bleu=50, compared_to="c1")) == ""


def test_a_range_whose_ends_print_alike_is_one_figure():
    rows = [_run("a", test_2016_flickr_bleu=28.232), _run("b", test_2016_flickr_bleu=28.2349)]
    assert rt.score_range(rows, "test_2016_flickr_bleu") == "28.23 (2 runs)"
    rows.append(_run("c", test_2016_flickr_bleu=28.236))
    assert rt.score_range(rows, "test_2016_flickr_bleu") == "28.23–28.24 (3 runs)"


def test_check_names_the_stale_files_and_writes_nothing(tmp_path, capsys):
    root = _tiny_project(tmp_path, TINY_RUNS)
    rt.write(root)
    runs = [*TINY_RUNS[:-1], _run("f1", test_2016_flickr_bleu=60.01, profile="full", recipe="p1")]
    rt.write_csv(root / "results" / "runs.csv", rt.RUN_COLUMNS, runs)
    index = (root / "docs/results/index.md").read_text()
    assert rt.main(["--root", str(root), "--check"]) == 1
    out = capsys.readouterr().out
    assert "stale: docs/results/index.md" in out and "stale: README.md" in out
    assert "stale: docs/results/machines.md" not in out
    assert (root / "docs/results/index.md").read_text() == index
    assert rt.main(["--root", str(root)]) == 0
    assert rt.main(["--root", str(root), "--check"]) == 0
    assert "60.01 (1 run)" in (root / "docs/results/index.md").read_text()


def test_a_readme_without_markers_is_stale_and_not_written(tmp_path):
    root = _tiny_project(tmp_path, TINY_RUNS)
    (root / "README.md").write_text("# Tiny\n")
    assert rt.stale(root)[-1].startswith("README.md (README.md has no line")
    with pytest.raises(rt.MarkersMissing):
        rt.write(root)
    assert (root / "README.md").read_text() == "# Tiny\n"
    assert (root / "docs/results/index.md").exists()


def test_a_malformed_csv_stops_the_generator(tmp_path):
    root = _tiny_project(tmp_path, [*TINY_RUNS, _run("bad", test_2016_flickr_bleu=52, machine="box-z")])
    with pytest.raises(ValueError, match="machine 'box-z' is not in results/machines.csv"):
        rt.write(root)
    assert rt.main(["--root", str(root), "--check"]) == 2


# -------------------------------------------------------------------------------- add-run


def _project_copy(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(ROOT / "results", root / "results")
    (root / "README.md").write_text(f"# attnlab\n\n{rt.START}\n{rt.END}\n")
    metrics = root / "metrics"
    metrics.mkdir()
    for name in ("transformer.json", "bahdanau.json", "nw.json", "transformer.heads.json"):
        shutil.copy(ROOT / "metrics" / name, metrics / name)
    t = json.loads((metrics / "transformer.json").read_text())
    t["bleu"] = 51.5123
    t["more_test_sets"]["test_2017_flickr"]["bleu"] = 44.1
    (metrics / "transformer.json").write_text(json.dumps(t))
    runs = root / "runs"
    runs.mkdir()
    (runs / "transformer.json").write_text(json.dumps({"run_id": "a" * 32, "experiment": "attnlab"}))
    (runs / "bahdanau.json").write_text(json.dumps({"run_id": "b" * 32}))
    return root


def test_add_run_appends_one_row_per_model_and_rewrites_the_tables(tmp_path, capsys):
    root = _project_copy(tmp_path)
    before = _rows(root / "results" / "runs.csv")
    args = ["--root", str(root), "add-run", "--commit", "abcdef1", "--machine", "xeon-amx", "--threads", "1",
            "--concurrent", "nothing", "--minutes", "17.5", "--date", "2026-12-03"]  # fmt: skip
    assert rt.main(args) == 0
    after = _rows(root / "results" / "runs.csv")
    assert after[: len(before)] == before
    new = after[len(before) :]
    assert [r["model"] for r in new] == ["transformer", "bahdanau", "nw"]
    t, b, n = new
    assert t["run"] == "abcdef1-xeon-amx" and t["commit"] == "abcdef1" and t["machine"] == "xeon-amx"
    # the default profile's current recipe, and its epochs from that recipe's earlier rows
    recipe = rt.current_recipe(before, "default")
    epochs = {r["model"]: r["epochs"] for r in before if r["profile"] == "default" and r["recipe"] == recipe}
    assert (t["profile"], t["recipe"], t["epochs"], t["precision"]) == (
        "default",
        recipe,
        epochs["transformer"],
        "fp32",
    )
    assert epochs["transformer"] and epochs["bahdanau"]
    assert (t["threads"], t["concurrent"], t["minutes_repro"], t["date"]) == (
        "1",
        "nothing",
        "17.5",
        "2026-12-03",
    )
    assert float(t["test_2016_flickr_bleu"]) == 51.5123 and float(t["test_2017_flickr_bleu"]) == 44.1
    assert t["signature_bleu"] == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    assert t["decoding"] == "beam 5, alpha 1.0"
    heads = json.loads((ROOT / "metrics" / "transformer.heads.json").read_text())
    assert float(t["val_bleu_greedy"]) == heads["val_bleu"]
    assert (t["mlflow_run_id"], b["mlflow_run_id"], n["mlflow_run_id"]) == ("a" * 32, "b" * 32, "")
    assert b["epochs"] == epochs["bahdanau"] and n["corpus"] == "synthetic" and n["nw_mse"]
    assert "added abcdef1-xeon-amx transformer: 51.5123" in capsys.readouterr().out

    assert rt.stale(root) == []
    index = (root / "docs/results/index.md").read_text()
    default = index.split("## The full profile")[0]
    # the new run (51.5123) joins the recorded runs of the current recipe: one more, a new low
    current = [r for r in before if (r["profile"], r["recipe"], r["model"], r["tgt_lang"]) ==
               ("default", recipe, "transformer", "fr") and r["test_2016_flickr_bleu"]]  # fmt: skip
    top = max(float(r["test_2016_flickr_bleu"]) for r in current)
    runs = f"{len(current) + 1} runs"
    assert f"| Transformer | en→fr | 51.51–{top:.2f} ({runs}) |" in default
    assert "xeon-amx (1, 2)" in default

    # the same run again, or a machine that is not in machines.csv: nothing is added
    assert rt.main(args) == 2
    assert "has two rows for 'transformer'" in capsys.readouterr().err
    bad = [a if a != "xeon-amx" else "m1-max" for a in args]
    bad[bad.index("abcdef1")] = "abcdef2"
    assert rt.main(bad) == 2
    assert "machine 'm1-max' is not in results/machines.csv" in capsys.readouterr().err
    assert _rows(root / "results" / "runs.csv") == after


def test_the_decoding_column_says_bf16_and_the_ensemble():
    """evaluate's ``decoding`` record → the runs table's text: an ensemble counts the kept
    checkpoint and its ``model.decoding.ensemble`` members."""
    m = json.loads((ROOT / "metrics" / "transformer.json").read_text())
    m["decoding"] = {**m["decoding"], "alpha": 0.8, "bf16": True, "ensemble": ["/a/seed1.ckpt", "b.ckpt"]}
    assert rt._translation_scores(m)["decoding"] == "beam 5, alpha 0.8, bf16, ensemble of 3 checkpoints"
    m["decoding"] = {**m["decoding"], "bf16": False, "ensemble": []}
    assert rt._translation_scores(m)["decoding"] == "beam 5, alpha 0.8"


def test_add_run_takes_mlflow_ids_and_the_recipe_from_its_options(tmp_path):
    root = _project_copy(tmp_path)
    args = ["--root", str(root), "add-run", "--commit", "abcdef1", "--machine", "epyc-avx2",
            "--profile", "full", "--metrics-dir", str(root / "metrics"), "--runs-dir", str(tmp_path / "none"),
            "--mlflow-run-id", "c" * 32, "--mlflow-run-id", "bahdanau=" + "d" * 32]  # fmt: skip
    assert rt.main(args) == 0
    new = _rows(root / "results" / "runs.csv")[-3:]
    assert [r["mlflow_run_id"] for r in new] == ["c" * 32, "d" * 32, ""]
    assert {r["recipe"] for r in new} == {"ad61121"} and {r["precision"] for r in new} == {""}
    assert {r["compared_to"] for r in new} == {""}


def test_add_run_records_the_run_a_trial_changed(tmp_path, capsys):
    root = _project_copy(tmp_path)
    args = ["--root", str(root), "add-run", "--commit", "abcdef1", "--machine", "epyc-avx512bf16",
            "--metrics-dir", str(root / "metrics"), "--runs-dir", str(tmp_path / "none"),
            "--profile", "trial: 36 epochs", "--recipe", "ad61121", "--val-bleu-beam5", "58.0",
            "--compared-to", "ad61121-full-en-de"]  # fmt: skip
    # the committed metrics are en→fr: the en→de run it names is not a run of the same direction
    assert rt.main(args) == 2
    assert "compared_to 'ad61121-full-en-de' is not a run with a transformer row" in capsys.readouterr().err
    args[-1] = "ad61121-full-en-fr"
    assert rt.main(args) == 0
    t, b, n = _rows(root / "results" / "runs.csv")[-3:]
    assert (t["profile"], t["compared_to"], t["val_bleu_beam5"]) == (
        "trial: 36 epochs",
        "ad61121-full-en-fr",
        "58.0",
    )
    assert b["compared_to"] == n["compared_to"] == b["val_bleu_beam5"] == ""  # the Transformer's only
    base = next(r for r in _rows(root / "results" / "runs.csv") if r["run"] == "ad61121-full-en-fr")
    gain = f"{58.0 - float(base['val_bleu_beam5']):+.2f} (beam 5)"
    assert (
        f"| 36 epochs | `abcdef1-epyc-avx512bf16` | `ad61121-full-en-fr` |  | beam 5: 58.00 | {gain} |"
        in (root / "docs/results/index.md").read_text()
    )


def test_add_run_of_one_model_ignores_the_other_metrics_files(tmp_path, capsys):
    """A full-profile run trains the Transformer alone: ``--model`` keeps the Bahdanau and NW
    files of an earlier ``dvc repro`` out, and ``--epochs``/``--minutes-train`` say what ran."""
    root = _project_copy(tmp_path)
    before = _rows(root / "results" / "runs.csv")
    args = ["--root", str(root), "add-run", "--commit", "abcdef1", "--machine", "epyc-avx512bf16",
            "--runs-dir", str(tmp_path / "none"), "--profile", "trial: 36 epochs", "--recipe", "ad61121",
            "--model", "transformer", "--epochs", "36", "--minutes-train", "bahdanau=12.5",
            "--minutes-train", "96.3"]  # fmt: skip
    assert rt.main(args) == 0
    after = _rows(root / "results" / "runs.csv")
    assert len(after) == len(before) + 1
    (t,) = after[len(before) :]
    assert (t["model"], t["epochs"], t["minutes_train"]) == ("transformer", "36", "96.3")
    # without --epochs: those of the profile and recipe's earlier rows (the full profile's 25)
    common = args[: args.index("--profile")]
    assert rt.main([*common, "--profile", "full", "--run", "second", "--model", "transformer"]) == 0
    assert _rows(root / "results" / "runs.csv")[-1]["epochs"] == "25"
    # a model named whose metrics file is missing: nothing added, the fix named
    (root / "metrics" / "bahdanau.json").unlink()
    assert rt.main([*args, "--run", "third", "--model", "bahdanau"]) == 2
    assert "--model bahdanau: no bahdanau.json in" in capsys.readouterr().err
    assert len(_rows(root / "results" / "runs.csv")) == len(before) + 2


def test_bleu_by_length_scores_each_bucket_as_sacrebleu_scores_its_sentences():
    import sacrebleu

    spec = importlib.util.spec_from_file_location("bleu_by_length", ROOT / "scripts" / "bleu_by_length.py")
    assert spec and spec.loader
    bl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bl)
    assert [bl.bucket_of(n) for n in (1, 8, 9, 12, 13, 16, 17, 40)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="outside the buckets"):
        bl.bucket_of(0)
    sources = ["a b", "a b c d e f g h i j", "one two three", "w " * 20]
    references = ["un chat noir", "le chien court vite", "trois mots ici", "une longue phrase ici"]
    hypotheses = ["un chat noir", "le chien court", "trois mots", "une phrase longue ici"]
    got = bl.bleu_by_length(sources, references, hypotheses)
    short = sacrebleu.corpus_bleu([hypotheses[0], hypotheses[2]], [[references[0], references[2]]]).score
    assert got[0] == (0, 2, pytest.approx(short)) and [b for b, _, _ in got] == [0, 1, 3]
    assert got[1][2] == pytest.approx(sacrebleu.corpus_bleu([hypotheses[1]], [[references[1]]]).score)


def test_image_runs_are_summarised_per_model_as_mean_and_sample_sd_over_seeds():
    row = dict.fromkeys(rt.IMAGE_COLUMNS, "")
    base = {**row, "data": "digits", "epochs": "10", "commit": "abc1234", "machine": "m", "threads": "1"}
    images = [
        {**base, "model": "vit", "params": "68K", "seed": "0", "test_accuracy": "0.70"},
        {**base, "model": "vit", "params": "68K", "seed": "1", "test_accuracy": "0.80"},
        {**base, "model": "vit", "params": "68K", "seed": "2", "test_accuracy": "0.90"},
        {**base, "model": "cnn", "params": "70K", "seed": "0", "test_accuracy": "0.95"},
    ]
    vit, cnn = rt.image_summary(images)
    # mean 0.8; sample sd sqrt((0.01 + 0 + 0.01) / 2) = 0.1
    assert vit == [
        "digits",
        "vit",
        "68K",
        "10",
        "3",
        "0.8000 ± 0.1000",
        "0.7000 0.8000 0.9000",
        "`abc1234`",
        "m (1)",
    ]
    assert cnn[4:7] == ["1", "0.9500", "0.9500"]  # one seed: no spread
    page = rt.render_index(RUNS, MACHINES, images=images)
    assert "## Images: a Vision Transformer against a CNN" in page and "0.8000 ± 0.1000" in page


def test_a_malformed_image_runs_csv_stops_the_generator(tmp_path):
    (tmp_path / "results").mkdir()
    path = tmp_path / rt.IMAGES_CSV
    rt.write_csv(path, rt.IMAGE_COLUMNS, [{**dict.fromkeys(rt.IMAGE_COLUMNS, ""), "test_accuracy": "high"}])
    with pytest.raises(ValueError, match=r"image_runs.csv:2: test_accuracy 'high' is no number"):
        rt._images(tmp_path)
    rt.write_csv(path, ["run", "accuracy"], [])
    with pytest.raises(ValueError, match="columns"):
        rt._images(tmp_path)


def test_each_goal_is_set_beside_the_best_run_of_its_direction_and_test_set(tmp_path):
    runs = [
        _run("f1", profile="full", recipe="p1", tgt_lang="de", val_bleu_beam5=41.0,
             test_2016_flickr_bleu_tok_lc=41.2286),
        _run("f2", profile="trial: ensemble", recipe="p1", tgt_lang="de", compared_to="f1",
             val_bleu_beam5=42.0, test_2016_flickr_bleu_tok_lc=41.5552, test_2017_flickr_bleu_tok_lc=33.7391),
        # better on test but not on validation: not the one chosen
        _run("f4", profile="trial: more", recipe="p1", tgt_lang="de", compared_to="f2",
             val_bleu_beam5=41.9, test_2016_flickr_bleu_tok_lc=41.9, test_2017_flickr_bleu_tok_lc=34.0),
        _run("f5", profile="trial: no val", recipe="p1", tgt_lang="de", test_2016_flickr_bleu_tok_lc=45.0),
        _run("f3", profile="full", recipe="p1", tgt_lang="fr", val_bleu_beam5=60.0,
             test_2016_flickr_bleu_tok_lc=62.4216),
        _run("t1", corpus="fra_eng", tgt_lang="de", val_bleu_beam5=99.0, test_2016_flickr_bleu_tok_lc=99.0),
    ]  # fmt: skip
    goal = dict(src_lang="en", tgt_lang="de", test_set="test_2016_flickr", goal="42.6")
    goal |= {"published": "p", "source": "s"}
    goals = [
        goal,
        goal | {"test_set": "test_2017_flickr", "goal": "36.1"},
        goal | {"tgt_lang": "fr", "goal": "63.8"},
        goal | {"src_lang": "fr", "tgt_lang": "en"},
    ]
    assert rt.goal_rows(runs, goals) == [
        ["en→de", "test_2016_flickr", "42.6", "p", "`f2`", "42.00", "41.56", "-1.04"],  # 41.5552 − 42.6
        ["en→de", "test_2017_flickr", "36.1", "p", "`f2`", "42.00", "33.74", "-2.36"],  # 33.7391 − 36.1
        ["en→fr", "test_2016_flickr", "63.8", "p", "`f3`", "60.00", "62.42", "-1.38"],  # 62.4216 − 63.8
        ["fr→en", "test_2016_flickr", "42.6", "p", "", "", "–", ""],  # no run of that direction
    ]
    # the README's line: each run chosen once, what it is, its scores against the goals
    assert rt.goals_sentence(runs, goals).endswith(
        "): en→de, `f2` (ensemble): 41.56 on test_2016_flickr against 42.6 (gap -1.04), "
        "33.74 on test_2017_flickr against 36.1 (gap -2.36); "
        "en→fr, `f3` (full): 62.42 on test_2016_flickr against 63.8 (gap -1.38)."
    )
    assert rt.goals_sentence(runs, goals[3:]) == ""
    root = _tiny_project(tmp_path, runs)
    rt.write_csv(root / rt.GOALS_CSV, rt.GOAL_COLUMNS, goals[:1])
    rt.write(root)
    index = (root / "docs/results/index.md").read_text()
    assert "| en→de | test_2016_flickr | 42.6 | p | `f2` | 42.00 | 41.56 | -1.04 |" in index
    readme = (root / "README.md").read_text()
    assert "(docs/results/index.md#against-the-published-results)): " in readme
    assert "): en→de, `f2` (ensemble): 41.56 on test_2016_flickr against 42.6 (gap -1.04).\n" in readme
    # a goal no run is scored for is in the docs' table only
    rt.write_csv(root / rt.GOALS_CSV, rt.GOAL_COLUMNS, [goals[3]])
    rt.write(root)
    assert "against the published results" not in (root / "README.md").read_text()
    assert (
        "| fr→en | test_2016_flickr | 42.6 | p |  |  | – |  |" in (root / "docs/results/index.md").read_text()
    )
    # a value with an unquoted comma: the file and line named, and the fix
    (root / rt.GOALS_CSV).write_text(
        "src_lang,tgt_lang,test_set,goal,published,source\n\nen,de,test_2016_flickr,42.6,a, b,s\n"
    )
    with pytest.raises(
        ValueError, match=r"goals.csv:3: 7 values for 6 columns \(src_lang, .*\); put a value"
    ):
        rt._goals(root)
    rt.write_csv(root / rt.GOALS_CSV, rt.GOAL_COLUMNS, [goal | {"goal": "high"}])
    with pytest.raises(ValueError, match=r"goals.csv:2: goal 'high' is no positive number"):
        rt._goals(root)
    rt.write_csv(root / rt.GOALS_CSV, rt.GOAL_COLUMNS, [goal | {"test_set": "test_2018_flickr"}])
    with pytest.raises(ValueError, match=r"goals.csv:2: test_set 'test_2018_flickr' is none of"):
        rt._goals(root)


def test_the_first_epoch_table_reads_each_runs_history_defaults_first():
    run = dict.fromkeys(rt.RUN_COLUMNS, "")
    runs = [
        {
            **run,
            "mlflow_run_id": "a" * 32,
            "profile": "ablation",
            "recipe": "r+model.net.scaled=false",
            "model": "transformer",
        },
        {**run, "mlflow_run_id": "b" * 32, "profile": "default", "recipe": "r", "model": "transformer"},
        {
            **run,
            "mlflow_run_id": "c" * 32,
            "profile": "ablation",
            "recipe": "r+model=seq2seq",
            "model": "seq2seq",
        },
    ]
    h = dict.fromkeys(rt.HISTORY_COLUMNS, "")
    history = [  # epochs out of order on purpose
        {
            **h,
            "mlflow_run_id": "a" * 32,
            "model": "transformer",
            "epoch": "2",
            "val_loss": "2.5",
            "val_bleu": "20.00",
        },
        {
            **h,
            "mlflow_run_id": "a" * 32,
            "model": "transformer",
            "epoch": "1",
            "val_loss": "3.2",
            "val_bleu": "13.00",
            "entropy_encoder_self": "0.0912",
            "entropy_encoder_decoder": "0.19",
        },
        {
            **h,
            "mlflow_run_id": "c" * 32,
            "model": "seq2seq",
            "epoch": "1",
            "val_loss": "3.3",
            "val_bleu": "7.62",
        },
        {
            **h,
            "mlflow_run_id": "b" * 32,
            "model": "transformer",
            "epoch": "1",
            "val_loss": "2.6",
            "val_bleu": "25.03",
            "entropy_encoder_self": "1.99",
        },
    ]
    assert rt.first_epoch_rows(runs, history) == [
        ["Transformer", "(default `r`)", "25.03", "encoder self 1.99", "2.6"],
        [
            "Transformer",
            "`model.net.scaled=false`",
            "13.00",
            "encoder self 0.09; encoder–decoder 0.19",
            "3.2 2.5",
        ],
        ["seq2seq (no attention)", "`model=seq2seq`", "7.62", "(no attention)", "3.3"],
    ]


def test_every_run_of_the_history_is_a_run_of_runs_csv(tmp_path):
    assert rt._history(ROOT), "results/ablation_history.csv is empty"
    (tmp_path / "results").mkdir()
    shutil.copy(ROOT / rt.RUNS_CSV, tmp_path / rt.RUNS_CSV)
    rt.write_csv(
        tmp_path / rt.HISTORY_CSV,
        rt.HISTORY_COLUMNS,
        [{**dict.fromkeys(rt.HISTORY_COLUMNS, ""), "mlflow_run_id": "f" * 32}],
    )
    with pytest.raises(ValueError, match=r"ablation_history.csv:2: run f{32} is not in results/runs.csv"):
        rt._history(tmp_path)

"""Tokenize and train at growing corpus sizes: time, throughput and peak memory side by side.

For each size (``--sizes``, default 0.1M, 1M and 5M sentence pairs) a synthetic English-like →
French-like corpus is written in ``data=parallel``'s layout (``train.en`` and ``train.fr``,
one sentence a line; val and test are held out of train, ``data.heldout``), then:

1. **tokenize**: ``python src/tokenize_data.py data=parallel data.path=...`` in a subprocess:
   wall time, pairs/s, and its peak RSS (``ru_maxrss`` of that process, from ``os.wait4``).
   sentencepiece trains on the same sample at every size (``--spm-sample`` sentences,
   ``data.input_sentence_size``), so what grows is the corpus, not sentencepiece's input.
2. **train**: a subprocess (this script, ``--train-worker``) that builds
   :class:`attnlab.data.datamodule.TranslationDataModule` over the tokenized folder
   (memory-mapped ids, token-budget batches of ``--max-tokens``) and a tiny Transformer
   (d_model 64, 2 heads, 1+1 layers, ffn 128): the time to the first training batch (the
   DataModule, the sampler's first epoch, one batch), the loader's own throughput over
   ``--loader-batches`` batches (batches/s), then ``--steps`` training steps (forward,
   loss, backward, AdamW) for the model's step time beside it; peak RSS of that process
   (``ru_maxrss``, which counts the pages of the memory-mapped ids it touched) and, at its end,
   the anonymous and file-backed parts of its RSS.
3. **encoding parallelism** (on the first size): sentencepiece's ``encode`` of the same
   sentences with 1 thread, with one thread a core (``num_threads``, what tokenize uses), and in
   a process pool of one worker a core; sentences/s and the ratios to 1 thread, timed in
   alternating rounds.

The ratios of the largest size's peak RSS to the smallest's (``*_rss_ratio``) are the point:
streamed tokenizing and memory-mapped training should keep them near 1 (target ≤ 1.25). The
corpus generator is fixed-seed (a Zipfian vocabulary of made-up words built from syllables,
so BPE has subwords to find); corpora are kept in ``--workdir`` and reused. The last line of
output is one JSON object; ``--record results/corpus_scale.csv --machine <id of
results/machines.csv>`` appends one row per size.

    python benchmarks/corpus_scale.py                       # 0.1M, 1M, 5M
    python benchmarks/corpus_scale.py --sizes 2000 --steps 2 --loader-batches 5   # a quick check
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = "corpus_scale v1"  # change when the generator changes: cached corpora are rewritten


# --- the synthetic corpus -----------------------------------------------------------------------


def _words(rng: np.random.Generator, n: int, onsets: str, vowels: str, codas: str) -> list[str]:
    """``n`` distinct made-up words of 1–4 syllables (onset + vowel + optional coda)."""
    syllables = [o + v + c for o in onsets for v in vowels for c in ("", *codas)]
    words: dict[str, None] = {}
    while len(words) < n:
        k = rng.integers(1, 5, size=n)
        picks = rng.integers(0, len(syllables), size=(n, 4))
        for length, row in zip(k.tolist(), picks.tolist()):
            words.setdefault("".join(syllables[i] for i in row[:length]), None)
            if len(words) == n:
                break
    return list(words)


def synthesize(folder: Path, pairs: int, seed: int = 0, vocabulary: int = 30_000) -> Path:
    """Write ``pairs`` sentence pairs as ``folder/train.en`` and ``folder/train.fr`` (plain UTF-8,
    a sentence a line), the same for the same ``pairs`` and ``seed``; kept and reused when
    ``folder/GENERATOR`` says they were written so. A source sentence is 2–50 words drawn from a
    Zipfian distribution (Zipf–Mandelbrot, exponent 1.07) over ``vocabulary`` made-up words plus
    a full stop; its target is the aligned target words in reverse order (a reordering to learn)."""
    folder = Path(folder)
    stamp = f"{GENERATOR} pairs={pairs} seed={seed} vocabulary={vocabulary}\n"
    marker = folder / "GENERATOR"
    if marker.is_file() and marker.read_text() == stamp:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    rng = np.random.default_rng(seed)
    src_words = _words(rng, vocabulary, "bdfgklmnprstvz", "aeiou", "nrs")
    tgt_words = _words(rng, vocabulary, "bcdfhjlmnpqrtvx", "aeiouy", "lnst")
    weights = 1.0 / (np.arange(vocabulary) + 2.7) ** 1.07
    cumulative = np.cumsum(weights / weights.sum())
    with (
        (folder / "train.en").open("w", encoding="utf-8") as en,
        (folder / "train.fr").open("w", encoding="utf-8") as fr,
    ):
        for start in range(0, pairs, 100_000):
            m = min(100_000, pairs - start)
            lengths = np.clip(rng.poisson(10, m) + 2, 2, 50)
            ids = np.minimum(
                np.searchsorted(cumulative, rng.random(int(lengths.sum()))), vocabulary - 1
            ).tolist()
            ends = np.cumsum(lengths).tolist()
            src_lines, tgt_lines, a = [], [], 0
            for b in ends:
                words = ids[a:b]
                src_lines.append(" ".join(map(src_words.__getitem__, words)) + " .\n")
                tgt_lines.append(" ".join(map(tgt_words.__getitem__, reversed(words))) + " .\n")
                a = b
            en.write("".join(src_lines))
            fr.write("".join(tgt_lines))
    marker.write_text(stamp)
    return folder


# --- measuring subprocesses -----------------------------------------------------------------------


def run_measured(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, float, str]:
    """Run ``cmd`` (output to ``log``); (wall seconds, peak RSS in MiB of that process and the
    ones it waited for, its stdout's last line). Raises RuntimeError naming the log on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} … failed ({proc.returncode}); see {log}:\n{text[-3000:]}")
    last = text.strip().splitlines()[-1] if text.strip() else ""
    return wall, usage.ru_maxrss / 1024, last  # ru_maxrss: KiB on Linux


def tokenize(corpus: Path, root: Path, pairs: int, vocab_size: int, spm_sample: int) -> dict:
    """Run the tokenize stage on ``corpus`` into ``root``; its time, pairs/s and peak RSS."""
    heldout = min(1000, pairs // 20)
    cmd = [
        sys.executable, "src/tokenize_data.py", "data=parallel", f"data.path={corpus}", "data.src_lang=en",
        "data.tgt_lang=fr", f"paths.root={root}", f"data.vocab_size={vocab_size}",
        f"data.input_sentence_size={spm_sample}", f"data.heldout.num_val={heldout}",
        f"data.heldout.num_test={heldout}", f"hydra.run.dir={root / 'hydra'}", "hydra.output_subdir=null",
    ]  # fmt: skip
    wall, rss, _ = run_measured(cmd, root / "tokenize.log")
    stats = json.loads((root / "data/tokenized/parallel-en-fr/stats.json").read_text())
    return {
        "tokenize_s": wall,
        "tokenize_pairs_per_s": pairs / wall,
        "tokenize_rss_mb": rss,
        "train_pairs_kept": stats["splits"]["train"]["kept"],
        "vocab": stats["vocab_size"]["actual"],
    }


def train(tokenized: Path, log: Path, steps: int, loader_batches: int, max_tokens: int) -> dict:
    """Run :func:`train_worker` in a subprocess; its figures and peak RSS."""
    cmd = [
        sys.executable, __file__, "--train-worker", str(tokenized), "--steps", str(steps),
        "--loader-batches", str(loader_batches), "--max-tokens", str(max_tokens),
    ]  # fmt: skip
    _, rss, last = run_measured(cmd, log)
    return {**json.loads(last), "train_rss_mb": rss}


def _proc_status() -> dict[str, float]:
    """RssAnon and RssFile of this process now, MiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def train_worker(tokenized: Path, steps: int, loader_batches: int, max_tokens: int) -> dict:
    """The training side in this process: the first batch, the loader alone, then model steps."""
    import torch

    from attnlab.data.datamodule import TranslationDataModule
    from attnlab.loss import sequence_loss
    from attnlab.models.transformer import Transformer

    torch.manual_seed(0)
    t0 = time.perf_counter()
    dm = TranslationDataModule(tokenized, batch_size=128, max_len=100, seed=0, max_tokens=max_tokens)
    loader = dm.train_dataloader()
    it = iter(loader)
    batch = next(it)
    first_batch = time.perf_counter() - t0

    def next_batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:  # a tiny corpus: the next epoch
            it = iter(loader)
            return next(it)

    t0 = time.perf_counter()
    for _ in range(loader_batches):
        batch = next_batch()
    loader_s = time.perf_counter() - t0
    net = Transformer(dm.vocab_size, d_model=64, num_heads=2, num_layers=1, ffn_hidden=128, dropout=0.1)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    step_s = fetch_s = 0.0
    tokens = 0
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next_batch()
        t1 = time.perf_counter()
        loss = sequence_loss(net, batch, 0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        fetch_s, step_s = fetch_s + t1 - t0, step_s + time.perf_counter() - t1
        tokens += int((batch["tgt_out"] != 0).sum())
    ds = dm.dataset("train")
    return {
        "train_pairs": len(ds),
        "batches_per_epoch": len(loader.batch_sampler),
        "first_batch_s": first_batch,
        "loader_batches_per_s": loader_batches / loader_s if loader_s else 0.0,
        "model_step_ms": 1e3 * step_s / max(steps, 1),
        "loader_ms_per_batch_in_steps": 1e3 * fetch_s / max(steps, 1),
        "target_tokens_per_step": tokens / max(steps, 1),
        "torch_threads": torch.get_num_threads(),
        "self_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **{f"end_{k.lower()}_mb": v for k, v in _proc_status().items()},
    }


# --- encoding: threads against processes ---------------------------------------------------------

_worker_sp = None


def _init_encoder(model: str) -> None:
    global _worker_sp
    import sentencepiece as spm

    _worker_sp = spm.SentencePieceProcessor(model_file=model)


def _encode_chunk(sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    seqs = _worker_sp.encode(sentences, num_threads=1)
    lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
    return np.fromiter((t for s in seqs for t in s), np.int32, int(lengths.sum())), lengths


def encode_parallelism(
    model: Path, corpus: Path, sentences: int, rounds: int = 3, chunk: int = 16384
) -> dict:
    """sentencepiece ``encode`` of the first ``sentences`` source sentences of ``corpus``, packed to
    arrays as tokenize does: 1 thread, ``num_threads`` = cores, a process pool of cores workers.
    Sentences/s (median over ``rounds``, the three taking turns) and ratios to 1 thread."""
    from concurrent.futures import ProcessPoolExecutor

    import sentencepiece as spm

    from attnlab.data.tokenizer import _flat

    with (corpus / "train.en").open(encoding="utf-8") as f:
        text = [line.rstrip("\n") for _, line in zip(range(sentences), f)]
    chunks = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    cores = os.cpu_count() or 1
    sp = spm.SentencePieceProcessor(model_file=str(model))
    _init_encoder(str(model))
    times: dict[str, list[float]] = {"threads_1": [], f"threads_{cores}": [], f"processes_{cores}": []}
    with ProcessPoolExecutor(cores, initializer=_init_encoder, initargs=(str(model),)) as pool:
        list(pool.map(_encode_chunk, chunks[:cores]))  # start the workers
        runs = {
            "threads_1": lambda: [_flat(sp.encode(c, num_threads=1)) for c in chunks],
            f"threads_{cores}": lambda: [_flat(sp.encode(c, num_threads=cores)) for c in chunks],
            f"processes_{cores}": lambda: list(pool.map(_encode_chunk, chunks)),
        }
        names = list(runs)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                t0 = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t0)
    rate = {k: len(text) / float(np.median(v)) for k, v in times.items()}
    return {
        "sentences": len(text),
        **{f"{k}_sentences_per_s": v for k, v in rate.items()},
        "threads_vs_1": rate[f"threads_{cores}"] / rate["threads_1"],
        "processes_vs_1": rate[f"processes_{cores}"] / rate["threads_1"],
    }


# --- the run --------------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """``2000``, ``100k``, ``0.1M``, ``5M`` → pairs."""
    text = text.strip()
    scale = {"k": 1_000, "K": 1_000, "m": 1_000_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(round(float(text[:-1] if scale > 1 else text) * scale))


RECORD_COLUMNS = [
    "run", "commit", "date", "machine", "cpu_flags", "concurrent", "pairs", "tokenize_s",
    "tokenize_pairs_per_s", "tokenize_rss_mb", "first_batch_s", "train_rss_mb", "loader_batches_per_s",
    "model_step_ms", "spm_sample", "max_tokens", "source",
]  # fmt: skip


def cpu_flags() -> str:
    """The CPU flags that decide speed here: those of avx2, avx512_bf16, amx_tile it has."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    return " ".join(f for f in ("avx2", "avx512_bf16", "amx_tile") if f in flags) or "none"


def record(result: dict, path: Path, machine: str, concurrent: str) -> None:
    """Append one row per size of ``result`` to the results file ``path`` (header first when new).

    Raises:
        ValueError: the file's header is not :data:`RECORD_COLUMNS`.
    """
    from attnlab.analysis.provenance import append_rows, git_commit

    commit = git_commit(ROOT)
    run = f"{commit.split()[0]}-{machine}-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M}"
    append_rows(path, RECORD_COLUMNS, ({
        "run": run, "commit": commit, "date": f"{datetime.date.today():%Y-%m-%d}",
        "machine": machine, "cpu_flags": result["cpu_flags"], "concurrent": concurrent,
        "pairs": row["pairs"], "spm_sample": result["spm_sample"], "max_tokens": result["max_tokens"],
        **{k: f"{row[k]:.4g}" for k in (
            "tokenize_s", "tokenize_pairs_per_s", "tokenize_rss_mb", "first_batch_s", "train_rss_mb",
            "loader_batches_per_s", "model_step_ms")},
        "source": "benchmarks/corpus_scale.py --record",
    } for row in result["sizes"]))  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", default="0.1M,1M,5M", help="corpus sizes in pairs, comma-separated (2000, 100k, 5M)"
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "attnlab-corpus-scale",
        help="where the corpora (kept, reused) and the runs go",
    )
    p.add_argument("--spm-sample", type=int, default=200_000, help="data.input_sentence_size at every size")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=2400, help="token budget of a training batch")
    p.add_argument("--steps", type=int, default=20, help="training steps timed")
    p.add_argument("--loader-batches", type=int, default=200, help="batches the loader alone is timed on")
    p.add_argument(
        "--encode-sentences", type=int, default=100_000, help="sentences of the encoding comparison"
    )
    p.add_argument("--record", type=Path, help="append the rows to this CSV (results/corpus_scale.csv)")
    p.add_argument("--machine", help="--record: the machine's id in results/machines.csv")
    p.add_argument("--concurrent", default="nothing", help="--record: what else ran on the machine")
    p.add_argument("--train-worker", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.train_worker:
        print(json.dumps(train_worker(a.train_worker, a.steps, a.loader_batches, a.max_tokens)))
        return {}
    if a.record and not a.machine:
        p.error("--record needs --machine <id of results/machines.csv>")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    rows, encoding = [], None
    for n in sizes:
        t0 = time.perf_counter()
        corpus = synthesize(a.workdir / "corpora" / str(n), n)
        generated = time.perf_counter() - t0
        root = a.workdir / "runs" / str(n)
        row = {"pairs": n, "generate_s": generated, **tokenize(corpus, root, n, a.vocab_size, a.spm_sample)}
        tokenized = root / "data/tokenized/parallel-en-fr"
        row.update(train(tokenized, root / "train.log", a.steps, a.loader_batches, a.max_tokens))
        rows.append(row)
        print(
            f"{n} pairs: tokenize {row['tokenize_s']:.1f} s ({row['tokenize_pairs_per_s']:.0f} pairs/s, "
            f"peak RSS {row['tokenize_rss_mb']:.0f} MiB); first batch {row['first_batch_s']:.2f} s, "
            f"loader {row['loader_batches_per_s']:.0f} batches/s, model step {row['model_step_ms']:.1f} ms, "
            f"training peak RSS {row['train_rss_mb']:.0f} MiB",
            flush=True,
        )
        if encoding is None:
            encoding = encode_parallelism(tokenized / "spm.model", corpus, min(a.encode_sentences, n))
            print("encoding:", ", ".join(f"{k} {v:.3g}" for k, v in encoding.items()), flush=True)
    small, large = rows[0], rows[-1]
    result = {
        "sizes": rows,
        "tokenize_rss_ratio": large["tokenize_rss_mb"] / small["tokenize_rss_mb"],
        "train_rss_ratio": large["train_rss_mb"] / small["train_rss_mb"],
        "rss_target": 1.25,
        "encoding": encoding,
        "spm_sample": a.spm_sample,
        "max_tokens": a.max_tokens,
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg()[0],
    }
    print(
        f"peak RSS, {large['pairs']} against {small['pairs']} pairs: "
        f"tokenize ×{result['tokenize_rss_ratio']:.2f}, training ×{result['train_rss_ratio']:.2f} "
        f"(target ≤ {result['rss_target']})"
    )
    print(json.dumps(result))
    if a.record:
        record(result, a.record, a.machine, a.concurrent)
    return result


if __name__ == "__main__":
    main()

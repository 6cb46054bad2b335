"""Translation speed of attnlab's Transformer: eager checkpoint, exported model and CTranslate2.

Decodes the real Multi30k test set (test_2016_flickr, English → French, the first
``--sentences`` of its 1,000 sentences) with four engines (five where the CPU has bf16 units),
each greedy (beam 1) and with beam search (``--beam-size`` 5, length penalty ``--alpha`` 1.0:
the model's ``decoding`` in ``conf/model/transformer.yaml``), in one run:

- ``checkpoint``: the trained checkpoint decoded eagerly, :func:`attnlab.checkpoint.load_net`
  + :func:`attnlab.inference.decoding.translate` (what ``src/evaluate.py`` runs); its JSON keys are
  ``torch_*``;
- ``checkpoint_bf16``: the same under bf16 autocast (``translate(..., bf16=True)``, opt-in in
  attnlab: ``model.decoding.bf16``), keys ``torch_bf16_*`` and the ratios ``<mode>_bf16_vs_torch``;
  run by default only where the CPU has bf16 units (``avx512_bf16`` or ``amx_bf16``), as on
  others attnlab refuses it;
- ``export``: the export folder's torch programs (whatever its ``config.json`` names:
  TorchScript traces or ``torch.export`` programs) through
  :class:`attnlab.serving.translator.Translator` (``engine="torch"``), the same decoding loops;
- ``ct2_fp32`` and ``ct2_int8``: the folder's CTranslate2 models through the same
  ``Translator`` (``engine="ctranslate2"`` / ``"ctranslate2_int8"``, i.e.
  :class:`attnlab.export.ctranslate2.CTranslate2Translator`).

Every engine × mode runs in its own worker process (multiprocessing, spawn), so its peak RSS
(``ru_maxrss`` of the worker, read in the worker) is its own. The parent never imports torch,
and the random-weights model is built and exported in a child of its own, because a process
started with exec inherits its parent's peak RSS as a floor; ``parent_rss_mb`` in the JSON is
that floor. A worker loads its engine (not timed), decodes ``--warmup`` sentences once (not
timed; CTranslate2 loads its model on this first call), then waits. The parent then runs
``--runs`` rounds; in each round every worker, one after another (the order rotated each
round, so that machine noise hits all alike), decodes all the sentences once, timed from
text in to ids out: tokenization, batching (``--batch-size`` sentences, sorted by length) and
decoding are in the time, detokenization is not. Threads: ``torch.set_num_threads(--threads)``
in every worker; ``Translator`` gives CTranslate2 torch's thread count as ``intra_threads``,
and every worker also gets ``OMP_NUM_THREADS=--threads`` in its environment (``os_threads`` in
the table counts the worker's OS threads: with ``--threads 1`` a CTranslate2 worker has 2, its
main thread and its one translation thread). On busy cores, OpenMP threads that spin-wait (the
default of both) slow down badly: on this project's 2-core machine at load average 4-5, torch
with 2 threads decoded 20× slower than with 1 (2.3× slower with ``OMP_WAIT_POLICY=PASSIVE``,
which the workers inherit when it is set). The output then carries a note; compare engines on an idle machine.

Per engine × mode: sentences/s and target tokens/s (the generated sentencepiece pieces, the
``</s>`` and anything after it not counted), wall seconds of one pass over the set, each as
the median over the runs with min–max; peak RSS of the worker (over its loading, warm-up
and all its runs: one value, not a median); corpus BLEU (sacreBLEU ``corpus_bleu``, default
13a tokenization, cased) of the detokenized output against the French references; and
``same``: the fraction of sentences whose ids equal the ``checkpoint`` engine's in the same
mode (1.0 for an export of that very checkpoint; ct2_fp32 greedy about 1.0; CTranslate2's
beam search and int8 weights differ in some sentences, see
:class:`~attnlab.export.ctranslate2.CTranslate2Translator`).

Models: ``--checkpoint`` (default ``checkpoints/transformer/best.ckpt``, copied first so a
training run that replaces it meanwhile changes nothing) and ``--export`` (default
``models/transformer``). An export without the CTranslate2 models a requested engine needs
(or none at all) is re-exported from the checkpoint into a temporary folder
(:func:`attnlab.export.trace.export_translation`), and the output says so. With
``--random-weights``, or when the checkpoint is missing (said so), a same-shape Transformer
(d_model 256, 4 heads, 2+2 layers, ffn 512, tied embeddings) with seeded random weights is
exported to a temporary folder with the project's sentencepiece model
(``data/tokenized/multi30k-en-fr/spm.model``), or one of 5,000 pieces trained on the corpus's
train split when there is none. Random weights (almost) never emit ``</s>``, so every sentence
decodes to its length cap (min(1.5 · source tokens + 10, 256)): the timings are a worst case and BLEU
is meaningless (about 0). Such a model mostly repeats ``<bos>``, which is stripped from the
output, so its tokens/s is about 0; the table then adds "cap tokens/s" (``cap_tokens_per_s_*``):
the sum of the sentences' length caps (``cap_tokens``, the steps of a pass in which no
sentence ends) per second.

Sources and references: ``data/tokenized/multi30k-en-fr/test.{src,tgt}.txt`` (written by the
tokenize stage), else ``test_2016_flickr.{en,fr}.gz`` from ``data/raw/multi30k``,
``$ATTNLAB_DATA_MIRROR/multi30k`` or ``../shared/data/multi30k``.

Reading the output: one table row per engine × mode, "median (min–max)" over the runs; then
the last line, one JSON object: ``<engine>_<mode>`` sentences/s medians (``torch_greedy``,
``torch_beam5``, ``export_*``, ``ct2_fp32_*``, ``ct2_int8_*``), with ``_min``/``_max``;
``tokens_per_s_*``, ``seconds_*``, ``rss_mb_*``, ``bleu_*``, ``same_as_torch_*``,
``tokens_*`` (generated pieces per pass), ``rss_load_mb_*`` (RSS once loaded and warmed up),
``os_threads_*``, ``compute_type_*`` (CTranslate2's); the ratios ``greedy_vs_ct2_fp32`` =
torch_greedy / ct2_fp32_greedy and ``beam5_vs_ct2_fp32`` (< 1: CTranslate2 is faster),
``*_vs_ct2_int8`` likewise, ``<mode>_export_vs_torch`` and ``<mode>_ct2_int8_vs_fp32``; and the
machine and run facts (CPU model, ``avx512_bf16``, ``amx_bf16``, versions, threads,
sentences, runs, ``random_weights``, load average before and after). An engine that failed has
``null`` values and its error in ``errors``.

    python benchmarks/translate_throughput.py                      # trained model, all 1,000, 5 runs
    python benchmarks/translate_throughput.py --random-weights --sentences 40 --runs 1
    python benchmarks/translate_throughput.py --engines checkpoint,ct2_int8 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("checkpoint", "checkpoint_bf16", "export", "ct2_fp32", "ct2_int8")
# The engine name in the JSON keys, and the Translator engine (None: eager checkpoint).
KEY = {
    "checkpoint": "torch",
    "checkpoint_bf16": "torch_bf16",
    "export": "export",
    "ct2_fp32": "ct2_fp32",
    "ct2_int8": "ct2_int8",
}
TRANSLATOR_ENGINE = {
    "checkpoint": None,
    "checkpoint_bf16": None,
    "export": "torch",
    "ct2_fp32": "ctranslate2",
    "ct2_int8": "ctranslate2_int8",
}
QUANTIZATION = {"ctranslate2": "float32", "ctranslate2_int8": "int8"}
# The trained model's net (conf/model/transformer.yaml), for --random-weights.
NET = {
    "_target_": "attnlab.models.transformer.Transformer",
    "d_model": 256,
    "num_heads": 4,
    "num_layers": 2,
    "ffn_hidden": 512,
    "dropout": 0.1,
    "tie_embeddings": True,
}
TOKENS_COUNTED = "generated sentencepiece pieces per sentence, </s> and anything after it not counted"
RANDOM_NOTE = (
    "random weights: every sentence decodes to its length cap (no </s>), so these "
    "timings are a worst case and BLEU is meaningless; the random model mostly repeats "
    "<bos>, which is stripped, so tokens/s is about 0: cap tokens/s counts the steps"
)


# --- inputs and machine facts (parent: no torch here) ---------------------------------------


def decoding_defaults() -> tuple[int, float]:
    """beam_size and alpha of conf/model/transformer.yaml's ``decoding`` (5 and 1.0 if unreadable)."""
    try:
        from omegaconf import OmegaConf

        dec = OmegaConf.load(ROOT / "conf" / "model" / "transformer.yaml").decoding
        return int(dec.beam_size), float(dec.alpha)
    except Exception:  # noqa: BLE001 - a default for the option only
        return 5, 1.0


def raw_multi30k(raw: Path) -> Path:
    """The folder of Multi30k's raw .gz files: ``raw``/multi30k, else a mirror."""
    candidates = [Path(raw) / "multi30k"]
    if os.environ.get("ATTNLAB_DATA_MIRROR"):
        candidates.append(Path(os.environ["ATTNLAB_DATA_MIRROR"]) / "multi30k")
    candidates.append(ROOT.parent / "shared" / "data" / "multi30k")
    for c in candidates:
        if (c / "test_2016_flickr.en.gz").is_file():
            return c
    raise SystemExit(
        f"no Multi30k corpus in {', '.join(map(str, candidates))}: run "
        "`dvc repro download` or set ATTNLAB_DATA_MIRROR"
    )


def load_test(tokenized: Path, raw: Path, n: int | None) -> tuple[list[str], list[str], str]:
    """(English sources, French references, where they came from), the first ``n``."""
    from attnlab.data.corpora import read_lines, read_multi30k

    src, tgt = tokenized / "test.src.txt", tokenized / "test.tgt.txt"
    if src.is_file() and tgt.is_file():
        sources, refs, where = read_lines(src), read_lines(tgt), str(src.parent)
    else:
        folder = raw_multi30k(raw)
        pairs = read_multi30k(folder, "test_2016_flickr", "en", "fr")
        sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
        where = f"{folder}/test_2016_flickr"
    if len(sources) != len(refs):
        raise SystemExit(f"{where}: {len(sources)} sources but {len(refs)} references")
    return sources[:n], refs[:n], where


def cpu_facts() -> dict:
    """CPU model (``/proc/cpuinfo``), CPU count and the bf16 flags attnlab decides by
    (:data:`attnlab.config.BF16_CPU_FLAGS`: ``avx512_bf16``, ``amx_bf16``); ``bf16_units`` is
    :func:`attnlab.config.has_bf16_units`' answer for the CPU (which imports no torch)."""
    from attnlab.config import BF16_CPU_FLAGS, cpu_flags, has_bf16_units

    model = None
    with contextlib.suppress(OSError):
        model = next(
            (
                line.partition(":")[2].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            None,
        )
    flags = cpu_flags()
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        **{f: f in flags for f in BF16_CPU_FLAGS},
        "bf16_units": has_bf16_units("cpu"),
    }


def cap_tokens(spm: Path, sentences: list[str]) -> int:
    """Sum over the sentences of their length caps (attnlab.inference.decoding.max_output_len: min(⌊1.5 ·
    source tokens with </s> + 10⌋, 256)): the steps of a pass in which no sentence ends early."""
    from attnlab.data.tokenizer import load_sentencepiece  # sentencepiece only, no torch

    ids = load_sentencepiece(spm).encode(list(sentences))
    return sum(min(int(1.5 * (len(x) + 1) + 10), 256) for x in ids if x)


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def rss_mb() -> float:
    """Peak RSS of this process in MiB (ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- model preparation (in a child process: it imports torch) -------------------------------


def _decoding_config(beam_size: int, alpha: float) -> dict:
    return {"model": "transformer", "decoding": {"beam_size": beam_size, "alpha": alpha}}


def prepare_random(tmp: str, spm_path: str | None, raw: str, seed: int, beam_size: int, alpha: float) -> dict:
    """A seeded random Transformer as a load_net checkpoint and an export folder in ``tmp``."""
    import warnings

    import torch

    from attnlab.data.corpora import read_multi30k
    from attnlab.data.tokenizer import load_sentencepiece, train_sentencepiece
    from attnlab.export.trace import export_translation
    from attnlab.models import build_net

    tmp_dir = Path(tmp)
    note = None
    if spm_path is None:
        pairs = read_multi30k(raw_multi30k(Path(raw)), "train", "en", "fr")
        train_sentencepiece([s for pair in pairs for s in pair if s], tmp_dir / "spm", 5000)
        spm_path = str(tmp_dir / "spm.model")
        note = f"trained a 5,000-piece sentencepiece model on the train split ({len(pairs)} pairs)"
    vocab = load_sentencepiece(spm_path).get_piece_size()
    torch.manual_seed(seed)
    net = build_net(NET, vocab_size=vocab, pad_id=0).eval()
    ckpt = tmp_dir / "random.ckpt"  # what attnlab.checkpoint.load_net reads (train.py's layout)
    torch.save(
        {
            "hyper_parameters": {"net": dict(NET), "vocab_size": vocab},
            "state_dict": {f"net.{k}": v for k, v in net.state_dict().items()},
        },
        ckpt,
    )
    with warnings.catch_warnings():  # the tracer's notes on the attention weights it keeps
        warnings.simplefilter("ignore")
        export_translation(
            net,
            Path(spm_path),
            tmp_dir / "export",
            _decoding_config(beam_size, alpha),
            ctranslate2=["float32", "int8"],
        )
    return {
        "checkpoint": str(ckpt),
        "export": str(tmp_dir / "export"),
        "spm": spm_path,
        "vocab": vocab,
        "note": note,
    }


def reexport(checkpoint: str, spm_path: str, out_dir: str, beam_size: int, alpha: float) -> str:
    """Export ``checkpoint`` (a Transformer) with both CTranslate2 models into ``out_dir``."""
    import warnings

    from attnlab.checkpoint import load_net
    from attnlab.export.trace import export_translation

    net = load_net(Path(checkpoint), expected_kind="transformer")
    with warnings.catch_warnings():  # the tracer's notes on the attention weights it keeps
        warnings.simplefilter("ignore")
        export_translation(
            net,
            Path(spm_path),
            Path(out_dir),
            _decoding_config(beam_size, alpha),
            ctranslate2=["float32", "int8"],
        )
    return out_dir


def export_has(export: Path, engines: list[str]) -> bool:
    """Whether ``export`` is a translation export (config.json) holding every Translator engine of
    ``engines``; its torch files are Translator's business (a broken folder fails in the worker)."""
    try:
        config = json.loads((export / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if config.get("task") != "translation":
        return False
    have = config.get("engines") or ["torch"]
    for e in engines:
        name = TRANSLATOR_ENGINE[e]
        if name is None:
            continue
        if name not in have:
            return False
        if name in QUANTIZATION and not (export / "ctranslate2" / QUANTIZATION[name] / "model.bin").is_file():
            return False
    return True


# --- worker: one engine × mode ---------------------------------------------------------------


def _load(spec: dict):
    """(decode: sentences → ids per sentence, detokenize: ids → str, info) for the worker's engine."""
    import torch

    torch.set_num_threads(spec["threads"])
    engine, beam, alpha, bs = spec["engine"], spec["beam_size"], spec["alpha"], spec["batch_size"]
    if engine in ("checkpoint", "checkpoint_bf16"):
        from attnlab.checkpoint import load_net
        from attnlab.data.tokenizer import load_sentencepiece
        from attnlab.inference.decoding import translate

        net = load_net(Path(spec["checkpoint"]), expected_kind="transformer")
        tokenizer = load_sentencepiece(spec["spm"])
        vocab = net.output.weight.shape[0]
        if tokenizer.get_piece_size() != vocab:
            raise ValueError(
                f"{spec['spm']} has {tokenizer.get_piece_size()} pieces but the "
                f"checkpoint's vocabulary is {vocab}: pass the model's --spm"
            )

        def decode(sentences):
            return translate(
                net.init_state,
                net.step,
                tokenizer,
                sentences,
                batch_size=bs,
                beam_size=beam,
                alpha=alpha,
                bf16=engine == "checkpoint_bf16",
            )

        return decode, tokenizer.decode, lambda: {}

    from attnlab.serving.translator import Translator

    name = TRANSLATOR_ENGINE[engine]
    translator = Translator(Path(spec["export"]), beam_size=beam, alpha=alpha, batch_size=bs, engine=name)

    def info():  # CTranslate2's compute type, once its model is loaded (first call)
        ct2 = getattr(translator, "_ctranslate2", {}).get(name)
        return {"compute_type": getattr(ct2, "compute_type", None)} if ct2 is not None else {}

    return translator._translate, translator.tokenizer.decode, info


def worker(conn, spec: dict) -> None:
    """Load the engine, warm up, then answer each ``sentences`` request with one timed pass."""
    try:
        t = time.perf_counter()
        decode, detok, info = _load(spec)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        decode(spec["sentences"][: spec["warmup"]])
        warmup_s = time.perf_counter() - t
        conn.send({"ready": True, "load_s": load_s, "warmup_s": warmup_s, "rss_load_mb": rss_mb(), **info()})
    except Exception:  # noqa: BLE001 - reported by the parent, which goes on without this engine
        conn.send({"error": traceback.format_exc()})
        return
    while True:
        msg = conn.recv()
        if msg is None:
            break
        try:
            t = time.perf_counter()
            ids = decode(spec["sentences"])
            seconds = time.perf_counter() - t
            conn.send(
                {
                    "seconds": seconds,
                    "ids": ids,
                    "hyps": [detok(x) for x in ids],
                    "rss_mb": rss_mb(),
                    "os_threads": len(os.listdir("/proc/self/task"))
                    if os.path.isdir("/proc/self/task")
                    else None,
                }
            )
        except Exception:  # noqa: BLE001 - any failure goes back to the parent as a traceback
            conn.send({"error": traceback.format_exc()})
            break
    conn.close()


# --- parent ----------------------------------------------------------------------------------


def fmt(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> None:
    beam_default, alpha_default = decoding_defaults()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sentences", type=int, default=None, help="decode the first N test sentences (default: all 1,000)"
    )
    p.add_argument("--runs", type=int, default=5, help="timed passes over the sentences per engine × mode")
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch.set_num_threads and OMP_NUM_THREADS (CTranslate2) of every worker",
    )
    p.add_argument("--batch-size", type=int, default=128, help="sentences decoded together")
    p.add_argument(
        "--beam-size",
        type=int,
        default=beam_default,
        help="beam of the beam mode (default: conf/model/transformer.yaml)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=alpha_default,
        help="length penalty of the beam mode (default: conf/model/transformer.yaml)",
    )
    p.add_argument("--warmup", type=int, default=8, help="sentences of the untimed warm-up call")
    p.add_argument(
        "--engines",
        default=None,
        help=f"comma list of {', '.join(ENGINES)} (default: all; checkpoint_bf16 only "
        "where the CPU has bf16 units)",
    )
    p.add_argument("--modes", default="greedy,beam", help="comma list of greedy, beam")
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "transformer" / "best.ckpt"))
    p.add_argument("--export", default=str(ROOT / "models" / "transformer"))
    p.add_argument(
        "--tokenized",
        default=str(ROOT / "data" / "tokenized" / "multi30k-en-fr"),
        help="the tokenize stage's folder: test.{src,tgt}.txt and spm.model",
    )
    p.add_argument(
        "--raw",
        default=str(ROOT / "data" / "raw"),
        help="raw corpora (multi30k/*.gz), when the tokenized folder is missing",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="a seeded random same-shape Transformer instead of the trained one",
    )
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    default = [e for e in ENGINES if e != "checkpoint_bf16" or cpu_facts()["bf16_units"]]
    engines = [e.strip() for e in a.engines.split(",") if e.strip()] if a.engines else default
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if bad := [e for e in engines if e not in ENGINES] + [m for m in modes if m not in ("greedy", "beam")]:
        p.error(f"unknown engine or mode {bad}; engines: {', '.join(ENGINES)}; modes: greedy, beam")
    if a.runs < 1 or a.threads < 1 or a.batch_size < 1 or a.beam_size < 1 or (a.sentences or 1) < 1:
        p.error("--sentences, --runs, --threads, --batch-size and --beam-size must be ≥ 1")
    mode_k = {"greedy": (1, 0.0), "beam": (a.beam_size, a.alpha)}
    mode_name = {"greedy": "greedy", "beam": f"beam{a.beam_size}"}

    load_start = os.getloadavg()
    tokenized = Path(a.tokenized)
    sources, refs, where = load_test(tokenized, Path(a.raw), a.sentences)
    print(f"{len(sources)} sentences of test_2016_flickr en→fr from {where}", flush=True)
    notes: list[str] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` cleans up
    tmp = tempfile.mkdtemp(prefix="translate_throughput-")
    ctx = mp.get_context("spawn")
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # inherited by every worker (CTranslate2's threads)
    workers: dict[tuple[str, str], tuple] = {}
    try:
        spm = tokenized / "spm.model"
        random_weights = a.random_weights
        checkpoint, export = Path(a.checkpoint), Path(a.export)
        if not random_weights and not checkpoint.is_file():
            random_weights = True
            notes.append(f"{checkpoint} not found: using random weights")
        t = time.perf_counter()
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:  # torch stays out of this process
            if random_weights:
                print("building and exporting a random-weights Transformer ...", flush=True)
                made = pool.submit(
                    prepare_random,
                    tmp,
                    str(spm) if spm.is_file() else None,
                    a.raw,
                    a.seed,
                    a.beam_size,
                    a.alpha,
                ).result()
                checkpoint, export, spm = Path(made["checkpoint"]), Path(made["export"]), Path(made["spm"])
                notes += [n for n in (made["note"], RANDOM_NOTE) if n]
            else:
                snapshot = Path(tmp) / "best.ckpt"  # a training run may replace the file meanwhile
                shutil.copy(checkpoint, snapshot)
                if not spm.is_file() and (export / "spm.model").is_file():
                    spm = export / "spm.model"
                if not export_has(export, engines):
                    why = (
                        "not found"
                        if not (export / "config.json").exists()
                        else "lacks a requested engine (CTranslate2 models)"
                    )
                    print(f"{export} {why}: exporting {checkpoint} to a temporary folder ...", flush=True)
                    export = Path(
                        pool.submit(
                            reexport, str(snapshot), str(spm), str(Path(tmp) / "export"), a.beam_size, a.alpha
                        ).result()
                    )
                    notes.append(
                        f"the export engines use {checkpoint} exported to a temporary "
                        f"folder, because {a.export} {why}"
                    )
                checkpoint = snapshot
        prep_s = time.perf_counter() - t
        caps = cap_tokens(spm, sources)
        parent_rss = rss_mb()
        busy = load_start[0] + a.threads - (os.cpu_count() or 1)
        if busy > 0.5:
            notes.append(
                f"the CPUs were busy (load average {load_start[0]:.1f} on {os.cpu_count()} CPUs, "
                f"threads per engine: {a.threads}): OpenMP threads that spin-wait (torch's and "
                "CTranslate2's default) slow down badly on busy cores (on a 2-core machine "
                "at load 4-5 torch with 2 threads decoded 20× slower than with 1); rerun on "
                "an idle machine, or with --threads 1, or with OMP_WAIT_POLICY=PASSIVE set"
            )

        order = [(e, m) for m in modes for e in engines]
        errors: dict[str, str] = {}
        for e, m in order:  # one at a time, so that loading and warm-up do not compete
            beam, alpha = mode_k[m]
            spec = {
                "engine": e,
                "beam_size": beam,
                "alpha": alpha,
                "batch_size": a.batch_size,
                "threads": a.threads,
                "warmup": a.warmup,
                "sentences": sources,
                "checkpoint": str(checkpoint),
                "export": str(export),
                "spm": str(spm),
            }
            here, there = ctx.Pipe()
            proc = ctx.Process(target=worker, args=(there, spec), daemon=True)
            proc.start()
            there.close()
            try:
                ready = here.recv()
            except EOFError:
                proc.join()
                ready = {"error": f"worker exited with code {proc.exitcode}"}
            name = f"{KEY[e]}_{mode_name[m]}"
            if "error" in ready:
                errors[name] = ready["error"].strip().splitlines()[-1]
                print(f"{e} {mode_name[m]}: failed to start: {errors[name]}", flush=True)
                proc.join()
                continue
            workers[(e, m)] = (proc, here, ready, [])
            print(
                f"{e} {mode_name[m]}: loaded in {ready['load_s']:.1f} s, warm-up "
                f"{ready['warmup_s']:.1f} s"
                + (f", compute type {ready['compute_type']}" if ready.get("compute_type") else ""),
                flush=True,
            )

        live = [k for k in order if k in workers]
        for r in range(a.runs):
            rotated = live[r % len(live) :] + live[: r % len(live)] if live else []
            for key in rotated:
                proc, conn, _, results = workers[key]
                conn.send("run")
                try:
                    res = conn.recv()
                except EOFError:
                    res = {"error": f"worker exited with code {proc.exitcode}"}
                name = f"{KEY[key[0]]}_{mode_name[key[1]]}"
                if "error" in res:
                    errors[name] = res["error"].strip().splitlines()[-1]
                    print(f"run {r + 1}: {key[0]} {mode_name[key[1]]} failed: {errors[name]}", flush=True)
                    live = [k for k in live if k != key]
                    continue
                results.append(res)
                print(
                    f"run {r + 1}/{a.runs}: {key[0]:>10} {mode_name[key[1]]:<7} "
                    f"{len(sources) / res['seconds']:8.2f} sentences/s ({res['seconds']:.2f} s)",
                    flush=True,
                )
                time.sleep(0.05)  # let the last engine's OpenMP threads stop spinning

        import sacrebleu

        result: dict = {}
        rows = []
        reference_ids = {
            m: workers[("checkpoint", m)][3][0]["ids"]
            for m in modes
            if ("checkpoint", m) in workers and workers[("checkpoint", m)][3]
        }
        for e, m in order:
            name = f"{KEY[e]}_{mode_name[m]}"
            runs = workers[(e, m)][3] if (e, m) in workers else []
            if not runs:
                for k in (name, f"tokens_per_s_{name}", f"bleu_{name}", f"rss_mb_{name}"):
                    result[k] = None
                continue
            ready = workers[(e, m)][2]
            sps = [len(sources) / x["seconds"] for x in runs]
            tokens = [sum(len(ids) for ids in x["ids"]) for x in runs]
            tps = [n / x["seconds"] for n, x in zip(tokens, runs)]
            secs = [x["seconds"] for x in runs]
            bleus = [sacrebleu.corpus_bleu(x["hyps"], [refs]).score for x in runs]
            same = None
            if m in reference_ids:
                same = sum(x == y for x, y in zip(runs[0]["ids"], reference_ids[m])) / max(len(sources), 1)
            stable = all(x["ids"] == runs[0]["ids"] for x in runs)
            peak = max(x["rss_mb"] for x in runs)
            result.update(
                {
                    name: statistics.median(sps),
                    f"{name}_min": min(sps),
                    f"{name}_max": max(sps),
                    f"tokens_per_s_{name}": statistics.median(tps),
                    f"tokens_per_s_{name}_min": min(tps),
                    f"tokens_per_s_{name}_max": max(tps),
                    f"seconds_{name}": statistics.median(secs),
                    f"tokens_{name}": tokens[0],
                    **(
                        {f"cap_tokens_per_s_{name}": caps / statistics.median(secs)} if random_weights else {}
                    ),
                    f"bleu_{name}": statistics.median(bleus),
                    f"rss_mb_{name}": peak,
                    f"rss_load_mb_{name}": ready["rss_load_mb"],
                    f"same_as_torch_{name}": same,
                    f"os_threads_{name}": runs[-1]["os_threads"],
                }
            )
            if not stable:
                notes.append(f"{name}: the output ids differ between runs")
            if ready.get("compute_type"):
                result[f"compute_type_{name}"] = ready["compute_type"]
            rows.append(
                (
                    e,
                    mode_name[m],
                    fmt(sps),
                    fmt(tps, 0),
                    *([fmt([caps / x for x in secs], 0)] if random_weights else []),
                    fmt(secs, 2),
                    fmt(bleus, 2),
                    "—" if same is None else f"{same:.3f}",
                    f"{peak:.0f}",
                    str(runs[-1]["os_threads"]),
                    f"{ready['load_s']:.1f}",
                )
            )

        def ratio(x, y):
            return result[x] / result[y] if result.get(x) and result.get(y) else None

        for m in modes:
            mn = mode_name[m]
            for q in ("fp32", "int8"):
                result[f"{mn}_vs_ct2_{q}"] = ratio(f"torch_{mn}", f"ct2_{q}_{mn}")
            result[f"{mn}_export_vs_torch"] = ratio(f"export_{mn}", f"torch_{mn}")
            result[f"{mn}_ct2_int8_vs_fp32"] = ratio(f"ct2_int8_{mn}", f"ct2_fp32_{mn}")
            result[f"{mn}_bf16_vs_torch"] = ratio(f"torch_bf16_{mn}", f"torch_{mn}")

        header = (
            "engine",
            "mode",
            "sentences/s",
            "tokens/s",
            *(["cap tokens/s"] if random_weights else []),
            "seconds",
            "BLEU",
            "same",
            "peak RSS MiB",
            "os_threads",
            "load s",
        )
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print()
        print("  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
        for r in rows:
            print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        print(
            f"median (min–max) over {a.runs} run(s) of {len(sources)} sentences; tokens: "
            f"{TOKENS_COUNTED}; seconds: one pass, text in → ids out (detokenization not timed); "
            "same: fraction of sentences with the checkpoint's ids; peak RSS: the worker process, "
            "over loading, warm-up and all runs"
        )
        for m in modes:
            mn = mode_name[m]
            if result.get(f"{mn}_vs_ct2_fp32") is not None:
                print(f"{mn}: checkpoint / ct2_fp32 sentences/s = {result[f'{mn}_vs_ct2_fp32']:.2f}")
        for n in notes:
            print(f"note: {n}")
        for name, err in errors.items():
            print(f"error: {name}: {err}")

        result.update(
            **cpu_facts(),
            torch=version("torch"),
            ctranslate2=version("ctranslate2"),
            sacrebleu=version("sacrebleu"),
            threads=a.threads,
            ct2_threads=f"intra_threads {a.threads} (Translator's: torch's), OMP_NUM_THREADS={a.threads}",
            omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
            sentences=len(sources),
            cap_tokens=caps,
            runs=a.runs,
            batch_size=a.batch_size,
            beam_size=a.beam_size,
            alpha=a.alpha,
            warmup_sentences=a.warmup,
            random_weights=random_weights,
            bleu_meaningful=not random_weights,
            tokens_counted=TOKENS_COUNTED,
            test_set="multi30k test_2016_flickr en-fr",
            data=where,
            checkpoint=a.checkpoint if not random_weights else None,
            export=str(export) if not str(export).startswith(tmp) else f"temporary ({a.export} not used)",
            prepare_s=prep_s,
            parent_rss_mb=parent_rss,
            load_avg_start=load_start[0],
            load_avg_end=os.getloadavg()[0],
            notes=notes,
            errors=errors,
        )
        print(json.dumps(result))
    finally:
        for _proc, conn, _, _ in workers.values():
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(None)
        for proc, _, _, _ in workers.values():
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

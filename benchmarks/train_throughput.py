"""Training and decoding throughput: attnlab's Transformer vs a model built on torch.nn.Transformer.

Both models: d_model 256, 4 heads, 3+3 layers, ffn 1024, dropout 0.1, a joint
sentencepiece vocabulary of 8000 trained on Multi30k en→fr, tied embeddings
and output projection, sinusoidal positions, AdamW, label smoothing 0.1. Both
train on the very same token-budget batches (``--max-tokens`` padded tokens,
length-sorted, :class:`attnlab.data.batching.TokenBudgetBatchSampler`) for
``--steps`` timed steps after ``--warmup`` untimed ones, in fp32 and under
bf16 autocast (the loss in float32), alternating the models so that
machine noise hits all alike. Each trains as its user would: attnlab with its
own loss (:func:`attnlab.loss.sequence_loss`, the output layer and
cross-entropy in chunks, never all (B, T, V) logits at once), the peer with
``F.cross_entropy`` over all logits. ``--logits-loss`` (default on) also times
attnlab's model with the peer's loss, separating the model from the loss.
Under bf16 autocast attnlab's output layer stays in float32 (inside
:func:`attnlab.loss.linear_cross_entropy`) while the peer's runs in bf16, so
the bf16 figures are not like for like; the peak RSS covers all the models.

Reported: target tokens/s of each (the non-pad target tokens of the timed
batches / wall time), their ratios, peak RSS of the process, model FLOP
utilization (the analytic FLOPs of the timed steps / wall time, against a
matmul rate measured in the same run), the padding fraction of the batches,
and greedy and beam-5 decoding sentences/s of attnlab's Transformer with and
without its KV cache, for outputs of exactly ``--decode-len`` tokens (<eos> is
forbidden while decoding, so every sentence costs the same number of steps).
The last line is one JSON object.

    python benchmarks/train_throughput.py [--steps 10 --bf16-steps 3 --warmup 3 --max-tokens 2400]
    ATTNLAB_DATA_MIRROR=../shared/data python benchmarks/train_throughput.py   # no data/raw yet
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from attnlab.data.batching import PairDataset, TokenBudgetBatchSampler, collate, padding_fraction
from attnlab.data.corpora import read_multi30k
from attnlab.data.tokenizer import EOS_ID, PAD_ID, train_sentencepiece
from attnlab.inference.decoding import beam_search, greedy_decode
from attnlab.loss import sequence_loss
from attnlab.models.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]


class TorchTransformerMT(nn.Module):
    """What a user would write with torch.nn.Transformer: embeddings, sinusoidal positions, tied output."""

    def __init__(self, vocab_size, d_model, num_heads, num_layers, ffn_hidden, dropout):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        pos = torch.arange(1024, dtype=torch.float32)[:, None]
        div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        pe = torch.zeros(1024, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos / div), torch.cos(pos / div)
        self.register_buffer("pe", pe, persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model, num_heads, num_layers, num_layers, ffn_hidden, dropout, batch_first=True
        )
        self.output = nn.Linear(d_model, vocab_size, bias=False)
        self.output.weight = self.embedding.weight

    def _embed(self, tokens):
        return self.dropout(self.embedding(tokens) * math.sqrt(self.d_model) + self.pe[: tokens.shape[1]])

    def forward(self, src, src_valid_lens, tgt_in):
        src_pad = torch.arange(src.shape[1])[None, :] >= src_valid_lens[:, None]
        T = tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.bool)
        out = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_in == PAD_ID,
        )
        return self.output(out)


def logits_loss(model, batch):
    """The obvious loss: all (B, T, V) logits, then F.cross_entropy (what the peer's user writes)."""
    logits = model(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
    return F.cross_entropy(
        logits.float().flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=PAD_ID, label_smoothing=0.1
    )


def attnlab_loss(model, batch):
    """What attnlab's TranslationModule trains with: the chunked output layer + loss."""
    return sequence_loss(model, batch, 0.1)


def train_step(model, opt, batch, bf16: bool, loss_fn=logits_loss):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = loss_fn(model, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def step_flops(batch, d, ffn, layers, vocab) -> float:
    """Analytic training FLOPs of one batch (forward ×3): matmuls of projections, FFN,
    attention scores/values and the output layer, on the padded tensors."""
    B, S = batch["src"].shape
    T = batch["tgt_in"].shape[1]
    proj, ff = 2 * 4 * d * d, 2 * 2 * d * ffn  # per token: Q,K,V,O; two FFN layers
    enc = layers * (B * S * (proj + ff) + 2 * 2 * B * S * S * d)
    dec = layers * (B * T * (2 * proj + ff) + 2 * 2 * B * T * T * d + 2 * 2 * B * T * S * d)
    out = 2 * B * T * d * vocab
    return 3.0 * (enc + dec + out)


def matmul_rate(dtype, n=1024, reps=20) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t)


def without_eos(step):
    """``step`` with <eos> forbidden, so every output has exactly the decoding length."""

    def forced(ys, *state):
        logits, *state = step(ys, *state)
        return (logits.index_fill(-1, torch.tensor([EOS_ID]), float("-inf")), *state)

    return forced


def load_pairs(args):
    raw = Path(args.raw)
    if not (raw / "multi30k").is_dir():
        mirror = os.environ.get("ATTNLAB_DATA_MIRROR")
        if not mirror:
            raise SystemExit(f"no {raw}/multi30k: run `dvc repro download` or set ATTNLAB_DATA_MIRROR")
        raw = Path(mirror)
    return read_multi30k(raw / "multi30k", "train", "en", "fr"), read_multi30k(
        raw / "multi30k", "val", "en", "fr"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--raw", default=str(ROOT / "data" / "raw"))
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=2400)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--bf16-steps",
        type=int,
        default=3,
        help="timed bf16 steps (few: a CPU without bf16 matrix units is ~20× slower)",
    )
    p.add_argument("--decode-sentences", type=int, default=64)
    p.add_argument("--decode-len", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--logits-loss",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time attnlab's model with the peer's full-logits loss",
    )
    a = p.parse_args()
    torch.manual_seed(a.seed)

    train, val = load_pairs(a)
    with tempfile.TemporaryDirectory() as tmp:
        sp = train_sentencepiece([s for pair in train for s in pair], Path(tmp) / "spm", a.vocab)
    V = sp.get_piece_size()
    ds = PairDataset(sp.encode([s for s, _ in train]), sp.encode([t for _, t in train]), max_len=100)
    sampler = TokenBudgetBatchSampler(ds.lengths(), a.max_tokens, seed=a.seed)
    epoch = list(sampler)
    n_batches = a.warmup + max(a.steps, a.bf16_steps)
    batches = [collate([ds[i] for i in b]) for b in epoch[:n_batches]]
    pad_epoch = padding_fraction(epoch, ds.src, ds.tgt)

    size = dict(d_model=256, num_heads=4, num_layers=3, ffn_hidden=1024, dropout=0.1)
    models = {"attnlab": Transformer(V, **size, tie_embeddings=True), "peer": TorchTransformerMT(V, **size)}
    # attnlab as it trains (attnlab.loss) and the peer as a user writes it (full logits).
    losses = {"attnlab": attnlab_loss, "peer": logits_loss}
    if a.logits_loss:  # also attnlab's model with the peer's loss: the model alone vs the peer
        models["attnlab_logits_loss"] = Transformer(V, **size, tie_embeddings=True)
        losses["attnlab_logits_loss"] = logits_loss
    params = {k: sum(p.numel() for p in m.parameters()) for k in ("attnlab", "peer") for m in [models[k]]}
    result = {
        "vocab": V,
        "params_attnlab": params["attnlab"],
        "params_peer": params["peer"],
        "padding_fraction": pad_epoch,
        "batches_per_epoch": len(epoch),
    }

    for precision, steps in (("fp32", a.steps), ("bf16", a.bf16_steps)):
        if steps < 1:
            continue
        bf16 = precision == "bf16"
        opts = {k: torch.optim.AdamW(m.parameters(), lr=5e-4) for k, m in models.items()}
        for m in models.values():
            m.train()
        for b in batches[: a.warmup]:
            for k in models:
                train_step(models[k], opts[k], b, bf16, losses[k])
        elapsed = dict.fromkeys(models, 0.0)
        timed = batches[a.warmup : a.warmup + steps]
        for b in timed:  # alternate the models batch by batch
            for k in models:
                t = time.perf_counter()
                train_step(models[k], opts[k], b, bf16, losses[k])
                elapsed[k] += time.perf_counter() - t
        tokens = sum(int((b["tgt_out"] != PAD_ID).sum()) for b in timed)
        flops = sum(step_flops(b, 256, 1024, 3, V) for b in timed)
        rate = matmul_rate(torch.bfloat16 if bf16 else torch.float32)
        for k in models:
            result[f"{k}_{precision}"] = tokens / elapsed[k]
            result[f"mfu_{k}_{precision}"] = flops / elapsed[k] / rate
        result[f"matmul_gflops_{precision}"] = rate / 1e9
        result[f"attnlab_vs_peer_{precision}"] = elapsed["peer"] / elapsed["attnlab"]
        if "attnlab_logits_loss" in models:
            result[f"attnlab_logits_loss_vs_peer_{precision}"] = (
                elapsed["peer"] / elapsed["attnlab_logits_loss"]
            )
        print(
            f"{precision}: attnlab {result[f'attnlab_{precision}']:.0f} tok/s, "
            f"peer {result[f'peer_{precision}']:.0f} tok/s, "
            f"ratio {result[f'attnlab_vs_peer_{precision}']:.2f}"
            + (
                f"; attnlab's model with the peer's loss "
                f"{result[f'attnlab_logits_loss_{precision}']:.0f} tok/s"
                if "attnlab_logits_loss" in models
                else ""
            ),
            flush=True,
        )
    if a.bf16_steps >= 1:
        result["bf16_vs_fp32_attnlab"] = result["attnlab_bf16"] / result["attnlab_fp32"]
        result["bf16_vs_fp32_peer"] = result["peer_bf16"] / result["peer_fp32"]

    net = models["attnlab"].eval()
    sources = [s for s, _ in val[: a.decode_sentences]]
    src, valid = sp.encode_sources(sources)
    interfaces = {
        "cached": (net.init_state, without_eos(net.step)),
        "uncached": (net.init_state_uncached, without_eos(net.step_uncached)),
    }
    outputs = {}
    for beam in (1, 5):
        for name, (init, step) in interfaces.items():
            t = time.perf_counter()
            if beam == 1:
                ys = greedy_decode(init, step, src, valid, a.decode_len)
            else:
                ys = beam_search(init, step, src, valid, a.decode_len, beam_size=beam)
            key = "decode_" + ("" if beam == 1 else f"beam{beam}_") + name
            result[key] = len(sources) / (time.perf_counter() - t)
            outputs[(beam, name)] = ys
        same = torch.equal(outputs[(beam, "cached")], outputs[(beam, "uncached")])
        result[f"decode_beam{beam}_identical_tokens"] = same
        result[f"decode_beam{beam}_mean_len"] = float(
            (outputs[(beam, "cached")] != PAD_ID).sum(1).float().mean()
        )
    result["decode_cached_vs_uncached"] = result["decode_cached"] / result["decode_uncached"]
    result["decode_beam5_cached_vs_uncached"] = (
        result["decode_beam5_cached"] / result["decode_beam5_uncached"]
    )
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.update(threads=torch.get_num_threads(), torch=torch.__version__, **vars(a))
    for k, v in result.items():
        print(f"{k:>34}: {v:.3f}" if isinstance(v, float) else f"{k:>34}: {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

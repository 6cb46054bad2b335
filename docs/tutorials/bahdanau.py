# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Bahdanau attention: the alignment a translation model learns
#
# *English* · [中文](../../tutorials/bahdanau.zh/)
#
# This page follows *Dive into Deep Learning* section **11.4 "The Bahdanau Attention
# Mechanism"** (Chinese edition 10.4 Bahdanau 注意力) with attnlab's own model
# (`src/attnlab/models/bahdanau.py`) **trained by attnlab's pipeline** on Multi30k
# English→French. Every claim below is computed on this page, or read from the project's
# committed results (section 4), and checked with an `assert`; the
# site runs the page when it is built, and the tests run it too (`tests/test_tutorials.py`), so a
# claim that stops being true fails CI.
#
# You will:
#
# 1. compute one decoding step's context vector by hand, from the trained model's own weights,
#    and check it against the model;
# 2. draw the **alignment** of the example "The cat is on the mat." → "Le chat est sur le
#    tapis." and of D2L's "go ." → "va !", and check that *chat* looks at *cat*;
# 3. measure how close to the diagonal the alignments of the validation sentences lie;
# 4. read the pipeline's **BLEU by source length** for the attention-free seq2seq model, Bahdanau
#    and the Transformer: what a fixed context vector costs, and how strong that evidence is.
#
# **The trained model.** The full mode (how the site is built) reads the model that `dvc repro`
# trained in this project (`runs/bahdanau.json`, the `train@bahdanau` stage; see
# [Your first run](../../tutorials/first-run/)). The fast mode (`ATTNLAB_TUTORIAL_FAST=1`, what
# CI runs) trains its own for one epoch with the same `src/train.py` and the same recipe
# (`params.yaml`), in `.cache/trained/` of the project, and checks the same assertions. If the
# pipeline's model is missing, the full mode does the same and says so. No weights of unknown
# origin are used: the page prints the MLflow run its model comes from.
#
# **Running time.** The last cell prints how long the run shown here took, and the first code
# cell how long getting the model took. The one-epoch training of the fast mode takes about a
# minute on 2 idle CPU cores, several times that on a busy machine. It runs once: later runs
# reuse it until the code, the configs or `params.yaml` change. It needs the corpus, from the
# internet or from the folder in `ATTNLAB_DATA_MIRROR`. To run the
# page yourself: `python docs/tutorials/bahdanau.py`, or open it in Jupyter with
# [jupytext](https://jupytext.readthedocs.io/).

# %%
import csv
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attnlab
from attnlab.analysis.heads import diagonal_offset
from attnlab.analysis.provenance import git_commit
from attnlab.analysis.trained import trained_model
from attnlab.data.corpora import read_lines
from attnlab.data.special_tokens import BOS_ID, EOS_ID, PAD_ID
from attnlab.inference.decoding import translate

START = time.perf_counter()
FAST = os.environ.get("ATTNLAB_TUTORIAL_FAST") == "1"  # a one-epoch model, fewer sentences, same assertions
ROOT = Path(attnlab.__file__).resolve().parents[2]  # the project: params.yaml, runs/, results/
torch.manual_seed(0)
print("mode:", "fast" if FAST else "full")

# fast: a one-epoch run of the pipeline's recipe; full: the pipeline's model (or that run, if none)
model = trained_model("bahdanau", ROOT, epochs=1 if FAST else None, fallback_epochs=1)
net, sp = model.net, model.tokenizer
print("model:", model.origin)
# the examples below are English→French: a model of another direction (params.yaml) cannot show them
assert model.tokenized.name.endswith("-en-fr"), f"this page needs an en→fr model, not {model.tokenized.name}"
print(f"model ready after {time.perf_counter() - START:.1f} s")

# %% [markdown]
# ## 1. One decoding step, by hand
#
# The encoder, a GRU, reads the source and keeps one hidden state $\mathbf h_j$ per source token.
# The decoder is another GRU. Before it emits target token $t$, its query is its previous
# hidden state $\mathbf s_{t-1}$, and the **context vector** is an attention pooling of the
# encoder states (D2L eq. 11.4.1 (zh 10.4.1)):
#
# $$\mathbf c_t = \sum_{j} \alpha(\mathbf s_{t-1}, \mathbf h_j)\, \mathbf h_j, \qquad
# \alpha(\mathbf s, \mathbf h_j) = \operatorname{softmax}_j\big(\mathbf w_v^\top
# \tanh(\mathbf W_q \mathbf s + \mathbf W_k \mathbf h_j)\big),$$
#
# additive scoring (D2L 11.3.4 (zh 10.3.2)). The decoder's input at step $t$ is
# $[\mathbf c_t; \operatorname{embed}(y_{t-1})]$. In attnlab the encoder is `net.encoder`, the
# scoring is `net.attention` (an `AdditiveAttention` with `W_q`, `W_k` and `w_v`) and the
# decoder is `net.rnn`; `net.attention_maps` runs the decoder on a given target (teacher
# forcing) and returns the weights $\alpha$, one row per target token.
#
# Below, the first two steps of "A dog runs in the snow." → "Un chien court dans la neige." are
# recomputed with plain tensor operations from the trained weights: the weights $\alpha$, the
# context $\mathbf c_t$ and the decoder's next state. They are compared with the model's own
# weights and with the states `net.features` returns (the decoder's top-layer output at each
# step, which the context fed).

# %%
source, target = "A dog runs in the snow.", "Un chien court dans la neige."
src, src_lens = sp.encode_sources([source])  # (1, S) ids with <eos>, (1,) its length
tgt_in = torch.tensor([[BOS_ID] + sp.encode(target)])  # (1, T): <bos> + the target's pieces
with torch.no_grad():
    weights = net.attention_maps(src, src_lens, tgt_in)["alignment"][0][0, 0]  # (T, S)
    states = net.features(src, src_lens, tgt_in)[0]  # (T, h): the decoder's output at each step

    H, last = net.encoder(src, src_lens)  # H: (1, S, h), one state per source token
    a = net.attention
    s = last  # the decoder starts from the encoder's last state: (layers, 1, h)
    by_hand = []
    for t in range(2):
        query = s[-1]  # s_{t-1}: (1, h), the top layer
        scores = a.w_v(torch.tanh(a.W_q(query)[:, None] + a.W_k(H))).squeeze(-1)  # (1, S)
        alpha = torch.softmax(scores, dim=-1)  # (1, S); no padding in a batch of one
        context = alpha @ H[0]  # (1, h): Σ_j α_j h_j
        x = torch.cat([context, net.embedding(tgt_in[:, t])], dim=-1)[:, None]  # (1, 1, h + e)
        _, s = net.rnn(x, s)
        by_hand.append((alpha[0], s[-1, 0]))  # α_t and the new top-layer state
pieces = [sp.id_to_piece(int(i)) for i in src[0]]
for t, (alpha, _) in enumerate(by_hand):
    word = sp.id_to_piece(int(tgt_in[0, t + 1]))
    print(f"step {t + 1} ({word!r}): α =", " ".join(f"{p}:{w:.2f}" for p, w in zip(pieces, alpha.tolist())))

# %%
for t, (alpha, state) in enumerate(by_hand):
    assert torch.allclose(alpha, weights[t], atol=1e-5), (t, alpha, weights[t])
    assert abs(float(alpha.sum()) - 1) < 1e-5  # a distribution over the source tokens
    assert torch.allclose(state, states[t], atol=1e-5)  # the context by hand gives the model's state

# %% [markdown]
# The weights and the states agree with the model's to 10⁻⁵. The same step inside a **padded batch** must
# give the same weights, with exactly zero weight on the padding (the masked softmax of
# D2L 11.3.2.1 (zh 10.3.1)): the sentence is batched with a longer one.

# %%
longer = "Two young men in red shirts are playing football on a green field near the old church."
batch_src, batch_lens = sp.encode_sources([source, longer])  # padded to the longer sentence
batch_tgt = torch.nn.utils.rnn.pad_sequence(
    [tgt_in[0], torch.tensor([BOS_ID] + sp.encode("Deux jeunes hommes jouent au football."))],
    batch_first=True,
    padding_value=PAD_ID,
)
with torch.no_grad():
    batched = net.attention_maps(batch_src, batch_lens, batch_tgt)["alignment"][0][0, 0]  # (T', S')
S, T = src.shape[1], tgt_in.shape[1]
print(
    f"alone: {S} source tokens; in the batch: {batch_src.shape[1]}, of which {batch_src.shape[1] - S} padding"
)
assert batch_src.shape[1] > S
assert torch.all(batched[:T, S:] == 0)  # no weight at all on the padding
assert torch.allclose(batched[:T, :S], weights, atol=1e-5)  # the same alignment, alone or batched

# %% [markdown]
# ## 2. The alignment of a sentence: *chat* looks at *cat*
#
# A common example in study notes is "The cat is on the mat." → "Le chat est sur le tapis.":
# when the decoder emits *chat*, its largest weight should be on *cat*. D2L's own example is
# "go ." → "va !" (lower-cased and split into words by D2L's preprocessing; here the raw text
# "Go." → "Va !"). Below, both are teacher-forced through the trained model (the reference
# translation is fed in, so each row is the attention **when that target piece is produced**),
# and the rows are drawn as heatmaps, source pieces across and target pieces down. The pieces
# are the sentencepiece model's: "▁" marks the start of a word, and a word may be split, as
# "Go" into "▁G" "o".


# %%
def alignment(source: str, target: str) -> tuple[torch.Tensor, list[str], list[str]]:
    """(T, S) weights of the teacher-forced target, the source pieces (with <eos>) and the
    target pieces, each row the attention while that target piece is produced."""
    src, lens = sp.encode_sources([source])
    ids = sp.encode(target)
    with torch.no_grad():
        w = net.attention_maps(src, lens, torch.tensor([[BOS_ID] + ids]))["alignment"][0][0, 0]
    return w, [sp.id_to_piece(int(i)) for i in src[0]], [sp.id_to_piece(i) for i in ids]


def draw(ax, w, src_pieces, tgt_pieces, title):
    ax.imshow(w, cmap="Reds", vmin=0, vmax=1)
    ax.set_xticks(range(len(src_pieces)), src_pieces, rotation=90)
    ax.set_yticks(range(len(tgt_pieces)), tgt_pieces)
    ax.set(xlabel="source (keys)", ylabel="target (queries)", title=title)


examples = {
    "cat": ("The cat is on the mat.", "Le chat est sur le tapis."),
    "go": ("Go.", "Va !"),
}
maps = {name: alignment(*pair) for name, pair in examples.items()}
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained", width_ratios=[8, 4])
for ax, (name, (w, s, t)) in zip(axes, maps.items()):
    draw(ax, w, s, t, " → ".join(examples[name]))
plt.show()

w, s, t = maps["cat"]
for piece, row in zip(t, w):
    print(f"{piece:>8} looks most at {s[int(row.argmax())]!r:8} ({float(row.max()):.2f})")

# %%
w, s, t = maps["cat"]
chat, cat = t.index("▁chat"), s.index("▁cat")
assert int(w[chat].argmax()) == cat, f"'chat' looks most at {s[int(w[chat].argmax())]!r}, not 'cat'"
w, s, t = maps["go"]
go = {j for j, piece in enumerate(s) if piece in ("▁G", "o", "▁Go")}  # the pieces of "Go"
va = [i for i, piece in enumerate(t) if piece in ("▁V", "a", "▁Va")]  # the pieces of "Va"
assert go and va and all(int(w[i].argmax()) in go for i in va), "the pieces of 'Va' do not look at 'Go'"

# %% [markdown]
# The model was never told which word translates which: it learned to predict the next French
# piece, and attending to *cat* when emitting *chat* is what made that prediction easy. Only the
# *chat* row is asserted. The alignment is **soft** and not exact: each row spreads some weight
# over other words, function words such as *le* or *est* attend where the context helps most,
# and in a briefly trained model (the fast mode's) the rows after *chat* may sit one word off,
# *tapis* looking at the full stop rather than at *mat*.
#
# The model's own translation, decoded greedily, and its alignment, as `src/translate.py …
# +show_attention=true` draws it for any sentence. Multi30k's captions of Flickr photos rarely
# mention cats, so the translation may well miss this sentence's words: it answers another
# question than the alignment above, which asked where the model looks when it is *given*
# the reference.

# %%
own = translate(net.init_state, net.step, sp, [examples["cat"][0]])[0]  # greedy: the output's ids
print("translation:", sp.decode(own))
w, s, t = alignment(examples["cat"][0], sp.decode(own))
fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
draw(ax, w, s, t, "the model's own translation")
plt.show()

# %% [markdown]
# ## 3. Alignments lie near the diagonal
#
# English and French mostly keep the same word order, so a good alignment runs near the
# diagonal: the $t$-th of $T$ target pieces looks near the $(t/T)$-th part of the source. For
# every validation sentence, teacher-forced, `attnlab.analysis.heads.diagonal_offset` takes each
# row's arg-max source position $s^*$ and measures
# $\big|\frac{s^*+1/2}{S} - \frac{t+1/2}{T}\big|$, the distance from the diagonal as a fraction
# of the sentence. The same measure for a **random** arg-max (each $s^*$ drawn uniformly) is the
# baseline: an attention that ignored the words would score about that.

# %%
N_VAL = 200 if FAST else 1000  # validation sentences
sources = read_lines(model.tokenized / "val.src.txt")[:N_VAL]
targets = read_lines(model.tokenized / "val.tgt.txt")[:N_VAL]
src, src_lens = sp.encode_sources(sources)
tgt = [torch.tensor([BOS_ID] + sp.encode(t) + [EOS_ID]) for t in targets]
tgt = torch.nn.utils.rnn.pad_sequence(tgt, batch_first=True, padding_value=PAD_ID)
tgt_in, tgt_lens = tgt[:, :-1], (tgt[:, 1:] != PAD_ID).sum(1)
with torch.no_grad():
    w = net.attention_maps(src, src_lens, tgt_in)["alignment"][0]  # (B, 1, T, S)
trained_offset = float(diagonal_offset(w, tgt_lens, src_lens)[0])

g = torch.Generator().manual_seed(0)
random_w = torch.rand(w.shape, generator=g)  # a random arg-max per row (masked to the source)
random_offset = float(diagonal_offset(random_w, tgt_lens, src_lens)[0])
print(f"mean distance from the diagonal, {N_VAL} val sentences:")
print(f"  trained {trained_offset:.3f}, random {random_offset:.3f}")
assert trained_offset < 0.5 * random_offset

# %% [markdown]
# ## 4. What a fixed context vector costs
#
# Before attention, the encoder–decoder of D2L 10.7 (zh 9.7) handed the decoder **one** vector,
# the encoder's last state, for the whole sentence: a fixed-size summary, whatever the length.
# Bahdanau et al. (2015) argued that this bottleneck hurts most on long sentences, and gave the
# decoder a new context at every step instead. attnlab trains both, with the same sizes
# (`model=seq2seq` is Bahdanau without the attention; see
# [Ablations](../../how-to/ablations/)), and the pipeline scores each on the test set, in
# buckets of source length. The numbers are the committed results file
# `results/bleu_by_length.csv` (written by `scripts/bleu_by_length.py`; its `note` says which
# runs and machine).

# %%
with open(ROOT / "results" / "bleu_by_length.csv", newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
print(rows[0]["note"])
models = list(dict.fromkeys(r["model"] for r in rows))
bleu = {m: [float(r["bleu"]) for r in rows if r["model"] == m] for m in models}
labels = [
    f"{r['words_min']}–{r['words_max']}" if r["words_max"] else f"{r['words_min']}+"
    for r in rows
    if r["model"] == models[0]
]
sentences = [int(r["sentences"]) for r in rows if r["model"] == models[0]]
print(f"{'source words':12}", "  ".join(f"{lab:>6}" for lab in labels))
print(f"{'sentences':12}", "  ".join(f"{n:>6}" for n in sentences))
for m in models:
    kept = bleu[m][-1] / bleu[m][0]
    print(f"{m:12}", "  ".join(f"{b:6.2f}" for b in bleu[m]), f"  longest/shortest = {kept:.2f}")

fig, ax = plt.subplots(figsize=(6.5, 3.8), layout="constrained")
for m in models:
    ax.plot(range(len(labels)), bleu[m], marker="o", label=m)
ax.set_xticks(range(len(labels)), [f"{lab}\n({n} sent.)" for lab, n in zip(labels, sentences)])
ax.set(xlabel="source length (words)", ylabel="test BLEU (sacreBLEU)", ylim=(0, None))
ax.legend()
plt.show()

# %%
assert {"seq2seq", "bahdanau", "transformer"} <= set(models)
assert all(b > s for b, s in zip(bleu["bahdanau"], bleu["seq2seq"]))  # attention wins at every length
for m in models:
    assert bleu[m][-1] < bleu[m][0]  # every model loses BLEU on the longest sentences …
kept = {m: bleu[m][-1] / bleu[m][0] for m in models}
assert kept["seq2seq"] == min(kept.values())  # … and the fixed context loses the largest share
assert all(s < 0.5 * b for s, b in zip(bleu["seq2seq"], bleu["bahdanau"]))  # less than half, at every length
assert all(t > b for t, b in zip(bleu["transformer"], bleu["bahdanau"]))

# the seq2seq run had Bahdanau's recipe of its time: as many epochs as the default run of the
# recipe it changes one switch of (results/runs.csv)
with open(ROOT / "results" / "runs.csv", newline="", encoding="utf-8") as f:
    runs = list(csv.DictReader(f))
seq2seq_run = next(r for r in runs if r["profile"] == "ablation" and r["model"] == "seq2seq")
base = seq2seq_run["recipe"].split("+")[0]
bahdanau_run = next(
    r for r in runs if (r["profile"], r["recipe"], r["model"]) == ("default", base, "bahdanau")
)
print(f"seq2seq: {seq2seq_run['epochs']} epochs, recipe {seq2seq_run['recipe']}")
print(f"Bahdanau: {bahdanau_run['epochs']} epochs, recipe {base}")
assert int(seq2seq_run["epochs"]) == int(bahdanau_run["epochs"])

# %% [markdown]
# Every model translates long sentences worse: there is more to get right. But the model with
# one fixed context vector keeps the smallest share of its short-sentence score on the longest
# bucket, and it scores less than half of Bahdanau's BLEU at every length. Its BLEU is low even
# on short sentences: trained with Bahdanau's recipe for as many epochs, the model with one
# summary vector is worse everywhere, and worst of all on long sentences.
#
# How strong is this evidence? The gap in the share kept is small (0.59 against 0.64), it rests
# mostly on the longest bucket (about a hundred sentences), each model is one training run, and
# there are no error bars: across the first three buckets the seq2seq model's BLEU even holds
# up a little better relative to Bahdanau's. The book's claim is about much longer sentences than
# Multi30k's captions; what this corpus shows is a consistent gap at every length and a
# steeper fall at the end.
#
# The [hard-attention page](../../tutorials/hard-attention/) goes on from here: what if the
# decoder had to pick **one** source word instead of a weighted mean?
#
# To look at the alignment of any sentence with the pipeline's model, see
# [Your first run](../../tutorials/first-run/) (its translate and explorer steps); the model's class is in the
# [API reference](../../reference/api/models/#attnlab.models.bahdanau.Bahdanau).

# %%
elapsed = time.perf_counter() - START
print(f"this page ran in {elapsed:.1f} s ({'fast' if FAST else 'full'} mode), commit {git_commit()}")

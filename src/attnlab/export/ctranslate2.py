"""Export attnlab's Transformer to CTranslate2, and translate with the exported model.

:func:`export_ctranslate2` fills CTranslate2's spec API (``ctranslate2.specs.TransformerSpec``
from a ``TransformerEncoderSpec`` and a ``TransformerDecoderSpec``, as CTranslate2's own
converters do) with the weights of :class:`attnlab.models.transformer.Transformer`, then
``validate()``, ``optimize(quantization=...)`` and ``save()`` into a folder that replaces
``out_dir`` atomically (:func:`attnlab.files.staged_dir`). The folder also holds ``spm.model``
and ``attnlab.json`` (sizes, the position table's length, the quantization).
:class:`CTranslate2Translator` loads it with ``ctranslate2.Translator`` and decodes as
:func:`attnlab.inference.decoding.translate` does (the same length cap, no other penalty).

Each spec field and why it takes its value (post-norm, the stacked attention projections,
D2L's interleaved sinusoid table carried as is, tied embeddings, the vocabulary) is explained
in the documentation: Explanation, "The Transformer in CTranslate2".

Sources: CTranslate2's spec API (``ctranslate2.specs``; ``converters/opennmt_py.py``,
``converters/fairseq.py``, ``src/decoding.cc``); Vaswani et al. 2017, 3.1-3.5; Wu et al.
2016, eq. 14 (GNMT length penalty).

Raises (at export): ValueError for a model CTranslate2 cannot represent (hard attention).
"""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnlab.data.special_tokens import BOS_ID, EOS_ID, UNK_ID
from attnlab.export.integrity import ExportFiles, damaged, reason, write_checksums
from attnlab.files import staged_dir
from attnlab.inference.decoding import decodable, max_output_len, strip_special
from attnlab.models.transformer import Transformer

FORMAT_VERSION = 1
QUANTIZATIONS = ("float32", "int8")
METADATA = "attnlab.json"
# CTranslate2's beam patience used by default (see CTranslate2Translator): with α > 0 its beam
# search stops a sentence once beam_size · patience hypotheses have finished.
DEFAULT_PATIENCE = 2.0
TOKENIZER_FILE = "spm.model"
VOCABULARY_FILE = "shared_vocabulary.json"


# --- export -----------------------------------------------------------------------------


def _array(t: torch.Tensor) -> np.ndarray:
    """A float32 C-contiguous copy of ``t`` (never a view of the live parameter: int8
    quantization scales the spec's arrays in place)."""
    return t.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().copy()


def _set_linear(spec, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Fill a ``LinearSpec``: weight (out, in) as torch stores it; bias (out,) only if the
    layer has one (the spec's bias is optional)."""
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _set_layer_norm(spec, ln: nn.LayerNorm) -> None:
    """Fill a ``LayerNormSpec`` (gamma, beta (d,)); a LayerNorm without affine parameters is 1, 0."""
    d = ln.normalized_shape[-1]
    spec.gamma = _array(ln.weight) if ln.weight is not None else np.ones(d, np.float32)
    spec.beta = _array(ln.bias) if ln.bias is not None else np.zeros(d, np.float32)


def _stack(*tensors: torch.Tensor | None) -> torch.Tensor | None:
    """Row-wise concatenation of projection weights or biases (None if the layer has no bias)."""
    if any(t is None for t in tensors):
        return None
    return torch.cat([t.detach() for t in tensors], dim=0)


def _output_weight(attention) -> torch.Tensor:
    """W_o (d_model, d_model) with the head mask, if any, folded into its input columns."""
    w = attention.W_o.weight.detach()
    if attention.head_mask is None:
        return w
    per_column = attention.head_mask.to(w).repeat_interleave(w.shape[1] // attention.num_heads)
    return w * per_column[None, :]


def _set_attention(spec, attention, self_attention: bool) -> None:
    """Fill a ``MultiHeadAttentionSpec`` from attnlab's :class:`MultiHeadAttention`.

    Self-attention: ``linear[0]`` = [W_q; W_k; W_v] (3·d, d), ``linear[1]`` = W_o.
    Cross attention: ``linear[0]`` = W_q, ``linear[1]`` = [W_k; W_v] (2·d, d), ``linear[2]`` = W_o.
    CTranslate2 always divides the scores by √d (d per head); an unscaled attention
    (``scaled=False``) is exported with W_q (and its bias) multiplied by √d, which gives the
    same scores q·k.
    """
    if attention.hard:
        raise ValueError(
            "this Transformer uses hard (arg-max) attention, which CTranslate2 "
            "cannot run (its attention is softmax only); keep it on torch"
        )
    q, k, v, o = attention.W_q, attention.W_k, attention.W_v, attention.W_o
    unscale = 1.0 if attention.scaled else math.sqrt(q.weight.shape[0] // attention.num_heads)
    q_weight = q.weight.detach() * unscale
    q_bias = None if q.bias is None else q.bias.detach() * unscale
    if self_attention:
        _set_linear(spec.linear[0], _stack(q_weight, k.weight, v.weight), _stack(q_bias, k.bias, v.bias))
    else:
        _set_linear(spec.linear[0], q_weight, q_bias)
        _set_linear(spec.linear[1], _stack(k.weight, v.weight), _stack(k.bias, v.bias))
    _set_linear(spec.linear[-1], _output_weight(attention), o.bias)


def _set_ffn(spec, ffn, addnorm) -> None:
    _set_layer_norm(spec.layer_norm, addnorm.ln)
    _set_linear(spec.linear_0, ffn.dense1.weight, ffn.dense1.bias)
    _set_linear(spec.linear_1, ffn.dense2.weight, ffn.dense2.bias)


def _layer_norm_eps(net: Transformer) -> float:
    """The one epsilon of all the net's layer norms. Raises ValueError if they differ."""
    eps = {m.eps for m in net.modules() if isinstance(m, nn.LayerNorm)}
    if len(eps) != 1:
        raise ValueError(
            f"the net's layer norms use several epsilons {sorted(eps)}; "
            "CTranslate2 has one layer_norm_epsilon per model"
        )
    return float(eps.pop())


def _check_net(net) -> None:
    """TypeError unless ``net`` is attnlab's Transformer (Bahdanau has its own message)."""
    if isinstance(net, Transformer):
        return
    from attnlab.models.bahdanau import Bahdanau

    if isinstance(net, Bahdanau):
        raise TypeError(
            "CTranslate2 cannot run attnlab's Bahdanau model: it has no GRU "
            "encoder-decoder with additive attention (its sequence-to-sequence "
            "model is the Transformer). Bahdanau stays on torch: export it with "
            "attnlab.export.trace.export_translation"
        )
    raise TypeError(
        f"export_ctranslate2 exports attnlab.models.transformer.Transformer, "
        f"got {type(net).__module__}.{type(net).__name__}"
    )


def _vocabulary(tokenizer_path: Path, net: Transformer) -> list[str]:
    """The sentencepiece pieces in id order, checked against the net's vocabulary sizes."""
    from attnlab.data.tokenizer import load_sentencepiece

    sp = load_sentencepiece(tokenizer_path)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    sizes = {
        "source embedding": net.src_embedding.num_embeddings,
        "target embedding": net.tgt_embedding.num_embeddings,
        "output layer": net.output.out_features,
    }
    wrong = {k: v for k, v in sizes.items() if v != len(pieces)}
    if wrong:
        raise ValueError(
            f"{tokenizer_path} has {len(pieces)} pieces but the net's "
            + ", ".join(f"{k} has {v}" for k, v in wrong.items())
            + ": CTranslate2 needs the joint sentencepiece vocabulary the net was "
            "trained with (a separate source vocabulary cannot be exported)"
        )
    if len(set(pieces)) != len(pieces):
        raise ValueError(f"{tokenizer_path} has duplicate pieces; CTranslate2 maps tokens by text")
    return pieces


def build_spec(net: Transformer, pieces: Sequence[str]):
    """The ``ctranslate2.specs.TransformerSpec`` of ``net`` (weights copied, float32, not yet
    validated or optimized), with ``pieces`` as its source and target vocabulary.

    Raises:
        ValueError: hard attention, or layer norms with different epsilons.
    """
    from ctranslate2.specs import common_spec, transformer_spec

    heads = {a.num_heads for kind in net.attention_layers().values() for a in kind}
    if len(heads) != 1:
        raise ValueError(
            f"attention layers with different head counts {sorted(heads)}; "
            "a CTranslate2 stack has one num_heads"
        )
    num_heads = heads.pop()
    # pre_norm: each sublayer reads LayerNorm(x), and the stack ends in a layer norm
    stack = dict(num_heads=num_heads, pre_norm=net.norm_first, activation=common_spec.Activation.RELU)
    encoder = transformer_spec.TransformerEncoderSpec(len(net.encoder_blocks), **stack)
    decoder = transformer_spec.TransformerDecoderSpec(len(net.decoder_blocks), **stack)
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    # (max_len, d_model): interleaved sin/cos, a learned table, or zeros (no positions)
    table = _array(net.pos_encoding.P[0])
    encoder.scale_embeddings = True  # × √d_model, as Transformer._embed
    decoder.scale_embeddings = True
    encoder.embeddings[0].weight = _array(net.src_embedding.weight)
    decoder.embeddings.weight = _array(net.tgt_embedding.weight)
    encoder.position_encodings.encodings = table
    decoder.position_encodings.encodings = table.copy()
    for layer, blk in zip(encoder.layer, net.encoder_blocks):
        _set_attention(layer.self_attention, blk.attention, self_attention=True)
        _set_layer_norm(layer.self_attention.layer_norm, blk.addnorm1.ln)
        _set_ffn(layer.ffn, blk.ffn, blk.addnorm2)
    for layer, blk in zip(decoder.layer, net.decoder_blocks):
        _set_attention(layer.self_attention, blk.attention1, self_attention=True)
        _set_layer_norm(layer.self_attention.layer_norm, blk.addnorm1.ln)
        _set_attention(layer.attention, blk.attention2, self_attention=False)
        _set_layer_norm(layer.attention.layer_norm, blk.addnorm2.ln)
        _set_ffn(layer.ffn, blk.ffn, blk.addnorm3)
    if net.norm_first:
        _set_layer_norm(encoder.layer_norm, net.encoder_norm)
        _set_layer_norm(decoder.layer_norm, net.decoder_norm)
    _set_linear(decoder.projection, net.output.weight, net.output.bias)

    config = spec.config
    config.layer_norm_epsilon = _layer_norm_eps(net)
    config.unk_token = pieces[UNK_ID]
    config.bos_token = pieces[BOS_ID]
    config.eos_token = pieces[EOS_ID]
    config.decoder_start_token = pieces[BOS_ID]  # the decoder input starts with <bos>
    config.add_source_bos = False
    config.add_source_eos = True  # sources end in </s> (encode_sources)
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    return spec


def supports(net: nn.Module) -> bool:
    """Whether :func:`export_ctranslate2` converts ``net``: attnlab's Transformer yes; Bahdanau
    no (CTranslate2 has no GRU encoder–decoder)."""
    return isinstance(net, Transformer)


def export_ctranslate2(
    net: nn.Module, tokenizer_path: Path, out_dir: Path, quantization: str = "float32"
) -> Path:
    """Convert attnlab's Transformer into a CTranslate2 model folder (the spec API).

    The folder, which replaces ``out_dir`` atomically (:func:`attnlab.files.staged_dir`),
    holds CTranslate2's ``model.bin``, ``config.json`` and ``shared_vocabulary.json``, plus
    ``spm.model`` (a copy of ``tokenizer_path``) and ``attnlab.json`` (format version, sizes,
    ``max_positions`` = rows of the position table, ``quantization``), and, written last,
    ``SHA256SUMS`` (:mod:`attnlab.export.integrity`), which :class:`CTranslate2Translator`
    checks the files against. Load it with
    :class:`CTranslate2Translator`, or with ``ctranslate2.Translator`` and sentencepiece
    pieces (</s> is appended by the model). The spec fields and why: the module docstring.

    Args:
        net: a :class:`attnlab.models.transformer.Transformer` with a joint vocabulary (any
            device, train or eval mode: only its weights are read; dropout is not exported).
        tokenizer_path: the sentencepiece model the net was trained with (``spm.model``);
            its pieces in id order are the vocabulary.
        out_dir: the model folder to write.
        quantization: ``"float32"`` (weights as they are) or ``"int8"`` (weights quantized
            per output row to int8 with float32 scales; CTranslate2 then computes in
            ``int8_float32`` on CPU). The embeddings and the output layer are quantized too.
    Returns:
        ``out_dir``.
    Raises:
        TypeError: ``net`` is not attnlab's Transformer (e.g. ``Bahdanau``: CTranslate2 has
            no GRU encoder-decoder, so Bahdanau stays on torch).
        ValueError: ``quantization`` not one of ``"float32"``, ``"int8"``; a tokenizer whose
            piece count differs from the net's vocabulary (or a separate source vocabulary);
            hard attention; layer norms with different epsilons; or the spec's own
            ``validate()`` error.
    """
    _check_net(net)
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization={quantization!r} is not supported; use one of "
            f"{', '.join(repr(q) for q in QUANTIZATIONS)}"
        )
    tokenizer_path = Path(tokenizer_path)
    pieces = _vocabulary(tokenizer_path, net)
    spec = build_spec(net, pieces)
    spec.validate()
    spec.optimize(quantization=quantization)
    metadata = {
        "format_version": FORMAT_VERSION,
        "model": "transformer",
        "quantization": quantization,
        "vocab_size": len(pieces),
        "d_model": net.d_model,
        "num_layers": len(net.encoder_blocks),
        "num_heads": net.encoder_blocks[0].attention.num_heads,
        "ffn_hidden": net.encoder_blocks[0].ffn.dense1.out_features,
        "tie_embeddings": net.src_embedding.weight is net.output.weight,
        "max_positions": int(net.pos_encoding.P.shape[1]),
    }
    out_dir = Path(out_dir)
    with staged_dir(out_dir) as tmp:
        spec.save(str(tmp))
        shutil.copy(tokenizer_path, tmp / TOKENIZER_FILE)
        (tmp / METADATA).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
        write_checksums(tmp)  # last: the folder loads on its own, and is checked as it does
    return out_dir


# --- runtime ----------------------------------------------------------------------------


def ctranslate2_length_penalty(alpha: float, src_len: int) -> float:
    """CTranslate2's ``length_penalty`` for attnlab's GNMT α, at a source of ``src_len`` tokens.

    attnlab ranks finished hypotheses by log P(Y) / ((5 + |Y|) / 6)^α (Wu et al. 2016,
    eq. 14; |Y| counts the </s>); CTranslate2 by log P(Y) / |Y|^lp. Only ratios of penalties
    between hypotheses of one sentence matter, so the two agree where their logarithmic
    slopes d log penalty / d log |Y| agree: α·|Y| / (5 + |Y|) = lp. The slope is taken at
    |Y| = ``src_len`` (the source's tokens with its </s>, the expected output length with
    its </s>): lp = α·src_len / (5 + src_len). α = 0 gives lp = 0 (no normalization in
    either). Away from that length the rankings can differ.
    """
    return float(alpha) * src_len / (5.0 + src_len)


def _read_json(files: ExportFiles, name: str):
    """The JSON file ``name`` of a checked folder (:class:`~attnlab.export.integrity.ExportFiles`)."""
    with files.loading(name) as path:
        return json.loads(path.read_text(encoding="utf-8"))


class CTranslate2Translator:
    """Translate with a CTranslate2 folder written by :func:`export_ctranslate2`, returning
    ids as :func:`attnlab.inference.decoding.translate` does (one list per sentence, input order,
    specials stripped): with ``beam_size=1`` the same greedy ids (up to arg-max near ties
    under a different float summation order); beam search differs (below).

    Decoding options: ``beam_size`` as given (1 is greedy), ``patience`` as given
    (default :data:`DEFAULT_PATIENCE`, below), ``num_hypotheses=1``,
    ``min_decoding_length=0`` (an immediate </s>, an empty translation, is allowed as in
    attnlab; CTranslate2's default 1 forbids it), ``repetition_penalty=1``,
    ``no_repeat_ngram_size=0``, ``coverage_penalty=0``,
    ``disable_unk=False`` (attnlab may emit <unk>), no suppressed sequences, no sampling
    (``sampling_topk=1``), ``max_input_length=0`` (CTranslate2 would otherwise cut sources
    after 1024 tokens; the source length is checked against the position table instead),
    ``return_end_token=True`` (so the length in the length penalty counts the </s> as
    attnlab's does; the </s> and anything after it are then stripped here, with
    <pad>/<bos>, by :func:`attnlab.inference.decoding.strip_special`).

    Length cap, per sentence: :func:`attnlab.inference.decoding.max_output_len` of its source length
    (with </s>), min(⌊1.5·n + 10⌋, 256), counting the output </s>. CTranslate2 counts the
    same way: its ``max_decoding_length`` is the number of decoding steps, the step that
    emits </s> included (``src/decoding.cc``: a hypothesis is finished at ``step + 1 ==
    max_length``). It takes one value per call, so:
    greedy (``beam_size=1``) runs one call with the batch's largest cap and cuts each
    hypothesis to its own cap — exact, as greedy step t depends only on the tokens before
    it; beam search runs one call per source length (the cap and the α mapping are
    functions of it).

    Beam search differs from attnlab's :func:`attnlab.inference.decoding.beam_search` (equal results
    are not guaranteed, even at α = 0):

    - length normalization: CTranslate2 divides log P(Y) by |Y|^lp, attnlab by GNMT's
      ((5 + |Y|) / 6)^α (Wu et al. 2016, eq. 14), |Y| with the </s> in both (hence
      ``return_end_token=True``). lp = :func:`ctranslate2_length_penalty`, α·n / (5 + n) for
      a source of n tokens: the two penalties then change at the same relative rate at
      |Y| = n. α = 0 is lp = 0, no normalization in either.
    - the beam: CTranslate2 takes the top 2·K candidates per step and keeps K open
      hypotheses besides the finished ones; attnlab's finished hypotheses keep their beam
      slot (extended by <pad> at no cost) and compete with the open ones.
    - the stop: with lp = 0 CTranslate2 stops a sentence when its best candidate ends (no
      open hypothesis can then beat it; attnlab's answer is that hypothesis too unless the
      two beams hold different candidates). With lp > 0 it stops once K·patience
      hypotheses have finished, however poor; attnlab searches until all K beams are
      finished (or the cap). With ``patience=1`` CTranslate2 then often stops before the
      best, longer hypothesis has ended (on the 48-pair test model, α = 0.6 and 1: 46 of 48
      equal to attnlab with patience 1, 48 of 48 with 2), so the default is
      :data:`DEFAULT_PATIENCE` = 2.

    Args:
        model_dir: the folder of :func:`export_ctranslate2`.
        tokenizer: a sentencepiece tokenizer (:class:`attnlab.data.tokenizer.SentencePieceTokenizer`),
            a path to its ``.model``, or None for the folder's ``spm.model``. Its pieces must
            be the model's vocabulary.
        compute_type: CTranslate2's compute type ("default": the saved weights' type, i.e.
            float32 or, for an int8 folder on CPU, int8_float32; also "float32", "int8",
            "int8_float32", ...).
        inter_threads: translations run in parallel (CTranslate2 workers).
        intra_threads: threads per translation (0: CTranslate2's default).
        device: "cpu" (or "cuda" where CTranslate2 was built with it).
    Raises:
        FileNotFoundError: ``model_dir`` holds no CTranslate2 model.
        DamagedExportError: a file of the folder is missing, changed since the export (its
            ``SHA256SUMS``) or unreadable (names it and the command that exports it again).
        ValueError: the tokenizer's pieces are not the model's vocabulary; CTranslate2's own
            error for an unsupported ``compute_type``.
    """

    def __init__(
        self,
        model_dir: Path,
        tokenizer=None,
        compute_type: str = "default",
        inter_threads: int = 1,
        intra_threads: int = 0,
        device: str = "cpu",
    ):
        import ctranslate2

        from attnlab.data.tokenizer import load_sentencepiece

        self.model_dir = Path(model_dir)
        files = ExportFiles(self.model_dir, model="transformer")  # each file checked as it loads
        if not (self.model_dir / "model.bin").is_file() and files.sums is None:
            raise FileNotFoundError(
                f"{self.model_dir} holds no CTranslate2 model (model.bin); "
                "write one with attnlab.export.ctranslate2.export_ctranslate2"
            )
        if tokenizer is None:
            with files.loading(TOKENIZER_FILE) as path:
                tokenizer = load_sentencepiece(path)
        elif isinstance(tokenizer, (str, Path)):
            tokenizer = load_sentencepiece(tokenizer)
        self.tokenizer = tokenizer
        # a model saved with separate vocabularies has the target's
        vocabulary = (
            VOCABULARY_FILE if (self.model_dir / VOCABULARY_FILE).is_file() else "target_vocabulary.json"
        )
        self.pieces: list[str] = _read_json(files, vocabulary)
        if [tokenizer.id_to_piece(i) for i in range(tokenizer.get_piece_size())] != self.pieces:
            raise ValueError(
                f"the tokenizer's {tokenizer.get_piece_size()} pieces are not the "
                f"vocabulary of {self.model_dir} ({len(self.pieces)} pieces): use "
                "the sentencepiece model the folder was exported with"
            )
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        listed = files.sums is not None and METADATA in files.sums
        self.metadata = _read_json(files, METADATA) if listed or (self.model_dir / METADATA).is_file() else {}
        self.max_positions: int | None = self.metadata.get("max_positions")
        for name in ("config.json", "model.bin"):  # what CTranslate2 reads
            files.check(name)
        try:
            self.translator = ctranslate2.Translator(
                str(self.model_dir),
                device=device,
                compute_type=compute_type,
                inter_threads=inter_threads,
                intra_threads=intra_threads,
            )
        except (RuntimeError, UnicodeDecodeError) as e:  # its reader (a bad compute_type: ValueError)
            raise damaged(self.model_dir, f"CTranslate2 cannot load it: {reason(e)}", "transformer") from e
        self.compute_type = self.translator.compute_type

    def _options(self, beam_size: int, max_batch_size: int, patience: float) -> dict:
        """translate_batch options common to every call: everything attnlab does not do is off."""
        return dict(
            max_batch_size=max_batch_size,
            beam_size=beam_size,
            patience=patience,
            num_hypotheses=1,
            coverage_penalty=0.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            disable_unk=False,
            suppress_sequences=None,
            return_end_token=True,
            prefix_bias_beta=0.0,
            max_input_length=0,
            min_decoding_length=0,
            use_vmap=False,
            return_scores=False,
            return_attention=False,
            return_alternatives=False,
            sampling_topk=1,
            sampling_topp=1.0,
            sampling_temperature=1.0,
            replace_unknowns=False,
        )

    def _ids_of(self, tokens: Sequence[str], cap: int) -> list[int]:
        """A hypothesis's pieces → ids cut to ``cap`` tokens, then specials stripped."""
        return strip_special([self.ids[t] for t in tokens[:cap]])

    def translate_ids(
        self,
        sources: Sequence[Sequence[int]],
        beam_size: int = 1,
        alpha: float = 0.0,
        batch_size: int = 128,
        patience: float = DEFAULT_PATIENCE,
    ) -> list[list[int]]:
        """Decode source id lists; one output id list per source, input order.

        Args:
            sources: per sentence its token ids (ints in [0, V)) *without* the </s>
                (the model appends it), as ``tokenizer.encode`` gives them. An empty
                list gives ``[]`` without decoding, as in attnlab.
            beam_size: 1 for greedy (exactly attnlab's tokens, up to float summation
                order), more for CTranslate2's beam search (class docstring).
            alpha: attnlab's GNMT length penalty α ≥ 0, mapped with
                :func:`ctranslate2_length_penalty` (beam search only).
            batch_size: most sentences per CTranslate2 batch (``max_batch_size``).
            patience: CTranslate2's beam patience (> 0; beam search with α > 0 only): a
                sentence stops once ``beam_size · patience`` hypotheses have finished. The
                default :data:`DEFAULT_PATIENCE` (class docstring) brings the stop closer to
                attnlab's, which searches until all its beams have finished.
        Returns:
            list of lists of int: generated ids without <bos>, <pad>, </s> and anything
            after the </s>, each at most the sentence's :func:`~attnlab.inference.decoding.max_output_len`.
        Raises:
            ValueError: beam_size < 1, alpha < 0, batch_size < 1, patience ≤ 0, an id outside the
                vocabulary, or a source (with </s>) longer than the position table, which
                attnlab's PositionalEncoding refuses too.
        """
        if int(beam_size) != beam_size or beam_size < 1 or alpha < 0 or batch_size < 1 or not patience > 0:
            raise ValueError(
                f"need integers beam_size ≥ 1, batch_size ≥ 1, alpha ≥ 0 and "
                f"patience > 0; got beam_size={beam_size}, alpha={alpha}, "
                f"batch_size={batch_size}, patience={patience}"
            )
        beam_size = int(beam_size)
        V = len(self.pieces)
        out: list[list[int]] = [[] for _ in sources]
        todo: list[tuple[int, list[str], int]] = []  # (index, pieces, source length with </s>)
        for i, ids in enumerate(sources):
            ids = [int(t) for t in ids]
            if not ids:
                continue
            bad = [t for t in ids if not 0 <= t < V]
            if bad:
                raise ValueError(f"source {i} has ids {bad[:5]} outside the vocabulary [0, {V})")
            if self.max_positions is not None and len(ids) + 1 > self.max_positions:
                raise ValueError(
                    f"source {i} has {len(ids) + 1} tokens with </s>, more than the "
                    f"model's {self.max_positions} positions"
                )
            todo.append((i, [self.pieces[t] for t in ids], len(ids) + 1))
        if not todo:
            return out
        options = self._options(beam_size, batch_size, patience)
        if beam_size == 1:
            caps = [max_output_len(n) for _, _, n in todo]
            results = self.translator.translate_batch(
                [p for _, p, _ in todo], max_decoding_length=max(caps), length_penalty=0.0, **options
            )
            for (i, _, _), cap, res in zip(todo, caps, results):
                out[i] = self._ids_of(res.hypotheses[0], cap)
            return out
        groups: dict[int, list[tuple[int, list[str]]]] = defaultdict(list)
        for i, p, n in todo:
            groups[n].append((i, p))
        for n, group in sorted(groups.items()):
            cap = max_output_len(n)
            results = self.translator.translate_batch(
                [p for _, p in group],
                max_decoding_length=cap,
                length_penalty=ctranslate2_length_penalty(alpha, n),
                **options,
            )
            for (i, _), res in zip(group, results):
                out[i] = self._ids_of(res.hypotheses[0], cap)
        return out

    def translate(
        self,
        sentences: Sequence[str],
        beam_size: int = 1,
        alpha: float = 0.0,
        batch_size: int = 128,
        patience: float = DEFAULT_PATIENCE,
    ) -> list[list[int]]:
        """Sentences in, generated ids out (specials stripped), input order — the contract of
        :func:`attnlab.inference.decoding.translate`, and its skip rule
        (:func:`attnlab.inference.decoding.decodable`): a sentence without text or without tokens
        gets ``[]``. Shapes, options and errors: :meth:`translate_ids`."""
        sources: list[list[int]] = [[] for _ in sentences]
        if len(sentences):
            src, valid = self.tokenizer.encode_sources(list(sentences))
            for i in decodable(sentences, valid).nonzero()[:, 0].tolist():
                sources[i] = src[i, : int(valid[i]) - 1].tolist()  # without the </s> the model appends
        return self.translate_ids(sources, beam_size, alpha, batch_size, patience)

    def translate_text(
        self,
        sentences: Sequence[str],
        beam_size: int = 1,
        alpha: float = 0.0,
        batch_size: int = 128,
        patience: float = DEFAULT_PATIENCE,
    ) -> list[str]:
        """:meth:`translate`, detokenized with the tokenizer: one string per sentence."""
        return [
            self.tokenizer.decode(ids)
            for ids in self.translate(sentences, beam_size, alpha, batch_size, patience)
        ]

"""The book: D2L chapter 11, "Attention Mechanisms and Transformers", in torch alone.

In the chapter's order:

* :mod:`attnlab.models.nadaraya_watson`: 11.2, attention pooling by similarity
  (Nadaraya–Watson kernel regression);
* :mod:`attnlab.models.attention`: 11.3 scoring functions (masked softmax, additive and
  scaled dot-product attention), 11.5 multi-head attention (with head masks);
* :mod:`attnlab.models.seq2seq`: 10.7 (zh 9.7), the attention-free GRU seq2seq, Bahdanau's
  baseline (one fixed context vector);
* :mod:`attnlab.models.bahdanau`: 11.4, the Bahdanau attention seq2seq (GRU), with additive or
  dot-product scoring;
* :mod:`attnlab.models.hard_attention`: hard attention (Xu et al. 2015, sec. 4.1): sampled
  locations, REINFORCE, the straight-through Gumbel-softmax (Bahdanau's ``attention`` switch);
* :mod:`attnlab.models.positional_encoding`: 11.6, sinusoidal positional encoding (and the
  learned and absent alternatives);
* :mod:`attnlab.models.transformer`: 11.7, the position-wise FFN, add & norm, the blocks and
  the Transformer encoder–decoder (post- or pre-norm, scaled or unscaled dot products).

The book's names are importable from here, in one line::

    from attnlab.models import (masked_softmax, AdditiveAttention, DotProductAttention,
                                MultiHeadAttention, PositionalEncoding, PositionWiseFFN,
                                AddNorm, Bahdanau, Transformer, NadarayaWatson)

(The Chinese edition numbers this chapter 10: 11.2 there is 10.2, and so on.)

Nothing here imports Lightning, Hydra, MLflow or the rest of attnlab
(``tests/test_layout.py`` checks it): the lab (:mod:`attnlab.lit`, :mod:`attnlab.data`,
the stage scripts) is built around these modules.

:func:`build_net` is the one place a translation model is built from a config
(``conf/model/<name>.yaml`` → ``net``, or the ``hyper_parameters`` of a
checkpoint). It accepts only attnlab's own model classes and never imports or
calls anything else a config or checkpoint names: a checkpoint from elsewhere
is data, not code.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from attnlab.models.attention import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    masked_hardmax,
    masked_softmax,
    transpose_output,
    transpose_qkv,
)
from attnlab.models.bahdanau import Bahdanau, Seq2SeqEncoder
from attnlab.models.nadaraya_watson import NadarayaWatson
from attnlab.models.positional_encoding import PositionalEncoding, max_positions
from attnlab.models.seq2seq import Seq2Seq
from attnlab.models.transformer import (
    AddNorm,
    PositionWiseFFN,
    Transformer,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
)

__all__ = [
    "NET_TARGETS",
    "AddNorm",
    "AdditiveAttention",
    "Bahdanau",
    "DotProductAttention",
    "MultiHeadAttention",
    "NadarayaWatson",
    "PositionWiseFFN",
    "PositionalEncoding",
    "Seq2Seq",
    "Seq2SeqEncoder",
    "Transformer",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "UnknownModelError",
    "build_net",
    "masked_hardmax",
    "masked_softmax",
    "max_positions",
    "transpose_output",
    "transpose_qkv",
]

# The `_target_` strings a model config may name (what conf/model/*.yaml write).
NET_TARGETS = (
    "attnlab.models.transformer.Transformer",
    "attnlab.models.bahdanau.Bahdanau",
    "attnlab.models.seq2seq.Seq2Seq",
)


class UnknownModelError(ValueError):
    """A model config names a class that is not one of attnlab's models (nothing was imported)."""


def _classes() -> dict[str, type[nn.Module]]:
    return {f"{c.__module__}.{c.__qualname__}": c for c in (Transformer, Bahdanau, Seq2Seq)}


def build_net(config: Mapping, **kwargs) -> nn.Module:
    """Build the translation model ``config`` describes: ``{"_target_": <class>, size: value, …}``.

    Args:
        config: plain mapping with ``_target_`` one of :data:`NET_TARGETS` and the
            class's keyword arguments (``d_model``, ``num_heads``, … or ``embed_size``, …).
        kwargs: further keyword arguments (``vocab_size``, ``pad_id``, ``src_vocab_size``).
    Returns:
        the model, an ``nn.Module`` in training mode with fresh weights.
    Raises:
        UnknownModelError: ``_target_`` is missing or names anything but attnlab's
            models, or a value holds a ``_target_`` or another Hydra special key
            (``_partial_``, ``_args_``, …). Nothing that the config names is imported
            or called; the message names the target and the accepted ones.
    """
    target = config.get("_target_") if isinstance(config, Mapping) else config
    if target not in NET_TARGETS:
        raise UnknownModelError(
            f"model config names _target_={target!r}, which is not one of attnlab's models "
            f"({', '.join(NET_TARGETS)}); attnlab builds only its own model classes and "
            "imports or calls nothing else a config or checkpoint names. Use a checkpoint "
            "written by attnlab's src/train.py, or set model.net._target_ to one of those"
        )
    args = {k: v for k, v in config.items() if k != "_target_"}
    for key, value in args.items():
        nested = value.get("_target_") if isinstance(value, Mapping) else None
        if key.startswith("_") or nested is not None:
            raise UnknownModelError(
                f"model config {target}: key {key!r} holds {value!r}; a model's settings are "
                "plain numbers, strings and booleans, never objects to build (nothing was "
                "imported or called). Remove the key or give it a plain value"
            )
    return _classes()[target](**args, **kwargs)

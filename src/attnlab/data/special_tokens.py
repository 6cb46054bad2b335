"""The fixed ids of the four special tokens, the same for every tokenizer of the project.

Sentencepiece's models (:mod:`attnlab.data.tokenizer`) are trained with these ids and D2L's
word vocabularies (:mod:`attnlab.data.d2l`) put ``<pad> <unk> <bos> <eos>`` at them. They are
distinct and non-negative (sentencepiece's default pad id is -1, which
``nn.Embedding(padding_idx=-1)`` would read as the last row).
"""

from __future__ import annotations

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

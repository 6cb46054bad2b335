"""Split a user's text into the sentences a model translates, keeping everything between them.

The models learn from single sentences (Multi30k's captions, Tatoeba's lines) and stop at the
end of the first sentence of a longer input, dropping the rest without a word. So the
translator cuts each input into sentences, translates them one by one and joins the
translations with the input's own separators: spaces, line breaks, blank lines.

Lines are cut first, at every line break :meth:`str.splitlines` knows (``\\n``, ``\\r\\n``,
``\\r``, ``\\v``, ``\\f``, U+001C–U+001E, U+0085, U+2028, U+2029), so a line without final
punctuation is its own sentence. Each line is then cut into sentences by `sentencex
<https://github.com/wikimedia/sentencex>`_, Wikimedia's segmenter: maintained, rule-based
(abbreviations like "Dr." or "e.g.", decimal numbers, quotes and brackets, per language, with
fallbacks for about 240 languages, ``。！？`` for Chinese), fast (written in Rust), no model to
download, and it returns character offsets, so nothing of the input is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sentencex

# The line boundaries of str.splitlines, \r\n first so that it is one break, not two.
LINE_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


@dataclass(frozen=True)
class Split:
    """An input cut into sentences: ``gaps[0] + sentences[0] + gaps[1] + … + sentences[-1] +
    gaps[-1]`` is the input, character for character.

    Attributes:
        sentences: the N sentences, without the spaces and line breaks around them (N ≥ 0;
            0 for an input of spaces and line breaks only, or an empty one).
        gaps: the N + 1 separators: before the first sentence, between each two, after the last.
    """

    sentences: list[str]
    gaps: list[str]

    def join(self, translations: list[str]) -> str:
        """The translations of :attr:`sentences` (N str, in order) joined with :attr:`gaps`: the
        input's separators and line breaks, kept; "" for an input without a sentence.

        Raises:
            ValueError: not N translations.
        """
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for {len(self.sentences)} sentences")
        if not self.sentences:
            return ""
        parts = [self.gaps[0]]
        for translation, gap in zip(translations, self.gaps[1:]):
            parts += [translation, gap]
        return "".join(parts)


def split_sentences(text: str, language: str) -> Split:
    """Cut ``text`` into its sentences (module docstring): at line breaks, then with sentencex
    for ``language`` (an ISO 639 code such as ``en``, ``fr``, ``zh``; an unknown code gets
    sentencex's generic rules). Surrounding whitespace stays in the gaps."""
    sentences: list[str] = []
    gaps: list[str] = []
    pending = ""  # separator text since the last sentence
    start = 0
    for line_end in [m for m in LINE_BREAK.finditer(text)] + [None]:
        stop = line_end.start() if line_end else len(text)
        line = text[start:stop]
        ends = (
            [b["end_index"] for b in sentencex.get_sentence_boundaries(language, line)]
            if line.strip()
            else []
        )
        cuts = [0, *sorted(set(ends) - {0, len(line)}), len(line)] if ends else []
        for a, b in zip(cuts, cuts[1:]):  # the pieces cover the line whatever the boundaries
            piece = line[a:b]
            core = piece.strip()
            if not core:
                pending += piece
                continue
            lead = piece[: len(piece) - len(piece.lstrip())]
            trail = piece[len(piece.rstrip()) :]
            gaps.append(pending + lead)
            sentences.append(core)
            pending = trail
        if not line.strip():
            pending += line
        if line_end:
            pending += line_end.group()
            start = line_end.end()
    gaps.append(pending)
    return Split(sentences, gaps)

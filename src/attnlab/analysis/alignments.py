"""Draw the alignments of translations you asked for: PNG heatmaps and the explorer page.

``src/translate.py … +show_attention=true`` calls :func:`show_alignments` with what
:meth:`attnlab.serving.translator.Translator.align` returned: the cross attention of the very
tokens it printed. The figures are those of training runs (:func:`attnlab.analysis.viz.draw_translation_maps`,
:func:`attnlab.analysis.explorer.translation_explorer`), with one slider position, ``translation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnlab.analysis.explorer import translation_epoch, translation_explorer, write_explorer
from attnlab.analysis.viz import KIND_AXES, KindMaps, SentenceMaps, draw_translation_maps


def sentence_maps(sentence: str, alignment) -> SentenceMaps:
    """One sentence's :class:`attnlab.serving.translator.Alignment` as the figures' :class:`SentenceMaps`
    (its one kind; one (H, T, S) tensor per layer)."""
    _, _, key_axis, query_axis = KIND_AXES[alignment.kind]
    layers = [w.float().cpu() for w in alignment.weights]
    return SentenceMaps(
        sentence,
        alignment.translation,
        {
            alignment.kind: KindMaps(
                alignment.kind,
                layers,
                list(alignment.source_tokens),
                list(alignment.target_tokens),
                key_axis,
                query_axis,
            )
        },
    )


def show_alignments(
    sentences: Sequence[str], alignments: Sequence, out_dir: Path, title: str
) -> tuple[list[Path], Path | None]:
    """Write one PNG per (sentence, layer), heads as panels (``sent<i>_<kind>_layer<l>.png``,
    ``i`` from 0), and ``explorer.html`` with every sentence, into ``out_dir``.

    Sentences with nothing translated (no target token) get no figure; with none left no page
    is written (returns ``([], None)``).

    Returns:
        (the PNG paths, the explorer page's path or None).
    """
    maps = [
        sentence_maps(s, a) if a.target_tokens else SentenceMaps(s, a.translation, {})
        for s, a in zip(sentences, alignments)
    ]  # no kinds: no figure, the others keep their i
    kept = [m for m in maps if m.kinds]
    if not kept:
        return [], None
    pngs = draw_translation_maps(maps, Path(out_dir))
    page = translation_explorer([translation_epoch(kept, 1, label="translation")], title)
    return pngs, write_explorer(Path(out_dir) / "explorer.html", page)

"""What attention does: head statistics, head importance and pruning, figures, the explorer.

One job per module (this package re-exports nothing):

* :mod:`attnlab.analysis.heads`: per-head entropy, confidence and diagonal offset.
* :mod:`attnlab.analysis.pruning`: head importance by masking, and pruning (Michel et al. 2019).
* :mod:`attnlab.analysis.head_figures`: the importance and pruning figures.
* :mod:`attnlab.analysis.viz`: attention heatmaps (PNG) of the translation and NW models.
* :mod:`attnlab.analysis.explorer`: the interactive explorer, one self-contained HTML page.
* :mod:`attnlab.analysis.alignments`: one sentence's alignment drawn for ``src/translate.py``.
"""

"""DVC stage `evaluate@<model>`: score the best checkpoint on the test splits.

What is measured is the model's task's (conf/model/<model>.yaml `task.evaluate`, in
attnlab.inference.evaluation). Seq2seq models: beam search (model.decoding: beam_size, alpha) over the
test split on the device that `device` names (conf/device/*.yaml, one process), detokenized, scored with
sacreBLEU (corpus BLEU cased, lowercased BLEU, chrF; BLEU's tokenizer follows data.tgt_lang:
zh, ja-mecab, ko-mecab, else 13a, or data.bleu_tokenize); the translations go to
metrics/<model>.hyp.txt. metrics/<model>.json also says what was measured, as MT papers
report it: corpus, src_lang, tgt_lang, test_set, the decoding settings and the sacreBLEU
signatures. The further test splits of data.more_test_splits (Multi30k: test_2017_flickr) are
scored the same way, into metrics/<model>.json → more_test_sets and MLflow test_bleu/<name>,
...; their translations go to the MLflow run (evaluation/<name>.hyp.txt). NW: test MSE
against D2L's average-pooling and non-parametric baselines.
Writes metrics/<model>.json and logs test_* metrics (and, for translation, the test set,
decoding and signatures as tags) to the model's MLflow run.
    python src/evaluate.py model=transformer
"""

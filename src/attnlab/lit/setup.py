"""Build a task (LightningModule + dataloaders) from a composed Hydra config, and its heatmaps."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from attnlab.data.corpora import read_lines
from attnlab.data.datamodule import TranslationDataModule
from attnlab.lit.regression import RegressionModule, full_batch_loader
from attnlab.lit.translation import TranslationModule
from attnlab.models.nadaraya_watson import nw_evaluation, synthetic_from_config
from attnlab.viz import nw_figures, translation_heatmaps


def _plain(node) -> dict:
    """OmegaConf node → plain dict (checkpoints must load with ``weights_only=True``)."""
    return OmegaConf.to_container(node, resolve=True)


def build_task(cfg: DictConfig):
    """(module, (train_loader_or_datamodule,...)) for ``trainer.fit(module, *loaders)``.

    Raises:
        ValueError: model/data mismatch (NW needs data=synthetic; seq2seq models a corpus).
    """
    if cfg.model.task == "regression":
        from attnlab.models.nadaraya_watson import check_kernel, check_width
        for kernel in cfg.model.kernels:  # a typo fails here, not after training
            check_kernel(kernel)
        for width in (cfg.model.width, *cfg.model.width_sweep):
            check_width(width)
        data = synthetic_from_config(cfg.data, cfg.seed)
        module = RegressionModule(optimizer=_plain(cfg.optimizer), init_w=cfg.model.init_w)
        module.data = data
        return module, (full_batch_loader(data["x_train"], data["y_train"]),
                        full_batch_loader(data["x_test"], data["y_test"]))
    if cfg.data.name == "synthetic":
        raise ValueError(f"model={cfg.model.name} translates; choose data=multi30k or data=fra_eng")
    dm = TranslationDataModule(cfg.paths.tokenized, cfg.model.batch_size, cfg.data.max_len, cfg.seed,
                               max_tokens=cfg.model.get("max_tokens"))
    module = TranslationModule(net=_plain(cfg.model.net), optimizer=_plain(cfg.optimizer),
                               vocab_size=dm.vocab_size, label_smoothing=cfg.model.label_smoothing,
                               warmup_steps=cfg.model.warmup_steps, src_vocab_size=dm.src_vocab_size)
    attach_text(module, dm.tokenizer, cfg)
    return module, (dm,)


def attach_text(module: TranslationModule, tokenizer, cfg: DictConfig) -> None:
    """Give a translation module its tokenizer and the val sentences scored for ``val_bleu``."""
    tok_dir = Path(cfg.paths.tokenized)
    n = cfg.data.val_bleu_sentences
    module.tokenizer = tokenizer
    module.val_texts = (read_lines(tok_dir / "val.src.txt")[:n], read_lines(tok_dir / "val.tgt.txt")[:n])


def heatmaps(cfg: DictConfig, net, trained, out_dir: Path) -> list[Path]:
    """Write the attention PNGs of ``net`` (the best checkpoint's model) into ``out_dir``.

    ``trained`` is the module that was fit: it holds the data (NW) or tokenizer.
    """
    if cfg.model.task == "regression":
        m = cfg.model
        ev = nw_evaluation(trained.data, float(net.w.detach()), m.kernels, m.width, m.width_sweep)
        d = trained.data
        return nw_figures(d["x_train"], d["y_train"], d["x_test"], d["y_test"],
                          ev["predictions"], ev["weights"], out_dir,
                          kernels=ev["kernels"], width=m.width, width_sweep=ev["width_sweep"],
                          trained_w=ev["w"])
    return translation_heatmaps(net, trained.tokenizer, heatmap_sources(cfg), out_dir)


def heatmap_sources(cfg: DictConfig) -> list[str]:
    """The validation sources at ``cfg.heatmaps.sentences`` (indices past the split are skipped)."""
    sources = read_lines(Path(cfg.paths.tokenized) / "val.src.txt")
    return [sources[i] for i in cfg.heatmaps.sentences if i < len(sources)]

"""LightningModule for translation: teacher-forced cross-entropy training, val loss and BLEU.

``conf/model/{transformer,bahdanau}.yaml`` name it as their ``task.module``: ``train.py`` builds
it with :meth:`TranslationModule.from_config` and asks it for its run tags, its per-epoch
callbacks and its final figures, never which task it holds.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torchmetrics import MeanMetric, SumMetric

from attnlab.analysis.heads import head_statistics
from attnlab.analysis.viz import translation_heatmaps
from attnlab.checkpoint import TOKENIZER_KEY, tokenizer_record
from attnlab.data.corpora import read_lines
from attnlab.data.datamodule import TranslationDataModule
from attnlab.data.tokenizer import PAD_ID
from attnlab.errors import ConfigError
from attnlab.inference.decoding import translate_text
from attnlab.inference.lengths import check_fixed_steps, check_splits_fit, scored_splits, training_bound
from attnlab.lit.heatmaps import EpochHeatmaps
from attnlab.loss import NonFiniteLossError, rdrop_loss, sequence_loss
from attnlab.metrics import CorpusScores, bleu_tokenizer
from attnlab.models import build_net, max_positions

log = logging.getLogger(__name__)


def inverse_sqrt_warmup(warmup_steps: int):
    """LR multiplier: linear warmup to 1 over ``warmup_steps``, then (warmup/step)^0.5
    (Vaswani et al. eq. 3, normalized to peak 1). ``warmup_steps=0`` keeps the LR constant."""

    def factor(step: int) -> float:
        if warmup_steps <= 0:
            return 1.0
        step = step + 1
        return min(step / warmup_steps, math.sqrt(warmup_steps / step))

    return factor


def linear_warmup_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: linear warmup to 1 over ``warmup_steps``, then linear decay that reaches 0
    just after the last of ``total_steps`` steps: the budget-aware schedule of Li, Yumer and
    Ramanan (ICLR 2020, "Budgeted Training: Rethinking Deep Neural Network Training Under
    Resource Constraints"), who find linear decay to zero best when the number of steps is fixed.

    Raises:
        ValueError: ``total_steps`` is not larger than ``warmup_steps`` (no step would decay).
    """
    if total_steps <= max(warmup_steps, 0):
        raise ConfigError(
            f"lr_decay=linear needs more steps than warm-up: {total_steps} step(s) planned "
            f"(trainer.max_epochs / max_steps), warmup_steps={warmup_steps}; raise "
            "trainer.max_epochs or lower model.warmup_steps"
        )

    def factor(step: int) -> float:  # step: the 0-based index of the optimizer step to take
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / (total_steps - warmup_steps))

    return factor


LR_DECAYS = ("inverse_sqrt", "linear")


def fit_splits(cfg: DictConfig, dm: TranslationDataModule, positions: int | None) -> None:
    """Make every split fit a net of ``positions`` positions (:func:`attnlab.models.max_positions`;
    ``None``: any length) before training starts (:mod:`attnlab.inference.lengths`): training
    pairs it cannot take are left out (``dm.max_len`` lowered to the bound, the count logged
    as a warning, as is any pair ``data.max_len`` leaves out here); a val or test pair it
    cannot take stops the run.

    Raises:
        PairTooLongError: a val or test pair (:func:`attnlab.inference.lengths.check_splits_fit`),
            or D2L's ``data.num_steps``, needs more positions than the net has.
    """
    if dm.fixed_length:
        check_fixed_steps(dm.tokenizer.num_steps, positions, cfg.model.name)
        return
    check_splits_fit(cfg.paths.tokenized, scored_splits(cfg.data), positions, cfg.model.name, "train")
    dm.max_len = training_bound(cfg.data.max_len, positions)
    train = dm.dataset("train")
    if train.num_dropped:
        why = f"data.max_len={cfg.data.max_len}"
        if dm.max_len < cfg.data.max_len:
            why = (
                f"the {cfg.model.name} model has {positions} positions (model.net.max_len), fewer than "
                f"{why}; set data.max_len={positions} to drop them at tokenize, counted in stats.json"
            )
        log.warning(
            "train: %d of %d tokenized pairs left out of training, with %d or more tokens on a side (%s)",
            train.num_dropped,
            train.num_dropped + len(train),
            dm.max_len,
            why,
        )


class TranslationModule(pl.LightningModule):
    """Wraps a seq2seq ``nn.Module`` (``attnlab.models``) built from its Hydra config.

    Args:
        net: Hydra config dict of the model (``_target_`` and sizes); ``vocab_size``
            and ``pad_id`` are filled in here.
        optimizer: Hydra config dict of a partial ``torch.optim`` optimizer.
        vocab_size: joint (or target) vocabulary size.
        src_vocab_size: size of a separate source vocabulary, or ``None`` for a joint one.
        label_smoothing: ε of the training loss (val loss is plain cross-entropy).
        warmup_steps: steps of linear warm-up to ``optimizer.lr``.
        lr_decay: the LR after warm-up: ``"inverse_sqrt"`` (:func:`inverse_sqrt_warmup`, Vaswani
            et al.; no planned length) or ``"linear"`` (:func:`linear_warmup_decay`, to 0 at the
            last step of ``trainer.max_epochs``/``max_steps``: Lightning's
            ``estimated_stepping_batches``).
        bleu_tokenize: sacreBLEU's tokenizer for ``val_bleu`` (:func:`attnlab.metrics.bleu_tokenizer`
            of the target language: ``from_config`` passes it).
        rdrop_alpha: α of R-Drop (:func:`attnlab.loss.rdrop_loss`, Liang et al. 2021): each
            training batch passes twice and the two distributions are pulled together; 0 (the
            default) trains on the plain cross-entropy. ``train_loss`` stays the cross-entropy.
    Logged metrics: ``train_loss``, ``val_loss`` (cross-entropy per target token),
    ``val_bleu`` and ``val_chrf`` (sacreBLEU, in [0, 100]; per epoch), ``tokens_per_sec``.
    Progress bar only (not logged): ``loss`` (the step's training loss) and ``tokens/s``
    (target tokens per second over the epoch's finished steps, per rank).
    A net trained by REINFORCE (Bahdanau, ``model.net.attention=hard_reinforce``) adds its
    surrogate to the training objective and logs ``reinforce_reward``, ``reinforce_baseline``,
    ``attention_entropy`` and ``reinforce_grad_var`` per epoch
    (:func:`attnlab.models.hard_attention.score_function_loss`).
    ``val_texts`` (sources, references) set by the caller enables ``val_bleu``/``val_chrf``;
    under DDP each rank translates its share of them, and the sacreBLEU statistics
    (:class:`~attnlab.metrics.CorpusScores`) are summed across ranks into one corpus score.
    ``val_loss`` is likewise a token-weighted ``MeanMetric`` reduced across ranks; the
    batches that only pad a rank's share of the steps (``counted`` False:
    :class:`~attnlab.data.datamodule.CountOnceLoader`) are left out of it, so it counts each
    val pair once on any number of ranks, as ``val_pairs`` (a ``SumMetric``, not logged)
    shows after each validation.
    Raises:
        ConfigError: a ``model.net`` the model classes refuse (their message), an unknown
            ``lr_decay``, an ``rdrop_alpha`` < 0, or > 0 for a net without dropout (and
            without sampled attention).
        NonFiniteLossError: from ``training_step`` when the loss is NaN or ±inf (names the step).
    """

    def __init__(
        self,
        net: dict,
        optimizer: dict,
        vocab_size: int,
        label_smoothing: float = 0.1,
        warmup_steps: int = 0,
        lr_decay: str = "inverse_sqrt",
        val_batch_size: int = 256,
        src_vocab_size: int | None = None,
        bleu_tokenize: str = "13a",
        rdrop_alpha: float = 0.0,
    ):
        super().__init__()
        if not rdrop_alpha >= 0:
            raise ConfigError(f"model.rdrop_alpha={rdrop_alpha} must be ≥ 0 (0 trains without R-Drop)")
        if lr_decay not in LR_DECAYS:
            raise ConfigError(
                f"model.lr_decay={lr_decay!r} is not a schedule; choose one of {', '.join(LR_DECAYS)}"
            )
        self.save_hyperparameters(logger=False)
        extra = {"src_vocab_size": src_vocab_size} if src_vocab_size else {}
        try:  # the models check their sizes and switches (model.net.*): a config error
            self.net = build_net(net, vocab_size=vocab_size, pad_id=PAD_ID, **extra)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        stochastic = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.net.modules())
        if rdrop_alpha > 0 and not stochastic and net.get("attention") != "hard_reinforce":
            raise ConfigError(
                f"model.rdrop_alpha={rdrop_alpha} needs dropout: with model.net.dropout=0 the two "
                "passes agree and R-Drop only doubles each step; set model.net.dropout (e.g. 0.2, "
                "+experiment=full's) or leave model.rdrop_alpha out"
            )
        # Validation metrics (states not saved in checkpoints, summed across DDP ranks).
        # A NaN batch loss makes val_loss NaN (a float strategy puts that float in place of a NaN,
        # weight kept): "warn"/"ignore" would drop the batch, and "disable" replaces every
        # weight by 1 in torchmetrics ≤ 1.9 (Lightning-AI/torchmetrics#3434).
        self.val_loss = MeanMetric(nan_strategy=float("nan"))
        self.val_pairs = SumMetric()  # the val pairs val_loss covers (not logged)
        self.val_scores = CorpusScores(bleu_tokenize)
        self.tokenizer = None
        # The tokenizer file the net trains with (attnlab.checkpoint.tokenizer_record), saved in
        # every checkpoint: a fine-tune (+init_from) checks its corpus was tokenized with it.
        self.tokenizer_facts: dict | None = None
        self.val_texts: tuple[list[str], list[str]] | None = None
        self.heatmap_sources: list[str] = []  # the sentences of the attention maps
        self.stats_batch: dict[str, torch.Tensor] | None = None  # the head statistics' val pairs
        self._epoch_tokens = 0
        self._epoch_start = self._epoch_train_time = 0.0

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Record the tokenizer file (name, sha256, folder) under
        :data:`attnlab.checkpoint.TOKENIZER_KEY`: strings only, read with ``weights_only=True``."""
        if self.tokenizer_facts is not None:
            checkpoint[TOKENIZER_KEY] = dict(self.tokenizer_facts)

    def forward(self, src, src_valid_lens, tgt_in):
        return self.net(src, src_valid_lens, tgt_in)

    def _loss(self, batch, smoothing):
        return sequence_loss(self.net, batch, smoothing)

    def training_step(self, batch, batch_idx):
        alpha = self.hparams.get("rdrop_alpha", 0.0)
        if alpha > 0:  # the net saw the batch twice: a sampled attention's term covers both copies
            objective, loss = rdrop_loss(self.net, batch, self.hparams.label_smoothing, alpha)
            twice = {"tgt_out": torch.cat([batch["tgt_out"], batch["tgt_out"]])}
            objective = self._add_score_function_term(objective, twice)
        else:
            loss = self._loss(batch, self.hparams.label_smoothing)
            objective = self._add_score_function_term(loss, batch)
        if not torch.isfinite(objective):
            raise NonFiniteLossError(
                f"training loss is {objective.item()} at step {self.global_step} (epoch "
                f"{self.current_epoch}, batch {batch_idx}); no weight was updated with it. "
                "Lower optimizer.lr or raise model.warmup_steps (a changed config trains afresh)"
            )
        ntok = int((batch["tgt_out"] != PAD_ID).sum())
        done_tokens, done_time = self._epoch_tokens, self._epoch_train_time
        self._epoch_tokens += ntok
        self.log(
            "train_loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=ntok, sync_dist=True
        )
        # Progress bar only (logger=False: no MLflow metric): this step's loss and the target
        # tokens/s of this epoch's finished steps (this rank's under DDP). Both are CPU tensors,
        # so the bar reads them every step without waiting for the GPU; the loss is copied just
        # after the two syncs above, when nothing is queued on the device.
        self.log("loss", loss.detach().cpu(), on_step=True, on_epoch=False, prog_bar=True, logger=False)
        if done_time > 0:  # none at an epoch's first step
            self.log(
                "tokens/s",
                torch.tensor(done_tokens / done_time),
                on_step=True,
                on_epoch=False,
                prog_bar=True,
                logger=False,
            )
        return objective

    def _add_score_function_term(self, loss: torch.Tensor, batch) -> torch.Tensor:
        """``loss`` plus the REINFORCE surrogate of a net that sampled its attention in this
        step's pass (``net.score_function_loss``: Bahdanau with ``model.net.attention=hard_reinforce``),
        whose metrics are logged per epoch; for every other net, ``loss`` itself."""
        term = getattr(self.net, "score_function_loss", None)
        out = term(batch["tgt_out"]) if term is not None else None
        if out is None:
            return loss
        surrogate, metrics = out
        for name, value in metrics.items():
            self.log(
                name, value, on_step=False, on_epoch=True, batch_size=len(batch["tgt_out"]), sync_dist=True
            )
        return loss + surrogate

    def on_train_epoch_start(self):
        self._epoch_tokens, self._epoch_start, self._epoch_train_time = 0, time.perf_counter(), 0.0

    def on_train_start(self):
        # A run resumed mid-epoch skips on_train_epoch_start: count from here (the resumed part).
        self.on_train_epoch_start()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self._epoch_train_time = time.perf_counter() - self._epoch_start  # after the optimizer step

    def on_train_epoch_end(self):
        # Lightning runs validation before this hook; the time is taken at the last training step.
        # Summed over DDP ranks: the throughput of the whole job.
        self.log(
            "tokens_per_sec",
            self._epoch_tokens / max(self._epoch_train_time, 1e-9),
            sync_dist=True,
            reduce_fx="sum",
        )

    def on_validation_epoch_start(self):
        self.val_pairs.reset()

    def validation_step(self, batch, batch_idx):
        # Logged at every step of every rank, a padding step too: each rank then takes part in
        # the metric's sync at the epoch's end (a rank that never logged it would not).
        self.log("val_loss", self.val_loss, on_epoch=True, prog_bar=True)
        counted = batch.get("counted")  # (B,) bool; False: a pair another rank scores (padding)
        if counted is not None and not bool(counted.all()):
            if not bool(counted.any()):
                return  # a repeated batch that only pads this rank's share of the steps
            # Same batch, same arithmetic; the tokens of the uncounted pairs are not scored.
            batch = {**batch, "tgt_out": batch["tgt_out"].masked_fill(~counted[:, None], PAD_ID)}
        loss = self._loss(batch, 0.0)  # mean over the batch's scored target tokens
        # Weighted by the token count: the epoch value is the mean over all val tokens.
        self.val_loss.update(loss, weight=(batch["tgt_out"] != PAD_ID).sum())
        self.val_pairs.update(len(batch["tgt_out"]) if counted is None else counted.sum())

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        if self.stats_batch is not None:
            self._log_head_statistics()
        if self.val_texts is not None and self.tokenizer is not None:
            self._log_val_scores()

    def _log_head_statistics(self):
        """Entropy, confidence and diagonal offset of every head on ``stats_batch``
        (:func:`attnlab.analysis.heads.head_statistics`); the same sample on every rank, so the same
        values."""
        batch = {k: v.to(self.device) for k, v in self.stats_batch.items()}
        for name, value in head_statistics(self.net, batch).items():
            self.log(name, torch.tensor(value, dtype=torch.float64), sync_dist=True)

    def _log_val_scores(self):
        sources, references = self.val_texts
        world, rank = self.trainer.world_size, self.trainer.global_rank
        sources, references = sources[rank::world], references[rank::world]
        # In translate()'s length order, so each chunk is one of the batches it would form.
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        size = self.hparams.val_batch_size
        for b in range(0, len(order), size):
            idx = order[b : b + size]
            self.val_scores.update(self.translate([sources[i] for i in idx]), [references[i] for i in idx])
        scores = self.val_scores.compute()  # states summed across ranks: one corpus score
        self.val_scores.reset()
        # Every rank holds the same values (float64, as sacreBLEU gives them); the mean over
        # ranks of equal values is that value, and sync_dist keeps Lightning from warning.
        for name, key in (("val_bleu", "bleu"), ("val_chrf", "chrf")):
            self.log(
                name, torch.tensor(scores[key], dtype=torch.float64), prog_bar=key == "bleu", sync_dist=True
            )

    def translate(self, sentences: list[str]) -> list[str]:
        """Greedy translations (detokenized text) of ``sentences``, in order."""
        was_training = self.net.training
        self.net.eval()
        hyps = translate_text(
            self.net.init_state,
            self.net.step,
            self.tokenizer,
            sentences,
            self.hparams.val_batch_size,
            self.device,
        )
        self.net.train(was_training)
        return hyps

    def configure_optimizers(self):
        opt = instantiate(self.hparams.optimizer)(params=self.parameters())
        warmup = self.hparams.warmup_steps
        if self.hparams.get("lr_decay", "inverse_sqrt") == "linear":
            factor = linear_warmup_decay(warmup, int(self.trainer.estimated_stepping_batches))
        else:
            factor = inverse_sqrt_warmup(warmup)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # --- what train.py asks of its task (conf/model/<model>.yaml: task.module) ---------------

    @classmethod
    def from_config(cls, cfg: DictConfig) -> tuple[TranslationModule, tuple[TranslationDataModule]]:
        """(module, (datamodule,)) for ``trainer.fit(module, *loaders)``, from a composed config.

        The net is ``model.net`` sized to the tokenized corpus (``paths.tokenized``); the module
        gets the tokenizer, the first ``data.val_bleu_sentences`` val pairs (scored for
        ``val_bleu`` with the sacreBLEU tokenizer of ``data.tgt_lang``, or ``data.bleu_tokenize``
        when set: :func:`attnlab.metrics.bleu_tokenizer`), the val sources at
        ``heatmaps.sentences`` (indices past the split are skipped) and the record of the
        tokenizer file (:func:`attnlab.checkpoint.tokenizer_record`) its checkpoints keep.
        Raises:
            ValueError: ``data=synthetic`` (a translation model needs a corpus); an unknown
                ``data.bleu_tokenize``.
            FileNotFoundError: the corpus is not tokenized yet (names the stage to run).
            PairTooLongError: a val or test pair needs more positions than the net has
                (:func:`fit_splits`).
        """
        if cfg.data.name == "synthetic":
            raise ConfigError(
                f"model={cfg.model.name} translates; choose data=multi30k, data=fra_eng or data=parallel"
            )
        dm = TranslationDataModule(
            cfg.paths.tokenized,
            cfg.model.batch_size,
            cfg.data.max_len,
            cfg.seed,
            max_tokens=cfg.model.get("max_tokens"),
        )
        plain = lambda node: OmegaConf.to_container(node, resolve=True)
        module = cls(
            net=plain(cfg.model.net),
            optimizer=plain(cfg.optimizer),
            vocab_size=dm.vocab_size,
            label_smoothing=cfg.model.label_smoothing,
            warmup_steps=cfg.model.warmup_steps,
            lr_decay=cfg.model.lr_decay,
            src_vocab_size=dm.src_vocab_size,
            bleu_tokenize=bleu_tokenizer(cfg.data.tgt_lang, cfg.data.get("bleu_tokenize")),
            rdrop_alpha=cfg.model.get("rdrop_alpha", 0.0),  # absent from conf: +model.rdrop_alpha=5
        )
        tok_dir, n = Path(cfg.paths.tokenized), cfg.data.val_bleu_sentences
        sources = read_lines(tok_dir / "val.src.txt")
        module.tokenizer = dm.tokenizer
        module.tokenizer_facts = tokenizer_record(tok_dir)
        module.val_texts = (sources[:n], read_lines(tok_dir / "val.tgt.txt")[:n])
        module.heatmap_sources = [sources[i] for i in cfg.heatmaps.sentences if i < len(sources)]
        if cfg.heatmaps.head_stats_sentences:
            module.stats_batch = dm.fixed_batch("val", cfg.heatmaps.head_stats_sentences)
        fit_splits(cfg, dm, max_positions(module.net))
        return module, (dm,)

    @staticmethod
    def run_tags(cfg: DictConfig) -> dict[str, str]:
        """What the MLflow run translates (``corpus``, ``src_lang``, ``tgt_lang``), in run-name order."""
        return {"corpus": cfg.data.name, "src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang}

    def epoch_callbacks(self, cfg: DictConfig, folder: Path, logger) -> list[pl.Callback]:
        """After every validation epoch, the attention maps of ``heatmaps.epoch_kinds`` (PNGs in
        ``<folder>/attention/epochs/``) and the explorer (``<folder>/explorer.html``)."""
        return [
            EpochHeatmaps(
                self.heatmap_sources,
                cfg.heatmaps.epoch_kinds,
                folder / "attention",
                logger,
                explorer_path=folder / "explorer.html",
            )
        ]

    def figures(self, net: torch.nn.Module, folder: Path) -> list[Path]:
        """The attention PNGs of ``net`` (the kept checkpoint's model) for the heatmap sentences:
        every kind and layer (:func:`attnlab.analysis.viz.translation_heatmaps`), in
        ``<folder>/attention``."""
        return translation_heatmaps(net, self.tokenizer, self.heatmap_sources, folder / "attention")

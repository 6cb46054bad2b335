"""Hydra composition of the real conf/: groups, errors a user sees, resolved paths."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

import attnlab  # noqa: F401 - registers the resolvers conf/ uses, as the apps do

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")


def _compose(overrides, monkeypatch, root="/tmp/attnlab-root", uri=None):
    overrides = [f"paths.root={root}", *overrides]  # the apps default it to the working directory
    if uri is None:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_readme_override_line_composes(monkeypatch):
    cfg = _compose(
        ["model=transformer", "optimizer=adamw", "device=cpu", "trainer.max_epochs=1"], monkeypatch
    )
    assert cfg.model.net._target_ == "attnlab.models.transformer.Transformer"
    assert cfg.optimizer._target_ == "torch.optim.AdamW"
    assert cfg.device.accelerator == "cpu" and cfg.trainer.max_epochs == 1
    assert set(cfg.model.net) >= {"d_model", "num_heads", "num_layers", "ffn_hidden", "dropout"}


def test_unknown_model_lists_valid_choices(monkeypatch):
    with pytest.raises(MissingConfigException) as e:
        _compose(["model=foo"], monkeypatch)
    for choice in ("bahdanau", "nw", "transformer"):
        assert choice in str(e.value)


def test_unknown_key_is_rejected(monkeypatch):
    with pytest.raises(ConfigCompositionException, match="d_modle"):
        _compose(["model.net.d_modle=3"], monkeypatch)


def test_misspelled_trainer_key_is_a_composition_error_naming_it(monkeypatch, tmp_path):
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'trainer\.max_epoch'") as e:
        _compose(["trainer.max_epoch=1"], monkeypatch, root=tmp_path)
    assert "Key 'max_epoch' is not in struct" in str(e.value.__cause__)


def test_train_script_with_misspelled_key_exits_nonzero_naming_it(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "src" / "train.py"), "trainer.max_epoch=1", f"paths.root={tmp_path}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Could not override 'trainer.max_epoch'" in proc.stderr
    assert "Key 'max_epoch' is not in struct" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # failed at composition: nothing ran, nothing written


def test_nw_brings_its_own_data_and_optimizer(monkeypatch):
    cfg = _compose(["model=nw"], monkeypatch)
    assert cfg.data.name == "synthetic" and cfg.optimizer._target_ == "torch.optim.SGD"


def test_mlflow_store_is_absolute_sqlite_at_root(monkeypatch):
    cfg = _compose([], monkeypatch, root="/srv/lab")
    assert cfg.mlflow.tracking_uri == "sqlite:////srv/lab/mlflow.db"
    assert cfg.paths.tokenized == "/srv/lab/data/tokenized/multi30k-en-fr"
    cfg = _compose([], monkeypatch, uri="http://127.0.0.1:5000")
    assert cfg.mlflow.tracking_uri == "http://127.0.0.1:5000"


def test_translation_model_on_synthetic_data_is_a_clear_error(monkeypatch):
    from hydra.utils import get_class

    cfg = _compose(["model=transformer", "data=synthetic"], monkeypatch)
    with pytest.raises(ValueError, match="choose data=multi30k, data=fra_eng or data=parallel"):
        get_class(cfg.model.task.module).from_config(cfg)


@pytest.mark.parametrize(
    "model, lr, extra",
    [
        ("bahdanau", 0.005, {"num_layers": 2, "embed_size": 256}),
        ("transformer", 0.0015, {"ffn_hidden": 64, "num_heads": 4, "tie_embeddings": False}),
    ],
)
def test_fra_eng_d2l_profile_sets_d2ls_hyperparameters(monkeypatch, model, lr, extra):
    cfg = _compose(["data=fra_eng_d2l", f"model={model}"], monkeypatch, root="/r")
    net = cfg.model.net
    assert net.dropout == 0.2 and net.get("num_hiddens", net.get("d_model")) == 256
    assert all(net[k] == v for k, v in extra.items())
    assert cfg.optimizer.lr == lr and cfg.model.batch_size == 128 and cfg.model.label_smoothing == 0
    assert cfg.trainer.max_epochs == 30 and cfg.trainer.gradient_clip_val == 1.0
    assert cfg.checkpoint.monitor is None  # D2L keeps the final model
    assert cfg.paths.checkpoints == f"/r/d2l/checkpoints/{model}"  # not the DVC outputs
    # the command line still wins over the profile
    cfg = _compose(["data=fra_eng_d2l", f"model={model}", "trainer.max_epochs=2"], monkeypatch)
    assert cfg.trainer.max_epochs == 2


def test_profile_applies_only_to_its_pair(monkeypatch):
    cfg = _compose(["model=transformer"], monkeypatch, root="/r")
    assert cfg.trainer.max_epochs == 10 and cfg.model.net.ffn_hidden == 512
    assert cfg.checkpoint.monitor == "val_loss" and cfg.paths.checkpoints == "/r/checkpoints/transformer"


@pytest.mark.parametrize(
    "root, project",
    [
        ("/home/me/attnlab/.dvc/tmp/exps/tmpa1b2c3", "/home/me/attnlab"),  # `dvc exp run --queue`
        ("/home/me/attnlab", "/home/me/attnlab"),
        ("/home/me/.dvc/tmp/exps", "/home/me/.dvc/tmp/exps"),  # the folder itself is no workspace
    ],
)
def test_runs_in_dvcs_temporary_workspace_track_to_the_project(monkeypatch, root, project):
    cfg = _compose([], monkeypatch, root=root)
    assert cfg.paths.tracking_root == project
    assert cfg.mlflow.tracking_uri == f"sqlite:///{project}/mlflow.db"
    assert cfg.mlflow.artifact_location == f"{project}/mlruns"
    assert cfg.paths.checkpoints == f"{root}/checkpoints/transformer"  # outputs stay in the run's copy
    assert cfg.paths.plots == f"{root}/plots/transformer"


def _yaml(path: str):
    from omegaconf import OmegaConf

    return OmegaConf.load(Path(CONF) / path)


def test_trainer_full_extends_default_with_only_its_changes(monkeypatch):
    from omegaconf import OmegaConf

    full = _yaml("trainer/full.yaml")
    assert list(full.defaults) == ["default", "_self_"]
    own = {k: v for k, v in OmegaConf.to_container(full).items() if k != "defaults"}
    base = OmegaConf.to_container(_compose(["trainer=default"], monkeypatch).trainer)
    assert own and all(base[k] != v for k, v in own.items()), "full.yaml repeats a default value"
    composed = OmegaConf.to_container(_compose(["trainer=full"], monkeypatch).trainer)
    assert composed == {**base, **own}
    assert composed["max_epochs"] == 40
    assert composed["precision"] == "${bf16_if_supported:${device.accelerator}}"


def _leaves(node, prefix=""):
    """``{"a.b.c": value}`` for every leaf of a plain nested dict."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_full_profile_experiment_sets_only_its_recipe_on_trainer_full(monkeypatch):
    """``+experiment=full`` = the default composition with trainer=full and exactly the keys
    conf/experiment/full.yaml sets, each of them a change."""
    from omegaconf import OmegaConf

    own = _leaves(
        {k: v for k, v in OmegaConf.to_container(_yaml("experiment/full.yaml")).items() if k != "defaults"}
    )
    assert own == {
        "model.lr_decay": "linear",
        "model.warmup_steps": 800,
        "model.net.num_layers": 3,
        "model.net.ffn_hidden": 1024,
        "model.net.dropout": 0.2,
        "trainer.max_epochs": 25,
        "optimizer.lr": 0.002,
        "checkpoint.average_last": 8,
    }
    base = _leaves(OmegaConf.to_container(_compose(["trainer=full"], monkeypatch)))
    full = _leaves(OmegaConf.to_container(_compose(["+experiment=full"], monkeypatch)))
    assert all(base[k] != v for k, v in own.items()), "experiment/full.yaml repeats a value"
    assert full == {**base, **own}
    assert base["optimizer.lr"] == 0.001 and full["optimizer.lr"] == 0.002  # adam.yaml's peak, the profile's
    assert full["trainer.precision"] == "${bf16_if_supported:${device.accelerator}}"


def test_full_profile_as_dvc_runs_it_takes_max_epochs_from_params(monkeypatch):
    """The train stage puts ``trainer.max_epochs=<models.transformer.max_epochs>`` before the
    model's ``overrides``: the command line beats the experiment file, so the README's
    ``dvc exp run -S models.transformer.max_epochs=25`` is what sets the epochs."""
    stage = ["model=transformer", "data=multi30k", "optimizer=adam", "device=cpu", "seed=0"]
    assert _compose([*stage, "trainer.max_epochs=4", "+experiment=full"], monkeypatch).trainer.max_epochs == 4
    cfg = _compose([*stage, "trainer.max_epochs=25", "+experiment=full"], monkeypatch)
    assert (cfg.trainer.max_epochs, cfg.model.net.dropout, cfg.optimizer.lr, cfg.checkpoint.average_last) == (
        25,
        0.2,
        0.002,
        8,
    )


@pytest.mark.parametrize(
    "flags, device, expected",
    [
        ({"avx2", "avx512f"}, "cpu", "32-true"),
        ({"avx2", "avx512_bf16"}, "cpu", "bf16-mixed"),
        ({"amx_bf16"}, "cpu", "bf16-mixed"),
        ({"avx2", "avx512_bf16"}, "auto", "bf16-mixed"),
        (set(), "auto", "32-true"),
    ],
)
def test_trainer_full_chooses_bf16_where_the_cpu_has_bf16_units(monkeypatch, flags, device, expected):
    import torch

    from attnlab import config

    monkeypatch.setattr(config, "cpu_flags", lambda: set(flags))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = _compose(["trainer=full", f"device={device}"], monkeypatch)
    assert cfg.trainer.precision == expected
    assert _compose(["trainer=full", "trainer.precision=32-true"], monkeypatch).trainer.precision == "32-true"


@pytest.mark.parametrize("bf16, expected", [(True, "bf16-mixed"), (False, "32-true")])
def test_trainer_full_on_a_gpu_asks_cuda_for_bf16(monkeypatch, bf16, expected):
    import torch

    from attnlab import config

    monkeypatch.setattr(config, "cpu_flags", lambda: {"avx512_bf16"})  # the GPU decides, not the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert _compose(["trainer=full", "device=gpu"], monkeypatch).trainer.precision == expected
    assert _compose(["trainer=full", "device=auto"], monkeypatch).trainer.precision == expected
    assert config.bf16_if_supported("mps") == "32-true"


@pytest.mark.parametrize(
    "precision, accelerator, cuda, refused",
    [
        ("16-true", "cpu", False, True),
        ("16-true", "auto", False, True),
        ("16-true", "cpu", True, True),  # a GPU in the machine does not help a run on the CPU
        ("16-true", "auto", True, False),
        ("16-true", "gpu", True, False),
        ("16-mixed", "cpu", False, False),  # Lightning makes it bf16-mixed on a CPU
        ("bf16-mixed", "cpu", False, False),
        ("32-true", "cpu", False, False),
    ],
)
def test_float16_training_on_the_cpu_is_refused(monkeypatch, precision, accelerator, cuda, refused):
    import torch

    from attnlab import config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(config, "cpu_flags", lambda: {"amx_bf16"})
    if not refused:
        config.check_precision(precision, accelerator)
        return
    with pytest.raises(ValueError) as e:
        config.check_precision(precision, accelerator)
    assert str(e.value) == (
        "trainer.precision=16-true trains in float16, which a CPU cannot do (the loss is NaN from "
        "the first step, whatever the learning rate): use trainer.precision=32-true, or bf16-mixed "
        "(this CPU has bf16 units; trainer=full chooses for you)"
    )


@pytest.mark.parametrize("model", ["bahdanau", "transformer"])
def test_d2l_profiles_share_d2l_yaml_and_state_only_their_model(model):
    profile = _yaml(f"profile/fra_eng_d2l_{model}.yaml")
    assert list(profile.defaults) == ["d2l", "_self_"]
    shared = _yaml("profile/d2l.yaml")
    # config.yaml selects `profile: ${data}_${model}`: no pair of choices selects d2l.yaml alone
    pairs = {
        f"{d.stem}_{m.stem}"
        for d in Path(CONF, "data").glob("*.yaml")
        for m in Path(CONF, "model").glob("*.yaml")
    }
    assert f"fra_eng_d2l_{model}" in pairs and "d2l" not in pairs
    assert not set(profile.model) & set(shared.model) and not set(profile.optimizer) & set(shared.optimizer)
    assert set(profile) == {"defaults", "model", "optimizer"}


@pytest.mark.parametrize("name", ["bahdanau", "transformer"])
def test_model_constructor_defaults_equal_conf_model_yaml(name):
    """conf/model/<name>.yaml is the one place of the model's sizes: the Python defaults agree."""
    import importlib
    import inspect

    from omegaconf import OmegaConf

    net = OmegaConf.to_container(_yaml(f"model/{name}.yaml").net)
    module, cls = net.pop("_target_").rsplit(".", 1)
    params = inspect.signature(getattr(importlib.import_module(module), cls)).parameters
    assert {k: params[k].default for k in net} == net


def test_has_bf16_units_answers_for_the_cpu_without_importing_torch():
    """benchmarks/translate_throughput.py asks it in a parent process that keeps torch out; the
    answer is whether /proc/cpuinfo's flags hold avx512_bf16 or amx_bf16 (read here directly)."""
    code = (
        "import sys; from attnlab.config import has_bf16_units; "
        "print(has_bf16_units('cpu'), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    try:
        flags = {
            f
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
            for f in line.partition(":")[2].split()
        }
    except OSError:
        flags = set()
    assert out.stdout.split() == [str(bool(flags & {"avx512_bf16", "amx_bf16"})), "False"]

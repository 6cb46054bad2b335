"""Take the documentation's screenshots from a real run, with headless Chromium.

    python scripts/screenshots.py --project DIR [--out docs/assets]

DIR is a project where `dvc repro` has run: it has plots/transformer/explorer.html and
mlflow.db. The script

1. opens the Transformer's attention explorer from disk (encoder–decoder attention, last
   layer, all heads, validation sentence 1, the last epoch) → explorer.png;
2. copies the head-importance figures the run drew (plots/heads/transformer/importance.png,
   pruning.png) → head_importance.png, head_pruning.png;
3. starts `mlflow ui` on a free loopback port over DIR/mlflow.db, and takes the experiment's
   runs list → mlflow_runs.png, the Transformer's run page → mlflow_run.png, and that run's
   explorer as MLflow's artifact view shows it → mlflow_artifacts.png.

Each page is waited for in real time over the DevTools protocol (the explorer logs
``attnlab-explorer: drawn <state>`` when it has drawn; the MLflow pages are waited for until
the run names show), then captured at --window (default 1400x900 CSS pixels). Chromium is the
first of chromium, chromium-browser, google-chrome on PATH (or --browser). The helpers are
the tests' own (tests/helpers/browser.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.browser import BROWSERS, DevTools, mlflow_ui  # noqa: E402 - tests/ goes on sys.path first

# Beyond the tests' client's flags: no background connections (the machines have no network
# but the package registries, and Chromium's attempts are refused, many at a time).
FLAGS = (
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def drawn(state: str | None = None):
    """Matches the console message the explorer logs once it has drawn (``state``, if given)."""

    def found(event: dict) -> bool:
        if event.get("method") != "Runtime.consoleAPICalled":
            return False
        text = str(event["params"]["args"][0].get("value", ""))
        return text.startswith("attnlab-explorer: drawn ") and (state is None or text.endswith(" " + state))

    return found


def wait_for_text(chrome: DevTools, tab: str, texts: list[str], timeout: float = 90) -> None:
    """Wait until the page's text holds every one of ``texts``, then a little more for layout."""
    deadline = time.monotonic() + timeout
    script = "document.body ? document.body.innerText : ''"
    while True:
        body = chrome.evaluate(tab, script) or ""
        if all(t in body for t in texts):
            time.sleep(2)
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: the page never showed {texts}; it shows: {body[:500]!r}")
        time.sleep(0.5)


def show(chrome: DevTools, url: str, window: tuple[int, int]) -> str:
    """A new tab showing ``url`` with a viewport of exactly ``window`` CSS pixels; its session."""
    tab = chrome.open("about:blank")
    chrome.call(
        "Emulation.setDeviceMetricsOverride",
        tab,
        width=window[0],
        height=window[1],
        deviceScaleFactor=1,
        mobile=False,
    )
    chrome.call("Page.navigate", tab, url=url)
    return tab


# MLflow keeps the UI's choices in the browser's localStorage: the assistant panel closed, and
# the run table's columns (the model tag and the scores) instead of source and dataset.
UI_STATE = """(() => {
  localStorage.setItem("mlflow.assistant.panelOpen_v1", "false");
  localStorage.setItem("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1", "true");
  const key = 'MLflowLocalStorage-1.1-ExperimentPage-["%s"]-ReactComponentState';
  const state = JSON.parse(localStorage.getItem(key) || "{}");
  state.selectedColumns = %s;
  localStorage.setItem(key, JSON.stringify(state));
  const toggle = [...document.querySelectorAll("div")].find((e) => e.innerText === "Model training");
  if (toggle) toggle.click();
  return true;
})()"""
RUNS_HEIGHT = 480  # the run table has a row per model: the rest of a taller window is empty
COLUMNS = [
    "tags.`model`",
    "metrics.`test_bleu`",
    "metrics.`test_chrf`",
    "metrics.`val_bleu`",
    "metrics.`test_mse`",
]


def explorer_state(page: Path, sentence: int, kind: str) -> str:
    """The explorer's state for ``sentence``: the last layer, all heads, the last epoch."""
    from attnlab.analysis.explorer import read_data

    data = read_data(page.read_text(encoding="utf-8"))
    epoch = data["epochs"][-1]
    layers = len(epoch["sentences"][sentence]["kinds"][kind]["layers"])
    return f"sentence={sentence}&kind={kind}&layer={layers}&head=all&epoch={epoch['epoch']}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, required=True, help="a project where `dvc repro` has run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "assets", help="where the PNGs go")
    parser.add_argument("--model", default="transformer", help="whose explorer and run to show")
    parser.add_argument("--sentence", type=int, default=1, help="the validation sentence of the explorer")
    parser.add_argument("--window", default="1400x900", help="width x height in CSS pixels")
    parser.add_argument("--browser", default=None, help="a Chromium binary (default: found on PATH)")
    args = parser.parse_args(argv)

    project = args.project.resolve()
    page = project / "plots" / args.model / "explorer.html"
    store = project / "mlflow.db"
    for needed in (page, store):
        if not needed.is_file():
            raise SystemExit(f"screenshots: {needed} is missing: run `dvc repro` in {project} first")
    browser = args.browser or next((p for b in BROWSERS if (p := shutil.which(b))), None)
    if browser is None:
        raise SystemExit(f"screenshots: no Chromium on PATH (looked for {', '.join(BROWSERS)})")
    window = tuple(int(v) for v in args.window.lower().split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    kind = "encoder_decoder" if args.model == "transformer" else "alignment"
    state = explorer_state(page, args.sentence, kind)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("attnlab")
    if experiment is None:
        raise SystemExit(f"screenshots: {store} has no experiment 'attnlab'")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    run = next((r for r in runs if r.data.tags.get("model") == args.model), None)
    if run is None:
        raise SystemExit(f"screenshots: no run of model {args.model} in {store}")
    names = sorted({r.info.run_name for r in runs if r.info.run_name})[:3]

    written = []
    heads = project / "plots" / "heads" / "transformer"
    for name, target in (("importance.png", "head_importance.png"), ("pruning.png", "head_pruning.png")):
        if (heads / name).is_file():
            written.append(Path(shutil.copyfile(heads / name, args.out / target)))
        else:
            print(
                f"screenshots: {heads / name} is missing (the head_importance stage has not run); "
                f"{target} not written",
                file=sys.stderr,
            )
    with tempfile.TemporaryDirectory(prefix="attnlab-shots-") as tmp:
        tmp = Path(tmp)
        with DevTools(browser, tmp / "profile", window, FLAGS) as chrome:
            tab = show(chrome, f"{page.as_uri()}#{state}", window)
            chrome.wait_for(drawn(state), 90, f"the explorer drawn at {state}")
            time.sleep(1)
            written.append(chrome.screenshot(tab, args.out / "explorer.png"))

        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        with mlflow_ui(store, tmp, env) as ui, DevTools(browser, tmp / "profile-ui", window, FLAGS) as chrome:
            base = f"{ui}/#/experiments/{experiment.experiment_id}"
            tab = show(chrome, f"{base}/runs", window)
            wait_for_text(chrome, tab, names)
            chrome.evaluate(tab, UI_STATE % (experiment.experiment_id, json.dumps(COLUMNS)))
            time.sleep(2)
            tab = show(chrome, f"{base}/runs", (window[0], min(window[1], RUNS_HEIGHT)))
            wait_for_text(chrome, tab, names)
            written.append(chrome.screenshot(tab, args.out / "mlflow_runs.png"))

            tab = show(chrome, f"{base}/runs/{run.info.run_id}", window)
            wait_for_text(chrome, tab, [run.info.run_name, "Parameters"])
            written.append(chrome.screenshot(tab, args.out / "mlflow_run.png"))

            tab = show(chrome, f"{base}/runs/{run.info.run_id}/artifacts/attention/explorer.html", window)
            chrome.wait_for(drawn(), 120, "the explorer drawn in MLflow's artifact view")
            time.sleep(2)
            written.append(chrome.screenshot(tab, args.out / "mlflow_artifacts.png"))
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

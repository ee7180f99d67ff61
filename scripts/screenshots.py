#!/usr/bin/env python3
"""Retake the README's figures and `mlflow ui` screenshots (docs/img/) from a stub-server run.

    .venv/bin/python scripts/screenshots.py                 # demo run (once), figures, shots
    .venv/bin/python scripts/screenshots.py --fresh         # redo the demo run first
    .venv/bin/python scripts/screenshots.py --traces all    # also record traces, if supported

What it does, all on this machine:

1. A demo run in `--demo-dir` (default `.evolve_cache/screenshots-demo`; reused when it
   exists): the stub OpenAI-compatible server (`benchmarks/stub_openai_server.py`) serves
   every role, so the run takes about a minute and its numbers only show the layout, not a
   result. It runs `evolve run experiments/quickstart.toml`, `evolve tune
   experiments/tune_quick.toml` and `evolve export` (the registered model).
2. `evolve compare --plot` of both into docs/img/ (PNG and PDF).
3. `mlflow ui` on the demo's mlruns/, and headless Chromium (Debian: `apt-get install
   chromium`) screenshots of: the runs table, a candidate's metric charts, the prompt registry
   (when it holds prompts), a trace (when the run recorded any) and the registered model.

Every process it starts (stub server, mlflow ui) is stopped at the end, also on errors.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
WINDOW = "1680,1000"
# Chromium runs the single-page app for this long (virtual time) before the screenshot.
RENDER_BUDGET_MS = 25_000


def _log(text: str) -> None:
    print(f"screenshots: {text}", file=sys.stderr, flush=True)


def _env(demo: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["EVOLVE_CACHE_DIR"] = str(demo / "cache")
    # mlflow ui otherwise spends a minute trying to download LiteLLM's price list.
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return env


@contextlib.contextmanager
def _process(command: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> Iterator:
    """A background process in its own process group (mlflow ui starts workers), stopped
    with its whole group: SIGTERM, then SIGKILL after 20 s."""
    with open(log, "w") as output:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            yield process
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _wait_for_line(log: Path, pattern: str, timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text(errors="replace"))
        if match:
            return match
        time.sleep(0.2)
    raise SystemExit(f"screenshots: no {pattern!r} in {log} after {timeout_s:.0f} s")


def _wait_for_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise SystemExit(f"screenshots: {url} did not answer within {timeout_s:.0f} s")


def _evolve(demo: Path, env: dict[str, str], *args: str) -> None:
    command = [PYTHON, "-m", "evolve.cli", *args]
    _log(" ".join(["evolve", *args]))
    done = subprocess.run(command, cwd=demo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"screenshots: evolve {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def demo_run(demo: Path, env: dict[str, str], traces: str | None) -> None:
    """The quickstart, the quick tuning study and an export, on the stub server."""
    demo.mkdir(parents=True, exist_ok=True)
    stub_log = demo / "stub.log"
    stub = [PYTHON, str(REPO / "benchmarks" / "stub_openai_server.py"), "--port", "0"]
    with _process(stub + ["--latency", "0.005"], cwd=demo, env=env, log=stub_log):
        base_url = _wait_for_line(stub_log, r"(http://\S+/v1)", 30).group(1)
        llm = ["--base-url", base_url, "--model", "stub", "--no-llm-cache", "--no-progress"]
        quickstart = REPO / "experiments" / "quickstart.toml"
        tune = REPO / "experiments" / "tune_quick.toml"
        if traces:
            # A copy of the quickstart with traces on (the [tracking] traces key, if this
            # version of the toolkit has it; an older one refuses the key and says so).
            text = quickstart.read_text(encoding="utf-8")
            text = text.replace("[tracking]", f'[tracking]\ntraces = "{traces}"', 1)
            text = re.sub(r'(?m)^file = "', f'file = "{quickstart.parent}/', text)
            quickstart = demo / "quickstart.toml"
            quickstart.write_text(text, encoding="utf-8")
        _evolve(demo, env, "run", str(quickstart), *llm)
        _evolve(demo, env, "tune", str(tune), *llm)
        _evolve(demo, env, "export", str(quickstart), "--out", "exported")


def figures(demo: Path, env: dict[str, str], out: Path) -> None:
    spec = demo / "quickstart.toml"
    quickstart = spec if spec.is_file() else REPO / "experiments" / "quickstart.toml"
    _evolve(demo, env, "compare", str(quickstart), "--plot", str(out / "quickstart-evolution"))
    tune = REPO / "experiments" / "tune_quick.toml"
    _evolve(demo, env, "compare", str(tune), "--plot", str(out / "tune-quick"))


def _pages(tracking_uri: str) -> list[tuple[str, str]]:
    """(file name, UI route) of every page worth a screenshot in this tracking store."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    pages: list[tuple[str, str]] = []
    experiment = client.get_experiment_by_name("amemgym-evolve/quickstart")
    if experiment is None:
        raise SystemExit("screenshots: the demo store has no amemgym-evolve/quickstart experiment")
    eid = experiment.experiment_id
    pages.append(("mlflow-runs.png", f"#/experiments/{eid}/runs"))
    candidates = client.search_runs(
        [eid], filter_string="tags.`evolve.kind` = 'candidate'", order_by=["start_time ASC"]
    )
    if candidates:
        run = candidates[0].info.run_id
        pages.append(
            ("mlflow-candidate-metrics.png", f"#/experiments/{eid}/runs/{run}/model-metrics")
        )
    with contextlib.suppress(Exception):  # a store without the prompt registry
        prompts = client.search_prompts()
        if prompts:
            pages.append(("mlflow-prompts.png", "#/prompts"))
            pages.append(("mlflow-prompt.png", f"#/prompts/{prompts[0].name}"))
    with contextlib.suppress(Exception):
        traces = client.search_traces(locations=[eid], max_results=1)
        if traces:
            trace_id = traces[0].info.trace_id
            pages.append(
                ("mlflow-trace.png", f"#/experiments/{eid}/traces?selectedEvaluationId={trace_id}")
            )
    for model in client.search_registered_models():
        if model.name.startswith("quickstart"):
            version = max(
                int(v.version) for v in client.search_model_versions(f"name='{model.name}'")
            )
            pages.append(
                ("mlflow-registered-model.png", f"#/models/{model.name}/versions/{version}")
            )
            break
    tuning = client.get_experiment_by_name("amemgym-evolve/tune-quick")
    if tuning is not None:
        pages.append(("mlflow-tuning-runs.png", f"#/experiments/{tuning.experiment_id}/runs"))
    return pages


def screenshots(demo: Path, env: dict[str, str], out: Path, chromium: str, port: int) -> None:
    tracking_uri = f"sqlite:///{demo / 'mlruns' / 'mlflow.db'}"
    pages = _pages(tracking_uri)
    mlflow = [str(Path(PYTHON).parent / "mlflow"), "ui", "--backend-store-uri", tracking_uri]
    mlflow += ["--host", "127.0.0.1", "--port", str(port)]
    with _process(mlflow, cwd=demo, env=env, log=demo / "mlflow-ui.log"):
        base = f"http://127.0.0.1:{port}/"
        _wait_for_http(base, 240)
        for name, route in pages:
            target = out / name
            _log(f"{name}: {route}")
            done = subprocess.run(
                [
                    chromium,
                    "--headless=new",
                    "--no-sandbox",  # CI containers run as root
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--hide-scrollbars",
                    f"--window-size={WINDOW}",
                    f"--virtual-time-budget={RENDER_BUDGET_MS}",
                    f"--screenshot={target}",
                    base + route,
                ],
                capture_output=True,
                text=True,
                timeout=180,
            )
            if done.returncode != 0 or not target.is_file():
                raise SystemExit(f"screenshots: chromium failed on {route}:\n{done.stderr[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--demo-dir", type=Path, default=REPO / ".evolve_cache" / "screenshots-demo"
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--fresh", action="store_true", help="delete the demo run and redo it")
    parser.add_argument("--traces", choices=["heldout", "all"], help="record traces in the demo")
    parser.add_argument("--no-figures", action="store_true", help="only the mlflow ui shots")
    parser.add_argument("--port", type=int, default=5077)
    parser.add_argument(
        "--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser")
    )
    args = parser.parse_args()
    if not args.chromium:
        raise SystemExit(
            "screenshots: no chromium on PATH; install it (Debian: apt-get install chromium)"
        )
    demo = args.demo_dir.resolve()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.fresh and demo.exists():
        shutil.rmtree(demo)
    env = _env(demo)
    if not (demo / "mlruns" / "mlflow.db").is_file():
        demo_run(demo, env, args.traces)
    if not args.no_figures:
        figures(demo, env, out)
    screenshots(demo, env, out, args.chromium, args.port)
    _log(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

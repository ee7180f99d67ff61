#!/usr/bin/env python3
"""Retake the docs' figures and `mlflow ui` screenshots (docs/img/) from a stub-server run.

    .venv/bin/python scripts/screenshots.py                 # demo run (once), figures, shots
    .venv/bin/python scripts/screenshots.py --fresh         # redo the demo run first
    .venv/bin/python scripts/screenshots.py --fresh --traces all   # as in docs/img/: with traces

What it does, all on this machine:

1. A demo run in `--demo-dir` (default `.evolve_cache/screenshots-demo`; reused when it
   exists): the stub OpenAI-compatible server (`benchmarks/stub_openai_server.py`) serves
   every role, so the run takes about a minute and its numbers only show the layout, not a
   result. It runs `evolve run experiments/quickstart.toml`, `evolve tune
   experiments/tune_quick.toml` and `evolve export` (the registered model).
2. `evolve compare --plot` of both into docs/img/ (PNG and PDF).
3. `mlflow ui` on the demo's mlruns/, and headless Chromium (Debian: `apt-get install
   chromium`), driven over its DevTools protocol (aiohttp, a dependency of LiteLLM), shoots:
   the runs table as first opened and with the parent expanded (no column set: the scores
   are in the run names), the parent run's page (its candidate table), a candidate's charts, the
   prompt registry and one prompt (when it holds prompts), a trace (when the run recorded
   any; `--traces all`), the registered model and the tuning study's trials.

Every process it starts (stub server, mlflow ui) is stopped at the end, also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# This checkout's `evolve` (the address the UI is opened at), not another installed copy.
sys.path.insert(0, str(REPO))
PYTHON = sys.executable
# The width the docs promise the scores are visible at.
WINDOW = "1440,900"
# Real seconds the single-page app gets to fetch and draw a page, then to react to the clicks.
RENDER_WAIT_S = 12.0
SETTLE_WAIT_S = 3.0
# The tuning study's page and a trace: from the stub demo when a real run's store is shot
# (the quickstart runs no study and records no trace).
TUNING_PAGE = "mlflow-tuning-runs.png"
TRACE_PAGE = "mlflow-trace.png"
DEMO_ONLY_PAGES = {TUNING_PAGE, TRACE_PAGE}


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
    """A background process in its own process group, stopped with its whole group as
    `evolve ui` stops its server (`stop_process_group`)."""
    from evolve.tracking.ui_server import stop_process_group

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
            stop_process_group(process)


def _wait_for_line(log: Path, pattern: str, timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text(errors="replace"))
        if match:
            return match
        time.sleep(0.2)
    raise SystemExit(f"screenshots: no {pattern!r} in {log} after {timeout_s:.0f} s")


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
            # A copy of the quickstart with traces on: its `[tracking] traces` key is set
            # (replaced when the file has one, which TOML forbids repeating, else added).
            text = quickstart.read_text(encoding="utf-8")
            text, replaced = re.subn(r'(?m)^traces = "[a-z]+"', f'traces = "{traces}"', text)
            if not replaced:
                text = text.replace("[tracking]", f'[tracking]\ntraces = "{traces}"', 1)
            text = re.sub(r'(?m)^file = "', f'file = "{quickstart.parent}/', text)
            quickstart = demo / "quickstart.toml"
            quickstart.write_text(text, encoding="utf-8")
        _evolve(demo, env, "run", str(quickstart), *llm)
        _evolve(demo, env, "tune", str(tune), *llm)
        _evolve(demo, env, "export", str(quickstart), "--out", "exported")


# The quickstart's figure shows a result, so it is drawn from a real run: the record of the
# quickstart's own environment seed on the bundled 1.5B (the stub's run shows only the layout).
QUICKSTART_RECORD = (
    REPO / "benchmarks" / "records" / "quickstart_seeds-addable-failures" / "quickstart-s13"
)


def figures(demo: Path, env: dict[str, str], out: Path) -> None:
    plot = str(out / "quickstart-evolution")
    _evolve(demo, env, "compare", str(QUICKSTART_RECORD), "--plot", plot)
    tune = REPO / "experiments" / "tune_quick.toml"
    _evolve(demo, env, "compare", str(tune), "--plot", str(out / "tune-quick"))


# Pressed on every page: MLflow 3.17 opens its Assistant panel over a third of the page on a
# browser's first visit.
CLOSE_ASSISTANT = (
    "document.querySelector('[data-component-id=\"mlflow.assistant.chat_panel.close\"]')?.click();"
)
# The runs table shows the quickstart's parent run collapsed; its candidates are children.
EXPAND_PARENT_RUN = (
    "document.querySelectorAll('[data-component-id$=\"runnamecellrenderer.tsx_46\"]')"
    ".forEach(button => button.click());"
)


# The trace opens on its root span; an LLM call's span shows its messages, completion,
# tokens and latency. The first "llm agent" label in the tree is clicked.
SELECT_LLM_CALL = (
    "const labels = [...document.querySelectorAll('span, div')].filter("
    "element => element.children.length === 0 && element.innerText.trim() === 'llm agent');"
    "labels[0]?.click();"
)


Page = tuple[str, str, str, str]


def _pages(tracking_uri: str) -> list[Page]:
    """(file name, UI route, setup script after which the page is reloaded, script run once
    the page has rendered) of every page worth a screenshot in this tracking store."""
    import mlflow

    from evolve.tracking.runs_view import publish_runs_view, runs_view_route

    client = mlflow.MlflowClient(tracking_uri)
    pages: list[Page] = []
    experiment = client.get_experiment_by_name("amemgym-evolve/quickstart")
    if experiment is None:
        raise SystemExit("screenshots: the demo store has no amemgym-evolve/quickstart experiment")
    eid = experiment.experiment_id
    # As a new browser first sees the table at the address `evolve ui` opens (its shared
    # view: the score columns, newest first): the parent run collapsed with its best's
    # scores; then with the parent expanded (one click), every candidate's.
    publish_runs_view(client, eid)
    printed = runs_view_route(eid).lstrip("/")
    pages.append(("mlflow-runs-first-open.png", printed, "", ""))
    pages.append(("mlflow-runs.png", printed, "", EXPAND_PARENT_RUN))
    parents = client.search_runs([eid], filter_string="tags.`evolve.kind` = 'experiment'")
    if parents:
        route = f"#/experiments/{eid}/runs/{parents[0].info.run_id}"
        pages.append(("mlflow-parent-run.png", route, "", ""))
    candidates = client.search_runs(
        [eid], filter_string="tags.`evolve.kind` = 'candidate'", order_by=["start_time ASC"]
    )
    if candidates:
        run = candidates[0].info.run_id
        route = f"#/experiments/{eid}/runs/{run}/model-metrics"
        pages.append(("mlflow-candidate-metrics.png", route, "", ""))
    with contextlib.suppress(Exception):  # a store without the prompt registry
        prompts = client.search_prompts()
        if prompts:
            pages.append(("mlflow-prompts.png", "#/prompts", "", ""))
            pages.append(("mlflow-prompt.png", f"#/prompts/{prompts[0].name}", "", ""))
    with contextlib.suppress(Exception):
        traces = client.search_traces(locations=[eid], max_results=1)
        if traces:
            trace_id = traces[0].info.trace_id
            route = f"#/experiments/{eid}/traces?selectedEvaluationId={trace_id}"
            pages.append((TRACE_PAGE, route, "", SELECT_LLM_CALL))
    for model in client.search_registered_models():
        if model.name.startswith("quickstart"):
            version = max(
                int(v.version) for v in client.search_model_versions(f"name='{model.name}'")
            )
            route = f"#/models/{model.name}/versions/{version}"
            pages.append(("mlflow-registered-model.png", route, "", ""))
            # Its LoggedModel: the champion's metrics, figures and linked prompts.
            source = client.get_model_version(model.name, str(version)).source
            logged = client.get_logged_model(source.removeprefix("models:/"))
            route = f"#/experiments/{logged.experiment_id}/models/{logged.model_id}"
            pages.append(("mlflow-logged-model.png", route, "", ""))
            break
    tuning = client.get_experiment_by_name("amemgym-evolve/tune-quick")
    if tuning is not None:
        publish_runs_view(client, tuning.experiment_id)
        route = runs_view_route(tuning.experiment_id).lstrip("/")
        pages.append((TUNING_PAGE, route, "", EXPAND_PARENT_RUN))
    return pages


async def _shoot_pages(devtools: str, base: str, pages: list[Page], out: Path) -> None:
    """Drive one headless Chromium tab over the DevTools protocol: open each page, give the
    single-page app real time to fetch and draw (charts load after the page), close the
    Assistant, run the page's script, then capture. (`chromium --screenshot` cannot click,
    and its virtual time budget captured the charts still spinning.)"""
    import aiohttp

    width, height = (int(size) for size in WINDOW.split(","))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{devtools}/json/list") as response:
            targets = await response.json()
        tab = next(target for target in targets if target["type"] == "page")
        async with session.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as socket:
            message_id = 0

            async def command(method: str, **params: object) -> dict:
                nonlocal message_id
                message_id += 1
                await socket.send_json({"id": message_id, "method": method, "params": params})
                while True:  # events arrive in between; only our answer matters
                    message = await socket.receive_json(timeout=120)
                    if message.get("id") == message_id:
                        if "error" in message:
                            raise SystemExit(f"screenshots: {method} failed: {message['error']}")
                        return message.get("result", {})

            await command(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            for name, route, setup, script in pages:
                _log(f"{name}: {route}")
                await command("Page.navigate", url=base + route)
                await asyncio.sleep(RENDER_WAIT_S)
                if setup:
                    await command("Runtime.evaluate", expression=setup)
                    await command("Page.reload")
                    await asyncio.sleep(RENDER_WAIT_S)
                await command("Runtime.evaluate", expression=CLOSE_ASSISTANT + script)
                await asyncio.sleep(SETTLE_WAIT_S)
                shot = await command("Page.captureScreenshot", format="png")
                (out / name).write_bytes(base64.b64decode(shot["data"]))


def screenshots(
    demo: Path,
    env: dict[str, str],
    out: Path,
    chromium: str,
    port: int,
    *,
    store: Path,
    only: set[str] | None = None,
) -> None:
    tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
    pages = _pages(tracking_uri)
    if store != demo / "mlruns":  # the study and the traces come from the demo's store
        pages = [page for page in pages if page[0] not in DEMO_ONLY_PAGES]
    elif only is not None:
        pages = [page for page in pages if page[0] in only]
    from evolve.tracking.ui_server import running_ui

    # A new user's browser: no column, workflow or panel choice kept from an earlier run.
    profile = demo / "chromium-profile"
    shutil.rmtree(profile, ignore_errors=True)
    browser = [
        chromium,
        "--headless=new",
        "--no-sandbox",  # CI containers run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--window-size={WINDOW}",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    chromium_log = demo / "chromium.log"
    # The server `evolve ui` starts, started the same way.
    with running_ui(tracking_uri, host="127.0.0.1", port=port):
        base = f"http://127.0.0.1:{port}/"
        with _process(browser, cwd=demo, env=env, log=chromium_log):
            devtools = _wait_for_line(chromium_log, r"DevTools listening on ws://([^/\s]+)/", 60)
            asyncio.run(_shoot_pages(devtools.group(1), base, pages, out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--demo-dir", type=Path, default=REPO / ".evolve_cache" / "screenshots-demo"
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--fresh", action="store_true", help="delete the demo run and redo it")
    parser.add_argument(
        "--store",
        type=Path,
        help="shoot this checkout's mlruns/ (e.g. a fresh clone's after its quickstart and "
        "export) instead of the stub demo's; the tuning page still comes from the demo",
    )
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
    store = args.store.resolve() if args.store else demo / "mlruns"
    screenshots(demo, env, out, args.chromium, args.port, store=store)
    if store != demo / "mlruns":  # the study's page and a trace, from the demo
        demo_store = demo / "mlruns"
        screenshots(
            demo, env, out, args.chromium, args.port, store=demo_store, only=DEMO_ONLY_PAGES
        )
    record_provenance(store, demo)
    _log(f"written to {out}")
    return 0


PROVENANCE_LINE = re.compile(r"(?m)^Screenshots taken on .*$")


def record_provenance(store: Path, demo: Path) -> None:
    """Say in docs/mlflow.md when, at which commit and from which store the shots were taken."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    source = (
        "a stub-server demo run (the numbers show the layout only)"
        if store == demo / "mlruns"
        else "a fresh clone's quickstart on the bundled 1.5B and its export (the tuning study "
        "and the trace: a stub-server demo run with traces)"
    )
    line = (
        f"Screenshots taken on {time.strftime('%Y-%m-%d')} at commit {commit or 'unknown'} by "
        f"`scripts/screenshots.py`, from {source}."
    )
    page = REPO / "docs" / "mlflow.md"
    text = page.read_text(encoding="utf-8")
    if PROVENANCE_LINE.search(text):
        page.write_text(PROVENANCE_LINE.sub(line, text, count=1), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())

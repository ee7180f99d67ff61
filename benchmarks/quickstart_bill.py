"""The quickstart's bill, cold: whole-process wall time, each stage's seconds and tokens, the
server's prompt-evaluation and decoding seconds, against a committed baseline.

`run` starts `evolve run SPEC` as one process, as a new user would, with every cache cold: a
fresh `EVOLVE_CACHE_DIR` (response cache, upper-bound tables, the model file assembled again
from its PyPI copy) and a fresh runs directory. `show` reads a finished run. Both print:

- the whole process's wall time (`run` only);
- per generation: wall seconds, LLM calls sent, tokens;
- per stage outside the generations (upper bound, held-out tests): the same, plus the
  server's prompt-evaluation and decoding seconds;
- the run's server seconds (summed over slots) and the share of wall time with no request in
  flight (the toolkit's own);
- the held-out verdict of the best against the base;

and beside each figure the baseline's and their ratio. `--save` writes the figures as the new
baseline. Only ratios mean something on a shared machine: measure on idle cores.

    .venv/bin/python benchmarks/quickstart_bill.py run [--spec experiments/quickstart.toml]
        [--work DIR] [--baseline benchmarks/records/quickstart-bill.json] [--save]
    .venv/bin/python benchmarks/quickstart_bill.py show RUN_DIR [--baseline ...] [--save]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = ROOT / "benchmarks" / "records" / "quickstart-bill.json"


def run_cold(spec: Path, work: Path) -> tuple[Path, float]:
    """Run `evolve run SPEC` in one process with cold caches; its run directory and wall."""
    name = tomllib.loads(spec.read_text(encoding="utf-8"))["name"]
    store = work / "mlruns"
    store.mkdir(parents=True, exist_ok=True)
    environment = {
        **os.environ,
        "EVOLVE_CACHE_DIR": str(work / "cache"),
        # Tracked as a user's run is, into a store of its own rather than the checkout's.
        "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",
    }
    environment.pop("DSPY_CACHEDIR", None)  # the response cache lives in the fresh cache dir
    command = [sys.executable, "-m", "evolve.cli", "run", str(spec), "--no-progress"]
    command += ["--runs-dir", str(work / "runs")]
    print("$", " ".join(command), f"(EVOLVE_CACHE_DIR={work / 'cache'})", flush=True)
    started = time.perf_counter()
    subprocess.run(command, env=environment, check=True, cwd=ROOT)
    return work / "runs" / name, time.perf_counter() - started


def figures(run_dir: Path, process_wall_s: float | None) -> dict[str, Any]:
    """The bill of a finished run directory (`result.json`)."""
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    found: dict[str, Any] = {"name": result["name"]}
    if process_wall_s is not None:
        found["process wall s"] = round(process_wall_s, 1)
    found["run wall s"] = round(result["wall_time_s"], 1)
    for generation in result["generations"]:
        label = f"generation {generation['generation']}"
        found[f"{label} wall s"] = round(generation["wall_time_s"], 1)
        found[f"{label} calls"] = generation["llm_calls"]
        found[f"{label} tokens"] = generation["tokens"]
    for stage, spend in result.get("stage_spend", {}).items():
        found[f"{stage} wall s"] = round(spend.get("wall_time_s", 0.0), 1)
        found[f"{stage} calls"] = spend.get("requests", 0)
        found[f"{stage} tokens"] = spend.get("prompt_tokens", 0) + spend.get("completion_tokens", 0)
        found[f"{stage} prompt s"] = round(spend.get("prompt_eval_s", 0.0), 1)
        found[f"{stage} decode s"] = round(spend.get("decode_s", 0.0), 1)
    found["calls"] = result["llm_calls"]
    found["tokens"] = result["tokens"]
    found["server prompt s"] = round(result.get("prompt_eval_s", 0.0), 1)
    found["server decode s"] = round(result.get("decode_s", 0.0), 1)
    if result.get("toolkit_share") is not None:
        found["toolkit share"] = round(result["toolkit_share"], 3)
    comparison = result.get("heldout_comparison") or {}
    if comparison:
        difference = comparison.get("difference") or {}
        interval = difference.get("interval") or {}
        found["held-out verdict"] = comparison.get("verdict")
        found["held-out difference"] = difference.get("value")
        found["held-out difference low"] = interval.get("low")
        found["held-out difference high"] = interval.get("high")
        found["McNemar best-only / base-only"] = (
            f"{comparison.get('x_only_correct')}/{comparison.get('y_only_correct')}"
        )
    return found


def show(found: dict[str, Any], baseline: dict[str, Any] | None) -> None:
    width = max(len(key) for key in found)
    print(f"{'figure':<{width}} {'this run':>12} {'baseline':>12} {'ratio':>7}")
    for key, value in found.items():
        before = (baseline or {}).get(key)
        ratio = ""
        if isinstance(value, int | float) and isinstance(before, int | float) and before:
            ratio = f"{value / before:.2f}x"
        print(f"{key:<{width}} {_cell(value):>12} {_cell(before):>12} {ratio:>7}")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cold = commands.add_parser("run", help="run the spec cold and print its bill")
    cold.add_argument("--spec", type=Path, default=ROOT / "experiments" / "quickstart.toml")
    cold.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    shown = commands.add_parser("show", help="print the bill of a finished run directory")
    shown.add_argument("run_dir", type=Path)
    for sub in (cold, shown):
        sub.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE)
        sub.add_argument("--save", action="store_true", help="write the figures as the baseline")
    args = parser.parse_args()
    if args.command == "run":
        work = args.work or Path(tempfile.mkdtemp(prefix="quickstart-bill-"))
        run_dir, wall = run_cold(args.spec.resolve(), work.resolve())
        found = figures(run_dir, wall)
    else:
        found = figures(args.run_dir, None)
    baseline = (
        json.loads(args.baseline.read_text(encoding="utf-8")) if args.baseline.exists() else None
    )
    show(found, baseline)
    if args.save:
        args.baseline.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
        print(f"saved as the baseline: {args.baseline}")


if __name__ == "__main__":
    main()

"""Overhead of MLflow traces (`[tracking] traces`): the same small experiment, tracked, with
traces = "none" and traces = "all", each repeated in fresh directories.

The LMs are the test suite's scripted ones (`tests/optimize/evolve_helpers.World`, instant
replies), so the difference in wall time is the cost of the traces alone, an upper bound on
their share of a run with real LMs. Printed: median wall time per mode, the number of traced
user-periods (spans of kind `period`) and the extra milliseconds per traced user-period.

    PYTHONPATH=$PWD:$PWD/tests .venv/bin/python benchmarks/trace_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def run_once(directory: Path, traces: str) -> tuple[float, int]:
    from optimize.evolve_helpers import World, write_spec

    from evolve.optimize import evolve_policy
    from evolve.spec.config import load_spec
    from evolve.tracking import MLflowTracker, mlflow_client

    uri = f"sqlite:///{directory}/mlruns/mlflow.db"
    spec_path = write_spec(directory, tracking=f'experiment_name = "bench"\ntraces = "{traces}"')
    spec = load_spec(spec_path)
    started = time.perf_counter()
    evolve_policy(
        spec,
        World().lms,
        runs_dir=directory / "runs",
        tracker=MLflowTracker(uri, spec.mlflow_experiment_name()),
        upper_bound_cache=directory / "ub",
    )
    elapsed = time.perf_counter() - started
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name("bench")
    traces_found = client.search_traces(locations=[experiment.experiment_id], max_results=1000)
    periods = sum(1 for t in traces_found for s in t.data.spans if s.name.startswith("period "))
    return elapsed, periods


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"none": [], "all": []}
    traced_periods = 0
    for repeat in range(args.repeats):
        for mode in ("none", "all"):  # alternated: drift in machine load hits both
            with tempfile.TemporaryDirectory() as tmp:
                elapsed, periods = run_once(Path(tmp), mode)
            times[mode].append(elapsed)
            if mode == "all":
                traced_periods = periods
            print(f"repeat {repeat} traces={mode}: {elapsed:.2f} s ({periods} traced periods)")
    none, traced = statistics.median(times["none"]), statistics.median(times["all"])
    extra_ms = (traced - none) * 1000 / max(traced_periods, 1)
    print(
        f"median: none {none:.2f} s, all {traced:.2f} s (+{(traced / none - 1) * 100:.0f}%), "
        f"{traced_periods} traced user-periods, {extra_ms:.1f} ms per traced user-period"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

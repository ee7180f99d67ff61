"""One tuning worker process on scripted LMs (used by the two-worker test).

Usage: python worker_main.py SPEC RUNS_DIR UPPER_BOUND_CACHE
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script: make the tests directory importable like pytest does (pythonpath=tests),
# and the repository (a bare tests/memory_policies/ directory must not shadow the package).
_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(_ROOT / "tests"), str(_ROOT)]

from tuning.tune_helpers import TuneWorld  # noqa: E402

from evolve.tuning import load_study_spec, run_study  # noqa: E402


def main(spec: str, runs_dir: str, cache: str) -> int:
    world = TuneWorld(delay_s=0.01)
    result = run_study(
        load_study_spec(spec),
        world.lms,
        runs_dir=runs_dir,
        upper_bound_cache=cache,
        worker_only=True,
    )
    print(f"worker done: {result.finished_trials} finished trials")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))

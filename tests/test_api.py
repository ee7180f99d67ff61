"""The Python API (`evolve.api`) and the promise that importing `evolve` changes nothing in the
caller's process: environment defaults are set by the `evolve` command and the API functions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stub_server import StubServer

REPO = Path(__file__).resolve().parents[1]
TOOLKIT_VARIABLES = ("DSPY_CACHEDIR", "LITELLM_LOCAL_MODEL_COST_MAP", "HF_HUB_OFFLINE")


def _python(code: str, tmp_path: Path) -> dict:
    """Run `code` in a fresh interpreter without the toolkit's variables; it prints JSON."""
    env = {k: v for k, v in os.environ.items() if k not in TOOLKIT_VARIABLES}
    env.update(PYTHONPATH=str(REPO), EVOLVE_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_evolve_leaves_the_environment_unchanged(tmp_path):
    code = """
import json, os
before = dict(os.environ)
import evolve, evolve.api, evolve.cli, evolve.export.bundle
after = dict(os.environ)
print(json.dumps({"changed": sorted(k for k in before.keys() | after.keys()
                                     if before.get(k) != after.get(k))}))
"""
    assert _python(code, tmp_path) == {"changed": []}


def test_the_cli_entry_points_dspys_cache_at_the_toolkit_cache(tmp_path):
    code = """
import json, os
import dspy
from evolve.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
print(json.dumps({"env": os.environ.get("DSPY_CACHEDIR"),
                  "dspy": str(dspy.cache.disk_cache_dir)}))
"""
    expected = str((tmp_path / "cache" / "dspy").resolve())
    assert _python(code, tmp_path) == {"env": expected, "dspy": expected}


def test_a_users_own_dspy_cache_setting_wins(tmp_path):
    code = f"""
import json, os
os.environ["DSPY_CACHEDIR"] = {str(tmp_path / "mine")!r}
import dspy
from evolve.core.paths import use_toolkit_caches
use_toolkit_caches()
print(json.dumps({{"dspy": str(dspy.cache.disk_cache_dir)}}))
"""
    assert _python(code, tmp_path) == {"dspy": str(tmp_path / "mine")}


def test_evaluate_policies_runs_what_evolve_eval_runs(tmp_path):
    """Against the stub endpoint: one report per policy, stored where the command stores it."""
    from evolve import api
    from evolve.commands.eval import run_dir_names
    from evolve.llm import EndpointConfig, LLMConfig
    from evolve.simulator.evaluation import EpisodeConfig
    from evolve.simulator.synthesis.offline import synthesize_environment
    from evolve.simulator.synthesis.presets import get_preset

    environment = synthesize_environment(get_preset("tiny"), seed=0)
    with StubServer() as stub:
        llm = LLMConfig(default=EndpointConfig(model="stub", base_url=stub.base_url))
        reports = api.evaluate_policies(
            environment,
            ["native", "in_context:update_every=2,short_term_len=2"],
            tmp_path / "eval",
            llm=llm,
            episode=EpisodeConfig(concurrency=1, max_users=1),
            upper_bound_cache=tmp_path / "ub",
        )
    assert list(reports) == run_dir_names(["native", "in_context:update_every=2,short_term_len=2"])
    assert len(set(reports)) == 2
    for name, report in reports.items():
        assert Path(report.run_dir) == tmp_path / "eval" / name
        assert report.complete and report.summary.n_items > 0
        assert 0.0 <= report.summary.accuracy <= 1.0

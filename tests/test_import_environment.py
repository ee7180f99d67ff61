"""Importing any module of `evolve` leaves the caller's `os.environ` unchanged: MLflow sets
a telemetry variable when it is imported, so the toolkit imports MLflow lazily, and
environment defaults are set by the CLI and the API functions only.

A fresh interpreter per check: a module already imported by another test proves nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Variables the toolkit (or MLflow on import) would set; removed so a change is visible.
WATCHED = (
    "DSPY_CACHEDIR",
    "LITELLM_LOCAL_MODEL_COST_MAP",
    "HF_HUB_OFFLINE",
    "MLFLOW_DISABLE_TELEMETRY",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
    "_MLFLOW_TELEMETRY_SESSION_ID",
)
# The registered model's code ("models from code"): MLflow loads it, it imports MLflow by
# design, and nothing in the toolkit imports it.
NOT_IMPORTED_BY_THE_TOOLKIT = {"evolve.export.exported_model"}

CHECK = """
import importlib, json, os, pkgutil
before = dict(os.environ)
import evolve
modules = sorted(
    m.name for m in pkgutil.walk_packages(evolve.__path__, "evolve.")
    if m.name not in {skip!r} and not m.name.endswith("__main__")
)
for name in modules:
    importlib.import_module(name)
after = dict(os.environ)
changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
print(json.dumps({{"modules": modules, "changed": changed}}))
"""


def test_importing_every_evolve_module_leaves_os_environ_unchanged(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in WATCHED}
    env.update(PYTHONPATH=str(REPO), EVOLVE_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(skip=sorted(NOT_IMPORTED_BY_THE_TOOLKIT))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # The walk really covered the modules that use MLflow and the CLI.
    assert {"evolve.tracking", "evolve.export.bundle", "evolve.cli"} <= set(report["modules"])
    assert report["changed"] == []

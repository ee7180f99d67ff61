"""`memory-policies` as its own distribution, and the registered model without the toolkit.

One fresh virtualenv (no toolkit, no torch) gets the `memory-policies` wheel built from
`dist/memory-policies` plus mlflow. In it, the "in your own app" snippet of docs/export.md runs
against the stub endpoint, and the model `evolve export` registers loads from the registry
(`models:/NAME@champion`) and predicts.

Installing needs PyPI once: the dependencies are kept as wheels in
`$EVOLVE_CACHE_DIR/wheelhouse` (pip's HTTP cache does not keep the registry's files here),
so later runs install offline (the three tests: 2.5 minutes on this 2-core machine, 8 with an
empty wheelhouse).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pytest
from stub_server import StubServer

import memory_policies
from evolve.core.paths import cache_dir

pytestmark = pytest.mark.slow_install

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTION = REPO / "dist" / "memory-policies"
SNIPPET_BUNDLE = 'memory_policies.load("runs/exported_policy")'
SNIPPET_LM = 'dspy.LM("openai/gpt-4.1-mini")'


def _pip(*args: str, timeout: float = 900) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory) -> Path:
    """A virtualenv holding only memory-policies (+ its dependencies) and mlflow."""
    root = tmp_path_factory.mktemp("fresh-venv")
    wheels = root / "wheels"
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", str(DISTRIBUTION), "-w", str(wheels))
    (wheel,) = wheels.glob("memory_policies-*.whl")
    venv = root / "venv"
    # No pip inside: the toolkit's pip installs into it (`--python`), which saves ensurepip.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    wanted = [str(wheel), f"mlflow=={mlflow.__version__}"]
    wheelhouse = cache_dir() / "wheelhouse"
    offline = subprocess.run(
        # --no-compile: byte-compiling mlflow's and pandas' trees is most of an install's time.
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile"]
        + ["--no-index"]
        + ["--find-links", str(wheelhouse), *wanted],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if offline.returncode != 0:  # first run (or new versions): fetch the missing wheels once
        _pip("wheel", "-q", "--find-links", str(wheelhouse), "-w", str(wheelhouse), *wanted)
        _pip(
            "--python", str(python), "install", "-q", "--no-compile", "--no-index",
            "--find-links", str(wheelhouse), *wanted,
        )  # fmt: skip
    return python


def _run_in(python: Path, code: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DSPY_CACHEDIR"}}
    env["DSPY_CACHEDIR"] = str(cwd / "dspy-cache")
    done = subprocess.run(
        [str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _readme_snippet() -> str:
    """The "in your own app" snippet of docs/export.md."""
    page = (REPO / "docs" / "export.md").read_text()
    section = page[page.index("## In your own app") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_fresh_venv_has_no_toolkit_and_no_torch(fresh_venv, tmp_path):
    out = _run_in(
        fresh_venv,
        "import importlib.util as u; print([m for m in ('evolve', 'torch', 'llama_cpp') "
        "if u.find_spec(m)])",
        tmp_path,
    )
    assert out.strip() == "[]"


def test_readme_snippet_runs_with_only_memory_policies_installed(fresh_venv, tmp_path):
    bundle = tmp_path / "bundle"
    memory_policies.build_policy("in_context:update_every=2,short_term_len=2").save(bundle)
    snippet = _readme_snippet()
    assert SNIPPET_BUNDLE in snippet and SNIPPET_LM in snippet  # the page still says this
    with StubServer() as stub:
        code = snippet.replace(SNIPPET_BUNDLE, f"memory_policies.load({str(bundle)!r})").replace(
            SNIPPET_LM, f'dspy.LM("openai/stub", api_base={stub.base_url!r}, api_key="unused")'
        )
        code += "\nprint(state.model_dump_json())\n"
        out = _run_in(fresh_venv, code, tmp_path)
        calls = stub.stats()["chat_requests"]
    assert calls >= 2  # both turns reached the endpoint
    state = json.loads(out.strip().splitlines()[-1])
    assert state["kind"] == "in_context"


def test_registered_model_loads_and_predicts_without_the_toolkit(fresh_venv, tmp_path):
    from evolve.export.bundle import register_model_version

    bundle = tmp_path / "bundle"
    memory_policies.build_policy("in_context:update_every=2,short_term_len=2").save(bundle)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    version, model_uri = register_model_version(bundle, "fresh-policy", tracking_uri=uri)
    assert model_uri == "models:/fresh-policy@champion"
    with StubServer() as stub:
        code = textwrap.dedent(
            f"""
            import json, mlflow
            mlflow.set_tracking_uri({uri!r})
            config = {{"model": "openai/stub", "base_url": {stub.base_url!r}}}
            model = mlflow.pyfunc.load_model({model_uri!r}, model_config=config)
            turn = model.predict([{{"user_message": "[Current Time: 2025-03-01]\\nI am keto."}}])
            answer = model.predict([{{"question": "My diet?", "options": ["vegan", "keto"],
                                     "state": turn[0]["state"]}}])
            print(json.dumps({{"turn": turn, "answer": answer}}))
            """
        )
        out = _run_in(fresh_venv, code, tmp_path)
        calls = stub.stats()["chat_requests"]
    result = json.loads(out.strip().splitlines()[-1])
    assert calls >= 2
    assert json.loads(result["turn"][0]["state"])["kind"] == "in_context"
    assert result["answer"][0]["choice"] in (1, 2, None)
    assert result["answer"][0]["state"] == result["turn"][0]["state"]  # questions are read-only

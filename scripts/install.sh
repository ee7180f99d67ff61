#!/usr/bin/env bash
# Create .venv and install amemgym-evolve into it; `--test` adds the test dependencies.
# Safe to rerun: an existing .venv is reused and only what changed is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv

# The embedded LLM server: llama.cpp's llama-server, compiled from the llama.cpp sources of
# the pinned llama-cpp-python sdist with portable x86-64 flags (about 6 minutes on 2 cores;
# skipped when .venv/bin/llama-server already matches). A failed build stops the install.
PYTHON=.venv/bin/python scripts/build_llama_server.sh .venv/bin .evolve_cache/build

target="."
if [ "${1:-}" = "--test" ]; then
  target=".[test]"
fi
.venv/bin/python -m pip install --disable-pip-version-check -q -e "$target"
echo "install.sh: installed into .venv ($(.venv/bin/python --version)) with .venv/bin/llama-server"

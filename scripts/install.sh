#!/usr/bin/env bash
# Create .venv and install amemgym-evolve into it; `--test` adds the test dependencies.
# Safe to rerun: an existing .venv is reused and only what changed is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv

# llama-cpp-python compiles llama.cpp from source (about 5 minutes on 2 cores). Build a
# portable x86-64 binary: the default -march=native can emit AMX/AVX-512 instructions that
# some virtual machines advertise but fault on (general protection fault at the first call).
if [ "$(uname -m)" = "x86_64" ] && [ -z "${CMAKE_ARGS:-}" ]; then
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

target="."
if [ "${1:-}" = "--test" ]; then
  target=".[test]"
fi
.venv/bin/python -m pip install --disable-pip-version-check -q -e "$target"
echo "install.sh: installed into .venv ($(.venv/bin/python --version))"

#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the llama.cpp sources vendored in the pinned
# llama-cpp-python sdist (MIT), and install the binary as DEST_DIR/llama-server.
#
#   scripts/build_llama_server.sh DEST_DIR [WORK_DIR]
#
# No prebuilt binary or web-UI asset is downloaded: only the sdist, through pip. The build is
# skipped when DEST_DIR/llama-server exists and its stamp matches the pinned version and flags.
# A failed step exits non-zero after printing the tail of the build log: there is no fallback.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
dest_dir="${1:?usage: build_llama_server.sh DEST_DIR [WORK_DIR]}"
work_dir="${2:-.evolve_cache/build}"
python="${PYTHON:-python3}"

# A portable x86-64 binary: -march=native can emit AMX/AVX-512 instructions that some
# virtual machines advertise but fault on (general protection fault at the first call).
# Static libraries, so the one binary can be copied out of the build tree. No HTTPS client
# (the server only listens on loopback) and no web UI (never served to a browser here).
cmake_flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
)
if [ "$(uname -m)" = "x86_64" ]; then
  cmake_flags+=(
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  )
fi
# Extra flags from the caller (e.g. GPU backends) are appended and recorded in the stamp.
if [ -n "${LLAMA_SERVER_CMAKE_ARGS:-}" ]; then
  read -r -a extra_flags <<<"$LLAMA_SERVER_CMAKE_ARGS"
  cmake_flags+=("${extra_flags[@]}")
fi

binary="$dest_dir/llama-server"
stamp="$dest_dir/llama-server.stamp"
expected_stamp="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION ${cmake_flags[*]}"
if [ -x "$binary" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$expected_stamp" ]; then
  echo "build_llama_server.sh: $binary is up to date (llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION)"
  exit 0
fi

for tool in cmake c++; do
  if ! command -v "$tool" >/dev/null; then
    echo "build_llama_server.sh: '$tool' is not installed; llama-server is compiled from" \
      "source: install a C++ compiler and CMake >= 3.14 (e.g. apt-get install g++ cmake)" >&2
    exit 1
  fi
done

mkdir -p "$work_dir" "$dest_dir"
work_dir="$(cd "$work_dir" && pwd)"
sdist="$work_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
source_dir="$work_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
build_dir="$work_dir/llama-server-build-$LLAMA_CPP_PYTHON_VERSION"
log="$work_dir/llama-server-build.log"

fail() {
  echo "build_llama_server.sh: $1 (full log: $log); last lines:" >&2
  tail -n 40 "$log" >&2 || true
  exit 1
}

: >"$log"
if [ ! -f "$sdist" ]; then
  echo "build_llama_server.sh: downloading the llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist"
  # --no-binary for this package only: pip prepares the sdist's metadata in an isolated build
  # environment, and `--no-binary :all:` made it compile that environment's packages from
  # sdists too (over 8 minutes on a fresh machine; 19 s with wheels for them).
  "$python" -m pip download --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work_dir" >>"$log" 2>&1 \
    || fail "could not download the llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist"
fi
if [ ! -f "$source_dir/CMakeLists.txt" ]; then
  tar -xzf "$sdist" -C "$work_dir" >>"$log" 2>&1 || fail "could not unpack $sdist"
fi

echo "build_llama_server.sh: compiling llama-server (about 10 minutes on 2 cores; log: $log)"
started=$(date +%s)
cmake -S "$source_dir" -B "$build_dir" "${cmake_flags[@]}" >>"$log" 2>&1 \
  || fail "cmake could not configure the llama.cpp build"
cmake --build "$build_dir" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  >>"$log" 2>&1 || fail "compiling llama-server failed"
"$build_dir/bin/llama-server" --version >>"$log" 2>&1 \
  || fail "the freshly built llama-server does not run"

install -m 0755 "$build_dir/bin/llama-server" "$binary.tmp"
mv -f "$binary.tmp" "$binary"
echo "$expected_stamp" >"$stamp"
echo "build_llama_server.sh: built $binary in $(($(date +%s) - started)) s"

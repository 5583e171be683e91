#!/usr/bin/env bash
# Build (or reuse) the real llama-server from the llama.cpp vendored in the
# llama-cpp-python sdist. The binary is cached outside the repo, keyed by the
# pinned version and the build flags, so a warm run costs nothing.
# Prints the binary's path on the last line of stdout.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
)
PYTHON="${PYTHON:-python3}"

key=$(printf '%s\n' "$LLAMA_CPP_PYTHON_VERSION" "${CMAKE_FLAGS[@]}" | sha256sum | cut -c1-12)
cache_root="${TOKENGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tokengate}"
dest="$cache_root/llama-server/$LLAMA_CPP_PYTHON_VERSION-$key"
bin="$dest/llama-server"

if [[ -x "$bin" ]] && "$bin" --version >/dev/null 2>&1; then
  echo "llama-server: cached at $bin" >&2
  echo "$bin"
  exit 0
fi

echo "llama-server: building llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION's vendored llama.cpp (cold: ~9 min on 2 cores)" >&2
mkdir -p "$dest"
work=$(mktemp -d "$cache_root/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The sdist is kept ($cache_root/src): tests/conformance/run.py takes llama.cpp's own server
# test suite from it.
sdist="$cache_root/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
if [[ ! -f "$sdist" ]]; then
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work/dl" >&2
  mkdir -p "$cache_root/src"
  mv "$work"/dl/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz "$sdist"
fi
tar xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" "${CMAKE_FLAGS[@]}" >&2
cmake --build "$work/build" --target llama-server -j"$(nproc)" >&2

# Install atomically: a build killed half-way never leaves a binary that looks cached.
cp "$work/build/bin/llama-server" "$dest/llama-server.tmp"
mv "$dest/llama-server.tmp" "$bin"
"$bin" --version >&2
echo "$bin"

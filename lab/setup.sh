#!/usr/bin/env bash
# Prepares what the laboratory runs: llama.cpp's `llama-server` (CPU only),
# built into a cache directory, and the generated models it serves
# (lab/make-model.py). What is already in the cache is reused, so only the
# first run builds. Prints the binary's path and the models directory.
#
#   lab/setup.sh
#
# The source is the llama.cpp tree that llama-cpp-python's source distribution
# vendors (PyPI carries it; llama.cpp itself is not packaged for Debian 12).
# GGML_NATIVE=OFF keeps the binary free of this CPU's extensions, so a cached
# build runs on any machine of the same kind. About 15 minutes on 2 busy cores.
#
# Environment: REDSTRING_CACHE (default ~/.cache/redstring) holds the build
# and the models; REDSTRING_LLAMA_SERVER, when set to an executable, is used
# as is. Needs cmake, a C++ compiler and python3 with the gguf and numpy
# packages; says how to install whichever is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

version=0.3.36 # llama-cpp-python; vendors llama.cpp 0c1e570
cache=${REDSTRING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/redstring}

need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "lab/setup.sh: '$1' is missing; install it with: $2" >&2
    exit 2
  fi
}

# The models: small enough to generate in a second, each named by its shape.
models="$cache/models"
need python3 "apt-get install -y python3 python3-pip"
if ! python3 -c "import gguf, numpy" 2>/dev/null; then
  echo "lab/setup.sh: python3 lacks gguf or numpy; install them with: python3 -m pip install gguf numpy" >&2
  exit 2
fi
mkdir -p "$models"
# dims, layers, heads: about 3 to 15 ms a token on one core.
if [ ! -s "$models/lab-512x8.gguf" ]; then
  python3 "$here/make-model.py" "$models/lab-512x8.gguf.partial" --dims 512 --layers 8 --heads 8
  mv "$models/lab-512x8.gguf.partial" "$models/lab-512x8.gguf"
fi

if [ -n "${REDSTRING_LLAMA_SERVER:-}" ] && [ -x "$REDSTRING_LLAMA_SERVER" ]; then
  echo "$REDSTRING_LLAMA_SERVER"
  echo "$models"
  exit 0
fi
dest="$cache/llama-server-$version"
bin="$dest/llama-server"
if [ ! -x "$bin" ]; then
  need cmake "apt-get install -y cmake"
  need c++ "apt-get install -y build-essential"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "lab/setup.sh: building llama-server $version into $dest" >&2
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$version" -d "$work" >&2
  tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
  src="$work/llama_cpp_python-$version/vendor/llama.cpp"
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
  cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
  mkdir -p "$dest"
  install -m 755 "$work/build/bin/llama-server" "$bin.partial"
  mv "$bin.partial" "$bin"
fi
echo "$bin"
echo "$models"

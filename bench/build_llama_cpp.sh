#!/usr/bin/env bash
# Build the real llama.cpp (CPU only) into a folder OUTSIDE this clone, from the source that
# PyPI's llama-cpp-python source distribution carries (vendor/llama.cpp), for the tests and
# benchmarks gated on LLAMA_CPP_BIN_DIR (docs/engine.md, "The real llama.cpp").
#
#   bench/build_llama_cpp.sh DIR        # prints DIR/llama.cpp-build/bin on its last line
#   export LLAMA_CPP_BIN_DIR="$(bench/build_llama_cpp.sh DIR | tail -n 1)"
#
# Public tools only: pip (to fetch the sdist from PyPI), cmake, make and a C++ compiler with
# OpenMP (Debian: apt-get install cmake g++ make; git is optional, for llama.cpp's build-info).
# No network but PyPI: the web UI download and curl are off (LLAMA_USE_PREBUILT_UI=OFF would
# otherwise fetch UI assets at build time; LLAMA_CURL=OFF, LLAMA_OPENSSL=OFF).
# Env: JOBS (default 2), NICE (default 10), WITH_SERVER=1 also builds llama-server and llama-cli
# (the chat client sits on the server's code and is most of the build time).
# It takes long: 27 min (real; 9.6 min user) for the default targets on a 2-core machine at load
# average ~8, so CI does not run it.
set -euo pipefail

VERSION=0.3.36     # llama-cpp-python; vendors ggml-org/llama.cpp@0c1e57098 (its CHANGELOG)
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e   # llama_cpp_python-0.3.36.tar.gz
JOBS=${JOBS:-2}
NICE=${NICE:-10}
WITH_SERVER=${WITH_SERVER:-0}

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR   (a folder outside the clone; the build goes to DIR/llama.cpp-build)" >&2
    exit 2
fi
mkdir -p "$1"
ROOT=$(cd "$1" && pwd -P)
CLONE=$(cd "$(dirname "$0")/.." && pwd -P)
case "$ROOT/" in
    "$CLONE"/*) echo "$0: $ROOT is inside the clone $CLONE; give a folder outside it" >&2; exit 2 ;;
esac
for tool in cmake make c++ python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$0: $tool not found; install cmake, make, g++ and python3-pip" >&2; exit 3; }
done

DL=$ROOT/dl
SDIST=$DL/llama_cpp_python-$VERSION.tar.gz
SRC=$ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$ROOT/llama.cpp-build
mkdir -p "$DL"
if [ ! -f "$SDIST" ]; then
    # --no-binary :all: takes the source distribution (pip prepares its metadata once, ~1 min)
    python3 -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$DL"
fi
echo "$SHA256  $SDIST" | sha256sum -c --quiet - || { echo "$0: $SDIST is not the sdist this script pins" >&2; exit 1; }
if [ ! -d "$SRC" ]; then
    tar -C "$ROOT" -xzf "$SDIST"
fi

# The sdist carries a one-commit shallow git dir for the submodule, so llama.cpp's build-info finds
# the commit itself (its "build number" is then 1, not upstream's b-number); without git, the commit
# llama-cpp-python's CHANGELOG names for this version.
COMMIT=$(git -C "$SRC" rev-parse --short=9 HEAD 2>/dev/null || true)
if [ -z "$COMMIT" ]; then
    COMMIT=$(awk -v v="## [$VERSION]" '$0==v{f=1;next} f&&/^## \[/{exit} f&&match($0,/llama\.cpp@[0-9a-f]+/){print substr($0,RSTART+10,RLENGTH-10);exit}' \
        "$ROOT/llama_cpp_python-$VERSION/CHANGELOG.md")
fi
echo "llama-cpp-python $VERSION vendors llama.cpp@${COMMIT:-unknown}" >&2

start=$(date +%s)
nice -n "$NICE" cmake -S "$SRC" -B "$BUILD" -G "Unix Makefiles" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_SERVER="$([ "$WITH_SERVER" = 1 ] && echo ON || echo OFF)" \
    -DLLAMA_BUILD_COMMIT="${COMMIT:-unknown}" >&2
TARGETS="llama-completion llama-bench llama-gguf-split llama-simple llama-tokenize"
[ "$WITH_SERVER" = 1 ] && TARGETS="$TARGETS llama-server llama-cli"
for t in $TARGETS; do
    nice -n "$NICE" cmake --build "$BUILD" --config Release -j "$JOBS" --target "$t" >&2
done
echo "build time: $(( $(date +%s) - start )) s" >&2
for t in $TARGETS; do
    [ -x "$BUILD/bin/$t" ] || { echo "$0: $BUILD/bin/$t was not built" >&2; exit 1; }
done
"$BUILD/bin/llama-bench" --version >&2 || true
echo "$BUILD/bin"

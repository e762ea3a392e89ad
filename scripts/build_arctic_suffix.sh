#!/usr/bin/env bash
# Builds arctic-inference's suffix-tree extension alone and installs `arctic_inference.suffix_decoding` (its
# SuffixDecodingCache and the compiled tree), the oracle of tests/models/test_suffix.py. The whole package does not
# build on a machine without CUDA: its build requires torch==2.10 and compiles CUDA ops; the suffix tree is plain
# C++20 bound with nanobind. Needs g++ and cmake >= 3.18; about half a minute of one core.
#
# Usage: scripts/build_arctic_suffix.sh [VERSION] (default 0.3.0); DEST=DIR installs under DIR instead of this
# Python's site-packages (then put DIR on PYTHONPATH).
set -euo pipefail
version=${1:-0.3.0}
dest=${DEST:-$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the sdist only: no build isolation, so that pip does not fetch the package's pinned torch to read its metadata
pip download "arctic-inference==$version" --no-deps --no-binary :all: --no-build-isolation -q -d "$work"
tar xzf "$work/arctic_inference-$version.tar.gz" -C "$work"
src="$work/arctic_inference-$version"
pip install "nanobind==2.9.2" --no-deps -q --target "$work/nanobind"
PYTHONPATH="$work/nanobind" cmake -S "$src/csrc/suffix_decoding" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v python)" >/dev/null
cmake --build "$work/build" -j"$(nproc)" >/dev/null

mkdir -p "$dest/arctic_inference/suffix_decoding"
# a full install's package __init__ is kept; alone, the package needs an empty one
[ -f "$dest/arctic_inference/__init__.py" ] || : >"$dest/arctic_inference/__init__.py"
cp "$src/arctic_inference/suffix_decoding/__init__.py" "$src/arctic_inference/suffix_decoding/cache.py" \
  "$work"/build/_C*.so "$dest/arctic_inference/suffix_decoding/"
PYTHONPATH="$dest${PYTHONPATH:+:$PYTHONPATH}" python -c \
  "from arctic_inference.suffix_decoding import SuffixDecodingCache; print('installed', SuffixDecodingCache.__module__)"

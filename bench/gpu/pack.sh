#!/usr/bin/env bash
# Make .gpu/ (ignored by git), what bench/gpu/run.sh needs on the lent GPU machine, which
# reaches no registry and takes 64 MiB a call: llama.cpp's source as xllamacpp pins it (or a
# CUDA build of llama-server made here, if BUILD names its build folder), SmolLM2 cut to 8
# layers (bench/gpu/cut_model.py), cp312 wheels of the package's dependencies, and the tree of
# a git revision to compare with (BASE, optional).
#   bash bench/gpu/pack.sh                 BUILD=path/to/build BASE=96cf50d bash bench/gpu/pack.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUTDIR=$ROOT/.gpu
WORK=${WORK:-/tmp/contemplation-gpu}
XLLAMACPP=2026.10.11549  # pyproject's [local] pin
mkdir -p "$OUTDIR" "$WORK"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude

if [ -n "${BUILD:-}" ]; then  # a build of one's own: llama-server and its shared libraries
  (cd "$BUILD/bin" && tar cf - llama-server ./*.so*) | xz -T2 -6 > "$OUTDIR/llama-bin.tar.xz"
else  # the source xllamacpp builds, without what a CUDA llama-server does not need
  sdist=$WORK/xllamacpp-$XLLAMACPP.tar.gz
  if [ ! -f "$sdist" ]; then
    url=$(curl -fsS "https://pypi.org/simple/xllamacpp/" | grep -o "https://[^\"#]*xllamacpp-$XLLAMACPP.tar.gz" | head -1)
    curl -fsS -o "$sdist" "$url"
  fi
  tar xzf "$sdist" -C "$WORK"
  skip=(docs models media benches conversion gguf-py)
  for b in cann et hexagon metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn hip blas; do
    skip+=("ggml/src/ggml-$b")
  done
  (cd "$WORK/xllamacpp-$XLLAMACPP/thirdparty" && tar "${skip[@]/#/--exclude=llama.cpp/}" -cf - llama.cpp) \
    | xz -T2 -6 > "$OUTDIR/llama-src.tar.xz"
fi

if [ ! -f "$OUTDIR/model.gguf" ]; then
  [ -x "$WORK/venv/bin/python" ] || { python3 -m venv "$WORK/venv"; "$WORK/venv/bin/pip" install -q gguf==0.19.0; }
  src=$(.venv/bin/python -c 'import sys; sys.path.insert(0, "."); from tests import peers; print(peers.smollm2_gguf())')
  "$WORK/venv/bin/python" bench/gpu/cut_model.py "$src" "$OUTDIR/model.gguf" --layers 8
fi

rm -rf "$OUTDIR/whl"
.venv/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml","rb"))["project"]["dependencies"]))' > "$WORK/req.txt"
plats=(); for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do plats+=(--platform "$p"); done
.venv/bin/pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${plats[@]}" -d "$OUTDIR/whl" -r "$WORK/req.txt"
rm -f "$OUTDIR"/whl/cryptography-* "$OUTDIR"/whl/cffi-* "$OUTDIR"/whl/pycparser-*  # pyjwt's extra: unused, 5 MB

# the committed tree (the working tree may hold someone's half-made edit), and BASE's
git archive HEAD | xz -T2 -6 > "$OUTDIR/head.tar.xz"
if [ -n "${BASE:-}" ]; then git archive "$BASE" | xz -T2 -6 > "$OUTDIR/base.tar.xz"; fi
du -sh "$OUTDIR"; du -ch $(git ls-files) 2>/dev/null | tail -1

#!/usr/bin/env bash
# The benchmarks on the lent GPU machine (one H100/H200; CUDA 13 with nvcc, cmake, ninja and
# python3 3.12 are there; nothing can be fetched). .gpu/ is made by bench/gpu/pack.sh.
#   bash bench/gpu/run.sh [SECONDS]      everything within SECONDS (default 540)
# Builds llama-server for the GPU from the carried source (unless a build was carried), then:
# saturation at the server's own slot count and at 16 slots (daemon vs direct client, real
# llama-server), the ingest ceiling (bench_ingest.py), and the same on BASE's tree if carried.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
BUDGET=${1:-540}
left() { echo $((BUDGET - SECONDS)); }
exec > >(tee -a "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cpus: $(nproc); $(python3 --version)"

BIN=/tmp/llama-bin
CUBLAS=$(dirname "$(find /usr/local /opt /usr/lib -name 'libcublas.so.13' -print -quit 2>/dev/null)")
echo "cuBLAS: $CUBLAS"
if [ -f .gpu/llama-bin.tar.xz ]; then
  mkdir -p $BIN && tar xJf .gpu/llama-bin.tar.xz -C $BIN
else
  mkdir -p /tmp/llama && tar xJf .gpu/llama-src.tar.xz -C /tmp/llama
  # a toolkit with cuBLAS and a libcuda.so to link with: the image's own, or one put together
  # from it, the cuBLAS of PyTorch's wheels and a stub of the driver (its real one is loaded)
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc); TK=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
  rm -rf /tmp/cuda && cp -rs "$TK/" /tmp/cuda
  if [ ! -e /tmp/cuda/include/cublas_v2.h ] && [ -n "$CUBLAS" ]; then
    cp "$CUBLAS"/../include/cublas*.h /tmp/cuda/include/
    for f in "$CUBLAS"/libcublas*.so.13; do ln -sf "$f" "/tmp/cuda/lib64/$(basename "$f" .13)"; done
  fi
  echo > /tmp/stub.c && gcc -shared -o /tmp/libcuda.so -Wl,-soname,libcuda.so.1 /tmp/stub.c
  cmake -S /tmp/llama/llama.cpp -B /tmp/llama/build -G Ninja -DGGML_CUDA=ON \
    -DCUDAToolkit_ROOT=/tmp/cuda -DCMAKE_CUDA_COMPILER="$TK/bin/nvcc" \
    -DCUDA_cuda_driver_LIBRARY=/tmp/libcuda.so -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release \
    > "$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
  ninja -C /tmp/llama/build llama-server > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  BIN=/tmp/llama/build/bin
  echo "built llama-server in ${SECONDS} s"
fi
export LD_LIBRARY_PATH=$BIN:$CUBLAS:${LD_LIBRARY_PATH:-}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
"$BIN/llama-server" --version 2>&1 | tail -2

run() {  # NEED_S COMMAND...: run it if NEED_S seconds are left, within what is left
  local need=$1; shift
  if [ "$(left)" -lt "$need" ]; then echo "skipped, out of time: $*"; return; fi
  echo "== $* ($(left) s left)"
  timeout "$(($(left) - 5))" "$@"
}
mkdir -p /tmp/head && tar xJf .gpu/head.tar.xz -C /tmp/head && cd /tmp/head  # the committed tree
SERVE=(--llama-server "$BIN/llama-server" --gguf "$ROOT/.gpu/model.gguf" --only-one)
run 90 python3 bench/bench_saturation.py "${SERVE[@]}" --conversations 32 --max-tokens 128 --rounds 3
run 90 python3 bench/bench_saturation.py "${SERVE[@]}" --slots 16 --conversations 64 --max-tokens 128 --rounds 3
run 60 python3 bench/bench_ingest.py --slots 16 --conversations 64 --max-tokens 256 --rounds 3
if [ -f "$ROOT/.gpu/base.tar.xz" ]; then  # the same benchmarks on the tree before (A/B on this machine)
  mkdir -p /tmp/base && tar xJf "$ROOT/.gpu/base.tar.xz" -C /tmp/base
  mkdir -p /tmp/base/bench/gpu && cp bench/bench_ingest.py bench/bench_saturation.py /tmp/base/bench/
  cp bench/gpu/*.py /tmp/base/bench/gpu/  # (the benchmarks themselves are today's)
  cd /tmp/base
  run 60 python3 bench/bench_ingest.py --slots 16 --conversations 64 --max-tokens 256 --rounds 3
  run 90 python3 bench/bench_saturation.py "${SERVE[@]}" --slots 16 --conversations 64 --max-tokens 128 --rounds 3
fi
echo "done in ${SECONDS} s"

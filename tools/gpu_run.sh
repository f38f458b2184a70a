#!/usr/bin/env bash
# One call on the GPU machine: build for its arch, run the GPU tests, compute-sanitizer on every
# kernel, the benchmarks, and a short table last. Results land in $OUT (or /tmp/gpu_out).
#   APHRODITE_COMMIT=<hash> bash tools/gpu_run.sh [ARCH]   (ARCH: default the visible GPU's)
# (.git does not travel to the GPU machine: pass the commit so results name it.)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
if [ -n "${1:-}" ]; then export TORCH_CUDA_ARCH_LIST="$1"; fi
# The image's default CXX (/opt/gcc) has no shared libstdc++; the system g++ does.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi

start=$(date +%s)
APHRODITE_TARGET_DEVICE=cuda MAX_JOBS=${MAX_JOBS:-16} \
  python3 -m pip install -e . --no-build-isolation --no-deps -q 2>&1 | tail -20 | tee "$OUT/build.log"
build_s=$(( $(date +%s) - start ))
echo "build (configure + compile + link, clean): ${build_s}s" | tee -a "$OUT/build.log"
python3 -m aphrodite_ext info | tee "$OUT/info.txt"

python3 -m pytest -q tests/kernels -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -5
tests=$(tail -1 "$OUT/tests.log")

san=""
for tool in memcheck racecheck; do
  if compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_kernels.py \
      > "$OUT/sanitizer_$tool.log" 2>&1; then san+="$tool clean; "
  else san+="$tool FAILED (see sanitizer_$tool.log); "; fi
  tail -3 "$OUT/sanitizer_$tool.log"
done

python3 benchmarks/bench_kernels.py --out "$OUT" 2>&1 | tail -45 > "$OUT/bench.log"
python3 benchmarks/bench_marlin.py --out "$OUT" > "$OUT/bench_marlin.log" 2>&1

echo
echo "================ summary ================"
cat "$OUT/gpu.txt"
echo "build: ${build_s}s on $(nproc) cores"
echo "tests: $tests"
echo "sanitizer: $san"
cat "$OUT/bench.log" | grep "^|" || tail -20 "$OUT/bench.log"
grep "^|" "$OUT/bench_marlin.log" || tail -20 "$OUT/bench_marlin.log"

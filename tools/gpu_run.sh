#!/usr/bin/env bash
# One call on the GPU machine: build for its arch, run the GPU tests, compute-sanitizer on every
# kernel, the benchmarks, and a short table last. Results land in $OUT (or /tmp/gpu_out).
#   APHRODITE_COMMIT=<hash> [STAGES="build test sanitize bench"] bash tools/gpu_run.sh [ARCH]
# ARCH defaults to the visible GPU's. STAGES picks steps (a later call on a warm machine can skip
# "build"); TESTS narrows pytest (default tests/kernels); BENCH picks benchmark scripts
# (default: every benchmarks/bench_*.py that needs a GPU); TEST_TIMEOUT and BENCH_TIMEOUT (s)
# bound the tests and each benchmark, so that one call's later stages still run. The "profile"
# stage (not in the default) runs tools/profile_kernels.py $PROFILE_ARGS under Nsight Compute
# into profile.csv.
# (.git does not travel to the GPU machine: pass the commit so results name it.) Everything but
# the tables (.md) ends up in $OUT/logs.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
STAGES=${STAGES:-build test sanitize bench}
TESTS=${TESTS:-tests/kernels}
BENCH=${BENCH:-kernels paged_attention marlin flash_attn decode_layer}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
if [ -n "${1:-}" ]; then export TORCH_CUDA_ARCH_LIST="$1"; fi
# The image's default CXX (/opt/gcc) has no shared libstdc++; the system g++ does.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
summary=()
has() { [[ " $STAGES " == *" $1 "* ]]; }
# Whether exit code $1 is timeout -k's: 124 stopped at the limit, 137 killed 30 s after.
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }

if has build; then
  # The flash-attention family needs CuTe's headers: the nvidia-cutlass wheel, carried in .whl/
  # (the GPU machine has no network), installed without its dependencies.
  if ! python3 -c "import cutlass_library" 2>/dev/null && ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps .whl/nvidia_cutlass-*.whl > "$OUT/cutlass_install.log" 2>&1
  fi
  start=$(date +%s)
  APHRODITE_TARGET_DEVICE=cuda MAX_JOBS=${MAX_JOBS:-16} \
    python3 -m pip install -e . --no-build-isolation --no-deps -q > "$OUT/build.log" 2>&1
  rc=$?
  tail -30 "$OUT/build.log"
  build_s=$(( $(date +%s) - start ))
  summary+=("build: rc $rc, ${build_s}s on $(nproc) cores (configure + compile + link, clean)")
  python3 -m aphrodite_ext plan > "$OUT/plan.txt" 2>&1
  python3 -m aphrodite_ext info | tee "$OUT/info.txt" | head -8
fi

if has test; then
  timeout -k 30 "${TEST_TIMEOUT:-3000}" python3 -m pytest -q $TESTS -p no:cacheprovider \
    --maxfail=40 > "$OUT/tests.log" 2>&1 ||
    ! timed_out $? ||
    echo "tests stopped at TEST_TIMEOUT (${TEST_TIMEOUT:-3000}s)" >> "$OUT/tests.log"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30
  summary+=("tests: $(tail -1 "$OUT/tests.log")")
fi

if has sanitize; then
  san=""
  for tool in memcheck racecheck; do
    # memcheck without torch's caching allocator: each tensor is its own allocation, so that a
    # kernel writing past one is caught (inside a cached block it would land in valid memory).
    uncached=(); [ $tool = memcheck ] && uncached=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    t0=$(date +%s)
    if env "${uncached[@]}" timeout "${SAN_TIMEOUT:-300}" \
        compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_kernels.py \
        > "$OUT/sanitizer_$tool.log" 2>&1; then san+="$tool clean ($(( $(date +%s) - t0 ))s); "
    else san+="$tool FAILED (see sanitizer_$tool.log); "; grep -m5 -B2 -A8 "=====" "$OUT/sanitizer_$tool.log" | head -40; fi
  done
  summary+=("sanitizer: $san")
fi

if has bench; then
  for b in $BENCH; do
    [ -f "benchmarks/bench_$b.py" ] || continue
    timeout -k 30 "${BENCH_TIMEOUT:-3000}" python3 "benchmarks/bench_$b.py" --out "$OUT" \
      > "$OUT/bench_$b.log" 2>&1 || {
      rc=$?
      if timed_out $rc; then echo "bench_$b stopped at BENCH_TIMEOUT (${BENCH_TIMEOUT:-3000}s)"
      else echo "bench_$b failed (rc $rc):"; fi
      tail -15 "$OUT/bench_$b.log"
    }
  done
fi

if has profile; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  timeout "${PROFILE_TIMEOUT:-300}" "$NCU" --profile-from-start off --clock-control none \
    --cache-control all --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis --csv --page details \
    python3 tools/profile_kernels.py ${PROFILE_ARGS:---tokens 1 16 64} \
    > "$OUT/profile.csv" 2> "$OUT/profile.err"
  summary+=("profile: rc $?, $(grep -c '"Duration"' "$OUT/profile.csv") kernels in profile.csv")
  python3 tools/ncu_table.py "$OUT/profile.csv" > "$OUT/profile.md" 2>&1
fi

# The tables first and the status lines last, so that a clipped tail of the output keeps them.
for b in $BENCH; do
  [ -f "$OUT/bench_$b.log" ] && { echo "--- $b"; grep "^|" "$OUT/bench_$b.log"; }
done
if [ -f "$OUT/profile.md" ]; then echo "--- profile"; cat "$OUT/profile.md"; fi
echo
echo "================ summary ================"
cat "$OUT/gpu.txt"
printf '%s\n' "${summary[@]}"

# The device tool brings back at most 8 files from $OUT: the tables (.md) stay as they are, and
# everything else (logs, the benchmarks' .json, plan, info, profiles) goes into one logs.tgz.
(
  cd "$OUT" || exit 0
  mapfile -t logs < <(find . -maxdepth 1 -type f ! -name '*.md' ! -name logs.tgz -printf '%f\n')
  if [ "${#logs[@]}" -gt 0 ] && tar czf logs.tgz "${logs[@]}"; then rm -f "${logs[@]}"; fi
)

"""Writes header variants of kernels/marlin/marlin_gemm.cuh for tools/marlin_probe.cu, an A/B
probe of the split-K reduction: `cl` (the header as it is: split tiles summed in a thread block
cluster, blocks spread by shared memory), `cl_packed` (clusters with each block's own shared
memory) and `nocl` (the fp32 partials in global memory: every block sums a share where the grid
is resident at once and its tiles have more than 8 rows, else the last block to arrive). Only the
launch differs.

    python3 tools/marlin_probe.py /tmp/mv
    for v in cl cl_packed nocl; do
      nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I/tmp/mv/$v -Ikernels \\
        --expt-relaxed-constexpr -DAPHRODITE_BACKEND_GPU -DVARIANT="\\"$v\\"" \\
        tools/marlin_probe.cu -o /tmp/mp_$v
    done
    # on the GPU machine: for v in cl cl_packed nocl; do /tmp/mp_$v; done

(The binaries link the CUDA runtime statically: build them here and carry them.)
"""

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "kernels/marlin/marlin_gemm.cuh"
SHAPED = ("if (per_sm >= natural || per_sm > kMaxPerSm) per_sm = 0;", "per_sm = 0;")
CLUSTER = ("p.arch >= 90 && splits >= 2", "false && splits >= 2")


def main() -> None:
    src = SRC.read_text()
    for old, _ in (SHAPED, CLUSTER):
        if old not in src:
            raise SystemExit(f"marlin_gemm.cuh no longer has {old!r}: update the probe")
    variants = {"cl": src, "cl_packed": src.replace(*SHAPED), "nocl": src.replace(*CLUSTER)}
    out = Path(sys.argv[1])
    for name, text in variants.items():
        d = out / name / "marlin"
        d.mkdir(parents=True, exist_ok=True)
        (d / "marlin_gemm.cuh").write_text(text)
    print(" ".join(variants))


if __name__ == "__main__":
    main()

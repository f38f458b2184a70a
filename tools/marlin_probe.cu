// A/B probe of marlin's split-K reduction: times instantiations launched directly
// (launch_gemm_instance) for header variants that differ only in the launch
// (tools/marlin_probe.py says how to build them), the L2 cleared by reading 1 GiB before each
// call. Prints one table row per case: variant, block shape, M, K, N, splits, resident clusters /
// clusters the grid needs and each block's shared memory (as the header's cluster_shape works
// them out), median us, weight GB/s, and a checksum of the output (the same in every variant).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "marlin/marlin_gemm.cuh"

using namespace aphrodite::marlin;
using namespace aphrodite;

__global__ void read_all(const int4* p, int64_t n, int* out) {
  int acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) out[0] = acc;
}

__global__ void checksum(const __half* x, int64_t n, float* out) {
  float s = 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    s += __half2float(x[i]) * (1.0f + (i % 7));
  atomicAdd(out, s);
}

// shape 0: m16n256 (decode), 1: m64n256w, 2: m128n256w
gpuError_t launch(int shape, const GemmProblem& p, int workers) {
  using detail::launch_gemm_instance;
  switch (shape) {
    case 0:
      return launch_gemm_instance<__half, WeightType::kUint4b8, true, 1, 1, 4, 1, Engine::kMmaSync>(
          p, workers, SplitSum::kAuto, nullptr);
    case 1:
      return launch_gemm_instance<__half, WeightType::kUint4b8, true, 2, 2, 4, 1, Engine::kWgmma>(
          p, workers, SplitSum::kAuto, nullptr);
    default:
      return launch_gemm_instance<__half, WeightType::kUint4b8, true, 4, 2, 4, 1, Engine::kWgmma>(
          p, workers, SplitSum::kAuto, nullptr);
  }
}

template <int MT, int MW, Engine W>
detail::ClusterShape clusters_of(int sms, int splits, int64_t blocks) {
  using C = detail::Config<__half, WeightType::kUint4b8, true, MT, MW, 4, 1, W>;
  int natural = 0;
  detail::configure_instance<__half, WeightType::kUint4b8, true, MT, MW, 4, 1, W>(&natural);
  return detail::cluster_shape<C>(
      detail::gemm_kernel<__half, WeightType::kUint4b8, true, MT, MW, 4, 1, W>, natural, sms,
      splits, blocks);
}

int main() {
  const int64_t flush_bytes = int64_t{1} << 30;
  void* flush;
  int* sink;
  float* sum;
  cudaMalloc(&flush, flush_bytes);
  cudaMemset(flush, 0, flush_bytes);
  cudaMalloc(&sink, 4);
  cudaMalloc(&sum, 4);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  struct Case {
    int shape;
    int64_t m, k, n;
    int splits;
  };
  const Case cases[] = {{0, 1, 8192, 28672, 2},  {0, 16, 8192, 28672, 2}, {0, 1, 28672, 8192, 8},
                        {0, 16, 28672, 8192, 8}, {0, 1, 8192, 8192, 8},   {0, 16, 8192, 8192, 4},
                        {0, 16, 8192, 8192, 8},  {0, 16, 4096, 4096, 4},  {0, 16, 4096, 4096, 8},
                        {1, 64, 8192, 8192, 4},  {1, 64, 4096, 4096, 4},  {1, 64, 28672, 8192, 4},
                        {2, 128, 8192, 8192, 2}, {2, 128, 8192, 8192, 4}, {2, 128, 4096, 4096, 4},
                        {1, 128, 4096, 4096, 4}, {1, 128, 4096, 4096, 8}, {1, 128, 8192, 8192, 4}};
  for (const Case& c : cases) {
    GemmProblem p{};
    void *a, *out, *scales;
    int32_t *b, *counters;
    float* partials;
    cudaMalloc(&a, c.m * c.k * 2);
    cudaMalloc(&out, c.m * c.n * 2);
    cudaMalloc(&b, c.k * c.n / 2);
    cudaMalloc(&scales, c.k / 128 * c.n * 2);
    // Whole 128 x 256 tiles: enough for every block shape's slots (GemmPlan::partial_floats).
    cudaMalloc(&partials,
               int64_t{c.splits} * ((c.m + 127) / 128 * 128) * ((c.n + 255) / 256 * 256) * 4);
    cudaMalloc(&counters, 1 << 16);
    cudaMemset(a, 0x11, c.m * c.k * 2);
    cudaMemset(b, 0x5a, c.k * c.n / 2);
    cudaMemset(scales, 0x22, c.k / 128 * c.n * 2);
    cudaMemset(counters, 0, 1 << 16);
    p.out = out;
    p.a = a;
    p.b = b;
    p.scales = scales;
    p.zeros = nullptr;
    p.bias = nullptr;
    p.partials = partials;
    p.counters = counters;
    p.num_counters = (1 << 16) / 4;
    p.m = c.m;
    p.n = c.n;
    p.k = c.k;
    p.lda = c.k;
    p.ldc = c.n;
    p.group_size = 128;
    p.dtype = ScalarType::kFloat16;
    p.weight_type = WeightType::kUint4b8;
    p.sm_count = sms;
    p.arch = 90;
    const int bn = 256;
    const int workers = static_cast<int>((c.n / bn) * c.splits);
    std::vector<float> ts;
    for (int r = 0; r < 40; ++r) {
      read_all<<<sms * 8, 512>>>(static_cast<const int4*>(flush), flush_bytes / 16, sink);
      cudaEventRecord(e0);
      const cudaError_t err = launch(c.shape, p, workers);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      if (err != cudaSuccess) {
        std::printf("launch: %s\n", cudaGetErrorString(err));
        return 1;
      }
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      ts.push_back(ms);
    }
    cudaMemset(sum, 0, 4);
    checksum<<<sms, 256>>>(static_cast<const __half*>(out), c.m * c.n, sum);
    float h = 0;
    cudaMemcpy(&h, sum, 4, cudaMemcpyDeviceToHost);
    std::sort(ts.begin(), ts.end());
    const int bm = c.shape == 0 ? 16 : c.shape == 1 ? 64 : 128;
    const dim3 grid(workers, (c.m + bm - 1) / bm);
    const int64_t nb = int64_t{grid.x} * grid.y;
    const detail::ClusterShape cs =
        c.shape == 0   ? clusters_of<1, 1, Engine::kMmaSync>(sms, c.splits, nb)
        : c.shape == 1 ? clusters_of<2, 2, Engine::kWgmma>(sms, c.splits, nb)
                       : clusters_of<4, 2, Engine::kWgmma>(sms, c.splits, nb);
    const int mc = cs.clusters;
    const double bytes = c.k * c.n / 2.0 + c.k / 128.0 * c.n * 2;
    const char* names[] = {"m16n256", "m64n256w", "m128n256w"};
    std::printf("| %s | %s | %ld | %ld | %ld | %d | %d/%d %dK | %.1f | %.0f | %.6g |\n", VARIANT,
                names[c.shape], (long)c.m, (long)c.k, (long)c.n, c.splits, mc,
                (int)(grid.x * grid.y / c.splits), cs.smem / 1024, ts[ts.size() / 2] * 1e3,
                bytes / (ts[ts.size() / 2] * 1e-3) / 1e9, h);
    cudaFree(a);
    cudaFree(out);
    cudaFree(b);
    cudaFree(scales);
    cudaFree(partials);
    cudaFree(counters);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) std::printf("error: %s\n", cudaGetErrorString(e));
  return 0;
}

// Torch binding of the marlin family: the W4A16 GEMM and the repacks from GPTQ / AWQ checkpoints
// into our tile layout (marlin/marlin.h). Schemas follow vLLM's; arguments we do not support
// are rejected with a message. The repacks run on CPU and CUDA; the GEMM on CUDA only.
// Unlike vLLM's Marlin, b_scales are plain row-major [K / group, N] and AWQ zero points plain
// nibble order [K / group, N / 8] (aphrodite_ext.ops.marlin.awq_zeros_to_marlin).
#include "marlin/marlin.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/per_device.h"
#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

void check_num_bits(const char* op, int64_t num_bits) {
  TORCH_CHECK(num_bits == 4, op, ": only num_bits=4 is supported (4-bit weights), got ", num_bits);
}

void check_repack_sizes(const char* op, int64_t size_k, int64_t size_n) {
  TORCH_CHECK(size_k > 0 && size_k % marlin::kTileK == 0, op, ": size_k must be a positive ",
              "multiple of ", marlin::kTileK, " (the k extent of a packed tile), got ", size_k);
  TORCH_CHECK(size_n > 0 && size_n % marlin::kTileN == 0, op, ": size_n must be a positive ",
              "multiple of ", marlin::kTileN, " (the n extent of a packed tile), got ", size_n);
}

void check_int32_matrix(const char* op, const char* arg, const at::Tensor& t, int64_t rows,
                        int64_t cols) {
  TORCH_CHECK(t.scalar_type() == at::kInt, op, ": ", arg, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, op, ": ", arg,
              " must have shape [", rows, ", ", cols, "], got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), op, ": ", arg, " must be contiguous");
}

at::Tensor run_repack(const char* op, const at::Tensor& in, const at::Tensor& perm, int64_t size_k,
                      int64_t size_n, marlin::SourceFormat format) {
  at::Tensor out = at::empty({size_k / marlin::kTileK, 2 * size_n}, in.options());
  const marlin::RepackProblem p{out.data_ptr<int32_t>(),
                                in.data_ptr<int32_t>(),
                                perm.defined() ? perm.data_ptr<int32_t>() : nullptr,
                                size_k,
                                size_n,
                                format};
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  at::parallel_for(0, out.numel(), 4096, [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(marlin_repack, p, begin, end);
  });
#else
  const c10::cuda::OptionalCUDAGuard guard(in.device());
  check_launch(op, marlin::launch_repack(p, current_stream(in)));
#endif
#endif
  return out;
}

at::Tensor gptq_marlin_repack(const at::Tensor& b_q_weight, const at::Tensor& perm, int64_t size_k,
                              int64_t size_n, int64_t num_bits) {
  constexpr const char* op = "gptq_marlin_repack";
  check_num_bits(op, num_bits);
  check_repack_sizes(op, size_k, size_n);
  check_int32_matrix(op, "b_q_weight (GPTQ qweight, [size_k / 8, size_n])", b_q_weight,
                     size_k / marlin::kPackFactor, size_n);
  at::Tensor perm32;
  if (perm.numel() > 0) {
    check_same_device(op, "perm", perm, b_q_weight);
    TORCH_CHECK(perm.dim() == 1 && perm.size(0) == size_k, op,
                ": perm must be empty or have shape [", size_k, "], got ", perm.sizes());
    TORCH_CHECK(perm.scalar_type() == at::kInt || perm.scalar_type() == at::kLong, op,
                ": perm must be int32 or int64, got ", perm.scalar_type());
    // A row index out of range would read past the weights, on every backend; checked before
    // the int32 narrowing (which would wrap 2^32 to 0). A repack runs once a layer, at load
    // time: the synchronisation of these checks is cheap there.
    const at::Tensor bad = at::logical_or(perm < 0, perm >= size_k);
    if (bad.any().item<bool>()) {
      const int64_t i = bad.nonzero()[0][0].item<int64_t>();
      TORCH_CHECK(false, op, ": perm[", i, "] = ", perm[i].item<int64_t>(),
                  " is not a row index in [0, ", size_k, ")");
    }
    TORCH_CHECK(std::get<0>(perm.sort()).equal(at::arange(size_k, perm.options())), op,
                ": perm must be a permutation of [0, ", size_k, "): some row appears twice");
    perm32 = perm.to(at::kInt).contiguous();
  }
  return run_repack(op, b_q_weight, perm32, size_k, size_n, marlin::SourceFormat::kGptq);
}

at::Tensor awq_marlin_repack(const at::Tensor& b_q_weight, int64_t size_k, int64_t size_n,
                             int64_t num_bits) {
  constexpr const char* op = "awq_marlin_repack";
  check_num_bits(op, num_bits);
  check_repack_sizes(op, size_k, size_n);
  check_int32_matrix(op, "b_q_weight (AWQ qweight, [size_k, size_n / 8])", b_q_weight, size_k,
                     size_n / marlin::kPackFactor);
  return run_repack(op, b_q_weight, at::Tensor(), size_k, size_n, marlin::SourceFormat::kAwq);
}

#if defined(APHRODITE_BACKEND_GPU) && APHRODITE_FAMILY_BUILT
/// The dispatch's plan, or, for tuning only, the one APHRODITE_MARLIN_CONFIG forces:
/// "m<rows>n<cols>[k<k warps>][w|t]" (a thread-block shape of codegen/marlin.py SHAPES, e.g.
/// m16n256, m64n256k2, m128n256w or m16n256t: w for the sm_90a wgmma blocks, t for the sm_90a
/// TMA-fed mma.sync block) with an optional ":<splits>" (k
/// slices; without it the heuristic's split for that shape) or ":sk[<blocks>]" (stream-K over
/// <blocks> blocks per row of blocks; without a number the blocks resident at once). A split may
/// name how its tiles are summed, ":<splits>/cluster", "/spread" or "/last" (marlin::SplitSum):
/// the call then raises where the launch cannot take that way, instead of taking another. Read
/// on every call (a getenv), so a benchmark can sweep configurations in one process
/// (benchmarks/bench_marlin.py --sweep). Every configuration computes the same result up to fp32
/// summation order, and the three sums of one split the same bits; an unknown or unbuilt shape
/// raises.
marlin::GemmPlan plan_for(const char* op, const marlin::GemmProblem& p) {
  const char* forced = std::getenv("APHRODITE_MARLIN_CONFIG");
  if (forced == nullptr || forced[0] == '\0') return marlin::plan_gemm(p);
  int rows = 0, cols = 0, k_warps = 1, splits = 0, used = 0;
  bool stream_k = false, has_splits = false;
  bool ok = std::sscanf(forced, "m%dn%d%n", &rows, &cols, &used) == 2;
  const char* rest = forced + used;
  if (ok && *rest == 'k') {
    used = 0;
    ok = std::sscanf(rest, "k%d%n", &k_warps, &used) == 1 && k_warps >= 1;
    rest += used;
  }
  marlin::Engine engine = marlin::Engine::kMmaSync;
  if (ok && *rest == 'w') {
    engine = marlin::Engine::kWgmma;
    ++rest;
  } else if (ok && *rest == 't') {
    engine = marlin::Engine::kMmaSyncTma;
    ++rest;
  }
  if (ok && rest[0] == ':' && rest[1] == 's' && rest[2] == 'k') {
    stream_k = true;
    rest += 3;
    if (*rest != '\0') {
      used = 0;
      ok = std::sscanf(rest, "%d%n", &splits, &used) == 1 && splits >= 1;
      rest += used;
    }
  } else if (ok && *rest == ':') {
    used = 0;
    ok = std::sscanf(rest, ":%d%n", &splits, &used) == 1;
    rest += used;
    has_splits = true;
  }
  marlin::SplitSum sum = marlin::SplitSum::kAuto;
  if (ok && has_splits && *rest == '/') {  // a split sum follows a split only
    const std::string name(rest + 1);
    if (name == "cluster") sum = marlin::SplitSum::kCluster;
    if (name == "spread") sum = marlin::SplitSum::kSpread;
    if (name == "last") sum = marlin::SplitSum::kLast;
    ok = sum != marlin::SplitSum::kAuto;
    rest += 1 + name.size();
  }
  ok = ok && *rest == '\0';
  TORCH_CHECK(ok && rows > 0 && rows % 16 == 0 && cols > 0 && cols % 64 == 0, op,
              ": APHRODITE_MARLIN_CONFIG='", forced,
              "' is not 'm<rows>n<cols>[k<k warps>][w|t][:<splits>[/cluster|/spread|/last]|"
              ":sk[<blocks>]]' (e.g. m16n256:4, m64n256k2, m64n256:sk, m128n256w:sk, m16n256t:7, "
              "m16n256t:8/spread)");
  const bool sm90a = engine != marlin::Engine::kMmaSync;
  TORCH_CHECK(!sm90a || p.arch == 90, op, ": APHRODITE_MARLIN_CONFIG='", forced,
              "' names an sm_90a block shape (wgmma or TMA-fed), which runs on sm_90 only (this "
              "device is sm_",
              p.arch, ")");
  const marlin::BlockShape shape{rows / 16, cols / 64, k_warps, engine};
  marlin::GemmPlan plan = stream_k ? marlin::plan_gemm_stream_k(p, shape, splits)
                                   : marlin::plan_gemm_with(p, shape, splits);
  TORCH_CHECK(plan.shape.m_tiles != 0, op, ": APHRODITE_MARLIN_CONFIG='", forced,
              "' names a block shape this build does not hold for these types");
  TORCH_CHECK(sum == marlin::SplitSum::kAuto || plan.splits >= 2, op, ": APHRODITE_MARLIN_CONFIG='",
              forced, "' names a split sum, but the plan has ", plan.splits,
              " split (the problem has too few k slices)");
  TORCH_CHECK(sum != marlin::SplitSum::kCluster || p.arch >= 90, op, ": APHRODITE_MARLIN_CONFIG='",
              forced, "' sums in clusters, which run on sm_90 and newer (this device is sm_",
              p.arch, ")");
  plan.sum = sum;
  return plan;
}
#endif

at::Tensor gptq_marlin_gemm(
    const at::Tensor& a, const std::optional<at::Tensor>& c_or_none, const at::Tensor& b_q_weight,
    const std::optional<at::Tensor>& b_bias_or_none, const at::Tensor& b_scales,
    const std::optional<at::Tensor>& global_scale, const std::optional<at::Tensor>& b_zeros_or_none,
    const std::optional<at::Tensor>& g_idx_or_none, const std::optional<at::Tensor>& perm_or_none,
    const at::Tensor& workspace, int64_t b_q_type, int64_t size_m, int64_t size_n, int64_t size_k,
    bool is_k_full, bool use_atomic_add, bool use_fp32_reduce, bool is_zp_float) {
  constexpr const char* op = "gptq_marlin_gemm";
  // use_atomic_add and use_fp32_reduce are hints: we always reduce split-K partials in fp32,
  // in a fixed order.
  (void)use_atomic_add;
  (void)use_fp32_reduce;
#if defined(APHRODITE_BACKEND_CPU) || !APHRODITE_FAMILY_BUILT
  // On the CPU backend this is the registered CPU kernel; where the family was not built (ROCm,
  // or no CUDA arch >= 8.0) it is never registered, and the op raises the family's status.
  TORCH_CHECK(false, op, " runs on CUDA only (tensor-core W4A16 GEMM): build aphrodite_ext with ",
              "APHRODITE_TARGET_DEVICE=cuda and pass CUDA tensors; on the CPU use "
              "aphrodite_ext.ops.marlin.gemm_ref");
  (void)c_or_none, (void)b_q_weight, (void)b_bias_or_none, (void)b_scales, (void)global_scale,
      (void)b_zeros_or_none, (void)g_idx_or_none, (void)perm_or_none, (void)workspace,
      (void)b_q_type, (void)size_m, (void)size_n, (void)size_k, (void)is_k_full, (void)is_zp_float;
  return a;
#else
  TORCH_CHECK(!c_or_none.has_value(), op, ": c_or_none is not supported (the op allocates and ",
              "returns its output); pass None");
  TORCH_CHECK(!global_scale.has_value(), op, ": global_scale (NVFP4 weights) is not supported; ",
              "pass None");
  TORCH_CHECK(!is_zp_float, op,
              ": is_zp_float=True (floating-point zero points) is not "
              "supported; zero points are 4-bit codes");
  marlin::WeightType weight_type;
  if (b_q_type == marlin::kVllmUint4b8Id) {
    weight_type = marlin::WeightType::kUint4b8;
  } else if (b_q_type == marlin::kVllmUint4Id) {
    weight_type = marlin::WeightType::kUint4;
  } else {
    TORCH_CHECK(false, op, ": b_q_type ", b_q_type, " is not supported; expected vLLM's id of ",
                "uint4b8 (", marlin::kVllmUint4b8Id, ", GPTQ) or uint4 (", marlin::kVllmUint4Id,
                ", AWQ with zero points)");
  }
  const ScalarType dtype = kernel_dtype(op, "a", a);
  TORCH_CHECK(dtype != ScalarType::kFloat32, op, ": a must be float16 or bfloat16, got float32");
  TORCH_CHECK(a.dim() == 2 && a.size(0) == size_m && a.size(1) == size_k, op,
              ": a must have shape [size_m, size_k] = [", size_m, ", ", size_k, "], got ",
              a.sizes());
  TORCH_CHECK(size_k > 0 && size_k % marlin::kTileK == 0, op, ": size_k must be a positive ",
              "multiple of ", marlin::kTileK, ", got ", size_k);
  TORCH_CHECK(size_n > 0 && size_n % marlin::kTileN == 0, op, ": size_n must be a positive ",
              "multiple of ", marlin::kTileN, ", got ", size_n);
  check_int32_matrix(op, "b_q_weight (packed by gptq_marlin_repack/awq_marlin_repack)", b_q_weight,
                     size_k / marlin::kTileK, 2 * size_n);
  check_same_device(op, "b_q_weight", b_q_weight, a);

  TORCH_CHECK(b_scales.dim() == 2 && b_scales.size(1) == size_n && b_scales.size(0) >= 1, op,
              ": b_scales must have shape [num_groups, size_n = ", size_n, "], got ",
              b_scales.sizes());
  check_dtype(op, "b_scales", b_scales, a.scalar_type());
  TORCH_CHECK(b_scales.is_contiguous(), op, ": b_scales must be contiguous");
  check_same_device(op, "b_scales", b_scales, a);
  const int64_t num_groups = b_scales.size(0);
  TORCH_CHECK(size_k % num_groups == 0, op, ": size_k ", size_k, " is not a multiple of the ",
              num_groups, " groups of b_scales");
  const int64_t group_size = size_k / num_groups;
  TORCH_CHECK(num_groups == 1 || (group_size % 16 == 0 && group_size >= 32), op,
              ": the group size (size_k / b_scales.size(0) = ", group_size, ") must be a ",
              "multiple of 16 and at least 32 (32, 64, 128, ...), or one group per channel");

  const bool has_zeros = b_zeros_or_none.has_value() && b_zeros_or_none->numel() > 0;
  if (weight_type == marlin::WeightType::kUint4) {
    TORCH_CHECK(has_zeros, op, ": b_q_type uint4 needs zero points in b_zeros_or_none");
    check_int32_matrix(op, "b_zeros_or_none ([num_groups, size_n / 8], see awq_zeros_to_marlin)",
                       *b_zeros_or_none, num_groups, size_n / marlin::kPackFactor);
    check_same_device(op, "b_zeros_or_none", *b_zeros_or_none, a);
  } else {
    TORCH_CHECK(!has_zeros, op, ": b_q_type uint4b8 has its zero point in the type (8); ",
                "b_zeros_or_none must be None or empty");
  }
  const bool has_bias = b_bias_or_none.has_value();
  if (has_bias) {
    TORCH_CHECK(b_bias_or_none->dim() == 1 && b_bias_or_none->size(0) == size_n, op,
                ": b_bias_or_none must have shape [", size_n, "], got ", b_bias_or_none->sizes());
    check_dtype(op, "b_bias_or_none", *b_bias_or_none, a.scalar_type());
    TORCH_CHECK(b_bias_or_none->is_contiguous(), op, ": b_bias_or_none must be contiguous");
    check_same_device(op, "b_bias_or_none", *b_bias_or_none, a);
  }

  const bool has_g_idx = g_idx_or_none.has_value() && g_idx_or_none->numel() > 0;
  const bool has_perm = perm_or_none.has_value() && perm_or_none->numel() > 0;
  TORCH_CHECK(has_g_idx == has_perm, op, ": act-order needs both g_idx_or_none and ",
              "perm_or_none (or neither)");
  at::Tensor a_in = a;
  if (has_perm) {
    TORCH_CHECK(is_k_full, op, ": act-order with is_k_full=False (a row-parallel shard of an ",
                "act-order weight) is not supported");
    for (const at::Tensor* t : {&*g_idx_or_none, &*perm_or_none}) {
      TORCH_CHECK(t->dim() == 1 && t->size(0) == size_k, op, ": g_idx_or_none and perm_or_none ",
                  "must have shape [", size_k, "], got ", t->sizes());
      TORCH_CHECK(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong, op,
                  ": g_idx_or_none and perm_or_none must be int32 or int64, got ",
                  t->scalar_type());
      check_same_device(op, "g_idx_or_none/perm_or_none", *t, a);
    }
    // The packed weight's row k is checkpoint row perm[k] (gptq_marlin_repack with perm), and
    // g_idx[perm] is then arange(K) // group_size for GPTQ act-order checkpoints: gathering
    // the columns of a the same way leaves plain contiguous groups for the kernel.
    a_in = a.index_select(1, perm_or_none->to(at::kLong));
  }
  check_last_dim_contiguous(op, "a", a_in);
  const int64_t lda = a_in.size(0) > 1 ? a_in.stride(0) : size_k;
  TORCH_CHECK(lda % 8 == 0 && reinterpret_cast<uintptr_t>(a_in.data_ptr()) % 16 == 0, op,
              ": a must be 16-byte aligned with a row stride that is a multiple of 8, got "
              "stride ",
              lda);

  for (const at::Tensor* t : {&b_q_weight, &b_scales}) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, op,
                ": b_q_weight and b_scales must be 16-byte aligned (copied in 16-byte vectors)");
  }
  TORCH_CHECK(!has_zeros || reinterpret_cast<uintptr_t>(b_zeros_or_none->data_ptr()) % 16 == 0, op,
              ": b_zeros_or_none must be 16-byte aligned (copied in 16-byte vectors)");
  TORCH_CHECK(workspace.scalar_type() == at::kInt, op, ": workspace must be int32 (zeros), got ",
              workspace.scalar_type());
  check_same_device(op, "workspace", workspace, a);
  TORCH_CHECK(workspace.is_contiguous(), op, ": workspace must be contiguous");

  at::Tensor out = at::empty({size_m, size_n}, a.options());
  if (size_m == 0) return out;

  const c10::cuda::OptionalCUDAGuard guard(a.device());
  // SM count, compute capability and peak DRAM bandwidth per device, asked once (the dispatch
  // needs them on every call).
  static PerDevice sm_counts, archs, dram;
  const int device = a.device().index();
  const int sm_count = sm_counts.get(device, [&] {
    int count = 0;
    check_launch(op, cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  });
  const int arch = archs.get(device, [&] {
    int major = 0, minor = 0;
    check_launch(op, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    check_launch(op, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return 10 * major + minor;
  });
  // Double data rate: 2 x clock (kHz) x bus width (bits) / 8 bytes; unknown (kept as -1, used as
  // 0) where the device does not say.
  const int dram_kept = dram.get(device, [&] {
    int clock_khz = 0, bus_bits = 0;
    int gbps = -1;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess) {
      gbps = static_cast<int>(int64_t{clock_khz} * bus_bits / 4000000);
    }
    (void)cudaGetLastError();
    return gbps > 0 ? gbps : -1;
  });
  const int dram_gbps = dram_kept > 0 ? dram_kept : 0;
  marlin::GemmProblem p{};
  p.out = out.data_ptr();
  p.a = a_in.data_ptr();
  p.b = b_q_weight.data_ptr<int32_t>();
  p.scales = b_scales.data_ptr();
  p.zeros = has_zeros ? b_zeros_or_none->data_ptr<int32_t>() : nullptr;
  p.bias = has_bias ? b_bias_or_none->data_ptr() : nullptr;
  p.counters = workspace.data_ptr<int32_t>();
  p.num_counters = workspace.numel();
  p.m = size_m;
  p.n = size_n;
  p.k = size_k;
  p.lda = lda;
  p.ldc = size_n;
  p.group_size = group_size;
  p.dtype = dtype;
  p.weight_type = weight_type;
  p.sm_count = sm_count;
  p.arch = arch;
  p.dram_gbps = dram_gbps;
  TORCH_CHECK(marlin::has_gemm(dtype, weight_type, num_groups > 1 && group_size < size_k), op,
              ": this combination (", to_string(dtype), ", ",
              weight_type == marlin::WeightType::kUint4 ? "uint4" : "uint4b8", ", ",
              num_groups > 1 ? "grouped" : "per-channel", " scales) was left out of this build ",
              "by its generator options (APHRODITE_GENERATOR_OPTIONS marlin.dtypes=..., "
              "marlin.weights=..., marlin.groups=...)");
  const marlin::GemmPlan plan = plan_for(op, p);
  // The grid's rows of blocks (y) are at most 65535.
  const int64_t block_rows = 16 * static_cast<int64_t>(plan.shape.m_tiles);
  TORCH_CHECK((size_m + block_rows - 1) / block_rows <= 65535, op, ": size_m ", size_m,
              " is more than 65535 blocks of ", block_rows, " rows; split the call along M");
  at::Tensor partials;
  if (plan.partial_floats > 0) {
    partials = at::empty({plan.partial_floats}, a.options().dtype(at::kFloat));
    p.partials = partials.data_ptr<float>();
  }
  check_launch(op, marlin::launch_gemm(p, plan, current_stream(a)));
  return out;
#endif
}

// Fakes (Meta): shapes only, so the ops trace under torch.compile.
at::Tensor repack_fake(const at::Tensor& b_q_weight, const c10::SymInt& size_k,
                       const c10::SymInt& size_n) {
  return at::empty_symint({size_k / marlin::kTileK, size_n * 2}, b_q_weight.options());
}

at::Tensor gptq_marlin_repack_fake(const at::Tensor& b_q_weight, const at::Tensor& perm,
                                   c10::SymInt size_k, c10::SymInt size_n, int64_t) {
  detail::check_meta_calls("gptq_marlin_repack", b_q_weight, perm);
  return repack_fake(b_q_weight, size_k, size_n);
}

at::Tensor awq_marlin_repack_fake(const at::Tensor& b_q_weight, c10::SymInt size_k,
                                  c10::SymInt size_n, int64_t) {
  return repack_fake(b_q_weight, size_k, size_n);
}

at::Tensor gptq_marlin_gemm_fake(const at::Tensor& a, const std::optional<at::Tensor>& c,
                                 const at::Tensor& b_q_weight,
                                 const std::optional<at::Tensor>& bias, const at::Tensor& scales,
                                 const std::optional<at::Tensor>& global,
                                 const std::optional<at::Tensor>& zeros,
                                 const std::optional<at::Tensor>& g_idx,
                                 const std::optional<at::Tensor>& perm, const at::Tensor& workspace,
                                 int64_t, c10::SymInt size_m, c10::SymInt size_n, c10::SymInt, bool,
                                 bool, bool, bool) {
  detail::check_meta_calls("gptq_marlin_gemm", a, c, b_q_weight, bias, scales, global, zeros, g_idx,
                           perm, workspace);
  return at::empty_symint({std::move(size_m), std::move(size_n)}, a.options());
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_C, ops) {
  ops.def(
      "gptq_marlin_gemm(Tensor a, Tensor? c_or_none, Tensor b_q_weight, Tensor? b_bias_or_none, "
      "Tensor b_scales, Tensor? global_scale, Tensor? b_zeros_or_none, Tensor? g_idx_or_none, "
      "Tensor? perm_or_none, Tensor workspace, int b_q_type, SymInt size_m, SymInt size_n, "
      "SymInt size_k, bool is_k_full=True, bool use_atomic_add=False, "
      "bool use_fp32_reduce=False, bool is_zp_float=False) -> Tensor");
  ops.def(
      "gptq_marlin_repack(Tensor b_q_weight, Tensor perm, SymInt size_k, SymInt size_n, "
      "int num_bits) -> Tensor");
  ops.def(
      "awq_marlin_repack(Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits) "
      "-> Tensor");
}

TORCH_LIBRARY_IMPL(_C, Meta, m) {
  m.impl("gptq_marlin_gemm", &aphrodite::gptq_marlin_gemm_fake);
  m.impl("gptq_marlin_repack", &aphrodite::gptq_marlin_repack_fake);
  m.impl("awq_marlin_repack", &aphrodite::awq_marlin_repack_fake);
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_C, m) {
  m.impl("gptq_marlin_gemm", &aphrodite::gptq_marlin_gemm);
  m.impl("gptq_marlin_repack", &aphrodite::gptq_marlin_repack);
  m.impl("awq_marlin_repack", &aphrodite::awq_marlin_repack);
}
#endif

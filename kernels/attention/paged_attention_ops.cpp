// Torch binding of the paged_attention family: schemas (vLLM's paged_attention_v1/v2, plus the
// Transformer-XL variants), input checks, and the CPU and GPU paths. The problem itself is
// described in paged_attention.h.
#include "attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

bool supported_head_size(int64_t h) {
  for (int64_t s : {64, 80, 96, 112, 128, 192, 256})
    if (h == s) return true;
  return false;
}

attention::KvCacheDtype cache_dtype_of(const char* op, const std::string& kv_cache_dtype) {
  if (kv_cache_dtype == "auto") return attention::KvCacheDtype::kAuto;
  if (kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3") {
    return attention::KvCacheDtype::kFp8E4M3;
  }
  TORCH_CHECK(false, op, ": kv_cache_dtype must be \"auto\", \"fp8\" or \"fp8_e4m3\", got \"",
              kv_cache_dtype, "\"");
}

void check_scale_tensor(const char* op, const char* arg, const at::Tensor& t,
                        const at::Tensor& query) {
  TORCH_CHECK(t.numel() == 1, op, ": ", arg, " must hold one float32 value, got shape ", t.sizes());
  check_dtype(op, arg, t, at::kFloat);
  check_same_device(op, arg, t, query);
}

/// A float32 v2 scratch tensor: contiguous, [num_seqs, num_heads, partitions(, head_size)].
int64_t check_scratch(const char* op, const char* arg, const at::Tensor& t, int64_t num_seqs,
                      int64_t num_heads, int64_t head_size, int64_t max_seq_len,
                      int64_t partition_size, const at::Tensor& query) {
  const bool with_head = head_size > 0;
  TORCH_CHECK(t.dim() == (with_head ? 4 : 3) && t.size(0) == num_seqs && t.size(1) == num_heads &&
                  (!with_head || t.size(3) == head_size),
              op, ": ", arg, " must be float32 [num_seqs=", num_seqs, ", num_heads=", num_heads,
              ", max_num_partitions",
              with_head ? ", head_size=" + std::to_string(head_size) : std::string(),
              "], got shape ", t.sizes());
  const int64_t needed = (max_seq_len + partition_size - 1) / partition_size;
  TORCH_CHECK(t.size(2) >= needed, op, ": ", arg, " holds ", t.size(2),
              " partitions but max_seq_len=", max_seq_len, " needs ceil(max_seq_len / ",
              partition_size, ") = ", needed);
  check_dtype(op, arg, t, at::kFloat);
  TORCH_CHECK(t.is_contiguous(), op, ": ", arg, " must be contiguous");
  check_same_device(op, arg, t, query);
  return t.size(2);
}

/// Checks every input and describes the problem. u and bd are given for the XL ops only.
attention::PagedAttentionProblem make_problem(
    const char* op, at::Tensor& out, const at::Tensor& query, const at::Tensor* u,
    const at::Tensor* bd, const at::Tensor& key_cache, const at::Tensor& value_cache,
    int64_t num_kv_heads, double scale, const at::Tensor& block_tables, const at::Tensor& seq_lens,
    int64_t block_size, int64_t max_seq_len, const std::optional<at::Tensor>& alibi_slopes,
    const std::string& kv_cache_dtype, const at::Tensor& k_scale, const at::Tensor& v_scale) {
  TORCH_CHECK(query.dim() == 3, op, ": query must be [num_seqs, num_heads, head_size], got shape ",
              query.sizes());
  const int64_t num_seqs = query.size(0), num_heads = query.size(1), head_size = query.size(2);
  const ScalarType dtype = kernel_dtype(op, "query", query);
  check_last_dim_contiguous(op, "query", query);
  TORCH_CHECK(supported_head_size(head_size), op,
              ": head_size must be one of 64, 80, 96, 112, 128, 192, 256, got ", head_size);
  TORCH_CHECK(block_size == 8 || block_size == 16 || block_size == 32, op,
              ": block_size must be 8, 16 or 32, got ", block_size);
  TORCH_CHECK(num_kv_heads >= 1 && num_heads >= num_kv_heads && num_heads % num_kv_heads == 0, op,
              ": num_heads (", num_heads, ") must be a positive multiple of num_kv_heads (",
              num_kv_heads, ")");
  TORCH_CHECK(max_seq_len >= 0, op, ": max_seq_len must be >= 0, got ", max_seq_len);
  TORCH_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);

  TORCH_CHECK(out.sizes() == query.sizes(), op, ": out must have the shape of query ",
              query.sizes(), ", got ", out.sizes());
  check_dtype(op, "out", out, query.scalar_type());
  TORCH_CHECK(out.is_contiguous(), op, ": out must be contiguous");
  check_same_device(op, "out", out, query);

  // The caches.
  const attention::KvCacheDtype cache_dtype = cache_dtype_of(op, kv_cache_dtype);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"key_cache", key_cache},
                                {"value_cache", value_cache}}) {
    check_same_device(op, name, t, query);
    if (cache_dtype == attention::KvCacheDtype::kAuto) {
      TORCH_CHECK(t.scalar_type() == query.scalar_type(), op, ": ", name,
                  " must have the query's dtype ", query.scalar_type(),
                  " for kv_cache_dtype=\"auto\", got ", t.scalar_type());
    } else {
      TORCH_CHECK(t.scalar_type() == at::kByte || t.scalar_type() == at::kFloat8_e4m3fn, op, ": ",
                  name, " must be uint8 or float8_e4m3fn for kv_cache_dtype=\"", kv_cache_dtype,
                  "\", got ", t.scalar_type());
    }
  }
  const int64_t x = 16 / key_cache.element_size();
  TORCH_CHECK(key_cache.dim() == 5 && key_cache.size(1) == num_kv_heads &&
                  key_cache.size(2) == head_size / x && key_cache.size(3) == block_size &&
                  key_cache.size(4) == x,
              op, ": key_cache must be [num_blocks, num_kv_heads=", num_kv_heads,
              ", head_size/x=", head_size / x, ", block_size=", block_size, ", x=", x,
              "] (x = 16 bytes / element size), got shape ", key_cache.sizes());
  TORCH_CHECK(value_cache.dim() == 4 && value_cache.size(0) == key_cache.size(0) &&
                  value_cache.size(1) == num_kv_heads && value_cache.size(2) == head_size &&
                  value_cache.size(3) == block_size,
              op, ": value_cache must be [num_blocks=", key_cache.size(0),
              ", num_kv_heads=", num_kv_heads, ", head_size=", head_size,
              ", block_size=", block_size, "], got shape ", value_cache.sizes());
  // Blocks and heads may be strided (one stride each, shared by both caches); a head's block
  // must be dense.
  TORCH_CHECK(
      key_cache.stride(4) == 1 && key_cache.stride(3) == x && key_cache.stride(2) == block_size * x,
      op,
      ": key_cache must be contiguous within each [head_size/x, block_size, x] head "
      "block, got strides ",
      key_cache.strides());
  TORCH_CHECK(value_cache.stride(3) == 1 && value_cache.stride(2) == block_size, op,
              ": value_cache must be contiguous within each [head_size, block_size] head block, "
              "got strides ",
              value_cache.strides());
  TORCH_CHECK(
      key_cache.stride(0) == value_cache.stride(0) && key_cache.stride(1) == value_cache.stride(1),
      op, ": key_cache and value_cache must have the same block and head strides, got ",
      key_cache.strides(), " and ", value_cache.strides());
  check_scale_tensor(op, "k_scale", k_scale, query);
  check_scale_tensor(op, "v_scale", v_scale, query);

  // Block tables and lengths.
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == num_seqs, op,
              ": block_tables must be int32 [num_seqs=", num_seqs,
              ", max_blocks_per_seq], got shape ", block_tables.sizes());
  check_dtype(op, "block_tables", block_tables, at::kInt);
  check_last_dim_contiguous(op, "block_tables", block_tables);
  check_same_device(op, "block_tables", block_tables, query);
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == num_seqs, op,
              ": seq_lens must be int32 [num_seqs=", num_seqs, "], got shape ", seq_lens.sizes());
  check_dtype(op, "seq_lens", seq_lens, at::kInt);
  TORCH_CHECK(seq_lens.is_contiguous(), op, ": seq_lens must be contiguous");
  check_same_device(op, "seq_lens", seq_lens, query);

  if (alibi_slopes) {
    TORCH_CHECK(alibi_slopes->dim() == 1 && alibi_slopes->size(0) == num_heads, op,
                ": alibi_slopes must be float32 [num_heads=", num_heads, "], got shape ",
                alibi_slopes->sizes());
    check_dtype(op, "alibi_slopes", *alibi_slopes, at::kFloat);
    TORCH_CHECK(alibi_slopes->is_contiguous(), op, ": alibi_slopes must be contiguous");
    check_same_device(op, "alibi_slopes", *alibi_slopes, query);
  }
  if (u != nullptr) {
    TORCH_CHECK(u->sizes() == query.sizes(), op, ": pos_bias_u must have the shape of query ",
                query.sizes(), ", got ", u->sizes());
    check_dtype(op, "pos_bias_u", *u, query.scalar_type());
    check_last_dim_contiguous(op, "pos_bias_u", *u);
    check_same_device(op, "pos_bias_u", *u, query);
    TORCH_CHECK(bd->dim() == 3 && bd->size(0) == num_seqs && bd->size(1) == num_heads &&
                    bd->size(2) >= max_seq_len,
                op, ": matrix_bd must be [num_seqs=", num_seqs, ", num_heads=", num_heads,
                ", >= max_seq_len=", max_seq_len, "], got shape ", bd->sizes());
    check_dtype(op, "matrix_bd", *bd, query.scalar_type());
    check_last_dim_contiguous(op, "matrix_bd", *bd);
    check_same_device(op, "matrix_bd", *bd, query);
  }

#if defined(APHRODITE_BACKEND_CPU)
  // On the CPU the indices can be checked for free; a bad one would read outside the caches.
  // (The GPU path trusts them, as vLLM's does: checking would synchronise the stream.)
  if (query.is_cpu()) {
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    const int64_t num_blocks = key_cache.size(0);
    for (int64_t s = 0; s < num_seqs; ++s) {
      TORCH_CHECK(lens[s] >= 0 && lens[s] <= max_seq_len, op, ": seq_lens[", s, "] = ", lens[s],
                  " is outside [0, max_seq_len=", max_seq_len, "]");
      const int64_t blocks = (lens[s] + block_size - 1) / block_size;
      TORCH_CHECK(blocks <= block_tables.size(1), op, ": seq_lens[", s, "] = ", lens[s], " needs ",
                  blocks, " blocks but block_tables has ", block_tables.size(1), " columns");
      for (int64_t b = 0; b < blocks; ++b) {
        const int32_t id = tables[s * block_tables.stride(0) + b];
        TORCH_CHECK(id >= 0 && id < num_blocks, op, ": block_tables[", s, ", ", b, "] = ", id,
                    " is outside the cache's ", num_blocks, " blocks");
      }
    }
  }
#endif

  return attention::PagedAttentionProblem{out.data_ptr(),
                                          query.data_ptr(),
                                          key_cache.data_ptr(),
                                          value_cache.data_ptr(),
                                          block_tables.data_ptr<int32_t>(),
                                          seq_lens.data_ptr<int32_t>(),
                                          alibi_slopes ? alibi_slopes->data_ptr<float>() : nullptr,
                                          k_scale.data_ptr<float>(),
                                          v_scale.data_ptr<float>(),
                                          u != nullptr ? u->data_ptr() : nullptr,
                                          bd != nullptr ? bd->data_ptr() : nullptr,
                                          num_seqs,
                                          num_heads,
                                          num_kv_heads,
                                          head_size,
                                          block_size,
                                          max_seq_len,
                                          block_tables.stride(0),
                                          block_tables.size(1),
                                          query.stride(0),
                                          query.stride(1),
                                          key_cache.stride(0),
                                          key_cache.stride(1),
                                          u != nullptr ? u->stride(0) : 0,
                                          u != nullptr ? u->stride(1) : 0,
                                          bd != nullptr ? bd->stride(0) : 0,
                                          bd != nullptr ? bd->stride(1) : 0,
                                          static_cast<float>(scale),
                                          dtype,
                                          cache_dtype};
}

/// vLLM's block-sparse arguments: accepted for schema compatibility, only their defaults
/// (dense attention) are implemented.
void check_dense(const char* op, int64_t tp_rank, int64_t local_blocks, int64_t vert_stride,
                 int64_t sparse_block_size, int64_t head_sliding_step) {
  TORCH_CHECK(tp_rank >= 0, op, ": tp_rank must be >= 0, got ", tp_rank);
  TORCH_CHECK(local_blocks == 0 && vert_stride <= 1 && head_sliding_step == 0, op,
              ": block-sparse attention is not supported: blocksparse_local_blocks, "
              "blocksparse_vert_stride and blocksparse_head_sliding_step must keep their "
              "defaults (0, 0, 0), got (",
              local_blocks, ", ", vert_stride, ", ", head_sliding_step, ")");
  (void)sparse_block_size;  // only meaningful when sparse
}

void run(const char* op, const attention::PagedAttentionProblem& p,
         const attention::PagedAttentionV2Scratch* v2, at::Tensor& out) {
  if (p.num_seqs == 0) return;
  // Every sequence empty (max_seq_len 0): attention over no tokens is zeros, as the kernels
  // write for an empty sequence among others; there is no partition for them to launch over.
  if (p.max_seq_len == 0) {
    out.zero_();
    return;
  }
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  at::parallel_for(0, p.num_seqs * p.num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(paged_attention, p, v2, begin, end);
  });
#else
  const c10::cuda::OptionalCUDAGuard guard(out.device());
  const gpuStream_t stream = current_stream(out);
  // What this build's generated grid cannot run is a user error with a reason, not a launch
  // failure.
  if (const char* why = attention::paged_attention_unsupported(p, v2)) {
    TORCH_CHECK(false, op, ": ", why);
  }
  check_launch(op, v2 == nullptr ? attention::launch_paged_attention_v1(p, stream)
                                 : attention::launch_paged_attention_v2(p, *v2, stream));
#endif
#else
  (void)op, (void)v2;
#endif
}

attention::PagedAttentionV2Scratch make_scratch(const char* op, at::Tensor& exp_sums,
                                                at::Tensor& max_logits, at::Tensor& tmp_out,
                                                const at::Tensor& query, int64_t max_seq_len,
                                                int64_t block_size, int64_t partition_size) {
  TORCH_CHECK(partition_size > 0 && partition_size % block_size == 0, op,
              ": partition_size must be a positive multiple of block_size (", block_size, "), got ",
              partition_size);
  // A partition past the longest sequence holds it whole: the same split in the fewest tokens
  // (the CPU kernel sizes its buffers by the partition) of whole blocks and, where
  // partition_size allows, of whole 16-token steps, so that the tensor-core kernel keeps it at
  // block size 8 too.
  const int64_t unit = std::lcm(block_size, int64_t{16});
  const int64_t whole = (std::max<int64_t>(max_seq_len, 1) + unit - 1) / unit;
  partition_size = std::min(partition_size, whole * unit);
  const int64_t num_seqs = query.size(0), num_heads = query.size(1);
  const int64_t parts = check_scratch(op, "tmp_out", tmp_out, num_seqs, num_heads, query.size(2),
                                      max_seq_len, partition_size, query);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"exp_sums", exp_sums},
                                {"max_logits", max_logits}}) {
    TORCH_CHECK(check_scratch(op, name, t, num_seqs, num_heads, 0, max_seq_len, partition_size,
                              query) == parts,
                op, ": ", name, " must have tmp_out's ", parts, " partitions, got ", t.size(2));
  }
  // The kernels index a partition's tokens in 32 bits.
  TORCH_CHECK(parts * partition_size < (int64_t{1} << 31), op, ": the scratch's ", parts,
              " partitions of ", partition_size, " tokens pass 2^31 tokens");
  return attention::PagedAttentionV2Scratch{exp_sums.data_ptr<float>(),
                                            max_logits.data_ptr<float>(), tmp_out.data_ptr<float>(),
                                            parts, partition_size};
}

void paged_attention_v1(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens,
                        int64_t block_size, int64_t max_seq_len,
                        const std::optional<at::Tensor>& alibi_slopes,
                        const std::string& kv_cache_dtype, const at::Tensor& k_scale,
                        const at::Tensor& v_scale, int64_t tp_rank,
                        int64_t blocksparse_local_blocks, int64_t blocksparse_vert_stride,
                        int64_t blocksparse_block_size, int64_t blocksparse_head_sliding_step) {
  const char* op = "paged_attention_v1";
  check_dense(op, tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
              blocksparse_block_size, blocksparse_head_sliding_step);
  const auto p = make_problem(op, out, query, nullptr, nullptr, key_cache, value_cache,
                              num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                              alibi_slopes, kv_cache_dtype, k_scale, v_scale);
  run(op, p, nullptr, out);
}

void paged_attention_v2(
    at::Tensor& out, at::Tensor& exp_sums, at::Tensor& max_logits, at::Tensor& tmp_out,
    const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
    int64_t num_kv_heads, double scale, const at::Tensor& block_tables, const at::Tensor& seq_lens,
    int64_t block_size, int64_t max_seq_len, const std::optional<at::Tensor>& alibi_slopes,
    const std::string& kv_cache_dtype, const at::Tensor& k_scale, const at::Tensor& v_scale,
    int64_t tp_rank, int64_t blocksparse_local_blocks, int64_t blocksparse_vert_stride,
    int64_t blocksparse_block_size, int64_t blocksparse_head_sliding_step, int64_t partition_size) {
  const char* op = "paged_attention_v2";
  check_dense(op, tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
              blocksparse_block_size, blocksparse_head_sliding_step);
  const auto p = make_problem(op, out, query, nullptr, nullptr, key_cache, value_cache,
                              num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                              alibi_slopes, kv_cache_dtype, k_scale, v_scale);
  const auto scratch = make_scratch(op, exp_sums, max_logits, tmp_out, query, max_seq_len,
                                    block_size, partition_size);
  run(op, p, &scratch, out);
}

void xl_paged_attention_v1(at::Tensor& out, const at::Tensor& query, const at::Tensor& pos_bias_u,
                           const at::Tensor& matrix_bd, const at::Tensor& key_cache,
                           const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           int64_t block_size, int64_t max_seq_len,
                           const std::string& kv_cache_dtype, const at::Tensor& k_scale,
                           const at::Tensor& v_scale) {
  const char* op = "xl_paged_attention_v1";
  const auto p = make_problem(op, out, query, &pos_bias_u, &matrix_bd, key_cache, value_cache,
                              num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                              std::nullopt, kv_cache_dtype, k_scale, v_scale);
  run(op, p, nullptr, out);
}

void xl_paged_attention_v2(at::Tensor& out, at::Tensor& exp_sums, at::Tensor& max_logits,
                           at::Tensor& tmp_out, const at::Tensor& query,
                           const at::Tensor& pos_bias_u, const at::Tensor& matrix_bd,
                           const at::Tensor& key_cache, const at::Tensor& value_cache,
                           int64_t num_kv_heads, double scale, const at::Tensor& block_tables,
                           const at::Tensor& seq_lens, int64_t block_size, int64_t max_seq_len,
                           const std::string& kv_cache_dtype, const at::Tensor& k_scale,
                           const at::Tensor& v_scale, int64_t partition_size) {
  const char* op = "xl_paged_attention_v2";
  const auto p = make_problem(op, out, query, &pos_bias_u, &matrix_bd, key_cache, value_cache,
                              num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                              std::nullopt, kv_cache_dtype, k_scale, v_scale);
  const auto scratch = make_scratch(op, exp_sums, max_logits, tmp_out, query, max_seq_len,
                                    block_size, partition_size);
  run(op, p, &scratch, out);
}

}  // namespace
}  // namespace aphrodite

// vLLM's arguments; the v2 ops add partition_size last: the tokens of a partition, a multiple of
// block_size, by default vLLM's 512 (its callers size the scratch by it;
// aphrodite_ext.ops.paged_attention.PARTITION_SIZE mirrors it).
#define APHRODITE_PAGED_ATTENTION_ARGS                                                        \
  "Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, float scale, "       \
  "Tensor block_tables, Tensor seq_lens, int block_size, int max_seq_len, "                   \
  "Tensor? alibi_slopes, str kv_cache_dtype, Tensor k_scale, Tensor v_scale, int tp_rank=0, " \
  "int blocksparse_local_blocks=0, int blocksparse_vert_stride=0, "                           \
  "int blocksparse_block_size=64, int blocksparse_head_sliding_step=0"
#define APHRODITE_XL_PAGED_ATTENTION_ARGS                                                     \
  "Tensor query, Tensor pos_bias_u, Tensor matrix_bd, Tensor key_cache, Tensor value_cache, " \
  "int num_kv_heads, float scale, Tensor block_tables, Tensor seq_lens, int block_size, "     \
  "int max_seq_len, str kv_cache_dtype, Tensor k_scale, Tensor v_scale"
#define APHRODITE_V2_SCRATCH "Tensor! exp_sums, Tensor! max_logits, Tensor! tmp_out, "
#define APHRODITE_V2_PARTITION ", int partition_size=512) -> ()"

APHRODITE_DEFINE_OPS(_C, ops) {
  ops.def("paged_attention_v1(Tensor! out, " APHRODITE_PAGED_ATTENTION_ARGS ") -> ()");
  ops.def("paged_attention_v2(Tensor! out, " APHRODITE_V2_SCRATCH APHRODITE_PAGED_ATTENTION_ARGS
              APHRODITE_V2_PARTITION);
  ops.def("xl_paged_attention_v1(Tensor! out, " APHRODITE_XL_PAGED_ATTENTION_ARGS ") -> ()");
  ops.def(
      "xl_paged_attention_v2(Tensor! out, " APHRODITE_V2_SCRATCH APHRODITE_XL_PAGED_ATTENTION_ARGS
          APHRODITE_V2_PARTITION);
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_C, m) {
  m.impl("paged_attention_v1", &aphrodite::paged_attention_v1);
  m.impl("paged_attention_v2", &aphrodite::paged_attention_v2);
  m.impl("xl_paged_attention_v1", &aphrodite::xl_paged_attention_v1);
  m.impl("xl_paged_attention_v2", &aphrodite::xl_paged_attention_v2);
}
#endif

namespace aphrodite {
namespace {

/// split_kv's question (aphrodite_ext/ops/paged_attention.py): which blocks of the tensor-core
/// kernel the launcher can run (dtype, kv_cache_dtype, head size, block size) problems with on
/// GPU `device` (attention::paged_attention_mma_warps): 8, 4 or 0 warps; 0 on the CPU backend
/// and on ROCm (no tensor-core kernel there).
int64_t paged_attention_mma_warps(int64_t device, at::ScalarType dtype,
                                  const std::string& kv_cache_dtype, int64_t head_size,
                                  int64_t block_size, bool xl) {
  const char* op = "_paged_attention_mma_warps";
  const auto cache = cache_dtype_of(op, kv_cache_dtype);
#if APHRODITE_FAMILY_BUILT && defined(APHRODITE_BACKEND_GPU) && !defined(USE_ROCM)
  const auto kernel = to_kernel_dtype(dtype);
  if (!kernel) return 0;
  TORCH_CHECK(device >= 0 && device < c10::cuda::device_count(), op, ": no GPU ", device);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return attention::paged_attention_mma_warps(*kernel, cache, head_size, block_size, xl);
#else
  (void)cache, (void)device, (void)dtype, (void)head_size, (void)block_size, (void)xl;
  return 0;
#endif
}

}  // namespace
}  // namespace aphrodite

// A query, not a kernel: no tensors, so one implementation serves every dispatch key.
TORCH_LIBRARY_FRAGMENT(_C, m) {
  m.def(
      "_paged_attention_mma_warps(int device, ScalarType dtype, str kv_cache_dtype, int head_size, "
      "int block_size, bool xl) -> int",
      &aphrodite::paged_attention_mma_warps);
}

// Torch binding of the flash_attn family (module _fa2_C): the varlen forward's schema, input
// checks, fake (Meta) kernel and the CUDA launch.
#include "flash_attn/flash_attn.h"

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include <ATen/ops/empty.h>

#include "common/torch_binding.h"

namespace aphrodite {
namespace {

constexpr const char* kOp = "varlen_fwd";

// cp.async and the 16-byte output stores move 8 elements at a time: every row and head (and
// cache block) must start on a 16-byte boundary.
void check_aligned(const char* arg, const at::Tensor& t) {
  check_last_dim_contiguous(kOp, arg, t);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, kOp, ": ", arg,
              " must start on a 16-byte boundary");
  bool aligned = true;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) aligned = aligned && t.stride(d) % 8 == 0;
  TORCH_CHECK(aligned, kOp, ": ", arg,
              " must have strides (all but the last) that are multiples of 8 elements (16 bytes), "
              "got strides ",
              t.strides());
}

void check_cu_seqlens(const char* arg, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.scalar_type() == at::kInt, kOp, ": ", arg, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 1 && t.size(0) >= 2, kOp, ": ", arg,
              " must be 1-D of length batch + 1 >= 2, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), kOp, ": ", arg, " must be contiguous");
  check_same_device(kOp, arg, t, q);
}

struct Checked {
  int64_t total_q, heads, head_dim, total_k, kv_heads, batch, block_size;
  bool paged;
};

Checked check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& out, const at::Tensor& cu_seqlens_q,
                     const at::Tensor& cu_seqlens_k, const std::optional<at::Tensor>& seqused_k,
                     const std::optional<at::Tensor>& block_table, int64_t max_seqlen_q,
                     int64_t max_seqlen_k, double softmax_scale, int64_t window_size_left,
                     int64_t window_size_right, double softcap) {
  TORCH_CHECK(q.dim() == 3, kOp, ": q must be [total_q, num_heads, head_dim], got shape ",
              q.sizes());
  const bool paged = block_table.has_value();
  if (paged) {
    TORCH_CHECK(k.dim() == 4, kOp,
                ": with a block_table, k must be a paged cache [num_blocks, block_size, "
                "num_kv_heads, head_dim], got shape ",
                k.sizes());
  } else {
    TORCH_CHECK(k.dim() == 3, kOp, ": k must be [total_k, num_kv_heads, head_dim]",
                (k.dim() == 4 ? " (a 4-D paged cache needs a block_table)" : ""), ", got shape ",
                k.sizes());
  }
  TORCH_CHECK(v.sizes() == k.sizes(), kOp, ": v must have the shape of k ", k.sizes(), ", got ",
              v.sizes());
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, kOp,
              ": q must be float16 or bfloat16, got ", q.scalar_type());
  check_dtype(kOp, "k", k, q.scalar_type());
  check_dtype(kOp, "v", v, q.scalar_type());
  check_same_device(kOp, "k", k, q);
  check_same_device(kOp, "v", v, q);
  const int64_t kv_dim = paged ? 2 : 1;  // k's head dimension
  const Checked c{q.size(0),
                  q.size(1),
                  q.size(2),
                  paged ? k.size(0) * k.size(1) : k.size(0),
                  k.size(kv_dim),
                  cu_seqlens_q.size(0) - 1,
                  paged ? k.size(1) : 0,
                  paged};
  TORCH_CHECK(k.size(kv_dim + 1) == c.head_dim, kOp, ": k and v must have q's head_dim ",
              c.head_dim, ", got ", k.size(kv_dim + 1));
  TORCH_CHECK(c.kv_heads > 0 && c.heads > 0 && c.heads % c.kv_heads == 0, kOp, ": num_kv_heads (",
              c.kv_heads, ") must divide num_heads (", c.heads, "), both positive");
  // The launch's grid: (query tiles, num_heads, batch); y and z are at most 65535.
  TORCH_CHECK(c.heads <= 65535 && c.batch <= 65535, kOp,
              ": at most 65535 heads and 65535 sequences a call, got ", c.heads, " and ", c.batch,
              " (split the batch)");
  check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q);
  check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q);
  TORCH_CHECK(cu_seqlens_k.size(0) == cu_seqlens_q.size(0), kOp,
              ": cu_seqlens_k must have the length of cu_seqlens_q (", cu_seqlens_q.size(0),
              "), got ", cu_seqlens_k.size(0));
  TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, kOp,
              ": max_seqlen_q and max_seqlen_k must be >= 0, got ", max_seqlen_q, " and ",
              max_seqlen_k);
  TORCH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0.0, kOp,
              ": softmax_scale must be a finite number > 0, got ", softmax_scale);
  TORCH_CHECK(std::isfinite(softcap) && softcap >= 0.0, kOp,
              ": softcap must be a finite number >= 0 (0: off), got ", softcap);
  TORCH_CHECK(
      window_size_left >= -1 && window_size_right >= -1 &&
          window_size_left <= std::numeric_limits<int32_t>::max() &&
          window_size_right <= std::numeric_limits<int32_t>::max(),
      kOp, ": window_size_left and window_size_right must be -1 (unbounded) or in [0, 2^31), got ",
      window_size_left, " and ", window_size_right);
  if (seqused_k.has_value()) {
    TORCH_CHECK(seqused_k->scalar_type() == at::kInt, kOp, ": seqused_k must be int32, got ",
                seqused_k->scalar_type());
    TORCH_CHECK(seqused_k->dim() == 1 && seqused_k->size(0) == c.batch, kOp,
                ": seqused_k must be 1-D of length batch (", c.batch, "), got shape ",
                seqused_k->sizes());
    TORCH_CHECK(seqused_k->is_contiguous(), kOp, ": seqused_k must be contiguous");
    check_same_device(kOp, "seqused_k", *seqused_k, q);
  }
  if (paged) {
    const at::Tensor& bt = *block_table;
    TORCH_CHECK(bt.scalar_type() == at::kInt, kOp, ": block_table must be int32, got ",
                bt.scalar_type());
    TORCH_CHECK(bt.dim() == 2 && bt.size(0) == c.batch, kOp, ": block_table must be [batch (",
                c.batch, "), max_blocks_per_seq], got shape ", bt.sizes());
    TORCH_CHECK(bt.size(1) == 0 || bt.stride(1) == 1, kOp,
                ": block_table must be contiguous in its last dimension, got strides ",
                bt.strides());
    check_same_device(kOp, "block_table", bt, q);
    TORCH_CHECK(c.block_size > 0 && c.block_size % 16 == 0, kOp,
                ": the paged cache's block_size (k.size(1)) must be a positive multiple of 16, "
                "got ",
                c.block_size);
  }
  if (out.has_value()) {
    TORCH_CHECK(out->sizes() == q.sizes(), kOp, ": out must have the shape of q ", q.sizes(),
                ", got ", out->sizes());
    check_dtype(kOp, "out", *out, q.scalar_type());
    check_same_device(kOp, "out", *out, q);
  }
  return c;
}

std::tuple<at::Tensor, at::Tensor> varlen_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& out, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, const std::optional<at::Tensor>& seqused_k,
    const std::optional<at::Tensor>& block_table, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double softmax_scale, bool causal, int64_t window_size_left, int64_t window_size_right,
    double softcap, bool return_softmax_lse) {
  const Checked c =
      check_inputs(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q,
                   max_seqlen_k, softmax_scale, window_size_left, window_size_right, softcap);
  at::Tensor result =
      out.has_value() ? at::empty({0}, q.options()) : at::empty(q.sizes(), q.options());
  at::Tensor dst = out.has_value() ? *out : result;
  at::Tensor lse = at::empty({return_softmax_lse ? c.heads : 0, return_softmax_lse ? c.total_q : 0},
                             q.options().dtype(at::kFloat));
#if APHRODITE_FAMILY_BUILT
  const ScalarType dtype = kernel_dtype(kOp, "q", q);
  TORCH_CHECK(flash_attn::has_fwd(static_cast<int>(c.head_dim), dtype, causal, c.paged), kOp,
              ": head_dim ", c.head_dim, " with ", q.scalar_type(), (causal ? " causal" : ""),
              (c.paged ? " paged" : ""),
              " is not in this build (head dims built: ", flash_attn::built_head_dims(),
              "; see the flash_attn generator options)");
  check_aligned("q", q);
  check_aligned("k", k);
  check_aligned("v", v);
  check_aligned("out", dst);
  // Paged rows are addressed by (block, row in block) in 64 bits; dense rows by int offsets.
  TORCH_CHECK(c.total_q < (int64_t{1} << 31) && (c.paged || c.total_k < (int64_t{1} << 31)), kOp,
              ": total_q and total_k must be below 2^31 tokens");
  if (c.total_q == 0 || c.batch == 0 || max_seqlen_q == 0) {
    if (return_softmax_lse) lse.fill_(-INFINITY);
    dst.zero_();
    return {result, lse};
  }
  flash_attn::FwdProblem p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = dst.data_ptr();
  p.lse = return_softmax_lse ? lse.data_ptr<float>() : nullptr;
  p.cu_seqlens_q = cu_seqlens_q.data_ptr<int32_t>();
  p.cu_seqlens_k = cu_seqlens_k.data_ptr<int32_t>();
  p.seqused_k = seqused_k.has_value() ? seqused_k->data_ptr<int32_t>() : nullptr;
  const int64_t kv_dim = c.paged ? 1 : 0;  // k's row dimension
  if (c.paged) {
    p.block_table = block_table->data_ptr<int32_t>();
    p.block_table_batch_stride = block_table->stride(0);
    p.k_block_stride = k.stride(0);
    p.v_block_stride = v.stride(0);
    p.block_size = static_cast<int>(c.block_size);
  }
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.k_row_stride = k.stride(kv_dim);
  p.k_head_stride = k.stride(kv_dim + 1);
  p.v_row_stride = v.stride(kv_dim);
  p.v_head_stride = v.stride(kv_dim + 1);
  p.o_row_stride = dst.stride(0);
  p.o_head_stride = dst.stride(1);
  p.total_q = c.total_q;
  p.batch = static_cast<int>(c.batch);
  p.num_heads = static_cast<int>(c.heads);
  p.num_kv_heads = static_cast<int>(c.kv_heads);
  p.head_dim = static_cast<int>(c.head_dim);
  p.max_seqlen_q = static_cast<int>(max_seqlen_q);
  p.window_left = static_cast<int>(window_size_left);
  p.window_right = causal ? 0 : static_cast<int>(window_size_right);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  p.causal = causal;
  p.dtype = dtype;
  const c10::cuda::OptionalCUDAGuard guard(q.device());
  check_launch(kOp, flash_attn::launch_fwd(p, current_stream(q)));
#endif
  return {result, lse};
}

// Fake (Meta): the outputs' shapes, so the op traces under torch.compile. With `out` given the
// result is written there and the first output is empty (a custom op may not return an alias
// of an input).
std::tuple<at::Tensor, at::Tensor> varlen_fwd_fake(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& out, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, const std::optional<at::Tensor>& seqused_k,
    const std::optional<at::Tensor>& block_table, int64_t, int64_t, double, bool, int64_t, int64_t,
    double, bool return_softmax_lse) {
  detail::check_meta_calls("varlen_fwd", q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k,
                           block_table);
  at::Tensor result =
      out.has_value() ? at::empty({0}, q.options()) : at::empty_symint(q.sym_sizes(), q.options());
  std::vector<c10::SymInt> lse_shape{c10::SymInt(0), c10::SymInt(0)};
  if (return_softmax_lse) lse_shape = {q.sym_size(1), q.sym_size(0)};
  return {result, at::empty_symint(lse_shape, q.options().dtype(at::kFloat))};
}

}  // namespace
}  // namespace aphrodite

// vLLM's varlen_fwd argument names and order, less what this kernel does not take (leftpad_k,
// alibi_slopes, p_dropout, zero_tensors, num_splits); `causal` and `return_softmax_lse` keep
// the names of flash_attn_varlen_func. With a block_table, k and v are paged caches and
// seqused_k (or cu_seqlens_k's differences) gives the key counts.
APHRODITE_DEFINE_OPS(_fa2_C, ops) {
  ops.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!)? out, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, Tensor? seqused_k, Tensor? block_table, int max_seqlen_q, "
      "int max_seqlen_k, float softmax_scale, bool causal, int window_size_left, "
      "int window_size_right, float softcap, bool return_softmax_lse) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(_fa2_C, Meta, m) { m.impl("varlen_fwd", &aphrodite::varlen_fwd_fake); }

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_fa2_C, m) { m.impl("varlen_fwd", &aphrodite::varlen_fwd); }
#endif

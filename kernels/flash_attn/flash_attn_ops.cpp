// Torch binding of the flash_attn family (module _fa2_C): the varlen forward's schema, input
// checks, fake (Meta) kernel and the CUDA launch.
#include "flash_attn/flash_attn.h"

#include <cmath>
#include <optional>
#include <tuple>

#include <ATen/ops/empty.h>

#include "common/torch_binding.h"

namespace aphrodite {
namespace {

constexpr const char* kOp = "varlen_fwd";

// cp.async and the 16-byte output stores move 8 elements at a time: every row and head must
// start on a 16-byte boundary.
void check_aligned(const char* arg, const at::Tensor& t) {
  check_last_dim_contiguous(kOp, arg, t);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, kOp, ": ", arg,
              " must start on a 16-byte boundary");
  TORCH_CHECK(t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0, kOp, ": ", arg,
              " must have token and head strides that are multiples of 8 elements (16 bytes), "
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
  int64_t total_q, heads, head_dim, total_k, kv_heads, batch;
};

Checked check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& out, const at::Tensor& cu_seqlens_q,
                     const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                     double softmax_scale) {
  TORCH_CHECK(q.dim() == 3, kOp, ": q must be [total_q, num_heads, head_dim], got shape ",
              q.sizes());
  TORCH_CHECK(k.dim() == 3, kOp, ": k must be [total_k, num_kv_heads, head_dim], got shape ",
              k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), kOp, ": v must have the shape of k ", k.sizes(), ", got ",
              v.sizes());
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, kOp,
              ": q must be float16 or bfloat16, got ", q.scalar_type());
  check_dtype(kOp, "k", k, q.scalar_type());
  check_dtype(kOp, "v", v, q.scalar_type());
  check_same_device(kOp, "k", k, q);
  check_same_device(kOp, "v", v, q);
  const Checked c{q.size(0), q.size(1), q.size(2), k.size(0), k.size(1), cu_seqlens_q.size(0) - 1};
  TORCH_CHECK(k.size(2) == c.head_dim, kOp, ": k and v must have q's head_dim ", c.head_dim,
              ", got ", k.size(2));
  TORCH_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0, kOp, ": num_kv_heads (", c.kv_heads,
              ") must divide num_heads (", c.heads, ")");
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
  if (out.has_value()) {
    TORCH_CHECK(out->sizes() == q.sizes(), kOp, ": out must have the shape of q ", q.sizes(),
                ", got ", out->sizes());
    check_dtype(kOp, "out", *out, q.scalar_type());
    check_same_device(kOp, "out", *out, q);
  }
  return c;
}

std::tuple<at::Tensor, at::Tensor> varlen_fwd(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v,
                                              const std::optional<at::Tensor>& out,
                                              const at::Tensor& cu_seqlens_q,
                                              const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, double softmax_scale,
                                              bool causal, bool return_softmax_lse) {
  const Checked c = check_inputs(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, softmax_scale);
  at::Tensor result =
      out.has_value() ? at::empty({0}, q.options()) : at::empty(q.sizes(), q.options());
  at::Tensor dst = out.has_value() ? *out : result;
  at::Tensor lse = at::empty({return_softmax_lse ? c.heads : 0, return_softmax_lse ? c.total_q : 0},
                             q.options().dtype(at::kFloat));
#if APHRODITE_FAMILY_BUILT
  const ScalarType dtype = kernel_dtype(kOp, "q", q);
  TORCH_CHECK(flash_attn::has_fwd(static_cast<int>(c.head_dim), dtype, causal), kOp, ": head_dim ",
              c.head_dim, " with ", q.scalar_type(), (causal ? " causal" : ""),
              " is not in this build (head dims built: ", flash_attn::built_head_dims(),
              "; see the flash_attn generator options)");
  check_aligned("q", q);
  check_aligned("k", k);
  check_aligned("v", v);
  check_aligned("out", dst);
  TORCH_CHECK(c.total_q < (int64_t{1} << 31) && c.total_k < (int64_t{1} << 31), kOp,
              ": total_q and total_k must be below 2^31 tokens");
  if (c.total_q == 0 || c.batch == 0 || max_seqlen_q == 0) {
    if (return_softmax_lse) lse.fill_(-INFINITY);
    dst.zero_();
    return {result, lse};
  }
  const flash_attn::FwdProblem p{q.data_ptr(),
                                 k.data_ptr(),
                                 v.data_ptr(),
                                 dst.data_ptr(),
                                 return_softmax_lse ? lse.data_ptr<float>() : nullptr,
                                 cu_seqlens_q.data_ptr<int32_t>(),
                                 cu_seqlens_k.data_ptr<int32_t>(),
                                 q.stride(0),
                                 q.stride(1),
                                 k.stride(0),
                                 k.stride(1),
                                 v.stride(0),
                                 v.stride(1),
                                 dst.stride(0),
                                 dst.stride(1),
                                 c.total_q,
                                 static_cast<int>(c.batch),
                                 static_cast<int>(c.heads),
                                 static_cast<int>(c.kv_heads),
                                 static_cast<int>(c.head_dim),
                                 static_cast<int>(max_seqlen_q),
                                 static_cast<float>(softmax_scale),
                                 causal,
                                 dtype};
  const c10::cuda::OptionalCUDAGuard guard(q.device());
  check_launch(kOp, flash_attn::launch_fwd(p, current_stream(q)));
#endif
  return {result, lse};
}

// Fake (Meta): the outputs' shapes, so the op traces under torch.compile. With `out` given the
// result is written there and the first output is empty (a custom op may not return an alias
// of an input).
std::tuple<at::Tensor, at::Tensor> varlen_fwd_fake(const at::Tensor& q, const at::Tensor&,
                                                   const at::Tensor&,
                                                   const std::optional<at::Tensor>& out,
                                                   const at::Tensor&, const at::Tensor&, int64_t,
                                                   int64_t, double, bool, bool return_softmax_lse) {
  at::Tensor result =
      out.has_value() ? at::empty({0}, q.options()) : at::empty_symint(q.sym_sizes(), q.options());
  std::vector<c10::SymInt> lse_shape{c10::SymInt(0), c10::SymInt(0)};
  if (return_softmax_lse) lse_shape = {q.sym_size(1), q.sym_size(0)};
  return {result, at::empty_symint(lse_shape, q.options().dtype(at::kFloat))};
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_fa2_C, ops) {
  ops.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!)? out, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
      "bool causal, bool return_softmax_lse) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(_fa2_C, Meta, m) { m.impl("varlen_fwd", &aphrodite::varlen_fwd_fake); }

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_fa2_C, m) { m.impl("varlen_fwd", &aphrodite::varlen_fwd); }
#endif

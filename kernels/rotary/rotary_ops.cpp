// Torch binding of the rotary family: vLLM's rotary_embedding schema, input checks, and the
// backend kernels. query and key may be strided views (e.g. slices of a fused qkv projection):
// any token stride and head stride are taken as long as the last dimension is contiguous.
#include "rotary/rotary.h"

#include <ATen/MemoryOverlap.h>

#include <optional>

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

constexpr const char* kOp = "rotary_embedding";

/// Stride of the first `dims` dimensions of t collapsed into one token dimension; they must
/// collapse (as for contiguous tensors and slices of later dimensions). 0 for at most one token.
int64_t token_stride(const char* arg, const at::Tensor& t, int64_t dims) {
  if (t.numel() == 0) return 0;  // no tokens (or empty heads) to lay out
  int64_t stride = 0;
  int64_t expected = -1;
  for (int64_t d = dims - 1; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (expected >= 0) {
      TORCH_CHECK(t.stride(d) == expected, kOp, ": ", arg, "'s token dimensions (the first ", dims,
                  ") must collapse into one stride, got sizes ", t.sizes(), " strides ",
                  t.strides());
    } else {
      stride = t.stride(d);
      expected = stride;
    }
    expected *= t.size(d);
  }
  return stride;
}

/// Heads and strides of query or key, laid out as [*positions.shape, num_heads * head_size] or
/// [*positions.shape, num_heads, head_size].
struct HeadsLayout {
  int64_t heads = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

HeadsLayout heads_layout(const char* arg, const at::Tensor& t, const at::Tensor& positions,
                         int64_t head_size) {
  const int64_t dims = positions.dim();
  TORCH_CHECK(t.dim() == dims + 1 || t.dim() == dims + 2, kOp, ": ", arg,
              " must have shape [*positions.shape, num_heads * head_size] or [*positions.shape, "
              "num_heads, head_size] with positions of shape ",
              positions.sizes(), ", got ", t.sizes());
  TORCH_CHECK(t.sizes().slice(0, dims).equals(positions.sizes()), kOp, ": ", arg,
              "'s leading dimensions must match the shape of positions ", positions.sizes(),
              ", got ", t.sizes());
  check_last_dim_contiguous(kOp, arg, t);
  HeadsLayout l;
  if (t.dim() == dims + 1) {
    TORCH_CHECK(t.size(-1) % head_size == 0, kOp, ": ", arg, "'s last dimension (", t.size(-1),
                ") must be a multiple of head_size (", head_size, ")");
    l.heads = t.size(-1) / head_size;
    l.head_stride = head_size;
  } else {
    TORCH_CHECK(t.size(-1) == head_size, kOp, ": ", arg, "'s last dimension (", t.size(-1),
                ") must equal head_size (", head_size, ") when heads are a dimension of their own");
    l.heads = t.size(-2);
    l.head_stride = l.heads > 1 ? t.stride(-2) : 0;
  }
  l.token_stride = token_stride(arg, t, dims);
  return l;
}

#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
template <typename I>
void check_positions_in_range(const at::Tensor& positions, int64_t num_tokens, int64_t stride,
                              int64_t max_position) {
  const I* pos = positions.const_data_ptr<I>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t p = static_cast<int64_t>(pos[t * stride]);
    TORCH_CHECK(p >= 0 && p < max_position, kOp, ": positions must be in [0, ", max_position,
                ") (the rows of cos_sin_cache), got ", p, " at token ", t);
  }
}
#endif

void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      const std::optional<at::Tensor>& key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox) {
  TORCH_CHECK(positions.scalar_type() == at::kLong || positions.scalar_type() == at::kInt, kOp,
              ": positions must be int64 or int32, got ", positions.scalar_type());
  TORCH_CHECK(positions.dim() == 1 || positions.dim() == 2, kOp,
              ": positions must have shape [num_tokens] or [batch, seq_len], got ",
              positions.sizes());
  TORCH_CHECK(head_size > 0, kOp, ": head_size must be positive, got ", head_size);
  const ScalarType dtype = kernel_dtype(kOp, "query", query);
  check_same_device(kOp, "positions", positions, query);
  check_same_device(kOp, "cos_sin_cache", cos_sin_cache, query);

  TORCH_CHECK(cos_sin_cache.dim() == 2, kOp,
              ": cos_sin_cache must have shape [max_position, rot_dim], got ",
              cos_sin_cache.sizes());
  const int64_t rot_dim = cos_sin_cache.size(1);
  const int64_t max_position = cos_sin_cache.size(0);
  TORCH_CHECK(rot_dim > 0 && rot_dim % 2 == 0, kOp,
              ": rot_dim (the last dimension of cos_sin_cache) must be even and positive, got ",
              rot_dim);
  TORCH_CHECK(rot_dim <= head_size, kOp, ": rot_dim (the last dimension of cos_sin_cache, ",
              rot_dim, ") must not exceed head_size (", head_size, ")");
  TORCH_CHECK(max_position > 0, kOp, ": cos_sin_cache must have at least one row");
  TORCH_CHECK(cos_sin_cache.scalar_type() == query.scalar_type() ||
                  cos_sin_cache.scalar_type() == at::kFloat,
              kOp, ": cos_sin_cache must be ", query.scalar_type(),
              " (the dtype of query) or float32, got ", cos_sin_cache.scalar_type());
  check_last_dim_contiguous(kOp, "cos_sin_cache", cos_sin_cache);

  const HeadsLayout q = heads_layout("query", query, positions, head_size);
  HeadsLayout k;
  if (key.has_value()) {
    check_same_device(kOp, "key", *key, query);
    check_dtype(kOp, "key", *key, query.scalar_type());
    k = heads_layout("key", *key, positions, head_size);
  }
  TORCH_CHECK(q.heads + k.heads <= INT32_MAX, kOp, ": at most 2^31 - 1 heads, got ",
              q.heads + k.heads);
  const int64_t num_tokens = positions.numel();
  // Updating in place through aliased elements would race (GPU) or rotate twice.
  auto check_elements_distinct = [&](const char* arg, const at::Tensor& t, const HeadsLayout& l) {
    TORCH_CHECK(t.numel() == 0 || (at::has_internal_overlap(t) != at::MemOverlap::Yes &&
                                   (l.heads <= 1 || l.head_stride >= head_size)),
                kOp, ": ", arg, " has elements that share memory (sizes ", t.sizes(), ", strides ",
                t.strides(), ")");
  };
  check_elements_distinct("query", query, q);
  if (key.has_value()) check_elements_distinct("key", *key, k);
  if (key.has_value() && query.numel() > 0 && key->numel() > 0) {
    if ((q.heads <= 1 || q.head_stride == head_size) &&
        (k.heads <= 1 || k.head_stride == head_size)) {
      // Tokens as rows of contiguous heads: exact for slices of one qkv projection.
      TORCH_CHECK(!rows_overlap(byte_rows(query, num_tokens, q.heads * head_size, q.token_stride),
                                byte_rows(*key, num_tokens, k.heads * head_size, k.token_stride)),
                  kOp, ": query and key must not share memory");
    } else {
      const at::MemOverlapStatus overlap = at::get_overlap_status(query, *key);
      TORCH_CHECK(overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::Partial,
                  kOp, ": query and key must not share memory");
    }
  }

  const int64_t positions_stride = token_stride("positions", positions, positions.dim());
  const rotary::RotaryProblem p{positions.data_ptr(),
                                query.data_ptr(),
                                key.has_value() ? key->data_ptr() : nullptr,
                                cos_sin_cache.data_ptr(),
                                num_tokens,
                                q.heads,
                                k.heads,
                                head_size,
                                rot_dim,
                                max_position,
                                positions_stride,
                                q.token_stride,
                                q.head_stride,
                                k.token_stride,
                                k.head_stride,
                                max_position > 1 ? cos_sin_cache.stride(0) : 0,
                                is_neox,
                                positions.scalar_type() == at::kInt,
                                dtype,
                                kernel_dtype(kOp, "cos_sin_cache", cos_sin_cache)};
  if (num_tokens == 0 || q.heads + k.heads == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  if (p.positions_int32) {
    check_positions_in_range<int32_t>(positions, num_tokens, positions_stride, max_position);
  } else {
    check_positions_in_range<int64_t>(positions, num_tokens, positions_stride, max_position);
  }
  TORCH_CHECK(cpu::active_isa().error.empty(), kOp, ": ", cpu::active_isa().error);
  const int64_t work = std::max<int64_t>(1, (q.heads + k.heads) * rot_dim);
  const int64_t grain = std::max<int64_t>(1, 32768 / work);
  at::parallel_for(0, num_tokens, grain, [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(rotary_embedding, p, begin, end);
  });
#else
  // Positions outside [0, max_position) are not checked here (that needs a device sync); the
  // kernel leaves those tokens unchanged.
  const c10::cuda::OptionalCUDAGuard guard(query.device());
  check_launch(kOp, rotary::launch_rotary_embedding(p, current_stream(query)));
#endif
#endif
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_C, ops) {
  ops.def(
      "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
      "Tensor cos_sin_cache, bool is_neox) -> ()");
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_C, m) { m.impl("rotary_embedding", &aphrodite::rotary_embedding); }
#endif

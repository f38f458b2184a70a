// Shared helpers for the torch-facing bindings (`*_ops.cpp`): input checks with messages that
// name the op and what it expected, conversion to the torch-free kernel types, launch checks,
// and the registration macros that give every op a schema even where its family was not built.
//
// Each family's binding is compiled with these definitions from cmake/families.cmake:
//   APHRODITE_FAMILY_NAME    "activation"
//   APHRODITE_FAMILY_BUILT   1 when the family's kernels are in this module, else 0
//   APHRODITE_FAMILY_STATUS  "built for 8.0 9.0a" or the reason it was skipped
// and the backend's: APHRODITE_BACKEND_CPU or APHRODITE_BACKEND_GPU (CUDA and ROCm).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "common/scalar_type.h"

#if defined(APHRODITE_BACKEND_GPU)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common/gpu.h"
#endif

#ifndef APHRODITE_FAMILY_NAME
#error "bindings are compiled through aphrodite_add_family(), which defines APHRODITE_FAMILY_*"
#endif

namespace aphrodite {

/// A torch element type as the kernels' ScalarType, or nullopt where the kernels take none.
inline std::optional<ScalarType> to_kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ScalarType::kFloat32;
    case at::kHalf: return ScalarType::kFloat16;
    case at::kBFloat16: return ScalarType::kBFloat16;
    default: return std::nullopt;
  }
}

/// The torch element type `op` takes, as the kernels' ScalarType; rejects the others.
inline ScalarType kernel_dtype(const char* op, const char* arg, const at::Tensor& t) {
  const auto dtype = to_kernel_dtype(t.scalar_type());
  TORCH_CHECK(dtype, op, ": ", arg, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  return *dtype;
}

inline void check_same_device(const char* op, const char* arg, const at::Tensor& t,
                              const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", arg, " is on ", t.device(),
              " but the other inputs are on ", ref.device());
}

inline void check_dtype(const char* op, const char* arg, const at::Tensor& t,
                        at::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, op, ": ", arg, " must be ", expected, ", got ",
              t.scalar_type());
}

inline void check_last_dim_contiguous(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 0 || t.stride(-1) == 1 || t.size(-1) <= 1, op, ": ", arg,
              " must be contiguous in its last dimension, got strides ", t.strides());
}

/// The GPU kernels index a row's elements with 32-bit integers: rows of at most 2^31 - 1.
inline void check_row_length(const char* op, int64_t length) {
#if defined(APHRODITE_BACKEND_GPU)
  TORCH_CHECK(length <= INT32_MAX, op,
              ": the GPU kernels take rows of at most 2^31 - 1 elements, got ", length);
#else
  (void)op;
  (void)length;
#endif
}

/// Rows of a tensor viewed as [rows, last]: every leading dimension must collapse into one
/// stride (true for contiguous tensors and for slices of the last dimension). An empty tensor
/// has no rows to lay out: any strides.
inline int64_t row_stride(const char* op, const char* arg, const at::Tensor& t) {
  check_last_dim_contiguous(op, arg, t);
  if (t.dim() <= 1) return t.size(-1);
  int64_t stride = t.stride(-2);
  if (t.numel() == 0) return stride;
  int64_t expected = stride;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    TORCH_CHECK(t.size(d) == 1 || t.stride(d) == expected, op, ": ", arg,
                " must have rows of one stride (leading dims collapsible), got sizes ", t.sizes(),
                " strides ", t.strides());
    expected *= t.size(d);
  }
  return stride;
}

/// Rejects an output whose rows (row_stride's [rows, last] view, `stride` elements apart)
/// share memory with each other, as an expanded tensor's do: the op would write them twice.
inline void check_rows_distinct(const char* op, const char* arg, const at::Tensor& t,
                                int64_t stride) {
  if (t.numel() == 0 || t.numel() == t.size(-1)) return;
  TORCH_CHECK(stride >= t.size(-1), op, ": ", arg, " has rows that share memory (sizes ", t.sizes(),
              ", strides ", t.strides(),
              "); pass a tensor whose rows are distinct, e.g. a new or .contiguous() one");
}

/// Memory as rows: `rows` runs of `width` contiguous bytes, `step` bytes apart, from `begin`,
/// in the allocation `storage` (nullptr: no memory to share, e.g. empty or meta).
struct ByteRows {
  const void* storage = nullptr;
  uintptr_t begin = 0;
  int64_t rows = 0, width = 0, step = 0;
};

/// t's memory as `rows` rows of `width` elements, `stride` elements apart (from its first).
inline ByteRows byte_rows(const at::Tensor& t, int64_t rows, int64_t width, int64_t stride) {
  if (t.numel() == 0 || t.is_meta() || !t.has_storage()) return {};
  const int64_t elem = t.element_size();
  return {t.storage().unsafeGetStorageImpl(), reinterpret_cast<uintptr_t>(t.data_ptr()), rows,
          width * elem, stride * elem};
}

/// t as row_stride's [rows, last] view, rows `stride` elements apart.
inline ByteRows byte_rows(const at::Tensor& t, int64_t stride) {
  if (t.numel() == 0) return {};
  return byte_rows(t, t.numel() / t.size(-1), t.size(-1), stride);
}

/// Whether two ByteRows share a byte. Exact where both step the same number of bytes (slices
/// of one tensor's last dimension: q and k of a qkv projection do not overlap); else by their
/// byte ranges.
inline bool rows_overlap(ByteRows a, ByteRows b) {
  if (a.storage == nullptr || a.storage != b.storage) return false;
  if (a.rows == 1) a.step = b.rows == 1 ? std::max(a.width, b.width) : b.step;
  if (b.rows == 1) b.step = a.step;
  const int64_t delta = static_cast<int64_t>(b.begin - a.begin);
  if (a.step == b.step && a.step >= a.width && a.step >= b.width) {
    // Byte a0 + i S + x (x < a.width) meets b0 + j S + y (y < b.width) where (i - j) S =
    // delta + y - x: some k = i - j in [-(b.rows - 1), a.rows - 1] with k S in
    // [delta - a.width + 1, delta + b.width - 1].
    const int64_t step = a.step;
    auto floor_div = [](int64_t n, int64_t d) { return n >= 0 ? n / d : -((-n + d - 1) / d); };
    const int64_t lo = std::max(-floor_div(-(delta - a.width + 1), step), -(b.rows - 1));
    const int64_t hi = std::min(floor_div(delta + b.width - 1, step), a.rows - 1);
    return lo <= hi;
  }
  const int64_t a_end = (a.rows - 1) * a.step + a.width;
  const int64_t b_end = delta + (b.rows - 1) * b.step + b.width;
  return delta < a_end && 0 < b_end;
}

/// Rejects `out` sharing memory with `other` (rows_overlap), but for `in_place` ops the same
/// rows exactly (the same first element and row stride): where an op writes an element it has
/// read it first, from the same place.
inline void check_no_overlap(const char* op, const char* out_name, const at::Tensor& out,
                             int64_t out_stride, const char* other_name, const at::Tensor& other,
                             int64_t other_stride, bool in_place) {
  if (in_place && out.numel() > 0 && out.data_ptr() == other.data_ptr() &&
      (out_stride == other_stride || out.numel() == out.size(-1))) {
    return;
  }
  TORCH_CHECK(!rows_overlap(byte_rows(out, out_stride), byte_rows(other, other_stride)), op, ": ",
              out_name, " shares memory with ", other_name,
              in_place ? " other than as the same rows (in place)" : "",
              "; pass tensors that do not overlap");
}

#if defined(APHRODITE_BACKEND_GPU)
/// Turns a launch's error code into an exception that says what to do about it.
inline void check_launch(const char* op, gpuError_t err) {
  if (err == gpuSuccess) return;
#if !defined(USE_ROCM)
  TORCH_CHECK(err != cudaErrorNoKernelImageForDevice, op, ": the ", APHRODITE_FAMILY_NAME,
              " kernels were not built for this GPU (", APHRODITE_FAMILY_STATUS,
              "); rebuild with its arch in TORCH_CUDA_ARCH_LIST");
#endif
  TORCH_CHECK(false, op, ": kernel launch failed: ", gpuGetErrorString(err));
}

inline gpuStream_t current_stream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

namespace detail {

/// A boxed kernel that raises instead of computing, for ops this install cannot run.
class Unavailable final : public c10::OperatorKernel {
 public:
  explicit Unavailable(std::string why) : why_(std::move(why)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
    TORCH_CHECK(false, op.schema().name(),
                " is not available in this install of aphrodite_ext: ", why_);
  }

 private:
  std::string why_;
};

inline torch::CppFunction unavailable(std::string why) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Unavailable>(std::move(why)));
}

/// An op's fake (Meta) kernel runs when any of its tensors is on the meta device: under
/// tracing (FakeTensor, torch.compile, opcheck) all are. A real tensor beside a meta one is a
/// mistake that would otherwise return without computing anything.
inline void check_meta_call(const std::string& op, const at::Tensor& t) {
  TORCH_CHECK(!t.defined() || t.is_meta(), op, ": got a tensor on ", t.device(),
              " beside tensors on the meta device; pass every tensor on the device that "
              "computes (all on meta only to trace shapes)");
}

inline void check_meta_call(const std::string& op, const std::optional<at::Tensor>& t) {
  if (t.has_value()) check_meta_call(op, *t);
}

/// check_meta_call for each of `ts` (tensors and optional tensors).
template <typename... Ts>
void check_meta_calls(const std::string& op, const Ts&... ts) {
  (check_meta_call(op, ts), ...);
}

inline void check_meta_call(const std::string& op, const c10::IValue& v) {
  if (v.isTensor()) {
    check_meta_call(op, v.toTensor());
  } else if (v.isTensorList() || v.isList()) {
    for (const c10::IValue& e : v.toListRef()) check_meta_call(op, e);
  }
}

/// The fake kernel of an op that writes into caller-provided tensors and returns nothing:
/// tracing (FakeTensor, torch.compile, symbolic shapes) only needs it to consume its inputs.
inline void write_only_fake(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    check_meta_call(op.schema().name(), (*stack)[i]);
  }
  torch::jit::drop(*stack, n);
}

}  // namespace detail

/// Defines a family's op schemas. Where the family was not built, or for the device type this
/// backend does not serve, the op still exists and raises a sentence naming the reason. An op
/// that returns nothing gets its fake (Meta) kernel here; ops that return tensors register
/// their own.
class OpDefiner {
 public:
  explicit OpDefiner(torch::Library& lib) : lib_(lib) {}

  void def(const char* schema) {
    lib_.def(schema);
    std::string name(schema, std::string(schema).find('('));
#if defined(APHRODITE_BACKEND_GPU)
    constexpr auto kServed = c10::DispatchKey::CUDA;
    constexpr auto kOther = c10::DispatchKey::CPU;
    const char* other_why =
        "this install was built for the GPU backend and takes GPU tensors; "
        "for CPU tensors build with APHRODITE_TARGET_DEVICE=cpu";
#else
    constexpr auto kServed = c10::DispatchKey::CPU;
    constexpr auto kOther = c10::DispatchKey::CUDA;
    const char* other_why =
        "this install was built for the cpu backend and takes CPU tensors; "
        "for GPU tensors build with APHRODITE_TARGET_DEVICE=cuda or rocm";
#endif
    lib_.impl(name.c_str(), torch::dispatch(kOther, detail::unavailable(other_why)));
    if (std::string(schema).find("-> ()") != std::string::npos) {
      lib_.impl(
          name.c_str(),
          torch::dispatch(c10::DispatchKey::Meta,
                          torch::CppFunction::makeFromBoxedFunction<&detail::write_only_fake>()));
    }
    if (!APHRODITE_FAMILY_BUILT) {
      lib_.impl(
          name.c_str(),
          torch::dispatch(kServed, detail::unavailable(std::string("the ") + APHRODITE_FAMILY_NAME +
                                                       " family " + APHRODITE_FAMILY_STATUS)));
    }
  }

 private:
  torch::Library& lib_;
};

}  // namespace aphrodite

/// Schemas of a family's ops in module `ns`: APHRODITE_DEFINE_OPS(_C, ops) { ops.def("..."); }
#define APHRODITE_DEFINE_OPS(ns, ops)                                    \
  static void APHRODITE_DEFINE_OPS_BODY_##ns(aphrodite::OpDefiner& ops); \
  TORCH_LIBRARY_FRAGMENT(ns, lib) {                                      \
    aphrodite::OpDefiner definer(lib);                                   \
    APHRODITE_DEFINE_OPS_BODY_##ns(definer);                             \
  }                                                                      \
  static void APHRODITE_DEFINE_OPS_BODY_##ns(aphrodite::OpDefiner& ops)

#if defined(APHRODITE_BACKEND_GPU)
#define APHRODITE_DISPATCH_KEY CUDA
#else
#define APHRODITE_DISPATCH_KEY CPU
#endif

/// Registers a built family's kernels under this backend's dispatch key.
#define APHRODITE_IMPL_OPS(ns, m) TORCH_LIBRARY_IMPL(ns, APHRODITE_DISPATCH_KEY, m)

// Torch binding of the KV cache family: schemas, input checks and backend kernels of
// reshape_and_cache (paged layout), reshape_and_cache_flash, copy_blocks and swap_blocks.
// swap_blocks is a list of block copies between devices and is done here with the runtime's
// async copies on the current stream; the other ops call kernels (kernels/cache, kernels/cpu).
#include "cache/cache.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ops/empty.h>

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

cache::KvCacheDtype parse_kv_cache_dtype(const char* op, const std::string& name) {
  if (name == "auto") return cache::KvCacheDtype::kAuto;
  if (name == "fp8" || name == "fp8_e4m3") return cache::KvCacheDtype::kFp8E4M3;
  TORCH_CHECK(false, op, ": kv_cache_dtype must be \"auto\", \"fp8\" or \"fp8_e4m3\", got \"", name,
              "\"", name == "fp8_e5m2" ? " (E5M2 caches are not supported)" : "");
}

/// Whether every dimension but the first is laid out contiguously (one block is one range).
bool blocks_contiguous(const at::Tensor& t) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

/// The stride of dimension d, or `fallback` where the dimension has size 1 (its stride is then
/// arbitrary and never used).
int64_t stride_or(const at::Tensor& t, int64_t d, int64_t fallback) {
  return t.size(d) == 1 ? fallback : t.stride(d);
}

cache::ReshapeAndCacheProblem check_reshape_inputs(
    const char* op, cache::CacheLayout layout, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slot_mapping,
    const std::string& kv_cache_dtype, const at::Tensor& k_scale, const at::Tensor& v_scale) {
  const cache::KvCacheDtype cache_dtype = parse_kv_cache_dtype(op, kv_cache_dtype);
  TORCH_CHECK(key.dim() == 3, op, ": key must be [num_tokens, num_kv_heads, head_size], got ",
              key.sizes());
  TORCH_CHECK(value.sizes() == key.sizes(), op, ": value must have the shape of key ", key.sizes(),
              ", got ", value.sizes());
  const ScalarType dtype = kernel_dtype(op, "key", key);
  check_dtype(op, "value", value, key.scalar_type());
  check_last_dim_contiguous(op, "key", key);
  check_last_dim_contiguous(op, "value", value);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"value", value},
                                {"key_cache", key_cache},
                                {"value_cache", value_cache},
                                {"slot_mapping", slot_mapping}}) {
    check_same_device(op, name, t, key);
  }
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, op, ": slot_mapping must be int64, got ",
              slot_mapping.scalar_type());
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.is_contiguous(), op,
              ": slot_mapping must be a contiguous 1-D tensor, got sizes ", slot_mapping.sizes(),
              " strides ", slot_mapping.strides());
  TORCH_CHECK(slot_mapping.size(0) <= key.size(0), op, ": slot_mapping has ", slot_mapping.size(0),
              " slots but key only ", key.size(0), " tokens");
  if (cache_dtype == cache::KvCacheDtype::kAuto) {
    TORCH_CHECK(key_cache.scalar_type() == key.scalar_type() &&
                    value_cache.scalar_type() == key.scalar_type(),
                op, ": with kv_cache_dtype \"auto\" the caches must have key's dtype ",
                key.scalar_type(), ", got ", key_cache.scalar_type(), " and ",
                value_cache.scalar_type());
  } else {
#if defined(USE_ROCM)
    TORCH_CHECK(false, op, ": fp8 KV caches are not supported on ROCm by this build");
#endif
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"key_cache", key_cache},
                                  {"value_cache", value_cache}}) {
      TORCH_CHECK(t.scalar_type() == at::kByte || t.scalar_type() == at::kFloat8_e4m3fn, op,
                  ": with kv_cache_dtype \"", kv_cache_dtype, "\" ", name,
                  " must be uint8 or float8_e4m3fn, got ", t.scalar_type());
    }
    for (const auto& [name, t] :
         {std::pair<const char*, const at::Tensor&>{"k_scale", k_scale}, {"v_scale", v_scale}}) {
      TORCH_CHECK(t.scalar_type() == at::kFloat && t.numel() == 1, op, ": ", name,
                  " must be a one-element float32 tensor, got ", t.scalar_type(), " of shape ",
                  t.sizes());
      check_same_device(op, name, t, key);
    }
  }

  const int64_t num_kv_heads = key.size(1), head_size = key.size(2);
#if defined(APHRODITE_BACKEND_GPU)
  // The GPU kernel's grid has a block row per kv head (at most 65535) and 32-bit item counts.
  TORCH_CHECK(num_kv_heads <= 65535 && head_size <= (int64_t{1} << 20), op,
              ": at most 65535 kv heads and a head_size of 2^20 on the GPU, got ", num_kv_heads,
              " and ", head_size);
#endif
  cache::ReshapeAndCacheProblem p{};
  p.key = key.data_ptr();
  p.value = value.data_ptr();
  p.key_cache = key_cache.data_ptr();
  p.value_cache = value_cache.data_ptr();
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  if (cache_dtype != cache::KvCacheDtype::kAuto) {
    p.k_scale = k_scale.data_ptr<float>();
    p.v_scale = v_scale.data_ptr<float>();
  }
  p.num_tokens = slot_mapping.size(0);
  p.num_kv_heads = num_kv_heads;
  p.head_size = head_size;
  p.key_token_stride = key.stride(0);
  p.key_head_stride = key.stride(1);
  p.value_token_stride = value.stride(0);
  p.value_head_stride = value.stride(1);
  p.layout = layout;
  p.dtype = dtype;
  p.cache_dtype = cache_dtype;

  if (layout == cache::CacheLayout::kPaged) {
    const int64_t x = cache::paged_key_chunk(cache_dtype, dtype);
    TORCH_CHECK(head_size % x == 0, op, ": head_size ", head_size, " must be a multiple of x = ", x,
                " (16 bytes of cache) in the paged layout");
    TORCH_CHECK(key_cache.dim() == 5 && value_cache.dim() == 4, op,
                ": the paged layout takes key_cache [num_blocks, num_kv_heads, head_size / x, "
                "block_size, x] and value_cache [num_blocks, num_kv_heads, head_size, "
                "block_size], got ",
                key_cache.sizes(), " and ", value_cache.sizes());
    const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(3);
    TORCH_CHECK(block_size > 0, op, ": block_size (dimension 3 of key_cache ", key_cache.sizes(),
                ") must be positive");
    TORCH_CHECK(key_cache.size(1) == num_kv_heads && key_cache.size(2) == head_size / x &&
                    key_cache.size(4) == x,
                op, ": key_cache must be [num_blocks, ", num_kv_heads, ", ", head_size / x,
                ", block_size, ", x, "] for key ", key.sizes(), " (x = ", x, " for a ",
                key_cache.scalar_type(), " cache), got ", key_cache.sizes());
    TORCH_CHECK(value_cache.size(0) == num_blocks && value_cache.size(1) == num_kv_heads &&
                    value_cache.size(2) == head_size && value_cache.size(3) == block_size,
                op, ": value_cache must be [", num_blocks, ", ", num_kv_heads, ", ", head_size,
                ", ", block_size, "] to match key_cache ", key_cache.sizes(), ", got ",
                value_cache.sizes());
    TORCH_CHECK(stride_or(key_cache, 4, 1) == 1 && stride_or(key_cache, 3, x) == x &&
                    stride_or(key_cache, 2, block_size * x) == block_size * x,
                op, ": key_cache must be contiguous within each head, got strides ",
                key_cache.strides());
    TORCH_CHECK(
        stride_or(value_cache, 3, 1) == 1 && stride_or(value_cache, 2, block_size) == block_size,
        op, ": value_cache must be contiguous within each head, got strides ",
        value_cache.strides());
    p.block_size = block_size;
    p.num_slots = num_blocks * block_size;
    p.key_cache_block_stride = key_cache.stride(0);
    p.key_cache_head_stride = key_cache.stride(1);
    p.value_cache_block_stride = value_cache.stride(0);
    p.value_cache_head_stride = value_cache.stride(1);
  } else {
    TORCH_CHECK(key_cache.dim() == 4, op,
                ": the flash layout takes caches [num_blocks, block_size, num_kv_heads, "
                "head_size], got key_cache ",
                key_cache.sizes());
    TORCH_CHECK(key_cache.size(2) == num_kv_heads && key_cache.size(3) == head_size, op,
                ": key_cache must be [num_blocks, block_size, ", num_kv_heads, ", ", head_size,
                "] for key ", key.sizes(), ", got ", key_cache.sizes());
    TORCH_CHECK(value_cache.sizes() == key_cache.sizes(), op,
                ": value_cache must have the shape of key_cache ", key_cache.sizes(), ", got ",
                value_cache.sizes());
    TORCH_CHECK(key_cache.size(1) > 0, op, ": block_size (dimension 1 of key_cache ",
                key_cache.sizes(), ") must be positive");
    check_last_dim_contiguous(op, "key_cache", key_cache);
    check_last_dim_contiguous(op, "value_cache", value_cache);
    p.block_size = key_cache.size(1);
    p.num_slots = key_cache.size(0) * key_cache.size(1);
    p.key_cache_block_stride = key_cache.stride(0);
    p.key_cache_slot_stride = key_cache.stride(1);
    p.key_cache_head_stride = key_cache.stride(2);
    p.value_cache_block_stride = value_cache.stride(0);
    p.value_cache_slot_stride = value_cache.stride(1);
    p.value_cache_head_stride = value_cache.stride(2);
  }
  // Views of one kv tensor ([2, ...] or [num_blocks, 2, ...]) are fine; the same memory twice
  // would have the values overwrite the keys.
  TORCH_CHECK(key_cache.numel() == 0 || key_cache.data_ptr() != value_cache.data_ptr(), op,
              ": key_cache and value_cache are the same memory; pass the key and value halves "
              "of the cache");
  return p;
}

void run_reshape_and_cache(const char* op, cache::CacheLayout layout, const at::Tensor& key,
                           const at::Tensor& value, at::Tensor& key_cache, at::Tensor& value_cache,
                           const at::Tensor& slot_mapping, const std::string& kv_cache_dtype,
                           const at::Tensor& k_scale, const at::Tensor& v_scale) {
  const cache::ReshapeAndCacheProblem p =
      check_reshape_inputs(op, layout, key, value, key_cache, value_cache, slot_mapping,
                           kv_cache_dtype, k_scale, v_scale);
  if (p.num_tokens == 0 || p.num_kv_heads == 0 || p.head_size == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  const int64_t max_slot = slot_mapping.narrow(0, 0, p.num_tokens).max().item<int64_t>();
  TORCH_CHECK(max_slot < p.num_slots, op, ": slot_mapping holds slot ", max_slot,
              " but the caches have only ", p.num_slots, " (num_blocks * block_size)");
  const int64_t grain = std::max<int64_t>(1, 16384 / (p.num_kv_heads * p.head_size));
  at::parallel_for(0, p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(reshape_and_cache, p, begin, end);
  });
#else
  const c10::cuda::OptionalCUDAGuard guard(key.device());
  check_launch(op, cache::launch_reshape_and_cache(p, current_stream(key)));
#endif
#endif
}

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping,
                       const std::string& kv_cache_dtype, const at::Tensor& k_scale,
                       const at::Tensor& v_scale) {
  run_reshape_and_cache("reshape_and_cache", cache::CacheLayout::kPaged, key, value, key_cache,
                        value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale);
}

void reshape_and_cache_flash(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                             at::Tensor& value_cache, const at::Tensor& slot_mapping,
                             const std::string& kv_cache_dtype, const at::Tensor& k_scale,
                             const at::Tensor& v_scale) {
  run_reshape_and_cache("reshape_and_cache_flash", cache::CacheLayout::kFlash, key, value,
                        key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale);
}

/// Checks an int64 [num_pairs, 2] block mapping; where it is on the CPU, also that its blocks
/// exist (src < src_blocks, dst < dst_blocks), that no block is written twice (the copies run
/// concurrently), and, where `in_one_cache` (source and destination blocks are the same
/// memory), that no block written is read by another row.
void check_block_mapping(const char* op, const at::Tensor& mapping, int64_t src_blocks,
                         int64_t dst_blocks, bool in_one_cache) {
  TORCH_CHECK(mapping.scalar_type() == at::kLong, op, ": block_mapping must be int64, got ",
              mapping.scalar_type());
  TORCH_CHECK(mapping.dim() == 2 && mapping.size(1) == 2 && mapping.is_contiguous(), op,
              ": block_mapping must be a contiguous [num_pairs, 2] tensor of (src, dst), got "
              "sizes ",
              mapping.sizes(), " strides ", mapping.strides());
  if (!mapping.is_cpu() || mapping.size(0) == 0) return;
  const int64_t* m = mapping.data_ptr<int64_t>();
  for (int64_t i = 0; i < mapping.size(0); ++i) {
    TORCH_CHECK(
        m[2 * i] >= 0 && m[2 * i] < src_blocks && m[2 * i + 1] >= 0 && m[2 * i + 1] < dst_blocks,
        op, ": block_mapping row ", i, " (", m[2 * i], ", ", m[2 * i + 1],
        ") names a block outside [0, ", src_blocks, ") -> [0, ", dst_blocks, ")");
  }
  std::vector<int64_t> dsts(static_cast<size_t>(mapping.size(0)));
  for (int64_t i = 0; i < mapping.size(0); ++i) dsts[i] = m[2 * i + 1];
  std::sort(dsts.begin(), dsts.end());
  const auto twice = std::adjacent_find(dsts.begin(), dsts.end());
  TORCH_CHECK(twice == dsts.end(), op, ": block_mapping writes block ",
              twice == dsts.end() ? 0 : *twice,
              " more than once; each destination block may appear once");
  if (!in_one_cache) return;
  for (int64_t i = 0; i < mapping.size(0); ++i) {
    TORCH_CHECK(m[2 * i] == m[2 * i + 1] || !std::binary_search(dsts.begin(), dsts.end(), m[2 * i]),
                op, ": block_mapping row ", i, " reads block ", m[2 * i],
                ", which another row writes; the copies run concurrently, so a block may be a "
                "source or a destination, not both (copy in two calls)");
  }
}

/// The largest power of two <= 16 dividing every value.
int common_alignment(std::initializer_list<int64_t> values) {
  int64_t a = 16;
  for (int64_t v : values) {
    while (a > 1 && v % a != 0) a /= 2;
  }
  return static_cast<int>(a);
}

void copy_blocks(const std::vector<at::Tensor>& key_caches,
                 const std::vector<at::Tensor>& value_caches, const at::Tensor& block_mapping) {
  const char* op = "copy_blocks";
  TORCH_CHECK(key_caches.size() == value_caches.size(), op, ": got ", key_caches.size(),
              " key caches but ", value_caches.size(), " value caches (one of each per layer)");
  const int64_t num_layers = static_cast<int64_t>(key_caches.size());
  if (num_layers == 0) {
    check_block_mapping(op, block_mapping, 0, 0, /*in_one_cache=*/true);
    return;
  }
  const at::Tensor& k0 = key_caches[0];
  const at::Tensor& v0 = value_caches[0];
  int64_t num_blocks = std::min(k0.dim() > 0 ? k0.size(0) : 0, v0.dim() > 0 ? v0.size(0) : 0);
  for (int64_t l = 0; l < num_layers; ++l) {
    for (const auto& [name, t, first] :
         {std::tuple<const char*, const at::Tensor&, const at::Tensor&>{"key_caches", key_caches[l],
                                                                        k0},
          {"value_caches", value_caches[l], v0}}) {
      check_same_device(op, name, t, k0);
      TORCH_CHECK(t.dim() >= 1, op, ": ", name, "[", l, "] must have a block dimension");
      TORCH_CHECK(t.sizes() == first.sizes() && t.strides() == first.strides() &&
                      t.scalar_type() == first.scalar_type(),
                  op, ": every tensor of ", name, " must match ", name, "[0] (",
                  first.scalar_type(), " ", first.sizes(), " strides ", first.strides(), "), got ",
                  t.scalar_type(), " ", t.sizes(), " strides ", t.strides(), " at layer ", l);
      TORCH_CHECK(blocks_contiguous(t), op, ": each block of ", name, "[", l,
                  "] must be contiguous, got strides ", t.strides());
    }
  }
  check_block_mapping(op, block_mapping, num_blocks, num_blocks, /*in_one_cache=*/true);
  const int64_t num_pairs = block_mapping.size(0);
  if (num_pairs == 0) return;

  cache::CopyBlocksProblem p{};
  p.num_layers = num_layers;
  p.num_pairs = num_pairs;
  p.key_block_bytes = k0.numel() / k0.size(0) * k0.element_size();
  p.key_block_stride_bytes = k0.stride(0) * k0.element_size();
  p.value_block_bytes = v0.numel() / v0.size(0) * v0.element_size();
  p.value_block_stride_bytes = v0.stride(0) * v0.element_size();
  // Base pointers: keys of every layer, then values.
  at::Tensor pointers = at::empty({2 * num_layers}, at::TensorOptions().dtype(at::kLong));
  int64_t* ptr = pointers.data_ptr<int64_t>();
  int64_t align_bits = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    ptr[l] = reinterpret_cast<int64_t>(key_caches[l].data_ptr());
    ptr[num_layers + l] = reinterpret_cast<int64_t>(value_caches[l].data_ptr());
    align_bits |= ptr[l] | ptr[num_layers + l];
  }
  p.alignment = common_alignment({align_bits, p.key_block_bytes, p.key_block_stride_bytes,
                                  p.value_block_bytes, p.value_block_stride_bytes});
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  check_same_device(op, "block_mapping", block_mapping, k0);
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  p.key_caches = reinterpret_cast<void* const*>(ptr);
  p.value_caches = reinterpret_cast<void* const*>(ptr + num_layers);
  p.block_mapping = block_mapping.data_ptr<int64_t>();
  at::parallel_for(0, 2 * num_layers * num_pairs, 1, [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(copy_blocks, p, begin, end);
  });
#else
  TORCH_CHECK(k0.is_cuda(), op, ": the caches must be on the GPU, got ", k0.device());
  TORCH_CHECK(num_layers <= 65535, op, ": at most 65535 layers a call on the GPU, got ",
              num_layers);
  TORCH_CHECK(block_mapping.is_cpu() || block_mapping.device() == k0.device(), op,
              ": block_mapping must be on the CPU or on the caches' device ", k0.device(), ", got ",
              block_mapping.device());
  const c10::cuda::OptionalCUDAGuard guard(k0.device());
  const at::Tensor device_pointers = pointers.to(k0.device());
  const at::Tensor device_mapping = block_mapping.to(k0.device());
  p.key_caches = reinterpret_cast<void* const*>(device_pointers.data_ptr<int64_t>());
  p.value_caches = reinterpret_cast<void* const*>(device_pointers.data_ptr<int64_t>() + num_layers);
  p.block_mapping = device_mapping.data_ptr<int64_t>();
  check_launch(op, cache::launch_copy_blocks(p, current_stream(k0)));
#endif
#endif
}

void swap_blocks(const at::Tensor& src, at::Tensor& dst, const at::Tensor& block_mapping) {
  const char* op = "swap_blocks";
  TORCH_CHECK(src.dim() >= 1 && dst.dim() >= 1, op, ": src and dst must have a block dimension");
  TORCH_CHECK(src.scalar_type() == dst.scalar_type(), op, ": dst must be ", src.scalar_type(),
              " like src, got ", dst.scalar_type());
  TORCH_CHECK(src.sizes().slice(1) == dst.sizes().slice(1), op,
              ": src and dst blocks must have one shape, got ", src.sizes(), " and ", dst.sizes());
  TORCH_CHECK(blocks_contiguous(src) && blocks_contiguous(dst), op,
              ": each block of src and dst must be contiguous, got strides ", src.strides(),
              " and ", dst.strides());
  TORCH_CHECK(block_mapping.is_cpu(), op, ": block_mapping must be on the CPU, got ",
              block_mapping.device());
  check_block_mapping(op, block_mapping, src.size(0), dst.size(0),
                      /*in_one_cache=*/src.numel() > 0 && dst.numel() > 0 &&
                          src.storage().is_alias_of(dst.storage()));
  const int64_t num_pairs = block_mapping.size(0);
  const int64_t elem = src.element_size();
  const int64_t block_bytes = src.size(0) == 0 ? 0 : src.numel() / src.size(0) * elem;
  if (num_pairs == 0 || block_bytes == 0) return;
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(dst.data_ptr());
  const int64_t src_stride = src.stride(0) * elem, dst_stride = dst.stride(0) * elem;
  const int64_t* m = block_mapping.data_ptr<int64_t>();
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  TORCH_CHECK(src.is_cpu() && dst.is_cpu(), op, ": src and dst must be CPU tensors here, got ",
              src.device(), " and ", dst.device());
  at::parallel_for(0, num_pairs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(to + m[2 * i + 1] * dst_stride, from + m[2 * i] * src_stride, block_bytes);
    }
  });
#else
  TORCH_CHECK(src.is_cuda() || dst.is_cuda(), op, ": src or dst must be on the GPU, got ",
              src.device(), " and ", dst.device());
  TORCH_CHECK(src.is_cpu() || dst.is_cpu() || src.device() == dst.device(), op,
              ": src and dst on two GPUs (", src.device(), ", ", dst.device(),
              ") are not supported");
  TORCH_CHECK((src.is_cuda() || src.is_cpu()) && (dst.is_cuda() || dst.is_cpu()), op,
              ": src and dst must be on the GPU or the CPU, got ", src.device(), " and ",
              dst.device());
#if defined(USE_ROCM)
  const auto kind = !src.is_cuda()  ? hipMemcpyHostToDevice
                    : dst.is_cuda() ? hipMemcpyDeviceToDevice
                                    : hipMemcpyDeviceToHost;
#else
  const auto kind = !src.is_cuda()  ? cudaMemcpyHostToDevice
                    : dst.is_cuda() ? cudaMemcpyDeviceToDevice
                                    : cudaMemcpyDeviceToHost;
#endif
  const at::Device device = src.is_cuda() ? src.device() : dst.device();
  const c10::cuda::OptionalCUDAGuard guard(device);
  const gpuStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  for (int64_t i = 0; i < num_pairs; ++i) {
#if defined(USE_ROCM)
    const gpuError_t err = hipMemcpyAsync(to + m[2 * i + 1] * dst_stride,
                                          from + m[2 * i] * src_stride, block_bytes, kind, stream);
#else
    const gpuError_t err = cudaMemcpyAsync(to + m[2 * i + 1] * dst_stride,
                                           from + m[2 * i] * src_stride, block_bytes, kind, stream);
#endif
    TORCH_CHECK(err == gpuSuccess, op, ": copying block ", m[2 * i], " to block ", m[2 * i + 1],
                " failed: ", gpuGetErrorString(err));
  }
#endif
#endif
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_C, ops) {
  ops.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, "
      "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()");
  ops.def(
      "reshape_and_cache_flash(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, "
      "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()");
  ops.def(
      "copy_blocks(Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor block_mapping) -> "
      "()");
  ops.def("swap_blocks(Tensor src, Tensor! dst, Tensor block_mapping) -> ()");
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_C, m) {
  m.impl("reshape_and_cache", &aphrodite::reshape_and_cache);
  m.impl("reshape_and_cache_flash", &aphrodite::reshape_and_cache_flash);
  m.impl("copy_blocks", &aphrodite::copy_blocks);
  m.impl("swap_blocks", &aphrodite::swap_blocks);
}
#endif

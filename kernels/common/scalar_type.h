// Element types shared by every backend's kernel entry points. Torch-free.
#pragma once

#include <cstdint>

namespace aphrodite {

/// The floating-point element types a kernel may be asked to handle.
enum class ScalarType : int8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline const char* to_string(ScalarType t) {
  switch (t) {
    case ScalarType::kFloat32: return "float32";
    case ScalarType::kFloat16: return "float16";
    case ScalarType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

}  // namespace aphrodite

// Picks, once per process, which ISA build of the CPU kernels runs: the best one that this
// module holds and the running CPU supports, or the one APHRODITE_CPU_ISA names. The build
// machine's CPU plays no part. Torch-free.
//
// CMake defines APHRODITE_CPU_HAS_<ISA>=1 for each ISA build linked into the module.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu/cpu_kernels.h"

namespace aphrodite::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

inline const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

/// Whether this module holds the ISA's build and the running CPU can execute it.
inline bool isa_usable(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2:
#if defined(APHRODITE_CPU_HAS_AVX2) && (defined(__x86_64__) || defined(__i386__))
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case Isa::kAvx512:
#if defined(APHRODITE_CPU_HAS_AVX512) && (defined(__x86_64__) || defined(__i386__))
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
      return false;
#endif
  }
  return false;
}

/// The outcome of choosing: the ISA, or why the requested one cannot run here.
struct IsaChoice {
  Isa isa;
  std::string error;  ///< empty when `isa` is usable
};

inline IsaChoice choose_isa(const char* requested) {
  if (requested != nullptr && *requested != '\0') {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (std::strcmp(requested, to_string(isa)) != 0) continue;
      if (isa_usable(isa)) return {isa, ""};
      return {Isa::kScalar, std::string("APHRODITE_CPU_ISA=") + requested +
                                " cannot run here: this module was not built with it or this "
                                "CPU lacks it"};
    }
    return {Isa::kScalar, std::string("APHRODITE_CPU_ISA=") + requested +
                              " is not an ISA; valid values: scalar, avx2, avx512"};
  }
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    if (isa_usable(isa)) return {isa, ""};
  }
  return {Isa::kScalar, ""};
}

/// The choice made at first use, for the life of the process.
inline const IsaChoice& active_isa() {
  static const IsaChoice choice = choose_isa(std::getenv("APHRODITE_CPU_ISA"));
  return choice;
}

}  // namespace aphrodite::cpu

/// Calls the active ISA's build of kernel `fn`: APHRODITE_CPU_CALL(rms_norm, p, begin, end).
#if defined(APHRODITE_CPU_HAS_AVX512)
#define APHRODITE_CPU_CASE_AVX512(fn, ...) \
  case ::aphrodite::cpu::Isa::kAvx512: return ::aphrodite::cpu::avx512::fn(__VA_ARGS__);
#else
#define APHRODITE_CPU_CASE_AVX512(fn, ...)
#endif
#if defined(APHRODITE_CPU_HAS_AVX2)
#define APHRODITE_CPU_CASE_AVX2(fn, ...) \
  case ::aphrodite::cpu::Isa::kAvx2: return ::aphrodite::cpu::avx2::fn(__VA_ARGS__);
#else
#define APHRODITE_CPU_CASE_AVX2(fn, ...)
#endif
#define APHRODITE_CPU_CALL(fn, ...)                              \
  [&]() {                                                        \
    switch (::aphrodite::cpu::active_isa().isa) {                \
      APHRODITE_CPU_CASE_AVX512(fn, __VA_ARGS__)                 \
      APHRODITE_CPU_CASE_AVX2(fn, __VA_ARGS__)                   \
      default: return ::aphrodite::cpu::scalar::fn(__VA_ARGS__); \
    }                                                            \
  }()

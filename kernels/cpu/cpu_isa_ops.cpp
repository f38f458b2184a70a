// `<module>::cpu_isa() -> str`: which ISA build of the CPU kernels this process runs, or why
// the requested one cannot run. Linked into every CPU module; `python -m aphrodite_ext info`
// reports it.
#include <torch/library.h>

#include "cpu/cpu_isa.h"

namespace {
std::string cpu_isa() {
  const auto& choice = aphrodite::cpu::active_isa();
  return choice.error.empty() ? aphrodite::cpu::to_string(choice.isa) : "error: " + choice.error;
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(APHRODITE_MODULE_NAME, m) { m.def("cpu_isa() -> str", &cpu_isa); }

// A value that a launcher works out once per device and keeps (SM counts, occupancy, whether a
// kernel's code has a PDL prologue): asked on every call, looked up after the first. Host code;
// torch-free.
#pragma once

#include <atomic>

namespace aphrodite {

/// One int a device, kept for devices 0..63 (others ask every time). `get(device, compute)`
/// returns the kept value, else compute()'s, which it keeps unless it is 0: 0 means "could not
/// say", and the next call asks again. Threads racing on a first call may each compute; they
/// store the same value.
class PerDevice {
 public:
  template <typename Compute>
  int get(int device, Compute compute) {
    const bool keep = device >= 0 && device < kMaxDevices;
    if (keep) {
      const int known = values_[device].load(std::memory_order_relaxed);
      if (known != 0) return known;
    }
    const int value = compute();
    if (keep && value != 0) values_[device].store(value, std::memory_order_relaxed);
    return value;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<int> values_[kMaxDevices] = {};
};

}  // namespace aphrodite

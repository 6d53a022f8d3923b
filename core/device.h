// core/device.h: where a tensor lives: the CPU or one CUDA device by index ("cpu", "cuda:1").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

inline constexpr int kMaxCudaDevices = 4096;  // device indices are 0 .. kMaxCudaDevices - 1
[[noreturn]] void throw_bad_cuda_index(int index);  // an Error naming the index (core/core.cpp)

struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;  // always 0 for the CPU

  static constexpr Device cpu() { return {DeviceType::CPU, 0}; }
  // An index outside 0 .. 4095 is an Error (70000 was cut to cuda:4464).
  static constexpr Device cuda(int index = 0) {
    if (index < 0 || index >= kMaxCudaDevices) throw_bad_cuda_index(index);
    return {DeviceType::CUDA, static_cast<int16_t>(index)};
  }
  // "cpu" (or "cpu:0"), "cuda", "cuda:3" (no sign, no leading zero); anything else is an Error.
  static Device parse(std::string_view text);

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu" or "cuda:N"

  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

}  // namespace kiln

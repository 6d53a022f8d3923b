// core/device.h: where a tensor lives: the CPU or one CUDA device by index ("cpu", "cuda:1").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;  // always 0 for the CPU

  static constexpr Device cpu() { return {DeviceType::CPU, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::CUDA, static_cast<int16_t>(index)}; }
  // "cpu", "cuda", "cuda:3"; anything else is an Error.
  static Device parse(std::string_view text);

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu" or "cuda:N"

  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

}  // namespace kiln

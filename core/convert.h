// core/convert.h: one element converted between dtypes, as PyTorch converts; the CPU and CUDA
// backends both use it. 16-bit floats go through float; to bool is "nonzero"; float to integer
// truncates toward zero; float to uint8 or int8 goes through int64 and wraps (-1.0 -> 255), as
// PyTorch's CPU backend does, where a direct conversion of an out-of-range value is undefined.
#pragma once

#include <type_traits>

#include "core/dtype.h"

namespace kiln {

template <typename To, typename From>
KILN_HOST_DEVICE inline To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<opmath_t<From>>(x) != 0;
  } else if constexpr (std::is_same_v<From, bool>) {
    return static_cast<To>(static_cast<opmath_t<To>>(x ? 1 : 0));
  } else if constexpr (std::is_integral_v<To> && sizeof(To) == 1 && !std::is_integral_v<From>) {
    return static_cast<To>(static_cast<int64_t>(static_cast<opmath_t<From>>(x)));
  } else {
    return static_cast<To>(static_cast<opmath_t<To>>(static_cast<opmath_t<From>>(x)));
  }
}

}  // namespace kiln

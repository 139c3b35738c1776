// One element of a parameter as the optimizer sees it (a 16-bit weight plus
// its error-correction byte when error correction is on) and its write-back
// with the parameter's rounding: the element-wise form of codec.cpp's
// load_param_tile / store_param_tile, for the element-wise 1-bit Adam passes
// of the CPU engine and the CUDA kernels.
#pragma once
#include <cstdint>

#include "float16.hpp"
#include "hd.hpp"
#include "lowbit.h"
#include "rounding.hpp"

namespace lowbit {

// Element i of a tensor of `dtype` as fp32.
LOWBIT_HD float load_element(const void* data, lowbit_dtype_t dtype, int64_t i) {
  if (dtype == LOWBIT_DTYPE_FLOAT32) return static_cast<const float*>(data)[i];
  const uint16_t h = static_cast<const uint16_t*>(data)[i];
  return dtype == LOWBIT_DTYPE_BFLOAT16 ? bf16_to_float(h) : fp16_to_float(h);
}

// `rounding` is a lowbit_rounding_t (ignored for fp32 params).
LOWBIT_HD float load_param_element(const void* param, lowbit_dtype_t dtype, int32_t rounding, const uint8_t* ecc,
                                   int64_t i) {
  if (dtype == LOWBIT_DTYPE_FLOAT32 || rounding != LOWBIT_ROUNDING_ERROR_CORRECTION)
    return load_element(param, dtype, i);
  const uint16_t h = static_cast<const uint16_t*>(param)[i];
  return dtype == LOWBIT_DTYPE_BFLOAT16 ? bf16_ecc_to_float(h, ecc[i]) : fp16_ecc_to_float(h, ecc[i]);
}

LOWBIT_HD void store_param_element(void* param, lowbit_dtype_t dtype, int32_t rounding, uint8_t* ecc, uint64_t key,
                                   int64_t i, float x) {
  if (dtype == LOWBIT_DTYPE_FLOAT32) {
    static_cast<float*>(param)[i] = x;
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(param) + i;
  const bool bf16 = dtype == LOWBIT_DTYPE_BFLOAT16;
  if (rounding == LOWBIT_ROUNDING_STOCHASTIC) {
    const uint32_t bits = random_bits(key, uint64_t(i));
    *h = bf16 ? float_to_bf16_sr(x, bits) : float_to_fp16_sr(x, bits);
  } else if (rounding == LOWBIT_ROUNDING_ERROR_CORRECTION) {
    if (bf16)
      float_to_bf16_ecc(x, *h, ecc[i]);
    else
      float_to_fp16_ecc(x, *h, ecc[i]);
  } else {
    *h = bf16 ? float_to_bf16(x) : float_to_fp16(x);
  }
}

}  // namespace lowbit

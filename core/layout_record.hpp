// The JAX state's per-parameter layout record (StepControl::layout), checked
// by the CPU engine and on the device by the CUDA engine against how each
// parameter is bound.
#pragma once
#include <cstdint>

#include "hd.hpp"
#include "shape.hpp"

namespace lowbit {

// The layout record of one bound parameter (the JAX state's `layout` row):
//   0, 1: lowbit_state_format_t of moment 0, 1 (0: no such moment)
//   2:    lowbit_rounding_t
//   3, 4: lowbit_normalization_t of moment 0, 1 (0: no such moment)
//   5:    ndim of the bound shape (0: flat)
//   6..13: its dims as int32 (0 past ndim)
// The JAX handlers bind a shape only to parameters with a RANK1 or FACTORED
// moment (the CUDA engine's tables keep it only for those), so the record of
// every other parameter has ndim 0; such shapes have dims <= INT32_MAX.
constexpr int kLayoutColumns = 6 + kMaxDims;

template <class Rec>
LOWBIT_HD bool layout_matches(const int32_t* rec, int num_moments, const Rec& formats, const Rec& norms,
                              int32_t rounding, const Shape& shape) {
  bool ok = rec[2] == rounding && rec[5] == shape.ndim;
  for (int m = 0; m < 2; ++m) {
    ok = ok && rec[m] == (m < num_moments ? int32_t(formats[m]) : 0);
    ok = ok && rec[3 + m] == (m < num_moments ? int32_t(norms[m]) + 1 : 0);  // Norm -> lowbit_normalization_t
  }
  for (int k = 0; k < kMaxDims; ++k) ok = ok && rec[6 + k] == (k < shape.ndim ? int32_t(shape.dim[k]) : 0);
  return ok;
}

}  // namespace lowbit

// The order in which the 1-bit allreduce accumulates its sums of squares (in
// double), fixed so that the host (host_kernels.cpp) and the device
// (cuda_kernels.cuh) add the same numbers in the same order and give the
// same bits, whatever the number of threads or blocks:
//
//  - the elements 0 .. count-1 are cut into segments of kSegment elements,
//    each segment into kRounds rounds of kLanes = 2048 elements; element j of
//    a segment goes to lane j % 2048;
//  - lane l starts at +0.0 and adds v*v (v widened to double) for its
//    elements in increasing order (kRounds at most);
//  - the segment's sum folds its 2048 lanes: fold8 over each group of 8
//    neighbouring lanes (8c .. 8c+7, c = 0..255), then tree256 over the 256
//    results;
//  - segment s goes to accumulator s % 256 (started at +0.0, segments in
//    increasing order); the total is tree256 over the 256 accumulators.
//
// On the device, thread c of the block of a segment owns lanes 8c .. 8c+7
// (the 8 consecutive elements it loads, or decodes from one byte, per round)
// and the block reduction is tree256; thread c of the finishing block owns
// accumulator c. Missing elements (past count) add nothing, and x + 0.0 == x,
// so the tail of the last segment and empty accumulators change nothing.
#pragma once
#include <cstdint>

#include "core/hd.hpp"

namespace lowbit {
namespace onebit {
namespace sumsq {

constexpr int kLanes = 2048;  // = 256 threads x 8 elements
constexpr int kRounds = 4;
constexpr int64_t kSegment = int64_t(kLanes) * kRounds;
constexpr int kTree = 256;  // threads of a block; accumulators of the total

// Segments of `count` elements (0 for count == 0).
LOWBIT_HD int64_t segments(int64_t count) { return (count + kSegment - 1) / kSegment; }

// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
LOWBIT_HD double fold8(const double* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// tree256 (host form): for h = 128, 64, ..., 1: t[i] += t[i + h] for i < h.
// Returns t[0]; t is overwritten.
inline double tree256(double* t) {
  for (int h = kTree / 2; h > 0; h >>= 1)
    for (int i = 0; i < h; ++i) t[i] += t[i + h];
  return t[0];
}

}  // namespace sumsq
}  // namespace onebit
}  // namespace lowbit

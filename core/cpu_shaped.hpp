// Pass 1 of the shaped parameters on the CPU (rank-1 and factored moments,
// core/shape.hpp), around the fused step: the statistics of the new moments
// (rank-1 maxima per dim, factored row and column means), the factored
// accumulators between the passes, and the rank-1 vectors after pass 2.
#pragma once
#include <cstdint>
#include <vector>

#include "engine.hpp"

namespace lowbit {

// Work of pass 1: rows [a, b) of a parameter (kind 0), or columns [c0, c1) of
// batch `batch` over the rows of column chunk `chunk` (kind 1). A parameter
// without a factored moment has row items only (they also take the rank-1
// column maxima); with one, the column items take the rank-1 first moment's
// column maxima too.
struct StatItem {
  int32_t param, kind;
  int64_t a, b, batch, chunk;
};

class CpuShapedPass {
 public:
  // The work items of the shaped params among `params` (at bind()).
  void build(const std::vector<ParamView>& params, int num_threads);
  bool empty() const { return items_.empty(); }
  // Pass 1 and the factored accumulators, for the params with a gradient.
  void before_step(Algo algo, const std::vector<ParamView>& params, const std::vector<GradView>& grads,
                   const std::vector<StepScalars>& scalars, int num_threads, bool parallel);
  // After pass 2: the new rank-1 vectors move in.
  void after_step(const std::vector<ParamView>& params, const std::vector<GradView>& grads) const;

 private:
  std::vector<StatItem> items_;
  std::vector<size_t> shaped_;
  std::vector<int64_t> partial_off_;
  std::vector<double> partials_;
  // Per thread, 2 * colmax_cols_ column maxima of a rank-1 row item.
  std::vector<uint32_t> colmax_;
  int64_t colmax_cols_ = 0;
};

}  // namespace lowbit

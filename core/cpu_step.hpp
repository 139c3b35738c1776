// The CPU engine's per-chunk work of the fused step (cpu_step.cpp) and what
// its shaped pass 1 (cpu_shaped.cpp) shares with it.
#pragma once
#include <cstdint>

#include "engine.hpp"

namespace lowbit {

// fp32 working arrays of one tile.
struct alignas(64) Tile {
  float p[kTile], g[kTile], m[kTile], v[kTile];
};

inline bool shaped_moment(const ParamView& pv, int k) {
  return k < pv.num_moments && pv.moment[k].norm != Norm::Block;
}

// One step of `algo` over chunk c of a parameter (its scalars s and rounding
// key of this step): fp32 tensors are updated where they lie, the others go
// through a tile's fp32 arrays. out: where the new values go instead of the
// param (StepControl::flat_out at the param's offset), or null.
void step_chunk(Algo algo, const ParamView& pv, const GradView& grad, const StepScalars& s, uint64_t key,
                const Chunk& c, float* out = nullptr);

// Whether chunk c of a gradient holds a NaN or Inf.
bool chunk_has_nonfinite(const GradView& grad, const Chunk& c);

}  // namespace lowbit

// What the CUDA kernels read: per-parameter tables (static ones uploaded when
// the registered set changes, per-step ones uploaded each step through kernel
// parameters), the block-to-chunk map, and the quantization maps. Plain
// structs shared by the host code (cuda_engine.cpp, built by the C++
// compiler) and the kernels (*.cu).
#pragma once
#include <cstdint>

#include "core/pass.hpp"
#include "core/qmaps.hpp"
#include "core/quant.hpp"
#include "core/shape.hpp"
#include "core/update_rules.hpp"
#include "lowbit.h"

namespace lowbit {
namespace cuda {

constexpr int kThreads = 256;                  // threads per CUDA block
constexpr int kWarps = kThreads / 32;          // one warp updates one tile of kTile = 256 elements
constexpr int kElemsPerThread = kTile / 32;    // 8: one 16-byte load of a 16-bit tensor
constexpr int kSplit = 2;                      // CUDA blocks per chunk (a chunk is <= 64K elements)
static_assert(kElemsPerThread == 8, "the load/store paths assume 8 elements per thread");
static_assert(kTile == 256 && kBlock8 == 256 && kBlock4 == 128, "a tile is one 8-bit block or two 4-bit blocks");

enum DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };
enum Round : uint8_t { kNearest = 0, kStochastic = 1, kEcc = 2 };
constexpr uint8_t kNoMap = 255;

// Static description of one parameter: changes only when the engine is bound
// again (registration, checkpoint loads, new JAX buffers).
// DevParam::coding bits.
constexpr uint8_t kCodeSecond = 1;      // positive values never encode to 0
constexpr uint8_t kCodeStochastic = 2;  // 4BIT_SR: a step rounds the codes stochastically

struct DevParam {
  void* param;
  uint8_t* ecc;
  void* mdata[2];
  float* mscale[2];
  int64_t numel;
  int32_t group;        // device-scalar mode: index into the group hparams
  uint8_t pdtype;       // DType
  uint8_t rounding;     // Round (only for 16-bit params)
  uint8_t num_moments;  // 0, 1, 2
  uint8_t param_al16;   // param base is 16-byte aligned
  uint8_t format[2];    // lowbit_state_format_t of each moment
  uint8_t map[2];       // MapId of each quantized moment or kNoMap
  uint8_t coding[2];    // kCodeSecond | kCodeStochastic: MomentView::second, MomentView::stochastic
  uint8_t norm[2];      // Norm of each moment (Rank1: scales = vectors + workspace; Factored: data = accumulators)
  Shape shape;          // read by Rank1 / Factored moments only
};
// The lowbit_state_format_t moment k was bound with (core/state.hpp
// public_format): its format, 4BIT_SR for stochastic codes, 4BIT_DYN for
// codes on the unsigned dynamic 4-bit map.
LOWBIT_HD int32_t public_format(const DevParam& P, int k) {
  if (P.coding[k] & kCodeStochastic) return int32_t(LOWBIT_STATE_4BIT_SR);
  return P.format[k] == LOWBIT_STATE_4BIT && P.map[k] == uint8_t(MapId::UnsignedDynamic4) ? int32_t(LOWBIT_STATE_4BIT_DYN)
                                                                                          : int32_t(P.format[k]);
}
static_assert(sizeof(DevParam) == 144, "DevParam layout (no implicit padding: tables are compared bytewise)");

// Pass 1 of the shaped parameters (core/shape.hpp): rows [a, b) of a
// parameter (kind 0: one warp per row), or columns [a, b) (<= kThreads, one
// thread each) of batch `batch` over the rows of column chunk `chunk`
// (kind 1), or, for a param whose shaped moments are all rank-1 and whose
// rows are a multiple of 8 long, both maxima from columns [a, b) (<= 256, 8
// per lane) over the rows of chunk `chunk` (kind 2, in place of kinds 0 and
// 1). Written by bind().
struct DevStatItem {
  int32_t param, kind;
  int64_t a, b, batch, chunk;
  int64_t partial_off;  // the param's factored column partials in ShapedArgs::partials
};
static_assert(sizeof(DevStatItem) == 48, "DevStatItem layout");

// A parameter with a Rank1 or Factored moment: where its factored column
// partials start in the engine's partial buffer (doubles).
struct DevShaped {
  int32_t param;
  int32_t pad_;
  int64_t partial_off;
};
static_assert(sizeof(DevShaped) == 16, "DevShaped layout");


// Per-step description of one parameter: the gradient is uploaded by the
// host, the rest written by prepare_kernel.
struct DevDyn {
  const void* grad;     // nullptr: the parameter is not updated this step
  uint64_t key;         // stochastic rounding key of this step
  int32_t scalar_idx;   // index into the scalar table (the parameter's own)
  uint8_t gdtype;       // DType
  uint8_t grad_al16;    // grad base is 16-byte aligned
  uint8_t pad_[2];
};
static_assert(sizeof(DevDyn) == 24, "DevDyn layout");

struct DevChunk {
  int64_t begin, end;  // element range of the parameter; begin is a multiple of kChunkElements
  int32_t param;
  int32_t pad_;
};
static_assert(sizeof(DevChunk) == 24, "DevChunk layout");
// Compared bytewise: every field is 4 bytes wide, so the struct has no padding.
static_assert(alignof(StepScalars) == 4 && sizeof(StepScalars) % 4 == 0, "StepScalars layout (compared bytewise)");

// The maps of core/qmaps.cpp (values, midpoints and bucket tables), in MapId order.
struct DevMaps {
  QMap map[kNumMaps];
};
static_assert(sizeof(QMap) % 4 == 0, "maps are copied to shared memory as 32-bit words");

// Everything the step kernel needs, passed by value.
struct StepArgs {
  const DevParam* params;
  const DevDyn* dyn;
  const StepScalars* scalars;  // parameter i uses scalars[dyn[i].scalar_idx] and key dyn[i].key (prepare_kernel)
  const DevChunk* chunks;
  const DevMaps* maps;
  const int32_t* skip_flag;    // non-null: the step does nothing when *skip_flag != 0
  float* out;                  // StepControl::flat_out (kFlatOut rules): the new values go to out + flat offset
  const struct DevFlat* flat;
};

struct ShapedArgs {
  const DevParam* params;
  const DevDyn* dyn;
  const StepScalars* scalars;
  const DevStatItem* items;  // pass 1
  const DevShaped* shaped;   // mid / finish: one CUDA block each
  double* partials;
  const int32_t* skip_flag;
  const QMap* maps;  // the maps of DevMaps (global memory)
};

// Before the step, the scalars and rounding key of every parameter with a
// gradient are computed on the device (core/step_scalars.hpp) from
// hparams[params[i].group] and its step count, into scalars[i] / dyn[i].
struct PrepareArgs {
  const DevParam* params;
  DevDyn* dyn;
  StepScalars* scalars;
  const lowbit_hparams_t* hparams;
  const int64_t* steps;
  const int32_t* shared_count;  // non-null: the step count of every parameter (JAX)
  int64_t host_count;           // >= 0: that count as a host value (StepControl::host_count)
  const float* lr;              // non-null: replaces hparams.lr
  const int32_t* layout;        // non-null: N x kLayoutColumns records (core/layout_record.hpp); a mismatch sets *flag
  int32_t* flag;
  uint64_t seed;
  int64_t num_params;
  int64_t frozen_step;              // >= 0: 1-bit Adam's compressed stage, variance frozen at this step
  int32_t validate_hparams;         // hparams are the caller's (StepControl::hparams): hparams_valid or skip
  int32_t algo;                     // Algo: the scalars' rule, and hparams_valid's
};

// Host tables reach the device as the kernel parameters of an upload kernel:
// no staging memory, no host synchronisation, ordered on the caller's stream,
// and a captured CUDA graph holds the values of the captured step. Batches of
// 30 KiB use the large kernel parameters of CUDA >= 12.1 (sm_70+); under
// stream capture the engine uses batches under the classic 4 KiB limit, so a
// graph never depends on large parameters in kernel nodes.
constexpr int kUploadSegments = 8;
struct UploadSegment {
  uint32_t* dst;
  int32_t first_word;  // in payload
  int32_t words;
};
template <int Words>
struct UploadBatchT {
  static constexpr int kWords = Words;
  UploadSegment seg[kUploadSegments];
  int32_t num_segments;
  int32_t total_words;
  uint32_t payload[Words];
};
using UploadBatch = UploadBatchT<7680>;     // 30 KiB of payload per launch
using UploadBatchSmall = UploadBatchT<960>; // 3.75 KiB
static_assert(sizeof(UploadBatch) < 32000, "kernel parameters are limited to 32764 bytes");
static_assert(sizeof(UploadBatchSmall) < 4000, "the small batch fits the 4 KiB parameter limit");

struct CheckArgs {
  const DevParam* params;
  const DevDyn* dyn;
  const DevChunk* chunks;
  int32_t* flag;  // set to 1 when a non-finite gradient element is found
};

// +1 on the step count of every updated parameter unless the step was
// skipped; with a shared count, *shared_count_out = *shared_count (or
// host_count) + 1 instead.
struct FinalizeArgs {
  const DevDyn* dyn;
  int64_t* steps;
  const int32_t* skip_flag;
  const int32_t* shared_count;
  int32_t* shared_count_out;
  int64_t host_count;
  int64_t num_params;
};

// Passes (core/pass.hpp): where a parameter sits in the flat buffers, and
// its element mask (nullptr: none).
struct DevFlat {
  int64_t offset;
  const uint8_t* mask;
};
static_assert(sizeof(DevFlat) == 16, "DevFlat layout");

// What a pass's kernels read (cuda/pass_launch.cuh): the engine's tables.
struct PassTables {
  const DevParam* params;
  const DevDyn* dyn;
  const StepScalars* scalars;  // the scalars of the step the pass belongs to
  const DevChunk* chunks;
  const DevFlat* flat;
  const lowbit_hparams_t* hparams;
  PassPartial* partials;  // one per chunk
  int32_t* skip_flag;     // the engine's step flag
  int64_t num_params, num_chunks;
};

// Launchers (step_*.cu, aux_kernels.cu). They only enqueue; errors are read
// by the caller with cudaGetLastError.
template <Algo A>
void launch_step(const StepArgs& args, int64_t num_chunks, void* stream);
template <class Batch>
void launch_upload(const Batch& batch, void* stream);
// Shaped parameters: pass 1 (per algorithm, step_*.cu), then between the
// passes (factored column sums and row means) and after pass 2 (rank-1
// vectors move in) (aux_kernels.cu).
template <Algo A>
void launch_stats(const ShapedArgs& args, int64_t num_items, void* stream);
void launch_shaped_mid(const ShapedArgs& args, int64_t num_shaped, void* stream);
void launch_shaped_finish(const ShapedArgs& args, int64_t num_shaped, void* stream);
void launch_check(const CheckArgs& args, int64_t num_chunks, void* stream);
void launch_prepare(const PrepareArgs& args, void* stream);
void launch_finalize(const FinalizeArgs& args, void* stream);
// *flag <- 1 if *value > 0 (a pass's PassSkip::if_positive).
void launch_skip_if_positive(const float* value, int32_t* flag, void* stream);
// x[i] rounded to bf16 (nearest even), in place.
void launch_round_bf16(float* x, int64_t n, void* stream);

}  // namespace cuda
}  // namespace lowbit

// How 1-bit Adam, 0/1 Adam and 1-bit LAMB name their collective calls in
// the messages of the communicator's argument agreement.
#include "distributed/onebit_optimizer.hpp"

namespace lowbit {
namespace distributed {
namespace {

const char* kind_name(int32_t kind) {
  switch (kind) {
    case kCallerOneBitAdam: return "from a 1-bit Adam step";
    case kCallerZeroOneAdam: return "from a 0/1 Adam step";
    case kCallerOneBitLamb: return "from a 1-bit LAMB step";
    default: return "directly";
  }
}

const char* subject_name(int32_t kind) {
  switch (kind) {
    case kCallerZeroOneAdam: return "0/1 Adam";
    case kCallerOneBitLamb: return "1-bit LAMB";
    default: return "1-bit Adam";
  }
}

const char* stage_name(int32_t stage) {
  switch (stage) {
    case kStageWarmup: return "the warm-up stage (full-precision allreduce_mean)";
    case kStageCompressed: return "the compressed stage (compressed_allreduce)";
    case kStageLocal: return "a 0/1 Adam local step (non-finite agreement only)";
    case kStageSync: return "a 0/1 Adam synchronisation (compressed_allreduce)";
    default: return "no 1-bit Adam stage";
  }
}

const CallerNames kNames{kind_name, subject_name, stage_name, "freeze_step", "params"};

}  // namespace

const CallerNames& caller_names() { return kNames; }

CollectiveCaller direct_caller() {
  CollectiveCaller who;
  who.names = &kNames;
  return who;
}

}  // namespace distributed
}  // namespace lowbit

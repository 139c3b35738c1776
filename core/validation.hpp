// Checks of caller-provided structs. Each throws lowbit::Error naming the
// field and the value at fault; none has side effects.
#pragma once
#include <cstdint>

#include "lowbit.h"

namespace lowbit {

// The most CPU engine threads a caller may ask for (lowbit.h, num_threads).
// OpenMP itself has no safe upper bound: a team of 100000 threads crashes
// inside the runtime and INT32_MAX makes it exit(1).
constexpr int32_t kMaxNumThreads = 1024;

// Step counts. lowbit_optimizer_set_step takes 0 .. kMaxSetStep = 2^53: every
// such count is exact as a double (Python floats, torch's step tensors, JSON)
// and lies 2^63 - 2^53 steps below INT64_MAX, so no computation on a count
// (t = step + 1, the bias corrections' powers by repeated squaring, the
// stochastic-rounding key, the 1-bit schedules' step + issued and step %
// interval) can overflow in any run. A checkpoint may carry up to
// kMaxCheckpointStep = 2^62: what steps from 2^53 reach only after 2^62 - 2^53
// steps, with 2^62 steps of headroom still left below INT64_MAX.
constexpr int64_t kMaxSetStep = int64_t(1) << 53;
constexpr int64_t kMaxCheckpointStep = int64_t(1) << 62;

// That a struct has its current size. Caller structs never reach the core
// otherwise: the C boundary (capi/struct_abi.hpp, the one table of released
// sizes) reads each, of any released size, into a current one.
void check_struct_size(size_t got, size_t expected, const char* what);
void check_algorithm(lowbit_algorithm_t algorithm);
// 1-bit Adam, 0/1 Adam, 1-bit LAMB: fp32 state, a communicator, one bucket.
bool is_onebit_algorithm(lowbit_algorithm_t algorithm);
const char* onebit_algorithm_name(lowbit_algorithm_t algorithm);
void check_onebit_options(const lowbit_onebit_options_t& options);
void check_hparams(const lowbit_hparams_t& h, lowbit_algorithm_t algorithm);
// A group's algorithm: hparams.algorithm, or the optimizer's where it is 0.
lowbit_algorithm_t group_algorithm(const lowbit_hparams_t& h, lowbit_algorithm_t optimizer_algorithm);
void check_config(const lowbit_optimizer_config_t& c);
void check_state_format(lowbit_state_format_t f, const char* field, bool allow_default);
// A tensor on `device`; `what` names it in messages ("param", "grads[3]").
void check_tensor(const lowbit_tensor_t& t, const char* what, lowbit_device_t device, int32_t device_index);
// numel elements of a valid dtype fit in INT64_MAX bytes.
void check_tensor_bytes(int64_t numel, lowbit_dtype_t dtype, const char* what);
void check_flag(int32_t value, const char* field, bool allow_default);
// 0 (all OpenMP threads) .. kMaxNumThreads.
void check_num_threads(int32_t num_threads);
// DEFAULT, BLOCK, RANK1, and FACTORED when allow_factored.
void check_normalization(lowbit_normalization_t n, const char* field, bool allow_factored);

}  // namespace lowbit

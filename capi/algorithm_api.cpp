// The algorithm descriptors through the C API (lowbit.h, "the algorithms,
// described"): core/algorithms.hpp and core/hparam_specs.hpp, as C structs.
#include "boundary.hpp"
#include "core/algorithms.hpp"
#include "core/hparams.hpp"
#include "core/validation.hpp"
#include "struct_abi.hpp"

namespace abi = lowbit::abi;
using lowbit::guarded;

extern "C" {

LOWBIT_API lowbit_status_t lowbit_algorithm_info(lowbit_algorithm_t algorithm, lowbit_algorithm_info_t* out) {
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(out, "out");
    abi::write_struct(out, lowbit::algorithm_info(algorithm), "out");
  });
}

LOWBIT_API lowbit_status_t lowbit_hparam_info(lowbit_algorithm_t algorithm, int32_t index, lowbit_hparam_info_t* out) {
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(out, "out");
    const std::vector<lowbit_hparam_info_t> infos = lowbit::hparam_infos(algorithm);
    LOWBIT_REQUIRE(index >= 0 && size_t(index) < infos.size(), LOWBIT_ERROR_INVALID_ARGUMENT, "index = ", index,
                   " but ", lowbit::algorithm_info(algorithm).title, " has ", infos.size(), " hyper-parameters");
    abi::write_struct(out, infos[size_t(index)], "out");
  });
}

LOWBIT_API lowbit_status_t lowbit_moments_in_use(lowbit_algorithm_t algorithm, const lowbit_hparams_t* hparams,
                                                 int32_t* count) {
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(count, "count");
    lowbit::check_algorithm(algorithm);
    const lowbit_hparams_t h = abi::read_hparams(hparams, algorithm, "hparams");
    lowbit::check_hparams(h, algorithm);
    *count = lowbit::moments_in_use(lowbit::describe(algorithm), h);
  });
}

LOWBIT_API lowbit_status_t lowbit_algorithms(lowbit_algorithm_t* out, int32_t capacity, int32_t* count) {
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(count, "count");
    LOWBIT_REQUIRE(capacity >= 0, LOWBIT_ERROR_INVALID_ARGUMENT, "capacity = ", capacity, " must be >= 0");
    LOWBIT_REQUIRE(capacity == 0 || out != nullptr, LOWBIT_ERROR_NULL_POINTER, "out is NULL with capacity ",
                   capacity);
    const std::vector<lowbit_algorithm_t>& all = lowbit::all_algorithms();
    for (size_t i = 0; i < all.size() && int32_t(i) < capacity; ++i) out[i] = all[i];
    *count = int32_t(all.size());
  });
}

}  // extern "C"

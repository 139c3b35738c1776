// The sized inits of the structs of lowbit.h (lowbit_*_init_sized) and the
// plain-named entry points of the release that introduced each, all through
// the one table of released sizes (struct_abi.hpp). lowbit_comm.h's are in
// comm_api.cpp.
#include "core/defaults.hpp"
#include "core/validation.hpp"
#include "struct_abi.hpp"

namespace abi = lowbit::abi;

namespace {

lowbit_optimizer_config_t preset_config(lowbit_preset_t preset) {
  LOWBIT_REQUIRE(preset == LOWBIT_PRESET_LPMM_ADAMW_4BIT || preset == LOWBIT_PRESET_ADAMW_4BIT_FACTOR ||
                     preset == LOWBIT_PRESET_ADAMW_4BIT_SR || preset == LOWBIT_PRESET_ADAMW_4BIT_SR_DYN,
                 LOWBIT_ERROR_INVALID_ARGUMENT, "preset = ", int(preset), " is not a lowbit_preset_t value");
  const bool sr = preset == LOWBIT_PRESET_ADAMW_4BIT_SR || preset == LOWBIT_PRESET_ADAMW_4BIT_SR_DYN;
  lowbit_optimizer_config_t out = lowbit::default_config(LOWBIT_ALGORITHM_ADAMW);
  out.state_format = sr ? LOWBIT_STATE_4BIT_SR : LOWBIT_STATE_4BIT;
  out.second_state_format = preset == LOWBIT_PRESET_ADAMW_4BIT_SR_DYN ? LOWBIT_STATE_4BIT_DYN : LOWBIT_STATE_4BIT;
  out.first_normalization = LOWBIT_NORMALIZATION_BLOCK;
  out.second_normalization = preset == LOWBIT_PRESET_LPMM_ADAMW_4BIT     ? LOWBIT_NORMALIZATION_RANK1
                             : preset == LOWBIT_PRESET_ADAMW_4BIT_FACTOR ? LOWBIT_NORMALIZATION_FACTORED
                                                                         : LOWBIT_NORMALIZATION_BLOCK;
  return out;
}

lowbit_hparams_t hparams_for(lowbit_algorithm_t algorithm) {
  lowbit::check_algorithm(algorithm);
  return lowbit::default_hparams(algorithm);
}

lowbit_optimizer_config_t config_for(lowbit_algorithm_t algorithm) {
  lowbit::check_algorithm(algorithm);
  return lowbit::default_config(algorithm);
}

}  // namespace

extern "C" {

LOWBIT_API lowbit_status_t lowbit_hparams_init_sized(lowbit_hparams_t* h, size_t size, lowbit_algorithm_t algorithm) {
  return abi::init_entry(h, size, 0, "hparams", [&] { return hparams_for(algorithm); });
}

LOWBIT_API lowbit_status_t(lowbit_hparams_init)(lowbit_hparams_t* h, lowbit_algorithm_t algorithm) {
  return abi::init_entry(h, 0, 200, "hparams", [&] { return hparams_for(algorithm); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_config_init_sized(lowbit_optimizer_config_t* c, size_t size,
                                                              lowbit_algorithm_t algorithm) {
  return abi::init_entry(c, size, 0, "config", [&] { return config_for(algorithm); });
}

// The 0.2 symbol (parenthesised: not the header's macro).
LOWBIT_API lowbit_status_t(lowbit_optimizer_config_init)(lowbit_optimizer_config_t* c, lowbit_algorithm_t algorithm) {
  return abi::init_entry(c, 0, 200, "config", [&] { return config_for(algorithm); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_config_preset_sized(lowbit_optimizer_config_t* c, size_t size,
                                                                lowbit_preset_t preset) {
  return abi::init_entry(c, size, 0, "config", [&] { return preset_config(preset); });
}

LOWBIT_API lowbit_status_t(lowbit_optimizer_config_preset)(lowbit_optimizer_config_t* c, lowbit_preset_t preset) {
  return abi::init_entry(c, 0, 300, "config", [&] { return preset_config(preset); });
}

LOWBIT_DEFINE_STRUCT_INIT(lowbit_param_config_t, lowbit_param_config_init, 200, "param_config",
                          lowbit::default_param_config())
LOWBIT_DEFINE_STRUCT_INIT(lowbit_onebit_options_t, lowbit_onebit_options_init, 300, "options",
                          lowbit::default_onebit_options())
LOWBIT_DEFINE_STRUCT_INIT(lowbit_onebit_status_t, lowbit_onebit_status_init, 400, "status", lowbit_onebit_status_t{})
LOWBIT_DEFINE_STRUCT_INIT(lowbit_param_info_t, lowbit_param_info_init, 400, "info", lowbit_param_info_t{})
LOWBIT_DEFINE_STRUCT_INIT(lowbit_state_plan_t, lowbit_state_plan_init, 400, "plan", lowbit_state_plan_t{})
LOWBIT_DEFINE_STRUCT_INIT(lowbit_build_info_t, lowbit_build_info_init, 400, "info", lowbit_build_info_t{})
LOWBIT_DEFINE_STRUCT_INIT(lowbit_algorithm_info_t, lowbit_algorithm_info_init, 800, "info", lowbit_algorithm_info_t{})
LOWBIT_DEFINE_STRUCT_INIT(lowbit_hparam_info_t, lowbit_hparam_info_init, 800, "info", lowbit_hparam_info_t{})

}  // extern "C"

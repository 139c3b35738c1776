// The released sizes of every struct of the public headers, and the checks
// and copies over them (struct_abi.hpp). docs/ABI.md lists the same table
// with the fields each release added.
#include "struct_abi.hpp"

#include <string>

#include "core/defaults.hpp"

namespace lowbit {
namespace abi {
namespace {

// A release of `size` bytes whose caller owns `data` of them (0: all).
constexpr Release rel(int version, size_t size, size_t data = 0) { return Release{version, size, data ? data : size}; }

// Oldest first, strictly growing, each past struct_size, the newest the
// current sizeof and no newer than this library.
template <size_t N>
constexpr bool well_formed(const Release (&r)[N], size_t current) {
  for (size_t i = 0; i < N; ++i) {
    if (r[i].size <= sizeof(size_t) || r[i].data_bytes > r[i].size || r[i].data_bytes <= sizeof(size_t)) return false;
    if (i > 0 && (r[i].size <= r[i - 1].size || r[i].version <= r[i - 1].version)) return false;
  }
  return r[N - 1].size == current && r[N - 1].data_bytes == current &&
         r[N - 1].version <= LOWBIT_VERSION;
}

std::string version_name(int v) { return concat(v / 10000, ".", v / 100 % 100); }

}  // namespace

// The table: struct, releases (version, size[, the caller's bytes]).
#define LOWBIT_STRUCT_ABI(T, init_name, ...)                                 \
  template <>                                                                \
  const StructAbi& abi_of<T>() {                                             \
    static constexpr Release r[] = {__VA_ARGS__};                            \
    static_assert(well_formed(r, sizeof(T)), #T ": malformed release list"); \
    static const StructAbi s{#T, init_name, r, int(sizeof r / sizeof r[0])}; \
    return s;                                                                \
  }

// lowbit.h
LOWBIT_STRUCT_ABI(lowbit_build_info_t, "lowbit_build_info_init", rel(300, offsetof(lowbit_build_info_t, cpu_kernels)),
                  rel(800, sizeof(lowbit_build_info_t)))
LOWBIT_STRUCT_ABI(lowbit_hparams_t, "lowbit_hparams_init",
                  rel(200, 48, offsetof(lowbit_hparams_t, algorithm)), rel(700, offsetof(lowbit_hparams_t, alpha)),
                  rel(800, sizeof(lowbit_hparams_t)))
LOWBIT_STRUCT_ABI(lowbit_optimizer_config_t, "lowbit_optimizer_config_init",
                  rel(200, offsetof(lowbit_optimizer_config_t, first_normalization)),
                  rel(300, sizeof(lowbit_optimizer_config_t)))
// 0.3's ndim starts in the tail padding of 0.2's struct: a 0.2 caller owns
// the bytes before it only.
LOWBIT_STRUCT_ABI(lowbit_param_config_t, "lowbit_param_config_init",
                  rel(200, offsetof(lowbit_param_config_t, shape), offsetof(lowbit_param_config_t, ndim)),
                  rel(300, sizeof(lowbit_param_config_t)))
LOWBIT_STRUCT_ABI(lowbit_onebit_options_t, "lowbit_onebit_options_init", rel(300, sizeof(lowbit_onebit_options_t)))
LOWBIT_STRUCT_ABI(lowbit_onebit_status_t, "lowbit_onebit_status_init", rel(300, sizeof(lowbit_onebit_status_t)))
LOWBIT_STRUCT_ABI(lowbit_param_info_t, "lowbit_param_info_init",
                  rel(200, offsetof(lowbit_param_info_t, first_normalization)), rel(300, sizeof(lowbit_param_info_t)))
LOWBIT_STRUCT_ABI(lowbit_state_plan_t, "lowbit_state_plan_init",
                  rel(200, offsetof(lowbit_state_plan_t, normalization)), rel(300, offsetof(lowbit_state_plan_t, kind)),
                  rel(800, sizeof(lowbit_state_plan_t)))
LOWBIT_STRUCT_ABI(lowbit_algorithm_info_t, "lowbit_algorithm_info_init", rel(800, sizeof(lowbit_algorithm_info_t)))
LOWBIT_STRUCT_ABI(lowbit_hparam_info_t, "lowbit_hparam_info_init", rel(800, sizeof(lowbit_hparam_info_t)))
LOWBIT_STRUCT_ABI(lowbit_param_buffers_t, "lowbit_param_buffers_init", rel(600, sizeof(lowbit_param_buffers_t)))
LOWBIT_STRUCT_ABI(lowbit_step_args_t, "lowbit_step_args_init", rel(600, sizeof(lowbit_step_args_t)))
// lowbit_comm.h
LOWBIT_STRUCT_ABI(lowbit_comm_config_t, "lowbit_comm_config_init",
                  rel(200, offsetof(lowbit_comm_config_t, timeout_ms)),
                  rel(400, offsetof(lowbit_comm_config_t, error_format)), rel(800, sizeof(lowbit_comm_config_t)))
LOWBIT_STRUCT_ABI(lowbit_comm_info_t, "lowbit_comm_info_init", rel(200, offsetof(lowbit_comm_info_t, timeout_ms)),
                  rel(400, sizeof(lowbit_comm_info_t)))
LOWBIT_STRUCT_ABI(lowbit_comm_stats_t, "lowbit_comm_stats_init", rel(200, sizeof(lowbit_comm_stats_t)))
LOWBIT_STRUCT_ABI(lowbit_comm_transport_t, "lowbit_comm_transport_init", rel(300, sizeof(lowbit_comm_transport_t)))

#undef LOWBIT_STRUCT_ABI

lowbit_hparams_t read_hparams(const lowbit_hparams_t* in, lowbit_algorithm_t algorithm, const char* arg) {
  return read_struct(in, default_hparams(algorithm), arg);
}

const Release& find_release(const StructAbi& s, size_t struct_size, const char* arg) {
  for (int i = 0; i < s.count; ++i)
    if (s.releases[i].size == struct_size) return s.releases[i];
  std::string known;
  for (int i = 0; i < s.count; ++i)
    known += concat(i == 0 ? "" : i + 1 == s.count ? " and " : ", ", s.releases[i].size, " (lowbit ",
                    version_name(s.releases[i].version), ")");
  fail(LOWBIT_ERROR_INVALID_ARGUMENT, arg, ".struct_size = ", struct_size, " is not a released size of ", s.type,
       " (this library knows ", known, "); set it with ", s.init, "()");
}

size_t size_in(const StructAbi& s, int version) {
  size_t size = 0;
  for (int i = 0; i < s.count; ++i)
    if (s.releases[i].version <= version) size = s.releases[i].size;
  LOWBIT_REQUIRE(size != 0, LOWBIT_ERROR_INTERNAL, s.type, " did not exist in lowbit ", version_name(version));
  return size;
}

size_t struct_size_of(const void* p) {
  size_t size;
  std::memcpy(&size, p, sizeof size);
  return size;
}

void read_bytes(const StructAbi& s, const void* in, void* full, const char* arg) {
  const Release& r = find_release(s, struct_size_of(in), arg);
  std::memcpy(full, in, r.data_bytes);
  const size_t current = s.releases[s.count - 1].size;
  std::memcpy(full, &current, sizeof current);
}

void write_bytes(void* out, const void* full, size_t size) {
  std::memcpy(static_cast<char*>(out) + sizeof(size_t), static_cast<const char*>(full) + sizeof(size_t),
              size - sizeof(size_t));
}

}  // namespace abi
}  // namespace lowbit

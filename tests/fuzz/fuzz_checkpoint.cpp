// Fuzz target for the checkpoint loader: any input either loads, or fails
// with a status and leaves the optimizer exactly as it was. Built with
// libFuzzer (tests/fuzz/CMakeLists.txt, clang) and, with the driver in
// corpus_main.cpp, as a regression test over tests/fuzz/corpus.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lowbit.h"

namespace {

struct Target {
  lowbit_optimizer_t opt = nullptr;
  std::vector<float> p0;
  std::vector<uint16_t> p1;
  std::vector<float> g0;
  std::vector<uint16_t> g1;

  Target() : p0(300, 0.5f), p1(5000, 0x3F80), g0(300, 0.25f), g1(5000, 0x3E80) {
    lowbit_optimizer_config_t c;
    lowbit_hparams_t h;
    lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
    lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
    c.state_format = LOWBIT_STATE_8BIT;
    c.second_state_format = LOWBIT_STATE_4BIT;
    c.error_correction = 1;
    c.num_threads = 1;
    check(lowbit_optimizer_create(&opt, &c, &h));
    add(p0.data(), g0.data(), 300, LOWBIT_DTYPE_FLOAT32);
    add(p1.data(), g1.data(), 5000, LOWBIT_DTYPE_BFLOAT16);
    check(lowbit_optimizer_step(opt, nullptr));
  }
  void add(void* p, void* g, int64_t n, lowbit_dtype_t dt) {
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = {p, n, dt, LOWBIT_DEVICE_CPU, 0};
    pc.grad = {g, n, dt, LOWBIT_DEVICE_CPU, 0};
    int64_t id;
    check(lowbit_optimizer_add_param(opt, &pc, &id));
  }
  static void check(lowbit_status_t s) {
    if (s != LOWBIT_SUCCESS) {
      std::fprintf(stderr, "unexpected failure: %s: %s\n", lowbit_status_string(s), lowbit_last_error());
      std::abort();
    }
  }
  std::vector<uint8_t> save(lowbit_checkpoint_mode_t mode) {
    int64_t size = 0;
    check(lowbit_optimizer_save(opt, mode, nullptr, 0, &size, nullptr));
    std::vector<uint8_t> out(static_cast<size_t>(size));
    check(lowbit_optimizer_save(opt, mode, out.data(), size, &size, nullptr));
    return out;
  }
};

Target& target() {
  static Target t;
  return t;
}

}  // namespace

// Writes valid seed inputs (one per checkpoint mode) into `dir`.
void write_seed_corpus(const char* dir) {
  for (int mode = LOWBIT_CHECKPOINT_COMPRESSED; mode <= LOWBIT_CHECKPOINT_MATERIALIZED_BF16; ++mode) {
    std::vector<uint8_t> bytes = target().save(lowbit_checkpoint_mode_t(mode));
    char path[4096];
    std::snprintf(path, sizeof path, "%s/valid_mode%d.bin", dir, mode);
    FILE* f = std::fopen(path, "wb");
    if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
    std::fclose(f);
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Target& t = target();
  std::vector<uint8_t> before = t.save(LOWBIT_CHECKPOINT_COMPRESSED);
  lowbit_status_t s = lowbit_optimizer_load(t.opt, data, int64_t(size), nullptr);
  if (s != LOWBIT_SUCCESS) {
    if (std::strlen(lowbit_optimizer_last_error(t.opt)) == 0) std::abort();  // an error always has a message
    if (t.save(LOWBIT_CHECKPOINT_COMPRESSED) != before) std::abort();        // and changes nothing
    return 0;
  }
  // A loaded state must be usable, then the baseline is restored.
  Target::check(lowbit_optimizer_step(t.opt, nullptr));
  Target::check(lowbit_optimizer_load(t.opt, before.data(), int64_t(before.size()), nullptr));
  return 0;
}

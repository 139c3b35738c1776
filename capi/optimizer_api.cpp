// lowbit_optimizer_* entry points: argument checks that need the C view,
// then a call into lowbit::Optimizer inside guarded().
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "boundary.hpp"
#include "comm_handle.hpp"
#include "core/defaults.hpp"
#include "core/optimizer.hpp"
#include "core/validation.hpp"
#include "distributed/onebit_optimizer.hpp"
#include "muon/muon_optimizer.hpp"
#include "trust/trust_optimizer.hpp"
#include "struct_abi.hpp"

struct lowbit_optimizer {
  std::unique_ptr<lowbit::Optimizer> impl;
  std::string last_error;
};

using lowbit::guarded;
using lowbit::distributed::onebit;
namespace abi = lowbit::abi;

namespace {

template <class Body>
lowbit_status_t on_handle(lowbit_optimizer_t opt, Body&& body) noexcept {
  return lowbit::on_handle(opt, "opt (the optimizer handle)", std::forward<Body>(body));
}

// Caller structs of any released size, as the current structs (an older
// struct gets the defaults of the fields added since).
lowbit_optimizer_config_t read_config(const lowbit_optimizer_config_t* c, const char* arg) {
  return abi::read_struct(c, lowbit::default_config(LOWBIT_ALGORITHM_ADAMW), arg);
}
lowbit_hparams_t read_hparams(const lowbit_hparams_t* h, lowbit_algorithm_t algorithm) {
  return abi::read_hparams(h, algorithm, "hparams");
}

}  // namespace

extern "C" {

LOWBIT_API lowbit_status_t lowbit_optimizer_create(lowbit_optimizer_t* out, const lowbit_optimizer_config_t* config,
                                                   const lowbit_hparams_t* hparams) {
  if (out) *out = nullptr;
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(out, "out");
    LOWBIT_REQUIRE_PTR(config, "config");
    LOWBIT_REQUIRE_PTR(hparams, "hparams");
    const lowbit_optimizer_config_t full = read_config(config, "config");
    auto handle = std::make_unique<lowbit_optimizer>();
    const lowbit_hparams_t h = read_hparams(hparams, full.algorithm);
    handle->impl = lowbit::trust::make_optimizer(full, h);
    if (!handle->impl)
      handle->impl = full.algorithm == LOWBIT_ALGORITHM_MUON ? lowbit::muon::make_optimizer(full, h)
                                                             : lowbit::distributed::make_optimizer(full, h);
    *out = handle.release();
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_destroy(lowbit_optimizer_t opt) {
  delete opt;
  return LOWBIT_SUCCESS;
}

LOWBIT_API const char* lowbit_optimizer_last_error(lowbit_optimizer_t opt) { return lowbit::last_error_of(opt); }

LOWBIT_API lowbit_status_t lowbit_optimizer_add_group(lowbit_optimizer_t opt, const lowbit_hparams_t* hparams,
                                                      int32_t* out_group) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(hparams, "hparams");
    LOWBIT_REQUIRE_PTR(out_group, "out_group");
    *out_group = o.add_group(read_hparams(hparams, o.config().algorithm));
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_set_hparams(lowbit_optimizer_t opt, int32_t group,
                                                        const lowbit_hparams_t* hparams) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(hparams, "hparams");
    o.set_hparams(group, read_hparams(hparams, o.config().algorithm));
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_get_hparams(lowbit_optimizer_t opt, int32_t group, lowbit_hparams_t* out) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out, "out");
    abi::write_struct_unchecked(out, o.hparams(group), "out");
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_set_lr(lowbit_optimizer_t opt, int32_t group, float lr) {
  return on_handle(opt, [&](lowbit::Optimizer& o) { o.set_lr(group, lr); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_add_param(lowbit_optimizer_t opt, const lowbit_param_config_t* config,
                                                      int64_t* out_param_id) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(config, "param_config");
    LOWBIT_REQUIRE_PTR(out_param_id, "out_param_id");
    *out_param_id = o.add_param(abi::read_struct(config, lowbit::default_param_config(), "param_config"));
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_set_grad(lowbit_optimizer_t opt, int64_t param_id,
                                                     const lowbit_tensor_t* grad) {
  return on_handle(opt, [&](lowbit::Optimizer& o) { o.set_grad(param_id, grad); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_step(lowbit_optimizer_t opt, void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) { o.step(nullptr, 0, stream); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_step_with_grads(lowbit_optimizer_t opt, const lowbit_tensor_t* grads,
                                                            int64_t num_grads, void* stream) {
  // grads == NULL is checked by the optimizer: a 1-bit Adam step reports it
  // to the other ranks too.
  return on_handle(opt, [&](lowbit::Optimizer& o) { o.step(grads, num_grads, stream, true); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_step_params(lowbit_optimizer_t opt, const int64_t* ids, int64_t num_ids,
                                                        const lowbit_tensor_t* grads, void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) { o.step_params(ids, num_ids, grads, stream); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_set_comm(lowbit_optimizer_t opt, lowbit_comm_t comm) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    lowbit::Communicator& c = lowbit::communicator_from_handle(comm);
    onebit(o, "set_comm: only a 1-bit Adam optimizer uses a communicator").set_comm(c);
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_set_onebit_warmup_average(lowbit_optimizer_t opt, int32_t average) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE(average == 0 || average == 1, LOWBIT_ERROR_INVALID_ARGUMENT, "average = ", average,
                   " (expected 0 or 1)");
    onebit(o, "set_onebit_warmup_average: only a 1-bit Adam optimizer has a warm-up").set_warmup_average(average != 0);
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_set_onebit_options(lowbit_optimizer_t opt,
                                                               const lowbit_onebit_options_t* options) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(options, "options");
    const lowbit_onebit_options_t full = abi::read_struct(options, lowbit::default_onebit_options(), "options");
    onebit(o, "set_onebit_options: only 0/1 Adam and 1-bit LAMB take these options").set_options(full);
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_onebit_status(lowbit_optimizer_t opt, lowbit_onebit_status_t* out) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out, "out");
    abi::write_struct_unchecked(
        out, onebit(o, "onebit_status: only 1-bit Adam, 0/1 Adam and 1-bit LAMB have a 1-bit status").status(nullptr),
        "out");
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_set_momentum_mask(lowbit_optimizer_t opt, int64_t param_id,
                                                              const uint8_t* mask, int64_t numel) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    o.param(param_id);  // a bad id first, as for every other call
    onebit(o, "set_momentum_mask: only a 1-bit Adam optimizer takes a momentum mask")
        .set_momentum_mask(param_id, mask, numel);
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_last_step_skipped(lowbit_optimizer_t opt, int32_t* out) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = o.last_step_skipped() ? 1 : 0;
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_num_params(lowbit_optimizer_t opt, int64_t* out) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = o.num_params();
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_param_info(lowbit_optimizer_t opt, int64_t param_id,
                                                       lowbit_param_info_t* out) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out, "out");
    abi::write_struct(out, o.info(param_id), "param_info");
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_state_bytes(lowbit_optimizer_t opt, int64_t param_id, int64_t* out) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = o.state_bytes(param_id);
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_workspace_bytes(lowbit_optimizer_t opt, int64_t* out) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = o.extension() ? o.extension()->workspace_bytes() : 0;
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_read_moment(lowbit_optimizer_t opt, int64_t param_id, int32_t moment,
                                                        float* out, int64_t numel, void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) { o.read_moment(param_id, moment, out, numel, stream); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_write_moment(lowbit_optimizer_t opt, int64_t param_id, int32_t moment,
                                                         const float* values, int64_t numel, void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) { o.write_moment(param_id, moment, values, numel, stream); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_set_step(lowbit_optimizer_t opt, int64_t param_id, int64_t step,
                                                     void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) { o.set_step(param_id, step, stream); });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_device_hparams(lowbit_optimizer_t opt, int32_t group,
                                                           lowbit_hparams_t** out) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out, "out");
    *out = o.device_hparams(group);
  });
}

LOWBIT_API lowbit_status_t lowbit_plan_param_state(const lowbit_optimizer_config_t* config,
                                                   const lowbit_hparams_t* hparams,
                                                   const lowbit_param_config_t* param, lowbit_state_plan_t* out) {
  return guarded(nullptr, [&] {
    LOWBIT_REQUIRE_PTR(config, "config");
    LOWBIT_REQUIRE_PTR(hparams, "hparams");
    LOWBIT_REQUIRE_PTR(param, "param");
    abi::check_out(out, "out");
    const lowbit_optimizer_config_t full = read_config(config, "config");
    lowbit::check_config(full);
    const lowbit_hparams_t h = read_hparams(hparams, full.algorithm);
    lowbit::check_hparams(h, full.algorithm);
    const lowbit_param_config_t pc = abi::read_struct(param, lowbit::default_param_config(), "param");
    abi::write_struct(out, lowbit::to_c_plan(lowbit::plan_param_state(full, h, pc), pc.param.numel), "out");
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_save(lowbit_optimizer_t opt, lowbit_checkpoint_mode_t mode, void* buffer,
                                                 int64_t capacity, int64_t* out_size, void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(out_size, "out_size");
    std::vector<uint8_t> bytes = o.save(mode, stream);
    *out_size = int64_t(bytes.size());
    if (!buffer) return;
    LOWBIT_REQUIRE(capacity >= int64_t(bytes.size()), LOWBIT_ERROR_BUFFER_TOO_SMALL, "capacity = ", capacity,
                   " is smaller than the checkpoint size ", bytes.size());
    std::memcpy(buffer, bytes.data(), bytes.size());
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_save_file(lowbit_optimizer_t opt, lowbit_checkpoint_mode_t mode,
                                                      const char* path, void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(path, "path");
    std::vector<uint8_t> bytes = o.save(mode, stream);
    // Write a temporary file next to `path` and rename it over `path`, so a
    // failed save never clobbers a good checkpoint. The temporary name is
    // unique to this call (process, thread, counter) and created exclusively,
    // so concurrent saves to one path never write into each other's file:
    // each renames a complete checkpoint, the last rename wins.
    static std::atomic<uint64_t> counter{0};
    const size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
    std::string tmp;
    FILE* f = nullptr;
    int open_errno = 0;
    for (int attempt = 0; attempt < 16 && !f; ++attempt) {
      tmp = lowbit::concat(path, ".tmp.", long(getpid()), ".", std::hex, thread, std::dec, ".",
                           counter.fetch_add(1, std::memory_order_relaxed));
      f = std::fopen(tmp.c_str(), "wbx");  // exclusive: never an existing file
      open_errno = errno;
      if (!f && open_errno != EEXIST) break;
    }
    LOWBIT_REQUIRE(f, LOWBIT_ERROR_IO, "path = \"", path, "\": cannot create \"", tmp, "\" for writing: ",
                   std::strerror(open_errno));
    bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    ok = (std::fclose(f) == 0) && ok;
    const int write_errno = errno;
    if (!ok || std::rename(tmp.c_str(), path) != 0) {
      const int err = ok ? errno : write_errno;
      std::remove(tmp.c_str());
      lowbit::fail(LOWBIT_ERROR_IO, "path = \"", path, "\": writing the checkpoint failed: ", std::strerror(err));
    }
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_load(lowbit_optimizer_t opt, const void* buffer, int64_t size,
                                                 void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(buffer, "buffer");
    o.load(static_cast<const uint8_t*>(buffer), size, stream);
  });
}

LOWBIT_API lowbit_status_t lowbit_optimizer_load_file(lowbit_optimizer_t opt, const char* path, void* stream) {
  return on_handle(opt, [&](lowbit::Optimizer& o) {
    LOWBIT_REQUIRE_PTR(path, "path");
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path, "rb"), &std::fclose);
    LOWBIT_REQUIRE(f, LOWBIT_ERROR_IO, "path = \"", path, "\": cannot open for reading: ", std::strerror(errno));
    // Read the header first: the size it announces is checked against what
    // this optimizer could load and against the file's size (where the file
    // has one), and bounds the read, so a corrupt header or an endless file
    // (/dev/zero, a pipe) never makes a large allocation.
    auto read_into = [&](uint8_t* dst, size_t n) {
      size_t got = 0;
      while (got < n) {
        const size_t r = std::fread(dst + got, 1, n - got, f.get());
        if (r == 0) break;
        got += r;
      }
      LOWBIT_REQUIRE(!std::ferror(f.get()), LOWBIT_ERROR_IO, "path = \"", path, "\": read error: ",
                     std::strerror(errno));
      return got;
    };
    const size_t head_bytes = lowbit::Optimizer::kCheckpointHeadBytes;
    std::vector<uint8_t> bytes(head_bytes);
    const size_t head = read_into(bytes.data(), head_bytes);
    if (head < head_bytes) {  // too short to hold a header: the parser says what is missing
      o.load(bytes.data(), int64_t(head), stream);
      lowbit::fail(LOWBIT_ERROR_CORRUPT_DATA, "path = \"", path, "\": ", head, " bytes are not a checkpoint");
    }
    uint64_t total;
    try {
      total = o.checkpoint_size(bytes.data());
    } catch (const lowbit::Error& e) {
      throw lowbit::Error(e.status(), lowbit::concat("path = \"", path, "\": ", e.what()));
    }
    struct stat st;
    const bool regular = fstat(fileno(f.get()), &st) == 0 && S_ISREG(st.st_mode);
    if (regular)
      LOWBIT_REQUIRE(uint64_t(st.st_size) == total, LOWBIT_ERROR_CORRUPT_DATA, "path = \"", path, "\": the file has ",
                     int64_t(st.st_size), " bytes but its checkpoint header announces ", total);
    // A regular file has the bytes it announces; a stream grows the buffer
    // only as data arrives (a header may announce more than ever comes).
    const size_t step = regular ? size_t(total) : size_t(1) << 24;
    while (bytes.size() < total) {
      const size_t have = bytes.size(), want = std::min<size_t>(step, size_t(total) - have);
      bytes.resize(have + want);
      const size_t got = read_into(bytes.data() + have, want);
      LOWBIT_REQUIRE(got == want, LOWBIT_ERROR_CORRUPT_DATA, "path = \"", path, "\": the checkpoint is truncated: ",
                     have + got, " bytes, its header announces ", total);
    }
    uint8_t extra;
    LOWBIT_REQUIRE(read_into(&extra, 1) == 0, LOWBIT_ERROR_CORRUPT_DATA, "path = \"", path,
                   "\": the file continues past the ", total, " bytes its checkpoint header announces");
    o.load(bytes.data(), int64_t(total), stream);
  });
}

}  // extern "C"

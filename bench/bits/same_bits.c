/* The same-bits check of refactors: runs a fixed set of optimizer cases
 * through the C API and prints one FNV-1a hash per case (params after every
 * step, the compressed and materialised checkpoints, 1-bit statuses and the
 * communicator's error buffers). Two builds give the same bits when they
 * print the same lines (bench/bits/compare.sh runs both and diffs).
 *
 *   same_bits fused [cpu|cuda]   every algorithm x state format x
 *                                normalisation x param dtype (one process)
 *   mpirun -np R same_bits onebit [cpu|cuda]
 *                                1-bit Adam, 0/1 Adam and 1-bit LAMB through
 *                                every phase, with masks, skipped steps,
 *                                16-bit params (R ranks; rank 0 prints)
 *
 * Built with LOWBIT_SAME_BITS_NO_MPI (a build without MPI, e.g. the aarch64
 * cross build: bench/bits/compare_arch.sh) it has the fused mode only.
 *
 * Inputs are a fixed pseudo-random sequence; nothing here asserts: the
 * output is compared between builds. */
/* Built with LOWBIT_NO_INIT_MACROS and the sized inits of lowbit 0.3, so one
 * binary runs against an older liblowbit as well as the new one. */
#define LOWBIT_NO_INIT_MACROS 1
#ifndef LOWBIT_SAME_BITS_NO_MPI
#include <mpi.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"
#include "lowbit_comm.h"

#ifdef LOWBIT_SAME_BITS_CUDA
#include <cuda_runtime_api.h>
#endif

static int g_cuda = 0;

#define CHECK(call)                                                                             \
  do {                                                                                          \
    lowbit_status_t st_ = (call);                                                               \
    if (st_ != LOWBIT_SUCCESS) {                                                                \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, lowbit_last_error()); \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

/* ---- hashing and inputs */

static uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const uint8_t* b = (const uint8_t*)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
static const uint64_t kFnvBasis = 14695981039346656037ull;

static uint64_t g_rng;
static uint32_t next_u32(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 11);
}
/* A value spread over several decades, either sign. */
static float next_value(float scale) {
  const float u = (float)(next_u32() & 0xFFFFFF) / 16777216.0f - 0.5f;
  const float decade = (float)(1 << (next_u32() % 12)) / 2048.0f;
  return scale * u * decade;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
static uint16_t to_f16(float f) { /* via _Float16 where the compiler has it */
  _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static size_t dtype_bytes(lowbit_dtype_t d) { return d == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }
static void fill(void* dst, lowbit_dtype_t d, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = next_value(scale);
    if (d == LOWBIT_DTYPE_FLOAT32)
      ((float*)dst)[i] = v;
    else if (d == LOWBIT_DTYPE_BFLOAT16)
      ((uint16_t*)dst)[i] = to_bf16(v);
    else
      ((uint16_t*)dst)[i] = to_f16(v);
  }
}

/* ---- tensors on the optimizer's device (host mirrors for filling and hashing) */

typedef struct {
  void* host;
  void* dev; /* == host on the CPU */
  int64_t numel;
  lowbit_dtype_t dtype;
} buf_t;

static buf_t buf_new(int64_t numel, lowbit_dtype_t d) {
  buf_t b = {malloc((size_t)numel * dtype_bytes(d)), NULL, numel, d};
  b.dev = b.host;
#ifdef LOWBIT_SAME_BITS_CUDA
  if (g_cuda && cudaMalloc(&b.dev, (size_t)numel * dtype_bytes(d)) != cudaSuccess) exit(2);
#endif
  return b;
}
static void buf_push(buf_t* b) {
#ifdef LOWBIT_SAME_BITS_CUDA
  if (g_cuda) cudaMemcpy(b->dev, b->host, (size_t)b->numel * dtype_bytes(b->dtype), cudaMemcpyHostToDevice);
#endif
  (void)b;
}
static uint64_t buf_hash(uint64_t h, buf_t* b) {
#ifdef LOWBIT_SAME_BITS_CUDA
  if (g_cuda) cudaMemcpy(b->host, b->dev, (size_t)b->numel * dtype_bytes(b->dtype), cudaMemcpyDeviceToHost);
#endif
  return fnv(h, b->host, (size_t)b->numel * dtype_bytes(b->dtype));
}
static void buf_free(buf_t* b) {
#ifdef LOWBIT_SAME_BITS_CUDA
  if (g_cuda) cudaFree(b->dev);
#endif
  free(b->host);
}
static lowbit_tensor_t tensor(const buf_t* b) {
  lowbit_tensor_t t = {b->dev, b->numel, b->dtype, g_cuda ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU, 0};
  return t;
}

static uint64_t hash_checkpoint(uint64_t h, lowbit_optimizer_t opt, lowbit_checkpoint_mode_t mode) {
  int64_t size = 0;
  CHECK(lowbit_optimizer_save(opt, mode, NULL, 0, &size, NULL));
  void* data = malloc((size_t)size);
  CHECK(lowbit_optimizer_save(opt, mode, data, size, &size, NULL));
  h = fnv(h, data, (size_t)size);
  free(data);
  return h;
}

/* ---- fused steps */

enum { kParams = 4 };
static const int64_t kShapes[kParams][4] = {{1, 1037}, {2, 64, 130}, {3, 4, 33, 70}, {2, 150, 700}};

typedef struct {
  lowbit_algorithm_t algo;
  int nesterov;
  lowbit_state_format_t f1, f2;
  lowbit_normalization_t n1, n2;
  lowbit_dtype_t pdtype;
  int rounding; /* 0 nearest, 1 stochastic, 2 error correction */
} fused_case_t;

static uint64_t run_fused(const fused_case_t* c, uint64_t seed) {
  g_rng = seed;
  lowbit_optimizer_config_t cfg;
  lowbit_hparams_t hp;
  lowbit_optimizer_config_init_sized(&cfg, sizeof cfg, c->algo);
  lowbit_hparams_init(&hp, c->algo);
  cfg.device = g_cuda ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU;
  cfg.state_format = c->f1;
  cfg.second_state_format = c->f2;
  cfg.first_normalization = c->n1;
  cfg.second_normalization = c->n2;
  cfg.min_quantized_numel = 0;
  cfg.seed = 1234;
  cfg.stochastic_rounding = c->rounding == 1;
  cfg.error_correction = c->rounding == 2;
  cfg.num_threads = 2;
  hp.weight_decay = 0.05f;
  if (c->algo == LOWBIT_ALGORITHM_SGD) {
    hp.momentum = 0.9f;
    hp.nesterov = c->nesterov;
  }
  lowbit_optimizer_t opt;
  CHECK(lowbit_optimizer_create(&opt, &cfg, &hp));
  lowbit_hparams_t hp2 = hp;
  hp2.lr *= 0.5f;
  hp2.weight_decay = 0.f;
  int32_t g2;
  CHECK(lowbit_optimizer_add_group(opt, &hp2, &g2));
  buf_t p[kParams], g[kParams];
  for (int k = 0; k < kParams; ++k) {
    int64_t n = 1;
    for (int d = 1; d <= kShapes[k][0]; ++d) n *= kShapes[k][d];
    p[k] = buf_new(n, c->pdtype);
    g[k] = buf_new(n, c->pdtype);
    fill(p[k].host, c->pdtype, n, 1.f);
    buf_push(&p[k]);
    lowbit_param_config_t pc;
    lowbit_param_config_init_sized(&pc, sizeof pc);
    pc.param = tensor(&p[k]);
    pc.grad = tensor(&g[k]);
    pc.group = k == 2 ? g2 : 0;
    pc.ndim = (int32_t)kShapes[k][0];
    for (int d = 0; d < pc.ndim; ++d) pc.shape[d] = kShapes[k][d + 1];
    int64_t id;
    CHECK(lowbit_optimizer_add_param(opt, &pc, &id));
  }
  uint64_t h = kFnvBasis;
  for (int step = 0; step < 4; ++step) {
    for (int k = 0; k < kParams; ++k) {
      fill(g[k].host, c->pdtype, g[k].numel, 0.1f);
      buf_push(&g[k]);
    }
    CHECK(lowbit_optimizer_set_lr(opt, 0, hp.lr * (1.f - 0.1f * (float)step)));
    CHECK(lowbit_optimizer_step(opt, NULL));
    for (int k = 0; k < kParams; ++k) h = buf_hash(h, &p[k]);
  }
  h = hash_checkpoint(h, opt, LOWBIT_CHECKPOINT_COMPRESSED);
  h = hash_checkpoint(h, opt, LOWBIT_CHECKPOINT_MATERIALIZED_FP32);
  CHECK(lowbit_optimizer_destroy(opt));
  for (int k = 0; k < kParams; ++k) buf_free(&p[k]), buf_free(&g[k]);
  return h;
}

static const char* algo_name(lowbit_algorithm_t a) {
  switch (a) {
    case LOWBIT_ALGORITHM_ADAMW: return "adamw";
    case LOWBIT_ALGORITHM_ADAM: return "adam";
    case LOWBIT_ALGORITHM_LION: return "lion";
    case LOWBIT_ALGORITHM_SGD: return "sgd";
    case LOWBIT_ALGORITHM_ONEBIT_ADAM: return "onebit_adam";
    case LOWBIT_ALGORITHM_ZEROONE_ADAM: return "zeroone_adam";
    case LOWBIT_ALGORITHM_ONEBIT_LAMB: return "onebit_lamb";
    default: return "?";
  }
}
static const char* dtype_name(lowbit_dtype_t d) {
  return d == LOWBIT_DTYPE_FLOAT32 ? "f32" : d == LOWBIT_DTYPE_BFLOAT16 ? "bf16" : "f16";
}

static void fused_all(void) {
  const lowbit_algorithm_t algos[] = {LOWBIT_ALGORITHM_ADAMW, LOWBIT_ALGORITHM_ADAM, LOWBIT_ALGORITHM_LION,
                                      LOWBIT_ALGORITHM_SGD, LOWBIT_ALGORITHM_SGD};
  const lowbit_state_format_t fmts[][2] = {{LOWBIT_STATE_FP32, LOWBIT_STATE_FP32}, {LOWBIT_STATE_BF16, LOWBIT_STATE_BF16},
                                           {LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT}, {LOWBIT_STATE_4BIT, LOWBIT_STATE_4BIT},
                                           {LOWBIT_STATE_FP8, LOWBIT_STATE_FP8},   {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT},
                                           {LOWBIT_STATE_4BIT_DYN, LOWBIT_STATE_4BIT_DYN}};
  const lowbit_normalization_t norms[][2] = {{LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_BLOCK},
                                             {LOWBIT_NORMALIZATION_RANK1, LOWBIT_NORMALIZATION_RANK1},
                                             {LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_FACTORED},
                                             {LOWBIT_NORMALIZATION_RANK1, LOWBIT_NORMALIZATION_FACTORED}};
  const struct {
    lowbit_dtype_t d;
    int rounding;
  } weights[] = {{LOWBIT_DTYPE_FLOAT32, 0}, {LOWBIT_DTYPE_BFLOAT16, 0}, {LOWBIT_DTYPE_BFLOAT16, 1},
                 {LOWBIT_DTYPE_BFLOAT16, 2}, {LOWBIT_DTYPE_FLOAT16, 1}};
  int index = 0;
  for (size_t a = 0; a < sizeof algos / sizeof algos[0]; ++a)
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; ++f)
      for (size_t nm = 0; nm < sizeof norms / sizeof norms[0]; ++nm)
        for (size_t w = 0; w < sizeof weights / sizeof weights[0]; ++w) {
          const int quantized = fmts[f][0] == LOWBIT_STATE_8BIT || fmts[f][0] == LOWBIT_STATE_4BIT ||
                                fmts[f][0] == LOWBIT_STATE_4BIT_DYN;
          const int adam = algos[a] == LOWBIT_ALGORITHM_ADAMW || algos[a] == LOWBIT_ALGORITHM_ADAM;
          if (nm > 0 && !quantized) continue;
          if (norms[nm][1] == LOWBIT_NORMALIZATION_FACTORED && !adam) continue;
          fused_case_t c = {algos[a], a == 4, fmts[f][0], fmts[f][1], norms[nm][0], norms[nm][1], weights[w].d,
                            weights[w].rounding};
          const uint64_t h = run_fused(&c, 0x9E3779B97F4A7C15ull + (uint64_t)index++);
          printf("fused %s%s m=%d/%d norm=%d/%d %s r%d %016llx\n", algo_name(c.algo), c.nesterov ? "-nesterov" : "",
                 (int)c.f1, (int)c.f2, (int)c.n1, (int)c.n2, dtype_name(c.pdtype), c.rounding,
                 (unsigned long long)h);
        }
}

#ifndef LOWBIT_SAME_BITS_NO_MPI
/* ---- 1-bit optimizers over MPI */

typedef struct {
  lowbit_algorithm_t algo;
  lowbit_dtype_t pdtype;
  int rounding;
  int mask;
  int average;  /* the warm-up averages (1) or runs on the caller's average (0) */
  int bad_step; /* a non-finite gradient on the last rank at this step (0: none) */
} onebit_case_t;

static uint64_t run_onebit(const onebit_case_t* c, lowbit_comm_t comm, int rank, int world) {
  g_rng = 0x1234567ull + (uint64_t)c->algo * 7919u + (uint64_t)rank;
  lowbit_optimizer_config_t cfg;
  lowbit_hparams_t hp;
  lowbit_optimizer_config_init_sized(&cfg, sizeof cfg, c->algo);
  lowbit_hparams_init(&hp, c->algo);
  cfg.device = g_cuda ? LOWBIT_DEVICE_CUDA : LOWBIT_DEVICE_CPU;
  cfg.seed = 77;
  cfg.stochastic_rounding = c->rounding == 1;
  cfg.error_correction = c->rounding == 2;
  cfg.num_threads = 1;
  cfg.freeze_step = c->algo == LOWBIT_ALGORITHM_ZEROONE_ADAM ? 6 : 3;
  hp.weight_decay = 0.01f;
  hp.lr = 1e-2f;
  lowbit_optimizer_t opt;
  CHECK(lowbit_optimizer_create(&opt, &cfg, &hp));
  CHECK(lowbit_optimizer_set_comm(opt, comm));
  CHECK(lowbit_optimizer_set_onebit_warmup_average(opt, c->average));
  if (c->algo != LOWBIT_ALGORITHM_ONEBIT_ADAM) {
    lowbit_onebit_options_t o;
    lowbit_onebit_options_init(&o);
    o.var_update_scaler = 2;
    o.local_step_scaler = 2;
    o.local_step_clipper = 4;
    o.factor_threshold = 0.2f;
    CHECK(lowbit_optimizer_set_onebit_options(opt, &o));
  }
  lowbit_hparams_t hp2 = hp;
  hp2.lr *= 0.5f;
  int32_t g2;
  CHECK(lowbit_optimizer_add_group(opt, &hp2, &g2));
  const int64_t sizes[3] = {70001, 1000, 3};
  buf_t p[3], g[3];
  for (int k = 0; k < 3; ++k) {
    p[k] = buf_new(sizes[k], c->pdtype);
    g[k] = buf_new(sizes[k], c->pdtype);
    const uint64_t keep = g_rng;
    g_rng = 99 + (uint64_t)k; /* the same params on every rank */
    fill(p[k].host, c->pdtype, sizes[k], 1.f);
    g_rng = keep;
    buf_push(&p[k]);
    lowbit_param_config_t pc;
    lowbit_param_config_init_sized(&pc, sizeof pc);
    pc.param = tensor(&p[k]);
    pc.grad = tensor(&g[k]);
    pc.group = k == 1 ? g2 : 0;
    int64_t id;
    CHECK(lowbit_optimizer_add_param(opt, &pc, &id));
  }
  if (c->mask) {
    uint8_t* m = malloc((size_t)sizes[1]);
    for (int64_t i = 0; i < sizes[1]; ++i) m[i] = (uint8_t)(i % 3 != 0);
    CHECK(lowbit_optimizer_set_momentum_mask(opt, 1, m, sizes[1]));
    free(m);
  }
  uint64_t h = kFnvBasis;
  for (int step = 1; step <= 16; ++step) {
    for (int k = 0; k < 3; ++k) {
      fill(g[k].host, c->pdtype, sizes[k], 0.1f);
      if (k == 1 && step == c->bad_step && rank == world - 1) {
        if (c->pdtype == LOWBIT_DTYPE_FLOAT32)
          ((float*)g[k].host)[5] = 1.f / 0.f;
        else
          ((uint16_t*)g[k].host)[5] = c->pdtype == LOWBIT_DTYPE_BFLOAT16 ? 0x7F80u : 0x7C00u;
      }
      buf_push(&g[k]);
    }
    CHECK(lowbit_optimizer_set_lr(opt, 0, hp.lr * (1.f - 0.03f * (float)step)));
    CHECK(lowbit_optimizer_step(opt, NULL));
    lowbit_onebit_status_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK(lowbit_optimizer_onebit_status(opt, &s));
    int32_t skipped = 0;
    CHECK(lowbit_optimizer_last_step_skipped(opt, &skipped));
    const int64_t fields[] = {s.step, s.phase, s.next_full_average, s.var_interval, s.var_counter,
                              s.local_step_interval, s.local_step_counter, s.next_exchange, skipped};
    h = fnv(h, fields, sizeof fields);
    for (int k = 0; k < 3; ++k) h = buf_hash(h, &p[k]);
  }
  h = hash_checkpoint(h, opt, LOWBIT_CHECKPOINT_COMPRESSED);
  int64_t size = 0;
  CHECK(lowbit_comm_save_errors(comm, NULL, 0, &size, NULL));
  void* blob = malloc((size_t)size);
  CHECK(lowbit_comm_save_errors(comm, blob, size, &size, NULL));
  h = fnv(h, blob, (size_t)size);
  free(blob);
  CHECK(lowbit_comm_reset_errors(comm, NULL));
  CHECK(lowbit_optimizer_destroy(opt));
  for (int k = 0; k < 3; ++k) buf_free(&p[k]), buf_free(&g[k]);
  return h;
}

static void onebit_all(void) {
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm mpi = MPI_COMM_WORLD;
  lowbit_comm_config_t cc;
  lowbit_comm_config_init(&cc);
  lowbit_comm_t comm;
  CHECK(lowbit_comm_create_mpi(&comm, &mpi, &cc));
  const lowbit_algorithm_t algos[] = {LOWBIT_ALGORITHM_ONEBIT_ADAM, LOWBIT_ALGORITHM_ZEROONE_ADAM,
                                      LOWBIT_ALGORITHM_ONEBIT_LAMB};
  const struct {
    lowbit_dtype_t d;
    int rounding;
  } weights[] = {{LOWBIT_DTYPE_FLOAT32, 0}, {LOWBIT_DTYPE_BFLOAT16, 1}, {LOWBIT_DTYPE_BFLOAT16, 2},
                 {LOWBIT_DTYPE_FLOAT16, 0}};
  for (size_t a = 0; a < 3; ++a)
    for (size_t w = 0; w < 4; ++w)
      for (int mask = 0; mask < 2; ++mask)
        for (int average = 0; average < 2; ++average)
          for (int bad = 0; bad < 2; ++bad) {
            onebit_case_t c = {algos[a], weights[w].d, weights[w].rounding, mask, average, bad ? 8 : 0};
            uint64_t h = run_onebit(&c, comm, rank, world);
            uint64_t all[64] = {0};
            MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
            if (rank == 0)
              printf("onebit np%d %s %s r%d mask%d avg%d bad%d %016llx\n", world, algo_name(c.algo),
                     dtype_name(c.pdtype), c.rounding, mask, average, c.bad_step,
                     (unsigned long long)fnv(kFnvBasis, all, sizeof(uint64_t) * (size_t)world));
          }
  CHECK(lowbit_comm_destroy(comm));
}
#endif

int main(int argc, char** argv) {
#ifndef LOWBIT_SAME_BITS_NO_MPI
  MPI_Init(&argc, &argv);
#endif
  const char* what = argc > 1 ? argv[1] : "fused";
  g_cuda = argc > 2 && strcmp(argv[2], "cuda") == 0;
  if (strcmp(what, "fused") == 0) {
    fused_all();
  } else {
#ifdef LOWBIT_SAME_BITS_NO_MPI
    fprintf(stderr, "same_bits: built without MPI, only the fused mode runs (asked: %s)\n", what);
    return 2;
#else
    onebit_all();
#endif
  }
  fflush(stdout);
#ifndef LOWBIT_SAME_BITS_NO_MPI
  MPI_Finalize();
#endif
  return 0;
}

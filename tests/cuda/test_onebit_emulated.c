/* The 1-bit optimizers with CUDA parameters (the CUDA engine and the
 * communicator's device path: on the emulation, linked with lowbit_emulated,
 * or on a GPU, linked with liblowbit as test_onebit_cuda, every rank on
 * device 0) against the CPU engine, bit for bit, under mpirun (1, 2 and 4
 * ranks): 1-bit Adam, 0/1 Adam and 1-bit LAMB in turn.
 *
 * Every rank runs two optimizers side by side, each with its own MPI
 * communicator: one with host tensors (CPU engine, host communicator path),
 * one with CUDA tensors (CUDA engine, device communicator path, staged through
 * pinned memory). Parameters: fp32 with a momentum mask, bf16 with stochastic
 * rounding over two chunks, fp16 with error correction. 1-bit Adam: bias
 * correction on, freeze_step 3. 0/1 Adam: var_freeze_step 5, the variance
 * interval doubling after every variance step, the local interval doubling
 * every 2 phase-2 steps up to 4, so the run has variance steps, 1-bit
 * gradient steps, synchronisations and local steps. 1-bit LAMB: freeze_step
 * 5, v_fresh seeded at step count 5, the scaling at the first compression
 * step. Gradients differ per rank. Steps 2 and 10 have a NaN gradient on rank
 * 0, steps 6 and 14 an Inf on the last rank: each is skipped on every rank
 * (1-bit Adam: the warm-up average, the compressed exchange; 0/1 Adam: a
 * variance step, a 1-bit step, a synchronisation, a local step; LAMB: a
 * warm-up step and two compression steps). After every step the params, the
 * skip flags and the 1-bit status, and at the end the whole optimizer state
 * and both communicator errors must be identical between the engines.
 * Resume: the CUDA run's checkpoint and communicator errors after step 2
 * (1-bit Adam: warm-up) or 9 (0/1 Adam: phase 2; LAMB: compression), loaded
 * into a fresh CUDA optimizer and communicator, must carry on to the same
 * bits as the uninterrupted CPU run. */
#include <mpi.h>

#include "cuda_test_util.h"
#include "../common/mpi_check.h"
#include "lowbit_comm.h"

#define NP 3
#define STEPS 16
static const int64_t SIZES[NP] = {3000, 70001, 129};
static const lowbit_dtype_t PDT[NP] = {LOWBIT_DTYPE_FLOAT32, LOWBIT_DTYPE_BFLOAT16, LOWBIT_DTYPE_FLOAT16};

static int rank, world;
static lowbit_algorithm_t algo;

static int64_t freeze_step(void) { return algo == LOWBIT_ALGORITHM_ONEBIT_ADAM ? 3 : 5; }
static int resume_after(void) { return algo == LOWBIT_ALGORITHM_ONEBIT_ADAM ? 2 : 9; }
static int bad_step(int s) { return s == 2 || s == 6 || s == 10 || s == 14; }
static const char* algo_name(void) {
  return algo == LOWBIT_ALGORITHM_ONEBIT_ADAM ? "1-bit Adam" : algo == LOWBIT_ALGORITHM_ZEROONE_ADAM ? "0/1 Adam" : "1-bit LAMB";
}


/* Deterministic values of magnitude 2^emin .. 1 for a key (rank, step, param). */
static void fill(void* out, lowbit_dtype_t d, int64_t n, int emin, uint64_t key) {
  uint64_t rng = key * 0x9E3779B97F4A7C15ull;
  ct_fill(out, d, n, emin, 0, &rng);
}

typedef struct {
  lowbit_device_t device;
  lowbit_comm_t comm;
  lowbit_optimizer_t opt;
  void* param[NP];
  void* grad[NP];
} run_t;

static void* alloc(lowbit_device_t d, size_t bytes) {
  void* p = NULL;
  if (d == LOWBIT_DEVICE_CUDA)
    CHECK(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc");
  else
    p = malloc(bytes);
  return p;
}

/* Emulated device memory is host memory: params are compared and filled directly. */
static void setup(run_t* r, lowbit_device_t device, const uint8_t* mask) {
  memset(r, 0, sizeof *r);
  r->device = device;
  MPI_Comm mc = MPI_COMM_WORLD;
  lowbit_comm_config_t cc;
  OK(lowbit_comm_config_init(&cc));
  cc.cuda_aware_mpi = LOWBIT_COMM_CUDA_AWARE_NEVER;
  OK(lowbit_comm_create_mpi(&r->comm, &mc, &cc));
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  OK(lowbit_optimizer_config_init(&c, algo));
  OK(lowbit_hparams_init(&h, algo));
  c.device = device;
  c.freeze_step = freeze_step();
  c.seed = 77;
  h.lr = 1e-2f;
  h.bias_correction = algo == LOWBIT_ALGORITHM_ONEBIT_ADAM; /* the others have none */
  h.weight_decay = 0.01f;
  OK(lowbit_optimizer_create(&r->opt, &c, &h));
  OK(lowbit_optimizer_set_comm(r->opt, r->comm));
  if (algo != LOWBIT_ALGORITHM_ONEBIT_ADAM) {
    lowbit_onebit_options_t o;
    OK(lowbit_onebit_options_init(&o));
    o.var_update_scaler = 1;
    o.local_step_scaler = 2;
    o.local_step_clipper = 4;
    o.factor_threshold = 0.05f;
    OK(lowbit_optimizer_set_onebit_options(r->opt, &o));
  }
  for (int i = 0; i < NP; ++i) {
    const size_t bytes = (size_t)SIZES[i] * ct_dtype_bytes(PDT[i]);
    r->param[i] = alloc(device, bytes);
    r->grad[i] = alloc(device, bytes);
    fill(r->param[i], PDT[i], SIZES[i], -4, 1000u + (uint64_t)i); /* the same params on every rank */
    lowbit_param_config_t pc;
    OK(lowbit_param_config_init(&pc));
    pc.param = (lowbit_tensor_t){r->param[i], SIZES[i], PDT[i], device, 0};
    pc.grad = (lowbit_tensor_t){r->grad[i], SIZES[i], PDT[i], device, 0};
    pc.stochastic_rounding = i == 1;
    pc.error_correction = i == 2;
    int64_t id;
    OK(lowbit_optimizer_add_param(r->opt, &pc, &id));
  }
  OK(lowbit_optimizer_set_momentum_mask(r->opt, 0, mask, SIZES[0]));
}

static void destroy(run_t* r) {
  lowbit_optimizer_destroy(r->opt);
  lowbit_comm_destroy(r->comm);
  for (int i = 0; i < NP; ++i) {
    if (r->device == LOWBIT_DEVICE_CUDA) {
      cudaFree(r->param[i]);
      cudaFree(r->grad[i]);
    } else {
      free(r->param[i]);
      free(r->grad[i]);
    }
  }
}

static void grads_for(run_t* r, int step) {
  for (int i = 0; i < NP; ++i) {
    fill(r->grad[i], PDT[i], SIZES[i], -12, (uint64_t)step * 7919u + (uint64_t)rank * 104729u + (uint64_t)i);
    const int nan = step == 2 || step == 10;
    const int bad = bad_step(step) && rank == (nan ? 0 : world - 1);
    if (bad && i == 1) {
      const uint16_t v = nan ? 0x7FC0u : 0x7F80u; /* bf16 NaN, +Inf */
      memcpy((char*)r->grad[i] + 2 * 4321, &v, 2);
    }
  }
}

static void step(run_t* r, int s) {
  grads_for(r, s);
  OK(lowbit_optimizer_step(r->opt, NULL));
  if (r->device == LOWBIT_DEVICE_CUDA) CHECK(cudaStreamSynchronize(NULL) == cudaSuccess, "sync");
}

static int skipped(run_t* r) {
  int32_t out = -1;
  OK(lowbit_optimizer_last_step_skipped(r->opt, &out));
  return out;
}

static void same_params(run_t* a, run_t* b, const char* what, int s) {
  for (int i = 0; i < NP; ++i)
    CHECK(memcmp(a->param[i], b->param[i], (size_t)SIZES[i] * ct_dtype_bytes(PDT[i])) == 0,
          "%s %s step %d: param %d differs between the CPU and the CUDA engine", algo_name(), what, s, i);
}

static void same_status(run_t* a, run_t* b, int s) {
  lowbit_onebit_status_t x, y;
  memset(&x, 0, sizeof x);
  memset(&y, 0, sizeof y);
  x.struct_size = y.struct_size = sizeof x;
  OK(lowbit_optimizer_onebit_status(a->opt, &x));
  OK(lowbit_optimizer_onebit_status(b->opt, &y));
  CHECK(memcmp(&x, &y, sizeof x) == 0,
        "%s step %d: 1-bit status differs (CPU step %lld phase %d exchange %d, CUDA step %lld phase %d exchange %d)",
        algo_name(), s, (long long)x.step, x.phase, x.next_exchange, (long long)y.step, y.phase, y.next_exchange);
}

static uint8_t* save_opt(run_t* r, int64_t* n) {
  OK(lowbit_optimizer_save(r->opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, n, NULL));
  uint8_t* b = malloc((size_t)*n);
  OK(lowbit_optimizer_save(r->opt, LOWBIT_CHECKPOINT_COMPRESSED, b, *n, n, NULL));
  return b;
}

static uint8_t* save_errors(run_t* r, int64_t* n) {
  OK(lowbit_comm_save_errors(r->comm, NULL, 0, n, NULL));
  uint8_t* b = malloc((size_t)*n);
  OK(lowbit_comm_save_errors(r->comm, b, *n, n, NULL));
  return b;
}

static void same_state(run_t* a, run_t* b, const char* what) {
  int64_t n0, n1, e0, e1;
  uint8_t *x = save_opt(a, &n0), *y = save_opt(b, &n1);
  CHECK(n0 == n1 && memcmp(x, y, (size_t)n0) == 0, "%s %s: optimizer state differs between the engines", algo_name(),
        what);
  uint8_t *u = save_errors(a, &e0), *v = save_errors(b, &e1);
  CHECK(e0 == e1 && memcmp(u, v, (size_t)e0) == 0, "%s %s: communicator errors differ between the engines",
        algo_name(), what);
  free(x), free(y), free(u), free(v);
}

static void run_algorithm(const uint8_t* mask) {
  run_t cpu, gpu;
  setup(&cpu, LOWBIT_DEVICE_CPU, mask);
  setup(&gpu, LOWBIT_DEVICE_CUDA, mask);
  uint8_t *ck = NULL, *errs = NULL;
  int64_t ck_n = 0, errs_n = 0;
  void* mid[NP];
  for (int s = 1; s <= STEPS; ++s) {
    step(&cpu, s);
    step(&gpu, s);
    const int expect_skip = bad_step(s);
    CHECK(skipped(&cpu) == expect_skip && skipped(&gpu) == expect_skip,
          "%s step %d: skipped CPU %d CUDA %d, expected %d", algo_name(), s, skipped(&cpu), skipped(&gpu), expect_skip);
    same_params(&cpu, &gpu, "", s);
    same_status(&cpu, &gpu, s);
    if (s == resume_after()) {
      ck = save_opt(&gpu, &ck_n);
      errs = save_errors(&gpu, &errs_n);
      for (int i = 0; i < NP; ++i) {
        const size_t bytes = (size_t)SIZES[i] * ct_dtype_bytes(PDT[i]);
        mid[i] = malloc(bytes);
        memcpy(mid[i], gpu.param[i], bytes);
      }
    }
  }
  same_state(&cpu, &gpu, "after the run");
  lowbit_param_info_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  OK(lowbit_optimizer_param_info(gpu.opt, 1, &info));
  CHECK(info.step == STEPS - 4, "%s: CUDA step count %lld, expected %d", algo_name(), (long long)info.step, STEPS - 4);

  /* Resume the CUDA run from its checkpoint. */
  run_t resumed;
  setup(&resumed, LOWBIT_DEVICE_CUDA, mask);
  for (int i = 0; i < NP; ++i) memcpy(resumed.param[i], mid[i], (size_t)SIZES[i] * ct_dtype_bytes(PDT[i]));
  OK(lowbit_optimizer_load(resumed.opt, ck, ck_n, NULL));
  OK(lowbit_comm_load_errors(resumed.comm, errs, errs_n, NULL));
  for (int s = resume_after() + 1; s <= STEPS; ++s) step(&resumed, s);
  same_params(&cpu, &resumed, "resumed", STEPS);
  same_state(&cpu, &resumed, "resumed");
  same_status(&cpu, &resumed, STEPS);

  if (rank == 0)
    printf("%s, %d ranks: CUDA engine = CPU engine bit for bit over %d steps (freeze at %lld, four "
           "skipped steps), resume after step %d included\n",
           algo_name(), world, STEPS, (long long)freeze_step(), resume_after());
  destroy(&resumed);
  destroy(&gpu);
  destroy(&cpu);
  for (int i = 0; i < NP; ++i) free(mid[i]);
  free(ck), free(errs);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (!ct_gpu_available()) {  /* the GPU build (test_onebit_cuda) without a GPU; the emulation always has one */
    MPI_Finalize();
    return CT_SKIP;
  }
  uint8_t* mask = malloc((size_t)SIZES[0]);
  uint64_t mask_rng = 5;
  for (int64_t i = 0; i < SIZES[0]; ++i) mask[i] = (uint8_t)(ct_next(&mask_rng) % 5 != 0);
  const lowbit_algorithm_t algos[3] = {LOWBIT_ALGORITHM_ONEBIT_ADAM, LOWBIT_ALGORITHM_ZEROONE_ADAM,
                                       LOWBIT_ALGORITHM_ONEBIT_LAMB};
  for (int a = 0; a < 3; ++a) {
    algo = algos[a];
    run_algorithm(mask);
  }
  free(mask);
  MPI_Finalize();
  return 0;
}

/* 1-bit Adam under mpirun: softmax regression on a generated data set, one
 * shard per rank. Checks: (1) the final loss is within 2% of full-precision
 * data-parallel Adam (the same optimizer with freeze_step beyond the run);
 * (2) all ranks hold identical params; (3) a checkpoint (optimizer state +
 * communicator errors) taken in the warm-up or in the compressed stage resumes
 * bit-identically; (4) masked momentum elements stay exactly zero. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"
#include "lowbit_comm.h"

#define D 48
#define C 6
#define NPR 1024 /* samples per rank */
#define NW (D * C)

static int rank, world;

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);      \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, "\n");                                              \
      MPI_Abort(MPI_COMM_WORLD, 1);                                       \
    }                                                                     \
  } while (0)
#define OK(call) CHECK((call) == LOWBIT_SUCCESS, "%s failed: %s", #call, lowbit_last_error())

static float X[NPR][D];
static int Y[NPR];

static unsigned lcg(unsigned* s) { return *s = *s * 1664525u + 1013904223u; }
static float unif(unsigned* s) { return (lcg(s) >> 8) / 16777216.0f; }
static float gauss(unsigned* s) {
  float u = unif(s) + 1e-7f, v = unif(s);
  return sqrtf(-2.f * logf(u)) * cosf(6.2831853f * v);
}

/* Teacher: a fixed random linear map; labels = argmax of teacher logits + noise. */
static void make_data(void) {
  unsigned ts = 7;
  static float T[D][C];
  for (int i = 0; i < D; ++i)
    for (int c = 0; c < C; ++c) T[i][c] = gauss(&ts);
  unsigned s = 1000u + (unsigned)rank;
  for (int n = 0; n < NPR; ++n) {
    float best = -1e30f;
    for (int i = 0; i < D; ++i) X[n][i] = gauss(&s);
    for (int c = 0; c < C; ++c) {
      float z = 0.f;
      for (int i = 0; i < D; ++i) z += X[n][i] * T[i][c];
      z += 2.f * gauss(&s);
      if (z > best) best = z, Y[n] = c;
    }
  }
}

/* Mean cross-entropy over this rank's shard and its gradient. */
static double loss_grad(const float* w, const float* b, float* gw, float* gb) {
  double loss = 0;
  if (gw) memset(gw, 0, sizeof(float) * NW), memset(gb, 0, sizeof(float) * C);
  for (int n = 0; n < NPR; ++n) {
    float z[C], mx = -1e30f, sum = 0.f;
    for (int c = 0; c < C; ++c) {
      z[c] = b[c];
      for (int i = 0; i < D; ++i) z[c] += X[n][i] * w[i * C + c];
      mx = z[c] > mx ? z[c] : mx;
    }
    for (int c = 0; c < C; ++c) sum += (z[c] = expf(z[c] - mx));
    loss -= log(z[Y[n]] / sum);
    if (!gw) continue;
    for (int c = 0; c < C; ++c) {
      float d = (z[c] / sum - (c == Y[n])) / NPR;
      gb[c] += d;
      for (int i = 0; i < D; ++i) gw[i * C + c] += d * X[n][i];
    }
  }
  return loss / NPR;
}

static double global_loss(const float* w, const float* b) {
  double l = loss_grad(w, b, NULL, NULL), g;
  MPI_Allreduce(&l, &g, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return g / world;
}

typedef struct {
  lowbit_optimizer_t opt;
  lowbit_comm_t comm;
  float w[NW], b[C], gw[NW], gb[C];
} Run;

static void setup(Run* r, int64_t freeze_step, const uint8_t* mask) {
  memset(r, 0, sizeof *r);
  lowbit_comm_config_t cc;
  OK(lowbit_comm_config_init(&cc));
  MPI_Comm mc = MPI_COMM_WORLD;
  OK(lowbit_comm_create_mpi(&r->comm, &mc, &cc));
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  OK(lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ONEBIT_ADAM));
  OK(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ONEBIT_ADAM));
  c.freeze_step = freeze_step;
  h.lr = 1e-2f;
  OK(lowbit_optimizer_create(&r->opt, &c, &h));
  OK(lowbit_optimizer_set_comm(r->opt, r->comm));
  lowbit_param_config_t pc;
  OK(lowbit_param_config_init(&pc));
  int64_t id;
  pc.param = (lowbit_tensor_t){r->w, NW, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.grad = (lowbit_tensor_t){r->gw, NW, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  OK(lowbit_optimizer_add_param(r->opt, &pc, &id));
  pc.param = (lowbit_tensor_t){r->b, C, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.grad = (lowbit_tensor_t){r->gb, C, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  OK(lowbit_optimizer_add_param(r->opt, &pc, &id));
  if (mask) OK(lowbit_optimizer_set_momentum_mask(r->opt, 0, mask, NW));
}

static void train(Run* r, int steps) {
  for (int t = 0; t < steps; ++t) {
    loss_grad(r->w, r->b, r->gw, r->gb);
    OK(lowbit_optimizer_step(r->opt, NULL));
  }
}

static void teardown(Run* r) {
  lowbit_optimizer_destroy(r->opt);
  lowbit_comm_destroy(r->comm);
}

/* Optimizer checkpoint + this rank's communicator errors. */
typedef struct {
  uint8_t *opt, *errs;
  int64_t opt_size, errs_size;
} Ckpt;

static Ckpt save(Run* r) {
  Ckpt k;
  OK(lowbit_optimizer_save(r->opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, &k.opt_size, NULL));
  k.opt = malloc((size_t)k.opt_size);
  OK(lowbit_optimizer_save(r->opt, LOWBIT_CHECKPOINT_COMPRESSED, k.opt, k.opt_size, &k.opt_size, NULL));
  OK(lowbit_comm_save_errors(r->comm, NULL, 0, &k.errs_size, NULL));
  k.errs = malloc((size_t)k.errs_size + 1);
  OK(lowbit_comm_save_errors(r->comm, k.errs, k.errs_size, &k.errs_size, NULL));
  return k;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  make_data();
  const int steps = 300, freeze = 60;

  /* (1) Loss against full-precision data-parallel Adam. */
  Run full, onebit;
  setup(&full, 1 << 30, NULL);
  setup(&onebit, freeze, NULL);
  double l0 = global_loss(full.w, full.b);
  train(&full, steps);
  train(&onebit, steps);
  double lf = global_loss(full.w, full.b), l1 = global_loss(onebit.w, onebit.b);
  if (rank == 0)
    printf("world %d: initial loss %.5f, full-precision Adam %.5f, 1-bit Adam %.5f (%+.2f%%) after %d steps "
           "(freeze at %d)\n", world, l0, lf, l1, 100 * (l1 - lf) / lf, steps, freeze);
  CHECK(l1 <= lf * 1.02, "1-bit Adam loss %.5f is not within 2%% of %.5f", l1, lf);
  CHECK(lf < 0.8 * l0, "the baseline did not train (%.5f -> %.5f)", l0, lf);

  /* (2) Every rank holds the same params. */
  float w0[NW];
  memcpy(w0, onebit.w, sizeof w0);
  MPI_Bcast(w0, NW, MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(memcmp(w0, onebit.w, sizeof w0) == 0, "params differ across ranks");
  teardown(&full);
  teardown(&onebit);

  /* (3) Resume from a checkpoint in either stage gives the same bits. */
  for (int at = freeze - 10; at <= freeze + 20; at += 30) {
    Run a, b;
    setup(&a, freeze, NULL);
    setup(&b, freeze, NULL);
    train(&a, at);
    Ckpt k = save(&a);
    memcpy(b.w, a.w, sizeof a.w), memcpy(b.b, a.b, sizeof a.b);
    OK(lowbit_optimizer_load(b.opt, k.opt, k.opt_size, NULL));
    if (at >= freeze) OK(lowbit_comm_load_errors(b.comm, k.errs, k.errs_size, NULL));
    train(&a, 25);
    train(&b, 25);
    CHECK(memcmp(a.w, b.w, sizeof a.w) == 0 && memcmp(a.b, b.b, sizeof a.b) == 0,
          "resuming at step %d differs from the uninterrupted run", at);
    free(k.opt), free(k.errs);
    teardown(&a), teardown(&b);
  }

  /* (4) Masked momentum stays exactly zero in both stages. */
  uint8_t mask[NW];
  for (int i = 0; i < NW; ++i) mask[i] = (uint8_t)(i % 5 != 0);
  Run m;
  setup(&m, 10, mask);
  train(&m, 30);
  float mom[NW];
  OK(lowbit_optimizer_read_moment(m.opt, 0, 0, mom, NW, NULL));
  int nonzero = 0;
  for (int i = 0; i < NW; ++i) {
    if (!mask[i]) CHECK(mom[i] == 0.f, "masked momentum %d is %g", i, mom[i]);
    nonzero += mom[i] != 0.f;
  }
  CHECK(nonzero > NW / 2, "unmasked momentum is zero");
  teardown(&m);
  if (rank == 0) printf("1-bit Adam: all checks passed at world size %d\n", world);
  MPI_Finalize();
  return 0;
}

/* 1-bit Adam under mpirun: softmax regression on a generated data set, one
 * shard per rank. Checks: (1) the final loss is within 2% of full-precision
 * data-parallel Adam (the same optimizer with freeze_step beyond the run);
 * (2) all ranks hold identical params; (3) a checkpoint (optimizer state +
 * communicator errors) taken in the warm-up or in the compressed stage resumes
 * bit-identically; (4) masked momentum elements stay exactly zero.
 *
 * With the argument "errors" (2+ ranks): a bad step on one rank fails on
 * every rank with nothing changed anywhere (params, moments, step counts,
 * communicator errors), and the next good step works: a missing grad, a NULL
 * grads array, a wrong num_grads, params at different step counts, ranks at
 * different steps, ranks in different stages, ranks with different
 * freeze_step, and a rank with no communicator (the others time out). Before
 * these were agreed on, the other ranks waited forever. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowbit.h"
#include "../common/mpi_check.h"
#include "lowbit_comm.h"

static int errors_main(void);

#define D 48
#define C 6
#define NPR 1024 /* samples per rank */
#define NW (D * C)

static int rank, world;


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

/* comm_timeout_ms > 0: the communicator times out (LOWBIT_COMM_TIMEOUT_MS);
 * set_comm == 0: the optimizer gets no communicator. */
static void setup_ex(Run* r, int64_t freeze_step, const uint8_t* mask, int set_comm, int64_t comm_timeout_ms);
static void setup(Run* r, int64_t freeze_step, const uint8_t* mask) { setup_ex(r, freeze_step, mask, 1, 0); }

static void setup_ex(Run* r, int64_t freeze_step, const uint8_t* mask, int set_comm, int64_t comm_timeout_ms) {
  memset(r, 0, sizeof *r);
  lowbit_comm_config_t cc;
  OK(lowbit_comm_config_init(&cc));
  MPI_Comm mc = MPI_COMM_WORLD;
  if (comm_timeout_ms) {
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)comm_timeout_ms);
    setenv("LOWBIT_COMM_TIMEOUT_MS", v, 1);
  }
  OK(lowbit_comm_create_mpi(&r->comm, &mc, &cc));
  unsetenv("LOWBIT_COMM_TIMEOUT_MS");
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  OK(lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ONEBIT_ADAM));
  OK(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ONEBIT_ADAM));
  c.freeze_step = freeze_step;
  h.lr = 1e-2f;
  OK(lowbit_optimizer_create(&r->opt, &c, &h));
  if (set_comm) OK(lowbit_optimizer_set_comm(r->opt, r->comm));
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
  if (argc > 1 && strcmp(argv[1], "errors") == 0) return errors_main();
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

  /* (5) Warm-up on gradients the caller averaged (lowbit_optimizer_set_onebit_warmup_average 0, e.g.
   * DDP): given the mean of every rank's gradients, the same params as averaging inside (up to the
   * order of the fp32 sum: MPI's here), through the freeze and after it. */
  {
    Run in, out;
    setup(&in, 10, NULL);
    setup(&out, 10, NULL);
    OK(lowbit_optimizer_set_onebit_warmup_average(out.opt, 0));
    for (int t = 0; t < 20; ++t) {
      loss_grad(in.w, in.b, in.gw, in.gb);
      OK(lowbit_optimizer_step(in.opt, NULL));
      loss_grad(out.w, out.b, out.gw, out.gb);
      if (t < 10) {  /* warm-up: the caller averages */
        MPI_Allreduce(MPI_IN_PLACE, out.gw, NW, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, out.gb, C, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < NW; ++i) out.gw[i] /= (float)world;
        for (int i = 0; i < C; ++i) out.gb[i] /= (float)world;
      }
      OK(lowbit_optimizer_step(out.opt, NULL));
    }
    double d = 0;
    for (int i = 0; i < NW; ++i) d = fmax(d, fabs((double)in.w[i] - out.w[i]));
    CHECK(d < 1e-4, "pre-averaged warm-up differs from the optimizer's own averaging by %g", d);
    float w0[NW];
    memcpy(w0, out.w, sizeof w0);
    MPI_Bcast(w0, NW, MPI_FLOAT, 0, MPI_COMM_WORLD);
    CHECK(memcmp(w0, out.w, sizeof w0) == 0, "pre-averaged warm-up: params differ across ranks");
    lowbit_comm_stats_t st;
    st.struct_size = sizeof st;
    OK(lowbit_comm_get_stats(out.comm, &st));
    CHECK(st.mean_calls == 0, "a pre-averaged warm-up all-reduced %lld times", (long long)st.mean_calls);
    /* bad values, and an optimizer without a warm-up */
    CHECK(lowbit_optimizer_set_onebit_warmup_average(out.opt, 2) == LOWBIT_ERROR_INVALID_ARGUMENT &&
              strstr(lowbit_optimizer_last_error(out.opt), "average"),
          "average = 2 was not refused");
    teardown(&in), teardown(&out);
    /* ranks disagreeing on the setting: every rank fails its warm-up step, nothing waits */
    if (world > 1) {
      Run r;
      setup(&r, 10, NULL);
      if (rank == 0) OK(lowbit_optimizer_set_onebit_warmup_average(r.opt, 0));
      loss_grad(r.w, r.b, r.gw, r.gb);
      CHECK(lowbit_optimizer_step(r.opt, NULL) == LOWBIT_ERROR_INVALID_ARGUMENT,
            "a step with the warm-up averaging set differently on rank 0 did not fail: %s",
            lowbit_optimizer_last_error(r.opt));
      teardown(&r);
    }
  }
  if (rank == 0) printf("1-bit Adam: all checks passed at world size %d\n", world);
  MPI_Finalize();
  return 0;
}

/* ------------------------------------------------------------ errors mode */

/* Everything a step may change on this rank. */
typedef struct {
  float w[NW], b[C], m[2][NW + C];
  int64_t steps[2];
  uint8_t* errs;
  int64_t errs_size;
} Snap;

static void snap(Run* r, Snap* s) {
  memcpy(s->w, r->w, sizeof s->w);
  memcpy(s->b, r->b, sizeof s->b);
  for (int k = 0; k < 2; ++k) {
    OK(lowbit_optimizer_read_moment(r->opt, 0, k, s->m[k], NW, NULL));
    OK(lowbit_optimizer_read_moment(r->opt, 1, k, s->m[k] + NW, C, NULL));
  }
  for (int p = 0; p < 2; ++p) {
    lowbit_param_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    OK(lowbit_optimizer_param_info(r->opt, p, &info));
    s->steps[p] = info.step;
  }
  OK(lowbit_comm_save_errors(r->comm, NULL, 0, &s->errs_size, NULL));
  s->errs = malloc((size_t)s->errs_size);
  OK(lowbit_comm_save_errors(r->comm, s->errs, s->errs_size, &s->errs_size, NULL));
}

static void same_snap(Run* r, Snap* before, const char* what) {
  Snap now;
  snap(r, &now);
  CHECK(memcmp(before->w, now.w, sizeof now.w) == 0 && memcmp(before->b, now.b, sizeof now.b) == 0,
        "%s: params changed", what);
  CHECK(memcmp(before->m, now.m, sizeof now.m) == 0, "%s: moments changed", what);
  CHECK(before->steps[0] == now.steps[0] && before->steps[1] == now.steps[1], "%s: step counts changed", what);
  CHECK(before->errs_size == now.errs_size && memcmp(before->errs, now.errs, (size_t)now.errs_size) == 0,
        "%s: communicator errors changed", what);
  free(now.errs);
  free(before->errs);
}

static void grads_of(Run* r, lowbit_tensor_t g[2]) {
  g[0] = (lowbit_tensor_t){r->gw, NW, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  g[1] = (lowbit_tensor_t){r->gb, C, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
}

/* The culprit's and the others' statuses and the text both must show. */
static void expect(lowbit_status_t got, lowbit_status_t want, const char* needle, const char* what) {
  const char* msg = lowbit_last_error();
  CHECK(got == want, "%s: status %d (%s), expected %d: %s", what, (int)got, lowbit_status_string(got), (int)want, msg);
  CHECK(strstr(msg, needle) != NULL, "%s: the message \"%s\" does not mention \"%s\"", what, msg, needle);
}

/* A step that must fail on every rank: on `culprit` with (culprit_status,
 * culprit_needle); elsewhere with others_status and a message naming the
 * culprit (when naming) and containing others_needle. Nothing may change. */
static void bad_step(Run* r, int culprit, const lowbit_tensor_t* culprit_grads, int64_t culprit_num,
                     lowbit_status_t culprit_status, const char* culprit_needle, lowbit_status_t others_status,
                     int naming, const char* others_needle, const char* what) {
  loss_grad(r->w, r->b, r->gw, r->gb);
  Snap before;
  snap(r, &before);
  lowbit_tensor_t g[2];
  grads_of(r, g);
  const double t0 = MPI_Wtime();
  lowbit_status_t st = rank == culprit ? lowbit_optimizer_step_with_grads(r->opt, culprit_grads, culprit_num, NULL)
                                       : lowbit_optimizer_step_with_grads(r->opt, g, 2, NULL);
  const double waited = MPI_Wtime() - t0;
  if (rank == 0) printf("%s: rank 0 (%.3f s): %s\n", what, waited, lowbit_last_error());
  if (rank == culprit) {
    expect(st, culprit_status, culprit_needle, what);
  } else {
    expect(st, others_status, others_needle, what);
    if (naming) {
      char who[64];
      snprintf(who, sizeof who, "rank %d rejected its arguments", culprit);
      expect(st, others_status, who, what);
    }
  }
  same_snap(r, &before, what);
}

/* Every rank steps normally and ends with the same params. */
static void good_step(Run* r, const char* what) {
  loss_grad(r->w, r->b, r->gw, r->gb);
  OK(lowbit_optimizer_step(r->opt, NULL));
  float w0[NW];
  memcpy(w0, r->w, sizeof w0);
  MPI_Bcast(w0, NW, MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(memcmp(w0, r->w, sizeof w0) == 0, "%s: params differ across ranks", what);
}

static int errors_main(void) {
  if (world < 2) {
    if (rank == 0) printf("errors mode needs 2 or more ranks\n");
    MPI_Finalize();
    return 77;
  }
  const int culprit = world - 1, freeze = 6;
  char needle[128];
  Run r;
  setup(&r, freeze, NULL);
  int done = 0; /* steps taken */
  for (int stage = 0; stage < 2; ++stage) {
    const int64_t at = stage ? freeze + 1 : 3; /* the step count of the bad steps */
    for (; done < at; ++done) good_step(&r, stage ? "compressed stage" : "warm-up");
    lowbit_tensor_t g[2];
    grads_of(&r, g);

    /* A missing grad on one rank. */
    lowbit_tensor_t missing[2] = {g[0], g[1]};
    missing[1].data = NULL;
    bad_step(&r, culprit, missing, 2, LOWBIT_ERROR_INVALID_ARGUMENT, "grad of param 1 is missing",
             LOWBIT_ERROR_INVALID_ARGUMENT, 1, "grad of param 1 is missing", "missing grad");
    /* No grads array, or a wrong count. */
    bad_step(&r, culprit, NULL, 2, LOWBIT_ERROR_NULL_POINTER, "grads is NULL", LOWBIT_ERROR_INVALID_ARGUMENT, 1,
             "grads is NULL", "NULL grads");
    bad_step(&r, culprit, g, 1, LOWBIT_ERROR_INVALID_ARGUMENT, "num_grads = 1", LOWBIT_ERROR_INVALID_ARGUMENT, 1,
             "num_grads = 1", "num_grads");
    /* A grad of the wrong size. */
    lowbit_tensor_t short_grad[2] = {g[0], g[1]};
    short_grad[0].numel = NW - 1;
    bad_step(&r, culprit, short_grad, 2, LOWBIT_ERROR_INVALID_ARGUMENT, "grads[0].numel",
             LOWBIT_ERROR_INVALID_ARGUMENT, 1, "grads[0].numel", "grad numel");
    /* Params at different step counts on one rank. */
    if (rank == culprit) OK(lowbit_optimizer_set_step(r.opt, 1, at + 2, NULL));
    bad_step(&r, culprit, g, 2, LOWBIT_ERROR_INVALID_STATE, "different step counts", LOWBIT_ERROR_INVALID_ARGUMENT,
             1, "different step counts", "params at different steps");
    if (rank == culprit) OK(lowbit_optimizer_set_step(r.opt, 1, at, NULL));
    /* One rank at another step, in the same stage. */
    if (rank == culprit) OK(lowbit_optimizer_set_step(r.opt, -1, at + 1, NULL));
    snprintf(needle, sizeof needle, "at steps %d to %d", (int)at, (int)at + 1);
    bad_step(&r, culprit, g, 2, LOWBIT_ERROR_INVALID_ARGUMENT, needle, LOWBIT_ERROR_INVALID_ARGUMENT, 0, needle,
             "ranks at different steps");
    /* One rank in the other stage. */
    if (rank == culprit) OK(lowbit_optimizer_set_step(r.opt, -1, stage ? 0 : freeze, NULL));
    bad_step(&r, culprit, g, 2, LOWBIT_ERROR_INVALID_ARGUMENT, "but some rank is in the", LOWBIT_ERROR_INVALID_ARGUMENT,
             0, "but some rank is in the", "ranks in different stages");
    if (rank == culprit) OK(lowbit_optimizer_set_step(r.opt, -1, at, NULL));
    /* Every rank still in step. */
    good_step(&r, "after the bad steps");
    good_step(&r, "after the bad steps");
    done += 2;
  }
  teardown(&r);

  /* Different freeze_step: every rank fails at the first step, instead of
   * deadlocking when the first of them leaves the warm-up. */
  {
    Run f;
    setup(&f, rank == culprit ? 3 : 5, NULL);
    int t = 0;
    lowbit_status_t st = LOWBIT_SUCCESS;
    for (; t < 6 && st == LOWBIT_SUCCESS; ++t) {
      loss_grad(f.w, f.b, f.gw, f.gb);
      Snap before;
      snap(&f, &before);
      st = lowbit_optimizer_step(f.opt, NULL);
      if (st != LOWBIT_SUCCESS) same_snap(&f, &before, "different freeze_step");
      else free(before.errs);
    }
    if (rank == 0) printf("different freeze_step: rank 0: %s\n", lowbit_last_error());
    CHECK(t == 1, "ranks with different freeze_step stepped %d times", t - 1);
    expect(st, LOWBIT_ERROR_INVALID_ARGUMENT, "freeze_step is", "different freeze_step");
    teardown(&f);
  }

  /* No communicator on one rank: it fails at once; the others, whose
   * communicator has a timeout, fail when it expires. Nothing changes. */
  {
    Run n;
    const int64_t timeout_ms = 300;
    setup_ex(&n, freeze, NULL, rank != culprit, timeout_ms);
    loss_grad(n.w, n.b, n.gw, n.gb);
    Snap before;
    snap(&n, &before);
    const lowbit_status_t st = lowbit_optimizer_step(n.opt, NULL);
    if (rank == culprit)
      expect(st, LOWBIT_ERROR_INVALID_STATE, "needs a communicator", "no communicator");
    else
      expect(st, LOWBIT_ERROR_COMMUNICATION, "timed out", "no communicator");
    if (rank == 0) printf("no communicator on rank %d: rank 0: %s\n", culprit, lowbit_last_error());
    same_snap(&n, &before, "no communicator");
    teardown(&n);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("1-bit Adam: bad steps fail on every rank at world size %d\n", world);
  MPI_Finalize();
  return 0;
}

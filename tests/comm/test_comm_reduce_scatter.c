/* The compressed reduce-scatter (lowbit_comm_compressed_reduce_scatter,
 * docs/COMMUNICATOR.md section 2b) against a float64 simulation of its rule,
 * bit for bit, over MPI_COMM_WORLD, a communicator with the ranks in reverse
 * order and a callback transport, on sizes around the padding (8W - 1, 8W,
 * 8W + 1), below the world size, across a sum-of-squares segment (8193) and
 * the threaded path (65537).
 *
 * The simulation is written from the specification, not from comm/: every
 * fp32 operation of the rule is a float64 operation rounded to fp32 (which
 * gives the fp32 result exactly: double has more than 2 * 24 + 2 bits), the
 * sums of squares in double in the specified order. Per call (the simulation
 * starts from every rank's errors as the library holds them, so each call is
 * checked on its own; sequences mix in compressed allreduces, whose lazily
 * kept errors the reduce-scatter then reads):
 *  - out, this rank's chunk [r C, r C + c_r) (lowbit_comm_reduce_scatter_chunk),
 *    equals the simulation bit for bit; nothing outside it is written; the
 *    tensor is unchanged (or, in place, only its chunk is overwritten);
 *  - the worker error equals the simulation's bit for bit, the server error
 *    is unchanged;
 *  - the counters grow by one call, n elements and (W-1) (4 + C/8) bytes.
 * Refused calls (a bad out on one rank, mismatched numel or operation, a NaN
 * on one rank, scales whose sum overflows, a CUDA tensor, a failing
 * transport function) fail on every rank with nothing changed (the error
 * blob, out, the tensor), and the next call works. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "comm_harness.h"
#include "comm_transports.h"

/* ---- the simulation */

static void tree256(double* t) {
  for (int h = 128; h > 0; h >>= 1)
    for (int i = 0; i < h; ++i) t[i] += t[i + h];
}

/* The sum of squares of v[0 .. count) in the specified order: segments of
 * 8192, lane j % 2048 of a segment adds its elements in order, the lanes
 * fold in groups of 8 then a tree over 256; segment s into accumulator
 * s % 256; a tree over the accumulators. */
static double ordered_sumsq(const float* v, int64_t count) {
  static double lane[2048];
  double acc[256] = {0};
  for (int64_t s0 = 0, seg = 0; s0 < count; s0 += 8192, ++seg) {
    memset(lane, 0, sizeof lane);
    for (int64_t j = 0; j < 8192 && s0 + j < count; ++j) {
      const double x = (double)v[s0 + j];
      lane[j % 2048] += x * x;
    }
    double t[256];
    for (int c = 0; c < 256; ++c) {
      const double* a = lane + 8 * c;
      t[c] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    }
    tree256(t);
    acc[seg % 256] += t[0];
  }
  tree256(acc);
  return acc[0];
}

static float f32(double v) { return (float)v; }

/* One call of the rule over all ranks: in[j] (n floats) and e[j] (n floats,
 * updated) for every rank j; out_r (c_r floats) gets rank r's chunk. */
static void sim_reduce_scatter(int64_t n, int W, int r, float* const* in, float* const* e, float* out_r) {
  const sim_layout_t l = sim_layout(n, W);
  float* x = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* s = (float*)xmalloc(sizeof(float) * (size_t)W);
  unsigned char** bit = (unsigned char**)xmalloc(sizeof(unsigned char*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    bit[j] = (unsigned char*)xmalloc((size_t)n);
    for (int64_t i = 0; i < n; ++i) x[i] = f32((double)in[j][i] + (double)e[j][i]);
    s[j] = f32(sqrt(ordered_sumsq(x, n) / (double)n));
    for (int64_t i = 0; i < n; ++i) {
      bit[j][i] = x[i] >= 0.0f;
      e[j][i] = f32((double)x[i] - (bit[j][i] ? (double)s[j] : -(double)s[j]));
    }
  }
  const int64_t c = sim_real_in_chunk(&l, r);
  for (int64_t i = 0; i < c; ++i) {
    const int64_t g = (int64_t)r * l.chunk + i;
    float a = 0.0f;
    for (int j = 0; j < W; ++j) a = f32((double)a + (bit[j][g] ? (double)s[j] : -(double)s[j]));
    out_r[i] = f32((double)a / (double)W);
  }
  for (int j = 0; j < W; ++j) free(bit[j]);
  free(bit);
  free(s);
  free(x);
}

/* ---- helpers */

static unsigned char* save_blob(lowbit_comm_t comm, int64_t* size) {
  CHECK_OK(comm, lowbit_comm_save_errors(comm, NULL, 0, size, NULL));
  unsigned char* b = (unsigned char*)xmalloc((size_t)*size + 1);
  int64_t got = 0;
  CHECK_OK(comm, lowbit_comm_save_errors(comm, b, *size, &got, NULL));
  return b;
}

static lowbit_comm_stats_t stats_of(lowbit_comm_t comm) {
  lowbit_comm_stats_t s;
  s.struct_size = sizeof s;
  CHECK_OK(comm, lowbit_comm_get_stats(comm, &s));
  return s;
}

/* Every rank's worker errors as the library holds them (zeros when unbound). */
static void library_errors(lowbit_comm_t comm, int64_t n, int W, float* const* e) {
  int64_t wn = 0, sn = 0;
  CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn));
  int any = wn != 0, all = 0;
  MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    for (int j = 0; j < W; ++j) memset(e[j], 0, sizeof(float) * (size_t)n);
    return;
  }
  const sim_layout_t l = sim_layout(n, W);
  double** werr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  double** serr = (double**)xmalloc(sizeof(double*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    werr[j] = (double*)xmalloc(sizeof(double) * (size_t)n);
    serr[j] = (double*)xmalloc(sizeof(double) * (size_t)(sim_real_in_chunk(&l, j) + 1));
  }
  gather_errors(comm, &l, werr, serr);
  for (int j = 0; j < W; ++j) {
    for (int64_t i = 0; i < n; ++i) e[j][i] = (float)werr[j][i]; /* exact: they were floats */
    free(werr[j]);
    free(serr[j]);
  }
  free(werr);
  free(serr);
}

static int64_t g_checked = 0;

/* One checked reduce-scatter of the inputs of call `k` (in place when
 * `in_place`). */
static void checked_call(lowbit_comm_t comm, int64_t n, uint64_t tag, int k, int in_place) {
  int32_t r = 0, W = 0;
  CHECK_OK(comm, lowbit_comm_rank(comm, &r));
  CHECK_OK(comm, lowbit_comm_world_size(comm, &W));
  const sim_layout_t l = sim_layout(n, W);
  int64_t off = -1, c = -1;
  CHECK_OK(comm, lowbit_comm_reduce_scatter_chunk(comm, n, &off, &c));
  CHECK(off == (int64_t)r * l.chunk && c == sim_real_in_chunk(&l, r),
        "n %lld: chunk [%lld, +%lld), expected [%lld, +%lld)", (long long)n, (long long)off, (long long)c,
        (long long)r * l.chunk, (long long)sim_real_in_chunk(&l, r));

  float** in = (float**)xmalloc(sizeof(float*) * (size_t)W);
  float** e = (float**)xmalloc(sizeof(float*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    in[j] = (float*)xmalloc(sizeof(float) * (size_t)n);
    e[j] = (float*)xmalloc(sizeof(float) * (size_t)n);
    fill_normal(in[j], n, harness_seed(), tag * 1000003ull + (uint64_t)k * 64 + (uint64_t)j, 1.0 + 0.5 * j);
    if (n > 3) {
      in[j][n / 3] = 0.0f;
      in[j][n / 2] = -0.0f;
    }
  }
  library_errors(comm, n, W, e);
  float* want = (float*)xmalloc(sizeof(float) * (size_t)(c + 1));
  sim_reduce_scatter(n, W, r, in, e, want);

  /* the server error before the call, to check it is left alone */
  int64_t wn = 0, sn = 0;
  CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn));
  float* serr0 = (float*)xmalloc(sizeof(float) * (size_t)(sn + 1));
  if (sn) CHECK_OK(comm, lowbit_comm_read_errors(comm, NULL, 0, serr0, sn, NULL));

  const int64_t guard = 16;
  float* mine = (float*)xmalloc(sizeof(float) * (size_t)(n + guard));
  memcpy(mine, in[r], sizeof(float) * (size_t)n);
  for (int64_t g = 0; g < guard; ++g) mine[n + g] = 777.0f + (float)g;
  float* out = (float*)xmalloc(sizeof(float) * (size_t)(c + 2 * guard));
  for (int64_t i = 0; i < c + 2 * guard; ++i) out[i] = -555.0f - (float)i;
  lowbit_tensor_t t = host_tensor(mine, n);
  lowbit_tensor_t o = host_tensor(in_place ? mine + off : out + guard, c);
  if (c == 0) o.data = NULL; /* an empty chunk takes no memory */
  const lowbit_comm_stats_t s0 = stats_of(comm);
  CHECK_OK(comm, lowbit_comm_compressed_reduce_scatter(comm, &t, &o, NULL));
  const lowbit_comm_stats_t s1 = stats_of(comm);
  CHECK(s1.compressed_calls == s0.compressed_calls + 1 && s1.compressed_elements == s0.compressed_elements + n &&
            s1.compressed_bytes_sent - s0.compressed_bytes_sent == (int64_t)(W - 1) * (4 + l.chunk / 8),
        "n %lld: counters grew by %lld calls, %lld elements, %lld bytes (expected 1, n, (W-1)(4+C/8) = %lld)",
        (long long)n, (long long)(s1.compressed_calls - s0.compressed_calls),
        (long long)(s1.compressed_elements - s0.compressed_elements),
        (long long)(s1.compressed_bytes_sent - s0.compressed_bytes_sent), (long long)((W - 1) * (4 + l.chunk / 8)));
  int32_t nf = -1;
  CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
  CHECK(nf == 0, "last_nonfinite is %d after a finite call", nf);

  const float* got = in_place ? mine + off : out + guard;
  for (int64_t i = 0; i < c; ++i)
    CHECK(memcmp(&got[i], &want[i], 4) == 0, "n %lld call %d%s: out[%lld] (element %lld) is %.9g, simulation %.9g",
          (long long)n, k, in_place ? " (in place)" : "", (long long)i, (long long)(off + i), (double)got[i],
          (double)want[i]);
  g_checked += c;
  for (int64_t g = 0; g < guard; ++g) CHECK(mine[n + g] == 777.0f + (float)g, "n %lld: wrote past the tensor", (long long)n);
  for (int64_t i = 0; i < n; ++i) {
    if (in_place && i >= off && i < off + c) continue;
    CHECK(memcmp(&mine[i], &in[r][i], 4) == 0, "n %lld: the tensor's element %lld was changed", (long long)n,
          (long long)i);
  }
  if (!in_place) {
    for (int64_t g = 0; g < guard; ++g)
      CHECK(out[g] == -555.0f - (float)g && out[guard + c + g] == -555.0f - (float)(guard + c + g),
            "n %lld: wrote outside out", (long long)n);
  }
  float* lib_w = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* serr1 = (float*)xmalloc(sizeof(float) * (size_t)(sn + 1));
  int64_t sn1 = 0;
  CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn1));
  CHECK(wn == n && sn1 == sim_real_in_chunk(&l, r), "error numel %lld/%lld after the call", (long long)wn,
        (long long)sn1);
  CHECK_OK(comm, lowbit_comm_read_errors(comm, lib_w, n, sn ? serr1 : NULL, sn, NULL));
  for (int64_t i = 0; i < n; ++i)
    CHECK(memcmp(&lib_w[i], &e[r][i], 4) == 0, "n %lld call %d: worker error %lld is %.9g, simulation %.9g",
          (long long)n, k, (long long)i, (double)lib_w[i], (double)e[r][i]);
  if (sn) CHECK(memcmp(serr0, serr1, sizeof(float) * (size_t)sn) == 0, "n %lld: the server error changed", (long long)n);
  check_same_on_all_ranks((uint64_t)n, "numel");

  for (int j = 0; j < W; ++j) {
    free(in[j]);
    free(e[j]);
  }
  free(in);
  free(e);
  free(want);
  free(serr0);
  free(serr1);
  free(mine);
  free(out);
  free(lib_w);
}

/* A compressed allreduce of fresh inputs (its result is test_comm_sim's
 * business): it leaves the errors in their lazy form. */
static void allreduce_between(lowbit_comm_t comm, int64_t n, uint64_t tag) {
  float* v = (float*)xmalloc(sizeof(float) * (size_t)n);
  fill_normal(v, n, harness_seed(), tag * 7919ull + (uint64_t)g_rank, 2.0);
  lowbit_tensor_t t = host_tensor(v, n);
  CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL));
  free(v);
}

static void run_sizes(lowbit_comm_t comm, uint64_t tag) {
  int32_t W = 0;
  CHECK_OK(comm, lowbit_comm_world_size(comm, &W));
  const int64_t u = 8 * (int64_t)W;
  uint64_t st = mix64(harness_seed() + tag);
  const int64_t random_size = 1 + (int64_t)(uniform01(&st) * 30000.0);
  const int64_t sizes[] = {1, 2, 3, W > 1 ? W - 1 : 5, W, W + 1, 7, u - 1, u, u + 1, 2 * u + 1, 1001, 8193,
                           65537, random_size};
  const int count = (int)(sizeof sizes / sizeof sizes[0]);
  for (int i = 0; i < count; ++i) {
    const int64_t n = sizes[i];
    const uint64_t tg = tag * 100 + (uint64_t)i;
    CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));
    /* unbound (zero errors), stored errors, in place, after an allreduce
     * (lazy errors), and again */
    checked_call(comm, n, tg, 0, 0);
    checked_call(comm, n, tg, 1, 0);
    checked_call(comm, n, tg, 2, 1);
    allreduce_between(comm, n, tg);
    checked_call(comm, n, tg, 3, 0);
    checked_call(comm, n, tg, 4, n % 2);
  }
  if (g_rank == 0) printf("  %d sizes (random one: %lld) bit-identical to the simulation\n", count, (long long)random_size);
}

/* ---- refused calls */

typedef struct {
  int64_t blob_size;
  unsigned char* blob;
  lowbit_comm_stats_t stats;
} snapshot_t;

static snapshot_t snap(lowbit_comm_t comm) {
  snapshot_t s;
  s.blob = save_blob(comm, &s.blob_size);
  s.stats = stats_of(comm);
  return s;
}

/* The errors unchanged and (unless `exchanged`) the counters too. */
static void check_unchanged(lowbit_comm_t comm, snapshot_t* before, int exchanged, const char* what) {
  int64_t size = 0;
  unsigned char* after = save_blob(comm, &size);
  CHECK(size == before->blob_size && memcmp(after, before->blob, (size_t)size) == 0, "%s: the errors changed", what);
  const lowbit_comm_stats_t s = stats_of(comm);
  CHECK(s.compressed_calls == before->stats.compressed_calls + (exchanged ? 1 : 0), "%s: the counters (%lld calls)",
        what, (long long)(s.compressed_calls - before->stats.compressed_calls));
  free(after);
  free(before->blob);
}

static void refused_calls(lowbit_comm_t comm, int callbacks) {
  int32_t r = 0, W = 0;
  CHECK_OK(comm, lowbit_comm_rank(comm, &r));
  CHECK_OK(comm, lowbit_comm_world_size(comm, &W));
  const int64_t n = 1000;
  const sim_layout_t l = sim_layout(n, W);
  const int64_t c = sim_real_in_chunk(&l, r), off = (int64_t)r * l.chunk;
  float* v = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* copy = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* out = (float*)xmalloc(sizeof(float) * (size_t)(c + 1));
  CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));
  checked_call(comm, n, 4242, 0, 0); /* bound, with errors */
  fill_normal(v, n, harness_seed(), 99u + (uint64_t)r, 1.0);
  memcpy(copy, v, sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < c; ++i) out[i] = -1.0f;
  lowbit_tensor_t t = host_tensor(v, n), o = host_tensor(out, c);
  char needle[128];
  snapshot_t s;

#define UNTOUCHED(what)                                                                             \
  do {                                                                                              \
    CHECK(memcmp(v, copy, sizeof(float) * (size_t)n) == 0, "%s: the tensor changed", what);         \
    for (int64_t i_ = 0; i_ < c; ++i_) CHECK(out[i_] == -1.0f, "%s: out was written", what); \
  } while (0)

  /* a bad out on the last rank only: every rank fails */
  if (W > 1) {
    s = snap(comm);
    lowbit_tensor_t bad = o;
    if (r == W - 1) bad.numel = c + 1;
    snprintf(needle, sizeof needle, "rank %d rejected its arguments: out.numel is", W - 1);
    CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &t, &bad, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 r == W - 1 ? "out.numel is" : needle);
    check_unchanged(comm, &s, 0, "bad out.numel on one rank");
    UNTOUCHED("bad out.numel on one rank");
  }
  /* NULL out, a bf16 out, NULL out.data, a CUDA tensor: refused on every rank */
  s = snap(comm);
  CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &t, NULL, NULL), LOWBIT_ERROR_NULL_POINTER,
               "out is NULL");
  lowbit_tensor_t bf = o;
  bf.dtype = LOWBIT_DTYPE_BFLOAT16;
  CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &t, &bf, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
               "out.dtype");
  lowbit_tensor_t cuda = t;
  cuda.device = LOWBIT_DEVICE_CUDA;
  CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &cuda, &o, NULL), LOWBIT_ERROR_UNSUPPORTED, "CUDA");
  if (c > 0) {
    lowbit_tensor_t nul = o;
    nul.data = NULL;
    CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &t, &nul, NULL), LOWBIT_ERROR_NULL_POINTER,
                 "out.data is NULL");
  }
  check_unchanged(comm, &s, 0, "bad arguments");
  UNTOUCHED("bad arguments");

  if (W > 1) {
    /* mismatched numel: rank 0 passes n + 1 (with its chunk's out) */
    s = snap(comm);
    float* w = (float*)xmalloc(sizeof(float) * (size_t)(n + 1));
    memcpy(w, v, sizeof(float) * (size_t)n);
    w[n] = 1.0f;
    lowbit_tensor_t t1 = host_tensor(w, r == 0 ? n + 1 : n);
    int64_t c1 = 0;
    CHECK_OK(comm, lowbit_comm_reduce_scatter_chunk(comm, t1.numel, NULL, &c1));
    float* o1buf = (float*)xmalloc(sizeof(float) * (size_t)(c1 + 1));
    lowbit_tensor_t o1 = host_tensor(o1buf, c1);
    CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &t1, &o1, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 r == 0 ? "this communicator's error buffers are bound to numel" : "rank 0 rejected its arguments");
    check_unchanged(comm, &s, 0, "numel bound to another");
    free(o1buf);
    free(w);
    /* mismatched operation: rank 0 reduce-scatters, the others allreduce */
    s = snap(comm);
    if (r == 0)
      CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &t, &o, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                   "lowbit_comm_compressed");
    else
      CHECK_STATUS(comm, lowbit_comm_compressed_allreduce(comm, &t, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                   "lowbit_comm_compressed_reduce_scatter");
    check_unchanged(comm, &s, 0, "mismatched operation");
    UNTOUCHED("mismatched operation");
  }
  /* a NaN on the last rank */
  s = snap(comm);
  if (r == W - 1) v[n / 2] = NAN;
  snprintf(needle, sizeof needle, "of rank %d holds a NaN or an Inf", W - 1);
  CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &t, &o, NULL), LOWBIT_ERROR_NONFINITE, needle);
  int32_t nf = 0;
  CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
  CHECK(nf == 1, "last_nonfinite %d after a NaN", nf);
  check_unchanged(comm, &s, 0, "a NaN on one rank");
  if (r == W - 1) v[n / 2] = copy[n / 2];
  UNTOUCHED("a NaN on one rank");
  /* scales whose sum overflows (every rank's input near FLT_MAX): refused
   * after the exchange, on every rank alike */
  if (W > 1) {
    CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));
    float* big = (float*)xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; ++i) big[i] = 3.0e38f;
    lowbit_tensor_t tb = host_tensor(big, n);
    s = snap(comm);
    CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &tb, &o, NULL), LOWBIT_ERROR_NONFINITE,
                 "sum of the ranks' scales overflowed");
    CHECK_OK(comm, lowbit_comm_last_nonfinite(comm, &nf));
    CHECK(nf == 1, "last_nonfinite %d after an overflow", nf);
    /* the call bound the (reset) communicator to n with zero errors: the blob
     * of an unbound communicator has numel 0, so compare the values */
    float* we = (float*)xmalloc(sizeof(float) * (size_t)n);
    CHECK_OK(comm, lowbit_comm_read_errors(comm, we, n, NULL, 0, NULL));
    for (int64_t i = 0; i < n; ++i) CHECK(we[i] == 0.0f, "overflow: the worker error changed");
    for (int64_t i = 0; i < c; ++i) CHECK(out[i] == -1.0f, "overflow: out was written");
    const lowbit_comm_stats_t st = stats_of(comm);
    CHECK(st.compressed_calls == s.stats.compressed_calls + 1, "overflow: the exchange is counted");
    free(s.blob);
    free(we);
    free(big);
  }
  /* a transport function that fails on every rank (the all-to-all, the
   * second function of the call after the agreement) */
  if (callbacks) {
    s = snap(comm);
    callback_comm_fail_at(comm, 2);
    CHECK_STATUS(comm, lowbit_comm_compressed_reduce_scatter(comm, &t, &o, NULL), LOWBIT_ERROR_COMMUNICATION,
                 "alltoall");
    callback_comm_fail_at(comm, 0);
    check_unchanged(comm, &s, 0, "a failing all-to-all");
    UNTOUCHED("a failing all-to-all");
  }
  /* the chunk query's bad arguments */
  int64_t a = 0;
  CHECK_STATUS(comm, lowbit_comm_reduce_scatter_chunk(comm, 0, &a, &a), LOWBIT_ERROR_INVALID_ARGUMENT, "numel is 0");
  CHECK_STATUS(comm, lowbit_comm_reduce_scatter_chunk(comm, n, NULL, NULL), LOWBIT_ERROR_NULL_POINTER, "NULL");
  /* and the communicator still works */
  CHECK_OK(comm, lowbit_comm_reset_errors(comm, NULL));
  checked_call(comm, n, 4343, 0, 0);
  (void)off;
#undef UNTOUCHED
  if (g_rank == 0) printf("  refused calls: every rank failed, nothing changed\n");
  free(v);
  free(copy);
  free(out);
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);

  lowbit_comm_t world = make_world_comm();
  if (g_rank == 0) printf("MPI_COMM_WORLD:\n");
  run_sizes(world, 1);
  refused_calls(world, 0);
  CHECK_OK(world, lowbit_comm_destroy(world));

  MPI_Comm rev;
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_world - g_rank, &rev);
  lowbit_comm_t rc = NULL;
  CHECK_OK(rc, lowbit_comm_create_mpi(&rc, &rev, NULL));
  if (g_rank == 0) printf("reversed communicator:\n");
  run_sizes(rc, 2);
  CHECK_OK(rc, lowbit_comm_destroy(rc));
  MPI_Comm_free(&rev);

  lowbit_comm_t cb = make_callback_comm(MPI_COMM_WORLD, 1);
  if (g_rank == 0) printf("callback transport:\n");
  run_sizes(cb, 3);
  refused_calls(cb, 1);
  destroy_callback_comm(cb);

  if (g_rank == 0) printf("%lld output elements bit-identical to the simulation\n", (long long)g_checked);
  return harness_finish();
}

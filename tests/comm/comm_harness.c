#include "comm_harness.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "../common/test_seed.h"

int g_rank = 0, g_world = 1;
static uint64_t g_seed = 0;

void harness_fail(const char* file, int line, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[rank %d/%d] FAILED at %s:%d: %s (seed %llu)\n", g_rank, g_world, file, line, buf,
          (unsigned long long)g_seed);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

void check_status_impl(const char* file, int line, const char* what, lowbit_status_t got, lowbit_status_t expected,
                       lowbit_comm_t comm, const char* needle) {
  const char* tl = lowbit_last_error();
  if (got != expected)
    harness_fail(file, line, "%s returned %s (%d), expected %s (%d); message: \"%s\"", what, lowbit_status_string(got),
                 (int)got, lowbit_status_string(expected), (int)expected, tl);
  if (expected == LOWBIT_SUCCESS) return;
  if (needle && !strstr(tl, needle))
    harness_fail(file, line, "%s: lowbit_last_error() is \"%s\", which does not mention \"%s\"", what, tl, needle);
  if (comm && strcmp(lowbit_comm_last_error(comm), tl) != 0)
    harness_fail(file, line, "%s: lowbit_comm_last_error() \"%s\" differs from lowbit_last_error() \"%s\"", what,
                 lowbit_comm_last_error(comm), tl);
  if (strlen(tl) < 10) harness_fail(file, line, "%s: message \"%s\" is too short to explain anything", what, tl);
}

void harness_init(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  /* Rank 0 picks the seed (tests/common/test_seed.h: fixed unless
   * LOWBIT_TEST_SEED says otherwise) and every rank uses it. */
  unsigned long long s = 0;
  if (g_rank == 0) {
    printf("%s: %d ranks\n", (*argv)[0], g_world);
    s = (unsigned long long)lowbit_test_seed((*argv)[0]);
    fflush(stdout);
  }
  MPI_Bcast(&s, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  g_seed = s;
}

int harness_finish(void) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    printf("all checks passed\n");
    fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}

uint64_t harness_seed(void) { return g_seed; }

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double uniform01(uint64_t* state) {
  *state = mix64(*state);
  return ((double)(*state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, double sigma) {
  uint64_t st = mix64(seed ^ mix64(stream + 0x1234567ull));
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = uniform01(&st), u2 = uniform01(&st);
    const double r = sqrt(-2.0 * log(u1));
    out[i] = (float)(sigma * r * cos(6.283185307179586 * u2));
    if (i + 1 < n) out[i + 1] = (float)(sigma * r * sin(6.283185307179586 * u2));
  }
}

lowbit_tensor_t host_tensor(float* data, int64_t n) {
  lowbit_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.numel = n;
  t.dtype = LOWBIT_DTYPE_FLOAT32;
  t.device = LOWBIT_DEVICE_CPU;
  t.device_index = 0;
  return t;
}

lowbit_comm_t make_world_comm(void) {
  lowbit_comm_t c = NULL;
  MPI_Comm w = MPI_COMM_WORLD;
  CHECK_OK(c, lowbit_comm_create_mpi(&c, &w, NULL));
  CHECK(c != NULL, "lowbit_comm_create_mpi gave NULL");
  return c;
}

sim_layout_t sim_layout(int64_t n, int world) {
  sim_layout_t l;
  const int64_t unit = 8 * (int64_t)world;
  l.world = world;
  l.n = n;
  l.padded = (n + unit - 1) / unit * unit;
  l.chunk = l.padded / world;
  return l;
}

int64_t sim_real_in_chunk(const sim_layout_t* l, int r) {
  int64_t v = l->n - (int64_t)r * l->chunk;
  if (v < 0) v = 0;
  if (v > l->chunk) v = l->chunk;
  return v;
}

void sim_step(const sim_layout_t* l, float* const* in, double* const* werr, double* const* serr, double* out,
              unsigned char* amb, double* server_scales, double* worker_scales) {
  const int W = l->world;
  const int64_t n = l->n;
  /* q[j][i] = s_j * sign(x_j,i), the value rank j's chunk message decodes to. */
  double* q = (double*)xmalloc(sizeof(double) * (size_t)n * (size_t)W);
  double smax_v = 0.0;
  double* smax = &smax_v;
  for (int j = 0; j < W; ++j) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = (double)in[j][i] + werr[j][i];
      ss += x * x;
    }
    /* The scale travels as fp32 (the sum of squares in double, rounded once). */
    const double s = (double)(float)sqrt(ss / (double)n);
    if (worker_scales) worker_scales[j] = s;
    if (s > *smax) *smax = s;
    for (int64_t i = 0; i < n; ++i) {
      const double x = (double)in[j][i] + werr[j][i];
      const double qq = x >= 0.0 ? s : -s;
      q[(size_t)j * (size_t)n + (size_t)i] = qq;
      werr[j][i] = x - qq;
    }
  }
  for (int r = 0; r < W; ++r) {
    const int64_t c = sim_real_in_chunk(l, r);
    const int64_t off = (int64_t)r * l->chunk;
    double* y = (double*)xmalloc(sizeof(double) * (size_t)(c ? c : 1));
    double ss = 0.0;
    for (int64_t i = 0; i < c; ++i) {
      /* As specified: the sum over ranks, in rank order, and the division in
       * fp32 (exact here, not float64, where the +-s_j nearly cancel). */
      float a = 0.f;
      for (int j = 0; j < W; ++j) a += (float)q[(size_t)j * (size_t)n + (size_t)(off + i)];
      y[i] = (double)(a / (float)W) + serr[r][i];
      ss += y[i] * y[i];
    }
    const double S = c ? sqrt(ss / (double)c) : 0.0;
    if (server_scales) server_scales[r] = S;
    for (int64_t i = 0; i < c; ++i) {
      const double o = y[i] >= 0.0 ? S : -S;
      out[off + i] = o;
      if (amb) amb[off + i] = fabs(y[i]) <= 1e-5 * (*smax + fabs(serr[r][i]));
      serr[r][i] = y[i] - o;
    }
    free(y);
  }
  free(q);
}

void gather_errors(lowbit_comm_t comm, const sim_layout_t* l, double* const* werr, double* const* serr) {
  const int W = l->world;
  int32_t crank = 0;
  CHECK_OK(comm, lowbit_comm_rank(comm, &crank));
  int64_t wn = 0, sn = 0;
  CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn));
  CHECK(wn == l->n, "worker error numel %lld, expected %lld", (long long)wn, (long long)l->n);
  CHECK(sn == sim_real_in_chunk(l, crank), "server error numel %lld, expected %lld", (long long)sn,
        (long long)sim_real_in_chunk(l, crank));
  /* my errors: [worker n][server sn], sent with my comm rank */
  float* mine = (float*)xmalloc(sizeof(float) * (size_t)(l->n + sn + 1));
  CHECK_OK(comm, lowbit_comm_read_errors(comm, mine, wn, mine + wn, sn, NULL));
  int* ranks = (int*)xmalloc(sizeof(int) * (size_t)g_world);
  int cr = crank;
  MPI_Allgather(&cr, 1, MPI_INT, ranks, 1, MPI_INT, MPI_COMM_WORLD);
  int* counts = (int*)xmalloc(sizeof(int) * (size_t)g_world);
  int* displs = (int*)xmalloc(sizeof(int) * (size_t)g_world);
  int total = 0;
  for (int p = 0; p < g_world; ++p) {
    counts[p] = (int)(l->n + sim_real_in_chunk(l, ranks[p]));
    displs[p] = total;
    total += counts[p];
  }
  float* all = (float*)xmalloc(sizeof(float) * (size_t)(total + 1));
  MPI_Allgatherv(mine, (int)(wn + sn), MPI_FLOAT, all, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
  for (int p = 0; p < g_world; ++p) {
    const int j = ranks[p];
    const float* src = all + displs[p];
    for (int64_t i = 0; i < l->n; ++i) werr[j][i] = src[i];
    const int64_t c = sim_real_in_chunk(l, j);
    for (int64_t i = 0; i < c; ++i) serr[j][i] = src[l->n + i];
  }
  (void)W;
  free(mine);
  free(ranks);
  free(counts);
  free(displs);
  free(all);
}

uint64_t fnv64(const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t error_blob_checksum(const unsigned char* blob, int64_t size) {
  static const unsigned char zero[8] = {0};
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < size; ++i) {
    h ^= (i >= 48 && i < 56) ? zero[i - 48] : blob[i];
    h *= 1099511628211ull;
  }
  return h;
}

void error_blob_fix_checksum(unsigned char* blob, int64_t size) {
  const uint64_t h = error_blob_checksum(blob, size);
  memcpy(blob + 48, &h, 8);
}

void check_same_on_all_ranks(uint64_t value, const char* what) {
  uint64_t lo = value, hi = value;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi, "%s differs between ranks", what);
}

void* xmalloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return p;
}

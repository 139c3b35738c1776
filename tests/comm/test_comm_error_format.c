/* The worker and server errors kept in bf16 or in 8-bit blocks
 * (lowbit_comm_config_t.error_format, docs/COMMUNICATOR.md section 5b),
 * against a float64 simulation of the rule, bit for bit, over MPI and a
 * callback transport: sequences of compressed allreduces and reduce-scatters
 * on sizes around the padding, a 256-block, a sum-of-squares segment (8193)
 * and the threaded path (65537), with outliers in the inputs.
 *
 * The simulation is written from the specification, not from comm/: every
 * fp32 operation a float64 operation rounded to fp32; bf16 rounding by
 * scaling to an 8-bit significand (frexp / rint / ldexp, ties to even,
 * saturating at the largest bf16); the 8-bit code nearbyint(f32(f32(e / m) *
 * 127)) with m the block's absmax, decoded f32(f32(k * m) / 127). Checked per
 * call: the output (tensor, or the reduce-scatter's chunk) and both errors as
 * lowbit_comm_read_errors gives them (the decoded values), bit for bit.
 * Checkpoints: the blob carries the errors in their format (64 + the
 * format's bytes) and a fresh communicator of the same format continues
 * the sequence with the same bits; a blob of another format is refused
 * (STATE_MISMATCH), and corrupt ones (checksum, NaN values or absmaxes, the
 * code -128, truncation: CORRUPT_DATA), with nothing changed. Every other
 * reduce-scatter runs in place (out = tensor + offset). Refusals on every rank: an unknown
 * format (creation), different formats across ranks (MPI creation, and a
 * callback transport's first collective), the codec stages (UNSUPPORTED). */
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

/* bf16 of a finite float: 8 significant bits, ties to even, the exponent
 * range of fp32 (subnormal step 2^-133), saturating at +-(2 - 2^-7) 2^127. */
static float sim_bf16(float v) {
  if (v == 0.0f) return v;
  int ex = 0;
  frexp((double)v, &ex); /* |v| in [2^(ex-1), 2^ex) */
  int shift = 8 - ex;    /* v * 2^shift has 8 integer bits */
  if (ex - 8 < -133) shift = 133;
  const double q = ldexp(nearbyint(ldexp((double)v, shift)), -shift);
  const double big = ldexp(255.0, 120); /* 0x7F7F */
  if (fabs(q) > big) return v < 0 ? (float)-big : (float)big;
  return (float)q;
}

/* e[0 .. count) <- the decoded values of its encoding in `fmt`. */
static void sim_encode(int fmt, float* e, int64_t count) {
  if (fmt == LOWBIT_COMM_ERROR_BF16) {
    for (int64_t i = 0; i < count; ++i) e[i] = sim_bf16(e[i]);
    return;
  }
  for (int64_t b0 = 0; b0 < count; b0 += 256) {
    const int64_t len = count - b0 < 256 ? count - b0 : 256;
    double m = 0.0;
    for (int64_t k = 0; k < len; ++k) m = fabs((double)e[b0 + k]) > m ? fabs((double)e[b0 + k]) : m;
    for (int64_t k = 0; k < len; ++k) {
      double code = 0.0;
      if (m > 0.0) code = nearbyint((double)f32((double)f32((double)e[b0 + k] / m) * 127.0)) + 0.0; /* an integer: no -0 */
      e[b0 + k] = f32((double)f32(code * m) / 127.0);
    }
  }
}

typedef struct {
  int W, fmt;
  int64_t n, C;
  float** E; /* per rank, n */
  float** Z; /* per rank, its chunk's real elements */
} sim_t;

static int64_t real_in_chunk(const sim_t* s, int r) {
  int64_t v = s->n - (int64_t)r * s->C;
  return v < 0 ? 0 : (v > s->C ? s->C : v);
}

static void sim_init(sim_t* s, int64_t n, int W, int fmt) {
  const int64_t unit = 8 * (int64_t)W, padded = (n + unit - 1) / unit * unit;
  s->W = W, s->fmt = fmt, s->n = n, s->C = padded / W;
  s->E = (float**)xmalloc(sizeof(float*) * (size_t)W);
  s->Z = (float**)xmalloc(sizeof(float*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    s->E[j] = (float*)calloc((size_t)n, sizeof(float));
    s->Z[j] = (float*)calloc((size_t)s->C + 1, sizeof(float));
  }
}

static void sim_free(sim_t* s) {
  for (int j = 0; j < s->W; ++j) free(s->E[j]), free(s->Z[j]);
  free(s->E), free(s->Z);
}

/* One call over all ranks: in[j] (n floats). allreduce: out (n) the result;
 * otherwise out (c_r) rank r's reduce-scatter chunk. */
static void sim_call(sim_t* s, int allreduce, float* const* in, int r, float* out) {
  const int W = s->W;
  const int64_t n = s->n, C = s->C;
  float* x = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* sc = (float*)xmalloc(sizeof(float) * (size_t)W);
  unsigned char** bit = (unsigned char**)xmalloc(sizeof(unsigned char*) * (size_t)W);
  for (int j = 0; j < W; ++j) {
    bit[j] = (unsigned char*)xmalloc((size_t)n);
    for (int64_t i = 0; i < n; ++i) x[i] = f32((double)in[j][i] + (double)s->E[j][i]);
    sc[j] = f32(sqrt(ordered_sumsq(x, n) / (double)n));
    for (int64_t i = 0; i < n; ++i) {
      bit[j][i] = x[i] >= 0.0f;
      s->E[j][i] = f32((double)x[i] - (bit[j][i] ? (double)sc[j] : -(double)sc[j]));
    }
    sim_encode(s->fmt, s->E[j], n);
  }
  for (int q = 0; q < W; ++q) {
    if (!allreduce && q != r) continue;
    const int64_t c = real_in_chunk(s, q);
    float* y = (float*)xmalloc(sizeof(float) * (size_t)(c + 1));
    for (int64_t i = 0; i < c; ++i) {
      const int64_t g = (int64_t)q * C + i;
      float a = 0.0f;
      for (int j = 0; j < W; ++j) a = f32((double)a + (bit[j][g] ? (double)sc[j] : -(double)sc[j]));
      a = f32((double)a / (double)W);
      y[i] = allreduce ? f32((double)a + (double)s->Z[q][i]) : a;
    }
    if (!allreduce) {
      memcpy(out, y, sizeof(float) * (size_t)c);
    } else {
      const float S = c ? f32(sqrt(ordered_sumsq(y, c) / (double)c)) : 0.0f;
      for (int64_t i = 0; i < c; ++i) {
        const int b = y[i] >= 0.0f;
        out[(int64_t)q * C + i] = b ? S : -S;
        s->Z[q][i] = f32((double)y[i] - (b ? (double)S : -(double)S));
      }
      sim_encode(s->fmt, s->Z[q], c);
    }
    free(y);
  }
  for (int j = 0; j < W; ++j) free(bit[j]);
  free(bit), free(sc), free(x);
}

/* ---- helpers */

static const char* fmt_name(int fmt) { return fmt == LOWBIT_COMM_ERROR_BF16 ? "bf16" : "int8"; }

static lowbit_comm_config_t config_of(int fmt) {
  lowbit_comm_config_t c;
  CHECK(lowbit_comm_config_init(&c) == LOWBIT_SUCCESS, "config_init");
  CHECK(c.struct_size == sizeof c && c.error_format == LOWBIT_COMM_ERROR_FP32, "config_init's defaults");
  c.error_format = fmt;
  return c;
}

static lowbit_comm_t make_comm(int fmt) {
  lowbit_comm_config_t cfg = config_of(fmt);
  lowbit_comm_t c = NULL;
  MPI_Comm w = MPI_COMM_WORLD;
  CHECK_OK(c, lowbit_comm_create_mpi(&c, &w, &cfg));
  return c;
}

static unsigned char* save_blob(lowbit_comm_t comm, int64_t* size) {
  CHECK_OK(comm, lowbit_comm_save_errors(comm, NULL, 0, size, NULL));
  unsigned char* b = (unsigned char*)xmalloc((size_t)*size + 1);
  int64_t got = 0;
  CHECK_OK(comm, lowbit_comm_save_errors(comm, b, *size, &got, NULL));
  CHECK(got == *size, "save_errors size");
  return b;
}

static int64_t fmt_bytes(int fmt, int64_t count) {
  return fmt == LOWBIT_COMM_ERROR_BF16 ? 2 * count : count + 4 * ((count + 255) / 256);
}

static void inputs(float* const* in, int64_t n, int W, uint64_t seed, int call) {
  for (int j = 0; j < W; ++j) {
    fill_normal(in[j], n, seed, (uint64_t)(1000 * call + j), 0.5 + call);
    /* outliers: a few elements far above the rest, so 8-bit blocks see one */
    for (int k = 0; k < 3; ++k) in[j][(int64_t)((mix64(seed + 17u * (uint64_t)(call * 8 + k + 4 * j)) % (uint64_t)n))] *= 300.0f;
  }
}

static int64_t g_checked = 0;

/* The library's errors against the simulation's for this rank. */
static void check_errors(lowbit_comm_t comm, const sim_t* s, const char* what) {
  const int r = g_rank;
  const int64_t c = real_in_chunk(s, r);
  int64_t wn = 0, sn = 0;
  CHECK_OK(comm, lowbit_comm_error_numel(comm, &wn, &sn));
  CHECK(wn == s->n && sn == c, "%s: error numel %lld / %lld, expected %lld / %lld", what, (long long)wn,
        (long long)sn, (long long)s->n, (long long)c);
  float* w = (float*)xmalloc(sizeof(float) * (size_t)(wn + 1));
  float* z = (float*)xmalloc(sizeof(float) * (size_t)(sn + 1));
  CHECK_OK(comm, lowbit_comm_read_errors(comm, w, wn, sn ? z : NULL, sn, NULL));
  for (int64_t i = 0; i < wn; ++i)
    CHECK(memcmp(&w[i], &s->E[r][i], 4) == 0, "%s: worker error %lld is %.9g, the simulation %.9g", what,
          (long long)i, (double)w[i], (double)s->E[r][i]);
  for (int64_t i = 0; i < sn; ++i)
    CHECK(memcmp(&z[i], &s->Z[r][i], 4) == 0, "%s: server error %lld is %.9g, the simulation %.9g", what,
          (long long)i, (double)z[i], (double)s->Z[r][i]);
  g_checked += wn + sn;
  free(w), free(z);
}

/* ops: 'A' compressed allreduce, 'R' compressed reduce-scatter, 'S' save the
 * errors, check the blob, and continue on a fresh communicator that loaded it
 * (MPI only). */
static lowbit_comm_t run(lowbit_comm_t comm, int fmt, int64_t n, const char* ops, uint64_t seed, int via_mpi) {
  const int W = g_world, r = g_rank;
  sim_t s;
  sim_init(&s, n, W, fmt);
  float** in = (float**)xmalloc(sizeof(float*) * (size_t)W);
  for (int j = 0; j < W; ++j) in[j] = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* want = (float*)xmalloc(sizeof(float) * (size_t)n);
  float* t = (float*)xmalloc(sizeof(float) * (size_t)n);
  char what[160];
  for (int k = 0; ops[k]; ++k) {
    snprintf(what, sizeof what, "%s n=%lld op %d (%c)%s", fmt_name(fmt), (long long)n, k, ops[k],
             via_mpi ? "" : " over callbacks");
    if (ops[k] == 'S') {
      int64_t size = 0;
      unsigned char* blob = save_blob(comm, &size);
      const int64_t c = real_in_chunk(&s, r);
      CHECK(size == 64 + fmt_bytes(fmt, n) + fmt_bytes(fmt, c), "%s: blob of %lld bytes, expected %lld", what,
            (long long)size, (long long)(64 + fmt_bytes(fmt, n) + fmt_bytes(fmt, c)));
      uint32_t version = 0, f = 1234;
      memcpy(&version, blob + 8, 4), memcpy(&f, blob + 56, 4);
      CHECK(version == 3 && (int)f == fmt, "%s: blob version %u format %u", what, version, f);
      /* another format refuses it, nothing changed */
      lowbit_comm_t other = make_comm(fmt == LOWBIT_COMM_ERROR_BF16 ? LOWBIT_COMM_ERROR_INT8 : LOWBIT_COMM_ERROR_FP32);
      CHECK_STATUS(other, lowbit_comm_load_errors(other, blob, size, NULL), LOWBIT_ERROR_STATE_MISMATCH,
                   "this communicator keeps them in");
      int64_t wn = -1, sn = -1;
      CHECK_OK(other, lowbit_comm_error_numel(other, &wn, &sn));
      CHECK(wn == 0 && sn == 0, "%s: a refused load bound the errors", what);
      if (fmt == LOWBIT_COMM_ERROR_BF16) { /* and an fp32 blob is refused by a compact communicator */
        CHECK_OK(other, lowbit_comm_destroy(other));
        other = make_comm(LOWBIT_COMM_ERROR_FP32);
        int64_t fsize = 0;
        unsigned char* fblob = save_blob(other, &fsize);
        CHECK_STATUS(comm, lowbit_comm_load_errors(comm, fblob, fsize, NULL), LOWBIT_ERROR_STATE_MISMATCH,
                     "holds errors in LOWBIT_COMM_ERROR_FP32");
        free(fblob);
        check_errors(comm, &s, what); /* unchanged */
      }
      /* a corrupted byte of the payload is refused; so are, with a valid
       * checksum, a NaN (bf16) / a NaN absmax or the code -128 (int8), and a
       * truncated blob; nothing changes */
      blob[size - 1] ^= 0x40;
      CHECK_STATUS(comm, lowbit_comm_load_errors(comm, blob, size, NULL), LOWBIT_ERROR_CORRUPT_DATA, "checksum");
      blob[size - 1] ^= 0x40;
      {
        unsigned char* bad = (unsigned char*)xmalloc((size_t)size);
        const int kinds = fmt == LOWBIT_COMM_ERROR_BF16 ? 1 : 2;
        for (int kind = 0; kind < kinds; ++kind) {
          memcpy(bad, blob, (size_t)size);
          if (fmt == LOWBIT_COMM_ERROR_BF16) {
            bad[64] = 0xC0, bad[65] = 0x7F; /* element 0: bf16 NaN */
          } else if (kind == 0) {
            const uint32_t nan_bits = 0x7FC00000u;
            memcpy(bad + 64, &nan_bits, 4); /* block 0's absmax */
          } else {
            bad[64 + 4 * ((n + 255) / 256)] = 0x80; /* element 0's code: -128 */
          }
          error_blob_fix_checksum(bad, size);
          CHECK_STATUS(comm, lowbit_comm_load_errors(comm, bad, size, NULL), LOWBIT_ERROR_CORRUPT_DATA,
                       "not finite or not a valid code");
        }
        CHECK_STATUS(comm, lowbit_comm_load_errors(comm, blob, size - 1, NULL), LOWBIT_ERROR_CORRUPT_DATA,
                     "truncated");
        free(bad);
        check_errors(comm, &s, what);
      }
      CHECK_OK(other, lowbit_comm_destroy(other));
      CHECK_OK(comm, lowbit_comm_destroy(comm));
      comm = make_comm(fmt);
      CHECK_OK(comm, lowbit_comm_load_errors(comm, blob, size, NULL));
      free(blob);
      check_errors(comm, &s, what);
      continue;
    }
    const int allreduce = ops[k] == 'A';
    inputs(in, n, W, seed, k);
    memcpy(t, in[r], sizeof(float) * (size_t)n);
    lowbit_tensor_t tt = host_tensor(t, n);
    sim_call(&s, allreduce, in, r, want);
    if (allreduce) {
      CHECK_OK(comm, lowbit_comm_compressed_allreduce(comm, &tt, NULL));
      for (int64_t i = 0; i < n; ++i)
        CHECK(memcmp(&t[i], &want[i], 4) == 0, "%s: out %lld is %.9g, the simulation %.9g", what, (long long)i,
              (double)t[i], (double)want[i]);
    } else {
      int64_t off = 0, cnt = 0;
      CHECK_OK(comm, lowbit_comm_reduce_scatter_chunk(comm, n, &off, &cnt));
      float* o = (float*)xmalloc(sizeof(float) * (size_t)(cnt + 1));
      /* every other reduce-scatter in place (out = tensor + offset: the worker
       * error is committed from the tensor before out is written) */
      const int in_place = (k & 1) && cnt > 0;
      float* dst = in_place ? t + off : o;
      lowbit_tensor_t ot = host_tensor(cnt ? dst : NULL, cnt);
      CHECK_OK(comm, lowbit_comm_compressed_reduce_scatter(comm, &tt, &ot, NULL));
      for (int64_t i = 0; i < cnt; ++i)
        CHECK(memcmp(&dst[i], &want[i], 4) == 0, "%s: out %lld is %.9g, the simulation %.9g%s", what, (long long)i,
              (double)dst[i], (double)want[i], in_place ? " (in place)" : "");
      free(o);
    }
    check_errors(comm, &s, what);
  }
  for (int j = 0; j < W; ++j) free(in[j]);
  free(in), free(want), free(t);
  sim_free(&s);
  return comm;
}

static void test_sequences(void) {
  const int W = g_world;
  const int64_t sizes[] = {1, 8 * W - 1, 8 * W + 1, 257, 8193, 65537};
  for (int f = LOWBIT_COMM_ERROR_BF16; f <= LOWBIT_COMM_ERROR_INT8; ++f)
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
      const int64_t n = sizes[i];
      lowbit_comm_t comm = make_comm(f);
      comm = run(comm, f, n, n > 10000 ? "AARSA" : "AARASRAA", harness_seed() + (uint64_t)(f * 100 + i), 1);
      CHECK_OK(comm, lowbit_comm_destroy(comm));
      /* the same over a callback transport */
      if (n <= 10000) {
        lowbit_comm_config_t cfg = config_of(f);
        lowbit_comm_t cb = make_callback_comm_config(MPI_COMM_WORLD, 1, &cfg);
        run(cb, f, n, "ARAA", harness_seed() + 7u + (uint64_t)(f * 100 + i), 0);
        destroy_callback_comm(cb);
      }
    }
}

static void test_refusals(void) {
  const int W = g_world, r = g_rank;
  /* an unknown format on one rank: every rank's creation fails */
  {
    lowbit_comm_config_t cfg = config_of(r == W - 1 ? 7 : LOWBIT_COMM_ERROR_BF16);
    lowbit_comm_t c = (lowbit_comm_t)1;
    MPI_Comm w = MPI_COMM_WORLD;
    const lowbit_status_t st = lowbit_comm_create_mpi(&c, &w, &cfg);
    CHECK(st == LOWBIT_ERROR_INVALID_ARGUMENT && c == NULL, "an unknown format: status %s",
          lowbit_status_string(st));
    CHECK(strstr(lowbit_comm_last_error(NULL), "error_format") != NULL, "the message names error_format: %s",
          lowbit_comm_last_error(NULL));
  }
  /* an unknown format on a callback transport (local creation) */
  {
    lowbit_comm_config_t cfg = config_of(-1);
    lowbit_comm_transport_t t;
    lowbit_comm_transport_init(&t);
    lowbit_comm_t c = NULL;
    const lowbit_status_t st = lowbit_comm_create_transport(&c, &t, &cfg);
    CHECK(st == LOWBIT_ERROR_INVALID_ARGUMENT && c == NULL && strstr(lowbit_comm_last_error(NULL), "error_format"),
          "a callback transport with format -1: %s", lowbit_comm_last_error(NULL));
  }
  if (W > 1) {
    /* different formats across ranks over MPI: every rank's creation fails */
    lowbit_comm_config_t cfg = config_of(r == 0 ? LOWBIT_COMM_ERROR_INT8 : LOWBIT_COMM_ERROR_BF16);
    lowbit_comm_t c = (lowbit_comm_t)1;
    MPI_Comm w = MPI_COMM_WORLD;
    const lowbit_status_t st = lowbit_comm_create_mpi(&c, &w, &cfg);
    CHECK(st == LOWBIT_ERROR_INVALID_ARGUMENT && c == NULL && strstr(lowbit_comm_last_error(NULL), "error_format"),
          "different formats at creation: %s %s", lowbit_status_string(st), lowbit_comm_last_error(NULL));
    /* over a callback transport: its first collective fails on every rank, nothing changed */
    lowbit_comm_config_t cf = config_of(r == 0 ? LOWBIT_COMM_ERROR_FP32 : LOWBIT_COMM_ERROR_INT8);
    lowbit_comm_t cb = make_callback_comm_config(MPI_COMM_WORLD, 1, &cf);
    float v[40];
    fill_normal(v, 40, 3, (uint64_t)r, 1.0);
    float keep[40];
    memcpy(keep, v, sizeof v);
    lowbit_tensor_t tt = host_tensor(v, 40);
    CHECK_STATUS(cb, lowbit_comm_compressed_allreduce(cb, &tt, NULL), LOWBIT_ERROR_INVALID_ARGUMENT,
                 "keeps its errors in");
    CHECK(memcmp(v, keep, sizeof v) == 0, "a refused call changed the tensor");
    int64_t wn = -1, sn = -1;
    CHECK_OK(cb, lowbit_comm_error_numel(cb, &wn, &sn));
    CHECK(wn == 0, "a refused call bound the errors");
    destroy_callback_comm(cb);
  }
  /* the codec stages refuse compact errors */
  {
    lowbit_comm_t c = make_comm(LOWBIT_COMM_ERROR_INT8);
    float v[16] = {1};
    unsigned char send[4096];
    lowbit_tensor_t tt = host_tensor(v, 16);
    CHECK_STATUS(c, lowbit_comm_stage_compress(c, &tt, send, sizeof send, NULL), LOWBIT_ERROR_UNSUPPORTED,
                 "codec stages keep fp32 errors only");
    CHECK_OK(c, lowbit_comm_destroy(c));
  }
  /* an 0.4-sized config still works and means fp32 */
  {
    lowbit_comm_config_t cfg = config_of(LOWBIT_COMM_ERROR_FP32);
    cfg.struct_size = 24;
    lowbit_comm_t c = NULL;
    MPI_Comm w = MPI_COMM_WORLD;
    CHECK_OK(c, lowbit_comm_create_mpi(&c, &w, &cfg));
    int64_t size = 0;
    unsigned char* blob = save_blob(c, &size);
    uint32_t version = 0;
    memcpy(&version, blob + 8, 4);
    CHECK(version == 2 && size == 64, "an fp32 communicator's blob is version 2 (got %u)", version);
    free(blob);
    CHECK_OK(c, lowbit_comm_destroy(c));
  }
}

int main(int argc, char** argv) {
  harness_init(&argc, &argv);
  test_refusals();
  test_sequences();
  if (g_rank == 0) printf("error formats: %lld error values checked bit for bit\n", (long long)g_checked);
  return harness_finish();
}

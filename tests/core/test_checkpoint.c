/* Checkpoints through the C API: bit-identical resume per format, loading
 * across formats and modes, files, and every kind of bad file leaving the
 * optimizer untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lowbit.h"
#include "../common/test_seed.h"

#define NP 3
static const int64_t kSizes[NP] = {5000, 257, 9001}; /* 257 stays fp32 under the threshold */
static unsigned g_seed;

static float frand(unsigned* s) {
  *s = *s * 1664525u + 1013904223u;
  return ((*s >> 8) / 16777216.0f) * 2.f - 1.f;
}

typedef struct {
  lowbit_optimizer_t opt;
  lowbit_dtype_t dtype;
  void* params[NP];
  void* grads[NP];
} Fixture;

static size_t esize(lowbit_dtype_t d) { return d == LOWBIT_DTYPE_FLOAT32 ? 4 : 2; }

static void make(Fixture* f, lowbit_algorithm_t algo, lowbit_state_format_t fmt, lowbit_dtype_t dtype, int sr,
                 int ecc) {
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_config_init(&c, algo), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_hparams_init(&h, algo), LOWBIT_SUCCESS);
  c.state_format = fmt;
  c.seed = 1234;
  c.stochastic_rounding = sr;
  c.error_correction = ecc;
  if (algo == LOWBIT_ALGORITHM_SGD) h.momentum = 0.9f;
  h.lr = 1e-2f;
  assert_int_equal(lowbit_optimizer_create(&f->opt, &c, &h), LOWBIT_SUCCESS);
  f->dtype = dtype;
  unsigned s = g_seed;
  for (int i = 0; i < NP; ++i) {
    f->params[i] = malloc(kSizes[i] * esize(dtype));
    f->grads[i] = malloc(kSizes[i] * 4);
    for (int64_t k = 0; k < kSizes[i]; ++k) {
      float v = frand(&s);
      if (dtype == LOWBIT_DTYPE_FLOAT32) ((float*)f->params[i])[k] = v;
      else ((uint16_t*)f->params[i])[k] = (uint16_t)(dtype == LOWBIT_DTYPE_BFLOAT16 ? 0x3F00 : 0x3800) + (k % 64);
    }
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){f->params[i], kSizes[i], dtype, LOWBIT_DEVICE_CPU, 0};
    pc.grad = (lowbit_tensor_t){f->grads[i], kSizes[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    int64_t id;
    assert_int_equal(lowbit_optimizer_add_param(f->opt, &pc, &id), LOWBIT_SUCCESS);
    assert_int_equal(id, i);
  }
}

static void copy_params(Fixture* dst, const Fixture* src) {
  for (int i = 0; i < NP; ++i) memcpy(dst->params[i], src->params[i], kSizes[i] * esize(src->dtype));
}

static void run_steps(Fixture* f, int first, int count) {
  for (int t = first; t < first + count; ++t) {
    for (int i = 0; i < NP; ++i) {
      unsigned s = g_seed * 31u + (unsigned)(t * 977 + i);
      for (int64_t k = 0; k < kSizes[i]; ++k) ((float*)f->grads[i])[k] = frand(&s) * (k % 7 == 0 ? 0.f : 1.f);
    }
    assert_int_equal(lowbit_optimizer_step(f->opt, NULL), LOWBIT_SUCCESS);
  }
}

static void destroy(Fixture* f) {
  lowbit_optimizer_destroy(f->opt);
  for (int i = 0; i < NP; ++i) free(f->params[i]), free(f->grads[i]);
}

static uint8_t* save(lowbit_optimizer_t opt, lowbit_checkpoint_mode_t mode, int64_t* size) {
  assert_int_equal(lowbit_optimizer_save(opt, mode, NULL, 0, size, NULL), LOWBIT_SUCCESS);
  uint8_t* buf = malloc((size_t)*size);
  int64_t written;
  assert_int_equal(lowbit_optimizer_save(opt, mode, buf, *size, &written, NULL), LOWBIT_SUCCESS);
  assert_int_equal(written, *size);
  return buf;
}

static void assert_same_params(const Fixture* a, const Fixture* b) {
  for (int i = 0; i < NP; ++i) assert_memory_equal(a->params[i], b->params[i], kSizes[i] * esize(a->dtype));
}

/* Save after 5 steps, load into a fresh optimizer, and 5 more steps on both
 * give the same bits, for every algorithm x format (and SR / ECC weights). */
static void test_resume_is_bit_identical(void** state) {
  (void)state;
  const lowbit_algorithm_t algos[] = {LOWBIT_ALGORITHM_ADAMW, LOWBIT_ALGORITHM_ADAM, LOWBIT_ALGORITHM_LION,
                                      LOWBIT_ALGORITHM_SGD};
  const lowbit_state_format_t fmts[] = {LOWBIT_STATE_FP32, LOWBIT_STATE_BF16, LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT,
                                        LOWBIT_STATE_FP8};
  for (int a = 0; a < 4; ++a)
    for (int f = 0; f < 5; ++f)
      for (int w = 0; w < 3; ++w) {
        lowbit_dtype_t dtype = w == 0 ? LOWBIT_DTYPE_FLOAT32 : LOWBIT_DTYPE_BFLOAT16;
        Fixture x, y;
        make(&x, algos[a], fmts[f], dtype, w == 1, w == 2);
        make(&y, algos[a], fmts[f], dtype, w == 1, w == 2);
        run_steps(&x, 0, 5);
        int64_t size;
        uint8_t* buf = save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, &size);
        copy_params(&y, &x);
        assert_int_equal(lowbit_optimizer_load(y.opt, buf, size, NULL), LOWBIT_SUCCESS);
        run_steps(&x, 5, 5);
        run_steps(&y, 5, 5);
        assert_same_params(&x, &y);
        int64_t s2;
        uint8_t* b2 = save(y.opt, LOWBIT_CHECKPOINT_COMPRESSED, &s2);
        uint8_t* b1 = save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, &size);
        assert_int_equal(size, s2);
        assert_memory_equal(b1, b2, (size_t)size);
        free(buf), free(b1), free(b2);
        destroy(&x), destroy(&y);
      }
}

static void read_all(lowbit_optimizer_t opt, int moment, float** out) {
  for (int i = 0; i < NP; ++i) {
    out[i] = malloc(kSizes[i] * 4);
    assert_int_equal(lowbit_optimizer_read_moment(opt, i, moment, out[i], kSizes[i], NULL), LOWBIT_SUCCESS);
  }
}

/* Materialised fp32 checkpoints hold the dequantized moments; loading one into
 * a quantized optimizer quantizes it the same way the source was. */
static void test_across_formats(void** state) {
  (void)state;
  const lowbit_state_format_t fmts[] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_FP8, LOWBIT_STATE_BF16};
  for (int f = 0; f < 4; ++f) {
    Fixture q, full, q2;
    make(&q, LOWBIT_ALGORITHM_ADAMW, fmts[f], LOWBIT_DTYPE_FLOAT32, 0, 0);
    make(&full, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_FP32, LOWBIT_DTYPE_FLOAT32, 0, 0);
    make(&q2, LOWBIT_ALGORITHM_ADAMW, fmts[f], LOWBIT_DTYPE_FLOAT32, 0, 0);
    run_steps(&q, 0, 4);
    /* Tolerance of requantizing dequantized values (a block's absmax element
     * may itself move by one code, e.g. the signed 8-bit map has no -1):
     * a fraction of the block absmax, per format. */
    const float tol[] = {0.02f, 0.15f, 0.07f, 0.f};
    const lowbit_checkpoint_mode_t modes[] = {LOWBIT_CHECKPOINT_MATERIALIZED_FP32, LOWBIT_CHECKPOINT_COMPRESSED};
    for (int mi = 0; mi < 2; ++mi) {
      lowbit_checkpoint_mode_t mode = modes[mi];
      int64_t size;
      uint8_t* buf = save(q.opt, mode, &size);
      assert_int_equal(lowbit_optimizer_load(full.opt, buf, size, NULL), LOWBIT_SUCCESS);
      assert_int_equal(lowbit_optimizer_load(q2.opt, buf, size, NULL), LOWBIT_SUCCESS);
      for (int m = 0; m < 2; ++m) {
        float *a[NP], *b[NP], *c[NP];
        read_all(q.opt, m, a);
        read_all(full.opt, m, b);
        read_all(q2.opt, m, c);
        for (int i = 0; i < NP; ++i) {
          assert_memory_equal(a[i], b[i], kSizes[i] * 4); /* fp32 holds the dequantized values exactly */
          if (mode == LOWBIT_CHECKPOINT_COMPRESSED || f == 3) {
            assert_memory_equal(a[i], c[i], kSizes[i] * 4); /* same format: the codes themselves */
          } else {
            float amax = 0.f, err = 0.f;
            for (int64_t k = 0; k < kSizes[i]; ++k) {
              amax = fmaxf(amax, fabsf(a[i][k]));
              err = fmaxf(err, fabsf(a[i][k] - c[i][k]));
            }
            assert_true(err <= tol[f] * amax);
          }
          free(a[i]), free(b[i]), free(c[i]);
        }
      }
      free(buf);
    }
    /* Continuing from the materialised state gives the same steps as the source. */
    copy_params(&q2, &q);
    run_steps(&q, 4, 3);
    run_steps(&q2, 4, 3);
    assert_same_params(&q, &q2);
    lowbit_param_info_t info = {.struct_size = sizeof info};
    assert_int_equal(lowbit_optimizer_param_info(q2.opt, 0, &info), LOWBIT_SUCCESS);
    assert_int_equal(info.step, 7);
    destroy(&q), destroy(&full), destroy(&q2);
  }
}

static void test_file_round_trip(void** state) {
  (void)state;
  Fixture x, y;
  make(&x, LOWBIT_ALGORITHM_LION, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 0, 0);
  make(&y, LOWBIT_ALGORITHM_LION, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 0, 0);
  run_steps(&x, 0, 3);
  char path[64];
  snprintf(path, sizeof path, "/tmp/lowbit_ckpt_%d.bin", (int)g_seed);
  assert_int_equal(lowbit_optimizer_save_file(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, path, NULL), LOWBIT_SUCCESS);
  copy_params(&y, &x);
  assert_int_equal(lowbit_optimizer_load_file(y.opt, path, NULL), LOWBIT_SUCCESS);
  run_steps(&x, 3, 2);
  run_steps(&y, 3, 2);
  assert_same_params(&x, &y);
  remove(path);
  assert_int_equal(lowbit_optimizer_load_file(y.opt, "/nonexistent/dir/ckpt.bin", NULL), LOWBIT_ERROR_IO);
  assert_non_null(strstr(lowbit_optimizer_last_error(y.opt), "/nonexistent/dir/ckpt.bin"));
  assert_int_equal(lowbit_optimizer_save_file(y.opt, LOWBIT_CHECKPOINT_COMPRESSED, "/nonexistent/dir/x", NULL),
                   LOWBIT_ERROR_IO);
  destroy(&x), destroy(&y);
}

/* Everything observable about an optimizer, to prove a failed load changed nothing. */
static uint8_t* snapshot(lowbit_optimizer_t opt, int64_t* size) { return save(opt, LOWBIT_CHECKPOINT_COMPRESSED, size); }

static void expect_rejected(Fixture* y, const uint8_t* bytes, int64_t size, const uint8_t* before, int64_t before_size) {
  lowbit_status_t s = lowbit_optimizer_load(y->opt, bytes, size, NULL);
  assert_true(s == LOWBIT_ERROR_CORRUPT_DATA || s == LOWBIT_ERROR_VERSION_MISMATCH || s == LOWBIT_ERROR_STATE_MISMATCH);
  assert_true(strlen(lowbit_optimizer_last_error(y->opt)) > 0);
  int64_t after_size;
  uint8_t* after = snapshot(y->opt, &after_size);
  assert_int_equal(after_size, before_size);
  assert_memory_equal(after, before, (size_t)before_size);
  free(after);
}

static void test_bad_files_change_nothing(void** state) {
  (void)state;
  Fixture x, y;
  make(&x, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 1);
  make(&y, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 1);
  run_steps(&x, 0, 3);
  run_steps(&y, 0, 1);
  int64_t size, before_size;
  uint8_t* good = save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, &size);
  uint8_t* before = snapshot(y.opt, &before_size);

  /* Truncated at every length. */
  for (int64_t n = 0; n < size; n += (n < 200 ? 1 : 397)) expect_rejected(&y, good, n, before, before_size);
  /* Any flipped byte: checksums catch it. */
  uint8_t* bad = malloc((size_t)size);
  unsigned s = g_seed;
  for (int k = 0; k < 300; ++k) {
    memcpy(bad, good, (size_t)size);
    int64_t pos = k < 100 ? k : (int64_t)((frand(&s) * 0.5f + 0.5f) * (float)(size - 1));
    bad[pos] ^= (uint8_t)(1u << (k % 8));
    expect_rejected(&y, bad, size, before, before_size);
  }
  /* Wrong version with a valid checksum: VERSION_MISMATCH. */
  memcpy(bad, good, (size_t)size);
  bad[8] = 99;
  assert_int_equal(lowbit_optimizer_load(y.opt, bad, size, NULL), LOWBIT_ERROR_VERSION_MISMATCH);
  assert_non_null(strstr(lowbit_optimizer_last_error(y.opt), "version"));
  /* Trailing garbage. */
  uint8_t* longer = calloc((size_t)size + 8, 1);
  memcpy(longer, good, (size_t)size);
  expect_rejected(&y, longer, size + 8, before, before_size);
  assert_int_equal(lowbit_optimizer_load(y.opt, NULL, size, NULL), LOWBIT_ERROR_NULL_POINTER);

  /* Mismatched optimizers: other param count, other sizes, other algorithm. */
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
  lowbit_optimizer_t z;
  assert_int_equal(lowbit_optimizer_create(&z, &c, &h), LOWBIT_SUCCESS);
  float* p = calloc(5000, 4);
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param = (lowbit_tensor_t){p, 5000, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  int64_t id;
  assert_int_equal(lowbit_optimizer_add_param(z, &pc, &id), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_optimizer_load(z, good, size, NULL), LOWBIT_ERROR_STATE_MISMATCH);
  assert_non_null(strstr(lowbit_optimizer_last_error(z), "params"));
  lowbit_optimizer_destroy(z);
  Fixture lion;
  make(&lion, LOWBIT_ALGORITHM_LION, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_BFLOAT16, 0, 1);
  assert_int_equal(lowbit_optimizer_load(lion.opt, good, size, NULL), LOWBIT_ERROR_STATE_MISMATCH);
  assert_non_null(strstr(lowbit_optimizer_last_error(lion.opt), "algorithm"));

  /* Buffer too small. */
  int64_t out;
  uint8_t small[16];
  assert_int_equal(lowbit_optimizer_save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, small, 16, &out, NULL), LOWBIT_ERROR_BUFFER_TOO_SMALL);
  assert_int_equal(out, size);
  assert_int_equal(lowbit_optimizer_save(x.opt, (lowbit_checkpoint_mode_t)7, NULL, 0, &out, NULL), LOWBIT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(lowbit_optimizer_last_error(x.opt), "mode"));

  /* And y still steps like x did from the same point. */
  assert_int_equal(lowbit_optimizer_load(y.opt, good, size, NULL), LOWBIT_SUCCESS);
  copy_params(&y, &x);
  run_steps(&x, 3, 2);
  run_steps(&y, 3, 2);
  assert_same_params(&x, &y);
  free(good), free(bad), free(longer), free(before), free(p);
  destroy(&x), destroy(&y), destroy(&lion);
}


/* Issue 17 (5): an SGD group created with momentum 0.9 and later set to
 * momentum 0 (a schedule ending at 0) keeps its momentum buffers; its own
 * checkpoint loads (the layout follows the registration and the checkpoint,
 * not the current momentum), and the next steps are the same bits. A param
 * registered without a buffer still cannot take a group with momentum. */
static void set_momentum(lowbit_optimizer_t opt, float momentum) {
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_get_hparams(opt, 0, &h), LOWBIT_SUCCESS);
  h.momentum = momentum;
  assert_int_equal(lowbit_optimizer_set_hparams(opt, 0, &h), LOWBIT_SUCCESS);
}

static void test_sgd_momentum_schedule_to_zero_resumes(void** state) {
  (void)state;
  const lowbit_state_format_t fmts[] = {LOWBIT_STATE_FP32, LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT};
  for (int f = 0; f < 3; ++f)
    for (int back_up = 0; back_up < 2; ++back_up) {
      Fixture x, y;
      make(&x, LOWBIT_ALGORITHM_SGD, fmts[f], LOWBIT_DTYPE_FLOAT32, 0, 0); /* momentum 0.9 */
      make(&y, LOWBIT_ALGORITHM_SGD, fmts[f], LOWBIT_DTYPE_FLOAT32, 0, 0);
      run_steps(&x, 0, 3);
      set_momentum(x.opt, 0.f);
      run_steps(&x, 3, 2);
      int64_t size;
      uint8_t* buf = save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, &size);
      /* its own checkpoint, into itself and into a fresh optimizer made as x was */
      assert_int_equal(lowbit_optimizer_load(x.opt, buf, size, NULL), LOWBIT_SUCCESS);
      copy_params(&y, &x);
      lowbit_status_t st = lowbit_optimizer_load(y.opt, buf, size, NULL);
      if (st != LOWBIT_SUCCESS) fail_msg("format %d: load -> %d: %s", (int)fmts[f], (int)st, lowbit_optimizer_last_error(y.opt));
      lowbit_hparams_t h;
      assert_int_equal(lowbit_optimizer_get_hparams(y.opt, 0, &h), LOWBIT_SUCCESS);
      assert_true(h.momentum == 0.f);
      if (back_up) { /* the schedule may raise momentum again: the buffers are still there */
        set_momentum(x.opt, 0.5f);
        set_momentum(y.opt, 0.5f);
      }
      run_steps(&x, 5, 3);
      run_steps(&y, 5, 3);
      assert_same_params(&x, &y);
      int64_t s1, s2;
      uint8_t* b1 = save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, &s1);
      uint8_t* b2 = save(y.opt, LOWBIT_CHECKPOINT_COMPRESSED, &s2);
      assert_int_equal(s1, s2);
      assert_memory_equal(b1, b2, (size_t)s1);
      free(buf), free(b1), free(b2);
      destroy(&x), destroy(&y);
    }

  /* A param registered with momentum 0 has no buffer: a checkpoint with
   * momentum buffers is a STATE_MISMATCH naming the momentum, and nothing
   * changes. */
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_SGD), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_SGD), LOWBIT_SUCCESS);
  float p0[16] = {0}, p1[16] = {0}, g[16];
  for (int k = 0; k < 16; ++k) g[k] = 0.1f * (float)(k - 8);
  lowbit_optimizer_t plain, with_momentum;
  assert_int_equal(lowbit_optimizer_create(&plain, &c, &h), LOWBIT_SUCCESS); /* momentum 0: no buffer */
  h.momentum = 0.9f;
  assert_int_equal(lowbit_optimizer_create(&with_momentum, &c, &h), LOWBIT_SUCCESS);
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  int64_t id;
  pc.param = (lowbit_tensor_t){p0, 16, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  pc.grad = (lowbit_tensor_t){g, 16, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  assert_int_equal(lowbit_optimizer_add_param(plain, &pc, &id), LOWBIT_SUCCESS);
  pc.param.data = p1;
  assert_int_equal(lowbit_optimizer_add_param(with_momentum, &pc, &id), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_optimizer_step(with_momentum, NULL), LOWBIT_SUCCESS);
  int64_t size, before_size;
  uint8_t* buf = save(with_momentum, LOWBIT_CHECKPOINT_COMPRESSED, &size);
  uint8_t* before = save(plain, LOWBIT_CHECKPOINT_COMPRESSED, &before_size);
  assert_int_equal(lowbit_optimizer_load(plain, buf, size, NULL), LOWBIT_ERROR_STATE_MISMATCH);
  assert_non_null(strstr(lowbit_optimizer_last_error(plain), "momentum"));
  /* and it is unchanged */
  int64_t psize;
  uint8_t* pbuf = save(plain, LOWBIT_CHECKPOINT_COMPRESSED, &psize);
  assert_int_equal(psize, before_size);
  assert_memory_equal(pbuf, before, (size_t)psize);
  free(buf), free(before), free(pbuf);
  lowbit_optimizer_destroy(plain), lowbit_optimizer_destroy(with_momentum);
}


/* ------------------------------------------------------------------ files */

static void write_file(const char* path, const uint8_t* bytes, size_t n) {
  FILE* f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static char g_dir[64];
static void make_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/lowbit_ckpt_XXXXXX");
  assert_non_null(mkdtemp(g_dir));
}
/* Number of entries in g_dir (without . and ..). */
static int dir_entries(void) {
  DIR* d = opendir(g_dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent* e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

/* lowbit_optimizer_load_file on `path` in a child whose address space is
 * limited to what it uses plus 256 MiB: an unbounded read fails there with
 * OUT_OF_MEMORY instead of exhausting the machine. Returns the status. */
static int load_file_in_small_child(const char* path) {
  fflush(stdout);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    Fixture y;
    make(&y, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 0, 0);
    long pages = 0;
    FILE* statm = fopen("/proc/self/statm", "r");
    if (statm && fscanf(statm, "%ld", &pages) == 1) {
      struct rlimit lim;
      getrlimit(RLIMIT_AS, &lim);
      lim.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)256 << 20);
      setrlimit(RLIMIT_AS, &lim);
    }
    if (statm) fclose(statm);
    _exit((int)lowbit_optimizer_load_file(y.opt, path, NULL));
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

typedef struct {
  const char* path;
  const uint8_t* bytes;
  size_t n;
} fifo_writer_t;
static void* fifo_write(void* arg) {
  const fifo_writer_t* w = (const fifo_writer_t*)arg;
  FILE* f = fopen(w->path, "wb");
  if (f) {
    fwrite(w->bytes, 1, w->n, f); /* the reader may stop early: EPIPE is fine */
    fclose(f);
  }
  return NULL;
}
static lowbit_status_t load_through_fifo(lowbit_optimizer_t opt, const char* fifo, const uint8_t* bytes, size_t n) {
  signal(SIGPIPE, SIG_IGN);
  fifo_writer_t w = {fifo, bytes, n};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fifo_write, &w), 0);
  lowbit_status_t st = lowbit_optimizer_load_file(opt, fifo, NULL);
  /* unblock a writer the reader left behind */
  int fd = open(fifo, O_RDONLY | O_NONBLOCK);
  if (fd >= 0) {
    char sink[4096];
    while (read(fd, sink, sizeof sink) > 0) {
    }
    close(fd);
  }
  pthread_join(t, NULL);
  return st;
}

/* Issue 17 (9): load_file reads no more than the size the header announces,
 * checked first against this optimizer's largest checkpoint and the file's
 * size: /dev/zero (before: read until 1 GB) and headers announcing huge or
 * wrong sizes are CORRUPT_DATA, nothing changes; FIFOs still load. */
static void test_load_file_bounded(void** state) {
  (void)state;
  make_dir();
  Fixture x, y;
  make(&x, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 0, 0);
  make(&y, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_8BIT, LOWBIT_DTYPE_FLOAT32, 0, 0);
  run_steps(&x, 0, 2);
  run_steps(&y, 0, 1);
  int64_t size, before_size;
  uint8_t* good = save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, &size);
  uint8_t* before = snapshot(y.opt, &before_size);

  assert_int_equal(load_file_in_small_child("/dev/zero"), LOWBIT_ERROR_CORRUPT_DATA);
  assert_int_equal(lowbit_optimizer_load_file(y.opt, "/dev/zero", NULL), LOWBIT_ERROR_CORRUPT_DATA);
  assert_non_null(strstr(lowbit_optimizer_last_error(y.opt), "/dev/zero"));

  /* a valid header (magic, version) announcing other sizes: total_size is the
   * u64 at offset 24 */
  char path[128], fifo[128];
  snprintf(path, sizeof path, "%s/bad.ckpt", g_dir);
  snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  const uint64_t announced[] = {UINT64_MAX, (uint64_t)1 << 63, (uint64_t)1 << 40, (uint64_t)size * 100,
                                (uint64_t)size + 8, (uint64_t)size - 8, 0, 60};
  uint8_t* bad = malloc((size_t)size);
  for (size_t k = 0; k < sizeof announced / sizeof announced[0]; ++k) {
    memcpy(bad, good, (size_t)size);
    memcpy(bad + 24, &announced[k], 8);
    write_file(path, bad, (size_t)size);
    lowbit_status_t st = lowbit_optimizer_load_file(y.opt, path, NULL);
    if (st != LOWBIT_ERROR_CORRUPT_DATA)
      fail_msg("announced %llu: status %d: %s", (unsigned long long)announced[k], (int)st, lowbit_optimizer_last_error(y.opt));
    assert_non_null(strstr(lowbit_optimizer_last_error(y.opt), "announces"));
    assert_int_equal(load_file_in_small_child(path), LOWBIT_ERROR_CORRUPT_DATA);
    /* a stream has no size to compare with: the announced size bounds the read */
    assert_int_equal(load_through_fifo(y.opt, fifo, bad, (size_t)size), LOWBIT_ERROR_CORRUPT_DATA);
  }
  /* the good checkpoint followed by more bytes: from a file or a stream */
  uint8_t* longer = calloc((size_t)size + 4096, 1);
  memcpy(longer, good, (size_t)size);
  write_file(path, longer, (size_t)size + 4096);
  assert_int_equal(lowbit_optimizer_load_file(y.opt, path, NULL), LOWBIT_ERROR_CORRUPT_DATA);
  assert_int_equal(load_through_fifo(y.opt, fifo, longer, (size_t)size + 4096), LOWBIT_ERROR_CORRUPT_DATA);
  /* shorter than a header */
  write_file(path, good, 20);
  assert_int_equal(lowbit_optimizer_load_file(y.opt, path, NULL), LOWBIT_ERROR_CORRUPT_DATA);
  int64_t after_size;
  uint8_t* after = snapshot(y.opt, &after_size);
  assert_int_equal(after_size, before_size);
  assert_memory_equal(after, before, (size_t)before_size);

  /* and the good one loads, from a file and from a stream */
  write_file(path, good, (size_t)size);
  assert_int_equal(load_through_fifo(y.opt, fifo, good, (size_t)size), LOWBIT_SUCCESS);
  assert_int_equal(lowbit_optimizer_load_file(y.opt, path, NULL), LOWBIT_SUCCESS);
  copy_params(&y, &x);
  run_steps(&x, 2, 2);
  run_steps(&y, 2, 2);
  assert_same_params(&x, &y);
  remove(path), remove(fifo), rmdir(g_dir);
  free(good), free(bad), free(longer), free(before), free(after);
  destroy(&x), destroy(&y);
}

/* Issue 17 (10): concurrent saves to one path (distinct handles with the
 * same state, one thread each) all succeed, leave no temporary file, and the
 * file loads (before: they shared "<path>.tmp" and some returned IO errors). */
#define SAVERS 8
#define SAVES 25
typedef struct {
  lowbit_optimizer_t opt;
  const char* path;
  int failures;
  char first_error[256];
} saver_t;
static void* save_loop(void* arg) {
  saver_t* s = (saver_t*)arg;
  for (int k = 0; k < SAVES; ++k) {
    lowbit_checkpoint_mode_t mode = k % 3 == 2 ? LOWBIT_CHECKPOINT_MATERIALIZED_FP32 : LOWBIT_CHECKPOINT_COMPRESSED;
    if (lowbit_optimizer_save_file(s->opt, mode, s->path, NULL) != LOWBIT_SUCCESS && s->failures++ == 0)
      snprintf(s->first_error, sizeof s->first_error, "%s", lowbit_optimizer_last_error(s->opt));
  }
  return NULL;
}

static void test_concurrent_saves_to_one_path(void** state) {
  (void)state;
  make_dir();
  char path[128];
  snprintf(path, sizeof path, "%s/shared.ckpt", g_dir);
  Fixture f[SAVERS];
  saver_t s[SAVERS];
  pthread_t t[SAVERS];
  for (int i = 0; i < SAVERS; ++i) {
    make(&f[i], LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_FLOAT32, 0, 0);
    run_steps(&f[i], 0, 2);
    s[i] = (saver_t){f[i].opt, path, 0, ""};
  }
  for (int i = 0; i < SAVERS; ++i) assert_int_equal(pthread_create(&t[i], NULL, save_loop, &s[i]), 0);
  for (int i = 0; i < SAVERS; ++i) pthread_join(t[i], NULL);
  for (int i = 0; i < SAVERS; ++i)
    if (s[i].failures) fail_msg("saver %d: %d of %d saves failed: %s", i, s[i].failures, SAVES, s[i].first_error);
  assert_int_equal(dir_entries(), 1); /* the checkpoint, no temporary file left */
  Fixture y;
  make(&y, LOWBIT_ALGORITHM_ADAMW, LOWBIT_STATE_4BIT, LOWBIT_DTYPE_FLOAT32, 0, 0);
  assert_int_equal(lowbit_optimizer_load_file(y.opt, path, NULL), LOWBIT_SUCCESS);
  copy_params(&y, &f[0]);
  run_steps(&f[0], 2, 2);
  run_steps(&y, 2, 2);
  assert_same_params(&f[0], &y);
  /* a failed save (its directory is gone) leaves nothing behind either */
  remove(path);
  rmdir(g_dir);
  assert_int_equal(lowbit_optimizer_save_file(y.opt, LOWBIT_CHECKPOINT_COMPRESSED, path, NULL), LOWBIT_ERROR_IO);
  assert_non_null(strstr(lowbit_optimizer_last_error(y.opt), path));
  for (int i = 0; i < SAVERS; ++i) destroy(&f[i]);
  destroy(&y);
}


/* ------------------------------------------------------------------ materialised round trips */

/* Blocks of moment 0 of param i whose largest-magnitude element is negative. */
static int negative_extreme_blocks(lowbit_optimizer_t opt, int i, int block) {
  float* m = malloc(kSizes[i] * 4);
  assert_int_equal(lowbit_optimizer_read_moment(opt, i, 0, m, kSizes[i], NULL), LOWBIT_SUCCESS);
  int count = 0;
  for (int64_t b = 0; b < kSizes[i]; b += block) {
    float ext = 0.f;
    for (int64_t k = b; k < b + block && k < kSizes[i]; ++k)
      if (fabsf(m[k]) > fabsf(ext)) ext = m[k];
    count += ext < 0.f;
  }
  free(m);
  return count;
}

/* Issue 17 (12): materialise (fp32 or bf16) -> load into the same quantized
 * format -> materialise -> ... is a fixed point after the first load: the
 * codes and scales (the whole compressed checkpoint) of cycles 2..10 equal
 * cycle 1's. Before, blocks whose largest-magnitude element is negative
 * shrank by x0.99297 (8-bit) or x0.8875 (4-bit) per cycle (the signed maps'
 * most negative code is not -1). From an fp32 checkpoint, cycle 1 itself
 * keeps every decoded value within 2 ulps of the state the steps made. From a
 * bf16 one, rounding moves each value and its block's scale by at most 2^-8
 * (relative), so the normalised value by at most about 2^-7; where that
 * crosses a midpoint the code moves to a neighbour, which then lies at most
 * twice as far: every decoded value stays within 2^-6 + 2^-8 < 2^-5 (which
 * depends on the data: some seeds cross a midpoint, most do not). The same
 * holds through read_moment / write_moment, which encode like a load. */
static void test_materialized_round_trip_is_fixed_point(void** state) {
  (void)state;
  const lowbit_state_format_t fmts[] = {LOWBIT_STATE_8BIT, LOWBIT_STATE_4BIT, LOWBIT_STATE_FP8};
  const int blocks[] = {256, 128, 256};
  const lowbit_checkpoint_mode_t modes[] = {LOWBIT_CHECKPOINT_MATERIALIZED_FP32, LOWBIT_CHECKPOINT_MATERIALIZED_BF16};
  for (int f = 0; f < 3; ++f)
    for (int mi = 0; mi < 2; ++mi) {
      Fixture x;
      make(&x, LOWBIT_ALGORITHM_ADAMW, fmts[f], LOWBIT_DTYPE_FLOAT32, 0, 0);
      run_steps(&x, 0, 4);
      /* params 0 and 2 are quantized (257 stays fp32): some of their blocks
       * have a negative extreme once decoded (about half in fp32; fewer in
       * 4-bit, whose top positive code is 1 but most negative -0.8875: at
       * least 9 of 111 blocks over 60 random seeds, as few as 2 in param 0) */
      assert_true(negative_extreme_blocks(x.opt, 0, blocks[f]) + negative_extreme_blocks(x.opt, 2, blocks[f]) >= 3);
      float *orig[2][NP], *now[NP];
      for (int m = 0; m < 2; ++m) read_all(x.opt, m, orig[m]);
      int64_t first_size = 0;
      uint8_t* first = NULL;
      for (int cycle = 1; cycle <= 10; ++cycle) {
        int64_t size;
        uint8_t* buf = save(x.opt, modes[mi], &size);
        assert_int_equal(lowbit_optimizer_load(x.opt, buf, size, NULL), LOWBIT_SUCCESS);
        free(buf);
        int64_t csize;
        uint8_t* compressed = save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, &csize);
        if (cycle == 1) {
          first = compressed, first_size = csize;
          continue;
        }
        assert_int_equal(csize, first_size);
        if (memcmp(compressed, first, (size_t)csize))
          fail_msg("format %d, materialised mode %d: cycle %d changed the codes or scales of cycle 1", (int)fmts[f],
                   (int)modes[mi], cycle);
        free(compressed);
      }
      /* cycle 1 against the state the steps made */
      for (int m = 0; m < 2; ++m) {
        read_all(x.opt, m, now);
        for (int i = 0; i < NP; ++i) {
          for (int64_t k = 0; k < kSizes[i]; ++k) {
            float a = orig[m][i][k], b = now[i][k];
            float tol = modes[mi] == LOWBIT_CHECKPOINT_MATERIALIZED_FP32 ? 2.f * (nextafterf(fabsf(a), INFINITY) - fabsf(a))
                                                                       : 0x1p-5f * fabsf(a); /* bf16 rounding, see above */
            if (!(fabsf(a - b) <= tol))
              fail_msg("format %d, mode %d: param %d moment %d element %lld: %.9g after the steps, %.9g after a save/load",
                       (int)fmts[f], (int)modes[mi], i, m, (long long)k, a, b);
          }
          free(orig[m][i]), free(now[i]);
        }
      }
      /* read_moment -> write_moment is the same fixed point */
      for (int i = 0; i < NP; ++i)
        for (int m = 0; m < 2; ++m) {
          float* v = malloc(kSizes[i] * 4);
          assert_int_equal(lowbit_optimizer_read_moment(x.opt, i, m, v, kSizes[i], NULL), LOWBIT_SUCCESS);
          if (mi == 1) /* as a bf16 checkpoint holds them */
            for (int64_t k = 0; k < kSizes[i]; ++k) {
              uint32_t u;
              memcpy(&u, &v[k], 4);
              u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
              memcpy(&v[k], &u, 4);
            }
          assert_int_equal(lowbit_optimizer_write_moment(x.opt, i, m, v, kSizes[i], NULL), LOWBIT_SUCCESS);
          free(v);
        }
      int64_t wsize;
      uint8_t* written = save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, &wsize);
      assert_int_equal(wsize, first_size);
      assert_memory_equal(written, first, (size_t)wsize);
      free(written), free(first);
      destroy(&x);
    }
}

/* ------------------------------------------------------------------ issue 15 */

/* golden/v1_adamw_4bit.lbck was written by lowbit 0.2 (checkpoint version 1)
 * with golden/make_v1.c; the same optimizer and steps run here must hold the
 * same state once the file is loaded into a fresh one. */
static float gfr(unsigned* s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) / 16777216.0f) * 2.f - 1.f; }
static void make_v1_fixture(lowbit_optimizer_t* opt, float** p, float** g, int steps) {
  static const int64_t n[3] = {5000, 300, 7};
  static const lowbit_state_format_t f[3] = {LOWBIT_STATE_DEFAULT, LOWBIT_STATE_8BIT, LOWBIT_STATE_FP32};
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW);
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
  c.state_format = LOWBIT_STATE_4BIT;
  h.lr = 1e-2f;
  assert_int_equal(lowbit_optimizer_create(opt, &c, &h), LOWBIT_SUCCESS);
  unsigned s = 7;
  for (int i = 0; i < 3; ++i) {
    p[i] = malloc(n[i] * 4);
    g[i] = malloc(n[i] * 4);
    for (int64_t k = 0; k < n[i]; ++k) p[i][k] = gfr(&s);
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){p[i], n[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.grad = (lowbit_tensor_t){g[i], n[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.state_format = f[i];
    int64_t id;
    assert_int_equal(lowbit_optimizer_add_param(*opt, &pc, &id), LOWBIT_SUCCESS);
  }
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < 3; ++i)
      for (int64_t k = 0; k < n[i]; ++k) g[i][k] = gfr(&s);
    assert_int_equal(lowbit_optimizer_step(*opt, NULL), LOWBIT_SUCCESS);
  }
}

static void test_loads_version1_golden(void** state) {
  (void)state;
  lowbit_optimizer_t a, b;
  float *pa[3], *ga[3], *pb[3], *gb[3];
  make_v1_fixture(&a, pa, ga, 3);
  make_v1_fixture(&b, pb, gb, 0);
  const char* path = LOWBIT_GOLDEN_DIR "/v1_adamw_4bit.lbck";
  if (lowbit_optimizer_load_file(b, path, NULL) != LOWBIT_SUCCESS)
    fail_msg("loading %s: %s", path, lowbit_optimizer_last_error(b));
  for (int i = 0; i < 3; ++i) {
    lowbit_param_info_t ia, ib;
    ia.struct_size = ib.struct_size = sizeof ia;
    assert_int_equal(lowbit_optimizer_param_info(a, i, &ia), LOWBIT_SUCCESS);
    assert_int_equal(lowbit_optimizer_param_info(b, i, &ib), LOWBIT_SUCCESS);
    assert_int_equal(ia.step, 3);
    assert_int_equal(ib.step, 3);
    for (int m = 0; m < 2; ++m) {
      float *x = calloc((size_t)ia.numel, 4), *y = calloc((size_t)ia.numel, 4);
      assert_int_equal(lowbit_optimizer_read_moment(a, i, m, x, ia.numel, NULL), LOWBIT_SUCCESS);
      assert_int_equal(lowbit_optimizer_read_moment(b, i, m, y, ia.numel, NULL), LOWBIT_SUCCESS);
      assert_memory_equal(x, y, 4 * (size_t)ia.numel);
      free(x), free(y);
    }
  }
  /* and a version-2 save of it loads back */
  int64_t size;
  assert_int_equal(lowbit_optimizer_save(b, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, &size, NULL), LOWBIT_SUCCESS);
  uint8_t* buf = malloc((size_t)size);
  assert_int_equal(lowbit_optimizer_save(b, LOWBIT_CHECKPOINT_COMPRESSED, buf, size, &size, NULL), LOWBIT_SUCCESS);
  uint32_t version;
  memcpy(&version, buf + 8, 4);
  assert_int_equal(version, 2);
  assert_int_equal(lowbit_optimizer_load(a, buf, size, NULL), LOWBIT_SUCCESS);
  free(buf);
  for (int i = 0; i < 3; ++i) free(pa[i]), free(ga[i]), free(pb[i]), free(gb[i]);
  lowbit_optimizer_destroy(a);
  lowbit_optimizer_destroy(b);
}

/* Shaped params (7 x 129 and 3 x 5 x 257 and a 1-D one) with the two
 * presets: a compressed checkpoint resumes bit for bit; a materialised one
 * and one of the other preset load (converted). */
typedef struct {
  lowbit_optimizer_t opt;
  float* p[3];
  float* g[3];
} Shaped;
static const int64_t kShapedN[3] = {7 * 129, 3 * 5 * 257, 1000};
static void make_shaped(Shaped* f, lowbit_preset_t preset) {
  lowbit_optimizer_config_t c;
  lowbit_hparams_t h;
  assert_int_equal(lowbit_optimizer_config_preset(&c, preset), LOWBIT_SUCCESS);
  c.min_quantized_numel = 0;
  lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
  assert_int_equal(lowbit_optimizer_create(&f->opt, &c, &h), LOWBIT_SUCCESS);
  unsigned s = g_seed;
  for (int i = 0; i < 3; ++i) {
    f->p[i] = malloc(kShapedN[i] * 4);
    f->g[i] = malloc(kShapedN[i] * 4);
    for (int64_t k = 0; k < kShapedN[i]; ++k) f->p[i][k] = frand(&s);
    lowbit_param_config_t pc;
    lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){f->p[i], kShapedN[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.grad = (lowbit_tensor_t){f->g[i], kShapedN[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    if (i == 0) pc.ndim = 2, pc.shape[0] = 7, pc.shape[1] = 129;
    if (i == 1) pc.ndim = 3, pc.shape[0] = 3, pc.shape[1] = 5, pc.shape[2] = 257;
    int64_t id;
    assert_int_equal(lowbit_optimizer_add_param(f->opt, &pc, &id), LOWBIT_SUCCESS);
  }
}
static void shaped_steps(Shaped* f, int first, int count) {
  for (int t = first; t < first + count; ++t) {
    for (int i = 0; i < 3; ++i) {
      unsigned s = g_seed * 17u + (unsigned)(t * 131 + i);
      for (int64_t k = 0; k < kShapedN[i]; ++k) f->g[i][k] = frand(&s) * (float)(1 + k % 13);
    }
    assert_int_equal(lowbit_optimizer_step(f->opt, NULL), LOWBIT_SUCCESS);
  }
}
static void destroy_shaped(Shaped* f) {
  for (int i = 0; i < 3; ++i) free(f->p[i]), free(f->g[i]);
  lowbit_optimizer_destroy(f->opt);
}

static void test_shaped_checkpoints(void** state) {
  (void)state;
  for (int preset = LOWBIT_PRESET_LPMM_ADAMW_4BIT; preset <= LOWBIT_PRESET_ADAMW_4BIT_FACTOR; ++preset) {
    Shaped x, y, other;
    make_shaped(&x, (lowbit_preset_t)preset);
    make_shaped(&y, (lowbit_preset_t)preset);
    make_shaped(&other, (lowbit_preset_t)(3 - preset));
    shaped_steps(&x, 0, 4);
    for (int mode = LOWBIT_CHECKPOINT_COMPRESSED; mode <= LOWBIT_CHECKPOINT_MATERIALIZED_FP32; ++mode) {
      int64_t size;
      assert_int_equal(lowbit_optimizer_save(x.opt, mode, NULL, 0, &size, NULL), LOWBIT_SUCCESS);
      uint8_t* buf = malloc((size_t)size);
      assert_int_equal(lowbit_optimizer_save(x.opt, mode, buf, size, &size, NULL), LOWBIT_SUCCESS);
      assert_int_equal(lowbit_optimizer_load(y.opt, buf, size, NULL), LOWBIT_SUCCESS);
      if (lowbit_optimizer_load(other.opt, buf, size, NULL) != LOWBIT_SUCCESS)
        fail_msg("preset %d mode %d into the other preset: %s", preset, mode, lowbit_optimizer_last_error(other.opt));
      for (int i = 0; i < 3; ++i) {
        float *a = calloc((size_t)kShapedN[i], 4), *b = calloc((size_t)kShapedN[i], 4);
        for (int m = 0; m < 2; ++m) {
          assert_int_equal(lowbit_optimizer_read_moment(x.opt, i, m, a, kShapedN[i], NULL), LOWBIT_SUCCESS);
          assert_int_equal(lowbit_optimizer_read_moment(y.opt, i, m, b, kShapedN[i], NULL), LOWBIT_SUCCESS);
          /* compressed: the same bits. Materialised: a rank-1 or block v re-encodes to the same codes (its
           * vectors / absmax are decoded values); the factored v's means give back its accumulators within
           * rounding; m (4-bit blocks, signed map without -1) may re-code, as for every block format. */
          if (mode == LOWBIT_CHECKPOINT_COMPRESSED || (m == 1 && (preset == LOWBIT_PRESET_LPMM_ADAMW_4BIT || i == 2)))
            assert_memory_equal(a, b, 4 * (size_t)kShapedN[i]);
          else if (m == 1)
            for (int64_t k = 0; k < kShapedN[i]; ++k) assert_true(fabsf(a[k] - b[k]) <= 1e-5f * a[k]);
        }
        free(a), free(b);
      }
      free(buf);
    }
    /* compressed resume: the same steps give the same bits */
    int64_t size;
    assert_int_equal(lowbit_optimizer_save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, NULL, 0, &size, NULL), LOWBIT_SUCCESS);
    uint8_t* buf = malloc((size_t)size);
    assert_int_equal(lowbit_optimizer_save(x.opt, LOWBIT_CHECKPOINT_COMPRESSED, buf, size, &size, NULL), LOWBIT_SUCCESS);
    assert_int_equal(lowbit_optimizer_load(y.opt, buf, size, NULL), LOWBIT_SUCCESS);
    /* and through a file: load_file's size bound counts the dims, rank-1 vectors and factored accumulators */
    for (int mode = LOWBIT_CHECKPOINT_COMPRESSED; mode <= LOWBIT_CHECKPOINT_MATERIALIZED_FP32; ++mode) {
      char path[96];
      snprintf(path, sizeof path, "/tmp/lowbit_shaped_%d_%d_%d.bin", (int)getpid(), preset, mode);
      assert_int_equal(lowbit_optimizer_save_file(x.opt, (lowbit_checkpoint_mode_t)mode, path, NULL), LOWBIT_SUCCESS);
      if (lowbit_optimizer_load_file(other.opt, path, NULL) != LOWBIT_SUCCESS)
        fail_msg("preset %d mode %d through a file: %s", preset, mode, lowbit_optimizer_last_error(other.opt));
      unlink(path);
    }
    assert_int_equal(lowbit_optimizer_load(y.opt, buf, size, NULL), LOWBIT_SUCCESS);
    for (int i = 0; i < 3; ++i) memcpy(y.p[i], x.p[i], kShapedN[i] * 4);
    shaped_steps(&x, 4, 3);
    shaped_steps(&y, 4, 3);
    for (int i = 0; i < 3; ++i) assert_memory_equal(x.p[i], y.p[i], kShapedN[i] * 4);
    free(buf);
    destroy_shaped(&x), destroy_shaped(&y), destroy_shaped(&other);
  }
}

int main(void) {
  g_seed = (unsigned)lowbit_test_seed("test_checkpoint");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resume_is_bit_identical),
      cmocka_unit_test(test_across_formats),
      cmocka_unit_test(test_file_round_trip),
      cmocka_unit_test(test_bad_files_change_nothing),
      cmocka_unit_test(test_sgd_momentum_schedule_to_zero_resumes),
      cmocka_unit_test(test_load_file_bounded),
      cmocka_unit_test(test_concurrent_saves_to_one_path),
      cmocka_unit_test(test_materialized_round_trip_is_fixed_point),
      cmocka_unit_test(test_loads_version1_golden),
      cmocka_unit_test(test_shaped_checkpoints),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

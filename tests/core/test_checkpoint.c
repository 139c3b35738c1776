/* Checkpoints through the C API: bit-identical resume per format, loading
 * across formats and modes, every kind of bad file leaving the optimizer
 * untouched, materialised round trips, version-1 and shaped checkpoints
 * (files: test_checkpoint_files.c). */
#include "checkpoint_fixture.h"

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "../common/test_seed.h"


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
      cmocka_unit_test(test_materialized_round_trip_is_fixed_point),
      cmocka_unit_test(test_loads_version1_golden),
      cmocka_unit_test(test_shaped_checkpoints),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

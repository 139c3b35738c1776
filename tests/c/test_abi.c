/* Issue 30 (item 3): one ABI rule for every struct of lowbit.h and
 * lowbit_comm.h (docs/ABI.md). For each struct: its sized init writes exactly
 * the size it is given (bytes past it untouched), an older released size is
 * accepted and the plain-named exported init fills the struct of its
 * release; an unknown size is refused with a message naming the struct and
 * the size, writing nothing; a struct passed in at an older size gets the
 * defaults of the newer fields; a struct the library fills gets exactly its
 * struct_size bytes.
 * Issue 32, the communicator's defects on a one-rank callback transport:
 * destroying a communicator from inside its own transport function is
 * refused (9); stage_message_bytes takes 2^55 as its message says, and a
 * callback transport's errors name it, not NCCL (10). And the one rule of
 * 1-bit LAMB's trust-ratio clip: 0 < min_coeff <= max_coeff. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "lowbit.h"
#include "lowbit_comm.h"

#define GUARD 0xA5
#define SLACK 64
#define BUF 512

static void check_error(lowbit_status_t got, lowbit_status_t want, const char* message, const char* n1,
                        const char* n2, const char* what) {
  if (got != want) fail_msg("%s: status %d, expected %d (%s)", what, (int)got, (int)want, message);
  if (n1 && !strstr(message, n1)) fail_msg("%s: \"%s\" does not name \"%s\"", what, message, n1);
  if (n2 && !strstr(message, n2)) fail_msg("%s: \"%s\" does not name \"%s\"", what, message, n2);
}

/* The call first, then its message (`message` is read after the call). */
#define expect_error(call, want, message, n1, n2, what) \
  do {                                                  \
    const lowbit_status_t got_ = (call);                \
    check_error(got_, want, message, n1, n2, what);     \
  } while (0)

#define OK(call)                                                                                    \
  do {                                                                                              \
    lowbit_status_t st_ = (call);                                                                   \
    if (st_ != LOWBIT_SUCCESS) fail_msg("%s:%d: %s -> %d: %s", __FILE__, __LINE__, #call, (int)st_, \
                                        lowbit_last_error());                                       \
  } while (0)

/* Every byte of b[from, to) is GUARD. */
static void untouched(const unsigned char* b, size_t from, size_t to, const char* what) {
  for (size_t i = from; i < to; ++i)
    if (b[i] != GUARD) fail_msg("%s: byte %zu was written (only %zu bytes may be)", what, i, from);
}

static size_t size_field(const void* p) {
  size_t s;
  memcpy(&s, p, sizeof s);
  return s;
}

static void set_size(void* p, size_t s) { memcpy(p, &s, sizeof s); }

/* ------------------------------------------------------------ the inits */

typedef lowbit_status_t (*sized_fn)(void* p, size_t size);
typedef lowbit_status_t (*plain_fn)(void* p);

#define INIT_PAIR(name, sized_call, plain_call)                                             \
  static lowbit_status_t name##_sized(void* p, size_t n) { return sized_call; }             \
  static lowbit_status_t name##_plain(void* p) { return plain_call; }

INIT_PAIR(build_info, lowbit_build_info_init_sized(p, n), (lowbit_build_info_init)(p))
INIT_PAIR(hparams, lowbit_hparams_init_sized(p, n, LOWBIT_ALGORITHM_ADAMW),
          (lowbit_hparams_init)(p, LOWBIT_ALGORITHM_ADAMW))
INIT_PAIR(config, lowbit_optimizer_config_init_sized(p, n, LOWBIT_ALGORITHM_ADAMW),
          (lowbit_optimizer_config_init)(p, LOWBIT_ALGORITHM_ADAMW))
INIT_PAIR(preset, lowbit_optimizer_config_preset_sized(p, n, LOWBIT_PRESET_LPMM_ADAMW_4BIT),
          (lowbit_optimizer_config_preset)(p, LOWBIT_PRESET_LPMM_ADAMW_4BIT))
INIT_PAIR(param_config, lowbit_param_config_init_sized(p, n), (lowbit_param_config_init)(p))
INIT_PAIR(options, lowbit_onebit_options_init_sized(p, n), (lowbit_onebit_options_init)(p))
INIT_PAIR(status, lowbit_onebit_status_init_sized(p, n), (lowbit_onebit_status_init)(p))
INIT_PAIR(param_info, lowbit_param_info_init_sized(p, n), (lowbit_param_info_init)(p))
INIT_PAIR(plan, lowbit_state_plan_init_sized(p, n), (lowbit_state_plan_init)(p))
INIT_PAIR(algorithm_info, lowbit_algorithm_info_init_sized(p, n), (lowbit_algorithm_info_init)(p))
INIT_PAIR(hparam_info, lowbit_hparam_info_init_sized(p, n), (lowbit_hparam_info_init)(p))
INIT_PAIR(comm_config, lowbit_comm_config_init_sized(p, n), (lowbit_comm_config_init)(p))
INIT_PAIR(comm_info, lowbit_comm_info_init_sized(p, n), (lowbit_comm_info_init)(p))
INIT_PAIR(comm_stats, lowbit_comm_stats_init_sized(p, n), (lowbit_comm_stats_init)(p))
INIT_PAIR(transport, lowbit_comm_transport_init_sized(p, n), (lowbit_comm_transport_init)(p))

typedef struct {
  const char* type;
  size_t now, old; /* sizeof, and the older released size (0: none) */
  size_t plain;    /* what the plain-named function fills */
  sized_fn sized;
  plain_fn plain_init;
} struct_case_t;

#define OLD_CONFIG offsetof(lowbit_optimizer_config_t, first_normalization)
#define OLD_PARAM_CONFIG offsetof(lowbit_param_config_t, shape)
#define OLD_HPARAMS ((size_t)48) /* 0.2 .. 0.6: up to bias_correction, padded */
#define OLD_PARAM_INFO offsetof(lowbit_param_info_t, first_normalization)
#define OLD_PLAN offsetof(lowbit_state_plan_t, normalization)
#define OLD_COMM_CONFIG offsetof(lowbit_comm_config_t, timeout_ms)
#define OLD_COMM_INFO offsetof(lowbit_comm_info_t, timeout_ms)
#define OLD_BUILD_INFO offsetof(lowbit_build_info_t, cpu_kernels) /* 0.3 .. 0.7 */

static const struct_case_t kCases[] = {
    {"lowbit_build_info_t", sizeof(lowbit_build_info_t), OLD_BUILD_INFO, OLD_BUILD_INFO, build_info_sized,
     build_info_plain},
    {"lowbit_hparams_t", sizeof(lowbit_hparams_t), OLD_HPARAMS, OLD_HPARAMS, hparams_sized, hparams_plain},
    {"lowbit_optimizer_config_t", sizeof(lowbit_optimizer_config_t), OLD_CONFIG, OLD_CONFIG, config_sized,
     config_plain},
    {"lowbit_optimizer_config_t", sizeof(lowbit_optimizer_config_t), OLD_CONFIG, sizeof(lowbit_optimizer_config_t),
     preset_sized, preset_plain},
    {"lowbit_param_config_t", sizeof(lowbit_param_config_t), OLD_PARAM_CONFIG, OLD_PARAM_CONFIG, param_config_sized,
     param_config_plain},
    {"lowbit_onebit_options_t", sizeof(lowbit_onebit_options_t), 0, sizeof(lowbit_onebit_options_t), options_sized,
     options_plain},
    {"lowbit_onebit_status_t", sizeof(lowbit_onebit_status_t), 0, sizeof(lowbit_onebit_status_t), status_sized,
     status_plain},
    {"lowbit_param_info_t", sizeof(lowbit_param_info_t), OLD_PARAM_INFO, sizeof(lowbit_param_info_t),
     param_info_sized, param_info_plain},
    {"lowbit_state_plan_t", sizeof(lowbit_state_plan_t), OLD_PLAN, offsetof(lowbit_state_plan_t, kind), plan_sized,
     plan_plain},
    {"lowbit_algorithm_info_t", sizeof(lowbit_algorithm_info_t), 0, sizeof(lowbit_algorithm_info_t),
     algorithm_info_sized, algorithm_info_plain},
    {"lowbit_hparam_info_t", sizeof(lowbit_hparam_info_t), 0, sizeof(lowbit_hparam_info_t), hparam_info_sized,
     hparam_info_plain},
    {"lowbit_comm_config_t", sizeof(lowbit_comm_config_t), OLD_COMM_CONFIG, OLD_COMM_CONFIG, comm_config_sized,
     comm_config_plain},
    {"lowbit_comm_info_t", sizeof(lowbit_comm_info_t), OLD_COMM_INFO, sizeof(lowbit_comm_info_t), comm_info_sized,
     comm_info_plain},
    {"lowbit_comm_stats_t", sizeof(lowbit_comm_stats_t), 0, sizeof(lowbit_comm_stats_t), comm_stats_sized,
     comm_stats_plain},
    {"lowbit_comm_transport_t", sizeof(lowbit_comm_transport_t), 0, sizeof(lowbit_comm_transport_t),
     transport_sized, transport_plain},
};

static void init_writes(const struct_case_t* c, size_t size, int plain) {
  unsigned char buf[BUF];
  char what[128];
  snprintf(what, sizeof what, "%s init (%s, %zu bytes)", c->type, plain ? "plain" : "sized", size);
  memset(buf, GUARD, sizeof buf);
  OK(plain ? c->plain_init(buf) : c->sized(buf, size));
  if (size_field(buf) != size) fail_msg("%s: struct_size = %zu", what, size_field(buf));
  untouched(buf, size, size + SLACK, what);
}

static void test_inits(void** state) {
  (void)state;
  for (size_t k = 0; k < sizeof kCases / sizeof kCases[0]; ++k) {
    const struct_case_t* c = &kCases[k];
    assert_true(c->now + SLACK <= BUF);
    init_writes(c, c->now, 0);
    if (c->old) init_writes(c, c->old, 0);
    init_writes(c, c->plain, 1);
    /* Sizes no release had: smaller than the first, between, larger than this library knows. */
    const size_t bad[] = {0, 8, 12, c->now - 4, c->now + 8, c->old ? c->old + 4 : c->now + 16};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; ++b) {
      unsigned char buf[BUF];
      char size_text[48], what[128];
      snprintf(size_text, sizeof size_text, "struct_size = %zu", bad[b]);
      snprintf(what, sizeof what, "%s init with %s", c->type, size_text);
      memset(buf, GUARD, sizeof buf);
      expect_error(c->sized(buf, bad[b]), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(), c->type, size_text,
                   what);
      untouched(buf, 0, sizeof buf, what);
    }
    expect_error(c->sized(NULL, c->now), LOWBIT_ERROR_NULL_POINTER, lowbit_last_error(), "NULL", NULL, c->type);
  }
}

static void test_init_defaults(void** state) {
  (void)state;
  lowbit_hparams_t h;
  OK(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_LION));
  assert_true(h.struct_size == sizeof h && h.lr == 1e-4f && h.beta2 == 0.99f);
  lowbit_optimizer_config_t oc;
  OK(lowbit_optimizer_config_preset(&oc, LOWBIT_PRESET_ADAMW_4BIT_FACTOR));
  assert_true(oc.state_format == LOWBIT_STATE_4BIT && oc.second_normalization == LOWBIT_NORMALIZATION_FACTORED);
  OK(lowbit_optimizer_config_preset(&oc, LOWBIT_PRESET_ADAMW_4BIT_SR_DYN));
  assert_true(oc.state_format == LOWBIT_STATE_4BIT_SR && oc.second_state_format == LOWBIT_STATE_4BIT_DYN &&
              oc.first_normalization == LOWBIT_NORMALIZATION_BLOCK && oc.second_normalization == LOWBIT_NORMALIZATION_BLOCK);
  assert_int_equal(lowbit_optimizer_config_preset(&oc, (lowbit_preset_t)5), LOWBIT_ERROR_INVALID_ARGUMENT);
  /* An older struct gets what it has room for. */
  unsigned char buf[BUF];
  memset(buf, GUARD, sizeof buf);
  OK(lowbit_optimizer_config_preset_sized((lowbit_optimizer_config_t*)buf, OLD_CONFIG, LOWBIT_PRESET_LPMM_ADAMW_4BIT));
  assert_int_equal(((lowbit_optimizer_config_t*)buf)->state_format, LOWBIT_STATE_4BIT);
  untouched(buf, OLD_CONFIG, OLD_CONFIG + SLACK, "0.2 preset");
  lowbit_comm_config_t cc;
  OK(lowbit_comm_config_init(&cc));
  assert_true(cc.struct_size == sizeof cc && cc.cuda_aware_mpi == LOWBIT_COMM_CUDA_AWARE_AUTO && cc.timeout_ms == 0);
  lowbit_comm_transport_t t;
  OK(lowbit_comm_transport_init(&t));
  assert_true(t.world_size == 1 && t.rank == 0 && t.host_buffers == 1 && t.device_buffers == 0 &&
              t.device_index == -1 && t.alltoall == NULL && t.allreduce_max_i64 == NULL);
  lowbit_onebit_options_t o;
  OK(lowbit_onebit_options_init(&o));
  assert_true(o.var_update_scaler == 16 && o.max_coeff == 10.f && o.min_coeff == 0.01f);
  expect_error(lowbit_hparams_init(&h, (lowbit_algorithm_t)99), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(),
               "algorithm", NULL, "hparams_init(99)");
  expect_error(lowbit_optimizer_config_preset(&oc, (lowbit_preset_t)9), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_last_error(), "preset", NULL, "preset 9");
}

/* ------------------------------------------------------------ an optimizer and a one-rank transport */

static float g_param[64], g_grad[64];

static lowbit_optimizer_t make_optimizer(lowbit_algorithm_t algorithm, const lowbit_optimizer_config_t* config) {
  lowbit_optimizer_config_t oc;
  lowbit_hparams_t h;
  OK(lowbit_optimizer_config_init(&oc, algorithm));
  OK(lowbit_hparams_init(&h, algorithm));
  lowbit_optimizer_t opt = NULL;
  OK(lowbit_optimizer_create(&opt, config ? config : &oc, &h));
  return opt;
}

static lowbit_param_config_t param_2d(void) {
  lowbit_param_config_t pc;
  lowbit_param_config_init(&pc);
  pc.param.data = g_param;
  pc.param.numel = 64;
  pc.param.dtype = LOWBIT_DTYPE_FLOAT32;
  pc.param.device = LOWBIT_DEVICE_CPU;
  pc.grad = pc.param;
  pc.grad.data = g_grad;
  return pc;
}

typedef struct {
  lowbit_comm_t comm;        /* the communicator whose calls run these functions */
  int destroy_inside;        /* alltoall tries to destroy it */
  lowbit_status_t destroyed; /* what that returned */
  char message[512];
} one_rank_t;

static int32_t copy_fn(void* u, const void* send, void* recv, int64_t m, void* stream) {
  (void)stream;
  one_rank_t* s = (one_rank_t*)u;
  if (s->destroy_inside) {
    s->destroyed = lowbit_comm_destroy(s->comm);
    snprintf(s->message, sizeof s->message, "%s", lowbit_last_error());
  }
  memmove(recv, send, (size_t)m);
  return 0;
}
static int32_t gather_fn(void* u, const void* send, void* recv, int64_t m, void* stream) {
  (void)u;
  (void)stream;
  memmove(recv, send, (size_t)m);
  return 0;
}
static int32_t sum_fn(void* u, float* data, int64_t n, void* stream) {
  (void)u, (void)data, (void)n, (void)stream;
  return 0;
}
static int32_t max_fn(void* u, int64_t* v, int32_t k) {
  (void)u, (void)v, (void)k;
  return 0;
}

/* The transport of a one-rank communicator (s is reset). */
static lowbit_comm_transport_t one_rank_transport(one_rank_t* s) {
  memset(s, 0, sizeof *s);
  lowbit_comm_transport_t t;
  OK(lowbit_comm_transport_init(&t));
  t.user_data = s;
  t.alltoall = copy_fn, t.allgather = gather_fn;
  t.allreduce_sum_f32 = sum_fn, t.allreduce_max_i64 = max_fn;
  return t;
}

static lowbit_comm_t make_comm(one_rank_t* s, const lowbit_comm_config_t* config) {
  lowbit_comm_transport_t t = one_rank_transport(s);
  OK(lowbit_comm_create_transport(&s->comm, &t, config));
  return s->comm;
}

static lowbit_tensor_t host_tensor(float* data, int64_t n) {
  const lowbit_tensor_t t = {data, n, LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
  return t;
}

/* ------------------------------------------------------------ reads */

/* A struct at an older size, with garbage after it: the library must not
 * read the garbage (it would be refused) but take the defaults. */
static void test_older_structs_passed_in_get_defaults(void** state) {
  (void)state;
  unsigned char cbuf[BUF], pbuf[BUF];
  memset(cbuf, 0x7F, sizeof cbuf);
  OK(lowbit_optimizer_config_init_sized((lowbit_optimizer_config_t*)cbuf, OLD_CONFIG, LOWBIT_ALGORITHM_ADAMW));
  lowbit_optimizer_t opt = make_optimizer(LOWBIT_ALGORITHM_ADAMW, (const lowbit_optimizer_config_t*)cbuf);
  memset(pbuf, 0x7F, sizeof pbuf);
  lowbit_param_config_t pc = param_2d();
  memcpy(pbuf, &pc, offsetof(lowbit_param_config_t, ndim)); /* what a 0.2 caller owns */
  set_size(pbuf, OLD_PARAM_CONFIG);
  int64_t id = -1;
  OK(lowbit_optimizer_add_param(opt, (const lowbit_param_config_t*)pbuf, &id));
  lowbit_param_info_t info;
  OK(lowbit_param_info_init(&info));
  OK(lowbit_optimizer_param_info(opt, id, &info));
  assert_int_equal(info.ndim, 0);
  assert_int_equal(info.first_normalization, LOWBIT_NORMALIZATION_BLOCK);
  assert_int_equal(info.second_normalization, LOWBIT_NORMALIZATION_BLOCK);
  /* The plan of the same structs. */
  lowbit_hparams_t h;
  OK(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  lowbit_state_plan_t plan;
  OK(lowbit_state_plan_init(&plan));
  OK(lowbit_plan_param_state((const lowbit_optimizer_config_t*)cbuf, &h, (const lowbit_param_config_t*)pbuf, &plan));
  assert_int_equal(plan.normalization[0], LOWBIT_NORMALIZATION_BLOCK);
  lowbit_optimizer_destroy(opt);
  /* A 0.2 comm config: no timeout (garbage there would be refused for a callback transport). */
  unsigned char ccbuf[BUF];
  memset(ccbuf, 0x7F, sizeof ccbuf);
  OK(lowbit_comm_config_init_sized((lowbit_comm_config_t*)ccbuf, OLD_COMM_CONFIG));
  one_rank_t s;
  lowbit_comm_t comm = make_comm(&s, (const lowbit_comm_config_t*)ccbuf);
  lowbit_comm_info_t ci;
  OK(lowbit_comm_info_init(&ci));
  OK(lowbit_comm_get_info(comm, &ci));
  assert_true(ci.timeout_ms == 0 && ci.world_size == 1);
  OK(lowbit_comm_destroy(comm));
}

static void test_unknown_sizes_passed_in_are_refused(void** state) {
  (void)state;
  lowbit_optimizer_config_t oc;
  lowbit_hparams_t h;
  OK(lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ONEBIT_LAMB));
  OK(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ONEBIT_LAMB));
  lowbit_optimizer_t opt = (lowbit_optimizer_t)&oc;
  oc.struct_size = OLD_CONFIG + 4;
  expect_error(lowbit_optimizer_create(&opt, &oc, &h), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(),
               "lowbit_optimizer_config_t", "config.struct_size = 76", "config 76");
  assert_null(opt);
  oc.struct_size = sizeof oc;
  h.struct_size = 44;
  expect_error(lowbit_optimizer_create(&opt, &oc, &h), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(),
               "lowbit_hparams_t", "hparams.struct_size = 44", "hparams 44");
  h.struct_size = sizeof h;
  OK(lowbit_optimizer_create(&opt, &oc, &h));
  h.struct_size = sizeof h + 8;
  char too_big[48];
  snprintf(too_big, sizeof too_big, "struct_size = %zu", sizeof h + 8);
  expect_error(lowbit_optimizer_set_hparams(opt, 0, &h), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(opt), "lowbit_hparams_t", too_big, "set_hparams sizeof + 8");
  int32_t group = -1;
  expect_error(lowbit_optimizer_add_group(opt, &h, &group), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(opt), "lowbit_hparams_t", NULL, "add_group");
  lowbit_param_config_t pc = param_2d();
  pc.struct_size = 100;
  int64_t id = -1;
  expect_error(lowbit_optimizer_add_param(opt, &pc, &id), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(opt), "lowbit_param_config_t", "struct_size = 100", "add_param 100");
  lowbit_onebit_options_t o;
  OK(lowbit_onebit_options_init(&o));
  o.struct_size = 48;
  expect_error(lowbit_optimizer_set_onebit_options(opt, &o), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(opt), "lowbit_onebit_options_t", "struct_size = 48", "options 48");
  lowbit_optimizer_destroy(opt);
  /* The communicator's. */
  one_rank_t s;
  lowbit_comm_transport_t t = one_rank_transport(&s);
  lowbit_comm_t comm = (lowbit_comm_t)&s;
  t.struct_size = 64;
  expect_error(lowbit_comm_create_transport(&comm, &t, NULL), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(),
               "lowbit_comm_transport_t", "transport.struct_size = 64", "transport 64");
  assert_null(comm);
  t.struct_size = sizeof t;
  lowbit_comm_config_t cc;
  OK(lowbit_comm_config_init(&cc));
  cc.struct_size = 20;
  expect_error(lowbit_comm_create_transport(&comm, &t, &cc), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(),
               "lowbit_comm_config_t", "config.struct_size = 20", "comm config 20");
  assert_null(comm);
}

/* ------------------------------------------------------------ writes */

/* out (in a GUARD-filled buffer) at `size`: the call writes that much. */
static unsigned char* guarded_out(unsigned char* buf, size_t size) {
  memset(buf, GUARD, BUF);
  set_size(buf, size);
  return buf;
}

static void test_writes_honour_struct_size(void** state) {
  (void)state;
  unsigned char buf[BUF];
  lowbit_optimizer_t opt = make_optimizer(LOWBIT_ALGORITHM_ADAMW, NULL);
  lowbit_param_config_t pc = param_2d();
  pc.ndim = 2;
  pc.shape[0] = 8;
  pc.shape[1] = 8;
  int64_t id = -1;
  OK(lowbit_optimizer_add_param(opt, &pc, &id));
  /* param_info: 0.2 and current sizes, a wrong one. */
  const size_t info_sizes[] = {OLD_PARAM_INFO, sizeof(lowbit_param_info_t)};
  for (int k = 0; k < 2; ++k) {
    lowbit_param_info_t* info = (lowbit_param_info_t*)guarded_out(buf, info_sizes[k]);
    OK(lowbit_optimizer_param_info(opt, id, info));
    assert_true(info->struct_size == info_sizes[k] && info->numel == 64);
    untouched(buf, info_sizes[k], info_sizes[k] + SLACK, "param_info");
    if (k == 1) assert_int_equal(info->ndim, 2);
  }
  guarded_out(buf, OLD_PARAM_INFO + 8);
  expect_error(lowbit_optimizer_param_info(opt, id, (lowbit_param_info_t*)buf), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(opt), "lowbit_param_info_t", "struct_size = 64", "param_info 64");
  untouched(buf, sizeof(size_t), BUF, "refused param_info");
  /* The plan. */
  lowbit_optimizer_config_t oc;
  lowbit_hparams_t h;
  OK(lowbit_optimizer_config_init(&oc, LOWBIT_ALGORITHM_ADAMW));
  OK(lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW));
  lowbit_state_plan_t* plan = (lowbit_state_plan_t*)guarded_out(buf, OLD_PLAN);
  OK(lowbit_plan_param_state(&oc, &h, &pc, plan));
  assert_true(plan->struct_size == OLD_PLAN && plan->num_moments == 2);
  untouched(buf, OLD_PLAN, OLD_PLAN + SLACK, "0.2 plan");
  guarded_out(buf, 8);
  expect_error(lowbit_plan_param_state(&oc, &h, &pc, (lowbit_state_plan_t*)buf), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_last_error(), "lowbit_state_plan_t", "out.struct_size = 8", "plan 8");
  untouched(buf, sizeof(size_t), BUF, "refused plan");
  /* get_hparams: the released size; and, as before 0.4, any other value is
   * the 0.2 struct (callers of earlier releases did not set it). */
  const size_t hp_sizes[] = {sizeof(lowbit_hparams_t), 0, 12345};
  for (int k = 0; k < 3; ++k) {
    lowbit_hparams_t* back = (lowbit_hparams_t*)guarded_out(buf, hp_sizes[k]);
    OK(lowbit_optimizer_get_hparams(opt, 0, back));
    const size_t written = k == 0 ? sizeof(lowbit_hparams_t) : OLD_HPARAMS;
    assert_true(back->struct_size == written && back->lr == h.lr);
    untouched(buf, written, written + SLACK, "get_hparams");
  }
  lowbit_optimizer_destroy(opt);
  /* build_info. */
  lowbit_build_info_t* bi = (lowbit_build_info_t*)guarded_out(buf, sizeof(lowbit_build_info_t));
  OK(lowbit_build_info(bi));
  assert_int_equal(bi->version, lowbit_version());
  untouched(buf, sizeof(lowbit_build_info_t), sizeof(lowbit_build_info_t) + SLACK, "build_info");
  assert_true(strlen(bi->cpu_matmul_fp32) > 0 && strlen(bi->cpu_matmul_bf16) > 0);
  assert_true(strlen(bi->cpu_kernels) > 0 && strlen(bi->cpu_kernels_available) > 0 && strlen(bi->cpu_codec) > 0);
  /* A 0.3 caller's struct gets its 80 bytes, nothing past them. */
  bi = (lowbit_build_info_t*)guarded_out(buf, OLD_BUILD_INFO);
  OK(lowbit_build_info(bi));
  assert_int_equal(bi->version, lowbit_version());
  untouched(buf, OLD_BUILD_INFO, OLD_BUILD_INFO + SLACK, "0.3 build_info");
  guarded_out(buf, sizeof(lowbit_build_info_t) - 8);
  expect_error(lowbit_build_info((lowbit_build_info_t*)buf), LOWBIT_ERROR_INVALID_ARGUMENT, lowbit_last_error(),
               "lowbit_build_info_t", NULL, "build_info - 8");
  untouched(buf, sizeof(size_t), BUF, "refused build_info");
}

static void test_onebit_status_writes(void** state) {
  (void)state;
  unsigned char buf[BUF];
  lowbit_optimizer_t opt = make_optimizer(LOWBIT_ALGORITHM_ZEROONE_ADAM, NULL);
  const size_t sizes[] = {sizeof(lowbit_onebit_status_t), 0, 3};
  for (int k = 0; k < 3; ++k) {
    lowbit_onebit_status_t* st = (lowbit_onebit_status_t*)guarded_out(buf, sizes[k]);
    OK(lowbit_optimizer_onebit_status(opt, st));
    assert_true(st->struct_size == sizeof(lowbit_onebit_status_t) && st->step == 0 && st->var_interval == 1);
    untouched(buf, sizeof(lowbit_onebit_status_t), sizeof(lowbit_onebit_status_t) + SLACK, "onebit_status");
  }
  lowbit_optimizer_destroy(opt);
}

static void test_comm_writes(void** state) {
  (void)state;
  unsigned char buf[BUF];
  one_rank_t s;
  lowbit_comm_t comm = make_comm(&s, NULL);
  const size_t info_sizes[] = {OLD_COMM_INFO, sizeof(lowbit_comm_info_t)};
  for (int k = 0; k < 2; ++k) {
    lowbit_comm_info_t* info = (lowbit_comm_info_t*)guarded_out(buf, info_sizes[k]);
    OK(lowbit_comm_get_info(comm, info));
    assert_true(info->struct_size == info_sizes[k] && info->backend == LOWBIT_COMM_BACKEND_CALLBACKS &&
                info->world_size == 1);
    if (k == 1) assert_true(info->timeout_ms == 0);
    untouched(buf, info_sizes[k], info_sizes[k] + SLACK, "comm_info");
  }
  guarded_out(buf, OLD_COMM_INFO + 4);
  expect_error(lowbit_comm_get_info(comm, (lowbit_comm_info_t*)buf), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_comm_last_error(comm), "lowbit_comm_info_t", "struct_size = 68", "comm_info 68");
  untouched(buf, sizeof(size_t), BUF, "refused comm_info");
  lowbit_comm_stats_t* st = (lowbit_comm_stats_t*)guarded_out(buf, sizeof(lowbit_comm_stats_t));
  OK(lowbit_comm_get_stats(comm, st));
  assert_true(st->compressed_calls == 0);
  untouched(buf, sizeof(lowbit_comm_stats_t), sizeof(lowbit_comm_stats_t) + SLACK, "comm_stats");
  guarded_out(buf, 16);
  expect_error(lowbit_comm_get_stats(comm, (lowbit_comm_stats_t*)buf), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_comm_last_error(comm), "lowbit_comm_stats_t", "struct_size = 16", "comm_stats 16");
  untouched(buf, sizeof(size_t), BUF, "refused comm_stats");
  OK(lowbit_comm_destroy(comm));
}

/* ------------------------------------------------------------ the communicator timeout */

/* A callback transport cannot be bounded by lowbit: a timeout is refused,
 * naming the field, not NCCL. (MPI's field and its environment override:
 * tests/comm/test_comm_api.c.) */
static void test_callback_transport_refuses_a_timeout(void** state) {
  (void)state;
  one_rank_t s;
  lowbit_comm_transport_t t = one_rank_transport(&s);
  lowbit_comm_config_t cc;
  OK(lowbit_comm_config_init(&cc));
  cc.timeout_ms = 100;
  lowbit_comm_t comm = NULL;
  expect_error(lowbit_comm_create_transport(&comm, &t, &cc), LOWBIT_ERROR_UNSUPPORTED, lowbit_last_error(),
               "config.timeout_ms is 100", "callback transport", "callback timeout");
  assert_null(strstr(lowbit_last_error(), "NCCL"));
  assert_null(comm);
  cc.timeout_ms = 0;
  OK(lowbit_comm_create_transport(&comm, &t, &cc));
  OK(lowbit_comm_destroy(comm));
}

/* ------------------------------------------------------------ issue 32 */

/* Defect 9: the alltoall of a compressed allreduce destroys its own
 * communicator. Refused: the call completes, the communicator lives on. */
static void test_destroy_inside_own_transport_function_is_refused(void** state) {
  (void)state;
  one_rank_t s;
  lowbit_comm_t comm = make_comm(&s, NULL);
  float x[100], y[100];
  for (int i = 0; i < 100; ++i) x[i] = y[i] = (float)(i - 50) * 0.25f;
  lowbit_tensor_t tx = host_tensor(x, 100);
  s.destroy_inside = 1;
  OK(lowbit_comm_compressed_allreduce(comm, &tx, NULL));
  expect_error(s.destroyed, LOWBIT_ERROR_INVALID_STATE, s.message, "lowbit_comm_destroy", "inside", "destroy inside");
  s.destroy_inside = 0;
  /* Still whole: a second communicator that saw no destroy gives the same bits. */
  one_rank_t s2;
  lowbit_comm_t twin = make_comm(&s2, NULL);
  lowbit_tensor_t ty = host_tensor(y, 100);
  OK(lowbit_comm_compressed_allreduce(twin, &ty, NULL));
  assert_memory_equal(x, y, sizeof x);
  OK(lowbit_comm_compressed_allreduce(comm, &tx, NULL));
  OK(lowbit_comm_compressed_allreduce(twin, &ty, NULL));
  assert_memory_equal(x, y, sizeof x);
  OK(lowbit_comm_destroy(comm));
  OK(lowbit_comm_destroy(twin));
}

/* Defect 10: "at most 2^55" means 2^55 is taken. */
static void test_stage_message_bytes_takes_2_to_the_55(void** state) {
  (void)state;
  one_rank_t s;
  lowbit_comm_t comm = make_comm(&s, NULL);
  const int64_t max = (int64_t)1 << 55;
  int64_t m = 0;
  OK(lowbit_comm_stage_message_bytes(comm, max, &m));
  assert_true(m == 4 + max / 8);
  expect_error(lowbit_comm_stage_message_bytes(comm, max + 1, &m), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_comm_last_error(comm), "at most 2^55", "36028797018963969", "2^55 + 1");
  OK(lowbit_comm_destroy(comm));
}

/* Defect 10: a callback transport's errors name it, not NCCL. */
static void test_callback_transport_errors_name_it(void** state) {
  (void)state;
  one_rank_t s;
  lowbit_comm_transport_t t = one_rank_transport(&s);
  t.host_buffers = 0;
  t.device_buffers = 1;
  lowbit_comm_t comm = NULL;
  OK(lowbit_comm_create_transport(&comm, &t, NULL));
  float x[16] = {0};
  lowbit_tensor_t tx = host_tensor(x, 16);
  expect_error(lowbit_comm_compressed_allreduce(comm, &tx, NULL), LOWBIT_ERROR_UNSUPPORTED,
               lowbit_comm_last_error(comm), "callback transport", "host_buffers = 0", "host tensor, device transport");
  assert_null(strstr(lowbit_comm_last_error(comm), "NCCL"));
  expect_error(lowbit_comm_allreduce_mean(comm, &tx, NULL), LOWBIT_ERROR_UNSUPPORTED, lowbit_comm_last_error(comm),
               "callback transport", NULL, "mean of a host tensor");
  assert_null(strstr(lowbit_comm_last_error(comm), "NCCL"));
  OK(lowbit_comm_destroy(comm));
}

/* 1-bit LAMB: 0 < min_coeff <= max_coeff (equal pins the trust ratio), as
 * lowbit.h and docs/ALGORITHMS.md say. */
static void test_lamb_coefficient_rule(void** state) {
  (void)state;
  lowbit_optimizer_t opt = make_optimizer(LOWBIT_ALGORITHM_ONEBIT_LAMB, NULL);
  lowbit_onebit_options_t o;
  OK(lowbit_onebit_options_init(&o));
  o.min_coeff = o.max_coeff = 2.f;
  OK(lowbit_optimizer_set_onebit_options(opt, &o));
  o.max_coeff = 1.f;
  expect_error(lowbit_optimizer_set_onebit_options(opt, &o), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(opt), "max_coeff", ">= min_coeff", "max < min");
  o.max_coeff = 3.f;
  o.min_coeff = 0.f;
  expect_error(lowbit_optimizer_set_onebit_options(opt, &o), LOWBIT_ERROR_INVALID_ARGUMENT,
               lowbit_optimizer_last_error(opt), "min_coeff", "> 0", "min 0");
  lowbit_optimizer_destroy(opt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_inits),
      cmocka_unit_test(test_init_defaults),
      cmocka_unit_test(test_older_structs_passed_in_get_defaults),
      cmocka_unit_test(test_unknown_sizes_passed_in_are_refused),
      cmocka_unit_test(test_writes_honour_struct_size),
      cmocka_unit_test(test_onebit_status_writes),
      cmocka_unit_test(test_comm_writes),
      cmocka_unit_test(test_callback_transport_refuses_a_timeout),
      cmocka_unit_test(test_destroy_inside_own_transport_function_is_refused),
      cmocka_unit_test(test_stage_message_bytes_takes_2_to_the_55),
      cmocka_unit_test(test_callback_transport_errors_name_it),
      cmocka_unit_test(test_lamb_coefficient_rule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

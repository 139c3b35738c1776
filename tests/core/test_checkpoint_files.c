/* Checkpoint files through the C API: lowbit_optimizer_load_file reads no
 * more than the header announces and the file holds (a bad size fails before
 * any large read), and concurrent saves to one path each write a whole
 * checkpoint. */
#include "checkpoint_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/test_seed.h"

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


int main(void) {
  g_seed = (unsigned)lowbit_test_seed("test_checkpoint_files");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_file_bounded),
      cmocka_unit_test(test_concurrent_saves_to_one_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Writes a version-1 checkpoint: AdamW, params of 5000 (4-bit), 300 (8-bit, override) and 7 (fp32), 3 steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lowbit.h"
static float fr(unsigned* s) { *s = *s * 1664525u + 1013904223u; return ((*s >> 8) / 16777216.0f) * 2.f - 1.f; }
int main(int argc, char** argv) {
  static const int64_t n[3] = {5000, 300, 7};
  static const lowbit_state_format_t f[3] = {LOWBIT_STATE_DEFAULT, LOWBIT_STATE_8BIT, LOWBIT_STATE_FP32};
  lowbit_optimizer_config_t c; lowbit_hparams_t h; lowbit_optimizer_t opt;
  lowbit_optimizer_config_init(&c, LOWBIT_ALGORITHM_ADAMW); lowbit_hparams_init(&h, LOWBIT_ALGORITHM_ADAMW);
  c.state_format = LOWBIT_STATE_4BIT; h.lr = 1e-2f;
  if (lowbit_optimizer_create(&opt, &c, &h)) return 1;
  float* p[3]; float* g[3]; unsigned s = 7;
  for (int i = 0; i < 3; ++i) {
    p[i] = malloc(n[i] * 4); g[i] = malloc(n[i] * 4);
    for (int64_t k = 0; k < n[i]; ++k) p[i][k] = fr(&s);
    lowbit_param_config_t pc; lowbit_param_config_init(&pc);
    pc.param = (lowbit_tensor_t){p[i], n[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.grad = (lowbit_tensor_t){g[i], n[i], LOWBIT_DTYPE_FLOAT32, LOWBIT_DEVICE_CPU, 0};
    pc.state_format = f[i];
    int64_t id; if (lowbit_optimizer_add_param(opt, &pc, &id)) return 2;
  }
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < 3; ++i) for (int64_t k = 0; k < n[i]; ++k) g[i][k] = fr(&s);
    if (lowbit_optimizer_step(opt, NULL)) return 3;
  }
  if (lowbit_optimizer_save_file(opt, LOWBIT_CHECKPOINT_COMPRESSED, argv[1], NULL)) return 4;
  puts(lowbit_optimizer_last_error(opt));
  return 0;
}

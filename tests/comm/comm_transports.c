#include "comm_transports.h"

#include <stdlib.h>

#include "comm_harness.h"

const char* via_name(via_t via) {
  switch (via) {
    case VIA_BUILTIN: return "built-in MPI";
    case VIA_STAGES: return "codec stages over MPI_Alltoall/MPI_Allgather";
    case VIA_CALLBACKS: return "callback transport over MPI";
  }
  return "?";
}

lowbit_status_t stages_allreduce(lowbit_comm_t comm, MPI_Comm mpi, const lowbit_tensor_t* t) {
  int32_t W = 0;
  int64_t m = 0;
  CHECK_OK(comm, lowbit_comm_world_size(comm, &W));
  lowbit_status_t st = lowbit_comm_stage_message_bytes(comm, t->numel, &m);
  if (st != LOWBIT_SUCCESS) return st;
  unsigned char* send = (unsigned char*)xmalloc((size_t)(W * m));
  unsigned char* recv = (unsigned char*)xmalloc((size_t)(W * m));
  unsigned char* gsend = (unsigned char*)xmalloc((size_t)m);
  unsigned char* grecv = (unsigned char*)xmalloc((size_t)(W * m));
  st = lowbit_comm_stage_compress(comm, t, send, W * m, NULL);
  if (st == LOWBIT_SUCCESS) {
    CHECK(MPI_Alltoall(send, (int)m, MPI_BYTE, recv, (int)m, MPI_BYTE, mpi) == MPI_SUCCESS, "MPI_Alltoall failed");
    st = lowbit_comm_stage_reduce(comm, recv, W * m, gsend, m, NULL);
  }
  if (st == LOWBIT_SUCCESS) {
    CHECK(MPI_Allgather(gsend, (int)m, MPI_BYTE, grecv, (int)m, MPI_BYTE, mpi) == MPI_SUCCESS, "MPI_Allgather failed");
    st = lowbit_comm_stage_decode(comm, grecv, W * m, t, NULL);
  }
  free(send);
  free(recv);
  free(gsend);
  free(grecv);
  return st;
}

lowbit_status_t via_allreduce(via_t via, lowbit_comm_t comm, MPI_Comm mpi, const lowbit_tensor_t* t) {
  if (via == VIA_STAGES) return stages_allreduce(comm, mpi, t);
  return lowbit_comm_compressed_allreduce(comm, t, NULL);
}

/* ------------------------------------------------------------ callbacks */

typedef struct {
  lowbit_comm_t comm;
  MPI_Comm mpi;
  int fail_at; /* countdown; 0: never */
  long calls;
} cb_state_t;

#define MAX_CALLBACK_COMMS 8
static cb_state_t* g_cb[MAX_CALLBACK_COMMS];

static int32_t cb_enter(cb_state_t* s) {
  ++s->calls;
  if (s->fail_at > 0 && --s->fail_at == 0) return -7;
  return 0;
}

static int32_t cb_alltoall(void* u, const void* send, void* recv, int64_t m, void* stream) {
  (void)stream;
  cb_state_t* s = (cb_state_t*)u;
  if (cb_enter(s)) return -7;
  return MPI_Alltoall(send, (int)m, MPI_BYTE, recv, (int)m, MPI_BYTE, s->mpi) == MPI_SUCCESS ? 0 : 1;
}

static int32_t cb_allgather(void* u, const void* send, void* recv, int64_t m, void* stream) {
  (void)stream;
  cb_state_t* s = (cb_state_t*)u;
  if (cb_enter(s)) return -7;
  return MPI_Allgather(send, (int)m, MPI_BYTE, recv, (int)m, MPI_BYTE, s->mpi) == MPI_SUCCESS ? 0 : 1;
}

static int32_t cb_sum(void* u, float* data, int64_t n, void* stream) {
  (void)stream;
  cb_state_t* s = (cb_state_t*)u;
  if (cb_enter(s)) return -7;
  return MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, s->mpi) == MPI_SUCCESS ? 0 : 1;
}

static int32_t cb_max(void* u, int64_t* v, int32_t k) {
  cb_state_t* s = (cb_state_t*)u;
  if (cb_enter(s)) return -7;
  return MPI_Allreduce(MPI_IN_PLACE, v, k, MPI_INT64_T, MPI_MAX, s->mpi) == MPI_SUCCESS ? 0 : 1;
}

lowbit_comm_t make_callback_comm(MPI_Comm mpi, int agreement) {
  int world = 1;
  MPI_Comm_size(mpi, &world);
  return make_callback_comm_declaring(mpi, agreement, world);
}

static lowbit_comm_t make_cb(MPI_Comm mpi, int agreement, int32_t world_size, const lowbit_comm_config_t* config);

lowbit_comm_t make_callback_comm_declaring(MPI_Comm mpi, int agreement, int32_t world_size) {
  return make_cb(mpi, agreement, world_size, NULL);
}

lowbit_comm_t make_callback_comm_config(MPI_Comm mpi, int agreement, const lowbit_comm_config_t* config) {
  int world = 0;
  MPI_Comm_size(mpi, &world);
  return make_cb(mpi, agreement, world, config);
}

static lowbit_comm_t make_cb(MPI_Comm mpi, int agreement, int32_t world_size, const lowbit_comm_config_t* config) {
  int slot = 0;
  while (slot < MAX_CALLBACK_COMMS && g_cb[slot]) ++slot;
  CHECK(slot < MAX_CALLBACK_COMMS, "too many callback communicators");
  cb_state_t* s = (cb_state_t*)xmalloc(sizeof *s);
  s->fail_at = 0;
  s->calls = 0;
  MPI_Comm_dup(mpi, &s->mpi);
  int rank = 0;
  MPI_Comm_rank(s->mpi, &rank);
  lowbit_comm_transport_t t = {0};
  t.struct_size = sizeof t;
  t.user_data = s;
  t.rank = rank;
  t.world_size = world_size;
  t.host_buffers = 1;
  t.device_index = -1;
  t.alltoall = cb_alltoall;
  t.allgather = cb_allgather;
  t.allreduce_sum_f32 = cb_sum;
  t.allreduce_max_i64 = agreement ? cb_max : NULL;
  lowbit_comm_t c = NULL;
  CHECK_OK(c, lowbit_comm_create_transport(&c, &t, config));
  s->comm = c;
  g_cb[slot] = s;
  return c;
}

static cb_state_t* find_cb(lowbit_comm_t comm) {
  for (int i = 0; i < MAX_CALLBACK_COMMS; ++i)
    if (g_cb[i] && g_cb[i]->comm == comm) return g_cb[i];
  harness_fail(__FILE__, __LINE__, "not a callback communicator");
  return NULL;
}

void destroy_callback_comm(lowbit_comm_t comm) {
  for (int i = 0; i < MAX_CALLBACK_COMMS; ++i)
    if (g_cb[i] && g_cb[i]->comm == comm) {
      CHECK_OK(comm, lowbit_comm_destroy(comm));
      MPI_Comm_free(&g_cb[i]->mpi);
      free(g_cb[i]);
      g_cb[i] = NULL;
      return;
    }
  harness_fail(__FILE__, __LINE__, "not a callback communicator");
}

void callback_comm_fail_at(lowbit_comm_t comm, int k) { find_cb(comm)->fail_at = k; }
long callback_comm_calls(lowbit_comm_t comm) { return find_cb(comm)->calls; }

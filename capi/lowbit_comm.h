/*
 * lowbit_comm.h: the compressed communicator (1-bit allreduce with error
 * feedback, the communication scheme of 1-bit Adam, Tang et al. 2021).
 *
 * The algorithm (padding, sign rule, worker and server, the order of every
 * sum, which scalars are float and which double), the argument agreement,
 * failures and timeouts, the error blob format, the transports and the codec
 * stages' message layout are specified in docs/COMMUNICATOR.md; this header
 * keeps a short contract per function.
 *
 * The ABI, threading and stream rules of lowbit.h apply here too: every
 * struct starts with `size_t struct_size` and has a sized init; create
 * functions take the out-param first; lowbit_comm_destroy(NULL) is a no-op;
 * every call returns a lowbit_status_t and, on failure, sets both
 * lowbit_last_error() (this thread) and lowbit_comm_last_error(comm) (this
 * handle), naming the argument and the value at fault. One thread per handle
 * at a time.
 *
 * Collectives
 *   A communicator spans a group of ranks (an MPI communicator, an NCCL
 *   communicator, or the caller's transport functions).
 *   lowbit_comm_create_mpi*, lowbit_comm_create_nccl, lowbit_comm_destroy
 *   (MPI), lowbit_comm_compressed_allreduce,
 *   lowbit_comm_compressed_reduce_scatter and lowbit_comm_allreduce_mean are
 *   collective: every rank calls them, in the same order, with the same
 *   numel. Over MPI (and a callback transport with allreduce_max_i64), each
 *   call first agrees on its arguments over the ranks (the call, numel,
 *   dtype, the caller and its stage, the world size), so a rank whose
 *   arguments are rejected makes every rank fail (its own error here;
 *   LOWBIT_ERROR_INVALID_ARGUMENT on the other ranks, "rank R rejected its
 *   arguments: <its message> [its status]"), and mismatched calls fail on
 *   every rank with a message naming both sides, instead of deadlocking;
 *   nothing changes on any rank. Over NCCL there is no such agreement:
 *   mismatched calls hang, as with any NCCL collective.
 *
 * Failures (docs/COMMUNICATOR.md, section 4)
 *   - 1-bit optimizer steps run their local checks before any collective; a
 *     failure on one rank fails the step on every rank, nothing changed. A
 *     rank with no communicator set fails at once, and the others wait.
 *   - A rank that is stuck, gone or late: an MPI collective waits for it
 *     forever, unless a timeout is set: lowbit_comm_config_t.timeout_ms, or
 *     the environment variable LOWBIT_COMM_TIMEOUT_MS, which overrides it
 *     where set and not empty (every rank must use the same value; the ranks
 *     agree on it at creation). Each exchange then waits at most that long;
 *     on expiry the call returns LOWBIT_ERROR_COMMUNICATION ("timed out")
 *     having changed nothing, and the communicator is unusable for good
 *     (destroy it; its MPI communicator and buffers stay allocated).
 *   - NCCL has no host-side timeout (its collectives run on the stream). A
 *     callback transport is bounded by its own functions only: lowbit calls
 *     them synchronously and cannot interrupt them; a function that gives up
 *     and returns non-zero fails the call with LOWBIT_ERROR_COMMUNICATION.
 *     For both, config.timeout_ms must be 0 and LOWBIT_COMM_TIMEOUT_MS is
 *     ignored.
 *   - A rank killed: with Open MPI the runtime ends the job; checkpoint
 *     regularly (optimizer state and every rank's lowbit_comm_save_errors).
 *
 * Non-finite input
 *   If any rank's input (tensor + worker error) holds a NaN or an Inf, or a
 *   finite input makes the server average overflow, the compressed allreduce
 *   changes nothing on any rank: host tensors return LOWBIT_ERROR_NONFINITE
 *   on every rank; CUDA tensors return LOWBIT_SUCCESS and
 *   lowbit_comm_last_nonfinite() tells once the stream has reached the call.
 *
 * Error buffers, workspaces, devices
 *   The first compressed allreduce binds the communicator to its numel (at
 *   most 2^55) and device and allocates everything, once; later calls
 *   allocate nothing, and a call with another numel or device is rejected
 *   until lowbit_comm_reset_errors(). MPI takes host tensors and CUDA tensors
 *   (CUDA-aware, or staged through pinned memory; host-driven: it waits for
 *   `stream` before each exchange); NCCL takes CUDA tensors, fully
 *   asynchronous on `stream` (libnccl.so.2, or LOWBIT_NCCL_LIBRARY, loaded at
 *   run time; LOWBIT_ERROR_UNSUPPORTED where it cannot be). Device buffers
 *   are used in stream order.
 */
#ifndef LOWBIT_COMM_H
#define LOWBIT_COMM_H

#include "lowbit.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lowbit_comm_backend {
  LOWBIT_COMM_BACKEND_MPI = 1,
  LOWBIT_COMM_BACKEND_NCCL = 2,
  LOWBIT_COMM_BACKEND_CALLBACKS = 3, /* a transport of the caller's functions (lowbit_comm_transport_t) */
  LOWBIT_COMM_BACKEND_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_COMM_BACKEND_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_comm_backend_t;

/* How an MPI communicator moves CUDA tensors. */
typedef enum lowbit_comm_cuda_aware {
  LOWBIT_COMM_CUDA_AWARE_AUTO = -1,   /* CUDA-aware if MPIX_Query_cuda_support() says so */
  LOWBIT_COMM_CUDA_AWARE_NEVER = 0,   /* stage through pinned host memory */
  LOWBIT_COMM_CUDA_AWARE_ALWAYS = 1,  /* pass device pointers to MPI (caller vouches) */
  LOWBIT_COMM_CUDA_AWARE_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_COMM_CUDA_AWARE_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_comm_cuda_aware_t;

typedef struct lowbit_comm_config {
  size_t struct_size;
  int32_t cuda_aware_mpi; /* a lowbit_comm_cuda_aware_t; default AUTO */
  /* Since 0.4 (struct_size of 0.2 callers still accepted: 0). */
  int64_t timeout_ms; /* MPI: the most each exchange waits for the other ranks, 1 .. 2147483647 ms;
                         0 (default): forever. The environment variable LOWBIT_COMM_TIMEOUT_MS, where
                         set and not empty, overrides it. NCCL and callback transports: must be 0
                         (LOWBIT_ERROR_UNSUPPORTED otherwise). See "Failures" above. */
  /* Since 0.8 (struct_size of 0.2 and 0.4 callers still accepted: FP32). */
  int32_t error_format; /* a lowbit_comm_error_format_t: how this rank keeps its worker and server
                           errors (docs/COMMUNICATOR.md, section 5b); default FP32. Every rank must
                           use the same (each collective checks it, MPI and callback transports with
                           an agreement). BF16 and INT8 take host tensors only (CUDA tensors, NCCL
                           communicators and the codec stages: LOWBIT_ERROR_UNSUPPORTED). */
} lowbit_comm_config_t;

/* How a communicator keeps its error feedback (config.error_format). */
typedef enum lowbit_comm_error_format {
  LOWBIT_COMM_ERROR_FP32 = 0, /* fp32, 4 B/element (the default; the bits of earlier releases) */
  LOWBIT_COMM_ERROR_BF16 = 1, /* bf16, round to nearest even: 2 B/element */
  LOWBIT_COMM_ERROR_INT8 = 2, /* blocks of 256 elements, one fp32 absmax each, codes on the linear
                                 map k/127 (k = -127..127), round to nearest even: 1 + 1/64 B/element */
  LOWBIT_COMM_ERROR_FORCE_INT32 = 0x7FFFFFFF
} lowbit_comm_error_format_t;

/* Fills the defaults (AUTO, no timeout); writes struct_size bytes (a
 * released size). lowbit_comm_config_init is the 0.2 entry point (it fills
 * the 0.2 struct), called through the macro by code compiled against this
 * header. */
LOWBIT_API lowbit_status_t lowbit_comm_config_init_sized(lowbit_comm_config_t* config, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_comm_config_init(lowbit_comm_config_t* config);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_comm_config_init(config) lowbit_comm_config_init_sized((config), sizeof(*(config)))
#endif

/* Creates a communicator over an MPI communicator (collective over it; the
 * ranks also agree on its timeout, see "Failures").
 * `mpi_comm` points to the caller's MPI_Comm (e.g. &comm, or mpi4py's
 * MPI._addressof(comm)); the library duplicates it (MPI_Comm_dup), so the
 * caller's own traffic never mixes with ours. MPI must be initialised.
 * config may be NULL (defaults). Without MPI support built in:
 * LOWBIT_ERROR_UNSUPPORTED. */
LOWBIT_API lowbit_status_t lowbit_comm_create_mpi(lowbit_comm_t* out, const void* mpi_comm,
                                                  const lowbit_comm_config_t* config);
/* The same from a Fortran handle (MPI_Comm_c2f(comm), mpi4py comm.py2f()). */
LOWBIT_API lowbit_status_t lowbit_comm_create_mpi_fortran(lowbit_comm_t* out, int64_t mpi_fortran_comm,
                                                          const lowbit_comm_config_t* config);

#define LOWBIT_NCCL_UNIQUE_ID_BYTES 128

/* Writes a fresh ncclUniqueId (128 bytes) for rank 0 to distribute. */
LOWBIT_API lowbit_status_t lowbit_comm_nccl_unique_id(void* out_id, int64_t capacity);
/* Creates a communicator over a new NCCL communicator (collective over the
 * `world` ranks holding the same id); this rank uses CUDA device
 * `device_index`. The NCCL communicator is owned and destroyed with it. */
LOWBIT_API lowbit_status_t lowbit_comm_create_nccl(lowbit_comm_t* out, const void* unique_id, int32_t rank,
                                                   int32_t world, int32_t device_index,
                                                   const lowbit_comm_config_t* config);
/* Creates a communicator over an existing ncclComm_t (passed as void*); the
 * caller keeps ownership and must destroy it after this communicator. Not
 * collective. */
LOWBIT_API lowbit_status_t lowbit_comm_create_nccl_comm(lowbit_comm_t* out, void* nccl_comm,
                                                        const lowbit_comm_config_t* config);

/* Collective over MPI (MPI_Comm_free): call before MPI_Finalize. NULL: no-op.
 * From inside one of this communicator's own transport functions (a call on
 * it is still running): LOWBIT_ERROR_INVALID_STATE, nothing freed. */
LOWBIT_API lowbit_status_t lowbit_comm_destroy(lowbit_comm_t comm);

/* Message of the last failed call on this handle ("" if none); for NULL, the
 * thread's lowbit_last_error(), as lowbit_optimizer_last_error(NULL). */
LOWBIT_API const char* lowbit_comm_last_error(lowbit_comm_t comm);

LOWBIT_API lowbit_status_t lowbit_comm_rank(lowbit_comm_t comm, int32_t* out);
LOWBIT_API lowbit_status_t lowbit_comm_world_size(lowbit_comm_t comm, int32_t* out);

typedef struct lowbit_comm_info {
  size_t struct_size; /* set by the caller */
  lowbit_comm_backend_t backend;
  int32_t rank;
  int32_t world_size;
  int32_t cuda_aware_mpi;  /* MPI: 1 if CUDA tensors go to MPI directly, 0 if staged */
  int32_t device_index;    /* NCCL: the CUDA device; MPI: -1 */
  int64_t bound_numel;     /* numel the error buffers are bound to; 0: unbound */
  lowbit_device_t bound_device; /* valid when bound_numel > 0 */
  int64_t padded_numel;    /* N (0 when unbound) */
  int64_t chunk_numel;     /* C = N / world_size (0 when unbound) */
  /* Since 0.4 (struct_size of 0.2 callers still accepted: the fields above). */
  int64_t timeout_ms;      /* the timeout in effect (config.timeout_ms or LOWBIT_COMM_TIMEOUT_MS); 0: none */
} lowbit_comm_info_t;

/* Zeroes the struct and sets struct_size (lowbit_comm_info_init: the 0.4 struct). */
LOWBIT_API lowbit_status_t lowbit_comm_info_init_sized(lowbit_comm_info_t* info, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_comm_info_init(lowbit_comm_info_t* info);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_comm_info_init(info) lowbit_comm_info_init_sized((info), sizeof(*(info)))
#endif

/* Writes out->struct_size bytes (a released size). */
LOWBIT_API lowbit_status_t lowbit_comm_get_info(lowbit_comm_t comm, lowbit_comm_info_t* out);

/* In place, on every rank: tensor (fp32, contiguous, host or CUDA) <- the
 * 1-bit compressed average over ranks, with error feedback
 * (docs/COMMUNICATOR.md, section 2). */
LOWBIT_API lowbit_status_t lowbit_comm_compressed_allreduce(lowbit_comm_t comm, const lowbit_tensor_t* tensor,
                                                            void* stream);

/* (Since 0.8.) The reduce-scatter half of the compressed allreduce
 * (docs/COMMUNICATOR.md, section 2b), collective like it (the same argument
 * agreement): every rank compresses `tensor` (fp32, contiguous, host, numel
 * elements, the same numel on every rank; read, not written) with its worker
 * error feedback (the allreduce's worker rule and padding) and sends each
 * rank the 1-bit codes of its chunk and its scale; `out` (fp32, host) gets the
 * average over ranks of the decoded codes of this rank's chunk: elements
 * [offset, offset + count) of lowbit_comm_reduce_scatter_chunk (count may be
 * 0: out.data may then be NULL; out may overlap tensor). The worker error is
 * updated and shared with the compressed allreduce (the same binding to
 * numel and device); the server error is neither read nor changed. Each rank
 * sends (W-1) (4 + C/8) bytes. A non-finite input on any rank, or scales
 * whose sum overflows, change nothing on any rank (LOWBIT_ERROR_NONFINITE on
 * every rank, lowbit_comm_last_nonfinite() 1). CUDA tensors (and so NCCL):
 * LOWBIT_ERROR_UNSUPPORTED. */
LOWBIT_API lowbit_status_t lowbit_comm_compressed_reduce_scatter(lowbit_comm_t comm, const lowbit_tensor_t* tensor,
                                                                 const lowbit_tensor_t* out, void* stream);

/* (Since 0.8.) Local, allocates nothing: this rank's chunk of a compressed
 * reduce-scatter of `numel` (1 .. 2^55) elements: *out_offset = rank * C,
 * *out_numel = the real elements of the chunk (0 .. C). Either pointer may be
 * NULL, not both. With numel a multiple of 8 * world_size the chunks are
 * numel / world_size each, torch's reduce_scatter_tensor layout. */
LOWBIT_API lowbit_status_t lowbit_comm_reduce_scatter_chunk(lowbit_comm_t comm, int64_t numel, int64_t* out_offset,
                                                            int64_t* out_numel);

/* In place, on every rank: tensor (fp32) <- (sum over ranks) / world_size,
 * uncompressed (for warm-up): the transport's sum, then an fp32 division
 * (docs/COMMUNICATOR.md, section 3). Non-finite values propagate. CUDA
 * tensors over a non-CUDA-aware MPI are staged through a pinned buffer that
 * grows to the largest numel seen. */
LOWBIT_API lowbit_status_t lowbit_comm_allreduce_mean(lowbit_comm_t comm, const lowbit_tensor_t* tensor,
                                                      void* stream);

/* 1 if the last compressed allreduce found a NaN/Inf on some rank and changed
 * nothing, 0 if it was applied (and 0 before any call). For CUDA tensors,
 * valid once the stream has reached that call. */
LOWBIT_API lowbit_status_t lowbit_comm_last_nonfinite(lowbit_comm_t comm, int32_t* out);

/* ---------------------------------------------------------------- error buffers */

/* This rank's error sizes: worker = bound numel, server = the real elements
 * of its chunk (both 0 when unbound). */
LOWBIT_API lowbit_status_t lowbit_comm_error_numel(lowbit_comm_t comm, int64_t* out_worker_numel,
                                                   int64_t* out_server_numel);

/* Copies this rank's worker and server errors into host buffers (either may
 * be NULL to skip it; the numel given must equal lowbit_comm_error_numel's).
 * Waits for `stream`. For inspection, tests and simulations. */
LOWBIT_API lowbit_status_t lowbit_comm_read_errors(lowbit_comm_t comm, float* worker, int64_t worker_numel,
                                                   float* server, int64_t server_numel, void* stream);

/* Serialises this rank's errors (part of a checkpoint; one blob per rank:
 * 64 header bytes, then numel + server_numel fp32; the format, version 2 with
 * a whole-blob checksum, is in docs/COMMUNICATOR.md, section 5; a
 * communicator whose config.error_format is BF16 or INT8 writes version 3,
 * the errors in that format, section 5b). An unbound
 * communicator saves numel 0. With buffer == NULL only
 * *out_size is set; otherwise capacity must be >= the size
 * (LOWBIT_ERROR_BUFFER_TOO_SMALL). Waits for `stream`. */
LOWBIT_API lowbit_status_t lowbit_comm_save_errors(lowbit_comm_t comm, void* buffer, int64_t capacity,
                                                   int64_t* out_size, void* stream);

/* Restores errors saved by the same rank of a communicator with the same
 * world size. Bound with the same numel: copied in place; otherwise the
 * communicator is unbound and the errors wait (on the host) for the next
 * compressed allreduce, which must then have that numel. Errors:
 * CORRUPT_DATA (truncated, bad magic, checksum, non-zero reserved bytes,
 * inconsistent header, non-finite values), VERSION_MISMATCH,
 * STATE_MISMATCH (other world size or rank, or errors of another
 * config.error_format: a blob is loaded only by a communicator of its format).
 * On any error nothing changes.
 * numel 0 is the same as lowbit_comm_reset_errors. Waits for `stream`. */
LOWBIT_API lowbit_status_t lowbit_comm_load_errors(lowbit_comm_t comm, const void* buffer, int64_t size,
                                                   void* stream);

/* Zeroes both errors and unbinds the size (the next compressed allreduce may
 * use any numel/device). Local, not collective; call it on every rank. */
LOWBIT_API lowbit_status_t lowbit_comm_reset_errors(lowbit_comm_t comm, void* stream);

/* ---------------------------------------------------------------- counters */

typedef struct lowbit_comm_stats {
  size_t struct_size; /* set by the caller */
  int64_t compressed_calls;      /* compressed allreduces and reduce-scatters that
                                    exchanged data (all of them but those
                                    stopped before the exchange: bad arguments, and
                                    non-finite host input over MPI) */
  int64_t compressed_elements;   /* sum of their numel */
  int64_t compressed_bytes_sent; /* bytes this rank addressed to other ranks */
  int64_t mean_calls;
  int64_t mean_elements;
  int64_t mean_bytes_sent; /* nominal: 2 * (W-1)/W * 4 * numel (ring allreduce) */
} lowbit_comm_stats_t;

/* Zeroes the struct and sets struct_size (lowbit_comm_stats_init: the 0.4 struct). */
LOWBIT_API lowbit_status_t lowbit_comm_stats_init_sized(lowbit_comm_stats_t* stats, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_comm_stats_init(lowbit_comm_stats_t* stats);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_comm_stats_init(stats) lowbit_comm_stats_init_sized((stats), sizeof(*(stats)))
#endif

/* Counters since creation or the last reset; writes out->struct_size bytes.
 * The argument agreement (and the 512-byte message that follows it when a
 * rank failed) is not counted. */
LOWBIT_API lowbit_status_t lowbit_comm_get_stats(lowbit_comm_t comm, lowbit_comm_stats_t* out);
LOWBIT_API lowbit_status_t lowbit_comm_reset_stats(lowbit_comm_t comm);

/* ---------------------------------------------------------------- any transport */
/*
 * The 1-bit scheme over a transport lowbit does not know (torch.distributed,
 * a framework's own collectives, a custom network), in either of two ways
 * (docs/COMMUNICATOR.md, section 7):
 * 1. A transport of callbacks (lowbit_comm_create_transport): every call of
 *    this header runs through the caller's functions, exactly as over MPI
 *    (the same bits, error feedback and checkpoints).
 * 2. The codec stages (lowbit_comm_stage_*): the caller moves the bytes
 *    between compress (tensor -> W messages), its all-to-all, reduce (W
 *    messages -> one), its all-gather, and decode (W messages -> the average;
 *    the error updates take effect). A message is the fp32 scale (4 bytes,
 *    little-endian) then the sign bits of one chunk (bit k of byte b =
 *    element 8b + k, 1 = +1); the bytes are those the compressed allreduce
 *    exchanges. Until decode succeeds nothing observable changes; the stages
 *    never talk to other ranks (no argument agreement).
 */

/* The caller's transport. Every function returns 0 on success; any other
 * value makes the lowbit call fail with LOWBIT_ERROR_COMMUNICATION (the
 * message names the function and the value). After such a failure the
 * caller's tensor and this rank's errors are unchanged, but other ranks may
 * have completed the call or may still wait in it: treat the group as
 * broken, as with a failed MPI or NCCL collective.
 * The functions are called on the thread that called lowbit, one at a time,
 * in the same order on every rank; nothing but they bound how long a call
 * waits (no timeout applies). A function must not destroy the communicator
 * whose call runs it (lowbit_comm_destroy refuses:
 * LOWBIT_ERROR_INVALID_STATE). */
typedef struct lowbit_comm_transport {
  size_t struct_size;
  void* user_data;        /* passed back to every function; must outlive the communicator */
  int32_t rank;           /* 0 .. world_size-1 */
  int32_t world_size;     /* >= 1; the same on every rank (the argument agreement compares it) */
  int32_t host_buffers;   /* 1: the functions take host memory (LOWBIT_DEVICE_CPU tensors) */
  int32_t device_buffers; /* 1: the functions take CUDA device memory directly; when 0, CUDA
                             tensors are staged through pinned host memory (needs host_buffers) */
  int32_t stream_ordered; /* 1: device exchanges are enqueued on `stream` (NCCL-like); 0: they
                             complete on the host before returning, and lowbit waits for `stream`
                             before calling them with device memory */
  int32_t device_index;   /* the CUDA device the transport serves, or -1 for any */
  /* Every rank sends bytes [r*m, (r+1)*m) of send to rank r and receives
   * rank r's message at recv + r*m. */
  int32_t (*alltoall)(void* user_data, const void* send, void* recv, int64_t m, void* stream);
  /* Every rank's m bytes of send, in rank order, into recv (world_size * m bytes). */
  int32_t (*allgather)(void* user_data, const void* send, void* recv, int64_t m, void* stream);
  /* In place: data <- the sum over ranks (fp32, n elements). */
  int32_t (*allreduce_sum_f32)(void* user_data, float* data, int64_t n, void* stream);
  /* In place, host memory: values[0..count) <- the maximum over ranks. May be
   * NULL: then there is no argument agreement (mismatched calls misbehave as
   * the transport does, as over NCCL). */
  int32_t (*allreduce_max_i64)(void* user_data, int64_t* values, int32_t count);
} lowbit_comm_transport_t;

/* Fills the defaults: user_data NULL, rank 0, world_size 1, host buffers,
 * no device buffers, not stream-ordered, device_index -1, every function
 * NULL; writes struct_size bytes (lowbit_comm_transport_init: the 0.4 struct). */
LOWBIT_API lowbit_status_t lowbit_comm_transport_init_sized(lowbit_comm_transport_t* transport, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_comm_transport_init(lowbit_comm_transport_t* transport);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_comm_transport_init(transport) lowbit_comm_transport_init_sized((transport), sizeof(*(transport)))
#endif

/* Creates a communicator over the caller's transport (copied; not
 * collective: no function of `transport` is called). config may be NULL
 * (its cuda_aware_mpi is ignored; its timeout_ms must be 0). Errors:
 * struct_size, rank, world_size, a NULL function other than
 * allreduce_max_i64, neither host nor device buffers. */
LOWBIT_API lowbit_status_t lowbit_comm_create_transport(lowbit_comm_t* out, const lowbit_comm_transport_t* transport,
                                                        const lowbit_comm_config_t* config);

/* Bytes of one message of the compressed allreduce of `numel` (1 .. 2^55)
 * elements on this communicator (4 + C/8); not collective, allocates
 * nothing. */
LOWBIT_API lowbit_status_t lowbit_comm_stage_message_bytes(lowbit_comm_t comm, int64_t numel,
                                                           int64_t* out_message_bytes);

/* Worker stage: tensor (fp32, unchanged) + worker error -> send
 * (send_bytes >= W * message bytes). */
LOWBIT_API lowbit_status_t lowbit_comm_stage_compress(lowbit_comm_t comm, const lowbit_tensor_t* tensor, void* send,
                                                      int64_t send_bytes, void* stream);

/* Server stage: recv (the W messages for this rank's chunk, recv_bytes >= W *
 * message bytes) + server error -> gsend (gsend_bytes >= message bytes). */
LOWBIT_API lowbit_status_t lowbit_comm_stage_reduce(lowbit_comm_t comm, const void* recv, int64_t recv_bytes,
                                                    void* gsend, int64_t gsend_bytes, void* stream);

/* Decode stage: grecv (W messages, rank order) -> out (fp32, the numel and
 * device of the compress tensor; may be that tensor), and the sequence's
 * error updates take effect. */
LOWBIT_API lowbit_status_t lowbit_comm_stage_decode(lowbit_comm_t comm, const void* grecv, int64_t grecv_bytes,
                                                    const lowbit_tensor_t* out, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* LOWBIT_COMM_H */

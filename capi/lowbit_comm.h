/*
 * lowbit_comm.h: the compressed communicator (1-bit allreduce with error
 * feedback, the communication scheme of 1-bit Adam, Tang et al. 2021).
 *
 * The ABI, threading and stream rules of lowbit.h apply here too: config and
 * info structs start with `size_t struct_size`; create functions take the
 * out-param first; lowbit_comm_destroy(NULL) is a no-op; every call returns a
 * lowbit_status_t and, on failure, sets both lowbit_last_error() (this
 * thread) and lowbit_comm_last_error(comm) (this handle), naming the argument
 * and the value at fault. One thread per handle at a time.
 *
 * Collectives
 *   A communicator spans a group of ranks (an MPI communicator or an NCCL
 *   communicator). lowbit_comm_create_*, lowbit_comm_destroy,
 *   lowbit_comm_compressed_allreduce and lowbit_comm_allreduce_mean are
 *   collective: every rank of the group calls them, in the same order, with
 *   the same numel. Over MPI, each call first agrees on its arguments with a
 *   128-byte allreduce: what decides the exchanges that follow (which call:
 *   compressed_allreduce or allreduce_mean; numel, which fixes
 *   the padding and chunking; dtype) and who calls (directly, or a 1-bit
 *   Adam step with its stage, freeze_step, number of params and, on CPU, step
 *   count). So a rank whose arguments are rejected makes every rank fail
 *   (its own error here; LOWBIT_ERROR_INVALID_ARGUMENT on the other ranks,
 *   "rank R rejected its arguments: <its message> [its status]"), and ranks
 *   that make different calls all fail with a message naming both sides,
 *   instead of deadlocking; in both cases nothing changes on any rank.
 *   Over NCCL there is no such agreement (device collectives cannot report to
 *   the host without a synchronisation): mismatched calls hang, as with any
 *   NCCL collective.
 *
 * Failures
 *   - A bad call on one rank, or mismatched calls: see above (MPI).
 *   - 1-bit Adam (lowbit_optimizer_step with a communicator set): the step
 *     runs all its local checks (grads, step counts, stage) before any
 *     collective; a failure on one rank joins the agreement of the others'
 *     collective, so every rank fails with nothing changed (params, moments,
 *     step counts, errors). A rank with NO communicator set cannot reach the
 *     others: it fails at once (LOWBIT_ERROR_INVALID_STATE) and the others
 *     wait in their step's agreement, forever or until their timeout.
 *   - A rank that is stuck, gone or late: a collective waits for it forever,
 *     unless the environment variable LOWBIT_COMM_TIMEOUT_MS set a timeout
 *     (MPI; read by lowbit_comm_create_mpi*, which fail on every rank unless
 *     every rank has the same value; 0 or unset: none; at most 2147483647):
 *     each exchange of a call then waits at most that many milliseconds,
 *     and on expiry the call returns LOWBIT_ERROR_COMMUNICATION ("timed
 *     out") having changed nothing, and the communicator is unusable for
 *     good: every later
 *     collective on it fails at once, local calls (rank, save_errors) still
 *     work, and lowbit_comm_destroy leaves its MPI communicator and buffers
 *     allocated (an MPI collective cannot be cancelled; it may still write
 *     them). Pick a timeout well above the longest normal skew between ranks
 *     (uneven compute, checkpoint I/O): a rank that is merely late also times
 *     out, on a communicator its peers already gave up. Under a timeout the
 *     exchanges are nonblocking collectives polled with MPI_Test (sleeps of
 *     up to 1 ms between polls), and allreduce_mean copies host tensors
 *     through a buffer of its own. Creation and destruction (MPI_Comm_dup,
 *     MPI_Comm_free) have no timeout. NCCL ignores the variable: its
 *     collectives run on the stream, the host never waits in them. (An
 *     environment variable rather than a lowbit_comm_config_t field:
 *     lowbit_comm_config_init cannot know which size of the struct its
 *     caller was compiled with, so a grown struct would be overrun in old
 *     callers.)
 *   - A rank killed (kill -9, OOM killer, crash): with Open MPI's mpirun
 *     (4.1, measured), the runtime notices and kills every other rank of the
 *     job ("mpirun noticed that process rank 1 ... exited on signal 9",
 *     exit status 137): no call returns, nothing can be saved after the
 *     fact. Checkpoint regularly (optimizer state and every rank's
 *     lowbit_comm_save_errors) and restart the job from the last one. Where
 *     the runtime keeps the job alive (mpirun --enable-recovery, some
 *     schedulers), the survivors wait forever in the collective without a
 *     timeout; with one they get LOWBIT_ERROR_COMMUNICATION after it, but
 *     MPI_Finalize may then hang as well (Open MPI's TCP transport did):
 *     save what you need, then end the job with MPI_Abort.
 *   - lowbit_comm_create_mpi_fortran with a handle that is no communicator:
 *     LOWBIT_ERROR_INVALID_ARGUMENT naming the handle. Open MPI maps such a
 *     handle to a NULL communicator, which is refused before any MPI call;
 *     every communicator (also through lowbit_comm_create_mpi) is then probed
 *     (MPI_Comm_test_inter, MPI_Comm_size) with MPI_COMM_WORLD's error
 *     handler set to MPI_ERRORS_RETURN for the two calls (then restored; do
 *     not change MPI_COMM_WORLD's handler from another thread meanwhile).
 *     With another MPI, a garbage handle is caught only if that MPI checks
 *     its arguments (MPICH does unless built without error checking), and a
 *     dangling or garbage MPI_Comm passed by pointer is undefined behaviour
 *     in MPI itself.
 *
 * The 1-bit compressed allreduce (one flat fp32 buffer of n elements, the
 * same n on every rank; W ranks)
 *   Padding: the buffer is padded to N = the smallest multiple of 8*W that is
 *   >= n, and split into W chunks of C = N/W elements (a multiple of 8);
 *   rank r is the "server" of chunk r = [r*C, (r+1)*C). Pad elements (index
 *   >= n) carry no error, count in no norm and are never written.
 *   Sign rule: sign(v) = +1 if v >= 0 (so +0 and -0 give +1), else -1. A
 *   sign travels as one bit, 1 = +1, bit k of byte b = element 8b+k.
 *   Worker (every rank), with its persistent worker error e (n floats):
 *     x = tensor + e;  s = ||x||_2 / sqrt(n)  (norm over the n real elements,
 *     accumulated in double, rounded once to fp32);  q = s * sign(x);
 *     e <- x - q  (exactly the fp32 value every receiver decodes).
 *     To every rank r it sends the sign bits of chunk r and s.
 *   Server (rank r, with c_r = the real elements of chunk r, and its
 *   persistent server error z, c_r floats):
 *     a_i = (sum over ranks j, in rank order, of s_j * sign_j,i) / W  (fp32);
 *     y = a + z;  S = ||y||_2 / sqrt(c_r) (S = 0 when c_r == 0);
 *     o = S * sign(y);  z <- y - o.  It sends the sign bits of o and S to all.
 *   Result (every rank, identical bits): element i of chunk r = o_i of r.
 *   The double sums of squares are accumulated in one fixed order
 *   (comm/sumsq.hpp) on the host and on the device, so host and CUDA tensors
 *   give the same bits too.
 *   Bytes each rank sends: 2 * (W-1) * (4 + C/8) (an all-to-all and an
 *   all-gather of the packed bits plus one fp32 scale per message), i.e.
 *   about 2 * (W-1)/W * (1/8 + 4W/N) bytes per element, against
 *   2 * (W-1)/W * 4 for a fp32 ring allreduce.
 *   Error feedback: summing the update rules over calls t = 1..T with a fixed
 *   input g_j on rank j and zero initial errors gives, exactly,
 *     (1/T) sum_t out_t = mean_j(g_j) - (mean_j(e_j^T) + z^T) / T,
 *   so the running mean of the outputs converges to the true mean as
 *   max|errors| / T (plus fp32 rounding).
 *
 * Non-finite input
 *   If any rank's x (tensor + worker error) holds a NaN or an Inf, the call
 *   changes nothing on any rank: tensor, worker and server errors stay as
 *   they were, and no rank waits forever.
 *   - Host (CPU) tensors: every rank returns LOWBIT_ERROR_NONFINITE (the
 *     message names the first rank at fault) and
 *     lowbit_comm_last_nonfinite() reports 1.
 *   - CUDA tensors: the check runs on the device (a NaN scale travels with
 *     the packed bits), so the call returns LOWBIT_SUCCESS once the work is
 *     enqueued and lowbit_comm_last_nonfinite() reports the outcome once
 *     `stream` has reached the call.
 *
 * Error buffers and workspaces
 *   The first lowbit_comm_compressed_allreduce binds the communicator to its
 *   numel and device: the worker/server error buffers (zero) and every
 *   workspace are allocated then, once; later calls allocate nothing. A call
 *   with another numel or device is rejected (tensor.numel / tensor.device)
 *   until lowbit_comm_reset_errors() (which zeroes the errors and unbinds the
 *   size; workspaces of the same size are reused).
 *
 * Devices
 *   MPI: host tensors, and CUDA tensors (when built with CUDA) either passed
 *   to a CUDA-aware MPI (MPIX_Query_cuda_support) or staged through pinned
 *   host memory. MPI is host-driven: with CUDA tensors the call waits for
 *   `stream` before each of its two exchanges (no host code ever reads a
 *   scale or a sign: they are computed, checked and decoded on the device).
 *   NCCL: CUDA tensors only, fully asynchronous on `stream`. NCCL is loaded
 *   at run time (libnccl.so.2, or the path in the environment variable
 *   LOWBIT_NCCL_LIBRARY); a library built without NCCL support, or a process
 *   where it cannot be loaded, gets LOWBIT_ERROR_UNSUPPORTED.
 *   The device buffers of a communicator are used in stream order: if
 *   consecutive calls use different streams, order those streams (events),
 *   as with any stream-ordered library.
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
} lowbit_comm_config_t;

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

/* In place, on every rank: tensor (fp32) <- (sum over ranks) / world_size,
 * uncompressed (for warm-up). Non-finite values propagate. CUDA tensors over
 * a non-CUDA-aware MPI are staged through a pinned buffer that grows to the
 * largest numel seen. */
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

/* Serialises this rank's errors (part of a checkpoint; one blob per rank).
 * Format (little-endian): "LBCOMMER", u32 version (2), u32 header bytes (64),
 * i32 world, i32 rank, i64 numel, i64 chunk_numel, i64 server_numel,
 * u64 checksum, u64 reserved (0), then numel + server_numel fp32. The
 * checksum is the FNV-1a-64 of the whole blob, header included, with its own
 * 8 bytes read as 0. (Version 1, which is still read, checksummed the payload
 * only.) An unbound communicator saves numel 0. With buffer == NULL only
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
 * STATE_MISMATCH (other world size or rank). On any error nothing changes.
 * numel 0 is the same as lowbit_comm_reset_errors. Waits for `stream`. */
LOWBIT_API lowbit_status_t lowbit_comm_load_errors(lowbit_comm_t comm, const void* buffer, int64_t size,
                                                   void* stream);

/* Zeroes both errors and unbinds the size (the next compressed allreduce may
 * use any numel/device). Local, not collective; call it on every rank. */
LOWBIT_API lowbit_status_t lowbit_comm_reset_errors(lowbit_comm_t comm, void* stream);

/* ---------------------------------------------------------------- counters */

typedef struct lowbit_comm_stats {
  size_t struct_size; /* set by the caller */
  int64_t compressed_calls;      /* calls that exchanged data (all of them but those
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
 * a framework's own collectives, a custom network), in either of two ways.
 *
 * 1. A transport of callbacks (lowbit_comm_create_transport). The
 *    communicator runs every call of this header (compressed allreduce, mean,
 *    the argument agreement, 1-bit Adam through lowbit_optimizer_set_comm)
 *    through the caller's functions, exactly as over MPI: the same bits, the
 *    same error feedback, the same checkpoints.
 * 2. The codec stages (lowbit_comm_stage_*): the caller moves the bytes
 *    itself between the three stages of one compressed allreduce:
 *      compress  tensor + worker error -> `send`: W messages, message r for
 *                rank r (the server of chunk r)
 *      (caller)  all-to-all: message r of every rank j lands on rank r at
 *                recv + j * message_bytes
 *      reduce    `recv` + server error -> `gsend`: one message
 *      (caller)  all-gather of `gsend`, in rank order, into `grecv`
 *      decode    `grecv` -> out (the averaged tensor), and the worker and
 *                server error updates of compress and reduce take effect.
 *    A message is lowbit_comm_stage_message_bytes() bytes (4 + C/8, see the
 *    padding above): send, recv and grecv hold W messages, gsend one. The
 *    bytes are exactly those lowbit_comm_compressed_allreduce exchanges, so a
 *    transport built from the stages gives its bits.
 *    Buffers live where the compress tensor lives (host memory for
 *    LOWBIT_DEVICE_CPU, device memory of the same CUDA device otherwise) and
 *    are used in `stream` order; no call allocates once the communicator is
 *    bound (the first compress binds it, as the first compressed allreduce
 *    does). Until decode succeeds nothing observable changes: the errors
 *    (read_errors, save_errors) are those of the last completed call, and a
 *    new compress abandons an unfinished sequence. Reduce needs a compress
 *    before it and decode a reduce; otherwise LOWBIT_ERROR_INVALID_STATE.
 *    The stages never talk to other ranks, so there is no argument
 *    agreement: every rank must run the same sequence with the same numel.
 *    Non-finite input travels as a NaN scale: on host tensors every rank's
 *    decode then returns LOWBIT_ERROR_NONFINITE and changes nothing (out and
 *    both errors as they were; lowbit_comm_last_nonfinite() reports 1); on
 *    CUDA tensors decode returns LOWBIT_SUCCESS and the device flag tells,
 *    as for the compressed allreduce.
 *    Stages and the communicator's own collectives may be mixed on one
 *    handle between sequences (a collective abandons an unfinished one).
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

/*
 * lowbit: memory-efficient and communication-efficient optimizers behind a C ABI.
 *
 * The algorithms behind these contracts are specified in docs/ALGORITHMS.md
 * (state formats, shaped parameters, the 1-bit optimizers) and
 * docs/COMMUNICATOR.md (lowbit_comm.h); the struct versions in docs/ABI.md.
 *
 * ABI rules
 *   - Every struct (but the lowbit_tensor_t descriptor, whose layout is
 *     frozen) starts with `size_t struct_size`, set by the caller to
 *     sizeof(the struct it was compiled against), and only grows at the end.
 *     The library knows every size each struct has shipped with: a struct
 *     passed in of an older, smaller size gets the defaults of the fields
 *     added since; a struct the library fills gets exactly struct_size
 *     bytes; any other size (not a released one) is
 *     LOWBIT_ERROR_INVALID_ARGUMENT naming the argument, the struct and the
 *     size, and nothing is written.
 *   - Every struct has a sized init, lowbit_X_init_sized(p, sizeof *p, ...),
 *     which the macro lowbit_X_init(p, ...) calls. The plain name is also an
 *     exported function, for binaries of earlier releases and callers that
 *     cannot use macros: it fills the struct of the release that introduced
 *     it (each says which). Define LOWBIT_NO_INIT_MACROS to call those.
 *   - Enum values and status codes are explicit and never reused. Every enum
 *     has *_FORCE_INT32 and *_FORCE_INT32_MIN members so that it is 32 bits
 *     wide and any int32 value (e.g. a bad one from a caller) is
 *     representable; they are never valid values.
 *   - Handles are opaque. Create functions take the out-param first; destroy
 *     functions accept NULL.
 *   - No C++ exception, abort() or exit() ever crosses this boundary: every
 *     entry point returns a lowbit_status_t.
 *
 * Thread safety
 *   - A handle may be used by one thread at a time. Distinct handles are
 *     independent and may be used concurrently from different threads.
 *   - lowbit_last_error() is thread-local; lowbit_optimizer_last_error() is
 *     per handle (it follows the one-thread-per-handle rule).
 *
 * Devices and streams
 *   - Tensors cross as a lowbit_tensor_t (pointer, numel, dtype, device).
 *   - Every call that may touch device memory takes an explicit stream
 *     (a cudaStream_t passed as void*, NULL = legacy default stream). Device
 *     calls only enqueue work: no hidden host synchronisation and no hidden
 *     allocation inside lowbit_optimizer_step().
 *
 * Steps on CUDA
 *   - lowbit_optimizer_step() enqueues on `stream` and returns: the hyper-
 *     parameters, the per-parameter step counts (bias corrections), the
 *     non-finite check and the skip decision all live on the device, so no
 *     step waits for the GPU, with skip_nonfinite = 1 as well, and a whole
 *     step can be captured in a CUDA graph (see lowbit_optimizer_step).
 *   - Registration (add_param, set_momentum_mask), checkpoints, moment and
 *     step-count reads and writes are blocking: they are ordered after the
 *     work already enqueued on the `stream` they take (registration: after all
 *     work on the device) and return when done.
 *   - 1-bit Adam over MPI is host-driven: its step waits for the stream
 *     before each exchange (capi/lowbit_comm.h). It also waits once, at the
 *     step that may cross freeze_step, to learn whether earlier steps were
 *     skipped.
 *
 * Non-finite gradients
 *   - With lowbit_optimizer_config_t.skip_nonfinite = 1 (the default), a step
 *     first checks every gradient; if any element is NaN or +-Inf, the whole
 *     step is skipped (params, state and step counters unchanged, like AMP's
 *     found-inf) and lowbit_optimizer_last_step_skipped() reports 1. The call
 *     itself returns LOWBIT_SUCCESS. On CUDA the check is done on the device,
 *     so the skip flag becomes valid once the stream has passed the step.
 *   - With skip_nonfinite = 0 no check is made and non-finite values
 *     propagate into params and state, as in plain PyTorch optimizers; in a
 *     quantized state a NaN makes its block's scale, and so the whole block,
 *     NaN (CPU and CUDA alike).
 *   - A finite gradient never makes a second moment Inf or NaN: v, the
 *     factored statistics and v^ saturate at 3.3895e38 (the largest bf16)
 *     where they used to overflow (|g| above ~5.8e20 at beta2 = 0.999, or
 *     ~1.8e19 for the factored g^2).
 */
#ifndef LOWBIT_H
#define LOWBIT_H

#include <stddef.h>
#include <stdint.h>

/* LOWBIT_VERSION_MAJOR / _MINOR / _PATCH, generated from the CMake project
 * version (the one place the version number is written). */
#include "lowbit_version.h"
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define LOWBIT_VERSION (LOWBIT_VERSION_MAJOR * 10000 + LOWBIT_VERSION_MINOR * 100 + LOWBIT_VERSION_PATCH)

#if defined(_WIN32)
#define LOWBIT_API __declspec(dllexport)
#else
#define LOWBIT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

typedef enum lowbit_status {
  LOWBIT_SUCCESS = 0,
  LOWBIT_ERROR_INVALID_ARGUMENT = 1, /* a value is out of range or unknown */
  LOWBIT_ERROR_NULL_POINTER = 2,     /* a required pointer was NULL */
  LOWBIT_ERROR_UNSUPPORTED = 3,      /* valid, but not built in / not possible here */
  LOWBIT_ERROR_OUT_OF_MEMORY = 4,
  LOWBIT_ERROR_INVALID_STATE = 5, /* call not allowed now (e.g. step with no params) */
  LOWBIT_ERROR_CUDA = 6,
  LOWBIT_ERROR_IO = 7,               /* file could not be opened / read / written */
  LOWBIT_ERROR_CORRUPT_DATA = 8,     /* truncated, bad magic, checksum mismatch */
  LOWBIT_ERROR_VERSION_MISMATCH = 9, /* checkpoint from an unknown format version */
  LOWBIT_ERROR_STATE_MISMATCH = 10,  /* checkpoint does not match the registered params */
  LOWBIT_ERROR_BUFFER_TOO_SMALL = 11,
  LOWBIT_ERROR_NONFINITE = 12, /* NaN/Inf where a finite value is required */
  LOWBIT_ERROR_COMMUNICATION = 13,
  LOWBIT_ERROR_INTERNAL = 14,
  LOWBIT_STATUS_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_STATUS_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_status_t;

/* Static, never NULL, "unknown status" for values not listed above. */
LOWBIT_API const char* lowbit_status_string(lowbit_status_t status);

/* The message of the last failed call on this thread ("" if none). Valid until
 * the next lowbit call on this thread. */
LOWBIT_API const char* lowbit_last_error(void);

/* LOWBIT_VERSION of the library actually loaded. */
LOWBIT_API int lowbit_version(void);

/* 1 if this library was built with that capability. */
LOWBIT_API int lowbit_has_cuda(void);
LOWBIT_API int lowbit_has_mpi(void);
LOWBIT_API int lowbit_has_nccl(void);

/* What this library was built with, from the facts CMake found at configure
 * time (and, for cpu_avx512_codecs and the cpu_ fields, the CPU it runs on). Strings are static
 * and never NULL ("" when unknown or not applicable). */
typedef struct lowbit_build_info {
  size_t struct_size;  /* set by the caller */
  int32_t version;     /* LOWBIT_VERSION of this library */
  int32_t has_cuda;    /* the CUDA engine is built in */
  /* SHA-256 (hex) of lowbit_cdef.h, the declarations of these headers that
   * the Python package reads (bindings/gen_cdef.py); "" when the build had no
   * Python to generate them. */
  const char* cdef_fingerprint;
  const char* cuda_architectures; /* CMAKE_CUDA_ARCHITECTURES, e.g. "80;90" */
  const char* cuda_version;       /* version of the CUDA toolkit built against */
  int32_t has_mpi;                /* the MPI transport is built in */
  int32_t has_nccl;               /* the NCCL transport is built in (libnccl is loaded at run time) */
  int32_t has_openmp;             /* CPU steps run on OpenMP threads */
  int32_t has_jax_handlers;       /* this build also made liblowbit_jax (the XLA FFI handlers, a separate module) */
  /* 1 if the CPU engine's codecs run their AVX-512 forms in this process:
   * the avx512 level runs (cpu_kernels) and the CPU has AVX-512 VBMI too. */
  int32_t cpu_avx512_codecs;
  int32_t reserved0;              /* 0 */
  const char* compiler;           /* C++ compiler id and version */
  const char* build_type;         /* CMAKE_BUILD_TYPE */
  /* Since 0.8. The CPU kernels' instruction-set level in this process:
   * "portable", "avx2", "avx512" or "neon" (docs/ARCHITECTURE.md, "CPU
   * levels"): the best this CPU runs, or LOWBIT_CPU_KERNELS's. */
  const char* cpu_kernels;
  /* Every level this CPU and build can run, comma-separated, e.g.
   * "portable,avx2,avx512". */
  const char* cpu_kernels_available;
  /* The moment codec of that level: "portable", "AVX2", "AVX-512", "NEON". */
  const char* cpu_codec;
  /* What became of LOWBIT_CPU_KERNELS ("" when unset or honoured: a name that
   * is no level, or a level this CPU cannot run). */
  const char* cpu_kernels_note;
  /* Since 0.8: what runs Muon's fp32 and bf16 matrix products on the CPU in this
   * process, with LOWBIT_MATMUL as it is now (auto, blas or builtin, README
   * "Muon"): the CBLAS loaded ("OpenBLAS 0.3.21 ... (path)"), lowbit's own
   * blocked product (where the CBLAS is the reference BLAS, or there is
   * none) or, for bf16, oneDNN's bf16 matmul ("oneDNN 2.6.3 bf16 matmul",
   * where this CPU has one). */
  const char* cpu_matmul_fp32;
  const char* cpu_matmul_bf16;
} lowbit_build_info_t;

/* Zeroes the struct and sets struct_size; writes struct_size bytes (a
 * released size). lowbit_build_info_init is the exported entry point for
 * callers that cannot use the macro (it fills the 0.4 struct). */
LOWBIT_API lowbit_status_t lowbit_build_info_init_sized(lowbit_build_info_t* info, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_build_info_init(lowbit_build_info_t* info);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_build_info_init(info) lowbit_build_info_init_sized((info), sizeof(*(info)))
#endif

/* Fills *out: writes out->struct_size bytes (a released size). */
LOWBIT_API lowbit_status_t lowbit_build_info(lowbit_build_info_t* out);

/* ---------------------------------------------------------------- tensors */

typedef enum lowbit_dtype {
  LOWBIT_DTYPE_FLOAT32 = 1,
  LOWBIT_DTYPE_BFLOAT16 = 2,
  LOWBIT_DTYPE_FLOAT16 = 3,
  LOWBIT_DTYPE_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_DTYPE_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_dtype_t;

typedef enum lowbit_device {
  LOWBIT_DEVICE_CPU = 1,
  LOWBIT_DEVICE_CUDA = 2,
  LOWBIT_DEVICE_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_DEVICE_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_device_t;

/* A flat, contiguous tensor. The library never owns `data`. */
typedef struct lowbit_tensor {
  void* data;
  int64_t numel;
  lowbit_dtype_t dtype;
  lowbit_device_t device;
  int32_t device_index; /* CUDA ordinal; 0 for CPU */
} lowbit_tensor_t;

/* ---------------------------------------------------------------- optimizer */

typedef struct lowbit_optimizer* lowbit_optimizer_t;
/* Compressed communicator (created through lowbit_comm.h). */
typedef struct lowbit_comm* lowbit_comm_t;

typedef enum lowbit_algorithm {
  LOWBIT_ALGORITHM_ADAMW = 1, /* Adam with decoupled weight decay */
  LOWBIT_ALGORITHM_ADAM = 2,  /* Adam with L2 weight decay (added to the gradient) */
  LOWBIT_ALGORITHM_LION = 3,  /* Lion with decoupled weight decay */
  LOWBIT_ALGORITHM_SGD = 4,   /* SGD, optional momentum / dampening / Nesterov, L2 decay */
  LOWBIT_ALGORITHM_ONEBIT_ADAM = 5,  /* 1-bit Adam: docs/ALGORITHMS.md, section 3.1 */
  LOWBIT_ALGORITHM_ZEROONE_ADAM = 6, /* 0/1 Adam: docs/ALGORITHMS.md, section 3.2 */
  LOWBIT_ALGORITHM_ONEBIT_LAMB = 7,  /* 1-bit LAMB: docs/ALGORITHMS.md, section 3.3 */
  LOWBIT_ALGORITHM_MUON = 8,         /* Muon (since 0.7): see "Muon" below */
  LOWBIT_ALGORITHM_RMSPROP = 9,      /* RMSprop as torch.optim.RMSprop (since 0.8) */
  LOWBIT_ALGORITHM_ADAGRAD = 10,     /* Adagrad as torch.optim.Adagrad (since 0.8) */
  LOWBIT_ALGORITHM_LAMB = 11,        /* LAMB as optax.lamb: Adam's direction plus decoupled decay, scaled by
                                        the per-tensor trust ratio ||p|| / ||update|| (since 0.8) */
  LOWBIT_ALGORITHM_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_ALGORITHM_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_algorithm_t;

/* How one optimizer moment is stored: fp32, bf16, or quantized in blocks
 * with one fp32 scale each (8BIT: 256 uint8 codes on the dynamic maps; 4BIT:
 * 128 codes, two per byte, the second moment on {k/16, k = 1..16}; FP8: 256
 * e4m3 bytes). Codes, ties, scales and the re-encoding of fp32 values (a
 * materialise / load cycle is a fixed point): docs/ALGORITHMS.md, section 1.
 * 4BIT_SR (since 0.5): 4BIT's layout, maps and decoding, but a step rounds
 * each code stochastically between its two neighbouring map values (unbiased,
 * counter-based bits as for weights), which keeps long runs at fp32's loss
 * where nearest codes fall behind (bench/NOTES.md, issue 37); BLOCK
 * normalisation only.
 * 4BIT_DYN (since 0.8): 4BIT's layout (blocks of 128, two codes per byte),
 * but an unsigned moment (a second moment: AdamW's v, RMSprop's square_avg)
 * is coded on the unsigned dynamic-exponent map of 16 values (0, three
 * decades of 2, 4 and 8 values, 1: docs/ALGORITHMS.md, section 1) instead of
 * {k/16}, so that values a decade or two under their block's largest keep
 * their size (bench/NOTES.md, issue 50); a signed moment is 4BIT's (its map
 * is already the signed dynamic one), and a plan reports it as 4BIT. */
typedef enum lowbit_state_format {
  LOWBIT_STATE_DEFAULT = 0, /* per parameter: use the optimizer's default */
  LOWBIT_STATE_FP32 = 1,
  LOWBIT_STATE_BF16 = 2,
  LOWBIT_STATE_8BIT = 3,
  LOWBIT_STATE_4BIT = 4,
  LOWBIT_STATE_FP8 = 5,
  LOWBIT_STATE_4BIT_SR = 6,
  LOWBIT_STATE_4BIT_DYN = 7,
  LOWBIT_STATE_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_STATE_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_state_format_t;

/* Shaped parameters: a parameter may carry a shape (lowbit_param_config_t
 * ndim / shape: up to LOWBIT_MAX_DIMS dims, row-major, product = numel, no
 * zero dim); without one it is 1-D. The shape matters only to the RANK1 and
 * FACTORED normalisations (lpmm's 4-bit optimizers): docs/ALGORITHMS.md,
 * section 2.
 *   BLOCK:    the blocks of lowbit_state_format_t.
 *   RANK1:    8BIT / 4BIT moments of a parameter with >= 2 dims: one scale
 *             vector per dim, an element's scale the min over its dims
 *             (1-D parameters fall back to BLOCK; FP8 is refused).
 *   FACTORED: the second moment of AdamW / Adam as fp32 row and column
 *             accumulators (Adafactor's factorisation); parameters with < 2
 *             dims keep a quantized v. The plan and param_info report
 *             format FP32 for a factored moment. */
#define LOWBIT_MAX_DIMS 8

typedef enum lowbit_normalization {
  LOWBIT_NORMALIZATION_DEFAULT = 0,  /* per parameter: the optimizer's; in the optimizer: BLOCK */
  LOWBIT_NORMALIZATION_BLOCK = 1,
  LOWBIT_NORMALIZATION_RANK1 = 2,
  LOWBIT_NORMALIZATION_FACTORED = 3, /* second moment only */
  LOWBIT_NORMALIZATION_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_NORMALIZATION_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_normalization_t;

/* How a 16-bit weight receives the fp32 result of a step. */
typedef enum lowbit_rounding {
  LOWBIT_ROUNDING_NEAREST = 0,          /* round to nearest even (always for fp32 params) */
  LOWBIT_ROUNDING_STOCHASTIC = 1,       /* counter-based stochastic rounding */
  LOWBIT_ROUNDING_ERROR_CORRECTION = 2, /* nearest plus one error-correction byte per element */
  LOWBIT_ROUNDING_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_ROUNDING_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_rounding_t;

/* Muon (LOWBIT_ALGORITHM_MUON, since 0.7), as torch.optim.Muon: for a
 * parameter of >= 2 dims (more dims are read as rows = dim 0, cols = the
 * rest, as Keller Jordan's Muon reshapes conv weights),
 *   m <- m + (1 - momentum) (g - m)            (the momentum, moment 0: any format)
 *   u <- nesterov ? g + momentum (m - g) : m
 *   O <- NS(u): X = u / max(||u||_F, eps), transposed when rows > cols; ns_steps
 *        times A = X X^T, B = b A + c A A, X = a X + B X
 *   p <- p (1 - lr weight_decay) - lr_adjusted O
 * with lr_adjusted = lr * sqrt(max(1, rows / cols)) (ORIGINAL),
 * 0.2 lr sqrt(max(rows, cols)) (MATCH_RMS_ADAMW), lr sqrt(rows / cols)
 * (SPECTRAL_UNCLAMPED) or lr (NONE). The products go through a BLAS (CPU:
 * the CBLAS found at build time; CUDA: cuBLAS) in the step's stream. A group
 * of a MUON optimizer may set hparams.algorithm to ADAMW (or ADAM, LION,
 * SGD, RMSPROP, ADAGRAD: the descriptors' hybrid_group): its params take
 * that algorithm's step, in any state format (the usual hybrid: matrices
 * with Muon, embeddings, heads, norms and biases with AdamW). A parameter
 * of < 2 dims in a Muon group is refused at registration. Muon steps
 * matrices in batches of equal shape through a workspace of the batch's
 * fp32 update plus its Newton-Schulz products
 * (lowbit_optimizer_workspace_bytes). */
typedef enum lowbit_muon_lr_adjust {
  LOWBIT_MUON_LR_ORIGINAL = 0, /* sqrt(max(1, rows / cols)): torch's default */
  LOWBIT_MUON_LR_MATCH_RMS_ADAMW = 1,
  LOWBIT_MUON_LR_SPECTRAL_UNCLAMPED = 2,
  LOWBIT_MUON_LR_NONE = 3,
  LOWBIT_MUON_LR_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_MUON_LR_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_muon_lr_adjust_t;

typedef enum lowbit_ns_precision {
  LOWBIT_NS_PRECISION_DEFAULT = 0, /* CPU: FP32; CUDA: BF16 */
  LOWBIT_NS_PRECISION_FP32 = 1,    /* fp32 products, fp32 results */
  LOWBIT_NS_PRECISION_BF16 = 2,    /* torch.optim.Muon's: the update, the norm and every product
                                      rounded to bf16 (products of bf16 values, fp32 accumulation) */
  LOWBIT_NS_PRECISION_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_NS_PRECISION_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_ns_precision_t;

/* Hyper-parameters of one parameter group. All may change between steps. */
typedef struct lowbit_hparams {
  size_t struct_size;
  float lr;           /* >= 0 and finite */
  float beta1;        /* Adam/Lion in [0, 1) */
  float beta2;        /* Adam/Lion in [0, 1) */
  float eps;          /* Adam, > 0 */
  float weight_decay; /* >= 0 */
  float momentum;     /* SGD, in [0, 1) */
  float dampening;    /* SGD, in [0, 1] */
  int32_t nesterov;   /* SGD: 0/1, requires momentum > 0 and dampening == 0 */
  int32_t bias_correction; /* Adam: 0/1 */
  /* Since 0.7 (struct_size of older callers still accepted: the defaults
   * below). */
  lowbit_algorithm_t algorithm; /* the group's algorithm: 0 = the optimizer's; a MUON optimizer's
                                   group may say ADAMW, ADAM, LION, SGD, RMSPROP or ADAGRAD */
  int32_t ns_steps;             /* Muon: Newton-Schulz iterations, 1..100 (default 5) */
  float ns_coefficients[3];     /* Muon: the quintic's (a, b, c), finite (3.4445, -4.775, 2.0315) */
  lowbit_muon_lr_adjust_t adjust_lr; /* Muon: torch.optim.Muon's adjust_lr_fn */
  lowbit_ns_precision_t ns_precision; /* Muon: how the products are rounded */
  /* Since 0.8 (struct_size of older callers still accepted: the defaults
   * below). Which fields an algorithm reads, with their defaults and
   * bounds: lowbit_hparam_info. */
  float alpha;                       /* RMSprop: smoothing constant, in [0, 1) (default 0.99) */
  int32_t centered;                  /* RMSprop: 0/1, divide by the variance estimate */
  float lr_decay;                    /* Adagrad: lr / (1 + (t - 1) lr_decay), finite and >= 0 */
  float initial_accumulator_value;   /* Adagrad: the sum of squares' start, finite and >= 0 */
} lowbit_hparams_t;

/* Fills struct_size and the usual defaults for `algorithm`
 * (AdamW: lr 1e-3, betas 0.9/0.999, eps 1e-8, wd 0.01; Adam: wd 0;
 *  Lion: lr 1e-4, betas 0.9/0.99, wd 0; SGD: lr 1e-2, momentum 0; the 1-bit
 *  optimizers: AdamW's without bias correction); writes struct_size bytes
 * (a released size). lowbit_hparams_init is the 0.2 entry point (the 0.2
 * struct), called through the macro by code compiled against this header. */
LOWBIT_API lowbit_status_t lowbit_hparams_init_sized(lowbit_hparams_t* hparams, size_t struct_size,
                                                     lowbit_algorithm_t algorithm);
LOWBIT_API lowbit_status_t lowbit_hparams_init(lowbit_hparams_t* hparams, lowbit_algorithm_t algorithm);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_hparams_init(hparams, algorithm) \
  lowbit_hparams_init_sized((hparams), sizeof(*(hparams)), (algorithm))
#endif

/* ------------------------------------------------ the algorithms, described
 * (since 0.8). Every algorithm's facts live in one descriptor inside the
 * library; these calls export it, so that bindings build their classes,
 * keyword arguments, defaults and checks from it (docs/ALGORITHMS.md,
 * "Algorithms as data"). Strings are static and never NULL. */

#define LOWBIT_MAX_MOMENTS 4 /* moment slots an algorithm may describe */

typedef enum lowbit_moment_kind {
  LOWBIT_MOMENT_SIGNED = 1,   /* a signed average (a momentum): signed maps, no floor */
  LOWBIT_MOMENT_UNSIGNED = 2, /* a non-negative accumulator (a second moment): unsigned maps, and a
                                 positive value never encodes to 0 */
  LOWBIT_MOMENT_KIND_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_MOMENT_KIND_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_moment_kind_t;

typedef struct lowbit_algorithm_info {
  size_t struct_size; /* set by the caller (lowbit_algorithm_info_init) */
  lowbit_algorithm_t algorithm;
  int32_t num_hparams;       /* hyper-parameters it reads: lowbit_hparam_info 0..num_hparams-1 */
  const char* name;          /* "adamw", "rmsprop", ...: the name every binding takes */
  const char* title;         /* "AdamW", "RMSprop", ... */
  int32_t max_moments;       /* moment slots it may keep (which ones, for given hparams:
                                lowbit_plan_param_state's num_moments, slots 0.. in order) */
  int32_t reads_param;       /* its moments depend on the param (L2 weight decay) */
  const char* moment_names[LOWBIT_MAX_MOMENTS];       /* torch's state names: "exp_avg", "square_avg", ... */
  lowbit_moment_kind_t moment_kinds[LOWBIT_MAX_MOMENTS];
  int32_t bias_correction;   /* it has Adam's bias correction (hparams.bias_correction) */
  int32_t factored_second;   /* moment 1 may be factored (second_normalization = FACTORED) */
  int32_t distributed;       /* a 1-bit optimizer (needs a communicator) */
  int32_t hybrid_group;      /* a Muon optimizer's group may take it (hparams.algorithm) */
  int32_t matrices;          /* it steps matrices (params of >= 2 dims only) */
  int32_t reserved0;         /* 0 */
} lowbit_algorithm_info_t;

typedef enum lowbit_hparam_type {
  LOWBIT_HPARAM_REAL = 1, /* float field(s) */
  LOWBIT_HPARAM_FLAG = 2, /* int32_t, 0 or 1 */
  LOWBIT_HPARAM_INT = 3,  /* int32_t in [lower, upper] */
  LOWBIT_HPARAM_ENUM = 4, /* an enum of the header, in [lower, upper] */
  LOWBIT_HPARAM_TYPE_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_HPARAM_TYPE_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_hparam_type_t;

/* One hyper-parameter of one algorithm: a field of lowbit_hparams_t, its
 * default for that algorithm, its bounds (a value v is valid when lower <= v
 * (lower < v if !lower_inclusive) and v <= upper (v < upper if
 * !upper_inclusive); reals must be finite) and what it means. */
typedef struct lowbit_hparam_info {
  size_t struct_size; /* set by the caller (lowbit_hparam_info_init) */
  const char* name;   /* the field's name in lowbit_hparams_t */
  const char* meaning;
  lowbit_hparam_type_t type;
  int32_t count;           /* values: 1, or 3 (ns_coefficients) */
  size_t offset;           /* offsetof(lowbit_hparams_t, <name>) */
  double default_value[3]; /* the first `count` are meaningful */
  double lower, upper;
  int32_t lower_inclusive, upper_inclusive;
  int32_t since;           /* LOWBIT_VERSION of the release that added the field */
  int32_t reserved0;       /* 0 */
} lowbit_hparam_info_t;

/* The descriptor of `algorithm` (LOWBIT_ERROR_INVALID_ARGUMENT for a value
 * that is no algorithm); writes out->struct_size bytes (a released size). */
LOWBIT_API lowbit_status_t lowbit_algorithm_info(lowbit_algorithm_t algorithm, lowbit_algorithm_info_t* out);
/* Hyper-parameter `index` (0 .. num_hparams - 1) of `algorithm`. */
LOWBIT_API lowbit_status_t lowbit_hparam_info(lowbit_algorithm_t algorithm, int32_t index, lowbit_hparam_info_t* out);
/* How many moments a param of a group with `hparams` keeps under `algorithm`
 * (slots 0 .. *count - 1 of lowbit_algorithm_info's): SGD's momentum buffer
 * only with momentum, RMSprop's second only with momentum or centering. The
 * hparams are checked as lowbit_hparams_check does. */
LOWBIT_API lowbit_status_t lowbit_moments_in_use(lowbit_algorithm_t algorithm, const lowbit_hparams_t* hparams,
                                                 int32_t* count);
/* Every algorithm of this library, in enum order: writes min(count, capacity)
 * values to out (NULL with capacity 0: only the count). */
LOWBIT_API lowbit_status_t lowbit_algorithms(lowbit_algorithm_t* out, int32_t capacity, int32_t* count);
LOWBIT_API lowbit_status_t lowbit_algorithm_info_init_sized(lowbit_algorithm_info_t* info, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_hparam_info_init_sized(lowbit_hparam_info_t* info, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_algorithm_info_init(lowbit_algorithm_info_t* info);
LOWBIT_API lowbit_status_t lowbit_hparam_info_init(lowbit_hparam_info_t* info);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_algorithm_info_init(info) lowbit_algorithm_info_init_sized((info), sizeof(*(info)))
#define lowbit_hparam_info_init(info) lowbit_hparam_info_init_sized((info), sizeof(*(info)))
#endif

typedef struct lowbit_optimizer_config {
  size_t struct_size;
  lowbit_algorithm_t algorithm;
  lowbit_device_t device; /* every param of this optimizer lives here */
  int32_t device_index;
  lowbit_state_format_t state_format;        /* first moment (and second unless set) */
  lowbit_state_format_t second_state_format; /* LOWBIT_STATE_DEFAULT: same as state_format */
  int64_t min_quantized_numel; /* params with fewer elements keep fp32 state (default 4096) */
  uint64_t seed;               /* stochastic rounding */
  int32_t stochastic_rounding; /* default for 16-bit params: 0/1 */
  int32_t error_correction;    /* default for 16-bit params: 0/1 (wins over SR) */
  int32_t skip_nonfinite;      /* see "Non-finite gradients" above; default 1 */
  int32_t num_threads;         /* CPU engine threads, 0..1024; 0 = all OpenMP threads
                                  (omp_get_max_threads()); larger values are
                                  LOWBIT_ERROR_INVALID_ARGUMENT */
  int64_t freeze_step;         /* 1-bit Adam: first step with frozen variance (default 100; >= 1 for 1-bit Adam and LAMB) */
  /* Since 0.3 (struct_size of 0.2 callers still accepted: both BLOCK). */
  lowbit_normalization_t first_normalization;  /* DEFAULT / BLOCK or RANK1 */
  lowbit_normalization_t second_normalization; /* DEFAULT / BLOCK, RANK1 or FACTORED */
} lowbit_optimizer_config_t;

/* Fills struct_size and defaults: CPU, fp32 state, threshold 4096, seed 0,
 * no SR, no error correction, skip_nonfinite 1, num_threads 0, block
 * normalisation. `struct_size` is sizeof the caller's struct (a released
 * size): only that many bytes are written. */
LOWBIT_API lowbit_status_t lowbit_optimizer_config_init_sized(lowbit_optimizer_config_t* config, size_t struct_size,
                                                              lowbit_algorithm_t algorithm);
/* The 0.2 entry point, kept for binaries built against 0.2 (and for callers
 * that cannot use the macro, e.g. ctypes): fills the 0.2 struct
 * (struct_size = offsetof(lowbit_optimizer_config_t, first_normalization)).
 * Code compiled against this header calls it through the macro below, which
 * passes sizeof(*config) to lowbit_optimizer_config_init_sized. */
LOWBIT_API lowbit_status_t lowbit_optimizer_config_init(lowbit_optimizer_config_t* config,
                                                        lowbit_algorithm_t algorithm);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_optimizer_config_init(config, algorithm) \
  lowbit_optimizer_config_init_sized((config), sizeof(*(config)), (algorithm))
#endif

/* Named configurations, on top of lowbit_optimizer_config_init's defaults
 * (they set state formats and normalisations only):
 *   LPMM_ADAMW_4BIT:  lpmm's 4-bit AdamW: m 4-bit blocks of 128 (signed
 *                     dynamic map), v 4-bit rank-1 (linear map without zero).
 *   ADAMW_4BIT_FACTOR: lpmm's "4-bit Factor": m 4-bit blocks, v factored
 *                     (fp32 row and column accumulators; 4-bit blocks for
 *                     params with fewer than 2 dims).
 *   ADAMW_4BIT_SR:    (since 0.5) m 4BIT_SR, v 4BIT, both in blocks: the
 *                     4-bit preset that keeps fp32's loss over long runs
 *                     (bench/NOTES.md, issue 37; about 1.06 B/param).
 *   ADAMW_4BIT_SR_DYN: (since 0.8) m 4BIT_SR, v 4BIT_DYN, both in blocks: as
 *                     ADAMW_4BIT_SR with v on the dynamic map, which holds v
 *                     that spread over decades within a block (a CNN's:
 *                     bench/NOTES.md, issue 50; about 1.06 B/param). */
typedef enum lowbit_preset {
  LOWBIT_PRESET_LPMM_ADAMW_4BIT = 1,
  LOWBIT_PRESET_ADAMW_4BIT_FACTOR = 2,
  LOWBIT_PRESET_ADAMW_4BIT_SR = 3,
  LOWBIT_PRESET_ADAMW_4BIT_SR_DYN = 4,
  LOWBIT_PRESET_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_PRESET_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_preset_t;

/* lowbit_optimizer_config_init(config, AdamW) plus the preset; writes
 * struct_size bytes (a released size: a 0.2 struct has no normalisations,
 * so it gets the formats only). lowbit_optimizer_config_preset is the 0.3
 * entry point (it fills the 0.3 struct), called through the macro by code
 * compiled against this header. */
LOWBIT_API lowbit_status_t lowbit_optimizer_config_preset_sized(lowbit_optimizer_config_t* config, size_t struct_size,
                                                                lowbit_preset_t preset);
LOWBIT_API lowbit_status_t lowbit_optimizer_config_preset(lowbit_optimizer_config_t* config, lowbit_preset_t preset);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_optimizer_config_preset(config, preset) \
  lowbit_optimizer_config_preset_sized((config), sizeof(*(config)), (preset))
#endif

/* Creates an optimizer; `hparams` become parameter group 0. */
LOWBIT_API lowbit_status_t lowbit_optimizer_create(lowbit_optimizer_t* out,
                                                   const lowbit_optimizer_config_t* config,
                                                   const lowbit_hparams_t* hparams);
LOWBIT_API lowbit_status_t lowbit_optimizer_destroy(lowbit_optimizer_t opt);

/* Message of the last failed call on this handle ("" if none); for NULL, the
 * thread's lowbit_last_error(). */
LOWBIT_API const char* lowbit_optimizer_last_error(lowbit_optimizer_t opt);

LOWBIT_API lowbit_status_t lowbit_optimizer_add_group(lowbit_optimizer_t opt, const lowbit_hparams_t* hparams,
                                                      int32_t* out_group);
LOWBIT_API lowbit_status_t lowbit_optimizer_set_hparams(lowbit_optimizer_t opt, int32_t group,
                                                        const lowbit_hparams_t* hparams);
/* Writes out->struct_size bytes. (Before 0.4 this call did not read
 * struct_size: a value that is not a released size is taken as the 0.2
 * struct, the one it always wrote, and set to that size.) */
LOWBIT_API lowbit_status_t lowbit_optimizer_get_hparams(lowbit_optimizer_t opt, int32_t group,
                                                        lowbit_hparams_t* out);
LOWBIT_API lowbit_status_t lowbit_optimizer_set_lr(lowbit_optimizer_t opt, int32_t group, float lr);

typedef struct lowbit_param_config {
  size_t struct_size;
  lowbit_tensor_t param;
  lowbit_tensor_t grad; /* optional (data NULL): give grads to step later */
  int32_t group;
  lowbit_state_format_t state_format; /* DEFAULT: optimizer default + size threshold */
  lowbit_state_format_t second_state_format;
  int32_t stochastic_rounding; /* -1: optimizer default */
  int32_t error_correction;    /* -1: optimizer default */
  /* Since 0.3 (struct_size of 0.2 callers still accepted: 1-D, DEFAULT). */
  int32_t ndim;                     /* 0 (default): 1-D of numel; else 1..LOWBIT_MAX_DIMS */
  int64_t shape[LOWBIT_MAX_DIMS];   /* row-major dims, each >= 1, product == param.numel */
  lowbit_normalization_t first_normalization;  /* DEFAULT: the optimizer's */
  lowbit_normalization_t second_normalization; /* DEFAULT: the optimizer's */
} lowbit_param_config_t;

/* Fills struct_size and defaults (group 0, formats DEFAULT, flags -1, no
 * shape, normalisations DEFAULT); writes struct_size bytes (a released size).
 * lowbit_param_config_init is the 0.2 entry point (the 0.2 struct), called
 * through the macro by code compiled against this header. */
LOWBIT_API lowbit_status_t lowbit_param_config_init_sized(lowbit_param_config_t* config, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_param_config_init(lowbit_param_config_t* config);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_param_config_init(config) lowbit_param_config_init_sized((config), sizeof(*(config)))
#endif

/* Registers a parameter; ids are 0, 1, 2, ... in registration order and stay
 * valid for the life of the handle (out_param_id is required). State is
 * allocated here, zero-initialised. With error correction, the 16-bit weight
 * and its byte together carry 8 more significand bits than the weight alone
 * (bf16: 16 significant bits), so updates far below one 16-bit ulp add up. */
LOWBIT_API lowbit_status_t lowbit_optimizer_add_param(lowbit_optimizer_t opt, const lowbit_param_config_t* config,
                                                      int64_t* out_param_id);

/* Replaces the registered gradient of a parameter (NULL or data NULL: none,
 * the parameter is left alone by the next steps). */
LOWBIT_API lowbit_status_t lowbit_optimizer_set_grad(lowbit_optimizer_t opt, int64_t param_id,
                                                     const lowbit_tensor_t* grad);

/* One step over every parameter that has a gradient, using the registered
 * gradients. On CUDA it only enqueues work on `stream` (no host wait, no
 * allocation), so it can be captured in a CUDA graph: a replay takes one more
 * step with the gradient buffers, the device step counts and the device
 * hyper-parameters (lowbit_optimizer_device_hparams) of the moment it runs.
 * Hyper-parameters changed on the host since the last uncaptured step are
 * written into the graph with their values at capture time. Capture again
 * after registering parameters, loading a checkpoint, changing a gradient
 * pointer or a momentum mask. Parameters with a RANK1 or FACTORED moment take
 * two passes over their elements (docs/ALGORITHMS.md, section 2). */
LOWBIT_API lowbit_status_t lowbit_optimizer_step(lowbit_optimizer_t opt, void* stream);

/* (Since 0.6.) One step of the params ids[0, num_ids) only, distinct
 * registered ids in any order, with their registered gradients (grads NULL)
 * or grads[k] for ids[k]: e.g. each param as soon as its gradient is ready
 * (the step inside backward), or a bucket of them. Each param gets exactly
 * the bits a full step gives it: its own step count, bias corrections and
 * stochastic-rounding bits; checkpoints are unchanged. The others are left
 * alone. The non-finite check (skip_nonfinite) covers this call's gradients:
 * a NaN skips this call's params only. On CUDA it only enqueues, as
 * lowbit_optimizer_step (its cost grows with the number of registered
 * params, not of ids). 1-bit Adam, 0/1 Adam and 1-bit LAMB refuse it
 * (LOWBIT_ERROR_UNSUPPORTED): they exchange every param in one collective. */
LOWBIT_API lowbit_status_t lowbit_optimizer_step_params(lowbit_optimizer_t opt, const int64_t* ids, int64_t num_ids,
                                                        const lowbit_tensor_t* grads, void* stream);

/* One step with gradients given for this step only: grads[i] belongs to param
 * i, num_grads must equal the number of params; grads[i].data == NULL skips
 * param i. Registered gradients are not changed. */
LOWBIT_API lowbit_status_t lowbit_optimizer_step_with_grads(lowbit_optimizer_t opt, const lowbit_tensor_t* grads,
                                                            int64_t num_grads, void* stream);

/* 1-bit Adam: the communicator that averages gradients (warm-up) and
 * compressed momentum (after freeze_step). Required before the first step of a
 * LOWBIT_ALGORITHM_ONEBIT_ADAM optimizer; the optimizer does not own it. */
LOWBIT_API lowbit_status_t lowbit_optimizer_set_comm(lowbit_optimizer_t opt, lowbit_comm_t comm);

/* 1-bit Adam: whether a warm-up step (step count < freeze_step) averages the
 * gradients over the communicator (1, the default) or runs on gradients the
 * caller already averaged over the ranks (0: e.g. DDP's all-reduce, which
 * overlaps with backward); then the warm-up step exchanges only the
 * communicator's argument agreement. Every rank must use the same setting
 * (a mismatch fails the step on every rank). Not saved in checkpoints. */
LOWBIT_API lowbit_status_t lowbit_optimizer_set_onebit_warmup_average(lowbit_optimizer_t opt, int32_t average);

/* 0/1 Adam and 1-bit LAMB (DeepSpeed's ZeroOneAdam and OnebitLamb; their
 * hyper-parameter names), specified in docs/ALGORITHMS.md, section 3. Like
 * 1-bit Adam they keep fp32 state, need a communicator
 * (lowbit_optimizer_set_comm) and share one flat fp32 bucket over all
 * parameters (one collective per step); they have no bias correction
 * (hparams.bias_correction must be 0: the lowbit_hparams_init default).
 * config.freeze_step is 0/1 Adam's var_freeze_step (then v is frozen and
 * local steps with doubling synchronisation intervals begin) and 1-bit
 * LAMB's warm-up length (>= 1). A skipped step (non-finite input on any rank)
 * changes nothing on any rank and does not advance the schedules.
 * Checkpoints save the schedules, 0/1 Adam's p_sync, LAMB's v_fresh and
 * scalars; the communicator's error buffers are per rank
 * (lowbit_comm_save_errors).
 * 0/1 Adam diverges where variance entries stay exactly 0 (e.g. parameters
 * whose gradient is always 0): they move by about lr / eps per step; mask
 * them (lowbit_optimizer_set_momentum_mask), as in DeepSpeed. */
typedef struct lowbit_onebit_options {
  size_t struct_size;
  int64_t var_update_scaler;  /* 0/1 Adam: variance steps per interval before it doubles (16), >= 1 */
  int64_t local_step_scaler;  /* 0/1 Adam: phase-2 steps per local interval before it doubles (32678), >= 1 */
  int64_t local_step_clipper; /* 0/1 Adam: the largest local interval (16), >= 1 */
  float max_coeff;            /* LAMB: upper clip of the warm-up trust ratio (10), finite, >= min_coeff */
  float min_coeff;            /* LAMB: lower clip (0.01), finite, > 0 */
  float coeff_beta;           /* LAMB: EMA factor of the trust ratio (0.9), in [0, 1) */
  float factor_max;           /* LAMB: upper clip of the factor (4), finite, >= factor_min */
  float factor_min;           /* LAMB: lower clip (0.5), finite, > 0 */
  float factor_threshold;     /* LAMB: largest relative change of the factor per step (0.1), in [0, 1) */
} lowbit_onebit_options_t;

/* Fills struct_size and the defaults above; writes struct_size bytes (a
 * released size). lowbit_onebit_options_init is the 0.3 entry point (the 0.3
 * struct), called through the macro by code compiled against this header. */
LOWBIT_API lowbit_status_t lowbit_onebit_options_init_sized(lowbit_onebit_options_t* options, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_onebit_options_init(lowbit_onebit_options_t* options);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_onebit_options_init(options) lowbit_onebit_options_init_sized((options), sizeof(*(options)))
#endif

/* Sets the options of a 0/1 Adam or 1-bit LAMB optimizer (any time between
 * steps; every rank must use the same; not saved in checkpoints). */
LOWBIT_API lowbit_status_t lowbit_optimizer_set_onebit_options(lowbit_optimizer_t opt,
                                                               const lowbit_onebit_options_t* options);

/* Where a 1-bit optimizer stands (1-bit Adam, 0/1 Adam, 1-bit LAMB). */
typedef struct lowbit_onebit_status {
  size_t struct_size;
  int64_t step;               /* steps applied (CUDA: waits for the device) */
  int32_t phase;              /* 0: warm-up / 0/1 Adam phase 1; 1: compressed / phase 2 */
  int32_t next_full_average;  /* 1 if the next step runs on gradients averaged uncompressed (built-in, or by
                                 the caller after lowbit_optimizer_set_onebit_warmup_average(opt, 0)) */
  int64_t var_interval, var_counter;            /* 0/1 Adam */
  int64_t local_step_interval, local_step_counter; /* 0/1 Adam */
  int32_t next_exchange;      /* the next step's exchange: 0 none, 1 uncompressed average, 2 1-bit */
  int32_t reserved_;
} lowbit_onebit_status_t;

/* Zeroes the struct and sets struct_size (lowbit_onebit_status_init: the 0.4 struct). */
LOWBIT_API lowbit_status_t lowbit_onebit_status_init_sized(lowbit_onebit_status_t* status, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_onebit_status_init(lowbit_onebit_status_t* status);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_onebit_status_init(status) lowbit_onebit_status_init_sized((status), sizeof(*(status)))
#endif

/* Writes out->struct_size bytes. (Before 0.4 this call did not read
 * struct_size: a value that is not a released size is taken as the 0.3
 * struct, the one it always wrote, and set to that size.) */
LOWBIT_API lowbit_status_t lowbit_optimizer_onebit_status(lowbit_optimizer_t opt, lowbit_onebit_status_t* out);

/* 1-bit Adam, 0/1 Adam, 1-bit LAMB: elements where mask (uint8, numel of the
 * param, host memory) is 0 keep a momentum of exactly zero, and the exchanged
 * values do not reach them (what each algorithm does with them:
 * docs/ALGORITHMS.md, section 3.4). NULL removes the mask. Blocking, like
 * registration (the mask is copied into engine memory). */
LOWBIT_API lowbit_status_t lowbit_optimizer_set_momentum_mask(lowbit_optimizer_t opt, int64_t param_id,
                                                              const uint8_t* mask, int64_t numel);

/* 1 if the last step was skipped because a gradient was not finite. On CUDA
 * the value is written by the device: it is valid once the stream of that
 * step has passed it (e.g. after cudaStreamSynchronize); reading it does not
 * wait. */
LOWBIT_API lowbit_status_t lowbit_optimizer_last_step_skipped(lowbit_optimizer_t opt, int32_t* out);

LOWBIT_API lowbit_status_t lowbit_optimizer_num_params(lowbit_optimizer_t opt, int64_t* out);

typedef struct lowbit_param_info {
  size_t struct_size;
  int64_t numel;
  int64_t step; /* number of steps applied to this parameter (CUDA: waits for the device) */
  int32_t group;
  lowbit_dtype_t param_dtype;
  lowbit_state_format_t state_format;        /* resolved (threshold applied) */
  lowbit_state_format_t second_state_format; /* LOWBIT_STATE_DEFAULT if the algorithm has one moment */
  int32_t stochastic_rounding;
  int32_t error_correction;
  int64_t state_bytes; /* optimizer state incl. scales and error-correction bytes */
  /* Since 0.3 (struct_size of 0.2 callers still accepted). */
  lowbit_normalization_t first_normalization;  /* resolved: BLOCK (also for unquantized formats) or RANK1 */
  lowbit_normalization_t second_normalization; /* resolved; DEFAULT if the algorithm has one moment */
  int32_t ndim;                                /* as registered (0: no shape) */
} lowbit_param_info_t;

/* Zeroes the struct and sets struct_size (lowbit_param_info_init: the 0.4 struct). */
LOWBIT_API lowbit_status_t lowbit_param_info_init_sized(lowbit_param_info_t* info, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_param_info_init(lowbit_param_info_t* info);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_param_info_init(info) lowbit_param_info_init_sized((info), sizeof(*(info)))
#endif

/* Writes out->struct_size bytes (a released size). */
LOWBIT_API lowbit_status_t lowbit_optimizer_param_info(lowbit_optimizer_t opt, int64_t param_id,
                                                       lowbit_param_info_t* out);

/* Bytes of optimizer state of one param, or of all when param_id == -1. */
LOWBIT_API lowbit_status_t lowbit_optimizer_state_bytes(lowbit_optimizer_t opt, int64_t param_id, int64_t* out);
/* Since 0.7: the bytes of step workspace the optimizer holds on its device
 * besides its state (Muon: its batch of fp32 updates twice, their Gram
 * matrices and products; 0 for the element-wise algorithms). Allocated at
 * registration, never in a step. */
LOWBIT_API lowbit_status_t lowbit_optimizer_workspace_bytes(lowbit_optimizer_t opt, int64_t* out);

/* Copies one moment (0: first, 1: second) of a param, dequantized, into a
 * caller buffer of numel floats on the host. Blocking, after the work on
 * `stream`. */
LOWBIT_API lowbit_status_t lowbit_optimizer_read_moment(lowbit_optimizer_t opt, int64_t param_id, int32_t moment,
                                                        float* out, int64_t numel, void* stream);

/* Replaces one moment of a param by `values` (numel fp32 on the host); the
 * library encodes them into the param's state format (quantized formats:
 * blockwise, exactly as loading a materialised checkpoint of these values
 * does; see lowbit_state_format_t). Values must be finite, and a second moment
 * (Adam's variance) >= 0; otherwise LOWBIT_ERROR_NONFINITE /
 * LOWBIT_ERROR_INVALID_ARGUMENT name the first bad element and nothing
 * changes. A BF16 moment stores a finite value beyond bf16's range as
 * +-3.3895e38 (its largest), never Inf. Blocking, after the work on `stream`. */
LOWBIT_API lowbit_status_t lowbit_optimizer_write_moment(lowbit_optimizer_t opt, int64_t param_id, int32_t moment,
                                                         const float* values, int64_t numel, void* stream);

/* Sets the number of steps applied to a param (param_id -1: every param), as
 * the next step's bias correction and stochastic-rounding bits see it.
 * 0 <= step <= 2^53, else LOWBIT_ERROR_INVALID_ARGUMENT (a checkpoint's counts:
 * up to 2^62, else CORRUPT_DATA). Blocking, after the work on `stream`. */
LOWBIT_API lowbit_status_t lowbit_optimizer_set_step(lowbit_optimizer_t opt, int64_t param_id, int64_t step,
                                                     void* stream);

/* Engine memory holding the lowbit_hparams_t of a group as steps read it:
 * host memory for a CPU optimizer, device memory for CUDA. A captured CUDA
 * graph reads lr and the other hyper-parameters from here at every replay,
 * so a schedule can write them (e.g. cudaMemcpyAsync on the replay stream)
 * between replays. Host-side set_hparams / set_lr of the group replace what
 * was written here at the next step; get_hparams and checkpoints report the
 * host-side values. The pointer stays valid for the life of the handle. */
LOWBIT_API lowbit_status_t lowbit_optimizer_device_hparams(lowbit_optimizer_t opt, int32_t group,
                                                           lowbit_hparams_t** out);

/* ---------------------------------------------------------------- state plan */

/* The optimizer state a parameter gets: the one home of the layout rules
 * (format resolution and the size threshold, moment counts, block and byte
 * sizes, error correction over stochastic rounding), for callers that keep
 * the state themselves (lowbit.jax). */
typedef struct lowbit_state_plan {
  size_t struct_size;           /* set by the caller */
  int32_t num_moments;          /* 0, 1 or 2 */
  lowbit_state_format_t format[2]; /* resolved; LOWBIT_STATE_DEFAULT for a moment the algorithm does not keep */
  int64_t block_size[2];        /* elements per fp32 scale; 0 for unquantized formats */
  int64_t data_bytes[2];        /* codes / values of each moment */
  int64_t scale_count[2];       /* fp32 scales of each moment */
  lowbit_rounding_t rounding;   /* how the weight is written back */
  int64_t ecc_bytes;            /* error-correction bytes (numel, or 0) */
  int64_t state_bytes;          /* everything above, as lowbit_optimizer_state_bytes reports */
  /* Since 0.3 (struct_size of 0.2 callers still accepted: the fields above).
   * The layout of a moment by normalisation: docs/ALGORITHMS.md, section 2. */
  lowbit_normalization_t normalization[2]; /* resolved; DEFAULT for a moment the algorithm does not keep */
  /* Since 0.8 (struct_size of older callers still accepted: a plan without
   * kinds is read as moment 0 signed, moment 1 unsigned, the kinds of every
   * algorithm before 0.8). Each moment's kind, which picks its map and floor
   * (0 for a moment the algorithm does not keep). */
  lowbit_moment_kind_t kind[2];
} lowbit_state_plan_t;

/* Zeroes the struct and sets struct_size (lowbit_state_plan_init: the 0.4 struct). */
LOWBIT_API lowbit_status_t lowbit_state_plan_init_sized(lowbit_state_plan_t* plan, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_state_plan_init(lowbit_state_plan_t* plan);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_state_plan_init(plan) lowbit_state_plan_init_sized((plan), sizeof(*(plan)))
#endif

/* Plans the state of a param of param->param.numel (>= 0) elements and dtype
 * param->param.dtype (data and device are not used) with the per-param
 * overrides of `param`, in an optimizer made with `config` whose group
 * param->group has `hparams`. Exactly what lowbit_optimizer_add_param would
 * allocate; writes out->struct_size bytes (a released size). */
LOWBIT_API lowbit_status_t lowbit_plan_param_state(const lowbit_optimizer_config_t* config,
                                                   const lowbit_hparams_t* hparams,
                                                   const lowbit_param_config_t* param, lowbit_state_plan_t* out);

/* ---------------------------------------------------------------- functional step */

/* (Since 0.6.) A step over buffers the caller owns and passes at every call,
 * for frameworks whose buffers change from call to call (XLA custom calls,
 * TensorFlow, ONNX Runtime training, Rust or Julia trainers). lowbit.jax is
 * built on it alone.
 *
 * State. Each parameter's state is the buffers its lowbit_state_plan_t
 * describes (lowbit_plan_param_state): per moment `data_bytes` of codes or
 * values and `scale_count` fp32 scales (rank-1 vectors or factored
 * accumulators for those normalisations), and `ecc_bytes` error-correction
 * bytes, all zero-filled before the first step, plus a state record: the
 * LOWBIT_STATE_RECORD_INT32 int32 values lowbit_state_record writes once,
 * kept with the state (and checkpointed with it) so that a step can tell
 * that the buffers were made for another format, normalisation, rounding or
 * shape. Alignment: params, grads and fp32 / bf16 moments to their element
 * size, scales to 4 bytes; codes and ecc bytes have none. A buffer may be
 * larger than its plan's size, never smaller.
 *
 * Steps. The caller passes the hyper-parameters of every group as host
 * values or in engine memory, and optionally lr in engine memory; the count of steps applied
 * so far as a host value, as a pointer into engine memory (host memory for a
 * CPU context, device memory for CUDA) that the step reads and writes in
 * stream order, or both: then they must agree (the state's count against
 * the caller's, e.g. after restoring two checkpoints). One count serves every
 * parameter of the call. A parameter's rounding key is its index in the
 * call, so a call over the params of a handle optimizer in registration
 * order gives the handle's bits (lowbit_optimizer_step).
 *
 * Checks. Everything the host can check is checked before anything is
 * written: a bad argument returns its status and changes nothing. What only
 * the device can see (a CUDA context's lr, hyper-parameters in engine
 * memory, count and state records) is
 * checked in stream order: a bad value makes the step change nothing (count
 * included) and lowbit_step_context_last_step_skipped report 1, as for a
 * non-finite gradient (skip_nonfinite). On CUDA a step only enqueues work:
 * no host wait, and no allocation after the first call with a given number
 * of parameters. */

#define LOWBIT_STATE_RECORD_INT32 14

typedef struct lowbit_step_context* lowbit_step_context_t;

/* One parameter of a functional step. */
typedef struct lowbit_param_buffers {
  size_t struct_size;
  lowbit_tensor_t param;             /* updated in place */
  lowbit_tensor_t grad;              /* param's numel; data NULL: the param is not stepped */
  int32_t group;                     /* index into lowbit_step_args_t.hparams */
  int32_t ndim;                      /* the shape the state was planned with (lowbit_param_config_t) */
  int64_t shape[LOWBIT_MAX_DIMS];
  const lowbit_state_plan_t* plan;   /* host memory: lowbit_plan_param_state's answer for this param */
  void* moment[2];                   /* plan->data_bytes[m] bytes (NULL where 0) */
  int64_t moment_bytes[2];           /* the sizes of those buffers */
  float* scales[2];                  /* plan->scale_count[m] floats */
  int64_t scale_count[2];
  uint8_t* ecc;                      /* plan->ecc_bytes bytes */
  int64_t ecc_bytes;
} lowbit_param_buffers_t;

/* Zeroes the struct and sets struct_size (lowbit_param_buffers_init: the 0.6 struct). */
LOWBIT_API lowbit_status_t lowbit_param_buffers_init_sized(lowbit_param_buffers_t* p, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_param_buffers_init(lowbit_param_buffers_t* p);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_param_buffers_init(p) lowbit_param_buffers_init_sized((p), sizeof(*(p)))
#endif

/* The per-call values of a functional step. */
typedef struct lowbit_step_args {
  size_t struct_size;
  const lowbit_hparams_t* hparams; /* host memory or NULL: one per group, each of a released size */
  int32_t num_groups;              /* >= 1 */
  int32_t reserved0;               /* 0 */
  const float* lr;                 /* engine memory or NULL: replaces every group's lr */
  int64_t step;                    /* steps applied so far (t - 1), in [0, 2^31 - 1); -1: not given */
  const int32_t* count;            /* engine memory or NULL: the state's count of steps applied */
  int32_t* count_out;              /* engine memory or NULL: *count + 1 (or step + 1) unless skipped; may alias count */
  const int32_t* records;          /* engine memory: num_params x LOWBIT_STATE_RECORD_INT32, row i the state record of params[i] */
  /* Engine memory or NULL: num_groups lowbit_hparams_t of this header's layout
   * (struct_size is not read), instead of `hparams`; exactly one of the two
   * is set. A CUDA context checks them where the step reads them (a bad
   * value skips the step), so a schedule on the device needs no host value.
   * The layout is this header's: 0.7 grew lowbit_hparams_t (72 bytes, was 48),
   * so a caller built against 0.6 that passes engine_hparams must be rebuilt
   * (host `hparams` of any released size are still read by their struct_size). */
  const lowbit_hparams_t* engine_hparams;
} lowbit_step_args_t;

/* Zeroes the struct, sets struct_size and step = -1 (lowbit_step_args_init: the 0.6 struct). */
LOWBIT_API lowbit_status_t lowbit_step_args_init_sized(lowbit_step_args_t* args, size_t struct_size);
LOWBIT_API lowbit_status_t lowbit_step_args_init(lowbit_step_args_t* args);
#ifndef LOWBIT_NO_INIT_MACROS
#define lowbit_step_args_init(args) lowbit_step_args_init_sized((args), sizeof(*(args)))
#endif

/* A reusable context of functional steps: config's algorithm (AdamW, Adam,
 * Lion or SGD), device and device_index, seed, skip_nonfinite and
 * num_threads (its formats and thresholds are the plans' business). */
LOWBIT_API lowbit_status_t lowbit_step_context_create(lowbit_step_context_t* out,
                                                      const lowbit_optimizer_config_t* config);
LOWBIT_API lowbit_status_t lowbit_step_context_destroy(lowbit_step_context_t ctx);
/* Message of the last failed call on this context; for NULL, lowbit_last_error(). */
LOWBIT_API const char* lowbit_step_context_last_error(lowbit_step_context_t ctx);

/* Writes the state record of a param planned as `plan` with shape
 * (ndim, shape) (ndim 0: flat) into out[0, LOWBIT_STATE_RECORD_INT32), host
 * memory. */
LOWBIT_API lowbit_status_t lowbit_state_record(const lowbit_state_plan_t* plan, int32_t ndim, const int64_t* shape,
                                               int32_t* out, int64_t capacity);

/* One step of the context's algorithm over params[0, num_params), on
 * `stream` (CUDA; NULL: the legacy default stream). */
LOWBIT_API lowbit_status_t lowbit_functional_step(lowbit_step_context_t ctx, const lowbit_param_buffers_t* params,
                                                  int64_t num_params, const lowbit_step_args_t* args, void* stream);

/* 1 if the context's last step changed nothing (a non-finite gradient, or
 * on CUDA a bad lr, hyper-parameter, count or record). CUDA: valid once the stream has passed
 * that step; does not wait. */
LOWBIT_API lowbit_status_t lowbit_step_context_last_step_skipped(lowbit_step_context_t ctx, int32_t* out);

/* Checks hyper-parameters for `algorithm` as lowbit_optimizer_create and
 * lowbit_optimizer_set_hparams do (the message in lowbit_last_error()). */
LOWBIT_API lowbit_status_t lowbit_hparams_check(const lowbit_hparams_t* hparams, lowbit_algorithm_t algorithm);

/* Decodes moment `moment` (0 or 1) of a param's state on the host into
 * out[0, numel) fp32: the buffers as lowbit_param_buffers_t holds them, the
 * plan and shape as the param was planned with. */
LOWBIT_API lowbit_status_t lowbit_decode_moment(const lowbit_state_plan_t* plan, int32_t moment, int32_t ndim,
                                                const int64_t* shape, const void* data, int64_t data_bytes,
                                                const float* scales, int64_t scale_count, float* out, int64_t numel);

/* "fp32", "bf16", "8bit", "4bit", "fp8", "4bit-sr"; "unknown" for other values. */
LOWBIT_API const char* lowbit_state_format_name(lowbit_state_format_t format);

/* ---------------------------------------------------------------- checkpoints */

typedef enum lowbit_checkpoint_mode {
  LOWBIT_CHECKPOINT_COMPRESSED = 1,   /* codes + scales, as stored */
  LOWBIT_CHECKPOINT_MATERIALIZED_FP32 = 2, /* fp32 moments */
  LOWBIT_CHECKPOINT_MATERIALIZED_BF16 = 3, /* bf16 moments */
  LOWBIT_CHECKPOINT_FORCE_INT32 = 0x7FFFFFFF,
  LOWBIT_CHECKPOINT_FORCE_INT32_MIN = -0x7FFFFFFF
} lowbit_checkpoint_mode_t;

/* Serialises the whole optimizer state (groups, steps, moments, error-
 * correction bytes). With buffer == NULL only *out_size is set. Checkpoint
 * calls are blocking: they read or write the state after the work already
 * enqueued on `stream`, and return when done. */
LOWBIT_API lowbit_status_t lowbit_optimizer_save(lowbit_optimizer_t opt, lowbit_checkpoint_mode_t mode, void* buffer,
                                                 int64_t capacity, int64_t* out_size, void* stream);
/* Writes the checkpoint to a temporary file next to `path` (its name unique
 * to the call) and renames it over `path`: a failed save leaves `path` as it
 * was and removes the temporary file; concurrent saves to one path each
 * write a whole checkpoint, and the last rename wins. */
LOWBIT_API lowbit_status_t lowbit_optimizer_save_file(lowbit_optimizer_t opt, lowbit_checkpoint_mode_t mode,
                                                      const char* path, void* stream);
/* Loads a checkpoint into an optimizer with the same params registered (same
 * count and sizes). Any format/mode is accepted and converted to this
 * optimizer's formats. On any error the optimizer is left untouched. */
LOWBIT_API lowbit_status_t lowbit_optimizer_load(lowbit_optimizer_t opt, const void* buffer, int64_t size,
                                                 void* stream);
/* Reads at most the size the file's checkpoint header announces, after
 * checking that size against the file's own size (regular files) and the
 * largest checkpoint this optimizer could load: a bad or impossible size, a
 * shorter or longer file is LOWBIT_ERROR_CORRUPT_DATA before any large read. */
LOWBIT_API lowbit_status_t lowbit_optimizer_load_file(lowbit_optimizer_t opt, const char* path, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* LOWBIT_H */

//! Rust bindings of lowbit's functional step (`capi/lowbit.h`, section
//! "functional step", since 0.6): memory-efficient optimizers (every
//! algorithm the library describes but the distributed ones: AdamW, Adam,
//! Lion, SGD, Muon, RMSprop, Adagrad, with fp32 / bf16 / 8-bit / 4-bit / fp8
//! state) stepping buffers the caller owns.
//!
//! [`sys`] mirrors the C declarations this crate needs, by hand (no bindgen:
//! the structs are `#[repr(C)]` copies of the header's, every one but
//! `lowbit_tensor_t` starting with `struct_size`; the enums are `i32`
//! constants). The safe layer on top steps host (CPU) memory:
//!
//! - [`ParamState`]: one parameter's optimizer state, planned by
//!   `lowbit_plan_param_state` and owned here (zero-filled buffers of the
//!   plan's sizes and the state record);
//! - [`Param`]: a parameter, its gradient and its state for one step;
//! - [`StepContext`]: `lowbit_step_context_t` (destroyed on drop), whose
//!   [`StepContext::step`] is one `lowbit_functional_step`;
//! - [`Error`]: a failed call's status and the library's message;
//! - [`algorithms`], [`algorithm_spec`], [`algorithm_named`]: the library's
//!   descriptors (`lowbit_algorithm_info`, `lowbit_hparam_info`), read at run
//!   time: names, moment slots and kinds, hyper-parameters with defaults and
//!   bounds; [`AlgorithmSpec::set`] writes a hyper-parameter by name where
//!   its descriptor says, [`moments_in_use`] counts a group's moments.
//!
//! Linking: `build.rs` links `liblowbit` from the directory in the
//! environment variable `LOWBIT_LIB_DIR` (default: `../../build`, the
//! repository's build directory) and sets an rpath to it.

#![allow(clippy::missing_safety_doc)]

use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;
use std::os::raw::{c_char, c_void};
use std::ptr;

/// The C declarations (`capi/lowbit.h`), by hand, for a 64-bit target.
#[allow(non_camel_case_types)]
pub mod sys {
    use std::os::raw::{c_char, c_void};

    // Enums: 32 bits wide in C (each has *_FORCE_INT32 members).
    pub type lowbit_status_t = i32;
    pub const LOWBIT_SUCCESS: lowbit_status_t = 0;
    pub const LOWBIT_ERROR_INVALID_ARGUMENT: lowbit_status_t = 1;
    pub const LOWBIT_ERROR_NULL_POINTER: lowbit_status_t = 2;
    pub const LOWBIT_ERROR_UNSUPPORTED: lowbit_status_t = 3;
    pub const LOWBIT_ERROR_OUT_OF_MEMORY: lowbit_status_t = 4;
    pub const LOWBIT_ERROR_INVALID_STATE: lowbit_status_t = 5;
    pub const LOWBIT_ERROR_CUDA: lowbit_status_t = 6;
    pub const LOWBIT_ERROR_IO: lowbit_status_t = 7;
    pub const LOWBIT_ERROR_CORRUPT_DATA: lowbit_status_t = 8;
    pub const LOWBIT_ERROR_VERSION_MISMATCH: lowbit_status_t = 9;
    pub const LOWBIT_ERROR_STATE_MISMATCH: lowbit_status_t = 10;
    pub const LOWBIT_ERROR_BUFFER_TOO_SMALL: lowbit_status_t = 11;
    pub const LOWBIT_ERROR_NONFINITE: lowbit_status_t = 12;
    pub const LOWBIT_ERROR_COMMUNICATION: lowbit_status_t = 13;
    pub const LOWBIT_ERROR_INTERNAL: lowbit_status_t = 14;

    pub type lowbit_dtype_t = i32;
    pub const LOWBIT_DTYPE_FLOAT32: lowbit_dtype_t = 1;
    pub const LOWBIT_DTYPE_BFLOAT16: lowbit_dtype_t = 2;
    pub const LOWBIT_DTYPE_FLOAT16: lowbit_dtype_t = 3;

    pub type lowbit_device_t = i32;
    pub const LOWBIT_DEVICE_CPU: lowbit_device_t = 1;
    pub const LOWBIT_DEVICE_CUDA: lowbit_device_t = 2;

    pub type lowbit_algorithm_t = i32;
    pub const LOWBIT_ALGORITHM_ADAMW: lowbit_algorithm_t = 1;
    pub const LOWBIT_ALGORITHM_ADAM: lowbit_algorithm_t = 2;
    pub const LOWBIT_ALGORITHM_LION: lowbit_algorithm_t = 3;
    pub const LOWBIT_ALGORITHM_SGD: lowbit_algorithm_t = 4;
    pub const LOWBIT_ALGORITHM_ONEBIT_ADAM: lowbit_algorithm_t = 5;
    pub const LOWBIT_ALGORITHM_ZEROONE_ADAM: lowbit_algorithm_t = 6;
    pub const LOWBIT_ALGORITHM_ONEBIT_LAMB: lowbit_algorithm_t = 7;
    pub const LOWBIT_ALGORITHM_MUON: lowbit_algorithm_t = 8;
    pub const LOWBIT_ALGORITHM_RMSPROP: lowbit_algorithm_t = 9;
    pub const LOWBIT_ALGORITHM_ADAGRAD: lowbit_algorithm_t = 10;
    pub const LOWBIT_ALGORITHM_LAMB: lowbit_algorithm_t = 11;

    pub type lowbit_moment_kind_t = i32;
    pub const LOWBIT_MOMENT_SIGNED: lowbit_moment_kind_t = 1;
    pub const LOWBIT_MOMENT_UNSIGNED: lowbit_moment_kind_t = 2;
    pub const LOWBIT_MAX_MOMENTS: usize = 4;

    pub type lowbit_hparam_type_t = i32;
    pub const LOWBIT_HPARAM_REAL: lowbit_hparam_type_t = 1;
    pub const LOWBIT_HPARAM_FLAG: lowbit_hparam_type_t = 2;
    pub const LOWBIT_HPARAM_INT: lowbit_hparam_type_t = 3;
    pub const LOWBIT_HPARAM_ENUM: lowbit_hparam_type_t = 4;

    pub type lowbit_state_format_t = i32;
    pub const LOWBIT_STATE_DEFAULT: lowbit_state_format_t = 0;
    pub const LOWBIT_STATE_FP32: lowbit_state_format_t = 1;
    pub const LOWBIT_STATE_BF16: lowbit_state_format_t = 2;
    pub const LOWBIT_STATE_8BIT: lowbit_state_format_t = 3;
    pub const LOWBIT_STATE_4BIT: lowbit_state_format_t = 4;
    pub const LOWBIT_STATE_FP8: lowbit_state_format_t = 5;
    pub const LOWBIT_STATE_4BIT_SR: lowbit_state_format_t = 6;
    pub const LOWBIT_STATE_4BIT_DYN: lowbit_state_format_t = 7;

    pub const LOWBIT_MAX_DIMS: usize = 8;

    pub type lowbit_normalization_t = i32;
    pub const LOWBIT_NORMALIZATION_DEFAULT: lowbit_normalization_t = 0;
    pub const LOWBIT_NORMALIZATION_BLOCK: lowbit_normalization_t = 1;
    pub const LOWBIT_NORMALIZATION_RANK1: lowbit_normalization_t = 2;
    pub const LOWBIT_NORMALIZATION_FACTORED: lowbit_normalization_t = 3;

    pub type lowbit_rounding_t = i32;
    pub const LOWBIT_ROUNDING_NEAREST: lowbit_rounding_t = 0;
    pub const LOWBIT_ROUNDING_STOCHASTIC: lowbit_rounding_t = 1;
    pub const LOWBIT_ROUNDING_ERROR_CORRECTION: lowbit_rounding_t = 2;

    pub type lowbit_preset_t = i32;
    pub const LOWBIT_PRESET_LPMM_ADAMW_4BIT: lowbit_preset_t = 1;
    pub const LOWBIT_PRESET_ADAMW_4BIT_FACTOR: lowbit_preset_t = 2;
    pub const LOWBIT_PRESET_ADAMW_4BIT_SR: lowbit_preset_t = 3;
    pub const LOWBIT_PRESET_ADAMW_4BIT_SR_DYN: lowbit_preset_t = 4;

    pub const LOWBIT_STATE_RECORD_INT32: usize = 14;

    /// A flat, contiguous tensor (frozen layout, no struct_size).
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_tensor_t {
        pub data: *mut c_void,
        pub numel: i64,
        pub dtype: lowbit_dtype_t,
        pub device: lowbit_device_t,
        pub device_index: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_hparams_t {
        pub struct_size: usize,
        pub lr: f32,
        pub beta1: f32,
        pub beta2: f32,
        pub eps: f32,
        pub weight_decay: f32,
        pub momentum: f32,
        pub dampening: f32,
        pub nesterov: i32,
        pub bias_correction: i32,
        // Since 0.7: a group's algorithm (0: the optimizer's) and Muon's settings.
        pub algorithm: lowbit_algorithm_t,
        pub ns_steps: i32,
        pub ns_coefficients: [f32; 3],
        pub adjust_lr: i32,
        pub ns_precision: i32,
        // Since 0.8: RMSprop's and Adagrad's (lowbit_hparam_info says which
        // algorithm reads which field).
        pub alpha: f32,
        pub centered: i32,
        pub lr_decay: f32,
        pub initial_accumulator_value: f32,
    }

    /// An algorithm's descriptor (since 0.8).
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_algorithm_info_t {
        pub struct_size: usize,
        pub algorithm: lowbit_algorithm_t,
        pub num_hparams: i32,
        pub name: *const c_char,
        pub title: *const c_char,
        pub max_moments: i32,
        pub reads_param: i32,
        pub moment_names: [*const c_char; LOWBIT_MAX_MOMENTS],
        pub moment_kinds: [lowbit_moment_kind_t; LOWBIT_MAX_MOMENTS],
        pub bias_correction: i32,
        pub factored_second: i32,
        pub distributed: i32,
        pub hybrid_group: i32,
        pub matrices: i32,
        pub reserved0: i32,
    }

    /// One hyper-parameter of one algorithm (since 0.8).
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_hparam_info_t {
        pub struct_size: usize,
        pub name: *const c_char,
        pub meaning: *const c_char,
        pub type_: lowbit_hparam_type_t,
        pub count: i32,
        pub offset: usize,
        pub default_value: [f64; 3],
        pub lower: f64,
        pub upper: f64,
        pub lower_inclusive: i32,
        pub upper_inclusive: i32,
        pub since: i32,
        pub reserved0: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_optimizer_config_t {
        pub struct_size: usize,
        pub algorithm: lowbit_algorithm_t,
        pub device: lowbit_device_t,
        pub device_index: i32,
        pub state_format: lowbit_state_format_t,
        pub second_state_format: lowbit_state_format_t,
        pub min_quantized_numel: i64,
        pub seed: u64,
        pub stochastic_rounding: i32,
        pub error_correction: i32,
        pub skip_nonfinite: i32,
        pub num_threads: i32,
        pub freeze_step: i64,
        pub first_normalization: lowbit_normalization_t,
        pub second_normalization: lowbit_normalization_t,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_param_config_t {
        pub struct_size: usize,
        pub param: lowbit_tensor_t,
        pub grad: lowbit_tensor_t,
        pub group: i32,
        pub state_format: lowbit_state_format_t,
        pub second_state_format: lowbit_state_format_t,
        pub stochastic_rounding: i32,
        pub error_correction: i32,
        pub ndim: i32,
        pub shape: [i64; LOWBIT_MAX_DIMS],
        pub first_normalization: lowbit_normalization_t,
        pub second_normalization: lowbit_normalization_t,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_state_plan_t {
        pub struct_size: usize,
        pub num_moments: i32,
        pub format: [lowbit_state_format_t; 2],
        pub block_size: [i64; 2],
        pub data_bytes: [i64; 2],
        pub scale_count: [i64; 2],
        pub rounding: lowbit_rounding_t,
        pub ecc_bytes: i64,
        pub state_bytes: i64,
        pub normalization: [lowbit_normalization_t; 2],
        // Since 0.8: each moment's kind (its maps and floor).
        pub kind: [lowbit_moment_kind_t; 2],
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_param_buffers_t {
        pub struct_size: usize,
        pub param: lowbit_tensor_t,
        pub grad: lowbit_tensor_t,
        pub group: i32,
        pub ndim: i32,
        pub shape: [i64; LOWBIT_MAX_DIMS],
        pub plan: *const lowbit_state_plan_t,
        pub moment: [*mut c_void; 2],
        pub moment_bytes: [i64; 2],
        pub scales: [*mut f32; 2],
        pub scale_count: [i64; 2],
        pub ecc: *mut u8,
        pub ecc_bytes: i64,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct lowbit_step_args_t {
        pub struct_size: usize,
        pub hparams: *const lowbit_hparams_t,
        pub num_groups: i32,
        pub reserved0: i32,
        pub lr: *const f32,
        pub step: i64,
        pub count: *const i32,
        pub count_out: *mut i32,
        pub records: *const i32,
        pub engine_hparams: *const lowbit_hparams_t,
    }

    /// Opaque `struct lowbit_step_context`.
    #[repr(C)]
    pub struct lowbit_step_context {
        _private: [u8; 0],
    }
    pub type lowbit_step_context_t = *mut lowbit_step_context;

    extern "C" {
        pub fn lowbit_status_string(status: lowbit_status_t) -> *const c_char;
        pub fn lowbit_last_error() -> *const c_char;
        pub fn lowbit_version() -> i32;

        pub fn lowbit_hparams_init_sized(
            hparams: *mut lowbit_hparams_t,
            struct_size: usize,
            algorithm: lowbit_algorithm_t,
        ) -> lowbit_status_t;
        pub fn lowbit_optimizer_config_init_sized(
            config: *mut lowbit_optimizer_config_t,
            struct_size: usize,
            algorithm: lowbit_algorithm_t,
        ) -> lowbit_status_t;
        pub fn lowbit_optimizer_config_preset_sized(
            config: *mut lowbit_optimizer_config_t,
            struct_size: usize,
            preset: lowbit_preset_t,
        ) -> lowbit_status_t;
        pub fn lowbit_param_config_init_sized(
            config: *mut lowbit_param_config_t,
            struct_size: usize,
        ) -> lowbit_status_t;
        pub fn lowbit_state_plan_init_sized(plan: *mut lowbit_state_plan_t, struct_size: usize) -> lowbit_status_t;
        pub fn lowbit_plan_param_state(
            config: *const lowbit_optimizer_config_t,
            hparams: *const lowbit_hparams_t,
            param: *const lowbit_param_config_t,
            out: *mut lowbit_state_plan_t,
        ) -> lowbit_status_t;

        pub fn lowbit_param_buffers_init_sized(p: *mut lowbit_param_buffers_t, struct_size: usize) -> lowbit_status_t;
        pub fn lowbit_step_args_init_sized(args: *mut lowbit_step_args_t, struct_size: usize) -> lowbit_status_t;
        pub fn lowbit_step_context_create(
            out: *mut lowbit_step_context_t,
            config: *const lowbit_optimizer_config_t,
        ) -> lowbit_status_t;
        pub fn lowbit_step_context_destroy(ctx: lowbit_step_context_t) -> lowbit_status_t;
        pub fn lowbit_step_context_last_error(ctx: lowbit_step_context_t) -> *const c_char;
        pub fn lowbit_state_record(
            plan: *const lowbit_state_plan_t,
            ndim: i32,
            shape: *const i64,
            out: *mut i32,
            capacity: i64,
        ) -> lowbit_status_t;
        pub fn lowbit_functional_step(
            ctx: lowbit_step_context_t,
            params: *const lowbit_param_buffers_t,
            num_params: i64,
            args: *const lowbit_step_args_t,
            stream: *mut c_void,
        ) -> lowbit_status_t;
        pub fn lowbit_step_context_last_step_skipped(ctx: lowbit_step_context_t, out: *mut i32) -> lowbit_status_t;
        pub fn lowbit_hparams_check(hparams: *const lowbit_hparams_t, algorithm: lowbit_algorithm_t)
            -> lowbit_status_t;
        pub fn lowbit_decode_moment(
            plan: *const lowbit_state_plan_t,
            moment: i32,
            ndim: i32,
            shape: *const i64,
            data: *const c_void,
            data_bytes: i64,
            scales: *const f32,
            scale_count: i64,
            out: *mut f32,
            numel: i64,
        ) -> lowbit_status_t;
        pub fn lowbit_state_format_name(format: lowbit_state_format_t) -> *const c_char;

        pub fn lowbit_algorithm_info(
            algorithm: lowbit_algorithm_t,
            out: *mut lowbit_algorithm_info_t,
        ) -> lowbit_status_t;
        pub fn lowbit_hparam_info(
            algorithm: lowbit_algorithm_t,
            index: i32,
            out: *mut lowbit_hparam_info_t,
        ) -> lowbit_status_t;
        pub fn lowbit_moments_in_use(
            algorithm: lowbit_algorithm_t,
            hparams: *const lowbit_hparams_t,
            count: *mut i32,
        ) -> lowbit_status_t;
        pub fn lowbit_algorithms(out: *mut lowbit_algorithm_t, capacity: i32, count: *mut i32) -> lowbit_status_t;
        pub fn lowbit_algorithm_info_init_sized(
            info: *mut lowbit_algorithm_info_t,
            struct_size: usize,
        ) -> lowbit_status_t;
        pub fn lowbit_hparam_info_init_sized(info: *mut lowbit_hparam_info_t, struct_size: usize) -> lowbit_status_t;
    }
}

use sys::*;

// The current sizes on LP64 (docs/ABI.md, "Released sizes"), checked when the
// crate compiles; the tests check that the library agrees.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<lowbit_tensor_t>() == 32, "lowbit_tensor_t");
    assert!(size_of::<lowbit_hparams_t>() == 88, "lowbit_hparams_t");
    assert!(
        size_of::<lowbit_optimizer_config_t>() == 80,
        "lowbit_optimizer_config_t"
    );
    assert!(size_of::<lowbit_param_config_t>() == 168, "lowbit_param_config_t");
    assert!(size_of::<lowbit_state_plan_t>() == 112, "lowbit_state_plan_t");
    assert!(size_of::<lowbit_algorithm_info_t>() == 112, "lowbit_algorithm_info_t");
    assert!(size_of::<lowbit_hparam_info_t>() == 96, "lowbit_hparam_info_t");
    assert!(size_of::<lowbit_param_buffers_t>() == 232, "lowbit_param_buffers_t");
    assert!(size_of::<lowbit_step_args_t>() == 72, "lowbit_step_args_t");
};

// ---------------------------------------------------------------- errors

/// A failed call: its status (`LOWBIT_ERROR_*`) and the library's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: lowbit_status_t,
    pub message: String,
}

impl Error {
    fn new(status: lowbit_status_t, message: String) -> Error {
        Error { status, message }
    }
    /// `lowbit_status_string` of the status, e.g. "invalid argument".
    pub fn status_string(&self) -> &'static str {
        status_string(self.status)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status_string(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// A C string the library owns (static, or valid until the next call).
fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A status of a call without a handle: the message is this thread's
/// `lowbit_last_error()`.
fn check(status: lowbit_status_t) -> Result<()> {
    if status == LOWBIT_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(status, c_string(unsafe { lowbit_last_error() })))
    }
}

fn static_str(p: *const c_char) -> &'static str {
    // The library's names and status strings are static, never NULL.
    if p.is_null() {
        return "";
    }
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

/// `lowbit_status_string`.
pub fn status_string(status: lowbit_status_t) -> &'static str {
    static_str(unsafe { lowbit_status_string(status) })
}

/// `lowbit_state_format_name`: "fp32", "bf16", "8bit", "4bit", "fp8", "4bit-sr".
pub fn state_format_name(format: lowbit_state_format_t) -> &'static str {
    static_str(unsafe { lowbit_state_format_name(format) })
}

/// `LOWBIT_VERSION` of the loaded library (MAJOR * 10000 + MINOR * 100 + PATCH).
pub fn version() -> i32 {
    unsafe { lowbit_version() }
}

// ---------------------------------------------------------------- structs

/// `lowbit_optimizer_config_init`: the defaults for `algorithm` (CPU, fp32
/// state, threshold 4096, seed 0, skip_nonfinite 1, ...).
pub fn optimizer_config(algorithm: lowbit_algorithm_t) -> Result<lowbit_optimizer_config_t> {
    let mut c = std::mem::MaybeUninit::<lowbit_optimizer_config_t>::zeroed();
    check(unsafe {
        lowbit_optimizer_config_init_sized(c.as_mut_ptr(), size_of::<lowbit_optimizer_config_t>(), algorithm)
    })?;
    Ok(unsafe { c.assume_init() })
}

/// `lowbit_hparams_init`: the usual hyper-parameters of `algorithm`.
pub fn hparams(algorithm: lowbit_algorithm_t) -> Result<lowbit_hparams_t> {
    let mut h = std::mem::MaybeUninit::<lowbit_hparams_t>::zeroed();
    check(unsafe { lowbit_hparams_init_sized(h.as_mut_ptr(), size_of::<lowbit_hparams_t>(), algorithm) })?;
    Ok(unsafe { h.assume_init() })
}

/// `lowbit_hparams_check`: the checks lowbit_optimizer_create makes.
pub fn hparams_check(hparams: &lowbit_hparams_t, algorithm: lowbit_algorithm_t) -> Result<()> {
    check(unsafe { lowbit_hparams_check(hparams, algorithm) })
}

/// `lowbit_param_config_init` for a CPU param of `numel` elements of
/// `dtype` (data NULL: only the plan reads it), 1-D unless `shape` is set
/// (see [`with_shape`]).
pub fn param_config(numel: i64, dtype: lowbit_dtype_t) -> Result<lowbit_param_config_t> {
    let mut c = std::mem::MaybeUninit::<lowbit_param_config_t>::zeroed();
    check(unsafe { lowbit_param_config_init_sized(c.as_mut_ptr(), size_of::<lowbit_param_config_t>()) })?;
    let mut c = unsafe { c.assume_init() };
    c.param = tensor(ptr::null_mut(), numel, dtype);
    Ok(c)
}

/// Sets a param config's shape (row-major; at most `LOWBIT_MAX_DIMS` dims).
pub fn with_shape(mut config: lowbit_param_config_t, shape: &[i64]) -> Result<lowbit_param_config_t> {
    if shape.len() > LOWBIT_MAX_DIMS {
        return Err(Error::new(
            LOWBIT_ERROR_INVALID_ARGUMENT,
            format!("a shape of {} dims: at most {}", shape.len(), LOWBIT_MAX_DIMS),
        ));
    }
    config.ndim = shape.len() as i32;
    config.shape = [0; LOWBIT_MAX_DIMS];
    config.shape[..shape.len()].copy_from_slice(shape);
    Ok(config)
}

fn tensor(data: *mut c_void, numel: i64, dtype: lowbit_dtype_t) -> lowbit_tensor_t {
    lowbit_tensor_t {
        data,
        numel,
        dtype,
        device: LOWBIT_DEVICE_CPU,
        device_index: 0,
    }
}

/// `lowbit_plan_param_state`: the state `lowbit_optimizer_add_param` would
/// allocate for `param` in an optimizer of `config` whose group has `hparams`.
pub fn plan_param_state(
    config: &lowbit_optimizer_config_t,
    hparams: &lowbit_hparams_t,
    param: &lowbit_param_config_t,
) -> Result<lowbit_state_plan_t> {
    let mut plan = std::mem::MaybeUninit::<lowbit_state_plan_t>::zeroed();
    check(unsafe { lowbit_state_plan_init_sized(plan.as_mut_ptr(), size_of::<lowbit_state_plan_t>()) })?;
    check(unsafe { lowbit_plan_param_state(config, hparams, param, plan.as_mut_ptr()) })?;
    Ok(unsafe { plan.assume_init() })
}

// ---------------------------------------------------------------- algorithms, described

/// One hyper-parameter of one algorithm (`lowbit_hparam_info`): a field of
/// `lowbit_hparams_t`, its default for that algorithm, its bounds and what
/// it means.
#[derive(Clone, Debug, PartialEq)]
pub struct HparamSpec {
    pub name: &'static str,
    pub meaning: &'static str,
    /// `LOWBIT_HPARAM_REAL`, `_FLAG`, `_INT` or `_ENUM`.
    pub kind: lowbit_hparam_type_t,
    /// The field's values (1, or 3 for `ns_coefficients`) and their defaults.
    pub default: Vec<f64>,
    pub offset: usize,
    pub lower: f64,
    pub upper: f64,
    pub lower_inclusive: bool,
    pub upper_inclusive: bool,
    /// `LOWBIT_VERSION` of the release that added the field.
    pub since: i32,
}

impl HparamSpec {
    /// Whether `v` is within the bounds (reals: and finite).
    pub fn admits(&self, v: f64) -> bool {
        let lo = if self.lower_inclusive {
            v >= self.lower
        } else {
            v > self.lower
        };
        let hi = if self.upper_inclusive {
            v <= self.upper
        } else {
            v < self.upper
        };
        v.is_finite() && lo && hi
    }
}

/// An algorithm as the library describes it (`lowbit_algorithm_info` and
/// its `lowbit_hparam_info` entries).
#[derive(Clone, Debug, PartialEq)]
pub struct AlgorithmSpec {
    pub algorithm: lowbit_algorithm_t,
    /// "adamw", "rmsprop", ...: the name every binding takes.
    pub name: &'static str,
    /// "AdamW", "RMSprop", ...
    pub title: &'static str,
    /// torch's state names of the moment slots it may keep ("square_avg", ...).
    pub moment_names: Vec<&'static str>,
    /// `LOWBIT_MOMENT_SIGNED` or `_UNSIGNED`, per slot.
    pub moment_kinds: Vec<lowbit_moment_kind_t>,
    pub reads_param: bool,
    pub bias_correction: bool,
    pub factored_second: bool,
    /// A 1-bit optimizer (needs a communicator: no functional step).
    pub distributed: bool,
    pub hybrid_group: bool,
    /// It steps matrices (params of >= 2 dims only).
    pub matrices: bool,
    /// Its hyper-parameters, in the library's order.
    pub hparams: Vec<HparamSpec>,
}

impl AlgorithmSpec {
    /// The hyper-parameter `name`, or an `INVALID_ARGUMENT` error naming it
    /// and the algorithm's.
    pub fn hparam(&self, name: &str) -> Result<&HparamSpec> {
        self.hparams.iter().find(|h| h.name == name).ok_or_else(|| {
            let known: Vec<&str> = self.hparams.iter().map(|h| h.name).collect();
            Error::new(
                LOWBIT_ERROR_INVALID_ARGUMENT,
                format!(
                    "'{}' is not a hyper-parameter of {} (its: {})",
                    name,
                    self.name,
                    known.join(", ")
                ),
            )
        })
    }

    /// The library's defaults (`lowbit_hparams_init`).
    pub fn default_hparams(&self) -> Result<lowbit_hparams_t> {
        hparams(self.algorithm)
    }

    /// Writes `values` (as many as the field holds) into field `name` of
    /// `h`, where the descriptor says it lies; flags, ints and enums must be
    /// integral. The bounds are the library's to check ([`hparams_check`]).
    pub fn set(&self, h: &mut lowbit_hparams_t, name: &str, values: &[f64]) -> Result<()> {
        let spec = self.hparam(name)?;
        let count = spec.default.len();
        if values.len() != count {
            return Err(Error::new(
                LOWBIT_ERROR_INVALID_ARGUMENT,
                format!("{} of {} takes {} values, got {}", name, self.name, count, values.len()),
            ));
        }
        field_range(spec)?;
        let base = h as *mut lowbit_hparams_t as *mut u8;
        for (k, &v) in values.iter().enumerate() {
            let at = unsafe { base.add(spec.offset + 4 * k) };
            if spec.kind == LOWBIT_HPARAM_REAL {
                unsafe { ptr::write_unaligned(at as *mut f32, v as f32) };
            } else {
                if v != v.floor() || v < i32::MIN as f64 || v > i32::MAX as f64 {
                    return Err(Error::new(
                        LOWBIT_ERROR_INVALID_ARGUMENT,
                        format!(
                            "{} = {} of {} must be an integer ({})",
                            name, v, self.name, spec.meaning
                        ),
                    ));
                }
                unsafe { ptr::write_unaligned(at as *mut i32, v as i32) };
            }
        }
        Ok(())
    }

    /// The values of field `name` of `h`.
    pub fn get(&self, h: &lowbit_hparams_t, name: &str) -> Result<Vec<f64>> {
        let spec = self.hparam(name)?;
        field_range(spec)?;
        let base = h as *const lowbit_hparams_t as *const u8;
        Ok((0..spec.default.len())
            .map(|k| {
                let at = unsafe { base.add(spec.offset + 4 * k) };
                if spec.kind == LOWBIT_HPARAM_REAL {
                    unsafe { ptr::read_unaligned(at as *const f32) as f64 }
                } else {
                    unsafe { ptr::read_unaligned(at as *const i32) as f64 }
                }
            })
            .collect())
    }

    /// The defaults with `values` ((name, value) pairs, one value each)
    /// written over them, checked by the library (`lowbit_hparams_check`).
    pub fn hparams_with(&self, values: &[(&str, f64)]) -> Result<lowbit_hparams_t> {
        let mut h = self.default_hparams()?;
        for &(name, v) in values {
            self.set(&mut h, name, &[v])?;
        }
        hparams_check(&h, self.algorithm)?;
        Ok(h)
    }

    /// How many moments a param of a group with `h` keeps (`lowbit_moments_in_use`).
    pub fn moments_in_use(&self, h: &lowbit_hparams_t) -> Result<usize> {
        moments_in_use(self.algorithm, h)
    }
}

// A field past this crate's lowbit_hparams_t (a newer library's) is refused,
// never written.
fn field_range(spec: &HparamSpec) -> Result<()> {
    if spec.offset + 4 * spec.default.len() > size_of::<lowbit_hparams_t>() {
        return Err(Error::new(
            LOWBIT_ERROR_UNSUPPORTED,
            format!(
                "hyper-parameter {} (since {}) lies past this crate's lowbit_hparams_t ({} bytes)",
                spec.name,
                spec.since,
                size_of::<lowbit_hparams_t>()
            ),
        ));
    }
    Ok(())
}

/// The descriptor of `algorithm` (`lowbit_algorithm_info`, `lowbit_hparam_info`).
pub fn algorithm_spec(algorithm: lowbit_algorithm_t) -> Result<AlgorithmSpec> {
    let mut info = std::mem::MaybeUninit::<lowbit_algorithm_info_t>::zeroed();
    check(unsafe { lowbit_algorithm_info_init_sized(info.as_mut_ptr(), size_of::<lowbit_algorithm_info_t>()) })?;
    check(unsafe { lowbit_algorithm_info(algorithm, info.as_mut_ptr()) })?;
    let info = unsafe { info.assume_init() };
    let n = (info.max_moments.max(0) as usize).min(LOWBIT_MAX_MOMENTS);
    let mut specs = Vec::with_capacity(info.num_hparams.max(0) as usize);
    for i in 0..info.num_hparams {
        let mut h = std::mem::MaybeUninit::<lowbit_hparam_info_t>::zeroed();
        check(unsafe { lowbit_hparam_info_init_sized(h.as_mut_ptr(), size_of::<lowbit_hparam_info_t>()) })?;
        check(unsafe { lowbit_hparam_info(algorithm, i, h.as_mut_ptr()) })?;
        let h = unsafe { h.assume_init() };
        let count = (h.count.max(0) as usize).min(3);
        specs.push(HparamSpec {
            name: static_str(h.name),
            meaning: static_str(h.meaning),
            kind: h.type_,
            default: h.default_value[..count].to_vec(),
            offset: h.offset,
            lower: h.lower,
            upper: h.upper,
            lower_inclusive: h.lower_inclusive != 0,
            upper_inclusive: h.upper_inclusive != 0,
            since: h.since,
        });
    }
    Ok(AlgorithmSpec {
        algorithm: info.algorithm,
        name: static_str(info.name),
        title: static_str(info.title),
        moment_names: info.moment_names[..n].iter().map(|&p| static_str(p)).collect(),
        moment_kinds: info.moment_kinds[..n].to_vec(),
        reads_param: info.reads_param != 0,
        bias_correction: info.bias_correction != 0,
        factored_second: info.factored_second != 0,
        distributed: info.distributed != 0,
        hybrid_group: info.hybrid_group != 0,
        matrices: info.matrices != 0,
        hparams: specs,
    })
}

/// Every algorithm of the loaded library, in enum order (`lowbit_algorithms`).
pub fn algorithms() -> Result<Vec<AlgorithmSpec>> {
    let mut count = 0i32;
    check(unsafe { lowbit_algorithms(ptr::null_mut(), 0, &mut count) })?;
    let mut ids = vec![0 as lowbit_algorithm_t; count.max(0) as usize];
    check(unsafe { lowbit_algorithms(ids.as_mut_ptr(), ids.len() as i32, &mut count) })?;
    ids.truncate(count.max(0) as usize);
    ids.into_iter().map(algorithm_spec).collect()
}

/// The algorithm called `name` ("rmsprop", ...), or an `INVALID_ARGUMENT`
/// error naming it and the library's algorithms.
pub fn algorithm_named(name: &str) -> Result<AlgorithmSpec> {
    let all = algorithms()?;
    let names: Vec<&str> = all.iter().map(|a| a.name).collect();
    let message = format!(
        "no algorithm is called '{}' (this library has: {})",
        name,
        names.join(", ")
    );
    all.into_iter()
        .find(|a| a.name == name)
        .ok_or_else(|| Error::new(LOWBIT_ERROR_INVALID_ARGUMENT, message))
}

/// `lowbit_moments_in_use`: how many moments (slots 0..) a param of a group
/// with `hparams` keeps under `algorithm` (the hparams checked as
/// `lowbit_hparams_check` does).
pub fn moments_in_use(algorithm: lowbit_algorithm_t, hparams: &lowbit_hparams_t) -> Result<usize> {
    let mut count = 0i32;
    check(unsafe { lowbit_moments_in_use(algorithm, hparams, &mut count) })?;
    Ok(count.max(0) as usize)
}

// ---------------------------------------------------------------- elements

/// An element type of params and grads (host memory).
pub unsafe trait Element: Copy {
    const DTYPE: lowbit_dtype_t;
}
unsafe impl Element for f32 {
    const DTYPE: lowbit_dtype_t = LOWBIT_DTYPE_FLOAT32;
}
/// A bfloat16 value (its bits).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);
unsafe impl Element for Bf16 {
    const DTYPE: lowbit_dtype_t = LOWBIT_DTYPE_BFLOAT16;
}
/// An IEEE half value (its bits).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F16(pub u16);
unsafe impl Element for F16 {
    const DTYPE: lowbit_dtype_t = LOWBIT_DTYPE_FLOAT16;
}

// ---------------------------------------------------------------- state

/// One parameter's optimizer state, owned here: the buffers of its plan,
/// zero-filled, and its state record. Keep it (and checkpoint it) with the
/// parameter; the step checks that it was made for the plan and shape.
#[derive(Clone, Debug)]
pub struct ParamState {
    plan: lowbit_state_plan_t,
    numel: i64,
    dtype: lowbit_dtype_t,
    ndim: i32,
    shape: [i64; LOWBIT_MAX_DIMS],
    // u64 words: aligned for fp32 and bf16 moments, whatever the allocator.
    moments: [Vec<u64>; 2],
    scales: [Vec<f32>; 2],
    ecc: Vec<u8>,
    record: [i32; LOWBIT_STATE_RECORD_INT32],
}

fn plan_len(n: i64, what: &str) -> Result<usize> {
    if n < 0 {
        return Err(Error::new(
            LOWBIT_ERROR_INTERNAL,
            format!("the plan has {} = {}", what, n),
        ));
    }
    Ok(n as usize)
}

/// Element types whose all-zero bytes are a value (the state's buffers).
unsafe trait ZeroValid: Copy {}
unsafe impl ZeroValid for u8 {}
unsafe impl ZeroValid for u64 {}
unsafe impl ZeroValid for f32 {}

/// `n` zeros, or an `OUT_OF_MEMORY` [`Error`] naming `what` where `vec![0; n]`
/// would abort the process (the allocation fails) or panic (more than
/// `isize::MAX` bytes). The memory comes zeroed from the allocator, its pages
/// untouched until written.
fn zeroed_vec<T: ZeroValid>(n: usize, what: &str) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let refused = || {
        Error::new(
            LOWBIT_ERROR_OUT_OF_MEMORY,
            format!(
                "{}: {} values of {} bytes could not be allocated",
                what,
                n,
                size_of::<T>()
            ),
        )
    };
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| refused())?;
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        return Err(refused());
    }
    // SAFETY: the global allocator's memory for n values of T, in the layout
    // Vec<T> uses for that capacity, all zero bytes (a value of T).
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

impl ParamState {
    /// Plans the state of `param` (`lowbit_plan_param_state`; its numel,
    /// dtype, shape and per-param overrides) and allocates it.
    pub fn new(
        config: &lowbit_optimizer_config_t,
        hparams: &lowbit_hparams_t,
        param: &lowbit_param_config_t,
    ) -> Result<ParamState> {
        let plan = plan_param_state(config, hparams, param)?;
        ParamState::from_plan(plan, param.param.numel, param.param.dtype, param.ndim, &param.shape)
    }

    /// The state of a plan made elsewhere for a param of `numel` elements
    /// of `dtype` and shape (ndim, shape) (ndim 0: flat).
    pub fn from_plan(
        plan: lowbit_state_plan_t,
        numel: i64,
        dtype: lowbit_dtype_t,
        ndim: i32,
        shape: &[i64; LOWBIT_MAX_DIMS],
    ) -> Result<ParamState> {
        if numel < 0 {
            return Err(Error::new(
                LOWBIT_ERROR_INVALID_ARGUMENT,
                format!("numel = {} must be >= 0", numel),
            ));
        }
        let mut record = [0i32; LOWBIT_STATE_RECORD_INT32];
        check(unsafe { lowbit_state_record(&plan, ndim, shape.as_ptr(), record.as_mut_ptr(), record.len() as i64) })?;
        let mut moments = [Vec::new(), Vec::new()];
        let mut scales = [Vec::new(), Vec::new()];
        for m in 0..2 {
            let bytes = plan_len(plan.data_bytes[m], "data_bytes")?;
            moments[m] = zeroed_vec::<u64>(bytes / 8 + usize::from(bytes % 8 != 0), "the plan's data_bytes")?;
            scales[m] = zeroed_vec::<f32>(plan_len(plan.scale_count[m], "scale_count")?, "the plan's scale_count")?;
        }
        let ecc = zeroed_vec::<u8>(plan_len(plan.ecc_bytes, "ecc_bytes")?, "the plan's ecc_bytes")?;
        Ok(ParamState {
            plan,
            numel,
            dtype,
            ndim,
            shape: *shape,
            moments,
            scales,
            ecc,
            record,
        })
    }

    pub fn plan(&self) -> &lowbit_state_plan_t {
        &self.plan
    }
    pub fn numel(&self) -> i64 {
        self.numel
    }
    /// The state record (`lowbit_state_record`).
    pub fn record(&self) -> &[i32; LOWBIT_STATE_RECORD_INT32] {
        &self.record
    }
    /// Moment `m`'s codes or values: exactly the plan's `data_bytes[m]` bytes.
    pub fn moment_bytes(&self, m: usize) -> &[u8] {
        let n = self.plan.data_bytes[m] as usize;
        let words = &self.moments[m];
        unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, n) }
    }
    /// Moment `m`'s fp32 scales (block scales, rank-1 vectors or factored accumulators).
    pub fn scales(&self, m: usize) -> &[f32] {
        &self.scales[m]
    }
    /// The scales' bytes, in memory order.
    pub fn scale_bytes(&self, m: usize) -> &[u8] {
        let s = &self.scales[m];
        unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, s.len() * size_of::<f32>()) }
    }
    /// The error-correction bytes (none unless the plan's rounding is ERROR_CORRECTION).
    pub fn ecc(&self) -> &[u8] {
        &self.ecc
    }

    /// Moment `m` (0 or 1) decoded to fp32 (`lowbit_decode_moment`).
    pub fn decode_moment(&self, m: usize) -> Result<Vec<f32>> {
        if m >= 2 {
            return Err(Error::new(
                LOWBIT_ERROR_INVALID_ARGUMENT,
                format!("moment = {}: a state has moments 0 and 1 at most", m),
            ));
        }
        // numel is the caller's (from_plan): the library checks it against
        // the plan before writing, this allocation must not abort first.
        let mut out = zeroed_vec::<f32>(self.numel as usize, "the decoded moment")?;
        let bytes = self.moment_bytes(m);
        check(unsafe {
            lowbit_decode_moment(
                &self.plan,
                m as i32,
                self.ndim,
                self.shape.as_ptr(),
                bytes.as_ptr() as *const c_void,
                bytes.len() as i64,
                self.scales[m].as_ptr(),
                self.scales[m].len() as i64,
                out.as_mut_ptr(),
                self.numel,
            )
        })?;
        Ok(out)
    }

    fn moment_ptr(&mut self, m: usize) -> *mut c_void {
        if self.plan.data_bytes[m] == 0 {
            ptr::null_mut()
        } else {
            self.moments[m].as_mut_ptr() as *mut c_void
        }
    }
}

// ---------------------------------------------------------------- step

/// A parameter, its gradient and its state, for one step. The borrows last as
/// long as the `Param`: the step writes the param and the state in place.
pub struct Param<'a> {
    buffers: lowbit_param_buffers_t,
    record: [i32; LOWBIT_STATE_RECORD_INT32],
    _borrows: PhantomData<&'a mut ()>,
}

impl<'a> Param<'a> {
    /// `param`, stepped with `grad` (same length) in group `group`.
    pub fn new<T: Element, G: Element>(
        param: &'a mut [T],
        grad: &'a [G],
        state: &'a mut ParamState,
        group: i32,
    ) -> Result<Param<'a>> {
        if grad.len() != param.len() {
            return Err(Error::new(
                LOWBIT_ERROR_INVALID_ARGUMENT,
                format!("the grad has {} elements but the param {}", grad.len(), param.len()),
            ));
        }
        let g = tensor(grad.as_ptr() as *mut c_void, grad.len() as i64, G::DTYPE);
        Param::with_grad_tensor(param, g, state, group)
    }

    /// `param` without a gradient: a step leaves it and its state alone.
    pub fn frozen<T: Element>(param: &'a mut [T], state: &'a mut ParamState, group: i32) -> Result<Param<'a>> {
        let g = tensor(ptr::null_mut(), param.len() as i64, T::DTYPE);
        Param::with_grad_tensor(param, g, state, group)
    }

    fn with_grad_tensor<T: Element>(
        param: &'a mut [T],
        grad: lowbit_tensor_t,
        state: &'a mut ParamState,
        group: i32,
    ) -> Result<Param<'a>> {
        if param.len() as i64 != state.numel || T::DTYPE != state.dtype {
            return Err(Error::new(
                LOWBIT_ERROR_INVALID_ARGUMENT,
                format!(
                    "a param of {} elements of dtype {} but its state was planned for {} of dtype {}",
                    param.len(),
                    T::DTYPE,
                    state.numel,
                    state.dtype
                ),
            ));
        }
        let mut b = std::mem::MaybeUninit::<lowbit_param_buffers_t>::zeroed();
        check(unsafe { lowbit_param_buffers_init_sized(b.as_mut_ptr(), size_of::<lowbit_param_buffers_t>()) })?;
        let mut b = unsafe { b.assume_init() };
        b.param = tensor(param.as_mut_ptr() as *mut c_void, param.len() as i64, T::DTYPE);
        b.grad = grad;
        b.group = group;
        b.ndim = state.ndim;
        b.shape = state.shape;
        for m in 0..2 {
            b.moment[m] = state.moment_ptr(m);
            b.moment_bytes[m] = state.plan.data_bytes[m];
            b.scales[m] = if state.scales[m].is_empty() {
                ptr::null_mut()
            } else {
                state.scales[m].as_mut_ptr()
            };
            b.scale_count[m] = state.scales[m].len() as i64;
        }
        b.ecc = if state.ecc.is_empty() {
            ptr::null_mut()
        } else {
            state.ecc.as_mut_ptr()
        };
        b.ecc_bytes = state.ecc.len() as i64;
        // The plan lives in the state, which this Param borrows mutably for 'a.
        b.plan = &state.plan;
        Ok(Param {
            buffers: b,
            record: state.record,
            _borrows: PhantomData,
        })
    }
}

/// The count of steps applied so far, as the step takes it.
pub enum Count<'a> {
    /// A host value (`args.step`).
    Host(i64),
    /// A count the step reads and, unless it skips, increments
    /// (`args.count` = `args.count_out`).
    State(&'a mut i32),
    /// Both: they must agree.
    Both(i64, &'a mut i32),
}

/// A context of functional steps on the CPU (`lowbit_step_context_t`):
/// the config's algorithm, seed, skip_nonfinite and num_threads.
pub struct StepContext {
    ctx: lowbit_step_context_t,
    buffers: Vec<lowbit_param_buffers_t>,
    records: Vec<i32>,
}

// One thread at a time per handle (lowbit.h, "Thread safety").
unsafe impl Send for StepContext {}

impl StepContext {
    /// A context for `config` (device CPU: this safe layer steps host memory;
    /// [`sys`] has the rest).
    pub fn new(config: &lowbit_optimizer_config_t) -> Result<StepContext> {
        if config.device != LOWBIT_DEVICE_CPU {
            return Err(Error::new(
                LOWBIT_ERROR_UNSUPPORTED,
                "StepContext steps host memory (config.device = LOWBIT_DEVICE_CPU); use lowbit::sys for CUDA".into(),
            ));
        }
        let mut ctx: lowbit_step_context_t = ptr::null_mut();
        check(unsafe { lowbit_step_context_create(&mut ctx, config) })?;
        Ok(StepContext {
            ctx,
            buffers: Vec::new(),
            records: Vec::new(),
        })
    }

    /// The raw handle (it stays owned by this context).
    pub fn as_raw(&self) -> lowbit_step_context_t {
        self.ctx
    }

    /// The message of the last failed call on this context.
    pub fn last_error(&self) -> String {
        c_string(unsafe { lowbit_step_context_last_error(self.ctx) })
    }

    fn check(&self, status: lowbit_status_t) -> Result<()> {
        if status == LOWBIT_SUCCESS {
            Ok(())
        } else {
            Err(Error::new(status, self.last_error()))
        }
    }

    /// One step over `params` (`lowbit_functional_step`): `hparams[g]` are
    /// group g's hyper-parameters, `count` the steps applied so far. A bad
    /// argument changes nothing. Returns whether the step was skipped (a
    /// non-finite gradient with skip_nonfinite).
    pub fn step(&mut self, params: &mut [Param<'_>], hparams: &[lowbit_hparams_t], count: Count<'_>) -> Result<bool> {
        if params.is_empty() || hparams.is_empty() || hparams.len() > i32::MAX as usize {
            return Err(Error::new(
                LOWBIT_ERROR_INVALID_ARGUMENT,
                format!(
                    "{} params and {} groups: at least one of each",
                    params.len(),
                    hparams.len()
                ),
            ));
        }
        self.buffers.clear();
        self.records.clear();
        for p in params.iter() {
            self.buffers.push(p.buffers);
            self.records.extend_from_slice(&p.record);
        }
        let mut args = std::mem::MaybeUninit::<lowbit_step_args_t>::zeroed();
        self.check(unsafe { lowbit_step_args_init_sized(args.as_mut_ptr(), size_of::<lowbit_step_args_t>()) })?;
        let mut args = unsafe { args.assume_init() };
        args.hparams = hparams.as_ptr();
        args.num_groups = hparams.len() as i32;
        args.records = self.records.as_ptr();
        match count {
            Count::Host(step) => args.step = step,
            Count::State(c) => {
                args.count = c as *const i32;
                args.count_out = c as *mut i32;
            }
            Count::Both(step, c) => {
                args.step = step;
                args.count = c as *const i32;
                args.count_out = c as *mut i32;
            }
        }
        let status = unsafe {
            lowbit_functional_step(
                self.ctx,
                self.buffers.as_ptr(),
                self.buffers.len() as i64,
                &args,
                ptr::null_mut(),
            )
        };
        self.check(status)?;
        self.last_step_skipped()
    }

    /// Whether the last step changed nothing (`lowbit_step_context_last_step_skipped`).
    pub fn last_step_skipped(&self) -> Result<bool> {
        let mut out = 0i32;
        self.check(unsafe { lowbit_step_context_last_step_skipped(self.ctx, &mut out) })?;
        Ok(out != 0)
    }
}

impl Drop for StepContext {
    fn drop(&mut self) {
        unsafe {
            lowbit_step_context_destroy(self.ctx);
        }
    }
}

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests {
    use super::*;

    // Every struct's size here is the size of the current release: the sized
    // inits accept only released sizes, and the last field of each lands
    // where the library writes it.
    #[test]
    fn struct_sizes_are_released_sizes() {
        unsafe {
            let mut h = std::mem::zeroed::<lowbit_hparams_t>();
            assert_eq!(
                lowbit_hparams_init_sized(&mut h, size_of::<lowbit_hparams_t>(), LOWBIT_ALGORITHM_ADAMW),
                0
            );
            assert_eq!(h.struct_size, size_of::<lowbit_hparams_t>());
            assert_eq!(
                (h.lr, h.beta1, h.beta2, h.eps, h.weight_decay),
                (1e-3, 0.9, 0.999, 1e-8, 0.01)
            );
            assert_eq!(h.bias_correction, 1);
            // the 0.8 fields land where the library writes them
            let mut r = std::mem::zeroed::<lowbit_hparams_t>();
            assert_eq!(
                lowbit_hparams_init_sized(&mut r, size_of::<lowbit_hparams_t>(), LOWBIT_ALGORITHM_RMSPROP),
                0
            );
            assert_eq!((r.lr, r.alpha, r.centered, r.lr_decay), (1e-2, 0.99, 0, 0.0));

            let mut c = std::mem::zeroed::<lowbit_optimizer_config_t>();
            let n = size_of::<lowbit_optimizer_config_t>();
            assert_eq!(
                lowbit_optimizer_config_preset_sized(&mut c, n, LOWBIT_PRESET_LPMM_ADAMW_4BIT),
                0
            );
            assert_eq!(c.struct_size, n);
            assert_eq!(
                (c.algorithm, c.device, c.min_quantized_numel, c.skip_nonfinite),
                (1, 1, 4096, 1)
            );
            assert_eq!(
                (c.state_format, c.second_normalization),
                (LOWBIT_STATE_4BIT, LOWBIT_NORMALIZATION_RANK1)
            );

            let mut p = std::mem::zeroed::<lowbit_param_config_t>();
            assert_eq!(
                lowbit_param_config_init_sized(&mut p, size_of::<lowbit_param_config_t>()),
                0
            );
            assert_eq!(
                (p.struct_size, p.stochastic_rounding, p.error_correction),
                (size_of::<lowbit_param_config_t>(), -1, -1)
            );

            let mut s = std::mem::zeroed::<lowbit_state_plan_t>();
            assert_eq!(
                lowbit_state_plan_init_sized(&mut s, size_of::<lowbit_state_plan_t>()),
                0
            );
            let mut b = std::mem::zeroed::<lowbit_param_buffers_t>();
            assert_eq!(
                lowbit_param_buffers_init_sized(&mut b, size_of::<lowbit_param_buffers_t>()),
                0
            );
            assert_eq!(b.struct_size, size_of::<lowbit_param_buffers_t>());
            let mut a = std::mem::zeroed::<lowbit_step_args_t>();
            assert_eq!(lowbit_step_args_init_sized(&mut a, size_of::<lowbit_step_args_t>()), 0);
            assert_eq!((a.struct_size, a.step), (size_of::<lowbit_step_args_t>(), -1));

            // A size the library never shipped is refused (and named).
            assert_eq!(
                lowbit_step_args_init_sized(&mut a, size_of::<lowbit_step_args_t>() + 8),
                LOWBIT_ERROR_INVALID_ARGUMENT
            );
            assert!(c_string(lowbit_last_error()).contains("args"));
        }
    }

    // The plan's last field (normalization, since 0.3) is filled: the Rust
    // plan is the current struct, not the 0.2 one.
    #[test]
    fn plan_fills_the_whole_struct() {
        let mut cfg = optimizer_config(LOWBIT_ALGORITHM_ADAMW).unwrap();
        cfg.state_format = LOWBIT_STATE_8BIT;
        cfg.min_quantized_numel = 0;
        let hp = hparams(LOWBIT_ALGORITHM_ADAMW).unwrap();
        let pc = with_shape(param_config(300, LOWBIT_DTYPE_FLOAT32).unwrap(), &[3, 100]).unwrap();
        let plan = plan_param_state(&cfg, &hp, &pc).unwrap();
        assert_eq!(plan.num_moments, 2);
        assert_eq!(plan.format, [LOWBIT_STATE_8BIT, LOWBIT_STATE_8BIT]);
        assert_eq!(
            plan.normalization,
            [LOWBIT_NORMALIZATION_BLOCK, LOWBIT_NORMALIZATION_BLOCK]
        );
        assert_eq!(plan.data_bytes, [300, 300]);
        assert_eq!(plan.scale_count, [2, 2]);
        assert_eq!(plan.state_bytes, 600 + 16);
        assert_eq!(state_format_name(plan.format[0]), "8bit");
    }

    #[test]
    fn steps_and_errors() {
        let mut cfg = optimizer_config(LOWBIT_ALGORITHM_ADAMW).unwrap();
        cfg.state_format = LOWBIT_STATE_8BIT;
        cfg.min_quantized_numel = 0;
        let mut hp = hparams(LOWBIT_ALGORITHM_ADAMW).unwrap();
        hp.lr = 0.1;
        hparams_check(&hp, LOWBIT_ALGORITHM_ADAMW).unwrap();
        let pc = param_config(300, LOWBIT_DTYPE_FLOAT32).unwrap();
        let mut state = ParamState::new(&cfg, &hp, &pc).unwrap();
        let mut ctx = StepContext::new(&cfg).unwrap();
        let mut w = vec![1.0f32; 300];
        let g = vec![0.5f32; 300];
        let mut count = 0i32;
        for t in 0..3 {
            let mut params = [Param::new(&mut w[..], &g[..], &mut state, 0).unwrap()];
            assert!(!ctx.step(&mut params, &[hp], Count::Both(t, &mut count)).unwrap());
        }
        assert_eq!(count, 3);
        assert!(w.iter().all(|&x| x < 1.0));
        let m = state.decode_moment(0).unwrap();
        assert!(m.iter().all(|&x| x > 0.0));

        // The host count disagrees with the state's: refused, nothing changes.
        let before = w.clone();
        let mut params = [Param::new(&mut w[..], &g[..], &mut state, 0).unwrap()];
        let e = ctx.step(&mut params, &[hp], Count::Both(7, &mut count)).unwrap_err();
        assert_eq!(e.status, LOWBIT_ERROR_STATE_MISMATCH);
        assert!(e.message.contains("count"), "{}", e);
        assert_eq!((w, count), (before, 3));

        // A bad hyper-parameter: refused with a message.
        hp.beta1 = 1.5;
        assert_eq!(
            hparams_check(&hp, LOWBIT_ALGORITHM_ADAMW).unwrap_err().status,
            LOWBIT_ERROR_INVALID_ARGUMENT
        );

        // A state planned for another size.
        let mut small = [0f32; 10];
        let gs = [0f32; 10];
        assert!(Param::new(&mut small[..], &gs[..], &mut state, 0).is_err());
        let mut wrong_cfg = cfg;
        wrong_cfg.device = LOWBIT_DEVICE_CUDA;
        assert_eq!(
            StepContext::new(&wrong_cfg).err().unwrap().status,
            LOWBIT_ERROR_UNSUPPORTED
        );
    }

    // Issue 45 (11): sizes the process cannot allocate and a moment index out
    // of range are errors, not an abort or a panic.
    #[test]
    fn huge_sizes_and_bad_moments_are_errors() {
        let mut cfg = optimizer_config(LOWBIT_ALGORITHM_ADAMW).unwrap();
        cfg.state_format = LOWBIT_STATE_8BIT;
        cfg.min_quantized_numel = 0;
        let hp = hparams(LOWBIT_ALGORITHM_ADAMW).unwrap();
        let pc = param_config(300, LOWBIT_DTYPE_FLOAT32).unwrap();
        let plan = plan_param_state(&cfg, &hp, &pc).unwrap();
        let shape = [0i64; LOWBIT_MAX_DIMS];
        for (field, value) in [(0, 1i64 << 62), (0, i64::MAX), (1, i64::MAX - 3), (2, 1i64 << 61)] {
            let mut huge = plan;
            match field {
                0 => huge.data_bytes[0] = value,
                1 => huge.scale_count[1] = value,
                _ => huge.ecc_bytes = value,
            }
            let e = ParamState::from_plan(huge, 300, LOWBIT_DTYPE_FLOAT32, 0, &shape).unwrap_err();
            assert_eq!(e.status, LOWBIT_ERROR_OUT_OF_MEMORY, "{}", e);
            assert!(e.message.contains("could not be allocated"), "{}", e);
        }
        // a numel the plan was not made for: decode_moment refuses it
        for numel in [i64::MAX / 2, 1i64 << 40, 301] {
            let state = ParamState::from_plan(plan, numel, LOWBIT_DTYPE_FLOAT32, 0, &shape).unwrap();
            let e = state.decode_moment(0).unwrap_err();
            assert!(
                e.status == LOWBIT_ERROR_OUT_OF_MEMORY || e.status == LOWBIT_ERROR_INVALID_ARGUMENT,
                "numel {}: {}",
                numel,
                e
            );
        }
        let state = ParamState::from_plan(plan, 300, LOWBIT_DTYPE_FLOAT32, 0, &shape).unwrap();
        for m in [2usize, 3, usize::MAX] {
            let e = state.decode_moment(m).unwrap_err();
            assert_eq!(e.status, LOWBIT_ERROR_INVALID_ARGUMENT);
            assert!(e.message.contains("moments 0 and 1"), "{}", e);
        }
        assert_eq!(state.decode_moment(1).unwrap(), vec![0f32; 300]);
    }

    #[test]
    fn frozen_param_is_left_alone() {
        let cfg = optimizer_config(LOWBIT_ALGORITHM_ADAMW).unwrap();
        let hp = hparams(LOWBIT_ALGORITHM_ADAMW).unwrap();
        let pc = param_config(4, LOWBIT_DTYPE_FLOAT32).unwrap();
        let mut s0 = ParamState::new(&cfg, &hp, &pc).unwrap();
        let mut s1 = ParamState::new(&cfg, &hp, &pc).unwrap();
        let mut ctx = StepContext::new(&cfg).unwrap();
        let (mut a, mut b) = ([1.0f32; 4], [1.0f32; 4]);
        let g = [0.5f32; 4];
        let mut params = [
            Param::new(&mut a[..], &g[..], &mut s0, 0).unwrap(),
            Param::frozen(&mut b[..], &mut s1, 0).unwrap(),
        ];
        assert!(!ctx.step(&mut params, &[hp], Count::Host(0)).unwrap());
        assert!(a.iter().all(|&x| x < 1.0));
        assert_eq!(b, [1.0f32; 4]);
        assert!(s1.decode_moment(0).unwrap().iter().all(|&x| x == 0.0));
    }

    #[test]
    fn nonfinite_gradient_skips() {
        let cfg = optimizer_config(LOWBIT_ALGORITHM_ADAMW).unwrap();
        let hp = hparams(LOWBIT_ALGORITHM_ADAMW).unwrap();
        let pc = param_config(4, LOWBIT_DTYPE_FLOAT32).unwrap();
        let mut state = ParamState::new(&cfg, &hp, &pc).unwrap();
        let mut ctx = StepContext::new(&cfg).unwrap();
        let mut w = [1.0f32; 4];
        let g = [0.1f32, f32::NAN, 0.0, 0.0];
        let mut count = 0i32;
        let mut params = [Param::new(&mut w[..], &g[..], &mut state, 0).unwrap()];
        assert!(ctx.step(&mut params, &[hp], Count::State(&mut count)).unwrap());
        assert_eq!((w, count), ([1.0f32; 4], 0));
    }
}

//! train_linear: examples/train_linear_functional.c in Rust, operation for
//! operation: the same data (the same xorshift64* generator), the same
//! initial weights, AdamW with the weight's 8-bit state and the bias's fp32
//! state, the same 50 full-batch steps through lowbit's functional step. It
//! prints the same `final-bits <hex>` line (a 64-bit FNV-1a hash of the final
//! params and state buffers): bindings/rust/run_test.sh compares the two.
//!
//! Exits non-zero if a call fails or the loss did not go down by 10x.

use lowbit::sys::*;
use lowbit::{Count, Param, ParamState, StepContext};
use std::process::exit;

const N: usize = 512; // samples
const D: usize = 64; // features
const STEPS: i64 = 50;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [-1, 1): the top 24 bits, exactly representable as floats.
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 * (2.0f32 / 16777216.0) - 1.0
    }
}

struct Data {
    x: Vec<f32>, // N x D, row-major
    y: Vec<f32>,
}

/// The data and the initial weight.
fn make_data() -> (Data, Vec<f32>) {
    let mut rng = Rng(0x243F6A8885A308D3);
    let mut w_true = [0f32; D];
    for (j, w) in w_true.iter_mut().enumerate() {
        *w = (((j * 37) % 17) as i32 - 8) as f32 / 16.0;
    }
    let b_true = 0.75f32;
    let mut x = vec![0f32; N * D];
    let mut y = vec![0f32; N];
    for i in 0..N {
        for j in 0..D {
            x[i * D + j] = rng.uniform();
        }
        let mut v = b_true;
        for j in 0..D {
            v += x[i * D + j] * w_true[j];
        }
        y[i] = v + 0.01f32 * rng.uniform();
    }
    let mut w = vec![0f32; D];
    for v in w.iter_mut() {
        *v = 0.1f32 * rng.uniform();
    }
    (Data { x, y }, w)
}

/// The loss at (w, b); with grads, also writes them.
fn loss_and_grads(d: &Data, w: &[f32], b: &[f32; 1], grads: Option<(&mut [f32], &mut [f32; 1])>) -> f64 {
    let mut loss = 0.0f64;
    let mut grads = grads;
    if let Some((gw, gb)) = grads.as_mut() {
        for v in gw.iter_mut() {
            *v = 0.0;
        }
        gb[0] = 0.0;
    }
    for i in 0..N {
        let row = &d.x[i * D..(i + 1) * D];
        let mut pred = b[0];
        for j in 0..D {
            pred += row[j] * w[j];
        }
        let r = pred - d.y[i];
        loss += r as f64 * r as f64;
        if let Some((gw, gb)) = grads.as_mut() {
            for j in 0..D {
                gw[j] += r * row[j];
            }
            gb[0] += r;
        }
    }
    if let Some((gw, gb)) = grads.as_mut() {
        for v in gw.iter_mut() {
            *v *= 1.0f32 / N as f32;
        }
        gb[0] *= 1.0f32 / N as f32;
    }
    0.5 * loss / N as f64
}

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001B3);
    }
    h
}

fn floats_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_ne_bytes());
    }
    out
}

fn run() -> lowbit::Result<bool> {
    let (data, mut w) = make_data();
    let mut b = [0f32; 1];
    let mut gw = vec![0f32; D];
    let mut gb = [0f32; 1];

    // The optimizer: AdamW, 8-bit state for every param, however small.
    let mut cfg = lowbit::optimizer_config(LOWBIT_ALGORITHM_ADAMW)?;
    cfg.state_format = LOWBIT_STATE_8BIT;
    cfg.min_quantized_numel = 0;
    // Group 0: the weight; group 1: the bias, no weight decay.
    let mut hp0 = lowbit::hparams(LOWBIT_ALGORITHM_ADAMW)?;
    hp0.lr = 0.05;
    hp0.weight_decay = 0.01;
    let mut hp1 = hp0;
    hp1.weight_decay = 0.0;
    let hp = [hp0, hp1];
    for h in &hp {
        lowbit::hparams_check(h, LOWBIT_ALGORITHM_ADAMW)?;
    }

    // Plans: the weight a 1 x 64 matrix with the config's 8-bit state, the
    // bias fp32 state (a per-param override).
    let pc_w = lowbit::with_shape(lowbit::param_config(D as i64, LOWBIT_DTYPE_FLOAT32)?, &[1, D as i64])?;
    let mut state_w = ParamState::new(&cfg, &hp[0], &pc_w)?;
    let mut pc_b = lowbit::param_config(1, LOWBIT_DTYPE_FLOAT32)?;
    pc_b.group = 1;
    pc_b.state_format = LOWBIT_STATE_FP32;
    pc_b.second_state_format = LOWBIT_STATE_FP32;
    let mut state_b = ParamState::new(&cfg, &hp[1], &pc_b)?;
    for (name, s) in [("weight", &state_w), ("bias", &state_b)] {
        let p = s.plan();
        println!(
            "{}: state {} / {}, {} bytes",
            name,
            lowbit::state_format_name(p.format[0]),
            lowbit::state_format_name(p.format[1]),
            p.state_bytes
        );
    }

    let mut ctx = StepContext::new(&cfg)?;
    let mut count = 0i32; // the state's count of steps applied
    let loss0 = loss_and_grads(&data, &w, &b, None);
    println!("step {:3}  loss {:.6}", 0, loss0);
    for t in 0..STEPS {
        let loss = loss_and_grads(&data, &w, &b, Some((&mut gw, &mut gb)));
        if (t + 1) % 10 == 0 {
            println!("step {:3}  loss {:.6}", t + 1, loss);
        }
        let mut params = [
            Param::new(&mut w[..], &gw[..], &mut state_w, 0)?,
            Param::new(&mut b[..], &gb[..], &mut state_b, 1)?,
        ];
        // Steps applied so far, as a host value and as the state's count.
        if ctx.step(&mut params, &hp, Count::Both(t, &mut count))? {
            eprintln!("step {} was skipped", t);
            return Ok(false);
        }
    }
    let loss1 = loss_and_grads(&data, &w, &b, None);
    println!(
        "final loss {:.6} (from {:.6}, {:.1}x lower), count {}",
        loss1,
        loss0,
        loss0 / loss1,
        count
    );

    let mut h = 0xCBF29CE484222325u64;
    h = fnv1a(h, &floats_bytes(&w));
    h = fnv1a(h, &floats_bytes(&b));
    for s in [&state_w, &state_b] {
        for m in 0..2 {
            h = fnv1a(h, s.moment_bytes(m));
            h = fnv1a(h, s.scale_bytes(m));
        }
        h = fnv1a(h, s.ecc());
    }
    println!("final-bits {:016x}", h);

    let mut ok = true;
    if count as i64 != STEPS {
        eprintln!("the count is {} after {} steps", count, STEPS);
        ok = false;
    }
    if loss1.is_nan() || loss1 * 10.0 > loss0 {
        eprintln!("the loss went from {} to {}: not 10x lower", loss0, loss1);
        ok = false;
    }
    Ok(ok)
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => exit(1),
        Err(e) => {
            eprintln!("train_linear: {}", e);
            exit(1);
        }
    }
}

//! Issue 46 through the crate: the algorithms come from the library's
//! descriptors at run time (names, moment slots and kinds, hyper-parameters
//! by name), and RMSprop (plain, momentum, centred) and Adagrad (lr_decay,
//! weight decay, initial_accumulator_value) step as a float64 reference of
//! torch.optim's rules, written here from those rules, over 20 steps with
//! fp32 state (free-running) and 8-bit state (lockstep from the decoded
//! state). Inputs: a fixed-seed xorshift, so every run sees the same numbers.

use lowbit::sys::*;
use lowbit::*;

const N: usize = 3000; // > one 8-bit block of 256, not a multiple of it
const STEPS: usize = 20;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        // xorshift64*, then a uniform in (-1, 1)
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 11;
        2.0 * (x as f64 / (1u64 << 53) as f64) - 1.0
    }
    fn vec(&mut self, scale: f64) -> Vec<f32> {
        (0..N).map(|_| (scale * self.next()) as f32).collect()
    }
}

/// A case: the algorithm's name and its hyper-parameters by descriptor name.
fn cases() -> Vec<(&'static str, Vec<(&'static str, f64)>)> {
    vec![
        ("rmsprop", vec![("lr", 1e-2), ("alpha", 0.99), ("eps", 1e-8)]),
        (
            "rmsprop",
            vec![
                ("lr", 5e-3),
                ("alpha", 0.9),
                ("eps", 1e-6),
                ("weight_decay", 0.01),
                ("momentum", 0.9),
            ],
        ),
        (
            "rmsprop",
            vec![("lr", 5e-3), ("alpha", 0.95), ("eps", 1e-8), ("centered", 1.0)],
        ),
        (
            "adagrad",
            vec![
                ("lr", 5e-2),
                ("lr_decay", 1e-3),
                ("weight_decay", 0.01),
                ("initial_accumulator_value", 0.1),
                ("eps", 1e-10),
            ],
        ),
    ]
}

fn hp_of(values: &[(&str, f64)], name: &str, default: f64) -> f64 {
    // as the library holds it: float32
    values
        .iter()
        .find(|(k, _)| *k == name)
        .map(|&(_, v)| v as f32 as f64)
        .unwrap_or(default)
}

/// One float64 step numbered t (from 1) of torch.optim's rule, in place:
/// p, then the slots (RMSprop: square_avg, then momentum_buffer or grad_avg;
/// Adagrad: sum, which starts at initial_accumulator_value).
fn reference_step(name: &str, hp: &[(&str, f64)], t: usize, p: &mut [f64], g: &[f32], s0: &mut [f64], s1: &mut [f64]) {
    let lr = hp_of(hp, "lr", 0.0);
    let wd = hp_of(hp, "weight_decay", 0.0);
    let eps = hp_of(hp, "eps", 0.0);
    for i in 0..p.len() {
        let g = g[i] as f64 + wd * p[i];
        if name == "rmsprop" {
            let alpha = hp_of(hp, "alpha", 0.99);
            let momentum = hp_of(hp, "momentum", 0.0);
            let centered = hp_of(hp, "centered", 0.0) != 0.0;
            s0[i] = alpha * s0[i] + (1.0 - alpha) * g * g;
            let avg = if centered {
                s1[i] += (1.0 - alpha) * (g - s1[i]);
                (s0[i] - s1[i] * s1[i]).max(0.0).sqrt() + eps
            } else {
                s0[i].sqrt() + eps
            };
            if momentum > 0.0 {
                s1[i] = momentum * s1[i] + g / avg;
                p[i] -= lr * s1[i];
            } else {
                p[i] -= lr * g / avg;
            }
        } else {
            let start = if t == 1 {
                hp_of(hp, "initial_accumulator_value", 0.0)
            } else {
                s0[i]
            };
            s0[i] = start + g * g;
            let clr = lr / (1.0 + (t as f64 - 1.0) * hp_of(hp, "lr_decay", 0.0));
            p[i] -= clr * g / (s0[i].sqrt() + eps);
        }
    }
}

struct Run {
    spec: AlgorithmSpec,
    hp: lowbit_hparams_t,
    state: ParamState,
    ctx: StepContext,
    w: Vec<f32>,
    count: i32,
}

fn start(name: &str, values: &[(&str, f64)], format: lowbit_state_format_t, w: &[f32]) -> Run {
    let spec = algorithm_named(name).unwrap();
    let hp = spec.hparams_with(values).unwrap();
    let mut cfg = optimizer_config(spec.algorithm).unwrap();
    cfg.state_format = format;
    cfg.min_quantized_numel = 0;
    let state = ParamState::new(&cfg, &hp, &param_config(N as i64, LOWBIT_DTYPE_FLOAT32).unwrap()).unwrap();
    let ctx = StepContext::new(&cfg).unwrap();
    Run {
        spec,
        hp,
        state,
        ctx,
        w: w.to_vec(),
        count: 0,
    }
}

impl Run {
    fn step(&mut self, g: &[f32]) {
        let mut params = [Param::new(&mut self.w[..], g, &mut self.state, 0).unwrap()];
        assert!(!self
            .ctx
            .step(&mut params, &[self.hp], Count::State(&mut self.count))
            .unwrap());
    }
    fn moments(&self) -> Vec<Vec<f64>> {
        (0..self.state.plan().num_moments as usize)
            .map(|m| self.state.decode_moment(m).unwrap().iter().map(|&x| x as f64).collect())
            .collect()
    }
}

#[test]
fn algorithms_come_from_the_descriptors() {
    let all = algorithms().unwrap();
    let names: Vec<&str> = all.iter().map(|a| a.name).collect();
    for want in ["adamw", "adam", "lion", "sgd", "muon", "rmsprop", "adagrad"] {
        assert!(names.contains(&want), "{:?}", names);
    }
    let rms = algorithm_named("rmsprop").unwrap();
    assert_eq!(rms.algorithm, LOWBIT_ALGORITHM_RMSPROP);
    assert_eq!(rms.moment_kinds[0], LOWBIT_MOMENT_UNSIGNED);
    let hp_names: Vec<&str> = rms.hparams.iter().map(|h| h.name).collect();
    assert_eq!(hp_names, ["lr", "alpha", "eps", "weight_decay", "momentum", "centered"]); // torch's order
    let ada = algorithm_spec(LOWBIT_ALGORITHM_ADAGRAD).unwrap();
    assert_eq!(
        (ada.name, ada.moment_kinds.clone()),
        ("adagrad", vec![LOWBIT_MOMENT_UNSIGNED])
    );
    assert!(ada.hparam("initial_accumulator_value").unwrap().admits(0.1));
    assert!(!ada.hparam("lr_decay").unwrap().admits(-1.0));

    // The descriptor's offsets are the struct's fields.
    let mut h = rms.default_hparams().unwrap();
    assert_eq!((h.alpha, h.centered), (0.99, 0));
    rms.set(&mut h, "alpha", &[0.9]).unwrap();
    rms.set(&mut h, "centered", &[1.0]).unwrap();
    assert_eq!((h.alpha, h.centered), (0.9, 1));
    assert_eq!(rms.get(&h, "alpha").unwrap(), vec![0.9f32 as f64]);

    // Moment counts from the library.
    let count = |v: &[(&str, f64)]| rms.moments_in_use(&rms.hparams_with(v).unwrap()).unwrap();
    assert_eq!(
        (count(&[]), count(&[("momentum", 0.9)]), count(&[("centered", 1.0)])),
        (1, 2, 2)
    );
    assert_eq!(ada.moments_in_use(&ada.default_hparams().unwrap()).unwrap(), 1);

    // Bad input: an error naming it, never a panic.
    let e = rms.hparams_with(&[("centered", 1.0), ("momentum", 0.9)]).unwrap_err();
    assert_eq!(e.status, LOWBIT_ERROR_UNSUPPORTED, "{}", e);
    assert!(e.message.contains("three moments"), "{}", e);
    let e = rms.hparams_with(&[("alpha", 1.5)]).unwrap_err();
    assert_eq!(e.status, LOWBIT_ERROR_INVALID_ARGUMENT);
    assert!(e.message.contains("alpha"), "{}", e);
    let e = ada.hparams_with(&[("beta1", 0.9)]).unwrap_err();
    assert!(
        e.message
            .contains("'beta1' is not a hyper-parameter of adagrad (its: lr, lr_decay"),
        "{}",
        e
    );
    let e = rms.set(&mut h, "centered", &[0.5]).unwrap_err();
    assert!(e.message.contains("must be an integer"), "{}", e);
    let e = rms.set(&mut h, "alpha", &[0.9, 0.8]).unwrap_err();
    assert!(e.message.contains("takes 1 values, got 2"), "{}", e);
    let e = algorithm_named("adafactorz").unwrap_err();
    assert!(
        e.message.contains("no algorithm is called 'adafactorz'") && e.message.contains("rmsprop"),
        "{}",
        e
    );
    assert_eq!(algorithm_spec(42).unwrap_err().status, LOWBIT_ERROR_INVALID_ARGUMENT);
    assert_eq!(
        moments_in_use(42, &h).unwrap_err().status,
        LOWBIT_ERROR_INVALID_ARGUMENT
    );
}

#[test]
fn fp32_state_follows_the_float64_reference() {
    for (case, (name, values)) in cases().into_iter().enumerate() {
        let mut rng = Rng(0x9E3779B97F4A7C15 ^ case as u64);
        let w0 = rng.vec(0.5);
        let mut run = start(name, &values, LOWBIT_STATE_FP32, &w0);
        let mut p: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
        let (mut s0, mut s1) = (vec![0.0; N], vec![0.0; N]);
        for t in 1..=STEPS {
            let g = rng.vec(0.1);
            run.step(&g);
            reference_step(name, &values, t, &mut p, &g, &mut s0, &mut s1);
        }
        assert_eq!(run.count, STEPS as i32);
        // float32 roundings of a few units of 2^-24 per step, over 20 steps
        let size = p.iter().fold(0f64, |a, &x| a.max(x.abs()));
        let moved = p.iter().zip(&w0).fold(0f64, |a, (&x, &y)| a.max((x - y as f64).abs()));
        let err = run
            .w
            .iter()
            .zip(&p)
            .fold(0f64, |a, (&x, &y)| a.max((x as f64 - y).abs()));
        assert!(
            err <= 2e-6 * (size + moved),
            "{} {:?}: error {:e} (size {}, moved {})",
            name,
            values,
            err,
            size,
            moved
        );
        let m = run.moments();
        for i in 0..N {
            assert!(
                (m[0][i] - s0[i]).abs() <= 1e-5 * s0[i].abs() + 1e-12,
                "{} slot 0 [{}]",
                name,
                i
            );
        }
        assert_eq!(run.spec.moments_in_use(&run.hp).unwrap(), m.len());
    }
}

#[test]
fn eight_bit_state_steps_as_the_float64_reference() {
    for (case, (name, values)) in cases().into_iter().enumerate() {
        let mut rng = Rng(0xD1B54A32D192ED03 ^ case as u64);
        let w0 = rng.vec(0.5);
        let mut run = start(name, &values, LOWBIT_STATE_8BIT, &w0);
        assert_eq!(run.state.plan().format[0], LOWBIT_STATE_8BIT);
        for t in 1..=STEPS {
            let g = rng.vec(0.1);
            // the reference starts from lowbit's decoded state (lockstep)
            let old = run.moments();
            let mut p: Vec<f64> = run.w.iter().map(|&x| x as f64).collect();
            let before = p.clone();
            let mut s0 = old[0].clone();
            let mut s1 = if old.len() > 1 { old[1].clone() } else { vec![0.0; N] };
            reference_step(name, &values, t, &mut p, &g, &mut s0, &mut s1);
            run.step(&g);
            for i in 0..N {
                // float32 roundings of the result and of the step, plus the
                // library's rounding of the L2-decayed gradient g + wd p (two
                // roundings of its terms; it cancels where wd p ~ -g) through
                // the step's sensitivity to it, lr_t / denominator
                let lr_t = if name == "adagrad" {
                    hp_of(&values, "lr", 0.0) / (1.0 + (t as f64 - 1.0) * hp_of(&values, "lr_decay", 0.0))
                } else {
                    hp_of(&values, "lr", 0.0)
                };
                let centred = hp_of(&values, "centered", 0.0) != 0.0;
                let var = if centred {
                    (s0[i] - s1[i] * s1[i]).max(0.0)
                } else {
                    s0[i]
                };
                let denom = var.sqrt() + hp_of(&values, "eps", 0.0);
                let g_err =
                    2f64.powi(-22) * ((g[i] as f64).abs() + hp_of(&values, "weight_decay", 0.0) * before[i].abs());
                let tol = 4e-7 * (p[i].abs() + (p[i] - before[i]).abs()) + lr_t * g_err / denom + 1e-9;
                assert!(
                    (run.w[i] as f64 - p[i]).abs() <= tol,
                    "case {} {} t={} [{}]: {} vs {} (from {}, g {}, slot0 {} was {})",
                    case,
                    name,
                    t,
                    i,
                    run.w[i],
                    p[i],
                    before[i],
                    g[i],
                    s0[i],
                    old[0][i]
                );
            }
            // each stored slot is an 8-bit code of the reference's new moment:
            // within a small fraction of its block's absmax, and an unsigned
            // slot keeps a positive value positive (its floor, not code 0)
            let new = run.moments();
            for (m, want) in [s0, s1].iter().enumerate().take(new.len()) {
                for (b, block) in want.chunks(256).enumerate() {
                    let absmax = block.iter().fold(0f64, |a, &x| a.max(x.abs()));
                    for (k, &x) in block.iter().enumerate() {
                        let got = new[m][b * 256 + k];
                        assert!(
                            (got - x).abs() <= 0.02 * absmax,
                            "{} t={} slot {} [{}]: {} vs {}",
                            name,
                            t,
                            m,
                            b * 256 + k,
                            got,
                            x
                        );
                        if run.spec.moment_kinds[m] == LOWBIT_MOMENT_UNSIGNED && x > 0.0 {
                            assert!(
                                got > 0.0,
                                "{} t={} slot {} [{}]: {} encoded to 0",
                                name,
                                t,
                                m,
                                b * 256 + k,
                                x
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(run.count, STEPS as i32);
    }
}

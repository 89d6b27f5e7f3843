//! The example kernels (and a few language features) run on the CPU device against
//! plain-Rust references, on random inputs and ragged sizes, with poisoned outputs.

// Each example is included as a module; they share `examples/common`.
#![allow(clippy::duplicate_mod)]

#[path = "../../examples/layernorm.rs"]
#[allow(dead_code)]
mod layernorm;
#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera_tests::assert_close;

fn dev() -> Device {
    tessera_tests::compiled_cpu()
}

fn rand_vec(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

fn f64s<T: Copy>(v: &[T], f: impl Fn(T) -> f64) -> Vec<f64> {
    v.iter().map(|&x| f(x)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn vector_add_matches(n in 0usize..5000, seed in any::<u64>()) {
        let d = dev();
        let xs = rand_vec(seed, n, -100.0, 100.0);
        let ys = rand_vec(seed ^ 1, n, -100.0, 100.0);
        let x = d.upload(&xs).unwrap();
        let y = d.upload(&ys).unwrap();
        let mut out = d.upload(&vec![f32::NAN; n]).unwrap();
        vector_add::vector_add::<256>::launch(&d, n.div_ceil(256), (&x, &y, &mut out, n as i32)).unwrap();
        let got = out.download().unwrap();
        for i in 0..n {
            prop_assert_eq!(got[i].to_bits(), (xs[i] + ys[i]).to_bits(), "element {}", i);
        }
    }

    #[test]
    fn softmax_matches(rows in 1usize..40, cols in 1usize..=256, seed in any::<u64>()) {
        let d = dev();
        let xs = rand_vec(seed, rows * cols, -20.0, 20.0);
        let x = d.upload(&xs).unwrap();
        let mut out = d.upload(&vec![f32::NAN; rows * cols]).unwrap();
        softmax::softmax::<f32, 4, 256>::launch(&d, rows.div_ceil(4), (&x, &mut out, rows as i32, cols as i32)).unwrap();
        let want = softmax::reference(&xs, rows, cols);
        let got = f64s(&out.download().unwrap(), |v| v as f64);
        assert_close("softmax", &got, &want, |i| 1e-7 + 1e-5 * want[i]);
    }

    #[test]
    fn matmul_matches(m in 1usize..100, n in 1usize..100, k in 1usize..100, seed in any::<u64>()) {
        let d = dev();
        let a = rand_vec(seed, m * k, -1.0, 1.0);
        let b = rand_vec(seed ^ 7, k * n, -1.0, 1.0);
        let (want, mag) = matmul::reference(&f64s(&a, |v| v as f64), &f64s(&b, |v| v as f64), m, n, k);
        let da = d.upload(&a).unwrap();
        let db = d.upload(&b).unwrap();
        let mut dc = d.upload(&vec![f32::NAN; m * n]).unwrap();
        matmul::matmul::<f32, 16, 32, 16>::launch(&d, (m.div_ceil(16), n.div_ceil(32)), (&da, &db, &mut dc, m as i32, n as i32, k as i32)).unwrap();
        let got = f64s(&dc.download().unwrap(), |v| v as f64);
        let eps = f32::EPSILON as f64;
        assert_close("matmul f32", &got, &want, |i| mag[i] * k as f64 * eps + want[i].abs() * eps);

        // f16 inputs and output, f32 accumulation.
        let a16: Vec<f16> = a.iter().map(|&v| f16::from_f32(v)).collect();
        let b16: Vec<f16> = b.iter().map(|&v| f16::from_f32(v)).collect();
        let (want, mag) = matmul::reference(&f64s(&a16, |v| v.to_f64()), &f64s(&b16, |v| v.to_f64()), m, n, k);
        let da = d.upload(&a16).unwrap();
        let db = d.upload(&b16).unwrap();
        let mut dc = d.upload(&vec![f16::NAN; m * n]).unwrap();
        matmul::matmul::<f16, 64, 64, 32>::launch(&d, (m.div_ceil(64), n.div_ceil(64)), (&da, &db, &mut dc, m as i32, n as i32, k as i32)).unwrap();
        let got = f64s(&dc.download().unwrap(), |v| v.to_f64());
        assert_close("matmul f16", &got, &want, |i| 1e-7 + mag[i] * k as f64 * eps + want[i].abs() / 2048.0);
    }

    #[test]
    fn layernorm_matches(rows in 1usize..20, cols in 1usize..700, seed in any::<u64>()) {
        let d = dev();
        let xs = rand_vec(seed, rows * cols, -4.0, 6.0);
        let ws = rand_vec(seed ^ 3, cols, 0.5, 1.5);
        let bs = rand_vec(seed ^ 5, cols, -1.0, 1.0);
        let x = d.upload(&xs).unwrap();
        let w = d.upload(&ws).unwrap();
        let b = d.upload(&bs).unwrap();
        let mut y = d.upload(&vec![f32::NAN; rows * cols]).unwrap();
        let mut mean = d.upload(&vec![f32::NAN; rows]).unwrap();
        let mut rstd = d.upload(&vec![f32::NAN; rows]).unwrap();
        layernorm::layernorm::<f32, 128>::launch(&d, rows, (&x, &w, &b, &mut y, &mut mean, &mut rstd, cols as i32, 1e-5)).unwrap();
        let got = f64s(&y.download().unwrap(), |v| v as f64);
        let mut want = vec![0.0; rows * cols];
        for r in 0..rows {
            let row = &xs[r * cols..(r + 1) * cols];
            let mu = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
            let var = row.iter().map(|&v| (v as f64 - mu).powi(2)).sum::<f64>() / cols as f64;
            let rs = 1.0 / (var + 1e-5).sqrt();
            for c in 0..cols {
                want[r * cols + c] = (row[c] as f64 - mu) * rs * ws[c] as f64 + bs[c] as f64;
            }
        }
        assert_close("layernorm", &got, &want, |i| 1e-4 + 1e-5 * want[i].abs());
        prop_assert!(mean.download().unwrap().iter().all(|v| v.is_finite()));
        prop_assert!(rstd.download().unwrap().iter().all(|v| v.is_finite() && *v > 0.0));
    }
}

// ---------------------------------------------------------------------------------
// Language features: runtime and comptime control flow, carried values, reductions.

/// Per program: counts down a runtime `while`, sums with a runtime `for` whose bounds
/// come from arguments, branches at runtime, and unrolls a comptime loop over an
/// array of accumulators.
#[kernel]
fn control_flow<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32, limit: f32) {
    let lanes = arange::<B>();
    // Runtime for over the whole input, in tiles: column sums per lane.
    let mut acc = zeros::<f32, S1<B>>();
    for start in (0..n).step_by(B) {
        let offs = start + lanes;
        acc += x.load(offs, offs.lt(n));
    }
    // Comptime loop, unrolled: four partial accumulators.
    let mut parts = [zeros::<f32, S1<B>>(); 4];
    for j in 0..4usize {
        let offs = lanes * 4 + (j as i32);
        parts[j] = x.load(offs, offs.lt(n));
    }
    let four = parts[0] + parts[1] + parts[2] + parts[3];
    // Runtime if with values assigned in both branches.
    let total = acc.sum::<0>();
    let mut flag = zeros::<f32, ()>();
    if total.gt(limit) {
        flag = flag + 1.0;
    } else {
        flag = flag - 1.0;
    }
    // Runtime while with two carried values: halve until below 1.
    let mut v = total.maximum(1.0);
    let mut steps = zeros::<i32, ()>();
    while v.ge(1.0) {
        v = v * 0.5;
        steps += 1;
    }
    out.store_unmasked(lanes, acc);
    out.store_unmasked(lanes + B, four);
    out.store_unmasked(2 * B as i32, flag);
    out.store_unmasked(2 * B as i32 + 1, steps.cast::<f32>());
    out.store_unmasked(
        2 * B as i32 + 2,
        lanes.cumsum::<0>().max::<0>().cast::<f32>(),
    );
}

#[test]
fn control_flow_matches_reference() {
    const B: usize = 32;
    let d = dev();
    for (n, seed) in [(0usize, 1u64), (1, 2), (31, 3), (128, 4), (1000, 5)] {
        let mut r = StdRng::seed_from_u64(seed);
        let xs: Vec<f32> = (0..n).map(|_| r.gen_range(0.0..4.0)).collect();
        let limit = 100.0f32;
        let x = d.upload(&xs).unwrap();
        let mut out = d.upload(&vec![f32::NAN; 2 * B + 3]).unwrap();
        control_flow::<B>::launch(&d, 1u32, (&x, &mut out, n as i32, limit)).unwrap();
        let got = out.download().unwrap();
        let mut acc = [0.0f32; B];
        for start in (0..n).step_by(B) {
            for l in 0..B {
                if start + l < n {
                    acc[l] += xs[start + l];
                }
            }
        }
        let four: Vec<f32> = (0..B)
            .map(|l| {
                (0..4)
                    .map(|j| xs.get(l * 4 + j).copied().unwrap_or(0.0))
                    .sum()
            })
            .collect();
        let total: f32 = acc.iter().sum();
        let mut v = total.max(1.0);
        let mut steps = 0;
        while v >= 1.0 {
            v *= 0.5;
            steps += 1;
        }
        for l in 0..B {
            assert!((got[l] - acc[l]).abs() <= 1e-4, "n={n} acc[{l}]");
            assert!((got[B + l] - four[l]).abs() <= 1e-5, "n={n} four[{l}]");
        }
        assert!(
            (got[2 * B] - if total > limit { 1.0 } else { -1.0 }).abs() < 1e-6,
            "n={n} flag"
        );
        assert_eq!(got[2 * B + 1], steps as f32, "n={n} steps");
        assert_eq!(
            got[2 * B + 2],
            (0..B).sum::<usize>() as f32,
            "n={n} cumsum max"
        );
    }
}

/// A helper function called from a kernel: inlined by tracing, with its own runtime
/// `if`.
#[helper]
fn clamp_or_zero<const B: usize>(v: Tile<f32, S1<B>>, hi: Scalar<f32>) -> Tile<f32, S1<B>> {
    let mut r = v.minimum(hi);
    if hi.lt(0.0) {
        r = zeros::<f32, S1<B>>();
    }
    r
}

#[kernel]
fn use_helper<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, hi: f32) {
    let offs = arange::<B>();
    out.store_unmasked(offs, clamp_or_zero::<B>(x.load_unmasked(offs), hi));
}

#[test]
fn helpers_are_inlined() {
    let d = dev();
    let xs = rand_vec(9, 64, -5.0, 5.0);
    let x = d.upload(&xs).unwrap();
    for hi in [2.0f32, -1.0] {
        let mut out = d.upload(&vec![f32::NAN; 64]).unwrap();
        use_helper::<64>::launch(&d, 1u32, (&x, &mut out, hi)).unwrap();
        let got = out.download().unwrap();
        for i in 0..64 {
            let want = if hi < 0.0 { 0.0 } else { xs[i].min(hi) };
            assert_eq!(got[i], want, "hi={hi} [{i}]");
        }
    }
}

/// Comptime parameters select code at build time and are part of the cache key.
#[kernel]
fn scale<const B: usize>(
    x: &Global<f32>,
    out: &mut Global<f32>,
    #[comptime] factor: f32,
    #[comptime] negate: bool,
) {
    let offs = arange::<B>();
    let mut v = x.load_unmasked(offs) * factor;
    if negate {
        v = -v;
    }
    out.store_unmasked(offs, v);
}

#[test]
fn comptime_params_specialize() {
    let d = dev();
    let xs = rand_vec(11, 16, -5.0, 5.0);
    let x = d.upload(&xs).unwrap();
    for (factor, negate) in [(2.0f32, false), (3.0, true), (2.0, true)] {
        let mut out = d.upload(&[f32::NAN; 16]).unwrap();
        scale::<16>::launch(&d, 1u32, (&x, &mut out, factor, negate)).unwrap();
        let got = out.download().unwrap();
        for i in 0..16 {
            let w = xs[i] * factor;
            assert_eq!(got[i], if negate { -w } else { w });
        }
    }
    let a = tessera::kernel_ir::<scale<16>>(&(2.0, false)).unwrap();
    let b = tessera::kernel_ir::<scale<16>>(&(2.0, true)).unwrap();
    assert_ne!(
        a.num_ops(),
        b.num_ops(),
        "the comptime branch is specialized away"
    );
}

//! The compiled CPU device (`Device::cpu()` with the `jit` feature): what it compiles
//! and what it leaves to the interpreter, its vector paths on ragged tiles, and the
//! interpreter's diagnostics (out-of-bounds accesses, division by zero) reproduced
//! with the user's line. The cross-backend suite compares it with the interpreter on
//! every example kernel.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::codegen::cpu::{self, CpuError};
use tessera::ir::interp::{HostBuffer, KernelArg, Scalar};
use tessera::prelude::*;
use tessera_tests::line_of;

const SOURCE: &str = include_str!("cpu_device.rs");

/// A 2-D tile: rows of `C` columns at a runtime stride, masked on both sides.
#[kernel]
fn scale_rows<const R: usize, const C: usize>(
    x: &Global<f32>,
    out: &mut Global<f32>,
    rows: i32,
    cols: i32,
    stride: i32,
) {
    let r = (program_id(0) * R + arange::<R>()).expand_dims::<1>();
    let c = (program_id(1) * C + arange::<C>()).expand_dims::<0>();
    let mask = r.lt(rows) & c.lt(cols);
    let v = x.load_or(r * stride + c, mask, -1.0);
    out.store(r * stride + c, v * 2.0 + r.cast::<f32>(), mask);
}

/// An atomic histogram: the compiled device leaves atomics to the interpreter.
#[kernel]
fn histogram<const B: usize>(keys: &Global<i32>, bins: &mut Global<i32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.lt(n);
    let k = keys.load(offs, mask);
    bins.atomic_add(k, full::<i32, S1<B>>(1), mask); // ATOMIC_ADD
}

/// Reads one element past the end of `x` in the last program.
#[kernel]
fn off_by_one<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let v = x.load(offs + 1, offs.lt(n)); // OFF_BY_ONE
    out.store(offs, v, offs.lt(n));
}

fn ir<K: Kernel<Comptime = ()>>() -> Arc<tessera::ir::Function> {
    tessera::kernel_ir::<K>(&()).expect("kernel builds")
}

#[test]
fn ragged_2d_tiles_match_the_interpreter_on_every_path() {
    let mut rng = StdRng::seed_from_u64(7);
    // Column counts: whole 16-lane runs (vector path), ragged ones, and a stride
    // wider than the row.
    for (rows, cols, stride) in [
        (37usize, 64usize, 64usize),
        (37, 61, 61),
        (5, 70, 83),
        (64, 16, 16),
    ] {
        let xs: Vec<f32> = (0..rows * stride)
            .map(|_| rng.gen_range(-4.0f32..4.0))
            .collect();
        let grid = (rows.div_ceil(8) as u32, cols.div_ceil(32) as u32);
        let mut got = Vec::new();
        for dev in [tessera_tests::compiled_cpu(), Device::interp()] {
            let x = dev.upload(&xs).unwrap();
            let mut out = dev.upload(&vec![f32::NAN; rows * stride]).unwrap();
            scale_rows::<8, 32>::launch(
                &dev,
                grid,
                (&x, &mut out, rows as i32, cols as i32, stride as i32),
            )
            .unwrap_or_else(|e| panic!("{dev}: {e}"));
            got.push(out.download().unwrap());
        }
        for (i, (a, b)) in got[0].iter().zip(&got[1]).enumerate() {
            assert!(
                a.to_bits() == b.to_bits(),
                "{rows}x{cols} stride {stride}: element {i}: compiled {a}, interpreter {b}"
            );
        }
        // Every element inside the matrix was written, the rest left poisoned.
        for r in 0..rows {
            for c in 0..stride {
                let v = got[0][r * stride + c];
                assert_eq!(c < cols, !v.is_nan(), "({r}, {c}) = {v}");
            }
        }
    }
}

#[test]
fn kernels_it_does_not_compile_run_on_the_interpreter() {
    let f = ir::<histogram<64>>();
    let keys: Vec<i32> = (0..1000).map(|i| (i * 7919) % 37).collect();
    let args = vec![
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&keys))),
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&[0i32; 37]))),
        KernelArg::Scalar(Scalar::I32(1000)),
    ];
    let e = cpu::launch(&f, [16, 1, 1], &args, true).expect_err("atomics are not compiled");
    let CpuError::Unsupported { span, message, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!(span.line, line_of(SOURCE, "ATOMIC_ADD"), "{e}");
    assert!(message.contains("atomic_rmw"), "{e}");
    // Nothing ran.
    let KernelArg::Buffer(bins) = &args[1] else {
        unreachable!()
    };
    assert_eq!(bins.to_vec::<i32>().unwrap(), vec![0; 37]);
    // The CPU device runs it on the interpreter instead.
    let dev = Device::cpu();
    let k = dev.upload(&keys).unwrap();
    let mut b = dev.upload(&[0i32; 37]).unwrap();
    histogram::<64>::launch(&dev, 16u32, (&k, &mut b, 1000)).unwrap();
    let mut want = [0i32; 37];
    for &k in &keys {
        want[k as usize] += 1;
    }
    assert_eq!(b.download().unwrap(), want);
}

#[test]
fn out_of_bounds_accesses_are_reported_as_the_interpreter_reports_them() {
    let f = ir::<off_by_one<16>>();
    let n = 40;
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let args = vec![
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xs))),
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&vec![0f32; n]))),
        KernelArg::Scalar(Scalar::I32(n as i32)),
    ];
    let got = cpu::launch(&f, [3, 1, 1], &args, true)
        .expect_err("sanitized")
        .to_string();
    let want = tessera::ir::interp::run(
        &f,
        [3, 1, 1],
        &[
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xs))),
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&vec![0f32; n]))),
            KernelArg::Scalar(Scalar::I32(n as i32)),
        ],
    )
    .expect_err("the interpreter reports it")
    .to_string();
    assert_eq!(got, want);
    let line = format!(":{}:", line_of(SOURCE, "OFF_BY_ONE"));
    assert!(
        want.contains(&line) && want.contains("index 40 of buffer `x` (len 40)"),
        "{want}"
    );
}

#[test]
fn the_interpreter_is_a_device_of_its_own_name() {
    let d = Device::by_name("interp").unwrap();
    assert_eq!(d.id(), "interp");
    assert_eq!(d, Device::cpu(), "the interpreter shares the CPU's memory");
    assert!(d.name().contains("reference interpreter"), "{}", d.name());
    assert!(
        Device::cpu().name().contains("compiled"),
        "{}",
        Device::cpu().name()
    );
}

/// Two tiles carried through a runtime loop, each step's values fused elementwise
/// expressions of both old ones (a rotation) or the old ones swapped: every carried
/// value is read before either is written. The masked load's `other` is computed
/// from the lane index.
#[kernel]
fn rotate<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32, steps: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let mut a = x.load(offs, m);
    let mut b = x.load_or(offs + 1, (offs + 1).lt(n), offs.cast::<f32>() * 0.5 - 3.0);
    for _ in 0..steps {
        let na = b * 0.75 + a * 0.25;
        let nb = a - b * 0.5;
        a = na;
        b = nb;
        let t = a;
        a = b;
        b = t;
    }
    out.store(offs, a, m);
    out.store(offs + n, b, m);
}

#[test]
fn carried_tiles_updated_from_each_other_match_the_interpreter() {
    let mut rng = StdRng::seed_from_u64(11);
    for (n, steps) in [(100usize, 0i32), (100, 1), (77, 6), (256, 5)] {
        let xs: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
        let mut got = Vec::new();
        for dev in [tessera_tests::compiled_cpu(), Device::interp()] {
            let x = dev.upload(&xs).unwrap();
            let mut out = dev.upload(&vec![f32::NAN; 2 * n]).unwrap();
            rotate::<32>::launch(&dev, n.div_ceil(32) as u32, (&x, &mut out, n as i32, steps))
                .unwrap_or_else(|e| panic!("{dev}: {e}"));
            got.push(out.download().unwrap());
        }
        // The reference, in f32 as the kernel computes it.
        let mut want = vec![0.0f32; 2 * n];
        for i in 0..n {
            let mut a = xs[i];
            let mut b = if i + 1 < n {
                xs[i + 1]
            } else {
                i as f32 * 0.5 - 3.0
            };
            for _ in 0..steps {
                let (na, nb) = (b * 0.75 + a * 0.25, a - b * 0.5);
                (a, b) = (nb, na);
            }
            (want[i], want[n + i]) = (a, b);
        }
        for (i, w) in want.iter().enumerate() {
            for (k, g) in got.iter().enumerate() {
                let d = ["compiled", "interpreter"][k];
                assert!(
                    g[i].to_bits() == w.to_bits(),
                    "n {n}, steps {steps}: element {i}: {d} {}, want {w}",
                    g[i]
                );
            }
        }
    }
}

/// Shifts `x` right by one in place: the load must be read whole before the store
/// writes (the compiled device may not fuse a load into a store to its own buffer).
#[kernel]
fn shift_in_place<const B: usize>(x: &mut Global<f32>, n: i32) {
    let offs = arange::<B>();
    let v = x.load(offs, offs.lt(n));
    x.store(offs + 1, v * 2.0, (offs + 1).lt(n));
}

/// `out = x * 2 + y` where the loads of `x` and `y` are fused into the store.
#[kernel]
fn axpy<const B: usize>(x: &Global<f32>, y: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    out.store(offs, x.load(offs, m) * 2.0 + y.load_or(offs, m, 1.0), m);
}

#[test]
fn fused_loads_see_memory_as_a_whole_tile_load_would() {
    let mut rng = StdRng::seed_from_u64(5);
    // In place: the store lands where later lanes are loaded from.
    let n = 200usize;
    let xs: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    for sanitize in [true, false] {
        let f = ir::<shift_in_place<256>>();
        let buf = Arc::new(HostBuffer::from_slice(&xs));
        let args = vec![
            KernelArg::Buffer(Arc::clone(&buf)),
            KernelArg::Scalar(Scalar::I32(n as i32)),
        ];
        cpu::launch(&f, [1, 1, 1], &args, sanitize).unwrap();
        let got = buf.to_vec::<f32>().unwrap();
        assert_eq!(got[0], xs[0]);
        for i in 1..n {
            assert_eq!(got[i], xs[i - 1] * 2.0, "sanitize {sanitize}: element {i}");
        }
    }
    // Fused into the store, with and without the sanitizer; then with the output
    // aliasing an input, which the compiled device leaves to the interpreter.
    let n = 1000usize;
    let xs: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    let ys: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    let f = ir::<axpy<64>>();
    for sanitize in [true, false] {
        let out = Arc::new(HostBuffer::from_slice(&vec![f32::NAN; n]));
        let args = vec![
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xs))),
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&ys))),
            KernelArg::Buffer(Arc::clone(&out)),
            KernelArg::Scalar(Scalar::I32(n as i32)),
        ];
        cpu::launch(&f, [16, 1, 1], &args, sanitize).unwrap();
        let got = out.to_vec::<f32>().unwrap();
        for i in 0..n {
            assert_eq!(
                got[i],
                xs[i] * 2.0 + ys[i],
                "sanitize {sanitize}: element {i}"
            );
        }
    }
    let x = Arc::new(HostBuffer::from_slice(&xs));
    let args = vec![
        KernelArg::Buffer(Arc::clone(&x)),
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&ys))),
        KernelArg::Buffer(Arc::clone(&x)),
        KernelArg::Scalar(Scalar::I32(n as i32)),
    ];
    let e = cpu::launch(&f, [16, 1, 1], &args, false).expect_err("x and out overlap");
    assert!(
        matches!(&e, CpuError::Unsupported { message, .. } if message.contains("overlap")),
        "{e}"
    );
    assert_eq!(x.to_vec::<f32>().unwrap(), xs, "nothing ran");
}

/// `e^x` and `2^x` of every element.
#[kernel]
fn exps<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let v = x.load(offs, m);
    out.store(offs, v.exp(), m);
    out.store(offs + n, v.exp2(), m);
}

/// Distance in representable f32 values between two results of the same sign.
fn ulps(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() {
            0
        } else {
            u64::MAX
        };
    }
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
}

#[test]
fn exp_is_within_two_ulp_of_libm() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e30,
        -1e30,
        f32::MIN_POSITIVE,
        88.72,
        88.73,
        -87.33,
        -103.97,
        -104.0,
        127.99,
        128.0,
        -126.0,
        -149.0,
        -149.5,
        -150.0,
    ];
    // Random arguments over every range that matters: the whole finite result range
    // of both functions (subnormal results included), and near zero.
    for (lo, hi) in [
        (-1.0f32, 1.0),
        (-110.0, 90.0),
        (-160.0, 130.0),
        (-1e-3, 1e-3),
    ] {
        xs.extend((0..4096).map(|_| rng.gen_range(lo..hi)));
    }
    within_two_ulp(
        &ir::<exps<256>>(),
        &xs,
        [("exp", f32::exp), ("exp2", f32::exp2)],
    );
}

/// A function's name and the host's libm version of it.
type Libm = (&'static str, fn(f32) -> f32);

/// Runs `f` (a kernel writing two functions of each of `n` elements to `out[..n]` and
/// `out[n..]`) on the compiled CPU device, with the sanitizer and without, and checks
/// every result within 2 ulp of the host's libm (`want`).
fn within_two_ulp(f: &tessera::ir::Function, xs: &[f32], want: [Libm; 2]) {
    let n = xs.len();
    for sanitize in [true, false] {
        let out = Arc::new(HostBuffer::from_slice(&vec![f32::NAN; 2 * n]));
        let args = vec![
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(xs))),
            KernelArg::Buffer(Arc::clone(&out)),
            KernelArg::Scalar(Scalar::I32(n as i32)),
        ];
        cpu::launch(f, [n.div_ceil(256) as u32, 1, 1], &args, sanitize).unwrap();
        let got = out.to_vec::<f32>().unwrap();
        for (k, (name, libm)) in want.into_iter().enumerate() {
            let mut worst = 0;
            for (i, &x) in xs.iter().enumerate() {
                let (g, w) = (got[k * n + i], libm(x));
                let d = ulps(g, w);
                assert!(d <= 2, "{name}({x:e}) = {g:e}, libm {w:e} ({d} ulp)");
                worst = worst.max(d);
            }
            println!("worst {name}: {worst} ulp (sanitize {sanitize})");
        }
    }
}

/// `ln x` and `log2 x` of every element.
#[kernel]
fn logs<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let v = x.load(offs, m);
    out.store(offs, v.log(), m);
    out.store(offs + n, v.log2(), m);
}

#[test]
fn log_is_within_two_ulp_of_libm() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        2.0,
        0.5,
        std::f32::consts::E,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        1.0 + f32::EPSILON,
        1.0 - f32::EPSILON / 2.0,
        std::f32::consts::SQRT_2,
        std::f32::consts::FRAC_1_SQRT_2,
    ];
    // Random bit patterns of positive floats (every exponent, subnormals included),
    // and arguments near 1, where the result is small and its relative error counts.
    xs.extend((0..8192).map(|_| f32::from_bits(rng.gen_range(1u32..0x7f80_0000))));
    xs.extend((0..4096).map(|_| rng.gen_range(0.9f32..1.1)));
    xs.extend((0..1024).map(|_| rng.gen_range(0.999_999f32..1.000_001)));
    within_two_ulp(
        &ir::<logs<256>>(),
        &xs,
        [("ln", f32::ln), ("log2", f32::log2)],
    );
}

/// Sums, maxima and minima of each row of `R x C` tiles of three element types.
#[kernel]
fn row_reduce<const R: usize, const C: usize>(
    xf: &Global<f32>,
    xi: &Global<i32>,
    xu: &Global<u32>,
    of: &mut Global<f32>,
    oi: &mut Global<i32>,
    ou: &mut Global<u32>,
) {
    let rows = arange::<R>();
    let offs = rows.expand_dims::<1>() * C + arange::<C>().expand_dims::<0>();
    let f = xf.load_unmasked(offs);
    let i = xi.load_unmasked(offs);
    let u = xu.load_unmasked(offs);
    of.store_unmasked(rows, f.sum::<1>());
    of.store_unmasked(rows + R, f.max::<1>());
    of.store_unmasked(rows + 2 * R, f.min::<1>());
    oi.store_unmasked(rows, i.sum::<1>());
    oi.store_unmasked(rows + R, i.max::<1>());
    oi.store_unmasked(rows + 2 * R, i.min::<1>());
    ou.store_unmasked(rows, u.sum::<1>());
    ou.store_unmasked(rows + R, u.max::<1>());
    ou.store_unmasked(rows + 2 * R, u.min::<1>());
}

fn row_reduce_case<const C: usize>(seed: u64)
where
    row_reduce<8, C>: Kernel<Comptime = ()>,
{
    const R: usize = 8;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut xf: Vec<f32> = (0..R * C).map(|_| rng.gen_range(-8.0f32..8.0)).collect();
    // Row 1 holds a NaN (max and min propagate it), row 2 only signed zeros (the
    // maximum is +0, the minimum -0), row 3 infinities.
    xf[C + C / 2] = f32::NAN;
    for c in 0..C {
        xf[2 * C + c] = if c % 3 == 0 { 0.0 } else { -0.0 };
    }
    xf[3 * C] = f32::INFINITY;
    xf[3 * C + 1] = f32::NEG_INFINITY;
    let xi: Vec<i32> = (0..R * C).map(|_| rng.r#gen::<i32>()).collect();
    let xu: Vec<u32> = (0..R * C).map(|_| rng.r#gen::<u32>()).collect();
    let f = ir::<row_reduce<8, C>>();
    let run = |compiled: bool, sanitize: bool| {
        let bufs = [
            Arc::new(HostBuffer::from_slice(&[f32::NAN; 3 * R])),
            Arc::new(HostBuffer::from_slice(&[0x5a5a5a5ai32; 3 * R])),
            Arc::new(HostBuffer::from_slice(&[0x5a5a5a5au32; 3 * R])),
        ];
        let mut args = vec![
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xf))),
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xi))),
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xu))),
        ];
        args.extend(bufs.iter().map(|b| KernelArg::Buffer(Arc::clone(b))));
        if compiled {
            cpu::launch(&f, [1, 1, 1], &args, sanitize).unwrap();
        } else {
            tessera::ir::interp::run(&f, [1, 1, 1], &args).unwrap();
        }
        (
            bufs[0].to_vec::<f32>().unwrap(),
            bufs[1].to_vec::<i32>().unwrap(),
            bufs[2].to_vec::<u32>().unwrap(),
        )
    };
    let want = run(false, false);
    for sanitize in [true, false] {
        let got = run(true, sanitize);
        assert_eq!(got.1, want.1, "C {C}: i32 sums, maxima, minima");
        assert_eq!(got.2, want.2, "C {C}: u32 sums, maxima, minima");
        for k in 0..3 * R {
            let (g, w) = (got.0[k], want.0[k]);
            let ok = if k < R && w.is_finite() {
                (g - w).abs() <= 1e-5 * w.abs().max(1.0)
            } else {
                g.to_bits() == w.to_bits()
            };
            assert!(
                ok,
                "C {C}: f32 result {k}: compiled {g:e}, interpreter {w:e}"
            );
        }
    }
}

#[test]
fn row_reductions_by_vectors_match_the_interpreter() {
    // 16-lane runs, one 8-lane run, the scalar path, a long row.
    row_reduce_case::<64>(1);
    row_reduce_case::<8>(2);
    row_reduce_case::<4>(3);
    row_reduce_case::<1024>(4);
}

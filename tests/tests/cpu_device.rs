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
        for dev in [Device::cpu(), Device::interp()] {
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

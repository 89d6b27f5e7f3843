//! Throughput of the SIMT emulator on the example kernels (vector_add, matmul f16 on
//! the `mma`/MFMA path, matmul f32 on the FMA path), for both flavors.
//!
//! `cargo bench -p tessera-tests --bench emu` (add `--profile dev` for a quick run).
//! The first launch of each kernel includes its JIT compilation and is reported
//! separately.

#![allow(clippy::duplicate_mod)]

#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use std::sync::Arc;
use std::time::Instant;

use tessera::codegen::CompileOptions;
use tessera::codegen::emu;
use tessera::codegen::target::EmuFlavor;
use tessera::ir::interp::{HostBuffer, KernelArg, Scalar};
use tessera::prelude::*;

fn time(
    f: &tessera::ir::Function,
    flavor: EmuFlavor,
    grid: [u32; 3],
    args: &[KernelArg],
) -> (f64, f64) {
    let opts = CompileOptions::default();
    let t = Instant::now();
    emu::launch(f, flavor, &opts, grid, args).expect("first launch");
    let first = t.elapsed().as_secs_f64();
    let reps = 3;
    let t = Instant::now();
    for _ in 0..reps {
        emu::launch(f, flavor, &opts, grid, args).expect("launch");
    }
    (first, t.elapsed().as_secs_f64() / reps as f64)
}

fn buf<T: tessera::ir::interp::Element>(v: &[T]) -> KernelArg {
    KernelArg::Buffer(Arc::new(HostBuffer::from_slice(v)))
}

fn main() {
    let n = 1usize << 20;
    let f = tessera::kernel_ir::<vector_add::vector_add<1024>>(&()).expect("builds");
    let args = [
        buf(&vec![1.0f32; n]),
        buf(&vec![2.0f32; n]),
        buf(&vec![0.0f32; n]),
        KernelArg::Scalar(Scalar::I32(n as i32)),
    ];
    for flavor in [EmuFlavor::Nv, EmuFlavor::Amd] {
        let (first, t) = time(&f, flavor, [(n / 1024) as u32, 1, 1], &args);
        println!(
            "vector_add n={n} {flavor:?}: {:.1} ms/launch, {:.2} M elements/s (first launch incl. JIT {:.0} ms)",
            t * 1e3,
            n as f64 / t / 1e6,
            first * 1e3
        );
    }
    let s = 256usize;
    let a: Vec<f16> = (0..s * s)
        .map(|i| f16::from_f32((i % 7) as f32 * 0.25 - 0.75))
        .collect();
    let args = [
        buf(&a),
        buf(&a),
        buf(&vec![f16::ZERO; s * s]),
        KernelArg::Scalar(Scalar::I32(s as i32)),
        KernelArg::Scalar(Scalar::I32(s as i32)),
        KernelArg::Scalar(Scalar::I32(s as i32)),
    ];
    let f = tessera::kernel_ir::<matmul::matmul<f16, 64, 64, 32>>(&()).expect("builds");
    let grid = [(s / 64) as u32, (s / 64) as u32, 1];
    for flavor in [EmuFlavor::Nv, EmuFlavor::Amd] {
        let (first, t) = time(&f, flavor, grid, &args);
        println!(
            "matmul f16 (mma) {s}^3 {flavor:?}: {:.1} ms/launch, {:.3} GFLOP/s (first launch incl. JIT {:.0} ms)",
            t * 1e3,
            2.0 * (s * s * s) as f64 / t / 1e9,
            first * 1e3
        );
    }
    let a32: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
    let args = [
        buf(&a32),
        buf(&a32),
        buf(&vec![0.0f32; s * s]),
        KernelArg::Scalar(Scalar::I32(s as i32)),
        KernelArg::Scalar(Scalar::I32(s as i32)),
        KernelArg::Scalar(Scalar::I32(s as i32)),
    ];
    let f = tessera::kernel_ir::<matmul::matmul<f32, 64, 64, 32>>(&()).expect("builds");
    for flavor in [EmuFlavor::Nv, EmuFlavor::Amd] {
        let (first, t) = time(&f, flavor, grid, &args);
        println!(
            "matmul f32 (fma) {s}^3 {flavor:?}: {:.1} ms/launch, {:.3} GFLOP/s (first launch incl. JIT {:.0} ms)",
            t * 1e3,
            2.0 * (s * s * s) as f64 / t / 1e9,
            first * 1e3
        );
    }
}

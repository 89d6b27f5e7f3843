//! Throughput and capacity of the SIMT emulator, for both flavors, against the
//! targets of the emulator v2 issue:
//!
//! | case | target |
//! |---|---|
//! | vector_add f32, 1M elements | >= 20 M elements/s |
//! | matmul f16 256³ on the `mma.sync`/MFMA path (64x64x32 tiles, 4 warps) | <= 2 s per launch |
//! | matmul f32 256³ on the FMA path | (reported) |
//! | softmax f32 1024 x 1000 | (reported) |
//! | a waiting kernel of 8 ranks x 128 blocks x 256 threads | runs without error |
//! | all_reduce f32 of 1 MiB on 8 ranks | completes |
//!
//! `cargo bench -p tessera-tests --bench emu [-- FILTER]` (FILTER: a substring of the
//! case names: `vector_add`, `matmul`, `softmax`, `capacity`, `all_reduce`). The first
//! launch of each kernel includes its JIT compilation and is reported separately;
//! the figure is the median of 5 launches.

#![allow(clippy::duplicate_mod)]

#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use std::sync::Arc;
use std::time::Instant;

use tessera::EmuKind;
use tessera::bench::Bench;
use tessera::codegen::CompileOptions;
use tessera::codegen::emu;
use tessera::codegen::target::EmuFlavor;
use tessera::ir::interp::{HostBuffer, KernelArg, Scalar};
use tessera::prelude::*;

const FLAVORS: [EmuFlavor; 2] = [EmuFlavor::Nv, EmuFlavor::Amd];

/// (first launch, median of the next 5) in seconds.
fn time(
    f: &tessera::ir::Function,
    flavor: EmuFlavor,
    grid: [u32; 3],
    args: &[KernelArg],
) -> (f64, f64) {
    let opts = CompileOptions::default();
    // The first launch includes the JIT compilation: one run, timed on its own.
    let t = Instant::now();
    emu::launch(f, flavor, &opts, grid, args).expect("first launch");
    let first = t.elapsed().as_secs_f64();
    // The launches run on the host when called: timed on the CPU device's wall clock.
    let rest = Bench::new()
        .warmup(0)
        .reps(5)
        .run(&Device::cpu(), || {
            emu::launch(f, flavor, &opts, grid, args).map_err(|e| tessera::Error::Emu(Box::new(e)))
        })
        .expect("launch");
    (first, rest.median().as_secs_f64())
}

fn buf<T: tessera::ir::interp::Element>(v: &[T]) -> KernelArg {
    KernelArg::Buffer(Arc::new(HostBuffer::from_slice(v)))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "target met" } else { "TARGET MISSED" }
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let want = |name: &str| name.contains(&filter);
    println!(
        "emulator benchmark, {} worker threads",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    if want("vector_add") {
        let n = 1usize << 20;
        let f = tessera::kernel_ir::<vector_add::vector_add<1024>>(&()).expect("builds");
        let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5).collect();
        let args = [
            buf(&x),
            buf(&x),
            buf(&vec![f32::NAN; n]),
            KernelArg::Scalar(Scalar::I32(n as i32)),
        ];
        for flavor in FLAVORS {
            let (first, t) = time(&f, flavor, [(n / 1024) as u32, 1, 1], &args);
            let rate = n as f64 / t / 1e6;
            println!(
                "vector_add n={n} {flavor:?}: {:.2} ms/launch, {rate:.1} M elements/s (first launch incl. JIT {:.0} ms); target >= 20 M/s: {}",
                t * 1e3,
                first * 1e3,
                verdict(rate >= 20.0)
            );
        }
    }

    let s = 256usize;
    let a: Vec<f16> = (0..s * s)
        .map(|i| f16::from_f32((i % 7) as f32 * 0.25 - 0.75))
        .collect();
    let dims = || {
        [
            KernelArg::Scalar(Scalar::I32(s as i32)),
            KernelArg::Scalar(Scalar::I32(s as i32)),
            KernelArg::Scalar(Scalar::I32(s as i32)),
        ]
    };
    let grid = [(s / 64) as u32, (s / 64) as u32, 1];
    if want("matmul") {
        let [m, n, k] = dims();
        let args = [buf(&a), buf(&a), buf(&vec![f16::NAN; s * s]), m, n, k];
        let f = tessera::kernel_ir::<matmul::matmul<f16, 64, 64, 32>>(&()).expect("builds");
        for flavor in FLAVORS {
            let (first, t) = time(&f, flavor, grid, &args);
            println!(
                "matmul f16 (mma) {s}^3 {flavor:?}: {:.1} ms/launch, {:.3} GFLOP/s (first launch incl. JIT {:.0} ms); target <= 2 s: {}",
                t * 1e3,
                2.0 * (s * s * s) as f64 / t / 1e9,
                first * 1e3,
                verdict(t <= 2.0)
            );
        }
        let a32: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
        let [m, n, k] = dims();
        let args = [buf(&a32), buf(&a32), buf(&vec![f32::NAN; s * s]), m, n, k];
        let f = tessera::kernel_ir::<matmul::matmul<f32, 64, 64, 32>>(&()).expect("builds");
        for flavor in FLAVORS {
            let (first, t) = time(&f, flavor, grid, &args);
            println!(
                "matmul f32 (fma) {s}^3 {flavor:?}: {:.1} ms/launch, {:.3} GFLOP/s (first launch incl. JIT {:.0} ms)",
                t * 1e3,
                2.0 * (s * s * s) as f64 / t / 1e9,
                first * 1e3
            );
        }
    }

    if want("softmax") {
        let (rows, cols) = (1024usize, 1000usize);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 * 0.05 - 2.5)
            .collect();
        let f = tessera::kernel_ir::<softmax::softmax<f32, 4, 1024>>(&()).expect("builds");
        let args = [
            buf(&x),
            buf(&vec![f32::NAN; rows * cols]),
            KernelArg::Scalar(Scalar::I32(rows as i32)),
            KernelArg::Scalar(Scalar::I32(cols as i32)),
        ];
        for flavor in FLAVORS {
            let (first, t) = time(&f, flavor, [(rows / 4) as u32, 1, 1], &args);
            println!(
                "softmax f32 {rows}x{cols} {flavor:?}: {:.1} ms/launch, {:.1} M elements/s (first launch incl. JIT {:.0} ms)",
                t * 1e3,
                (rows * cols) as f64 / t / 1e6,
                first * 1e3
            );
        }
    }

    if want("capacity") {
        for flavor in FLAVORS {
            let r = tessera_tests::emu_world::ring_world(flavor, 8, 128);
            match r {
                Ok(t) => println!(
                    "capacity {flavor:?}: a waiting kernel of 8 ranks x 128 blocks x 256 threads (262144 GPU threads live) in {:.2} s; target runs without error: {}",
                    t.as_secs_f64(),
                    verdict(true)
                ),
                Err(e) => println!("capacity {flavor:?}: {e}; {}", verdict(false)),
            }
        }
    }

    if want("all_reduce") {
        let n = (1usize << 20) / 4;
        for kind in [EmuKind::Nv, EmuKind::Amd] {
            let dev = Device::emu(kind).expect("the emulator is always available");
            let t = Instant::now();
            let res = World::local(8).on(&dev).run(|r| {
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i + r.rank() as usize * 7) % 64) as f32)
                    .collect();
                let mut b = r.upload(&x)?;
                r.all_reduce(&mut b, ReduceOp::Sum)?;
                b.download()
            });
            let secs = t.elapsed().as_secs_f64();
            let ok = res.as_ref().is_ok_and(|outs| {
                outs.iter().all(|o| {
                    o.iter().enumerate().all(|(i, &v)| {
                        let want: usize = (0..8).map(|rk| (i + rk * 7) % 64).sum();
                        v == want as f32
                    })
                })
            });
            match res {
                Ok(_) => println!(
                    "all_reduce f32 1 MiB on 8 ranks, emu {kind:?}: {secs:.2} s incl. world setup and JIT, {}; target completes: {}",
                    if ok { "sums verified" } else { "WRONG SUMS" },
                    verdict(ok)
                ),
                Err(e) => println!("all_reduce emu {kind:?}: {e}; {}", verdict(false)),
            }
        }
    }
}

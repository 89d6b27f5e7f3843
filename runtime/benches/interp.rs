//! Throughput of the reference interpreter (the CPU device) against plain Rust baselines
//! measured in the same run. Prints a table; run with
//! `cargo bench -p tessera --bench interp`.
//!
//! - vector_add (f32, 4M elements): the interpreter vs a plain Rust loop.
//! - matmul (f32, 512³): the interpreter vs a naive triple loop and vs the
//!   `matrixmultiply` crate's sgemm.

// Each example is included as a module; they share `examples/common`.
#![allow(clippy::duplicate_mod)]

#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use std::hint::black_box;
use std::time::Duration;

use tessera::bench::Bench;
use tessera::prelude::*;

fn lcg(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::cpu();
    // Each figure: the median time of `reps` runs after one warm-up run (on the CPU
    // device, so the wall clock: the plain Rust baselines are timed the same way).
    let time = |reps| Bench::new().warmup(1).reps(reps);
    println!("# tessera interpreter benchmark on {dev}");
    println!();
    println!("| benchmark | implementation | time | throughput | ratio vs baseline |");
    println!("|---|---|---|---|---|");

    // vector_add
    let n = 1 << 22;
    let xs = lcg(n, 1);
    let ys = lcg(n, 2);
    let x = dev.upload(&xs)?;
    let y = dev.upload(&ys)?;
    let mut out = dev.alloc::<f32>(n)?;
    let mut plain = vec![0.0f32; n];
    let t_plain = time(21)
        .run(&dev, || {
            let (a, b) = (black_box(&xs), black_box(&ys));
            for i in 0..n {
                plain[i] = a[i] + b[i];
            }
            black_box(&plain);
            Ok(())
        })?
        .median();
    let t_va = time(21)
        .run(&dev, || {
            vector_add::vector_add::<1024>::launch(
                &dev,
                n.div_ceil(1024),
                (&x, &y, &mut out, n as i32),
            )
        })?
        .median();
    assert_eq!(out.download()?, plain, "results differ");
    let gbs = |t: Duration| 3.0 * 4.0 * n as f64 / t.as_secs_f64() / 1e9;
    let row = |b: &str, imp: &str, t: Duration, thr: String, base: Duration| {
        println!(
            "| {b} | {imp} | {:.3} ms | {thr} | {:.2}x |",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / base.as_secs_f64()
        )
    };
    row(
        "vector_add f32 n=4M",
        "plain Rust loop (baseline, 1 thread)",
        t_plain,
        format!("{:.1} GB/s", gbs(t_plain)),
        t_plain,
    );
    row(
        "vector_add f32 n=4M",
        "tessera interpreter (BLOCK=1024)",
        t_va,
        format!("{:.1} GB/s", gbs(t_va)),
        t_plain,
    );

    // matmul
    let (m, nn, k) = (512usize, 512usize, 512usize);
    let a = lcg(m * k, 3);
    let b = lcg(k * nn, 4);
    let flops = 2.0 * (m * nn * k) as f64;
    let gf = |t: Duration| format!("{:.2} GFLOP/s", flops / t.as_secs_f64() / 1e9);
    let mut c_naive = vec![0.0f32; m * nn];
    let t_naive = time(3)
        .run(&dev, || {
            let (a, b) = (black_box(&a), black_box(&b));
            for i in 0..m {
                for j in 0..nn {
                    let mut s = 0.0f32;
                    for p in 0..k {
                        s += a[i * k + p] * b[p * nn + j];
                    }
                    c_naive[i * nn + j] = s;
                }
            }
            black_box(&c_naive);
            Ok(())
        })?
        .median();
    let mut c_mm = vec![0.0f32; m * nn];
    let t_mm = time(11)
        .run(&dev, || {
            // SAFETY: the pointers and strides describe the row-major a (m x k),
            // b (k x n) and c (m x n) vectors above, which outlive the call.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    nn,
                    1.0,
                    a.as_ptr(),
                    k as isize,
                    1,
                    b.as_ptr(),
                    nn as isize,
                    1,
                    0.0,
                    c_mm.as_mut_ptr(),
                    nn as isize,
                    1,
                );
            }
            Ok(())
        })?
        .median();
    let da = dev.upload(&a)?;
    let db = dev.upload(&b)?;
    let mut dc = dev.alloc::<f32>(m * nn)?;
    let grid = (m.div_ceil(64), nn.div_ceil(64));
    let t_interp = time(5)
        .run(&dev, || {
            matmul::matmul::<f32, 64, 64, 32>::launch(
                &dev,
                grid,
                (&da, &db, &mut dc, m as i32, nn as i32, k as i32),
            )
        })?
        .median();
    let got = dc.download()?;
    let max_err = got
        .iter()
        .zip(&c_naive)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f32, f32::max);
    assert!(max_err < 1e-3, "matmul results differ by {max_err}");
    row(
        "matmul f32 512³",
        "naive triple loop (baseline, 1 thread)",
        t_naive,
        gf(t_naive),
        t_naive,
    );
    row(
        "matmul f32 512³",
        "matrixmultiply::sgemm (1 thread)",
        t_mm,
        gf(t_mm),
        t_naive,
    );
    row(
        "matmul f32 512³",
        "tessera interpreter (64x64x32 tiles)",
        t_interp,
        gf(t_interp),
        t_naive,
    );
    println!();
    println!(
        "ratios: vector_add interpreter/plain = {:.2}x time; matmul interpreter speed = {:.2}x naive, {:.2}x matrixmultiply",
        t_va.as_secs_f64() / t_plain.as_secs_f64(),
        t_naive.as_secs_f64() / t_interp.as_secs_f64(),
        t_mm.as_secs_f64() / t_interp.as_secs_f64(),
    );
    Ok(())
}

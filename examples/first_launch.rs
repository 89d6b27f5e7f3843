//! What a kernel's first launch costs in a fresh process: tracing, compiling (or
//! loading the compiled CPU code from the disk cache) and running, timed as one.
//! `scripts/first-launch.sh` runs it in many processes and prints the ratios.
//!
//! `cargo run --release --example first_launch -- --device cpu --case rmsnorm`
//!
//! Cases (sizes no benchmark in this repository tunes for): `rmsnorm` 64 x 4096
//! f32, `argmax` 2000 x 4000 f32, `matmul` 1024^3 f16 (f32 accumulation). Each result
//! is checked against a host reference, so a fast wrong answer cannot pass.

// The matmul example's kernel is included as a module (with its own `main`).
#![allow(clippy::duplicate_mod)]

mod common;
#[path = "matmul.rs"]
#[allow(dead_code)]
mod matmul;

use std::time::Instant;

use tessera::prelude::*;

/// `y = x / sqrt(mean(x^2) + eps) * w` per row of `n` (at most `BLOCK`) columns.
#[kernel]
pub fn rmsnorm<const BLOCK: usize>(
    x: &Global<f32>,
    w: &Global<f32>,
    y: &mut Global<f32>,
    n: i32,
    eps: f32,
) {
    let row = program_id(0);
    let c = arange::<BLOCK>();
    let mask = c.lt(n);
    let v = x.load_or(row * n + c, mask, 0.0);
    let r = ((v * v).sum::<0>() / n.cast::<f32>() + eps).rsqrt();
    y.store(row * n + c, v * r * w.load(c, mask), mask);
}

/// `idx[r] = argmax(x[r, :])` for rows of `n` (at most `BLOCK`) columns.
#[kernel]
pub fn argmax_rows<const BLOCK: usize>(x: &Global<f32>, idx: &mut Global<i32>, n: i32) {
    let row = program_id(0);
    let c = arange::<BLOCK>();
    let v = x.load_or(row * n + c, c.lt(n), f32::NEG_INFINITY);
    idx.store_unmasked(row, v.argmax::<0>());
}

fn run(dev: &Device, case: &str) -> Result<f64, Box<dyn std::error::Error>> {
    let (mut rng, _) = common::rng();
    match case {
        "rmsnorm" => {
            let (rows, n) = (64usize, 4096usize);
            let xs = common::uniform(&mut rng, rows * n, -2.0, 2.0);
            let ws = common::uniform(&mut rng, n, 0.5, 1.5);
            let (x, w) = (dev.upload(&xs)?, dev.upload(&ws)?);
            let mut y = dev.upload(&vec![f32::NAN; rows * n])?;
            let t = Instant::now();
            rmsnorm::<4096>::launch(dev, rows, (&x, &w, &mut y, n as i32, 1e-6))?;
            dev.synchronize()?;
            let secs = t.elapsed().as_secs_f64();
            let got = y.download()?;
            for r in 0..rows {
                let row = &xs[r * n..(r + 1) * n];
                let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
                let s = 1.0 / (ms + 1e-6).sqrt();
                for c in 0..n {
                    let want = row[c] as f64 * s * ws[c] as f64;
                    let g = got[r * n + c] as f64;
                    if (g - want).abs() > 1e-5 + 1e-5 * want.abs() {
                        return Err(format!("rmsnorm [{r}, {c}] = {g}, want {want}").into());
                    }
                }
            }
            Ok(secs)
        }
        "argmax" => {
            let (rows, n) = (2000usize, 4000usize);
            let xs = common::uniform(&mut rng, rows * n, -100.0, 100.0);
            let x = dev.upload(&xs)?;
            let mut idx = dev.upload(&vec![-1i32; rows])?;
            let t = Instant::now();
            argmax_rows::<4096>::launch(dev, rows, (&x, &mut idx, n as i32))?;
            dev.synchronize()?;
            let secs = t.elapsed().as_secs_f64();
            let got = idx.download()?;
            for r in 0..rows {
                let row = &xs[r * n..(r + 1) * n];
                let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let want = row.iter().position(|&v| v == m).unwrap_or(0) as i32;
                if got[r] != want {
                    return Err(format!("argmax row {r} = {}, want {want}", got[r]).into());
                }
            }
            Ok(secs)
        }
        "matmul" => {
            let s = 1024usize;
            let to_h = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
            let ah = to_h(common::uniform(&mut rng, s * s, -1.0, 1.0));
            let bh = to_h(common::uniform(&mut rng, s * s, -1.0, 1.0));
            let (a, b) = (dev.upload(&ah)?, dev.upload(&bh)?);
            let mut c = dev.upload(&vec![f16::NAN; s * s])?;
            let t = Instant::now();
            matmul::matmul::<f16, 64, 64, 32>::launch(
                dev,
                (s.div_ceil(64), s.div_ceil(64)),
                (&a, &b, &mut c, s as i32, s as i32, s as i32),
            )?;
            dev.synchronize()?;
            let secs = t.elapsed().as_secs_f64();
            let got = c.download()?;
            // Every element written; a sample of rows checked in full.
            if let Some(i) = got.iter().position(|v| v.is_nan()) {
                return Err(format!("matmul: element {i} was not written").into());
            }
            for i in (0..s).step_by(97) {
                for j in 0..s {
                    let (mut want, mut mag) = (0.0f64, 0.0f64);
                    for p in 0..s {
                        let x = ah[i * s + p].to_f64() * bh[p * s + j].to_f64();
                        want += x;
                        mag += x.abs();
                    }
                    let g = got[i * s + j].to_f64();
                    if (g - want).abs() > 1e-3 * mag + 2e-3 * want.abs() {
                        return Err(format!("matmul [{i}, {j}] = {g}, want {want}").into());
                    }
                }
            }
            Ok(secs)
        }
        other => Err(format!("unknown case `{other}` (rmsnorm, argmax or matmul)").into()),
    }
}

fn main() {
    common::run_main(|| {
        let (mut device, mut case) = ("cpu".to_string(), "rmsnorm".to_string());
        use lexopt::ValueExt;
        let mut args = lexopt::Parser::from_env();
        while let Some(arg) = args.next()? {
            match arg {
                lexopt::Arg::Long("device") => device = args.value()?.string()?,
                lexopt::Arg::Long("case") => case = args.value()?.string()?,
                other => return Err(other.unexpected().into()),
            }
        }
        let dev = Device::by_name(&device)?;
        let first = run(&dev, &case)?;
        #[cfg(feature = "jit")]
        let compiled = tessera::codegen::cpu::compilations();
        #[cfg(not(feature = "jit"))]
        let compiled = 0;
        println!(
            "first_launch case={case} device={device} first_ms={:.2} cpu_compilations={compiled}",
            first * 1e3,
        );
        Ok(())
    });
}

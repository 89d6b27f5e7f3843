//! Tiled matrix multiplication `C = A · B` with `dot` accumulating in f32, for f32 and
//! f16 inputs, on sizes that are not multiples of the tile.
//!
//! On a GPU it then multiplies 4096 x 4096 f16 matrices with the fastest of several
//! configurations (tile, warps, pipeline stages), chosen by autotuning the first time
//! (`tessera::autotune::Tuner`: each one timed on the GPU, the winner kept in the
//! kernel disk cache, so later runs launch it at once), and prints its TFLOP/s.
//! `--tune N` does the same at N x N x N on any device (the emulators take minutes).
//!
//! `cargo run --release --example matmul [-- --tune N]`

mod common;

use std::time::Instant;

use tessera::ir::dsl::DotInput;
use tessera::prelude::*;

/// Each program instance computes one `BM x BN` tile of `C` (row-major, `m x n`),
/// walking the `k` dimension `BK` columns at a time. Out-of-range rows and columns are
/// masked: loads read zeros there and stores skip them.
#[kernel]
pub fn matmul<T: DotInput<Acc = f32>, const BM: usize, const BN: usize, const BK: usize>(
    a: &Global<T>,
    b: &Global<T>,
    c: &mut Global<T>,
    m: i32,
    n: i32,
    k: i32,
) {
    let rm = (program_id(0) * BM + arange::<BM>()).expand_dims::<1>(); // BM x 1
    let rn = (program_id(1) * BN + arange::<BN>()).expand_dims::<0>(); // 1 x BN
    let rk = arange::<BK>();
    let mut acc = zeros::<f32, S2<BM, BN>>();
    for k0 in (0..k).step_by(BK) {
        let kk = k0 + rk;
        let (k_col, k_row) = (kk.expand_dims::<0>(), kk.expand_dims::<1>()); // 1 x BK, BK x 1
        let a_tile = a.load(rm * k + k_col, rm.lt(m) & k_col.lt(k));
        let b_tile = b.load(k_row * n + rn, k_row.lt(k) & rn.lt(n));
        acc = dot(a_tile, b_tile, acc);
    }
    c.store(rm * n + rn, acc.cast::<T>(), rm.lt(m) & rn.lt(n));
}

/// `C = A · B` in f64 from the (already rounded) inputs, and `sum |a||b|` per element
/// for the error bound.
pub fn reference(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += av * b[p * n + j];
                mag[i * n + j] += (av * b[p * n + j]).abs();
            }
        }
    }
    (c, mag)
}

fn run<T: DotInput<Acc = f32> + tessera::Element>(
    dev: &Device,
    name: &str,
    (m, n, k): (usize, usize, usize),
    to_t: impl Fn(f32) -> T,
    to_f64: impl Fn(T) -> f64,
    out_ulp: f64,
) -> Result<(), Box<dyn std::error::Error>>
where
    matmul<T, 64, 64, 32>: Kernel<Comptime = ()>,
{
    let (mut rng, _) = common::rng();
    let a: Vec<T> = common::uniform(&mut rng, m * k, -1.0, 1.0)
        .into_iter()
        .map(&to_t)
        .collect();
    let b: Vec<T> = common::uniform(&mut rng, k * n, -1.0, 1.0)
        .into_iter()
        .map(&to_t)
        .collect();
    let a64: Vec<f64> = a.iter().map(|&v| to_f64(v)).collect();
    let b64: Vec<f64> = b.iter().map(|&v| to_f64(v)).collect();
    let (want, mag) = reference(&a64, &b64, m, n, k);

    let da = dev.upload(&a)?;
    let db = dev.upload(&b)?;
    let mut dc = dev.upload(&vec![to_t(f32::NAN); m * n])?;
    let grid = (m.div_ceil(64), n.div_ceil(64));
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    matmul::<T, 64, 64, 32>::launch(dev, grid, (&da, &db, &mut dc, mi, ni, ki))?; // builds the IR
    let t = Instant::now();
    matmul::<T, 64, 64, 32>::launch(dev, grid, (&da, &db, &mut dc, mi, ni, ki))?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{name}: {m}x{n}x{k} in {:.2} ms ({:.2} GFLOP/s)",
        secs * 1e3,
        2.0 * (m * n * k) as f64 / secs / 1e9
    );
    let got: Vec<f64> = dc.download()?.into_iter().map(&to_f64).collect();
    // f32 accumulation over k terms, then one rounding to the output type.
    let tol: Vec<f64> = want
        .iter()
        .zip(&mag)
        .map(|(w, s)| 1e-30 + s * (k as f64) * f32::EPSILON as f64 + w.abs() * out_ulp)
        .collect();
    common::check(name, &got, &want, &tol)?;
    Ok(())
}

/// A configuration the tuner tries: the tile (`BM`, `BN`, `BK`), warps and stages.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Config {
    tile: (usize, usize, usize),
    warps: u32,
    stages: u32,
}

/// What the tuner tries: the 64x64x32 tile with 4 warps, 128x128x64 with 4 and 8,
/// 128x256x64 with 8, each with 3 and 4 stages.
fn configs() -> Vec<Config> {
    let mut v = Vec::new();
    for (tile, warps) in [
        ((64, 64, 32), 4),
        ((128, 128, 64), 4),
        ((128, 128, 64), 8),
        ((128, 256, 64), 8),
    ] {
        for stages in [3, 4] {
            v.push(Config {
                tile,
                warps,
                stages,
            });
        }
    }
    v
}

/// `C = A · B` (f16, `s x s x s`) with the tuned configuration: tunes once per device
/// and shape, times the winner, and checks 16 rows of `C` against an f64 reference.
fn tuned(dev: &Device, s: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (mut rng, _) = common::rng();
    let a = common::uniform_f16(&mut rng, s * s, -1.0, 1.0);
    let b = common::uniform_f16(&mut rng, s * s, -1.0, 1.0);
    let (da, db) = (dev.upload(&a)?, dev.upload(&b)?);
    let mut dc = dev.upload(&vec![f16::NAN; s * s])?;
    let si = s as i32;
    let mut launch = |c: &Config| -> Result<(), tessera::Error> {
        let opts = LaunchOptions::new().num_warps(c.warps).num_stages(c.stages);
        let grid = |bm: usize, bn: usize| (s.div_ceil(bm), s.div_ceil(bn));
        let args = (&da, &db, &mut dc, si, si, si);
        match c.tile {
            (64, 64, 32) => matmul::<f16, 64, 64, 32>::launch_with(dev, grid(64, 64), &opts, args),
            (128, 128, 64) => {
                matmul::<f16, 128, 128, 64>::launch_with(dev, grid(128, 128), &opts, args)
            }
            _ => matmul::<f16, 128, 256, 64>::launch_with(dev, grid(128, 256), &opts, args),
        }
    };
    let (_, time) = common::tune_and_time(
        dev,
        "matmul_f16",
        configs(),
        (
            &format!("matmul f16 {s}x{s}x{s}"),
            &format!("{s}x{s}x{s} f16"),
        ),
        &mut launch,
    )?;
    println!(
        "matmul f16 {s}x{s}x{s}: {:.3} ms, {:.1} TFLOP/s (median of 10)",
        time * 1e3,
        2.0 * (s as f64).powi(3) / time / 1e12
    );
    // 16 rows of C against f64 (f32 accumulation, one f16 rounding).
    let got = dc.download()?;
    common::check_rows(
        "matmul f16",
        s,
        |i, p| a[i * s + p].to_f64(),
        |p, j| b[p * s + j].to_f64(),
        |i, j| got[i * s + j].to_f64(),
        1.0 / 1024.0,
    )?;
    Ok(())
}

fn main() {
    common::run_main(|| {
        let tune = common::tune_args(1, "--tune N")?.map(|v| v[0]);
        let dev = Device::best()?;
        let (_, seed) = common::rng();
        println!("matmul on {dev} (seed {seed})");
        let shape = (300, 200, 150);
        run::<f32>(
            &dev,
            "matmul f32",
            shape,
            |v| v,
            |v| v as f64,
            f32::EPSILON as f64,
        )?;
        run::<f16>(
            &dev,
            "matmul f16",
            shape,
            f16::from_f32,
            |v| v.to_f64(),
            1.0 / 2048.0,
        )?;
        match (tune, common::is_gpu(&dev)) {
            (Some(s), _) => tuned(&dev, s)?,
            (None, true) => tuned(&dev, 4096)?,
            (None, false) => {}
        }
        Ok(())
    });
}

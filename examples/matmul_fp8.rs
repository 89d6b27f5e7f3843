//! fp8 GEMM: `C = A · B` with 8-bit float inputs (OCP E4M3 and E5M2) and f32
//! accumulation, after quantizing f32 inputs to fp8 on the device.
//!
//! - `quantize` casts f32 to the 8-bit format (round to nearest even, saturating to
//!   the largest finite value, NaN to NaN): the same bits on every device, checked
//!   here against the host conversion (`tessera::fp8`).
//! - `matmul_fp8_bt` takes A (`m x k`) and Bᵀ (`n x k`), both row-major, so that both
//!   operands are contiguous along k: on sm_90a that is `wgmma` `.e4m3`/`.e5m2`
//!   (K-major operands from a `cp.async` ring); elsewhere the operands go to the f16
//!   matrix instructions (exact: every 8-bit float is an f16), see
//!   `tessera::codegen::fp8`.
//!
//! On a GPU it then multiplies 4096 x 4096 e4m3 matrices with the fastest of several
//! configurations (tile, warps, stages), chosen by autotuning the first time (the
//! winner kept in the kernel disk cache), and prints its TFLOP/s; `--tune N` does the
//! same at N x N x N on any device.
//!
//! `cargo run --release --example matmul_fp8 [-- --tune N]`

mod common;

use std::time::Instant;

use tessera::prelude::*;

/// `y = cast(x)` for `n` elements, `B` per program (`T` an 8-bit float, or any
/// other `dot` input).
#[kernel]
pub fn quantize<T: DotInput, const B: usize>(x: &Global<f32>, y: &mut Global<T>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    y.store(offs, x.load(offs, m).cast::<T>(), m);
}

/// One `BM x BN` tile of `C` (`m x n`, f32, row-major) per program, from A (`m x k`)
/// and Bᵀ (`n x k`) of 8-bit floats; out-of-range rows and columns are masked.
#[kernel]
pub fn matmul_fp8_bt<T: DotInput<Acc = f32>, const BM: usize, const BN: usize, const BK: usize>(
    a: &Global<T>,
    bt: &Global<T>,
    c: &mut Global<f32>,
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
        let (k_col, k_row) = (kk.expand_dims::<0>(), kk.expand_dims::<1>());
        let a_tile = a.load(rm * k + k_col, rm.lt(m) & k_col.lt(k));
        let b_tile = bt.load(rn * k + k_row, k_row.lt(k) & rn.lt(n));
        acc = dot(a_tile, b_tile, acc);
    }
    c.store(rm * n + rn, acc, rm.lt(m) & rn.lt(n));
}

/// `C = A · Bᵀᵀ` in f64 (A `m x k`, Bᵀ `n x k`), and `sum |a||b|` per element.
pub fn reference(a: &[f64], bt: &[f64], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let v = a[i * k + p] * bt[j * k + p];
                c[i * n + j] += v;
                mag[i * n + j] += v.abs();
            }
        }
    }
    (c, mag)
}

fn run<T>(
    dev: &Device,
    name: &str,
    (m, n, k): (usize, usize, usize),
    bits: impl Fn(T) -> u8,
    to_f64: impl Fn(T) -> f64,
    host: impl Fn(f32) -> u8,
) -> Result<(), Box<dyn std::error::Error>>
where
    T: DotInput<Acc = f32> + tessera::Element,
    quantize<T, 1024>: Kernel<Comptime = ()>,
    matmul_fp8_bt<T, 64, 64, 64>: Kernel<Comptime = ()>,
{
    let (mut rng, _) = common::rng();
    let a32 = common::uniform(&mut rng, m * k, -4.0, 4.0);
    let b32 = common::uniform(&mut rng, n * k, -4.0, 4.0);
    let quant = |x: &[f32]| -> Result<Vec<T>, Box<dyn std::error::Error>> {
        let dx = dev.upload(x)?;
        let mut dy = dev.upload(&vec![T::zeroed(); x.len()])?;
        let n = x.len();
        quantize::<T, 1024>::launch(dev, n.div_ceil(1024), (&dx, &mut dy, n as i32))?;
        let y = dy.download()?;
        // Bit-exact against the host conversion.
        if let Some(i) = (0..n).find(|&i| bits(y[i]) != host(x[i])) {
            return Err(format!(
                "{name}: quantize({}) gave bits {:#04x}, want {:#04x}",
                x[i],
                bits(y[i]),
                host(x[i])
            )
            .into());
        }
        Ok(y)
    };
    let (a, bt) = (quant(&a32)?, quant(&b32)?);
    println!("{name}: quantized {} values, bit-exact", a.len() + bt.len());
    let a64: Vec<f64> = a.iter().map(|&v| to_f64(v)).collect();
    let b64: Vec<f64> = bt.iter().map(|&v| to_f64(v)).collect();
    let (want, mag) = reference(&a64, &b64, m, n, k);
    let (da, db) = (dev.upload(&a)?, dev.upload(&bt)?);
    let mut dc = dev.upload(&vec![f32::NAN; m * n])?;
    let grid = (m.div_ceil(64), n.div_ceil(64));
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let launch = |dc: &mut tessera::Buffer<f32>| {
        matmul_fp8_bt::<T, 64, 64, 64>::launch(dev, grid, (&da, &db, dc, mi, ni, ki))
    };
    launch(&mut dc)?; // builds the IR
    let t = Instant::now();
    launch(&mut dc)?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{name}: {m}x{n}x{k} in {:.2} ms ({:.2} GFLOP/s)",
        secs * 1e3,
        2.0 * (m * n * k) as f64 / secs / 1e9
    );
    let got: Vec<f64> = dc.download()?.into_iter().map(f64::from).collect();
    // Products of 8-bit floats are exact in f32; the sum over k rounds in f32.
    let tol: Vec<f64> = mag
        .iter()
        .map(|s| 1e-30 + s * (k as f64) * f32::EPSILON as f64)
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

/// `C = A · Bᵀᵀ` (e4m3, `s x s x s`, f32 out) with the tuned configuration: tunes once
/// per device and shape, times the winner, and checks 16 rows of `C` against f64.
fn tuned(dev: &Device, s: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (mut rng, _) = common::rng();
    let mut random = || -> Vec<F8E4M3> {
        common::uniform(&mut rng, s * s, -4.0, 4.0)
            .into_iter()
            .map(F8E4M3::from_f32)
            .collect()
    };
    let (a, bt) = (random(), random());
    let (da, db) = (dev.upload(&a)?, dev.upload(&bt)?);
    let mut dc = dev.upload(&vec![f32::NAN; s * s])?;
    let si = s as i32;
    let mut launch = |c: &Config| -> Result<(), tessera::Error> {
        let opts = LaunchOptions::new().num_warps(c.warps).num_stages(c.stages);
        let grid = |bm: usize, bn: usize| (s.div_ceil(bm), s.div_ceil(bn));
        let args = (&da, &db, &mut dc, si, si, si);
        match c.tile {
            (64, 64, 64) => {
                matmul_fp8_bt::<F8E4M3, 64, 64, 64>::launch_with(dev, grid(64, 64), &opts, args)
            }
            (128, 128, 128) => matmul_fp8_bt::<F8E4M3, 128, 128, 128>::launch_with(
                dev,
                grid(128, 128),
                &opts,
                args,
            ),
            _ => matmul_fp8_bt::<F8E4M3, 128, 256, 128>::launch_with(
                dev,
                grid(128, 256),
                &opts,
                args,
            ),
        }
    };
    let mut configs = Vec::new();
    for (tile, warps) in [
        ((64, 64, 64), 4),
        ((128, 128, 128), 4),
        ((128, 128, 128), 8),
        ((128, 256, 128), 8),
    ] {
        for stages in [3, 4] {
            configs.push(Config {
                tile,
                warps,
                stages,
            });
        }
    }
    let (_, time) = common::tune_and_time(
        dev,
        "matmul_fp8_e4m3",
        configs,
        (
            &format!("matmul e4m3 {s}x{s}x{s}"),
            &format!("{s}x{s}x{s} e4m3"),
        ),
        &mut launch,
    )?;
    println!(
        "matmul e4m3 {s}x{s}x{s}: {:.3} ms, {:.1} TFLOP/s (median of 10)",
        time * 1e3,
        2.0 * (s as f64).powi(3) / time / 1e12
    );
    let got = dc.download()?;
    common::check_rows(
        "matmul e4m3",
        s,
        |i, p| a[i * s + p].to_f64(),
        |p, j| bt[j * s + p].to_f64(),
        |i, j| f64::from(got[i * s + j]),
        0.0,
    )?;
    Ok(())
}

fn main() {
    common::run_main(|| {
        let tune = common::tune_args(1, "--tune N")?.map(|v| v[0]);
        let dev = Device::best()?;
        let (_, seed) = common::rng();
        println!("fp8 matmul on {dev} (seed {seed})");
        let shape = (200, 150, 176);
        run::<F8E4M3>(
            &dev,
            "matmul e4m3",
            shape,
            |v| v.to_bits(),
            |v| v.to_f64(),
            |x| F8E4M3::from_f32(x).to_bits(),
        )?;
        run::<F8E5M2>(
            &dev,
            "matmul e5m2",
            shape,
            |v| v.to_bits(),
            |v| v.to_f64(),
            |x| F8E5M2::from_f32(x).to_bits(),
        )?;
        match (tune, common::is_gpu(&dev)) {
            (Some(s), _) => tuned(&dev, s)?,
            (None, true) => tuned(&dev, 4096)?,
            (None, false) => {}
        }
        Ok(())
    });
}

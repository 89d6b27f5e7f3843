//! Tiled matrix multiplication `C = A · B` with `dot` accumulating in f32, for f32 and
//! f16 inputs, on sizes that are not multiples of the tile.
//!
//! `cargo run --release --example matmul`

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

fn main() {
    common::run_main(|| {
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
        Ok(())
    });
}

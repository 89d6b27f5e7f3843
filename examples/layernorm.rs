//! Layer normalization (forward) over the rows of a matrix, walking each row in tiles
//! of `BLOCK` columns, so any row length works.
//!
//! `cargo run --release --example layernorm`

mod common;

use tessera::prelude::*;

/// `y = (x - mean) / sqrt(var + eps) * w + b` per row, statistics in f32; also writes
/// each row's mean and 1/std (what a backward pass needs).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn layernorm<T: Float, const BLOCK: usize>(
    x: &Global<T>,
    w: &Global<T>,
    b: &Global<T>,
    y: &mut Global<T>,
    mean_out: &mut Global<f32>,
    rstd_out: &mut Global<f32>,
    n_cols: i32,
    eps: f32,
) {
    let row = program_id(0);
    let base = row * n_cols;
    let cols = arange::<BLOCK>();
    let n = n_cols.cast::<f32>();

    let mut sum = zeros::<f32, S1<BLOCK>>();
    for off in (0..n_cols).step_by(BLOCK) {
        let c = off + cols;
        sum += x.load(base + c, c.lt(n_cols)).cast::<f32>();
    }
    let mean = sum.sum::<0>() / n;

    let mut sq = zeros::<f32, S1<BLOCK>>();
    for off in (0..n_cols).step_by(BLOCK) {
        let c = off + cols;
        let mask = c.lt(n_cols);
        let d = select(mask, x.load(base + c, mask).cast::<f32>() - mean, 0.0);
        sq += d * d;
    }
    let rstd = (sq.sum::<0>() / n + eps).rsqrt();

    for off in (0..n_cols).step_by(BLOCK) {
        let c = off + cols;
        let mask = c.lt(n_cols);
        let xv = x.load(base + c, mask).cast::<f32>();
        let wv = w.load(c, mask).cast::<f32>();
        let bv = b.load(c, mask).cast::<f32>();
        y.store(base + c, ((xv - mean) * rstd * wv + bv).cast::<T>(), mask);
    }
    mean_out.store_unmasked(row, mean);
    rstd_out.store_unmasked(row, rstd);
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let (n_rows, n_cols) = (512usize, 1000usize);
        let eps = 1e-5f32;
        println!("layernorm: {n_rows} x {n_cols} on {dev} (seed {seed})");
        let xs = common::uniform(&mut rng, n_rows * n_cols, -3.0, 5.0);
        let ws = common::uniform(&mut rng, n_cols, 0.5, 1.5);
        let bs = common::uniform(&mut rng, n_cols, -1.0, 1.0);

        let x = dev.upload(&xs)?;
        let w = dev.upload(&ws)?;
        let b = dev.upload(&bs)?;
        let mut y = dev.upload(&vec![f32::NAN; xs.len()])?;
        let mut mean = dev.upload(&vec![f32::NAN; n_rows])?;
        let mut rstd = dev.upload(&vec![f32::NAN; n_rows])?;
        layernorm::<f32, 256>::launch(
            &dev,
            n_rows,
            (&x, &w, &b, &mut y, &mut mean, &mut rstd, n_cols as i32, eps),
        )?;

        let mut want_y = vec![0.0f64; xs.len()];
        let mut want_mean = vec![0.0f64; n_rows];
        let mut want_rstd = vec![0.0f64; n_rows];
        for r in 0..n_rows {
            let row: Vec<f64> = xs[r * n_cols..(r + 1) * n_cols]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let mu = row.iter().sum::<f64>() / n_cols as f64;
            let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n_cols as f64;
            let rs = 1.0 / (var + eps as f64).sqrt();
            want_mean[r] = mu;
            want_rstd[r] = rs;
            for c in 0..n_cols {
                want_y[r * n_cols + c] = (row[c] - mu) * rs * ws[c] as f64 + bs[c] as f64;
            }
        }
        let f = |v: Vec<f32>| v.into_iter().map(|x| x as f64).collect::<Vec<_>>();
        common::check(
            "layernorm mean",
            &f(mean.download()?),
            &want_mean,
            &vec![1e-5; n_rows],
        )?;
        common::check(
            "layernorm rstd",
            &f(rstd.download()?),
            &want_rstd,
            &vec![1e-5; n_rows],
        )?;
        let tol: Vec<f64> = want_y.iter().map(|v| 1e-4 + 1e-5 * v.abs()).collect();
        common::check("layernorm y", &f(y.download()?), &want_y, &tol)?;
        Ok(())
    });
}

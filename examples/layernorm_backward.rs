//! Layer normalization backward (Triton's tutorial 05): `dx` per row, and the weight
//! and bias gradients `dw = Σ_rows dy·x̂`, `db = Σ_rows dy` by a two-stage parallel
//! reduction. Stage 1 (one program per row) computes `dx` and adds the row's `dy·x̂`
//! and `dy` into one of `GROUP` partial-sum rows (row `r` into row `r % GROUP`); stage
//! 2 (one program per block of columns) sums the `GROUP` partial rows. The tutorial
//! serializes the partial adds with a spin lock per group; here they are float
//! atomic adds, which need no lock.
//!
//! `cargo run --release --example layernorm_backward`

// The forward example is included as a module (its kernel gives the statistics); it
// shares `examples/common`.
#![allow(clippy::duplicate_mod)]

mod common;

#[path = "layernorm.rs"]
#[allow(dead_code)]
mod layernorm;

use tessera::prelude::*;

/// Stage 1: `dx = (w·dy - (x̂·c1 + c2))·rstd` with `x̂ = (x - mean)·rstd`,
/// `c1 = mean(x̂·w·dy)`, `c2 = mean(w·dy)`; `dy·x̂` and `dy` into the partial sums.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn layernorm_bwd_dx<const BLOCK: usize, const GROUP: usize>(
    x: &Global<f32>,
    dy: &Global<f32>,
    w: &Global<f32>,
    mean: &Global<f32>,
    rstd: &Global<f32>,
    dx: &mut Global<f32>,
    partial_dw: &mut Global<f32>,
    partial_db: &mut Global<f32>,
    n_cols: i32,
) {
    let row = program_id(0);
    let cols = arange::<BLOCK>();
    let m = cols.lt(n_cols);
    let offs = row * n_cols + cols;
    let xv = x.load(offs, m);
    let g = dy.load(offs, m);
    let wv = w.load(cols, m);
    let (mu, rs) = (mean.load_unmasked(row), rstd.load_unmasked(row));
    let xhat = select(m, (xv - mu) * rs, 0.0);
    let wdy = wv * g;
    let n = n_cols.cast::<f32>();
    let c1 = (xhat * wdy).sum::<0>() / n;
    let c2 = wdy.sum::<0>() / n;
    dx.store(offs, (wdy - (xhat * c1 + c2)) * rs, m);
    let slot = (row % GROUP as i32) * n_cols + cols;
    partial_dw.atomic_add(slot, g * xhat, m);
    partial_db.atomic_add(slot, g, m);
}

/// Stage 2: `dw[c] = Σ_g partial_dw[g, c]`, `db[c] = Σ_g partial_db[g, c]` for a
/// block of `BLOCK_N` columns, `BLOCK_M` partial rows at a time.
#[kernel]
pub fn layernorm_bwd_dwdb<const BLOCK_M: usize, const BLOCK_N: usize>(
    partial_dw: &Global<f32>,
    partial_db: &Global<f32>,
    dw: &mut Global<f32>,
    db: &mut Global<f32>,
    groups: i32,
    n_cols: i32,
) {
    let cols = program_id(0) * BLOCK_N + arange::<BLOCK_N>();
    let c = cols.expand_dims::<0>();
    let mut sw = zeros::<f32, S2<BLOCK_M, BLOCK_N>>();
    let mut sb = zeros::<f32, S2<BLOCK_M, BLOCK_N>>();
    for g0 in (0..groups).step_by(BLOCK_M) {
        let r = (g0 + arange::<BLOCK_M>()).expand_dims::<1>();
        let m = r.lt(groups) & c.lt(n_cols);
        sw += partial_dw.load(r * n_cols + c, m);
        sb += partial_db.load(r * n_cols + c, m);
    }
    let m = cols.lt(n_cols);
    dw.store(cols, sw.sum::<0>(), m);
    db.store(cols, sb.sum::<0>(), m);
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let (n_rows, n_cols) = (300usize, 1000usize);
        const GROUP: usize = 32;
        let eps = 1e-5f32;
        println!(
            "layernorm_backward: {n_rows} x {n_cols}, {GROUP} partial rows, on {dev} (seed {seed})"
        );
        let xs = common::uniform(&mut rng, n_rows * n_cols, -3.0, 5.0);
        let ws = common::uniform(&mut rng, n_cols, 0.5, 1.5);
        let bs = common::uniform(&mut rng, n_cols, -1.0, 1.0);
        let dys = common::uniform(&mut rng, n_rows * n_cols, -1.0, 1.0);
        let (x, w, b, g) = (
            dev.upload(&xs)?,
            dev.upload(&ws)?,
            dev.upload(&bs)?,
            dev.upload(&dys)?,
        );
        // The forward pass gives each row's mean and 1/std.
        let mut y = dev.upload(&vec![f32::NAN; xs.len()])?;
        let mut mean = dev.upload(&vec![f32::NAN; n_rows])?;
        let mut rstd = dev.upload(&vec![f32::NAN; n_rows])?;
        layernorm::layernorm::<f32, 256>::launch(
            &dev,
            n_rows,
            (&x, &w, &b, &mut y, &mut mean, &mut rstd, n_cols as i32, eps),
        )?;
        let mut dx = dev.upload(&vec![f32::NAN; xs.len()])?; // poison
        // The partial sums start at zero: they are accumulated into.
        let mut pdw = dev.upload(&vec![0.0f32; GROUP * n_cols])?;
        let mut pdb = dev.upload(&vec![0.0f32; GROUP * n_cols])?;
        layernorm_bwd_dx::<1024, GROUP>::launch(
            &dev,
            n_rows,
            (
                &x,
                &g,
                &w,
                &mean,
                &rstd,
                &mut dx,
                &mut pdw,
                &mut pdb,
                n_cols as i32,
            ),
        )?;
        let mut dw = dev.upload(&vec![f32::NAN; n_cols])?;
        let mut db = dev.upload(&vec![f32::NAN; n_cols])?;
        layernorm_bwd_dwdb::<32, 128>::launch(
            &dev,
            n_cols.div_ceil(128),
            (&pdw, &pdb, &mut dw, &mut db, GROUP as i32, n_cols as i32),
        )?;

        // The reference in f64.
        let mut want_dx = vec![0.0f64; xs.len()];
        let (mut want_dw, mut want_db) = (vec![0.0f64; n_cols], vec![0.0f64; n_cols]);
        for r in 0..n_rows {
            let row = |v: &[f32], c: usize| v[r * n_cols + c] as f64;
            let mu = (0..n_cols).map(|c| row(&xs, c)).sum::<f64>() / n_cols as f64;
            let var = (0..n_cols).map(|c| (row(&xs, c) - mu).powi(2)).sum::<f64>() / n_cols as f64;
            let rs = 1.0 / (var + eps as f64).sqrt();
            let xhat: Vec<f64> = (0..n_cols).map(|c| (row(&xs, c) - mu) * rs).collect();
            let wdy: Vec<f64> = (0..n_cols).map(|c| ws[c] as f64 * row(&dys, c)).collect();
            let c1 = (0..n_cols).map(|c| xhat[c] * wdy[c]).sum::<f64>() / n_cols as f64;
            let c2 = wdy.iter().sum::<f64>() / n_cols as f64;
            for c in 0..n_cols {
                want_dx[r * n_cols + c] = (wdy[c] - (xhat[c] * c1 + c2)) * rs;
                want_dw[c] += row(&dys, c) * xhat[c];
                want_db[c] += row(&dys, c);
            }
        }
        let f = |v: Vec<f32>| v.into_iter().map(|x| x as f64).collect::<Vec<_>>();
        let tol: Vec<f64> = want_dx.iter().map(|v| 1e-4 + 1e-4 * v.abs()).collect();
        common::check("layernorm_backward dx", &f(dx.download()?), &want_dx, &tol)?;
        // Sums of 300 rows in another order: about 300 · 2^-24 relative each.
        let tol: Vec<f64> = want_dw.iter().map(|v| 1e-3 + 1e-4 * v.abs()).collect();
        common::check("layernorm_backward dw", &f(dw.download()?), &want_dw, &tol)?;
        let tol: Vec<f64> = want_db.iter().map(|v| 1e-3 + 1e-4 * v.abs()).collect();
        common::check("layernorm_backward db", &f(db.download()?), &want_db, &tol)?;
        Ok(())
    });
}

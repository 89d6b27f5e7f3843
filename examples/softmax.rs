//! Row-wise softmax over a matrix whose rows are not a multiple of the tile: each
//! program instance normalizes `ROWS` rows at once, with the tail columns masked.
//!
//! `cargo run --release --example softmax`

mod common;

use tessera::prelude::*;

/// `out[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max))`, computed in f32 for any
/// float element type. `BLOCK` must cover `n_cols`.
#[kernel]
pub fn softmax<T: Float, const ROWS: usize, const BLOCK: usize>(
    x: &Global<T>,
    out: &mut Global<T>,
    n_rows: i32,
    n_cols: i32,
) {
    let rows = (program_id(0) * ROWS + arange::<ROWS>()).expand_dims::<1>(); // ROWS x 1
    let cols = arange::<BLOCK>().expand_dims::<0>(); // 1 x BLOCK
    let mask = rows.lt(n_rows) & cols.lt(n_cols); // ROWS x BLOCK
    let offs = rows * n_cols + cols;
    let v = x.load_or(offs, mask, f64::NEG_INFINITY).cast::<f32>();
    let e = (v - v.max::<1>().expand_dims::<1>()).exp();
    let y = e / e.sum::<1>().expand_dims::<1>();
    out.store(offs, y.cast::<T>(), mask);
}

/// Row softmax in f64.
pub fn reference(xs: &[f32], n_rows: usize, n_cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; xs.len()];
    for r in 0..n_rows {
        let row = &xs[r * n_cols..(r + 1) * n_cols];
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        for c in 0..n_cols {
            out[r * n_cols + c] = (row[c] as f64 - m).exp() / s;
        }
    }
    out
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let (n_rows, n_cols) = (1000usize, 781usize);
        println!("softmax: {n_rows} x {n_cols} on {dev} (seed {seed})");
        let xs = common::uniform(&mut rng, n_rows * n_cols, -8.0, 8.0);
        let want = reference(&xs, n_rows, n_cols);

        // f32
        let x = dev.upload(&xs)?;
        let mut out = dev.upload(&vec![f32::NAN; xs.len()])?;
        softmax::<f32, 4, 1024>::launch(
            &dev,
            n_rows.div_ceil(4),
            (&x, &mut out, n_rows as i32, n_cols as i32),
        )?;
        let got: Vec<f64> = out.download()?.iter().map(|&v| v as f64).collect();
        let tol: Vec<f64> = want.iter().map(|w| 1e-6 + 1e-5 * w).collect();
        common::check("softmax f32", &got, &want, &tol)?;

        // f16 storage, f32 math: the inputs are rounded to f16 first.
        let xs16: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
        let want16 = reference(
            &xs16.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            n_rows,
            n_cols,
        );
        let x = dev.upload(&xs16)?;
        let mut out = dev.upload(&vec![f16::NAN; xs.len()])?;
        softmax::<f16, 4, 1024>::launch(
            &dev,
            n_rows.div_ceil(4),
            (&x, &mut out, n_rows as i32, n_cols as i32),
        )?;
        let got: Vec<f64> = out.download()?.iter().map(|v| v.to_f64()).collect();
        // One f16 rounding of the output (relative 2^-11) plus f32 math.
        let tol: Vec<f64> = want16
            .iter()
            .map(|w| 1e-7 + w * (1.0 / 2048.0 + 1e-5))
            .collect();
        common::check("softmax f16", &got, &want16, &tol)?;
        Ok(())
    });
}

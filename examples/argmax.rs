//! Row-wise argmax and max of a matrix whose rows are not a multiple of the tile: one
//! program per row, the tail masked with -inf so it never wins, ties to the lowest
//! index (as `torch.argmax` and Triton's `tl.argmax` with `tie_break_left`).
//!
//! `cargo run --release --example argmax`

mod common;

use rand::Rng;
use tessera::prelude::*;

/// `idx[r] = argmax(x[r, :])`, `val[r] = max(x[r, :])`; `BLOCK` must cover `n_cols`.
#[kernel]
pub fn row_argmax<const BLOCK: usize>(
    x: &Global<f32>,
    idx: &mut Global<i32>,
    val: &mut Global<f32>,
    n_cols: i32,
) {
    let row = program_id(0);
    let cols = arange::<BLOCK>();
    let v = x.load_or(row * n_cols + cols, cols.lt(n_cols), f32::NEG_INFINITY);
    idx.store_unmasked(row, v.argmax::<0>());
    val.store_unmasked(row, v.max::<0>());
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let (rows, cols) = (300usize, 1000usize);
        println!("argmax: {rows} x {cols} on {dev} (seed {seed})");
        // Few distinct values, so most rows have ties for the maximum.
        let xs: Vec<f32> = (0..rows * cols)
            .map(|_| rng.gen_range(-50..50) as f32 * 0.25)
            .collect();
        let x = dev.upload(&xs)?;
        let mut idx = dev.upload(&vec![-1i32; rows])?; // poison
        let mut val = dev.upload(&vec![f32::NAN; rows])?;
        row_argmax::<1024>::launch(&dev, rows, (&x, &mut idx, &mut val, cols as i32))?;
        let (idx, val) = (idx.download()?, val.download()?);
        let mut ties = 0;
        for r in 0..rows {
            let row = &xs[r * cols..(r + 1) * cols];
            let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let first = row.iter().position(|&v| v == m).expect("a maximum");
            ties += usize::from(row.iter().filter(|&&v| v == m).count() > 1);
            if idx[r] != first as i32 || val[r] != m {
                return Err(format!(
                    "row {r}: argmax {} max {}, want {first} and {m}",
                    idx[r], val[r]
                )
                .into());
            }
        }
        println!("argmax: {rows} rows match ({ties} with ties for the maximum)");
        Ok(())
    });
}

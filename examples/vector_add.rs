//! Element-wise vector addition: the "hello world" of tile kernels.
//!
//! `cargo run --release --example vector_add`

mod common;

use std::time::Instant;

use tessera::prelude::*;

/// Each program instance adds one tile of `BLOCK` elements; the mask keeps the last,
/// partial tile inside the buffers.
#[kernel]
pub fn vector_add<const BLOCK: usize>(
    x: &Global<f32>,
    y: &Global<f32>,
    out: &mut Global<f32>,
    n: i32,
) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs.lt(n);
    out.store(offs, x.load(offs, mask) + y.load(offs, mask), mask);
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let n = 1_000_003usize; // not a multiple of the tile
        println!("vector_add: n = {n} on {dev} (seed {seed})");
        let xs = common::uniform(&mut rng, n, -10.0, 10.0);
        let ys = common::uniform(&mut rng, n, -10.0, 10.0);
        let x = dev.upload(&xs)?;
        let y = dev.upload(&ys)?;
        let mut out = dev.upload(&vec![f32::NAN; n])?; // poison: every element must be written

        let t = Instant::now();
        vector_add::<1024>::launch(&dev, n.div_ceil(1024), (&x, &y, &mut out, n as i32))?;
        let first = t.elapsed();
        let t = Instant::now();
        vector_add::<1024>::launch(&dev, n.div_ceil(1024), (&x, &y, &mut out, n as i32))?;
        let again = t.elapsed();
        println!("first launch (builds the IR) {first:?}, cached launch {again:?}");

        let got: Vec<f64> = out.download()?.iter().map(|&v| v as f64).collect();
        let want: Vec<f64> = xs.iter().zip(&ys).map(|(a, b)| (a + b) as f64).collect();
        common::check("vector_add", &got, &want, &vec![0.0; n])?;
        Ok(())
    });
}

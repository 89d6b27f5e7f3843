//! Seeded dropout (Triton's tutorial 04): the keep mask comes from a counter-based
//! random stream (`rand(seed, offsets)`, Philox 4x32-10), so no mask is stored and the
//! same seed gives the same mask whatever the tiling.
//!
//! `cargo run --release --example dropout`

mod common;

use tessera::prelude::*;

/// `out[i] = x[i] / (1 - p)` where the i-th random number is above `p`, else 0.
#[kernel]
pub fn seeded_dropout<const BLOCK: usize>(
    x: &Global<f32>,
    out: &mut Global<f32>,
    n: i32,
    p: f32,
    seed: i32,
) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs.lt(n);
    let v = x.load(offs, mask);
    let keep = rand(seed, offs).gt(p);
    out.store(offs, select(keep, v / (1.0f32 - p), 0.0), mask);
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let n = 100_003usize;
        let p = 0.3f32;
        println!("dropout: n = {n}, p = {p} on {dev} (seed {seed})");
        // Inputs away from 0, so that a dropped element (0) is told from a kept one.
        let xs: Vec<f32> = common::uniform(&mut rng, n, 1.0, 2.0);
        let x = dev.upload(&xs)?;
        let run = |block: usize, s: i32| -> Result<Vec<f32>, Box<dyn std::error::Error>> {
            let mut out = dev.upload(&vec![f32::NAN; n])?; // poison
            match block {
                256 => seeded_dropout::<256>::launch(
                    &dev,
                    n.div_ceil(256),
                    (&x, &mut out, n as i32, p, s),
                )?,
                _ => seeded_dropout::<1024>::launch(
                    &dev,
                    n.div_ceil(1024),
                    (&x, &mut out, n as i32, p, s),
                )?,
            }
            Ok(out.download()?)
        };
        let a = run(1024, 1234)?;
        // Every element is dropped (0) or kept and scaled by 1 / (1 - p).
        let kept: Vec<bool> = a.iter().map(|&v| v != 0.0).collect();
        let got: Vec<f64> = a.iter().map(|&v| v as f64).collect();
        let want: Vec<f64> = xs
            .iter()
            .zip(&kept)
            .map(|(&v, &k)| if k { (v / (1.0 - p)) as f64 } else { 0.0 })
            .collect();
        let tol: Vec<f64> = want.iter().map(|w| w.abs() * 1e-6).collect();
        common::check("dropout values", &got, &want, &tol)?;
        // About 1 - p of the elements are kept (5 standard deviations).
        let frac = kept.iter().filter(|&&k| k).count() as f64 / n as f64;
        let sigma = ((p * (1.0 - p)) as f64 / n as f64).sqrt();
        if (frac - (1.0 - p) as f64).abs() > 5.0 * sigma {
            return Err(format!("kept fraction {frac:.4}, want {:.4}", 1.0 - p).into());
        }
        println!(
            "kept fraction {frac:.4} (want {:.4} ± {:.4})",
            1.0 - p,
            5.0 * sigma
        );
        // The mask depends on the seed and the offsets only: another tiling gives the
        // same output bit for bit, another seed another mask.
        let b = run(256, 1234)?;
        if a.iter().zip(&b).any(|(x, y)| x.to_bits() != y.to_bits()) {
            return Err("BLOCK 256 and BLOCK 1024 give different masks".into());
        }
        let c = run(1024, 4321)?;
        let same = a
            .iter()
            .zip(&c)
            .filter(|(x, y)| (**x == 0.0) == (**y == 0.0))
            .count();
        // Independent masks agree on p² + (1-p)² of the elements (0.58 for p = 0.3).
        if same as f64 / n as f64 > 0.7 {
            return Err(format!("seeds 1234 and 4321 agree on {same} of {n} elements").into());
        }
        println!("same seed, other tiling: identical; other seed: {same} of {n} agree");
        Ok(())
    });
}

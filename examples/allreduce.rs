//! All-reduce (sum) with `Rank::all_reduce` on random data: every rank ends with the
//! element-wise sum over the ranks. Checked against an f64 host reference on every
//! rank (and the ranks must agree bit for bit), then timed; prints the algorithm and
//! bus bandwidths the way nccl-tests does (`busbw = algbw * 2(n-1)/n`).
//!
//! `cargo run --release --example allreduce -- --ranks 4 --n 1048576`

mod common;

use tessera::bench::{Bench, Timing};
use tessera::collectives::CollElem;
use tessera::prelude::*;

/// What to run: ranks, elements per rank, timed repetitions.
#[derive(Clone, Copy)]
struct Size {
    ranks: usize,
    n: usize,
    iters: usize,
}

fn run<T: CollElem>(
    dev: &Device,
    name: &str,
    Size { ranks, n, iters }: Size,
    to_t: impl Fn(f32) -> T + Sync,
    to_f64: impl Fn(T) -> f64,
    out_ulp: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let (mut rng, _) = common::rng();
    let xs: Vec<Vec<T>> = (0..ranks)
        .map(|_| {
            common::uniform(&mut rng, n, -1.0, 1.0)
                .into_iter()
                .map(&to_t)
                .collect()
        })
        .collect();
    let out = common::rank_world(ranks, dev).run(|r| {
        let mut buf = r.upload(&xs[r.rank() as usize])?;
        r.all_reduce(&mut buf, ReduceOp::Sum)?; // the first call also sets up the workspace
        let got = buf.download()?;
        // One measured run at a time: the inputs are restored between runs (not
        // timed), so that every run reduces the same data.
        let mut samples = Vec::with_capacity(iters);
        for _ in 0..iters {
            buf.copy_from(&xs[r.rank() as usize])?;
            r.barrier()?;
            let t = Bench::new().warmup(0).reps(1).run(r.device(), || {
                r.all_reduce(&mut buf, ReduceOp::Sum)?;
                r.barrier()
            })?;
            samples.extend_from_slice(t.samples());
        }
        Ok((got, Timing::new(samples)))
    })?;

    let mut want = vec![0.0f64; n];
    let mut mag = vec![0.0f64; n];
    for x in &xs {
        for i in 0..n {
            let v = to_f64(x[i]);
            want[i] += v;
            mag[i] += v.abs();
        }
    }
    // f32 sums over the ranks, then one rounding to T.
    let tol: Vec<f64> = (0..n)
        .map(|i| 1e-30 + mag[i] * ranks as f64 * f32::EPSILON as f64 + want[i].abs() * out_ulp)
        .collect();
    for (rank, (got, _)) in out.iter().enumerate() {
        let g: Vec<f64> = got.iter().map(|&v| to_f64(v)).collect();
        common::check(&format!("{name}, rank {rank}"), &g, &want, &tol)?;
        if got
            .iter()
            .zip(&out[0].0)
            .any(|(a, b)| to_f64(*a).to_bits() != to_f64(*b).to_bits())
        {
            return Err(format!("{name}: rank {rank} and rank 0 disagree").into());
        }
    }
    let secs = out[0].1.median().as_secs_f64();
    let bytes = (n * std::mem::size_of::<T>()) as f64;
    let algbw = bytes / secs / 1e9;
    let busbw = algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64;
    println!(
        "{name}: {ranks} ranks, {n} elements ({:.1} MiB): {:.3} ms, algbw {algbw:.3} GB/s, busbw {busbw:.3} GB/s (median of {iters})",
        bytes / (1 << 20) as f64,
        secs * 1e3
    );
    Ok(())
}

fn main() {
    common::run_main(|| {
        let v = common::parse_args(
            "allreduce [--ranks N] [--n ELEMENTS] [--iters N]",
            &[
                ("ranks", 4, 1..=64),
                ("n", 1 << 18, 1..=1 << 26),
                ("iters", 5, 1..=1000),
            ],
        )?;
        let (ranks, n, iters) = (v[0], v[1], v[2]);
        let size = Size { ranks, n, iters };
        let dev = common::comm_device();
        let (_, seed) = common::rng();
        println!("allreduce (sum): {ranks} ranks on {dev} (seed {seed})");
        run::<f32>(
            &dev,
            "all_reduce f32",
            size,
            |v| v,
            |v| v as f64,
            f32::EPSILON as f64,
        )?;
        run::<f16>(
            &dev,
            "all_reduce f16",
            size,
            f16::from_f32,
            |v| v.to_f64(),
            1.0 / 2048.0,
        )?;
        Ok(())
    });
}

//! Fused all-gather + GEMM on a world of ranks: `A` is row-sharded over the ranks,
//! `B` replicated, and every rank computes `C = gather(A) · B`. The fused kernel
//! (`tessera::fused::AgGemm`) pushes the local shard to the peers chunk by chunk and
//! computes while the other shards arrive; the unfused baseline all-gathers first,
//! then multiplies. Both are checked against a plain-Rust reference (f32 and f16,
//! outputs poisoned first) and timed.
//!
//! `cargo run --release --example ag_gemm -- --ranks 4 --rows 128 --n 256 --k 256`

mod common;

use tessera::bench::Bench;
use tessera::fused::unfused::AgThenGemm;
use tessera::fused::{AgGemm, GemmElem, ag_gemm_kernel, unfused};
use tessera::prelude::*;

/// `c = a · b` in f64, and `Σ|a||b|` per element (for the error bound).
fn reference(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
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

struct Shape {
    ranks: usize,
    ms: usize,
    n: usize,
    k: usize,
    iters: usize,
    programs: usize,
}

fn run<T: GemmElem>(
    dev: &Device,
    name: &str,
    s: &Shape,
    to_t: impl Fn(f32) -> T + Sync,
    to_f64: impl Fn(T) -> f64,
    out_ulp: f64,
) -> Result<(), Box<dyn std::error::Error>>
where
    ag_gemm_kernel<T, 64, 64, 32>: Kernel<Comptime = ()>,
    unfused::gather_rows_kernel<T, 64, 32>: Kernel<Comptime = ()>,
    unfused::gemm_kernel<T, 64, 64, 32>: Kernel<Comptime = ()>,
{
    let (ms, n, k) = (s.ms, s.n, s.k);
    let m = ms * s.ranks;
    let (mut rng, _) = common::rng();
    let a: Vec<T> = common::uniform(&mut rng, m * k, -1.0, 1.0)
        .into_iter()
        .map(&to_t)
        .collect();
    let b: Vec<T> = common::uniform(&mut rng, k * n, -1.0, 1.0)
        .into_iter()
        .map(&to_t)
        .collect();
    let poison = to_t(f32::NAN);

    let results = common::rank_world(s.ranks, dev).run(|r| {
        let me = r.rank() as usize;
        let shard = r.device().upload(&a[me * ms * k..(me + 1) * ms * k])?;
        let db = r.device().upload(&b)?;
        let mut fused = AgGemm::<T>::new(r, ms, n, k)?;
        if s.programs > 0 {
            fused = fused.with_programs(r, s.programs as u32)?;
        }
        let mut plain = AgThenGemm::<T>::new(r, ms, n, k)?;
        let mut c_fused = r.device().upload(&vec![poison; m * n])?;
        let mut c_plain = r.device().upload(&vec![poison; m * n])?;
        // First runs: build the kernels, and give the results to check.
        fused.run(r, &shard, &db, &mut c_fused)?;
        plain.run(r, &shard, &db, &mut c_plain)?;
        let got = (c_fused.download()?, c_plain.download()?);
        // Fused and unfused in alternation (the first runs warmed them up); each run
        // ends with a host barrier, so that a run's time is the whole world's.
        r.barrier()?;
        let cmp = Bench::new().warmup(0).reps(s.iters).compare(
            r.device(),
            || {
                fused.run(r, &shard, &db, &mut c_fused)?;
                r.barrier()
            },
            || {
                plain.run(r, &shard, &db, &mut c_plain)?;
                r.barrier()
            },
        )?;
        Ok((got, cmp))
    })?;

    let a64: Vec<f64> = a.iter().map(|&v| to_f64(v)).collect();
    let b64: Vec<f64> = b.iter().map(|&v| to_f64(v)).collect();
    let (want, mag) = reference(&a64, &b64, m, n, k);
    // f32 accumulation over k terms, then one rounding to the output type.
    let tol: Vec<f64> = want
        .iter()
        .zip(&mag)
        .map(|(w, s)| 1e-30 + s * (k as f64) * f32::EPSILON as f64 + w.abs() * out_ulp)
        .collect();
    for (rank, ((fused, plain), _)) in results.iter().enumerate() {
        let f: Vec<f64> = fused.iter().map(|&v| to_f64(v)).collect();
        let p: Vec<f64> = plain.iter().map(|&v| to_f64(v)).collect();
        common::check(&format!("{name} fused, rank {rank}"), &f, &want, &tol)?;
        common::check(&format!("{name} unfused, rank {rank}"), &p, &want, &tol)?;
    }
    // Rank 0's times (every run ends with a host barrier: the world's time).
    let (_, cmp) = &results[0];
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let (fused_ms, plain_ms) = (ms(cmp.a.median()), ms(cmp.b.median()));
    let gflop = 2.0 * (m * n * k) as f64 * s.ranks as f64 / 1e9;
    println!(
        "{name}: {} ranks, C {m}x{n}, k {k}: fused {fused_ms:.1} ms, unfused (all-gather, then GEMM) {plain_ms:.1} ms, speedup {:.2}x ({:.2} GFLOP/s fused, all ranks; medians of {} alternating runs, speedup = median per-pair unfused/fused)",
        s.ranks,
        1.0 / cmp.ratio,
        gflop / (fused_ms / 1e3),
        s.iters
    );
    Ok(())
}

fn main() {
    common::run_main(|| {
        let v = common::parse_args(
            "ag_gemm [--ranks N] [--rows ROWS_PER_RANK] [--n N] [--k K] [--iters N (0: 30 on the compiled CPU, where a run takes about a millisecond, else 3)] [--programs P (fused kernel's programs per rank; 0: the plan's default)]",
            &[
                ("ranks", 4, 1..=64),
                ("rows", 96, 1..=1 << 16),
                ("n", 160, 1..=1 << 16),
                ("k", 120, 1..=1 << 16),
                ("iters", 0, 0..=1000),
                ("programs", 0, 0..=1024),
            ],
        )?;
        let dev = common::comm_device();
        let s = Shape {
            ranks: v[0],
            ms: v[1],
            n: v[2],
            k: v[3],
            // Medians of a few runs are noise at a millisecond each.
            iters: match v[4] {
                0 if dev.id() == "cpu" => 30,
                0 => 3,
                n => n,
            },
            programs: v[5],
        };
        let (_, seed) = common::rng();
        println!(
            "ag_gemm: C = all_gather(A) · B, {} ranks on {} (A shards {}x{}, B {}x{}; seed {seed})",
            s.ranks, dev, s.ms, s.k, s.k, s.n
        );
        run::<f32>(
            &dev,
            "ag_gemm f32",
            &s,
            |v| v,
            |v| v as f64,
            f32::EPSILON as f64,
        )?;
        run::<f16>(
            &dev,
            "ag_gemm f16",
            &s,
            f16::from_f32,
            |v| v.to_f64(),
            1.0 / 2048.0,
        )?;
        Ok(())
    });
}

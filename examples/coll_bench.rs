//! Collectives on CPU ranks (the interpreter): all-reduce bus bandwidth against a plain
//! memcpy, one-shot vs two-shot times per size, LL vs plain latency at small sizes.
//!
//! `cargo run --release --example coll_bench [-- MAX_MIB]` (sizes up to MAX_MIB MiB,
//! default 16). Prints markdown tables (BENCHMARKS.md "Collectives on CPU ranks").
//!
//! `-- MAX_MIB mpi` compares with `MPI_Allreduce` in the same run: it builds
//! `mpi_allreduce.c` with `mpicc` and runs it with `mpirun` (Open MPI or MPICH; the
//! setup script installs Open MPI), then times Tessera's all_reduce at the same sizes
//! the same way (BENCHMARKS.md, "The compiled CPU device: communicating kernels").

use std::time::Duration;

use tessera::bench::Bench;
use tessera::collectives::{AllReduceAlgo, LL_MAX_ELEMS, ONE_SHOT_MAX_BYTES, auto_ll};
use tessera::prelude::*;

/// Seconds per all-reduce of `bytes` bytes of f32 on `ws` ranks: after one warm-up
/// call, `ROUNDS` rounds of `iters` calls, each ending with a host barrier (so that the
/// ranks' times of a round differ only by the barrier's exit); the result is the
/// slowest rank's best round, per call.
fn time_all_reduce(ws: usize, bytes: usize, algo: AllReduceAlgo, iters: u32) -> f64 {
    const ROUNDS: usize = 3;
    let n = (bytes / 4).max(1);
    let heap = 3 * n * 4 + 2 * ws * 8 * n.min(64 * 1024) + (32 << 20);
    let per_rank = World::local(ws)
        .heap_bytes(heap)
        .wait_timeout(Duration::from_secs(600))
        .run(|r| {
            let init: Vec<f32> = (0..n).map(|i| (i % 97) as f32 + r.rank() as f32).collect();
            let mut b = r.upload(&init)?;
            r.all_reduce_with(&mut b, ReduceOp::Max, algo)?;
            r.barrier()?;
            let rounds = Bench::new().warmup(0).reps(ROUNDS).run(r.device(), || {
                for _ in 0..iters {
                    r.all_reduce_with(&mut b, ReduceOp::Max, algo)?;
                }
                r.barrier()
            })?;
            Ok(rounds.min().as_secs_f64() / iters as f64)
        })
        .unwrap_or_else(|e| panic!("{ws} ranks, {bytes} bytes, {algo:?}: {e}"));
    per_rank.into_iter().fold(0.0, f64::max)
}

/// Plain memcpy bandwidth (GB/s) for `bytes` bytes: best of a few runs, with the
/// destination at the same and at a different offset modulo 4 KiB as the source.
fn memcpy_gbs(bytes: usize) -> f64 {
    let src = vec![1u8; bytes.max(1)];
    let dst = std::cell::RefCell::new(vec![0u8; bytes.max(1) + 4096]);
    let reps = ((256 << 20) / bytes.max(1)).clamp(3, 10_000);
    // Two runs at each offset, alternating (timed on the CPU device: the wall clock).
    let copies = |shift: usize| {
        let (src, dst) = (&src, &dst);
        move || {
            let mut dst = dst.borrow_mut();
            for _ in 0..reps {
                dst[shift..shift + src.len()].copy_from_slice(std::hint::black_box(src));
                std::hint::black_box(&mut *dst);
            }
            Ok(())
        }
    };
    let t = Bench::new()
        .warmup(0)
        .reps(2)
        .compare(&Device::cpu(), copies(0), copies(64))
        .expect("timing host copies");
    let best = t.a.min().min(t.b.min()).as_secs_f64() / reps as f64;
    bytes as f64 / best / 1e9
}

/// Seconds per `MPI_Allreduce` (f32, max) on `ws` processes at each of `sizes`
/// (bytes), measured by `mpi_allreduce.c` as [`time_all_reduce`] measures Tessera.
fn mpi_all_reduce(ws: usize, sizes: &[usize]) -> Result<Vec<f64>, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("mpi_allreduce.c");
    let exe = dir.path().join("mpi_allreduce");
    let out = std::process::Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("mpicc: {e} (install Open MPI: scripts/setup.sh)"))?;
    if !out.status.success() {
        return Err(format!(
            "mpicc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut cmd = std::process::Command::new("mpirun");
    // Open MPI refuses root without these; more ranks than cores need the second.
    if std::env::var_os("OMPI_ALLOW_RUN_AS_ROOT").is_none() {
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    let out = cmd
        .args(["--oversubscribe", "-n", &ws.to_string()])
        .arg(&exe)
        .args(sizes.iter().map(|b| b.to_string()))
        .output()
        .map_err(|e| format!("mpirun: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mpirun failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let times: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    if times.len() != sizes.len() {
        return Err(format!("unexpected output from mpi_allreduce: {text}"));
    }
    Ok(times)
}

fn iters_for(bytes: usize) -> u32 {
    ((4 << 20) / bytes.max(1)).clamp(2, 20) as u32
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

fn main() {
    // Tessera's messages (the `log` facade), filtered by TESSERA_LOG.
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("TESSERA_LOG", "warn")).init();
    // Positional arguments: the largest size in MiB (16), and optionally one section
    // (`busbw`, `crossover` or `ll`).
    let usage = "usage: coll_bench [MAX_MIB [busbw|crossover|ll|mpi]]";
    let mut positional = Vec::new();
    let mut p = lexopt::Parser::from_env();
    loop {
        match p.next() {
            Ok(None) => break,
            Ok(Some(lexopt::Arg::Value(v))) => positional.push(v.to_string_lossy().into_owned()),
            Ok(Some(other)) => {
                eprintln!("{}\n{usage}", other.unexpected());
                std::process::exit(2);
            }
            Err(e) => {
                eprintln!("{e}\n{usage}");
                std::process::exit(2);
            }
        }
    }
    let max_mib: usize = match positional.first() {
        None => 16,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("MAX_MIB `{v}` is not a number\n{usage}");
            std::process::exit(2);
        }),
    };
    let max = max_mib << 20;
    let only = positional.get(1).cloned();
    let run = |s: &str| only.as_deref().is_none_or(|o| o == s);
    let ranks = [2usize, 4, 8];
    // The interpreter moves data slower with more ranks on 2 cores: cap 8 ranks lower.
    let cap = |ws: usize| max >> (ws / 4 * 2);

    if only.as_deref() == Some("mpi") {
        println!("## all_reduce (Auto, f32, max) vs MPI_Allreduce, same run\n");
        println!(
            "Ratio: Tessera's time over MPI's (the target: at most 3 up to 64 KiB); busbw = bytes/time * 2(n-1)/n.\n"
        );
        println!(
            "| ranks | size | Tessera | MPI_Allreduce | Tessera/MPI | Tessera busbw GB/s | MPI busbw GB/s |"
        );
        println!("|---|---|---|---|---|---|---|");
        for ws in [2usize, 4] {
            let sizes: Vec<usize> = [4usize << 10, 16 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20]
                .into_iter()
                .filter(|&b| b <= max.max(64 << 10))
                .collect();
            let mpi = mpi_all_reduce(ws, &sizes).unwrap_or_else(|e| {
                eprintln!("coll_bench: MPI baseline: {e}");
                std::process::exit(1);
            });
            for (&bytes, &m) in sizes.iter().zip(&mpi) {
                let t = time_all_reduce(ws, bytes, AllReduceAlgo::Auto, iters_for(bytes).max(10));
                let bus = |t: f64| bytes as f64 / t / 1e9 * 2.0 * (ws as f64 - 1.0) / ws as f64;
                println!(
                    "| {ws} | {} | {:.4} ms | {:.4} ms | {:.2} | {:.3} | {:.3} |",
                    human(bytes),
                    t * 1e3,
                    m * 1e3,
                    t / m,
                    bus(t),
                    bus(m)
                );
            }
        }
        return;
    }
    if run("busbw") {
        println!("## all_reduce bus bandwidth (Auto, f32, max)\n");
        println!("busbw = algbw * 2(n-1)/n; memcpy = host `copy_from_slice` of the same size.\n");
        println!(
            "| ranks | size | algo | time | algbw GB/s | busbw GB/s | memcpy GB/s | busbw/memcpy |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for &ws in &ranks {
            let mut bytes = 1 << 10;
            while bytes <= cap(ws) {
                let t = time_all_reduce(ws, bytes, AllReduceAlgo::Auto, iters_for(bytes));
                let alg = bytes as f64 / t / 1e9;
                let bus = alg * 2.0 * (ws as f64 - 1.0) / ws as f64;
                let mc = memcpy_gbs(bytes);
                let which = if auto_ll(bytes) && bytes <= LL_MAX_ELEMS * 4 {
                    "LL"
                } else if bytes <= ONE_SHOT_MAX_BYTES {
                    "one-shot"
                } else {
                    "two-shot"
                };
                println!(
                    "| {ws} | {} | {which} | {:.3} ms | {alg:.4} | {bus:.4} | {mc:.2} | {:.4} |",
                    human(bytes),
                    t * 1e3,
                    bus / mc
                );
                bytes *= 4;
            }
        }
    }
    if run("crossover") {
        println!("\n## one-shot vs two-shot (f32, max)\n");
        println!("| ranks | size | one-shot | two-shot | faster |");
        println!("|---|---|---|---|---|");
        for &ws in &ranks {
            let mut bytes = 256;
            while bytes <= cap(ws).min(1 << 20) {
                let it = iters_for(bytes);
                let one = time_all_reduce(ws, bytes, AllReduceAlgo::OneShot, it);
                let two = time_all_reduce(ws, bytes, AllReduceAlgo::TwoShot, it);
                println!(
                    "| {ws} | {} | {:.3} ms | {:.3} ms | {} |",
                    human(bytes),
                    one * 1e3,
                    two * 1e3,
                    if one <= two { "one-shot" } else { "two-shot" }
                );
                bytes *= 2;
            }
        }
    }
    if run("ll") {
        println!("\n## LL vs plain one-shot latency (f32, max)\n");
        println!("| ranks | size | LL | plain one-shot | LL/plain |");
        println!("|---|---|---|---|---|");
        for &ws in &ranks {
            let mut bytes = 4;
            while bytes <= 64 << 10 {
                let it = 10;
                let ll = time_all_reduce(ws, bytes, AllReduceAlgo::LowLatency, it);
                let plain = time_all_reduce(ws, bytes, AllReduceAlgo::OneShot, it);
                println!(
                    "| {ws} | {} | {:.3} ms | {:.3} ms | {:.2} |",
                    human(bytes),
                    ll * 1e3,
                    plain * 1e3,
                    ll / plain
                );
                bytes *= 4;
            }
        }
    }
}

//! Collectives on CPU ranks (the interpreter): all-reduce bus bandwidth against a plain
//! memcpy, one-shot vs two-shot times per size, LL vs plain latency at small sizes.
//!
//! `cargo run --release --example coll_bench [-- MAX_MIB]` (sizes up to MAX_MIB MiB,
//! default 16). Prints markdown tables (BENCHMARKS.md "Collectives on CPU ranks").

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
    let usage = "usage: coll_bench [MAX_MIB [busbw|crossover|ll]]";
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

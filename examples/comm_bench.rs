//! Microbenchmarks of device-side communication on CPU ranks (threads of this process,
//! the reference interpreter): put bandwidth between two ranks against the plain
//! memcpy of the same sizes (measured in the same run, the ceiling), signal round-trip
//! latency, and `barrier_all` latency for 2, 4 and 8 ranks.
//!
//! `cargo run --release --example comm_bench [-- --quick]`
//!
//! Every measurement is checked (the put data arrives, the counters count), and the
//! best of several repetitions is reported (bandwidth: the fastest launch; latency:
//! the fastest of 5 timed launches of many round trips or barriers, averaged).

mod common;

use std::time::Duration;

use tessera::bench::Bench;
use tessera::prelude::*;

/// Lanes per tile: 4 KiB of f32.
const B: usize = 1024;

/// Rank 0 puts `n` elements of `src` into rank 1's `dst`, one tile per program, then
/// `quiet` (its puts are complete).
#[kernel]
fn put_bw<const B: usize>(src: &Global<f32>, dst: &mut Symmetric<f32>, n: i32) {
    if rank().eq(0) {
        let offs = program_id(0) * B + arange::<B>();
        let mask = offs.lt(n);
        dst.put(1, offs, src.load(offs, mask), mask);
        quiet();
    }
}

/// The same copy with a local destination: what the interpreter itself costs.
#[kernel]
fn copy_local<const B: usize>(src: &Global<f32>, dst: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.lt(n);
    dst.store(offs, src.load(offs, mask), mask);
}

/// `iters` signal round trips between ranks 0 and 1 (sequence numbers from
/// `first + 1`).
#[kernel]
fn signal_ping(sig: &mut Symmetric<u64>, first: i32, iters: i32) {
    let me = rank();
    for i in 0..iters {
        let v = (first + i + 1).cast::<u64>();
        if me.eq(0) {
            sig.signal(1, 0, v, SignalOp::Set);
            sig.wait_until(0, CmpPred::Ge, v);
        } else {
            sig.wait_until(0, CmpPred::Ge, v);
            sig.signal(0, 0, v, SignalOp::Set);
        }
    }
}

/// `iters` iterations of two barriers: before the first, each rank writes the
/// iteration number (from `first + 1`) into its counter; between them, it checks that
/// its left neighbour's counter reached it (`bad` counts misses).
#[kernel]
fn barriers(count: &mut Symmetric<i32>, bad: &mut Global<i32>, first: i32, iters: i32) {
    let n = world_size();
    let mut misses = zeros::<i32, ()>();
    for i in 0..iters {
        count.store_unmasked(0, first + i + 1);
        barrier_all();
        let left = count.on((rank() + n - 1) % n).load_unmasked(0);
        if left.ne(first + i + 1) {
            misses += 1;
        }
        barrier_all();
    }
    bad.store_unmasked(0, misses);
}

/// Timed launches per latency figure (the best one is reported).
const LATENCY_REPS: usize = 5;

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn world(n: usize, heap: usize) -> World {
    World::local(n)
        .heap_bytes(heap)
        .signal_bytes(4096)
        .wait_timeout(Duration::from_secs(120))
}

/// Put bandwidth, local-copy bandwidth and memcpy bandwidth for `bytes`.
fn bandwidth(bytes: usize, reps: usize) -> Result<(f64, f64, f64), Box<dyn std::error::Error>> {
    let n = bytes / 4;
    let (mut rng, _) = common::rng();
    let data = common::uniform(&mut rng, n, -1.0, 1.0);
    let programs = n.div_ceil(B) as u32;
    // memcpy between two buffers of the same size (both touched before timing), in
    // short batches of about 64 KiB (small copies are not lost in the clock's
    // resolution; short samples often escape preemption on a busy machine).
    let mut dst = vec![1.0f32; n];
    let batch = ((64 << 10) / bytes).max(1);
    // (Timed on the CPU device: the wall clock.)
    let memcpy = Bench::new()
        .warmup(0)
        .reps(if bytes <= 1 << 20 { 200 } else { 20 })
        .run(&Device::cpu(), || {
            for _ in 0..batch {
                dst.copy_from_slice(std::hint::black_box(&data));
                std::hint::black_box(&mut dst);
            }
            Ok(())
        })?
        .min()
        / batch as u32;
    let out = world(2, 2 * bytes + (1 << 20)).run(|r| {
        let src = r.device().upload(&data)?;
        let mut sym = r.upload(&vec![f32::NAN; n])?;
        let mut local = r.device().upload(&vec![f32::NAN; n])?;
        // Put and local copy in alternation, the fastest of each counts. Every rank
        // launches the put (only rank 0's programs move data); the copy is rank 0's.
        r.barrier()?;
        let times = Bench::new().warmup(0).reps(reps).compare(
            r.device(),
            || put_bw::<B>::launch(r.device(), programs, (&src, &mut sym, n as i32)),
            || {
                if r.rank() == 0 {
                    copy_local::<B>::launch(r.device(), programs, (&src, &mut local, n as i32))?;
                }
                Ok(())
            },
        )?;
        let (put, copy) = (times.a.min(), times.b.min());
        r.barrier()?;
        let got = if r.rank() == 1 {
            sym.download()?
        } else {
            local.download()?
        };
        Ok((put, copy, got))
    })?;
    for (k, (_, _, got)) in out.iter().enumerate() {
        if got
            .iter()
            .zip(&data)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(format!("{bytes} bytes: rank {k}'s copy differs from the source").into());
        }
    }
    Ok((
        gbps(bytes, out[0].0),
        gbps(bytes, out[0].1),
        gbps(bytes, memcpy),
    ))
}

/// Microseconds per signal round trip between two ranks.
fn signal_latency(iters: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let out = world(2, 1 << 20).run(|r| {
        let mut sig = r.alloc_signals(1)?;
        signal_ping::launch(r.device(), 1u32, (&mut sig, 0, 10))?;
        let mut first = 10;
        // The ranks start together; the round trips keep them in step from then on.
        r.barrier()?;
        let t = Bench::new()
            .warmup(0)
            .reps(LATENCY_REPS)
            .run(r.device(), || {
                signal_ping::launch(r.device(), 1u32, (&mut sig, first, iters as i32))?;
                first += iters as i32;
                Ok(())
            })?
            .min();
        r.barrier()?;
        Ok((t, sig.download()?[0]))
    })?;
    for (k, (_, s)) in out.iter().enumerate() {
        if *s != (LATENCY_REPS * iters) as u64 + 10 {
            return Err(format!("signal ping: rank {k} ended at {s}").into());
        }
    }
    Ok(out[0].0.as_secs_f64() * 1e6 / iters as f64)
}

/// Microseconds per `barrier_all` over `ranks` ranks.
fn barrier_latency(ranks: usize, iters: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let out = world(ranks, 1 << 20).run(|r| {
        let mut count = r.alloc::<i32>(1)?;
        let mut bad = r.device().upload(&[-1i32])?;
        barriers::launch(r.device(), 1u32, (&mut count, &mut bad, 0, 5))?;
        let mut misses = bad.download()?[0];
        let mut first = 5;
        // The ranks start together; the kernel's barriers keep them in step from then
        // on. Each run also reads back its 4-byte miss count (negligible next to the
        // `2 * iters` barriers).
        r.barrier()?;
        let t = Bench::new()
            .warmup(0)
            .reps(LATENCY_REPS)
            .run(r.device(), || {
                barriers::launch(
                    r.device(),
                    1u32,
                    (&mut count, &mut bad, first, iters as i32),
                )?;
                first += iters as i32;
                misses += bad.download()?[0];
                Ok(())
            })?
            .min();
        Ok((t, misses))
    })?;
    if let Some((k, (_, b))) = out.iter().enumerate().find(|(_, (_, b))| *b != 0) {
        return Err(format!("barrier_all: rank {k} saw {b} stale counters").into());
    }
    let worst = out.iter().map(|o| o.0).max().unwrap_or_default();
    // Two barriers per iteration.
    Ok(worst.as_secs_f64() * 1e6 / (2 * iters) as f64)
}

fn main() {
    let mut quick = false;
    let mut p = lexopt::Parser::from_env();
    loop {
        match p.next() {
            Ok(None) => break,
            Ok(Some(lexopt::Arg::Long("quick"))) => quick = true,
            Ok(Some(other)) => {
                eprintln!("{}\nusage: comm_bench [--quick]", other.unexpected());
                std::process::exit(2);
            }
            Err(e) => {
                eprintln!("{e}\nusage: comm_bench [--quick]");
                std::process::exit(2);
            }
        }
    }
    common::run_main(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!("comm_bench: CPU ranks (reference interpreter), {threads} hardware thread(s)");
        println!();
        println!(
            "| message | put (GB/s) | local copy kernel (GB/s) | memcpy (GB/s) | put / memcpy |"
        );
        println!("|---:|---:|---:|---:|---:|");
        let max_kib = if quick { 256 } else { 16 << 10 };
        let mut kib = 4usize;
        while kib <= max_kib {
            let bytes = kib << 10;
            let reps = if bytes <= 1 << 20 { 30 } else { 8 };
            let (put, local, memcpy) = bandwidth(bytes, reps)?;
            let size = if kib >= 1024 {
                format!("{} MiB", kib >> 10)
            } else {
                format!("{kib} KiB")
            };
            println!(
                "| {size} | {put:.3} | {local:.3} | {memcpy:.2} | {:.4} |",
                put / memcpy
            );
            kib *= 4;
        }
        println!();
        let iters = if quick { 200 } else { 2000 };
        println!("| latency | us |");
        println!("|---|---:|");
        println!(
            "| signal round trip, 2 ranks | {:.2} |",
            signal_latency(iters)?
        );
        for ranks in [2, 4, 8] {
            let iters = if quick { 50 } else { 500 };
            println!(
                "| barrier_all, {ranks} ranks | {:.2} |",
                barrier_latency(ranks, iters)?
            );
        }
        Ok(())
    });
}

//! Writing your own collectives: two short kernels built from the communication
//! primitives (`rank()`, `world_size()`, `buf.on(peer)`, `put_signal`, `wait_until`),
//! each checked against a plain-Rust reference.
//!
//! - `ring_all_gather`: every rank's chunk travels around the ring, one hop per step,
//!   each hop a `put_signal` to the next rank and a `wait_until` for the previous one.
//! - `all_reduce_argmax`: one shot: after a "ready" signal from every rank, each rank
//!   reads every peer's values directly and keeps the maximum *and the rank it came
//!   from* (ties go to the lowest rank), something the stock collectives do not do.
//!
//! `cargo run --release --example custom_collective -- --ranks 4 --n 1000`
//! (`--iters N` also times `ring_all_gather` with one program per block against its
//! persistent form, `ring_all_gather_persistent`: README, "Performance of
//! communicating kernels").

mod common;

use tessera::prelude::*;

/// `out` holds `world_size()` chunks of `n` values; chunk `rank()` is this rank's
/// input. Program `p` moves columns `p*B..` of every chunk. At step `s` a rank
/// forwards chunk `rank - s` (its own at step 0, then the one it just received) to the
/// next rank and signals it; after `world_size - 1` steps every rank has every chunk.
#[kernel]
fn ring_all_gather<const B: usize>(
    out: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    n: i32,
    epoch: u64,
) {
    let (me, ws) = (rank(), world_size());
    let (pid, np) = (program_id(0), num_programs(0));
    let cols = pid * B as i32 + arange::<B>();
    let mask = cols.lt(n);
    for step in 0..ws - 1 {
        let c = (me + ws - step) % ws;
        if step.gt(0) {
            // Chunk `c` came from the previous rank at the last step.
            sig.wait_until(c * np + pid, CmpPred::Ge, epoch);
        }
        let v = out.load(c * n + cols, mask);
        let next = (me + 1) % ws;
        out.put_signal(
            next,
            c * n + cols,
            v,
            mask,
            sig,
            c * np + pid,
            epoch,
            SignalOp::Set,
        );
    }
    // The last chunk to arrive is the next rank's.
    if ws.gt(1) {
        sig.wait_until(((me + 1) % ws) * np + pid, CmpPred::Ge, epoch);
    }
}

/// [`ring_all_gather`] with a persistent grid: a few programs per rank (as many as
/// the rank has cores, or SMs on a GPU) each loop over the column blocks `pid`,
/// `pid + np`, ... (`nb` of them), with one signal per block and chunk. Same result;
/// on the CPU device each waiting program is a coroutine, so a few programs that loop
/// cost far less than one program per block (`--iters` times both).
#[kernel]
fn ring_all_gather_persistent<const B: usize>(
    out: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    n: i32,
    nb: i32,
    epoch: u64,
) {
    let (me, ws) = (rank(), world_size());
    let (pid, np) = (program_id(0), num_programs(0));
    let next = (me + 1) % ws;
    for step in 0..ws - 1 {
        let c = (me + ws - step) % ws;
        for blk in (pid..nb).step_by(np) {
            let cols = blk * B as i32 + arange::<B>();
            let mask = cols.lt(n);
            if step.gt(0) {
                sig.wait_until(c * nb + blk, CmpPred::Ge, epoch);
            }
            let v = out.load(c * n + cols, mask);
            out.put_signal(
                next,
                c * n + cols,
                v,
                mask,
                sig,
                c * nb + blk,
                epoch,
                SignalOp::Set,
            );
        }
    }
    if ws.gt(1) {
        for blk in (pid..nb).step_by(np) {
            sig.wait_until(next * nb + blk, CmpPred::Ge, epoch);
        }
    }
}

/// `best[i] = max over ranks of x[i]` and `who[i]` = the (lowest) rank holding it.
/// Program 0 announces that this rank's `x` is ready (word `rank()` of every rank's
/// `sig`); every program waits for all ranks, then reads them in rank order.
#[kernel]
fn all_reduce_argmax<const B: usize>(
    x: &Symmetric<f32>,
    best: &mut Global<f32>,
    who: &mut Global<i32>,
    sig: &mut Symmetric<u64>,
    n: i32,
    epoch: u64,
) {
    let ws = world_size();
    if program_id(0).eq(0) {
        for p in 0..ws {
            sig.signal(p, rank(), epoch, SignalOp::Set);
        }
    }
    let offs = program_id(0) * B as i32 + arange::<B>();
    let mask = offs.lt(n);
    let mut m = full::<f32, S1<B>>(f32::NEG_INFINITY);
    let mut arg = zeros::<i32, S1<B>>();
    for p in 0..ws {
        sig.wait_until(p, CmpPred::Ge, epoch);
        let v = x.on(p).load(offs, mask);
        let take = v.gt(m);
        m = select(take, v, m);
        arg = select(take, p + zeros::<i32, S1<B>>(), arg);
    }
    best.store(offs, m, mask);
    who.store(offs, arg, mask);
}

const B: usize = 256;

fn main() {
    common::run_main(|| {
        let v = common::parse_args(
            "custom_collective [--ranks N] [--n N] [--iters N]",
            &[
                ("ranks", 4, 1..=64),
                ("n", 1000, 1..=B * 1024),
                ("iters", 0, 0..=1000),
            ],
        )?;
        let (ranks, n, iters) = (v[0], v[1], v[2]);
        let dev = common::comm_device();
        let (mut rng, seed) = common::rng();
        println!("custom collectives: {ranks} ranks on {dev}, {n} values per rank (seed {seed})");
        // Values on a coarse grid so that ties between ranks happen.
        let xs: Vec<Vec<f32>> = (0..ranks)
            .map(|_| {
                common::uniform(&mut rng, n, -8.0, 8.0)
                    .into_iter()
                    .map(f32::round)
                    .collect()
            })
            .collect();
        let out = common::rank_world(ranks, &dev).run(|r| {
            let me = r.rank() as usize;
            let grid = n.div_ceil(B);
            let mut init = vec![f32::NAN; n * ranks];
            init[me * n..(me + 1) * n].copy_from_slice(&xs[me]);
            let mut gathered = r.upload(&init)?;
            let mut ring_sig = r.alloc_signals(ranks * grid)?;
            let x = r.upload(&xs[me])?;
            let mut sig = r.alloc_signals(ranks)?;
            r.barrier()?; // every rank's buffers are allocated (and zeroed) before any signal
            ring_all_gather::<B>::launch(
                r.device(),
                grid,
                (&mut gathered, &mut ring_sig, n as i32, 1u64),
            )?;
            let mut best = r.device().upload(&vec![f32::NAN; n])?;
            let mut who = r.device().upload(&vec![-1i32; n])?;
            all_reduce_argmax::<B>::launch(
                r.device(),
                grid,
                (&x, &mut best, &mut who, &mut sig, n as i32, 1u64),
            )?;
            let mut got = vec![gathered.download()?];
            // The persistent grid: as many programs as this rank's share of the cores
            // (at least one), each looping over blocks.
            let programs = (std::thread::available_parallelism().map_or(1, |c| c.get()) / ranks)
                .clamp(1, grid);
            let mut ring_sig2 = r.alloc_signals(ranks * grid)?;
            let mut gathered2 = r.upload(&init)?;
            r.barrier()?;
            ring_all_gather_persistent::<B>::launch(
                r.device(),
                programs,
                (&mut gathered2, &mut ring_sig2, n as i32, grid as i32, 1u64),
            )?;
            got.push(gathered2.download()?);
            // Timed: both grids, taking turns, `iters` times each (epochs 2, 3, ...).
            let mut times = [Vec::new(), Vec::new()];
            for it in 0..iters {
                let epoch = it as u64 + 2;
                for (k, t) in times.iter_mut().enumerate() {
                    r.barrier()?;
                    let t0 = std::time::Instant::now();
                    if k == 0 {
                        ring_all_gather::<B>::launch(
                            r.device(),
                            grid,
                            (&mut gathered, &mut ring_sig, n as i32, epoch),
                        )?;
                    } else {
                        ring_all_gather_persistent::<B>::launch(
                            r.device(),
                            programs,
                            (&mut gathered2, &mut ring_sig2, n as i32, grid as i32, epoch),
                        )?;
                    }
                    r.barrier()?;
                    t.push(t0.elapsed().as_secs_f64());
                }
            }
            if iters > 0 {
                got.push(gathered.download()?);
                got.push(gathered2.download()?);
            }
            Ok((got, best.download()?, who.download()?, times, programs))
        })?;
        let want_gather: Vec<f32> = xs.concat();
        for (rank, (gs, best, who, _, _)) in out.iter().enumerate() {
            for g in gs {
                if g.iter()
                    .zip(&want_gather)
                    .any(|(a, b)| a.to_bits() != b.to_bits())
                {
                    return Err(format!(
                        "ring_all_gather: rank {rank} differs from the concatenation"
                    )
                    .into());
                }
            }
            for i in 0..n {
                let (w, wr) = (0..ranks).fold((f32::NEG_INFINITY, 0), |(m, a), r| {
                    if xs[r][i] > m {
                        (xs[r][i], r as i32)
                    } else {
                        (m, a)
                    }
                });
                if best[i] != w || who[i] != wr {
                    return Err(format!(
                        "all_reduce_argmax: rank {rank} element {i}: got ({}, rank {}), want ({w}, rank {wr})",
                        best[i], who[i]
                    )
                    .into());
                }
            }
        }
        println!(
            "ring_all_gather: {} values on each of {ranks} ranks match (one program per block, and persistent)",
            n * ranks
        );
        if iters > 0 {
            let (_, _, _, times, programs) = &out[0];
            let median = |v: &[f64]| {
                let mut v = v.to_vec();
                v.sort_by(f64::total_cmp);
                v[(v.len() - 1) / 2]
            };
            let (a, b) = (median(&times[0]), median(&times[1]));
            println!(
                "ring_all_gather on rank 0, median of {iters}: one program per block ({} programs): {:.3} ms; persistent ({programs} program(s)): {:.3} ms; persistent {:.2}x faster",
                n.div_ceil(B),
                a * 1e3,
                b * 1e3,
                a / b
            );
        }
        println!("all_reduce_argmax: {n} (max, rank) pairs on each of {ranks} ranks match");
        Ok(())
    });
}

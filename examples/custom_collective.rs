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
            "custom_collective [--ranks N] [--n N]",
            &[("ranks", 4, 1..=64), ("n", 1000, 1..=B * 1024)],
        )?;
        let (ranks, n) = (v[0], v[1]);
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
        let out = World::local(ranks).on(&dev).run(|r| {
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
            Ok((gathered.download()?, best.download()?, who.download()?))
        })?;
        let want_gather: Vec<f32> = xs.concat();
        for (rank, (g, best, who)) in out.iter().enumerate() {
            if g.iter()
                .zip(&want_gather)
                .any(|(a, b)| a.to_bits() != b.to_bits())
            {
                return Err(
                    format!("ring_all_gather: rank {rank} differs from the concatenation").into(),
                );
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
            "ring_all_gather: {} values on each of {ranks} ranks match",
            n * ranks
        );
        println!("all_reduce_argmax: {n} (max, rank) pairs on each of {ranks} ranks match");
        Ok(())
    });
}

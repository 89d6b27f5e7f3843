//! A token ring across ranks: rank 0's tile travels 0 -> 1 -> ... -> n-1 -> 0, each rank
//! adding one, `ROUNDS` times (`put_signal` + `wait_until`). Runs the ranks as threads
//! of this process, or as processes (the way `torchrun` would start them).
//!
//! ```text
//! cargo run --release --example ring -- --threads 4     # 4 ranks as threads
//! cargo run --release --example ring -- --procs 4       # 4 processes (spawn_local)
//! torchrun --nproc-per-node 4 target/release/examples/ring   # the same, by torchrun
//! ```

mod common;

use std::time::{Duration, Instant};

use tessera::prelude::*;

const B: usize = 256;

/// One token pass per rank per round; rank 0 starts each round and gets the token
/// back from the last rank.
#[kernel]
fn ring<const B: usize>(data: &mut Symmetric<f32>, sig: &mut Symmetric<u64>, rounds: i32) {
    let me = rank();
    let next = (me + 1) % world_size();
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    for r in 0..rounds {
        let round = (r + 1).cast::<u64>();
        if me.ne(0) {
            sig.wait_until(0, CmpPred::Ge, round);
        }
        let v = data.load(offs, all) + 1.0f32;
        data.put_signal(next, offs, v, all, sig, 0, round, SignalOp::Set);
        if me.eq(0) {
            sig.wait_until(0, CmpPred::Ge, round);
        }
    }
}

/// One rank's part: returns rank 0's final tile and the kernel's wall time.
fn run_rank(r: &Rank, init: &[f32], rounds: i32) -> Result<(Vec<f32>, Duration), Error> {
    let mut data = r.upload(&if r.rank() == 0 {
        init.to_vec()
    } else {
        vec![f32::NAN; B]
    })?;
    let mut sig = r.alloc_signals(1)?;
    // Warm-up (builds the kernel), then a timed run from fresh signals.
    ring::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, 1))?;
    r.barrier()?;
    data.copy_from(&if r.rank() == 0 {
        init.to_vec()
    } else {
        vec![f32::NAN; B]
    })?;
    sig.fill(0)?;
    r.barrier()?;
    let t = Instant::now();
    ring::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, rounds))?;
    let took = t.elapsed();
    r.barrier()?;
    Ok((data.download()?, took))
}

fn report(
    n: u32,
    rounds: i32,
    init: &[f32],
    got: &[f32],
    took: Duration,
    how: &str,
) -> Result<(), String> {
    let hops = rounds as f64 * f64::from(n);
    let want: Vec<f64> = init.iter().map(|&x| f64::from(x) + hops).collect();
    let got: Vec<f64> = got.iter().map(|&x| f64::from(x)).collect();
    common::check("ring", &got, &want, &vec![0.0; B])?;
    println!(
        "ring: {n} ranks as {how}, {rounds} rounds: {:.1} us per hop",
        took.as_secs_f64() * 1e6 / hops
    );
    Ok(())
}

fn main() {
    common::run_main(|| {
        let v = common::parse_args(
            "ring [--threads N | --procs N] [--rounds N]",
            &[
                ("threads", 2, 1..=256),
                ("procs", 0, 0..=256),
                ("rounds", 50, 1..=1_000_000),
            ],
        )?;
        let (threads, procs, rounds) = (v[0], v[1], v[2] as i32);
        let (mut rng, _) = common::rng();
        let init: Vec<f32> = common::uniform(&mut rng, B, -8.0, 8.0)
            .into_iter()
            .map(|x| x.round())
            .collect();
        let timeout = Duration::from_secs(30);
        if std::env::var_os("WORLD_SIZE").is_some() {
            // One rank of a launched world (started by --procs or torchrun).
            let world = World::launched()?
                .heap_bytes(1 << 20)
                .signal_bytes(4096)
                .wait_timeout(timeout);
            let n = world.size() as u32;
            let (got, took, me) =
                world.run_process(|r| run_rank(r, &init, rounds).map(|(g, t)| (g, t, r.rank())))?;
            if me == 0 {
                report(n, rounds, &init, &got, took, "processes")?;
            }
        } else if procs > 0 {
            // Every rank gets the same command line (it runs a launched world's rank).
            let exe = std::env::current_exe()?;
            let rest: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            let outs = tessera::world::spawn_local(procs, exe, &rest)?;
            for (r, o) in outs.iter().enumerate() {
                print!("{}", String::from_utf8_lossy(&o.stdout));
                eprint!("{}", String::from_utf8_lossy(&o.stderr));
                if !o.status.success() {
                    return Err(format!("rank {r} failed: {}", o.status).into());
                }
            }
        } else {
            let n = threads;
            let out = World::local(n)
                .heap_bytes(1 << 20)
                .signal_bytes(4096)
                .wait_timeout(timeout)
                .run(|r| run_rank(r, &init, rounds))?;
            report(n as u32, rounds, &init, &out[0].0, out[0].1, "threads")?;
        }
        Ok(())
    });
}

//! Device-side communication: a tile passed around a ring of ranks (a ping-pong for two
//! ranks). Each hop waits for the left neighbour's signal, adds one to every element and
//! `put_signal`s the tile to the right neighbour; rank 0 starts every lap.
//!
//! `cargo run --release --example ping_pong -- --ranks 4 [--laps 2000] [--elems 256]`
//!
//! Ranks are threads of this process on the best device present: on one GPU each
//! rank runs on a part of it (its own stream and SMs); `TESSERA_DEVICE=cpu`, `emu-nv`
//! or `emu-amd` chooses the device.

mod common;

use std::time::{Duration, Instant};

use tessera::prelude::*;

/// Lanes of the tile; `--elems` of them are live (the rest is masked off).
const B: usize = 1024;

/// The usage line (the flags' ranges and defaults come from `FLAGS`).
const USAGE: &str = "ping_pong [--ranks N] [--laps N] [--elems N]";

/// `laps` times around the ring, lap numbers `first + 1 ..= first + laps` (signals are
/// monotonic, so a second launch continues the count).
#[kernel]
pub fn ring_pass<const B: usize>(
    ball: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    first: i32,
    laps: i32,
    n: i32,
) {
    let me = rank();
    let right = (me + 1) % world_size();
    let offs = arange::<B>();
    let mask = offs.lt(n);
    for lap in 0..laps {
        let l = (first + lap + 1).cast::<u64>();
        if me.eq(0) {
            let v = ball.load(offs, mask) + 1.0f32;
            ball.put_signal(right, offs, v, mask, sig, 0, l, SignalOp::Set);
            // The tile comes back from the last rank.
            sig.wait_until(0, CmpPred::Ge, l);
        } else {
            sig.wait_until(0, CmpPred::Ge, l);
            let v = ball.load(offs, mask) + 1.0f32;
            ball.put_signal(right, offs, v, mask, sig, 0, l, SignalOp::Set);
        }
    }
}

#[derive(Debug, PartialEq)]
struct Args {
    ranks: usize,
    laps: usize,
    elems: usize,
}

/// The command line's flags: name, default, accepted values.
const FLAGS: [(&str, usize, std::ops::RangeInclusive<usize>); 3] = [
    ("ranks", 2, 1..=256),
    ("laps", 500, 1..=1_000_000),
    ("elems", 256, 1..=B),
];

/// The arguments (without the program name); `None` when `--help` asks for the usage.
fn parse_args(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
) -> Result<Option<Args>, String> {
    Ok(common::parse_args_from(USAGE, &FLAGS, args)?.map(|v| Args {
        ranks: v[0],
        laps: v[1],
        elems: v[2],
    }))
}

/// `x + 1.0` applied `k` times in `f32`, as the ranks do hop by hop.
fn add_ones(x: f32, k: usize) -> f32 {
    (0..k).fold(x, |v, _| v + 1.0)
}

fn main() {
    let args = match parse_args(std::env::args_os().skip(1)) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{}", common::args_help(USAGE, &FLAGS));
            return;
        }
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    common::run_main(|| {
        let dev = common::comm_device();
        let (mut rng, seed) = common::rng();
        let Args { ranks, laps, elems } = args;
        let warmup = laps.clamp(1, 10);
        println!(
            "ping_pong: a tile of {elems} f32 ({} bytes) around a ring of {ranks} rank(s) on {dev}, {laps} lap(s) (seed {seed})",
            elems * 4
        );
        let mut init = common::uniform(&mut rng, B, -100.0, 100.0);
        init[elems..].fill(f32::NAN); // masked off: must stay untouched
        let world = common::rank_world(ranks, &dev)
            .heap_bytes(1 << 20)
            .signal_bytes(4096)
            .wait_timeout(Duration::from_secs(60));
        let out = world.run(|r| {
            // Rank 0 holds the start; the others are poisoned until the tile arrives.
            let start = if r.rank() == 0 {
                init.clone()
            } else {
                vec![f32::NAN; B]
            };
            let mut ball = r.upload(&start)?;
            let mut sig = r.alloc_signals(1)?;
            let n = elems as i32;
            // Warm-up: builds the kernel.
            ring_pass::<B>::launch(r.device(), 1u32, (&mut ball, &mut sig, 0, warmup as i32, n))?;
            r.barrier()?;
            let t = Instant::now();
            ring_pass::<B>::launch(
                r.device(),
                1u32,
                (&mut ball, &mut sig, warmup as i32, laps as i32, n),
            )?;
            let elapsed = t.elapsed();
            r.barrier()?;
            Ok((ball.download()?, elapsed))
        });
        let out = out?;
        // Rank k last saw the tile after (total - 1) full laps and k more hops; rank 0
        // after every lap.
        let total = warmup + laps;
        for (k, (ball, _)) in out.iter().enumerate() {
            let hops = if k == 0 {
                total * ranks
            } else {
                (total - 1) * ranks + k
            };
            let got: Vec<f64> = ball.iter().map(|&v| v as f64).collect();
            let want: Vec<f64> = init
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    if i < elems {
                        add_ones(x, hops) as f64
                    } else {
                        0.0
                    }
                })
                .collect();
            let live = &got[..elems];
            common::check(
                &format!("rank {k}"),
                live,
                &want[..elems],
                &vec![0.0; elems],
            )?;
            if let Some(i) = got[elems..].iter().position(|v| !v.is_nan()) {
                return Err(
                    format!("rank {k}: masked-off element {} was written", elems + i).into(),
                );
            }
        }
        let t = out[0].1;
        let per_lap = t.as_secs_f64() / laps as f64;
        println!(
            "{laps} laps in {t:.3?}: {:.2} us per round trip, {:.2} us per hop",
            per_lap * 1e6,
            per_lap * 1e6 / ranks as f64
        );
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace())?.ok_or_else(|| "help".to_string())
    }

    #[test]
    fn arguments() {
        assert_eq!(
            parse("--ranks 4 --laps 7 --elems 3"),
            Ok(Args {
                ranks: 4,
                laps: 7,
                elems: 3
            })
        );
        assert_eq!(parse("").map(|a| a.ranks), Ok(2));
        assert_eq!(parse("--laps=9").map(|a| a.laps), Ok(9));
        assert_eq!(parse_args(["--help"]), Ok(None));
        for bad in [
            "--ranks",
            "--ranks 0",
            "--ranks x",
            "--elems 1025",
            "--bogus 1",
            "-h",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

//! Memory-model litmus tests across ranks: message passing (data, then a release
//! signal; an acquire wait, then the data), store buffering (each rank stores its own
//! word, then reads its peer's) and the LL protocol's flag+data word (one 8-byte
//! store carries both). Each runs many iterations inside one launch per rank, ranks
//! on different SMs (one GPU: each rank a part of it), and counts the outcomes the
//! memory model forbids: they must be 0.
//!
//! Each test also has a *weakened* variant (the release and acquire made relaxed, or
//! the LL word split in two), whose forbidden outcomes the hardware may show: how
//! often it does is printed, so the strong variants' zeros mean something on that
//! device (a test that could not fail would print 0 for both).
//!
//! `cargo run --release --example litmus -- [--iters 2000] [--launches 4]`
//!
//! Exits with status 1 when a strong variant shows a forbidden outcome.

mod common;

use tessera::prelude::*;

/// Lanes of a message.
const B: usize = 32;

const USAGE: &str = "litmus [--iters N] [--launches N]";

const FLAGS: [(&str, usize, std::ops::RangeInclusive<usize>); 2] =
    [("iters", 2000, 1..=100_000), ("launches", 4, 1..=1000)];

/// The flag of iteration `i` of launch `epoch`: monotonic across launches.
#[helper]
fn stamp(epoch: Scalar<i32>, i: Scalar<i32>) -> Scalar<u64> {
    (epoch * 1_000_000 + i + 1).cast::<u64>()
}

/// Message passing: message `i` goes to the right neighbour's slot `i`, then the flag
/// (release, system scope); the left neighbour's flag is awaited (acquire) and its
/// message must be whole. Counts wrong elements.
#[kernel]
pub fn mp_strong<const B: usize>(
    data: &mut Symmetric<i32>,
    flag: &mut Symmetric<u64>,
    bad: &mut Global<i32>,
    iters: i32,
    epoch: i32,
) {
    let me = rank();
    let n = world_size();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let lanes = arange::<B>();
    let all = lanes.ge(0);
    let mut wrong = zeros::<i32, ()>();
    for i in 0..iters {
        let offs = i * B as i32 + lanes;
        data.put(right, offs, lanes * 7 + epoch * 100_000 + i * 8 + me, all);
        let f = stamp(epoch, i);
        flag.signal(right, 0, f, SignalOp::Set);
        flag.wait_until(0, CmpPred::Ge, f);
        let got = data.load(offs, all);
        let want = lanes * 7 + epoch * 100_000 + i * 8 + left;
        wrong += got.ne(want).cast::<i32>().sum::<0>();
    }
    bad.store(0, wrong, me.ge(0));
}

/// [`mp_strong`] with the signal relaxed and the wait a relaxed polling loop.
#[kernel]
pub fn mp_weak<const B: usize>(
    data: &mut Symmetric<i32>,
    flag: &mut Symmetric<u64>,
    bad: &mut Global<i32>,
    iters: i32,
    epoch: i32,
) {
    let me = rank();
    let n = world_size();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let lanes = arange::<B>();
    let all = lanes.ge(0);
    let yes = me.ge(0);
    let mut wrong = zeros::<i32, ()>();
    for i in 0..iters {
        let offs = i * B as i32 + lanes;
        data.put(right, offs, lanes * 7 + epoch * 100_000 + i * 8 + me, all);
        let f = stamp(epoch, i);
        flag.signal_with(
            right,
            0,
            f,
            SignalOp::Set,
            MemOrder::Relaxed,
            MemScope::System,
        );
        let zero = zeros::<u64, ()>();
        let mut seen = flag.atomic_rmw(
            AtomicOp::Add,
            0,
            zero,
            yes,
            MemOrder::Relaxed,
            MemScope::System,
        );
        while seen.lt(f) {
            seen = flag.atomic_rmw(
                AtomicOp::Add,
                0,
                zero,
                yes,
                MemOrder::Relaxed,
                MemScope::System,
            );
        }
        let got = data.load(offs, all);
        let want = lanes * 7 + epoch * 100_000 + i * 8 + left;
        wrong += got.ne(want).cast::<i32>().sum::<0>();
    }
    bad.store(0, wrong, me.ge(0));
}

/// Store buffering between ranks `me` and `me ^ 1`: both meet (a signal handshake),
/// store `epoch` into their own word `i`, then read the peer's word `i`, the store and
/// the read as acq_rel read-modify-writes at system scope (so both reading the old
/// value is forbidden). `seen[i]` is what the peer's word held.
#[kernel]
pub fn sb_strong(
    x: &mut Symmetric<i32>,
    sync: &mut Symmetric<u64>,
    seen: &mut Global<i32>,
    iters: i32,
    epoch: i32,
) {
    let me = rank();
    let peer = me ^ 1;
    let yes = me.ge(0);
    let zero = zeros::<i32, ()>();
    for i in 0..iters {
        let s = stamp(epoch, i);
        sync.signal(peer, 0, s, SignalOp::Set);
        sync.wait_until(0, CmpPred::Ge, s);
        x.atomic_rmw(
            AtomicOp::Xchg,
            i,
            zero + epoch,
            yes,
            MemOrder::AcqRel,
            MemScope::System,
        );
        let mut theirs = x.on(peer);
        let v = theirs.atomic_rmw(
            AtomicOp::Add,
            i,
            zero,
            yes,
            MemOrder::AcqRel,
            MemScope::System,
        );
        seen.store(i, v, yes);
    }
}

/// [`sb_strong`] with a plain store and a plain load.
#[kernel]
pub fn sb_weak(
    x: &mut Symmetric<i32>,
    sync: &mut Symmetric<u64>,
    seen: &mut Global<i32>,
    iters: i32,
    epoch: i32,
) {
    let me = rank();
    let peer = me ^ 1;
    let yes = me.ge(0);
    let zero = zeros::<i32, ()>();
    for i in 0..iters {
        let s = stamp(epoch, i);
        sync.signal(peer, 0, s, SignalOp::Set);
        sync.wait_until(0, CmpPred::Ge, s);
        x.store(i, zero + epoch, yes);
        let theirs = x.on(peer);
        let v = theirs.load(i, yes);
        seen.store(i, v, yes);
    }
}

/// The LL protocol: the word `(flag << 32) | data` goes to the right neighbour's slot
/// `i` as one 8-byte store; the receiver polls its slot (relaxed) until the flag is
/// `i`'s and checks the data that came with it. Counts wrong data.
#[kernel]
pub fn ll_strong(line: &mut Symmetric<u64>, bad: &mut Global<i32>, iters: i32, epoch: i32) {
    let me = rank();
    let n = world_size();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let yes = me.ge(0);
    let zero = zeros::<u64, ()>();
    let mut wrong = zeros::<i32, ()>();
    for i in 0..iters {
        let f = stamp(epoch, i);
        let mine = (i * 7919 + epoch * 104_729 + me).cast::<u64>();
        line.put(right, i, (f << 32u64) | mine, yes);
        let mut w = line.atomic_rmw(
            AtomicOp::Add,
            i,
            zero,
            yes,
            MemOrder::Relaxed,
            MemScope::System,
        );
        while (w >> 32u64).ne(f) {
            w = line.atomic_rmw(
                AtomicOp::Add,
                i,
                zero,
                yes,
                MemOrder::Relaxed,
                MemScope::System,
            );
        }
        let want = (i * 7919 + epoch * 104_729 + left).cast::<u64>();
        wrong += (w & 0xffff_ffffu64).ne(want).cast::<i32>();
    }
    bad.store(0, wrong, yes);
}

/// [`ll_strong`] with the data and the flag in two words (slots `2i` and `2i + 1`),
/// two plain stores, the data read plainly once the flag is seen.
#[kernel]
pub fn ll_weak(line: &mut Symmetric<u64>, bad: &mut Global<i32>, iters: i32, epoch: i32) {
    let me = rank();
    let n = world_size();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let yes = me.ge(0);
    let zero = zeros::<u64, ()>();
    let mut wrong = zeros::<i32, ()>();
    for i in 0..iters {
        let f = stamp(epoch, i);
        let mine = (i * 7919 + epoch * 104_729 + me).cast::<u64>();
        line.put(right, 2 * i, mine, yes);
        line.put(right, 2 * i + 1, f, yes);
        let mut w = line.atomic_rmw(
            AtomicOp::Add,
            2 * i + 1,
            zero,
            yes,
            MemOrder::Relaxed,
            MemScope::System,
        );
        while w.ne(f) {
            w = line.atomic_rmw(
                AtomicOp::Add,
                2 * i + 1,
                zero,
                yes,
                MemOrder::Relaxed,
                MemScope::System,
            );
        }
        let got = line.load(2 * i, yes);
        let want = (i * 7919 + epoch * 104_729 + left).cast::<u64>();
        wrong += got.ne(want).cast::<i32>();
    }
    bad.store(0, wrong, yes);
}

/// Forbidden outcomes of one test on every rank, over `launches` launches of `iters`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Outcomes the memory model forbids (stale elements, both stores missed).
    pub forbidden: u64,
    /// Outcomes observed.
    pub trials: u64,
}

/// The tests: name, what it is.
pub const TESTS: [(&str, &str); 3] = [
    ("mp", "message passing"),
    ("sb", "store buffering"),
    ("ll", "LL flag+data word"),
];

/// Runs test `name` (`strong` or not) on a world of 2 ranks.
pub fn run_test(
    dev: &Device,
    name: &str,
    strong: bool,
    iters: usize,
    launches: usize,
) -> Result<Outcome, Error> {
    let it = iters as i32;
    let per_rank = common::rank_world(2, dev)
        .heap_bytes((16 << 20).max(iters * B * 4 * 2 + (4 << 20)))
        .signal_bytes(4096)
        .run(|r| {
            let mut out = Vec::new();
            let mut data = r.alloc::<i32>(iters * B)?;
            let mut x = r.alloc::<i32>(iters)?;
            let mut line = r.alloc::<u64>(2 * iters)?;
            let mut flag = r.alloc_signals(1)?;
            for epoch in 1..=launches as i32 {
                r.barrier()?;
                match name {
                    "mp" | "ll" => {
                        let mut bad = r.device().upload(&[-1i32])?;
                        match (name, strong) {
                            ("mp", true) => mp_strong::<B>::launch(
                                r.device(),
                                1u32,
                                (&mut data, &mut flag, &mut bad, it, epoch),
                            )?,
                            ("mp", false) => mp_weak::<B>::launch(
                                r.device(),
                                1u32,
                                (&mut data, &mut flag, &mut bad, it, epoch),
                            )?,
                            (_, true) => ll_strong::launch(
                                r.device(),
                                1u32,
                                (&mut line, &mut bad, it, epoch),
                            )?,
                            (_, false) => {
                                ll_weak::launch(r.device(), 1u32, (&mut line, &mut bad, it, epoch))?
                            }
                        }
                        out.push(bad.download()?);
                    }
                    _ => {
                        let mut seen = r.device().upload(&vec![-1i32; iters])?;
                        let args = (&mut x, &mut flag, &mut seen, it, epoch);
                        if strong {
                            sb_strong::launch(r.device(), 1u32, args)?;
                        } else {
                            sb_weak::launch(r.device(), 1u32, args)?;
                        }
                        out.push(seen.download()?);
                    }
                }
            }
            Ok(out)
        })?;
    let mut o = Outcome::default();
    for e in 0..launches {
        if name == "sb" {
            let (a, b) = (&per_rank[0][e], &per_rank[1][e]);
            let epoch = e as i32 + 1;
            for (&va, &vb) in a.iter().zip(b) {
                // Every slot written: the peer's word held an earlier epoch or this one.
                if !(0..=epoch).contains(&va) || !(0..=epoch).contains(&vb) {
                    return Err(Error::Usage(format!(
                        "sb: a slot holds {va}/{vb}, not a value of epochs 0..={epoch}"
                    )));
                }
                o.forbidden += u64::from(va < epoch && vb < epoch);
            }
            o.trials += iters as u64;
        } else {
            for rank in &per_rank {
                let bad = rank[e][0];
                if bad < 0 {
                    return Err(Error::Usage(format!("{name}: a rank wrote no count")));
                }
                o.forbidden += bad as u64;
                o.trials += (if name == "mp" { iters * B } else { iters }) as u64;
            }
        }
    }
    Ok(o)
}

fn main() {
    let v = match common::parse_args_from(USAGE, &FLAGS, std::env::args_os().skip(1)) {
        Ok(Some(v)) => v,
        Ok(None) => {
            println!("{}", common::args_help(USAGE, &FLAGS));
            return;
        }
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let (iters, launches) = (v[0], v[1]);
    common::run_main(|| {
        let dev = common::comm_device();
        println!(
            "litmus: 2 ranks on {dev:?} ({}), {launches} launch(es) of {iters} iterations per test",
            dev.name()
        );
        println!(
            "{:<34} {:>12} {:>12} {:>10}",
            "test", "trials", "forbidden", "rate"
        );
        let mut broken = Vec::new();
        for (name, what) in TESTS {
            for strong in [true, false] {
                let o = run_test(&dev, name, strong, iters, launches)?;
                let label = format!(
                    "{what} ({})",
                    if strong {
                        "release/acquire"
                    } else {
                        "weakened"
                    }
                );
                println!(
                    "{label:<34} {:>12} {:>12} {:>10.2e}",
                    o.trials,
                    o.forbidden,
                    o.forbidden as f64 / o.trials.max(1) as f64
                );
                if strong && o.forbidden > 0 {
                    broken.push(label);
                }
            }
        }
        if !broken.is_empty() {
            eprintln!(
                "error: the memory model's forbidden outcomes were observed: {}",
                broken.join(", ")
            );
            std::process::exit(1);
        }
        println!("litmus: no forbidden outcome in the release/acquire variants");
        Ok(())
    });
}

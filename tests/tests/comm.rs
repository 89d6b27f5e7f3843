//! Device-side communication on CPU ranks: ping-pong, ring, barriers, litmus, atomics,
//! timeouts and bad peers.
//!
//! Every test runs its kernels as the ranks of a [`World::local`] (threads of this
//! process, the reference interpreter); inputs are random (seeded), outputs poisoned
//! and checked element by element.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera_tests::line_of;

const SOURCE: &str = include_str!("comm.rs");

/// World sizes the scalable tests run on.
const WORLDS: [usize; 3] = [2, 4, 8];

/// A local world with small heaps and a generous timeout (a hang fails the test
/// instead of blocking CI; nothing here should come close to it).
fn world(n: usize) -> World {
    World::local(n)
        .heap_bytes(4 << 20)
        .signal_bytes(64 << 10)
        .wait_timeout(Duration::from_secs(60))
}

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Adds `1.0` `k` times in `f32`, as the kernels do hop by hop.
fn add_ones(x: f32, k: usize) -> f32 {
    (0..k).fold(x, |v, _| v + 1.0)
}

// ---------------------------------------------------------------------------------
// Ping-pong

/// Ping-pong: rank 0 writes a tile to rank 1 and signals; rank 1 waits, adds one,
/// sends it back. `rounds` times.
#[kernel]
fn ping_pong<const B: usize>(data: &mut Symmetric<f32>, sig: &mut Symmetric<u64>, rounds: i32) {
    let me = rank();
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    for r in 0..rounds {
        let round = (r + 1).cast::<u64>();
        if me.eq(0) {
            // Serve: send my tile, wait for the return.
            let v = data.load(offs, all);
            data.put_signal(1, offs, v, all, sig, 0, round, SignalOp::Set);
            sig.wait_until(1, CmpPred::Ge, round);
        } else {
            sig.wait_until(0, CmpPred::Ge, round);
            let v = data.load(offs, all) + 1.0f32;
            data.put_signal(0, offs, v, all, sig, 1, round, SignalOp::Set);
        }
    }
}

#[test]
fn ping_pong_two_ranks() {
    const B: usize = 64;
    let init: Vec<f32> = (0..B).map(|i| i as f32 * 0.5 - 3.0).collect();
    let out = World::local(2)
        .wait_timeout(Duration::from_secs(20))
        .run(|r| {
            let mut data = r.upload(&if r.rank() == 0 {
                init.clone()
            } else {
                vec![f32::NAN; B]
            })?;
            let mut sig = r.alloc_signals(2)?;
            ping_pong::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, 10))?;
            data.download()
        })
        .unwrap();
    let want: Vec<f32> = init.iter().map(|x| x + 10.0).collect();
    assert_eq!(out[0], want);
}

/// Ping-pong between the pairs (0,1), (2,3), ...: the even rank serves, the odd one
/// adds one per round trip. The tile is masked to `n` of `B` lanes.
#[kernel]
fn ping_pong_pairs<const B: usize>(
    data: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    rounds: i32,
    n: i32,
) {
    let me = rank();
    let partner = me ^ 1;
    let offs = arange::<B>();
    let mask = offs.lt(n);
    for r in 0..rounds {
        let round = (r + 1).cast::<u64>();
        if (me % 2).eq(0) {
            let v = data.load(offs, mask);
            data.put_signal(partner, offs, v, mask, sig, 0, round, SignalOp::Set);
            sig.wait_until(1, CmpPred::Ge, round);
        } else {
            sig.wait_until(0, CmpPred::Ge, round);
            let v = data.load(offs, mask) + 1.0f32;
            data.put_signal(partner, offs, v, mask, sig, 1, round, SignalOp::Set);
        }
    }
}

#[test]
fn ping_pong_pairs_of_ranks() {
    const B: usize = 128;
    for (k, &size) in WORLDS.iter().enumerate() {
        let mut g = rng(100 + k as u64);
        let n = g.gen_range(B / 2..=B);
        let rounds = g.gen_range(5..20usize);
        // Even ranks start from random data; odd ranks are poisoned, and so is the
        // masked-off tail of every rank.
        let init: Vec<Vec<f32>> = (0..size)
            .map(|r| {
                (0..B)
                    .map(|i| {
                        if r % 2 == 0 && i < n {
                            g.gen_range(-100.0..100.0)
                        } else {
                            f32::NAN
                        }
                    })
                    .collect()
            })
            .collect();
        let out = world(size)
            .run(|r| {
                let mut data = r.upload(&init[r.rank() as usize])?;
                let mut sig = r.alloc_signals(2)?;
                ping_pong_pairs::<B>::launch(
                    r.device(),
                    1u32,
                    (&mut data, &mut sig, rounds as i32, n as i32),
                )?;
                Ok((data.download()?, sig.download()?))
            })
            .unwrap();
        for (r, (data, sig)) in out.iter().enumerate() {
            let src = &init[r & !1];
            for i in 0..B {
                if i < n {
                    // The server holds its start + rounds, the client the last ball it
                    // received: start + rounds - 1.
                    let hops = if r % 2 == 0 { rounds } else { rounds - 1 };
                    assert_eq!(
                        data[i],
                        add_ones(src[i], hops),
                        "world {size} rank {r} [{i}]"
                    );
                } else {
                    assert!(data[i].is_nan(), "world {size} rank {r} [{i}] was written");
                }
            }
            let want_sig = if r % 2 == 0 {
                [0, rounds as u64]
            } else {
                [rounds as u64, 0]
            };
            assert_eq!(sig, &want_sig, "world {size} rank {r} signals");
        }
    }
}

// ---------------------------------------------------------------------------------
// Ring

/// Ring all-gather, one chunk of `B` per program: at step `s` every rank puts the tile
/// it holds into slot `s` of its right neighbour (`put_signal`), waits for its left
/// neighbour's put into its own slot `s`, and forwards that tile next. After
/// `world_size() - 1` steps, slot `s` of rank `r` holds rank `r - s - 1`'s tile.
#[kernel]
fn ring_allgather<const B: usize>(
    mine: &Global<f32>,
    slots: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
) {
    let me = rank();
    let n = world_size();
    let right = (me + 1) % n;
    let pid = program_id(0);
    let p = num_programs(0);
    let lanes = arange::<B>();
    let all = lanes.lt(B as i32);
    let mut tile = mine.load(pid * B + lanes, all);
    for s in 0..n - 1 {
        let idx = s * p + pid;
        let offs = idx * B + lanes;
        slots.put_signal(right, offs, tile, all, sig, idx, 1u64, SignalOp::Add);
        sig.wait_until(idx, CmpPred::Ge, 1u64);
        tile = slots.load(offs, all);
    }
}

#[test]
fn ring_allgather_put_signal() {
    const B: usize = 32;
    const P: usize = 3;
    for (k, &size) in WORLDS.iter().enumerate() {
        let mut g = rng(200 + k as u64);
        let mine: Vec<Vec<f32>> = (0..size)
            .map(|_| (0..P * B).map(|_| g.gen_range(-1e3..1e3)).collect())
            .collect();
        let steps = size - 1;
        let out = world(size)
            .run(|r| {
                let m = r.device().upload(&mine[r.rank() as usize])?;
                let mut slots = r.upload(&vec![f32::NAN; steps * P * B])?;
                let mut sig = r.alloc_signals(steps * P)?;
                ring_allgather::<B>::launch(r.device(), P as u32, (&m, &mut slots, &mut sig))?;
                Ok((slots.download()?, sig.download()?))
            })
            .unwrap();
        for (r, (slots, sig)) in out.iter().enumerate() {
            for s in 0..steps {
                let from = (r + size - s - 1) % size;
                for i in 0..P * B {
                    assert_eq!(
                        slots[s * P * B + i].to_bits(),
                        mine[from][i].to_bits(),
                        "world {size} rank {r} slot {s} [{i}]"
                    );
                }
            }
            assert!(sig.iter().all(|&v| v == 1), "world {size} rank {r}: {sig:?}");
        }
    }
}

// ---------------------------------------------------------------------------------
// rank(), world_size(), put + quiet + relaxed signal + fence

/// Each program records its rank and the world size, then hands a tagged value to its
/// left neighbour with a plain `put`, completes it with `quiet`, signals with a
/// *relaxed* signal, and on the receiving side orders the data load after the wait
/// with an acquire `fence`.
#[kernel]
fn who_am_i(ids: &mut Global<i32>, inbox: &mut Symmetric<i32>, sig: &mut Symmetric<u64>, tag: i32) {
    let me = rank();
    let n = world_size();
    let pid = program_id(0);
    let p = num_programs(0);
    ids.store_unmasked(pid * 3, me);
    ids.store_unmasked(pid * 3 + 1, n);
    let left = (me + n - 1) % n;
    inbox.put(left, pid, me * 1000 + tag + pid, pid.ge(0));
    quiet();
    sig.signal_with(
        left,
        pid,
        1u64,
        SignalOp::Add,
        MemOrder::Relaxed,
        MemScope::System,
    );
    sig.wait_until(pid, CmpPred::Ge, 1u64);
    fence(MemOrder::Acquire, MemScope::System);
    ids.store_unmasked(pid * 3 + 2, inbox.load_unmasked(pid));
    ids.store_unmasked(3 * p + pid, p);
}

#[test]
fn rank_world_size_fence_quiet() {
    const P: usize = 4;
    for (k, &size) in [1usize, 2, 4, 8].iter().enumerate() {
        let tag = rng(300 + k as u64).gen_range(1..1_000_000);
        let out = world(size)
            .run(|r| {
                let mut ids = r.device().upload(&vec![i32::MIN; 4 * P])?;
                let mut inbox = r.upload(&vec![i32::MIN; P])?;
                let mut sig = r.alloc_signals(P)?;
                who_am_i::launch(r.device(), P as u32, (&mut ids, &mut inbox, &mut sig, tag))?;
                ids.download()
            })
            .unwrap();
        for (r, ids) in out.iter().enumerate() {
            let right = (r + 1) % size;
            for p in 0..P {
                assert_eq!(ids[p * 3], r as i32, "world {size} rank {r} program {p}");
                assert_eq!(ids[p * 3 + 1], size as i32, "world {size}");
                assert_eq!(
                    ids[p * 3 + 2],
                    right as i32 * 1000 + tag + p as i32,
                    "world {size} rank {r} program {p}: value from the right"
                );
                assert_eq!(ids[3 * P + p], P as i32);
            }
        }
    }
}

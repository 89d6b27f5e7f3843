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
use tessera_tests::kernels::ping_pong;
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
            assert!(
                sig.iter().all(|&v| v == 1),
                "world {size} rank {r}: {sig:?}"
            );
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
                let mut ids = r.device().upload(&[i32::MIN; 4 * P])?;
                let mut inbox = r.upload(&[i32::MIN; P])?;
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

// ---------------------------------------------------------------------------------
// barrier_all

/// `iters` back-to-back `barrier_all`s. Before each, every program writes an
/// iteration-tagged value into its right neighbour's box (double-buffered by
/// iteration parity); after it, it checks its left neighbour's value: a barrier that
/// lets a program through early, or misorders, shows up as a stale tag. One random
/// rank per iteration (`plan[2i]`) straggles in a busy loop of random length
/// (`plan[2i + 1]` steps). `stats[program]`: good, bad, busy steps taken.
#[kernel]
fn barrier_storm(
    plan: &Global<i32>,
    boxes: &mut Symmetric<i32>,
    stats: &mut Global<i32>,
    iters: i32,
) {
    let me = rank();
    let n = world_size();
    let pid = program_id(0);
    let p = num_programs(0);
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let mut good = zeros::<i32, ()>();
    let mut bad = zeros::<i32, ()>();
    let mut spun = zeros::<i32, ()>();
    for i in 0..iters {
        if me.eq(plan.load_unmasked(2 * i)) {
            let mut k = plan.load_unmasked(2 * i + 1);
            while k.gt(0) {
                k -= 1;
                spun += 1;
            }
        }
        let slot = (i % 2) * p + pid;
        boxes
            .on(right)
            .store_unmasked(slot, (i * n + me) * p + pid + 1);
        barrier_all();
        let seen = boxes.load_unmasked(slot);
        if seen.eq((i * n + left) * p + pid + 1) {
            good += 1;
        } else {
            bad += 1;
        }
    }
    stats.store_unmasked(pid * 3, good);
    stats.store_unmasked(pid * 3 + 1, bad);
    stats.store_unmasked(pid * 3 + 2, spun);
}

#[test]
fn barrier_all_thousand_times_with_stragglers() {
    const ITERS: usize = 1000;
    for (k, (size, programs)) in [(2usize, 2usize), (4, 1), (8, 1)].into_iter().enumerate() {
        let mut g = rng(400 + k as u64);
        let plan: Vec<i32> = (0..ITERS)
            .flat_map(|_| [g.gen_range(0..size as i32), g.gen_range(0..40)])
            .collect();
        let t = Instant::now();
        let out = world(size)
            .run(|r| {
                let pl = r.device().upload(&plan)?;
                let mut boxes = r.upload(&vec![-1i32; 2 * programs])?;
                let mut stats = r.device().upload(&vec![i32::MIN; 3 * programs])?;
                barrier_storm::launch(
                    r.device(),
                    programs as u32,
                    (&pl, &mut boxes, &mut stats, ITERS as i32),
                )?;
                Ok((stats.download()?, boxes.download()?))
            })
            .unwrap();
        eprintln!(
            "barrier_all x {ITERS}: {size} rank(s) x {programs} program(s) in {:?}",
            t.elapsed()
        );
        for (r, (stats, boxes)) in out.iter().enumerate() {
            let left = (r + size - 1) % size;
            let spun: i32 = (0..ITERS)
                .filter(|&i| plan[2 * i] == r as i32)
                .map(|i| plan[2 * i + 1])
                .sum();
            for p in 0..programs {
                assert_eq!(
                    &stats[p * 3..p * 3 + 3],
                    &[ITERS as i32, 0, spun],
                    "world {size} rank {r} program {p}: good, bad, busy steps"
                );
                // The last two iterations' tags from the left neighbour.
                for i in [ITERS - 2, ITERS - 1] {
                    assert_eq!(
                        boxes[(i % 2) * programs + p],
                        ((i * size + left) * programs + p + 1) as i32,
                        "world {size} rank {r} program {p} box of iteration {i}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Message-passing litmus

/// Message passing without flow control: the even rank of each pair puts tile
/// `base + i` and then signals `i` (set), for `i = 1..=iters`, as fast as it can. The
/// odd rank waits for any signal value `v` above the last one it saw, then loads the
/// tile: every element must be at least `base + v` (data written before a signal is
/// visible to whoever sees the signal). `stats`: violations, observations.
#[kernel]
fn mp_litmus<const B: usize>(
    base: &Global<i32>,
    data: &mut Symmetric<i32>,
    sig: &mut Symmetric<u64>,
    stats: &mut Global<i32>,
    iters: i32,
) {
    let me = rank();
    let lanes = arange::<B>();
    let all = lanes.lt(B as i32);
    let b = base.load(lanes, all);
    if (me % 2).eq(0) {
        for i in 1..iters + 1 {
            data.put_signal(
                me + 1,
                lanes,
                b + i,
                all,
                sig,
                0,
                i.cast::<u64>(),
                SignalOp::Set,
            );
        }
    } else {
        let last = iters.cast::<u64>();
        let mut next = zeros::<u64, ()>() + 1u64;
        let mut violations = zeros::<i32, ()>();
        let mut seen = zeros::<i32, ()>();
        while next.le(last) {
            let v = sig.wait_until(0, CmpPred::Ge, next).value();
            let d = data.load(lanes, all) - b;
            violations += select(d.lt(v.cast::<i32>()), 1, 0).sum::<0>();
            seen += 1;
            next = v + 1u64;
        }
        stats.store_unmasked(0, violations);
        stats.store_unmasked(1, seen);
    }
}

#[test]
fn message_passing_litmus() {
    const B: usize = 64;
    const ITERS: i32 = 3000;
    for (k, &size) in WORLDS.iter().enumerate() {
        let base: Vec<i32> = {
            let mut g = rng(500 + k as u64);
            (0..B).map(|_| g.gen_range(-1_000_000..1_000_000)).collect()
        };
        let out = world(size)
            .run(|r| {
                let b = r.device().upload(&base)?;
                let mut data = r.upload(&vec![i32::MIN; B])?;
                let mut sig = r.alloc_signals(1)?;
                let mut stats = r.device().upload(&[i32::MIN; 2])?;
                mp_litmus::<B>::launch(
                    r.device(),
                    1u32,
                    (&b, &mut data, &mut sig, &mut stats, ITERS),
                )?;
                Ok((stats.download()?, data.download()?))
            })
            .unwrap();
        for (r, (stats, data)) in out.iter().enumerate() {
            if r % 2 == 0 {
                assert_eq!(stats, &[i32::MIN; 2], "world {size} rank {r}: writer");
                assert!(data.iter().all(|&v| v == i32::MIN), "writer's data written");
            } else {
                assert_eq!(
                    stats[0], 0,
                    "world {size} rank {r}: signal seen before data"
                );
                assert!(
                    (1..=ITERS).contains(&stats[1]),
                    "world {size} rank {r}: {} observations",
                    stats[1]
                );
                for i in 0..B {
                    assert_eq!(data[i], base[i] + ITERS, "world {size} rank {r} [{i}]");
                }
            }
        }
    }
}

/// Message passing from several programs into one peer: every program of an even rank
/// puts its chunk `base + i` into the odd partner, then adds 1 to the partner's one
/// signal word. The odd rank's program 0 waits until all `P` programs have signalled
/// round `i` (`sig[0] >= P * i`), checks every chunk is exactly `base + i` and the
/// counter exactly `P * i`, then acknowledges round `i` (`sig[1]` of the writer), which
/// the writers wait for before overwriting. `stats`: mismatched elements, bad counts,
/// rounds.
#[kernel]
fn mp_many_writers<const B: usize>(
    base: &Global<i32>,
    data: &mut Symmetric<i32>,
    sig: &mut Symmetric<u64>,
    stats: &mut Global<i32>,
    iters: i32,
) {
    let me = rank();
    let pid = program_id(0);
    let p = num_programs(0);
    let lanes = arange::<B>();
    let all = lanes.lt(B as i32);
    if (me % 2).eq(0) {
        let offs = pid * B + lanes;
        let b = base.load(offs, all);
        for i in 1..iters + 1 {
            sig.wait_until(1, CmpPred::Ge, (i - 1).cast::<u64>());
            data.put(me + 1, offs, b + i, all);
            sig.signal(me + 1, 0, 1u64, SignalOp::Add);
        }
    } else {
        if pid.eq(0) {
            let mut wrong = zeros::<i32, ()>();
            let mut bad_count = zeros::<i32, ()>();
            let mut rounds = zeros::<i32, ()>();
            for i in 1..iters + 1 {
                let want = (p * i).cast::<u64>();
                let v = sig.wait_until(0, CmpPred::Ge, want).value();
                if v.ne(want) {
                    bad_count += 1;
                }
                for q in 0..p {
                    let offs = q * B + lanes;
                    let d = data.load(offs, all) - base.load(offs, all);
                    wrong += select(d.ne(i), 1, 0).sum::<0>();
                }
                rounds += 1;
                sig.signal(me - 1, 1, i.cast::<u64>(), SignalOp::Set);
            }
            stats.store_unmasked(0, wrong);
            stats.store_unmasked(1, bad_count);
            stats.store_unmasked(2, rounds);
        }
    }
}

#[test]
fn message_passing_from_several_programs() {
    const B: usize = 16;
    const P: usize = 4;
    const ITERS: i32 = 300;
    for (k, &size) in WORLDS.iter().enumerate() {
        let base: Vec<i32> = {
            let mut g = rng(600 + k as u64);
            (0..P * B)
                .map(|_| g.gen_range(-1_000_000..1_000_000))
                .collect()
        };
        let out = world(size)
            .run(|r| {
                let b = r.device().upload(&base)?;
                let mut data = r.upload(&vec![i32::MIN; P * B])?;
                let mut sig = r.alloc_signals(2)?;
                let mut stats = r.device().upload(&[i32::MIN; 3])?;
                mp_many_writers::<B>::launch(
                    r.device(),
                    P as u32,
                    (&b, &mut data, &mut sig, &mut stats, ITERS),
                )?;
                // The reader's last acknowledgement may land after the writers finish.
                r.barrier()?;
                Ok((stats.download()?, data.download()?, sig.download()?))
            })
            .unwrap();
        for (r, (stats, data, sig)) in out.iter().enumerate() {
            if r % 2 == 0 {
                assert_eq!(stats, &[i32::MIN; 3], "world {size} rank {r}: writer");
                assert_eq!(sig, &[0, ITERS as u64], "world {size} rank {r}: acks");
            } else {
                assert_eq!(
                    stats,
                    &[0, 0, ITERS],
                    "world {size} rank {r}: wrong, bad counts, rounds"
                );
                assert_eq!(
                    sig,
                    &[(P as u64) * ITERS as u64, 0],
                    "world {size} rank {r}"
                );
                for i in 0..P * B {
                    assert_eq!(data[i], base[i] + ITERS, "world {size} rank {r} [{i}]");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Remote atomics

/// Every program of every rank, `iters` times, visits every rank (starting with
/// itself) and increments its counters there: `ci` (i32, +1, relaxed), `cu` (u64, a
/// random 40-bit increment, acq_rel), `cf` (f32, +1.0) and `cc` (i32, +1 through a
/// compare-and-swap loop). `stats[program]`: failed CAS attempts.
#[kernel]
fn count_everywhere(
    ci: &mut Symmetric<i32>,
    cu: &mut Symmetric<u64>,
    cf: &mut Symmetric<f32>,
    cc: &mut Symmetric<i32>,
    incs: &Global<u64>,
    stats: &mut Global<i32>,
    iters: i32,
) {
    let n = world_size();
    let me = rank();
    let pid = program_id(0);
    let p = num_programs(0);
    let t = pid.ge(0);
    let mut retries = zeros::<i32, ()>();
    for i in 0..iters {
        let inc = incs.load_unmasked((me * p + pid) * iters + i);
        for d in 0..n {
            let peer = (me + d) % n;
            ci.on(peer).atomic_rmw(
                AtomicOp::Add,
                0,
                full::<i32, ()>(1),
                t,
                MemOrder::Relaxed,
                MemScope::System,
            );
            cu.on(peer)
                .atomic_rmw(AtomicOp::Add, 0, inc, t, MemOrder::AcqRel, MemScope::System);
            cf.on(peer).atomic_add(0, full::<f32, ()>(1.0), t);
            let mut done = zeros::<i32, ()>();
            while done.eq(0) {
                let old = cc.on(peer).load_unmasked(0);
                let prev = cc.on(peer).atomic_cas(0, old, old + 1, t);
                if prev.eq(old) {
                    done = done + 1;
                } else {
                    retries += 1;
                }
            }
        }
    }
    stats.store_unmasked(pid, retries);
}

#[test]
fn remote_atomic_counters() {
    const P: usize = 3;
    const ITERS: usize = 40;
    for (k, &size) in WORLDS.iter().enumerate() {
        let mut g = rng(700 + k as u64);
        let incs: Vec<u64> = (0..size * P * ITERS)
            .map(|_| g.gen_range(1..1u64 << 40))
            .collect();
        let start_i: i32 = g.gen_range(-1000..1000);
        let start_u: u64 = g.gen_range(0..1u64 << 50);
        let out = world(size)
            .run(|r| {
                let inc = r.device().upload(&incs)?;
                let mut ci = r.upload(&[start_i, i32::MIN])?;
                let mut cu = r.upload(&[start_u, u64::MAX])?;
                let mut cf = r.upload(&[start_i as f32, f32::NAN])?;
                let mut cc = r.upload(&[start_i, i32::MIN])?;
                let mut stats = r.device().upload(&[i32::MIN; P])?;
                count_everywhere::launch(
                    r.device(),
                    P as u32,
                    (
                        &mut ci,
                        &mut cu,
                        &mut cf,
                        &mut cc,
                        &inc,
                        &mut stats,
                        ITERS as i32,
                    ),
                )?;
                // Peers may still be adding to this rank's counters.
                r.barrier()?;
                Ok((
                    ci.download()?,
                    cu.download()?,
                    cf.download()?,
                    cc.download()?,
                    stats.download()?,
                ))
            })
            .unwrap();
        let count = (size * P * ITERS) as i32;
        let sum_u = incs.iter().fold(start_u, |a, &b| a.wrapping_add(b));
        for (r, (ci, cu, cf, cc, stats)) in out.iter().enumerate() {
            assert_eq!(
                ci,
                &[start_i + count, i32::MIN],
                "world {size} rank {r}: i32 add"
            );
            assert_eq!(cu, &[sum_u, u64::MAX], "world {size} rank {r}: u64 add");
            assert_eq!(
                cf[0],
                (start_i + count) as f32,
                "world {size} rank {r}: f32 add"
            );
            assert!(
                cf[1].is_nan(),
                "world {size} rank {r}: f32 neighbour written"
            );
            assert_eq!(
                cc,
                &[start_i + count, i32::MIN],
                "world {size} rank {r}: cas loop"
            );
            assert!(
                stats.iter().all(|&s| s >= 0),
                "world {size} rank {r}: {stats:?}"
            );
        }
    }
}

/// Every program of every rank applies its `iters` random values (index
/// `(rank * programs + program) * iters + i`) to every rank's minimum and maximum
/// words: `mi` (i32), `mu` (u64), `mf` (f32), each `[min, max]`.
#[kernel]
fn min_max_everywhere(
    vi: &Global<i32>,
    vu: &Global<u64>,
    vf: &Global<f32>,
    mi: &mut Symmetric<i32>,
    mu: &mut Symmetric<u64>,
    mf: &mut Symmetric<f32>,
    iters: i32,
) {
    let n = world_size();
    let me = rank();
    let pid = program_id(0);
    let p = num_programs(0);
    let t = pid.ge(0);
    let (o, s) = (MemOrder::AcqRel, MemScope::System);
    for i in 0..iters {
        let j = (me * p + pid) * iters + i;
        let (a, b, c) = (
            vi.load_unmasked(j),
            vu.load_unmasked(j),
            vf.load_unmasked(j),
        );
        for d in 0..n {
            let peer = (me + d) % n;
            mi.on(peer).atomic_rmw(AtomicOp::Min, 0, a, t, o, s);
            mi.on(peer).atomic_rmw(AtomicOp::Max, 1, a, t, o, s);
            mu.on(peer).atomic_rmw(AtomicOp::Min, 0, b, t, o, s);
            mu.on(peer).atomic_rmw(AtomicOp::Max, 1, b, t, o, s);
            mf.on(peer).atomic_rmw(AtomicOp::Min, 0, c, t, o, s);
            mf.on(peer).atomic_max(1, c, t);
        }
    }
}

#[test]
fn remote_atomic_min_max() {
    const P: usize = 2;
    const ITERS: usize = 30;
    for (k, &size) in WORLDS.iter().enumerate() {
        let mut g = rng(800 + k as u64);
        let m = size * P * ITERS;
        let vi: Vec<i32> = (0..m).map(|_| g.gen_range(-1_000_000..1_000_000)).collect();
        let vu: Vec<u64> = (0..m).map(|_| g.gen_range(1..u64::MAX - 1)).collect();
        let vf: Vec<f32> = (0..m).map(|_| g.gen_range(-1e6..1e6)).collect();
        let out = world(size)
            .run(|r| {
                let (a, b, c) = (
                    r.device().upload(&vi)?,
                    r.device().upload(&vu)?,
                    r.device().upload(&vf)?,
                );
                let mut mi = r.upload(&[i32::MAX, i32::MIN])?;
                let mut mu = r.upload(&[u64::MAX, 0])?;
                let mut mf = r.upload(&[f32::INFINITY, f32::NEG_INFINITY])?;
                min_max_everywhere::launch(
                    r.device(),
                    P as u32,
                    (&a, &b, &c, &mut mi, &mut mu, &mut mf, ITERS as i32),
                )?;
                r.barrier()?;
                Ok((mi.download()?, mu.download()?, mf.download()?))
            })
            .unwrap();
        let fmin = vf.iter().copied().fold(f32::INFINITY, f32::min);
        let fmax = vf.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for (r, (mi, mu, mf)) in out.iter().enumerate() {
            let want_i = [*vi.iter().min().unwrap(), *vi.iter().max().unwrap()];
            let want_u = [*vu.iter().min().unwrap(), *vu.iter().max().unwrap()];
            assert_eq!(mi, &want_i, "world {size} rank {r}: i32 min/max");
            assert_eq!(mu, &want_u, "world {size} rank {r}: u64 min/max");
            assert_eq!(mf, &[fmin, fmax], "world {size} rank {r}: f32 min/max");
        }
    }
}

/// Exchange and compare-and-swap semantics. Every program of every rank swaps
/// `iters` distinct tags into rank 0's word `x[0]` and records the old values it got
/// back (`olds[program * iters + i]`). Then each program tests CAS on its own word
/// of its right neighbour (`slots[program]`, touched by nobody else): a CAS with the
/// wrong expected value must fail (return the current value, change nothing), one
/// with the current value must succeed. Recorded at `olds[programs * iters +
/// program * 4 ..]`: the value before, the failed CAS's result, the value after it,
/// the successful CAS's result.
#[kernel]
fn xchg_and_cas(
    x: &mut Symmetric<i32>,
    slots: &mut Symmetric<i32>,
    olds: &mut Global<i32>,
    iters: i32,
    wrong: i32,
) {
    let n = world_size();
    let me = rank();
    let pid = program_id(0);
    let p = num_programs(0);
    let t = pid.ge(0);
    for i in 0..iters {
        let tag = (me * p + pid) * iters + i + 1;
        let old = x.on(0).atomic_rmw(
            AtomicOp::Xchg,
            0,
            tag,
            t,
            MemOrder::AcqRel,
            MemScope::System,
        );
        olds.store_unmasked(pid * iters + i, old);
    }
    let right = (me + 1) % n;
    let before = slots.on(right).load_unmasked(pid);
    let mine = me * 100 + pid + 7;
    let failed = slots
        .on(right)
        .atomic_cas(pid, wrong + zeros::<i32, ()>(), mine + 0, t);
    let after_failed = slots.on(right).load_unmasked(pid);
    let won = slots.on(right).atomic_cas(pid, failed, mine, t);
    let at = p * iters + pid * 4;
    olds.store_unmasked(at, before);
    olds.store_unmasked(at + 1, failed);
    olds.store_unmasked(at + 2, after_failed);
    olds.store_unmasked(at + 3, won);
}

#[test]
fn remote_atomic_xchg_cas_semantics() {
    const P: usize = 3;
    const ITERS: usize = 25;
    for (k, &size) in WORLDS.iter().enumerate() {
        let mut g = rng(900 + k as u64);
        let x0: i32 = g.gen_range(-1000..0);
        // Every rank's slots hold distinct random values; `wrong` matches none.
        let slots0: Vec<Vec<i32>> = (0..size)
            .map(|_| (0..P).map(|_| g.gen_range(10_000..1_000_000)).collect())
            .collect();
        let wrong = -5;
        let out = world(size)
            .run(|r| {
                let me = r.rank() as usize;
                let mut x = r.upload(&[if me == 0 { x0 } else { i32::MIN }])?;
                let mut slots = r.upload(&slots0[me])?;
                let mut olds = r.device().upload(&vec![i32::MIN; P * ITERS + 4 * P])?;
                xchg_and_cas::launch(
                    r.device(),
                    P as u32,
                    (&mut x, &mut slots, &mut olds, ITERS as i32, wrong),
                )?;
                r.barrier()?;
                Ok((x.download()?, slots.download()?, olds.download()?))
            })
            .unwrap();
        // xchg: the values handed back, plus the final one, are exactly the initial
        // value and every tag, each once.
        let mut got: Vec<i32> = out
            .iter()
            .flat_map(|(_, _, o)| o[..P * ITERS].to_vec())
            .collect();
        got.push(out[0].0[0]);
        got.sort_unstable();
        let mut want: Vec<i32> = (1..=(size * P * ITERS) as i32).collect();
        want.push(x0);
        want.sort_unstable();
        assert_eq!(got, want, "world {size}: xchg lost or duplicated a value");
        for (r, (x, slots, olds)) in out.iter().enumerate() {
            if r != 0 {
                assert_eq!(x, &[i32::MIN], "world {size} rank {r}: x written");
            }
            let right = (r + 1) % size;
            let left = (r + size - 1) % size;
            for p in 0..P {
                let v = slots0[right][p];
                assert_eq!(
                    &olds[P * ITERS + p * 4..P * ITERS + p * 4 + 4],
                    &[v, v, v, v],
                    "world {size} rank {r} program {p}: before, failed cas, after it, won cas"
                );
                // My slots were claimed by my left neighbour.
                assert_eq!(
                    slots[p],
                    left as i32 * 100 + p as i32 + 7,
                    "world {size} rank {r} slot {p}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Failures: missing signals, bad peers, mismatched allocations, timeouts

/// Rank 0 waits for a signal nobody sends; every other rank waits for the signal
/// rank 0 would send after it.
#[kernel]
fn never_signalled(sig: &mut Symmetric<u64>, want: u64) {
    if rank().eq(0) {
        sig.wait_until(0, CmpPred::Ge, want); // MARK: missing-signal
        sig.signal(1, 0, want, SignalOp::Set);
    } else {
        sig.wait_until(0, CmpPred::Ge, want); // MARK: released-wait
    }
}

#[test]
fn missing_signal_times_out_with_location_and_releases_peers() {
    let timeout = Duration::from_millis(500);
    let mut g = rng(1000);
    let want: u64 = g.gen_range(1_000..1_000_000);
    let before: u64 = g.gen_range(1..want);
    // Rank 1 starts waiting later, so its own timeout would come after rank 0's: it must
    // be released by rank 0's failure, not time out by itself.
    let late = Duration::from_millis(300);
    let rank1_error = Mutex::new(None);
    let t = Instant::now();
    let err = World::local(2)
        .heap_bytes(1 << 20)
        .signal_bytes(4096)
        .wait_timeout(timeout)
        .run(|r| {
            let mut sig = r.upload(&[before])?;
            if r.rank() == 1 {
                std::thread::sleep(late);
            }
            let res = never_signalled::launch(r.device(), 1u32, (&mut sig, want));
            if let (Err(e), 1) = (&res, r.rank()) {
                *rank1_error.lock().unwrap() = Some(e.to_string());
            }
            res
        })
        .unwrap_err();
    let elapsed = t.elapsed();
    assert!(
        elapsed >= timeout,
        "returned after {elapsed:?}, before the timeout"
    );
    assert!(
        elapsed < timeout + late + Duration::from_secs(3),
        "returned after {elapsed:?}"
    );
    let msg = err.to_string();
    eprintln!("{msg}");
    let line = line_of(SOURCE, "MARK: missing-signal");
    assert!(
        msg.contains(&format!("tests/tests/comm.rs:{line}:")),
        "{msg}"
    );
    for part in [
        "`wait_until` timed out after 0.500 s",
        "kernel `never_signalled`",
        "on rank 0,",
        "signal `sig`[0]",
        &format!("expected >= {want}"),
        &format!("observed {before}"),
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    assert!(
        matches!(&err, Error::Exec(e) if matches!(**e, tessera::ir::interp::InterpError::WaitTimeout { rank: 0, expected, observed, .. } if expected == want && observed == before)),
        "{err:?}"
    );
    // Rank 1 was released by rank 0's failure, at its own wait.
    let r1 = rank1_error
        .lock()
        .unwrap()
        .clone()
        .expect("rank 1 failed too");
    let line = line_of(SOURCE, "MARK: released-wait");
    assert!(r1.contains(&format!("tests/tests/comm.rs:{line}:")), "{r1}");
    assert!(
        r1.contains("on rank 1,") && r1.contains("abandoned: rank 0 failed"),
        "{r1}"
    );
}

/// Ranks blocked in a host barrier are released when another rank's kernel fails, and
/// the world reports that failure, not the abandoned barriers.
#[test]
fn host_barrier_released_by_failed_kernel() {
    let t = Instant::now();
    let err = world(3)
        .run(|r| {
            let mut buf = r.upload(&[0.5f32; 16])?;
            if r.rank() == 2 {
                // Let the others block in the barrier first.
                std::thread::sleep(Duration::from_millis(100));
                bad_peer_kernel::launch(r.device(), 1u32, (&mut buf, 0))?;
            }
            r.barrier()
        })
        .unwrap_err();
    // The world's timeout is 60 s: only the release can make this quick.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let msg = err.to_string();
    assert!(
        msg.contains("bad peer 3") && msg.contains("on rank 2,"),
        "{msg}"
    );
}

/// Reaches the buffer of peer `world_size() + offset` from the last rank.
#[kernel]
fn bad_peer_kernel(buf: &mut Symmetric<f32>, offset: i32) {
    let lanes = arange::<16>();
    let v = buf.load_unmasked(lanes);
    if rank().eq(world_size() - 1) {
        buf.on(world_size() + offset).store_unmasked(lanes, v); // MARK: bad-peer
    }
}

#[test]
fn bad_peer_is_an_error_naming_the_line() {
    let line = line_of(SOURCE, "MARK: bad-peer");
    for (size, offset, peer) in [(2usize, 0i32, 2i64), (4, -5, -1), (1, 7, 8)] {
        let err = world(size)
            .run(|r| {
                let mut buf = r.upload(&[1.5f32; 16])?;
                bad_peer_kernel::launch(r.device(), 1u32, (&mut buf, offset))
            })
            .unwrap_err();
        let msg = err.to_string();
        for part in [
            format!("tests/tests/comm.rs:{line}:"),
            format!("bad peer {peer} in `remote_ptr`"),
            format!("on rank {},", size - 1),
            format!("the world has {size} rank(s)"),
        ] {
            assert!(msg.contains(&part), "{part:?} missing from: {msg}");
        }
    }
}

#[test]
fn symmetric_allocation_mismatch_is_a_comm_error() {
    type Alloc = fn(&Rank) -> Result<(), Error>;
    let cases: [(&str, Alloc, Alloc); 3] = [
        (
            "16 x f32",
            |r| r.alloc::<f32>(16).map(drop),
            |r| r.alloc::<f32>(32).map(drop),
        ),
        (
            "16 x f32",
            |r| r.alloc::<f32>(16).map(drop),
            |r| r.alloc::<i32>(16).map(drop),
        ),
        (
            "4 x u64",
            |r| r.alloc_signals(4).map(drop),
            |r| r.alloc::<u64>(4).map(drop),
        ),
    ];
    for (what, even, odd) in cases {
        let t = Instant::now();
        let err = world(2)
            .run(|r| {
                // One matching allocation first: the mismatch is the second.
                let _ok = r.alloc::<u8>(100)?;
                if r.rank() == 0 { even(r) } else { odd(r) }?;
                r.barrier()
            })
            .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        match &err {
            Error::Comm { message, .. } => {
                assert!(
                    message.contains("symmetric allocation #1 differs between ranks"),
                    "{message}"
                );
                assert!(message.contains(what), "{what:?} missing from: {message}");
            }
            e => panic!("not a Comm error: {e:?}"),
        }
    }
}

/// `TESSERA_WAIT_TIMEOUT` is the default of [`World::wait_timeout`]. The variable is
/// set only in a child process (this test binary, running just this test), so no
/// other test sees it.
#[test]
fn wait_timeout_from_environment() {
    const CHILD: &str = "TESSERA_COMM_TEST_CHILD";
    if std::env::var_os(CHILD).is_some() {
        assert_eq!(
            tessera::config::get().unwrap().wait_timeout,
            Duration::from_millis(400)
        );
        let t = Instant::now();
        let err = World::local(2)
            .heap_bytes(1 << 20)
            .signal_bytes(4096)
            .run(|r| {
                let mut sig = r.alloc_signals(1)?;
                never_signalled::launch(r.device(), 1u32, (&mut sig, 1u64))
            })
            .unwrap_err();
        assert!(err.to_string().contains("timed out after 0.400 s"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "wait_timeout_from_environment",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("TESSERA_WAIT_TIMEOUT", "400ms")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
}

/// A rank whose closure panics releases the others at once (they would otherwise wait
/// for it until the timeout) and is reported as the failure.
#[test]
fn panicking_rank_releases_the_world() {
    let t = Instant::now();
    let err = world(2)
        .run(|r| {
            let mut sig = r.alloc_signals(1)?;
            if r.rank() == 1 {
                std::thread::sleep(Duration::from_millis(50));
                panic!("rank 1 gives up");
            }
            // Waits for rank 1's signal, which never comes.
            never_signalled::launch(r.device(), 1u32, (&mut sig, 1u64))
        })
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let msg = err.to_string();
    assert!(
        matches!(err, Error::Comm { rank: 1, .. })
            && msg.contains("panicked")
            && msg.contains("rank 1 gives up"),
        "{msg}"
    );
}

/// Symmetric allocation is collective: a rank that allocates late cannot wipe (zero or
/// upload over) what a fast rank already put into its copy.
#[test]
fn allocation_waits_for_every_rank() {
    const B: usize = 32;
    let mut g = rng(1100);
    let init: Vec<f32> = (0..B).map(|_| g.gen_range(-10.0..10.0)).collect();
    let out = World::local(2)
        .heap_bytes(1 << 20)
        .signal_bytes(4096)
        .wait_timeout(Duration::from_secs(5))
        .run(|r| {
            if r.rank() == 1 {
                std::thread::sleep(Duration::from_millis(100));
            }
            let start = if r.rank() == 0 {
                init.clone()
            } else {
                vec![f32::NAN; B]
            };
            let mut data = r.upload(&start)?;
            let mut sig = r.alloc_signals(2)?;
            if r.rank() == 1 {
                std::thread::sleep(Duration::from_millis(100));
            }
            ping_pong_pairs::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, 3, B as i32))?;
            data.download()
        })
        .unwrap();
    for i in 0..B {
        assert_eq!(out[0][i], add_ones(init[i], 3), "rank 0 [{i}]");
        assert_eq!(out[1][i], add_ones(init[i], 2), "rank 1 [{i}]");
    }
}

#[kernel]
fn lonely_barrier() {
    barrier_all(); // MARK: lonely-barrier
}

/// A rank that never reaches `barrier_all`: the others time out with the arrival
/// count in the message.
#[test]
fn barrier_all_with_a_missing_rank_times_out() {
    let t = Instant::now();
    let err = World::local(3)
        .heap_bytes(1 << 20)
        .signal_bytes(4096)
        .wait_timeout(Duration::from_secs(1))
        .run(|r| {
            if r.rank() != 2 {
                lonely_barrier::launch(r.device(), 2u32, ())?;
            }
            Ok(())
        })
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    let msg = err.to_string();
    let line = line_of(SOURCE, "MARK: lonely-barrier");
    for part in [
        format!("tests/tests/comm.rs:{line}:"),
        "`barrier_all` timed out after 1.000 s".to_string(),
        "arrivals of all 6 program instances (3 rank(s) x 2; 4 arrived)".to_string(),
        "expected >= 6, observed 4".to_string(),
    ] {
        assert!(msg.contains(&part), "{part:?} missing from: {msg}");
    }
}

/// Every program writes `round` into its slot of rank 0's `slots`, passes a
/// `barrier_all`, then reads every slot: all must hold `round`. Slots that do not are
/// counted in rank 0's `bad[0]`.
#[kernel]
fn tagged_barrier(slots: &mut Symmetric<i32>, bad: &mut Symmetric<i32>, round: i32) {
    let np = num_programs(0);
    let me = rank() * np + program_id(0);
    slots.on(0).store_unmasked(me, round + zeros::<i32, ()>());
    barrier_all();
    let offs = arange::<64>();
    let mask = offs.lt(np * world_size());
    let seen = slots.on(0).load(offs, mask);
    let wrong = select(mask & seen.ne(round), 1i32, 0i32).reduce::<0>(ReduceOp::Sum);
    bad.on(0).atomic_add(0, wrong, me.ge(0));
    // Nobody may overwrite its slot for the next round before everyone has checked.
    barrier_all();
}

#[test]
fn barrier_all_with_different_grids_in_one_world() {
    // Kernels with 2 to 7 programs per rank share one world's barrier state: each
    // barrier must count its own participants (a stale count from a kernel with
    // another grid would release it early and the checks would see old tags).
    let bad = world(4)
        .run(|r| {
            let mut slots = r.alloc::<i32>(64)?;
            let mut bad = r.alloc::<i32>(1)?;
            let mut round = 1;
            for grid in [3u32, 5, 2, 7, 3, 5, 6] {
                for _ in 0..3 {
                    tagged_barrier::launch(r.device(), grid, (&mut slots, &mut bad, round))?;
                    round += 1;
                }
            }
            r.barrier()?;
            bad.download()
        })
        .unwrap();
    assert_eq!(bad[0], vec![0], "programs saw stale tags after barrier_all");
}

/// Stores a tile into this rank's copy of `data` through `on(rank())`: `data` is
/// read-only (`&Symmetric`), so the kernel must not build.
#[kernel]
fn store_through_readonly_peer(data: &Symmetric<i32>) {
    let offs = arange::<16>();
    data.on(rank()).store(offs, offs, offs.lt(16)); // MARK: readonly store
}

/// The same with an atomic on the next rank's copy.
#[kernel]
fn atomic_through_readonly_peer(data: &Symmetric<i32>) {
    let offs = arange::<16>();
    let next = (rank() + 1) % world_size();
    let _old = data.on(next).atomic_add(offs, offs, offs.lt(16)); // MARK: readonly atomic
}

#[test]
fn a_read_only_symmetric_cannot_be_written_through_a_peer_copy() {
    for (marker, expect) in [
        ("MARK: readonly store", "`store`"),
        ("MARK: readonly atomic", "`atomic"),
    ] {
        let original: Vec<i32> = (0..16).map(|i| 1000 + i).collect();
        let out = World::local(2)
            .heap_bytes(1 << 20)
            .signal_bytes(4096)
            .run(|r| {
                let data = r.upload(&original)?;
                let launched = if marker.ends_with("store") {
                    store_through_readonly_peer::launch(r.device(), 1u32, (&data,))
                } else {
                    atomic_through_readonly_peer::launch(r.device(), 1u32, (&data,))
                };
                r.barrier()?;
                Ok((launched.err().map(|e| e.to_string()), data.download()?))
            })
            .unwrap();
        let line = line_of(SOURCE, marker);
        for (e, data) in out {
            let e = e.expect("writing through a read-only buffer must not build");
            assert!(
                e.contains(expect)
                    && e.contains("`data`, a read-only parameter")
                    && e.contains(&format!("comm.rs:{line}:")),
                "{e}"
            );
            // The user's mistake, not Tessera's.
            assert!(
                e.starts_with("cannot build kernel") && !e.contains("internal error"),
                "{e}"
            );
            assert_eq!(data, original, "nothing was written");
        }
    }
}

//! Device-side communication on the SIMT emulator (`emu-nv`, `emu-amd`), with 2 and 4
//! ranks: the real lowering of `signal`, `wait_until`, `barrier_all` and `remote_ptr`
//! runs JIT-compiled, GPU threads as coroutines, every block of a waiting kernel live
//! at once. Ping-pong, ring exchange, a message-passing litmus, remote atomics, repeated
//! `barrier_all`, a missing signal (timeout naming the wait's line, the peer's
//! failure recognised as a consequence) and a bad peer.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera::{EmuKind, Error};
use tessera_tests::kernels::ping_pong;

const CONFIGS: [(EmuKind, usize); 4] = [
    (EmuKind::Nv, 2),
    (EmuKind::Nv, 4),
    (EmuKind::Amd, 2),
    (EmuKind::Amd, 4),
];

fn world(kind: EmuKind, n: usize) -> World {
    let d = Device::emu(kind).expect("the emulator is always available");
    World::local(n)
        .on(&d)
        .heap_bytes(4 << 20)
        .signal_bytes(64 << 10)
        .wait_timeout(Duration::from_secs(20))
}

fn random_f32(seed: u64, n: usize) -> Vec<f32> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-8.0f32..8.0)).collect()
}

#[test]
fn ping_pong_on_the_emulator() {
    const B: usize = 64;
    for (kind, n) in CONFIGS {
        let init = random_f32(7 + n as u64, B);
        let out = world(kind, n)
            .run(|r| {
                let mut data = r.upload(&if r.rank() == 0 {
                    init.clone()
                } else {
                    vec![f32::NAN; B]
                })?;
                let mut sig = r.alloc_signals(2)?;
                ping_pong::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, 5))?;
                data.download()
            })
            .unwrap_or_else(|e| panic!("{kind:?} x{n}: {e}"));
        let want: Vec<f32> = init.iter().map(|x| x + 5.0).collect();
        assert_eq!(out[0], want, "{kind:?} x{n}");
        // Rank 1 holds the last tile it received: the 5th serve.
        let last: Vec<f32> = init.iter().map(|x| x + 4.0).collect();
        assert_eq!(out[1], last, "{kind:?} x{n}");
    }
}

/// Ring: program `p` of every rank sends its part of `src` to the right neighbour's
/// `dst` and signals word `p` there; then waits for its left neighbour's part and
/// copies it (doubled) to `out`.
#[kernel]
fn ring<const B: usize>(
    src: &Symmetric<f32>,
    dst: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    out: &mut Global<f32>,
    round: u64,
) {
    let me = rank();
    let right = (me + 1) % world_size();
    let pid = program_id(0);
    let offs = pid * B as i32 + arange::<B>();
    let all = offs.ge(0);
    let v = src.load(offs, all);
    dst.put_signal(right, offs, v, all, sig, pid, round, SignalOp::Set);
    sig.wait_until(pid, CmpPred::Ge, round);
    let got = dst.load(offs, all);
    out.store(offs, got * 2.0f32, all);
}

#[test]
fn ring_exchange_on_the_emulator() {
    const B: usize = 32;
    const P: usize = 2;
    for (kind, n) in CONFIGS {
        let res = world(kind, n)
            .run(|r| {
                let mut got = Vec::new();
                let mut dst = r.alloc::<f32>(B * P)?;
                let mut sig = r.alloc_signals(P)?;
                let mut out = r.device().upload(&vec![f32::NAN; B * P])?;
                for round in 1..=3u64 {
                    let mine = random_f32(round * 100 + r.rank() as u64, B * P);
                    let src = r.upload(&mine)?;
                    ring::<B>::launch(
                        r.device(),
                        P as u32,
                        (&src, &mut dst, &mut sig, &mut out, round),
                    )?;
                    got.push(out.download()?);
                    // Nobody overwrites `dst` before everyone read it.
                    r.barrier()?;
                }
                Ok(got)
            })
            .unwrap_or_else(|e| panic!("{kind:?} x{n}: {e}"));
        for (me, rounds) in res.iter().enumerate() {
            let left = (me + n - 1) % n;
            for (i, got) in rounds.iter().enumerate() {
                let sent = random_f32((i as u64 + 1) * 100 + left as u64, B * P);
                let want: Vec<f32> = sent.iter().map(|x| x * 2.0).collect();
                assert_eq!(got, &want, "{kind:?} x{n} rank {me} round {}", i + 1);
            }
        }
    }
}

/// Message passing: message `i` (a tile) goes to the right neighbour's slot `i`, then
/// the flag is set to `epoch * 1000 + i + 1` (release); the receiver waits for the
/// flag (acquire) and must see the whole message. Counts wrong elements.
#[kernel]
fn litmus<const B: usize>(
    data: &mut Symmetric<i32>,
    flag: &mut Symmetric<u64>,
    out: &mut Global<i32>,
    iters: i32,
    epoch: i32,
) {
    let me = rank();
    let n = world_size();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let lanes = arange::<B>();
    let all = lanes.ge(0);
    let mut bad = zeros::<i32, ()>();
    for i in 0..iters {
        let offs = i * B as i32 + lanes;
        let stamp = epoch * 100000 + i * 1000;
        data.put(right, offs, lanes * 7 + stamp + me, all);
        let f = (epoch * 1000 + i + 1).cast::<u64>();
        flag.signal(right, 0, f, SignalOp::Set);
        flag.wait_until(0, CmpPred::Ge, f);
        let got = data.load(offs, all);
        let want = lanes * 7 + stamp + left;
        bad += got.ne(want).cast::<i32>().sum::<0>();
    }
    out.store(0, bad, me.ge(0));
}

#[test]
fn message_passing_litmus_on_the_emulator() {
    const B: usize = 64;
    const ITERS: usize = 12;
    for (kind, n) in CONFIGS {
        let res = world(kind, n)
            .run(|r| {
                let mut data = r.alloc::<i32>(B * ITERS)?;
                let mut flag = r.alloc_signals(1)?;
                let mut bad = Vec::new();
                for epoch in 1..=3 {
                    let mut out = r.device().upload(&[-1i32])?;
                    litmus::<B>::launch(
                        r.device(),
                        1u32,
                        (&mut data, &mut flag, &mut out, ITERS as i32, epoch),
                    )?;
                    bad.push(out.download()?[0]);
                    r.barrier()?;
                }
                Ok(bad)
            })
            .unwrap_or_else(|e| panic!("{kind:?} x{n}: {e}"));
        for (me, bad) in res.iter().enumerate() {
            assert_eq!(bad, &vec![0; 3], "{kind:?} x{n} rank {me}: stale elements");
        }
    }
}

/// Every program of every rank adds 1 to rank 0's counter `iters` times (remote
/// atomics), then `barrier_all`, then reads the counter.
#[kernel]
fn count(counter: &mut Symmetric<u64>, seen: &mut Global<u64>, iters: i32) {
    let yes = rank().ge(0);
    let mut c0 = counter.on(0);
    for _i in 0..iters {
        c0.atomic_add(0, zeros::<u64, ()>() + 1u64, yes);
    }
    barrier_all();
    let v = counter.get(0, 0, yes);
    seen.store(program_id(0), v, yes);
}

#[test]
fn remote_atomics_count_exactly_on_the_emulator() {
    const ITERS: i32 = 25;
    const P: usize = 2;
    for (kind, n) in CONFIGS {
        let res = world(kind, n)
            .run(|r| {
                let mut counter = r.alloc::<u64>(4)?;
                let mut seen = r.device().upload(&[u64::MAX; P])?;
                count::launch(r.device(), P as u32, (&mut counter, &mut seen, ITERS))?;
                let s = seen.download()?;
                r.barrier()?;
                Ok((s, counter.download()?))
            })
            .unwrap_or_else(|e| panic!("{kind:?} x{n}: {e}"));
        let total = (n * P) as u64 * ITERS as u64;
        assert_eq!(res[0].1, vec![total, 0, 0, 0], "{kind:?} x{n} counter");
        for (me, (seen, local)) in res.iter().enumerate() {
            assert_eq!(
                seen,
                &vec![total; P],
                "{kind:?} x{n} rank {me} after barrier_all"
            );
            if me != 0 {
                assert_eq!(local, &vec![0; 4], "{kind:?} x{n} rank {me} counter");
            }
        }
    }
}

/// `reps` rounds: write `rank * 1000 + k` into slot `rank` of every peer,
/// `barrier_all`, check every slot, `barrier_all`. Counts wrong slots.
#[kernel]
fn all_to_all<const B: usize>(buf: &mut Symmetric<i32>, out: &mut Global<i32>, reps: i32) {
    let me = rank();
    let n = world_size();
    let yes = me.ge(0);
    let lanes = arange::<B>();
    let valid = lanes.lt(n);
    let mut bad = zeros::<i32, ()>();
    for k in 0..reps {
        for p in 0..n {
            buf.put(p, me, me * 1000 + k, yes);
        }
        barrier_all();
        let got = buf.load_or(lanes, valid, 0);
        let want = select(valid, lanes * 1000 + k, 0);
        bad += got.ne(want).cast::<i32>().sum::<0>();
        barrier_all();
    }
    out.store(program_id(0), bad, yes);
}

#[test]
fn barrier_all_repeated_on_the_emulator() {
    const B: usize = 32;
    const P: usize = 2;
    for (kind, n) in CONFIGS {
        let res = world(kind, n)
            .run(|r| {
                let mut buf = r.alloc::<i32>(B)?;
                let mut out = r.device().upload(&[-1i32; P])?;
                all_to_all::<B>::launch(r.device(), P as u32, (&mut buf, &mut out, 6))?;
                out.download()
            })
            .unwrap_or_else(|e| panic!("{kind:?} x{n}: {e}"));
        for (me, bad) in res.iter().enumerate() {
            assert_eq!(bad, &vec![0; P], "{kind:?} x{n} rank {me}");
        }
    }
}

/// Rank 1 waits for a signal nobody sends; rank 0 (launched once rank 1 waits)
/// waits for one rank 1 would send afterwards, and is released by rank 1's failure.
#[kernel]
fn missing_signal(sig: &mut Symmetric<u64>, out: &mut Global<u64>) {
    let me = rank();
    let yes = me.ge(0);
    if me.eq(1) {
        // Tell rank 0's host that this wait is about to start.
        sig.signal(0, 2, 1u64, SignalOp::Set);
        let v = sig.wait_until(0, CmpPred::Eq, 42u64).value(); // MISSING-SIGNAL-WAIT
        sig.signal(0, 1, 1u64, SignalOp::Set);
        out.store(0, v, yes);
    } else {
        let v = sig.wait_until(1, CmpPred::Ge, 1u64).value();
        out.store(0, v, yes);
    }
}

/// The line of the wait marked `MISSING-SIGNAL-WAIT` in this file.
fn marked_line() -> usize {
    include_str!("comm_emu.rs")
        .lines()
        .position(|l| l.contains("MISSING-SIGNAL-WAIT") && l.contains("wait_until"))
        .expect("the marker is in this file")
        + 1
}

#[test]
fn a_missing_signal_times_out_naming_the_wait() {
    let line = marked_line();
    for kind in [EmuKind::Nv, EmuKind::Amd] {
        let errors = Mutex::new(vec![String::new(); 2]);
        let start = std::time::Instant::now();
        let err = world(kind, 2)
            .wait_timeout(Duration::from_millis(1500))
            .run(|r| {
                let mut sig = r.alloc_signals(3)?;
                // Plant a value that does not satisfy the wait.
                sig.copy_from(&[41, 0, 0])?;
                r.barrier()?;
                let mut out = r.device().upload(&[u64::MAX])?;
                if r.rank() == 0 {
                    // Start once rank 1 waits: rank 1 times out first and releases
                    // this wait.
                    while sig.download()?[2] == 0 {
                        if start.elapsed() > Duration::from_secs(60) {
                            return Err(Error::Comm {
                                rank: 0,
                                message: "rank 1 never started waiting".into(),
                            });
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    // A head start of a third of the timeout: rank 1's timeout (and the
                    // abort it raises) must come first even when the 2 cores are busy
                    // with other tests (with a few milliseconds, rank 0's own timeout
                    // sometimes won).
                    std::thread::sleep(Duration::from_millis(500));
                }
                let res = missing_signal::launch(r.device(), 1u32, (&mut sig, &mut out));
                if let Err(e) = &res {
                    errors.lock().unwrap()[r.rank() as usize] = e.to_string();
                }
                res
            })
            .expect_err("the wait cannot succeed");
        let elapsed = start.elapsed();
        let msg = err.to_string();
        let errors = errors.into_inner().unwrap();
        // The root cause (rank 1's timeout) is returned, not rank 0's consequence.
        assert!(
            msg.contains(&format!("comm_emu.rs:{line}:")),
            "{kind:?}: {msg}"
        );
        assert!(msg.contains("timed out"), "{kind:?}: {msg}");
        assert!(msg.contains("rank 1"), "{kind:?}: {msg}");
        assert!(msg.contains("== 42"), "{kind:?}: {msg}");
        assert!(msg.contains("observed 41"), "{kind:?}: {msg}");
        assert!(msg.contains("missing_signal"), "{kind:?}: {msg}");
        assert!(
            errors[0].contains("abandoned") && errors[0].contains("rank 1 failed"),
            "{kind:?}: rank 0 got: {}",
            errors[0]
        );
        assert!(elapsed < Duration::from_secs(15), "{kind:?}: {elapsed:?}");
    }
}

/// `buf.on(peer)` with a peer outside the world.
#[kernel]
fn bad_peer<const B: usize>(data: &mut Symmetric<f32>, peer: i32) {
    let offs = arange::<B>();
    data.put(peer, offs, zeros::<f32, S1<B>>() + 1.0f32, offs.ge(0));
}

#[test]
fn a_bad_peer_is_reported() {
    for (kind, n) in [(EmuKind::Nv, 2), (EmuKind::Amd, 4)] {
        let err = world(kind, n)
            .run(|r| {
                let mut data = r.alloc::<f32>(32)?;
                bad_peer::<32>::launch(r.device(), 1u32, (&mut data, n as i32 + 3))?;
                data.download()
            })
            .expect_err("peer out of range");
        let msg = err.to_string();
        assert!(matches!(err, Error::Emu(_)), "{kind:?}: {msg}");
        assert!(
            msg.contains(&format!("peer {} is outside the world of {n}", n + 3)),
            "{kind:?}: {msg}"
        );
        assert!(msg.contains("comm_emu.rs:"), "{kind:?}: {msg}");
        assert!(msg.contains("rank 0"), "{kind:?}: {msg}");
    }
}

/// `rank()` and `world_size()` in every program.
#[kernel]
fn whoami(out: &mut Global<i32>) {
    let pid = program_id(0);
    out.store(pid, rank() * 10 + world_size(), pid.ge(0));
}

#[test]
fn rank_and_world_size_inside_and_outside_a_world() {
    for kind in [EmuKind::Nv, EmuKind::Amd] {
        // Outside a world: rank 0 of 1.
        let d = Device::emu(kind).unwrap();
        let mut out = d.upload(&[-1i32; 3]).unwrap();
        whoami::launch(&d, 3u32, (&mut out,)).unwrap();
        assert_eq!(out.download().unwrap(), vec![1; 3], "{kind:?}");
        let res = world(kind, 4)
            .run(|r| {
                let mut out = r.device().upload(&[-1i32; 3])?;
                whoami::launch(r.device(), 3u32, (&mut out,))?;
                out.download()
            })
            .unwrap();
        for (me, got) in res.iter().enumerate() {
            assert_eq!(got, &vec![me as i32 * 10 + 4; 3], "{kind:?} rank {me}");
        }
    }
}

/// As the interpreter test of the same name: each program tags its slot of rank 0's
/// `slots`, passes `barrier_all`, and counts slots that miss the tag.
#[kernel]
fn tagged_barrier(slots: &mut Symmetric<i32>, bad: &mut Symmetric<i32>, round: i32) {
    let np = num_programs(0);
    let me = rank() * np + program_id(0);
    slots.on(0).store_unmasked(me, round + zeros::<i32, ()>());
    barrier_all();
    let offs = arange::<32>();
    let mask = offs.lt(np * world_size());
    let seen = slots.on(0).load(offs, mask);
    let wrong = select(mask & seen.ne(round), 1i32, 0i32).reduce::<0>(ReduceOp::Sum);
    bad.on(0).atomic_add(0, wrong, me.ge(0));
    barrier_all();
}

#[test]
fn barrier_all_with_different_grids_on_the_emulator() {
    // 2 ranks x (3, then 2, then 3) programs: the generation barrier counts each
    // barrier's own participants.
    for kind in [EmuKind::Nv, EmuKind::Amd] {
        let bad = world(kind, 2)
            .run(|r| {
                let mut slots = r.alloc::<i32>(32)?;
                let mut bad = r.alloc::<i32>(1)?;
                for (round, grid) in [3u32, 2, 3].into_iter().enumerate() {
                    tagged_barrier::launch(
                        r.device(),
                        grid,
                        (&mut slots, &mut bad, round as i32 + 1),
                    )?;
                }
                r.barrier()?;
                bad.download()
            })
            .unwrap();
        assert_eq!(bad[0], vec![0], "{kind:?}: stale tags after barrier_all");
    }
}

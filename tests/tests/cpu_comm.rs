//! Communicating kernels compiled for the CPU (`codegen::cpu::launch_with` in a world): remote
//! stores and loads straight into the peers' copies, signals and waits, `barrier_all`,
//! and their failures (a wait that times out, a peer outside the world, an access past
//! a peer's copy), each against the interpreter running the same ranks. The ranks are
//! threads of this process sharing hand-made control words and symmetric buffers, so
//! these tests call the compiled device directly: nothing falls back unnoticed.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::codegen::cpu::{self, CpuError};
use tessera::ir::interp::{self, CommWorld, HostBuffer, KernelArg, Scalar, ctrl};
use tessera::prelude::*;
use tessera_tests::line_of;

const SOURCE: &str = include_str!("cpu_comm.rs");

/// Each program sends its block, scaled by `rank + 1`, to the next rank's `inbox`
/// (a masked remote store), signals it, waits for the block from the previous rank,
/// then reads it back from its own copy and, through `remote_ptr`, the next rank's
/// copy of `x` (a remote load), and writes both to `out`.
#[kernel]
fn ring_exchange<const B: usize>(
    x: &mut Symmetric<f32>,
    inbox: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    out: &mut Global<f32>,
    n: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let next = (me + 1) % ws;
    let pid = program_id(0);
    let offs = pid * B + arange::<B>();
    let mask = offs.lt(n);
    let v = x.load(offs, mask);
    inbox.put(next, offs, v * (me + 1).cast::<f32>(), mask);
    sig.signal(next, pid, epoch, SignalOp::Set);
    sig.wait_until(pid, CmpPred::Ge, epoch);
    let got = inbox.load(offs, mask);
    let theirs = x.get(next, offs, mask);
    out.store(offs, got + theirs * 1000.0, mask);
}

/// Every program adds its rank's contribution to rank 0's `acc` slot of its own, then
/// `barrier_all`; after it, every program reads the sums back (visible on every rank).
#[kernel]
fn barrier_sum<const B: usize>(acc: &mut Symmetric<f32>, out: &mut Global<f32>, round: i32) {
    let me = rank();
    let pid = program_id(0);
    let offs = pid * B + arange::<B>();
    let all = offs.ge(0);
    // Rank r writes its column of the table on rank 0: `acc[(r * programs + pid) * B + i]`.
    let slot = (me * num_programs(0) + pid) * B + arange::<B>();
    acc.put(0, slot, (offs + me * 100 + round * 1000).cast::<f32>(), all);
    barrier_all();
    let mut s = zeros::<f32, S1<B>>();
    for r in 0..world_size() {
        s = s + acc.get(0, (r * num_programs(0) + pid) * B + arange::<B>(), all);
    }
    out.store(offs, s, all);
}

/// Waits for a signal nobody sends.
#[kernel]
fn waits_forever(sig: &mut Symmetric<u64>) {
    sig.wait_until(1, CmpPred::Eq, 7u64); // NEVER_SIGNALLED
}

/// Sends to a peer outside the world.
#[kernel]
fn bad_peer(x: &mut Symmetric<f32>) {
    let offs = arange::<8>();
    x.put(world_size(), offs, full::<f32, S1<8>>(1.0), offs.lt(8)); // BAD_PEER
}

/// Stores one element past the end of the next rank's copy.
#[kernel]
fn remote_off_by_one<const B: usize>(x: &mut Symmetric<f32>, n: i32) {
    let next = (rank() + 1) % world_size();
    let offs = arange::<B>();
    x.put(next, offs + 1, full::<f32, S1<B>>(2.0), offs.lt(n)); // REMOTE_OOB
}

fn ir<K: Kernel<Comptime = ()>>() -> Arc<tessera::ir::Function> {
    tessera::kernel_ir::<K>(&()).expect("kernel builds")
}

/// The control words of a world of `n` thread ranks and their views of it.
fn worlds(n: u32, timeout: Duration) -> Vec<CommWorld> {
    let ctrl: Arc<[Arc<HostBuffer>]> = (0..n)
        .map(|_| Arc::new(HostBuffer::new(tessera::ir::ScalarType::U64, ctrl::WORDS)))
        .collect();
    (0..n)
        .map(|rank| CommWorld {
            rank,
            size: n,
            ctrl: Arc::clone(&ctrl),
            timeout,
        })
        .collect()
}

fn symmetric<T: tessera::ir::interp::Element>(per_rank: &[Vec<T>]) -> Arc<[Arc<HostBuffer>]> {
    per_rank
        .iter()
        .map(|v| Arc::new(HostBuffer::from_slice(v)))
        .collect()
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Runner {
    Compiled { sanitize: bool },
    Interpreter,
}

/// Runs `f` on every rank at once (one thread each); `args(rank)` gives a rank's
/// arguments. Returns each rank's result.
fn run_ranks(
    f: &tessera::ir::Function,
    grid: [u32; 3],
    worlds: &[CommWorld],
    args: &[Vec<KernelArg>],
    runner: Runner,
) -> Vec<Result<(), String>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = worlds
            .iter()
            .zip(args)
            .map(|(w, a)| {
                s.spawn(move || match runner {
                    Runner::Compiled { sanitize } => {
                        let launch = cpu::CpuLaunch {
                            grid,
                            args: a,
                            world: Some(w),
                            ..Default::default()
                        };
                        let ran = match cpu::compile(f, sanitize) {
                            Ok(k) => cpu::launch_with(&k, &launch),
                            Err(e) => Err(e),
                        };
                        ran.map_err(|e| match e {
                            CpuError::Exec(e) => e.to_string(),
                            e => panic!("not compiled: {e}"),
                        })
                    }
                    Runner::Interpreter => {
                        interp::run_in_world(f, grid, a, Some(w)).map_err(|e| e.to_string())
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

const RUNNERS: [Runner; 3] = [
    Runner::Compiled { sanitize: false },
    Runner::Compiled { sanitize: true },
    Runner::Interpreter,
];

#[test]
fn remote_stores_loads_signals_and_waits_match_the_interpreter() {
    let mut rng = StdRng::seed_from_u64(11);
    for ranks in [2u32, 3] {
        // A ragged last block, and more programs than the machine has cores.
        let n: usize = 16 * 13 + 5;
        let programs = n.div_ceil(16) as u32;
        let xs: Vec<Vec<f32>> = (0..ranks)
            .map(|_| (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect())
            .collect();
        let mut results = Vec::new();
        for runner in RUNNERS {
            let ws = worlds(ranks, Duration::from_secs(20));
            let x = symmetric(&xs);
            let inbox = symmetric(&vec![vec![f32::NAN; n]; ranks as usize]);
            // Stale signals from an earlier epoch: `set` must replace them.
            let sig = symmetric(&vec![vec![1u64; programs as usize]; ranks as usize]);
            let outs: Vec<Arc<HostBuffer>> = (0..ranks)
                .map(|_| Arc::new(HostBuffer::from_slice(&vec![f32::NAN; n])))
                .collect();
            let args: Vec<Vec<KernelArg>> = (0..ranks as usize)
                .map(|r| {
                    vec![
                        KernelArg::Symmetric(Arc::clone(&x)),
                        KernelArg::Symmetric(Arc::clone(&inbox)),
                        KernelArg::Symmetric(Arc::clone(&sig)),
                        KernelArg::Buffer(Arc::clone(&outs[r])),
                        KernelArg::Scalar(Scalar::I32(n as i32)),
                        KernelArg::Scalar(Scalar::U64(3)),
                    ]
                })
                .collect();
            let f = ir::<ring_exchange<16>>();
            for r in run_ranks(&f, [programs, 1, 1], &ws, &args, runner) {
                r.unwrap_or_else(|e| panic!("{runner:?}: {e}"));
            }
            let got: Vec<Vec<f32>> = outs.iter().map(|o| o.to_vec::<f32>().unwrap()).collect();
            // Against the host: rank r received rank r-1's block times r, and read
            // rank r+1's x.
            for (r, mine) in got.iter().enumerate() {
                let prev = (r + ranks as usize - 1) % ranks as usize;
                let next = (r + 1) % ranks as usize;
                for (i, g) in mine.iter().enumerate() {
                    let want = xs[prev][i] * (prev + 1) as f32 + xs[next][i] * 1000.0;
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{runner:?}, {ranks} ranks: rank {r} element {i}"
                    );
                }
            }
            // Every signal word holds the epoch.
            for (r, s) in sig.iter().enumerate() {
                assert!(
                    s.to_vec::<u64>().unwrap().iter().all(|&v| v == 3),
                    "{runner:?}: rank {r}'s signals"
                );
            }
            results.push(got);
        }
        assert_eq!(results[0], results[2]);
    }
}

#[test]
fn barrier_all_orders_every_ranks_stores_before_every_later_load() {
    const B: usize = 8;
    // More programs than worker threads, so that programs wait on one thread while
    // the others arrive (as coroutines).
    let programs = 9u32;
    for runner in RUNNERS {
        let ranks = 3u32;
        let ws = worlds(ranks, Duration::from_secs(20));
        let table = vec![f32::NAN; ranks as usize * programs as usize * B];
        let acc = symmetric(&vec![table; ranks as usize]);
        let outs: Vec<Arc<HostBuffer>> = (0..ranks)
            .map(|_| {
                Arc::new(HostBuffer::from_slice(&vec![
                    f32::NAN;
                    programs as usize * B
                ]))
            })
            .collect();
        let f = ir::<barrier_sum<B>>();
        // Several rounds on the same control words (the barrier's count starts over),
        // each writing new values: a read before the barrier sees the last round's.
        for round in 0..4 {
            let args: Vec<Vec<KernelArg>> = (0..ranks as usize)
                .map(|r| {
                    vec![
                        KernelArg::Symmetric(Arc::clone(&acc)),
                        KernelArg::Buffer(Arc::clone(&outs[r])),
                        KernelArg::Scalar(Scalar::I32(round)),
                    ]
                })
                .collect();
            for r in run_ranks(&f, [programs, 1, 1], &ws, &args, runner) {
                r.unwrap_or_else(|e| panic!("{runner:?}: {e}"));
            }
            for (r, o) in outs.iter().enumerate() {
                let got = o.to_vec::<f32>().unwrap();
                for (i, &g) in got.iter().enumerate() {
                    let want: f32 = (0..ranks)
                        .map(|q| (i as u32 + q * 100 + round as u32 * 1000) as f32)
                        .sum();
                    assert_eq!(g, want, "{runner:?} round {round}: rank {r} element {i}");
                }
            }
        }
    }
}

#[test]
fn a_wait_nobody_answers_times_out_with_the_interpreters_message() {
    let f = ir::<waits_forever>();
    let mut msgs = Vec::new();
    for runner in RUNNERS {
        let ws = worlds(1, Duration::from_millis(300));
        let sig = symmetric(&[vec![5u64, 6, 0]]);
        let args = vec![vec![KernelArg::Symmetric(sig)]];
        let t = std::time::Instant::now();
        let r = run_ranks(&f, [3, 1, 1], &ws, &args, runner);
        assert!(t.elapsed() < Duration::from_secs(10), "{runner:?}: bounded");
        let e = r[0].clone().expect_err("times out");
        assert!(
            e.contains(&format!(":{}:", line_of(SOURCE, "NEVER_SIGNALLED"))),
            "{runner:?}: {e}"
        );
        assert!(e.contains("signal `sig`[1]"), "{runner:?}: {e}");
        assert!(e.contains("== 7"), "{runner:?}: {e}");
        msgs.push(e);
    }
    // The same message but for which program timed out first (all three wait; the
    // first to time out aborts the others, and which one that is depends on timing).
    let unpid = |m: &str| {
        let (head, tail) = m.split_once("program_id (").expect("program id");
        let (_, tail) = tail.split_once(')').expect("program id");
        format!("{head}{tail}")
    };
    assert_eq!(unpid(&msgs[0]), unpid(&msgs[2]), "compiled and interpreted");
    assert_eq!(unpid(&msgs[0]), unpid(&msgs[1]), "sanitized or not");
}

#[test]
fn a_peer_outside_the_world_is_reported() {
    let f = ir::<bad_peer>();
    let mut msgs = Vec::new();
    for runner in RUNNERS {
        let ws = worlds(2, Duration::from_secs(5));
        let x = symmetric(&[vec![0f32; 8], vec![0f32; 8]]);
        let args = vec![vec![KernelArg::Symmetric(Arc::clone(&x))]; 2];
        let r = run_ranks(&f, [1, 1, 1], &ws, &args, runner);
        let e = r[0].clone().expect_err("bad peer");
        assert!(
            e.contains(&format!(":{}:", line_of(SOURCE, "BAD_PEER"))),
            "{runner:?}: {e}"
        );
        assert!(e.contains('2'), "{runner:?}: {e}");
        msgs.push(e);
        // Nothing was written anywhere.
        for c in x.iter() {
            assert_eq!(c.to_vec::<f32>().unwrap(), vec![0f32; 8]);
        }
    }
    assert_eq!(msgs[0], msgs[1]);
}

#[test]
fn the_sanitizer_catches_a_store_past_a_peers_copy() {
    let f = ir::<remote_off_by_one<16>>();
    let ws = worlds(2, Duration::from_secs(5));
    let x = symmetric(&[vec![0f32; 16], vec![0f32; 16]]);
    let args = vec![
        vec![
            KernelArg::Symmetric(Arc::clone(&x)),
            KernelArg::Scalar(Scalar::I32(16)),
        ];
        2
    ];
    for runner in [Runner::Compiled { sanitize: true }, Runner::Interpreter] {
        let r = run_ranks(&f, [1, 1, 1], &ws, &args, runner);
        for (rank, r) in r.iter().enumerate() {
            let e = r.clone().expect_err("out of bounds");
            assert!(
                e.contains(&format!(":{}:", line_of(SOURCE, "REMOTE_OOB"))),
                "{runner:?} rank {rank}: {e}"
            );
            assert!(e.contains("16"), "{runner:?} rank {rank}: {e}");
        }
    }
    // In bounds, the same kernel runs (and fills elements 1.. of each copy).
    let args16 = vec![
        vec![
            KernelArg::Symmetric(Arc::clone(&x)),
            KernelArg::Scalar(Scalar::I32(15)),
        ];
        2
    ];
    for r in run_ranks(
        &f,
        [1, 1, 1],
        &ws,
        &args16,
        Runner::Compiled { sanitize: true },
    ) {
        r.expect("in bounds");
    }
    for c in x.iter() {
        let v = c.to_vec::<f32>().unwrap();
        assert_eq!(v[0], 0.0);
        assert!(v[1..].iter().all(|&e| e == 2.0), "{v:?}");
    }
}

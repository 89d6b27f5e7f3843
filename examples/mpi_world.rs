//! The MPI transport's suite: run it as an MPI job, e.g. with every byte on the
//! network path (no shared memory between the processes):
//!
//! ```text
//! cargo build -p tessera-examples --features mpi --example mpi_world
//! mpirun -np 4 --mca pml ob1 --mca btl self,tcp --mca osc pt2pt \
//!     target/debug/examples/mpi_world
//! ```
//!
//! Each process joins the MPI world (`World::launched`, which sees `mpirun`) and runs
//! every case on it: the ping-pong kernel, each collective with each algorithm, the
//! fused plans and their unfused baselines, device-side barriers and remote atomics,
//! back-to-back all-reduces with a straggler. It then runs the same cases on a world
//! of threads of its own (the shared-memory transport, in this process) and checks
//! that its rank's outputs are bit-for-bit the same (both worlds on the interpreter,
//! the reference semantics). Prints one line per case and
//! `N passed, N failed`; exits non-zero on any failure.
//!
//! `--ranks-per-node K` places the ranks on nodes of `K` consecutive ranks
//! (`World::ranks_per_node`: on one machine, groups of `K` processes that map each
//! other's heaps and reach the other groups through MPI calls; the threads world it
//! is compared with is placed the same way). `--crossover` then times the flat and
//! the hierarchical all-reduce and all-gather from 1 KiB to 1 MiB per rank and
//! prints the table (`scripts/mpi-check.sh 4 --nodes 2` runs both).
//!
//! `--stop-rank R [--stop-op OP]` runs the stopped-rank scenario instead
//! (`scripts/mpi-check.sh 2 --stopped` runs it): once the world formed (a 3 s wait
//! timeout), rank R stops itself (`SIGSTOP`) and every other rank makes one
//! operation that needs it, OP: a compare-and-swap on R's heap (`cas`, the
//! default), a `get` from it, a `put` to it (completed by the launch's quiet), a
//! `signal` (fetch-and-add) on it, or a host `barrier`. Each must fail within 20 s
//! with an error naming rank R (`rank R stopped answering`, or for a barrier whose
//! team segment is on a live rank `rank R never arrived`), then leave the world and
//! MPI without waiting for R. Prints `stop-test ok ...` or `stop-test FAIL ...` per
//! rank; the job itself then fails (R never finishes), so the script judges by
//! those lines.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::collectives::ONE_SHOT_MAX_BYTES;
use tessera::fused::unfused::{AgThenGemm, AllReduceThenRmsNorm, GemmThenReduceScatter};
use tessera::fused::{AgGemm, AllReduceRmsNorm, GemmReduceScatter};
use tessera::prelude::*;

const B: usize = 256;

/// The tile goes around the ring `laps` times; every rank adds one per hop.
#[kernel]
pub fn ring<const B: usize>(
    ball: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    laps: i32,
    n: i32,
) {
    let me = rank();
    let right = (me + 1) % world_size();
    let offs = arange::<B>();
    let mask = offs.lt(n);
    for lap in 0..laps {
        let l = (lap + 1).cast::<u64>();
        if me.eq(0) {
            let v = ball.load(offs, mask) + 1.0f32;
            ball.put_signal(right, offs, v, mask, sig, 0, l, SignalOp::Set);
            sig.wait_until(0, CmpPred::Ge, l);
        } else {
            sig.wait_until(0, CmpPred::Ge, l);
            let v = ball.load(offs, mask) + 1.0f32;
            ball.put_signal(right, offs, v, mask, sig, 0, l, SignalOp::Set);
        }
    }
}

/// Every program adds its values to every rank's `acc` with remote atomics (adds,
/// maxima, exchanges), then all programs of all ranks meet at a device barrier and
/// each reads its right neighbour's `acc` into `seen`.
#[kernel]
pub fn atomics<const B: usize>(
    acc: &mut Symmetric<i32>,
    top: &mut Symmetric<f32>,
    vals: &Global<i32>,
    seen: &mut Global<i32>,
) {
    let pid = program_id(0);
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    let v = vals.load(offs, all);
    let size = world_size();
    for p in 0..size {
        let mut a = acc.on(p);
        a.atomic_add(offs, v, all);
        let mut t = top.on(p);
        t.atomic_max(offs, v.cast::<f32>() * 0.5f32, all);
    }
    barrier_all();
    let right = (rank() + 1) % size;
    let got = acc.on(right).load(offs, all);
    seen.store(offs + pid * B, got, all);
}

/// Compare-and-swaps on `peer`'s `x` (the stopped-rank scenario).
#[kernel]
pub fn cas_on<const B: usize>(x: &mut Symmetric<i32>, peer: i32) {
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    let mut p = x.on(peer);
    p.atomic_cas(offs, offs, offs + 1, all);
}

/// Reads `peer`'s `x` into `out` (the stopped-rank scenario).
#[kernel]
pub fn get_from<const B: usize>(x: &mut Symmetric<i32>, out: &mut Global<i32>, peer: i32) {
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    let v = x.on(peer).load(offs, all);
    out.store(offs, v, all);
}

/// Writes `peer`'s `x` (completed at the launch's end: the stopped-rank scenario).
#[kernel]
pub fn put_to<const B: usize>(x: &mut Symmetric<i32>, peer: i32) {
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    x.on(peer).store(offs, offs, all);
}

/// Adds 1 to `peer`'s signal word 0 (the stopped-rank scenario).
#[kernel]
pub fn signal_on(sig: &mut Symmetric<u64>, peer: i32) {
    sig.signal(peer, 0, 1u64, SignalOp::Add);
}

/// Waits until this rank's signal word 0 reaches `n` (the stopped-rank scenario).
#[kernel]
pub fn wait_signals(sig: &mut Symmetric<u64>, n: i32) {
    sig.wait_until(0, CmpPred::Ge, n.cast::<u64>());
}

/// What the live ranks may do in the stopped-rank scenario.
const STOP_OPS: [&str; 5] = ["cas", "get", "put", "signal", "barrier"];

/// Waits until process `pid`, a process of this program on this machine, is stopped
/// (state `T` in `/proc/PID/stat`), at most `bound`; two seconds where there is no
/// such process (the rank runs on another node) or no `/proc`.
fn wait_until_stopped(pid: Option<u32>, bound: Duration) {
    let proc = pid.map(|p| format!("/proc/{p}"));
    let ours = || -> Option<bool> {
        let exe = std::fs::read_link(format!("{}/exe", proc.as_deref()?)).ok()?;
        Some(exe == std::env::current_exe().ok()?)
    };
    let state = || -> Option<char> {
        let s = std::fs::read_to_string(format!("{}/stat", proc.as_deref()?)).ok()?;
        // `PID (COMM) STATE ...`: COMM may hold spaces and parentheses.
        s[s.rfind(')')? + 1..].trim_start().chars().next()
    };
    if ours() != Some(true) {
        std::thread::sleep(Duration::from_secs(2));
        return;
    }
    let t = std::time::Instant::now();
    while !matches!(state(), Some('T' | 't')) && t.elapsed() < bound {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The stopped-rank scenario (`--stop-rank`, `--stop-op`: see the module docs);
/// never returns.
fn stop_test(stopped: u32, op: Option<&str>) -> ! {
    let timeout = Duration::from_secs(3);
    let bound = Duration::from_secs(20);
    let outcome = (|| -> Result<(u32, u32, String), Error> {
        let world = World::launched()?
            .on(&Device::interp())
            .heap_bytes(4 << 20)
            .wait_timeout(timeout);
        let rank = world.join()?;
        let (me, ws) = (rank.rank(), rank.size());
        // (The script ends whatever is left of the job by these pids.)
        println!("stop-test: rank {me} is pid {}", std::process::id());
        if stopped >= ws || ws < 2 {
            return Ok((
                me,
                ws,
                format!("FAIL: --stop-rank {stopped} needs a rank of {ws} and one more"),
            ));
        }
        let dev = rank.device().clone();
        // Each rank's `x` holds its pid: a live rank reads rank `stopped`'s, to see
        // it stopped before making its operation.
        let mut x = rank.upload(&[std::process::id() as i32; B])?;
        let mut sig = rank.alloc_signals(1)?;
        let mut out = dev.alloc::<i32>(B)?;
        rank.barrier()?;
        let stopped_pid = if me != stopped {
            get_from::<B>::launch(&dev, 1u32, (&mut x, &mut out, stopped as i32))?;
            out.download()?.first().map(|&p| p as u32)
        } else {
            None
        };
        // Every live rank tells rank `stopped` it passed the barriers (which may need
        // rank `stopped`'s answers: it holds the team segment when it is rank 0).
        // Rank `stopped` sees a signal once it is applied, maybe before the
        // signalling rank has its acknowledgement: it lets the transport progress
        // for a second more (`Rank::progress`), then stops. It sends nothing to a
        // live rank meanwhile, so the live ranks need not answer (which, outside a
        // call into the transport, they would not).
        rank.barrier()?;
        if me != stopped {
            signal_on::launch(&dev, 1u32, (&mut sig, stopped as i32))?;
        } else {
            wait_signals::launch(&dev, 1u32, (&mut sig, ws as i32 - 1))?;
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_secs(1) {
                rank.progress();
                std::thread::sleep(Duration::from_millis(1));
            }
            println!("stop-test: rank {me} (pid {}) stops", std::process::id());
            use std::io::Write;
            let _ = std::io::stdout().flush();
            // The job ends it (mpirun, or the script by this pid).
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &std::process::id().to_string()])
                .status();
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
        wait_until_stopped(stopped_pid, bound);
        let op = op.unwrap_or("cas");
        let peer = stopped as i32;
        let t = std::time::Instant::now();
        let res = match op {
            "cas" => cas_on::<B>::launch(&dev, 1u32, (&mut x, peer)),
            "get" => get_from::<B>::launch(&dev, 1u32, (&mut x, &mut out, peer)),
            "put" => put_to::<B>::launch(&dev, 1u32, (&mut x, peer)),
            "signal" => signal_on::launch(&dev, 1u32, (&mut sig, peer)),
            "barrier" => rank.barrier(),
            other => {
                return Ok((
                    me,
                    ws,
                    format!("FAIL: unknown --stop-op {other} (expected one of {STOP_OPS:?})"),
                ));
            }
        };
        let secs = t.elapsed().as_secs_f64();
        let verdict = match res {
            Ok(()) => format!("FAIL: the {op} needing stopped rank {stopped} succeeded"),
            Err(e) => {
                let e = e.to_string();
                let named = e.contains(&format!("rank {stopped} stopped answering"))
                    || (op == "barrier" && e.contains(&format!("rank {stopped} never arrived")));
                if !named {
                    format!(
                        "FAIL: the {op} failed after {secs:.2} s without naming rank {stopped}: {e}"
                    )
                } else if secs > bound.as_secs_f64() {
                    format!(
                        "FAIL: the {op} failed after {secs:.2} s (over {} s): {e}",
                        bound.as_secs()
                    )
                } else {
                    format!("ok: the {op} failed after {secs:.2} s naming rank {stopped}: {e}")
                }
            }
        };
        println!("stop-test {verdict} (rank {me})");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        // Leaving the world and MPI must not wait for the stopped rank either.
        let t = std::time::Instant::now();
        drop((x, sig, out));
        drop(rank);
        drop(world);
        let secs = t.elapsed().as_secs_f64();
        Ok((
            me,
            ws,
            if secs > bound.as_secs_f64() {
                format!("FAIL: leaving took {secs:.2} s")
            } else {
                format!("ok: left the world in {secs:.2} s")
            },
        ))
    })();
    let (line, failed, others) = match outcome {
        Ok((me, ws, v)) => (
            format!("stop-test {v} (rank {me})"),
            v.starts_with("FAIL"),
            ws > 2,
        ),
        Err(e) => (format!("stop-test FAIL: {e}"), true, true),
    };
    println!("{line}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Other live ranks are a wait timeout or two behind at most (their waits began
    // together): let them report before this exit ends the job.
    if others {
        std::thread::sleep(timeout * 2);
    }
    std::process::exit(if failed { 1 } else { 0 });
}

/// A case: a name and this rank's outputs (bytes, compared exactly).
type Outputs = Vec<(String, Vec<u8>)>;

fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Values in [-4, 4), the same for the same seed and rank on every transport.
fn data<T: From<F32>>(seed: u64, rank: u32, n: usize) -> Vec<T> {
    let mut g = StdRng::seed_from_u64(seed * 1_000_003 + u64::from(rank) * 7919 + 1);
    (0..n)
        .map(|_| T::from(F32(g.gen_range(-4.0f32..4.0))))
        .collect()
}

/// An `f32` to convert into each element type the cases use.
struct F32(f32);

impl From<F32> for f32 {
    fn from(v: F32) -> f32 {
        v.0
    }
}

impl From<F32> for f16 {
    fn from(v: F32) -> f16 {
        f16::from_f32(v.0)
    }
}

impl From<F32> for bf16 {
    fn from(v: F32) -> bf16 {
        bf16::from_f32(v.0)
    }
}

fn push<T: bytemuck::Pod>(out: &mut Outputs, name: impl Into<String>, v: &[T]) {
    out.push((name.into(), bytes(v)));
}

/// Every case on `r`'s world.
fn cases(r: &Rank) -> Result<Outputs, Error> {
    let mut out = Outputs::new();
    let me = r.rank();
    let ws = r.size() as usize;
    let dev = r.device().clone();

    // Ping-pong: 256 f32 (a masked-off tail) around the ring, 20 laps.
    let mut start = data::<f32>(1, 0, B);
    start[200..].fill(f32::NAN);
    let init = if me == 0 { start } else { vec![f32::NAN; B] };
    let mut ball = r.upload(&init)?;
    let mut sig = r.alloc_signals(1)?;
    ring::<B>::launch(&dev, 1u32, (&mut ball, &mut sig, 20, 200))?;
    r.barrier()?;
    push(&mut out, "ping_pong", &ball.download()?);

    // Remote atomics and device barriers.
    let mut acc = r.alloc::<i32>(B)?;
    let mut top = r.upload(&vec![-1e9f32; B])?;
    let vals: Vec<i32> = {
        let mut g = StdRng::seed_from_u64(7 + u64::from(me));
        (0..B).map(|_| g.gen_range(-1000..1000)).collect()
    };
    let vals = dev.upload(&vals)?;
    let mut seen = dev.upload(&vec![i32::MIN; 2 * B])?;
    atomics::<B>::launch(&dev, 2u32, (&mut acc, &mut top, &vals, &mut seen))?;
    r.barrier()?;
    push(&mut out, "remote atomics: sums", &acc.download()?);
    push(&mut out, "remote atomics: maxima", &top.download()?);
    push(
        &mut out,
        "remote atomics: after barrier_all",
        &seen.download()?,
    );

    // Every collective, every algorithm, three element types.
    let algos = [
        AllReduceAlgo::Auto,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::LowLatency,
        AllReduceAlgo::Hierarchical,
    ];
    for (ai, &algo) in algos.iter().enumerate() {
        for (oi, &op) in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]
            .iter()
            .enumerate()
        {
            let seed = 100 + ai as u64 * 10 + oi as u64;
            let mut b = r.upload(&data::<f32>(seed, me, 1000))?;
            r.all_reduce_with(&mut b, op, algo)?;
            push(
                &mut out,
                format!("all_reduce {algo:?} {op:?} f32"),
                &b.download()?,
            );
        }
        let mut h = r.upload(&data::<f16>(200 + ai as u64, me, 300))?;
        r.all_reduce_with(&mut h, ReduceOp::Sum, algo)?;
        push(
            &mut out,
            format!("all_reduce {algo:?} Sum f16"),
            &h.download()?,
        );
        let mut h = r.upload(&data::<bf16>(300 + ai as u64, me, 300))?;
        r.all_reduce_with(&mut h, ReduceOp::Sum, algo)?;
        push(
            &mut out,
            format!("all_reduce {algo:?} Sum bf16"),
            &h.download()?,
        );
    }
    // Several steps of the hierarchical pipeline per program.
    let mut b = r.upload(&data::<f32>(399, me, 300_007))?;
    r.all_reduce_with(&mut b, ReduceOp::Sum, AllReduceAlgo::Hierarchical)?;
    push(
        &mut out,
        "all_reduce Hierarchical Sum f32 (large)",
        &b.download()?,
    );
    let mut b = r.upload(&data::<f32>(398, me, 20_011))?;
    r.all_reduce(&mut b, ReduceOp::Sum)?;
    push(&mut out, "all_reduce Auto Sum f32 (large)", &b.download()?);
    for (gi, algo) in [
        AllGatherAlgo::Auto,
        AllGatherAlgo::Flat,
        AllGatherAlgo::Hierarchical,
    ]
    .into_iter()
    .enumerate()
    {
        for n in [333, 8195] {
            let x = r.upload(&data::<f32>(400 + gi as u64, me, n))?;
            let mut g = r.upload(&vec![f32::NAN; n * ws])?;
            r.all_gather_with(&x, &mut g, algo)?;
            push(
                &mut out,
                format!("all_gather {algo:?} f32 n={n}"),
                &g.download()?,
            );
        }
    }
    let x = r.upload(&data::<bf16>(401, me, 128 * ws))?;
    let mut s = r.alloc::<bf16>(128)?;
    r.reduce_scatter(&x, &mut s, ReduceOp::Sum)?;
    push(&mut out, "reduce_scatter bf16", &s.download()?);
    let mut b = r.upload(&data::<f16>(402, me, 500))?;
    r.broadcast(&mut b, (ws as u32).saturating_sub(2))?;
    push(&mut out, "broadcast f16", &b.download()?);
    let counts: Vec<usize> = {
        let mut g = StdRng::seed_from_u64(403 + u64::from(me));
        (0..ws).map(|_| g.gen_range(0..40)).collect()
    };
    let send = r.upload(&data::<f32>(404, me, 40 * ws))?;
    let mut recv = r.upload(&vec![f32::NAN; 40 * ws])?;
    let got = r.all_to_all_v(&send, &counts, &mut recv)?;
    push(&mut out, "all_to_all_v f32", &recv.download()?);
    push(
        &mut out,
        "all_to_all_v counts",
        &got.iter().map(|&c| c as u64).collect::<Vec<_>>(),
    );

    // The fused plans and their unfused baselines.
    let (rows, n, k) = (24, 40, 32);
    let a = dev.upload(&data::<f32>(500, me, rows * k))?;
    let bm = dev.upload(&data::<f32>(501, 0, k * n))?;
    let mut c = dev.alloc::<f32>(rows * ws * n)?;
    AgGemm::<f32>::new(r, rows, n, k)?.run(r, &a, &bm, &mut c)?;
    push(&mut out, "fused all-gather + GEMM", &c.download()?);
    let mut c = dev.alloc::<f32>(rows * ws * n)?;
    AgThenGemm::<f32>::new(r, rows, n, k)?.run(r, &a, &bm, &mut c)?;
    push(&mut out, "all-gather then GEMM", &c.download()?);
    let (m, kr) = (8 * ws, 24);
    let a = dev.upload(&data::<f32>(502, me, m * kr))?;
    let bm = dev.upload(&data::<f32>(503, me, kr * n))?;
    let mut o = dev.alloc::<f32>(m / ws * n)?;
    GemmReduceScatter::<f32>::new(r, m, n, kr)?.run(r, &a, &bm, &mut o)?;
    push(&mut out, "fused GEMM + reduce-scatter", &o.download()?);
    let mut o = dev.alloc::<f32>(m / ws * n)?;
    GemmThenReduceScatter::<f32>::new(r, m, n, kr)?.run(r, &a, &bm, &mut o)?;
    push(&mut out, "GEMM then reduce-scatter", &o.download()?);
    let (rows, hidden) = (6, 96);
    let x = r.upload(&data::<f32>(504, me, rows * hidden))?;
    let w = dev.upload(&data::<f32>(505, 0, hidden))?;
    for fused in [true, false] {
        let mut res = dev.upload(&data::<f32>(506, me, rows * hidden))?;
        let mut o = dev.alloc::<f32>(rows * hidden)?;
        let name = if fused {
            AllReduceRmsNorm::<f32>::new(r, rows, hidden, 1e-5)?
                .run(r, &x, &mut res, &w, &mut o)?;
            "fused all-reduce + RMSNorm"
        } else {
            AllReduceThenRmsNorm::<f32>::new(r, rows, hidden, 1e-5)?
                .run(r, &x, &mut res, &w, &mut o)?;
            "all-reduce then RMSNorm"
        };
        push(&mut out, format!("{name}: out"), &o.download()?);
        push(&mut out, format!("{name}: residual"), &res.download()?);
    }

    // Back-to-back all-reduces with a straggler (the same plan on every rank).
    let mut plan = StdRng::seed_from_u64(4242);
    let mut all = Vec::new();
    for call in 0..40u64 {
        let n = if plan.gen_bool(0.5) {
            plan.gen_range(1..300)
        } else {
            plan.gen_range(300..3000)
        };
        let algo = algos[plan.gen_range(0..algos.len())];
        let straggler = plan.gen_range(0..ws as u32);
        let ms = plan.gen_range(1..6);
        if plan.gen_bool(0.3) && me == straggler {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let mut b = r.upload(&data::<f32>(600 + call, me, n))?;
        r.all_reduce_with(&mut b, ReduceOp::Sum, algo)?;
        all.extend(b.download()?);
    }
    push(&mut out, "40 all-reduces with a straggler", &all);
    Ok(out)
}

/// Seconds per call of `f` on this rank, the slowest rank's (after one warm-up
/// call; ranks start together).
fn time_calls(
    r: &Rank,
    iters: u32,
    mut f: impl FnMut() -> Result<(), Error>,
) -> Result<f64, Error> {
    f()?;
    r.barrier()?;
    let t = std::time::Instant::now();
    for _ in 0..iters {
        f()?;
    }
    let mine = t.elapsed().as_secs_f64() / f64::from(iters);
    let mut m = r.upload(&[mine as f32])?;
    r.all_reduce_with(&mut m, ReduceOp::Max, AllReduceAlgo::OneShot)?;
    Ok(f64::from(m.download()?[0]))
}

/// The flat and the hierarchical all-reduce (f32 Sum) and all-gather from 1 KiB to
/// 1 MiB per rank: a table on rank 0 (the flat all-reduce is the one Auto takes on
/// one node: one-shot up to `ONE_SHOT_MAX_BYTES`, two-shot above).
fn crossover(r: &Rank) -> Result<(), Error> {
    let me = r.rank();
    let ws = r.size() as usize;
    if me == 0 {
        println!(
            "crossover: {ws} ranks, nodes {:?}; ms per call (slowest rank), hierarchical / flat",
            r.nodes()
        );
        println!("  bytes/rank | all_reduce flat  hier  ratio | all_gather flat  hier  ratio");
    }
    for kib in [1usize, 4, 16, 64, 256, 1024] {
        let n = kib * 1024 / 4;
        let iters = if kib >= 256 { 3 } else { 6 };
        let mut b = r.upload(&data::<f32>(700, me, n))?;
        let flat = if kib * 1024 <= ONE_SHOT_MAX_BYTES {
            AllReduceAlgo::OneShot
        } else {
            AllReduceAlgo::TwoShot
        };
        let ar_flat = time_calls(r, iters, || r.all_reduce_with(&mut b, ReduceOp::Max, flat))?;
        let ar_hier = time_calls(r, iters, || {
            r.all_reduce_with(&mut b, ReduceOp::Max, AllReduceAlgo::Hierarchical)
        })?;
        let x = r.upload(&data::<f32>(701, me, n))?;
        let mut g = r.alloc::<f32>(n * ws)?;
        let ag_flat = time_calls(r, iters, || {
            r.all_gather_with(&x, &mut g, AllGatherAlgo::Flat)
        })?;
        let ag_hier = time_calls(r, iters, || {
            r.all_gather_with(&x, &mut g, AllGatherAlgo::Hierarchical)
        })?;
        if me == 0 {
            println!(
                "  {:>7} KiB | {:>14.2} {:>5.2} {:>6.2} | {:>14.2} {:>5.2} {:>6.2}",
                kib,
                ar_flat * 1e3,
                ar_hier * 1e3,
                ar_hier / ar_flat,
                ag_flat * 1e3,
                ag_hier * 1e3,
                ag_hier / ag_flat
            );
        }
    }
    Ok(())
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("TESSERA_LOG", "warn")).init();
    let args: Vec<String> = std::env::args().collect();
    let per_node = args
        .iter()
        .position(|a| a == "--ranks-per-node")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse::<usize>());
    let per_node = match per_node {
        Some(Ok(k)) => Some(k),
        Some(Err(e)) => {
            eprintln!("error: --ranks-per-node: {e}");
            std::process::exit(2);
        }
        None => None,
    };
    let bench = args.iter().any(|a| a == "--crossover");
    if let Some(i) = args.iter().position(|a| a == "--stop-rank") {
        let op = args
            .iter()
            .position(|a| a == "--stop-op")
            .and_then(|i| args.get(i + 1));
        match args.get(i + 1).map(|v| v.parse::<u32>()) {
            Some(Ok(r)) => stop_test(r, op.map(String::as_str)),
            _ => {
                eprintln!("error: --stop-rank needs a rank");
                std::process::exit(2);
            }
        }
    }
    let place = move |w: World| match per_node {
        Some(k) => w.ranks_per_node(k),
        None => w,
    };
    let result = (|| -> Result<(u32, u32, u32), Error> {
        let world = place(
            World::launched()?
                // Both worlds on the interpreter: the comparison is bit-for-bit, and
                // the compiled CPU device contracts `dot` into FMAs (and runs the
                // ranks behind MPI calls on the interpreter anyway).
                .on(&Device::interp())
                .heap_bytes(16 << 20)
                .wait_timeout(Duration::from_secs(60)),
        );
        let rank = world.join()?;
        let (me, ws) = (rank.rank(), rank.size());
        if me == 0 {
            println!(
                "mpi_world: {ws} rank(s) of the launched world (MPI under mpirun) on {}, nodes {:?}",
                rank.device(),
                rank.nodes()
            );
        }
        let t = std::time::Instant::now();
        let got = cases(&rank)?;
        let mpi_time = t.elapsed();
        rank.barrier()?;
        // The reference: the same cases on a world of threads of this process.
        let t = std::time::Instant::now();
        let want = place(
            World::local(ws as usize)
                .on(&Device::interp())
                .heap_bytes(16 << 20)
                .wait_timeout(Duration::from_secs(60)),
        )
        .run(cases)?
        .swap_remove(me as usize);
        let local_time = t.elapsed();
        let (mut pass, mut fail) = (0u32, 0u32);
        for ((name, g), (wname, w)) in got.iter().zip(&want) {
            if name == wname && g == w {
                pass += 1;
                if me == 0 {
                    println!("ok   {name} ({} bytes)", g.len());
                }
            } else {
                fail += 1;
                let at = g.iter().zip(w).position(|(a, b)| a != b);
                println!(
                    "FAIL rank {me}: {name}: {} bytes, the local transport's {wname}: {} bytes; first difference at byte {at:?}",
                    g.len(),
                    w.len()
                );
            }
        }
        if got.len() != want.len() {
            fail += 1;
            println!(
                "FAIL rank {me}: {} cases, the local transport {}",
                got.len(),
                want.len()
            );
        }
        if bench {
            crossover(&rank)?;
        }
        // Every rank's counts, summed over the MPI world.
        let mut counts = rank.upload(&[pass as f32, fail as f32])?;
        rank.all_reduce(&mut counts, ReduceOp::Sum)?;
        let counts = counts.download()?;
        if me == 0 {
            println!(
                "cases on the launched world: {:.2} s; on threads (shared memory): {:.2} s",
                mpi_time.as_secs_f64(),
                local_time.as_secs_f64()
            );
        }
        Ok((me, counts[0] as u32, counts[1] as u32))
    })();
    match result {
        Ok((me, pass, fail)) => {
            if me == 0 {
                println!("mpi_world: {pass} passed, {fail} failed");
            }
            if fail > 0 {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

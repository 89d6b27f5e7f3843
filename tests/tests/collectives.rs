//! Collectives on CPU ranks (the interpreter) against sequential host references.
//!
//! Tolerance: none. The library reduces in `f32` over the ranks in rank order and
//! rounds once to the element type, on every rank and in every algorithm; the
//! references here do exactly the same, so results must match bit for bit (f16/bf16
//! results are the f32 rank-order reduction rounded once to nearest-even).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::collectives::{HIER_STEP_CHUNKS, MAX_PROGRAMS, TILE};
use tessera::prelude::*;

/// Element types under test, with exact conversions to and from `f32`.
trait Elem: CollElem + PartialEq + std::fmt::Debug {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    fn bits(self) -> u32;
    fn nan() -> Self {
        Self::from_f32(f32::NAN)
    }
}
impl Elem for f32 {
    fn from_f32(v: f32) -> f32 {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
}
impl Elem for f16 {
    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
}
impl Elem for bf16 {
    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
}

/// Rank `r`'s random data for a case (every rank can regenerate every rank's data).
fn data<T: Elem>(seed: u64, r: u32, n: usize) -> Vec<T> {
    let mut g = StdRng::seed_from_u64(seed.wrapping_mul(1000003) ^ ((r as u64 + 1) * 7919));
    (0..n)
        .map(|_| T::from_f32(g.gen_range(-8.0f32..8.0)))
        .collect()
}

/// Reduction over `inputs` (one per rank) in f32, rank order, rounded once.
fn reduce_ref<T: Elem>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let n = inputs.first().map_or(0, |v| v.len());
    (0..n)
        .map(|i| {
            let mut acc = inputs[0][i].to_f32();
            for x in &inputs[1..] {
                let v = x[i].to_f32();
                acc = match op {
                    ReduceOp::Max => acc.max(v),
                    ReduceOp::Min => acc.min(v),
                    _ => acc + v,
                };
            }
            T::from_f32(acc)
        })
        .collect()
}

/// First mismatch between `got` and `want` (bitwise), as a message.
fn diff<T: Elem>(what: &str, got: &[T], want: &[T]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{what}: length {} != {}", got.len(), want.len()));
    }
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].bits() != want[i].bits())
        .collect();
    bad.first().map(|&i| {
        format!(
            "{what}: {} of {} elements differ, first at {i}: got {:?}, want {:?}",
            bad.len(),
            got.len(),
            got[i],
            want[i]
        )
    })
}

const ALGOS: [AllReduceAlgo; 4] = [
    AllReduceAlgo::OneShot,
    AllReduceAlgo::TwoShot,
    AllReduceAlgo::LowLatency,
    AllReduceAlgo::Auto,
];
const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];

fn world(n: usize) -> World {
    World::local(n)
        .heap_bytes(64 << 20)
        .wait_timeout(Duration::from_secs(60))
}

/// Sizes for a world of `ws` ranks: 0, 1, and random non-multiples of the tile.
fn sizes(ws: usize, seed: u64) -> Vec<usize> {
    let mut g = StdRng::seed_from_u64(seed);
    let max = if ws >= 8 { 2500 } else { 5000 };
    let mut v = vec![0, 1, g.gen_range(2..1024), g.gen_range(1025..max)];
    if v[3] % 1024 == 0 {
        v[3] += 1;
    }
    v
}

/// Every all-reduce algorithm and op on `T`, sizes 0, 1 and random; checks every
/// rank's result.
fn all_reduce_case<T: Elem>(r: &Rank, seed: u64, errs: &mut Vec<String>) -> Result<(), Error> {
    let ws = r.size();
    for (ai, &algo) in ALGOS.iter().enumerate() {
        for (si, &n) in sizes(ws as usize, seed + ai as u64).iter().enumerate() {
            for (oi, &op) in OPS.iter().enumerate() {
                // Every op on the larger sizes; one op (rotating) on 0 and 1.
                if si < 2 && oi != (si + ai) % 3 {
                    continue;
                }
                let case = seed * 1000 + (ai * 100 + si * 10 + oi) as u64;
                let inputs: Vec<Vec<T>> = (0..ws).map(|q| data::<T>(case, q, n)).collect();
                let mut b = r.upload(&inputs[r.rank() as usize])?;
                r.all_reduce_with(&mut b, op, algo)?;
                let what = format!(
                    "{ws} ranks, rank {}, {algo:?} {op:?} {} n={n}",
                    r.rank(),
                    std::any::type_name::<T>()
                );
                errs.extend(diff(&what, &b.download()?, &reduce_ref(&inputs, op)));
            }
        }
    }
    Ok(())
}

fn all_reduce_world(ws: usize) {
    let errs = world(ws)
        .run(|r| {
            let mut errs = Vec::new();
            all_reduce_case::<f32>(r, 11 + ws as u64, &mut errs)?;
            all_reduce_case::<f16>(r, 23 + ws as u64, &mut errs)?;
            all_reduce_case::<bf16>(r, 37 + ws as u64, &mut errs)?;
            Ok(errs)
        })
        .unwrap();
    let errs: Vec<String> = errs.into_iter().flatten().collect();
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn all_reduce_2_ranks() {
    all_reduce_world(2);
}

#[test]
fn all_reduce_4_ranks() {
    all_reduce_world(4);
}

#[test]
fn all_reduce_8_ranks() {
    all_reduce_world(8);
}

/// all_gather, reduce_scatter and broadcast on `T` with poisoned outputs.
fn others_case<T: Elem>(r: &Rank, seed: u64, errs: &mut Vec<String>) -> Result<(), Error> {
    let ws = r.size();
    let me = r.rank();
    let ty = std::any::type_name::<T>();
    for (si, &n) in sizes(ws as usize, seed).iter().enumerate() {
        let case = seed * 100 + si as u64;
        // all_gather
        let inputs: Vec<Vec<T>> = (0..ws).map(|q| data::<T>(case, q, n)).collect();
        let input = r.upload(&inputs[me as usize])?;
        let mut out = r.upload(&vec![T::nan(); n * ws as usize])?;
        r.all_gather(&input, &mut out)?;
        let want: Vec<T> = inputs.concat();
        errs.extend(diff(
            &format!("all_gather {ws} ranks rank {me} {ty} n={n}"),
            &out.download()?,
            &want,
        ));
        // reduce_scatter (input n*ws per rank)
        let op = OPS[si % 3];
        let big: Vec<Vec<T>> = (0..ws)
            .map(|q| data::<T>(case + 7, q, n * ws as usize))
            .collect();
        let input = r.upload(&big[me as usize])?;
        let mut out = r.upload(&vec![T::nan(); n])?;
        r.reduce_scatter(&input, &mut out, op)?;
        let blocks: Vec<Vec<T>> = big
            .iter()
            .map(|v| v[me as usize * n..(me as usize + 1) * n].to_vec())
            .collect();
        errs.extend(diff(
            &format!("reduce_scatter {op:?} {ws} ranks rank {me} {ty} n={n}"),
            &out.download()?,
            &reduce_ref(&blocks, op),
        ));
        // broadcast: the root's data everywhere; other ranks start poisoned.
        let root = (case % ws as u64) as u32;
        let src = data::<T>(case + 13, root, n);
        let mut b = r.upload(&if me == root {
            src.clone()
        } else {
            vec![T::nan(); n]
        })?;
        r.broadcast(&mut b, root)?;
        errs.extend(diff(
            &format!("broadcast root {root} {ws} ranks rank {me} {ty} n={n}"),
            &b.download()?,
            &src,
        ));
    }
    Ok(())
}

#[test]
fn gather_scatter_broadcast() {
    for ws in [2usize, 4, 8] {
        let errs = world(ws)
            .run(|r| {
                let mut errs = Vec::new();
                others_case::<f32>(r, 101 + ws as u64, &mut errs)?;
                others_case::<f16>(r, 202 + ws as u64, &mut errs)?;
                others_case::<bf16>(r, 303 + ws as u64, &mut errs)?;
                Ok(errs)
            })
            .unwrap();
        let errs: Vec<String> = errs.into_iter().flatten().collect();
        assert!(errs.is_empty(), "{}", errs.join("\n"));
    }
}

/// Random per-destination counts of rank `r` (some zero).
fn counts(seed: u64, r: u32, ws: usize) -> Vec<usize> {
    let mut g = StdRng::seed_from_u64(seed ^ ((r as u64 + 1) * 104729));
    (0..ws)
        .map(|_| {
            if g.gen_bool(0.3) {
                0
            } else {
                g.gen_range(1..1500)
            }
        })
        .collect()
}

fn a2a_case<T: Elem>(r: &Rank, seed: u64, errs: &mut Vec<String>) -> Result<(), Error> {
    let ws = r.size() as usize;
    let me = r.rank() as usize;
    let cnt: Vec<Vec<usize>> = (0..ws).map(|q| counts(seed, q as u32, ws)).collect();
    let sends: Vec<Vec<T>> = (0..ws)
        .map(|q| data::<T>(seed, q as u32, cnt[q].iter().sum()))
        .collect();
    // Symmetric buffers have one length on every rank: the largest, padded.
    let send_len = sends.iter().map(|v| v.len()).max().unwrap_or(0) + 3;
    let recv_len = (0..ws)
        .map(|d| (0..ws).map(|s| cnt[s][d]).sum::<usize>())
        .max()
        .unwrap_or(0)
        + 5;
    let mut mine = sends[me].clone();
    mine.resize(send_len, T::nan());
    let send = r.upload(&mine)?;
    let mut recv = r.upload(&vec![T::nan(); recv_len])?;
    let got_counts = r.all_to_all_v(&send, &cnt[me], &mut recv)?;
    let want_counts: Vec<usize> = (0..ws).map(|s| cnt[s][me]).collect();
    if got_counts != want_counts {
        errs.push(format!(
            "all_to_all_v rank {me}: counts {got_counts:?} != {want_counts:?}"
        ));
    }
    let mut want = Vec::new();
    for s in 0..ws {
        let start: usize = cnt[s][..me].iter().sum();
        want.extend_from_slice(&sends[s][start..start + cnt[s][me]]);
    }
    // Everything past the received elements stays poisoned (nothing else written).
    want.resize(recv_len, T::nan());
    errs.extend(diff(
        &format!(
            "all_to_all_v {ws} ranks rank {me} {}",
            std::any::type_name::<T>()
        ),
        &recv.download()?,
        &want,
    ));
    Ok(())
}

#[test]
fn all_to_all_v_random_counts() {
    for ws in [2usize, 4, 8] {
        let errs = world(ws)
            .run(|r| {
                let mut errs = Vec::new();
                for round in 0..3u64 {
                    a2a_case::<f32>(r, 500 + ws as u64 * 10 + round, &mut errs)?;
                }
                a2a_case::<f16>(r, 600 + ws as u64, &mut errs)?;
                a2a_case::<bf16>(r, 700 + ws as u64, &mut errs)?;
                // All counts zero.
                let send = r.upload(&[1.0f32; 4])?;
                let mut recv = r.upload(&[f32::NAN; 4])?;
                let c = r.all_to_all_v(&send, &vec![0; ws], &mut recv)?;
                if c != vec![0; ws] || recv.download()?.iter().any(|v| !v.is_nan()) {
                    errs.push(format!("all-zero all_to_all_v on rank {}", r.rank()));
                }
                Ok(errs)
            })
            .unwrap();
        let errs: Vec<String> = errs.into_iter().flatten().collect();
        assert!(errs.is_empty(), "{}", errs.join("\n"));
    }
}

/// 200 back-to-back all-reduces (every algorithm, sizes across the LL/one-shot
/// boundary) with a random straggler sleeping before some calls: every result is
/// checked, so a stale slot or a missed handshake shows up as wrong data or a hang
/// (which the wait timeout turns into an error).
#[test]
fn back_to_back_with_straggler() {
    const CALLS: u64 = 200;
    let ws = 4usize;
    let errs = world(ws)
        .wait_timeout(Duration::from_secs(30))
        .run(|r| {
            let mut errs = Vec::new();
            let mut plan = StdRng::seed_from_u64(4242); // same plan on every rank
            for call in 0..CALLS {
                let n = if plan.gen_bool(0.5) {
                    plan.gen_range(1..300)
                } else {
                    plan.gen_range(300..3000)
                };
                let algo = ALGOS[plan.gen_range(0..4)];
                let straggler = plan.gen_range(0..ws as u32);
                let sleep = plan.gen_bool(0.25);
                let ms = plan.gen_range(1..6);
                if sleep && r.rank() == straggler {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                let inputs: Vec<Vec<f32>> =
                    (0..ws as u32).map(|q| data::<f32>(call, q, n)).collect();
                let mut b = r.upload(&inputs[r.rank() as usize])?;
                r.all_reduce_with(&mut b, ReduceOp::Sum, algo)?;
                errs.extend(diff(
                    &format!("call {call} {algo:?} n={n} rank {}", r.rank()),
                    &b.download()?,
                    &reduce_ref(&inputs, ReduceOp::Sum),
                ));
            }
            Ok(errs)
        })
        .unwrap();
    let errs: Vec<String> = errs.into_iter().flatten().collect();
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn bad_arguments_are_errors() {
    let out = world(2)
        .run(|r| {
            let mut b = r.upload(&[1.0f32; 10])?;
            let prod = r
                .all_reduce(&mut b, ReduceOp::Prod)
                .map_err(|e| e.to_string());
            let mut big = r.alloc::<f32>(70_000)?;
            let ll = r
                .all_reduce_with(&mut big, ReduceOp::Sum, AllReduceAlgo::LowLatency)
                .map_err(|e| e.to_string());
            let mut out = r.alloc::<f32>(7)?;
            let gather = r.all_gather(&b, &mut out).map_err(|e| e.to_string());
            let root = r.broadcast(&mut b, 5).map_err(|e| e.to_string());
            // Rank 1 passes counts that overflow its send buffer: both ranks fail.
            let counts = if r.rank() == 1 {
                vec![8, 8]
            } else {
                vec![1, 1]
            };
            let a2a = r
                .all_to_all_v(&b, &counts, &mut out)
                .map_err(|e| e.to_string());
            // Receive buffer too small for rank 0 (receives 6 + 6 > 7): both fail.
            let small = r
                .all_to_all_v(&b, &[6, 1], &mut out)
                .map_err(|e| e.to_string());
            // The world still works afterwards.
            r.all_reduce(&mut b, ReduceOp::Sum)?;
            Ok((prod, ll, gather, root, a2a, small, b.download()?))
        })
        .unwrap();
    for (rank, (prod, ll, gather, root, a2a, small, b)) in out.into_iter().enumerate() {
        assert!(prod.unwrap_err().contains("Sum, Max or Min"));
        assert!(ll.unwrap_err().contains("low-latency"));
        assert!(gather.unwrap_err().contains("expected input length 10"));
        assert!(root.unwrap_err().contains("root 5"));
        let a2a = a2a.unwrap_err();
        if rank == 1 {
            assert!(a2a.contains("add up to more"), "{a2a}");
        } else {
            assert!(a2a.contains("rank 1 passed invalid"), "{a2a}");
        }
        assert!(small.unwrap_err().contains("rank 0 receives 12"));
        assert_eq!(b, vec![2.0f32; 10]);
    }
}

#[test]
fn buffers_of_another_world_are_rejected() {
    let out = world(2)
        .run(|r| {
            // A symmetric buffer of another (finished) world: not in this rank's heap.
            let mut other = World::local(2)
                .heap_bytes(4 << 20)
                .run(|o| o.upload(&[0.0f32; 8]))?;
            let err = r
                .all_reduce(&mut other[0], ReduceOp::Sum)
                .map_err(|e| e.to_string());
            Ok(err)
        })
        .unwrap();
    for e in out {
        assert!(e.unwrap_err().contains("not allocated by this world"));
    }
}

/// A world of one rank: every collective is a copy (or nothing) and still works.
#[test]
fn single_rank_world() {
    let out = world(1)
        .run(|r| {
            let mut errs = Vec::new();
            let x = data::<f32>(9, 0, 1500);
            for algo in ALGOS {
                let mut b = r.upload(&x)?;
                r.all_reduce_with(&mut b, ReduceOp::Sum, algo)?;
                errs.extend(diff(&format!("{algo:?}"), &b.download()?, &x));
            }
            let mut out = r.upload(&vec![f32::NAN; 1500])?;
            let input = r.upload(&x)?;
            r.all_gather(&input, &mut out)?;
            errs.extend(diff("all_gather", &out.download()?, &x));
            out.fill(f32::NAN)?;
            r.reduce_scatter(&input, &mut out, ReduceOp::Max)?;
            errs.extend(diff("reduce_scatter", &out.download()?, &x));
            let mut b = r.upload(&x)?;
            r.broadcast(&mut b, 0)?;
            errs.extend(diff("broadcast", &b.download()?, &x));
            out.fill(f32::NAN)?;
            let c = r.all_to_all_v(&input, &[1000], &mut out)?;
            let mut want = x[..1000].to_vec();
            want.resize(1500, f32::NAN);
            errs.extend(diff("all_to_all_v", &out.download()?, &want));
            if c != vec![1000] {
                errs.push(format!("all_to_all_v counts {c:?}"));
            }
            Ok(errs)
        })
        .unwrap();
    assert!(out[0].is_empty(), "{}", out[0].join("\n"));
}

/// Ranks that make different collective calls (here the reduction of an all-reduce,
/// then the collective itself) fail, every one of them, within the wait timeout
/// rather than computing a mixture: the call records of the world's team segment
/// disagree, and the rank that sees it names both calls and fails the world.
#[test]
fn ranks_that_disagree_on_a_collective_all_fail() {
    for (case, want) in [
        ("op", "all_reduce(Max, f32, 64 elements, Auto)"),
        ("kind", "broadcast(f32, 64 elements, root 0)"),
    ] {
        let errs = std::sync::Mutex::new(Vec::new());
        let start = std::time::Instant::now();
        let _ = world(2).wait_timeout(Duration::from_secs(20)).run(|r| {
            let mut b = r.upload(&[1.0f32; 64])?;
            let got = match (case, r.rank()) {
                ("op", 1) => r.all_reduce(&mut b, ReduceOp::Max),
                ("kind", 1) => r.broadcast(&mut b, 0),
                _ => r.all_reduce(&mut b, ReduceOp::Sum),
            };
            let e = got.expect_err("a rank of a disagreeing world succeeded");
            errs.lock().unwrap().push(e.to_string());
            Ok(())
        });
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{case}: took {:?}",
            start.elapsed()
        );
        let errs = errs.into_inner().unwrap();
        assert_eq!(errs.len(), 2, "{case}: {errs:?}");
        let named = errs
            .iter()
            .find(|e| e.contains("differs between ranks"))
            .unwrap_or_else(|| panic!("{case}: no rank names the mismatch: {errs:?}"));
        assert!(
            named.contains("all_reduce(Sum, f32, 64 elements, Auto)"),
            "{named}"
        );
        assert!(named.contains(want), "{named}");
    }
}

/// The hierarchical reduction's order: each node's ranks in rank order (in f32),
/// then the nodes' partials in node order, rounded once. (With one node, or one rank
/// per node, this is the rank order.)
fn hier_ref<T: Elem>(inputs: &[Vec<T>], per_node: usize, op: ReduceOp) -> Vec<T> {
    let n = inputs.first().map_or(0, |v| v.len());
    let f = |a: f32, b: f32| match op {
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
        _ => a + b,
    };
    (0..n)
        .map(|i| {
            let partial = |node: &[Vec<T>]| {
                node.iter()
                    .map(|x| x[i].to_f32())
                    .reduce(f)
                    .unwrap_or(f32::NAN)
            };
            let acc = inputs
                .chunks(per_node)
                .map(partial)
                .reduce(f)
                .unwrap_or(f32::NAN);
            T::from_f32(acc)
        })
        .collect()
}

/// Rank `r`'s data for the hierarchical cases: full 24-bit mantissas over exponents
/// 2^-8 to 2^8, so that sums in another order round differently ([`data`]'s
/// uniform values are multiples of 2^-19 and their sums are exact in any order).
fn wide_data<T: Elem>(seed: u64, r: u32, n: usize) -> Vec<T> {
    let mut g = StdRng::seed_from_u64(seed.wrapping_mul(1000033) ^ ((r as u64 + 1) * 104729));
    (0..n)
        .map(|_| {
            let m = 1.0 + g.gen_range(0..1u32 << 23) as f32 / (1u32 << 23) as f32;
            let s = if g.gen_bool(0.5) { -1.0 } else { 1.0 };
            T::from_f32(s * m * 2f32.powi(g.gen_range(-8..=8)))
        })
        .collect()
}

/// Hierarchical all-reduce and all-gather on `T` for ranks placed `per_node` to a
/// node (`None`: not placed, one node): every op, ragged sizes up to several chunks
/// per program, each call checked on every rank against [`hier_ref`] and the
/// concatenation, poisoned outputs; flat calls of other sizes in between (the
/// staging slots and signal words are shared with them).
fn hier_case<T: Elem>(
    r: &Rank,
    per_node: Option<usize>,
    seed: u64,
    errs: &mut Vec<String>,
) -> Result<(), Error> {
    let ws = r.size() as usize;
    let me = r.rank() as usize;
    let l = per_node.unwrap_or(ws);
    let ty = std::any::type_name::<T>();
    let mut g = StdRng::seed_from_u64(seed);
    let ns = [
        1,
        g.gen_range(2..1024),
        g.gen_range(1025..4 * 1024),
        9 * 1024 + 7,
    ];
    for (si, &n) in ns.iter().enumerate() {
        for (oi, &op) in OPS.iter().enumerate() {
            let case = seed * 1000 + (si * 10 + oi) as u64;
            let inputs: Vec<Vec<T>> = (0..ws).map(|q| wide_data::<T>(case, q as u32, n)).collect();
            let mut b = r.upload(&inputs[me])?;
            r.all_reduce_with(&mut b, op, AllReduceAlgo::Hierarchical)?;
            let what =
                format!("{ws} ranks, {l} per node, rank {me}, hierarchical {op:?} {ty} n={n}");
            errs.extend(diff(&what, &b.download()?, &hier_ref(&inputs, l, op)));
            // A flat call of another size between two hierarchical ones.
            let mut c = r.upload(&inputs[me][..n / 2 + 1])?;
            r.all_reduce_with(&mut c, op, AllReduceAlgo::OneShot)?;
            let half: Vec<Vec<T>> = inputs.iter().map(|v| v[..n / 2 + 1].to_vec()).collect();
            errs.extend(diff(
                &format!("{what} (one-shot after)"),
                &c.download()?,
                &reduce_ref(&half, op),
            ));
        }
        let case = seed * 1000 + 500 + si as u64;
        let inputs: Vec<Vec<T>> = (0..ws).map(|q| data::<T>(case, q as u32, n)).collect();
        let input = r.upload(&inputs[me])?;
        let mut out = r.upload(&vec![T::nan(); n * ws])?;
        r.all_gather_with(&input, &mut out, AllGatherAlgo::Hierarchical)?;
        errs.extend(diff(
            &format!("{ws} ranks, {l} per node, rank {me}, hierarchical all_gather {ty} n={n}"),
            &out.download()?,
            &inputs.concat(),
        ));
    }
    Ok(())
}

fn hier_world(ws: usize, per_node: Option<usize>) -> Vec<String> {
    let w = world(ws);
    let w = match per_node {
        Some(k) => w.ranks_per_node(k),
        None => w,
    };
    let errs = w
        .run(move |r| {
            let mut errs = Vec::new();
            let l = per_node.unwrap_or(ws) as u32;
            // The data tells the orders apart: on 2 or more nodes of 2 or more ranks
            // the hierarchical order rounds differently from the rank order.
            if r.rank() == 0 && l > 1 && (l as usize) < ws {
                let inputs: Vec<Vec<f32>> = (0..ws as u32)
                    .map(|q| wide_data::<f32>(1, q, 1000))
                    .collect();
                let h = hier_ref(&inputs, l as usize, ReduceOp::Sum);
                let f = reduce_ref(&inputs, ReduceOp::Sum);
                if h == f {
                    errs.push(format!(
                        "{ws} ranks, {l} per node: the data does not tell the orders apart"
                    ));
                }
            }
            if r.ranks_per_node() != Some(l) {
                errs.push(format!(
                    "ranks_per_node() = {:?}, placed {l}",
                    r.ranks_per_node()
                ));
            }
            hier_case::<f32>(r, per_node, 71 + ws as u64, &mut errs)?;
            hier_case::<bf16>(r, per_node, 83 + ws as u64, &mut errs)?;
            // Several steps of the pipeline per program (a step is
            // HIER_STEP_CHUNKS chunks of TILE elements).
            let n = 2 * MAX_PROGRAMS * HIER_STEP_CHUNKS * TILE * l as usize + 7;
            let inputs: Vec<Vec<f32>> = (0..ws as u32).map(|q| wide_data(97, q, n)).collect();
            let mut b = r.upload(&inputs[r.rank() as usize])?;
            r.all_reduce_with(&mut b, ReduceOp::Sum, AllReduceAlgo::Hierarchical)?;
            errs.extend(diff(
                &format!(
                    "{ws} ranks, {l} per node, rank {}, hierarchical n={n}",
                    r.rank()
                ),
                &b.download()?,
                &hier_ref(&inputs, l as usize, ReduceOp::Sum),
            ));
            Ok(errs)
        })
        .unwrap_or_else(|e| panic!("{ws} ranks, {per_node:?} per node: {e}"));
    errs.into_iter().flatten().collect()
}

#[test]
fn hierarchical_collectives_on_placed_ranks() {
    let mut errs = Vec::new();
    // Two nodes of two, three nodes of two, two nodes of three; one node; one rank
    // per node (both degenerate to the rank order).
    for (ws, per_node) in [
        (4, Some(2)),
        (6, Some(2)),
        (6, Some(3)),
        (4, None),
        (3, Some(1)),
    ] {
        errs.extend(hier_world(ws, per_node));
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn hierarchical_collectives_need_regular_nodes() {
    // 3 ranks on nodes of 2: node 0 holds two, node 1 one.
    let errs = world(3).ranks_per_node(2).run(|r| {
        let mut b = r.upload(&[1.0f32; 10])?;
        let e = r
            .all_reduce_with(&mut b, ReduceOp::Sum, AllReduceAlgo::Hierarchical)
            .err()
            .map(|e| e.to_string());
        // Auto falls back to the flat algorithms there.
        let mut c = r.upload(&vec![1.0f32; 8192])?;
        r.all_reduce(&mut c, ReduceOp::Sum)?;
        let ok = c.download()?.iter().all(|&x| x == 3.0);
        Ok((e, ok))
    });
    // Every rank gets the error (the layout is the same everywhere) and goes on.
    let results = errs.expect("the world runs on after the refused call");
    for (r, (e, ok)) in results.iter().enumerate() {
        let msg = e.as_deref().unwrap_or("no error");
        assert!(
            msg.contains("nodes of equally many consecutive ranks") && msg.contains("[0, 0, 1]"),
            "rank {r}: {msg}"
        );
        assert!(ok, "rank {r}: the Auto all-reduce after it is wrong");
    }
}

const SOURCE: &str = include_str!("collectives.rs");

/// [`tessera_tests::assert_names_call_site`] for this file.
fn assert_names_call_site(msg: &str, mark: &str, call: &str, inner: &[&str]) {
    tessera_tests::assert_names_call_site((SOURCE, file!()), msg, mark, call, inner);
}

/// A collective whose peer never comes (rank 1 skips the second all-reduce): rank 0's
/// device-side wait in the library's kernel times out, and the error names the
/// user's call first (this file's line), then the wait that timed out (its line in
/// the library's kernels, the kernel, the rank).
#[test]
fn a_collective_that_times_out_names_the_callers_line() {
    let errs = std::sync::Mutex::new(Vec::new());
    let start = std::time::Instant::now();
    let _ = world(2).wait_timeout(Duration::from_millis(500)).run(|r| {
        let mut b = r.upload(&[1.0f32; 64])?;
        r.all_reduce(&mut b, ReduceOp::Sum)?;
        if r.rank() == 0 {
            let e = r.all_reduce(&mut b, ReduceOp::Sum); // MARK: lonely all_reduce
            errs.lock().unwrap().push(e);
        }
        Ok(())
    });
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let errs = errs.into_inner().unwrap();
    assert_eq!(errs.len(), 1);
    let e = errs
        .into_iter()
        .next()
        .unwrap()
        .expect_err("rank 0's lonely all_reduce succeeded");
    assert_names_call_site(
        &e.to_string(),
        "MARK: lonely all_reduce",
        "all_reduce",
        &[
            "runtime/src/collectives/kernels.rs:",
            "`wait_until` timed out after 0.500 s",
            "on rank 0",
        ],
    );
    let line = tessera_tests::line_of(SOURCE, "MARK: lonely all_reduce");
    match &e {
        Error::Collective { call, at, source } => {
            assert_eq!(
                (*call, at.file(), at.line()),
                ("all_reduce", "tests/tests/collectives.rs", line)
            );
            assert!(!matches!(**source, Error::Collective { .. }), "{e:?}");
        }
        other => panic!("not an Error::Collective: {other:?}"),
    }
    // The library's error, for matching: a wait that timed out on rank 0.
    assert!(
        e.inner()
            .to_string()
            .starts_with("runtime/src/collectives/kernels.rs:"),
        "{e:?}"
    );
}

/// Invalid arguments of every collective entry point: every rank's error names its
/// own call's line first, then the call and the library's reason.
#[test]
fn invalid_collective_calls_name_the_callers_line_on_every_rank() {
    let out = world(2)
        .run(|r| {
            let mut b = r.upload(&[1.0f32; 10])?;
            let mut big = r.alloc::<f32>(70_000)?;
            let mut out = r.alloc::<f32>(7)?;
            let (sum, ll, flat) = (
                ReduceOp::Sum,
                AllReduceAlgo::LowLatency,
                AllGatherAlgo::Flat,
            );
            let counts = if r.rank() == 1 {
                vec![8, 8]
            } else {
                vec![1, 1]
            };
            let errs = [
                r.all_reduce(&mut b, ReduceOp::Prod).err(), // MARK: call 1
                r.all_reduce_with(&mut big, sum, ll).err(), // MARK: call 2
                r.all_gather(&b, &mut out).err(),           // MARK: call 3
                r.all_gather_with(&b, &mut out, flat).err(), // MARK: call 4
                r.reduce_scatter(&b, &mut out, sum).err(),  // MARK: call 5
                r.broadcast(&mut b, 5).err(),               // MARK: call 6
                r.all_to_all_v(&b, &counts, &mut out).err(), // MARK: call 7
            ];
            Ok(errs.map(|e| e.map(|e| e.to_string())))
        })
        .unwrap();
    for (rank, errs) in out.into_iter().enumerate() {
        let cases = [
            ("all_reduce", "Sum, Max or Min"),
            ("all_reduce_with", "low-latency"),
            ("all_gather", "expected input length 10"),
            ("all_gather_with", "expected input length 10"),
            ("reduce_scatter", "expected output length 7"),
            ("broadcast", "root 5"),
            (
                "all_to_all_v",
                if rank == 1 {
                    "add up to more"
                } else {
                    "rank 1 passed invalid"
                },
            ),
        ];
        for (i, ((call, inner), e)) in cases.into_iter().zip(errs).enumerate() {
            let msg = e.unwrap_or_else(|| panic!("rank {rank}: {call} succeeded"));
            let on_rank = format!("on rank {rank}: ");
            let mark = format!("MARK: call {}", i + 1);
            assert_names_call_site(&msg, &mark, call, &[inner, &on_rank]);
        }
    }
}

/// A rank that fails while another waits in a collective is still the world's
/// error: the waiting rank's collective, released by that failure, returns an error
/// that only reports it (not wrapped with the call site), which `World::run` ranks
/// after the failing rank's own error.
#[test]
fn a_rank_that_fails_during_a_collective_is_the_worlds_error() {
    let start = std::time::Instant::now();
    let released = std::sync::Mutex::new(None);
    let err = world(2)
        .run(|r| {
            let mut b = r.upload(&[1.0f32; 64])?;
            r.all_reduce(&mut b, ReduceOp::Sum)?;
            if r.rank() == 1 {
                std::thread::sleep(Duration::from_millis(100));
                return Err(Error::Comm {
                    rank: 1,
                    message: "rank 1 gives up".into(),
                });
            }
            let e = r.all_reduce(&mut b, ReduceOp::Sum);
            *released.lock().unwrap() = e.as_ref().err().map(|e| e.to_string());
            e
        })
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert!(err.to_string().contains("rank 1 gives up"), "{err}");
    let released = released.into_inner().unwrap();
    assert!(released.is_some(), "rank 0's all_reduce succeeded");
}

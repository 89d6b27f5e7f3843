//! The collectives' kernels: every data-moving and reducing step, written in Tessera.
//!
//! Conventions shared by all kernels (see the [module docs](super)):
//! - a program instance handles the chunks `pid, pid + np, pid + 2 np, ...` of
//!   [`TILE`] elements (persistent style: the grid is small, every instance loops);
//! - handshake `h` of program `pid` uses the signal words
//!   `sig_base + (h * np + pid) * ws + src`, one word per source rank, written only
//!   by that source (`signal(.., epoch, Set)`) and waited for with `>= epoch`;
//! - reductions run in `f32`, over the ranks in rank order `0, 1, .., ws - 1`, and
//!   round once to `T`: every rank (and every algorithm) gets bit-identical results.

use crate::prelude::*;

/// Elements per tile (per chunk) in every collective kernel.
pub const TILE: usize = 1024;

/// `OP` values of the reducing kernels.
pub(crate) const OP_SUM: usize = 0;
/// See [`OP_SUM`].
pub(crate) const OP_MAX: usize = 1;
/// See [`OP_SUM`].
pub(crate) const OP_MIN: usize = 2;

type F = Tile<f32, S1<TILE>>;

/// `a (op) b`, with `op` known when the kernel is traced.
fn combine(a: F, b: F, op: usize) -> F {
    match op {
        OP_MAX => a.maximum(b),
        OP_MIN => a.minimum(b),
        _ => a + b,
    }
}

/// Handshake `h`: tells every rank's program `pid` that this rank's program `pid`
/// reached this point (release: its earlier accesses are visible to whoever sees the
/// signal), then waits until every rank's program `pid` did (acquire).
#[helper]
#[allow(clippy::zero_prefixed_literal)]
fn handshake(sig: &mut Symmetric<u64>, sig_base: Scalar<i32>, h: i32, epoch: Scalar<u64>) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let row = sig_base + (pid + np * h) * ws;
    for p in 0..ws {
        sig.signal(p, row + me, epoch, SignalOp::Set);
    }
    for p in 0..ws {
        sig.wait_until(row + p, CmpPred::Ge, epoch);
    }
}

/// One-shot all-reduce, plain protocol: copy the input into this rank's staging slot
/// (`stage[stage_off..]`, double-buffered by epoch parity), handshake, then read every
/// rank's slot, reduce and write the result into `buf`.
#[kernel]
pub(crate) fn ar_one_shot<T: Float, const OP: usize>(
    buf: &mut Symmetric<T>,
    stage: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    n: i32,
    stage_off: i32,
    sig_base: i32,
    epoch: u64,
) {
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    let nchunks = (n + (TILE as i32 - 1)) / TILE as i32;
    for c in (pid..nchunks).step_by(np) {
        let offs = c * TILE as i32 + lanes;
        let m = offs.lt(n);
        stage.store(offs + stage_off, buf.load(offs, m), m);
    }
    handshake(sig, sig_base, 0, epoch);
    for c in (pid..nchunks).step_by(np) {
        let offs = c * TILE as i32 + lanes;
        let m = offs.lt(n);
        let mut acc = stage.on(0).load(offs + stage_off, m).cast::<f32>();
        for p in 1..ws {
            acc = combine(acc, stage.on(p).load(offs + stage_off, m).cast::<f32>(), OP);
        }
        buf.store(offs, acc.cast::<T>(), m);
    }
}

/// Two-shot all-reduce: rank `r` owns segment `r` (`seg` elements) of the buffer;
/// after a handshake it reduces its segment over every rank's copy (reduce-scatter)
/// and writes the result into every rank's copy (all-gather, push), then a second
/// handshake says "my pushes are done". Only rank `r` reads or writes segment `r` of
/// a peer's copy, so no staging is needed.
#[kernel]
pub(crate) fn ar_two_shot<T: Float, const OP: usize>(
    buf: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    n: i32,
    seg: i32,
    sig_base: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    let nchunks = (seg + (TILE as i32 - 1)) / TILE as i32;
    handshake(sig, sig_base, 0, epoch);
    for c in (pid..nchunks).step_by(np) {
        let loc = c * TILE as i32 + lanes;
        let offs = me * seg + loc;
        let m = loc.lt(seg) & offs.lt(n);
        let mut acc = buf.on(0).load(offs, m).cast::<f32>();
        for p in 1..ws {
            acc = combine(acc, buf.on(p).load(offs, m).cast::<f32>(), OP);
        }
        let v = acc.cast::<T>();
        for p in 0..ws {
            buf.on(p).store(offs, v, m);
        }
    }
    handshake(sig, sig_base, 1, epoch);
}

/// One-shot all-reduce, low-latency protocol. Every element travels as one `u64`
/// word `flag << 32 | bits` (`bits`: the element's bit pattern, zero-extended; `flag`:
/// the call's epoch, passed shifted as `flag`), stored into slot `me` of every rank's
/// LL buffer (`ll[ll_off + src * cap + i]`). A reader polls its own slots' words until
/// every word carries this epoch's flag: no separate signal, and a word is data and
/// "ready" at once (a 64-bit store is single-copy atomic). The poll waits with
/// `wait_until` on the first word not yet ready, so it backs off, times out and
/// stops when another rank fails like any wait. Bits are turned back into `T` through
/// a per-program scratch tile seen both as `U` and as `T` (`scratch_bits`/`scratch`:
/// the same memory).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub(crate) fn ar_ll<T: Float, U: Int, const OP: usize>(
    buf: &mut Symmetric<T>,
    bits: &Symmetric<U>,
    ll: &mut Symmetric<u64>,
    scratch_bits: &mut Symmetric<U>,
    scratch: &Symmetric<T>,
    n: i32,
    ll_off: i32,
    cap: i32,
    flag: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    let nchunks = (n + (TILE as i32 - 1)) / TILE as i32;
    for c in (pid..nchunks).step_by(np) {
        let offs = c * TILE as i32 + lanes;
        let m = offs.lt(n);
        let w = bits.load(offs, m).cast::<u64>() | flag;
        for p in 0..ws {
            ll.on(p).store(ll_off + me * cap + offs, w, m);
        }
    }
    // The words are delivered (an off-node engine such as NVSHMEM guarantees it only
    // after a quiet; waiting for them without one could wait forever).
    quiet();
    let sc = pid * TILE as i32 + lanes;
    for c in (pid..nchunks).step_by(np) {
        let offs = c * TILE as i32 + lanes;
        let m = offs.lt(n);
        let mut acc = zeros::<f32, S1<TILE>>();
        for p in 0..ws {
            let idx = ll_off + p * cap + offs;
            let mut words = ll.load(idx, m);
            let mut pending = select::<i32, _, _, _>(words.lt(flag) & m, 1i32, 0i32).sum::<0>();
            while pending.gt(0) {
                let first = select::<i32, _, _, _>(words.lt(flag) & m, idx, i32::MAX).min::<0>();
                ll.wait_until(first, CmpPred::Ge, flag);
                words = ll.load(idx, m);
                pending = select::<i32, _, _, _>(words.lt(flag) & m, 1i32, 0i32).sum::<0>();
            }
            scratch_bits.store(sc, words.cast::<U>(), m);
            barrier();
            let v = scratch.load(sc, m).cast::<f32>();
            barrier();
            if p.eq(0) {
                acc = v;
            } else {
                acc = combine(acc, v, OP);
            }
        }
        buf.store(offs, acc.cast::<T>(), m);
    }
}

/// All-gather (push): after a handshake (every rank's output is free), each rank
/// writes its input into block `me` of every rank's output; a second handshake says
/// "my pushes are done".
#[kernel]
pub(crate) fn all_gather_k<T: Float>(
    input: &Symmetric<T>,
    output: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    n: i32,
    sig_base: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    let nchunks = (n + (TILE as i32 - 1)) / TILE as i32;
    handshake(sig, sig_base, 0, epoch);
    for c in (pid..nchunks).step_by(np) {
        let offs = c * TILE as i32 + lanes;
        let m = offs.lt(n);
        let v = input.load(offs, m);
        for p in 0..ws {
            output.on(p).store(me * n + offs, v, m);
        }
    }
    handshake(sig, sig_base, 1, epoch);
}

/// Reduce-scatter (pull): after a handshake, rank `r` reduces block `r` over every
/// rank's input into its output; a second handshake says "done reading your input".
#[kernel]
pub(crate) fn reduce_scatter_k<T: Float, const OP: usize>(
    input: &Symmetric<T>,
    output: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    n: i32,
    sig_base: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    let nchunks = (n + (TILE as i32 - 1)) / TILE as i32;
    handshake(sig, sig_base, 0, epoch);
    for c in (pid..nchunks).step_by(np) {
        let offs = c * TILE as i32 + lanes;
        let m = offs.lt(n);
        let src = me * n + offs;
        let mut acc = input.on(0).load(src, m).cast::<f32>();
        for p in 1..ws {
            acc = combine(acc, input.on(p).load(src, m).cast::<f32>(), OP);
        }
        output.store(offs, acc.cast::<T>(), m);
    }
    handshake(sig, sig_base, 1, epoch);
}

/// Broadcast (pull): after a handshake, every rank but `root` copies root's buffer;
/// a second handshake says "done reading".
#[kernel]
pub(crate) fn broadcast_k<T: Float>(
    buf: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    n: i32,
    root: i32,
    sig_base: i32,
    epoch: u64,
) {
    let me = rank();
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    let nchunks = (n + (TILE as i32 - 1)) / TILE as i32;
    handshake(sig, sig_base, 0, epoch);
    if me.ne(root) {
        for c in (pid..nchunks).step_by(np) {
            let offs = c * TILE as i32 + lanes;
            let m = offs.lt(n);
            let v = buf.on(root).load(offs, m);
            buf.store(offs, v, m);
        }
    }
    handshake(sig, sig_base, 1, epoch);
}

/// All-to-all-v, step 1 (one program): gathers every rank's count row
/// (`counts[0]`: 1 if that rank's arguments are valid, `counts[1 + d]`: elements it
/// sends to rank `d`) into `matrix` (`ws` rows of `ws + 1`), between two handshakes.
#[kernel]
pub(crate) fn a2a_counts(
    counts: &Symmetric<i32>,
    matrix: &mut Symmetric<i32>,
    sig: &mut Symmetric<u64>,
    sig_base: i32,
    epoch: u64,
) {
    let ws = world_size();
    let lanes = arange::<TILE>();
    let row = ws + 1;
    let nchunks = (row + (TILE as i32 - 1)) / TILE as i32;
    handshake(sig, sig_base, 0, epoch);
    for p in 0..ws {
        for c in 0..nchunks {
            let offs = c * TILE as i32 + lanes;
            let m = offs.lt(row);
            let v = counts.on(p).load(offs, m);
            matrix.store(p * row + offs, v, m);
        }
    }
    handshake(sig, sig_base, 1, epoch);
}

/// All-to-all-v, step 2 (pull): for every source `p`, copies `meta[3p + 2]` elements
/// from `send` of rank `p` at `meta[3p]` to this rank's `recv` at `meta[3p + 1]`;
/// a handshake then says "done reading your send buffer". (Every source's send buffer
/// is ready: its owner passed step 1.)
#[kernel]
pub(crate) fn a2a_data<T: Float>(
    send: &Symmetric<T>,
    recv: &mut Symmetric<T>,
    meta: &Global<i32>,
    sig: &mut Symmetric<u64>,
    sig_base: i32,
    epoch: u64,
) {
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    for p in 0..ws {
        let src = meta.load_unmasked(p * 3);
        let dst = meta.load_unmasked(p * 3 + 1);
        let cnt = meta.load_unmasked(p * 3 + 2);
        let nchunks = (cnt + (TILE as i32 - 1)) / TILE as i32;
        for c in (pid..nchunks).step_by(np) {
            let loc = c * TILE as i32 + lanes;
            let m = loc.lt(cnt);
            let v = send.on(p).load(src + loc, m);
            recv.store(dst + loc, v, m);
        }
    }
    handshake(sig, sig_base, 0, epoch);
}

/// A handshake on this rank's node (ranks `node0 .. node0 + lsize`): raises word
/// `row + me` on each of them to `epoch`, then waits for each one's word
/// (`row + node0 + k`).
#[helper]
#[allow(clippy::zero_prefixed_literal)]
fn node_handshake(
    hsig: &mut Symmetric<u64>,
    node0: Scalar<i32>,
    lsize: Scalar<i32>,
    row: Scalar<i32>,
    epoch: Scalar<u64>,
) {
    let me = rank();
    for k in 0..lsize {
        hsig.signal(node0 + k, row + me, epoch, SignalOp::Set);
    }
    for k in 0..lsize {
        hsig.wait_until(row + node0 + k, CmpPred::Ge, epoch);
    }
}

/// Hierarchical all-reduce (ranks on nodes of `lsize` consecutive ranks; see the
/// [module docs](super)). Local rank `l` of a node owns segment `l` (`seg` elements)
/// of the buffer. It handles its chunks in steps of `step` chunks, in one pipeline:
/// 1. **on the node** it reduces segment `l` over its node's ranks (direct loads)
///    into `f32` partials in its staging slot (`stage[stage_off..]`), then raises
///    its progress word on the rank of each node that owns the same segment;
/// 2. **across nodes** (one step behind, so that step 1 of the next step overlaps
///    the transfer) it waits for the progress of those ranks, reads their partials
///    through the off-node engine, combines them in node order, rounds once to `T`
///    and stores the result into segment `l` of every rank of its node.
///
/// Signal words (`hsig`, per program `pid`: three rows of `ws` words from
/// `pid * 3 * ws`): "entered" (epoch, on the node), progress (`tick + s + 1` after
/// step `s`; `tick` = epoch shifted left by 24, so values only grow across calls),
/// "done" (epoch, on the node: every rank of the node stored its segment here).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub(crate) fn ar_hier<T: Float, const OP: usize>(
    buf: &mut Symmetric<T>,
    stage: &mut Symmetric<f32>,
    hsig: &mut Symmetric<u64>,
    n: i32,
    seg: i32,
    lsize: i32,
    stage_off: i32,
    step: i32,
    epoch: u64,
    tick: u64,
) {
    let me = rank();
    let ws = world_size();
    let l = me % lsize;
    let node0 = me - l;
    let nodes = ws / lsize;
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    let nchunks = (seg + (TILE as i32 - 1)) / TILE as i32;
    let mine = (nchunks - pid + np - 1) / np;
    let entered = pid * 3 * ws;
    let progress = entered + ws;
    let done = progress + ws;
    node_handshake(hsig, node0, lsize, entered, epoch);
    let steps = (mine + step - 1) / step;
    for s in 0..steps + 1 {
        if s.lt(steps) {
            for q in 0..step {
                let i = s * step + q;
                if i.lt(mine) {
                    let loc = (pid + i * np) * TILE as i32 + lanes;
                    let offs = l * seg + loc;
                    let m = loc.lt(seg) & offs.lt(n);
                    let mut acc = buf.on(node0).load(offs, m).cast::<f32>();
                    for k in 1..lsize {
                        acc = combine(acc, buf.on(node0 + k).load(offs, m).cast::<f32>(), OP);
                    }
                    stage.store(stage_off + loc, acc, m);
                }
            }
            let mark = tick + (s + 1).cast::<u64>();
            for j in 0..nodes {
                hsig.signal(j * lsize + l, progress + me, mark, SignalOp::Set);
            }
        }
        if s.gt(0) {
            let mark = tick + s.cast::<u64>();
            for j in 0..nodes {
                hsig.wait_until(progress + j * lsize + l, CmpPred::Ge, mark);
            }
            for q in 0..step {
                let i = (s - 1) * step + q;
                if i.lt(mine) {
                    let loc = (pid + i * np) * TILE as i32 + lanes;
                    let offs = l * seg + loc;
                    let m = loc.lt(seg) & offs.lt(n);
                    let mut acc = stage.on(l).load(stage_off + loc, m);
                    for j in 1..nodes {
                        acc = combine(acc, stage.on(j * lsize + l).load(stage_off + loc, m), OP);
                    }
                    let v = acc.cast::<T>();
                    for k in 0..lsize {
                        buf.on(node0 + k).store(offs, v, m);
                    }
                }
            }
        }
    }
    node_handshake(hsig, node0, lsize, done, epoch);
}

/// Hierarchical all-gather (ranks on nodes of `lsize` consecutive ranks). Rank
/// `(node b, local l)` pushes each chunk of its input **across nodes** only to the
/// rank `l` of every node (block `me` of their outputs, through the off-node
/// engine) and raises its progress word there after each step of `step` chunks;
/// one step behind, it forwards what
/// the ranks `l` of every node pushed to it (block of that source) to the other
/// ranks of its **own node** (direct stores). Off-node bytes per rank: one copy of
/// the input per other node, instead of one per off-node rank. Signal rows as in
/// [`ar_hier`]; "entered" is raised on every rank that writes into this rank's
/// output (the ranks `l` of every node and the node's ranks).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub(crate) fn ag_hier<T: Float>(
    input: &Symmetric<T>,
    output: &mut Symmetric<T>,
    hsig: &mut Symmetric<u64>,
    n: i32,
    lsize: i32,
    step: i32,
    epoch: u64,
    tick: u64,
) {
    let me = rank();
    let ws = world_size();
    let l = me % lsize;
    let node0 = me - l;
    let nodes = ws / lsize;
    let pid = program_id(0);
    let np = num_programs(0);
    let lanes = arange::<TILE>();
    let nchunks = (n + (TILE as i32 - 1)) / TILE as i32;
    let mine = (nchunks - pid + np - 1) / np;
    let entered = pid * 3 * ws;
    let progress = entered + ws;
    let done = progress + ws;
    for j in 0..nodes {
        hsig.signal(j * lsize + l, entered + me, epoch, SignalOp::Set);
    }
    for k in 0..lsize {
        hsig.signal(node0 + k, entered + me, epoch, SignalOp::Set);
    }
    for j in 0..nodes {
        hsig.wait_until(entered + j * lsize + l, CmpPred::Ge, epoch);
    }
    for k in 0..lsize {
        hsig.wait_until(entered + node0 + k, CmpPred::Ge, epoch);
    }
    let steps = (mine + step - 1) / step;
    for s in 0..steps + 1 {
        if s.lt(steps) {
            for q in 0..step {
                let i = s * step + q;
                if i.lt(mine) {
                    let offs = (pid + i * np) * TILE as i32 + lanes;
                    let m = offs.lt(n);
                    let v = input.load(offs, m);
                    for j in 0..nodes {
                        output.on(j * lsize + l).store(me * n + offs, v, m);
                    }
                }
            }
            let mark = tick + (s + 1).cast::<u64>();
            for j in 0..nodes {
                hsig.signal(j * lsize + l, progress + me, mark, SignalOp::Set);
            }
        }
        if s.gt(0) {
            let mark = tick + s.cast::<u64>();
            for j in 0..nodes {
                hsig.wait_until(progress + j * lsize + l, CmpPred::Ge, mark);
            }
            for q in 0..step {
                let i = (s - 1) * step + q;
                if i.lt(mine) {
                    let offs = (pid + i * np) * TILE as i32 + lanes;
                    let m = offs.lt(n);
                    for j in 0..nodes {
                        let src = j * lsize + l;
                        let v = output.load(src * n + offs, m);
                        for k in 0..lsize {
                            if k.ne(l) {
                                output.on(node0 + k).store(src * n + offs, v, m);
                            }
                        }
                    }
                }
            }
        }
    }
    node_handshake(hsig, node0, lsize, done, epoch);
}

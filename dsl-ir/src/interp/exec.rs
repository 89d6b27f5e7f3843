//! The evaluator: argument checking, the parallel grid driver and per-op semantics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::InterpError;
use super::arith::{self, ArithErr, Operand};
use super::buffer::{Element, HostBuffer, std_order};
use super::comm::{CommWorld, MAX_RESIDENT};
use super::value::{Data, Elt, KernelArg, PtrTile, Slots, map_data};
use crate::ir::{ConstValue, DescOperands, Function, Op, OpKind, Region, ValueId};
use crate::types::{Elem, ScalarType, Type};

/// Runs kernel `f` on every program instance of `grid` with launch arguments `args`.
///
/// Arguments are checked against the parameters first (count, buffer element type
/// against the pointee type, scalar type), then all program instances run in parallel.
/// On failure the error of the lowest failing program id is returned (see the
/// [module docs](super)).
pub fn run(f: &Function, grid: [u32; 3], args: &[KernelArg]) -> Result<(), InterpError> {
    run_in_world(f, grid, args, None)
}

/// [`run`] as one rank of `world` (see the [module docs](super) on communication);
/// `None` runs as rank 0 of a world of one. When a program instance fails, the world
/// is aborted (every rank's waits stop) before the error is returned.
pub fn run_in_world(
    f: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&CommWorld>,
) -> Result<(), InterpError> {
    run_limited(f, grid, args, world, None)
}

/// [`run_in_world`] with a watchdog: once the launch has run for `timeout`, every
/// program stops at its next loop test (`for`, `while`) and the launch fails with
/// [`InterpError::LaunchTimeout`] naming the loop. `None`: no limit.
pub fn run_limited(
    f: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&CommWorld>,
    timeout: Option<std::time::Duration>,
) -> Result<(), InterpError> {
    drive(f, grid, args, world, timeout, None)
}

/// [`run_limited`] over the program instances `claim` hands out (their linear ids,
/// `x` fastest), until it returns `None`: the interpreter and compiled code can take
/// turns at one launch's programs (the CPU device runs a kernel's first launch so
/// while LLVM compiles it). Each id must be handed out once. A kernel whose programs
/// wait for each other (`wait_until`, `barrier_all`) is refused: they must all be
/// resident at once. On failure the error of the lowest failing id run here is
/// returned.
pub fn run_claimed(
    f: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    timeout: Option<std::time::Duration>,
    claim: &(dyn Fn() -> Option<u64> + Sync),
) -> Result<(), InterpError> {
    if f.uses_blocking() {
        return Err(InterpError::Unsupported {
            kernel: f.name.clone(),
            op: "launch",
            span: f.span.clone(),
            message: "the programs of a kernel that waits cannot be run in turns".into(),
        });
    }
    drive(f, grid, args, None, timeout, Some(claim))
}

fn drive(
    f: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&CommWorld>,
    timeout: Option<std::time::Duration>,
    claim: Option<&(dyn Fn() -> Option<u64> + Sync)>,
) -> Result<(), InterpError> {
    let world = world.cloned().unwrap_or_else(CommWorld::single);
    let bound = check_args(f, args, &world)?;
    let total = grid
        .iter()
        .try_fold(1u64, |n, &g| n.checked_mul(g as u64))
        .ok_or_else(|| InterpError::GridTooLarge {
            kernel: f.name.clone(),
            grid,
        })?;
    if total == 0 {
        return Ok(());
    }
    let blocking = f.uses_blocking();
    if blocking && total > MAX_RESIDENT {
        return Err(InterpError::TooManyPrograms {
            kernel: f.name.clone(),
            span: f.span.clone(),
            programs: total,
            limit: MAX_RESIDENT,
        });
    }
    let ex = Exec {
        f,
        grid,
        bufs: bound.bufs,
        remote_base: bound.remote_base,
        slot_names: bound.slot_names,
        params: bound.params,
        plan: Plan::new(f),
        world,
        best: AtomicU64::new(u64::MAX),
        err: Mutex::new(None),
        watchdog: timeout.map(|t| (std::time::Instant::now() + t, t)),
    };
    let nvalues = f.values.len();
    if let Some(claim) = claim {
        // One loop a worker, each taking the next program as it finishes one.
        (0..rayon::current_num_threads())
            .into_par_iter()
            .for_each_init(
                || vec![None; nvalues],
                |env, _| {
                    while let Some(lin) = claim() {
                        if lin < total {
                            ex.run_program(env, lin);
                        }
                    }
                },
            );
    } else if blocking {
        // Every program instance on its own thread: they may wait for each other.
        std::thread::scope(|s| {
            for lin in 0..total {
                let ex = &ex;
                s.spawn(move || ex.run_program(&mut vec![None; nvalues], lin));
            }
        });
    } else {
        (0..total)
            .into_par_iter()
            .for_each_init(|| vec![None; nvalues], |env, lin| ex.run_program(env, lin));
    }
    let err = ex.err.into_inner().unwrap_or_else(|e| e.into_inner());
    // The kernel's writes through a communication engine are complete when the
    // launch is, whether it failed or not.
    let quiet = ex.world.quiet();
    match err {
        Some((_, e)) => Err(e),
        None => quiet,
    }
}

/// Buffers by slot (parameters first, then every rank's copy of each symmetric
/// parameter), the remote slot base of each parameter slot, slot names, and the
/// initial values of the parameters.
struct Bound<'a> {
    bufs: Vec<Option<&'a HostBuffer>>,
    remote_base: Vec<Option<u32>>,
    slot_names: Vec<String>,
    params: Vec<(ValueId, Data)>,
}

fn check_args<'a>(
    f: &Function,
    args: &'a [KernelArg],
    world: &CommWorld,
) -> Result<Bound<'a>, InterpError> {
    let mismatch = |param: &str, message: String| InterpError::ArgMismatch {
        kernel: f.name.clone(),
        span: f.span.clone(),
        param: param.to_string(),
        message,
    };
    if args.len() != f.params.len() {
        return Err(mismatch(
            "<count>",
            format!(
                "expected {} argument(s), got {}",
                f.params.len(),
                args.len()
            ),
        ));
    }
    let mut bufs = Vec::with_capacity(args.len());
    let mut params = Vec::with_capacity(args.len());
    let mut remote: Vec<(usize, &'a [Arc<HostBuffer>])> = Vec::new();
    for (i, (p, a)) in f.params.iter().zip(args).enumerate() {
        let ty = f
            .values
            .get(p.value.index())
            .map(|v| &v.ty)
            .ok_or_else(|| mismatch(&p.name, "parameter has no value".into()))?;
        if !ty.is_scalar() {
            return Err(mismatch(
                &p.name,
                format!("tile parameters ({ty}) are not supported"),
            ));
        }
        match (ty.elem, a) {
            (Elem::Ptr { pointee, .. }, KernelArg::Buffer(b)) => {
                if b.elem() != pointee {
                    return Err(mismatch(
                        &p.name,
                        format!(
                            "expected a buffer of {pointee} for {ty}, got a buffer of {}",
                            b.elem()
                        ),
                    ));
                }
                bufs.push(Some(&**b));
                params.push((
                    p.value,
                    Data::Ptr(PtrTile {
                        slots: Slots::Uniform(i as u32),
                        offs: vec![0],
                    }),
                ));
            }
            (Elem::Ptr { pointee, .. }, KernelArg::Symmetric(copies)) => {
                if copies.len() != world.size as usize {
                    return Err(mismatch(
                        &p.name,
                        format!(
                            "a symmetric buffer with {} copies in a world of {} rank(s)",
                            copies.len(),
                            world.size
                        ),
                    ));
                }
                let local = &copies[world.rank as usize];
                if let Some(b) = copies.iter().find(|b| b.elem() != pointee) {
                    return Err(mismatch(
                        &p.name,
                        format!(
                            "expected a buffer of {pointee} for {ty}, got a buffer of {}",
                            b.elem()
                        ),
                    ));
                }
                bufs.push(Some(&**local));
                remote.push((i, copies));
                params.push((
                    p.value,
                    Data::Ptr(PtrTile {
                        slots: Slots::Uniform(i as u32),
                        offs: vec![0],
                    }),
                ));
            }
            (Elem::Ptr { .. }, KernelArg::Scalar(s)) => {
                return Err(mismatch(
                    &p.name,
                    format!("expected a buffer for {ty}, got scalar {s}"),
                ));
            }
            (Elem::Scalar(st), KernelArg::Scalar(s)) => {
                if s.ty() != st {
                    return Err(mismatch(
                        &p.name,
                        format!("expected a scalar of type {st}, got {s}"),
                    ));
                }
                bufs.push(None);
                params.push((p.value, s.to_data()));
            }
            (Elem::Scalar(st), KernelArg::Buffer(_) | KernelArg::Symmetric(_)) => {
                return Err(mismatch(
                    &p.name,
                    format!("expected a scalar of type {st}, got a buffer"),
                ));
            }
        }
    }
    let mut slot_names: Vec<String> = f.params.iter().map(|p| p.name.clone()).collect();
    let mut remote_base = vec![None; bufs.len()];
    for (i, copies) in remote {
        remote_base[i] = Some(bufs.len() as u32);
        for (r, b) in copies.iter().enumerate() {
            bufs.push(Some(&**b));
            slot_names.push(format!("{} (rank {r}'s copy)", f.params[i].name));
        }
    }
    Ok(Bound {
        bufs,
        remote_base,
        slot_names,
        params,
    })
}

/// Per-op facts computed once per launch.
struct PlanOp {
    /// Bit `k`: operand `k` may be moved out of the environment (its last use, in the
    /// region that defines it, and not used twice by this op).
    take: u64,
    /// For `splat`: every use broadcasts a one-element operand itself (`binary`, `cmp`,
    /// `addptr` whose other operand is not a splat), so the splat keeps one element.
    lazy: bool,
    regions: Vec<PlanRegion>,
}

struct PlanRegion {
    ops: Vec<PlanOp>,
}

struct Plan {
    body: PlanRegion,
}

impl Plan {
    fn new(f: &Function) -> Plan {
        const NONE: usize = usize::MAX;
        let nv = f.values.len();
        let mut def_region = vec![NONE; nv];
        let mut last_use = vec![(NONE, NONE); nv];
        for p in &f.params {
            if let Some(d) = def_region.get_mut(p.value.index()) {
                *d = 0;
            }
        }
        struct Walk<'a> {
            def_region: &'a mut Vec<usize>,
            last_use: &'a mut Vec<(usize, usize)>,
            /// Defined by a `splat`.
            splat: Vec<bool>,
            /// A splat all of whose uses accept a one-element operand.
            lazy: Vec<bool>,
            seq: usize,
            rid: usize,
        }
        impl Walk<'_> {
            fn scan(&mut self, r: &Region, rid: usize) {
                for a in &r.args {
                    if let Some(d) = self.def_region.get_mut(a.index()) {
                        *d = rid;
                    }
                }
                for op in &r.ops {
                    let s = self.seq;
                    self.seq += 1;
                    for (k, o) in op.operands.iter().enumerate() {
                        if let Some(u) = self.last_use.get_mut(o.index()) {
                            *u = (s, rid);
                        }
                        if self.splat.get(o.index()) == Some(&true) {
                            let broadcasts = matches!(
                                op.kind,
                                OpKind::Binary(_) | OpKind::Cmp(_) | OpKind::AddPtr
                            ) && op.operands.len() == 2
                                && !self.splat[op.operands[1 - k].index()];
                            if !broadcasts {
                                self.lazy[o.index()] = false;
                            }
                        }
                    }
                    for res in &op.results {
                        if let Some(d) = self.def_region.get_mut(res.index()) {
                            *d = rid;
                        }
                        if op.kind == OpKind::Splat && res.index() < self.splat.len() {
                            self.splat[res.index()] = true;
                            self.lazy[res.index()] = true;
                        }
                    }
                    for sub in &op.regions {
                        self.rid += 1;
                        let id = self.rid;
                        self.scan(sub, id);
                    }
                }
            }
            fn build(&mut self, r: &Region, rid: usize) -> PlanRegion {
                let mut ops = Vec::with_capacity(r.ops.len());
                for op in &r.ops {
                    let s = self.seq;
                    self.seq += 1;
                    let mut take = 0u64;
                    for (k, o) in op.operands.iter().enumerate().take(64) {
                        let i = o.index();
                        if i < self.last_use.len()
                            && self.last_use[i] == (s, rid)
                            && self.def_region[i] == rid
                            && op.operands.iter().filter(|x| *x == o).count() == 1
                        {
                            take |= 1 << k;
                        }
                    }
                    let mut regions = Vec::with_capacity(op.regions.len());
                    for sub in &op.regions {
                        self.rid += 1;
                        let id = self.rid;
                        regions.push(self.build(sub, id));
                    }
                    let lazy = op.kind == OpKind::Splat
                        && op
                            .results
                            .first()
                            .is_some_and(|r| self.lazy.get(r.index()) == Some(&true));
                    ops.push(PlanOp {
                        take,
                        lazy,
                        regions,
                    });
                }
                PlanRegion { ops }
            }
        }
        let mut w = Walk {
            def_region: &mut def_region,
            last_use: &mut last_use,
            splat: vec![false; nv],
            lazy: vec![false; nv],
            seq: 0,
            rid: 0,
        };
        w.scan(&f.body, 0);
        w.seq = 0;
        w.rid = 0;
        let body = w.build(&f.body, 0);
        Plan { body }
    }
}

/// Shared state of one launch.
pub(super) struct Exec<'a> {
    f: &'a Function,
    pub(super) grid: [u32; 3],
    bufs: Vec<Option<&'a HostBuffer>>,
    /// For each slot of a symmetric parameter: the slot of rank 0's copy (rank `r`'s
    /// copy is at `base + r`).
    pub(super) remote_base: Vec<Option<u32>>,
    slot_names: Vec<String>,
    params: Vec<(ValueId, Data)>,
    plan: Plan,
    pub(super) world: CommWorld,
    /// Lowest linear program id known to have failed.
    best: AtomicU64,
    err: Mutex<Option<(u64, InterpError)>>,
    /// The watchdog's deadline and limit ([`run_limited`]).
    watchdog: Option<(std::time::Instant, std::time::Duration)>,
}

/// Why a program instance stopped.
pub(super) enum Stop {
    Error(Box<InterpError>),
    /// A lower program id failed; this one's result no longer matters.
    Cancelled,
}

impl From<InterpError> for Stop {
    fn from(e: InterpError) -> Stop {
        Stop::Error(Box::new(e))
    }
}

pub(super) type R<T> = Result<T, Stop>;

/// How a region ended.
enum Term {
    Fall,
    Yield(Vec<Data>),
    Cond(bool, Vec<Data>),
}

impl Exec<'_> {
    fn run_program(&self, env: &mut [Option<Data>], lin: u64) {
        if lin > self.best.load(Ordering::Relaxed) {
            return;
        }
        for v in env.iter_mut() {
            *v = None;
        }
        for (v, d) in &self.params {
            if let Some(slot) = env.get_mut(v.index()) {
                *slot = Some(d.clone());
            }
        }
        let [gx, gy, _] = self.grid.map(|g| g as u64);
        let pid = [
            (lin % gx) as u32,
            ((lin / gx) % gy) as u32,
            (lin / (gx * gy)) as u32,
        ];
        let mut p = Prog {
            ex: self,
            env,
            pid,
            lin,
            locals: Vec::new(),
            local_of: HashMap::new(),
        };
        let r = p.region(&self.f.body, &self.plan.body);
        if let Err(Stop::Error(e)) = r {
            // Abandoned waits rank below the failure that caused them.
            let abandoned = matches!(*e, InterpError::Aborted { .. });
            if !abandoned {
                self.world.abort();
            }
            let key = lin | if abandoned { 1 << 63 } else { 0 };
            let mut g = self.err.lock().unwrap_or_else(|e| e.into_inner());
            if g.as_ref().is_none_or(|(l, _)| key < *l) {
                *g = Some((key, *e));
            }
            self.best.fetch_min(key, Ordering::Relaxed);
        }
    }
}

/// Multi-index of flat element `i` of a tile of `shape`.
fn unravel(shape: &[u32], mut i: usize) -> Vec<u32> {
    let mut out = vec![0u32; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        let n = (n as usize).max(1);
        out[d] = (i % n) as u32;
        i /= n;
    }
    out
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Source indices of a row-major walk over `shape` with source strides `st`.
fn strided_index(shape: &[usize], st: &[usize]) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let rank = shape.len();
    if rank == 0 {
        return vec![0];
    }
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let (inner, istride) = (shape[rank - 1], st[rank - 1]);
    let mut idx = vec![0usize; rank];
    let mut base = 0usize;
    loop {
        out.extend((0..inner).map(|j| base + j * istride));
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            base += st[d];
            if idx[d] < shape[d] {
                break;
            }
            base -= st[d] * shape[d];
            idx[d] = 0;
        }
    }
}

fn gather_data(d: &Data, idx: &[usize]) -> Data {
    map_data!(d, |v| idx.iter().map(|&i| v[i]).collect())
}

fn usize_shape(t: &Type) -> Vec<usize> {
    t.shape.iter().map(|&d| d as usize).collect()
}

/// True when every mask lane is set (vectorized: no early exit per lane).
fn all_true(m: &[bool]) -> bool {
    m.chunks(64).all(|c| c.iter().fold(true, |a, &b| a & b))
}

/// True when `offs` are consecutive: `offs[i] == offs[0] + i`.
fn contiguous(offs: &[i64]) -> bool {
    let Some(&s) = offs.first() else {
        return false;
    };
    // Non-short-circuiting per chunk so that it vectorizes.
    let mut base = s;
    for c in offs.chunks(64) {
        let mut ok = true;
        for (i, &o) in c.iter().enumerate() {
            ok &= o == base.wrapping_add(i as i64);
        }
        if !ok {
            return false;
        }
        base = base.wrapping_add(64);
    }
    true
}

/// Dispatches on a scalar type, binding the Rust element type to `$T`.
macro_rules! with_type {
    ($st:expr, $T:ident => $body:expr) => {
        match $st {
            ScalarType::I1 => {
                type $T = bool;
                $body
            }
            ScalarType::I8 => {
                type $T = i8;
                $body
            }
            ScalarType::I16 => {
                type $T = i16;
                $body
            }
            ScalarType::I32 => {
                type $T = i32;
                $body
            }
            ScalarType::I64 => {
                type $T = i64;
                $body
            }
            ScalarType::U8 => {
                type $T = u8;
                $body
            }
            ScalarType::U16 => {
                type $T = u16;
                $body
            }
            ScalarType::U32 => {
                type $T = u32;
                $body
            }
            ScalarType::U64 => {
                type $T = u64;
                $body
            }
            ScalarType::F16 => {
                type $T = half::f16;
                $body
            }
            ScalarType::BF16 => {
                type $T = half::bf16;
                $body
            }
            ScalarType::F32 => {
                type $T = f32;
                $body
            }
            ScalarType::F64 => {
                type $T = f64;
                $body
            }
            ScalarType::F8E4M3 => {
                type $T = crate::fp8::F8E4M3;
                $body
            }
            ScalarType::F8E5M2 => {
                type $T = crate::fp8::F8E5M2;
                $body
            }
        }
    };
}

fn const_data(c: ConstValue, st: ScalarType, n: usize) -> Data {
    with_type!(st, T => {
        let x: T = match c {
            ConstValue::Bool(b) => T::from_bool(b),
            ConstValue::Int(i) => T::from_i64(i),
            ConstValue::Float(x) => T::from_f64(x),
        };
        T::wrap(vec![x; n])
    })
}

/// Adds integer offsets to pointer offsets (wrapping); one-element operands are
/// broadcast.
fn add_offsets(offs: &mut Vec<i64>, d: &Data) -> bool {
    macro_rules! go {
        ($v:expr) => {{
            if offs.len() == 1 && $v.len() != 1 {
                let base = offs[0];
                *offs = $v.iter().map(|&x| base.wrapping_add(x as i64)).collect();
                return true;
            }
            if $v.len() == 1 {
                let x = $v[0] as i64;
                for o in offs.iter_mut() {
                    *o = o.wrapping_add(x);
                }
                return true;
            }
            if $v.len() != offs.len() {
                return false;
            }
            for (o, &x) in offs.iter_mut().zip($v.iter()) {
                *o = o.wrapping_add(x as i64);
            }
            true
        }};
    }
    match d {
        Data::I8(v) => go!(v),
        Data::I16(v) => go!(v),
        Data::I32(v) => go!(v),
        Data::I64(v) => go!(v),
        Data::U8(v) => go!(v),
        Data::U16(v) => go!(v),
        Data::U32(v) => go!(v),
        Data::U64(v) => go!(v),
        _ => false,
    }
}

fn select_data(c: &[bool], a: &Data, b: &Data) -> Option<Data> {
    fn sel<T: Copy>(c: &[bool], a: &[T], b: &[T]) -> Vec<T> {
        c.iter()
            .zip(a.iter().zip(b))
            .map(|(&c, (&x, &y))| if c { x } else { y })
            .collect()
    }
    use Data as D;
    Some(match (a, b) {
        (D::I1(x), D::I1(y)) => D::I1(sel(c, x, y)),
        (D::I8(x), D::I8(y)) => D::I8(sel(c, x, y)),
        (D::I16(x), D::I16(y)) => D::I16(sel(c, x, y)),
        (D::I32(x), D::I32(y)) => D::I32(sel(c, x, y)),
        (D::I64(x), D::I64(y)) => D::I64(sel(c, x, y)),
        (D::U8(x), D::U8(y)) => D::U8(sel(c, x, y)),
        (D::U16(x), D::U16(y)) => D::U16(sel(c, x, y)),
        (D::U32(x), D::U32(y)) => D::U32(sel(c, x, y)),
        (D::U64(x), D::U64(y)) => D::U64(sel(c, x, y)),
        (D::F16(x), D::F16(y)) => D::F16(sel(c, x, y)),
        (D::BF16(x), D::BF16(y)) => D::BF16(sel(c, x, y)),
        (D::F32(x), D::F32(y)) => D::F32(sel(c, x, y)),
        (D::F64(x), D::F64(y)) => D::F64(sel(c, x, y)),
        (D::Ptr(p), D::Ptr(q)) => {
            let n = c.len().min(p.offs.len()).min(q.offs.len());
            let slots = match (&p.slots, &q.slots) {
                (Slots::Uniform(s), Slots::Uniform(t)) if s == t => Slots::Uniform(*s),
                _ => Slots::Lanes(
                    (0..n)
                        .map(|i| if c[i] { p.slots.get(i) } else { q.slots.get(i) })
                        .collect(),
                ),
            };
            D::Ptr(PtrTile {
                slots,
                offs: sel(c, &p.offs, &q.offs),
            })
        }
        _ => return None,
    })
}

/// One program instance.
pub(super) struct Prog<'a, 'e> {
    pub(super) ex: &'a Exec<'a>,
    env: &'e mut [Option<Data>],
    pub(super) pid: [u32; 3],
    lin: u64,
    /// This program instance's block-local arrays (`local_alloc`), by slot
    /// `LOCAL_SLOT + index`, and the index of each op's array.
    locals: Vec<(HostBuffer, String)>,
    local_of: HashMap<*const Op, u32>,
}

/// The first buffer slot of block-local memory (below it: the launch's buffers).
const LOCAL_SLOT: u32 = 1 << 31;

impl Prog<'_, '_> {
    pub(super) fn kernel(&self) -> String {
        self.ex.f.name.clone()
    }

    pub(super) fn invalid(&self, op: &Op, message: impl Into<String>) -> Stop {
        InterpError::InvalidIr {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            message: message.into(),
        }
        .into()
    }

    /// A communication engine's failure during `op`.
    pub(super) fn transport(&self, op: &Op, message: String) -> Stop {
        InterpError::Transport {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            program_id: self.pid,
            message,
        }
        .into()
    }

    fn unsupported(&self, op: &Op, message: impl Into<String>) -> Stop {
        InterpError::Unsupported {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            message: message.into(),
        }
        .into()
    }

    fn arith_err(&self, op: &Op, e: ArithErr, shape: &[u32]) -> Stop {
        match e {
            ArithErr::DivZero(i) => InterpError::DivisionByZero {
                kernel: self.kernel(),
                op: op.kind.mnemonic(),
                span: op.span.clone(),
                program_id: self.pid,
                lane: unravel(shape, i),
            }
            .into(),
            ArithErr::Unsupported(m) => self.invalid(op, m),
        }
    }

    /// Fails the program when the launch's watchdog expired (at each loop test).
    fn check_watchdog(&self, op: &Op) -> R<()> {
        match self.ex.watchdog {
            Some((deadline, timeout)) if std::time::Instant::now() >= deadline => {
                Err(InterpError::LaunchTimeout {
                    kernel: self.kernel(),
                    op: op.kind.mnemonic(),
                    span: op.span.clone(),
                    program: self.lin,
                    timeout,
                }
                .into())
            }
            _ => Ok(()),
        }
    }

    fn check_cancel(&self) -> R<()> {
        if self.ex.best.load(Ordering::Relaxed) < self.lin {
            Err(Stop::Cancelled)
        } else {
            Ok(())
        }
    }

    fn ty(&self, op: &Op, v: ValueId) -> R<&Type> {
        match self.ex.f.values.get(v.index()) {
            Some(d) => Ok(&d.ty),
            None => Err(self.invalid(op, format!("unknown value {v}"))),
        }
    }

    pub(super) fn operand_ty(&self, op: &Op, k: usize) -> R<&Type> {
        let v = *op
            .operands
            .get(k)
            .ok_or_else(|| self.invalid(op, format!("missing operand {k}")))?;
        self.ty(op, v)
    }

    fn result_ty(&self, op: &Op) -> R<&Type> {
        let v = *op
            .results
            .first()
            .ok_or_else(|| self.invalid(op, "missing result"))?;
        self.ty(op, v)
    }

    pub(super) fn val(&self, op: &Op, k: usize) -> R<&Data> {
        let v = *op
            .operands
            .get(k)
            .ok_or_else(|| self.invalid(op, format!("missing operand {k}")))?;
        match self.env.get(v.index()) {
            Some(Some(d)) => Ok(d),
            _ => Err(self.invalid(op, format!("{v} is used before it is defined"))),
        }
    }

    /// Operand `k` by value: moved out at its last use, cloned otherwise.
    fn owned(&mut self, op: &Op, take: u64, k: usize) -> R<Data> {
        if k < 64 && take & (1 << k) != 0 {
            let v = op.operands[k];
            if let Some(d) = self.env.get_mut(v.index()).and_then(Option::take) {
                return Ok(d);
            }
        }
        self.val(op, k).cloned()
    }

    fn set(&mut self, op: &Op, i: usize, d: Data) -> R<()> {
        let v = *op
            .results
            .get(i)
            .ok_or_else(|| self.invalid(op, format!("missing result {i}")))?;
        match self.env.get_mut(v.index()) {
            Some(slot) => {
                *slot = Some(d);
                Ok(())
            }
            None => Err(self.invalid(op, format!("unknown value {v}"))),
        }
    }

    fn bind(&mut self, op: &Op, args: &[ValueId], vals: Vec<Data>) -> R<()> {
        if args.len() != vals.len() {
            return Err(self.invalid(
                op,
                format!(
                    "region takes {} argument(s), got {}",
                    args.len(),
                    vals.len()
                ),
            ));
        }
        for (a, d) in args.iter().zip(vals) {
            match self.env.get_mut(a.index()) {
                Some(slot) => *slot = Some(d),
                None => return Err(self.invalid(op, format!("unknown value {a}"))),
            }
        }
        Ok(())
    }

    fn check_len(&self, op: &Op, d: &Data, n: usize) -> R<()> {
        if d.len() != n {
            return Err(self.invalid(
                op,
                format!("tile has {} elements, its type says {n}", d.len()),
            ));
        }
        Ok(())
    }

    fn region(&mut self, r: &Region, p: &PlanRegion) -> R<Term> {
        for (op, pop) in r.ops.iter().zip(&p.ops) {
            if let Some(t) = self.op(op, pop)? {
                return Ok(t);
            }
        }
        Ok(Term::Fall)
    }

    pub(super) fn int_scalar(&self, op: &Op, k: usize) -> R<i128> {
        self.val(op, k)?
            .int_at(0)
            .ok_or_else(|| self.invalid(op, format!("operand {k} must be an integer scalar")))
    }

    fn bool_scalar(&self, op: &Op, k: usize) -> R<bool> {
        match self.val(op, k)? {
            Data::I1(v) if v.len() == 1 => Ok(v[0]),
            _ => Err(self.invalid(op, format!("operand {k} must be an i1 scalar"))),
        }
    }

    fn op(&mut self, op: &Op, pop: &PlanOp) -> R<Option<Term>> {
        let take = pop.take;
        let d = match &op.kind {
            OpKind::ProgramId { axis } | OpKind::NumPrograms { axis } => {
                let a = *axis as usize;
                if a > 2 {
                    return Err(self.invalid(op, format!("grid axis {axis}")));
                }
                let x = if matches!(op.kind, OpKind::ProgramId { .. }) {
                    self.pid[a]
                } else {
                    self.ex.grid[a]
                };
                Data::I32(vec![x as i32])
            }
            OpKind::Const(c) => {
                let t = self.result_ty(op)?;
                let st = t
                    .scalar_type()
                    .ok_or_else(|| self.invalid(op, "pointer constant"))?;
                const_data(*c, st, t.numel())
            }
            OpKind::Arange { start, end } => {
                if end.saturating_sub(*start) > 1 << 24 {
                    return Err(self.invalid(op, "arange too long"));
                }
                Data::I32((*start..*end).map(|x| x as i32).collect())
            }
            OpKind::Splat => {
                let n = self.result_ty(op)?.numel();
                let d = self.val(op, 0)?;
                self.check_len(op, d, 1)?;
                if pop.lazy {
                    // Every use broadcasts one-element operands itself.
                    d.clone()
                } else {
                    map_data!(d, |v| vec![v[0]; n])
                }
            }
            OpKind::Broadcast => {
                let src = usize_shape(self.operand_ty(op, 0)?);
                let dst = usize_shape(self.result_ty(op)?);
                let n_src: usize = src.iter().product();
                let n_dst: usize = dst.iter().product();
                if src.len() != dst.len() {
                    return Err(self.invalid(op, "broadcast changes the rank"));
                }
                if n_src == n_dst {
                    self.owned(op, take, 0)?
                } else {
                    let d = self.val(op, 0)?;
                    self.check_len(op, d, n_src)?;
                    if n_src == 1 {
                        map_data!(d, |v| vec![v[0]; n_dst])
                    } else {
                        let mut st = strides(&src);
                        for (i, s) in st.iter_mut().enumerate() {
                            if src[i] == 1 {
                                *s = 0;
                            }
                        }
                        gather_data(d, &strided_index(&dst, &st))
                    }
                }
            }
            OpKind::ExpandDims { .. } | OpKind::Reshape | OpKind::Hint { .. } => {
                self.owned(op, take, 0)?
            }
            OpKind::Permute { order } => {
                let src = usize_shape(self.operand_ty(op, 0)?);
                if order.len() != src.len() || order.iter().any(|&o| o as usize >= src.len()) {
                    return Err(self.invalid(op, "bad permutation"));
                }
                let st = strides(&src);
                let dst: Vec<usize> = order.iter().map(|&o| src[o as usize]).collect();
                let pst: Vec<usize> = order.iter().map(|&o| st[o as usize]).collect();
                let d = self.val(op, 0)?;
                self.check_len(op, d, src.iter().product())?;
                gather_data(d, &strided_index(&dst, &pst))
            }
            OpKind::Binary(b) => {
                let a = if take & 1 != 0 {
                    Operand::Own(self.owned(op, take, 0)?)
                } else {
                    Operand::Ref(self.val(op, 0)?)
                };
                let r = arith::binary(*b, a, self.val(op, 1)?);
                let shape = &self.result_ty(op)?.shape;
                r.map_err(|e| self.arith_err(op, e, shape))?
            }
            OpKind::Unary(u) => {
                let r = arith::unary(*u, self.val(op, 0)?);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::Fma => {
                let r = arith::fma(self.val(op, 0)?, self.val(op, 1)?, self.val(op, 2)?);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::Cmp(p) => {
                let r = arith::cmp(*p, self.val(op, 0)?, self.val(op, 1)?);
                Data::I1(r.map_err(|e| self.arith_err(op, e, &[]))?)
            }
            OpKind::Select => {
                let Data::I1(c) = self.val(op, 0)? else {
                    return Err(self.invalid(op, "select condition must be i1"));
                };
                select_data(c, self.val(op, 1)?, self.val(op, 2)?)
                    .ok_or_else(|| self.invalid(op, "select operands differ in type"))?
            }
            OpKind::Cast => {
                let to = self
                    .result_ty(op)?
                    .scalar_type()
                    .ok_or_else(|| self.invalid(op, "cast to a pointer"))?;
                let r = arith::cast(self.val(op, 0)?, to);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::LocalAlloc { len } => self.local_alloc(op, *len)?,
            OpKind::Bitcast => {
                let to = self
                    .result_ty(op)?
                    .scalar_type()
                    .ok_or_else(|| self.invalid(op, "bitcast to a pointer"))?;
                let r = arith::bitcast(self.val(op, 0)?, to);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::AddPtr => {
                let Data::Ptr(mut p) = self.owned(op, take, 0)? else {
                    return Err(self.invalid(op, "addptr needs pointers"));
                };
                let n = self.val(op, 1)?.len();
                if p.offs.len() == 1 && n != 1 {
                    // A one-element (lazily splatted) pointer: broadcast it.
                    if let Slots::Lanes(l) = &mut p.slots {
                        *l = vec![l[0]; n];
                    }
                }
                if !add_offsets(&mut p.offs, self.val(op, 1)?) {
                    return Err(
                        self.invalid(op, "addptr offsets must be integers of the same shape")
                    );
                }
                Data::Ptr(p)
            }
            OpKind::Load {
                has_mask,
                has_other,
            } => self.load(op, *has_mask, *has_other)?,
            OpKind::Store { has_mask } => {
                self.store(op, *has_mask)?;
                return Ok(None);
            }
            OpKind::DescLoad { rank, .. } => self.desc_load(op, *rank)?,
            OpKind::DescStore { rank } => {
                self.desc_store(op, *rank)?;
                return Ok(None);
            }
            OpKind::AtomicRmw { .. } | OpKind::AtomicCas { .. } => self.atomic(op)?,
            OpKind::Dot => {
                let (ta, tb) = (self.operand_ty(op, 0)?, self.operand_ty(op, 1)?);
                if ta.rank() != 2 || tb.rank() != 2 {
                    return Err(self.invalid(op, "dot needs 2-D tiles"));
                }
                let dims = (
                    ta.shape[0] as usize,
                    ta.shape[1] as usize,
                    tb.shape[1] as usize,
                );
                let acc = self.owned(op, take, 2)?;
                let r = arith::dot(self.val(op, 0)?, self.val(op, 1)?, acc, dims);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::Reduce { axis, op: rop } | OpKind::Scan { axis, op: rop, .. } => {
                let shape = usize_shape(self.operand_ty(op, 0)?);
                let a = *axis as usize;
                if a >= shape.len() {
                    return Err(self.invalid(op, format!("axis {axis} out of range")));
                }
                let dims = (
                    shape[..a].iter().product(),
                    shape[a],
                    shape[a + 1..].iter().product(),
                );
                let scan = match op.kind {
                    OpKind::Scan { reverse, .. } => Some(reverse),
                    _ => None,
                };
                let r = arith::reduce_or_scan(*rop, self.val(op, 0)?, dims, scan);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::For => {
                self.for_op(op, pop)?;
                return Ok(None);
            }
            OpKind::If => {
                let c = self.bool_scalar(op, 0)?;
                let i = if c { 0 } else { 1 };
                let (Some(r), Some(p)) = (op.regions.get(i), pop.regions.get(i)) else {
                    return Err(self.invalid(op, "if needs two regions"));
                };
                let vals = match self.region(r, p)? {
                    Term::Yield(v) => v,
                    Term::Fall => Vec::new(),
                    Term::Cond(..) => return Err(self.invalid(op, "`condition` in an if")),
                };
                if vals.len() != op.results.len() {
                    return Err(self.invalid(op, "if region yields the wrong number of values"));
                }
                for (i, d) in vals.into_iter().enumerate() {
                    self.set(op, i, d)?;
                }
                return Ok(None);
            }
            OpKind::While => {
                self.while_op(op, pop)?;
                return Ok(None);
            }
            OpKind::Yield => {
                let vals = (0..op.operands.len())
                    .map(|k| self.owned(op, take, k))
                    .collect::<R<Vec<_>>>()?;
                return Ok(Some(Term::Yield(vals)));
            }
            OpKind::Condition => {
                let c = self.bool_scalar(op, 0)?;
                let vals = (1..op.operands.len())
                    .map(|k| self.owned(op, take, k))
                    .collect::<R<Vec<_>>>()?;
                return Ok(Some(Term::Cond(c, vals)));
            }
            OpKind::Barrier => return Ok(None),
            OpKind::Print { .. } | OpKind::Assert { .. } => {
                return Err(self.invalid(
                    op,
                    "`print`/`assert` must be lowered first (tessera_ir::debug::lower_debug_ops)",
                ));
            }
            OpKind::Rank
            | OpKind::WorldSize
            | OpKind::RemotePtr
            | OpKind::Signal { .. }
            | OpKind::WaitUntil { .. }
            | OpKind::Fence { .. }
            | OpKind::BarrierAll => match self.comm_op(op)? {
                Some(d) => d,
                None => return Ok(None),
            },
        };
        self.set(op, 0, d)?;
        Ok(None)
    }

    fn for_op(&mut self, op: &Op, pop: &PlanOp) -> R<()> {
        if op.operands.len() < 3 {
            return Err(self.invalid(op, "for needs lb, ub, step"));
        }
        let ity = self
            .operand_ty(op, 0)?
            .scalar_type()
            .filter(|t| t.is_int())
            .ok_or_else(|| self.invalid(op, "for bounds must be integers"))?;
        let (lb, ub, step) = (
            self.int_scalar(op, 0)?,
            self.int_scalar(op, 1)?,
            self.int_scalar(op, 2)?,
        );
        if step <= 0 {
            return Err(self.unsupported(op, format!("for step must be positive, got {step}")));
        }
        let mut iters = (3..op.operands.len())
            .map(|k| self.owned(op, pop.take, k))
            .collect::<R<Vec<_>>>()?;
        let (Some(body), Some(pbody)) = (op.regions.first(), pop.regions.first()) else {
            return Err(self.invalid(op, "for needs a body"));
        };
        let Some((&iv_arg, iter_args)) = body.args.split_first() else {
            return Err(self.invalid(op, "for body needs an induction variable"));
        };
        let mut iv = lb;
        while iv < ub {
            self.check_cancel()?;
            self.check_watchdog(op)?;
            let ivd = Data::int_scalar(ity, iv).ok_or_else(|| self.invalid(op, "bad iv"))?;
            self.bind(op, &[iv_arg], vec![ivd])?;
            self.bind(op, iter_args, iters)?;
            iters = match self.region(body, pbody)? {
                Term::Yield(v) => v,
                Term::Fall if iter_args.is_empty() => Vec::new(),
                _ => return Err(self.invalid(op, "for body must end in yield")),
            };
            iv += step;
        }
        if iters.len() != op.results.len() {
            return Err(self.invalid(op, "for yields the wrong number of values"));
        }
        for (i, d) in iters.into_iter().enumerate() {
            self.set(op, i, d)?;
        }
        Ok(())
    }

    fn while_op(&mut self, op: &Op, pop: &PlanOp) -> R<()> {
        let mut carried = (0..op.operands.len())
            .map(|k| self.owned(op, pop.take, k))
            .collect::<R<Vec<_>>>()?;
        let (Some(before), Some(after), Some(pb), Some(pa)) = (
            op.regions.first(),
            op.regions.get(1),
            pop.regions.first(),
            pop.regions.get(1),
        ) else {
            return Err(self.invalid(op, "while needs two regions"));
        };
        loop {
            self.check_cancel()?;
            self.check_watchdog(op)?;
            self.bind(op, &before.args, carried)?;
            let (c, fwd) = match self.region(before, pb)? {
                Term::Cond(c, v) => (c, v),
                _ => return Err(self.invalid(op, "while before-region must end in condition")),
            };
            if !c {
                if fwd.len() != op.results.len() {
                    return Err(self.invalid(op, "while forwards the wrong number of values"));
                }
                for (i, d) in fwd.into_iter().enumerate() {
                    self.set(op, i, d)?;
                }
                return Ok(());
            }
            self.bind(op, &after.args, fwd)?;
            carried = match self.region(after, pa)? {
                Term::Yield(v) => v,
                Term::Fall if before.args.is_empty() => Vec::new(),
                _ => return Err(self.invalid(op, "while after-region must end in yield")),
            };
        }
    }

    // ----- memory -----

    fn pointee(&self, op: &Op) -> R<(ScalarType, Vec<u32>)> {
        let t = self.operand_ty(op, 0)?;
        match t.elem {
            Elem::Ptr { pointee, .. } => Ok((pointee, t.shape.clone())),
            Elem::Scalar(_) => Err(self.invalid(op, "memory op needs pointers")),
        }
    }

    pub(super) fn ptrs<'s>(&'s self, op: &Op, k: usize) -> R<&'s PtrTile> {
        match self.val(op, k)? {
            Data::Ptr(p) => Ok(p),
            _ => Err(self.invalid(op, "memory op needs pointers")),
        }
    }

    fn mask<'s>(&'s self, op: &Op, k: Option<usize>, n: usize) -> R<Option<&'s [bool]>> {
        let Some(k) = k else { return Ok(None) };
        match self.val(op, k)? {
            Data::I1(m) if m.len() == n => Ok(Some(m)),
            _ => Err(self.invalid(op, "mask must be an i1 tile of the pointers' shape")),
        }
    }

    fn typed<'s, T: Elt>(&'s self, op: &Op, k: usize, n: usize) -> R<&'s [T]> {
        match T::view(self.val(op, k)?) {
            Some(v) if v.len() == n => Ok(v),
            _ => Err(self.invalid(op, format!("operand {k} must be a {} tile", T::TY))),
        }
    }

    /// The buffer of `slot`, checked to hold `T`.
    fn buffer<T: Element>(&self, op: &Op, slot: u32, lane: usize, shape: &[u32]) -> R<&HostBuffer> {
        match self.slot_buffer(slot) {
            Some(b) if b.elem() == T::TY => Ok(b),
            Some(b) => Err(self.bad_ptr(
                op,
                lane,
                shape,
                format!(
                    "a pointer to {} points into a buffer of {}",
                    T::TY,
                    b.elem()
                ),
            )),
            None => Err(self.bad_ptr(
                op,
                lane,
                shape,
                "the pointer does not point into a buffer".into(),
            )),
        }
    }

    /// The buffer of a slot: a launch buffer or one of this program's local arrays.
    fn slot_buffer(&self, slot: u32) -> Option<&HostBuffer> {
        match slot.checked_sub(LOCAL_SLOT) {
            Some(i) => self.locals.get(i as usize).map(|(b, _)| b),
            None => self.ex.bufs.get(slot as usize).copied().flatten(),
        }
    }

    /// `local_alloc len`: this op's array of this program instance (made on its first
    /// run), every byte set to 0xFF at each run (NaN for floats, -1 for integers: the
    /// contents of GPU shared memory are undefined at the allocation, so a kernel that
    /// reads before writing reads poison).
    fn local_alloc(&mut self, op: &Op, len: u32) -> R<Data> {
        let Elem::Ptr { pointee, .. } = self.result_ty(op)?.elem else {
            return Err(self.invalid(op, "local_alloc must give a pointer"));
        };
        let i = match self.local_of.get(&(op as *const Op)) {
            Some(&i) => i,
            None => {
                let b = HostBuffer::new(pointee, len as usize);
                let name = format!("block-local memory ({}:{})", op.span.line, op.span.col);
                self.locals.push((b, name));
                let i = self.locals.len() as u32 - 1;
                self.local_of.insert(op as *const Op, i);
                i
            }
        };
        let b = &self.locals[i as usize].0;
        b.write_bytes(0, &vec![0xFF; b.size_bytes()])
            .map_err(|e| self.invalid(op, e.to_string()))?;
        Ok(Data::Ptr(PtrTile {
            slots: Slots::Uniform(LOCAL_SLOT + i),
            offs: vec![0],
        }))
    }

    pub(super) fn bad_ptr(&self, op: &Op, lane: usize, shape: &[u32], message: String) -> Stop {
        InterpError::InvalidPointer {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            program_id: self.pid,
            lane: unravel(shape, lane),
            message,
        }
        .into()
    }

    /// The name of a buffer slot: its parameter, or a rank's copy of it.
    pub(super) fn slot_name(&self, slot: u32) -> String {
        if let Some(i) = slot.checked_sub(LOCAL_SLOT) {
            return self
                .locals
                .get(i as usize)
                .map_or_else(|| format!("#{slot}"), |(_, n)| n.clone());
        }
        self.ex
            .slot_names
            .get(slot as usize)
            .map_or_else(|| format!("#{slot}"), Clone::clone)
    }

    fn oob(&self, op: &Op, lane: usize, shape: &[u32], slot: u32, index: i64, len: usize) -> Stop {
        let buffer = self.slot_name(slot);
        InterpError::OutOfBounds {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            program_id: self.pid,
            index,
            lane: unravel(shape, lane),
            buffer,
            len,
        }
        .into()
    }

    /// The buffer and in-bounds element index of lane `i`, or the sanitizer's error.
    #[inline]
    pub(super) fn locate<T: Element>(
        &self,
        op: &Op,
        p: &PtrTile,
        i: usize,
        shape: &[u32],
    ) -> R<(&HostBuffer, usize)> {
        let slot = p.slots.get(i);
        let b = self.buffer::<T>(op, slot, i, shape)?;
        let off = p.offs[i];
        if off < 0 || off as u64 >= b.len() as u64 {
            return Err(self.oob(op, i, shape, slot, off, b.len()));
        }
        Ok((b, off as usize))
    }

    /// For a uniform, contiguous pointer tile whose active lanes (all, without a mask)
    /// lie inside its buffer: the buffer, the lanes `lo..hi` from the first active
    /// lane to the last, and the element index of lane `lo`. `None` for a tile with
    /// no active lane, or one that must go lane by lane (which also reports an
    /// out-of-bounds lane). The range is what a transfer to another rank moves in
    /// one piece: the ragged last tile of a buffer included, whose masked-off lanes
    /// lie past its end.
    fn dense_range<T: Element>(
        &self,
        p: &PtrTile,
        mask: Option<&[bool]>,
    ) -> Option<(&HostBuffer, usize, usize, usize)> {
        let Slots::Uniform(s) = p.slots else {
            return None;
        };
        let b = self.slot_buffer(s)?;
        if b.elem() != T::TY || !contiguous(&p.offs) {
            return None;
        }
        let n = p.offs.len();
        let (lo, hi) = match mask {
            Some(m) => (
                m.iter().position(|&x| x)?,
                n - m.iter().rev().position(|&x| x)?,
            ),
            None => (0, n),
        };
        let start = p.offs[0] as i128 + lo as i128;
        let end = p.offs[0] as i128 + hi as i128;
        (start >= 0 && end <= b.len() as i128).then_some((b, lo, hi, start as usize))
    }

    fn load(&mut self, op: &Op, has_mask: bool, has_other: bool) -> R<Data> {
        let (pointee, shape) = self.pointee(op)?;
        with_type!(pointee, T => Ok(T::wrap(self.load_t::<T>(op, has_mask, has_other, &shape)?)))
    }

    fn load_t<T: Elt>(&self, op: &Op, has_mask: bool, has_other: bool, shape: &[u32]) -> R<Vec<T>> {
        let p = self.ptrs(op, 0)?;
        let n = p.offs.len();
        let mask = self.mask(op, has_mask.then_some(1), n)?;
        let other = if has_other {
            Some(self.typed::<T>(op, 2, n)?)
        } else {
            None
        };
        self.load_from(op, p, mask, other, shape)
    }

    /// Reads `p` where `mask` holds (all lanes without one), `other` (or zero)
    /// elsewhere.
    fn load_from<T: Elt>(
        &self,
        op: &Op,
        p: &PtrTile,
        mask: Option<&[bool]>,
        other: Option<&[T]>,
        shape: &[u32],
    ) -> R<Vec<T>> {
        let n = p.offs.len();
        let fill = |i: usize| other.map_or_else(T::default, |o| o[i]);
        if let Some((b, lo, hi, start)) = self.dense_range::<T>(p, mask) {
            // Masked-off lanes between the first and the last active one are read
            // (they are in bounds) but their values discarded.
            let got = b
                .load_range::<T>(start, hi - lo)
                .map_err(|e| self.transport(op, e))?;
            let mut v: Vec<T> = (0..lo).map(fill).collect();
            v.extend(got);
            v.extend((hi..n).map(fill));
            if let Some(m) = mask.filter(|m| !all_true(m)) {
                for (i, (x, &m)) in v.iter_mut().zip(m).enumerate() {
                    if !m {
                        *x = fill(i);
                    }
                }
            }
            return Ok(v);
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if mask.is_some_and(|m| !m[i]) {
                out.push(fill(i));
                continue;
            }
            let (b, idx) = self.locate::<T>(op, p, i, shape)?;
            // `idx < b.len()` was checked by `locate`.
            out.push(b.load::<T>(idx).map_err(|e| self.transport(op, e))?);
        }
        Ok(out)
    }

    fn store(&mut self, op: &Op, has_mask: bool) -> R<()> {
        let (pointee, shape) = self.pointee(op)?;
        with_type!(pointee, T => self.store_t::<T>(op, has_mask, &shape))
    }

    fn store_t<T: Elt>(&self, op: &Op, has_mask: bool, shape: &[u32]) -> R<()> {
        let p = self.ptrs(op, 0)?;
        let n = p.offs.len();
        let vals = self.typed::<T>(op, 1, n)?;
        let mask = self.mask(op, has_mask.then_some(2), n)?;
        self.store_to(op, p, vals, mask, shape)
    }

    /// Writes `vals` through `p` where `mask` holds (all lanes without one).
    fn store_to<T: Elt>(
        &self,
        op: &Op,
        p: &PtrTile,
        vals: &[T],
        mask: Option<&[bool]>,
        shape: &[u32],
    ) -> R<()> {
        if let Some((b, lo, hi, start)) = self.dense_range::<T>(p, mask) {
            let mask = mask.map(|m| &m[lo..hi]).filter(|m| !all_true(m));
            return b
                .store_range(start, &vals[lo..hi], mask)
                .map_err(|e| self.transport(op, e));
        }
        for (i, &v) in vals.iter().enumerate() {
            if mask.is_some_and(|m| !m[i]) {
                continue;
            }
            let (b, idx) = self.locate::<T>(op, p, i, shape)?;
            // `idx < b.len()` was checked by `locate`.
            b.store(idx, v).map_err(|e| self.transport(op, e))?;
        }
        Ok(())
    }

    /// The element pointers of a `desc_load`/`desc_store` block (row-major) and which
    /// of them lie inside the tensor; with a false predicate, none does.
    fn desc_block(&self, op: &Op, rank: u8, block: &[u32]) -> R<(PtrTile, Vec<bool>)> {
        let d = DescOperands::new(rank).map_err(|e| self.invalid(op, e))?;
        let base = self.ptrs(op, DescOperands::BASE)?;
        if base.offs.len() != 1 {
            return Err(self.invalid(op, "a tensor descriptor's base is a scalar pointer"));
        }
        let dim = |k: usize| self.int_scalar(op, k);
        let shape = (0..d.rank)
            .map(|i| dim(d.shape(i)))
            .collect::<R<Vec<_>>>()?;
        let coord = (0..d.rank)
            .map(|i| dim(d.coord(i)))
            .collect::<R<Vec<_>>>()?;
        // The innermost stride is 1.
        let stride = (0..d.rank)
            .map(|i| {
                if i + 1 < d.rank {
                    dim(d.stride(i))
                } else {
                    Ok(1)
                }
            })
            .collect::<R<Vec<_>>>()?;
        let live = match op.kind {
            OpKind::DescLoad { has_pred: true, .. } => self.bool_scalar(op, d.extra())?,
            _ => true,
        };
        let n: usize = block.iter().map(|&b| b as usize).product();
        let mut offs = Vec::with_capacity(n);
        let mut inside = Vec::with_capacity(n);
        let mut idx = vec![0u32; d.rank];
        for _ in 0..n {
            let mut off = base.offs[0] as i128;
            let mut ok = live;
            for (((&c, &i), &n), &s) in coord.iter().zip(&idx).zip(&shape).zip(&stride) {
                let x = c + i as i128;
                ok &= 0 <= x && x < n;
                off += x * s;
            }
            inside.push(ok);
            offs.push(if ok { off as i64 } else { 0 });
            for i in (0..d.rank).rev() {
                idx[i] += 1;
                if idx[i] < block[i] {
                    break;
                }
                idx[i] = 0;
            }
        }
        let slots = Slots::Uniform(base.slots.get(0));
        Ok((PtrTile { slots, offs }, inside))
    }

    fn desc_load(&self, op: &Op, rank: u8) -> R<Data> {
        let t = self.result_ty(op)?;
        let (Some(elem), block) = (t.scalar_type(), t.shape.clone()) else {
            return Err(self.invalid(op, "desc_load yields a tile"));
        };
        let (p, inside) = self.desc_block(op, rank, &block)?;
        with_type!(elem, T => Ok(T::wrap(self.load_from::<T>(op, &p, Some(&inside), None, &block)?)))
    }

    fn desc_store(&self, op: &Op, rank: u8) -> R<()> {
        let d = DescOperands::new(rank).map_err(|e| self.invalid(op, e))?;
        let t = self.operand_ty(op, d.extra())?.clone();
        let Some(elem) = t.scalar_type() else {
            return Err(self.invalid(op, "desc_store stores a tile"));
        };
        let (p, inside) = self.desc_block(op, rank, &t.shape)?;
        let n = inside.len();
        with_type!(elem, T => {
            let vals = self.typed::<T>(op, d.extra(), n)?;
            self.store_to::<T>(op, &p, vals, Some(&inside), &t.shape)
        })
    }

    fn atomic(&mut self, op: &Op) -> R<Data> {
        let (pointee, shape) = self.pointee(op)?;
        with_type!(pointee, T => Ok(T::wrap(self.atomic_t::<T>(op, &shape)?)))
    }

    fn atomic_t<T: Elt>(&self, op: &Op, shape: &[u32]) -> R<Vec<T>> {
        let p = self.ptrs(op, 0)?;
        let n = p.offs.len();
        let (order, mask_k) = match op.kind {
            OpKind::AtomicRmw {
                order, has_mask, ..
            } => (order, has_mask.then_some(2)),
            OpKind::AtomicCas {
                order, has_mask, ..
            } => (order, has_mask.then_some(3)),
            _ => return Err(self.invalid(op, "not an atomic")),
        };
        let ord = std_order(order);
        let mask = self.mask(op, mask_k, n)?;
        let v1 = self.typed::<T>(op, 1, n)?;
        let v2 = match op.kind {
            OpKind::AtomicCas { .. } => Some(self.typed::<T>(op, 2, n)?),
            _ => None,
        };
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if mask.is_some_and(|m| !m[i]) {
                out.push(T::default());
                continue;
            }
            let (b, idx) = self.locate::<T>(op, p, i, shape)?;
            // `idx < b.len()` was checked by `locate`.
            let old = match (&op.kind, v2) {
                (OpKind::AtomicRmw { op: aop, .. }, _) => b.rmw(idx, *aop, v1[i], ord),
                (_, Some(des)) => b.cas(idx, v1[i], des[i], ord),
                _ => Ok(None),
            }
            .map_err(|e| self.transport(op, e))?;
            match old {
                Some(o) => out.push(o),
                None => {
                    return Err(self.unsupported(
                        op,
                        format!("this atomic operation is not supported on {}", T::TY),
                    ));
                }
            }
        }
        Ok(out)
    }
}

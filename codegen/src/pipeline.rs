//! Software pipelining of `dot` operand loads: `num_stages` tiles in flight.
//!
//! In a `for` loop, a `load` whose value feeds only `dot` operands, and whose
//! pointers, mask and `other` are cheap pure functions of the induction variable and
//! of values defined before the loop, is issued `num_stages - 1` iterations ahead:
//!
//! ```text
//! for k in lb..ub step s { a = load(p(k), m(k)); acc = dot(a, ..., acc) }
//! ```
//!
//! becomes (for `num_stages = 2`)
//!
//! ```text
//! a0 = load(p(lb), m(lb) & lb < ub)
//! for k in lb..ub step s, carrying a = a0 {
//!     a' = load(p(k + s), m(k + s) & k + s < ub)   // in flight during the dot
//!     acc = dot(a, ..., acc)
//!     yield a'
//! }
//! ```
//!
//! With more stages the loop carries `num_stages - 1` tiles and shifts them down each
//! iteration. Loads past the end of the loop are masked off entirely, so they touch no
//! memory. A loop that waits, synchronizes or fences (`wait_until`, `barrier`,
//! `fence`, atomics) is left as it is: a load issued early would move above the op
//! that makes its data visible. The loaded tile waits in registers until its iteration, where `dot` stages
//! it through shared memory as before: register prefetch, the scheme Triton uses on
//! AMD GPUs (each iteration's global loads overlap the previous tile's matrix work).
//! The pass runs on a copy of the IR just before lowering, for GPU targets; the
//! interpreter keeps the plain loop, and the emulator runs the pipelined one, so the
//! cross-backend suite checks the transformation.

use std::collections::{HashMap, HashSet};

use tessera_ir::ir::{BinaryOp, CmpPred, ConstValue, Function, Op, OpKind, Region};
use tessera_ir::{Elem, ScalarType, Type, ValueId};

/// The most ops of one load's address computation the pass copies.
const MAX_SLICE: usize = 64;

/// `f` with the operand loads of the `dot`s `keep` accepts issued `num_stages - 1`
/// iterations ahead in their loops (see the module docs); `f` itself when
/// `num_stages < 2` or nothing applies.
pub fn pipeline_loads(
    f: &Function,
    num_stages: u32,
    keep: &dyn Fn(&Function, &Op) -> bool,
) -> Function {
    let mut f = f.clone();
    if num_stages < 2 {
        return f;
    }
    let mut body = std::mem::take(&mut f.body);
    let changed = rewrite_region(&mut f, &mut body, num_stages - 1, keep);
    f.body = body;
    if changed {
        tessera_ir::passes::dce(&mut f);
    }
    f
}

type Keep<'a> = &'a dyn Fn(&Function, &Op) -> bool;

/// Whether `r` (or a region in it) holds an op after which loads may see data they
/// would not see before it: `wait_until`, a barrier, a fence, an atomic.
fn orders_memory(r: &Region) -> bool {
    r.ops.iter().any(|o| {
        matches!(
            o.kind,
            OpKind::WaitUntil { .. }
                | OpKind::Barrier
                | OpKind::BarrierAll
                | OpKind::Fence { .. }
                | OpKind::AtomicRmw { .. }
                | OpKind::AtomicCas { .. }
        ) || o.regions.iter().any(orders_memory)
    })
}

fn rewrite_region(f: &mut Function, r: &mut Region, ahead: u32, keep: Keep<'_>) -> bool {
    let mut changed = false;
    let mut i = 0;
    while i < r.ops.len() {
        for sub in &mut r.ops[i].regions {
            changed |= rewrite_region(f, sub, ahead, keep);
        }
        if r.ops[i].kind == OpKind::For
            && let Some(prologue) = pipeline_for(f, &mut r.ops[i], ahead, keep)
        {
            let n = prologue.len();
            r.ops.splice(i..i, prologue);
            i += n;
            changed = true;
        }
        i += 1;
    }
    changed
}

/// Whether every use of `v` in `r` (and nested regions) is operand A or B of a `dot`
/// that `keep` accepts.
fn only_dot_uses(f: &Function, r: &Region, v: ValueId, keep: Keep<'_>) -> bool {
    let mut ok = true;
    let mut any = false;
    visit(r, &mut |op: &Op| {
        for (i, &o) in op.operands.iter().enumerate() {
            if o == v {
                any = true;
                ok &= op.kind == OpKind::Dot && i < 2 && keep(f, op);
            }
        }
    });
    any && ok
}

fn visit(r: &Region, f: &mut impl FnMut(&Op)) {
    for op in &r.ops {
        f(op);
        for sub in &op.regions {
            visit(sub, f);
        }
    }
}

/// Ops the pass copies into an address computation: pure, cheap, no memory.
fn copyable(k: &OpKind) -> bool {
    matches!(
        k,
        OpKind::Const(_)
            | OpKind::Arange { .. }
            | OpKind::Splat
            | OpKind::Broadcast
            | OpKind::ExpandDims { .. }
            | OpKind::Reshape
            | OpKind::Permute { .. }
            | OpKind::Hint { .. }
            | OpKind::Binary(_)
            | OpKind::Cmp(_)
            | OpKind::Select
            | OpKind::Cast
            | OpKind::Bitcast
            | OpKind::AddPtr
            | OpKind::ProgramId { .. }
            | OpKind::NumPrograms { .. }
    )
}

/// The body ops (indices, in order) the operands of body op `at` depend on, if they
/// are all [`copyable`] and reach only the induction variable and values defined
/// outside the loop.
fn slice(body: &Region, at: usize) -> Option<Vec<usize>> {
    let def: HashMap<ValueId, usize> = body.ops[..at]
        .iter()
        .enumerate()
        .flat_map(|(i, op)| op.results.iter().map(move |&v| (v, i)))
        .collect();
    let carried: HashSet<ValueId> = body.args.iter().skip(1).copied().collect();
    let mut need = HashSet::new();
    let mut stack: Vec<ValueId> = body.ops[at].operands.clone();
    while let Some(v) = stack.pop() {
        if carried.contains(&v) {
            return None;
        }
        let Some(&i) = def.get(&v) else {
            continue; // the induction variable, or defined before the loop
        };
        if !need.insert(i) {
            continue;
        }
        let op = &body.ops[i];
        if !copyable(&op.kind) || !op.regions.is_empty() || need.len() > MAX_SLICE {
            return None;
        }
        stack.extend(op.operands.iter().copied());
    }
    let mut out: Vec<usize> = need.into_iter().collect();
    out.sort_unstable();
    Some(out)
}

/// Emits ops into `out`, creating their results in `f`.
struct Emitter<'a> {
    f: &'a mut Function,
    out: Vec<Op>,
    span: tessera_ir::Span,
}

impl Emitter<'_> {
    fn op(&mut self, kind: OpKind, operands: Vec<ValueId>, ty: Type) -> ValueId {
        let v = self.f.new_value(ty);
        self.out.push(Op {
            kind,
            operands,
            results: vec![v],
            regions: Vec::new(),
            span: self.span.clone(),
        });
        v
    }

    /// `base + n * step` (scalars of type `ty`).
    fn offset_iv(&mut self, base: ValueId, step: ValueId, n: u32, ty: &Type) -> ValueId {
        if n == 0 {
            return base;
        }
        let c = self.op(OpKind::Const(ConstValue::Int(n as i64)), vec![], ty.clone());
        let m = self.op(OpKind::Binary(BinaryOp::Mul), vec![step, c], ty.clone());
        self.op(OpKind::Binary(BinaryOp::Add), vec![base, m], ty.clone())
    }

    /// A copy of the load `body.ops[at]` (with its address computation `sl`) for
    /// induction variable `iv`, masked off entirely when `iv >= ub`; returns the
    /// loaded value.
    fn load_at(
        &mut self,
        body: &Region,
        sl: &[usize],
        at: usize,
        iv: ValueId,
        ub: ValueId,
    ) -> ValueId {
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        map.insert(body.args[0], iv);
        let get = |map: &HashMap<ValueId, ValueId>, v: ValueId| *map.get(&v).unwrap_or(&v);
        for &i in sl {
            let op = &body.ops[i];
            let operands = op.operands.iter().map(|&o| get(&map, o)).collect();
            let results: Vec<ValueId> = op
                .results
                .iter()
                .map(|&r| {
                    let t = self.f.ty(r).clone();
                    let n = self.f.new_value(t);
                    map.insert(r, n);
                    n
                })
                .collect();
            self.out.push(Op {
                kind: op.kind.clone(),
                operands,
                results,
                regions: Vec::new(),
                span: op.span.clone(),
            });
        }
        let load = &body.ops[at];
        let ty = self.f.ty(load.results[0]).clone();
        let in_range = self.op(
            OpKind::Cmp(CmpPred::Lt),
            vec![iv, ub],
            Type::scalar(ScalarType::I1),
        );
        let (has_mask, has_other) = match load.kind {
            OpKind::Load {
                has_mask,
                has_other,
            } => (has_mask, has_other),
            OpKind::DescLoad { rank, has_pred } => {
                // Past the end: the predicate is false and nothing is accessed.
                let mut operands: Vec<ValueId> =
                    load.operands.iter().map(|&o| get(&map, o)).collect();
                let pred = if has_pred {
                    let p = operands.pop().expect("a predicate");
                    self.op(
                        OpKind::Binary(BinaryOp::And),
                        vec![p, in_range],
                        Type::scalar(ScalarType::I1),
                    )
                } else {
                    in_range
                };
                operands.push(pred);
                return self.op(
                    OpKind::DescLoad {
                        rank,
                        has_pred: true,
                    },
                    operands,
                    ty,
                );
            }
            _ => unreachable!("a load"),
        };
        let mask_ty = Type {
            elem: Elem::Scalar(ScalarType::I1),
            ..ty.clone()
        };
        let live = self.op(OpKind::Splat, vec![in_range], mask_ty.clone());
        let ptrs = get(&map, load.operands[0]);
        let mask = if has_mask {
            let m = get(&map, load.operands[1]);
            self.op(OpKind::Binary(BinaryOp::And), vec![m, live], mask_ty)
        } else {
            live
        };
        let mut operands = vec![ptrs, mask];
        if has_other {
            operands.push(get(&map, load.operands[2]));
        }
        self.op(
            OpKind::Load {
                has_mask: true,
                has_other,
            },
            operands,
            ty,
        )
    }
}

/// Pipelines the loads of `for_op` (see the module docs); returns the prologue to
/// insert before it, or `None` (and leaves it alone) when no load qualifies.
fn pipeline_for(f: &mut Function, for_op: &mut Op, ahead: u32, keep: Keep<'_>) -> Option<Vec<Op>> {
    let body = for_op.regions.first()?;
    if body.ops.last().is_none_or(|y| y.kind != OpKind::Yield) || body.args.is_empty() {
        return None; // not a verified loop body: leave it alone
    }
    if orders_memory(body) {
        // A load issued iterations ahead would move above the wait (or barrier,
        // fence, atomic) that makes its data visible: a sequence-parallel attention
        // waits for each peer's block of keys right before loading it.
        return None;
    }
    let cands: Vec<(usize, Vec<usize>)> = body
        .ops
        .iter()
        .enumerate()
        .filter(|(_, op)| matches!(op.kind, OpKind::Load { .. } | OpKind::DescLoad { .. }))
        .filter(|(_, op)| only_dot_uses(f, body, op.results[0], keep))
        .filter_map(|(i, _)| slice(body, i).map(|s| (i, s)))
        .collect();
    if cands.is_empty() {
        return None;
    }
    let (lb, ub, step) = (for_op.operands[0], for_op.operands[1], for_op.operands[2]);
    let iv_ty = f.ty(lb).clone();
    let body = for_op.regions[0].clone();
    let span = for_op.span.clone();
    // Prologue: iterations 0 .. ahead of every candidate.
    let mut pro = Emitter {
        f,
        out: Vec::new(),
        span: span.clone(),
    };
    let mut inits: Vec<Vec<ValueId>> = Vec::new();
    for (at, sl) in &cands {
        let mut tiles = Vec::new();
        for s in 0..ahead {
            let iv = pro.offset_iv(lb, step, s, &iv_ty);
            tiles.push(pro.load_at(&body, sl, *at, iv, ub));
        }
        inits.push(tiles);
    }
    let prologue = pro.out;
    // In the body: the tile `ahead` iterations on, issued first.
    let mut inb = Emitter {
        f,
        out: Vec::new(),
        span,
    };
    let iv_ahead = inb.offset_iv(body.args[0], step, ahead, &iv_ty);
    let mut next = Vec::new();
    for (at, sl) in &cands {
        next.push(inb.load_at(&body, sl, *at, iv_ahead, ub));
    }
    let prefetch = inb.out;
    // New carried values: per candidate, the tiles of iterations i .. i + ahead - 1.
    let mut new_args: Vec<Vec<ValueId>> = Vec::new();
    let mut new_results = Vec::new();
    for (at, _) in &cands {
        let ty = f.ty(body.ops[*at].results[0]).clone();
        new_args.push((0..ahead).map(|_| f.new_value(ty.clone())).collect());
        new_results.extend((0..ahead).map(|_| f.new_value(ty.clone())));
    }
    let body = &mut for_op.regions[0];
    // Uses of each load become its first carried tile; the load itself goes (DCE
    // removes its address computation when nothing else uses it).
    let mut subst = HashMap::new();
    for ((at, _), args) in cands.iter().zip(&new_args) {
        subst.insert(body.ops[*at].results[0], args[0]);
    }
    let drop: HashSet<usize> = cands.iter().map(|(at, _)| *at).collect();
    let mut ops: Vec<Op> = prefetch;
    for (i, op) in std::mem::take(&mut body.ops).into_iter().enumerate() {
        if !drop.contains(&i) {
            ops.push(op);
        }
    }
    for op in &mut ops {
        substitute(op, &subst);
    }
    // The yield shifts the tiles down and appends the new one.
    // (The body ends in its `yield`: checked before anything changed.)
    if let Some(y) = ops.last_mut() {
        for (args, n) in new_args.iter().zip(&next) {
            y.operands.extend(args.iter().skip(1).copied());
            y.operands.push(*n);
        }
    }
    body.ops = ops;
    body.args.extend(new_args.iter().flatten().copied());
    for_op.operands.extend(inits.iter().flatten().copied());
    for_op.results.extend(new_results);
    Some(prologue)
}

/// Replaces operands by `map` in `op` and its nested regions.
fn substitute(op: &mut Op, map: &HashMap<ValueId, ValueId>) {
    for o in &mut op.operands {
        if let Some(&n) = map.get(o) {
            *o = n;
        }
    }
    for r in &mut op.regions {
        for o in &mut r.ops {
            substitute(o, map);
        }
    }
}

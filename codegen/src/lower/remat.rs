//! Rematerialization: recomputing a cheap value in the layout a consumer needs,
//! instead of converting it through shared memory.
//!
//! Index and mask arithmetic (`arange`, splats, `expand_dims`, broadcasts, integer and
//! boolean elementwise ops, compares, selects, casts between integers, pointer
//! offsets) can be computed in any layout for the price of a few integer
//! instructions per register, while a conversion through shared memory costs a store,
//! two barriers and a load per element. So when a consumer needs such a value in
//! another layout (a broadcast's source, an operand of an elementwise op, the
//! pointers and mask of a load or store), [`Lowerer::relayout`] re-emits its defining
//! ops in that layout, recursively, within a budget; anything else (loads, `dot`,
//! reductions, loop-carried values) is converted as before. Values that do not change
//! in a loop are recomputed where they are needed, and LLVM hoists them out of the
//! loop (they are pure). This is the rematerialization half of Triton's
//! RemoveLayoutConversions, done at lowering time.

use tessera_ir::ir::{Op, OpKind};
use tessera_ir::{Elem, ScalarType, Span, ValueId};

use super::{LResult, Lowerer, Tile};
use crate::layout::{Layout, broadcast_bit_images, permute_bit_images};

/// The most ops one rematerialization may re-emit.
const BUDGET: u32 = 64;

impl<'ctx> Lowerer<'_, 'ctx> {
    /// `t` (the lowered value `v`) in layout `to`: a register renaming where every
    /// thread holds what it needs, else recomputed when `v` is cheap, else converted
    /// through shared memory.
    pub(super) fn relayout(
        &mut self,
        v: ValueId,
        t: &Tile<'ctx>,
        to: &Layout,
        span: &Span,
    ) -> LResult<Tile<'ctx>> {
        if let Some(r) = self.convert_cheap(t, to) {
            return Ok(r);
        }
        if self.rematerializable(v) {
            let mut budget = BUDGET;
            if let Some(r) = self.remat(v, to, &mut budget)? {
                self.note(|| format!("recompute an operand in {to} (was {})", t.layout));
                return Ok(r);
            }
        }
        self.convert(t, to, span)
    }

    /// `v` and every value it flows into through loops (`for` inits and `yield`s:
    /// a pipelined tile reaches its `dot` as a loop-carried value).
    pub(super) fn flow_closure(&self, v: ValueId) -> Vec<ValueId> {
        let mut out = vec![v];
        let mut i = 0;
        while i < out.len() {
            for &n in self.flows.get(&out[i]).into_iter().flatten() {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
            i += 1;
        }
        out
    }

    /// The `dot` ops `v` (or a value it flows into through a loop) is an operand of,
    /// with the operand index.
    pub(super) fn dot_uses(&self, v: ValueId) -> Vec<(&Op, usize)> {
        let mut out = Vec::new();
        for v in self.flow_closure(v) {
            visit_uses(&self.f.body, v, &mut |op, i| {
                if op.kind == OpKind::Dot {
                    out.push((op, i));
                }
            });
        }
        out
    }

    /// Whether every use of `v` is an operand of `dot` (`A` or `B`), following it
    /// through loops (`for` inits and `yield`s only pass it on).
    pub(super) fn feeds_only_dot(&self, v: ValueId) -> bool {
        let mut any = false;
        let mut only = true;
        for v in self.flow_closure(v) {
            visit_uses(&self.f.body, v, &mut |op, i| {
                let passes_on = (op.kind == OpKind::For && i >= 3) || op.kind == OpKind::Yield;
                if !passes_on {
                    any = true;
                    only &= op.kind == OpKind::Dot && i < 2;
                }
            });
        }
        any && only
    }

    /// The layout that spares the elementwise consumers of `v` (a load's value) a
    /// conversion: that of another operand of such a use that is lowered already, not
    /// uniform, and not cheap to recompute, so it would lead the op and `v` would be
    /// converted into it (a matmul accumulator plus a loaded residual, say). Backward
    /// propagation of that operand's layout to the load, whose pointers and mask are
    /// recomputed instead (Triton's RemoveLayoutConversions does the same).
    pub(super) fn consumer_layout(&self, v: ValueId) -> Option<Layout> {
        let shape = &self.f.ty(v).shape;
        let mut want = None;
        visit_uses(&self.f.body, v, &mut |op, _| {
            let elementwise = matches!(
                op.kind,
                OpKind::Binary(_)
                    | OpKind::Unary(_)
                    | OpKind::Cmp(_)
                    | OpKind::Select
                    | OpKind::Cast
                    | OpKind::Bitcast
                    | OpKind::Fma
            );
            if want.is_some() || !elementwise {
                return;
            }
            want = op
                .operands
                .iter()
                .filter(|&&o| o != v)
                .filter_map(|&o| self.vals.get(&o).map(|t| (o, t)))
                .find(|(o, t)| !t.uniform && t.layout.shape == *shape && !self.rematerializable(*o))
                .map(|(_, t)| t.layout.clone());
        });
        if want.is_some() {
            return want;
        }
        // The scales of a block-scaled `dot` (through loops): the layout its
        // instructions take them in.
        for u in self.flow_closure(v) {
            visit_uses(&self.f.body, u, &mut |op, i| {
                if want.is_none() && i >= 3 {
                    want = super::dot::scale_layout(self, op, i);
                }
            });
        }
        want
    }

    /// Whether `v` could be recomputed in another layout (its defining ops are all
    /// cheap and pure).
    pub(super) fn rematerializable(&self, v: ValueId) -> bool {
        let mut budget = BUDGET;
        self.remat_ok(v, &mut budget, false)
    }

    /// [`Self::rematerializable`] before lowering: scalar values that no op defines
    /// (parameters, loop induction variables) count as the uniform values they will be.
    pub(super) fn will_be_rematerializable(&self, v: ValueId) -> bool {
        let mut budget = BUDGET;
        self.remat_ok(v, &mut budget, true)
    }

    fn remat_ok(&self, v: ValueId, budget: &mut u32, planning: bool) -> bool {
        if self.vals.get(&v).is_some_and(|t| t.uniform) {
            return true;
        }
        if planning && !self.defs.contains_key(&v) && self.f.ty(v).shape.is_empty() {
            return true;
        }
        let Some(op) = self.defs.get(&v).copied() else {
            return false;
        };
        // Before lowering, constants and splats are not lowered yet; they will be
        // uniform.
        let uniform_op = planning
            && matches!(
                op.kind,
                OpKind::Const(_)
                    | OpKind::Splat
                    | OpKind::ProgramId { .. }
                    | OpKind::NumPrograms { .. }
            );
        if *budget == 0 || !(uniform_op || cheap(self, op)) {
            return false;
        }
        *budget -= 1;
        op.operands
            .iter()
            .all(|&o| self.remat_ok(o, budget, planning))
    }

    /// Re-emits `v`'s defining ops in layout `to`; `None` when `v` is not cheap.
    fn remat(&mut self, v: ValueId, to: &Layout, budget: &mut u32) -> LResult<Option<Tile<'ctx>>> {
        if let Some(t) = self.vals.get(&v) {
            if t.layout == *to {
                return Ok(Some(t.clone()));
            }
            if t.uniform {
                let (e, r) = (t.elem, t.regs[0]);
                return Ok(Some(self.uniform_tile(e, to.clone(), r)));
            }
        }
        let Some(op) = self.defs.get(&v).copied() else {
            return Ok(None);
        };
        // The caller checked the whole tree ([`Self::rematerializable`]), with the same
        // budget accounting, so this never gives up half way.
        if *budget == 0 || !cheap(self, op) {
            return Ok(None);
        }
        *budget -= 1;
        let shape = self.f.ty(op.results[0]).shape.clone();
        let t = match &op.kind {
            OpKind::Arange { start, .. } => {
                let idx = self.elem_indices(to)?;
                let s = self.cx.i32(*start);
                let regs = idx
                    .into_iter()
                    .map(|i| Ok(self.cx.b.build_int_add(i, s, "")?.into()))
                    .collect::<LResult<Vec<_>>>()?;
                Tile {
                    elem: Elem::Scalar(ScalarType::I32),
                    layout: to.clone(),
                    regs,
                    uniform: false,
                }
            }
            OpKind::ExpandDims { .. } | OpKind::Reshape | OpKind::Hint { .. } => {
                let src_shape = self.f.ty(op.operands[0]).shape.clone();
                let Some(s) = self.remat(op.operands[0], &to.with_shape(&src_shape), budget)?
                else {
                    return Ok(None);
                };
                Tile {
                    layout: to.clone(),
                    ..s
                }
            }
            OpKind::Broadcast | OpKind::Permute { .. } => {
                let src_shape = self.f.ty(op.operands[0]).shape.clone();
                let images = match &op.kind {
                    OpKind::Permute { order } => permute_bit_images(&src_shape, order),
                    _ => broadcast_bit_images(&src_shape, &shape),
                };
                let p = to.compose_bits(&src_shape, &images);
                let Some(s) = self.remat(op.operands[0], &p, budget)? else {
                    return Ok(None);
                };
                Tile {
                    layout: to.clone(),
                    ..s
                }
            }
            OpKind::Binary(_)
            | OpKind::Cmp(_)
            | OpKind::Select
            | OpKind::Cast
            | OpKind::Bitcast => {
                let mut ops = Vec::with_capacity(op.operands.len());
                for &o in &op.operands {
                    match self.remat(o, to, budget)? {
                        Some(t) => ops.push(t),
                        None => return Ok(None),
                    }
                }
                super::elementwise::lower_with(self, op, ops)?
            }
            OpKind::AddPtr => {
                let (Some(p), Some(o)) = (
                    self.remat(op.operands[0], to, budget)?,
                    self.remat(op.operands[1], to, budget)?,
                ) else {
                    return Ok(None);
                };
                super::memory::addptr_with(self, p, o)?
            }
            _ => return Ok(None),
        };
        Ok(Some(t))
    }
}

/// Ops [`Lowerer::relayout`] may re-emit: pure, a few instructions per register, on
/// integers, booleans and pointers (index and mask arithmetic; float math is left
/// alone: recomputing it would cost more than the conversion saves).
fn cheap(l: &Lowerer<'_, '_>, op: &Op) -> bool {
    let index_like = |v: ValueId| match l.f.ty(v).elem {
        Elem::Scalar(s) => s.is_int() || s == ScalarType::I1,
        Elem::Ptr { .. } => true,
    };
    let same_shape = || {
        let s = &l.f.ty(op.results[0]).shape;
        op.operands.iter().all(|&o| {
            let os = &l.f.ty(o).shape;
            os.is_empty() || os == s
        })
    };
    match &op.kind {
        OpKind::Arange { .. }
        | OpKind::ExpandDims { .. }
        | OpKind::Reshape
        | OpKind::Hint { .. } => true,
        OpKind::Broadcast | OpKind::Permute { .. } => true,
        OpKind::Binary(_) | OpKind::Cmp(_) | OpKind::Select | OpKind::Cast | OpKind::AddPtr => {
            same_shape()
                && index_like(op.results[0])
                && op
                    .operands
                    .iter()
                    .all(|&o| index_like(o) || l.f.ty(o).shape.is_empty())
        }
        _ => false,
    }
}

/// Calls `f(op, operand index)` for every use of `v` in `r` and its nested regions.
pub(super) fn visit_uses<'a>(
    r: &'a tessera_ir::ir::Region,
    v: ValueId,
    f: &mut impl FnMut(&'a Op, usize),
) {
    for op in &r.ops {
        for (i, &o) in op.operands.iter().enumerate() {
            if o == v {
                f(op, i);
            }
        }
        for sub in &op.regions {
            visit_uses(sub, v, f);
        }
    }
}

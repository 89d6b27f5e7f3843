//! Rings of asynchronous copies: the pipelined operand loads of a loop's `dot`
//! become `cp.async` (or TMA) copies straight into a ring of the `dot`'s arrays,
//! issued iterations ahead of the `dot` that reads them.

use std::collections::HashSet;

use tessera_ir::ValueId;
use tessera_ir::ir::{Op, OpKind, Region};

use super::{Planner, WarpSpec, cluster};
use crate::lower::{dot, memory, remat, tma};

impl<'a> Planner<'_, 'a, '_> {
    /// The uses of `v` in `r` (and nested regions).
    fn uses_in(r: &'a Region, v: ValueId) -> Vec<(&'a Op, usize)> {
        let mut out = Vec::new();
        remat::visit_uses(r, v, &mut |o, i| out.push((o, i)));
        out
    }

    /// Plans asynchronous copies for the pipelined operands of the `dot`s in loop
    /// `for_op` (in region `parent`): both operands of a matrix-path `dot` must come
    /// as [`crate::pipeline`] leaves them, a chain of region arguments `t0 .. t(d-1)`
    /// (`t0` the `dot`'s operand, each yielded as the one before, the last fed by a
    /// load in the body) whose initial values are loads just before the loop, every
    /// load one [`Arch::cp_async`] can do. Then each load copies straight into a ring
    /// of `d + 1` copies of the `dot`'s arrays (iteration `i` in slot `i % (d + 1)`),
    /// the region arguments hold nothing, and the loop waits for iteration `i`'s
    /// group at its top (`Lowerer::lower_for`, in `control.rs`).
    pub(super) fn plan_async(&mut self, for_op: &'a Op, parent: &'a Region) {
        let body = &for_op.regions[0];
        let Some(y) = body.ops.last() else {
            return;
        };
        let def_in = |r: &'a Region, v: ValueId| r.ops.iter().find(|o| o.results.contains(&v));
        // Per dot: per operand, (args of the chain, prologue loads, loop load).
        type Chain<'b> = (Vec<ValueId>, Vec<&'b Op>, &'b Op);
        let mut chains: Vec<(&'a Op, usize, Chain<'a>)> = Vec::new();
        for &a0 in body.args.iter().skip(1) {
            let [(d, which)] = Self::uses_in(body, a0)[..] else {
                continue;
            };
            if d.kind != OpKind::Dot || which >= 2 || dot::matrix_staging_bytes(self.l, d).is_none()
            {
                continue;
            }
            let dim = dot::array_row_dim(self.l, d, which);
            let arg_index = |a: ValueId| body.args.iter().position(|&x| x == a);
            let mut args = vec![a0];
            let mut cur = a0;
            let last = loop {
                let Some(k) = arg_index(cur) else { break None };
                let next = y.operands[k - 1];
                if let Some(k2) = arg_index(next) {
                    // `next` is yielded as `cur` (operand `k - 1`), and used nowhere else.
                    let uses = Self::uses_in(body, next);
                    let only_yield =
                        uses.len() == 1 && std::ptr::eq(uses[0].0, y) && uses[0].1 == k - 1;
                    if k2 == 0 || !only_yield || args.contains(&next) {
                        break None;
                    }
                    args.push(next);
                    cur = next;
                    continue;
                }
                break def_in(body, next).filter(|l| {
                    Self::uses_in(body, next).len() == 1 && self.ring_load_ok(l, d, which, dim)
                });
            };
            let Some(last) = last else {
                continue;
            };
            let mut pro = Vec::new();
            for &a in &args {
                let Some(k) = arg_index(a) else { break };
                let init = for_op.operands[3 + k - 1];
                match def_in(parent, init) {
                    Some(l)
                        if std::mem::discriminant(&l.kind)
                            == std::mem::discriminant(&last.kind)
                            && Self::uses_in(parent, init).len() == 1
                            && self.ring_load_ok(l, d, which, dim) =>
                    {
                        pro.push(l)
                    }
                    _ => break,
                }
            }
            if pro.len() == args.len() {
                chains.push((d, which, (args, pro, last)));
            }
        }
        for (d, which, (args, ..)) in &chains {
            if *which != 0 {
                continue;
            }
            let Some((_, _, (b_args, ..))) = chains
                .iter()
                .find(|(d2, w2, _)| std::ptr::eq(*d2, *d) && *w2 == 1)
            else {
                continue;
            };
            if b_args.len() != args.len() {
                continue;
            }
            let ahead = args.len() as u32;
            let slot_bytes = dot::matrix_staging_bytes(self.l, d)
                .unwrap_or(0)
                .next_multiple_of(self.l.smem_align());
            let overlap = if self.l.target().has_wgmma() {
                Self::chained_acc(body, d)
            } else {
                None
            };
            let slots = ahead + 1 + u32::from(overlap.is_some());
            let tma = chains
                .iter()
                .filter(|(d2, _, (_, _, last))| {
                    std::ptr::eq(*d2, *d) && matches!(last.kind, OpKind::DescLoad { .. })
                })
                .count() as u32;
            let mine = || chains.iter().filter(|(d2, ..)| std::ptr::eq(*d2, *d));
            let pro: Vec<&Op> = mine()
                .flat_map(|(.., (_, p, _))| p.iter().copied())
                .collect();
            let lasts: Vec<&Op> = mine().map(|(.., (_, _, l))| *l).collect();
            let spec = if tma == 2 {
                self.warp_spec_slice(for_op, parent, &pro, &lasts)
            } else {
                None
            };
            // A warp-specialized ring has a second mbarrier per slot: the consumers
            // release the slot on it.
            let bar_sets = if spec.is_some() { 2 } else { 1 };
            let bar_bytes = if tma > 0 {
                slots * tma::MBAR_BYTES * bar_sets
            } else {
                0
            };
            let bytes = slots * slot_bytes + bar_bytes;
            if self.plan.pipe_bytes + bytes > self.l.target().shared_memory_limit() {
                continue;
            }
            self.plan.async_dots.insert(
                *d as *const Op,
                AsyncDot {
                    offset: self.plan.pipe_bytes,
                    slot_bytes,
                    slots,
                    ahead,
                    overlap,
                    tma,
                    bars: self.plan.pipe_bytes + slots * slot_bytes,
                },
            );
            if let Some(slice) = spec {
                let defs = cluster::Defs::new(self.l.f);
                let multicast = [0, 1].map(|which| {
                    let loads: Vec<&Op> = mine()
                        .filter(|(_, w, _)| *w == which)
                        .flat_map(|(.., (_, p, l))| p.iter().copied().chain([*l]))
                        .collect();
                    cluster::multicast_axes(self.l.f, &defs, self.l.cluster, for_op, &loads)
                });
                let (slice, outer, outer_slice) = slice;
                self.plan.warp_spec = Some(WarpSpec {
                    for_op: for_op as *const Op,
                    dot: *d as *const Op,
                    slice,
                    empty: self.plan.pipe_bytes + slots * slot_bytes + slots * tma::MBAR_BYTES,
                    multicast,
                    outer: outer.map(|o| o as *const Op),
                    outer_slice,
                    groups: 1,
                });
            }
            // Whatever follows (arrays, scratch) starts aligned as arrays must.
            self.plan.pipe_bytes += bytes.next_multiple_of(self.l.smem_align());
            self.plan.pipe_dots.insert(
                *d as *const Op,
                self.plan.async_dots[&(*d as *const Op)].offset,
            );
            for (d2, w2, (cargs, pro, last)) in &chains {
                if !std::ptr::eq(*d2, *d) {
                    continue;
                }
                for &a in cargs {
                    self.plan.async_args.insert(a);
                }
                self.plan.staged.insert(cargs[0], (d2, *w2));
                for (s, l) in pro.iter().enumerate() {
                    self.plan
                        .async_loads
                        .insert(l.results[0], (d2, *w2, AsyncSlot::Fixed(s as u32)));
                }
                self.plan
                    .async_loads
                    .insert(last.results[0], (d2, *w2, AsyncSlot::Next));
            }
        }
    }

    /// The producer's part of loop `for_op` (in `parent`) when its ring (prologue
    /// loads `pro`, the loop's loads `lasts`, all TMA) can be warp-specialized: the
    /// target has `wgmma` (and `setmaxnreg`), the kernel does not communicate, its
    /// warps are whole warpgroups, the loop is at the kernel's top level or in the
    /// body of a top-level `for` (a persistent kernel's loop over tiles), and the
    /// producer warpgroup can run what comes before the loop (scalars, splatted
    /// constants, the prologue's copies: nothing that touches memory or needs the
    /// block's threads as the layouts count them) and compute the loop's copies
    /// from the induction variable and values defined before the loop, with pure
    /// scalar ops only (the slice returned, the loads included). For a persistent
    /// kernel also the outer loop and the body ops of it the producer lowers (the
    /// scalars the ring's loop needs; the outer loop carries nothing they use).
    /// `None` otherwise, or when the options turn it off or another loop has it.
    #[allow(clippy::type_complexity)]
    fn warp_spec_slice(
        &self,
        for_op: &'a Op,
        parent: &'a Region,
        pro: &[&'a Op],
        lasts: &[&'a Op],
    ) -> Option<(HashSet<*const Op>, Option<&'a Op>, HashSet<*const Op>)> {
        let (l, f) = (self.l, self.l.f);
        if l.warp_specialize == Some(false)
            || !l.target().has_wgmma()
            || f.uses_comm()
            || self.plan.warp_spec.is_some()
            || !l.nw.is_multiple_of(4)
            || (l.nw + 4) * l.ws > 1024
        {
            return None;
        }
        let scalar = |op: &Op| op.results.iter().all(|&r| f.ty(r).shape.is_empty());
        let pure_scalar = |op: &Op| op.kind.is_pure() && op.regions.is_empty() && scalar(op);
        // The top-level loop around it, for a ring loop nested one deep.
        let outer = if std::ptr::eq(parent, &f.body) {
            None
        } else {
            let o = f
                .body
                .ops
                .iter()
                .find(|o| o.kind == OpKind::For && std::ptr::eq(&o.regions[0], parent))?;
            Some(o)
        };
        // Everything before the split: what the producer warpgroup runs too.
        let before = |region: &'a Region, until: &Op, prologue: bool| {
            for op in &region.ops {
                if std::ptr::eq(op, until) {
                    break;
                }
                let ok = pure_scalar(op)
                    || matches!(op.kind, OpKind::Const(_))
                    || (prologue && pro.iter().any(|p| std::ptr::eq(*p, op)));
                if !ok {
                    return false;
                }
            }
            true
        };
        match outer {
            None if !before(parent, for_op, true) => return None,
            Some(o) if !before(&f.body, o, false) || !before(parent, for_op, true) => {
                return None;
            }
            _ => {}
        }
        let body = &for_op.regions[0];
        let mut need: HashSet<ValueId> = lasts
            .iter()
            .flat_map(|o| o.operands.iter().copied())
            .collect();
        let mut slice = HashSet::new();
        for op in body.ops.iter().rev() {
            let last = lasts.iter().any(|x| std::ptr::eq(*x, op));
            if !last && !op.results.iter().any(|r| need.contains(r)) {
                continue;
            }
            if !last && !pure_scalar(op) {
                return None;
            }
            slice.insert(op as *const Op);
            need.extend(op.operands.iter().copied());
        }
        // The producer carries nothing but the induction variable.
        if body.args.iter().skip(1).any(|a| need.contains(a)) {
            return None;
        }
        let mut outer_slice = HashSet::new();
        if let Some(o) = outer {
            // The outer body's scalars the ring loop's bounds and copies need.
            need.extend(for_op.operands.iter().take(3).copied());
            let mut past = false;
            for op in parent.ops.iter().rev() {
                if std::ptr::eq(op, for_op) {
                    past = true;
                    continue;
                }
                if !past || !op.results.iter().any(|r| need.contains(r)) {
                    continue;
                }
                if !pure_scalar(op) {
                    return None;
                }
                outer_slice.insert(op as *const Op);
                need.extend(op.operands.iter().copied());
            }
            if o.regions[0].args.iter().skip(1).any(|a| need.contains(a)) {
                return None;
            }
        }
        Some((slice, outer, outer_slice))
    }

    /// Whether load `l` (a `load` by `cp.async`, or a `desc_load` by TMA) can copy
    /// operand `which` of `dot` `d` into its ring.
    fn ring_load_ok(&self, l: &Op, d: &Op, which: usize, dim: usize) -> bool {
        match l.kind {
            OpKind::Load { .. } => memory::async_copy_ok(self.l, l, dim),
            OpKind::DescLoad { .. } => tma::ring_ok(self.l, l, d, which),
            _ => false,
        }
    }

    /// The index (in `body`'s arguments) of the accumulator that `dot` `d` only
    /// chains: `d`'s C is that argument, used nowhere else in the body, and `d`'s result
    /// is yielded for it and used nowhere else.
    fn chained_acc(body: &'a Region, d: &Op) -> Option<usize> {
        let j = body.args.iter().position(|&a| a == d.operands[2])?;
        let y = body.ops.last()?;
        if j == 0 || y.kind != OpKind::Yield || y.operands.get(j - 1) != Some(&d.results[0]) {
            return None;
        }
        let arg_uses = Self::uses_in(body, d.operands[2]);
        let res_uses = Self::uses_in(body, d.results[0]);
        let only = |u: &[(&Op, usize)], op: &Op, i: usize| {
            u.len() == 1 && std::ptr::eq(u[0].0, op) && u[0].1 == i
        };
        (only(&arg_uses, d, 2) && only(&res_uses, y, j - 1)).then_some(j)
    }
}

/// A `dot` fed by asynchronous copies: `slots` arrays of `slot_bytes` from `offset`
/// in shared memory, `ahead` iterations' copies in flight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AsyncDot {
    pub(crate) offset: u32,
    pub(crate) slot_bytes: u32,
    pub(crate) slots: u32,
    pub(crate) ahead: u32,
    /// Operands filled by TMA copies (0, 1 or 2): the mbarriers' arrival count.
    pub(crate) tma: u32,
    /// Where the slots' mbarriers start (one per slot, after the slots), when `tma > 0`.
    pub(crate) bars: u32,
    /// On `wgmma` targets, the loop-carried accumulator (its index in the body's
    /// arguments) when the dot only chains it (`acc = dot(a, b, acc)`): each
    /// iteration then leaves its wgmma group in flight (`wait_group 1`), the ring has
    /// one more slot so the slot being refilled is never one an in-flight group
    /// reads, and the loop ends with `wait_group 0`.
    pub(crate) overlap: Option<usize>,
}

/// Which array of the ring an asynchronous copy fills.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AsyncSlot {
    /// Slot `s`: the prologue's copy for iteration `s`.
    Fixed(u32),
    /// The loop's copy for iteration `i + ahead`: the slot being filled.
    Next,
}

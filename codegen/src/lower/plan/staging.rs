//! Shared arrays planned before lowering: `local_alloc` arrays, and the arrays of
//! `dot`s whose operands a loop keeps there (carried operands written by the loop,
//! loop-invariant ones written once before it).

use tessera_ir::ir::{Op, OpKind, Region};
use tessera_ir::{Elem, ValueId};

use super::Planner;
use crate::lower::{dot, remat};

impl<'a> Planner<'_, 'a, '_> {
    /// Whether `v` is defined by an op of `r` (or of a region nested in it).
    fn defined_in(r: &Region, v: ValueId) -> bool {
        r.ops
            .iter()
            .any(|o| o.results.contains(&v) || o.regions.iter().any(|s| Self::defined_in(s, v)))
    }

    /// Places the kernel's `local_alloc` arrays (at any depth: one array per op) at
    /// the start of shared memory, each aligned as every shared array is.
    pub(super) fn plan_locals(&mut self) {
        let mut allocs = Vec::new();
        self.l.f.walk(&mut |op| {
            if let OpKind::LocalAlloc { len } = op.kind {
                allocs.push((op as *const Op, len, op.results[0], op.span.clone()));
            }
        });
        for (op, len, result, span) in allocs {
            let elem = match self.l.f.ty(result).elem {
                Elem::Ptr { pointee, .. } => pointee,
                Elem::Scalar(s) => s,
            };
            let bytes = (len as u64 * elem.size_bytes() as u64).min(u32::MAX as u64) as u32;
            self.plan.locals.insert(op, self.plan.pipe_bytes);
            self.plan.pipe_bytes = self.plan.pipe_bytes.saturating_add(
                bytes
                    .checked_next_multiple_of(self.l.smem_align())
                    .unwrap_or(u32::MAX),
            );
            if self.plan.first_array.is_none() {
                self.plan.first_array = Some(span);
            }
        }
    }

    /// Finds the loop-carried values to keep in shared memory: a region argument of a
    /// `for` whose one use is operand A or B of a `dot` on the matrix path (and whose
    /// final value is not used after the loop). The loop writes the initial and each
    /// yielded tile into the `dot`'s own arrays and waits at a barrier, so the value
    /// crosses the back edge in shared memory, not registers: a pipelined operand
    /// load ([`crate::pipeline`]) overlaps the `dot` before it, with no register
    /// copies.
    pub(super) fn plan_staging(&mut self, r: &'a Region) {
        for op in &r.ops {
            for sub in &op.regions {
                self.plan_staging(sub);
            }
            if op.kind != OpKind::For {
                continue;
            }
            if self.l.arch.has_cp_async() {
                self.plan_async(op, r);
            }
            let body = &op.regions[0];
            // Loop-invariant operands of the body's own dots (Q in attention): written
            // into the dot's arrays once, before the loop, instead of every iteration.
            for d in body.ops.iter().filter(|o| o.kind == OpKind::Dot) {
                let key = d as *const Op;
                if self.plan.async_dots.contains_key(&key) {
                    continue;
                }
                let Some(bytes) = dot::matrix_staging_bytes(self.l, d) else {
                    continue;
                };
                for which in 0..2 {
                    let v = d.operands[which];
                    if body.args.contains(&v) || Self::defined_in(body, v) {
                        continue;
                    }
                    self.plan.invariant.insert((key, which));
                    if !self.plan.pipe_dots.contains_key(&key) {
                        self.plan.pipe_dots.insert(key, self.plan.pipe_bytes);
                        self.plan.pipe_bytes += bytes.next_multiple_of(self.l.smem_align());
                    }
                }
            }
            for (j, &arg) in body.args.iter().enumerate().skip(1) {
                if self.plan.staged.contains_key(&arg) {
                    continue;
                }
                let mut uses: Vec<(&'a Op, usize)> = Vec::new();
                remat::visit_uses(body, arg, &mut |o, i| uses.push((o, i)));
                let result_used = op.results.get(j - 1).is_some_and(|&res| {
                    let mut any = false;
                    remat::visit_uses(&self.l.f.body, res, &mut |_, _| any = true);
                    any
                });
                let [(d, i)] = uses[..] else {
                    continue;
                };
                if d.kind != OpKind::Dot || i >= 2 || result_used {
                    continue;
                }
                let Some(bytes) = dot::matrix_staging_bytes(self.l, d) else {
                    continue;
                };
                self.plan.staged.insert(arg, (d, i));
                let key = d as *const Op;
                if !self.plan.pipe_dots.contains_key(&key) {
                    self.plan.pipe_dots.insert(key, self.plan.pipe_bytes);
                    self.plan.pipe_bytes += bytes.next_multiple_of(self.l.smem_align());
                }
            }
            self.plan_double(body);
        }
    }

    /// Gives the staged `dot`s of loop body `body` a second copy of their arrays
    /// ([`Plan::double`](super::Plan::double)) where that is safe and pays: every
    /// staged `dot` of the body (else its barriers stay) is in the body itself, on
    /// fragments (`mma.sync`/MFMA/WMMA: `wgmma` and the rings have their own
    /// protocols; an operand written once before the loop goes into both copies),
    /// and the planned arrays stay within half the target's
    /// shared memory (so two blocks still fit where one did); when the kernel then
    /// runs out of shared memory it is lowered again without
    /// ([`crate::lower::Lowerer::double_buffer`]). On AMD only: NVIDIA's loops
    /// take `cp.async` rings where they can, and the register-staged rest (unaligned
    /// operands) spilled when unrolled (sm_80's 128x128x32 filetest: 684 bytes of
    /// spills instead of 64); and not on RDNA3, whose WMMA holds A and B twice
    /// (a 64x64x64 f16 matmul spilled 4 registers).
    fn plan_double(&mut self, body: &Region) {
        // (A loop with a ring keeps one body: its slots have their own protocol.)
        let ring = |o: &Op| self.plan.async_dots.contains_key(&(o as *const Op));
        let t = match self.l.target() {
            crate::Target::Emu(f) => f.imitates(),
            t => t,
        };
        let amd = matches!(t, crate::Target::Amdgpu(a) if a != crate::AmdArch::Gfx1100);
        if !self.l.double_buffer || !amd || body.ops.iter().any(ring) {
            return;
        }
        // The dots this loop's own arguments are staged for.
        let staged: Vec<&Op> = (body.args.iter())
            .filter_map(|a| self.plan.staged.get(a).map(|(d, _)| *d))
            .collect();
        let mut want: Vec<(*const Op, u32)> = Vec::new();
        for d in staged {
            let key = d as *const Op;
            if want.iter().any(|(k, _)| *k == key) {
                continue;
            }
            if !body.ops.iter().any(|o| std::ptr::eq(o, d)) {
                return;
            }
            let ok = dot::on_fragments(self.l, d);
            let bytes = dot::matrix_staging_bytes(self.l, d);
            match (ok, bytes) {
                (true, Some(b)) => want.push((key, b.next_multiple_of(self.l.smem_align()))),
                _ => return,
            }
        }
        let extra: u32 = want.iter().map(|w| w.1).sum();
        if want.is_empty()
            || self.plan.pipe_bytes + extra > self.l.target().shared_memory_limit() / 2
        {
            return;
        }
        for (key, bytes) in want {
            self.plan.double.insert(key, self.plan.pipe_bytes);
            self.plan.pipe_bytes += bytes;
        }
    }
}

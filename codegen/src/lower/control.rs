//! Control flow: `for`, `if` and `while` as LLVM blocks and phis.
//!
//! A region's values cross its back edge or join as phis, one per register of the
//! tile, in the layout the value has when it enters (a loop-carried value with a
//! [`plan`](super::plan) hint is converted to it first). Loops planned to keep a
//! `dot`'s operands in shared memory or in a ring of asynchronous copies (see
//! `plan/`) write the initial operands before the loop, wait for each iteration's
//! copies at its top and hold nothing for those operands in registers.

use inkwell::values::{BasicValue, IntValue};
use tessera_ir::Span;
use tessera_ir::ValueId;
use tessera_ir::ir::{Op, OpKind, Region};

use super::{AsyncDot, LResult, LowerError, Lowerer, Tile, dot, unsupported};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    pub(super) fn phis(&self, t: &Tile<'ctx>) -> LResult<Vec<inkwell::values::PhiValue<'ctx>>> {
        let ty = self.ty(t.elem);
        t.regs
            .iter()
            .map(|_| Ok(self.cx.b.build_phi(ty, "")?))
            .collect()
    }

    pub(super) fn phi_tile(
        &self,
        t: &Tile<'ctx>,
        phis: &[inkwell::values::PhiValue<'ctx>],
    ) -> Tile<'ctx> {
        Tile {
            elem: t.elem,
            layout: t.layout.clone(),
            regs: phis.iter().map(|p| p.as_basic_value()).collect(),
            uniform: false,
        }
    }

    pub(super) fn lower_for(&mut self, op: &Op) -> LResult<()> {
        let span = &op.span;
        let body = &op.regions[0];
        let lb = self.val(op.operands[0])?.regs[0].into_int_value();
        let ub = self.val(op.operands[1])?.regs[0].into_int_value();
        let step = self.val(op.operands[2])?.regs[0].into_int_value();
        let mut inits = Vec::new();
        let mut staged_any = false;
        // The `dot`s of this loop fed by asynchronous copies (the plan's `ring.rs`).
        let mut rings: Vec<(&Op, AsyncDot)> = Vec::new();
        for a in &body.args {
            if let Some(&(d, _)) = self.plan.staged.get(a)
                && self.plan.async_args.contains(a)
                && let Some(r) = self.async_dot(d)
                && !rings.iter().any(|(x, _)| std::ptr::eq(*x, d))
            {
                rings.push((d, r));
            }
        }
        for (i, &v) in op.operands[3..].iter().enumerate() {
            let t = self.val(v)?;
            if body
                .args
                .get(i + 1)
                .is_some_and(|a| self.plan.async_args.contains(a))
            {
                // In the ring already (the prologue's copies).
                inits.push(t);
                continue;
            }
            if let Some(t) =
                self.stage_carried(body.args.get(i + 1), &t, "the first iteration's", false)?
            {
                staged_any = true;
                inits.push(t);
                continue;
            }
            let t = match body
                .args
                .get(i + 1)
                .and_then(|a| self.plan.hints.get(a))
                .cloned()
            {
                Some(h) if h.shape == t.layout.shape => self.convert(&t, &h, span)?,
                _ => t,
            };
            inits.push(t);
        }
        for d in body.ops.iter().filter(|o| o.kind == OpKind::Dot) {
            for which in 0..2 {
                if !self.plan.invariant.contains(&(d as *const Op, which)) {
                    continue;
                }
                let base = self.pipe_base(d).ok_or_else(|| {
                    LowerError::Llvm("an invariant operand without arrays".into())
                })?;
                let t = self.val(d.operands[which])?;
                self.note(|| {
                    format!(
                        "the loop-invariant operand {} of the loop's dot written into the dot's shared arrays",
                        ["A", "B"][which]
                    )
                });
                dot::stage_operand(self, d, which, &t, base)?;
                // A double-buffered dot reads it from either copy (`Plan::double`).
                if let Some(&second) = self.plan.double.get(&(d as *const Op)) {
                    let base = self.smem_at(second);
                    dot::stage_operand(self, d, which, &t, base)?;
                }
                staged_any = true;
            }
        }
        if staged_any {
            self.barrier()?;
        }
        // A persistent kernel's loop over tiles around a warp-specialized ring: the
        // block splits here, after the ring's mbarriers are initialized.
        let persistent = self
            .plan
            .warp_spec
            .as_ref()
            .filter(|w| w.outer == Some(op as *const Op))
            .map(|w| (w.for_op, w.dot, w.empty));
        if let Some((inner, dot, empty)) = persistent {
            let inner = body
                .ops
                .iter()
                .find(|o| std::ptr::eq(*o, inner))
                .ok_or_else(|| {
                    LowerError::Llvm("a persistent loop without its ring loop".into())
                })?;
            let d = inner.regions[0]
                .ops
                .iter()
                .find(|o| std::ptr::eq(*o, dot))
                .ok_or_else(|| LowerError::Llvm("a ring loop without its dot".into()))?;
            let r = self
                .async_dot(d)
                .ok_or_else(|| LowerError::Llvm("no ring for this dot".into()))?;
            self.tma_inited.borrow_mut().insert(d as *const Op);
            self.init_ring_bars(&r)?;
            self.split_persistent(op, inner, d, r, empty, (lb, ub, step))?;
            self.restore_op(op);
        }
        // Ping-pong consumers walk their group's tiles of the block's walk.
        let walk = match persistent {
            Some((inner, ..)) if self.group.is_some() => Some((inner, lb, step)),
            _ => None,
        };
        let (lb, step) = match walk {
            Some(_) => self.group_tiles(lb, step)?,
            None => (lb, step),
        };
        // A warp-specialized ring: the block splits here (`spec.rs`), or (in a
        // persistent kernel) split already.
        let spec = self
            .plan
            .warp_spec
            .as_ref()
            .filter(|w| std::ptr::eq(w.for_op, op))
            .map(|w| (w.dot, w.empty, w.outer.is_some()));
        let spec = match spec {
            Some((dot, empty, split_before)) => {
                let (d, r) = rings
                    .iter()
                    .find(|(d, _)| std::ptr::eq(*d, dot))
                    .copied()
                    .ok_or_else(|| {
                        LowerError::Llvm("a warp-specialized loop without its ring".into())
                    })?;
                if !split_before {
                    self.split_for_producer(op, d, r, empty, lb, ub, step)?;
                    self.restore_op(op);
                }
                self.await_turn()?;
                Some((dot, r, empty))
            }
            None => None,
        };
        let pre = self.cx.cur_block();
        let header = self.cx.ctx.append_basic_block(self.kernel, "for.header");
        let bb_body = self.cx.ctx.append_basic_block(self.kernel, "for.body");
        let exit = self.cx.ctx.append_basic_block(self.kernel, "for.exit");
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(header);
        let iv = self.cx.b.build_phi(lb.get_type(), "iv")?;
        iv.add_incoming(&[(&lb, pre)]);
        // The double-buffered `dot`s of the body (`Plan::double`): the body is
        // unrolled by two (`lower_unrolled`).
        let dbuf: Vec<*const Op> = (body.ops.iter())
            .map(|d| d as *const Op)
            .filter(|d| self.plan.double.contains_key(d))
            .collect();
        let mut phis = Vec::new();
        for t in &inits {
            let ps = self.phis(t)?;
            for (p, r) in ps.iter().zip(&t.regs) {
                p.add_incoming(&[(r as &dyn BasicValue, pre)]);
            }
            phis.push(ps);
        }
        // Per ring: the byte offsets of the slot read this iteration and of the slot
        // its copies for iteration `i + ahead` fill.
        let i32t = self.cx.ctx.i32_type();
        // A persistent loop over tiles: the consumers' ring position, from tile to
        // tile (the ring loop inside starts where the last tile's ended).
        let cursor = match persistent {
            Some(_) => {
                let (rd, ph) = (
                    self.cx.b.build_phi(i32t, "cursor.read")?,
                    self.cx.b.build_phi(i32t, "cursor.phase")?,
                );
                rd.add_incoming(&[(&self.cx.i32(0), pre)]);
                ph.add_incoming(&[(&self.cx.i32(0), pre)]);
                self.ring_cursor = Some((
                    rd.as_basic_value().into_int_value(),
                    ph.as_basic_value().into_int_value(),
                ));
                Some((rd, ph))
            }
            None => None,
        };
        let start = match spec {
            Some(_)
                if self
                    .plan
                    .warp_spec
                    .as_ref()
                    .is_some_and(|w| w.outer.is_some()) =>
            {
                self.ring_cursor.ok_or_else(|| {
                    LowerError::Llvm("a persistent ring loop outside its loop over tiles".into())
                })?
            }
            _ => (self.cx.i32(0), self.cx.i32(0)),
        };
        let mut ring_phis = Vec::new();
        for (d, r) in &rings {
            let (rd, wr, ph) = (
                self.cx.b.build_phi(i32t, "ring.read")?,
                self.cx.b.build_phi(i32t, "ring.fill")?,
                // The mbarrier phase parity of the slot read (TMA rings).
                self.cx.b.build_phi(i32t, "ring.phase")?,
            );
            let own = spec.is_some_and(|(s, ..)| std::ptr::eq(s, *d as *const Op));
            let (r0, p0) = if own {
                start
            } else {
                (self.cx.i32(0), self.cx.i32(0))
            };
            rd.add_incoming(&[(&r0, pre)]);
            wr.add_incoming(&[(&self.cx.i32((r.ahead * r.slot_bytes) as i64), pre)]);
            ph.add_incoming(&[(&p0, pre)]);
            self.async_slots.borrow_mut().insert(
                *d as *const Op,
                (
                    rd.as_basic_value().into_int_value(),
                    wr.as_basic_value().into_int_value(),
                ),
            );
            ring_phis.push((rd, wr, ph, *r));
        }
        let ivv = iv.as_basic_value().into_int_value();
        // Unrolled by two (`lower_unrolled`): a trip while two iterations remain,
        // the last odd one after the loop (from `tail_check`).
        let (iv_test, leave) = match dbuf.is_empty() {
            true => (ivv, exit),
            false => (
                self.cx.b.build_int_add(ivv, step, "")?,
                self.cx
                    .ctx
                    .append_basic_block(self.kernel, "for.tail_check"),
            ),
        };
        let c = self
            .cx
            .b
            .build_int_compare(inkwell::IntPredicate::SLT, iv_test, ub, "")?;
        self.restore_op(op);
        let site = self.new_site("for");
        let c = self.arch.loop_continue(&self.cx, c, site)?;
        self.cx.b.build_conditional_branch(c, bb_body, leave)?;
        self.cx.b.position_at_end(bb_body);
        if let Some(ahead) = rings.iter().map(|(_, r)| r.ahead).min() {
            // This iteration's copies have landed (at most the `ahead - 1` newer groups
            // are pending, and the TMA copies' mbarrier phase is complete) and are
            // visible to the block; every thread is done with the slot the loop's
            // copies refill next (read in the previous iteration).
            if rings.iter().any(|(_, r)| r.tma < 2) {
                self.note(|| {
                    format!(
                        "cp.async.wait_group {} and a barrier at the top of each iteration",
                        ahead - 1
                    )
                });
                self.arch.cp_async_wait(&self.cx, ahead - 1)?;
            }
            for (d, rd, _, ph, r) in ring_phis
                .iter()
                .zip(&rings)
                .map(|((rd, wr, ph, r), (d, _))| (d, rd, wr, ph, r))
            {
                if r.tma == 0 {
                    continue;
                }
                self.note(|| {
                    "TMA ring: a wait for the read slot's mbarrier phase at the top of each iteration".to_string()
                });
                let bar = self.bar_at(r, rd.as_basic_value().into_int_value())?;
                let site = self.new_site("mbarrier.try_wait");
                let _ = d;
                self.arch.mbarrier_wait(
                    &self.cx,
                    bar,
                    ph.as_basic_value().into_int_value(),
                    site,
                )?;
            }
            // A warp-specialized ring's slots are refilled by the producer once the
            // consumers released them: no barrier for it.
            let others = rings
                .iter()
                .any(|(d, _)| spec.is_none_or(|(s, ..)| !std::ptr::eq(*d, s)));
            if others {
                if rings.iter().all(|(_, r)| r.tma == 2) {
                    self.note(|| {
                        "a barrier at the top of each iteration (every thread is done with the slot refilled next)".to_string()
                    });
                }
                self.barrier()?;
            } else {
                self.note(|| {
                    "warp-specialized: no barrier at the top of each iteration (the consumers release slots on their empty mbarriers)".to_string()
                });
            }
        }
        let ive = self.f.ty(op.operands[0]).elem;
        if let Some(&a) = body.args.first() {
            let t = self.scalar_tile(ive, ivv.into());
            self.set(a, t);
        }
        let carried: Vec<Tile> = inits
            .iter()
            .zip(&phis)
            .map(|(t, p)| self.phi_tile(t, p))
            .collect();
        for (a, t) in body.args.iter().skip(1).zip(&carried) {
            self.set(*a, t.clone());
        }
        if let Some((inner, lb0, step0)) = walk {
            let inner = body
                .ops
                .iter()
                .find(|o| std::ptr::eq(*o, inner))
                .ok_or_else(|| LowerError::Llvm("a ping-pong walk without its ring loop".into()))?;
            let w = super::spec::Walk {
                tile: ivv,
                lb: lb0,
                ub,
                step: step0,
            };
            self.pingpong = Some(w);
            self.skip_other_tile(op, inner, w)?;
            // (The body's ops, the tile's scalars among them, are lowered again.)
            if let Some(&a) = body.args.first() {
                let t = self.scalar_tile(ive, ivv.into());
                self.set(a, t);
            }
            self.restore_op(op);
        }
        let mut iv_last = ivv;
        let ys_conv = match dbuf.is_empty() {
            false => {
                let (ys, iv_odd) = self.lower_unrolled(op, &inits, &dbuf, (ivv, ive, step))?;
                iv_last = iv_odd;
                ys
            }
            true => {
                let ys = self.lower_region(body)?;
                self.restore_op(op);
                if let Some((dot, r, empty)) = spec
                    && let Some((rd, ..)) = ring_phis
                        .iter()
                        .zip(&rings)
                        .find(|(_, (d, _))| std::ptr::eq(*d, dot))
                        .map(|(p, _)| p)
                {
                    let rd = rd.as_basic_value().into_int_value();
                    self.release_slot(&r, empty, ivv, lb, rd)?;
                }
                let ys_conv = self.carried_out(body, &ys, &inits, span)?;
                if staged_any {
                    self.barrier()?;
                }
                ys_conv
            }
        };
        let next = self.cx.b.build_int_add(iv_last, step, "iv.next")?;
        let mut ring_next = Vec::new();
        for (rd, wr, ph, r) in &ring_phis {
            let size = self.cx.i32((r.slots * r.slot_bytes) as i64);
            let adv =
                |p: &inkwell::values::PhiValue<'ctx>| -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
                    let b = &self.cx.b;
                    let n = b.build_int_add(
                        p.as_basic_value().into_int_value(),
                        self.cx.i32(r.slot_bytes as i64),
                        "",
                    )?;
                    let wrap = b.build_int_compare(inkwell::IntPredicate::EQ, n, size, "")?;
                    Ok((
                        b.build_select(wrap, self.cx.i32(0), n, "")?
                            .into_int_value(),
                        wrap,
                    ))
                };
            let ((nr, wrap), (nw, _)) = (adv(rd)?, adv(wr)?);
            // The read slot's parity flips each time the ring wraps around.
            let b = &self.cx.b;
            let flip = b.build_xor(ph.as_basic_value().into_int_value(), self.cx.i32(1), "")?;
            let np = b
                .build_select(wrap, flip, ph.as_basic_value().into_int_value(), "")?
                .into_int_value();
            ring_next.push((nr, nw, np));
        }
        self.arch.loop_backedge(&self.cx)?;
        let latch = self.cx.cur_block();
        iv.add_incoming(&[(&next, latch)]);
        for ((rd, wr, ph, _), (nr, nw, np)) in ring_phis.iter().zip(&ring_next) {
            rd.add_incoming(&[(nr, latch)]);
            wr.add_incoming(&[(nw, latch)]);
            ph.add_incoming(&[(np, latch)]);
        }
        for (ps, y) in phis.iter().zip(&ys_conv) {
            for (p, r) in ps.iter().zip(&y.regs) {
                p.add_incoming(&[(r as &dyn BasicValue, latch)]);
            }
        }
        if let Some((rd, ph)) = cursor {
            // Where this tile's ring loop left the ring.
            let (r, p) = self.ring_cursor.take().ok_or_else(|| {
                LowerError::Llvm("a loop over tiles that lost its ring position".into())
            })?;
            rd.add_incoming(&[(&r, latch)]);
            ph.add_incoming(&[(&p, latch)]);
        }
        self.cx.b.build_unconditional_branch(header)?;
        let mut carried = carried;
        if dbuf.is_empty() {
            self.cx.b.position_at_end(exit);
        } else {
            // The unrolled loop's last odd-numbered iteration.
            self.cx.b.position_at_end(leave);
            carried = self.lower_tail(op, &inits, &dbuf, carried, (ivv, ive, ub), exit)?;
        }
        if walk.is_some() {
            self.pingpong = None;
        }
        if !rings.is_empty() {
            // The copies for iterations past the end land before anything else (TMA
            // copies past the end are never issued).
            if rings.iter().any(|(_, r)| r.tma < 2) {
                self.arch.cp_async_wait(&self.cx, 0)?;
            }
            for (d, r) in &rings {
                self.async_slots.borrow_mut().remove(&(*d as *const Op));
                self.tma_inited.borrow_mut().remove(&(*d as *const Op));
                // The last iteration's wgmma group, left in flight, completes.
                if let Some(j) = r.overlap
                    && let Some(t) = carried.get_mut(j - 1)
                {
                    *t = dot::wgmma::finish_in_flight(self, d, t)?;
                }
            }
            // A multicasting ring's producers wait for the release of every fill
            // (`spec.rs`), and a persistent kernel's producer refills the slot in
            // the next tile: the last iteration's slot, whose group was in flight,
            // is released now that it retired. A persistent kernel's next tile
            // reads the ring on from here.
            let (multicasts, outer) = self
                .plan
                .warp_spec
                .as_ref()
                .map_or((false, false), |w| (w.multicasts(), w.outer.is_some()));
            if let Some((dot, r, empty)) = spec
                && let Some((rd, _, ph, _)) = ring_phis
                    .iter()
                    .zip(&rings)
                    .find(|(_, (d, _))| std::ptr::eq(*d, dot))
                    .map(|(p, _)| p)
            {
                let rd = rd.as_basic_value().into_int_value();
                if outer {
                    self.ring_cursor = Some((rd, ph.as_basic_value().into_int_value()));
                    self.pass_turn()?;
                }
                if r.overlap.is_some() && (multicasts || outer) {
                    self.release_slot(&r, empty, ivv, lb, rd)?;
                }
            }
        }
        for (i, (r, t)) in op.results.iter().zip(carried).enumerate() {
            // A carried statistic keeps its parent after the loop (see
            // `reduce_hint`) when it kept the layout.
            if let Some(p) = body.args.get(i + 1).and_then(|a| self.parents.get(a))
                && self.plan.hints.get(&body.args[i + 1]) == Some(&t.layout)
            {
                self.parents.insert(*r, p.clone());
            }
            self.set(*r, t);
        }
        Ok(())
    }

    /// The values `ys` that `for` body `body` yields, as the next iteration takes
    /// them: in the layouts of `inits` (the loop's first), staged operands written
    /// into their `dot`'s arrays (the copy the next iteration reads), a ring's as
    /// they are.
    fn carried_out(
        &mut self,
        body: &Region,
        ys: &[Tile<'ctx>],
        inits: &[Tile<'ctx>],
        span: &Span,
    ) -> LResult<Vec<Tile<'ctx>>> {
        let mut out = Vec::new();
        for (j, (y, t)) in ys.iter().zip(inits).enumerate() {
            if body
                .args
                .get(j + 1)
                .is_some_and(|a| self.plan.async_args.contains(a))
            {
                out.push(y.clone());
                continue;
            }
            // The `dot` that read the staged tile ended at a barrier (or reads the
            // other copy): overwrite it.
            if let Some(s) =
                self.stage_carried(body.args.get(j + 1), y, "the next iteration's", true)?
            {
                out.push(s);
                continue;
            }
            out.push(self.convert(y, &t.layout, span)?);
        }
        Ok(out)
    }

    /// The body of `for` `op` whose `dot`s `dbuf` are double-buffered, unrolled by
    /// two: the loop runs while two
    /// iterations remain, the even one reading the first copy and writing the next
    /// iteration's tiles into the second, the odd one the other way round, each
    /// ending at the barrier after its writes (a last odd-numbered iteration runs
    /// after the loop, [`Self::lower_tail`]). Each copy's address is a constant in
    /// its body, so the fragment reads and staging stores keep their immediate
    /// offsets, and the loop has one exit. `iv` is the even iteration's induction
    /// variable (`ive` its type). Returns the values carried to the next trip and
    /// the odd iteration's induction variable.
    fn lower_unrolled(
        &mut self,
        op: &Op,
        inits: &[Tile<'ctx>],
        dbuf: &[*const Op],
        (iv, ive, step): (IntValue<'ctx>, tessera_ir::Elem, IntValue<'ctx>),
    ) -> LResult<(Vec<Tile<'ctx>>, IntValue<'ctx>)> {
        let body = &op.regions[0];
        self.note(|| {
            "unrolled by two: the loop's dots read two copies of their arrays in turn, one barrier an iteration".to_string()
        });
        let ys = self.lower_copy(op, inits, dbuf, true, false)?;
        let iv = self.cx.b.build_int_add(iv, step, "iv.odd")?;
        if let Some(&a) = body.args.first() {
            let t = self.scalar_tile(ive, iv.into());
            self.set(a, t);
        }
        for (a, t) in body.args.iter().skip(1).zip(&ys) {
            self.set(*a, t.clone());
        }
        let ys = self.lower_copy(op, inits, dbuf, false, true)?;
        Ok((ys, iv))
    }

    /// The body of `for` `op` reading the first copy of its double-buffered
    /// `dot`s' arrays (`first`) or the second, its values for the next iteration
    /// written or converted ([`Self::carried_out`]), then a barrier; `again`: the
    /// body lowered once already (no notes).
    fn lower_copy(
        &mut self,
        op: &Op,
        inits: &[Tile<'ctx>],
        dbuf: &[*const Op],
        first: bool,
        again: bool,
    ) -> LResult<Vec<Tile<'ctx>>> {
        for &d in dbuf {
            self.reads_second.insert(d, !first);
        }
        // The body's second and third copies are the same ops again: no notes.
        let was = self
            .copy_lowering
            .replace(again || self.copy_lowering.get());
        let ys = self.lower_region(&op.regions[0])?;
        self.restore_op(op);
        let ys = self.carried_out(&op.regions[0], &ys, inits, &op.span)?;
        self.barrier()?;
        self.copy_lowering.set(was);
        for d in dbuf {
            self.reads_second.remove(d);
        }
        Ok(ys)
    }

    /// After the loop of [`Self::lower_unrolled`] (positioned at `check`, where it
    /// leaves with `carried` at induction variable `iv`): the last iteration when
    /// their number is odd (it reads the first copy), then on to `exit`, where the
    /// loop's results are either. Returns them.
    #[allow(clippy::too_many_arguments)]
    fn lower_tail(
        &mut self,
        op: &Op,
        inits: &[Tile<'ctx>],
        dbuf: &[*const Op],
        carried: Vec<Tile<'ctx>>,
        (iv, ive, ub): (IntValue<'ctx>, tessera_ir::Elem, IntValue<'ctx>),
        exit: inkwell::basic_block::BasicBlock<'ctx>,
    ) -> LResult<Vec<Tile<'ctx>>> {
        let body = &op.regions[0];
        let tail = self.cx.ctx.append_basic_block(self.kernel, "for.tail");
        let c = self
            .cx
            .b
            .build_int_compare(inkwell::IntPredicate::SLT, iv, ub, "")?;
        let check = self.cx.cur_block();
        self.cx.b.build_conditional_branch(c, tail, exit)?;
        self.cx.b.position_at_end(tail);
        if let Some(&a) = body.args.first() {
            let t = self.scalar_tile(ive, iv.into());
            self.set(a, t);
        }
        for (a, t) in body.args.iter().skip(1).zip(&carried) {
            self.set(*a, t.clone());
        }
        let ys = self.lower_copy(op, inits, dbuf, true, true)?;
        let end = self.cx.cur_block();
        self.cx.b.build_unconditional_branch(exit)?;
        self.cx.b.position_at_end(exit);
        carried
            .iter()
            .zip(&ys)
            .map(|(c, y)| {
                let ps = self.phis(c)?;
                for ((p, x), e) in ps.iter().zip(&c.regs).zip(&y.regs) {
                    p.add_incoming(&[(x as &dyn BasicValue, check), (e as &dyn BasicValue, end)]);
                }
                Ok(self.phi_tile(c, &ps))
            })
            .collect()
    }

    /// When region argument `arg` is staged (the plan's `staging.rs`), writes `t` into
    /// its `dot`'s shared array (the caller adds the barrier) and returns the
    /// register-less tile that stands for it. `next`: `t` is the tile the next
    /// iteration reads, written into the copy of a double-buffered `dot`'s arrays
    /// that iteration reads ([`Self::pipe_copy`]).
    pub(super) fn stage_carried(
        &mut self,
        arg: Option<&ValueId>,
        t: &Tile<'ctx>,
        which_tile: &str,
        next: bool,
    ) -> LResult<Option<Tile<'ctx>>> {
        let Some(&(d, which)) = arg.and_then(|a| self.plan.staged.get(a)) else {
            return Ok(None);
        };
        let base = self
            .pipe_copy(d, next)
            .ok_or_else(|| LowerError::Llvm("a staged dot without arrays".into()))?;
        self.note(|| {
            format!(
                "{which_tile} operand {} of the loop's dot written into the dot's shared arrays",
                ["A", "B"][which]
            )
        });
        dot::stage_operand(self, d, which, t, base)?;
        Ok(Some(Tile {
            elem: t.elem,
            layout: t.layout.clone(),
            regs: Vec::new(),
            uniform: false,
        }))
    }

    pub(super) fn lower_if(&mut self, op: &Op) -> LResult<()> {
        let span = &op.span;
        let cond = self.val(op.operands[0])?.regs[0].into_int_value();
        let bt = self.cx.ctx.append_basic_block(self.kernel, "if.then");
        let be = self.cx.ctx.append_basic_block(self.kernel, "if.else");
        let bm = self.cx.ctx.append_basic_block(self.kernel, "if.end");
        self.cx.b.build_conditional_branch(cond, bt, be)?;
        self.cx.b.position_at_end(bt);
        let yt = self.lower_region(&op.regions[0])?;
        self.restore_op(op);
        let end_t = self.cx.cur_block();
        self.cx.b.build_unconditional_branch(bm)?;
        self.cx.b.position_at_end(be);
        let ye = self.lower_region(&op.regions[1])?;
        self.restore_op(op);
        let mut ye_conv = Vec::new();
        for (y, t) in ye.iter().zip(&yt) {
            ye_conv.push(self.convert(y, &t.layout, span)?);
        }
        let end_e = self.cx.cur_block();
        self.cx.b.build_unconditional_branch(bm)?;
        self.cx.b.position_at_end(bm);
        for ((r, t), e) in op.results.iter().zip(&yt).zip(&ye_conv) {
            let ps = self.phis(t)?;
            for ((p, a), b) in ps.iter().zip(&t.regs).zip(&e.regs) {
                p.add_incoming(&[(a as &dyn BasicValue, end_t), (b as &dyn BasicValue, end_e)]);
            }
            let tile = self.phi_tile(t, &ps);
            self.set(*r, tile);
        }
        Ok(())
    }

    pub(super) fn lower_while(&mut self, op: &Op) -> LResult<()> {
        let span = &op.span;
        let inits: Vec<Tile> = op
            .operands
            .iter()
            .map(|&v| self.val(v))
            .collect::<LResult<_>>()?;
        let pre = self.cx.cur_block();
        let header = self.cx.ctx.append_basic_block(self.kernel, "while.before");
        let after = self.cx.ctx.append_basic_block(self.kernel, "while.after");
        let exit = self.cx.ctx.append_basic_block(self.kernel, "while.exit");
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(header);
        let mut phis = Vec::new();
        for t in &inits {
            let ps = self.phis(t)?;
            for (p, r) in ps.iter().zip(&t.regs) {
                p.add_incoming(&[(r as &dyn BasicValue, pre)]);
            }
            phis.push(ps);
        }
        for ((a, t), ps) in op.regions[0].args.iter().zip(&inits).zip(&phis) {
            let tile = self.phi_tile(t, ps);
            self.set(*a, tile);
        }
        let cv = self.lower_region(&op.regions[0])?;
        self.restore_op(op);
        let Some((cond, fwd)) = cv.split_first() else {
            return unsupported(span, "a `while` whose before-region lacks a condition");
        };
        let site = self.new_site("while");
        let c = self
            .arch
            .loop_continue(&self.cx, cond.regs[0].into_int_value(), site)?;
        self.cx.b.build_conditional_branch(c, after, exit)?;
        self.cx.b.position_at_end(after);
        for (a, t) in op.regions[1].args.iter().zip(fwd) {
            self.set(*a, t.clone());
        }
        let ys = self.lower_region(&op.regions[1])?;
        self.restore_op(op);
        let mut ys_conv = Vec::new();
        for (y, t) in ys.iter().zip(&inits) {
            ys_conv.push(self.convert(y, &t.layout, span)?);
        }
        self.arch.loop_backedge(&self.cx)?;
        let latch = self.cx.cur_block();
        for (ps, y) in phis.iter().zip(&ys_conv) {
            for (p, r) in ps.iter().zip(&y.regs) {
                p.add_incoming(&[(r as &dyn BasicValue, latch)]);
            }
        }
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(exit);
        for (r, t) in op.results.iter().zip(fwd) {
            self.set(*r, t.clone());
        }
        Ok(())
    }
}

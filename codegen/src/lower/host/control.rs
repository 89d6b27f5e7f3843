//! Control flow on the host: `for`, `while` and `if` as loops and blocks, with the
//! loop-carried values in carrier slots, and the watchdog's poll in long loops.

use super::*;

impl<'a, 'ctx> H<'a, 'ctx> {
    /// A slot holding a loop-carried or branch-merged value of `v`'s type: a scalar
    /// slot (promoted to registers by LLVM) for 0-d values, a tile slot otherwise.
    pub(super) fn carrier(&mut self, v: ValueId) -> LResult<(PointerValue<'ctx>, bool)> {
        let e = self.elem(v);
        if self.f.ty(v).shape.is_empty() {
            let p = crate::lower::entry_alloca(&self.cx, self.lty(e), "carried")?;
            Ok((p, false))
        } else {
            let n = self.numel(v);
            Ok((self.slot(e, n)?, true))
        }
    }

    /// Writes `vals` (typed like `tys`) into the carriers, through temporaries where a
    /// value reads another carrier (a swap): every value is read before any carrier
    /// is written.
    pub(super) fn fill_carriers(
        &mut self,
        carriers: &[(PointerValue<'ctx>, bool)],
        tys: &[ValueId],
        vals: &[V<'ctx>],
    ) -> LResult<()> {
        let mut staged: Vec<V<'ctx>> = Vec::with_capacity(vals.len());
        for (k, &v) in vals.iter().enumerate() {
            let reads: Vec<PointerValue<'ctx>> = match v {
                V::T(p) => vec![p],
                V::F(f) => self.fused[f].reads.clone(),
                _ => Vec::new(),
            };
            let aliased = carriers
                .iter()
                .enumerate()
                .any(|(j, c)| j != k && c.1 && reads.contains(&c.0));
            if aliased {
                staged.push(self.staged(v, tys[k])?);
            } else {
                staged.push(v);
            }
        }
        for (k, v) in staged.into_iter().enumerate() {
            let (p, tile) = carriers[k];
            let e = self.elem(tys[k]);
            if tile {
                if matches!(v, V::T(q) if q == p) {
                    continue;
                }
                self.copy_tile(p, v, tys[k])?;
            } else {
                let x = self.get(v, e, self.i64(0))?;
                self.cx.b.build_store(p, x)?;
            }
        }
        Ok(())
    }

    /// `v` (typed like `ty`) copied into a fresh slot.
    pub(super) fn staged(&mut self, v: V<'ctx>, ty: ValueId) -> LResult<V<'ctx>> {
        if matches!(v, V::U(_)) {
            return Ok(v);
        }
        let tmp = self.slot(self.elem(ty), self.numel(ty))?;
        self.copy_tile(tmp, v, ty)?;
        Ok(V::T(tmp))
    }

    /// Writes every element of `v` (typed like `ty`) to slot `dst`: a fused value by
    /// runs along the last dimension where it divides into them (see [`Self::lanes`]).
    pub(super) fn copy_tile(
        &mut self,
        dst: PointerValue<'ctx>,
        v: V<'ctx>,
        ty: ValueId,
    ) -> LResult<()> {
        let e = self.elem(ty);
        let shape = self.shape(ty);
        let rm = row_major(&shape);
        let last = shape.last().copied().unwrap_or(0);
        let w: u32 = if last % 16 == 0 { 16 } else { 8 };
        if matches!(v, V::F(_))
            && matches!(e, Elem::Scalar(s) if s != ScalarType::I1)
            && last > 0
            && last % w as u64 == 0
        {
            let r = shape.len();
            let mut outer = shape.clone();
            outer[r - 1] = last / w as u64;
            let lt = self.lty(e);
            return self.versioned(&shape, None, Some(v), &mut |h, _| {
                h.nest(&outer, &mut |h, idx| {
                    let mut full = idx.to_vec();
                    full[r - 1] = h.cx.b.build_int_mul(idx[r - 1], h.i64(w as u64), "")?;
                    let lin0 = h.linear(&full, &rm)?;
                    let x = h.lanes(v, e, &full, lin0, w)?;
                    let st = h.cx.b.build_store(h.gep(lt, dst, lin0)?, x)?;
                    let _ = st.set_alignment(elem_bytes(e) as u32);
                    Ok(())
                })
            });
        }
        self.nest(&shape, &mut |h, idx| {
            let i = h.linear(idx, &rm)?;
            let x = h.get_at(v, e, idx, i)?;
            h.put(dst, e, i, x)
        })
    }

    pub(super) fn carried_value(
        &self,
        c: (PointerValue<'ctx>, bool),
        v: ValueId,
    ) -> LResult<V<'ctx>> {
        if c.1 {
            Ok(V::T(c.0))
        } else {
            Ok(V::U(self.cx.b.build_load(
                self.lty(self.elem(v)),
                c.0,
                "",
            )?))
        }
    }

    pub(super) fn for_op(&mut self, op: &Op) -> LResult<()> {
        if op.operands.len() < 3 || op.regions.len() != 1 {
            return unsupported(op, "without bounds and a body");
        }
        let body = &op.regions[0];
        let Some((&iv_arg, iter_args)) = body.args.split_first() else {
            return unsupported(op, "without an induction variable");
        };
        let ity = self.lty(self.elem(op.operands[0])).into_int_type();
        let signed = self
            .elem(op.operands[0])
            .scalar()
            .is_none_or(|s| s.is_signed_int());
        let bound = |h: &mut Self, k: usize| -> LResult<IntValue<'ctx>> {
            let v = h.val(op.operands[k])?;
            let x = h.get(v, h.elem(op.operands[k]), h.i64(0))?.into_int_value();
            Ok(h.cx.b.build_int_cast_sign_flag(x, ity, signed, "")?)
        };
        let (lb, ub, step) = (bound(self, 0)?, bound(self, 1)?, bound(self, 2)?);
        let site = self.site(op, SiteKind::Step, Vec::new());
        let pos = self
            .cx
            .b
            .build_int_compare(IntPredicate::SGT, step, ity.const_zero(), "")?;
        let step64 = self
            .cx
            .b
            .build_int_s_extend_or_bit_cast(step, self.cx.ctx.i64_type(), "")?;
        self.check(pos, site, self.i64(0), step64)?;
        let carriers: Vec<_> = iter_args
            .iter()
            .map(|&a| self.carrier(a))
            .collect::<LResult<_>>()?;
        let inits: Vec<V<'ctx>> = op.operands[3..]
            .iter()
            .map(|&v| self.val(v))
            .collect::<LResult<_>>()?;
        self.fill_carriers(&carriers, iter_args, &inits)?;
        let pre = self.here()?;
        let head = self.block("for");
        let body_bb = self.block("body");
        let exit = self.block("endfor");
        self.cx.b.build_unconditional_branch(head)?;
        self.cx.b.position_at_end(head);
        let phi = self.cx.b.build_phi(ity, "iv")?;
        phi.add_incoming(&[(&lb, pre)]);
        let iv = phi.as_basic_value().into_int_value();
        let pred = if signed {
            IntPredicate::SLT
        } else {
            IntPredicate::ULT
        };
        let go = self.cx.b.build_int_compare(pred, iv, ub, "")?;
        self.cx.b.build_conditional_branch(go, body_bb, exit)?;
        self.cx.b.position_at_end(body_bb);
        self.poll(site)?;
        self.vals.insert(iv_arg, V::U(iv.into()));
        for (k, &a) in iter_args.iter().enumerate() {
            let v = self.carried_value(carriers[k], a)?;
            self.vals.insert(a, v);
        }
        let ys = self.region(body)?;
        if ys.len() != iter_args.len() {
            return unsupported(op, "whose body yields the wrong number of values");
        }
        self.fill_carriers(&carriers, iter_args, &ys)?;
        let next = self.cx.b.build_int_add(iv, step, "")?;
        // Past the type's end the loop is over (the interpreter counts in i64).
        let no_wrap = self.cx.b.build_int_compare(pred, iv, next, "")?;
        let latch = self.here()?;
        phi.add_incoming(&[(&next, latch)]);
        self.cx.b.build_conditional_branch(no_wrap, head, exit)?;
        self.cx.b.position_at_end(exit);
        for (k, &r) in op.results.iter().enumerate() {
            let Some(&c) = carriers.get(k) else {
                return unsupported(op, "with more results than carried values");
            };
            let v = self.carried_value(c, iter_args[k])?;
            self.vals.insert(r, v);
        }
        Ok(())
    }

    /// The watchdog, once per iteration of a `for` or `while` loop: the runtime's
    /// `__tessera_cpu_poll(err)` returns 1 once the launch's deadline has passed, and
    /// the kernel fails at `site` (lane `u64::MAX` marks the timeout).
    pub(super) fn poll(&mut self, site: usize) -> LResult<()> {
        let ctx = self.cx.ctx;
        let ptr = ctx.ptr_type(AddressSpace::default());
        let f = self.cx.module.get_function(POLL).unwrap_or_else(|| {
            self.cx.module.add_function(
                POLL,
                ctx.i32_type().fn_type(&[ptr.into()], false),
                Some(inkwell::module::Linkage::External),
            )
        });
        let rc = self
            .cx
            .b
            .build_call(f, &[self.err.into()], "")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| LowerError::Llvm("poll returns nothing".into()))?
            .into_int_value();
        let ok =
            self.cx
                .b
                .build_int_compare(IntPredicate::EQ, rc, ctx.i32_type().const_zero(), "")?;
        self.check(ok, site, self.i64(u64::MAX), self.i64(0))
    }

    pub(super) fn while_op(&mut self, op: &Op) -> LResult<()> {
        if op.regions.len() != 2 {
            return unsupported(op, "without two regions");
        }
        let (before, after) = (&op.regions[0], &op.regions[1]);
        if before.args.len() != op.operands.len() || after.args.len() != op.results.len() {
            return unsupported(op, "whose regions take the wrong number of values");
        }
        let site = self.site(op, SiteKind::Loop, Vec::new());
        let carried: Vec<_> = before
            .args
            .iter()
            .map(|&a| self.carrier(a))
            .collect::<LResult<_>>()?;
        let forwarded: Vec<_> = op
            .results
            .iter()
            .map(|&r| self.carrier(r))
            .collect::<LResult<_>>()?;
        let inits: Vec<V<'ctx>> = op
            .operands
            .iter()
            .map(|&v| self.val(v))
            .collect::<LResult<_>>()?;
        self.fill_carriers(&carried, &before.args, &inits)?;
        let (head, body, exit) = (
            self.block("while"),
            self.block("do"),
            self.block("endwhile"),
        );
        self.cx.b.build_unconditional_branch(head)?;
        self.cx.b.position_at_end(head);
        self.poll(site)?;
        for (k, &a) in before.args.iter().enumerate() {
            let v = self.carried_value(carried[k], a)?;
            self.vals.insert(a, v);
        }
        let t = self.region(before)?;
        let Some((&c, fwd)) = t.split_first() else {
            return unsupported(op, "whose first region does not end in `condition`");
        };
        if fwd.len() != op.results.len() {
            return unsupported(op, "that forwards the wrong number of values");
        }
        let c = self
            .get(c, Elem::Scalar(ScalarType::I1), self.i64(0))?
            .into_int_value();
        self.fill_carriers(&forwarded, &op.results, fwd)?;
        self.cx.b.build_conditional_branch(c, body, exit)?;
        self.cx.b.position_at_end(body);
        for (k, &a) in after.args.iter().enumerate() {
            let v = self.carried_value(forwarded[k], a)?;
            self.vals.insert(a, v);
        }
        let ys = self.region(after)?;
        if ys.len() != before.args.len() {
            return unsupported(op, "whose second region yields the wrong number of values");
        }
        self.fill_carriers(&carried, &before.args, &ys)?;
        self.cx.b.build_unconditional_branch(head)?;
        self.cx.b.position_at_end(exit);
        for (k, &r) in op.results.iter().enumerate() {
            let v = self.carried_value(forwarded[k], r)?;
            self.vals.insert(r, v);
        }
        Ok(())
    }

    pub(super) fn if_op(&mut self, op: &Op) -> LResult<()> {
        if op.regions.len() != 2 {
            return unsupported(op, "without two regions");
        }
        let c = self.val(op.operands[0])?;
        let c = self
            .get(c, Elem::Scalar(ScalarType::I1), self.i64(0))?
            .into_int_value();
        let carriers: Vec<_> = op
            .results
            .iter()
            .map(|&r| self.carrier(r))
            .collect::<LResult<_>>()?;
        let (then_bb, else_bb, join) =
            (self.block("then"), self.block("else"), self.block("endif"));
        self.cx.b.build_conditional_branch(c, then_bb, else_bb)?;
        for (r, bb) in op.regions.iter().zip([then_bb, else_bb]) {
            self.cx.b.position_at_end(bb);
            let ys = self.region(r)?;
            if ys.len() != op.results.len() {
                return unsupported(op, "whose regions yield the wrong number of values");
            }
            self.fill_carriers(&carriers, &op.results, &ys)?;
            self.cx.b.build_unconditional_branch(join)?;
        }
        self.cx.b.position_at_end(join);
        for (k, &r) in op.results.iter().enumerate() {
            let v = self.carried_value(carriers[k], r)?;
            self.vals.insert(r, v);
        }
        Ok(())
    }
}

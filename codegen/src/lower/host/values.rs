//! Value forms: how a tile is held (a scalar, an affine base and strides, a slot of
//! scratch, or fused into its user) and how an element of each is read; the
//! elementwise ops and the views (`expand_dims`, `broadcast`, `reshape`, ...) that
//! change a form without copying.

use super::*;

impl<'a, 'ctx> H<'a, 'ctx> {
    /// `v` seen through shape op `op` (`expand_dims`, `reshape`, `hint`, `broadcast`,
    /// `permute`) without copying it, where that is possible: a uniform value as it
    /// is, an affine tile with new strides, a fused elementwise tree with each input
    /// seen the same way if it reads no memory (so a mask built from indices stays a
    /// few instructions per element through broadcasts), and a materialized tile
    /// through the ops that keep
    /// its row-major order. `None`: it must be materialized first.
    pub(super) fn view(&mut self, v: V<'ctx>, op: &Op) -> LResult<Option<V<'ctx>>> {
        let keeps_order = matches!(
            op.kind,
            OpKind::ExpandDims { .. } | OpKind::Reshape | OpKind::Hint { .. }
        ) || (op.kind == OpKind::Broadcast
            && self.numel(op.operands[0]) == self.numel(op.results[0]));
        match v {
            V::U(_) => Ok(Some(v)),
            V::T(_) => Ok(keeps_order.then_some(v)),
            V::A(k) => self.affine_view(k, op).map(Some),
            // Only trees over indices and uniforms: those are cheap to recompute by
            // every user (a view may have several), and read no memory.
            V::F(k) if self.fused[k].reads.is_empty() && !self.has_load(k) => {
                let mut ins = Vec::with_capacity(self.fused[k].ins.len());
                for i in 0..self.fused[k].ins.len() {
                    match self.view(self.fused[k].ins[i], op)? {
                        Some(x) => ins.push(x),
                        None => return Ok(None),
                    }
                }
                let fu = &self.fused[k];
                let f = Fused {
                    op: fu.op.clone(),
                    ins,
                    cost: fu.cost,
                    reads: fu.reads.clone(),
                    site: None,
                    prov: Prov::Unset,
                };
                self.fused.push(f);
                Ok(Some(V::F(self.fused.len() - 1)))
            }
            V::F(_) => Ok(None),
        }
    }

    /// Whether fused tree `fused[k]` holds a load.
    pub(super) fn has_load(&self, k: usize) -> bool {
        matches!(self.fused[k].op.kind, OpKind::Load { .. })
            || self.fused[k]
                .ins
                .iter()
                .any(|v| matches!(*v, V::F(j) if self.has_load(j)))
    }

    /// Affine tile `aff[k]` through shape op `op`.
    pub(super) fn affine_view(&mut self, k: usize, op: &Op) -> LResult<V<'ctx>> {
        match &op.kind {
            OpKind::Broadcast | OpKind::Permute { .. } => {
                let src = self.shape(op.operands[0]);
                let dst = self.shape(op.results[0]);
                let st = self.aff[k].strides.clone();
                let zero = st[0].get_type().const_zero();
                let strides = match &op.kind {
                    OpKind::Permute { order } if order.len() == st.len() => {
                        order.iter().map(|&o| st[o as usize]).collect()
                    }
                    OpKind::Permute { .. } => return unsupported(op, "with a bad order"),
                    _ => (0..st.len())
                        .map(|d| {
                            if src[d] == 1 && dst[d] != 1 {
                                zero
                            } else {
                                st[d]
                            }
                        })
                        .collect(),
                };
                let base = self.aff[k].base;
                Ok(self.affine(base, strides))
            }
            _ => self.reshaped(k, op),
        }
    }

    /// An affine tile through `expand_dims`, `reshape` or `hint`: the same strides
    /// for the dimensions that are not 1, zero for the others; materialized where a
    /// reshape moves elements between dimensions.
    pub(super) fn reshaped(&mut self, k: usize, op: &Op) -> LResult<V<'ctx>> {
        let src = self.shape(op.operands[0]);
        let dst = self.shape(op.results[0]);
        let big = |s: &[u64]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        if big(&src) != big(&dst) {
            return self.mat_v(V::A(k), op.operands[0]);
        }
        let st = self.aff[k].strides.clone();
        let zero = st[0].get_type().const_zero();
        let mut kept = src
            .iter()
            .zip(&st)
            .filter(|(d, _)| **d != 1)
            .map(|(_, s)| *s);
        let strides = dst
            .iter()
            .map(|&d| {
                if d == 1 {
                    zero
                } else {
                    kept.next().unwrap_or(zero)
                }
            })
            .collect();
        let base = self.aff[k].base;
        Ok(self.affine(base, strides))
    }

    /// `op` on affine and uniform operands, when the result is affine too: integer
    /// `+`, `-`, `*` (by a uniform), and `addptr`.
    pub(super) fn affine_op(&mut self, op: &Op, ins: &[V<'ctx>]) -> LResult<Option<V<'ctx>>> {
        if !ins.iter().any(|v| matches!(v, V::A(_)))
            || !ins.iter().all(|v| matches!(v, V::A(_) | V::U(_)))
        {
            return Ok(None);
        }
        let rank = self.shape(op.results[0]).len();
        let int = |e: Elem| {
            e.scalar()
                .is_some_and(|s| s.is_int() && s != ScalarType::I1)
        };
        // (base, strides) of an operand, uniform ones with zero strides.
        let parts = |h: &Self, v: V<'ctx>, zero: IntValue<'ctx>| match v {
            V::A(k) => (h.aff[k].base, h.aff[k].strides.clone()),
            V::U(x) => (x, vec![zero; rank]),
            V::T(_) | V::F(_) => unreachable!("checked above"),
        };
        let b = &self.cx.b;
        match op.kind {
            OpKind::Binary(bop @ (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul))
                if int(self.elem(op.results[0])) =>
            {
                let t = self.lty(self.elem(op.results[0])).into_int_type();
                let (x, xs) = parts(self, ins[0], t.const_zero());
                let (y, ys) = parts(self, ins[1], t.const_zero());
                let (x, y) = (x.into_int_value(), y.into_int_value());
                let (base, strides) = match bop {
                    BinaryOp::Add => (
                        b.build_int_add(x, y, "")?,
                        xs.iter()
                            .zip(&ys)
                            .map(|(&p, &q)| b.build_int_add(p, q, ""))
                            .collect::<Result<_, _>>()?,
                    ),
                    BinaryOp::Sub => (
                        b.build_int_sub(x, y, "")?,
                        xs.iter()
                            .zip(&ys)
                            .map(|(&p, &q)| b.build_int_sub(p, q, ""))
                            .collect::<Result<_, _>>()?,
                    ),
                    _ => match (ins[0], ins[1]) {
                        (V::A(_), V::U(_)) => (
                            b.build_int_mul(x, y, "")?,
                            xs.iter()
                                .map(|&p| b.build_int_mul(p, y, ""))
                                .collect::<Result<_, _>>()?,
                        ),
                        (V::U(_), V::A(_)) => (
                            b.build_int_mul(x, y, "")?,
                            ys.iter()
                                .map(|&q| b.build_int_mul(x, q, ""))
                                .collect::<Result<_, _>>()?,
                        ),
                        _ => return Ok(None),
                    },
                };
                Ok(Some(self.affine(base.into(), strides)))
            }
            OpKind::AddPtr => {
                let (Elem::Ptr { pointee, .. }, Some(os)) = (
                    self.elem(op.operands[0]),
                    self.elem(op.operands[1]).scalar(),
                ) else {
                    return Ok(None);
                };
                let i64t = self.cx.ctx.i64_type();
                let (p, ps) = parts(self, ins[0], i64t.const_zero());
                let (o, ost) = parts(
                    self,
                    ins[1],
                    self.lty(Elem::Scalar(os)).into_int_type().const_zero(),
                );
                let signed = os.is_signed_int();
                let o = b.build_int_cast_sign_flag(o.into_int_value(), i64t, signed, "")?;
                let ty = self.lty(Elem::Scalar(pointee));
                // SAFETY (generated code): address arithmetic, checked at the access.
                let base = unsafe { b.build_gep(ty, p.into_pointer_value(), &[o], "") }?;
                let strides = ps
                    .iter()
                    .zip(&ost)
                    .map(|(&p, &q)| {
                        let q = b.build_int_cast_sign_flag(q, i64t, signed, "")?;
                        b.build_int_add(p, q, "")
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Some(self.affine(base.into(), strides)))
            }
            _ => Ok(None),
        }
    }

    pub(super) fn elementwise(&mut self, op: &Op) -> LResult<()> {
        let ins: Vec<V<'ctx>> = op
            .operands
            .iter()
            .map(|&v| self.val(v))
            .collect::<LResult<_>>()?;
        if let Some(v) = self.affine_op(op, &ins)? {
            self.set(op, v);
            return Ok(());
        }
        let res_e = self.elem(op.results[0]);
        let in_e = self.elem(op.operands[if op.kind == OpKind::Select { 1 } else { 0 }]);
        if matches!(
            op.kind,
            OpKind::Cmp(_)
                | OpKind::Cast
                | OpKind::Bitcast
                | OpKind::Unary(_)
                | OpKind::Binary(_)
                | OpKind::Fma
        ) && in_e.scalar().is_none()
        {
            return unsupported(op, "on pointers");
        }
        let s_in = in_e.scalar().unwrap_or(ScalarType::I64);
        let div = matches!(op.kind, OpKind::Binary(BinaryOp::Div | BinaryOp::Rem)) && s_in.is_int();
        let div_site = div.then(|| {
            let shape = self.f.ty(op.results[0]).shape.clone();
            self.site(op, SiteKind::DivZero, shape)
        });
        if ins.iter().all(|v| matches!(v, V::U(_))) {
            let v = self.one(op, &ins, div_site, &[], self.i64(0))?;
            self.set(op, V::U(v));
            return Ok(());
        }
        // Fused (computed where it is read): an op with one user in its region, or a
        // comparison of affine and uniform values (a mask, one instruction to redo).
        let index_only =
            matches!(op.kind, OpKind::Cmp(_)) && ins.iter().all(|v| matches!(v, V::A(_) | V::U(_)));
        if div_site.is_none() && op.kind != OpKind::AddPtr {
            let k = self.push_fused(op, ins, None, Prov::Unset);
            let v = V::F(k);
            let fused = (index_only || self.fusible[op.results[0].index()])
                && self.fused[k].cost <= FUSE_COST;
            // Otherwise materialized here, by vector runs where they fit ([`Self::lanes`]).
            let v = if fused {
                v
            } else {
                self.mat_v(v, op.results[0])?
            };
            self.set(op, v);
            return Ok(());
        }
        let shape = self.shape(op.results[0]);
        let out = self.slot(res_e, shape.iter().product())?;
        let rm = row_major(&shape);
        self.nest(&shape, &mut |h, idx| {
            let i = h.linear(idx, &rm)?;
            let v = h.one(op, &ins, div_site, idx, i)?;
            h.put(out, res_e, i, v)
        })?;
        self.set(op, V::T(out));
        Ok(())
    }

    /// Records `op` over `ins` as fused value `fused[k]` and returns `k` (a load: with
    /// its check site and buffer).
    pub(super) fn push_fused(
        &mut self,
        op: &Op,
        ins: Vec<V<'ctx>>,
        site: Option<usize>,
        prov: Prov,
    ) -> usize {
        let mut cost = 1;
        let mut reads = Vec::new();
        for v in &ins {
            match *v {
                V::T(p) => reads.push(p),
                V::F(k) => {
                    cost += self.fused[k].cost;
                    reads.extend_from_slice(&self.fused[k].reads);
                }
                _ => {}
            }
        }
        self.fused.push(Fused {
            op: Op {
                regions: Vec::new(),
                ..op.clone()
            },
            ins,
            cost,
            reads,
            site,
            prov,
        });
        self.fused.len() - 1
    }

    /// Element `idx` (row-major `i`) of elementwise `op` over `ins`, checking an
    /// integer divisor against zero at `div_site`.
    pub(super) fn one(
        &mut self,
        op: &Op,
        ins: &[V<'ctx>],
        div_site: Option<usize>,
        idx: &[IntValue<'ctx>],
        i: IntValue<'ctx>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let args: Vec<BasicValueEnum<'ctx>> = ins
            .iter()
            .zip(&op.operands)
            .map(|(&v, &id)| self.get_at(v, self.elem(id), idx, i))
            .collect::<LResult<_>>()?;
        if let Some(site) = div_site {
            let y = args[1].into_int_value();
            let ok =
                self.cx
                    .b
                    .build_int_compare(IntPredicate::NE, y, y.get_type().const_zero(), "")?;
            self.check(ok, site, i, self.i64(0))?;
        }
        self.apply(op, &args)
    }

    /// Elementwise `op` on one element of each operand, `args`.
    pub(super) fn apply(
        &self,
        op: &Op,
        args: &[BasicValueEnum<'ctx>],
    ) -> LResult<BasicValueEnum<'ctx>> {
        let res_e = self.elem(op.results[0]);
        let in_e = self.elem(op.operands[if op.kind == OpKind::Select { 1 } else { 0 }]);
        let s_in = in_e.scalar().unwrap_or(ScalarType::I64);
        let s_out = res_e.scalar().unwrap_or(ScalarType::I64);
        let cx = &self.cx;
        Ok(match &op.kind {
            OpKind::Binary(BinaryOp::Pow) => {
                elementwise::pow(cx, &self.arch, s_in, args[0], args[1], &op.span)?
            }
            OpKind::Binary(bop) => elementwise::binary(cx, *bop, s_in, args[0], args[1])?,
            // exp and log in plain arithmetic, which vectorizes (a libm call per
            // element would not); the other functions as the SIMT lowering's.
            OpKind::Unary(u @ (UnaryOp::Exp | UnaryOp::Exp2))
                if matches!(s_in, ScalarType::F32 | ScalarType::F16 | ScalarType::BF16) =>
            {
                elementwise::exp_poly(cx, s_in, args[0], *u == UnaryOp::Exp2)?
            }
            OpKind::Unary(u @ (UnaryOp::Log | UnaryOp::Log2))
                if matches!(s_in, ScalarType::F32 | ScalarType::F16 | ScalarType::BF16) =>
            {
                elementwise::log_poly(cx, s_in, args[0], *u == UnaryOp::Log2)?
            }
            OpKind::Unary(u) => elementwise::unary(cx, &self.arch, *u, s_in, args[0], &op.span)?,
            OpKind::Fma => elementwise::fma(cx, s_in, args)?,
            OpKind::Cmp(p) => elementwise::cmp(cx, *p, s_in, args[0], args[1])?,
            OpKind::Select => {
                cx.b.build_select(args[0].into_int_value(), args[1], args[2], "")?
            }
            OpKind::Cast => elementwise::cast(cx, s_in, s_out, args[0])?,
            OpKind::Bitcast => cx.b.build_bit_cast(args[0], self.lty(res_e), "")?,
            OpKind::AddPtr => {
                let Elem::Ptr { pointee, .. } = self.elem(op.operands[0]) else {
                    return unsupported(op, "on a non-pointer");
                };
                let off = args[1].into_int_value();
                let signed = self
                    .elem(op.operands[1])
                    .scalar()
                    .is_none_or(|s| s.is_signed_int());
                let off =
                    cx.b.build_int_cast_sign_flag(off, cx.ctx.i64_type(), signed, "")?;
                let ty = self.lty(Elem::Scalar(pointee));
                // SAFETY (generated code): plain address arithmetic; accesses
                // are checked where they happen.
                unsafe { cx.b.build_gep(ty, args[0].into_pointer_value(), &[off], "") }?.into()
            }
            _ => return unsupported(op, "is not elementwise"),
        })
    }

    /// Materializes `v` (a tile of `n` elements of `from`) as a tile of `to` in a
    /// fresh slot (once per tile: `dot` converts its operands before the products).
    pub(super) fn converted(
        &mut self,
        v: V<'ctx>,
        from: ScalarType,
        to: ScalarType,
        n: u64,
    ) -> LResult<PointerValue<'ctx>> {
        if let (V::T(p), true) = (v, from == to) {
            return Ok(p);
        }
        let out = self.slot(Elem::Scalar(to), n)?;
        self.counted(n, &mut |h, i| {
            let x = h.get(v, Elem::Scalar(from), i)?;
            let y = elementwise::cast(&h.cx, from, to, x)?;
            h.put(out, Elem::Scalar(to), i, y)
        })?;
        Ok(out)
    }
}

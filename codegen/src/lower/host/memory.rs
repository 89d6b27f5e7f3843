//! Loads and stores: bounds checks against the accessed buffers (per access, per
//! run of lanes, or once per tile where the extent is known), masked and chunked
//! loops, and the unit-stride versions LLVM vectorizes.

use super::*;

impl<'a, 'ctx> H<'a, 'ctx> {
    /// Whether a pointer of provenance `prov` may point into a peer's memory.
    pub(super) fn reaches_peers(&self, prov: Prov) -> bool {
        match prov {
            Prov::Remote(_) => true,
            Prov::Mixed | Prov::Unset => self.remote,
            Prov::Param(_) => false,
        }
    }

    /// With checks on: `addr` must lie inside the buffer its pointer came from
    /// (for a pointer that may reach a peer: inside some rank's copy of it, which
    /// the runtime's [`CHECK`] knows).
    pub(super) fn check_access(
        &self,
        site: usize,
        prov: Prov,
        addr: PointerValue<'ctx>,
        esize: u64,
        lane: IntValue<'ctx>,
    ) -> LResult<()> {
        let (ok, index) = self.in_bounds(prov, addr, esize)?;
        self.check(ok, site, lane, index)
    }

    /// Whether the `esize` bytes at `addr` lie inside the buffer of provenance `prov`
    /// (for a pointer that may reach a peer: inside some rank's copy of it, which the
    /// runtime's [`CHECK`] knows), and the element index of `addr` in it.
    pub(super) fn in_bounds(
        &self,
        prov: Prov,
        addr: PointerValue<'ctx>,
        esize: u64,
    ) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
        let b = &self.cx.b;
        let i64t = self.cx.ctx.i64_type();
        let a = b.build_ptr_to_int(addr, i64t, "")?;
        if self.reaches_peers(prov) {
            let k = param_of(prov).map_or(-1i64, |k| k as i64);
            let f = self.runtime_fn(CHECK, i64t.into(), &[i64t.into(); 3])?;
            let off = b
                .build_call(
                    f,
                    &[self.i64(k as u64).into(), a.into(), self.i64(esize).into()],
                    "",
                )?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| LowerError::Llvm("check returns nothing".into()))?
                .into_int_value();
            let ok = b.build_int_compare(IntPredicate::EQ, off, self.i64(i64::MIN as u64), "")?;
            let index = b.build_int_signed_div(off, self.i64(esize), "")?;
            return Ok((ok, index));
        }
        let params: Vec<usize> = match prov {
            Prov::Param(k) => vec![k],
            _ => (0..self.f.params.len())
                .filter(|&k| matches!(self.f.ty(self.f.params[k].value).elem, Elem::Ptr { .. }))
                .collect(),
        };
        let mut ok = self.cx.ctx.bool_type().const_zero();
        let mut first_off = None;
        for k in params {
            let b = &self.cx.b;
            let (base, len) = self.extent(k)?;
            let off = b.build_int_sub(a, base, "")?;
            let lim = b.build_int_sub(len, self.i64(esize), "")?;
            let lo = b.build_int_compare(IntPredicate::SGE, off, self.i64(0), "")?;
            let hi = b.build_int_compare(IntPredicate::SLE, off, lim, "")?;
            let inb = b.build_and(lo, hi, "")?;
            ok = b.build_or(ok, inb, "")?;
            first_off.get_or_insert(off);
        }
        let index = match first_off {
            Some(off) => self.cx.b.build_int_signed_div(off, self.i64(esize), "")?,
            None => self.i64(0),
        };
        Ok((ok, index))
    }

    /// Whether the `w` elements of `esize` bytes from `addr` (one vector access) lie
    /// inside the buffer of provenance `prov`: the bytes the access touches (not the
    /// addresses the lanes' own offsets give, which an index overflow could leave
    /// apart), tested as one range, so a run costs a subtraction and a comparison
    /// (the buffer's base and bounds are loop-invariant), not `w` checks. The result
    /// is marked likely: a run that fails takes the lane-by-lane path, whose checks
    /// report the first element outside, as the interpreter does.
    pub(super) fn run_in_bounds(
        &self,
        prov: Prov,
        addr: PointerValue<'ctx>,
        esize: u64,
        w: u32,
    ) -> LResult<IntValue<'ctx>> {
        let b = &self.cx.b;
        let bytes = w as u64 * esize;
        let ok = match prov {
            Prov::Param(k) if !self.reaches_peers(prov) => {
                let i64t = self.cx.ctx.i64_type();
                let a = b.build_ptr_to_int(addr, i64t, "")?;
                let (base, len) = self.extent(k)?;
                // off in [0, len - bytes]: `lim >= 0` and `off <= lim` unsigned (a
                // negative `off` is a huge unsigned one).
                let off = b.build_int_sub(a, base, "")?;
                let lim = b.build_int_sub(len, self.i64(bytes), "")?;
                let fits = b.build_int_compare(IntPredicate::SGE, lim, self.i64(0), "")?;
                let inside = b.build_int_compare(IntPredicate::ULE, off, lim, "")?;
                b.build_and(fits, inside, "")?
            }
            _ => {
                let (first, _) = self.in_bounds(prov, addr, esize)?;
                let i8t = self.cx.ctx.i8_type().into();
                let last = self.gep(i8t, addr, self.i64(bytes - esize))?;
                let (last, _) = self.in_bounds(prov, last, esize)?;
                b.build_and(first, last, "")?
            }
        };
        self.likely(ok)
    }

    /// With checks on: the lanes of the run of `mask.len()` elements of `esize`
    /// bytes from `addr` (row-major elements from `lin0`) where `mask` holds lie
    /// inside parameter `param`'s buffer, tested by one vector comparison; the first
    /// lane outside fails the kernel at `site` with its own index.
    pub(super) fn check_lanes(
        &self,
        site: usize,
        param: usize,
        addr: PointerValue<'ctx>,
        esize: u64,
        mask: inkwell::values::VectorValue<'ctx>,
        lin0: IntValue<'ctx>,
    ) -> LResult<()> {
        let b = &self.cx.b;
        let w = mask.get_type().get_size();
        let i64t = self.cx.ctx.i64_type();
        let a = b.build_ptr_to_int(addr, i64t, "")?;
        let (base, len) = self.extent(param)?;
        let off0 = b.build_int_sub(a, base, "")?;
        let lim = b.build_int_sub(len, self.i64(esize), "")?;
        let steps: Vec<IntValue<'ctx>> = (0..w).map(|j| self.i64(j as u64 * esize)).collect();
        let offs = b.build_int_add(
            self.splat(off0.into(), w)?,
            VectorType::const_vector(&steps),
            "",
        )?;
        let zero = i64t.vec_type(w).const_zero();
        let lo = b.build_int_compare(IntPredicate::SGE, offs, zero, "")?;
        let hi = b.build_int_compare(IntPredicate::SLE, offs, self.splat(lim.into(), w)?, "")?;
        let inside = b.build_and(lo, hi, "")?;
        let bad = b.build_and(mask, b.build_not(inside, "")?, "")?;
        let word_t = self
            .cx
            .ctx
            .custom_width_int_type(
                std::num::NonZero::new(w).unwrap_or(std::num::NonZero::<u32>::MIN),
            )
            .map_err(|m| LowerError::Llvm(m.into()))?;
        let word = b.build_bit_cast(bad, word_t, "")?.into_int_value();
        let ok = b.build_int_compare(IntPredicate::EQ, word, word_t.const_zero(), "")?;
        // The first bad lane (its bit's position; only read when there is one).
        let j = self
            .cx
            .call_intrinsic(
                "llvm.cttz",
                &[word_t.into()],
                &[word.into(), self.cx.ctx.bool_type().const_zero().into()],
            )?
            .into_int_value();
        let j = b.build_int_z_extend_or_bit_cast(j, i64t, "")?;
        let lane = b.build_int_add(lin0, j, "")?;
        let index = b.build_int_add(b.build_int_signed_div(off0, self.i64(esize), "")?, j, "")?;
        self.check(ok, site, lane, index)
    }

    /// Parameter `k`'s base address and length in bytes, read once at the
    /// function's entry (so that every check uses the same values, which LLVM need
    /// not reload after the kernel's stores, nor speculate inside its branches).
    pub(super) fn extent(&self, k: usize) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
        self.extents
            .get(k)
            .copied()
            .flatten()
            .ok_or_else(|| LowerError::Llvm(format!("parameter {k} is not a buffer")))
    }

    /// `c`, marked as most likely true (`llvm.expect`): the checks' failure paths
    /// are laid out of the way.
    pub(super) fn likely(&self, c: IntValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let t = self.cx.ctx.bool_type();
        Ok(self
            .cx
            .call_intrinsic(
                "llvm.expect",
                &[t.into()],
                &[c.into(), t.const_all_ones().into()],
            )?
            .into_int_value())
    }

    pub(super) fn load(&mut self, op: &Op, has_mask: bool, has_other: bool) -> LResult<()> {
        let Elem::Ptr { pointee, .. } = self.elem(op.operands[0]) else {
            return unsupported(op, "through a non-pointer");
        };
        let e = Elem::Scalar(pointee);
        let ty = self.lty(e);
        let ptrs = self.val(op.operands[0])?;
        let pe = self.elem(op.operands[0]);
        let mask = has_mask.then(|| self.val(op.operands[1])).transpose()?;
        let n = self.numel(op.results[0]);
        let prov = self.prov[op.operands[0].index()];
        let site = self.checked.then(|| {
            let shape = self.f.ty(op.results[0]).shape.clone();
            self.site(
                op,
                SiteKind::Access {
                    param: param_of(prov),
                    remote: self.reaches_peers(prov),
                },
                shape,
            )
        });
        // Fused: read where its user reads it ([`fusible`] checked that nothing
        // writes that buffer in between).
        // Not with the sanitizer: a fused load is read only where its consumer reads
        // it (a masked store's live lanes), and every access the program makes must
        // be checked, as the interpreter checks it.
        let fused = self.fusible[op.results[0].index()]
            && !self.sanitize
            && !(matches!(ptrs, V::U(_)) && mask.is_none_or(|m| matches!(m, V::U(_))));
        // Materialized, a computed `other` is materialized first: the vector path,
        // which skips it, then stays open (and it is read once per masked-off lane,
        // not recomputed).
        let other = match (has_other, fused) {
            (false, _) => None,
            (true, true) => Some(self.val(op.operands[2])?),
            (true, false) => Some(self.mat(op.operands[2])?),
        };
        let mut ins = vec![ptrs];
        ins.extend(mask);
        ins.extend(other);
        let k = self.push_fused(op, ins, site, prov);
        if fused {
            self.set(op, V::F(k));
            return Ok(());
        }
        if matches!(ptrs, V::U(_)) && mask.is_none_or(|m| matches!(m, V::U(_))) && n == 1 {
            let v = self.load_elem(k, self.i64(0), &|h, v, e| h.get_at(v, e, &[], h.i64(0)))?;
            self.set(op, V::U(v));
            return Ok(());
        }
        let out = self.slot(e, n)?;
        let shape = self.shape(op.results[0]);
        let prov_site = site.map(|s| (s, prov));
        self.chunked(
            &shape,
            (ptrs, pe, e),
            mask,
            prov_site,
            // (The load itself: its lanes are trusted with its tile.)
            Some(V::F(k)),
            &mut |h, idx, i| {
                let v = h.load_elem(k, i, &|h, v, e| h.get_at(v, e, idx, i))?;
                h.put(out, e, i, v)
            },
            &mut |h, _, lin0, addr0, w| {
                let vt = vec_of(ty, w)?;
                let x = h.cx.b.build_load(vt, addr0, "")?;
                set_align(x, elem_bytes(e));
                let dst = h.gep(ty, out, lin0)?;
                let st = h.cx.b.build_store(dst, x)?;
                let _ = st.set_alignment(elem_bytes(e) as u32);
                Ok(())
            },
        )?;
        if self.f.ty(op.results[0]).shape.is_empty() {
            let v = self.get(V::T(out), e, self.i64(0))?;
            self.set(op, V::U(v));
        } else {
            self.set(op, V::T(out));
        }
        Ok(())
    }

    /// One element (row-major index `lin`) of the load `fused[k]`, its operands' elements
    /// read by `at`: the mask tested first, a masked-off lane taking `other` (or zero)
    /// without touching memory, the address checked with checks on.
    pub(super) fn load_elem(
        &self,
        k: usize,
        lin: IntValue<'ctx>,
        at: &dyn Fn(&Self, V<'ctx>, Elem) -> LResult<BasicValueEnum<'ctx>>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let fu = &self.fused[k];
        let (
            OpKind::Load {
                has_mask,
                has_other,
            },
            Elem::Ptr { pointee, .. },
        ) = (&fu.op.kind, self.elem(fu.op.operands[0]))
        else {
            return unsupported(&fu.op, "is not a load through pointers");
        };
        let pe = self.elem(fu.op.operands[0]);
        let e = Elem::Scalar(pointee);
        let ty = self.lty(e);
        let fill = match (has_other, fu.ins.get(2)) {
            (true, Some(&o)) => at(self, o, e)?,
            _ => ty.const_zero(),
        };
        let m = match (has_mask, fu.ins.get(1)) {
            (true, Some(&m)) => Some(at(self, m, Elem::Scalar(ScalarType::I1))?.into_int_value()),
            _ => None,
        };
        // (After the operands, which may have branched.)
        let pre = self.here()?;
        let (on, join) = (self.block("ld"), self.block("ldj"));
        match m {
            Some(m) => self.cx.b.build_conditional_branch(m, on, join)?,
            None => self.cx.b.build_unconditional_branch(on)?,
        };
        self.cx.b.position_at_end(on);
        let addr = at(self, fu.ins[0], pe)?.into_pointer_value();
        if let Some(s) = fu.site
            && !self.trusted.contains(&k)
        {
            self.check_access(s, fu.prov, addr, elem_bytes(e), lin)?;
        }
        let x = self.cx.b.build_load(ty, addr, "")?;
        let on_end = self.here()?;
        self.cx.b.build_unconditional_branch(join)?;
        self.cx.b.position_at_end(join);
        let phi = self.cx.b.build_phi(ty, "")?;
        phi.add_incoming(&[(&x, on_end)]);
        if *has_mask {
            phi.add_incoming(&[(&fill, pre)]);
        }
        Ok(phi.as_basic_value())
    }

    pub(super) fn store(&mut self, op: &Op, has_mask: bool) -> LResult<()> {
        let Elem::Ptr { pointee, .. } = self.elem(op.operands[0]) else {
            return unsupported(op, "through a non-pointer");
        };
        let e = Elem::Scalar(pointee);
        let ptrs = self.val(op.operands[0])?;
        let pe = self.elem(op.operands[0]);
        let vals = self.val(op.operands[1])?;
        let mask = has_mask.then(|| self.val(op.operands[2])).transpose()?;
        let shape = if self.numel(op.operands[0]) >= self.numel(op.operands[1]) {
            self.shape(op.operands[0])
        } else {
            self.shape(op.operands[1])
        };
        let prov = self.prov[op.operands[0].index()];
        let site = self.checked.then(|| {
            let shape = self.f.ty(op.operands[0]).shape.clone();
            self.site(
                op,
                SiteKind::Access {
                    param: param_of(prov),
                    remote: self.reaches_peers(prov),
                },
                shape,
            )
        });
        let bool_e = Elem::Scalar(ScalarType::I1);
        let ty = self.lty(e);
        // An affine value is materialized (the chunks read tile slots or compute a
        // fused value lane by lane).
        let vals = match vals {
            V::A(_) => self.mat_v(vals, op.operands[1])?,
            v => v,
        };
        let prov_site = site.map(|s| (s, prov));
        self.chunked(
            &shape,
            (ptrs, pe, e),
            mask,
            prov_site,
            Some(vals),
            &mut |h, idx, i| {
                let (on, join) = (h.block("st"), h.block("stj"));
                match mask {
                    Some(m) => {
                        let m = h.get_at(m, bool_e, idx, i)?.into_int_value();
                        h.cx.b.build_conditional_branch(m, on, join)?;
                    }
                    None => {
                        h.cx.b.build_unconditional_branch(on)?;
                    }
                }
                h.cx.b.position_at_end(on);
                let addr = h.get_at(ptrs, pe, idx, i)?.into_pointer_value();
                if let Some(s) = site {
                    h.check_access(s, prov, addr, elem_bytes(e), i)?;
                }
                let x = h.get_at(vals, e, idx, i)?;
                h.cx.b.build_store(addr, x)?;
                h.cx.b.build_unconditional_branch(join)?;
                h.cx.b.position_at_end(join);
                Ok(())
            },
            &mut |h, full, lin0, addr0, w| {
                let vt = vec_of(ty, w)?;
                let x: BasicValueEnum = match vals {
                    V::U(x) => h.splat(x, w)?.into(),
                    V::F(_) => h.lanes(vals, e, full, lin0, w)?.into(),
                    _ => {
                        let src = h.gep(
                            ty,
                            match vals {
                                V::T(p) => p,
                                _ => {
                                    return Err(LowerError::Llvm(
                                        "affine values stored by chunks".into(),
                                    ));
                                }
                            },
                            lin0,
                        )?;
                        let x = h.cx.b.build_load(vt, src, "")?;
                        set_align(x, elem_bytes(e));
                        x
                    }
                };
                let st = h.cx.b.build_store(addr0, x)?;
                let _ = st.set_alignment(elem_bytes(e) as u32);
                Ok(())
            },
        )
    }

    /// The `w` elements of `v` from multi-index `idx` (row-major index `lin0`) along
    /// the last dimension, as a vector: a slot's run and a contiguous fused load
    /// (checked at the run's ends) as vector loads, a fused elementwise op lane by lane
    /// over its operands' vectors, anything else lane by lane (straight-line code
    /// that LLVM's SLP vectorizer turns into vector instructions).
    pub(super) fn lanes(
        &self,
        v: V<'ctx>,
        e: Elem,
        idx: &[IntValue<'ctx>],
        lin0: IntValue<'ctx>,
        w: u32,
    ) -> LResult<inkwell::values::VectorValue<'ctx>> {
        let b = &self.cx.b;
        let i32t = self.cx.ctx.i32_type();
        let bool_e = Elem::Scalar(ScalarType::I1);
        match v {
            V::U(x) => return self.splat(x, w),
            V::T(p) if e != bool_e => {
                let ty = self.lty(e);
                let x = b.build_load(vec_of(ty, w)?, self.gep(ty, p, lin0)?, "")?;
                set_align(x, elem_bytes(e));
                return Ok(x.into_vector_value());
            }
            // An integer index tile: its first lane plus the last stride times 0..w.
            V::A(k)
                if matches!(e, Elem::Scalar(_))
                    && !idx.is_empty()
                    && self.aff[k].strides.len() == idx.len() =>
            {
                let x0 = self.get_at(v, e, idx, lin0)?.into_int_value();
                let t = x0.get_type();
                let st = self.aff[k].strides[idx.len() - 1];
                let iota: Vec<IntValue<'ctx>> =
                    (0..w).map(|j| t.const_int(j as u64, false)).collect();
                let steps = b.build_int_mul(
                    self.splat(st.into(), w)?,
                    VectorType::const_vector(&iota),
                    "",
                )?;
                return Ok(b.build_int_add(self.splat(x0.into(), w)?, steps, "")?);
            }
            V::F(k) => {
                let fu = &self.fused[k];
                let ops = &fu.op.operands;
                match fu.op.kind {
                    OpKind::Load {
                        has_mask,
                        has_other,
                    } if self.unit_stride(fu.ins[0]) => {
                        let site = fu.site.filter(|_| !self.trusted.contains(&k));
                        let prov = fu.prov;
                        let pe = self.elem(ops[0]);
                        let vt = vec_of(self.lty(e), w)?;
                        let addr0 = self.get_at(fu.ins[0], pe, idx, lin0)?.into_pointer_value();
                        if !has_mask && site.is_none() {
                            let x = b.build_load(vt, addr0, "")?;
                            set_align(x, elem_bytes(e));
                            return Ok(x.into_vector_value());
                        }
                        let m = if has_mask {
                            Some(self.lanes(fu.ins[1], bool_e, idx, lin0, w)?)
                        } else {
                            None
                        };
                        let pass = if has_other {
                            self.lanes(fu.ins[2], e, idx, lin0, w)?
                        } else {
                            vt.const_zero()
                        };
                        // A run whose mask holds everywhere (the common case) takes a
                        // plain load: a masked one costs half again on AMD Zen 2
                        // (layernorm's first pass, measured). So does a run inside
                        // its buffer, where accesses are checked.
                        let all = match m {
                            Some(m) => self.all_set(m)?,
                            None => self.cx.ctx.bool_type().const_all_ones(),
                        };
                        let all = match site {
                            Some(_) => {
                                let inb = self.run_in_bounds(prov, addr0, elem_bytes(e), w)?;
                                b.build_and(all, inb, "")?
                            }
                            None => all,
                        };
                        let (full, part, join) =
                            (self.block("ldv"), self.block("ldm"), self.block("ldvj"));
                        b.build_conditional_branch(all, full, part)?;
                        b.position_at_end(full);
                        let x = b.build_load(vt, addr0, "")?;
                        set_align(x, elem_bytes(e));
                        b.build_unconditional_branch(join)?;
                        b.position_at_end(part);
                        // A partly masked run (a tile's edge), or one that leaves its
                        // buffer: with checks, lane by lane, each lane loaded (and
                        // checked) only where its mask holds.
                        let y = match (site, m, prov) {
                            (None, Some(m), _) => {
                                self.masked_load(vt, addr0, m, pass, elem_bytes(e))?
                            }
                            // One buffer: every live lane checked at once (a vector
                            // comparison), the first one outside reported.
                            (Some(s), m, Prov::Param(p)) if !self.reaches_peers(prov) => {
                                let m = match m {
                                    Some(m) => m,
                                    None => self.splat(
                                        self.cx.ctx.bool_type().const_all_ones().into(),
                                        w,
                                    )?,
                                };
                                self.check_lanes(s, p, addr0, elem_bytes(e), m, lin0)?;
                                self.masked_load(vt, addr0, m, pass, elem_bytes(e))?
                            }
                            _ => {
                                let mut y = vt.get_undef();
                                for j in 0..w {
                                    let mut at = idx.to_vec();
                                    let r = at.len();
                                    at[r - 1] =
                                        b.build_int_add(idx[r - 1], self.i64(j as u64), "")?;
                                    let lin = b.build_int_add(lin0, self.i64(j as u64), "")?;
                                    let x = self
                                        .load_elem(k, lin, &|h, v, e| h.get_at(v, e, &at, lin))?;
                                    let jj = i32t.const_int(j as u64, false);
                                    y = b.build_insert_element(y, x, jj, "")?;
                                }
                                y
                            }
                        };
                        let part_end = self.here()?;
                        b.build_unconditional_branch(join)?;
                        b.position_at_end(join);
                        let phi = b.build_phi(vt, "")?;
                        phi.add_incoming(&[(&x, full), (&y, part_end)]);
                        return Ok(phi.as_basic_value().into_vector_value());
                    }
                    OpKind::Load { .. } => {}
                    _ if ops.iter().all(|&o| matches!(self.elem(o), Elem::Scalar(_))) => {
                        let vs: Vec<_> = fu
                            .ins
                            .iter()
                            .zip(ops)
                            .map(|(&v, &o)| self.lanes(v, self.elem(o), idx, lin0, w))
                            .collect::<LResult<_>>()?;
                        let mut out = vec_of(self.lty(e), w)?.get_undef();
                        for j in 0..w {
                            let jj = i32t.const_int(j as u64, false);
                            let args: Vec<BasicValueEnum<'ctx>> = vs
                                .iter()
                                .map(|&x| b.build_extract_element(x, jj, ""))
                                .collect::<Result<_, _>>()?;
                            let x = self.apply(&fu.op, &args)?;
                            out = b.build_insert_element(out, x, jj, "")?;
                        }
                        return Ok(out);
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        let r = idx.len();
        let mut out = vec_of(self.lty(e), w)?.get_undef();
        for j in 0..w {
            let mut at = idx.to_vec();
            if r > 0 {
                at[r - 1] = b.build_int_add(idx[r - 1], self.i64(j as u64), "")?;
            }
            let lin = b.build_int_add(lin0, self.i64(j as u64), "")?;
            let x = self.get_at(v, e, &at, lin)?;
            let k = i32t.const_int(j as u64, false);
            out = b.build_insert_element(out, x, k, "")?;
        }
        Ok(out)
    }

    /// `llvm.masked.load` of a `vt` from `addr` (aligned to `align` bytes): lanes
    /// where `mask` is false are not read and take `pass`'s.
    pub(super) fn masked_load(
        &self,
        vt: inkwell::types::VectorType<'ctx>,
        addr: PointerValue<'ctx>,
        mask: inkwell::values::VectorValue<'ctx>,
        pass: inkwell::values::VectorValue<'ctx>,
        align: u64,
    ) -> LResult<inkwell::values::VectorValue<'ctx>> {
        let intr = inkwell::intrinsics::Intrinsic::find("llvm.masked.load")
            .ok_or_else(|| LowerError::Llvm("no llvm.masked.load".into()))?;
        let decl = intr
            .get_declaration(&self.cx.module, &[vt.into(), addr.get_type().into()])
            .ok_or_else(|| LowerError::Llvm(format!("no llvm.masked.load for {vt}")))?;
        let call = self
            .cx
            .b
            .build_call(decl, &[addr.into(), mask.into(), pass.into()], "")?;
        let kind = Attribute::get_named_enum_kind_id("align");
        call.add_attribute(
            AttributeLoc::Param(0),
            self.cx.ctx.create_enum_attribute(kind, align),
        );
        call.try_as_basic_value()
            .basic()
            .map(|x| x.into_vector_value())
            .ok_or_else(|| LowerError::Llvm("llvm.masked.load returned nothing".into()))
    }

    /// Whether pointer tile `v` is affine with a unit stride along its last dimension.
    pub(super) fn unit_stride(&self, v: V<'ctx>) -> bool {
        match v {
            V::A(k) => {
                self.aff[k]
                    .strides
                    .last()
                    .and_then(|s| s.get_zero_extended_constant())
                    == Some(1)
            }
            _ => false,
        }
    }

    /// Whether every lane of the `i1` vector `bits` is set.
    pub(super) fn all_set(
        &self,
        bits: inkwell::values::VectorValue<'ctx>,
    ) -> LResult<IntValue<'ctx>> {
        let w = bits.get_type().get_size();
        let word_t = self
            .cx
            .ctx
            .custom_width_int_type(
                std::num::NonZero::new(w).unwrap_or(std::num::NonZero::<u32>::MIN),
            )
            .map_err(|m| LowerError::Llvm(m.into()))?;
        let b = &self.cx.b;
        let word = b.build_bit_cast(bits, word_t, "")?.into_int_value();
        Ok(b.build_int_compare(IntPredicate::EQ, word, word_t.const_all_ones(), "")?)
    }

    /// `x` in every lane of a `w`-lane vector.
    pub(super) fn splat(
        &self,
        x: BasicValueEnum<'ctx>,
        w: u32,
    ) -> LResult<inkwell::values::VectorValue<'ctx>> {
        let vt = vec_of(x.get_type(), w)?;
        let mut v = vt.get_undef();
        for k in 0..w {
            let k = self.cx.ctx.i32_type().const_int(k as u64, false);
            v = self.cx.b.build_insert_element(v, x, k, "")?;
        }
        Ok(v)
    }

    /// [`Self::chunked_once`], in two versions where accesses are checked: when the
    /// whole tile's addresses through `ptrs`, and those of the contiguous loads fused
    /// into `reads` (what a store writes), lie inside their buffers (one test each,
    /// from the affine pointers' extremes), loops without per-run checks; else the
    /// loops with them (a tile at a buffer's edge, or an access outside one).
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    pub(super) fn chunked(
        &mut self,
        shape: &[u64],
        (ptrs, pe, e): (V<'ctx>, Elem, Elem),
        mask: Option<V<'ctx>>,
        check: Option<(usize, Prov)>,
        reads: Option<V<'ctx>>,
        lane: &mut dyn FnMut(&mut Self, &[IntValue<'ctx>], IntValue<'ctx>) -> LResult<()>,
        chunk: &mut dyn FnMut(
            &mut Self,
            &[IntValue<'ctx>],
            IntValue<'ctx>,
            PointerValue<'ctx>,
            u32,
        ) -> LResult<()>,
    ) -> LResult<()> {
        let Some((_, prov)) = check else {
            return self.chunked_once(shape, (ptrs, pe, e), mask, None, lane, chunk);
        };
        let own = self.tile_in_bounds(ptrs, prov, shape, elem_bytes(e))?;
        self.versioned(shape, own, reads, &mut |h, fast| {
            let check = if fast && own.is_some() { None } else { check };
            h.chunked_once(shape, (ptrs, pe, e), mask, check, lane, chunk)
        })
    }

    /// Emits `emit` in two versions where that saves checks: when `own` (a tile's
    /// own pointer test, if any) and the tile tests of the contiguous loads fused into
    /// `reads` all hold, `emit(true)` with those loads read unchecked ([`H::trusted`]);
    /// else `emit(false)`, every access checked. Once, checked, when there is nothing
    /// to test.
    pub(super) fn versioned(
        &mut self,
        shape: &[u64],
        own: Option<IntValue<'ctx>>,
        reads: Option<V<'ctx>>,
        emit: &mut dyn FnMut(&mut Self, bool) -> LResult<()>,
    ) -> LResult<()> {
        let mut loads = Vec::new();
        if let Some(v) = reads {
            self.fused_loads(v, &mut loads);
        }
        let mut ok = own;
        let mut trusted = Vec::new();
        for k in loads {
            let fu = &self.fused[k];
            let (Some(&p), Elem::Ptr { pointee, .. }) =
                (fu.ins.first(), self.elem(fu.op.operands[0]))
            else {
                continue;
            };
            if fu.site.is_none() || self.shape(fu.op.results[0]) != shape {
                continue;
            }
            let prov = fu.prov;
            let esize = elem_bytes(Elem::Scalar(pointee));
            if let Some(t) = self.tile_in_bounds(p, prov, shape, esize)? {
                ok = Some(match ok {
                    Some(o) => self.cx.b.build_and(o, t, "")?,
                    None => t,
                });
                trusted.push(k);
            }
        }
        let Some(ok) = ok else {
            return emit(self, false);
        };
        let ok = self.likely(ok)?;
        let (fast, slow, join) = (self.block("tile"), self.block("edge"), self.block("tilej"));
        self.cx.b.build_conditional_branch(ok, fast, slow)?;
        self.cx.b.position_at_end(fast);
        let saved = std::mem::replace(&mut self.trusted, trusted);
        let r = emit(self, true);
        self.trusted = saved;
        r?;
        self.cx.b.build_unconditional_branch(join)?;
        self.cx.b.position_at_end(slow);
        emit(self, false)?;
        self.cx.b.build_unconditional_branch(join)?;
        self.cx.b.position_at_end(join);
        Ok(())
    }

    /// The fused loads `v` reads (through fused elementwise ops).
    pub(super) fn fused_loads(&self, v: V<'ctx>, out: &mut Vec<usize>) {
        if let V::F(k) = v {
            if matches!(self.fused[k].op.kind, OpKind::Load { .. }) {
                out.push(k);
            }
            for &i in &self.fused[k].ins {
                self.fused_loads(i, out);
            }
        }
    }

    /// Whether every address of the affine pointer tile `ptrs` over `shape` (its
    /// extremes: the base plus each dimension's most negative and most positive
    /// step) lies inside the one buffer of provenance `prov`; `None` for a pointer
    /// that is not affine or may reach several buffers (checked access by access).
    pub(super) fn tile_in_bounds(
        &self,
        ptrs: V<'ctx>,
        prov: Prov,
        shape: &[u64],
        esize: u64,
    ) -> LResult<Option<IntValue<'ctx>>> {
        let (V::A(k), Prov::Param(p)) = (ptrs, prov) else {
            return Ok(None);
        };
        if self.reaches_peers(prov) || self.aff[k].strides.len() != shape.len() {
            return Ok(None);
        }
        let b = &self.cx.b;
        let i64t = self.cx.ctx.i64_type();
        let (mut lo, mut hi) = (self.i64(0), self.i64(0));
        for (&n, &st) in shape.iter().zip(&self.aff[k].strides) {
            if n == 0 {
                return Ok(None);
            }
            let st = b.build_int_s_extend_or_bit_cast(st, i64t, "")?;
            let ext = b.build_int_mul(st, self.i64(n - 1), "")?;
            let neg = b.build_int_compare(IntPredicate::SLT, ext, self.i64(0), "")?;
            let down = b.build_select(neg, ext, self.i64(0), "")?.into_int_value();
            let up = b.build_select(neg, self.i64(0), ext, "")?.into_int_value();
            lo = b.build_int_add(lo, down, "")?;
            hi = b.build_int_add(hi, up, "")?;
        }
        let base = self.aff[k].base.into_pointer_value();
        let a = b.build_ptr_to_int(base, i64t, "")?;
        let (start, len) = self.extent(p)?;
        // Byte offsets of the lowest and highest element from the buffer's start.
        let off = b.build_int_sub(a, start, "")?;
        let lo_b = b.build_int_add(off, b.build_int_mul(lo, self.i64(esize), "")?, "")?;
        let hi_b = b.build_int_add(off, b.build_int_mul(hi, self.i64(esize), "")?, "")?;
        let lim = b.build_int_sub(len, self.i64(esize), "")?;
        let above = b.build_int_compare(IntPredicate::SGE, lo_b, self.i64(0), "")?;
        let below = b.build_int_compare(IntPredicate::SLE, hi_b, lim, "")?;
        Ok(Some(b.build_and(above, below, "")?))
    }

    /// Runs `lane(idx, lin)` for every element of `shape`, except that where
    /// `ptrs` (element type `pe`, pointing to `e`) is affine with a unit stride along
    /// the last dimension (a multiple of 8), a run of `w` lanes along it whose
    /// `mask` holds everywhere runs `chunk(idx0, lin0, addr0, w)` instead: one vector
    /// access from the run's first address (whose run the checks cover at both
    /// ends, `check`).
    #[allow(clippy::type_complexity)]
    pub(super) fn chunked_once(
        &mut self,
        shape: &[u64],
        (ptrs, pe, e): (V<'ctx>, Elem, Elem),
        mask: Option<V<'ctx>>,
        check: Option<(usize, Prov)>,
        lane: &mut dyn FnMut(&mut Self, &[IntValue<'ctx>], IntValue<'ctx>) -> LResult<()>,
        chunk: &mut dyn FnMut(
            &mut Self,
            &[IntValue<'ctx>],
            IntValue<'ctx>,
            PointerValue<'ctx>,
            u32,
        ) -> LResult<()>,
    ) -> LResult<()> {
        let rm = row_major(shape);
        let r = shape.len();
        let unit = self.unit_stride(ptrs);
        let last = shape.last().copied().unwrap_or(0);
        let w: u32 = if last % 16 == 0 { 16 } else { 8 };
        let vectorizable = unit
            && last % w as u64 == 0
            && e != Elem::Scalar(ScalarType::I1)
            && !matches!(mask, Some(V::A(_)))
            && (mask.is_some() || !matches!(ptrs, V::U(_)));
        if !vectorizable {
            return self.nest(shape, &mut |h, idx| {
                let i = h.linear(idx, &rm)?;
                lane(h, idx, i)
            });
        }
        let mut outer = shape.to_vec();
        outer[r - 1] = last / w as u64;
        self.nest(&outer, &mut |h, idx| {
            let b = &h.cx.b;
            let mut full = idx.to_vec();
            full[r - 1] = b.build_int_mul(idx[r - 1], h.i64(w as u64), "")?;
            let lin0 = h.linear(&full, &rm)?;
            let all = match mask {
                None => h.cx.ctx.bool_type().const_all_ones(),
                Some(V::U(m)) => m.into_int_value(),
                Some(V::T(p)) => {
                    let i8t = h.cx.ctx.i8_type();
                    let src = h.gep(i8t.into(), p, lin0)?;
                    let mv = b.build_load(i8t.vec_type(w), src, "")?.into_vector_value();
                    let bits = b.build_int_compare(
                        IntPredicate::NE,
                        mv,
                        i8t.vec_type(w).const_zero(),
                        "",
                    )?;
                    h.all_set(bits)?
                }
                Some(m @ V::F(_)) => {
                    let bits = h.lanes(m, Elem::Scalar(ScalarType::I1), &full, lin0, w)?;
                    h.all_set(bits)?
                }
                Some(V::A(_)) => unreachable!("not vectorizable"),
            };
            let addr0 = h.get_at(ptrs, pe, &full, lin0)?.into_pointer_value();
            let all = match check {
                Some((_, prov)) => {
                    let inb = h.run_in_bounds(prov, addr0, elem_bytes(e), w)?;
                    h.cx.b.build_and(all, inb, "")?
                }
                None => all,
            };
            let (fast, slow, join) = (h.block("vec"), h.block("lanes"), h.block("vecj"));
            h.cx.b.build_conditional_branch(all, fast, slow)?;
            h.cx.b.position_at_end(fast);
            chunk(h, &full, lin0, addr0, w)?;
            h.cx.b.build_unconditional_branch(join)?;
            h.cx.b.position_at_end(slow);
            h.counted(w as u64, &mut |h, j| {
                let mut at = full.clone();
                at[r - 1] = h.cx.b.build_int_add(full[r - 1], j, "")?;
                let lin = h.cx.b.build_int_add(lin0, j, "")?;
                lane(h, &at, lin)
            })?;
            h.cx.b.build_unconditional_branch(join)?;
            h.cx.b.position_at_end(join);
            Ok(())
        })
    }
}

//! `dot` on the host: a register-blocked micro-kernel over rows of the
//! accumulator, sized for this machine's vector registers ([`register_rows`]).

use super::*;

/// Rows of a `dot` register block ([`H::micro_kernel`]) for `vl`-lane rows of
/// `acc`: as many as keep every accumulator, one row of `pb` and a broadcast in this
/// machine's vector registers (16 of 256 bits with AVX2, 32 of 512 with AVX-512), at
/// most 8. With AVX2 that is 6 rows of 16 f32 lanes (with 8 the inner loop spilled
/// and reloaded accumulators every step).
pub(super) fn register_rows(acc: ScalarType, vl: u64) -> u64 {
    let wide = crate::host_cpu::wide_vectors();
    let (regs, bits) = if wide { (32, 512) } else { (16, 256) };
    let per_row = (vl * acc.bits() as u64).div_ceil(bits);
    ((regs - per_row - 1) / per_row).clamp(1, 8)
}

impl<'a, 'ctx> H<'a, 'ctx> {
    pub(super) fn dot(&mut self, op: &Op) -> LResult<()> {
        let (sa, sb) = (self.shape(op.operands[0]), self.shape(op.operands[1]));
        if sa.len() != 2 || sb.len() != 2 || op.operands.len() < 3 {
            return unsupported(op, "of tiles that are not 2-D");
        }
        let (m, k, n) = (sa[0], sa[1], sb[1]);
        let re = self.elem(op.results[0]);
        let (Some(acc), Some(ta), Some(tb), Some(tc)) = (
            re.scalar(),
            self.elem(op.operands[0]).scalar(),
            self.elem(op.operands[1]).scalar(),
            self.elem(op.operands[2]).scalar(),
        ) else {
            return unsupported(op, "of pointers");
        };
        let (a, b, c) = (
            self.mat(op.operands[0])?,
            self.mat(op.operands[1])?,
            self.mat(op.operands[2])?,
        );
        let pa = self.converted(a, ta, acc, m * k)?;
        let pb = self.converted(b, tb, acc, k * n)?;
        let out = self.slot(re, m * n)?;
        let ea = Elem::Scalar(acc);
        let vl: u64 = if acc == ScalarType::F64 { 8 } else { 16 };
        let micro = matches!(acc, ScalarType::F32 | ScalarType::F64) && n % vl == 0;
        // The accumulators start from `c` where it is a tile of `acc` already.
        let init = match c {
            V::T(p) if micro && tc == acc => p,
            _ => {
                self.counted(m * n, &mut |h, i| {
                    let x = h.get(c, Elem::Scalar(tc), i)?;
                    let x = elementwise::cast(&h.cx, tc, acc, x)?;
                    h.put(out, re, i, x)
                })?;
                out
            }
        };
        if micro {
            let mr = register_rows(acc, vl);
            let (blocks, rest) = (m / mr, m % mr);
            let mk = (m, n, k);
            self.micro_kernel(out, init, pa, pb, acc, mk, vl, (0, blocks, mr))?;
            if rest > 0 {
                self.micro_kernel(out, init, pa, pb, acc, mk, vl, (blocks * mr, 1, rest))?;
            }
            self.set(op, V::T(out));
            return Ok(());
        }
        self.nest(&[m, k], &mut |h, mk| {
            let aik = h.get(V::T(pa), ea, h.linear(mk, &[k, 1])?)?;
            h.counted(n, &mut |h, j| {
                let bi =
                    h.cx.b
                        .build_int_add(h.cx.b.build_int_mul(mk[1], h.i64(n), "")?, j, "")?;
                let oi =
                    h.cx.b
                        .build_int_add(h.cx.b.build_int_mul(mk[0], h.i64(n), "")?, j, "")?;
                let bkj = h.get(V::T(pb), ea, bi)?;
                let o = h.get(V::T(out), ea, oi)?;
                let r: BasicValueEnum = if acc.is_float() {
                    h.cx.call_intrinsic("llvm.fmuladd", &[h.lty(ea)], &[aik, bkj, o])?
                } else {
                    let p =
                        h.cx.b
                            .build_int_mul(aik.into_int_value(), bkj.into_int_value(), "")?;
                    h.cx.b.build_int_add(p, o.into_int_value(), "")?.into()
                };
                h.put(out, ea, oi, r)
            })
        })?;
        self.set(op, V::T(out));
        Ok(())
    }

    /// `out = init + pa · pb` (row-major `m x k` by `k x n`, all of float type `acc`;
    /// `init` may be `out`) for `blocks` register blocks from row `row0`: `mr` rows by
    /// one `vl`-lane vector of columns, whose `mr` accumulators stay in registers over
    /// the whole `k` loop (one vector load of `pb` and `mr` broadcasts of `pa` per
    /// step).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn micro_kernel(
        &mut self,
        out: PointerValue<'ctx>,
        init: PointerValue<'ctx>,
        pa: PointerValue<'ctx>,
        pb: PointerValue<'ctx>,
        acc: ScalarType,
        (_m, n, k): (u64, u64, u64),
        vl: u64,
        (row0, blocks, mr): (u64, u64, u64),
    ) -> LResult<()> {
        let ty = self.lty(Elem::Scalar(acc));
        let vt = vec_of(ty, vl as u32)?;
        let align = elem_bytes(Elem::Scalar(acc)) as u32;
        self.nest(&[blocks, n / vl], &mut |h, ij| {
            let b = &h.cx.b;
            let i0 = b.build_int_add(b.build_int_mul(ij[0], h.i64(mr), "")?, h.i64(row0), "")?;
            let j0 = b.build_int_mul(ij[1], h.i64(vl), "")?;
            let row = |h: &Self, r: u64, stride: u64| -> LResult<IntValue<'ctx>> {
                let b = &h.cx.b;
                let i = b.build_int_add(i0, h.i64(r), "")?;
                Ok(b.build_int_mul(i, h.i64(stride), "")?)
            };
            let mut starts = Vec::with_capacity(mr as usize);
            let mut dsts = Vec::with_capacity(mr as usize);
            for r in 0..mr {
                let at = h.cx.b.build_int_add(row(h, r, n)?, j0, "")?;
                let x = h.cx.b.build_load(vt, h.gep(ty, init, at)?, "")?;
                set_align(x, align as u64);
                starts.push(x);
                dsts.push(h.gep(ty, out, at)?);
            }
            let pre = h.here()?;
            let (head, exit) = (h.block("mk"), h.block("mkdone"));
            h.cx.b.build_unconditional_branch(head)?;
            h.cx.b.position_at_end(head);
            let i64t = h.cx.ctx.i64_type();
            let kp = h.cx.b.build_phi(i64t, "k")?;
            kp.add_incoming(&[(&i64t.const_zero(), pre)]);
            let kv = kp.as_basic_value().into_int_value();
            let mut phis = Vec::with_capacity(mr as usize);
            for x in &starts {
                let p = h.cx.b.build_phi(vt, "acc")?;
                p.add_incoming(&[(x, pre)]);
                phis.push(p);
            }
            let bi =
                h.cx.b
                    .build_int_add(h.cx.b.build_int_mul(kv, h.i64(n), "")?, j0, "")?;
            let bp = h.gep(ty, pb, bi)?;
            let bv = h.cx.b.build_load(vt, bp, "")?;
            set_align(bv, align as u64);
            let mut next = Vec::with_capacity(mr as usize);
            for (r, p) in phis.iter().enumerate() {
                let ai = h.cx.b.build_int_add(row(h, r as u64, k)?, kv, "")?;
                let a = h.get(V::T(pa), Elem::Scalar(acc), ai)?;
                let av = h.splat(a, vl as u32)?;
                let y = h.cx.call_intrinsic(
                    "llvm.fmuladd",
                    &[vt.into()],
                    &[av.into(), bv, p.as_basic_value()],
                )?;
                next.push(y);
            }
            let k1 = h.cx.b.build_int_add(kv, h.i64(1), "")?;
            let latch = h.here()?;
            kp.add_incoming(&[(&k1, latch)]);
            for (p, y) in phis.iter().zip(&next) {
                p.add_incoming(&[(y, latch)]);
            }
            let more =
                h.cx.b
                    .build_int_compare(IntPredicate::ULT, k1, h.i64(k), "")?;
            h.cx.b.build_conditional_branch(more, head, exit)?;
            h.cx.b.position_at_end(exit);
            for (p, y) in dsts.iter().zip(&next) {
                let st = h.cx.b.build_store(*p, *y)?;
                let _ = st.set_alignment(align);
            }
            Ok(())
        })
    }
}

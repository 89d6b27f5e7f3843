//! `reduce` and `scan` on the host: loops along the reduced axis, with
//! reassociation allowed where the interpreter's order does not bind the result.

use super::*;

impl<'a, 'ctx> H<'a, 'ctx> {
    /// `reduce` (`scan` = None) or `scan` (`Some(reverse)`) along `axis`.
    pub(super) fn reduce(
        &mut self,
        op: &Op,
        axis: u8,
        rop: ReduceOp,
        scan: Option<bool>,
    ) -> LResult<()> {
        let shape = self.shape(op.operands[0]);
        let a = axis as usize;
        if a >= shape.len() {
            return unsupported(op, "along a missing axis");
        }
        let e = self.elem(op.operands[0]);
        let Some(s) = e.scalar() else {
            return unsupported(op, "of pointers");
        };
        let bop = match rop {
            ReduceOp::Sum => BinaryOp::Add,
            ReduceOp::Prod => BinaryOp::Mul,
            ReduceOp::Min => BinaryOp::Min,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::And => BinaryOp::And,
            ReduceOp::Or => BinaryOp::Or,
            ReduceOp::Xor => BinaryOp::Xor,
        };
        let pre: u64 = shape[..a].iter().product();
        let len = shape[a];
        let post: u64 = shape[a + 1..].iter().product();
        let src = self.mat(op.operands[0])?;
        let re = self.elem(op.results[0]);
        let n_out = self.numel(op.results[0]);
        let out = self.slot(re, n_out)?;
        let combine = |h: &Self, x: BasicValueEnum<'ctx>, y: BasicValueEnum<'ctx>| {
            let r = elementwise::binary(&h.cx, bop, s, x, y)?;
            if scan.is_none()
                && matches!(s, ScalarType::F32 | ScalarType::F64)
                && bop == BinaryOp::Add
            {
                // A sum may be reassociated (vectorized), as every backend's tree does.
                crate::lower::arch::with_fast_math(r, inkwell::llvm_sys::LLVMFastMathAllowReassoc);
            }
            Ok::<_, LowerError>(r)
        };
        if len == 0 {
            return unsupported(op, "along an empty axis");
        }
        let w: u32 = if len.is_multiple_of(16) { 16 } else { 8 };
        let by_vectors = scan.is_none()
            && post == 1
            && len.is_multiple_of(w as u64)
            && matches!(src, V::T(_))
            && match bop {
                BinaryOp::Add => !s.is_float() || matches!(s, ScalarType::F32 | ScalarType::F64),
                BinaryOp::Max | BinaryOp::Min => !matches!(s, ScalarType::F16 | ScalarType::BF16),
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => s.is_int(),
                _ => false,
            }
            && s != ScalarType::I1
            && !s.is_fp8();
        match scan {
            None if by_vectors => {
                // Along the contiguous last axis: `w` partial results in a vector,
                // one vector of the row folded in per step, then the lanes folded
                // pairwise (a reassociation only for float sums, as any vector sum).
                let V::T(sp) = src else {
                    return unsupported(op, "of an unmaterialized tile");
                };
                let ty = self.lty(e);
                let vt = vec_of(ty, w)?;
                let fold = |h: &Self,
                            x: inkwell::values::VectorValue<'ctx>,
                            y: inkwell::values::VectorValue<'ctx>|
                 -> LResult<inkwell::values::VectorValue<'ctx>> {
                    let b = &h.cx.b;
                    let intr = |name: &str| -> LResult<inkwell::values::VectorValue<'ctx>> {
                        Ok(h.cx
                            .call_intrinsic(name, &[vt.into()], &[x.into(), y.into()])?
                            .into_vector_value())
                    };
                    let signed = s.is_signed_int();
                    Ok(match (bop, s.is_float()) {
                        (BinaryOp::Add, true) => {
                            let r = b.build_float_add(x, y, "")?;
                            crate::lower::arch::with_fast_math(
                                r.into(),
                                inkwell::llvm_sys::LLVMFastMathAllowReassoc,
                            );
                            r
                        }
                        (BinaryOp::Add, false) => b.build_int_add(x, y, "")?,
                        (BinaryOp::Max, true) => intr("llvm.maximum")?,
                        (BinaryOp::Min, true) => intr("llvm.minimum")?,
                        (BinaryOp::Max, false) => {
                            intr(if signed { "llvm.smax" } else { "llvm.umax" })?
                        }
                        (BinaryOp::Min, false) => {
                            intr(if signed { "llvm.smin" } else { "llvm.umin" })?
                        }
                        (BinaryOp::And, _) => b.build_and(x, y, "")?,
                        (BinaryOp::Or, _) => b.build_or(x, y, "")?,
                        _ => b.build_xor(x, y, "")?,
                    })
                };
                let chunks = len / w as u64;
                self.counted(pre, &mut |h, p| {
                    let row = h.cx.b.build_int_mul(p, h.i64(len), "")?;
                    let at = |h: &Self, c: IntValue<'ctx>| -> LResult<_> {
                        let i = h.cx.b.build_int_add(
                            row,
                            h.cx.b.build_int_mul(c, h.i64(w as u64), "")?,
                            "",
                        )?;
                        let x = h.cx.b.build_load(vt, h.gep(ty, sp, i)?, "")?;
                        set_align(x, elem_bytes(e));
                        Ok(x.into_vector_value())
                    };
                    let first = at(h, h.i64(0))?;
                    let acc = h.slot(e, w as u64)?;
                    let st = h.cx.b.build_store(acc, first)?;
                    let _ = st.set_alignment(elem_bytes(e) as u32);
                    h.counted(chunks - 1, &mut |h, c| {
                        let c = h.cx.b.build_int_add(c, h.i64(1), "")?;
                        let x = at(h, c)?;
                        let a = h.cx.b.build_load(vt, acc, "")?.into_vector_value();
                        let y = fold(h, a, x)?;
                        h.cx.b.build_store(acc, y)?;
                        Ok(())
                    })?;
                    let a = h.cx.b.build_load(vt, acc, "")?.into_vector_value();
                    let mut lanes: Vec<BasicValueEnum<'ctx>> = (0..w)
                        .map(|j| {
                            let j = h.cx.ctx.i32_type().const_int(j as u64, false);
                            h.cx.b.build_extract_element(a, j, "")
                        })
                        .collect::<Result<_, _>>()?;
                    while lanes.len() > 1 {
                        let half = lanes.len() / 2;
                        let mut next = Vec::with_capacity(half);
                        for j in 0..half {
                            next.push(combine(h, lanes[j], lanes[j + half])?);
                        }
                        lanes = next;
                    }
                    h.put(out, re, p, lanes[0])
                })?;
            }
            None => {
                // out[p, q] = in[p, 0, q]; then in[p, r, q] folded in, q innermost.
                self.nest(&[pre, post], &mut |h, pq| {
                    let si = h.linear(pq, &[len * post, 1])?;
                    let oi = h.linear(pq, &[post, 1])?;
                    let x = h.get(src, e, si)?;
                    h.put(out, re, oi, x)
                })?;
                if len > 1 {
                    self.nest(&[pre, len - 1, post], &mut |h, prq| {
                        let r = h.cx.b.build_int_add(prq[1], h.i64(1), "")?;
                        let si = h.linear(&[prq[0], r, prq[2]], &[len * post, post, 1])?;
                        let oi = h.linear(&[prq[0], prq[2]], &[post, 1])?;
                        let x = h.get(src, e, si)?;
                        let acc = h.get(V::T(out), re, oi)?;
                        let y = combine(h, acc, x)?;
                        h.put(out, re, oi, y)
                    })?;
                }
            }
            Some(reverse) => {
                self.nest(&[pre, post], &mut |h, pq| {
                    let first = if reverse { len - 1 } else { 0 };
                    let at = |h: &Self, r: IntValue<'ctx>| {
                        h.linear(&[pq[0], r, pq[1]], &[len * post, post, 1])
                    };
                    let i0 = at(h, h.i64(first))?;
                    let x = h.get(src, e, i0)?;
                    h.put(out, re, i0, x)?;
                    h.counted(len - 1, &mut |h, r| {
                        // Step r + 1 from the start (from the end when reversed).
                        let (cur, prev) = if reverse {
                            let c = h.cx.b.build_int_sub(h.i64(len - 2), r, "")?;
                            (c, h.cx.b.build_int_add(c, h.i64(1), "")?)
                        } else {
                            (h.cx.b.build_int_add(r, h.i64(1), "")?, r)
                        };
                        let (ci, pi) = (at(h, cur)?, at(h, prev)?);
                        let acc = h.get(V::T(out), re, pi)?;
                        let x = h.get(src, e, ci)?;
                        let y = combine(h, acc, x)?;
                        h.put(out, re, ci, y)
                    })
                })?;
            }
        }
        if self.f.ty(op.results[0]).shape.is_empty() {
            let v = self.get(V::T(out), re, self.i64(0))?;
            self.set(op, V::U(v));
        } else {
            self.set(op, V::T(out));
        }
        Ok(())
    }
}

//! Element semantics spelled out where Tile IR's differ from the interpreter's: math
//! on half floats through f32, reductions and scans with their identities, float to
//! integer saturating, integer division by zero and `MIN / -1`.

use super::*;

impl Lowerer<'_> {
    /// `u` of `x`; f16 and bf16 math runs in f32 and rounds once, as the interpreter's.
    pub(super) fn unary(
        &mut self,
        op: &Op,
        u: UnaryOp,
        s: ScalarType,
        x: Value,
        r: ValueId,
    ) -> Result<Value, CodegenError> {
        let shape = self.f.ty(r).shape.clone();
        let ty = self.ty(r);
        let nearest = ("rounding_mode", Attribute::i32(0));
        if s.is_int() || s == ScalarType::I1 {
            let wrap = ("overflow", Attribute::i32(0));
            return Ok(match u {
                UnaryOp::Neg => self.op1(Opcode::NegI, &[x], ty, &[wrap]),
                UnaryOp::Not => {
                    let ones = if s == ScalarType::I1 {
                        ConstValue::Bool(true)
                    } else {
                        ConstValue::Int(-1)
                    };
                    let m = self.const_splat(s, ones, &shape);
                    self.op1(Opcode::XOrI, &[x, m], ty, &[])
                }
                UnaryOp::Abs => self.op1(Opcode::AbsI, &[x], ty, &[]),
                UnaryOp::Popc if s != ScalarType::I1 => self.popc(x, s, &shape, ty),
                UnaryOp::Clz if s != ScalarType::I1 => self.clz(x, s, &shape, ty),
                _ => {
                    return Err(
                        self.unsupported(op, &format!("on {s} is not lowered to Tile IR yet"))
                    );
                }
            });
        }
        let half = matches!(s, ScalarType::F16 | ScalarType::BF16);
        let work = if half { ScalarType::F32 } else { s };
        let wty = tile(&shape, TileElementType::Scalar(scalar(work)));
        let x = if half {
            self.op1(
                Opcode::FToF,
                &[x],
                wty.clone(),
                std::slice::from_ref(&nearest),
            )
        } else {
            x
        };
        let (code, attrs): (Opcode, Vec<(&str, Attribute)>) = match u {
            UnaryOp::Neg => (Opcode::NegF, vec![]),
            UnaryOp::Abs => (Opcode::AbsF, vec![]),
            UnaryOp::Exp => (Opcode::Exp, vec![]),
            UnaryOp::Exp2 => (Opcode::Exp2, vec![]),
            UnaryOp::Log => (Opcode::Log, vec![]),
            UnaryOp::Log2 => (Opcode::Log2, vec![]),
            UnaryOp::Sqrt => (Opcode::Sqrt, vec![nearest.clone()]),
            UnaryOp::Rsqrt => (Opcode::Rsqrt, vec![]),
            UnaryOp::Sin => (Opcode::Sin, vec![]),
            UnaryOp::Cos => (Opcode::Cos, vec![]),
            UnaryOp::Tanh => (Opcode::TanH, vec![]),
            UnaryOp::Floor => (Opcode::Floor, vec![]),
            UnaryOp::Ceil => (Opcode::Ceil, vec![]),
            UnaryOp::Erf => {
                let y = self.erf(x, work, &shape, wty);
                return Ok(if half {
                    self.op1(Opcode::FToF, &[y], ty, &[nearest])
                } else {
                    y
                });
            }
            _ => {
                return Err(
                    self.unsupported(op, &format!("`{u:?}` on {s} is not lowered to Tile IR yet"))
                );
            }
        };
        let y = self.op1(code, &[x], wty, &attrs);
        Ok(if half {
            self.op1(Opcode::FToF, &[y], ty, &[nearest])
        } else {
            y
        })
    }

    /// `dot_scaled`: Tile IR's `mmaf_scaled` (Blackwell's block-scaled tensor-core
    /// instructions), its operands as Tile IR's narrow float types: packed E2M1 bytes
    /// unpacked (the low nibble first, as Tile IR's `unpack` reads a byte array),
    /// E8M0 scale bytes reinterpreted as `f8E8M0FNU`.
    pub(super) fn dot_scaled(
        &mut self,
        op: &Op,
        format: tessera_ir::ir::ScaledFormat,
        r: ValueId,
    ) -> Result<Value, CodegenError> {
        use tessera_ir::ir::ScaledFormat;
        let operand = |l: &mut Self, v: ValueId| -> Value {
            let x = l.val(v);
            if format != ScaledFormat::E2M1 {
                return x;
            }
            let sh = l.f.ty(v).shape.clone();
            let bytes = sh.iter().product::<u32>();
            let flat = l.op1(
                Opcode::Reshape,
                &[x],
                tile(&[bytes], TileElementType::Scalar(TScalar::I8)),
                &[],
            );
            let f4 = l.op1(
                Opcode::Unpack,
                &[flat],
                tile(&[bytes * 2], TileElementType::Scalar(TScalar::F4E2M1FN)),
                &[],
            );
            l.op1(
                Opcode::Reshape,
                &[f4],
                tile(
                    &[sh[0], sh[1] * 2],
                    TileElementType::Scalar(TScalar::F4E2M1FN),
                ),
                &[],
            )
        };
        let scale = |l: &mut Self, v: ValueId| -> Value {
            let x = l.val(v);
            if l.f.ty(v).scalar_type() != Some(ScalarType::U8) {
                return x;
            }
            let sh = l.f.ty(v).shape.clone();
            l.op1(
                Opcode::Bitcast,
                &[x],
                tile(&sh, TileElementType::Scalar(TScalar::F8E8M0FNU)),
                &[],
            )
        };
        let (a, b) = (operand(self, op.operands[0]), operand(self, op.operands[2]));
        let (sa, sb) = (scale(self, op.operands[1]), scale(self, op.operands[3]));
        let acc = self.val(op.operands[4]);
        let ty = self.ty(r);
        Ok(self.op1(Opcode::MmaFScaled, &[a, b, acc, sa, sb], ty, &[]))
    }

    /// `popc`: the bits set, by the parallel (SWAR) count at the element's width.
    fn popc(&mut self, x: Value, s: ScalarType, shape: &[u32], ty: Type) -> Value {
        let w = s.bits();
        let c = |l: &mut Self, v: u64| {
            let v = if w >= 64 { v } else { v & ((1u64 << w) - 1) };
            l.const_splat(s, ConstValue::Int(v as i64), shape)
        };
        let wrap = ("overflow", Attribute::i32(0));
        let logical = ("signedness", Attribute::i32(0));
        let shr = |l: &mut Self, v: Value, n: i64| {
            let n = l.const_splat(s, ConstValue::Int(n), shape);
            l.op1(
                Opcode::ShRI,
                &[v, n],
                ty.clone(),
                std::slice::from_ref(&logical),
            )
        };
        let and = |l: &mut Self, a: Value, b: Value| l.op1(Opcode::AndI, &[a, b], ty.clone(), &[]);
        let add = |l: &mut Self, a: Value, b: Value| {
            l.op1(
                Opcode::AddI,
                &[a, b],
                ty.clone(),
                std::slice::from_ref(&wrap),
            )
        };
        let (m1, m2, m4) = (
            c(self, 0x5555_5555_5555_5555),
            c(self, 0x3333_3333_3333_3333),
            c(self, 0x0f0f_0f0f_0f0f_0f0f),
        );
        // v - ((v >> 1) & m1): each 2-bit field holds its count.
        let t = shr(self, x, 1);
        let t = and(self, t, m1);
        let v = self.op1(
            Opcode::SubI,
            &[x, t],
            ty.clone(),
            std::slice::from_ref(&wrap),
        );
        // 4-bit fields.
        let lo = and(self, v, m2);
        let hi = shr(self, v, 2);
        let hi = and(self, hi, m2);
        let v = add(self, lo, hi);
        // Bytes.
        let t = shr(self, v, 4);
        let v = add(self, v, t);
        let v = and(self, v, m4);
        if w == 8 {
            return v;
        }
        // The bytes summed into the top byte, then down.
        let h = c(self, 0x0101_0101_0101_0101);
        let v = self.op1(Opcode::MulI, &[v, h], ty.clone(), &[wrap]);
        shr(self, v, i64::from(w) - 8)
    }

    /// `clz`: the leading zero bits (the width for 0), by halving: where the top `k`
    /// bits are zero, count them and shift them out, for `k` = w/2, w/4, .. 1.
    fn clz(&mut self, x: Value, s: ScalarType, shape: &[u32], ty: Type) -> Value {
        let w = i64::from(s.bits());
        let i1 = tile(shape, TileElementType::Scalar(TScalar::I1));
        let logical = ("signedness", Attribute::i32(0));
        let zero = self.const_splat(s, ConstValue::Int(0), shape);
        let mut n = zero;
        let mut v = x;
        let mut k = w / 2;
        while k >= 1 {
            let sh = self.const_splat(s, ConstValue::Int(w - k), shape);
            let top = self.op1(
                Opcode::ShRI,
                &[v, sh],
                ty.clone(),
                std::slice::from_ref(&logical),
            );
            let none = self.op1(
                Opcode::CmpI,
                &[top, zero],
                i1.clone(),
                &[
                    ("comparison_predicate", Attribute::i32(0)),
                    ("signedness", Attribute::i32(0)),
                ],
            );
            let kk = self.const_splat(s, ConstValue::Int(k), shape);
            let n2 = self.op1(
                Opcode::AddI,
                &[n, kk],
                ty.clone(),
                &[("overflow", Attribute::i32(0))],
            );
            n = self.op1(Opcode::Select, &[none, n2, n], ty.clone(), &[]);
            let v2 = self.op1(
                Opcode::ShLI,
                &[v, kk],
                ty.clone(),
                &[("overflow", Attribute::i32(0))],
            );
            v = self.op1(Opcode::Select, &[none, v2, v], ty.clone(), &[]);
            k /= 2;
        }
        // The last bit: 0 only when `x` was 0.
        let sh = self.const_splat(s, ConstValue::Int(w - 1), shape);
        let top = self.op1(Opcode::ShRI, &[v, sh], ty.clone(), &[logical]);
        let one = self.const_splat(s, ConstValue::Int(1), shape);
        let last = self.op1(Opcode::XOrI, &[top, one], ty.clone(), &[]);
        self.op1(
            Opcode::AddI,
            &[n, last],
            ty,
            &[("overflow", Attribute::i32(0))],
        )
    }

    /// `erf` in the float type `work` (f32 or f64), as the SIMT lowering computes it:
    /// the Taylor series `2/sqrt(pi) * x * sum (-1)^n x^2n / (n! (2n+1))` for
    /// `|x| < 0.5`, else Abramowitz and Stegun 7.1.26 with the sign of `x`.
    fn erf(&mut self, x: Value, work: ScalarType, shape: &[u32], ty: Type) -> Value {
        let nearest = ("rounding_mode", Attribute::i32(0));
        let c = |l: &mut Self, v: f64| l.const_splat(work, ConstValue::Float(v), shape);
        let mul = |l: &mut Self, a: Value, b: Value| {
            l.op1(
                Opcode::MulF,
                &[a, b],
                ty.clone(),
                std::slice::from_ref(&nearest),
            )
        };
        let add = |l: &mut Self, a: Value, b: Value| {
            l.op1(
                Opcode::AddF,
                &[a, b],
                ty.clone(),
                std::slice::from_ref(&nearest),
            )
        };
        // Horner's rule, highest coefficient first.
        let poly = |l: &mut Self, t: Value, coeffs: &[f64]| {
            let mut acc = c(l, coeffs[coeffs.len() - 1]);
            for &k in coeffs[..coeffs.len() - 1].iter().rev() {
                let m = mul(l, acc, t);
                let k = c(l, k);
                acc = add(l, m, k);
            }
            acc
        };
        use crate::lower::elementwise::{ERF_AS, ERF_AS_T, ERF_SERIES, ERF_SMALL};
        let x2 = mul(self, x, x);
        let p = poly(self, x2, &ERF_SERIES);
        let small = mul(self, x, p);
        let ax = self.op1(Opcode::AbsF, &[x], ty.clone(), &[]);
        let one = c(self, 1.0);
        let a = c(self, ERF_AS_T);
        let d = mul(self, ax, a);
        let d = add(self, one, d);
        let t = self.op1(
            Opcode::DivF,
            &[one, d],
            ty.clone(),
            std::slice::from_ref(&nearest),
        );
        let pp = poly(self, t, &ERF_AS);
        let nx2 = self.op1(Opcode::NegF, &[x2], ty.clone(), &[]);
        let e = self.op1(Opcode::Exp, &[nx2], ty.clone(), &[]);
        let pe = mul(self, pp, e);
        let big = self.op1(Opcode::SubF, &[one, pe], ty.clone(), &[nearest]);
        let nbig = self.op1(Opcode::NegF, &[big], ty.clone(), &[]);
        let i1 = tile(shape, TileElementType::Scalar(TScalar::I1));
        let cmp = |l: &mut Self, a: Value, b: Value, pred: i64| {
            l.op1(
                Opcode::CmpF,
                &[a, b],
                i1.clone(),
                &[
                    ("comparison_predicate", Attribute::i32(pred)),
                    ("comparison_ordering", Attribute::i32(1)),
                ],
            )
        };
        let zero = c(self, 0.0);
        let neg = cmp(self, x, zero, 2);
        let big = self.op1(Opcode::Select, &[neg, nbig, big], ty.clone(), &[]);
        let half = c(self, ERF_SMALL);
        let is_small = cmp(self, ax, half, 2);
        self.op1(Opcode::Select, &[is_small, small, big], ty, &[])
    }

    /// `reduce` (`scan: None`) or `scan` (`Some(reverse)`) along `axis`: Tile IR's
    /// op with the combining op in its region and the op's identity. Tile IR fixes no
    /// combining order (as on the SIMT path, float sums may round differently from
    /// the interpreter's sequential order; integer results are exact).
    pub(super) fn combine(
        &mut self,
        op: &Op,
        axis: u32,
        rop: ReduceOp,
        scan: Option<bool>,
        r: ValueId,
    ) -> Result<Value, CodegenError> {
        let s = self
            .f
            .ty(r)
            .scalar_type()
            .ok_or_else(|| self.unsupported(op, "of pointers"))?;
        if s.is_fp8() {
            return Err(self.unsupported(op, &format!("of {s} is not lowered to Tile IR yet")));
        }
        let ts = scalar(s);
        let bits = s.bits();
        let identity = if s.is_float() {
            let v = match rop {
                ReduceOp::Sum => 0.0,
                ReduceOp::Prod => 1.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Min => f64::INFINITY,
                _ => return Err(self.unsupported(op, &format!("`{rop:?}` on {s}"))),
            };
            Attribute::float(v, ts)
        } else {
            let signed = s.is_signed_int();
            let v: i64 = match rop {
                ReduceOp::Sum | ReduceOp::Or | ReduceOp::Xor => 0,
                ReduceOp::Prod => 1,
                ReduceOp::And => -1,
                ReduceOp::Max if signed => -(1i64 << (bits - 1).min(63)),
                ReduceOp::Max => 0,
                ReduceOp::Min if signed => ((1u64 << (bits - 1).min(63)) - 1) as i64,
                ReduceOp::Min => -1,
            };
            // Integer attributes are the value's bits at the element's width.
            let bits = if bits >= 64 {
                v
            } else {
                ((v as u64) & ((1u64 << bits) - 1)) as i64
            };
            Attribute::int(bits, ts)
        };
        let elem = tile(&[], TileElementType::Scalar(ts));
        let (region, blk, args) =
            build_single_block_region(&mut self.m, &[elem.clone(), elem.clone()]);
        let outer = std::mem::replace(&mut self.blk, blk);
        let sign = ("signedness", Attribute::i32(i64::from(s.is_signed_int())));
        let nan = ("propagate_nan", Attribute::Bool(true));
        let wrap = ("overflow", Attribute::i32(0));
        let nearest = ("rounding_mode", Attribute::i32(0));
        let (code, attrs): (Opcode, Vec<(&str, Attribute)>) = match (rop, s.is_float()) {
            (ReduceOp::Sum, true) => (Opcode::AddF, vec![nearest]),
            (ReduceOp::Prod, true) => (Opcode::MulF, vec![nearest]),
            (ReduceOp::Max, true) => (Opcode::MaxF, vec![nan]),
            (ReduceOp::Min, true) => (Opcode::MinF, vec![nan]),
            (ReduceOp::Sum, false) => (Opcode::AddI, vec![wrap]),
            (ReduceOp::Prod, false) => (Opcode::MulI, vec![wrap]),
            (ReduceOp::Max, false) => (Opcode::MaxI, vec![sign]),
            (ReduceOp::Min, false) => (Opcode::MinI, vec![sign]),
            (ReduceOp::And, false) => (Opcode::AndI, vec![]),
            (ReduceOp::Or, false) => (Opcode::OrI, vec![]),
            (ReduceOp::Xor, false) => (Opcode::XOrI, vec![]),
            _ => unreachable!("float bitwise reductions were refused above"),
        };
        let c = self.op1(code, &[args[0], args[1]], elem, &attrs);
        self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operand(c));
        self.blk = outer;
        let x = self.val(op.operands[0]);
        let ty = self.ty(r);
        let mut b = OpBuilder::new(
            if scan.is_some() {
                Opcode::Scan
            } else {
                Opcode::Reduce
            },
            Location::Unknown,
        )
        .operand(x)
        .result(ty)
        .attr("dim", Attribute::i32(i64::from(axis)));
        if let Some(reverse) = scan {
            b = b.attr("reverse", Attribute::Bool(reverse));
        }
        Ok(self.emit(
            b.attr("identities", Attribute::Array(vec![identity]))
                .region(region),
        )[0])
    }

    /// Float `x` to integer type `to` as Rust's `as` (the interpreter's cast):
    /// truncation towards zero, saturating at the type's bounds, NaN to 0. Tile IR's
    /// `ftoi` only ever sees values in range.
    pub(super) fn float_to_int(
        &mut self,
        x: Value,
        from: ScalarType,
        to: ScalarType,
        shape: &[u32],
        ty: Type,
    ) -> Value {
        let bits = to.bits();
        let signed = to.is_signed_int();
        // Powers of two: exact in every float type (or infinite, which still orders).
        let (lo, hi) = if signed {
            (-(2f64.powi(bits as i32 - 1)), 2f64.powi(bits as i32 - 1))
        } else {
            (0.0, 2f64.powi(bits as i32))
        };
        let (min, max): (i64, i64) = if signed {
            (i64::MIN >> (64 - bits), i64::MAX >> (64 - bits))
        } else {
            (
                0,
                if bits >= 64 {
                    -1
                } else {
                    ((1u64 << bits) - 1) as i64
                },
            )
        };
        let bty = tile(shape, TileElementType::Scalar(TScalar::I1));
        let fty = self.ty_of(from, shape);
        let cmp = |l: &mut Self, a: Value, b: Value, pred: i64, ordered: i64| {
            l.op1(
                Opcode::CmpF,
                &[a, b],
                bty.clone(),
                &[
                    ("comparison_predicate", Attribute::i32(pred)),
                    ("comparison_ordering", Attribute::i32(ordered)),
                ],
            )
        };
        let hi_v = self.const_splat(from, ConstValue::Float(hi), shape);
        let lo_v = self.const_splat(from, ConstValue::Float(lo), shape);
        let zero_f = self.const_splat(from, ConstValue::Float(0.0), shape);
        let too_big = cmp(self, x, hi_v, 5, 1);
        let too_small = cmp(self, x, lo_v, 3, 1);
        let nan = cmp(self, x, x, 1, 0);
        let out = self.op1(Opcode::OrI, &[too_big, too_small], bty.clone(), &[]);
        let out = self.op1(Opcode::OrI, &[out, nan], bty, &[]);
        let safe = self.op1(Opcode::Select, &[out, zero_f, x], fty, &[]);
        let t = self.op1(
            Opcode::FToI,
            &[safe],
            ty.clone(),
            &[
                ("signedness", Attribute::i32(i64::from(signed))),
                // `nearest_int_to_zero`, the only mode `ftoi` has: truncation.
                ("rounding_mode", Attribute::i32(6)),
            ],
        );
        let min_v = self.const_splat(to, ConstValue::Int(min), shape);
        let max_v = self.const_splat(to, ConstValue::Int(max), shape);
        let zero = self.const_splat(to, ConstValue::Int(0), shape);
        let v = self.op1(Opcode::Select, &[too_small, min_v, t], ty.clone(), &[]);
        let v = self.op1(Opcode::Select, &[too_big, max_v, v], ty.clone(), &[]);
        self.op1(Opcode::Select, &[nan, zero, v], ty, &[])
    }

    /// Integer `a / c` or `a % c` as the SIMT lowering computes them: division by zero
    /// gives 0 (the interpreter reports it; GPUs cannot), `MIN / -1` wraps and
    /// `MIN % -1` is 0, so Tile IR never sees a divisor it leaves undefined.
    pub(super) fn int_div(
        &mut self,
        b: BinaryOp,
        s: ScalarType,
        a: Value,
        c: Value,
        shape: &[u32],
        ty: Type,
    ) -> Value {
        let signed = s.is_signed_int();
        let bty = tile(shape, TileElementType::Scalar(TScalar::I1));
        let zero = self.const_splat(s, ConstValue::Int(0), shape);
        let one = self.const_splat(s, ConstValue::Int(1), shape);
        let cmp = |l: &mut Self, x: Value, y: Value| {
            l.op1(
                Opcode::CmpI,
                &[x, y],
                bty.clone(),
                &[
                    ("comparison_predicate", Attribute::i32(0)),
                    ("signedness", Attribute::i32(i64::from(signed))),
                ],
            )
        };
        let is0 = cmp(self, c, zero);
        let m1 = if signed {
            let all = self.const_splat(s, ConstValue::Int(-1), shape);
            Some(cmp(self, c, all))
        } else {
            None
        };
        let bad = match m1 {
            Some(m1) => self.op1(Opcode::OrI, &[is0, m1], bty.clone(), &[]),
            None => is0,
        };
        let safe = self.op1(Opcode::Select, &[bad, one, c], ty.clone(), &[]);
        let sign = ("signedness", Attribute::i32(i64::from(signed)));
        let q = if b == BinaryOp::Div {
            // Rounding towards zero, as Rust's and the hardware's.
            self.op1(
                Opcode::DivI,
                &[a, safe],
                ty.clone(),
                &[sign, ("rounding", Attribute::i32(1))],
            )
        } else {
            self.op1(Opcode::RemI, &[a, safe], ty.clone(), &[sign])
        };
        let q = match m1 {
            Some(m1) => {
                let alt = if b == BinaryOp::Div {
                    self.op1(
                        Opcode::SubI,
                        &[zero, a],
                        ty.clone(),
                        &[("overflow", Attribute::i32(0))],
                    )
                } else {
                    zero
                };
                self.op1(Opcode::Select, &[m1, alt, q], ty.clone(), &[])
            }
            None => q,
        };
        self.op1(Opcode::Select, &[is0, zero, q], ty, &[])
    }
}

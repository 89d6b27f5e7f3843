//! Elementwise ops: binary, unary (math), fma, cmp, select, cast. Semantics follow the
//! interpreter (see the table in [`super`]); `f16`/`bf16` arithmetic and math are
//! computed in `f32` and rounded once.

use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use tessera_ir::ir::{BinaryOp, CmpPred, Op, OpKind, UnaryOp};
use tessera_ir::{Elem, ScalarType, Span};

use super::arch::approx;
use super::{Cx, LResult, Lowerer, Tile, unsupported};

/// `erf`, as both NVIDIA backends compute it (the SIMT lowering here, Tile IR's in
/// `crate::tileir`): below [`ERF_SMALL`], `x * poly(x^2)` with the Taylor series
/// `2/sqrt(pi) * sum (-1)^n x^2n / (n! (2n+1))` ([`ERF_SERIES`], lowest first); else
/// Abramowitz and Stegun 7.1.26, `1 - poly(t) * exp(-x^2)` with
/// `t = 1 / (1 + ERF_AS_T * |x|)` ([`ERF_AS`]), with the sign of `x`.
pub(crate) const ERF_SERIES: [f64; 8] = {
    let k = std::f64::consts::FRAC_2_SQRT_PI;
    [
        k,
        -k / 3.0,
        k / 10.0,
        -k / 42.0,
        k / 216.0,
        -k / 1320.0,
        k / 9360.0,
        -k / 75600.0,
    ]
};
/// See [`ERF_SERIES`].
pub(crate) const ERF_AS: [f64; 6] = [
    0.0,
    0.254829592,
    -0.284496736,
    1.421413741,
    -1.453152027,
    1.061405429,
];
/// See [`ERF_SERIES`].
pub(crate) const ERF_AS_T: f64 = 0.3275911;
/// See [`ERF_SERIES`].
pub(crate) const ERF_SMALL: f64 = 0.5;

/// Lowers an elementwise op.
pub(super) fn lower<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    let mut ops: Vec<Tile<'ctx>> = op
        .operands
        .iter()
        .map(|&v| l.val(v))
        .collect::<LResult<_>>()?;
    // The operands meet in the layout of the first one that cannot be recomputed
    // cheaply (else of the first non-uniform one); the others are recomputed or
    // converted into it.
    let lead = (0..ops.len())
        .find(|&i| !ops[i].uniform && !l.rematerializable(op.operands[i]))
        .or_else(|| (0..ops.len()).find(|&i| !ops[i].uniform))
        .unwrap_or(0);
    let leader = ops[lead].layout.clone();
    for (i, t) in ops.iter_mut().enumerate() {
        *t = l.relayout(op.operands[i], t, &leader, &op.span)?;
    }
    lower_with(l, op, ops)
}

/// The elementwise `op` on operand tiles already in one layout (uniform ones in any).
pub(super) fn lower_with<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    op: &Op,
    ops: Vec<Tile<'ctx>>,
) -> LResult<Tile<'ctx>> {
    let res_elem = l.f.ty(op.results[0]).elem;
    let in_elem = ops[if op.kind == OpKind::Select { 1 } else { 0 }].elem;
    let s_in = in_elem.scalar();
    let s_out = res_elem.scalar();
    let all_uniform = ops.iter().all(|t| t.uniform);
    let leader = ops
        .iter()
        .find(|t| !t.uniform)
        .unwrap_or(&ops[0])
        .layout
        .clone();
    let n = if all_uniform { 1 } else { leader.num_regs() };
    let mut regs = Vec::with_capacity(n);
    // One site per op for the emulator's divisor check.
    let div_site = (matches!(op.kind, OpKind::Binary(BinaryOp::Div | BinaryOp::Rem))
        && s_in.is_some_and(|s| s.is_int()))
    .then(|| l.new_site("integer division"));
    // Registers the axis analysis proves equal to a lower one (constancy runs, e.g. a
    // mask `kc < seq_k` with `seq_k` a multiple of 16) are computed once.
    let same = if div_site.is_some() || all_uniform {
        0
    } else {
        constant_reg_bits(l, op, &leader)
    };
    for r in 0..n {
        if r & same != 0 {
            regs.push(regs[r & !same]);
            continue;
        }
        let args: Vec<BasicValueEnum<'ctx>> = ops.iter().map(|t| t.regs[r]).collect();
        if let Some(site) = div_site {
            l.arch
                .check_divisor(&l.cx, args[1].into_int_value(), site)?;
        }
        let v = match &op.kind {
            OpKind::Binary(BinaryOp::Pow) => {
                pow(&l.cx, l.arch, sc(s_in), args[0], args[1], &op.span)?
            }
            OpKind::Binary(b) => binary(&l.cx, *b, sc(s_in), args[0], args[1])?,
            OpKind::Unary(u) => unary(&l.cx, l.arch, *u, sc(s_in), args[0], &op.span)?,
            OpKind::Fma => fma(&l.cx, sc(s_in), &args)?,
            OpKind::Cmp(p) => cmp(&l.cx, *p, sc(s_in), args[0], args[1])?,
            OpKind::Select => {
                l.cx.b
                    .build_select(args[0].into_int_value(), args[1], args[2], "")?
            }
            OpKind::Cast => cast(&l.cx, sc(s_in), sc(s_out), args[0])?,
            OpKind::Bitcast => {
                let to = l.ty(res_elem);
                l.cx.b.build_bit_cast(args[0], to, "")?
            }
            _ => unreachable!("not an elementwise op"),
        };
        regs.push(v);
    }
    if all_uniform {
        return Ok(l.uniform_tile(res_elem, leader, regs[0]));
    }
    Ok(Tile {
        elem: res_elem,
        layout: leader,
        regs,
        uniform: false,
    })
}

/// The register bits of `lay` (the layout of `op`'s result) along which the result is
/// constant: a zero basis (a replica), or a basis inside the low bits of a dimension
/// in which the axis analysis proves runs of equal values at least that long.
fn constant_reg_bits(l: &Lowerer<'_, '_>, op: &Op, lay: &crate::layout::Layout) -> usize {
    let shape = &l.f.ty(op.results[0]).shape;
    if shape.is_empty() || *shape != lay.shape || !lay.is_bit_layout() {
        return 0;
    }
    let cst = l.axis.get(l.f, op.results[0]).constancy;
    let off = crate::layout::dim_bit_offsets(shape);
    let mut mask = 0usize;
    for (i, &b) in lay.reg.iter().enumerate() {
        let equal = b == 0 || {
            let pos = b.trailing_zeros();
            (0..shape.len()).any(|d| {
                let w = shape[d].trailing_zeros();
                pos >= off[d] && pos < off[d] + w && 1u64 << (pos - off[d]) < cst[d]
            })
        };
        if equal {
            mask |= 1 << i;
        }
    }
    mask
}

fn sc(s: Option<ScalarType>) -> ScalarType {
    s.unwrap_or(ScalarType::I64)
}

fn is_half(s: ScalarType) -> bool {
    matches!(s, ScalarType::F16 | ScalarType::BF16)
}

fn fty<'ctx>(cx: &Cx<'ctx>, s: ScalarType) -> inkwell::types::FloatType<'ctx> {
    match s {
        ScalarType::F16 => cx.ctx.f16_type(),
        ScalarType::BF16 => cx.ctx.bf16_type(),
        ScalarType::F64 => cx.ctx.f64_type(),
        _ => cx.ctx.f32_type(),
    }
}

fn ity<'ctx>(cx: &Cx<'ctx>, s: ScalarType) -> inkwell::types::IntType<'ctx> {
    cx.int_ty(s.bits())
}

/// Widens a half float to f32 (identity otherwise).
fn widen<'ctx>(cx: &Cx<'ctx>, s: ScalarType, v: BasicValueEnum<'ctx>) -> LResult<FloatValue<'ctx>> {
    let v = v.into_float_value();
    if is_half(s) {
        Ok(cx.b.build_float_ext(v, cx.ctx.f32_type(), "")?)
    } else {
        Ok(v)
    }
}

/// Rounds an f32 result back to a half float (identity otherwise).
fn narrow<'ctx>(
    cx: &Cx<'ctx>,
    s: ScalarType,
    v: FloatValue<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    if is_half(s) {
        Ok(trunc_float(cx, v, s)?.into())
    } else {
        Ok(v.into())
    }
}

/// `x` (f32 or f64) rounded to the narrower float `to` (nearest even, one rounding).
///
/// On the host ([`Cx::host`]) a conversion to bf16 is written out in integer
/// arithmetic: LLVM selects AVX512-BF16's `vcvtneps2bf16` for `fptrunc` where the
/// host has it, and that instruction flushes subnormal inputs and results to zero,
/// so the same kernel gave other results on such a CPU. From f64 to either half
/// float, the value is first rounded to f32 with round-to-odd, which keeps the
/// second rounding exact (f32 carries more than two bits beyond a half float's), as
/// the interpreter does: LLVM's host lowering of `fptrunc` f64 to f16 rounded twice
/// (2^-25 plus a little became 0, not the smallest subnormal).
pub(super) fn trunc_float<'ctx>(
    cx: &Cx<'ctx>,
    x: FloatValue<'ctx>,
    to: ScalarType,
) -> LResult<FloatValue<'ctx>> {
    if !(cx.host && is_half(to)) {
        return Ok(cx.b.build_float_trunc(x, fty(cx, to), "")?);
    }
    let bd = &cx.b;
    let i32t = cx.ctx.i32_type();
    let c = |v: u32| i32t.const_int(u64::from(v), false);
    let x = if x.get_type() == cx.ctx.f64_type() {
        f64_to_f32_odd(cx, x)?
    } else {
        x
    };
    if to == ScalarType::F16 {
        // F16C's `vcvtps2ph` ignores the flush-to-zero mode and rounds subnormals
        // right (without F16C, LLVM calls compiler-rt, which does too).
        return Ok(bd.build_float_trunc(x, fty(cx, to), "")?);
    }
    let u = bd.build_bit_cast(x, i32t, "")?.into_int_value();
    // Nearest even on the bits: add 0x7fff plus the kept part's lowest bit, keep the
    // top half (a carry into the exponent rounds up to the next binade or to
    // infinity, as it should; subnormals round the same way).
    let lsb = bd.build_and(bd.build_right_shift(u, c(16), false, "")?, c(1), "")?;
    let r = bd.build_int_add(u, bd.build_int_add(c(0x7fff), lsb, "")?, "")?;
    let rounded = bd.build_right_shift(r, c(16), false, "")?;
    // NaN: the top half with the quiet bit set.
    let quiet = bd.build_or(bd.build_right_shift(u, c(16), false, "")?, c(0x40), "")?;
    let mag = bd.build_and(u, c(0x7fff_ffff), "")?;
    let nan = bd.build_int_compare(IntPredicate::UGT, mag, c(0x7f80_0000), "")?;
    let bits = bd.build_select(nan, quiet, rounded, "")?.into_int_value();
    let h = bd.build_int_truncate(bits, cx.ctx.i16_type(), "")?;
    Ok(bd
        .build_bit_cast(h, cx.ctx.bf16_type(), "")?
        .into_float_value())
}

/// `x` (f64) rounded to f32 with round-to-odd: exact values as they are, inexact
/// ones to the neighbour toward zero with its lowest mantissa bit set (a finite
/// value beyond f32's range to ±`f32::MAX`). NaN stays NaN.
fn f64_to_f32_odd<'ctx>(cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
    let bd = &cx.b;
    let (i32t, f32t, f64t) = (cx.ctx.i32_type(), cx.ctx.f32_type(), cx.ctx.f64_type());
    let t = bd.build_float_trunc(x, f32t, "")?;
    let back = bd.build_float_ext(t, f64t, "")?;
    let inexact = bd.build_float_compare(FloatPredicate::ONE, back, x, "")?;
    let fabs = |v: FloatValue<'ctx>| -> LResult<FloatValue<'ctx>> {
        Ok(cx
            .call_intrinsic("llvm.fabs", &[f64t.into()], &[v.into()])?
            .into_float_value())
    };
    let away = bd.build_float_compare(FloatPredicate::OGT, fabs(back)?, fabs(x)?, "")?;
    let tb = bd.build_bit_cast(t, i32t, "")?.into_int_value();
    let toward = bd.build_int_sub(tb, i32t.const_int(1, false), "")?;
    let toward = bd.build_select(away, toward, tb, "")?.into_int_value();
    let odd = bd.build_or(toward, i32t.const_int(1, false), "")?;
    let bits = bd.build_select(inexact, odd, tb, "")?;
    Ok(bd.build_bit_cast(bits, f32t, "")?.into_float_value())
}

fn intr<'ctx>(
    cx: &Cx<'ctx>,
    name: &str,
    v: &[BasicValueEnum<'ctx>],
) -> LResult<BasicValueEnum<'ctx>> {
    let t: BasicTypeEnum = v[0].get_type();
    cx.call_intrinsic(name, &[t], v)
}

/// `a op b` with the interpreter's semantics.
pub(super) fn binary<'ctx>(
    cx: &Cx<'ctx>,
    op: BinaryOp,
    s: ScalarType,
    a: BasicValueEnum<'ctx>,
    b: BasicValueEnum<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    let bd = &cx.b;
    if s.is_float() {
        let (x, y) = (widen(cx, s, a)?, widen(cx, s, b)?);
        let r: FloatValue = match op {
            BinaryOp::Add => bd.build_float_add(x, y, "")?,
            BinaryOp::Sub => bd.build_float_sub(x, y, "")?,
            BinaryOp::Mul => bd.build_float_mul(x, y, "")?,
            BinaryOp::Div => bd.build_float_div(x, y, "")?,
            // Exact on every target (the half-float remainder is exact in f32).
            BinaryOp::Rem => super::fmod::fmod(cx, x, y)?,
            BinaryOp::Min => intr(cx, "llvm.minimum", &[x.into(), y.into()])?.into_float_value(),
            BinaryOp::Max => intr(cx, "llvm.maximum", &[x.into(), y.into()])?.into_float_value(),
            _ => {
                return Err(super::LowerError::Llvm(format!("`{}` on {s}", op.name())));
            }
        };
        return narrow(cx, s, r);
    }
    let (x, y) = (a.into_int_value(), b.into_int_value());
    let signed = s.is_signed_int();
    let t = x.get_type();
    let r: IntValue = match op {
        BinaryOp::Add => bd.build_int_add(x, y, "")?,
        BinaryOp::Sub => bd.build_int_sub(x, y, "")?,
        BinaryOp::Mul => bd.build_int_mul(x, y, "")?,
        BinaryOp::Div | BinaryOp::Rem => {
            // Division by zero gives 0; MIN / -1 wraps (MIN % -1 == 0).
            let zero = t.const_zero();
            let is0 = bd.build_int_compare(IntPredicate::EQ, y, zero, "")?;
            let mut bad = is0;
            if signed {
                let m1 = bd.build_int_compare(IntPredicate::EQ, y, t.const_all_ones(), "")?;
                bad = bd.build_or(is0, m1, "")?;
            }
            let safe = bd
                .build_select(bad, t.const_int(1, false), y, "")?
                .into_int_value();
            let q = match (op, signed) {
                (BinaryOp::Div, true) => bd.build_int_signed_div(x, safe, "")?,
                (BinaryOp::Div, false) => bd.build_int_unsigned_div(x, safe, "")?,
                (_, true) => bd.build_int_signed_rem(x, safe, "")?,
                (_, false) => bd.build_int_unsigned_rem(x, safe, "")?,
            };
            // y == -1: x / -1 = -x (wrapping), x % -1 = 0; y == 0: 0.
            let q = if signed {
                let m1 = bd.build_int_compare(IntPredicate::EQ, y, t.const_all_ones(), "")?;
                let alt = if op == BinaryOp::Div {
                    bd.build_int_sub(zero, x, "")?
                } else {
                    zero
                };
                bd.build_select(m1, alt, q, "")?.into_int_value()
            } else {
                q
            };
            bd.build_select(is0, zero, q, "")?.into_int_value()
        }
        BinaryOp::Min => intr(
            cx,
            if signed { "llvm.smin" } else { "llvm.umin" },
            &[x.into(), y.into()],
        )?
        .into_int_value(),
        BinaryOp::Max => intr(
            cx,
            if signed { "llvm.smax" } else { "llvm.umax" },
            &[x.into(), y.into()],
        )?
        .into_int_value(),
        BinaryOp::Pow => return Err(super::LowerError::Llvm(format!("`pow` on {s}"))),
        BinaryOp::And => bd.build_and(x, y, "")?,
        BinaryOp::Or => bd.build_or(x, y, "")?,
        BinaryOp::Xor => bd.build_xor(x, y, "")?,
        BinaryOp::Shl | BinaryOp::Shr => {
            let amt = bd.build_and(y, t.const_int(s.bits() as u64 - 1, false), "")?;
            if op == BinaryOp::Shl {
                bd.build_left_shift(x, amt, "")?
            } else {
                bd.build_right_shift(x, amt, signed, "")?
            }
        }
    };
    Ok(r.into())
}

fn poly<'ctx>(cx: &Cx<'ctx>, x: FloatValue<'ctx>, coeffs: &[f64]) -> LResult<FloatValue<'ctx>> {
    // Horner: c0 + x*(c1 + x*(...)).
    let t = x.get_type();
    let mut acc = t.const_float(*coeffs.last().expect("coefficients"));
    for &c in coeffs.iter().rev().skip(1) {
        acc = cx.b.build_float_mul(acc, x, "")?;
        acc = cx.b.build_float_add(acc, t.const_float(c), "")?;
    }
    Ok(acc)
}

/// `e^x` (`2^x` with `base2`) on a float of type `s` (half floats through f32) in
/// plain arithmetic, for the host: no call, so LLVM vectorizes it with the code around
/// it. The argument is reduced to `n + r` with `n` an integer and `|r| <= 1/2`
/// (`e^x`: Cody-Waite, `x = n ln2 + r` with `ln2` in two parts so that `r` keeps
/// its bits), `e^r` is a degree-7 Taylor polynomial (truncation below 2^-27
/// relative), and `2^n` is built from exponent bits in two halves so that
/// overflow, underflow and subnormal results round once. Within 2 ulp of the
/// correctly rounded f32 result (tests/cpu_device.rs sweeps it against libm);
/// infinities and NaN as in C.
pub(super) fn exp_poly<'ctx>(
    cx: &Cx<'ctx>,
    s: ScalarType,
    a: BasicValueEnum<'ctx>,
    base2: bool,
) -> LResult<BasicValueEnum<'ctx>> {
    let bd = &cx.b;
    let x = widen(cx, s, a)?;
    let t = x.get_type();
    let c = |v: f64| t.const_float(v);
    let i32t = cx.ctx.i32_type();
    // Past these, the result is 0 or infinity anyway; NaN is put back at the end.
    let (lo, hi) = if base2 {
        (-160.0, 160.0)
    } else {
        (-110.0, 90.0)
    };
    let xc = intr(cx, "llvm.minnum", &[x.into(), c(hi).into()])?;
    let xc = intr(cx, "llvm.maxnum", &[xc, c(lo).into()])?.into_float_value();
    let (n, r) = if base2 {
        let n = intr(cx, "llvm.roundeven", &[xc.into()])?.into_float_value();
        (n, bd.build_float_sub(xc, n, "")?)
    } else {
        let y = bd.build_float_mul(xc, c(std::f64::consts::LOG2_E), "")?;
        let n = intr(cx, "llvm.roundeven", &[y.into()])?.into_float_value();
        // ln 2 = 0.693359375 (exact in 10 bits, so n * it is exact) - 2.121944400e-4.
        let r = bd.build_float_sub(xc, bd.build_float_mul(n, c(0.693_359_375), "")?, "")?;
        let r = bd.build_float_sub(
            r,
            bd.build_float_mul(n, c(-2.121_944_400_546_905_8e-4), "")?,
            "",
        )?;
        (n, r)
    };
    // e^r, or 2^r = e^(r ln2): sum of (r k)^j / j!, j <= 7.
    let k = if base2 { std::f64::consts::LN_2 } else { 1.0 };
    let mut coeffs = [1.0f64; 8];
    for j in 1..8 {
        coeffs[j] = coeffs[j - 1] * k / j as f64;
    }
    let p = poly(cx, r, &coeffs)?;
    // 2^n = 2^(n/2) * 2^(n - n/2), each a normal power of two.
    let ni = bd.build_float_to_signed_int(n, i32t, "")?;
    let n1 = bd.build_right_shift(ni, i32t.const_int(1, false), true, "")?;
    let n2 = bd.build_int_sub(ni, n1, "")?;
    let pow2 = |m: inkwell::values::IntValue<'ctx>| -> LResult<FloatValue<'ctx>> {
        let e = bd.build_int_add(m, i32t.const_int(127, false), "")?;
        let bits = bd.build_left_shift(e, i32t.const_int(23, false), "")?;
        Ok(bd.build_bit_cast(bits, t, "")?.into_float_value())
    };
    let y = bd.build_float_mul(bd.build_float_mul(p, pow2(n1)?, "")?, pow2(n2)?, "")?;
    let nan = bd.build_float_compare(FloatPredicate::UNO, x, x, "")?;
    let y = bd.build_select(nan, x, y, "")?.into_float_value();
    narrow(cx, s, y)
}

/// `ln x` (`log2 x` with `base2`) on a float of type `s` (half floats through f32) in
/// plain arithmetic, for the host: no call, so LLVM vectorizes it with the code around
/// it. Computed in f64, where every f32 argument (subnormals too) is normal: `x = 2^e m`
/// with `m` in `[sqrt(1/2), sqrt(2))` from the bits, `ln m = 2 atanh(t)` with
/// `t = (m-1)/(m+1)` (`|t| < 0.172`) as the odd Taylor series to `t^13` (truncation
/// below 2^-39 relative), then `e ln2 + ln m` rounded once to f32: within 1 ulp of the
/// correctly rounded result (tests/cpu_device.rs sweeps it against libm). As in C:
/// `ln ±0 = -inf`, `ln inf = inf`, NaN for a negative argument, a NaN kept.
pub(super) fn log_poly<'ctx>(
    cx: &Cx<'ctx>,
    s: ScalarType,
    a: BasicValueEnum<'ctx>,
    base2: bool,
) -> LResult<BasicValueEnum<'ctx>> {
    let bd = &cx.b;
    let x = widen(cx, s, a)?;
    let t32 = x.get_type();
    let f64t = cx.ctx.f64_type();
    let i64t = cx.ctx.i64_type();
    let c = |v: f64| f64t.const_float(v);
    let k = |v: u64| i64t.const_int(v, false);
    let d = bd.build_float_ext(x, f64t, "")?;
    let bits = bd.build_bit_cast(d, i64t, "")?.into_int_value();
    // Exponent and mantissa in [1, 2); above sqrt(2), half of it and one more.
    let e = bd.build_right_shift(bits, k(52), false, "")?;
    let e = bd.build_and(e, k(0x7ff), "")?;
    let e = bd.build_int_sub(e, k(1023), "")?;
    let mb = bd.build_and(bits, k((1u64 << 52) - 1), "")?;
    let mb = bd.build_or(mb, k(0x3ff0_0000_0000_0000), "")?;
    let m = bd.build_bit_cast(mb, f64t, "")?.into_float_value();
    let big = bd.build_float_compare(FloatPredicate::OGT, m, c(std::f64::consts::SQRT_2), "")?;
    let m = bd
        .build_select(big, bd.build_float_mul(m, c(0.5), "")?, m, "")?
        .into_float_value();
    let e = bd
        .build_select(big, bd.build_int_add(e, k(1), "")?, e, "")?
        .into_int_value();
    // ln m = t (2 + 2t^2/3 + 2t^4/5 + ... + 2t^12/13); `m - 1` is exact.
    let f = bd.build_float_sub(m, c(1.0), "")?;
    let tt = bd.build_float_div(f, bd.build_float_add(m, c(1.0), "")?, "")?;
    let z = bd.build_float_mul(tt, tt, "")?;
    let coeffs: Vec<f64> = (0..7).map(|j| 2.0 / (2 * j + 1) as f64).collect();
    let lnm = bd.build_float_mul(tt, poly(cx, z, &coeffs)?, "")?;
    let ef = bd.build_signed_int_to_float(e, f64t, "")?;
    let r = if base2 {
        let l = bd.build_float_mul(lnm, c(std::f64::consts::LOG2_E), "")?;
        bd.build_float_add(ef, l, "")?
    } else {
        let l = bd.build_float_mul(ef, c(std::f64::consts::LN_2), "")?;
        bd.build_float_add(l, lnm, "")?
    };
    let r = bd.build_float_trunc(r, t32, "")?;
    let c32 = |v: f64| t32.const_float(v);
    let zero = bd.build_float_compare(FloatPredicate::OEQ, x, c32(0.0), "")?;
    let r = bd
        .build_select(zero, c32(f64::NEG_INFINITY), r, "")?
        .into_float_value();
    let inf = bd.build_float_compare(FloatPredicate::OEQ, x, c32(f64::INFINITY), "")?;
    let r = bd.build_select(inf, x, r, "")?.into_float_value();
    let neg = bd.build_float_compare(FloatPredicate::OLT, x, c32(0.0), "")?;
    let r = bd
        .build_select(neg, c32(f64::NAN), r, "")?
        .into_float_value();
    let nan = bd.build_float_compare(FloatPredicate::UNO, x, x, "")?;
    let r = bd.build_select(nan, x, r, "")?.into_float_value();
    narrow(cx, s, r)
}

fn exp_f32<'ctx>(cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
    let t = x.get_type();
    let y =
        cx.b.build_float_mul(x, t.const_float(std::f64::consts::LOG2_E), "")?;
    approx(cx, "llvm.exp2", y)
}

/// `pow(x, y)` as `exp2(y·log2|x|)` with the target's approximations, and C's special
/// cases: 1 for `y = ±0` or `x = 1` (even for NaN), 1 for `x = -1` with infinite `y`,
/// the sign of `x` for odd integer `y` (so `pow(-0, -3) = -inf`), NaN for a finite
/// negative `x` with a finite non-integer `y`. The rest (zeros, infinities, NaNs) falls
/// out of `log2` and `exp2`: `log2(0) = -inf`, `exp2(-inf) = 0`, NaN propagates.
pub(super) fn pow<'ctx>(
    cx: &Cx<'ctx>,
    arch: &dyn super::arch::Math,
    s: ScalarType,
    a: BasicValueEnum<'ctx>,
    b: BasicValueEnum<'ctx>,
    span: &Span,
) -> LResult<BasicValueEnum<'ctx>> {
    if s == ScalarType::F64 {
        return unsupported(span, "f64 `pow` (no device math library is linked)");
    }
    let bd = &cx.b;
    let (x, y) = (widen(cx, s, a)?, widen(cx, s, b)?);
    let t = x.get_type();
    let c = |v: f64| t.const_float(v);
    let ax = intr(cx, "llvm.fabs", &[x.into()])?.into_float_value();
    let l2 = arch.log2_approx(cx, ax)?;
    let e = bd.build_float_mul(y, l2, "")?;
    let mag = approx(cx, "llvm.exp2", e)?;
    // y is an integer (true for ±inf), and odd (false from 2^24 up, all even).
    let fy = intr(cx, "llvm.floor", &[y.into()])?.into_float_value();
    let y_int = bd.build_float_compare(FloatPredicate::OEQ, fy, y, "")?;
    let half = bd.build_float_mul(y, c(0.5), "")?;
    let fh = intr(cx, "llvm.floor", &[half.into()])?.into_float_value();
    let half_frac = bd.build_float_compare(FloatPredicate::ONE, fh, half, "")?;
    let y_odd = bd.build_and(y_int, half_frac, "")?;
    let signed = intr(cx, "llvm.copysign", &[mag.into(), x.into()])?.into_float_value();
    let r = bd.build_select(y_odd, signed, mag, "")?.into_float_value();
    // A finite negative base with a finite non-integer exponent.
    let x_neg = bd.build_float_compare(FloatPredicate::OLT, x, c(0.0), "")?;
    let x_fin = bd.build_float_compare(FloatPredicate::ONE, ax, c(f64::INFINITY), "")?;
    let ay = intr(cx, "llvm.fabs", &[y.into()])?.into_float_value();
    let y_fin = bd.build_float_compare(FloatPredicate::ONE, ay, c(f64::INFINITY), "")?;
    let bad = bd.build_and(
        bd.build_and(x_neg, x_fin, "")?,
        bd.build_and(y_fin, bd.build_not(y_int, "")?, "")?,
        "",
    )?;
    let r = bd.build_select(bad, c(f64::NAN), r, "")?.into_float_value();
    let y0 = bd.build_float_compare(FloatPredicate::OEQ, y, c(0.0), "")?;
    let x1 = bd.build_float_compare(FloatPredicate::OEQ, x, c(1.0), "")?;
    let xm1 = bd.build_float_compare(FloatPredicate::OEQ, x, c(-1.0), "")?;
    let y_inf = bd.build_float_compare(FloatPredicate::OEQ, ay, c(f64::INFINITY), "")?;
    let one = bd.build_or(bd.build_or(y0, x1, "")?, bd.build_and(xm1, y_inf, "")?, "")?;
    let r = bd.build_select(one, c(1.0), r, "")?.into_float_value();
    narrow(cx, s, r)
}

/// A unary op with the interpreter's semantics.
pub(super) fn unary<'ctx>(
    cx: &Cx<'ctx>,
    arch: &dyn super::arch::Math,
    op: UnaryOp,
    s: ScalarType,
    a: BasicValueEnum<'ctx>,
    span: &Span,
) -> LResult<BasicValueEnum<'ctx>> {
    let bd = &cx.b;
    if !s.is_float() {
        let x = a.into_int_value();
        let t = x.get_type();
        return Ok(match op {
            UnaryOp::Neg => bd.build_int_sub(t.const_zero(), x, "")?.into(),
            UnaryOp::Not => bd.build_not(x, "")?.into(),
            UnaryOp::Abs => intr(
                cx,
                "llvm.abs",
                &[x.into(), cx.ctx.bool_type().const_zero().into()],
            )?,
            // `popc.b32/b64` on NVIDIA, `v_bcnt_u32_b32` on AMD.
            UnaryOp::Popc => intr(cx, "llvm.ctpop", &[x.into()])?,
            // `clz.b32/b64` (`v_ffbh_u32`); defined as the width for 0 (the `false`
            // flag says 0 is not poison).
            UnaryOp::Clz => intr(
                cx,
                "llvm.ctlz",
                &[x.into(), cx.ctx.bool_type().const_zero().into()],
            )?,
            _ => return unsupported(span, format!("`{}` on {s}", op.name())),
        });
    }
    match op {
        UnaryOp::Neg => return Ok(bd.build_float_neg(a.into_float_value(), "")?.into()),
        UnaryOp::Abs => return intr(cx, "llvm.fabs", &[a]),
        UnaryOp::Not | UnaryOp::Popc | UnaryOp::Clz => {
            return unsupported(span, format!("`{}` on {s}", op.name()));
        }
        UnaryOp::Sqrt | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Rsqrt => {}
        _ if s == ScalarType::F64 => {
            return unsupported(
                span,
                format!("f64 `{}` (no device math library is linked)", op.name()),
            );
        }
        _ => {}
    }
    let x = widen(cx, s, a)?;
    let t = x.get_type();
    let one = t.const_float(1.0);
    let r: FloatValue = match op {
        UnaryOp::Exp => arch.exp2_approx(
            cx,
            bd.build_float_mul(x, t.const_float(std::f64::consts::LOG2_E), "")?,
        )?,
        UnaryOp::Exp2 => arch.exp2_approx(cx, x)?,
        UnaryOp::Log => {
            let l2 = arch.log2_approx(cx, x)?;
            bd.build_float_mul(l2, t.const_float(std::f64::consts::LN_2), "")?
        }
        UnaryOp::Log2 => arch.log2_approx(cx, x)?,
        UnaryOp::Sqrt => intr(cx, "llvm.sqrt", &[x.into()])?.into_float_value(),
        UnaryOp::Rsqrt => {
            let q = intr(cx, "llvm.sqrt", &[x.into()])?.into_float_value();
            bd.build_float_div(one, q, "")?
        }
        UnaryOp::Sin => approx(cx, "llvm.sin", x)?,
        UnaryOp::Cos => approx(cx, "llvm.cos", x)?,
        UnaryOp::Floor => intr(cx, "llvm.floor", &[x.into()])?.into_float_value(),
        UnaryOp::Ceil => intr(cx, "llvm.ceil", &[x.into()])?.into_float_value(),
        UnaryOp::Tanh => {
            let ax = intr(cx, "llvm.fabs", &[x.into()])?.into_float_value();
            // Large: 1 - 2 / (exp(2|x|) + 1), with the sign of x.
            let e = exp_f32(cx, bd.build_float_mul(ax, t.const_float(2.0), "")?)?;
            let d = bd.build_float_add(e, one, "")?;
            let q = bd.build_float_div(t.const_float(2.0), d, "")?;
            let big = bd.build_float_sub(one, q, "")?;
            let big = intr(cx, "llvm.copysign", &[big.into(), x.into()])?.into_float_value();
            // Small: x * P(x^2), the odd Taylor series to x^15.
            let x2 = bd.build_float_mul(x, x, "")?;
            let p = poly(
                cx,
                x2,
                &[
                    1.0,
                    -1.0 / 3.0,
                    2.0 / 15.0,
                    -17.0 / 315.0,
                    62.0 / 2835.0,
                    -1382.0 / 155925.0,
                    21844.0 / 6081075.0,
                    -929569.0 / 638512875.0,
                ],
            )?;
            let small = bd.build_float_mul(x, p, "")?;
            let c = bd.build_float_compare(FloatPredicate::OLT, ax, t.const_float(0.55), "")?;
            bd.build_select(c, small, big, "")?.into_float_value()
        }
        UnaryOp::Erf => {
            let ax = intr(cx, "llvm.fabs", &[x.into()])?.into_float_value();
            // Small: 2/sqrt(pi) * x * sum (-1)^n x^2n / (n! (2n+1)).
            let x2 = bd.build_float_mul(x, x, "")?;
            let p = poly(cx, x2, &ERF_SERIES)?;
            let small = bd.build_float_mul(x, p, "")?;
            // Large: Abramowitz-Stegun 7.1.26.
            let tt = bd.build_float_div(
                one,
                bd.build_float_add(
                    one,
                    bd.build_float_mul(ax, t.const_float(ERF_AS_T), "")?,
                    "",
                )?,
                "",
            )?;
            let pp = poly(cx, tt, &ERF_AS)?;
            let e = exp_f32(cx, bd.build_float_neg(x2, "")?)?;
            let big = bd.build_float_sub(one, bd.build_float_mul(pp, e, "")?, "")?;
            let big = intr(cx, "llvm.copysign", &[big.into(), x.into()])?.into_float_value();
            let c =
                bd.build_float_compare(FloatPredicate::OLT, ax, t.const_float(ERF_SMALL), "")?;
            bd.build_select(c, small, big, "")?.into_float_value()
        }
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not | UnaryOp::Popc | UnaryOp::Clz => {
            unreachable!("handled above")
        }
    };
    narrow(cx, s, r)
}

pub(super) fn fma<'ctx>(
    cx: &Cx<'ctx>,
    s: ScalarType,
    v: &[BasicValueEnum<'ctx>],
) -> LResult<BasicValueEnum<'ctx>> {
    let _ = s;
    intr(cx, "llvm.fma", &[v[0], v[1], v[2]])
}

pub(super) fn cmp<'ctx>(
    cx: &Cx<'ctx>,
    p: CmpPred,
    s: ScalarType,
    a: BasicValueEnum<'ctx>,
    b: BasicValueEnum<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    if s.is_float() {
        let pred = match p {
            CmpPred::Eq => FloatPredicate::OEQ,
            CmpPred::Ne => FloatPredicate::UNE,
            CmpPred::Lt => FloatPredicate::OLT,
            CmpPred::Le => FloatPredicate::OLE,
            CmpPred::Gt => FloatPredicate::OGT,
            CmpPred::Ge => FloatPredicate::OGE,
        };
        return Ok(cx
            .b
            .build_float_compare(pred, a.into_float_value(), b.into_float_value(), "")?
            .into());
    }
    let signed = s.is_signed_int();
    let pred = match (p, signed) {
        (CmpPred::Eq, _) => IntPredicate::EQ,
        (CmpPred::Ne, _) => IntPredicate::NE,
        (CmpPred::Lt, true) => IntPredicate::SLT,
        (CmpPred::Le, true) => IntPredicate::SLE,
        (CmpPred::Gt, true) => IntPredicate::SGT,
        (CmpPred::Ge, true) => IntPredicate::SGE,
        (CmpPred::Lt, false) => IntPredicate::ULT,
        (CmpPred::Le, false) => IntPredicate::ULE,
        (CmpPred::Gt, false) => IntPredicate::UGT,
        (CmpPred::Ge, false) => IntPredicate::UGE,
    };
    Ok(cx
        .b
        .build_int_compare(pred, a.into_int_value(), b.into_int_value(), "")?
        .into())
}

/// Conversion with Rust `as` semantics (saturating float to int, NaN to 0).
pub(super) fn cast<'ctx>(
    cx: &Cx<'ctx>,
    from: ScalarType,
    to: ScalarType,
    v: BasicValueEnum<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    let bd = &cx.b;
    if from == to {
        return Ok(v);
    }
    if from.is_fp8() || to.is_fp8() {
        return cast_fp8(cx, from, to, v);
    }
    if to == ScalarType::I1 {
        return Ok(if from.is_float() {
            let x = v.into_float_value();
            bd.build_float_compare(FloatPredicate::UNE, x, x.get_type().const_zero(), "")?
                .into()
        } else {
            let x = v.into_int_value();
            bd.build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "")?
                .into()
        });
    }
    match (from.is_float(), to.is_float()) {
        (true, true) => {
            let x = v.into_float_value();
            let (fb, tb) = (from.bits(), to.bits());
            if is_half(from) && is_half(to) {
                let w = bd.build_float_ext(x, cx.ctx.f32_type(), "")?;
                Ok(trunc_float(cx, w, to)?.into())
            } else if tb > fb {
                Ok(bd.build_float_ext(x, fty(cx, to), "")?.into())
            } else {
                Ok(trunc_float(cx, x, to)?.into())
            }
        }
        (true, false) => {
            let x = v.into_float_value();
            let name = if to.is_signed_int() {
                "llvm.fptosi.sat"
            } else {
                "llvm.fptoui.sat"
            };
            let rt: BasicTypeEnum = ity(cx, to).into();
            cx.call_intrinsic(name, &[rt, x.get_type().into()], &[x.into()])
        }
        (false, true) => {
            let x = v.into_int_value();
            if from.is_signed_int() {
                Ok(bd.build_signed_int_to_float(x, fty(cx, to), "")?.into())
            } else {
                Ok(bd.build_unsigned_int_to_float(x, fty(cx, to), "")?.into())
            }
        }
        (false, false) => {
            let x = v.into_int_value();
            let t = ity(cx, to);
            let (fb, tb) = (from.bits(), to.bits());
            Ok(if tb < fb {
                bd.build_int_truncate(x, t, "")?.into()
            } else if tb == fb {
                x.into()
            } else if from.is_signed_int() {
                bd.build_int_s_extend(x, t, "")?.into()
            } else {
                bd.build_int_z_extend(x, t, "")?.into()
            })
        }
    }
}

/// The parameters of an 8-bit float format for [`f32_to_fp8`]: mantissa bits,
/// exponent bias, the largest finite encoding, the f32 bits past which a value
/// saturates to it (`> sat` for E4M3: beyond 464 = 448 + half an ulp; `>= sat` for
/// E5M2: from 61440 = 57344 + half an ulp, which ties to an odd mantissa), the f32
/// bits of the smallest normal, and the scale that makes the smallest subnormal 1.
struct Fp8Format {
    mbits: u32,
    bias: u32,
    max_finite: u32,
    sat: u32,
    sat_inclusive: bool,
    min_normal: u32,
    sub_scale: f64,
}

fn fp8_format(s: ScalarType) -> Fp8Format {
    if s == ScalarType::F8E4M3 {
        Fp8Format {
            mbits: 3,
            bias: 7,
            max_finite: 0x7e,
            sat: 464f32.to_bits(),
            sat_inclusive: false,
            min_normal: 2f32.powi(-6).to_bits(),
            sub_scale: 512.0,
        }
    } else {
        Fp8Format {
            mbits: 2,
            bias: 15,
            max_finite: 0x7b,
            sat: 61440f32.to_bits(),
            sat_inclusive: true,
            min_normal: 2f32.powi(-14).to_bits(),
            sub_scale: 65536.0,
        }
    }
}

/// A cast to or from an 8-bit float (the verifier admits f16, bf16 and f32 on the
/// other side), in integer arithmetic on the bits, the same on every target: to the
/// 8-bit float rounds to nearest even and saturates to the largest finite value
/// (`satfinite`), NaN stays NaN; from it is exact.
fn cast_fp8<'ctx>(
    cx: &Cx<'ctx>,
    from: ScalarType,
    to: ScalarType,
    v: BasicValueEnum<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    let f32t = cx.ctx.f32_type();
    if to.is_fp8() && from.is_fp8() {
        let x = fp8_to_f32(cx, from, v.into_int_value())?;
        return Ok(f32_to_fp8(cx, to, x)?.into());
    }
    if to.is_fp8() {
        let x = v.into_float_value();
        let x = if from == ScalarType::F32 {
            x
        } else if is_half(from) {
            cx.b.build_float_ext(x, f32t, "")?
        } else {
            return Err(super::LowerError::Llvm(format!("cast from {from} to {to}")));
        };
        return Ok(f32_to_fp8(cx, to, x)?.into());
    }
    let x = fp8_to_f32(cx, from, v.into_int_value())?;
    Ok(match to {
        ScalarType::F32 => x.into(),
        // Exact: every 8-bit float value is an f16 and a bf16.
        t if is_half(t) => trunc_float(cx, x, t)?.into(),
        t => return Err(super::LowerError::Llvm(format!("cast from {from} to {t}"))),
    })
}

/// The f32 value of the 8-bit float bits `b` (exact).
fn fp8_to_f32<'ctx>(cx: &Cx<'ctx>, s: ScalarType, b: IntValue<'ctx>) -> LResult<FloatValue<'ctx>> {
    let bd = &cx.b;
    let (i32t, f32t) = (cx.ctx.i32_type(), cx.ctx.f32_type());
    let c = |x: u32| i32t.const_int(u64::from(x), false);
    let fmt = fp8_format(s);
    let u = bd.build_int_z_extend(b, i32t, "")?;
    let sign = bd.build_left_shift(bd.build_and(u, c(0x80), "")?, c(24), "")?;
    let a = bd.build_and(u, c(0x7f), "")?;
    // Normal: the exponent and mantissa bits moved into place, the bias moved to
    // f32's.
    let normal = bd.build_int_add(
        bd.build_left_shift(a, c(23 - fmt.mbits), "")?,
        c((127 - fmt.bias) << 23),
        "",
    )?;
    // Subnormal (exponent field 0): the mantissa times the smallest subnormal.
    let sub = bd.build_float_mul(
        bd.build_unsigned_int_to_float(a, f32t, "")?,
        f32t.const_float(1.0 / fmt.sub_scale),
        "",
    )?;
    let sub = bd.build_bit_cast(sub, i32t, "")?.into_int_value();
    let is_sub = bd.build_int_compare(IntPredicate::ULT, a, c(1 << fmt.mbits), "")?;
    let mag = bd.build_select(is_sub, sub, normal, "")?.into_int_value();
    // Specials: E4M3's one NaN (`S.1111.111`); E5M2's infinities (`S.11111.00`) and
    // NaNs.
    let mag = if s == ScalarType::F8E4M3 {
        let nan = bd.build_int_compare(IntPredicate::EQ, a, c(0x7f), "")?;
        bd.build_select(nan, c(0x7fc0_0000), mag, "")?
            .into_int_value()
    } else {
        let inf = bd.build_int_compare(IntPredicate::EQ, a, c(0x7c), "")?;
        let nan = bd.build_int_compare(IntPredicate::UGT, a, c(0x7c), "")?;
        let m = bd
            .build_select(inf, c(0x7f80_0000), mag, "")?
            .into_int_value();
        bd.build_select(nan, c(0x7fc0_0000), m, "")?
            .into_int_value()
    };
    let bits = bd.build_or(mag, sign, "")?;
    Ok(bd.build_bit_cast(bits, f32t, "")?.into_float_value())
}

/// `x` rounded to the 8-bit float `s` (nearest even, saturating to the largest
/// finite value, NaN to NaN), as its bits.
fn f32_to_fp8<'ctx>(cx: &Cx<'ctx>, s: ScalarType, x: FloatValue<'ctx>) -> LResult<IntValue<'ctx>> {
    let bd = &cx.b;
    let (i32t, f32t) = (cx.ctx.i32_type(), cx.ctx.f32_type());
    let c = |x: u32| i32t.const_int(u64::from(x), false);
    let fmt = fp8_format(s);
    let u = bd.build_bit_cast(x, i32t, "")?.into_int_value();
    let sign = bd.build_and(bd.build_right_shift(u, c(24), false, "")?, c(0x80), "")?;
    let a = bd.build_and(u, c(0x7fff_ffff), "")?;
    // Normal: rebias the exponent, keep the top mantissa bits, round the rest to
    // nearest even (a carry moves into the exponent, as it should).
    let drop = 23 - fmt.mbits;
    let exp = bd.build_int_sub(
        bd.build_right_shift(a, c(23), false, "")?,
        c(127 - fmt.bias),
        "",
    )?;
    let mant = bd.build_and(
        bd.build_right_shift(a, c(drop), false, "")?,
        c((1 << fmt.mbits) - 1),
        "",
    )?;
    let res = bd.build_or(bd.build_left_shift(exp, c(fmt.mbits), "")?, mant, "")?;
    let rest = bd.build_and(a, c((1 << drop) - 1), "")?;
    let half = c(1 << (drop - 1));
    let above = bd.build_int_compare(IntPredicate::UGT, rest, half, "")?;
    let tie = bd.build_int_compare(IntPredicate::EQ, rest, half, "")?;
    let odd = bd.build_int_compare(IntPredicate::NE, bd.build_and(mant, c(1), "")?, c(0), "")?;
    let up = bd.build_or(above, bd.build_and(tie, odd, "")?, "")?;
    let normal = bd.build_int_add(res, bd.build_int_z_extend(up, i32t, "")?, "")?;
    // Below the smallest normal: a multiple of the smallest subnormal, rounded to
    // nearest even (its bits are that multiple; 2^mbits is the smallest normal).
    let ax = bd.build_bit_cast(a, f32t, "")?.into_float_value();
    let scaled = bd.build_float_mul(ax, f32t.const_float(fmt.sub_scale), "")?;
    let rounded = cx
        .call_intrinsic("llvm.roundeven", &[f32t.into()], &[scaled.into()])?
        .into_float_value();
    let sub = bd.build_float_to_unsigned_int(rounded, i32t, "")?;
    let is_sub = bd.build_int_compare(IntPredicate::ULT, a, c(fmt.min_normal), "")?;
    let mag = bd.build_select(is_sub, sub, normal, "")?.into_int_value();
    let sat_pred = if fmt.sat_inclusive {
        IntPredicate::UGE
    } else {
        IntPredicate::UGT
    };
    let sat = bd.build_int_compare(sat_pred, a, c(fmt.sat), "")?;
    let mag = bd
        .build_select(sat, c(fmt.max_finite), mag, "")?
        .into_int_value();
    // NaN: E4M3's `0x7f`; E5M2's `0x7e` with the top two mantissa bits ORed in (a
    // quiet NaN's are `1x`), as CUDA's conversion does.
    let nan = bd.build_int_compare(IntPredicate::UGT, a, c(0x7f80_0000), "")?;
    let nan_bits = if s == ScalarType::F8E4M3 {
        c(0x7f)
    } else {
        bd.build_or(
            c(0x7e),
            bd.build_and(bd.build_right_shift(a, c(21), false, "")?, c(3), "")?,
            "",
        )?
    };
    let mag = bd.build_select(nan, nan_bits, mag, "")?.into_int_value();
    let bits = bd.build_or(mag, sign, "")?;
    Ok(bd.build_int_truncate(bits, cx.ctx.i8_type(), "")?)
}

/// The element type of a tile as a scalar (pointers are not elementwise operands).
pub(super) fn scalar_of(e: Elem) -> ScalarType {
    e.scalar().unwrap_or(ScalarType::I64)
}

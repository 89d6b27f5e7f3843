//! The exact float remainder (`fmod`, the interpreter's `%` on floats) on every target.
//!
//! LLVM's `frem` is exact on the host (it calls `fmodf`) but the NVPTX backend expands
//! it to `x - trunc(x / y) * y`, which loses bits once the quotient needs more than the
//! mantissa. So the lowering calls an internal function `__tessera_fmod_f32` /
//! `__tessera_fmod_f64` built here, the same code on the GPU and in the emulator.
//!
//! The algorithm is the long division of the mantissas: with `x = mx·2^ex` and
//! `y = my·2^ey` (integer mantissas with the implicit bit, `ex ≥ ey` once `|x| ≥ |y|`),
//! `x mod y = ((mx·2^(ex-ey)) mod my)·2^ey`, and the power of two is brought in a few
//! bits at a time (`r ← (r << k) mod my`, `k` chosen so that `r << k` cannot overflow).
//! The remainder is exactly representable, so it is rebuilt from its bits (normal or
//! subnormal) with no rounding. Special cases follow C: `fmod(x, 0)`, `fmod(±inf, y)`
//! and NaN operands give NaN; `fmod(x, ±inf) = x` for finite `x`; the result has the
//! sign of `x` (`-0.0` when a negative `x` divides evenly).

use inkwell::IntPredicate;
use inkwell::module::Linkage;
use inkwell::values::{FloatValue, FunctionValue};

use super::{Cx, LResult};

/// `fmod(x, y)` for `f32` or `f64` operands (one type).
pub(super) fn fmod<'ctx>(
    cx: &Cx<'ctx>,
    x: FloatValue<'ctx>,
    y: FloatValue<'ctx>,
) -> LResult<FloatValue<'ctx>> {
    let f = function(cx, x.get_type().get_bit_width() == 64)?;
    let call = cx.b.build_call(f, &[x.into(), y.into()], "")?;
    call.try_as_basic_value()
        .basic()
        .map(|v| v.into_float_value())
        .ok_or_else(|| super::LowerError::Llvm("fmod call has no value".into()))
}

/// The module's fmod function for the width, built on first use.
fn function<'ctx>(cx: &Cx<'ctx>, wide: bool) -> LResult<FunctionValue<'ctx>> {
    let name = if wide {
        "__tessera_fmod_f64"
    } else {
        "__tessera_fmod_f32"
    };
    if let Some(f) = cx.module.get_function(name) {
        return Ok(f);
    }
    let (ft, it) = if wide {
        (cx.ctx.f64_type(), cx.ctx.i64_type())
    } else {
        (cx.ctx.f32_type(), cx.ctx.i32_type())
    };
    // Width, mantissa bits, and the most bits `r < 2^(m+1)` may be shifted by at once.
    let (w, m, step): (u64, u64, u64) = if wide { (64, 52, 11) } else { (32, 23, 8) };
    let f = cx.module.add_function(
        name,
        ft.fn_type(&[ft.into(), ft.into()], false),
        Some(Linkage::Internal),
    );
    let saved = cx.b.get_insert_block();
    let b = &cx.b;
    let entry = cx.ctx.append_basic_block(f, "entry");
    let special = cx.ctx.append_basic_block(f, "special");
    let divide = cx.ctx.append_basic_block(f, "divide");
    let head = cx.ctx.append_basic_block(f, "head");
    let body = cx.ctx.append_basic_block(f, "body");
    let done = cx.ctx.append_basic_block(f, "done");
    let k = |v: u64| it.const_int(v, false);

    b.position_at_end(entry);
    let param = |i| {
        f.get_nth_param(i)
            .map(|p| p.into_float_value())
            .ok_or_else(|| super::LowerError::Llvm(format!("{name} has no parameter {i}")))
    };
    let (x, y) = (param(0)?, param(1)?);
    let ux = b.build_bit_cast(x, it, "ux")?.into_int_value();
    let uy = b.build_bit_cast(y, it, "uy")?.into_int_value();
    let sign_bit = k(1 << (w - 1));
    let abs_mask = k((1 << (w - 1)) - 1);
    let inf = k(((1 << (w - 1 - m)) - 1) << m);
    let sx = b.build_and(ux, sign_bit, "sx")?;
    let ax = b.build_and(ux, abs_mask, "ax")?;
    let ay = b.build_and(uy, abs_mask, "ay")?;
    // NaN when y is 0 or NaN, or x is infinite or NaN.
    let y0 = b.build_int_compare(IntPredicate::EQ, ay, k(0), "")?;
    let ynan = b.build_int_compare(IntPredicate::UGT, ay, inf, "")?;
    let xbad = b.build_int_compare(IntPredicate::UGE, ax, inf, "")?;
    let nan = b.build_or(b.build_or(y0, ynan, "")?, xbad, "nan")?;
    // |x| < |y| (including y = ±inf): x itself.
    let small = b.build_int_compare(IntPredicate::ULT, ax, ay, "small")?;
    let early = b.build_or(nan, small, "")?;
    b.build_conditional_branch(early, special, divide)?;

    b.position_at_end(special);
    let qnan = ft.const_float(f64::NAN);
    let r = b.build_select(nan, qnan, x, "")?;
    b.build_return(Some(&r))?;

    // Integer mantissas and exponents (subnormals have exponent 1, no implicit bit).
    b.position_at_end(divide);
    let implicit = k(1 << m);
    let mant_mask = k((1 << m) - 1);
    let split = |a| -> LResult<_> {
        let e = b.build_right_shift(a, k(m), false, "")?;
        let is_sub = b.build_int_compare(IntPredicate::EQ, e, k(0), "")?;
        let normal = b.build_or(b.build_and(a, mant_mask, "")?, implicit, "")?;
        let mant = b.build_select(is_sub, a, normal, "")?.into_int_value();
        let e1 = b.build_select(is_sub, k(1), e, "")?.into_int_value();
        Ok((mant, e1))
    };
    let (mx, ex) = split(ax)?;
    let (my, ey) = split(ay)?;
    let r0 = b.build_int_unsigned_rem(mx, my, "r0")?;
    let d0 = b.build_int_sub(ex, ey, "d0")?;
    b.build_unconditional_branch(head)?;

    b.position_at_end(head);
    let r_phi = b.build_phi(it, "r")?;
    let d_phi = b.build_phi(it, "d")?;
    let (r, d) = (
        r_phi.as_basic_value().into_int_value(),
        d_phi.as_basic_value().into_int_value(),
    );
    let more = b.build_int_compare(IntPredicate::NE, d, k(0), "more")?;
    b.build_conditional_branch(more, body, done)?;

    b.position_at_end(body);
    let lt = b.build_int_compare(IntPredicate::ULT, d, k(step), "")?;
    let sh = b.build_select(lt, d, k(step), "sh")?.into_int_value();
    let shifted = b.build_left_shift(r, sh, "")?;
    let r_next = b.build_int_unsigned_rem(shifted, my, "")?;
    let d_next = b.build_int_sub(d, sh, "")?;
    b.build_unconditional_branch(head)?;
    r_phi.add_incoming(&[(&r0, divide), (&r_next, body)]);
    d_phi.add_incoming(&[(&d0, divide), (&d_next, body)]);

    // r·2^(ey-1) in units of the smallest subnormal: normalize the leading bit to bit
    // m while the exponent stays ≥ 1, else it is a subnormal.
    b.position_at_end(done);
    let lz_all = cx
        .call_intrinsic(
            "llvm.ctlz",
            &[it.into()],
            &[r.into(), cx.ctx.bool_type().const_zero().into()],
        )?
        .into_int_value();
    let lz = b.build_int_sub(lz_all, k(w - 1 - m), "lz")?;
    let normal_ok = b.build_int_compare(IntPredicate::UGT, ey, lz, "")?;
    let e_field = b.build_int_sub(b.build_int_sub(ey, lz, "")?, k(1), "")?;
    let normal = b.build_int_add(
        b.build_left_shift(e_field, k(m), "")?,
        b.build_left_shift(r, lz, "")?,
        "",
    )?;
    let sub = b.build_left_shift(r, b.build_int_sub(ey, k(1), "")?, "")?;
    let mag = b.build_select(normal_ok, normal, sub, "")?.into_int_value();
    let zero = b.build_int_compare(IntPredicate::EQ, r, k(0), "")?;
    let mag = b.build_select(zero, k(0), mag, "")?.into_int_value();
    let bits = b.build_or(mag, sx, "")?;
    let out = b.build_bit_cast(bits, ft, "")?;
    b.build_return(Some(&out))?;

    if let Some(bb) = saved {
        b.position_at_end(bb);
    }
    Ok(f)
}

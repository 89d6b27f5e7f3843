//! Typed elementwise kernels: arithmetic, comparisons, casts, reductions, scans and
//! `dot`. Every op dispatches on the element type once and then runs a tight loop over
//! a `Vec<T>`.

use crate::fp8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

use super::minmax::{IeeeFloat, fmax, fmin};
use super::value::{Data, Elt, bf16_from_f64, f16_from_f64};
use crate::ir::{BinaryOp, CmpPred, ReduceOp, ScaledFormat, UnaryOp};
use crate::types::ScalarType;

/// Why an elementwise op failed.
#[derive(Debug)]
pub(crate) enum ArithErr {
    /// Integer division or remainder by zero at this lane.
    DivZero(usize),
    /// The op is not defined on these operands (ill-typed IR).
    Unsupported(String),
}

/// Arithmetic shared by integers (wrapping) and floats (IEEE; f16/bf16 through f32).
pub(crate) trait Num: Elt {
    const IS_INT: bool;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Integers: `o != 0` (checked by the caller); truncating, `MIN / -1` wraps.
    fn div(self, o: Self) -> Self;
    fn rem(self, o: Self) -> Self;
    fn min_(self, o: Self) -> Self;
    fn max_(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn is_zero(self) -> bool;
}

/// Bitwise ops of integers.
pub(crate) trait Int: Num {
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn shl(self, o: Self) -> Self;
    fn shr(self, o: Self) -> Self;
    fn not(self) -> Self;
    /// The number of set bits, in `Self`.
    fn popc(self) -> Self;
    /// The number of leading zero bits (the width for 0), in `Self`.
    fn clz(self) -> Self;
}

/// Float-only ops.
pub(crate) trait Float: Num + IeeeFloat {
    /// Applies a math function: f64 computes in f64; f32, f16 and bf16 compute in f32
    /// and round the result back.
    fn math(self, f32fn: fn(f32) -> f32, f64fn: fn(f64) -> f64) -> Self;
    /// `a * b + c` with a single rounding.
    fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `self^o` (C's `pow`; halves compute in f32 and round).
    fn pow_(self, o: Self) -> Self;
}

macro_rules! int_num {
    ($t:ty, $abs:expr) => {
        impl Num for $t {
            const IS_INT: bool = true;
            #[inline(always)]
            fn add(self, o: $t) -> $t {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: $t) -> $t {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: $t) -> $t {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div(self, o: $t) -> $t {
                if o == 0 { 0 } else { self.wrapping_div(o) }
            }
            #[inline(always)]
            fn rem(self, o: $t) -> $t {
                if o == 0 { 0 } else { self.wrapping_rem(o) }
            }
            #[inline(always)]
            fn min_(self, o: $t) -> $t {
                Ord::min(self, o)
            }
            #[inline(always)]
            fn max_(self, o: $t) -> $t {
                Ord::max(self, o)
            }
            #[inline(always)]
            fn neg(self) -> $t {
                self.wrapping_neg()
            }
            #[inline(always)]
            fn abs(self) -> $t {
                let f: fn($t) -> $t = $abs;
                f(self)
            }
            #[inline(always)]
            fn is_zero(self) -> bool {
                self == 0
            }
        }
        impl Int for $t {
            #[inline(always)]
            fn and(self, o: $t) -> $t {
                self & o
            }
            #[inline(always)]
            fn or(self, o: $t) -> $t {
                self | o
            }
            #[inline(always)]
            fn xor(self, o: $t) -> $t {
                self ^ o
            }
            #[inline(always)]
            fn shl(self, o: $t) -> $t {
                self.wrapping_shl(o as u32)
            }
            #[inline(always)]
            fn shr(self, o: $t) -> $t {
                self.wrapping_shr(o as u32)
            }
            #[inline(always)]
            fn not(self) -> $t {
                !self
            }
            #[inline(always)]
            fn popc(self) -> $t {
                self.count_ones() as $t
            }
            #[inline(always)]
            fn clz(self) -> $t {
                self.leading_zeros() as $t
            }
        }
    };
}

int_num!(i8, |x| x.wrapping_abs());
int_num!(i16, |x| x.wrapping_abs());
int_num!(i32, |x| x.wrapping_abs());
int_num!(i64, |x| x.wrapping_abs());
int_num!(u8, |x| x);
int_num!(u16, |x| x);
int_num!(u32, |x| x);
int_num!(u64, |x| x);

macro_rules! native_float {
    ($t:ty, $math:expr) => {
        impl Num for $t {
            const IS_INT: bool = false;
            #[inline(always)]
            fn add(self, o: $t) -> $t {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: $t) -> $t {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: $t) -> $t {
                self * o
            }
            #[inline(always)]
            fn div(self, o: $t) -> $t {
                self / o
            }
            #[inline(always)]
            fn rem(self, o: $t) -> $t {
                self % o
            }
            #[inline(always)]
            fn min_(self, o: $t) -> $t {
                fmin(self, o)
            }
            #[inline(always)]
            fn max_(self, o: $t) -> $t {
                fmax(self, o)
            }
            #[inline(always)]
            fn neg(self) -> $t {
                -self
            }
            #[inline(always)]
            fn abs(self) -> $t {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn is_zero(self) -> bool {
                self == 0.0
            }
        }
        impl Float for $t {
            #[inline(always)]
            fn math(self, f32fn: fn(f32) -> f32, f64fn: fn(f64) -> f64) -> $t {
                let m: fn($t, fn(f32) -> f32, fn(f64) -> f64) -> $t = $math;
                m(self, f32fn, f64fn)
            }
            #[inline(always)]
            fn fma(a: $t, b: $t, c: $t) -> $t {
                a.mul_add(b, c)
            }
            #[inline(always)]
            fn pow_(self, o: $t) -> $t {
                self.powf(o)
            }
        }
    };
}

native_float!(f32, |x, f, _| f(x));
native_float!(f64, |x, _, g| g(x));

/// `s + c` rounded to f64 with round-to-odd (so that rounding again to f16/bf16 is
/// correct): the sum plus its exact error term (TwoSum).
fn sum_odd(s: f64, c: f64) -> f64 {
    let t = s + c;
    if !t.is_finite() {
        return t;
    }
    let bp = t - s;
    let e = (s - (t - bp)) + (c - bp);
    if e == 0.0 || t.to_bits() & 1 == 1 {
        t
    } else if e > 0.0 {
        t.next_up()
    } else {
        t.next_down()
    }
}

macro_rules! half_float {
    ($t:ty, $from64:ident) => {
        impl Num for $t {
            const IS_INT: bool = false;
            #[inline(always)]
            fn add(self, o: $t) -> $t {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            #[inline(always)]
            fn sub(self, o: $t) -> $t {
                <$t>::from_f32(self.to_f32() - o.to_f32())
            }
            #[inline(always)]
            fn mul(self, o: $t) -> $t {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
            #[inline(always)]
            fn div(self, o: $t) -> $t {
                <$t>::from_f32(self.to_f32() / o.to_f32())
            }
            #[inline(always)]
            fn rem(self, o: $t) -> $t {
                <$t>::from_f32(self.to_f32() % o.to_f32())
            }
            #[inline(always)]
            fn min_(self, o: $t) -> $t {
                fmin(self, o)
            }
            #[inline(always)]
            fn max_(self, o: $t) -> $t {
                fmax(self, o)
            }
            #[inline(always)]
            fn neg(self) -> $t {
                -self
            }
            #[inline(always)]
            fn abs(self) -> $t {
                <$t>::from_bits(self.to_bits() & 0x7fff)
            }
            #[inline(always)]
            fn is_zero(self) -> bool {
                self.to_f32() == 0.0
            }
        }
        impl Float for $t {
            #[inline(always)]
            fn math(self, f32fn: fn(f32) -> f32, _: fn(f64) -> f64) -> $t {
                <$t>::from_f32(f32fn(self.to_f32()))
            }
            fn fma(a: $t, b: $t, c: $t) -> $t {
                // The product of two halves is exact in f64; the sum is rounded to odd so
                // the final rounding is the only one.
                let s = a.to_f64() * b.to_f64();
                $from64(sum_odd(s, c.to_f64()))
            }
            fn pow_(self, o: $t) -> $t {
                <$t>::from_f32(self.to_f32().powf(o.to_f32()))
            }
        }
    };
}

half_float!(f16, f16_from_f64);
half_float!(bf16, bf16_from_f64);

#[inline(always)]
fn zip<T: Copy, U>(a: &[T], b: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
    // One-element operands (lazy splats) are broadcast.
    match (a.len(), b.len()) {
        (1, n) if n != 1 => b.iter().map(|&y| f(a[0], y)).collect(),
        (n, 1) if n != 1 => a.iter().map(|&x| f(x, b[0])).collect(),
        _ => a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect(),
    }
}

/// The left operand of a binary op: borrowed, or owned (its last use) and then
/// overwritten in place.
pub(crate) enum Lhs<'a, T> {
    Ref(&'a [T]),
    Own(Vec<T>),
}

#[inline(always)]
fn zip_lhs<T: Copy>(a: Lhs<'_, T>, b: &[T], f: impl Fn(T, T) -> T) -> Vec<T> {
    match a {
        Lhs::Ref(a) => zip(a, b, f),
        Lhs::Own(a) if a.len() == 1 => zip(&a, b, f),
        Lhs::Own(mut a) if b.len() == 1 => {
            let y = b[0];
            for x in a.iter_mut() {
                *x = f(*x, y);
            }
            a
        }
        Lhs::Own(mut a) => {
            a.truncate(b.len());
            for (x, &y) in a.iter_mut().zip(b) {
                *x = f(*x, y);
            }
            a
        }
    }
}

fn num_binary<T: Num>(op: BinaryOp, a: Lhs<'_, T>, b: &[T]) -> Result<Vec<T>, ArithErr> {
    Ok(match op {
        BinaryOp::Add => zip_lhs(a, b, T::add),
        BinaryOp::Sub => zip_lhs(a, b, T::sub),
        BinaryOp::Mul => zip_lhs(a, b, T::mul),
        BinaryOp::Div | BinaryOp::Rem => {
            if T::IS_INT
                && let Some(i) = b.iter().position(|x| x.is_zero())
            {
                return Err(ArithErr::DivZero(i));
            }
            if op == BinaryOp::Div {
                zip_lhs(a, b, T::div)
            } else {
                zip_lhs(a, b, T::rem)
            }
        }
        BinaryOp::Min => zip_lhs(a, b, T::min_),
        BinaryOp::Max => zip_lhs(a, b, T::max_),
        _ => {
            return Err(ArithErr::Unsupported(format!(
                "`{}` is not defined on {}",
                op.name(),
                T::TY
            )));
        }
    })
}

fn float_binary<T: Float>(op: BinaryOp, a: Lhs<'_, T>, b: &[T]) -> Result<Vec<T>, ArithErr> {
    match op {
        BinaryOp::Pow => Ok(zip_lhs(a, b, T::pow_)),
        _ => num_binary(op, a, b),
    }
}

fn int_binary<T: Int>(op: BinaryOp, a: Lhs<'_, T>, b: &[T]) -> Result<Vec<T>, ArithErr> {
    Ok(match op {
        BinaryOp::And => zip_lhs(a, b, T::and),
        BinaryOp::Or => zip_lhs(a, b, T::or),
        BinaryOp::Xor => zip_lhs(a, b, T::xor),
        BinaryOp::Shl => zip_lhs(a, b, T::shl),
        BinaryOp::Shr => zip_lhs(a, b, T::shr),
        _ => return num_binary(op, a, b),
    })
}

fn bool_binary(op: BinaryOp, a: Lhs<'_, bool>, b: &[bool]) -> Result<Vec<bool>, ArithErr> {
    Ok(match op {
        BinaryOp::And => zip_lhs(a, b, |x, y| x & y),
        BinaryOp::Or => zip_lhs(a, b, |x, y| x | y),
        BinaryOp::Xor => zip_lhs(a, b, |x, y| x ^ y),
        _ => {
            return Err(ArithErr::Unsupported(format!(
                "`{}` is not defined on i1",
                op.name()
            )));
        }
    })
}

fn mismatch(what: &str, a: &Data) -> ArithErr {
    ArithErr::Unsupported(format!("`{what}` is not defined on {}", data_type_name(a)))
}

/// The element type name of a tile, for messages.
fn data_type_name(d: &Data) -> String {
    match d {
        Data::Ptr(_) => "pointers".into(),
        Data::I1(_) => "i1".into(),
        Data::I8(_) => "i8".into(),
        Data::I16(_) => "i16".into(),
        Data::I32(_) => "i32".into(),
        Data::I64(_) => "i64".into(),
        Data::U8(_) => "u8".into(),
        Data::U16(_) => "u16".into(),
        Data::U32(_) => "u32".into(),
        Data::U64(_) => "u64".into(),
        Data::F16(_) => "f16".into(),
        Data::BF16(_) => "bf16".into(),
        Data::F32(_) => "f32".into(),
        Data::F64(_) => "f64".into(),
        Data::F8E4M3(_) => "f8e4m3".into(),
        Data::F8E5M2(_) => "f8e5m2".into(),
    }
}

/// A tile operand: borrowed, or owned at its last use (then reused for the result).
pub(crate) enum Operand<'a> {
    Ref(&'a Data),
    Own(Data),
}

/// Elementwise binary op of two tiles of one type.
pub(crate) fn binary(op: BinaryOp, a: Operand<'_>, b: &Data) -> Result<Data, ArithErr> {
    use Data as D;
    macro_rules! arms {
        ($($v:ident => $f:ident),*) => {
            match (a, b) {
                $(
                    (Operand::Ref(D::$v(x)), D::$v(y)) => D::$v($f(op, Lhs::Ref(x), y)?),
                    (Operand::Own(D::$v(x)), D::$v(y)) => D::$v($f(op, Lhs::Own(x), y)?),
                )*
                (Operand::Ref(a), _) => return Err(mismatch(op.name(), a)),
                (Operand::Own(a), _) => return Err(mismatch(op.name(), &a)),
            }
        };
    }
    Ok(arms!(
        I1 => bool_binary,
        I8 => int_binary,
        I16 => int_binary,
        I32 => int_binary,
        I64 => int_binary,
        U8 => int_binary,
        U16 => int_binary,
        U32 => int_binary,
        U64 => int_binary,
        F16 => float_binary,
        BF16 => float_binary,
        F32 => float_binary,
        F64 => float_binary
    ))
}

fn int_unary<T: Int>(op: UnaryOp, a: &[T]) -> Result<Vec<T>, ArithErr> {
    Ok(match op {
        UnaryOp::Neg => a.iter().map(|&x| x.neg()).collect(),
        UnaryOp::Abs => a.iter().map(|&x| x.abs()).collect(),
        UnaryOp::Not => a.iter().map(|&x| x.not()).collect(),
        UnaryOp::Popc => a.iter().map(|&x| x.popc()).collect(),
        UnaryOp::Clz => a.iter().map(|&x| x.clz()).collect(),
        _ => {
            return Err(ArithErr::Unsupported(format!(
                "`{}` is not defined on {}",
                op.name(),
                T::TY
            )));
        }
    })
}

/// `erf` of an f32 (libm's `erff`, from musl).
fn erf32(x: f32) -> f32 {
    libm::erff(x)
}

fn float_unary<T: Float>(op: UnaryOp, a: &[T]) -> Result<Vec<T>, ArithErr> {
    let m = |f32fn: fn(f32) -> f32, f64fn: fn(f64) -> f64| -> Vec<T> {
        a.iter().map(|&x| x.math(f32fn, f64fn)).collect()
    };
    Ok(match op {
        UnaryOp::Neg => a.iter().map(|&x| x.neg()).collect(),
        UnaryOp::Abs => a.iter().map(|&x| x.abs()).collect(),
        UnaryOp::Exp => m(f32::exp, f64::exp),
        UnaryOp::Exp2 => m(f32::exp2, f64::exp2),
        UnaryOp::Log => m(f32::ln, f64::ln),
        UnaryOp::Log2 => m(f32::log2, f64::log2),
        UnaryOp::Sqrt => m(f32::sqrt, f64::sqrt),
        UnaryOp::Rsqrt => m(|x| 1.0 / x.sqrt(), |x| 1.0 / x.sqrt()),
        UnaryOp::Sin => m(f32::sin, f64::sin),
        UnaryOp::Cos => m(f32::cos, f64::cos),
        UnaryOp::Tanh => m(f32::tanh, f64::tanh),
        UnaryOp::Erf => m(erf32, libm::erf),
        UnaryOp::Floor => m(f32::floor, f64::floor),
        UnaryOp::Ceil => m(f32::ceil, f64::ceil),
        UnaryOp::Not | UnaryOp::Popc | UnaryOp::Clz => {
            return Err(ArithErr::Unsupported(format!(
                "`{}` is not defined on {}",
                op.name(),
                T::TY
            )));
        }
    })
}

/// Elementwise unary op.
pub(crate) fn unary(op: UnaryOp, a: &Data) -> Result<Data, ArithErr> {
    use Data as D;
    Ok(match a {
        D::I1(x) if op == UnaryOp::Not => D::I1(x.iter().map(|&b| !b).collect()),
        D::I8(x) => D::I8(int_unary(op, x)?),
        D::I16(x) => D::I16(int_unary(op, x)?),
        D::I32(x) => D::I32(int_unary(op, x)?),
        D::I64(x) => D::I64(int_unary(op, x)?),
        D::U8(x) => D::U8(int_unary(op, x)?),
        D::U16(x) => D::U16(int_unary(op, x)?),
        D::U32(x) => D::U32(int_unary(op, x)?),
        D::U64(x) => D::U64(int_unary(op, x)?),
        D::F16(x) => D::F16(float_unary(op, x)?),
        D::BF16(x) => D::BF16(float_unary(op, x)?),
        D::F32(x) => D::F32(float_unary(op, x)?),
        D::F64(x) => D::F64(float_unary(op, x)?),
        _ => return Err(mismatch(op.name(), a)),
    })
}

fn fma_vec<T: Float>(a: &[T], b: &[T], c: &[T]) -> Vec<T> {
    a.iter()
        .zip(b)
        .zip(c)
        .map(|((&x, &y), &z)| T::fma(x, y, z))
        .collect()
}

/// Elementwise fused multiply-add of float tiles.
pub(crate) fn fma(a: &Data, b: &Data, c: &Data) -> Result<Data, ArithErr> {
    use Data as D;
    Ok(match (a, b, c) {
        (D::F16(x), D::F16(y), D::F16(z)) => D::F16(fma_vec(x, y, z)),
        (D::BF16(x), D::BF16(y), D::BF16(z)) => D::BF16(fma_vec(x, y, z)),
        (D::F32(x), D::F32(y), D::F32(z)) => D::F32(fma_vec(x, y, z)),
        (D::F64(x), D::F64(y), D::F64(z)) => D::F64(fma_vec(x, y, z)),
        _ => return Err(mismatch("fma", a)),
    })
}

fn cmp_vec<T: PartialOrd + Copy>(p: CmpPred, a: &[T], b: &[T]) -> Vec<bool> {
    match p {
        CmpPred::Eq => zip(a, b, |x, y| x == y),
        CmpPred::Ne => zip(a, b, |x, y| x != y),
        CmpPred::Lt => zip(a, b, |x, y| x < y),
        CmpPred::Le => zip(a, b, |x, y| x <= y),
        CmpPred::Gt => zip(a, b, |x, y| x > y),
        CmpPred::Ge => zip(a, b, |x, y| x >= y),
    }
}

/// Elementwise comparison (`false < true` for `i1`).
pub(crate) fn cmp(p: CmpPred, a: &Data, b: &Data) -> Result<Vec<bool>, ArithErr> {
    use Data as D;
    Ok(match (a, b) {
        (D::I1(x), D::I1(y)) => cmp_vec(p, x, y),
        (D::I8(x), D::I8(y)) => cmp_vec(p, x, y),
        (D::I16(x), D::I16(y)) => cmp_vec(p, x, y),
        (D::I32(x), D::I32(y)) => cmp_vec(p, x, y),
        (D::I64(x), D::I64(y)) => cmp_vec(p, x, y),
        (D::U8(x), D::U8(y)) => cmp_vec(p, x, y),
        (D::U16(x), D::U16(y)) => cmp_vec(p, x, y),
        (D::U32(x), D::U32(y)) => cmp_vec(p, x, y),
        (D::U64(x), D::U64(y)) => cmp_vec(p, x, y),
        (D::F16(x), D::F16(y)) => cmp_vec(p, x, y),
        (D::BF16(x), D::BF16(y)) => cmp_vec(p, x, y),
        (D::F32(x), D::F32(y)) => cmp_vec(p, x, y),
        (D::F64(x), D::F64(y)) => cmp_vec(p, x, y),
        _ => return Err(mismatch("cmp", a)),
    })
}

fn cast_vec<S: Elt, D: Elt>(v: &[S]) -> Vec<D> {
    v.iter().map(|&x| x.cast::<D>()).collect()
}

/// Elementwise conversion to `to` (see the module docs for the rules).
/// Reinterprets the bits of every element as `to`, which must have the same width
/// (neither may be `i1` or a pointer).
pub(crate) fn bitcast(a: &Data, to: ScalarType) -> Result<Data, ArithErr> {
    fn b<T: Copy>(v: &[T], f: impl Fn(T) -> u64) -> Vec<u64> {
        v.iter().map(|&x| f(x)).collect()
    }
    let (width, bits) = match a {
        Data::I8(v) => (8, b(v, |x| u64::from(x as u8))),
        Data::U8(v) => (8, b(v, u64::from)),
        Data::F8E4M3(v) => (8, b(v, |x| u64::from(x.to_bits()))),
        Data::F8E5M2(v) => (8, b(v, |x| u64::from(x.to_bits()))),
        Data::I16(v) => (16, b(v, |x| u64::from(x as u16))),
        Data::U16(v) => (16, b(v, u64::from)),
        Data::F16(v) => (16, b(v, |x| u64::from(x.to_bits()))),
        Data::BF16(v) => (16, b(v, |x| u64::from(x.to_bits()))),
        Data::I32(v) => (32, b(v, |x| u64::from(x as u32))),
        Data::U32(v) => (32, b(v, u64::from)),
        Data::F32(v) => (32, b(v, |x| u64::from(x.to_bits()))),
        Data::I64(v) => (64, b(v, |x| x as u64)),
        Data::U64(v) => (64, b(v, |x| x)),
        Data::F64(v) => (64, b(v, f64::to_bits)),
        Data::I1(_) | Data::Ptr(_) => return Err(mismatch("bitcast", a)),
    };
    if to.bits() != width || to == ScalarType::I1 {
        return Err(ArithErr::Unsupported(format!(
            "`bitcast` from {} to {to}: the widths differ",
            data_type_name(a)
        )));
    }
    fn m<T>(bits: &[u64], f: impl Fn(u64) -> T) -> Vec<T> {
        bits.iter().map(|&x| f(x)).collect()
    }
    Ok(match to {
        ScalarType::I8 => Data::I8(m(&bits, |x| x as u8 as i8)),
        ScalarType::U8 => Data::U8(m(&bits, |x| x as u8)),
        ScalarType::F8E4M3 => Data::F8E4M3(m(&bits, |x| F8E4M3::from_bits(x as u8))),
        ScalarType::F8E5M2 => Data::F8E5M2(m(&bits, |x| F8E5M2::from_bits(x as u8))),
        ScalarType::I16 => Data::I16(m(&bits, |x| x as u16 as i16)),
        ScalarType::U16 => Data::U16(m(&bits, |x| x as u16)),
        ScalarType::F16 => Data::F16(m(&bits, |x| f16::from_bits(x as u16))),
        ScalarType::BF16 => Data::BF16(m(&bits, |x| bf16::from_bits(x as u16))),
        ScalarType::I32 => Data::I32(m(&bits, |x| x as u32 as i32)),
        ScalarType::U32 => Data::U32(m(&bits, |x| x as u32)),
        ScalarType::F32 => Data::F32(m(&bits, |x| f32::from_bits(x as u32))),
        ScalarType::I64 => Data::I64(m(&bits, |x| x as i64)),
        ScalarType::U64 => Data::U64(bits),
        ScalarType::F64 => Data::F64(m(&bits, f64::from_bits)),
        ScalarType::I1 => unreachable!("rejected above"),
    })
}

pub(crate) fn cast(a: &Data, to: ScalarType) -> Result<Data, ArithErr> {
    macro_rules! to_dst {
        ($v:expr) => {
            match to {
                ScalarType::I1 => Data::I1(cast_vec($v)),
                ScalarType::I8 => Data::I8(cast_vec($v)),
                ScalarType::I16 => Data::I16(cast_vec($v)),
                ScalarType::I32 => Data::I32(cast_vec($v)),
                ScalarType::I64 => Data::I64(cast_vec($v)),
                ScalarType::U8 => Data::U8(cast_vec($v)),
                ScalarType::U16 => Data::U16(cast_vec($v)),
                ScalarType::U32 => Data::U32(cast_vec($v)),
                ScalarType::U64 => Data::U64(cast_vec($v)),
                ScalarType::F16 => Data::F16(cast_vec($v)),
                ScalarType::BF16 => Data::BF16(cast_vec($v)),
                ScalarType::F32 => Data::F32(cast_vec($v)),
                ScalarType::F64 => Data::F64(cast_vec($v)),
                ScalarType::F8E4M3 => Data::F8E4M3(cast_vec($v)),
                ScalarType::F8E5M2 => Data::F8E5M2(cast_vec($v)),
            }
        };
    }
    Ok(match a {
        Data::I1(v) => to_dst!(v),
        Data::I8(v) => to_dst!(v),
        Data::I16(v) => to_dst!(v),
        Data::I32(v) => to_dst!(v),
        Data::I64(v) => to_dst!(v),
        Data::U8(v) => to_dst!(v),
        Data::U16(v) => to_dst!(v),
        Data::U32(v) => to_dst!(v),
        Data::U64(v) => to_dst!(v),
        Data::F16(v) => to_dst!(v),
        Data::BF16(v) => to_dst!(v),
        Data::F32(v) => to_dst!(v),
        Data::F64(v) => to_dst!(v),
        Data::F8E4M3(v) => to_dst!(v),
        Data::F8E5M2(v) => to_dst!(v),
        Data::Ptr(_) => return Err(mismatch("cast", a)),
    })
}

/// Reduces `x` viewed as `[outer, n, inner]` along the middle axis, combining
/// sequentially from index 0 to `n - 1`. `x.len() == outer * n * inner`, `n >= 1`.
fn reduce_vec<T: Copy>(
    x: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = o * n * inner;
        let start = out.len();
        out.extend_from_slice(&x[base..base + inner]);
        let acc = &mut out[start..];
        for k in 1..n {
            let row = &x[base + k * inner..base + (k + 1) * inner];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a = f(*a, v);
            }
        }
    }
    out
}

/// Inclusive scan of `x` viewed as `[outer, n, inner]` along the middle axis.
fn scan_vec<T: Copy>(
    x: &[T],
    outer: usize,
    n: usize,
    inner: usize,
    reverse: bool,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut out = x.to_vec();
    for o in 0..outer {
        let base = o * n * inner;
        for step in 1..n {
            let (prev, k) = if reverse {
                (n - step, n - 1 - step)
            } else {
                (step - 1, step)
            };
            for i in 0..inner {
                let p = out[base + prev * inner + i];
                let c = &mut out[base + k * inner + i];
                *c = f(p, *c);
            }
        }
    }
    out
}

/// Reduction (`scan: None`) or scan (`Some(reverse)`) of `x` viewed as
/// `[outer, n, inner]` along the middle axis.
pub(crate) fn reduce_or_scan(
    op: ReduceOp,
    x: &Data,
    (outer, n, inner): (usize, usize, usize),
    scan: Option<bool>,
) -> Result<Data, ArithErr> {
    fn go<T: Copy>(
        x: &[T],
        dims: (usize, usize, usize),
        scan: Option<bool>,
        f: impl Fn(T, T) -> T,
    ) -> Vec<T> {
        match scan {
            None => reduce_vec(x, dims.0, dims.1, dims.2, f),
            Some(rev) => scan_vec(x, dims.0, dims.1, dims.2, rev, f),
        }
    }
    fn num<T: Num>(
        op: ReduceOp,
        x: &[T],
        d: (usize, usize, usize),
        s: Option<bool>,
    ) -> Result<Vec<T>, ArithErr> {
        Ok(match op {
            ReduceOp::Sum => go(x, d, s, T::add),
            ReduceOp::Prod => go(x, d, s, T::mul),
            ReduceOp::Min => go(x, d, s, T::min_),
            ReduceOp::Max => go(x, d, s, T::max_),
            _ => {
                return Err(ArithErr::Unsupported(format!(
                    "`{}` is not defined on {}",
                    op.name(),
                    T::TY
                )));
            }
        })
    }
    fn int<T: Int>(
        op: ReduceOp,
        x: &[T],
        d: (usize, usize, usize),
        s: Option<bool>,
    ) -> Result<Vec<T>, ArithErr> {
        Ok(match op {
            ReduceOp::And => go(x, d, s, T::and),
            ReduceOp::Or => go(x, d, s, T::or),
            ReduceOp::Xor => go(x, d, s, T::xor),
            _ => return num(op, x, d, s),
        })
    }
    let d = (outer, n, inner);
    if n == 0 || x.len() != outer * n * inner {
        return Err(ArithErr::Unsupported(format!(
            "tile of {} elements does not match the reduced shape",
            x.len()
        )));
    }
    use Data as D;
    Ok(match x {
        D::I1(v) => D::I1(match op {
            ReduceOp::And => go(v, d, scan, |a, b| a & b),
            ReduceOp::Or => go(v, d, scan, |a, b| a | b),
            ReduceOp::Xor => go(v, d, scan, |a, b| a ^ b),
            _ => return Err(mismatch(op.name(), x)),
        }),
        D::I8(v) => D::I8(int(op, v, d, scan)?),
        D::I16(v) => D::I16(int(op, v, d, scan)?),
        D::I32(v) => D::I32(int(op, v, d, scan)?),
        D::I64(v) => D::I64(int(op, v, d, scan)?),
        D::U8(v) => D::U8(int(op, v, d, scan)?),
        D::U16(v) => D::U16(int(op, v, d, scan)?),
        D::U32(v) => D::U32(int(op, v, d, scan)?),
        D::U64(v) => D::U64(int(op, v, d, scan)?),
        D::F16(v) => D::F16(num(op, v, d, scan)?),
        D::BF16(v) => D::BF16(num(op, v, d, scan)?),
        D::F32(v) => D::F32(num(op, v, d, scan)?),
        D::F64(v) => D::F64(num(op, v, d, scan)?),
        D::F8E4M3(_) | D::F8E5M2(_) | D::Ptr(_) => return Err(mismatch(op.name(), x)),
    })
}

/// `dot_scaled` ([`crate::ir::OpKind::DotScaled`]): `a` (`m x k` elements of
/// `format`) and `b` (`k x n`) decoded exactly to f32 and multiplied by their block's
/// scale (in f32), then [`dot`]'s f32 loop. `dims` is `(m, k, n)` in elements.
pub(crate) fn dot_scaled(
    format: ScaledFormat,
    [a, sa, b, sb]: [&Data; 4],
    acc: Data,
    dims: (usize, usize, usize),
) -> Result<Data, ArithErr> {
    let (m, k, n) = dims;
    let bad = |what: &str| ArithErr::Unsupported(format!("dot_scaled: {what}"));
    let elems = |d: &Data, rows: usize, cols: usize| -> Result<Vec<f32>, ArithErr> {
        let v: Vec<f32> = match (format, d) {
            (ScaledFormat::E4M3, Data::F8E4M3(v)) => v.iter().map(|x| x.to_f32()).collect(),
            (ScaledFormat::E5M2, Data::F8E5M2(v)) => v.iter().map(|x| x.to_f32()).collect(),
            (ScaledFormat::E2M1, Data::U8(v)) => v
                .iter()
                .flat_map(|&x| [crate::mx::e2m1_to_f32(x), crate::mx::e2m1_to_f32(x >> 4)])
                .collect(),
            _ => return Err(bad("operand of another type than its format")),
        };
        if v.len() != rows * cols {
            return Err(bad("operand size does not match its shape"));
        }
        Ok(v)
    };
    let scales = |d: &Data| -> Result<Vec<f32>, ArithErr> {
        Ok(match d {
            Data::U8(v) => v.iter().map(|&e| crate::mx::E8M0(e).to_f32()).collect(),
            Data::F8E4M3(v) => v.iter().map(|x| x.to_f32()).collect(),
            _ => return Err(bad("scales are u8 (E8M0) or f8e4m3")),
        })
    };
    let (mut x, mut y) = (elems(a, m, k)?, elems(b, k, n)?);
    let (xs, ys) = (scales(sa)?, scales(sb)?);
    if xs.is_empty() || xs.len() % m != 0 || k % (xs.len() / m).max(1) != 0 {
        return Err(bad("scale sizes do not match the operands"));
    }
    let v = k / (xs.len() / m);
    if ys.len() != (k / v) * n {
        return Err(bad("scale sizes do not match the operands"));
    }
    for i in 0..m {
        for kk in 0..k {
            x[i * k + kk] *= xs[i * (k / v) + kk / v];
        }
    }
    for kk in 0..k {
        for j in 0..n {
            y[kk * n + j] *= ys[(kk / v) * n + j];
        }
    }
    match acc {
        Data::F32(mut c) => {
            if c.len() != m * n {
                return Err(bad("accumulator size does not match its shape"));
            }
            dot_loop(&x, &y, &mut c, dims, |p, q| p * q, |p, q| p + q);
            Ok(Data::F32(c))
        }
        _ => Err(bad("the accumulator is f32")),
    }
}

/// `acc[m][n] += sum_k a[m][k] * b[k][n]` in i-k-j order; for each output element the
/// products are added to it in order of increasing `k` (each product and each sum
/// rounded to the element type).
fn dot_loop<T: Copy>(
    a: &[T],
    b: &[T],
    acc: &mut [T],
    (m, k, n): (usize, usize, usize),
    mul: impl Fn(T, T) -> T,
    add: impl Fn(T, T) -> T,
) {
    for i in 0..m {
        let row = &mut acc[i * n..(i + 1) * n];
        let arow = &a[i * k..(i + 1) * k];
        for (kk, &aik) in arow.iter().enumerate() {
            let brow = &b[kk * n..(kk + 1) * n];
            for (c, &bv) in row.iter_mut().zip(brow) {
                *c = add(*c, mul(aik, bv));
            }
        }
    }
}

/// `dot a, b, acc` with `a: [m, k]`, `b: [k, n]`, `acc: [m, n]` (taken by value and
/// accumulated into).
pub(crate) fn dot(
    a: &Data,
    b: &Data,
    acc: Data,
    dims: (usize, usize, usize),
) -> Result<Data, ArithErr> {
    let (m, k, n) = dims;
    if a.len() != m * k || b.len() != k * n || acc.len() != m * n {
        return Err(ArithErr::Unsupported(
            "dot operand sizes do not match their shapes".into(),
        ));
    }
    fn to32<T: Copy>(v: &[T], f: impl Fn(T) -> f32) -> Vec<f32> {
        v.iter().map(|&x| f(x)).collect()
    }
    use Data as D;
    Ok(match (a, b, acc) {
        (D::F32(x), D::F32(y), D::F32(mut c)) => {
            dot_loop(x, y, &mut c, dims, |p, q| p * q, |p, q| p + q);
            D::F32(c)
        }
        (D::F16(x), D::F16(y), D::F32(mut c)) => {
            let (x, y) = (to32(x, f16::to_f32), to32(y, f16::to_f32));
            dot_loop(&x, &y, &mut c, dims, |p, q| p * q, |p, q| p + q);
            D::F32(c)
        }
        (D::BF16(x), D::BF16(y), D::F32(mut c)) => {
            let (x, y) = (to32(x, bf16::to_f32), to32(y, bf16::to_f32));
            dot_loop(&x, &y, &mut c, dims, |p, q| p * q, |p, q| p + q);
            D::F32(c)
        }
        (D::F64(x), D::F64(y), D::F64(mut c)) => {
            dot_loop(x, y, &mut c, dims, |p, q| p * q, |p, q| p + q);
            D::F64(c)
        }
        (D::F8E4M3(x), D::F8E4M3(y), D::F32(mut c)) => {
            let (x, y) = (to32(x, |v| v.to_f32()), to32(y, |v| v.to_f32()));
            dot_loop(&x, &y, &mut c, dims, |p, q| p * q, |p, q| p + q);
            D::F32(c)
        }
        (D::F8E5M2(x), D::F8E5M2(y), D::F32(mut c)) => {
            let (x, y) = (to32(x, |v| v.to_f32()), to32(y, |v| v.to_f32()));
            dot_loop(&x, &y, &mut c, dims, |p, q| p * q, |p, q| p + q);
            D::F32(c)
        }
        (D::I8(x), D::I8(y), D::I32(mut c)) => {
            let x: Vec<i32> = x.iter().map(|&v| v as i32).collect();
            let y: Vec<i32> = y.iter().map(|&v| v as i32).collect();
            dot_loop(&x, &y, &mut c, dims, |p, q| p * q, i32::wrapping_add);
            D::I32(c)
        }
        _ => return Err(mismatch("dot", a)),
    })
}

//! IEEE 754-2019 `minimum` and `maximum` (NaN-propagating, `-0.0 < +0.0`) over the
//! interpreter's float types: a leaf that the arithmetic (`arith`) and the buffers'
//! atomics (`buffer`) share.

use half::{bf16, f16};

/// A float whose NaNs and sign the min/max rules look at.
pub(crate) trait IeeeFloat: Copy + PartialOrd {
    /// Whether it is a NaN.
    fn is_nan_(self) -> bool;
    /// Whether its sign bit is set (`-0.0` included).
    fn is_neg_(self) -> bool;
}

macro_rules! ieee_float {
    ($($t:ty),*) => {$(
        impl IeeeFloat for $t {
            #[inline(always)]
            fn is_nan_(self) -> bool {
                self.is_nan()
            }
            #[inline(always)]
            fn is_neg_(self) -> bool {
                self.is_sign_negative()
            }
        }
    )*};
}

ieee_float!(f32, f64, f16, bf16);

/// Float minimum, NaN-propagating (IEEE 754-2019 `minimum`, PTX `min.NaN`): NaN if
/// either operand is NaN (the first NaN operand), and `-0.0 < +0.0`.
#[inline(always)]
pub(crate) fn fmin<T: IeeeFloat>(a: T, b: T) -> T {
    if a.is_nan_() {
        a
    } else if b.is_nan_() {
        b
    } else if a < b {
        a
    } else if b < a {
        b
    } else if a.is_neg_() {
        a
    } else {
        b
    }
}

/// Float maximum, NaN-propagating (IEEE 754-2019 `maximum`): NaN if either operand is
/// NaN, and `+0.0 > -0.0`.
#[inline(always)]
pub(crate) fn fmax<T: IeeeFloat>(a: T, b: T) -> T {
    if a.is_nan_() {
        a
    } else if b.is_nan_() {
        b
    } else if a > b {
        a
    } else if b > a || a.is_neg_() {
        b
    } else {
        a
    }
}

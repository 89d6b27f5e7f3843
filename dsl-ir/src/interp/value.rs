//! Kernel arguments ([`Scalar`], [`KernelArg`]) and the interpreter's dense tile values.

use std::fmt;
use std::sync::Arc;

use crate::fp8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

use super::buffer::{Element, HostBuffer};
use crate::types::ScalarType;

/// A typed scalar kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// `i1`.
    I1(bool),
    /// `i8`.
    I8(i8),
    /// `i16`.
    I16(i16),
    /// `i32`.
    I32(i32),
    /// `i64`.
    I64(i64),
    /// `u8`.
    U8(u8),
    /// `u16`.
    U16(u16),
    /// `u32`.
    U32(u32),
    /// `u64`.
    U64(u64),
    /// `f16`.
    F16(f16),
    /// `bf16`.
    BF16(bf16),
    /// `f32`.
    F32(f32),
    /// `f64`.
    F64(f64),
}

macro_rules! scalar_from {
    ($($v:ident($t:ty)),*) => {
        $(impl From<$t> for Scalar {
            fn from(x: $t) -> Scalar {
                Scalar::$v(x)
            }
        })*
        impl Scalar {
            /// The scalar's type.
            pub fn ty(&self) -> ScalarType {
                match self {
                    $(Scalar::$v(_) => ScalarType::$v,)*
                }
            }

            /// A one-element tile holding the scalar.
            pub(crate) fn to_data(self) -> Data {
                match self {
                    $(Scalar::$v(x) => Data::$v(vec![x]),)*
                }
            }
        }
    };
}

scalar_from!(
    I1(bool),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    F16(f16),
    BF16(bf16),
    F32(f32),
    F64(f64)
);

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::I1(x) => write!(f, "{x}"),
            Scalar::I8(x) => write!(f, "{x}"),
            Scalar::I16(x) => write!(f, "{x}"),
            Scalar::I32(x) => write!(f, "{x}"),
            Scalar::I64(x) => write!(f, "{x}"),
            Scalar::U8(x) => write!(f, "{x}"),
            Scalar::U16(x) => write!(f, "{x}"),
            Scalar::U32(x) => write!(f, "{x}"),
            Scalar::U64(x) => write!(f, "{x}"),
            Scalar::F16(x) => write!(f, "{x}"),
            Scalar::BF16(x) => write!(f, "{x}"),
            Scalar::F32(x) => write!(f, "{x}"),
            Scalar::F64(x) => write!(f, "{x}"),
        }?;
        write!(f, ": {}", self.ty())
    }
}

/// One kernel launch argument: a buffer for a pointer parameter (the pointer points at
/// its element 0), or a scalar of exactly the parameter's type.
#[derive(Clone, Debug)]
pub enum KernelArg {
    /// Device memory for a `ptr<T>` parameter; its element type must be `T`.
    Buffer(Arc<HostBuffer>),
    /// A value for a scalar parameter.
    Scalar(Scalar),
    /// A symmetric buffer for a `ptr<T>` parameter: every rank's copy, indexed by rank
    /// (the launch's [`CommWorld`](super::CommWorld) says which one is local). Pointers
    /// derived from it can be translated to a peer's copy with `remote_ptr`.
    Symmetric(Arc<[Arc<HostBuffer>]>),
}

impl From<Arc<HostBuffer>> for KernelArg {
    fn from(b: Arc<HostBuffer>) -> KernelArg {
        KernelArg::Buffer(b)
    }
}

impl From<Scalar> for KernelArg {
    fn from(s: Scalar) -> KernelArg {
        KernelArg::Scalar(s)
    }
}

/// Which buffer each lane of a pointer tile points into (the buffer's parameter index).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Slots {
    /// Every lane points into one buffer (the common case).
    Uniform(u32),
    /// Per lane.
    Lanes(Vec<u32>),
}

impl Slots {
    #[inline]
    pub(crate) fn get(&self, i: usize) -> u32 {
        match self {
            Slots::Uniform(s) => *s,
            Slots::Lanes(v) => v[i],
        }
    }
}

/// A tile of pointers: (buffer slot, element offset) per lane.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PtrTile {
    pub(crate) slots: Slots,
    pub(crate) offs: Vec<i64>,
}

/// A dense tile value in row-major order (its shape is the IR value's type).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    I1(Vec<bool>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    F8E4M3(Vec<F8E4M3>),
    F8E5M2(Vec<F8E5M2>),
    Ptr(PtrTile),
}

/// Applies `$e` (an expression over `$v: &Vec<T>`, generic in `T: Elt`) to every variant
/// of `&Data`, rebuilding a `Data` of the same kind. Pointer tiles apply it to the
/// offsets and to per-lane slots (uniform slots stay uniform).
macro_rules! map_data {
    ($d:expr, |$v:ident| $e:expr) => {
        match $d {
            Data::I1($v) => Data::I1($e),
            Data::I8($v) => Data::I8($e),
            Data::I16($v) => Data::I16($e),
            Data::I32($v) => Data::I32($e),
            Data::I64($v) => Data::I64($e),
            Data::U8($v) => Data::U8($e),
            Data::U16($v) => Data::U16($e),
            Data::U32($v) => Data::U32($e),
            Data::U64($v) => Data::U64($e),
            Data::F16($v) => Data::F16($e),
            Data::BF16($v) => Data::BF16($e),
            Data::F32($v) => Data::F32($e),
            Data::F64($v) => Data::F64($e),
            Data::F8E4M3($v) => Data::F8E4M3($e),
            Data::F8E5M2($v) => Data::F8E5M2($e),
            Data::Ptr(p) => Data::Ptr($crate::interp::value::PtrTile {
                slots: match &p.slots {
                    $crate::interp::value::Slots::Uniform(s) => {
                        $crate::interp::value::Slots::Uniform(*s)
                    }
                    $crate::interp::value::Slots::Lanes($v) => {
                        $crate::interp::value::Slots::Lanes($e)
                    }
                },
                offs: {
                    let $v = &p.offs;
                    $e
                },
            }),
        }
    };
}
pub(crate) use map_data;

impl Data {
    /// Number of lanes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Data::I1(v) => v.len(),
            Data::I8(v) => v.len(),
            Data::I16(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::U8(v) => v.len(),
            Data::U16(v) => v.len(),
            Data::U32(v) => v.len(),
            Data::U64(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::F8E4M3(v) => v.len(),
            Data::F8E5M2(v) => v.len(),
            Data::Ptr(p) => p.offs.len(),
        }
    }

    /// Lane `i` of an integer tile as `i128` (exact for every integer type).
    pub(crate) fn int_at(&self, i: usize) -> Option<i128> {
        Some(match self {
            Data::I8(v) => *v.get(i)? as i128,
            Data::I16(v) => *v.get(i)? as i128,
            Data::I32(v) => *v.get(i)? as i128,
            Data::I64(v) => *v.get(i)? as i128,
            Data::U8(v) => *v.get(i)? as i128,
            Data::U16(v) => *v.get(i)? as i128,
            Data::U32(v) => *v.get(i)? as i128,
            Data::U64(v) => *v.get(i)? as i128,
            _ => return None,
        })
    }

    /// A one-element tile of integer type `ty` holding `x` (truncated as Rust's `as`).
    pub(crate) fn int_scalar(ty: ScalarType, x: i128) -> Option<Data> {
        Some(match ty {
            ScalarType::I8 => Data::I8(vec![x as i8]),
            ScalarType::I16 => Data::I16(vec![x as i16]),
            ScalarType::I32 => Data::I32(vec![x as i32]),
            ScalarType::I64 => Data::I64(vec![x as i64]),
            ScalarType::U8 => Data::U8(vec![x as u8]),
            ScalarType::U16 => Data::U16(vec![x as u16]),
            ScalarType::U32 => Data::U32(vec![x as u32]),
            ScalarType::U64 => Data::U64(vec![x as u64]),
            _ => return None,
        })
    }
}

/// Rounds `x` to f32 with round-to-odd (exact results stay exact; inexact ones take the
/// neighbour with an odd significand), so that a second rounding to a narrower format
/// (f16, bf16) is correctly rounded.
fn f64_to_f32_odd(x: f64) -> f32 {
    let f = x as f32;
    if x.is_nan() || f as f64 == x {
        return f;
    }
    if f.is_infinite() {
        // Finite `x` beyond f32's range: the largest finite f32 (odd significand),
        // which then overflows f16/bf16 to infinity as it should.
        return f32::MAX.copysign(f);
    }
    if f.to_bits() & 1 == 1 {
        return f;
    }
    if (f as f64) < x {
        f.next_up()
    } else {
        f.next_down()
    }
}

/// `v` (magnitude `mag`, sign `neg`) rounded to f64 with round-to-odd.
fn int_to_f64_odd(neg: bool, mag: u64) -> f64 {
    let r = if mag < (1 << 53) {
        mag as f64
    } else {
        let shift = 64 - mag.leading_zeros() - 53;
        let mut hi = mag >> shift;
        if mag & ((1u64 << shift) - 1) != 0 {
            hi |= 1;
        }
        hi as f64 * (1u64 << shift) as f64
    };
    if neg { -r } else { r }
}

/// `x` correctly rounded (to nearest even) to f16.
pub(crate) fn f16_from_f64(x: f64) -> f16 {
    f16::from_f32(f64_to_f32_odd(x))
}

/// `x` correctly rounded (to nearest even) to bf16.
pub(crate) fn bf16_from_f64(x: f64) -> bf16 {
    bf16::from_f32(f64_to_f32_odd(x))
}

/// Element types of dense tiles, with the conversions of `cast` and `const`.
pub(crate) trait Elt: Element + Default + PartialEq + PartialOrd + fmt::Debug {
    /// Wraps a vector into the matching [`Data`] variant.
    fn wrap(v: Vec<Self>) -> Data;
    /// The vector of a [`Data`] of this type.
    fn view(d: &Data) -> Option<&Vec<Self>>;
    /// Conversion from a signed integer (Rust `as` semantics; to `i1`: nonzero).
    fn from_i64(v: i64) -> Self;
    /// Conversion from an unsigned integer.
    fn from_u64(v: u64) -> Self;
    /// Conversion from f32 (to ints: saturating, NaN to 0; to `i1`: `x != 0`).
    fn from_f32(x: f32) -> Self;
    /// Conversion from f64.
    fn from_f64(x: f64) -> Self;
    /// Conversion from a boolean (1 or 0).
    fn from_bool(b: bool) -> Self;
    /// `cast` to another element type.
    fn cast<D: Elt>(self) -> D;
}

macro_rules! elt_common {
    ($v:ident, $t:ty) => {
        fn wrap(v: Vec<$t>) -> Data {
            Data::$v(v)
        }
        fn view(d: &Data) -> Option<&Vec<$t>> {
            match d {
                Data::$v(v) => Some(v),
                _ => None,
            }
        }
    };
}

macro_rules! elt_int {
    ($v:ident, $t:ty, $via:ident, $wide:ty) => {
        impl Elt for $t {
            elt_common!($v, $t);
            #[inline(always)]
            fn from_i64(v: i64) -> $t {
                v as $t
            }
            #[inline(always)]
            fn from_u64(v: u64) -> $t {
                v as $t
            }
            #[inline(always)]
            fn from_f32(x: f32) -> $t {
                x as $t
            }
            #[inline(always)]
            fn from_f64(x: f64) -> $t {
                x as $t
            }
            #[inline(always)]
            fn from_bool(b: bool) -> $t {
                b as $t
            }
            #[inline(always)]
            fn cast<D: Elt>(self) -> D {
                D::$via(self as $wide)
            }
        }
    };
}

elt_int!(I8, i8, from_i64, i64);
elt_int!(I16, i16, from_i64, i64);
elt_int!(I32, i32, from_i64, i64);
elt_int!(I64, i64, from_i64, i64);
elt_int!(U8, u8, from_u64, u64);
elt_int!(U16, u16, from_u64, u64);
elt_int!(U32, u32, from_u64, u64);
elt_int!(U64, u64, from_u64, u64);

impl Elt for bool {
    elt_common!(I1, bool);
    fn from_i64(v: i64) -> bool {
        v != 0
    }
    fn from_u64(v: u64) -> bool {
        v != 0
    }
    fn from_f32(x: f32) -> bool {
        x != 0.0
    }
    fn from_f64(x: f64) -> bool {
        x != 0.0
    }
    fn from_bool(b: bool) -> bool {
        b
    }
    fn cast<D: Elt>(self) -> D {
        D::from_bool(self)
    }
}

impl Elt for f32 {
    elt_common!(F32, f32);
    #[inline(always)]
    fn from_i64(v: i64) -> f32 {
        v as f32
    }
    #[inline(always)]
    fn from_u64(v: u64) -> f32 {
        v as f32
    }
    #[inline(always)]
    fn from_f32(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    fn from_bool(b: bool) -> f32 {
        b as u8 as f32
    }
    #[inline(always)]
    fn cast<D: Elt>(self) -> D {
        D::from_f32(self)
    }
}

impl Elt for f64 {
    elt_common!(F64, f64);
    #[inline(always)]
    fn from_i64(v: i64) -> f64 {
        v as f64
    }
    #[inline(always)]
    fn from_u64(v: u64) -> f64 {
        v as f64
    }
    #[inline(always)]
    fn from_f32(x: f32) -> f64 {
        x as f64
    }
    #[inline(always)]
    fn from_f64(x: f64) -> f64 {
        x
    }
    fn from_bool(b: bool) -> f64 {
        b as u8 as f64
    }
    #[inline(always)]
    fn cast<D: Elt>(self) -> D {
        D::from_f64(self)
    }
}

macro_rules! elt_half {
    ($v:ident, $t:ty, $from64:ident) => {
        impl Elt for $t {
            elt_common!($v, $t);
            fn from_i64(v: i64) -> $t {
                $from64(int_to_f64_odd(v < 0, v.unsigned_abs()))
            }
            fn from_u64(v: u64) -> $t {
                $from64(int_to_f64_odd(false, v))
            }
            #[inline(always)]
            fn from_f32(x: f32) -> $t {
                <$t>::from_f32(x)
            }
            fn from_f64(x: f64) -> $t {
                $from64(x)
            }
            fn from_bool(b: bool) -> $t {
                if b { <$t>::ONE } else { <$t>::ZERO }
            }
            #[inline(always)]
            fn cast<D: Elt>(self) -> D {
                D::from_f32(self.to_f32())
            }
        }
    };
}

elt_half!(F16, f16, f16_from_f64);
elt_half!(BF16, bf16, bf16_from_f64);

/// The 8-bit floats: conversions from f32 (and exactly representable f64) round to
/// nearest even and saturate to the largest finite value, NaN stays NaN (the
/// `satfinite` conversions of CUDA and the PTX ISA, as [`crate::fp8`] implements
/// them); to f16, bf16, f32 and f64 they are exact. Integers convert through f64
/// (the verifier admits only f16, bf16 and f32 casts).
macro_rules! elt_fp8 {
    ($v:ident, $t:ty) => {
        impl Elt for $t {
            elt_common!($v, $t);
            fn from_i64(v: i64) -> $t {
                <$t>::from_f64(v as f64)
            }
            fn from_u64(v: u64) -> $t {
                <$t>::from_f64(v as f64)
            }
            fn from_f32(x: f32) -> $t {
                <$t>::from_f32(x)
            }
            fn from_f64(x: f64) -> $t {
                <$t>::from_f64(x)
            }
            fn from_bool(b: bool) -> $t {
                <$t>::from_f32(if b { 1.0 } else { 0.0 })
            }
            fn cast<D: Elt>(self) -> D {
                D::from_f32(self.to_f32())
            }
        }
    };
}

elt_fp8!(F8E4M3, F8E4M3);
elt_fp8!(F8E5M2, F8E5M2);

//! Types of the tile IR: scalar element types, pointers with an address space, and
//! statically shaped tiles of either.
//!
//! A value's [`Type`] is an element ([`Elem`]) plus a static shape. Rank 0 is a plain
//! scalar; every dimension of a tile is a power of two (checked by the verifier), as the
//! GPU layouts require.

use std::fmt;

/// A scalar element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScalarType {
    /// 1-bit boolean (masks, comparison results).
    I1,
    /// 8-bit signed integer.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 8-bit unsigned integer.
    U8,
    /// 16-bit unsigned integer.
    U16,
    /// 32-bit unsigned integer.
    U32,
    /// 64-bit unsigned integer.
    U64,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// 8-bit float E4M3 (OCP 8-bit floating point, "E4M3FN": exponent bias 7, 3
    /// mantissa bits, no infinities, NaN `S.1111.111`, largest finite ±448). Storage
    /// and matrix-unit type: loads, stores, casts from and to f16/bf16/f32, and `dot`
    /// (into f32); no arithmetic.
    F8E4M3,
    /// 8-bit float E5M2 (OCP: exponent bias 15, 2 mantissa bits, IEEE infinities and
    /// NaNs, largest finite ±57344; the top byte of an f16). As [`ScalarType::F8E4M3`]:
    /// a storage and matrix-unit type.
    F8E5M2,
}

impl ScalarType {
    /// Every scalar type, in a fixed order.
    pub const ALL: [ScalarType; 15] = [
        ScalarType::I1,
        ScalarType::I8,
        ScalarType::I16,
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::U8,
        ScalarType::U16,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::F16,
        ScalarType::BF16,
        ScalarType::F32,
        ScalarType::F64,
        ScalarType::F8E4M3,
        ScalarType::F8E5M2,
    ];

    /// The IR spelling: `i1`, `i32`, `u8`, `f16`, `bf16`, ...
    pub fn name(self) -> &'static str {
        match self {
            ScalarType::I1 => "i1",
            ScalarType::I8 => "i8",
            ScalarType::I16 => "i16",
            ScalarType::I32 => "i32",
            ScalarType::I64 => "i64",
            ScalarType::U8 => "u8",
            ScalarType::U16 => "u16",
            ScalarType::U32 => "u32",
            ScalarType::U64 => "u64",
            ScalarType::F16 => "f16",
            ScalarType::BF16 => "bf16",
            ScalarType::F32 => "f32",
            ScalarType::F64 => "f64",
            ScalarType::F8E4M3 => "f8e4m3",
            ScalarType::F8E5M2 => "f8e5m2",
        }
    }

    /// Parses the IR spelling produced by [`ScalarType::name`].
    pub fn from_name(s: &str) -> Option<ScalarType> {
        ScalarType::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Width in bits (1 for `i1`).
    pub const fn bits(self) -> u32 {
        match self {
            ScalarType::I1 => 1,
            ScalarType::I8 | ScalarType::U8 | ScalarType::F8E4M3 | ScalarType::F8E5M2 => 8,
            ScalarType::I16 | ScalarType::U16 | ScalarType::F16 | ScalarType::BF16 => 16,
            ScalarType::I32 | ScalarType::U32 | ScalarType::F32 => 32,
            ScalarType::I64 | ScalarType::U64 | ScalarType::F64 => 64,
        }
    }

    /// Size of one element in memory, in bytes (`i1` is stored as one byte).
    pub fn size_bytes(self) -> usize {
        (self.bits().max(8) / 8) as usize
    }

    /// `f16`, `bf16`, `f32`, `f64`: the float types with arithmetic (not the 8-bit
    /// storage floats, [`Self::is_fp8`]).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            ScalarType::F16 | ScalarType::BF16 | ScalarType::F32 | ScalarType::F64
        )
    }

    /// The 8-bit storage floats `f8e4m3` and `f8e5m2`.
    pub fn is_fp8(self) -> bool {
        matches!(self, ScalarType::F8E4M3 | ScalarType::F8E5M2)
    }

    /// Integer types, excluding the boolean `i1`.
    pub fn is_int(self) -> bool {
        !self.is_float() && !self.is_fp8() && self != ScalarType::I1
    }

    /// Signed integers (`i8`..`i64`).
    pub fn is_signed_int(self) -> bool {
        matches!(
            self,
            ScalarType::I8 | ScalarType::I16 | ScalarType::I32 | ScalarType::I64
        )
    }

    /// Unsigned integers (`u8`..`u64`).
    pub fn is_unsigned_int(self) -> bool {
        matches!(
            self,
            ScalarType::U8 | ScalarType::U16 | ScalarType::U32 | ScalarType::U64
        )
    }

    /// The boolean `i1`.
    pub fn is_bool(self) -> bool {
        self == ScalarType::I1
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a pointer points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddrSpace {
    /// Device global memory (kernel buffer arguments).
    Global,
    /// Per-program (block/workgroup) shared memory.
    Shared,
}

impl AddrSpace {
    /// The IR spelling.
    pub fn name(self) -> &'static str {
        match self {
            AddrSpace::Global => "global",
            AddrSpace::Shared => "shared",
        }
    }

    /// Parses the IR spelling.
    pub fn from_name(s: &str) -> Option<AddrSpace> {
        match s {
            "global" => Some(AddrSpace::Global),
            "shared" => Some(AddrSpace::Shared),
            _ => None,
        }
    }
}

/// The element of a value: a scalar, or a pointer to scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// A number or boolean.
    Scalar(ScalarType),
    /// A pointer to `pointee` elements in `space`.
    Ptr {
        /// The type of the pointed-to elements.
        pointee: ScalarType,
        /// The address space.
        space: AddrSpace,
    },
}

impl Elem {
    /// The scalar type, if this is not a pointer.
    pub fn scalar(self) -> Option<ScalarType> {
        match self {
            Elem::Scalar(s) => Some(s),
            Elem::Ptr { .. } => None,
        }
    }

    /// True for pointers.
    pub fn is_ptr(self) -> bool {
        matches!(self, Elem::Ptr { .. })
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Scalar(s) => write!(f, "{s}"),
            Elem::Ptr {
                pointee,
                space: AddrSpace::Global,
            } => write!(f, "ptr<{pointee}>"),
            Elem::Ptr { pointee, space } => write!(f, "ptr<{pointee}, {}>", space.name()),
        }
    }
}

/// The type of an IR value: an element and a static shape (empty for scalars).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    /// Element type.
    pub elem: Elem,
    /// Dimensions, outermost first. Empty for a scalar.
    pub shape: Vec<u32>,
}

impl Type {
    /// A rank-0 scalar.
    pub fn scalar(s: ScalarType) -> Type {
        Type {
            elem: Elem::Scalar(s),
            shape: Vec::new(),
        }
    }

    /// A tile of scalars.
    pub fn tile(s: ScalarType, shape: &[u32]) -> Type {
        Type {
            elem: Elem::Scalar(s),
            shape: shape.to_vec(),
        }
    }

    /// A scalar pointer to global memory.
    pub fn global_ptr(pointee: ScalarType) -> Type {
        Type {
            elem: Elem::Ptr {
                pointee,
                space: AddrSpace::Global,
            },
            shape: Vec::new(),
        }
    }

    /// The same element with another shape.
    pub fn with_shape(&self, shape: &[u32]) -> Type {
        Type {
            elem: self.elem,
            shape: shape.to_vec(),
        }
    }

    /// The same shape with another element.
    pub fn with_elem(&self, elem: Elem) -> Type {
        Type {
            elem,
            shape: self.shape.clone(),
        }
    }

    /// Rank (number of dimensions).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// True for rank 0.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// The scalar element type, if the element is not a pointer.
    pub fn scalar_type(&self) -> Option<ScalarType> {
        self.elem.scalar()
    }
}

impl fmt::Display for Type {
    /// `f32`, `ptr<f16>`, `<128xf32>`, `<64x32xptr<f16>>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shape.is_empty() {
            return write!(f, "{}", self.elem);
        }
        f.write_str("<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in ScalarType::ALL {
            assert_eq!(ScalarType::from_name(t.name()), Some(t));
        }
        assert_eq!(ScalarType::from_name("f8"), None);
    }

    #[test]
    fn display() {
        assert_eq!(
            Type::tile(ScalarType::F32, &[128, 64]).to_string(),
            "<128x64xf32>"
        );
        assert_eq!(Type::global_ptr(ScalarType::F16).to_string(), "ptr<f16>");
        let shared = Type {
            elem: Elem::Ptr {
                pointee: ScalarType::I8,
                space: AddrSpace::Shared,
            },
            shape: vec![4],
        };
        assert_eq!(shared.to_string(), "<4xptr<i8, shared>>");
        assert_eq!(ScalarType::I1.size_bytes(), 1);
        assert_eq!(ScalarType::BF16.size_bytes(), 2);
    }
}

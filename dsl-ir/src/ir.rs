//! The tile IR data structures: values, ops, regions and kernel functions.
//!
//! The IR is SSA with structured control flow. A [`Function`] owns a table of values
//! ([`ValueData`], indexed by [`ValueId`]) and a body [`Region`]. A region is a list of
//! [`Op`]s with block arguments; ops that hold regions (`for`, `if`, `while`) end each
//! region with a terminator (`yield` or `condition`). Values defined in an enclosing
//! region are visible in nested regions. Every op carries the [`Span`] of the user's
//! source that produced it.

use std::fmt;
use std::sync::Arc;

use crate::types::{ScalarType, Type};

/// A position in the user's source: file, 1-based line and 1-based column.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// Path of the source file as the Rust compiler reports it.
    pub file: Arc<str>,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl Span {
    /// Builds a span; `dir/../` and `./` components of the path are folded away.
    pub fn new(file: &str, line: u32, col: u32) -> Span {
        Span {
            file: normalize_path(file).into(),
            line,
            col,
        }
    }

    /// A span for IR that has no user source (built by hand or by a pass).
    pub fn unknown() -> Span {
        Span::new("<unknown>", 0, 0)
    }

    /// The caller's location (through `#[track_caller]` chains), with `dir/../`
    /// components of the path folded away.
    #[track_caller]
    pub fn caller() -> Span {
        let l = std::panic::Location::caller();
        Span::new(l.file(), l.line(), l.column())
    }

    /// True for [`Span::unknown`].
    pub fn is_unknown(&self) -> bool {
        self.line == 0
    }
}

/// Folds `a/../` and `./` components of a relative or absolute path, lexically.
fn normalize_path(p: &str) -> String {
    if !p.contains("..") && !p.contains("./") {
        return p.to_string();
    }
    let sep = if p.contains('\\') && !p.contains('/') {
        '\\'
    } else {
        '/'
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split(sep) {
        match c {
            "." => {}
            ".." if parts.last().is_some_and(|l| *l != ".." && !l.is_empty()) => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join(&sep.to_string())
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// An SSA value: an index into [`Function::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The index into the value table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// What the function knows about a value.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueData {
    /// Its type.
    pub ty: Type,
    /// A name for printing (parameters keep the user's names).
    pub name: Option<String>,
}

/// A constant scalar, splatted over the result's shape by [`OpKind::Const`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ConstValue {
    /// A boolean (`i1`).
    Bool(bool),
    /// An integer; unsigned 64-bit values are stored by their bit pattern.
    Int(i64),
    /// A float; narrower float types hold the value rounded to their precision.
    Float(f64),
}

impl ConstValue {
    /// Bit-exact equality (so `NaN == NaN` and `0.0 != -0.0`), for CSE and folding.
    pub fn bit_eq(&self, other: &ConstValue) -> bool {
        match (self, other) {
            (ConstValue::Bool(a), ConstValue::Bool(b)) => a == b,
            (ConstValue::Int(a), ConstValue::Int(b)) => a == b,
            (ConstValue::Float(a), ConstValue::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

/// Elementwise binary operations. Both operands and the result have the same type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// Addition (wrapping for integers).
    Add,
    /// Subtraction (wrapping for integers).
    Sub,
    /// Multiplication (wrapping for integers).
    Mul,
    /// Float division; integer division truncates toward zero.
    Div,
    /// Remainder with the sign of the dividend (as Rust's `%`).
    Rem,
    /// Minimum (NaN-propagating for floats).
    Min,
    /// Maximum (NaN-propagating for floats).
    Max,
    /// Bitwise and (logical for `i1`).
    And,
    /// Bitwise or.
    Or,
    /// Bitwise exclusive or.
    Xor,
    /// Shift left; the shift amount is taken modulo the bit width.
    Shl,
    /// Shift right: arithmetic for signed, logical for unsigned integers.
    Shr,
    /// `x^y` on floats, with C's special cases (`pow(x, ±0) = 1`, `pow(1, y) = 1`,
    /// `pow(x < 0, non-integer y)` is NaN, the sign of `x` kept for odd integer `y`).
    /// GPUs compute `exp2(y·log2|x|)` with the hardware approximations, so the relative
    /// error grows with `|y·log2 x|` (about `|y·log2 x|·2⁻²²`); the interpreter rounds
    /// the exact value.
    Pow,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 13] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::Shl,
        BinaryOp::Shr,
        BinaryOp::Pow,
    ];

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::Shl => "shl",
            BinaryOp::Shr => "shr",
            BinaryOp::Pow => "pow",
        }
    }

    /// True for ops that only make sense on integers and booleans.
    pub fn is_bitwise(self) -> bool {
        matches!(
            self,
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Shl | BinaryOp::Shr
        )
    }

    /// True when `a op b == b op a`.
    pub fn is_commutative(self) -> bool {
        matches!(
            self,
            BinaryOp::Add
                | BinaryOp::Mul
                | BinaryOp::Min
                | BinaryOp::Max
                | BinaryOp::And
                | BinaryOp::Or
                | BinaryOp::Xor
        )
    }
}

/// Elementwise unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// Negation (wrapping for integers).
    Neg,
    /// Bitwise not (logical for `i1`).
    Not,
    /// Absolute value (wrapping for `iN::MIN`).
    Abs,
    // Float-only math:
    /// e^x.
    Exp,
    /// 2^x.
    Exp2,
    /// Natural logarithm.
    Log,
    /// Base-2 logarithm.
    Log2,
    /// Square root.
    Sqrt,
    /// 1 / sqrt(x).
    Rsqrt,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// Error function.
    Erf,
    /// Round toward -inf.
    Floor,
    /// Round toward +inf.
    Ceil,
    // Integer-only bit counts (the result has the operand's type):
    /// The number of set bits (`popc`).
    Popc,
    /// The number of leading zero bits (`clz`); the bit width for 0.
    Clz,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 17] = [
        UnaryOp::Neg,
        UnaryOp::Not,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Exp2,
        UnaryOp::Log,
        UnaryOp::Log2,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Popc,
        UnaryOp::Clz,
    ];

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Not => "not",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Exp2 => "exp2",
            UnaryOp::Log => "log",
            UnaryOp::Log2 => "log2",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Popc => "popc",
            UnaryOp::Clz => "clz",
        }
    }

    /// True for transcendental and rounding functions, defined on floats only.
    pub fn is_float_only(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs | UnaryOp::Popc | UnaryOp::Clz
        )
    }

    /// True for the bit counts, defined on integers only (not `i1`).
    pub fn is_int_only(self) -> bool {
        matches!(self, UnaryOp::Popc | UnaryOp::Clz)
    }
}

/// What a [`OpKind::Hint`] promises along each dimension `d`, for the value `v` it
/// gives there (the analysis uses the largest power of two dividing `v`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HintKind {
    /// `multiple_of`: the first element of every run of consecutive values along `d`
    /// (every element, where there are none) is a multiple of `v`.
    MultipleOf,
    /// `max_contiguous`: along `d`, the elements form runs of `v` values increasing
    /// by one, starting at indices that are multiples of `v`.
    MaxContiguous,
    /// `max_constancy`: along `d`, the elements form runs of `v` equal values,
    /// starting at indices that are multiples of `v`.
    MaxConstancy,
}

impl HintKind {
    /// Every hint kind.
    pub const ALL: [HintKind; 3] = [
        HintKind::MultipleOf,
        HintKind::MaxContiguous,
        HintKind::MaxConstancy,
    ];

    /// The IR keyword.
    pub fn name(self) -> &'static str {
        match self {
            HintKind::MultipleOf => "multiple_of",
            HintKind::MaxContiguous => "max_contiguous",
            HintKind::MaxConstancy => "max_constancy",
        }
    }
}

/// Comparison predicates. Signedness follows the operand type; float comparisons are
/// ordered (false when either side is NaN) except `ne`, which is true for NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpPred {
    /// Equal.
    Eq,
    /// Not equal (true when either side is NaN).
    Ne,
    /// Less than.
    Lt,
    /// Less than or equal.
    Le,
    /// Greater than.
    Gt,
    /// Greater than or equal.
    Ge,
}

impl CmpPred {
    /// Every predicate.
    pub const ALL: [CmpPred; 6] = [
        CmpPred::Eq,
        CmpPred::Ne,
        CmpPred::Lt,
        CmpPred::Le,
        CmpPred::Gt,
        CmpPred::Ge,
    ];

    /// Whether `a pred b` holds, unsigned (a `wait_until` on a signal word).
    pub fn holds(self, a: u64, b: u64) -> bool {
        match self {
            CmpPred::Eq => a == b,
            CmpPred::Ne => a != b,
            CmpPred::Lt => a < b,
            CmpPred::Le => a <= b,
            CmpPred::Gt => a > b,
            CmpPred::Ge => a >= b,
        }
    }

    /// The comparison as an operator: `==`, `!=`, `<`, `<=`, `>`, `>=`.
    pub fn symbol(self) -> &'static str {
        match self {
            CmpPred::Eq => "==",
            CmpPred::Ne => "!=",
            CmpPred::Lt => "<",
            CmpPred::Le => "<=",
            CmpPred::Gt => ">",
            CmpPred::Ge => ">=",
        }
    }

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            CmpPred::Eq => "eq",
            CmpPred::Ne => "ne",
            CmpPred::Lt => "lt",
            CmpPred::Le => "le",
            CmpPred::Gt => "gt",
            CmpPred::Ge => "ge",
        }
    }
}

/// The element format of [`OpKind::DotScaled`]'s operands (both operands share it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaledFormat {
    /// `f8e4m3` tiles (MXFP8).
    E4M3,
    /// `f8e5m2` tiles (MXFP8).
    E5M2,
    /// FP4 E2M1, two per `u8` along the tile's last dimension, the first in the low
    /// nibble (MXFP4, NVFP4: [`crate::mx`]).
    E2M1,
}

impl ScaledFormat {
    /// Every format.
    pub const ALL: [ScaledFormat; 3] = [ScaledFormat::E4M3, ScaledFormat::E5M2, ScaledFormat::E2M1];

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            ScaledFormat::E4M3 => "e4m3",
            ScaledFormat::E5M2 => "e5m2",
            ScaledFormat::E2M1 => "e2m1",
        }
    }

    /// The element type of a tile of this format.
    pub fn storage(self) -> ScalarType {
        match self {
            ScaledFormat::E4M3 => ScalarType::F8E4M3,
            ScaledFormat::E5M2 => ScalarType::F8E5M2,
            ScaledFormat::E2M1 => ScalarType::U8,
        }
    }

    /// Elements per stored element along the last dimension (2 for packed E2M1).
    pub fn per_element(self) -> u32 {
        if self == ScaledFormat::E2M1 { 2 } else { 1 }
    }
}

/// Combining functions of `reduce`, `scan` and atomics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum (NaN-propagating for floats).
    Min,
    /// Maximum (NaN-propagating for floats).
    Max,
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
    /// Bitwise exclusive or.
    Xor,
}

impl ReduceOp {
    /// Every combining function.
    pub const ALL: [ReduceOp; 7] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::And,
        ReduceOp::Or,
        ReduceOp::Xor,
    ];

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::And => "and",
            ReduceOp::Or => "or",
            ReduceOp::Xor => "xor",
        }
    }

    /// The binary op that combines two partial results.
    pub fn binary(self) -> BinaryOp {
        match self {
            ReduceOp::Sum => BinaryOp::Add,
            ReduceOp::Prod => BinaryOp::Mul,
            ReduceOp::Min => BinaryOp::Min,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::And => BinaryOp::And,
            ReduceOp::Or => BinaryOp::Or,
            ReduceOp::Xor => BinaryOp::Xor,
        }
    }
}

/// Atomic read-modify-write functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Addition (wrapping for integers).
    Add,
    /// Minimum (NaN-propagating for floats).
    Min,
    /// Maximum (NaN-propagating for floats).
    Max,
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
    /// Bitwise exclusive or.
    Xor,
    /// Exchange: store the operand, return the old value.
    Xchg,
}

impl AtomicOp {
    /// Every atomic RMW function.
    pub const ALL: [AtomicOp; 7] = [
        AtomicOp::Add,
        AtomicOp::Min,
        AtomicOp::Max,
        AtomicOp::And,
        AtomicOp::Or,
        AtomicOp::Xor,
        AtomicOp::Xchg,
    ];

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "add",
            AtomicOp::Min => "min",
            AtomicOp::Max => "max",
            AtomicOp::And => "and",
            AtomicOp::Or => "or",
            AtomicOp::Xor => "xor",
            AtomicOp::Xchg => "xchg",
        }
    }
}

/// Memory ordering of atomics and communication ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemOrder {
    /// No ordering beyond atomicity.
    Relaxed,
    /// Later accesses stay after this one.
    Acquire,
    /// Earlier accesses stay before this one.
    Release,
    /// Both acquire and release.
    AcqRel,
}

impl MemOrder {
    /// Every ordering.
    pub const ALL: [MemOrder; 4] = [
        MemOrder::Relaxed,
        MemOrder::Acquire,
        MemOrder::Release,
        MemOrder::AcqRel,
    ];

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            MemOrder::Relaxed => "relaxed",
            MemOrder::Acquire => "acquire",
            MemOrder::Release => "release",
            MemOrder::AcqRel => "acq_rel",
        }
    }
}

/// The set of threads an atomic or fence synchronizes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemScope {
    /// The threads of one program instance (CUDA block, HIP workgroup).
    Block,
    /// All threads of the device.
    Device,
    /// The whole system: other devices and the host.
    System,
}

impl MemScope {
    /// Every scope.
    pub const ALL: [MemScope; 3] = [MemScope::Block, MemScope::Device, MemScope::System];

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            MemScope::Block => "block",
            MemScope::Device => "device",
            MemScope::System => "system",
        }
    }
}

/// How a [`OpKind::Signal`] updates a signal word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignalOp {
    /// Writes the value.
    Set,
    /// Adds the value (wrapping).
    Add,
}

impl SignalOp {
    /// Every signal op.
    pub const ALL: [SignalOp; 2] = [SignalOp::Set, SignalOp::Add];

    /// The IR mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            SignalOp::Set => "set",
            SignalOp::Add => "add",
        }
    }
}

/// The operation an [`Op`] performs. The operand and result conventions of each kind
/// are given on its variant; [`crate::infer`] computes result types from operand types
/// for every kind without regions.
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// `program_id axis`: the index of this program instance along grid axis 0, 1 or 2.
    /// No operands; result `i32`.
    ProgramId {
        /// Grid axis: 0, 1 or 2.
        axis: u8,
    },
    /// `num_programs axis`: the grid size along an axis. No operands; result `i32`.
    NumPrograms {
        /// Grid axis: 0, 1 or 2.
        axis: u8,
    },
    /// A constant splatted over the result type's shape. No operands.
    Const(ConstValue),
    /// `arange start, end`: the 1-D tile `[start, start+1, ..., end-1]` of `i32`.
    /// `end - start` must be a power of two. No operands.
    Arange {
        /// First value.
        start: i64,
        /// One past the last value.
        end: i64,
    },
    /// Scalar to tile: operand rank 0, result the same element with the result shape.
    Splat,
    /// Broadcast dimensions of size 1 to the result shape (same rank).
    Broadcast,
    /// Insert a dimension of size 1 at `axis`.
    ExpandDims {
        /// Where the new dimension goes.
        axis: u8,
    },
    /// Same elements in row-major order, another shape of equal element count.
    Reshape,
    /// Permute dimensions: result dim `i` is operand dim `order[i]`.
    Permute {
        /// Result dimension `i` is operand dimension `order[i]`.
        order: Vec<u8>,
    },
    /// `hint x kind=[v, ...]`: `x` itself (an integer scalar or tile), with a promise
    /// about its values that codegen's axis analysis may use (Triton's `multiple_of`,
    /// `max_contiguous`, `max_constancy`). One value per dimension (one for a scalar),
    /// each at least 1; see [`HintKind`]. A false promise makes the results of the
    /// memory accesses that rely on it unspecified; the interpreter does not check it.
    Hint {
        /// What is promised.
        kind: HintKind,
        /// The promised amount per dimension.
        values: Vec<u32>,
    },
    /// Elementwise binary op; operands and result share one type.
    Binary(BinaryOp),
    /// Elementwise unary op; operand and result share one type.
    Unary(UnaryOp),
    /// Fused multiply-add `a * b + c` (floats), one rounding.
    Fma,
    /// Elementwise comparison; operands share a type, result is `i1` of their shape.
    Cmp(CmpPred),
    /// `select cond, a, b`: `cond` is `i1`, `a` and `b` share the result type.
    Select,
    /// Elementwise conversion to the result's scalar type. Float to int saturates and
    /// maps NaN to 0 (as Rust's `as`); int to float rounds to nearest even.
    Cast,
    /// Elementwise reinterpretation of the bits as the result's scalar type, which
    /// has the operand's width (`f32` ↔ `i32`/`u32`, `f16`/`bf16` ↔ `i16`/`u16`, ...).
    /// Not defined on `i1` or pointers.
    Bitcast,
    /// `addptr ptrs, offsets`: pointer tile plus integer offsets (in elements).
    AddPtr,
    /// `load ptrs [, mask [, other]]`: reads pointed-to elements. Lanes whose mask is
    /// false are not accessed and yield `other` (or zero when absent).
    Load {
        /// A mask operand follows the pointers.
        has_mask: bool,
        /// An `other` operand follows the mask.
        has_other: bool,
    },
    /// `store ptrs, value [, mask]`: writes elements; masked-off lanes are not accessed.
    /// No results.
    Store {
        /// A mask operand follows the value.
        has_mask: bool,
    },
    /// `desc_load rank=R base, tmap, shape.., strides.., coords.. [, pred]`: reads a
    /// block of a tensor through a tensor descriptor. `base` is a scalar pointer to the
    /// tensor's first element, `tmap` a `u64` (the address of the descriptor's tensor
    /// map where the target has TMA, else unused), then `R` `i32` extents (outermost
    /// first), `R - 1` `i32` strides in elements of the outer dimensions (the innermost
    /// stride is 1) and `R` `i32` block start coordinates. The result (its type gives
    /// the block shape) holds `base[(c_0 + i_0) * s_0 + .. + (c_R-1 + i_R-1)]` where
    /// every `0 <= c_d + i_d < shape_d`, and zero elsewhere (out-of-bounds elements are
    /// not accessed). With `pred` (an `i1` scalar, added by the pipeliner) false, no
    /// element is accessed and the result is zero.
    DescLoad {
        /// Rank of the tensor and the block: 1 to 3.
        rank: u8,
        /// A predicate operand follows the coordinates.
        has_pred: bool,
    },
    /// `desc_store rank=R base, tmap, shape.., strides.., coords.., value`: writes a
    /// block through a tensor descriptor (operands as [`OpKind::DescLoad`], then the
    /// block); elements outside the tensor are not written. No results.
    DescStore {
        /// Rank of the tensor and the block: 1 to 3.
        rank: u8,
    },
    /// `atomic_rmw ptrs, value [, mask]`: returns the old values.
    AtomicRmw {
        /// The combining function.
        op: AtomicOp,
        /// Memory ordering.
        order: MemOrder,
        /// Synchronization scope.
        scope: MemScope,
        /// Whether a mask operand follows.
        has_mask: bool,
    },
    /// `atomic_cas ptrs, expected, desired [, mask]`: returns the old values.
    AtomicCas {
        /// Memory ordering.
        order: MemOrder,
        /// Synchronization scope.
        scope: MemScope,
        /// Whether a mask operand follows.
        has_mask: bool,
    },
    /// `dot a, b, acc`: `a` is `MxK`, `b` is `KxN`, `acc` and result `MxN`. Inputs
    /// f16/bf16/f32 accumulate in f32 (`acc` must be f32), f64 in f64, i8 in i32.
    Dot,
    /// `dot_scaled fmt a, a_scale, b, b_scale, acc`: a block-scaled matrix product
    /// ([`crate::mx`]). `a` holds `MxK` and `b` `KxN` elements of format `fmt`
    /// (stored `MxK/2` and `KxN/2` bytes for E2M1); `a_scale` is `MxK/V` and `b_scale`
    /// `K/VxN`, `u8` E8M0 scales with `V = 32`, or `f8e4m3` scales with `V = 16` (E2M1
    /// only: NVFP4); `acc` and the result are `MxN` f32. The result is
    /// `dot(a', b', acc)` in f32 (each product and each sum rounded, `k` increasing),
    /// where `a'[i][k] = f32(a[i][k]) * f32(a_scale[i][k / V])` and likewise `b'`: every
    /// element and scale decodes exactly, and their product is exact unless it leaves
    /// f32's range.
    DotScaled {
        /// The elements' format.
        format: ScaledFormat,
    },
    /// Reduces along `axis`, removing it.
    Reduce {
        /// The reduced axis.
        axis: u8,
        /// The combining function.
        op: ReduceOp,
    },
    /// Inclusive prefix combine along `axis` (from the end when `reverse`).
    Scan {
        /// The axis.
        axis: u8,
        /// The combining function.
        op: ReduceOp,
        /// Scan from the end.
        reverse: bool,
    },
    /// `for lb, ub, step, inits...`: one region with arguments `(iv, iters...)` ending in
    /// `yield iters...`; results are the final iteration values. Bounds are `i32` or
    /// `i64` scalars of one type; `step` must be positive.
    For,
    /// `if cond`: two regions (then, else), each ending in `yield` of the result types.
    If,
    /// `while inits...`: region 0 (`before`) takes the carried values and ends in
    /// `condition cond, forwarded...`; region 1 (`after`) takes the forwarded values
    /// and ends in `yield carried...`. Results are the forwarded values at exit.
    While,
    /// Region terminator: yields values to the parent op.
    Yield,
    /// Terminator of a `while` before-region: `condition cond, values...`.
    Condition,
    /// Synchronizes all threads of the program instance (GPU block barrier). A no-op
    /// for the interpreter, which runs each program instance as one thread.
    Barrier,
    /// `local_alloc len : ptr<T, shared>`: `len` elements of block-local memory (GPU
    /// shared memory / LDS), one array per program instance and per op (the same
    /// memory each time a loop runs the op), reached through the result pointer with
    /// `addptr`, `load`, `store` and block-scope atomics. Its contents are undefined
    /// after each allocation (the interpreter fills them with all-ones bytes: NaN,
    /// -1); threads see each other's writes after a `barrier`. Never merged by CSE.
    LocalAlloc {
        /// The number of elements.
        len: u32,
    },
    /// `rank`: this rank's index in the world, `0..world_size`. No operands; result
    /// `i32`. A kernel without a world runs as rank 0 of 1.
    Rank,
    /// `world_size`: the number of ranks. No operands; result `i32`.
    WorldSize,
    /// `remote_ptr ptrs, peer`: translates pointers into this rank's symmetric heap to
    /// the same addresses in rank `peer`'s heap (through the heap-base table). `peer`
    /// is an `i32` scalar in `0..world_size`; the result has the pointers' type.
    /// Loads, stores and atomics through the result are remote accesses.
    RemotePtr,
    /// `signal op order scope ptr, value`: one update of the `u64` signal word at the
    /// scalar pointer `ptr` (usually remote) per program instance, performed after
    /// every memory access the program issued before it (block-cooperative: all
    /// threads' earlier stores are covered, not only the updating thread's). Default
    /// ordering is `release` at `system` scope. No results.
    Signal {
        /// Set or add.
        op: SignalOp,
        /// Ordering of the update (`release` or stronger publishes earlier stores).
        order: MemOrder,
        /// Who the update synchronizes with.
        scope: MemScope,
    },
    /// `wait_until pred scope ptr, value`: blocks the program instance until the local
    /// `u64` signal word at scalar pointer `ptr` compares `pred` (unsigned) to `value`;
    /// the read that succeeds is an acquire at `scope`, so every later access of every
    /// thread of the program sees what the signaller published. Result: the observed
    /// `u64` (the token that orders later loads after the wait). Every backend times out
    /// instead of hanging.
    WaitUntil {
        /// The comparison `observed pred value`.
        pred: CmpPred,
        /// Who the acquire synchronizes with.
        scope: MemScope,
    },
    /// `fence order scope`: orders this program's memory accesses before and after it,
    /// for every thread of the program. No operands or results.
    Fence {
        /// Ordering.
        order: MemOrder,
        /// Scope.
        scope: MemScope,
    },
    /// `barrier_all`: no program instance of any rank passes until every program
    /// instance of every rank has arrived; every access before it (on any rank) is
    /// visible after it (system scope). Every rank must launch the same grid, and the
    /// whole grid must be resident at once.
    BarrierAll,
    /// `print "prefix" values...`: reports the values on the host after the launch,
    /// one line per element (scalars: one line), with the program id, the element's
    /// index and the op's file:line. Operands are scalars or tiles of one shape, of
    /// any element type but pointers. No results. Removed before any backend runs by
    /// [`crate::debug::lower_debug_ops`].
    Print {
        /// Text printed before the values.
        prefix: String,
    },
    /// `assert "message" cond`: when an element of the `i1` scalar or tile `cond` is
    /// false, the launch fails after the kernel completes, naming the op's
    /// file:line:col, the message, the program and the first failing element. The
    /// program does not stop at a failed assertion. No results. Removed before any
    /// backend runs by [`crate::debug::lower_debug_ops`].
    Assert {
        /// The message reported on failure.
        message: String,
    },
}

impl OpKind {
    /// The IR mnemonic (without attributes).
    pub fn mnemonic(&self) -> &'static str {
        match self {
            OpKind::ProgramId { .. } => "program_id",
            OpKind::NumPrograms { .. } => "num_programs",
            OpKind::Const(_) => "const",
            OpKind::Arange { .. } => "arange",
            OpKind::Splat => "splat",
            OpKind::Broadcast => "broadcast",
            OpKind::ExpandDims { .. } => "expand_dims",
            OpKind::Reshape => "reshape",
            OpKind::Permute { .. } => "permute",
            OpKind::Hint { .. } => "hint",
            OpKind::Binary(op) => op.name(),
            OpKind::Unary(op) => op.name(),
            OpKind::Fma => "fma",
            OpKind::Cmp(_) => "cmp",
            OpKind::Select => "select",
            OpKind::Cast => "cast",
            OpKind::Bitcast => "bitcast",
            OpKind::AddPtr => "addptr",
            OpKind::Load { .. } => "load",
            OpKind::Store { .. } => "store",
            OpKind::DescLoad { .. } => "desc_load",
            OpKind::DescStore { .. } => "desc_store",
            OpKind::AtomicRmw { .. } => "atomic_rmw",
            OpKind::AtomicCas { .. } => "atomic_cas",
            OpKind::Dot => "dot",
            OpKind::DotScaled { .. } => "dot_scaled",
            OpKind::Reduce { .. } => "reduce",
            OpKind::Scan { .. } => "scan",
            OpKind::For => "for",
            OpKind::If => "if",
            OpKind::While => "while",
            OpKind::Yield => "yield",
            OpKind::Condition => "condition",
            OpKind::Barrier => "barrier",
            OpKind::Rank => "rank",
            OpKind::WorldSize => "world_size",
            OpKind::RemotePtr => "remote_ptr",
            OpKind::Signal { .. } => "signal",
            OpKind::WaitUntil { .. } => "wait_until",
            OpKind::Fence { .. } => "fence",
            OpKind::BarrierAll => "barrier_all",
            OpKind::LocalAlloc { .. } => "local_alloc",
            OpKind::Print { .. } => "print",
            OpKind::Assert { .. } => "assert",
        }
    }

    /// True when the op has no effect besides its results, so CSE may merge two
    /// identical ones and DCE may delete an unused one.
    pub fn is_pure(&self) -> bool {
        !matches!(
            self,
            OpKind::Load { .. }
                | OpKind::Store { .. }
                | OpKind::DescLoad { .. }
                | OpKind::DescStore { .. }
                | OpKind::AtomicRmw { .. }
                | OpKind::AtomicCas { .. }
                | OpKind::For
                | OpKind::If
                | OpKind::While
                | OpKind::Yield
                | OpKind::Condition
                | OpKind::Barrier
                | OpKind::Signal { .. }
                | OpKind::WaitUntil { .. }
                | OpKind::Fence { .. }
                | OpKind::BarrierAll
                | OpKind::LocalAlloc { .. }
                | OpKind::Print { .. }
                | OpKind::Assert { .. }
        )
    }

    /// True for the debugging ops ([`OpKind::Print`], [`OpKind::Assert`]), which
    /// [`crate::debug::lower_debug_ops`] replaces with stores into a hidden buffer.
    pub fn is_debug(&self) -> bool {
        matches!(self, OpKind::Print { .. } | OpKind::Assert { .. })
    }

    /// True for the communication ops (which need a world: rank, heap-base table).
    pub fn is_comm(&self) -> bool {
        matches!(
            self,
            OpKind::Rank
                | OpKind::WorldSize
                | OpKind::RemotePtr
                | OpKind::Signal { .. }
                | OpKind::WaitUntil { .. }
                | OpKind::Fence { .. }
                | OpKind::BarrierAll
        )
    }

    /// True for ops that may block until another program instance (or rank) acts:
    /// every program instance must be resident at once.
    pub fn is_blocking(&self) -> bool {
        matches!(self, OpKind::WaitUntil { .. } | OpKind::BarrierAll)
    }

    /// True for region terminators.
    pub fn is_terminator(&self) -> bool {
        matches!(self, OpKind::Yield | OpKind::Condition)
    }
}

/// Where the parts of a [`OpKind::DescLoad`] or [`OpKind::DescStore`] of rank `rank`
/// sit among its operands: `base, tmap, shape[rank], strides[rank - 1],
/// coords[rank]`, then the predicate or the stored value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescOperands {
    /// The tensor's rank.
    pub rank: usize,
}

impl DescOperands {
    /// The layout for `rank` (1 to 3, the ranks of tiles).
    pub fn new(rank: u8) -> Result<DescOperands, String> {
        if !(1..=3).contains(&rank) {
            return Err(format!("a tensor descriptor has rank 1 to 3, got {rank}"));
        }
        Ok(DescOperands {
            rank: rank as usize,
        })
    }

    /// The base pointer.
    pub const BASE: usize = 0;
    /// The tensor-map address.
    pub const TMAP: usize = 1;

    /// Extent `d` (outermost first).
    pub fn shape(&self, d: usize) -> usize {
        2 + d
    }

    /// The stride of dimension `d < rank - 1`, in elements.
    pub fn stride(&self, d: usize) -> usize {
        2 + self.rank + d
    }

    /// Block start coordinate `d`.
    pub fn coord(&self, d: usize) -> usize {
        1 + 2 * self.rank + d
    }

    /// The predicate (`desc_load`) or the stored value (`desc_store`).
    pub fn extra(&self) -> usize {
        1 + 3 * self.rank
    }

    /// The operands before [`Self::extra`].
    pub fn count(&self) -> usize {
        1 + 3 * self.rank
    }

    /// Checks the common operands' types; returns the element type.
    pub(crate) fn check(
        &self,
        operands: &[&crate::types::Type],
        what: &str,
    ) -> Result<crate::types::ScalarType, String> {
        use crate::types::{Elem, ScalarType, Type};
        let base = operands[Self::BASE];
        let Elem::Ptr { pointee, .. } = base.elem else {
            return Err(format!("`{what}` needs a base pointer, got {base}"));
        };
        if !base.is_scalar() {
            return Err(format!(
                "`{what}` base must be a scalar pointer, got {base}"
            ));
        }
        if *operands[Self::TMAP] != Type::scalar(ScalarType::U64) {
            return Err(format!(
                "`{what}` tensor-map operand must be u64, got {}",
                operands[Self::TMAP]
            ));
        }
        let i32t = Type::scalar(ScalarType::I32);
        if let Some(t) = operands[2..self.count()].iter().find(|t| ***t != i32t) {
            return Err(format!(
                "`{what}` extents, strides and coordinates are i32 scalars, got {t}"
            ));
        }
        Ok(pointee)
    }
}

/// One operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// Values read.
    pub operands: Vec<ValueId>,
    /// Values defined.
    pub results: Vec<ValueId>,
    /// Nested regions (`for`: 1, `if`: 2, `while`: 2).
    pub regions: Vec<Region>,
    /// The user's source location.
    pub span: Span,
}

/// A list of ops with block arguments.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    /// Values bound on entry (loop induction variable, iteration values).
    pub args: Vec<ValueId>,
    /// The ops, in order; nested regions end in a terminator.
    pub ops: Vec<Op>,
}

/// Facts a kernel declares about a parameter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ParamAttrs {
    /// The kernel never writes through this pointer.
    pub readonly: bool,
    /// For pointers: the address is a multiple of this many bytes; for integers: the
    /// value is a multiple of this. Enables wide memory accesses in codegen.
    pub divisibility: Option<u32>,
    /// For pointers: the buffer it points to is smaller than 2 GiB, so every element
    /// the kernel may access through it lies less than 2^31 bytes past it. Lets AMD
    /// codegen address masked loads with 32-bit buffer offsets (out-of-range reads
    /// return 0) instead of exec-mask branches; the runtime sets it per launch.
    pub within_2gib: bool,
    /// For the `u64` tensor-map parameter of a tensor descriptor: the launch built
    /// the descriptor's tensor map ([`crate::tensor_desc::TmaBox`]) and passes its
    /// address, so codegen may read the descriptor with TMA. The runtime sets it per
    /// launch.
    pub tensor_map: bool,
    /// For integer parameters: the launch passes 1 (Triton's specialization of 1),
    /// so the body reads the constant 1 instead ([`passes::specialize`](crate::passes::specialize) rewrites
    /// its uses): a unit stride is a constant, and contiguity through it provable.
    /// The runtime sets it per launch.
    pub equal_to_one: bool,
    /// The kernel declared the parameter `#[no_specialize]`: launches record no
    /// facts about its value (neither divisibility nor [`ParamAttrs::equal_to_one`]),
    /// so every value shares one compiled kernel.
    pub no_specialize: bool,
}

/// What a launch knows about one argument: the facts [`passes::specialize`](crate::passes::specialize)
/// records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ParamFacts {
    /// A pointer that is 16-byte aligned, or an integer that is a multiple of 16.
    pub divisible_by_16: bool,
    /// A pointer into a buffer smaller than 2 GiB ([`ParamAttrs::within_2gib`]).
    pub within_2gib: bool,
    /// A tensor-map address the launch built ([`ParamAttrs::tensor_map`]).
    pub tensor_map: bool,
    /// An integer equal to 1 ([`ParamAttrs::equal_to_one`]).
    pub equal_to_one: bool,
}

impl ParamFacts {
    /// Facts for a launch argument: `divisible_by_16` as given, and for pointers
    /// whether the buffer is smaller than 2 GiB.
    pub fn new(divisible_by_16: bool, within_2gib: bool) -> ParamFacts {
        ParamFacts {
            divisible_by_16,
            within_2gib,
            ..ParamFacts::default()
        }
    }

    /// Facts for an integer argument of value `v`: a multiple of 16, or equal to 1.
    pub fn of_int(v: i128) -> ParamFacts {
        ParamFacts {
            divisible_by_16: v % 16 == 0,
            equal_to_one: v == 1,
            ..ParamFacts::default()
        }
    }
}

/// A kernel parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// The user's name.
    pub name: String,
    /// The SSA value that holds it in the body.
    pub value: ValueId,
    /// Declared facts.
    pub attrs: ParamAttrs,
}

/// A kernel: parameters, a value table and a body.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    /// Kernel name (the Rust function's name).
    pub name: String,
    /// Parameters in launch order.
    pub params: Vec<Param>,
    /// Every value's type, indexed by [`ValueId`].
    pub values: Vec<ValueData>,
    /// The body (no arguments, no terminator).
    pub body: Region,
    /// Where the kernel is defined.
    pub span: Span,
}

impl Function {
    /// An empty kernel.
    pub fn new(name: impl Into<String>, span: Span) -> Function {
        Function {
            name: name.into(),
            params: Vec::new(),
            values: Vec::new(),
            body: Region::default(),
            span,
        }
    }

    /// The type of a value.
    pub fn ty(&self, v: ValueId) -> &Type {
        &self.values[v.index()].ty
    }

    /// Allocates a new value of type `ty`.
    pub fn new_value(&mut self, ty: Type) -> ValueId {
        let id = ValueId(self.values.len() as u32);
        self.values.push(ValueData { ty, name: None });
        id
    }

    /// The scalar type of a value's elements; `None` for pointers.
    pub fn scalar_type(&self, v: ValueId) -> Option<ScalarType> {
        self.ty(v).scalar_type()
    }

    /// Calls `f` on every op, in program order, descending into regions before
    /// moving on (pre-order).
    pub fn walk(&self, f: &mut impl FnMut(&Op)) {
        fn go(r: &Region, f: &mut impl FnMut(&Op)) {
            for op in &r.ops {
                f(op);
                for sub in &op.regions {
                    go(sub, f);
                }
            }
        }
        go(&self.body, f);
    }

    /// True when the kernel uses communication ops ([`OpKind::is_comm`]).
    pub fn uses_comm(&self) -> bool {
        let mut any = false;
        self.walk(&mut |op| any |= op.kind.is_comm());
        any
    }

    /// True when the kernel has ops that wait for other program instances or ranks
    /// ([`OpKind::is_blocking`]).
    pub fn uses_blocking(&self) -> bool {
        let mut any = false;
        self.walk(&mut |op| any |= op.kind.is_blocking());
        any
    }

    /// Number of ops, counting nested ones.
    pub fn num_ops(&self) -> usize {
        let mut n = 0;
        self.walk(&mut |_| n += 1);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::normalize_path;

    #[test]
    fn paths_are_folded() {
        assert_eq!(normalize_path("runtime/../examples/a.rs"), "examples/a.rs");
        assert_eq!(normalize_path("./src/a.rs"), "src/a.rs");
        assert_eq!(normalize_path("../x/a.rs"), "../x/a.rs");
        assert_eq!(normalize_path("/w/r/../e/a.rs"), "/w/e/a.rs");
        assert_eq!(normalize_path("src/lib.rs"), "src/lib.rs");
    }
}

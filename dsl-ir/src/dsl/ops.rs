//! Tile operations: operators, math, comparisons, shape ops, reductions, memory.

use std::ops;

use super::shape::*;
use super::{
    DType, Float, Global, Int, LitValue, Num, NumElem, Scalar, Tile, constant, emit0, emit1,
    literal_tile, type_of, with_builder,
};
use crate::fp8::{F8E4M3, F8E5M2};
use crate::infer::dot_acc_type;
use crate::ir::{
    AtomicOp, BinaryOp, CmpPred, ConstValue, MemOrder, MemScope, OpKind, ReduceOp, Span, UnaryOp,
    ValueId,
};
use crate::types::{ScalarType, Type};
use half::{bf16, f16};

// ---------------------------------------------------------------------------------
// Operands: tiles and Rust literals

/// Something usable as an operand of element type `T`: a tile of `T`, or a Rust
/// number (integers for any numeric `T`, floats for float `T`) or bool, which becomes a
/// scalar constant.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an operand of element type `{T}`",
    label = "expected a tile of `{T}` or a Rust literal convertible to `{T}`",
    note = "element types never convert implicitly; use `.cast::<{T}>()`"
)]
pub trait Operand<T: DType> {
    /// The operand's shape.
    type Shape: Shape;
    /// The IR value (emitting a constant for literals).
    fn value(self, span: &Span) -> ValueId;
}

impl<T: DType, S: Shape> Operand<T> for Tile<T, S> {
    type Shape = S;
    fn value(self, _span: &Span) -> ValueId {
        self.id()
    }
}

macro_rules! int_operand {
    ($($t:ty),*) => {$(
        impl<T: Num> Operand<T> for $t {
            type Shape = ();
            fn value(self, span: &Span) -> ValueId {
                literal_tile::<T>(LitValue::Int(self as i128), span.clone()).id()
            }
        }
    )*};
}
int_operand!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

macro_rules! float_operand {
    ($($t:ty),*) => {$(
        impl<T: Float> Operand<T> for $t {
            type Shape = ();
            fn value(self, span: &Span) -> ValueId {
                literal_tile::<T>(LitValue::Float(self as f64), span.clone()).id()
            }
        }
    )*};
}
float_operand!(f32, f64);

impl Operand<bool> for bool {
    type Shape = ();
    fn value(self, span: &Span) -> ValueId {
        literal_tile::<bool>(LitValue::Bool(self), span.clone()).id()
    }
}

/// Broadcasts `v` to `dims` (splat for a scalar), if it does not have them already.
pub(crate) fn broadcast_value(v: ValueId, dims: &[u32], span: &Span) -> ValueId {
    let ty = type_of(v);
    if ty.shape == dims {
        return v;
    }
    let target = ty.with_shape(dims);
    let kind = if ty.is_scalar() {
        OpKind::Splat
    } else {
        OpKind::Broadcast
    };
    emit1(kind, &[v], Some(&target), target.clone(), span.clone())
}

#[track_caller]
fn binary<T: DType, S, R: Operand<T>>(
    op: BinaryOp,
    lhs: Tile<T, S>,
    rhs: R,
) -> Tile<T, <S as Broadcast<R::Shape>>::Out>
where
    S: Shape + Broadcast<R::Shape>,
{
    let span = Span::caller();
    let r = rhs.value(&span);
    let dims = <S as Broadcast<R::Shape>>::Out::dims();
    let l = broadcast_value(lhs.id(), &dims, &span);
    let r = broadcast_value(r, &dims, &span);
    let ty = Type::tile(T::TY, &dims);
    Tile::from_id(emit1(OpKind::Binary(op), &[l, r], None, ty, span))
}

/// `lit op tile` for a Rust literal on the left.
#[track_caller]
fn binary_rev<T: DType, S: Shape>(op: BinaryOp, lhs: ValueId, rhs: Tile<T, S>) -> Tile<T, S> {
    let span = Span::caller();
    let dims = S::dims();
    let l = broadcast_value(lhs, &dims, &span);
    let ty = Type::tile(T::TY, &dims);
    Tile::from_id(emit1(OpKind::Binary(op), &[l, rhs.id()], None, ty, span))
}

/// An operand of arithmetic (`+ - * / %`) on tiles of `T`: an [`Operand`] of a
/// [`Num`] type. The operators take any `Tile<T, S>` on the left and require this of
/// the right operand, so that a tile of another element type (`F8E4M3`, a kernel's
/// `T: DType`) is reported as [`Num`]'s error (cast first, or bound `T: Num`) rather
/// than as "cannot add".
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an operand of element type `{T}`",
    label = "expected a tile of `{T}` or a Rust literal convertible to `{T}`",
    note = "element types never convert implicitly; use `.cast::<{T}>()`"
)]
pub trait NumOperand<T: DType> {
    /// The operand's shape.
    type Shape: Shape;
    /// The IR value (emitting a constant for literals).
    fn value(self, span: &Span) -> ValueId;
}
// An operand of `<T as NumElem>::Elem` (which is `T`): for a `T` that is not `Num`,
// the projection does not normalize, so only `T: Num` is reported.
impl<T: Num, R: Operand<<T as NumElem>::Elem>> NumOperand<T> for R {
    type Shape = R::Shape;
    fn value(self, span: &Span) -> ValueId {
        Operand::value(self, span)
    }
}

/// An operand of the bitwise operators on tiles of `T` (a [`Bits`] type).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an operand of element type `{T}`",
    label = "expected a tile of `{T}` or a Rust literal convertible to `{T}`",
    note = "element types never convert implicitly; use `.cast::<{T}>()`"
)]
pub trait BitsOperand<T: DType> {
    /// The operand's shape.
    type Shape: Shape;
    /// The IR value (emitting a constant for literals).
    fn value(self, span: &Span) -> ValueId;
}
impl<T: Bits, R: Operand<T>> BitsOperand<T> for R {
    type Shape = R::Shape;
    fn value(self, span: &Span) -> ValueId {
        Operand::value(self, span)
    }
}

/// An operand of the shifts on tiles of `T` (an [`Int`] type).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an operand of element type `{T}`",
    label = "expected a tile of `{T}` or a Rust literal convertible to `{T}`",
    note = "element types never convert implicitly; use `.cast::<{T}>()`"
)]
pub trait IntOperand<T: DType> {
    /// The operand's shape.
    type Shape: Shape;
    /// The IR value (emitting a constant for literals).
    fn value(self, span: &Span) -> ValueId;
}
impl<T: Int, R: Operand<T>> IntOperand<T> for R {
    type Shape = R::Shape;
    fn value(self, span: &Span) -> ValueId {
        Operand::value(self, span)
    }
}

/// `lhs op rhs` for an operator operand `rhs` (already an IR value) of shape `R`.
#[track_caller]
fn binary_op<T: DType, S, R: Shape>(
    op: BinaryOp,
    lhs: Tile<T, S>,
    rhs: ValueId,
    span: Span,
) -> Tile<T, <S as Broadcast<R>>::Out>
where
    S: Shape + Broadcast<R>,
{
    let dims = <S as Broadcast<R>>::Out::dims();
    let l = broadcast_value(lhs.id(), &dims, &span);
    let r = broadcast_value(rhs, &dims, &span);
    let ty = Type::tile(T::TY, &dims);
    Tile::from_id(emit1(OpKind::Binary(op), &[l, r], None, ty, span))
}

macro_rules! binop {
    ($Trait:ident, $method:ident, $Assign:ident, $amethod:ident, $op:ident, $bound:ident) => {
        impl<T: DType, S: Shape, R: $bound<T>> ops::$Trait<R> for Tile<T, S>
        where
            S: Broadcast<<R as $bound<T>>::Shape>,
        {
            type Output = Tile<T, <S as Broadcast<<R as $bound<T>>::Shape>>::Out>;
            #[track_caller]
            fn $method(self, rhs: R) -> Self::Output {
                let span = Span::caller();
                let r = rhs.value(&span);
                binary_op::<T, S, <R as $bound<T>>::Shape>(BinaryOp::$op, self, r, span)
            }
        }
        impl<T: DType, S: Shape, R: $bound<T>> ops::$Assign<R> for Tile<T, S>
        where
            S: Broadcast<<R as $bound<T>>::Shape, Out = S>,
        {
            #[track_caller]
            fn $amethod(&mut self, rhs: R) {
                let span = Span::caller();
                let r = rhs.value(&span);
                *self = binary_op::<T, S, <R as $bound<T>>::Shape>(BinaryOp::$op, *self, r, span);
            }
        }
    };
}
binop!(Add, add, AddAssign, add_assign, Add, NumOperand);
binop!(Sub, sub, SubAssign, sub_assign, Sub, NumOperand);
binop!(Mul, mul, MulAssign, mul_assign, Mul, NumOperand);
binop!(Div, div, DivAssign, div_assign, Div, NumOperand);
binop!(Rem, rem, RemAssign, rem_assign, Rem, NumOperand);
binop!(
    BitAnd,
    bitand,
    BitAndAssign,
    bitand_assign,
    And,
    BitsOperand
);
binop!(BitOr, bitor, BitOrAssign, bitor_assign, Or, BitsOperand);
binop!(
    BitXor,
    bitxor,
    BitXorAssign,
    bitxor_assign,
    Xor,
    BitsOperand
);
binop!(Shl, shl, ShlAssign, shl_assign, Shl, IntOperand);
binop!(Shr, shr, ShrAssign, shr_assign, Shr, IntOperand);

impl<T: Int, S: Shape> Tile<T, S> {
    /// Elementwise number of set bits, in the element type (`popc`; PTX `popc`,
    /// AMDGCN `v_bcnt_u32_b32`).
    ///
    /// ```text
    /// let ones = mask_words.popc();   // Tile<u32, S>
    /// ```
    #[track_caller]
    pub fn popc(self) -> Tile<T, S> {
        self.unary(UnaryOp::Popc)
    }

    /// Elementwise number of leading zero bits, in the element type; the bit width
    /// for 0 (`clz`; PTX `clz`, AMDGCN `v_ffbh_u32`).
    ///
    /// ```text
    /// let log2_floor = 31 - x.clz();  // for x: Tile<i32, S>, x > 0
    /// ```
    #[track_caller]
    pub fn clz(self) -> Tile<T, S> {
        self.unary(UnaryOp::Clz)
    }
}

/// Element types with the bits of `U`: what [`Tile::bitcast`] converts between.
#[diagnostic::on_unimplemented(
    message = "cannot bitcast `{Self}` to `{U}`: the widths differ",
    label = "bitcast needs element types of one width",
    note = "8 bits: i8, u8, F8E4M3, F8E5M2; 16: i16, u16, f16, bf16; 32: i32, u32, f32; 64: i64, u64, f64 (bool has no bit layout; use `.cast()` to convert values)"
)]
pub trait SameWidth<U: DType>: DType {}

macro_rules! same_width {
    ($($t:ty),*) => { same_width!(@rows [$($t),*] $($t),*); };
    (@rows $all:tt $($t:ty),*) => { $( same_width!(@row $t, $all); )* };
    (@row $u:ty, [$($t:ty),*]) => { $( impl SameWidth<$u> for $t {} )* };
}
same_width!(i8, u8, F8E4M3, F8E5M2);
same_width!(i16, u16, f16, bf16);
same_width!(i32, u32, f32);
same_width!(i64, u64, f64);

/// Integer and boolean element types: the bitwise operators apply.
pub trait Bits: DType {}
impl<T: Int> Bits for T {}
impl Bits for bool {}

macro_rules! rev_binop {
    ($lit:ty, $bound:ident, $mk:expr; $($Trait:ident $method:ident $op:ident),*) => {$(
        impl<T: $bound, S: Shape> ops::$Trait<Tile<T, S>> for $lit {
            type Output = Tile<T, S>;
            #[track_caller]
            fn $method(self, rhs: Tile<T, S>) -> Tile<T, S> {
                let span = Span::caller();
                #[allow(clippy::redundant_closure_call)]
                let lit = ($mk)(self);
                let l = literal_tile::<T>(lit, span).id();
                binary_rev(BinaryOp::$op, l, rhs)
            }
        }
    )*};
}
macro_rules! rev_int {
    ($($t:ty),*) => {$(
        rev_binop!($t, Num, |x: $t| LitValue::Int(x as i128);
            Add add Add, Sub sub Sub, Mul mul Mul, Div div Div, Rem rem Rem);
    )*};
}
rev_int!(i32, i64, u32, u64, usize);
macro_rules! rev_float {
    ($($t:ty),*) => {$(
        rev_binop!($t, Float, |x: $t| LitValue::Float(x as f64);
            Add add Add, Sub sub Sub, Mul mul Mul, Div div Div);
    )*};
}
rev_float!(f32, f64);

/// Elementwise negation (wrapping for integers).
impl<T: Num, S: Shape> ops::Neg for Tile<T, S> {
    type Output = Tile<T, S>;
    #[track_caller]
    fn neg(self) -> Tile<T, S> {
        self.unary(UnaryOp::Neg)
    }
}

/// Bitwise not (logical not for `bool`).
impl<T: Bits, S: Shape> ops::Not for Tile<T, S> {
    type Output = Tile<T, S>;
    #[track_caller]
    fn not(self) -> Tile<T, S> {
        self.unary(UnaryOp::Not)
    }
}

// ---------------------------------------------------------------------------------
// Methods

macro_rules! cmp_methods {
    ($($name:ident => $pred:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        #[track_caller]
        #[allow(clippy::should_implement_trait)]
        pub fn $name<R: Operand<T>>(self, rhs: R) -> Tile<bool, <S as Broadcast<R::Shape>>::Out>
        where
            S: Broadcast<R::Shape>,
        {
            let span = Span::caller();
            let r = rhs.value(&span);
            let dims = <S as Broadcast<R::Shape>>::Out::dims();
            let l = broadcast_value(self.id(), &dims, &span);
            let r = broadcast_value(r, &dims, &span);
            let ty = Type::tile(ScalarType::I1, &dims);
            Tile::from_id(emit1(OpKind::Cmp(CmpPred::$pred), &[l, r], None, ty, span))
        }
    )*};
}

macro_rules! float_unary {
    ($($name:ident => $op:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        #[track_caller]
        pub fn $name(self) -> Tile<T, S> {
            self.unary(UnaryOp::$op)
        }
    )*};
}

macro_rules! reductions {
    ($($name:ident => $op:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        #[track_caller]
        pub fn $name<const AX: usize>(self) -> Tile<T, <S as RemoveAxis<AX>>::Out>
        where
            S: RemoveAxis<AX>,
        {
            self.reduce::<AX>(ReduceOp::$op)
        }
    )*};
}

macro_rules! keepdims_reductions {
    ($($name:ident => $op:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        #[track_caller]
        pub fn $name<const AX: usize>(self) -> Tile<T, <S as KeepAxis<AX>>::Kept>
        where
            S: KeepAxis<AX>,
        {
            self.reduce_keepdims::<AX>(ReduceOp::$op)
        }
    )*};
}

impl<T: DType, S: Shape> Tile<T, S> {
    #[track_caller]
    fn unary(self, op: UnaryOp) -> Tile<T, S> {
        Tile::from_id(emit1(
            OpKind::Unary(op),
            &[self.id()],
            None,
            Self::ir_type(),
            Span::caller(),
        ))
    }

    cmp_methods! {
        lt => Lt, "Elementwise `self < rhs` (signedness from the element type).";
        le => Le, "Elementwise `self <= rhs`.";
        gt => Gt, "Elementwise `self > rhs`.";
        ge => Ge, "Elementwise `self >= rhs`.";
        eq => Eq, "Elementwise `self == rhs`.";
        ne => Ne, "Elementwise `self != rhs` (true where either side is NaN).";
    }

    /// Elementwise conversion to `U` (float to int saturates, NaN becomes 0; int to
    /// float rounds to nearest even; int to int wraps or extends like Rust's `as`).
    #[track_caller]
    pub fn cast<U: DType>(self) -> Tile<U, S> {
        let ty = Tile::<U, S>::ir_type();
        if T::TY == U::TY {
            return Tile::from_id(self.id());
        }
        Tile::from_id(emit1(
            OpKind::Cast,
            &[self.id()],
            Some(&ty),
            ty.clone(),
            Span::caller(),
        ))
    }

    /// Elementwise reinterpretation of the bits as `U`, which must have the same width
    /// (`f32` ↔ `i32`/`u32`, `f16`/`bf16` ↔ `i16`/`u16`, `f64` ↔ `i64`/`u64`, the
    /// 8-bit floats ↔ `i8`/`u8`); a different width, or `bool`, is a compile error.
    ///
    /// ```text
    /// let bits = x.bitcast::<u32>();              // x: Tile<f32, S>
    /// let sign = (bits >> 31u32).cast::<i32>();
    /// let back = (bits & 0x7fff_ffffu32).bitcast::<f32>();   // |x|
    /// ```
    #[track_caller]
    pub fn bitcast<U: DType>(self) -> Tile<U, S>
    where
        T: SameWidth<U>,
    {
        let ty = Tile::<U, S>::ir_type();
        if T::TY == U::TY {
            return Tile::from_id(self.id());
        }
        Tile::from_id(emit1(
            OpKind::Bitcast,
            &[self.id()],
            Some(&ty),
            ty.clone(),
            Span::caller(),
        ))
    }

    /// Adds a size-1 dimension at `AX` (numpy's `x[:, None]` is `expand_dims::<1>()`).
    #[track_caller]
    pub fn expand_dims<const AX: usize>(self) -> Tile<T, <S as InsertAxis<AX>>::Out>
    where
        S: InsertAxis<AX>,
    {
        let ty = Tile::<T, <S as InsertAxis<AX>>::Out>::ir_type();
        Tile::from_id(emit1(
            OpKind::ExpandDims { axis: AX as u8 },
            &[self.id()],
            None,
            ty,
            Span::caller(),
        ))
    }

    /// Stretches size-1 dimensions (or a scalar) to shape `R`.
    #[track_caller]
    pub fn broadcast_to<R: Shape>(self) -> Tile<T, R>
    where
        S: BroadcastTo<R>,
    {
        Tile::from_id(broadcast_value(self.id(), &R::dims(), &Span::caller()))
    }

    /// The same elements (row-major) in shape `R`; the element counts must match
    /// (checked when the kernel is built).
    #[track_caller]
    pub fn reshape<R: Shape>(self) -> Tile<T, R> {
        let ty = Tile::<T, R>::ir_type();
        Tile::from_id(emit1(
            OpKind::Reshape,
            &[self.id()],
            Some(&ty),
            ty.clone(),
            Span::caller(),
        ))
    }

    /// Reduces along axis `AX` with `op`, removing the axis.
    #[track_caller]
    pub fn reduce<const AX: usize>(self, op: ReduceOp) -> Tile<T, <S as RemoveAxis<AX>>::Out>
    where
        S: RemoveAxis<AX>,
    {
        let ty = Tile::<T, <S as RemoveAxis<AX>>::Out>::ir_type();
        Tile::from_id(emit1(
            OpKind::Reduce { axis: AX as u8, op },
            &[self.id()],
            None,
            ty,
            Span::caller(),
        ))
    }

    /// Inclusive prefix combine with `op` along axis `AX` (from the end if `reverse`).
    #[track_caller]
    pub fn scan<const AX: usize>(self, op: ReduceOp, reverse: bool) -> Tile<T, S>
    where
        S: HasAxis<AX>,
    {
        Tile::from_id(emit1(
            OpKind::Scan {
                axis: AX as u8,
                op,
                reverse,
            },
            &[self.id()],
            None,
            Self::ir_type(),
            Span::caller(),
        ))
    }

    reductions! {
        sum => Sum, "Sum along axis `AX`.";
        prod => Prod, "Product along axis `AX`.";
        max => Max, "Maximum along axis `AX`.";
        min => Min, "Minimum along axis `AX`.";
    }

    /// [`Tile::reduce`] keeping axis `AX` with size 1, so that the result broadcasts
    /// against `self` (Triton's `keep_dims=True`).
    #[track_caller]
    pub fn reduce_keepdims<const AX: usize>(
        self,
        op: ReduceOp,
    ) -> Tile<T, <S as KeepAxis<AX>>::Kept>
    where
        S: KeepAxis<AX>,
    {
        let r = self.reduce::<AX>(op);
        let ty = Tile::<T, <S as KeepAxis<AX>>::Kept>::ir_type();
        Tile::from_id(emit1(
            OpKind::ExpandDims { axis: AX as u8 },
            &[r.id()],
            None,
            ty,
            Span::caller(),
        ))
    }

    keepdims_reductions! {
        sum_keepdims => Sum, "Sum along axis `AX`, keeping it with size 1: \
            `x / x.sum_keepdims::<1>()` normalizes each row.";
        prod_keepdims => Prod, "Product along axis `AX`, keeping it with size 1.";
        max_keepdims => Max, "Maximum along axis `AX`, keeping it with size 1: \
            `(x - x.max_keepdims::<1>()).exp()` is the stable softmax numerator.";
        min_keepdims => Min, "Minimum along axis `AX`, keeping it with size 1.";
    }

    /// Inclusive prefix sum along axis `AX`.
    #[track_caller]
    pub fn cumsum<const AX: usize>(self) -> Tile<T, S>
    where
        S: HasAxis<AX>,
    {
        self.scan::<AX>(ReduceOp::Sum, false)
    }

    /// Inclusive prefix product along axis `AX` (wrapping for integers): element `i`
    /// is `x[0] * x[1] * ... * x[i]`.
    ///
    /// ```text
    /// let survival = (1.0f32 - hazard).cumprod::<0>();
    /// ```
    #[track_caller]
    pub fn cumprod<const AX: usize>(self) -> Tile<T, S>
    where
        S: HasAxis<AX>,
    {
        self.scan::<AX>(ReduceOp::Prod, false)
    }
}

impl<T: Num, S: Shape> Tile<T, S> {
    /// Elementwise maximum.
    #[track_caller]
    pub fn maximum<R: Operand<T>>(self, rhs: R) -> Tile<T, <S as Broadcast<R::Shape>>::Out>
    where
        S: Broadcast<R::Shape>,
    {
        binary(BinaryOp::Max, self, rhs)
    }

    /// Elementwise minimum.
    #[track_caller]
    pub fn minimum<R: Operand<T>>(self, rhs: R) -> Tile<T, <S as Broadcast<R::Shape>>::Out>
    where
        S: Broadcast<R::Shape>,
    {
        binary(BinaryOp::Min, self, rhs)
    }

    /// Elementwise absolute value (wrapping for the most negative integer).
    #[track_caller]
    pub fn abs(self) -> Tile<T, S> {
        self.unary(UnaryOp::Abs)
    }
}

impl<T: Float, S: Shape> Tile<T, S> {
    float_unary! {
        exp => Exp, "Elementwise e^x (on GPUs `exp2(x·log2 e)`, as [`Tile::exp2`]).";
        exp2 => Exp2, "Elementwise 2^x. GPUs use the hardware approximation: NVIDIA \
            `ex2.approx.f32` (≤ 2 ulp), AMD `v_exp_f32` (1 ulp, results below 2^-126 \
            flushed to zero); the CPU and the emulator compute it in f32 with the host's \
            `exp2`.";
        log => Log, "Elementwise natural logarithm.";
        log2 => Log2, "Elementwise base-2 logarithm.";
        sqrt => Sqrt, "Elementwise square root.";
        rsqrt => Rsqrt, "Elementwise 1/sqrt(x).";
        sin => Sin, "Elementwise sine.";
        cos => Cos, "Elementwise cosine.";
        tanh => Tanh, "Elementwise hyperbolic tangent.";
        erf => Erf, "Elementwise error function.";
        floor => Floor, "Elementwise floor.";
        ceil => Ceil, "Elementwise ceiling.";
    }

    /// Elementwise `self^rhs` with C's `pow` special cases (`pow(x, 0) = 1`,
    /// `pow(1, y) = 1`, NaN for a negative base and a non-integer exponent, the base's
    /// sign for odd integer exponents). GPUs compute `exp2(rhs·log2|self|)` with the
    /// hardware approximations: the relative error is about `|rhs·log2 self|·2⁻²²`.
    ///
    /// ```text
    /// let y = x.pow(2.5f32);          // a literal exponent
    /// let z = x.pow(e);               // a tile of exponents
    /// ```
    #[track_caller]
    pub fn pow<R: Operand<T>>(self, rhs: R) -> Tile<T, <S as Broadcast<R::Shape>>::Out>
    where
        S: Broadcast<R::Shape>,
    {
        binary(BinaryOp::Pow, self, rhs)
    }

    /// Elementwise C `fmod`: `self - n·rhs` with `n = trunc(self / rhs)` computed
    /// exactly, so the result has the sign of `self` and is smaller than `rhs` in
    /// magnitude; NaN for `rhs = 0` or an infinite `self`; `self` for an infinite
    /// `rhs`. The same as `self % rhs` on float tiles, and exact on every backend.
    ///
    /// ```text
    /// let angle = theta.fmod(std::f32::consts::TAU);
    /// ```
    #[track_caller]
    pub fn fmod<R: Operand<T>>(self, rhs: R) -> Tile<T, <S as Broadcast<R::Shape>>::Out>
    where
        S: Broadcast<R::Shape>,
    {
        binary(BinaryOp::Rem, self, rhs)
    }

    /// Fused `self * b + c` with one rounding.
    #[track_caller]
    pub fn fma<B: Operand<T>, C: Operand<T>>(self, b: B, c: C) -> Tile<T, S>
    where
        B::Shape: BroadcastTo<S>,
        C::Shape: BroadcastTo<S>,
    {
        let span = Span::caller();
        let dims = S::dims();
        let b = broadcast_value(b.value(&span), &dims, &span);
        let c = broadcast_value(c.value(&span), &dims, &span);
        Tile::from_id(emit1(
            OpKind::Fma,
            &[self.id(), b, c],
            None,
            Self::ir_type(),
            span,
        ))
    }
}

impl<T: DType, A: Dim, B: Dim> Tile<T, (A, B)> {
    /// Transpose of a 2-D tile.
    #[track_caller]
    pub fn trans(self) -> Tile<T, (B, A)> {
        Tile::from_id(emit1(
            OpKind::Permute { order: vec![1, 0] },
            &[self.id()],
            None,
            Tile::<T, (B, A)>::ir_type(),
            Span::caller(),
        ))
    }
}

// ---------------------------------------------------------------------------------
// Free functions

/// The index of this program instance along grid axis `axis` (0, 1 or 2).
#[track_caller]
pub fn program_id(axis: u32) -> Scalar<i32> {
    grid_op(OpKind::ProgramId {
        axis: axis.min(255) as u8,
    })
}

/// The number of program instances along grid axis `axis`.
#[track_caller]
pub fn num_programs(axis: u32) -> Scalar<i32> {
    grid_op(OpKind::NumPrograms {
        axis: axis.min(255) as u8,
    })
}

#[track_caller]
fn grid_op(kind: OpKind) -> Scalar<i32> {
    let ty = Type::scalar(ScalarType::I32);
    Tile::from_id(emit1(kind, &[], None, ty, Span::caller()))
}

/// The 1-D tile `[0, 1, ..., N-1]` of `i32`.
#[track_caller]
pub fn arange<const N: usize>() -> Tile<i32, S1<N>>
where
    Const<N>: Pow2,
{
    let ty = Tile::<i32, S1<N>>::ir_type();
    Tile::from_id(emit1(
        OpKind::Arange {
            start: 0,
            end: N as i64,
        },
        &[],
        None,
        ty,
        Span::caller(),
    ))
}

/// A tile of zeros.
#[track_caller]
pub fn zeros<T: Num, S: Shape>() -> Tile<T, S> {
    let c = if T::TY.is_float() {
        ConstValue::Float(0.0)
    } else {
        ConstValue::Int(0)
    };
    constant(c)
}

/// A tile filled with `value`.
#[track_caller]
pub fn full<T: DType, S: Shape>(value: T) -> Tile<T, S> {
    constant(value.to_const())
}

/// The shape of `select(cond, a, b)`: the three shapes broadcast together.
pub type SelectShape<C, A, B> = <<C as Broadcast<A>>::Out as Broadcast<B>>::Out;

/// `cond ? a : b`, elementwise. The condition and both values broadcast against each
/// other as operands do, so any of them may be a scalar or a Rust literal: a scalar
/// condition picks one of two tiles, a tile condition picks between literals.
///
/// ```text
/// let relu = select(x.gt(0.0f32), x, 0.0);          // a literal operand
/// let row = select(pid.eq(0), first_row, other_row); // a scalar condition
/// let ones = select::<i32, _, _, _>(m, 1, 0).sum::<0>(); // two literals: name the type
/// ```
#[track_caller]
pub fn select<T: DType, C, A: Operand<T>, B: Operand<T>>(
    cond: Tile<bool, C>,
    a: A,
    b: B,
) -> Tile<T, SelectShape<C, A::Shape, B::Shape>>
where
    C: Broadcast<A::Shape>,
    <C as Broadcast<A::Shape>>::Out: Broadcast<B::Shape>,
{
    let span = Span::caller();
    let dims = <SelectShape<C, A::Shape, B::Shape>>::dims();
    let c = broadcast_value(cond.id(), &dims, &span);
    let a = broadcast_value(a.value(&span), &dims, &span);
    let b = broadcast_value(b.value(&span), &dims, &span);
    Tile::from_id(emit1(
        OpKind::Select,
        &[c, a, b],
        None,
        Tile::<T, SelectShape<C, A::Shape, B::Shape>>::ir_type(),
        span,
    ))
}

/// Input element types of [`dot`] and their accumulator types.
#[diagnostic::on_unimplemented(
    message = "`dot` is not defined on `{Self}` inputs",
    label = "dot takes f16, bf16, f32, F8E4M3 or F8E5M2 inputs (f32 accumulator), f64 (f64) or i8 (i32)"
)]
pub trait DotInput: DType + bytemuck::Pod {
    /// The accumulator element type.
    type Acc: DType;
}
impl DotInput for half::f16 {
    type Acc = f32;
}
impl DotInput for half::bf16 {
    type Acc = f32;
}
impl DotInput for f32 {
    type Acc = f32;
}
impl DotInput for f64 {
    type Acc = f64;
}
impl DotInput for i8 {
    type Acc = i32;
}
impl DotInput for F8E4M3 {
    type Acc = f32;
}
impl DotInput for F8E5M2 {
    type Acc = f32;
}

/// Matrix multiply-accumulate: `a` (M×K) times `b` (K×N) plus `acc` (M×N), computed
/// in the accumulator type (f32 for f16/bf16/f32 inputs). Runs on tensor cores where
/// the target has them.
#[track_caller]
pub fn dot<T: DotInput, M: Dim, K: Dim, K2, N: Dim>(
    a: Tile<T, (M, K)>,
    b: Tile<T, (K2, N)>,
    acc: Tile<T::Acc, (M, N)>,
) -> Tile<T::Acc, (M, N)>
where
    // Bounded this way round (the unknown `K2` as the self type) so that rustc does not
    // infer `K2` from `K` and report a plain type mismatch on `b` instead.
    K2: SameDim<K>,
{
    debug_assert_eq!(dot_acc_type(T::TY), Some(<T::Acc as DType>::TY));
    Tile::from_id(emit1(
        OpKind::Dot,
        &[a.id(), b.id(), acc.id()],
        None,
        Tile::<T::Acc, (M, N)>::ir_type(),
        Span::caller(),
    ))
}

/// Element types of [`dot_scaled`]'s operands and their format.
#[diagnostic::on_unimplemented(
    message = "`dot_scaled` is not defined on `{Self}` operands",
    label = "dot_scaled takes F8E4M3 or F8E5M2 tiles (MXFP8) or E2M1x2 tiles (MXFP4, NVFP4)"
)]
pub trait ScaledInput: DType {
    /// The format.
    const FORMAT: crate::ir::ScaledFormat;
}
impl ScaledInput for F8E4M3 {
    const FORMAT: crate::ir::ScaledFormat = crate::ir::ScaledFormat::E4M3;
}
impl ScaledInput for F8E5M2 {
    const FORMAT: crate::ir::ScaledFormat = crate::ir::ScaledFormat::E5M2;
}
impl ScaledInput for crate::mx::E2M1x2 {
    const FORMAT: crate::ir::ScaledFormat = crate::ir::ScaledFormat::E2M1;
}

/// Scale types of [`dot_scaled`]: [`crate::mx::E8M0`] (one per 32 elements along K)
/// or [`F8E4M3`] (NVFP4: one per 16, with [`crate::mx::E2M1x2`] operands).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a scale type of `dot_scaled`",
    label = "dot_scaled scales are E8M0 (MX formats) or F8E4M3 (NVFP4)"
)]
pub trait ScaleType: DType {}
impl ScaleType for crate::mx::E8M0 {}
impl ScaleType for F8E4M3 {}

/// Block-scaled matrix multiply-accumulate ([`crate::mx`]): `a` (M×K elements) times
/// `b` (K×N) plus `acc` (M×N, f32), each element multiplied by the scale of its block
/// of `V` elements along K: `a_scale` is M×(K/V), `b_scale` (K/V)×N. MXFP8: F8E4M3 or
/// F8E5M2 operands with E8M0 scales, `V = 32`; MXFP4: [`crate::mx::E2M1x2`] operands
/// (two elements a byte along the last dimension: `a` is stored M×K/2, `b` K×N/2)
/// with E8M0 scales, `V = 32`; NVFP4: E2M1x2 operands with F8E4M3 scales, `V = 16`.
/// Computed as `dot` in f32 of the exactly decoded, scaled operands; NVIDIA's
/// Tile IR backend takes Blackwell's block-scaled tensor-core instructions. A shape
/// that does not fit is an error at the call.
#[track_caller]
pub fn dot_scaled<
    T: ScaledInput,
    S: ScaleType,
    M: Dim,
    KA: Dim,
    KS: Dim,
    KB: Dim,
    NB: Dim,
    KS2: Dim,
    N: Dim,
>(
    a: Tile<T, (M, KA)>,
    a_scale: Tile<S, (M, KS)>,
    b: Tile<T, (KB, NB)>,
    b_scale: Tile<S, (KS2, N)>,
    acc: Tile<f32, (M, N)>,
) -> Tile<f32, (M, N)> {
    Tile::from_id(emit1(
        OpKind::DotScaled { format: T::FORMAT },
        &[a.id(), a_scale.id(), b.id(), b_scale.id(), acc.id()],
        None,
        Tile::<f32, (M, N)>::ir_type(),
        Span::caller(),
    ))
}

/// The output tile `(m, n)` of linear tile index `t` when an `m_tiles x n_tiles`
/// grid of tiles is walked in groups of `group` tile rows: consecutive indices go
/// down `group` rows of one tile column, then on to the next column, so the tiles
/// computed at about the same time share their operand rows and columns in L2
/// (Triton's "grouped ordering"). The last group has the rows that are left.
/// With a persistent loop (`for t in (program_id(0)..m_tiles * n_tiles)
/// .step_by(num_programs(0))`) it gives each program its tiles in that order.
#[track_caller]
pub fn grouped_tile(
    t: Scalar<i32>,
    m_tiles: Scalar<i32>,
    n_tiles: Scalar<i32>,
    group: i32,
) -> (Scalar<i32>, Scalar<i32>) {
    let group = group.max(1);
    let per_group = n_tiles * group;
    let first_m = (t / per_group) * group;
    let rows = (m_tiles - first_m).minimum(group);
    let within = t % per_group;
    (first_m + within % rows, within / rows)
}

/// Split-K work unit `u` of a walk over output tiles whose reduction (of extent
/// `k`, in blocks of `bk`) is split into `splits` parts: returns `(tile, k_begin,
/// k_end)`, unit `u` being part `u % splits` of tile `u / splits`. The parts take
/// consecutive runs of `ceil(ceil(k / bk) / splits)` blocks (the last ones may be
/// shorter or empty: `k_begin >= k_end`), so a walk over `tiles * splits` units
/// (`for u in (program_id(0)..tiles * splits).step_by(num_programs(0))`, each unit
/// adding its partial product into the output atomically) keeps every program busy
/// when the tiles alone are fewer than the GPU's programs.
#[track_caller]
pub fn split_k(
    u: Scalar<i32>,
    splits: Scalar<i32>,
    k: Scalar<i32>,
    bk: i32,
) -> (Scalar<i32>, Scalar<i32>, Scalar<i32>) {
    let bk = bk.max(1);
    let blocks = (k + (bk - 1)) / bk;
    let per = (blocks + (splits - 1)) / splits;
    let part = u % splits;
    // (A multiple of `bk`, as the block coordinates' analysis sees.)
    let begin = (part * per).minimum(blocks) * bk;
    let end = (begin + per * bk).minimum(k);
    (u / splits, begin, end)
}

/// Synchronizes the threads of the program instance (a GPU block barrier).
#[track_caller]
pub fn barrier() {
    emit0(OpKind::Barrier, &[], Span::caller());
}

// ---------------------------------------------------------------------------------
// Memory

/// A value that can be stored into a `Global<T>` at offsets of shape `S`: a tile of
/// `T` of that shape, or a Rust number or bool (a constant splatted over `S`).
#[diagnostic::on_unimplemented(
    message = "cannot store `{Self}` into a buffer of `{T}` at offsets of shape `{S}`",
    label = "the stored tile must have the buffer's element type and the offsets' shape",
    note = "convert with `.cast::<{T}>()` or broadcast with `.broadcast_to::<SHAPE>()`"
)]
pub trait StoreValue<T: DType, S: Shape> {
    /// The IR value, of shape `S`.
    fn value(self, span: &Span) -> ValueId;
}
impl<T: DType, S: Shape> StoreValue<T, S> for Tile<T, S> {
    fn value(self, _span: &Span) -> ValueId {
        self.id()
    }
}
macro_rules! store_literal {
    ($bound:ident: $($t:ty),*) => {$(
        impl<T: $bound, S: Shape> StoreValue<T, S> for $t {
            fn value(self, span: &Span) -> ValueId {
                broadcast_value(Operand::<T>::value(self, span), &S::dims(), span)
            }
        }
    )*};
}
store_literal!(Num: i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);
store_literal!(Float: f32, f64);
impl<S: Shape> StoreValue<bool, S> for bool {
    fn value(self, span: &Span) -> ValueId {
        broadcast_value(Operand::<bool>::value(self, span), &S::dims(), span)
    }
}

/// Element offsets into a buffer: a tile of integers, or a Rust integer (one element).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as buffer offsets",
    label = "offsets are a tile of integers (e.g. `Tile<i32, S>`) or a Rust integer"
)]
pub trait Offsets {
    /// The shape of the accessed tile.
    type Shape: Shape;
    /// The IR value of the offsets.
    fn value(self, span: &Span) -> ValueId;
}

impl<I: Int, S: Shape> Offsets for Tile<I, S> {
    type Shape = S;
    fn value(self, _span: &Span) -> ValueId {
        self.id()
    }
}

macro_rules! int_offsets {
    ($($t:ty),*) => {$(
        impl Offsets for $t {
            type Shape = ();
            fn value(self, span: &Span) -> ValueId {
                let v = self as i128;
                if i32::try_from(v).is_ok() {
                    literal_tile::<i32>(LitValue::Int(v), span.clone()).id()
                } else {
                    literal_tile::<i64>(LitValue::Int(v), span.clone()).id()
                }
            }
        }
    )*};
}
int_offsets!(i32, i64, u32, usize);

impl<T: DType> Global<T> {
    /// Pointers `self + offs` (in elements), splatting the base over the offsets' shape.
    pub(super) fn ptrs<O: Offsets>(&self, offs: O, span: &Span) -> ValueId {
        let dims = O::Shape::dims();
        let offs = offs.value(span);
        let base = broadcast_value(self.id(), &dims, span);
        let ty = with_builder(|b| b.ty(base).clone());
        emit1(OpKind::AddPtr, &[base, offs], None, ty, span.clone())
    }

    /// Loads `self[offs]` where `mask` is true; masked-off lanes are not accessed and
    /// read as zero.
    #[track_caller]
    pub fn load<O: Offsets, M: BroadcastTo<O::Shape>>(
        &self,
        offs: O,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        let span = Span::caller();
        let p = self.ptrs(offs, &span);
        Tile::from_id(emit1(
            OpKind::Load {
                has_mask: true,
                has_other: false,
            },
            &[p, broadcast_value(mask.id(), &O::Shape::dims(), &span)],
            None,
            Tile::<T, O::Shape>::ir_type(),
            span,
        ))
    }

    /// Loads `self[offs]` where `mask` is true and `other` elsewhere.
    #[track_caller]
    pub fn load_or<O: Offsets, M: BroadcastTo<O::Shape>, X: Operand<T>>(
        &self,
        offs: O,
        mask: Tile<bool, M>,
        other: X,
    ) -> Tile<T, O::Shape>
    where
        X::Shape: BroadcastTo<O::Shape>,
    {
        let span = Span::caller();
        let p = self.ptrs(offs, &span);
        let o = broadcast_value(other.value(&span), &O::Shape::dims(), &span);
        Tile::from_id(emit1(
            OpKind::Load {
                has_mask: true,
                has_other: true,
            },
            &[p, broadcast_value(mask.id(), &O::Shape::dims(), &span), o],
            None,
            Tile::<T, O::Shape>::ir_type(),
            span,
        ))
    }

    /// Loads `self[offs]` for every lane.
    #[track_caller]
    pub fn load_unmasked<O: Offsets>(&self, offs: O) -> Tile<T, O::Shape> {
        let span = Span::caller();
        let p = self.ptrs(offs, &span);
        Tile::from_id(emit1(
            OpKind::Load {
                has_mask: false,
                has_other: false,
            },
            &[p],
            None,
            Tile::<T, O::Shape>::ir_type(),
            span,
        ))
    }

    /// Stores `value` to `self[offs]` where `mask` is true.
    #[track_caller]
    pub fn store<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) {
        let span = Span::caller();
        let p = self.ptrs(offs, &span);
        emit0(
            OpKind::Store { has_mask: true },
            &[
                p,
                value.value(&span),
                broadcast_value(mask.id(), &O::Shape::dims(), &span),
            ],
            span,
        );
    }

    /// Stores `value` to `self[offs]` for every lane.
    #[track_caller]
    pub fn store_unmasked<O: Offsets, V: StoreValue<T, O::Shape>>(&mut self, offs: O, value: V) {
        let span = Span::caller();
        let p = self.ptrs(offs, &span);
        let v = value.value(&span);
        emit0(OpKind::Store { has_mask: false }, &[p, v], span);
    }

    /// Atomic read-modify-write of `self[offs]` with `value` where `mask` is true;
    /// returns the old values.
    #[track_caller]
    pub fn atomic_rmw<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        op: AtomicOp,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
        order: MemOrder,
        scope: MemScope,
    ) -> Tile<T, O::Shape> {
        let span = Span::caller();
        let p = self.ptrs(offs, &span);
        Tile::from_id(emit1(
            OpKind::AtomicRmw {
                op,
                order,
                scope,
                has_mask: true,
            },
            &[
                p,
                value.value(&span),
                broadcast_value(mask.id(), &O::Shape::dims(), &span),
            ],
            None,
            Tile::<T, O::Shape>::ir_type(),
            span,
        ))
    }

    /// Atomic add (acquire-release, device scope) where `mask` is true; returns the old
    /// values.
    #[track_caller]
    pub fn atomic_add<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.atomic_rmw(
            AtomicOp::Add,
            offs,
            value,
            mask,
            MemOrder::AcqRel,
            MemScope::Device,
        )
    }

    /// Atomic max (acquire-release, device scope); returns the old values.
    #[track_caller]
    pub fn atomic_max<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.atomic_rmw(
            AtomicOp::Max,
            offs,
            value,
            mask,
            MemOrder::AcqRel,
            MemScope::Device,
        )
    }

    /// Atomic compare-and-swap (acquire-release, device scope): where `mask` is true and
    /// `self[offs] == expected`, writes `desired`; returns the old values.
    #[track_caller]
    pub fn atomic_cas<O: Offsets, M: BroadcastTo<O::Shape>>(
        &mut self,
        offs: O,
        expected: Tile<T, O::Shape>,
        desired: Tile<T, O::Shape>,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.atomic_cas_scoped(offs, expected, desired, mask, MemScope::Device)
    }

    /// [`Global::atomic_cas`] at `scope`.
    #[track_caller]
    pub(super) fn atomic_cas_scoped<O: Offsets, M: BroadcastTo<O::Shape>>(
        &mut self,
        offs: O,
        expected: Tile<T, O::Shape>,
        desired: Tile<T, O::Shape>,
        mask: Tile<bool, M>,
        scope: MemScope,
    ) -> Tile<T, O::Shape> {
        let span = Span::caller();
        let p = self.ptrs(offs, &span);
        Tile::from_id(emit1(
            OpKind::AtomicCas {
                order: MemOrder::AcqRel,
                scope,
                has_mask: true,
            },
            &[
                p,
                expected.id(),
                desired.id(),
                broadcast_value(mask.id(), &O::Shape::dims(), &span),
            ],
            None,
            Tile::<T, O::Shape>::ir_type(),
            span,
        ))
    }
}

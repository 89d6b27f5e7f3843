//! Type-level tile shapes: dimensions, broadcasting, axis removal and insertion.

/// A comptime `usize` lifted to a type, for bounds on const generics.
pub struct Const<const N: usize>;

/// Implemented for `Const<N>` when `N` is a power of two (1 to 2^20): every tile
/// dimension must be one. Kernels get the bound `Const<N>: Pow2` for each const
/// generic they use as a tile dimension.
#[diagnostic::on_unimplemented(
    message = "tile dimension `{Self}` is not a power of two",
    label = "tile dimensions must be powers of two between 1 and 2^20",
    note = "GPU layouts map tile elements to lanes and registers by bits of the index"
)]
pub trait Pow2 {}

/// `Const<N>` for `N` a power of two (any, up to 2^63); [`Pow2`] also needs
/// [`TileElements<N>`]`: `[`FitsInATile`], so that a power of two too large for a
/// tile is reported as such, not as "not a power of two".
#[diagnostic::on_unimplemented(
    message = "tile dimension `{Self}` is not a power of two",
    label = "tile dimensions must be powers of two between 1 and 2^20",
    note = "GPU layouts map tile elements to lanes and registers by bits of the index"
)]
pub trait PowerOfTwo {
    /// `TileElements<N>`.
    type Elements;
}

/// The number of elements `N` of a tile dimension, for [`FitsInATile`].
pub struct TileElements<const N: usize>;

/// Implemented for `TileElements<N>` when a tile may have `N` elements (at most 2^20).
#[diagnostic::on_unimplemented(
    message = "tile too large: `{Self}` is more than the 2^20 = 1048576 elements a tile may have",
    label = "a tile has at most 2^20 elements",
    note = "a kernel works on large data in tiles: loop over it (`for off in (0..n).step_by(BLOCK)`) or launch more programs"
)]
pub trait FitsInATile {}

impl<const N: usize> Pow2 for Const<N>
where
    Const<N>: PowerOfTwo,
    <Const<N> as PowerOfTwo>::Elements: FitsInATile,
{
}

macro_rules! pow2 {
    ($($(#[$a:meta])* $n:literal)*) => {$(
        $(#[$a])*
        impl PowerOfTwo for Const<{ 1usize << $n }> {
            type Elements = TileElements<{ 1usize << $n }>;
        }
    )*};
}
pow2!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20);
// Too large for a tile: not listed among the sizes a tile may have.
macro_rules! pow2_too_large {
    ($($n:literal)*) => {$( pow2!(#[diagnostic::do_not_recommend] $n); )*};
}
pow2_too_large!(21 22 23 24 25 26 27 28 29 30 31);
#[cfg(target_pointer_width = "64")]
pow2_too_large!(32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63);

macro_rules! fits {
    ($($n:literal)*) => {$( impl FitsInATile for TileElements<{ 1usize << $n }> {} )*};
}
fits!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20);

/// A tile dimension of static size `N` (a power of two).
#[derive(Clone, Copy, Debug)]
pub struct D<const N: usize>;

/// The size-1 dimension made by `expand_dims`; it broadcasts against any `D<N>`.
#[derive(Clone, Copy, Debug)]
pub struct One;

/// A tile dimension.
pub trait Dim: Copy + 'static {
    /// Its size.
    const SIZE: u32;
}

impl<const N: usize> Dim for D<N>
where
    Const<N>: Pow2,
{
    const SIZE: u32 = N as u32;
}

impl Dim for One {
    const SIZE: u32 = 1;
}

/// A tile shape: `()`, `(A,)`, `(A, B)` or `(A, B, C)` of [`Dim`]s.
pub trait Shape: Copy + 'static {
    /// Number of dimensions.
    const RANK: usize;
    /// The sizes, outermost first.
    fn dims() -> Vec<u32>;
}

impl Shape for () {
    const RANK: usize = 0;
    fn dims() -> Vec<u32> {
        Vec::new()
    }
}
impl<A: Dim> Shape for (A,) {
    const RANK: usize = 1;
    fn dims() -> Vec<u32> {
        vec![A::SIZE]
    }
}
impl<A: Dim, B: Dim> Shape for (A, B) {
    const RANK: usize = 2;
    fn dims() -> Vec<u32> {
        vec![A::SIZE, B::SIZE]
    }
}
impl<A: Dim, B: Dim, C: Dim> Shape for (A, B, C) {
    const RANK: usize = 3;
    fn dims() -> Vec<u32> {
        vec![A::SIZE, B::SIZE, C::SIZE]
    }
}

/// A 1-D shape.
pub type S1<const A: usize> = (D<A>,);
/// A 2-D shape.
pub type S2<const A: usize, const B: usize> = (D<A>, D<B>);
/// A 3-D shape.
pub type S3<const A: usize, const B: usize, const C: usize> = (D<A>, D<B>, D<C>);

/// Broadcasting of one dimension against another.
#[diagnostic::on_unimplemented(
    message = "dimension `{Self}` does not match dimension `{R}`",
    label = "tile shapes must agree, or one side must be a size-1 dimension (`One`)"
)]
pub trait DimBroadcast<R: Dim>: Dim {
    /// The broadcast dimension.
    type Out: Dim;
}
impl<const N: usize> DimBroadcast<D<N>> for D<N>
where
    Const<N>: Pow2,
{
    type Out = D<N>;
}
impl<const N: usize> DimBroadcast<One> for D<N>
where
    Const<N>: Pow2,
{
    type Out = D<N>;
}
impl<const N: usize> DimBroadcast<D<N>> for One
where
    Const<N>: Pow2,
{
    type Out = D<N>;
}
impl DimBroadcast<One> for One {
    type Out = One;
}

/// Numpy-style broadcasting of two shapes of equal rank (or a scalar with anything).
#[diagnostic::on_unimplemented(
    message = "shape mismatch: a tile of shape `{Self}` cannot be combined with one of shape `{R}`",
    label = "shapes must be equal, or broadcastable through size-1 (`One`) dimensions or scalars",
    note = "the size-1 dimension that broadcasts is `One`, made by `expand_dims::<AXIS>()` and the `*_keepdims` reductions; in a type, a kept or inserted axis is `(D<N>, One)`, not `S2<N, 1>` (that is `(D<N>, D<1>)`, a dimension of size 1 that does not broadcast)",
    note = "to broadcast explicitly, use `broadcast_to::<SHAPE>()`"
)]
pub trait Broadcast<R: Shape>: Shape {
    /// The shape of the result.
    type Out: Shape;
}

#[diagnostic::do_not_recommend]
impl Broadcast<()> for () {
    type Out = ();
}
#[diagnostic::do_not_recommend]
impl<A: Dim> Broadcast<()> for (A,) {
    type Out = (A,);
}
#[diagnostic::do_not_recommend]
impl<A: Dim> Broadcast<(A,)> for () {
    type Out = (A,);
}
#[diagnostic::do_not_recommend]
impl<A: Dim, B: Dim> Broadcast<()> for (A, B) {
    type Out = (A, B);
}
#[diagnostic::do_not_recommend]
impl<A: Dim, B: Dim> Broadcast<(A, B)> for () {
    type Out = (A, B);
}
#[diagnostic::do_not_recommend]
impl<A: Dim, B: Dim, C: Dim> Broadcast<()> for (A, B, C) {
    type Out = (A, B, C);
}
#[diagnostic::do_not_recommend]
impl<A: Dim, B: Dim, C: Dim> Broadcast<(A, B, C)> for () {
    type Out = (A, B, C);
}
// Report a mismatch as one of whole shapes, not of one dimension.
#[diagnostic::do_not_recommend]
impl<A: DimBroadcast<A2>, A2: Dim> Broadcast<(A2,)> for (A,) {
    type Out = (A::Out,);
}
// Report a mismatch as one of whole shapes, not of one dimension.
#[diagnostic::do_not_recommend]
impl<A: DimBroadcast<A2>, B: DimBroadcast<B2>, A2: Dim, B2: Dim> Broadcast<(A2, B2)> for (A, B) {
    type Out = (A::Out, B::Out);
}
// Report a mismatch as one of whole shapes, not of one dimension.
#[diagnostic::do_not_recommend]
impl<A: DimBroadcast<A2>, B: DimBroadcast<B2>, C: DimBroadcast<C2>, A2: Dim, B2: Dim, C2: Dim>
    Broadcast<(A2, B2, C2)> for (A, B, C)
{
    type Out = (A::Out, B::Out, C::Out);
}

/// Removing axis `AX` (reductions).
#[diagnostic::on_unimplemented(
    message = "axis {AX} is out of range for a tile of shape `{Self}`",
    label = "axes count from 0, outermost first"
)]
pub trait RemoveAxis<const AX: usize>: Shape {
    /// The shape without that axis.
    type Out: Shape;
}
impl<A: Dim> RemoveAxis<0> for (A,) {
    type Out = ();
}
impl<A: Dim, B: Dim> RemoveAxis<0> for (A, B) {
    type Out = (B,);
}
impl<A: Dim, B: Dim> RemoveAxis<1> for (A, B) {
    type Out = (A,);
}
impl<A: Dim, B: Dim, C: Dim> RemoveAxis<0> for (A, B, C) {
    type Out = (B, C);
}
impl<A: Dim, B: Dim, C: Dim> RemoveAxis<1> for (A, B, C) {
    type Out = (A, C);
}
impl<A: Dim, B: Dim, C: Dim> RemoveAxis<2> for (A, B, C) {
    type Out = (A, B);
}

/// Checks that axis `AX` exists (scans keep the shape).
#[diagnostic::on_unimplemented(
    message = "axis {AX} is out of range for a tile of shape `{Self}`",
    label = "axes count from 0, outermost first"
)]
pub trait HasAxis<const AX: usize>: Shape {}
impl<S: RemoveAxis<AX>, const AX: usize> HasAxis<AX> for S {}

/// Inserting a size-1 axis at `AX` (`expand_dims`).
#[diagnostic::on_unimplemented(
    message = "cannot insert axis {AX} into a tile of shape `{Self}`",
    label = "the new axis must be between 0 and the rank"
)]
pub trait InsertAxis<const AX: usize>: Shape {
    /// The shape with the new axis.
    type Out: Shape;
}
impl InsertAxis<0> for () {
    type Out = (One,);
}
impl<A: Dim> InsertAxis<0> for (A,) {
    type Out = (One, A);
}
impl<A: Dim> InsertAxis<1> for (A,) {
    type Out = (A, One);
}
impl<A: Dim, B: Dim> InsertAxis<0> for (A, B) {
    type Out = (One, A, B);
}
impl<A: Dim, B: Dim> InsertAxis<1> for (A, B) {
    type Out = (A, One, B);
}
impl<A: Dim, B: Dim> InsertAxis<2> for (A, B) {
    type Out = (A, B, One);
}

/// A reduction along `AX` that keeps the axis with size 1 (`keep_dims=True`): the
/// shape is `S` with dimension `AX` set to 1, so the result broadcasts back against
/// the input (`x - x.max_keepdims::<1>()`).
pub trait KeepAxis<const AX: usize>: RemoveAxis<AX> {
    /// The shape with axis `AX` of size 1.
    type Kept: Shape;
}
impl<S: RemoveAxis<AX>, const AX: usize> KeepAxis<AX> for S
where
    <S as RemoveAxis<AX>>::Out: InsertAxis<AX>,
{
    type Kept = <<S as RemoveAxis<AX>>::Out as InsertAxis<AX>>::Out;
}

/// Two dimensions that must be equal (the inner dimension of `dot`).
#[diagnostic::on_unimplemented(
    message = "dot: inner dimensions differ: `a` has `{R}` columns but `b` has `{Self}` rows",
    label = "for a: M x K and b: K x N, the K dimensions must be equal"
)]
pub trait SameDim<R: Dim>: Dim {}
impl<const N: usize> SameDim<D<N>> for D<N> where Const<N>: Pow2 {}
impl SameDim<One> for One {}

/// Shapes that a tile of shape `Self` can be broadcast to.
#[diagnostic::on_unimplemented(
    message = "cannot broadcast a tile of shape `{Self}` to shape `{R}`",
    label = "broadcasting keeps the rank and only stretches size-1 dimensions (or a scalar)"
)]
pub trait BroadcastTo<R: Shape>: Shape {}
impl<S: Shape, R: Shape> BroadcastTo<R> for S where S: Broadcast<R, Out = R> {}

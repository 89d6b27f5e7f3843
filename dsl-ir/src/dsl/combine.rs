//! Reductions and scans with a combine function of the user's ([`reduce_with`],
//! [`associative_scan`]): over a tile or a tuple of tiles of one shape (a value and
//! its index, several operands at once), Triton's `tl.reduce` and
//! `tl.associative_scan` with a `combine_fn`.
//!
//! The combine function is ordinary kernel code (a `#[helper]`), traced once per step
//! of the network, so it may be anything associative: it need not be commutative (the
//! networks keep the operands in axis order). Each step exchanges the current values
//! through block-local memory (store, barrier, load, barrier):
//!
//! - the reduction is a butterfly: in step `s` (`s = 1, 2, 4, .., n/2`) element `i`
//!   combines with element `i ^ s` along the axis, the lower index on the left, so
//!   after `log2 n` steps every element holds the ordered combination of its line;
//! - the scan is Hillis and Steele's: in step `d` element `i` becomes
//!   `combine(x[i - d], x[i])` where `i ≥ d` (`combine(x[i], x[i + d])` where
//!   `i + d < n` for a reverse scan).

use super::net::Net;
use super::{DType, RemoveAxis, Shape, Tile};
use crate::ir::{BinaryOp, CmpPred, Span, ValueId};
use crate::types::ScalarType;

/// What [`reduce_with`] and [`associative_scan`] combine: a tile, or a tuple of two
/// to four tiles of one shape.
pub trait Combine: Copy {
    /// The tiles' shape.
    type Shape: Shape;
    /// The same kind of value with shape `R` (the reduction's result).
    type With<R: Shape>: Combine<Shape = R>;
    /// The tiles' IR values and element types, in order.
    fn parts(self) -> Vec<(ValueId, ScalarType)>;
    /// Rebuilds the value from IR values (of this kind's types and shape).
    fn from_parts(ids: &[ValueId]) -> Self;
}

impl<T: DType, S: Shape> Combine for Tile<T, S> {
    type Shape = S;
    type With<R: Shape> = Tile<T, R>;
    fn parts(self) -> Vec<(ValueId, ScalarType)> {
        vec![(self.id(), T::TY)]
    }
    fn from_parts(ids: &[ValueId]) -> Self {
        Tile::from_id(ids[0])
    }
}

macro_rules! tuple_combine {
    ($($t:ident $i:tt),*) => {
        impl<$($t: DType,)* S: Shape> Combine for ($(Tile<$t, S>,)*) {
            type Shape = S;
            type With<R: Shape> = ($(Tile<$t, R>,)*);
            fn parts(self) -> Vec<(ValueId, ScalarType)> {
                vec![$((self.$i.id(), $t::TY)),*]
            }
            fn from_parts(ids: &[ValueId]) -> Self {
                ($(Tile::from_id(ids[$i]),)*)
            }
        }
    };
}
tuple_combine!(A 0, B 1);
tuple_combine!(A 0, B 1, C 2);
tuple_combine!(A 0, B 1, C 2, D 3);

/// Reduces `values` (a tile or a tuple of tiles) along axis `AX` with `combine`,
/// which must be associative (not necessarily commutative: operands stay in axis
/// order). Triton's `tl.reduce(values, AX, combine_fn)`.
///
/// ```text
/// #[helper]
/// fn first_max<const R: usize, const C: usize>(
///     a: (Tile<f32, S2<R, C>>, Tile<i32, S2<R, C>>),
///     b: (Tile<f32, S2<R, C>>, Tile<i32, S2<R, C>>),
/// ) -> (Tile<f32, S2<R, C>>, Tile<i32, S2<R, C>>) {
///     let take_b = b.0.gt(a.0);
///     (select(take_b, b.0, a.0), select(take_b, b.1, a.1))
/// }
/// let (best, at) = reduce_with::<1, _, _>((x, cols), first_max);   // per row
/// ```
#[track_caller]
pub fn reduce_with<const AX: usize, V, F>(
    values: V,
    combine: F,
) -> V::With<<V::Shape as RemoveAxis<AX>>::Out>
where
    V: Combine,
    V::Shape: RemoveAxis<AX>,
    F: Fn(V, V) -> V,
{
    let span = Span::caller();
    let l = Lines::new(values, AX, &span);
    let net = &l.net;
    let zero = net.i32(0);
    let mut cur = values;
    let mut s = 1;
    while s < l.n {
        // The partner differs in bit `s` of the axis index (strides are powers of 2).
        let partner = net.bin(BinaryOp::Xor, l.pos, net.i32(s * l.stride), ScalarType::I32);
        let other = V::from_parts(&net.exchange(&l.arrays, &cur.parts(), l.pos, net, partner));
        let bit = net.bin(BinaryOp::And, l.idx, net.i32(s), ScalarType::I32);
        let lower = net.cmp(CmpPred::Eq, bit, zero);
        let mine_first = combine(cur, other).parts();
        let theirs_first = combine(other, cur).parts();
        let ids: Vec<ValueId> = mine_first
            .iter()
            .zip(&theirs_first)
            .map(|(&(a, t), &(b, _))| net.select(lower, a, b, t))
            .collect();
        cur = V::from_parts(&ids);
        s *= 2;
    }
    // Every element of a line holds its result: read the first of each line (the
    // positions of the other dimensions, at the input's strides).
    let rest = Net {
        dims: <<V::Shape as RemoveAxis<AX>>::Out as Shape>::dims(),
        span: &span,
    };
    let mut strides = net.strides();
    strides.remove(AX);
    let first = rest.positions(&strides);
    let ids = net.exchange(&l.arrays, &cur.parts(), l.pos, &rest, first);
    <V::With<<V::Shape as RemoveAxis<AX>>::Out>>::from_parts(&ids)
}

/// The inclusive scan of `values` (a tile or a tuple of tiles) along axis `AX` with
/// `combine` (associative): element `i` is `x[0] ∘ x[1] ∘ … ∘ x[i]`, or
/// `x[i] ∘ … ∘ x[n-1]` when `reverse`. Triton's `tl.associative_scan`.
///
/// ```text
/// // A running maximum and where it was reached.
/// let (run_max, at) = associative_scan::<0, _, _>((x, arange::<N>()), false, first_max);
/// ```
#[track_caller]
pub fn associative_scan<const AX: usize, V, F>(values: V, reverse: bool, combine: F) -> V
where
    V: Combine,
    V::Shape: RemoveAxis<AX>,
    F: Fn(V, V) -> V,
{
    let span = Span::caller();
    let l = Lines::new(values, AX, &span);
    let (net, n, stride, pos, idx) = (&l.net, l.n, l.stride, l.pos, l.idx);
    let mut cur = values;
    let mut d = 1;
    while d < n {
        // The element `d` before (after) along the axis, or this one where there is
        // none (its value is then not used).
        let (has, from) = if reverse {
            let has = net.cmp(CmpPred::Lt, idx, net.i32(n - d));
            let next = net.bin(BinaryOp::Add, pos, net.i32(d * stride), ScalarType::I32);
            (has, net.select(has, next, pos, ScalarType::I32))
        } else {
            let has = net.cmp(CmpPred::Ge, idx, net.i32(d));
            let prev = net.bin(BinaryOp::Sub, pos, net.i32(d * stride), ScalarType::I32);
            (has, net.select(has, prev, pos, ScalarType::I32))
        };
        let other = V::from_parts(&net.exchange(&l.arrays, &cur.parts(), pos, net, from));
        let c = if reverse {
            combine(cur, other)
        } else {
            combine(other, cur)
        };
        let ids: Vec<ValueId> = c
            .parts()
            .iter()
            .zip(cur.parts())
            .map(|(&(a, t), (b, _))| net.select(has, a, b, t))
            .collect();
        cur = V::from_parts(&ids);
        d *= 2;
    }
    cur
}

/// What both networks start from: the lines along axis `ax` of `values`' shape, and
/// an array in block-local memory per part.
struct Lines<'a> {
    net: Net<'a>,
    /// The length of a line.
    n: i64,
    /// The axis's element stride.
    stride: i64,
    arrays: Vec<ValueId>,
    /// The flat position of every element.
    pos: ValueId,
    /// The index of every element along the axis.
    idx: ValueId,
}

impl<'a> Lines<'a> {
    fn new<V: Combine>(values: V, ax: usize, span: &'a Span) -> Lines<'a> {
        let net = Net {
            dims: V::Shape::dims(),
            span,
        };
        let total: usize = net.dims.iter().map(|&d| d as usize).product();
        let arrays = values
            .parts()
            .iter()
            .map(|&(_, s)| net.local(s, total))
            .collect();
        Lines {
            n: i64::from(net.dims[ax]),
            stride: net.strides()[ax],
            arrays,
            pos: net.flat(),
            idx: net.index(ax),
            net,
        }
    }
}

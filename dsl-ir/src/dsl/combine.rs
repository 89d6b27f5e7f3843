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

use super::ops::broadcast_value;
use super::{DType, LitValue, RemoveAxis, Shape, Tile, emit0, emit1, literal_tile, with_builder};
use crate::ir::{BinaryOp, CmpPred, OpKind, Span, ValueId};
use crate::types::{AddrSpace, Elem, ScalarType, Type};

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

/// IR emission for the networks (and [`super::dot_batched`]), over tiles of shape
/// `dims`.
pub(super) struct Net<'a> {
    pub(super) dims: Vec<u32>,
    pub(super) span: &'a Span,
}

impl Net<'_> {
    pub(super) fn ty(&self, s: ScalarType) -> Type {
        Type::tile(s, &self.dims)
    }

    pub(super) fn i32(&self, v: i64) -> ValueId {
        let c = literal_tile::<i32>(LitValue::Int(v as i128), self.span.clone()).id();
        broadcast_value(c, &self.dims, self.span)
    }

    pub(super) fn bin(&self, op: BinaryOp, a: ValueId, b: ValueId, s: ScalarType) -> ValueId {
        emit1(
            OpKind::Binary(op),
            &[a, b],
            None,
            self.ty(s),
            self.span.clone(),
        )
    }

    pub(super) fn cmp(&self, p: CmpPred, a: ValueId, b: ValueId) -> ValueId {
        let t = self.ty(ScalarType::I1);
        emit1(OpKind::Cmp(p), &[a, b], None, t, self.span.clone())
    }

    pub(super) fn select(&self, c: ValueId, a: ValueId, b: ValueId, s: ScalarType) -> ValueId {
        emit1(
            OpKind::Select,
            &[c, a, b],
            None,
            self.ty(s),
            self.span.clone(),
        )
    }

    /// The index along dimension `d`, broadcast over the shape.
    pub(super) fn index(&self, d: usize) -> ValueId {
        let n = self.dims[d];
        let a = emit1(
            OpKind::Arange {
                start: 0,
                end: n as i64,
            },
            &[],
            None,
            Type::tile(ScalarType::I32, &[n]),
            self.span.clone(),
        );
        if self.dims.len() == 1 {
            return a;
        }
        // [n] -> [1, .., n, .., 1] -> dims.
        let mut shape = vec![1u32; self.dims.len()];
        shape[d] = n;
        let r = emit1(
            OpKind::Reshape,
            &[a],
            Some(&Type::tile(ScalarType::I32, &shape)),
            Type::tile(ScalarType::I32, &shape),
            self.span.clone(),
        );
        broadcast_value(r, &self.dims, self.span)
    }

    /// Row-major element strides of the shape.
    pub(super) fn strides(&self) -> Vec<i64> {
        let mut s = vec![1i64; self.dims.len()];
        for d in (0..self.dims.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * self.dims[d + 1] as i64;
        }
        s
    }

    /// The flat row-major position of every element.
    pub(super) fn flat(&self) -> ValueId {
        let st = self.strides();
        let mut pos = self.index(self.dims.len() - 1);
        for d in (0..self.dims.len() - 1).rev() {
            let term = self.bin(
                BinaryOp::Mul,
                self.index(d),
                self.i32(st[d]),
                ScalarType::I32,
            );
            pos = self.bin(BinaryOp::Add, pos, term, ScalarType::I32);
        }
        pos
    }

    /// A block-local array of `len` elements of `s`.
    pub(super) fn local(&self, s: ScalarType, len: usize) -> ValueId {
        let ty = Type {
            elem: Elem::Ptr {
                pointee: s,
                space: AddrSpace::Shared,
            },
            shape: vec![],
        };
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        emit1(
            OpKind::LocalAlloc { len },
            &[],
            Some(&ty),
            ty.clone(),
            self.span.clone(),
        )
    }

    pub(super) fn ptrs(&self, base: ValueId, offs: ValueId, dims: &[u32]) -> ValueId {
        let b = broadcast_value(base, dims, self.span);
        let ty = with_builder(|bd| bd.ty(b).clone());
        emit1(OpKind::AddPtr, &[b, offs], None, ty, self.span.clone())
    }

    pub(super) fn barrier(&self) {
        emit0(OpKind::Barrier, &[], self.span.clone());
    }

    /// Every part stored at `pos`, then (after a barrier) read back at `from`, of
    /// shape `dims`; a second barrier lets the arrays be written again.
    pub(super) fn exchange(
        &self,
        arrays: &[ValueId],
        parts: &[(ValueId, ScalarType)],
        pos: ValueId,
        from: ValueId,
        from_dims: &[u32],
    ) -> Vec<ValueId> {
        for (&a, &(v, _)) in arrays.iter().zip(parts) {
            let p = self.ptrs(a, pos, &self.dims);
            emit0(
                OpKind::Store { has_mask: false },
                &[p, v],
                self.span.clone(),
            );
        }
        self.barrier();
        let got = arrays
            .iter()
            .zip(parts)
            .map(|(&a, &(_, s))| {
                let p = self.ptrs(a, from, from_dims);
                let kind = OpKind::Load {
                    has_mask: false,
                    has_other: false,
                };
                emit1(
                    kind,
                    &[p],
                    None,
                    Type::tile(s, from_dims),
                    self.span.clone(),
                )
            })
            .collect();
        self.barrier();
        got
    }
}

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
    let net = Net {
        dims: V::Shape::dims(),
        span: &span,
    };
    let n = net.dims[AX] as i64;
    let total: usize = net.dims.iter().map(|&d| d as usize).product();
    let stride = net.strides()[AX];
    let types: Vec<ScalarType> = values.parts().iter().map(|p| p.1).collect();
    let arrays: Vec<ValueId> = types.iter().map(|&s| net.local(s, total)).collect();
    let pos = net.flat();
    let idx = net.index(AX);
    let zero = net.i32(0);
    let mut cur = values;
    let mut s = 1;
    while s < n {
        // The partner differs in bit `s` of the axis index (strides are powers of 2).
        let partner = net.bin(BinaryOp::Xor, pos, net.i32(s * stride), ScalarType::I32);
        let other = V::from_parts(&net.exchange(&arrays, &cur.parts(), pos, partner, &net.dims));
        let bit = net.bin(BinaryOp::And, idx, net.i32(s), ScalarType::I32);
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
    // Every element of a line holds its result: read the first of each line.
    let out_dims = <<V::Shape as RemoveAxis<AX>>::Out as Shape>::dims();
    let rest = Net {
        dims: out_dims.clone(),
        span: &span,
    };
    let st = net.strides();
    let first = if out_dims.is_empty() {
        literal_tile::<i32>(LitValue::Int(0), span.clone()).id()
    } else {
        let mut p = rest.i32(0);
        for (k, d) in (0..net.dims.len()).filter(|&d| d != AX).enumerate() {
            let term = rest.bin(
                BinaryOp::Mul,
                rest.index(k),
                rest.i32(st[d]),
                ScalarType::I32,
            );
            p = rest.bin(BinaryOp::Add, p, term, ScalarType::I32);
        }
        p
    };
    let ids = net.exchange(&arrays, &cur.parts(), pos, first, &out_dims);
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
    let net = Net {
        dims: V::Shape::dims(),
        span: &span,
    };
    let n = net.dims[AX] as i64;
    let total: usize = net.dims.iter().map(|&d| d as usize).product();
    let stride = net.strides()[AX];
    let types: Vec<ScalarType> = values.parts().iter().map(|p| p.1).collect();
    let arrays: Vec<ValueId> = types.iter().map(|&s| net.local(s, total)).collect();
    let pos = net.flat();
    let idx = net.index(AX);
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
        let other = V::from_parts(&net.exchange(&arrays, &cur.parts(), pos, from, &net.dims));
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

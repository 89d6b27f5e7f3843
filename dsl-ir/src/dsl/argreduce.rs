//! Index reductions: [`Tile::argmax`] and [`Tile::argmin`].

use super::{KeepAxis, Num, RemoveAxis, Shape, Tile, emit1, ops::broadcast_value};
use crate::ir::{BinaryOp, CmpPred, ConstValue, OpKind, ReduceOp, Span, ValueId};
use crate::types::{ScalarType, Type};

impl<T: Num, S: Shape> Tile<T, S> {
    /// The index (`i32`) along axis `AX` of the largest element; ties go to the lowest
    /// index. A NaN counts as the largest value (the first NaN's index), as the `max`
    /// reduction propagates it.
    #[track_caller]
    pub fn argmax<const AX: usize>(self) -> Tile<i32, <S as RemoveAxis<AX>>::Out>
    where
        S: RemoveAxis<AX>,
    {
        Tile::from_id(arg_reduce(
            self.id(),
            T::TY,
            &S::dims(),
            AX,
            ReduceOp::Max,
            &Span::caller(),
        ))
    }

    /// The index (`i32`) along axis `AX` of the smallest element; ties go to the lowest
    /// index. A NaN counts as the smallest value (the first NaN's index), as the `min`
    /// reduction propagates it.
    #[track_caller]
    pub fn argmin<const AX: usize>(self) -> Tile<i32, <S as RemoveAxis<AX>>::Out>
    where
        S: RemoveAxis<AX>,
    {
        Tile::from_id(arg_reduce(
            self.id(),
            T::TY,
            &S::dims(),
            AX,
            ReduceOp::Min,
            &Span::caller(),
        ))
    }

    /// [`Tile::argmax`] keeping axis `AX` with size 1 (so the indices broadcast
    /// against `self`, e.g. to compare with an `arange` along that axis).
    #[track_caller]
    pub fn argmax_keepdims<const AX: usize>(self) -> Tile<i32, <S as KeepAxis<AX>>::Kept>
    where
        S: KeepAxis<AX>,
    {
        let span = Span::caller();
        let r = arg_reduce(self.id(), T::TY, &S::dims(), AX, ReduceOp::Max, &span);
        Tile::from_id(keep_axis(
            r,
            AX,
            Tile::<i32, <S as KeepAxis<AX>>::Kept>::ir_type(),
            span,
        ))
    }

    /// [`Tile::argmin`] keeping axis `AX` with size 1.
    #[track_caller]
    pub fn argmin_keepdims<const AX: usize>(self) -> Tile<i32, <S as KeepAxis<AX>>::Kept>
    where
        S: KeepAxis<AX>,
    {
        let span = Span::caller();
        let r = arg_reduce(self.id(), T::TY, &S::dims(), AX, ReduceOp::Min, &span);
        Tile::from_id(keep_axis(
            r,
            AX,
            Tile::<i32, <S as KeepAxis<AX>>::Kept>::ir_type(),
            span,
        ))
    }
}

/// The reduced `v` with a size-1 axis at `axis` again.
fn keep_axis(v: ValueId, axis: usize, ty: Type, span: Span) -> ValueId {
    emit1(
        OpKind::ExpandDims { axis: axis as u8 },
        &[v],
        None,
        ty,
        span,
    )
}

/// `min(i : x[i] == reduce(x))` along `axis` (the NaN elements matching a NaN result):
/// the reduction, broadcast back, compared, and the lowest matching index reduced.
fn arg_reduce(
    x: ValueId,
    s: ScalarType,
    dims: &[u32],
    axis: usize,
    op: ReduceOp,
    span: &Span,
) -> ValueId {
    let e = |kind: OpKind, ops: &[ValueId], ty: Type| {
        emit1(kind, ops, Some(&ty), ty.clone(), span.clone())
    };
    let mut reduced = dims.to_vec();
    reduced.remove(axis);
    let m = e(
        OpKind::Reduce {
            axis: axis as u8,
            op,
        },
        &[x],
        Type::tile(s, &reduced),
    );
    let mut kept = reduced.clone();
    kept.insert(axis, 1);
    let m = e(
        OpKind::ExpandDims { axis: axis as u8 },
        &[m],
        Type::tile(s, &kept),
    );
    let m = broadcast_value(m, dims, span);
    let b = Type::tile(ScalarType::I1, dims);
    let mut hit = e(OpKind::Cmp(CmpPred::Eq), &[x, m], b.clone());
    if s.is_float() {
        let x_nan = e(OpKind::Cmp(CmpPred::Ne), &[x, x], b.clone());
        let m_nan = e(OpKind::Cmp(CmpPred::Ne), &[m, m], b.clone());
        let both = e(OpKind::Binary(BinaryOp::And), &[x_nan, m_nan], b.clone());
        hit = e(OpKind::Binary(BinaryOp::Or), &[hit, both], b.clone());
    }
    // The index along `axis`, shaped [1, .., n, .., 1], broadcast.
    let n = dims[axis];
    let i32t = ScalarType::I32;
    let mut idx = e(
        OpKind::Arange {
            start: 0,
            end: n as i64,
        },
        &[],
        Type::tile(i32t, &[n]),
    );
    let mut shape = vec![n];
    for a in 0..dims.len() {
        if a != axis {
            shape.insert(a, 1);
            idx = e(
                OpKind::ExpandDims { axis: a as u8 },
                &[idx],
                Type::tile(i32t, &shape),
            );
        }
    }
    let idx = broadcast_value(idx, dims, span);
    let none = e(
        OpKind::Const(ConstValue::Int(n as i64)),
        &[],
        Type::tile(i32t, dims),
    );
    let cand = e(OpKind::Select, &[hit, idx, none], Type::tile(i32t, dims));
    e(
        OpKind::Reduce {
            axis: axis as u8,
            op: ReduceOp::Min,
        },
        &[cand],
        Type::tile(i32t, &reduced),
    )
}

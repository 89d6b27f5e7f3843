//! In-tile sorting along the last axis: [`Tile::sort`], [`Tile::sort_descending`],
//! [`Tile::sort_with_indices`], [`Tile::topk`] and [`Tile::topk_with_indices`], for
//! 1-D tiles and for the rows of 2-D tiles.
//!
//! A bitonic sorting network over `(key, index)` pairs: for `N` elements along the
//! axis, `log2 N · (log2 N + 1) / 2` compare-exchange stages. In each stage element
//! `i` meets element `i ^ j` (`j` the stage's distance), which it reads from
//! block-local memory the threads wrote its current values to (store, barrier, load,
//! barrier), and keeps the one its position wants. The order is total, so every
//! backend gives the same result: keys compare with `<` (NaN after every number),
//! equal keys (and `-0.0`/`+0.0`) by their original index, so the sort is stable and
//! ties keep their order in both directions.

use super::ops::broadcast_value;
use super::{Const, D, LitValue, Num, Pow2, Tile, emit0, emit1, literal_tile, with_builder};
use crate::ir::{BinaryOp, CmpPred, OpKind, Span, UnaryOp, ValueId};
use crate::types::{AddrSpace, Elem, ScalarType, Type};

/// Raw IR emission on tiles of one shape (`dims`), at one span.
struct Emit<'a> {
    dims: &'a [u32],
    span: &'a Span,
}

impl Emit<'_> {
    fn ty(&self, s: ScalarType) -> Type {
        Type::tile(s, self.dims)
    }

    fn i32(&self, v: i64) -> ValueId {
        let c = literal_tile::<i32>(LitValue::Int(v as i128), self.span.clone()).id();
        broadcast_value(c, self.dims, self.span)
    }

    fn bin(&self, op: BinaryOp, a: ValueId, b: ValueId, s: ScalarType) -> ValueId {
        emit1(
            OpKind::Binary(op),
            &[a, b],
            None,
            self.ty(s),
            self.span.clone(),
        )
    }

    fn cmp(&self, p: CmpPred, a: ValueId, b: ValueId) -> ValueId {
        let t = self.ty(ScalarType::I1);
        emit1(OpKind::Cmp(p), &[a, b], None, t, self.span.clone())
    }

    fn and(&self, a: ValueId, b: ValueId) -> ValueId {
        self.bin(BinaryOp::And, a, b, ScalarType::I1)
    }

    fn or(&self, a: ValueId, b: ValueId) -> ValueId {
        self.bin(BinaryOp::Or, a, b, ScalarType::I1)
    }

    fn select(&self, c: ValueId, a: ValueId, b: ValueId, s: ScalarType) -> ValueId {
        emit1(
            OpKind::Select,
            &[c, a, b],
            None,
            self.ty(s),
            self.span.clone(),
        )
    }

    /// An array of `len` elements of `s` in block-local memory.
    fn local(&self, s: ScalarType, len: usize) -> ValueId {
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

    /// `base + offs` for a local array `base`.
    fn ptrs(&self, base: ValueId, offs: ValueId) -> ValueId {
        let b = broadcast_value(base, self.dims, self.span);
        let ty = with_builder(|bd| bd.ty(b).clone());
        emit1(OpKind::AddPtr, &[b, offs], None, ty, self.span.clone())
    }

    fn store(&self, base: ValueId, offs: ValueId, v: ValueId) {
        let p = self.ptrs(base, offs);
        emit0(
            OpKind::Store { has_mask: false },
            &[p, v],
            self.span.clone(),
        );
    }

    fn load(&self, base: ValueId, offs: ValueId, s: ScalarType) -> ValueId {
        let p = self.ptrs(base, offs);
        let kind = OpKind::Load {
            has_mask: false,
            has_other: false,
        };
        emit1(kind, &[p], None, self.ty(s), self.span.clone())
    }

    fn barrier(&self) {
        emit0(OpKind::Barrier, &[], self.span.clone());
    }

    /// Whether `x` is NaN (false for integers).
    fn is_nan(&self, x: ValueId, s: ScalarType) -> Option<ValueId> {
        s.is_float().then(|| self.cmp(CmpPred::Ne, x, x))
    }

    /// Whether `(ka, ia)` comes before `(kb, ib)`: keys by `<` (or `>` when
    /// `descending`) with NaN after (before) every number, then indices ascending.
    fn before(
        &self,
        (ka, ia): (ValueId, ValueId),
        (kb, ib): (ValueId, ValueId),
        s: ScalarType,
        descending: bool,
    ) -> ValueId {
        let (x, y) = if descending { (kb, ka) } else { (ka, kb) };
        let mut less = self.cmp(CmpPred::Lt, x, y);
        let mut same = self.cmp(CmpPred::Eq, ka, kb);
        if let (Some(nx), Some(ny)) = (self.is_nan(x, s), self.is_nan(y, s)) {
            // x < y also where y is NaN and x is not; two NaNs tie.
            let t = self.ty(ScalarType::I1);
            let not_nx = emit1(
                OpKind::Unary(UnaryOp::Not),
                &[nx],
                None,
                t,
                self.span.clone(),
            );
            less = self.or(less, self.and(ny, not_nx));
            same = self.or(same, self.and(nx, ny));
        }
        let idx_first = self.cmp(CmpPred::Lt, ia, ib);
        self.or(less, self.and(same, idx_first))
    }
}

/// Sorts `keys` (of shape `dims`, `n` elements along the last axis, `rows` rows) by
/// the network of the module docs; returns the sorted keys, their original indices
/// along the axis, and the local arrays holding both (row-major, `rows · n`).
fn bitonic(
    keys: ValueId,
    s: ScalarType,
    dims: &[u32],
    descending: bool,
    span: &Span,
) -> (ValueId, ValueId, ValueId, ValueId) {
    let e = Emit { dims, span };
    let n = *dims.last().unwrap_or(&1) as i64;
    let total: usize = dims.iter().map(|&d| d as usize).product();
    // Position along the axis, and the flat position (row * n + col).
    let it = Type::tile(ScalarType::I32, &[n as u32]);
    let col1 = emit1(
        OpKind::Arange { start: 0, end: n },
        &[],
        None,
        it,
        span.clone(),
    );
    let (col, flat) = if dims.len() == 1 {
        (col1, col1)
    } else {
        let rows = dims[0] as i64;
        let rt = Type::tile(ScalarType::I32, &[rows as u32]);
        let r = emit1(
            OpKind::Arange {
                start: 0,
                end: rows,
            },
            &[],
            None,
            rt,
            span.clone(),
        );
        let r2 = emit1(
            OpKind::ExpandDims { axis: 1 },
            &[r],
            None,
            Type::tile(ScalarType::I32, &[rows as u32, 1]),
            span.clone(),
        );
        let c2 = emit1(
            OpKind::ExpandDims { axis: 0 },
            &[col1],
            None,
            Type::tile(ScalarType::I32, &[1, n as u32]),
            span.clone(),
        );
        let col = broadcast_value(c2, dims, span);
        let row = broadcast_value(r2, dims, span);
        let base = e.bin(BinaryOp::Mul, row, e.i32(n), ScalarType::I32);
        (col, e.bin(BinaryOp::Add, base, col, ScalarType::I32))
    };
    let row_base = e.bin(BinaryOp::Sub, flat, col, ScalarType::I32);
    let kmem = e.local(s, total);
    let imem = e.local(ScalarType::I32, total);
    let (mut k, mut idx) = (keys, col);
    let zero = e.i32(0);
    let mut size = 2;
    while size <= n {
        let mut j = size / 2;
        while j >= 1 {
            e.store(kmem, flat, k);
            e.store(imem, flat, idx);
            e.barrier();
            let partner = e.bin(BinaryOp::Xor, col, e.i32(j), ScalarType::I32);
            let pflat = e.bin(BinaryOp::Add, row_base, partner, ScalarType::I32);
            let pk = e.load(kmem, pflat, s);
            let pi = e.load(imem, pflat, ScalarType::I32);
            e.barrier();
            // This position takes the first of the pair in the network's order when
            // it is the lower one of an ascending block (or the upper one of a
            // descending block).
            let bit_k = e.bin(BinaryOp::And, col, e.i32(size), ScalarType::I32);
            let asc = e.cmp(CmpPred::Eq, bit_k, zero);
            let bit_j = e.bin(BinaryOp::And, col, e.i32(j), ScalarType::I32);
            let lower = e.cmp(CmpPred::Eq, bit_j, zero);
            let take_first = e.cmp(CmpPred::Eq, lower, asc);
            let me_first = e.before((k, idx), (pk, pi), s, descending);
            let keep = e.cmp(CmpPred::Eq, take_first, me_first);
            k = e.select(keep, k, pk, s);
            idx = e.select(keep, idx, pi, ScalarType::I32);
            j /= 2;
        }
        size *= 2;
    }
    (k, idx, kmem, imem)
}

/// The first `kk` elements along the last axis of the sorted `(keys, idx)`, through
/// the local arrays: shape `dims` with the last dimension `kk`.
fn first_k(
    (k, idx, kmem, imem): (ValueId, ValueId, ValueId, ValueId),
    s: ScalarType,
    dims: &[u32],
    kk: u32,
    span: &Span,
) -> (ValueId, ValueId) {
    let e = Emit { dims, span };
    let n = *dims.last().unwrap_or(&1) as i64;
    let full = {
        let it = Type::tile(ScalarType::I32, &[n as u32]);
        let c = emit1(
            OpKind::Arange { start: 0, end: n },
            &[],
            None,
            it,
            span.clone(),
        );
        flat_positions(c, dims, n, span)
    };
    e.store(kmem, full, k);
    e.store(imem, full, idx);
    e.barrier();
    let mut out = dims.to_vec();
    if let Some(last) = out.last_mut() {
        *last = kk;
    }
    let o = Emit { dims: &out, span };
    let c = emit1(
        OpKind::Arange {
            start: 0,
            end: kk as i64,
        },
        &[],
        None,
        Type::tile(ScalarType::I32, &[kk]),
        span.clone(),
    );
    let pos = flat_positions(c, &out, n, span);
    let keys = o.load(kmem, pos, s);
    let ids = o.load(imem, pos, ScalarType::I32);
    // The arrays may be reused (a top-k in a loop): everyone has read them first.
    o.barrier();
    (keys, ids)
}

/// `row * n + col` over `dims` for the column indices `col` (1-D, the last dimension
/// of `dims`).
fn flat_positions(col: ValueId, dims: &[u32], n: i64, span: &Span) -> ValueId {
    if dims.len() == 1 {
        return col;
    }
    let e = Emit { dims, span };
    let rows = dims[0];
    let r = emit1(
        OpKind::Arange {
            start: 0,
            end: rows as i64,
        },
        &[],
        None,
        Type::tile(ScalarType::I32, &[rows]),
        span.clone(),
    );
    let r2 = emit1(
        OpKind::ExpandDims { axis: 1 },
        &[r],
        None,
        Type::tile(ScalarType::I32, &[rows, 1]),
        span.clone(),
    );
    let c2 = emit1(
        OpKind::ExpandDims { axis: 0 },
        &[col],
        None,
        Type::tile(ScalarType::I32, &[1, dims[1]]),
        span.clone(),
    );
    let row = broadcast_value(r2, dims, span);
    let c = broadcast_value(c2, dims, span);
    let base = e.bin(BinaryOp::Mul, row, e.i32(n), ScalarType::I32);
    e.bin(BinaryOp::Add, base, c, ScalarType::I32)
}

macro_rules! sort_methods {
    ($shape:ty, [$($g:tt)*], [$($pow2:ty),*], $kshape:ty) => {
        impl<T: Num, $($g)*> Tile<T, $shape>
        where
            $($pow2: Pow2,)*
        {
            /// Sorted ascending along the last axis (rows of a 2-D tile independently):
            /// NaN last, equal keys in their original order.
            ///
            /// ```text
            /// let s = x.sort();                 // x: Tile<f32, S1<1024>>
            /// ```
            #[track_caller]
            pub fn sort(self) -> Self {
                let span = Span::caller();
                let dims = <$shape as super::Shape>::dims();
                Tile::from_id(bitonic(self.id(), T::TY, &dims, false, &span).0)
            }

            /// Sorted descending along the last axis: NaN first, equal keys in their
            /// original order.
            #[track_caller]
            pub fn sort_descending(self) -> Self {
                let span = Span::caller();
                let dims = <$shape as super::Shape>::dims();
                Tile::from_id(bitonic(self.id(), T::TY, &dims, true, &span).0)
            }

            /// [`Self::sort`] (or [`Self::sort_descending`]) with each element's
            /// original index along the axis (an argsort).
            ///
            /// ```text
            /// let (v, i) = scores.sort_with_indices(true);   // descending
            /// ```
            #[track_caller]
            pub fn sort_with_indices(self, descending: bool) -> (Self, Tile<i32, $shape>) {
                let span = Span::caller();
                let dims = <$shape as super::Shape>::dims();
                let (k, i, ..) = bitonic(self.id(), T::TY, &dims, descending, &span);
                (Tile::from_id(k), Tile::from_id(i))
            }

            /// The `K` largest elements along the last axis, largest first (NaN
            /// counts as the largest; ties in their original order).
            ///
            /// ```text
            /// let best = logits.topk::<8>();    // logits: Tile<f32, S2<16, 64>> -> S2<16, 8>
            /// ```
            #[track_caller]
            pub fn topk<const K: usize>(self) -> Tile<T, $kshape>
            where
                Const<K>: Pow2,
            {
                self.topk_with_indices::<K>().0
            }

            /// [`Self::topk`] with the elements' indices along the axis (MoE routing:
            /// each token's top experts).
            #[track_caller]
            pub fn topk_with_indices<const K: usize>(
                self,
            ) -> (Tile<T, $kshape>, Tile<i32, $kshape>)
            where
                Const<K>: Pow2,
            {
                let span = Span::caller();
                let dims = <$shape as super::Shape>::dims();
                if K > N {
                    super::record_error(crate::builder::BuildError::new(
                        span.clone(),
                        format!("topk of {K} elements from a tile of {N} along the axis"),
                    ));
                }
                let sorted = bitonic(self.id(), T::TY, &dims, true, &span);
                let (k, i) = first_k(sorted, T::TY, &dims, K.min(N) as u32, &span);
                (Tile::from_id(k), Tile::from_id(i))
            }
        }
    };
}

sort_methods!((D<N>,), [const N: usize], [Const<N>], (D<K>,));
sort_methods!(
    (D<M>, D<N>),
    [const M: usize, const N: usize],
    [Const<M>, Const<N>],
    (D<M>, D<K>)
);

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

use super::net::Net;
use super::{Const, D, Num, Pow2, Tile};
use crate::ir::{BinaryOp, CmpPred, Span, ValueId};
use crate::types::ScalarType;

/// Whether `(ka, ia)` comes before `(kb, ib)`: keys by `<` (or `>` when `descending`)
/// with NaN after (before) every number, then indices ascending.
fn before(
    net: &Net<'_>,
    (ka, ia): (ValueId, ValueId),
    (kb, ib): (ValueId, ValueId),
    s: ScalarType,
    descending: bool,
) -> ValueId {
    let (x, y) = if descending { (kb, ka) } else { (ka, kb) };
    let mut less = net.cmp(CmpPred::Lt, x, y);
    let mut same = net.cmp(CmpPred::Eq, ka, kb);
    if s.is_float() {
        // x < y also where y is NaN and x is not; two NaNs tie.
        let (nx, ny) = (net.cmp(CmpPred::Ne, x, x), net.cmp(CmpPred::Ne, y, y));
        less = net.or(less, net.and(ny, net.not(nx)));
        same = net.or(same, net.and(nx, ny));
    }
    let idx_first = net.cmp(CmpPred::Lt, ia, ib);
    net.or(less, net.and(same, idx_first))
}

/// The sorted keys, their original indices along the axis, and the local arrays
/// holding both (row-major, the flat positions of the input).
struct Sorted {
    keys: ValueId,
    idx: ValueId,
    kmem: ValueId,
    imem: ValueId,
}

/// Sorts `keys` (of shape `dims`) along the last axis by the network of the module
/// docs.
fn bitonic(keys: ValueId, s: ScalarType, dims: &[u32], descending: bool, span: &Span) -> Sorted {
    let net = Net {
        dims: dims.to_vec(),
        span,
    };
    let last = dims.len() - 1;
    let n = i64::from(dims[last]);
    let total: usize = dims.iter().map(|&d| d as usize).product();
    let (col, flat) = (net.index(last), net.flat());
    let row_base = net.bin(BinaryOp::Sub, flat, col, ScalarType::I32);
    let kmem = net.local(s, total);
    let imem = net.local(ScalarType::I32, total);
    let arrays = [kmem, imem];
    let (mut k, mut idx) = (keys, col);
    let zero = net.i32(0);
    let mut size = 2;
    while size <= n {
        let mut j = size / 2;
        while j >= 1 {
            let partner = net.bin(BinaryOp::Xor, col, net.i32(j), ScalarType::I32);
            let pflat = net.bin(BinaryOp::Add, row_base, partner, ScalarType::I32);
            let parts = [(k, s), (idx, ScalarType::I32)];
            let got = net.exchange(&arrays, &parts, flat, &net, pflat);
            let (pk, pi) = (got[0], got[1]);
            // This position takes the first of the pair in the network's order when
            // it is the lower one of an ascending block (or the upper one of a
            // descending block).
            let bit_k = net.bin(BinaryOp::And, col, net.i32(size), ScalarType::I32);
            let asc = net.cmp(CmpPred::Eq, bit_k, zero);
            let bit_j = net.bin(BinaryOp::And, col, net.i32(j), ScalarType::I32);
            let lower = net.cmp(CmpPred::Eq, bit_j, zero);
            let take_first = net.cmp(CmpPred::Eq, lower, asc);
            let me_first = before(&net, (k, idx), (pk, pi), s, descending);
            let keep = net.cmp(CmpPred::Eq, take_first, me_first);
            k = net.select(keep, k, pk, s);
            idx = net.select(keep, idx, pi, ScalarType::I32);
            j /= 2;
        }
        size *= 2;
    }
    Sorted {
        keys: k,
        idx,
        kmem,
        imem,
    }
}

/// The first `kk` elements along the last axis of `sorted` (of shape `dims`), read
/// through its local arrays: shape `dims` with the last dimension `kk`.
fn first_k(
    sorted: Sorted,
    s: ScalarType,
    dims: &[u32],
    kk: u32,
    span: &Span,
) -> (ValueId, ValueId) {
    let net = Net {
        dims: dims.to_vec(),
        span,
    };
    let mut out = dims.to_vec();
    if let Some(last) = out.last_mut() {
        *last = kk;
    }
    let reader = Net { dims: out, span };
    // The output's elements at the input's positions.
    let from = reader.positions(&net.strides());
    let parts = [(sorted.keys, s), (sorted.idx, ScalarType::I32)];
    let got = net.exchange(
        &[sorted.kmem, sorted.imem],
        &parts,
        net.flat(),
        &reader,
        from,
    );
    (got[0], got[1])
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
                Tile::from_id(bitonic(self.id(), T::TY, &dims, false, &span).keys)
            }

            /// Sorted descending along the last axis: NaN first, equal keys in their
            /// original order.
            #[track_caller]
            pub fn sort_descending(self) -> Self {
                let span = Span::caller();
                let dims = <$shape as super::Shape>::dims();
                Tile::from_id(bitonic(self.id(), T::TY, &dims, true, &span).keys)
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
                let sorted = bitonic(self.id(), T::TY, &dims, descending, &span);
                (Tile::from_id(sorted.keys), Tile::from_id(sorted.idx))
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

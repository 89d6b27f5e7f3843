//! [`dot_batched`]: `dot` over a leading batch dimension.

use super::net::Net;
use super::{Dim, DotInput, SameDim, Tile, emit1};
use crate::ir::{BinaryOp, OpKind, Span};
use crate::types::ScalarType;

/// Batched matrix multiply-accumulate: for every `i` of the leading dimension,
/// `a[i]` (M×K) times `b[i]` (K×N) plus `acc[i]` (M×N), in the accumulator type (as
/// [`dot`](super::dot), on the matrix units where the target has them).
///
/// Each batch is one `dot`: the three tiles go to block-local memory once, and each
/// batch's operands are read back from there as 2-D tiles (one barrier), so the cost
/// is `B` dots plus a shared-memory round trip of the operands and results. For
/// large `B`, give each program fewer batches.
///
/// ```text
/// // Per head: scores = q · kᵀ for 4 heads at once.
/// let s = dot_batched(q, kt, zeros::<f32, S3<4, 64, 64>>());   // q: S3<4, 64, 32>, kt: S3<4, 32, 64>
/// ```
#[track_caller]
pub fn dot_batched<T: DotInput, B: Dim, M: Dim, K: Dim, B2, K2, N: Dim>(
    a: Tile<T, (B, M, K)>,
    b: Tile<T, (B2, K2, N)>,
    acc: Tile<T::Acc, (B, M, N)>,
) -> Tile<T::Acc, (B, M, N)>
where
    B2: SameDim<B>,
    K2: SameDim<K>,
{
    let span = Span::caller();
    let (nb, m, k, n) = (B::SIZE, M::SIZE, K::SIZE, N::SIZE);
    let acc_ty = <T::Acc as super::DType>::TY;
    let net = |d: &[u32]| Net {
        dims: d.to_vec(),
        span: &span,
    };
    let (na, nbk, nc) = (net(&[nb, m, k]), net(&[nb, k, n]), net(&[nb, m, n]));
    let la = na.local(T::TY, (nb * m * k) as usize);
    let lb = nbk.local(T::TY, (nb * k * n) as usize);
    let lc = nc.local(acc_ty, (nb * m * n) as usize);
    let lr = nc.local(acc_ty, (nb * m * n) as usize);
    na.store(la, na.flat(), a.id());
    nbk.store(lb, nbk.flat(), b.id());
    nc.store(lc, nc.flat(), acc.id());
    na.barrier();
    // The positions of batch `i`'s `r x c` tile in an array of [batch][r][c].
    let at = |i: u32, r: u32, c: u32| {
        let t = net(&[r, c]);
        let off = t.bin(
            BinaryOp::Add,
            t.flat(),
            t.i32(i64::from(i * r * c)),
            ScalarType::I32,
        );
        (t, off)
    };
    for i in 0..nb {
        let (ta, oa) = at(i, m, k);
        let (tb, ob) = at(i, k, n);
        let (tc, oc) = at(i, m, n);
        let ops = [
            ta.load(la, oa, T::TY),
            tb.load(lb, ob, T::TY),
            tc.load(lc, oc, acc_ty),
        ];
        let d = emit1(OpKind::Dot, &ops, None, tc.ty(acc_ty), span.clone());
        tc.store(lr, oc, d);
    }
    nc.barrier();
    let out = nc.load(lr, nc.flat(), acc_ty);
    // The arrays may be reused (a batched dot in a loop): everyone has read them.
    nc.barrier();
    Tile::from_id(out)
}

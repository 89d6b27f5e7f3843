//! [`dot_batched`]: `dot` over a leading batch dimension.

use super::combine::Net;
use super::{Dim, DotInput, SameDim, Tile, emit0, emit1};
use crate::ir::{BinaryOp, OpKind, Span, ValueId};
use crate::types::{ScalarType, Type};

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
    let full = |d: [u32; 3]| Net {
        dims: d.to_vec(),
        span: &span,
    };
    let (na, nbm, nc) = (full([nb, m, k]), full([nb, k, n]), full([nb, m, n]));
    let la = na.local(T::TY, (nb * m * k) as usize);
    let lb = nbm.local(T::TY, (nb * k * n) as usize);
    let lc = nc.local(acc_ty, (nb * m * n) as usize);
    let lr = nc.local(acc_ty, (nb * m * n) as usize);
    let store = |net: &Net, base: ValueId, v: ValueId| {
        let p = net.ptrs(base, net.flat(), &net.dims);
        emit0(OpKind::Store { has_mask: false }, &[p, v], span.clone());
    };
    store(&na, la, a.id());
    store(&nbm, lb, b.id());
    store(&nc, lc, acc.id());
    na.barrier();
    // One 2-D tile of batch `i` from a local array of [batch][r][c].
    let load = |base: ValueId, i: u32, r: u32, c: u32, s: ScalarType| {
        let net = Net {
            dims: vec![r, c],
            span: &span,
        };
        let off = net.bin(
            BinaryOp::Add,
            net.flat(),
            net.i32(i64::from(i * r * c)),
            ScalarType::I32,
        );
        let p = net.ptrs(base, off, &net.dims);
        let kind = OpKind::Load {
            has_mask: false,
            has_other: false,
        };
        emit1(kind, &[p], None, Type::tile(s, &[r, c]), span.clone())
    };
    for i in 0..nb {
        let ai = load(la, i, m, k, T::TY);
        let bi = load(lb, i, k, n, T::TY);
        let ci = load(lc, i, m, n, acc_ty);
        let d = emit1(
            OpKind::Dot,
            &[ai, bi, ci],
            None,
            Type::tile(acc_ty, &[m, n]),
            span.clone(),
        );
        let net = Net {
            dims: vec![m, n],
            span: &span,
        };
        let off = net.bin(
            BinaryOp::Add,
            net.flat(),
            net.i32(i64::from(i * m * n)),
            ScalarType::I32,
        );
        let p = net.ptrs(lr, off, &net.dims);
        emit0(OpKind::Store { has_mask: false }, &[p, d], span.clone());
    }
    nc.barrier();
    let p = nc.ptrs(lr, nc.flat(), &nc.dims);
    let kind = OpKind::Load {
        has_mask: false,
        has_other: false,
    };
    let out = emit1(kind, &[p], None, Type::tile(acc_ty, &nc.dims), span.clone());
    // The arrays may be reused (a batched dot in a loop): everyone has read them.
    nc.barrier();
    Tile::from_id(out)
}

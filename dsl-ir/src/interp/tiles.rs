//! Operations on dense tile data: indexing, gathers, offsets and selects.

use super::value::{Data, Elt, PtrTile, Slots, map_data};
use crate::ir::ConstValue;
use crate::types::{ScalarType, Type};

/// Multi-index of flat element `i` of a tile of `shape`.
pub(super) fn unravel(shape: &[u32], mut i: usize) -> Vec<u32> {
    let mut out = vec![0u32; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        let n = (n as usize).max(1);
        out[d] = (i % n) as u32;
        i /= n;
    }
    out
}

/// Row-major strides of `shape`.
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Source indices of a row-major walk over `shape` with source strides `st`.
pub(super) fn strided_index(shape: &[usize], st: &[usize]) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let rank = shape.len();
    if rank == 0 {
        return vec![0];
    }
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let (inner, istride) = (shape[rank - 1], st[rank - 1]);
    let mut idx = vec![0usize; rank];
    let mut base = 0usize;
    loop {
        out.extend((0..inner).map(|j| base + j * istride));
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            base += st[d];
            if idx[d] < shape[d] {
                break;
            }
            base -= st[d] * shape[d];
            idx[d] = 0;
        }
    }
}

pub(super) fn gather_data(d: &Data, idx: &[usize]) -> Data {
    map_data!(d, |v| idx.iter().map(|&i| v[i]).collect())
}

pub(super) fn usize_shape(t: &Type) -> Vec<usize> {
    t.shape.iter().map(|&d| d as usize).collect()
}

/// True when every mask lane is set (vectorized: no early exit per lane).
pub(super) fn all_true(m: &[bool]) -> bool {
    m.chunks(64).all(|c| c.iter().fold(true, |a, &b| a & b))
}

/// True when `offs` are consecutive: `offs[i] == offs[0] + i`.
pub(super) fn contiguous(offs: &[i64]) -> bool {
    let Some(&s) = offs.first() else {
        return false;
    };
    // Non-short-circuiting per chunk so that it vectorizes.
    let mut base = s;
    for c in offs.chunks(64) {
        let mut ok = true;
        for (i, &o) in c.iter().enumerate() {
            ok &= o == base.wrapping_add(i as i64);
        }
        if !ok {
            return false;
        }
        base = base.wrapping_add(64);
    }
    true
}

pub(super) fn const_data(c: ConstValue, st: ScalarType, n: usize) -> Data {
    with_type!(st, T => {
        let x: T = match c {
            ConstValue::Bool(b) => T::from_bool(b),
            ConstValue::Int(i) => T::from_i64(i),
            ConstValue::Float(x) => T::from_f64(x),
        };
        T::wrap(vec![x; n])
    })
}

/// Adds integer offsets to pointer offsets (wrapping); one-element operands are
/// broadcast.
pub(super) fn add_offsets(offs: &mut Vec<i64>, d: &Data) -> bool {
    macro_rules! go {
        ($v:expr) => {{
            if offs.len() == 1 && $v.len() != 1 {
                let base = offs[0];
                *offs = $v.iter().map(|&x| base.wrapping_add(x as i64)).collect();
                return true;
            }
            if $v.len() == 1 {
                let x = $v[0] as i64;
                for o in offs.iter_mut() {
                    *o = o.wrapping_add(x);
                }
                return true;
            }
            if $v.len() != offs.len() {
                return false;
            }
            for (o, &x) in offs.iter_mut().zip($v.iter()) {
                *o = o.wrapping_add(x as i64);
            }
            true
        }};
    }
    match d {
        Data::I8(v) => go!(v),
        Data::I16(v) => go!(v),
        Data::I32(v) => go!(v),
        Data::I64(v) => go!(v),
        Data::U8(v) => go!(v),
        Data::U16(v) => go!(v),
        Data::U32(v) => go!(v),
        Data::U64(v) => go!(v),
        _ => false,
    }
}

pub(super) fn select_data(c: &[bool], a: &Data, b: &Data) -> Option<Data> {
    pub(super) fn sel<T: Copy>(c: &[bool], a: &[T], b: &[T]) -> Vec<T> {
        c.iter()
            .zip(a.iter().zip(b))
            .map(|(&c, (&x, &y))| if c { x } else { y })
            .collect()
    }
    use Data as D;
    Some(match (a, b) {
        (D::I1(x), D::I1(y)) => D::I1(sel(c, x, y)),
        (D::I8(x), D::I8(y)) => D::I8(sel(c, x, y)),
        (D::I16(x), D::I16(y)) => D::I16(sel(c, x, y)),
        (D::I32(x), D::I32(y)) => D::I32(sel(c, x, y)),
        (D::I64(x), D::I64(y)) => D::I64(sel(c, x, y)),
        (D::U8(x), D::U8(y)) => D::U8(sel(c, x, y)),
        (D::U16(x), D::U16(y)) => D::U16(sel(c, x, y)),
        (D::U32(x), D::U32(y)) => D::U32(sel(c, x, y)),
        (D::U64(x), D::U64(y)) => D::U64(sel(c, x, y)),
        (D::F16(x), D::F16(y)) => D::F16(sel(c, x, y)),
        (D::BF16(x), D::BF16(y)) => D::BF16(sel(c, x, y)),
        (D::F32(x), D::F32(y)) => D::F32(sel(c, x, y)),
        (D::F64(x), D::F64(y)) => D::F64(sel(c, x, y)),
        (D::Ptr(p), D::Ptr(q)) => {
            let n = c.len().min(p.offs.len()).min(q.offs.len());
            let slots = match (&p.slots, &q.slots) {
                (Slots::Uniform(s), Slots::Uniform(t)) if s == t => Slots::Uniform(*s),
                _ => Slots::Lanes(
                    (0..n)
                        .map(|i| if c[i] { p.slots.get(i) } else { q.slots.get(i) })
                        .collect(),
                ),
            };
            D::Ptr(PtrTile {
                slots,
                offs: sel(c, &p.offs, &q.offs),
            })
        }
        _ => return None,
    })
}

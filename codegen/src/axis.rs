//! Axis information (after Triton's `AxisInfo`): for every integer or pointer value and
//! every dimension, what is known about runs of consecutive elements along it.
//!
//! - **contiguity** `c`: along the dimension, the elements form runs of `c` values
//!   that increase by exactly one (pointers: one element), starting at indices that
//!   are multiples of `c`;
//! - **divisibility** `d`: the first element of every such run is a multiple of `d`
//!   (pointers: in bytes);
//! - **constancy** `k`: runs of `k` equal elements, starting at multiples of `k`.
//!
//! All three are powers of two. The lowering emits a `<vec x T>` load or store (aligned
//! to its size) when the pointer's last dimension has contiguity ≥ vec and
//! divisibility ≥ the vector's bytes, and the mask is constant over the vector.
//!
//! Pointer parameters are assumed 16-byte aligned unless [`ParamAttrs::divisibility`]
//! says otherwise: every buffer Tessera's runtime allocates is 256-byte aligned, so
//! this holds for whole buffers passed to kernels. Integer parameters have
//! divisibility 1 unless declared. Loop induction variables get
//! `gcd(div(lb), div(step))`; loop-carried values and loaded values are unknown.
//!
//! [`ParamAttrs::divisibility`]: tessera_ir::ir::ParamAttrs::divisibility

use std::collections::HashMap;

use tessera_ir::ir::{BinaryOp, CmpPred, ConstValue, Function, HintKind, Op, OpKind, Region};
use tessera_ir::{Elem, ValueId};

/// The largest divisibility tracked (the divisibility of zero).
pub const MAX_DIV: u64 = 1 << 30;

/// What is known about one value (one entry per dimension; one entry for scalars).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisInfo {
    /// Contiguity per dimension.
    pub contiguity: Vec<u64>,
    /// Divisibility per dimension (bytes for pointers).
    pub divisibility: Vec<u64>,
    /// Constancy per dimension.
    pub constancy: Vec<u64>,
}

impl AxisInfo {
    /// Nothing known, for a value of `shape`.
    pub fn unknown(shape: &[u32]) -> AxisInfo {
        let r = shape.len().max(1);
        AxisInfo {
            contiguity: vec![1; r],
            divisibility: vec![1; r],
            constancy: vec![1; r],
        }
    }

    /// A value equal in every element with divisibility `div`.
    pub fn constant(shape: &[u32], div: u64) -> AxisInfo {
        let dims = dims_of(shape);
        AxisInfo {
            contiguity: vec![1; dims.len()],
            divisibility: vec![div; dims.len()],
            constancy: dims,
        }
    }

    /// The divisibility of a scalar (the first entry).
    pub fn scalar_div(&self) -> u64 {
        self.divisibility.iter().copied().min().unwrap_or(1)
    }
}

fn dims_of(shape: &[u32]) -> Vec<u64> {
    if shape.is_empty() {
        vec![1]
    } else {
        shape.iter().map(|&d| d as u64).collect()
    }
}

/// The largest power of two dividing `x` (capped at [`MAX_DIV`]; zero gives the cap).
pub fn pow2_div(x: i64) -> u64 {
    if x == 0 {
        MAX_DIV
    } else {
        (1u64 << x.unsigned_abs().trailing_zeros()).min(MAX_DIV)
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    // Both are powers of two.
    a.min(b)
}

/// Axis information of every value of a function.
#[derive(Debug, Default)]
pub struct AxisAnalysis {
    info: HashMap<ValueId, AxisInfo>,
}

impl AxisAnalysis {
    /// Analyzes `func`.
    pub fn run(func: &Function) -> AxisAnalysis {
        let mut a = AxisAnalysis::default();
        for p in &func.params {
            let ty = func.ty(p.value);
            let div = match ty.elem {
                Elem::Ptr { .. } => p.attrs.divisibility.map(|d| d as u64).unwrap_or(16),
                Elem::Scalar(_) => p.attrs.divisibility.map(|d| d as u64).unwrap_or(1),
            };
            let div = if div.is_power_of_two() {
                div
            } else {
                1 << div.trailing_zeros()
            };
            a.info
                .insert(p.value, AxisInfo::constant(&ty.shape, div.min(MAX_DIV)));
        }
        a.region(func, &func.body);
        a
    }

    /// The information of `v` (unknown if never computed).
    pub fn get(&self, func: &Function, v: ValueId) -> AxisInfo {
        self.info
            .get(&v)
            .cloned()
            .unwrap_or_else(|| AxisInfo::unknown(&func.ty(v).shape))
    }

    fn region(&mut self, func: &Function, r: &Region) {
        for op in &r.ops {
            self.op(func, op);
        }
    }

    fn op(&mut self, func: &Function, op: &Op) {
        let shape = |v: ValueId| func.ty(v).shape.clone();
        match &op.kind {
            OpKind::For => {
                let body = &op.regions[0];
                let lb = self.get(func, op.operands[0]).scalar_div();
                let step = self.get(func, op.operands[2]).scalar_div();
                if let Some(&iv) = body.args.first() {
                    self.info.insert(iv, AxisInfo::constant(&[], gcd(lb, step)));
                }
                for &a in body.args.iter().skip(1) {
                    self.info.insert(a, AxisInfo::unknown(&shape(a)));
                }
                self.region(func, body);
                return;
            }
            OpKind::If | OpKind::While => {
                for r in &op.regions {
                    for &a in &r.args {
                        self.info.insert(a, AxisInfo::unknown(&shape(a)));
                    }
                    self.region(func, r);
                }
                return;
            }
            _ => {}
        }
        let Some(&res) = op.results.first() else {
            return;
        };
        let rs = shape(res);
        let get = |s: &Self, i: usize| s.get(func, op.operands[i]);
        let info = match &op.kind {
            OpKind::Const(c) => {
                let div = match c {
                    ConstValue::Int(x) => pow2_div(*x),
                    _ => 1,
                };
                AxisInfo::constant(&rs, div)
            }
            OpKind::Arange { start, end } => AxisInfo {
                contiguity: vec![(end - start) as u64],
                divisibility: vec![pow2_div(*start)],
                constancy: vec![1],
            },
            OpKind::Splat => AxisInfo::constant(&rs, get(self, 0).scalar_div()),
            OpKind::ExpandDims { axis } => {
                let s = get(self, 0);
                let mut out = s.clone();
                let axis = *axis as usize;
                if shape(op.operands[0]).is_empty() {
                    out = AxisInfo::constant(&rs, s.scalar_div());
                } else {
                    // Along the new axis every element starts a run, so its divisibility
                    // must hold for every element: only when no dimension has runs of
                    // consecutive values (`n0 + arange` is not a multiple of `n0`'s).
                    let every = if s.contiguity.iter().all(|&c| c == 1) {
                        s.scalar_div()
                    } else {
                        1
                    };
                    out.contiguity.insert(axis, 1);
                    out.divisibility.insert(axis, every);
                    out.constancy.insert(axis, 1);
                }
                out
            }
            OpKind::Broadcast => {
                let s = get(self, 0);
                let src = shape(op.operands[0]);
                let mut out = s.clone();
                for d in 0..rs.len() {
                    if src[d] == 1 && rs[d] != 1 {
                        out.contiguity[d] = 1;
                        out.constancy[d] = rs[d] as u64;
                    }
                }
                out
            }
            OpKind::Binary(b) => {
                let (x, y) = (get(self, 0), get(self, 1));
                let n = x.contiguity.len();
                let mut out = AxisInfo::unknown(&rs);
                for d in 0..n {
                    let cst = gcd(x.constancy[d], y.constancy[d]);
                    out.constancy[d] = cst;
                    match b {
                        BinaryOp::Add | BinaryOp::Sub => {
                            let c1 = gcd(x.contiguity[d], y.constancy[d]);
                            let c2 = if *b == BinaryOp::Add {
                                gcd(y.contiguity[d], x.constancy[d])
                            } else {
                                1
                            };
                            out.contiguity[d] = c1.max(c2);
                            out.divisibility[d] = gcd(x.divisibility[d], y.divisibility[d]);
                        }
                        BinaryOp::Mul => {
                            out.divisibility[d] =
                                (x.divisibility[d].saturating_mul(y.divisibility[d])).min(MAX_DIV);
                        }
                        BinaryOp::And | BinaryOp::Or => {}
                        _ => {}
                    }
                }
                out
            }
            OpKind::AddPtr => {
                let (x, y) = (get(self, 0), get(self, 1));
                let esz = match func.ty(op.operands[0]).elem {
                    Elem::Ptr { pointee, .. } => pointee.size_bytes() as u64,
                    Elem::Scalar(_) => 1,
                };
                let n = x.contiguity.len();
                let mut out = AxisInfo::unknown(&rs);
                for d in 0..n {
                    out.constancy[d] = gcd(x.constancy[d], y.constancy[d]);
                    out.contiguity[d] = gcd(x.constancy[d], y.contiguity[d])
                        .max(gcd(x.contiguity[d], y.constancy[d]));
                    out.divisibility[d] = gcd(
                        x.divisibility[d],
                        y.divisibility[d].saturating_mul(esz).min(MAX_DIV),
                    );
                }
                out
            }
            OpKind::Cmp(p) => {
                let (x, y) = (get(self, 0), get(self, 1));
                let n = x.contiguity.len();
                let mut out = AxisInfo::unknown(&rs);
                for d in 0..n {
                    let mut cst = gcd(x.constancy[d], y.constancy[d]);
                    // A run of consecutive values starting at a multiple of `g`,
                    // compared (`<`, `>=`) with a constant multiple of `g`, does not
                    // straddle it.
                    let run = |c: &AxisInfo, k: &AxisInfo| {
                        gcd(
                            gcd(c.contiguity[d], k.constancy[d]),
                            gcd(c.divisibility[d], k.divisibility[d]),
                        )
                    };
                    match p {
                        CmpPred::Lt | CmpPred::Ge => cst = cst.max(run(&x, &y)),
                        CmpPred::Gt | CmpPred::Le => cst = cst.max(run(&y, &x)),
                        _ => {}
                    }
                    out.constancy[d] = cst;
                }
                out
            }
            OpKind::Select => {
                let (c, x, y) = (get(self, 0), get(self, 1), get(self, 2));
                let mut out = AxisInfo::unknown(&rs);
                for d in 0..out.constancy.len() {
                    out.constancy[d] = gcd(c.constancy[d], gcd(x.constancy[d], y.constancy[d]));
                }
                out
            }
            OpKind::Reshape | OpKind::Permute { .. } | OpKind::Cast | OpKind::Bitcast => {
                // Conservative, except that a constant stays constant.
                let s = get(self, 0);
                let src = shape(op.operands[0]);
                let all_const = dims_of(&src) == s.constancy;
                if all_const {
                    AxisInfo::constant(&rs, s.scalar_div())
                } else {
                    AxisInfo::unknown(&rs)
                }
            }
            OpKind::Hint { kind, values } => {
                // The analysis's own facts and the promise: each is a fact, so the
                // larger holds.
                let mut s = get(self, 0);
                let dims = dims_of(&rs);
                for (d, &v) in values.iter().enumerate().take(dims.len()) {
                    let v = pow2_div(v as i64);
                    let field = match kind {
                        HintKind::MultipleOf => &mut s.divisibility[d],
                        HintKind::MaxContiguous => &mut s.contiguity[d],
                        HintKind::MaxConstancy => &mut s.constancy[d],
                    };
                    let cap = if *kind == HintKind::MultipleOf {
                        MAX_DIV
                    } else {
                        dims[d]
                    };
                    *field = (*field).max(v.min(cap));
                }
                s
            }
            OpKind::RemotePtr => {
                // Same offset in another heap; heap bases are `HEAP_ALIGN`-aligned.
                let mut s = get(self, 0);
                for d in s.divisibility.iter_mut() {
                    *d = (*d).min(crate::comm::HEAP_ALIGN);
                }
                s
            }
            _ => AxisInfo::unknown(&rs),
        };
        self.info.insert(res, info);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::ir::ParamAttrs;
    use tessera_ir::{FunctionBuilder, ScalarType, Span, Type};

    #[test]
    fn vector_add_offsets_are_contiguous() {
        let sp = Span::unknown;
        let mut b = FunctionBuilder::new("k", sp());
        let x = b.param(
            "x",
            Type::global_ptr(ScalarType::F32),
            ParamAttrs::default(),
        );
        let n = b.param(
            "n",
            Type::scalar(ScalarType::I32),
            ParamAttrs {
                readonly: false,
                divisibility: Some(16),
                within_2gib: false,
                tensor_map: false,
                ..ParamAttrs::default()
            },
        );
        let pid = b
            .op1(OpKind::ProgramId { axis: 0 }, &[], None, sp())
            .unwrap();
        let c = b.const_i32(1024, sp()).unwrap();
        let base = b
            .op1(OpKind::Binary(BinaryOp::Mul), &[pid, c], None, sp())
            .unwrap();
        let ar = b
            .op1(
                OpKind::Arange {
                    start: 0,
                    end: 1024,
                },
                &[],
                None,
                sp(),
            )
            .unwrap();
        let t = Type::tile(ScalarType::I32, &[1024]);
        let bs = b.op1(OpKind::Splat, &[base], Some(&t), sp()).unwrap();
        let offs = b
            .op1(OpKind::Binary(BinaryOp::Add), &[bs, ar], None, sp())
            .unwrap();
        let ns = b.op1(OpKind::Splat, &[n], Some(&t), sp()).unwrap();
        let mask = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[offs, ns], None, sp())
            .unwrap();
        let pt = Type::tile(ScalarType::F32, &[1024]).with_elem(func_ptr());
        let xs = b.op1(OpKind::Splat, &[x], Some(&pt), sp()).unwrap();
        let p = b.op1(OpKind::AddPtr, &[xs, offs], None, sp()).unwrap();
        let f = b.finish();
        let a = AxisAnalysis::run(&f);
        let po = a.get(&f, offs);
        assert_eq!(po.contiguity, vec![1024]);
        assert_eq!(po.divisibility, vec![1024]);
        let pp = a.get(&f, p);
        assert_eq!(pp.contiguity, vec![1024]);
        assert_eq!(pp.divisibility, vec![16]);
        assert_eq!(a.get(&f, mask).constancy, vec![16]);
    }

    /// A causal mask `rows >= cols` (attention): `cols = 64 * pid + arange(64)` put
    /// along a new row axis is not a multiple of 64 in every element, so the mask is
    /// not constant along the rows. A divisibility of 64 there (that of `cols`' run
    /// starts) once claimed runs of 64 equal rows.
    #[test]
    fn an_expanded_range_has_no_divisibility_along_the_new_axis() {
        let sp = Span::unknown;
        let mut b = FunctionBuilder::new("k", sp());
        let pid = b
            .op1(OpKind::ProgramId { axis: 0 }, &[], None, sp())
            .unwrap();
        let range = |b: &mut FunctionBuilder, n: i64| {
            let c = b.const_i32(n as i32, sp()).unwrap();
            let base = b
                .op1(OpKind::Binary(BinaryOp::Mul), &[pid, c], None, sp())
                .unwrap();
            let t = Type::tile(ScalarType::I32, &[n as u32]);
            let bs = b.op1(OpKind::Splat, &[base], Some(&t), sp()).unwrap();
            let ar = b
                .op1(OpKind::Arange { start: 0, end: n }, &[], None, sp())
                .unwrap();
            b.op1(OpKind::Binary(BinaryOp::Add), &[bs, ar], None, sp())
                .unwrap()
        };
        let (r, c) = (range(&mut b, 128), range(&mut b, 64));
        let rows = b
            .op1(OpKind::ExpandDims { axis: 1 }, &[r], None, sp())
            .unwrap();
        let cols = b
            .op1(OpKind::ExpandDims { axis: 0 }, &[c], None, sp())
            .unwrap();
        let t = Type::tile(ScalarType::I32, &[128, 64]);
        let rows = b.op1(OpKind::Broadcast, &[rows], Some(&t), sp()).unwrap();
        let cols = b.op1(OpKind::Broadcast, &[cols], Some(&t), sp()).unwrap();
        let mask = b
            .op1(OpKind::Cmp(CmpPred::Ge), &[rows, cols], None, sp())
            .unwrap();
        let f = b.finish();
        let a = AxisAnalysis::run(&f);
        assert_eq!(a.get(&f, cols).divisibility, vec![1, 64]);
        assert_eq!(a.get(&f, rows).divisibility, vec![128, 1]);
        assert_eq!(a.get(&f, mask).constancy, vec![1, 1]);
    }

    fn func_ptr() -> Elem {
        Elem::Ptr {
            pointee: ScalarType::F32,
            space: tessera_ir::AddrSpace::Global,
        }
    }
}

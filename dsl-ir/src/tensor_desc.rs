//! Tensor descriptors: [`expand`] rewrites `desc_load`/`desc_store` into the masked
//! `load`/`store` with the same semantics, for targets without a tensor-memory
//! accelerator (and for the ones a TMA lowering cannot take).
//!
//! A block of shape `[b_0, .., b_R-1]` at coordinates `c` of a tensor with extents
//! `n` and strides `s` (the innermost 1) becomes, per dimension `d`,
//! `x_d = c_d + arange(b_d)` (expanded to rank `R`, size 1 elsewhere), pointers
//! `base + Σ x_d s_d` and the mask `⋀ 0 <= x_d < n_d` (and the predicate, when the
//! pipeliner added one). The address arithmetic is the one a hand-written masked load
//! has, so the axis analysis proves the same contiguity (16-byte accesses when the
//! strides are multiples of 16) and the pipeliner and `cp.async` take it as usual.

use crate::ir::{BinaryOp, CmpPred, ConstValue, DescOperands, Function, Op, OpKind, Region};
use crate::types::{Elem, ScalarType, Type};
use crate::{Span, ValueId};

/// Rewrites every `desc_load` and `desc_store` of `f` that `keep` rejects into masked
/// memory ops (see the module docs); returns how many it rewrote. `keep` sees the
/// function as it is before any rewrite.
pub fn expand(f: &mut Function, keep: &dyn Fn(&Function, &Op) -> bool) -> usize {
    // Decided up front, in walk order (the order `expand_region` meets them).
    let mut kept = Vec::new();
    f.walk(&mut |op| {
        if is_desc(op) {
            kept.push(keep(f, op));
        }
    });
    let mut body = std::mem::take(&mut f.body);
    let mut next = kept.into_iter();
    let n = expand_region(f, &mut body, &mut next);
    f.body = body;
    n
}

/// The `desc_load` and `desc_store` ops of `f`.
pub fn count(f: &Function) -> usize {
    let mut n = 0;
    f.walk(&mut |op| n += is_desc(op) as usize);
    n
}

fn is_desc(op: &Op) -> bool {
    matches!(op.kind, OpKind::DescLoad { .. } | OpKind::DescStore { .. })
}

fn expand_region(f: &mut Function, r: &mut Region, kept: &mut impl Iterator<Item = bool>) -> usize {
    let mut n = 0;
    let mut out = Vec::with_capacity(r.ops.len());
    for mut op in std::mem::take(&mut r.ops) {
        for sub in &mut op.regions {
            n += expand_region(f, sub, kept);
        }
        if !is_desc(&op) || kept.next().unwrap_or(false) {
            out.push(op);
            continue;
        }
        let mut e = Emit {
            f,
            out: &mut out,
            span: op.span.clone(),
        };
        e.lower(&op);
        n += 1;
    }
    r.ops = out;
    n
}

struct Emit<'a> {
    f: &'a mut Function,
    out: &'a mut Vec<Op>,
    span: Span,
}

impl Emit<'_> {
    fn op(&mut self, kind: OpKind, operands: Vec<ValueId>, ty: Option<Type>) -> Option<ValueId> {
        let results: Vec<ValueId> = ty.into_iter().map(|t| self.f.new_value(t)).collect();
        let v = results.first().copied();
        self.out.push(Op {
            kind,
            operands,
            results,
            regions: Vec::new(),
            span: self.span.clone(),
        });
        v
    }

    fn val(&mut self, kind: OpKind, operands: Vec<ValueId>, ty: Type) -> ValueId {
        self.op(kind, operands, Some(ty)).expect("one result")
    }

    /// `v` splatted or broadcast to `shape`.
    fn shaped(&mut self, v: ValueId, shape: &[u32]) -> ValueId {
        let t = self.f.ty(v).clone();
        if t.shape == shape {
            return v;
        }
        let kind = if t.is_scalar() {
            OpKind::Splat
        } else {
            OpKind::Broadcast
        };
        self.val(kind, vec![v], t.with_shape(shape))
    }

    fn binary(&mut self, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
        let t = self.f.ty(x).clone();
        let y = self.shaped(y, &t.shape);
        self.val(OpKind::Binary(b), vec![x, y], t)
    }

    fn cmp(&mut self, p: CmpPred, x: ValueId, y: ValueId) -> ValueId {
        let t = self.f.ty(x).clone();
        let y = self.shaped(y, &t.shape);
        let bt = Type::tile(ScalarType::I1, &t.shape);
        self.val(OpKind::Cmp(p), vec![x, y], bt)
    }

    fn lower(&mut self, op: &Op) {
        let (rank, block, store) = match op.kind {
            OpKind::DescLoad { rank, .. } => (rank, self.f.ty(op.results[0]).shape.clone(), false),
            OpKind::DescStore { rank } => {
                let d = DescOperands {
                    rank: rank as usize,
                };
                (rank, self.f.ty(op.operands[d.extra()]).shape.clone(), true)
            }
            _ => unreachable!("a descriptor op"),
        };
        let d = DescOperands {
            rank: rank as usize,
        };
        let i32t = Type::scalar(ScalarType::I32);
        let zero = self.val(OpKind::Const(ConstValue::Int(0)), vec![], i32t);
        let mut offs: Option<ValueId> = None;
        let mut mask: Option<ValueId> = None;
        for i in 0..d.rank {
            // x_i = c_i + arange(b_i), shaped [1, .., b_i, .., 1].
            let ar = self.val(
                OpKind::Arange {
                    start: 0,
                    end: block[i] as i64,
                },
                vec![],
                Type::tile(ScalarType::I32, &[block[i]]),
            );
            let mut x = self.binary(BinaryOp::Add, ar, op.operands[d.coord(i)]);
            let mut shape = vec![block[i]];
            for axis in 0..d.rank {
                if axis == i {
                    continue;
                }
                shape.insert(axis, 1);
                let t = Type::tile(ScalarType::I32, &shape);
                x = self.val(OpKind::ExpandDims { axis: axis as u8 }, vec![x], t);
            }
            let lo = self.cmp(CmpPred::Ge, x, zero);
            let hi = self.cmp(CmpPred::Lt, x, op.operands[d.shape(i)]);
            let inside = self.binary(BinaryOp::And, lo, hi);
            let inside = self.shaped(inside, &block);
            let off = if i + 1 < d.rank {
                self.binary(BinaryOp::Mul, x, op.operands[d.stride(i)])
            } else {
                x
            };
            let off = self.shaped(off, &block);
            offs = Some(match offs {
                Some(o) => self.binary(BinaryOp::Add, o, off),
                None => off,
            });
            mask = Some(match mask {
                Some(m) => self.binary(BinaryOp::And, m, inside),
                None => inside,
            });
        }
        let (Some(offs), Some(mut mask)) = (offs, mask) else {
            unreachable!("rank >= 1")
        };
        if matches!(op.kind, OpKind::DescLoad { has_pred: true, .. }) {
            mask = self.binary(BinaryOp::And, mask, op.operands[d.extra()]);
        }
        let base = op.operands[DescOperands::BASE];
        let bt = self.f.ty(base).clone();
        let ptrs = self.shaped(base, &block);
        debug_assert!(matches!(bt.elem, Elem::Ptr { .. }));
        let ptrs = self.val(OpKind::AddPtr, vec![ptrs, offs], bt.with_shape(&block));
        if store {
            self.op(
                OpKind::Store { has_mask: true },
                vec![ptrs, op.operands[d.extra()], mask],
                None,
            );
        } else {
            self.out.push(Op {
                kind: OpKind::Load {
                    has_mask: true,
                    has_other: false,
                },
                operands: vec![ptrs, mask],
                results: op.results.clone(),
                regions: Vec::new(),
                span: self.span.clone(),
            });
        }
    }
}

/// How a TMA target copies one block of a descriptor whose elements are
/// `elem_bytes` wide: `copies` boxes of `box_dims` (outermost first) side by side
/// along the innermost dimension, each written to shared memory as `rows x S` bytes
/// (`S = swizzle_bytes`, one box row) with the hardware's `S`-byte swizzle, the boxes
/// one after the other. That is the column-blocked, swizzled layout the `wgmma`
/// operand arrays use, so a block lands where the matrix instructions read it. The
/// runtime builds the tensor map from the same rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaBox {
    /// The box, outermost dimension first (the innermost is `S / elem_bytes`).
    pub box_dims: Vec<u32>,
    /// The swizzle span `S`: 32, 64 or 128 bytes.
    pub swizzle_bytes: u32,
    /// Boxes per block along the innermost dimension.
    pub copies: u32,
}

impl TmaBox {
    /// The rule (see the type's docs) for blocks of shape `block`, or `None` when TMA
    /// cannot copy them so: elements of 1, 2 or 4 bytes, rows of at least 32 bytes,
    /// box dimensions of at most 256.
    pub fn for_block(elem_bytes: u32, block: &[u32]) -> Option<TmaBox> {
        let (&inner, outer) = block.split_last()?;
        if !matches!(elem_bytes, 1 | 2 | 4) || block.iter().any(|&b| b == 0 || !b.is_power_of_two())
        {
            return None;
        }
        let row = inner * elem_bytes;
        if row < 32 {
            return None;
        }
        let s = row.min(128);
        let mut box_dims = outer.to_vec();
        box_dims.push(s / elem_bytes);
        if box_dims.iter().any(|&b| b > 256) {
            return None;
        }
        Some(TmaBox {
            box_dims,
            swizzle_bytes: s,
            copies: row / s,
        })
    }

    /// Bytes one box writes.
    pub fn box_bytes(&self, elem_bytes: u32) -> u32 {
        self.box_dims.iter().product::<u32>() * elem_bytes
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dsl::*;
    use crate::interp::{self, HostBuffer, KernelArg, Scalar};

    /// Block `(i, j)` of `dst` gets block `(i - 3, j - 5)` of `src`.
    fn kernel() -> Function {
        let f = trace("k", Span::new("t.rs", 1, 1), |p| {
            let s = p.tensor_desc::<f32, S2<8, 16>>("s", true);
            let mut d = p.tensor_desc::<f32, S2<8, 16>>("d", false);
            let i = program_id(0) * 8;
            let j = program_id(1) * 16;
            d.store([i, j], s.load([i - 3, j - 5]));
        })
        .expect("builds");
        crate::verify::verify(&f).expect("verifies");
        f
    }

    fn run(f: &Function, src: &[f32], m: i32, n: i32, ld: i32) -> Vec<f32> {
        let s = Arc::new(HostBuffer::from_slice(src));
        let d = Arc::new(HostBuffer::from_slice(&vec![f32::NAN; src.len()]));
        let sc = |v: i32| KernelArg::Scalar(Scalar::I32(v));
        let args = [
            KernelArg::Buffer(s.clone()),
            KernelArg::Scalar(Scalar::U64(0)),
            sc(m),
            sc(n),
            sc(ld),
            KernelArg::Buffer(d.clone()),
            KernelArg::Scalar(Scalar::U64(0)),
            sc(m),
            sc(n),
            sc(ld),
        ];
        let grid = [(m as u32).div_ceil(8), (n as u32).div_ceil(16), 1];
        interp::run(f, grid, &args).expect("runs");
        d.to_vec().expect("f32")
    }

    #[test]
    fn expansion_matches_the_interpreter_and_round_trips() {
        let f = kernel();
        let text = crate::printer::print_function(&f);
        assert!(text.contains("desc_load rank=2") && text.contains("desc_store rank=2"));
        let back = crate::parser::parse_function(&text).expect("parses");
        assert_eq!(crate::printer::print_function(&back), text);
        let mut g = f.clone();
        assert_eq!(expand(&mut g, &|_, _| false), 2);
        assert_eq!(count(&g), 0);
        crate::verify::verify(&g).expect("the expansion verifies");
        let (m, n, ld) = (21, 37, 40);
        let src: Vec<f32> = (0..m * ld).map(|v| v as f32 * 0.5 - 7.0).collect();
        let (a, b) = (run(&f, &src, m, n, ld), run(&g, &src, m, n, ld));
        for r in 0..m as usize {
            for c in 0..ld as usize {
                let (x, y) = (a[r * ld as usize + c], b[r * ld as usize + c]);
                if c >= n as usize {
                    assert!(x.is_nan() && y.is_nan(), "({r}, {c}) written outside");
                    continue;
                }
                let want = if r >= 3 && c >= 5 {
                    src[(r - 3) * ld as usize + c - 5]
                } else {
                    0.0
                };
                assert_eq!((x, y), (want, want), "({r}, {c})");
            }
        }
        // Keeping them keeps them.
        let mut h = f.clone();
        assert_eq!(expand(&mut h, &|_, _| true), 0);
        assert_eq!(h, f);
    }

    #[test]
    fn the_tma_box_rule() {
        let b = TmaBox::for_block(2, &[128, 64]).expect("a box");
        assert_eq!(
            (b.box_dims, b.swizzle_bytes, b.copies),
            (vec![128, 64], 128, 1)
        );
        let b = TmaBox::for_block(2, &[64, 128]).expect("a box");
        assert_eq!(
            (b.box_dims, b.swizzle_bytes, b.copies),
            (vec![64, 64], 128, 2)
        );
        let b = TmaBox::for_block(1, &[64, 32]).expect("a box");
        assert_eq!(
            (b.box_dims.clone(), b.swizzle_bytes, b.copies),
            (vec![64, 32], 32, 1)
        );
        assert_eq!(b.box_bytes(1), 2048);
        assert!(TmaBox::for_block(2, &[64, 8]).is_none(), "16-byte rows");
        assert!(TmaBox::for_block(2, &[512, 64]).is_none(), "512 rows");
        assert!(TmaBox::for_block(8, &[8, 8]).is_none(), "8-byte elements");
    }
}

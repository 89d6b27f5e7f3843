//! [`Net`]: raw IR emission over tiles of one shape, for the ops the front-end builds
//! from networks of steps through block-local memory (sorting, reductions and scans
//! with a user combine, batched `dot`).

use super::ops::broadcast_value;
use super::{LitValue, emit0, emit1, literal_tile, with_builder};
use crate::ir::{BinaryOp, CmpPred, OpKind, Span, UnaryOp, ValueId};
use crate::types::{AddrSpace, Elem, ScalarType, Type};

/// Emits ops on tiles of shape `dims`, each at `span`.
pub(super) struct Net<'a> {
    pub(super) dims: Vec<u32>,
    pub(super) span: &'a Span,
}

impl Net<'_> {
    pub(super) fn ty(&self, s: ScalarType) -> Type {
        Type::tile(s, &self.dims)
    }

    /// An `i32` constant of the shape.
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

    pub(super) fn and(&self, a: ValueId, b: ValueId) -> ValueId {
        self.bin(BinaryOp::And, a, b, ScalarType::I1)
    }

    pub(super) fn or(&self, a: ValueId, b: ValueId) -> ValueId {
        self.bin(BinaryOp::Or, a, b, ScalarType::I1)
    }

    pub(super) fn not(&self, a: ValueId) -> ValueId {
        let t = self.ty(ScalarType::I1);
        emit1(
            OpKind::Unary(UnaryOp::Not),
            &[a],
            None,
            t,
            self.span.clone(),
        )
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
        let t = Type::tile(ScalarType::I32, &shape);
        let r = emit1(
            OpKind::Reshape,
            &[a],
            Some(&t),
            t.clone(),
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

    /// `Σ index(d) · strides[d]` over the dimensions (a scalar 0 for rank 0).
    pub(super) fn positions(&self, strides: &[i64]) -> ValueId {
        let mut pos = self.i32(0);
        for (d, &st) in strides.iter().enumerate().take(self.dims.len()) {
            let term = self.bin(BinaryOp::Mul, self.index(d), self.i32(st), ScalarType::I32);
            pos = self.bin(BinaryOp::Add, pos, term, ScalarType::I32);
        }
        pos
    }

    /// The flat row-major position of every element.
    pub(super) fn flat(&self) -> ValueId {
        self.positions(&self.strides())
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
        let kind = OpKind::LocalAlloc { len };
        emit1(kind, &[], Some(&ty), ty.clone(), self.span.clone())
    }

    /// `base + offs`, splatting the base over the shape.
    pub(super) fn ptrs(&self, base: ValueId, offs: ValueId) -> ValueId {
        let b = broadcast_value(base, &self.dims, self.span);
        let ty = with_builder(|bd| bd.ty(b).clone());
        emit1(OpKind::AddPtr, &[b, offs], None, ty, self.span.clone())
    }

    /// `base[offs] = v` (`offs` and `v` of the shape).
    pub(super) fn store(&self, base: ValueId, offs: ValueId, v: ValueId) {
        let p = self.ptrs(base, offs);
        emit0(
            OpKind::Store { has_mask: false },
            &[p, v],
            self.span.clone(),
        );
    }

    /// `base[offs]` of element type `s` (`offs` of the shape).
    pub(super) fn load(&self, base: ValueId, offs: ValueId, s: ScalarType) -> ValueId {
        let p = self.ptrs(base, offs);
        let kind = OpKind::Load {
            has_mask: false,
            has_other: false,
        };
        emit1(kind, &[p], None, self.ty(s), self.span.clone())
    }

    pub(super) fn barrier(&self) {
        emit0(OpKind::Barrier, &[], self.span.clone());
    }

    /// Every part stored to its array at `pos` (of this shape), then (after a barrier)
    /// read back by `reader` at `from`; a second barrier lets the arrays be written
    /// again.
    pub(super) fn exchange(
        &self,
        arrays: &[ValueId],
        parts: &[(ValueId, ScalarType)],
        pos: ValueId,
        reader: &Net<'_>,
        from: ValueId,
    ) -> Vec<ValueId> {
        for (&a, &(v, _)) in arrays.iter().zip(parts) {
            self.store(a, pos, v);
        }
        self.barrier();
        let got = arrays
            .iter()
            .zip(parts)
            .map(|(&a, &(_, s))| reader.load(a, from, s))
            .collect();
        self.barrier();
        got
    }
}

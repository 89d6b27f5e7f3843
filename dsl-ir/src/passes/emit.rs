//! Building ops at one span inside a pass: each op's result types inferred from its
//! operands, as the tracer does.

use crate::infer::infer_result_types;
use crate::ir::{BinaryOp, ConstValue, Function, Op, OpKind, Span, ValueId};
use crate::types::{ScalarType, Type};

/// Appends ops at one span.
pub(crate) struct Emit<'f> {
    /// The function whose values the ops define.
    pub(crate) f: &'f mut Function,
    /// The ops built so far.
    pub(crate) ops: Vec<Op>,
    /// Their span.
    pub(crate) span: Span,
}

impl Emit<'_> {
    /// An op of `kind` on `operands` (result types inferred, `hint` for those the
    /// operands do not give); its results.
    pub(crate) fn op(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        hint: Option<&Type>,
    ) -> Result<Vec<ValueId>, String> {
        let tys: Vec<&Type> = operands.iter().map(|&v| self.f.ty(v)).collect();
        let results: Vec<ValueId> = infer_result_types(&kind, &tys, hint)?
            .into_iter()
            .map(|t| self.f.new_value(t))
            .collect();
        self.ops.push(Op {
            kind,
            operands: operands.to_vec(),
            results: results.clone(),
            regions: Vec::new(),
            span: self.span.clone(),
        });
        Ok(results)
    }

    /// [`Emit::op`] of an op with one result.
    pub(crate) fn op1(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        hint: Option<&Type>,
    ) -> Result<ValueId, String> {
        match self.op(kind, operands, hint)?.as_slice() {
            [v] => Ok(*v),
            _ => Err("internal: expected one result".into()),
        }
    }

    /// A `yield` of nothing.
    pub(crate) fn yield_op(&self) -> Op {
        Op {
            kind: OpKind::Yield,
            operands: Vec::new(),
            results: Vec::new(),
            regions: Vec::new(),
            span: self.span.clone(),
        }
    }

    /// The integer constant `v` of type `s`, splat to `shape`.
    pub(crate) fn int(&mut self, s: ScalarType, shape: &[u32], v: i64) -> Result<ValueId, String> {
        let t = Type::scalar(s).with_shape(shape);
        self.op1(OpKind::Const(ConstValue::Int(v)), &[], Some(&t))
    }

    /// `a op b`.
    pub(crate) fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> Result<ValueId, String> {
        self.op1(OpKind::Binary(op), &[a, b], None)
    }

    /// `v` converted to `to` elementwise.
    pub(crate) fn cast(&mut self, v: ValueId, to: ScalarType) -> Result<ValueId, String> {
        let t = self.f.ty(v).clone();
        let t = Type::scalar(to).with_shape(&t.shape);
        self.op1(OpKind::Cast, &[v], Some(&t))
    }
}

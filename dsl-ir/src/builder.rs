//! An untyped builder of [`Function`]s: appends ops to the innermost open region and
//! computes their result types with [`crate::infer`].
//!
//! The typed front-end (`tessera_ir::dsl`) and hand-written tests both build IR through
//! this; it rejects ill-typed ops immediately with a [`BuildError`] carrying the span.

use crate::infer::infer_result_types;
use crate::ir::{ConstValue, Function, Op, OpKind, Param, ParamAttrs, Region, Span, ValueId};
use crate::types::{ScalarType, Type};

/// An op the builder refused, with the user's source location.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{span}: {message}")]
pub struct BuildError {
    /// What is wrong.
    pub message: String,
    /// Where.
    pub span: Span,
}

impl BuildError {
    /// Builds an error.
    pub fn new(span: Span, message: impl Into<String>) -> BuildError {
        BuildError {
            message: message.into(),
            span,
        }
    }
}

/// Builds one kernel function op by op.
#[derive(Debug)]
pub struct FunctionBuilder {
    func: Function,
    /// Open regions; the body is at the bottom.
    stack: Vec<Region>,
}

impl FunctionBuilder {
    /// Starts a kernel named `name` defined at `span`.
    pub fn new(name: impl Into<String>, span: Span) -> FunctionBuilder {
        FunctionBuilder {
            func: Function::new(name, span),
            stack: vec![Region::default()],
        }
    }

    /// The function built so far (the open regions are not in its body yet).
    pub fn func(&self) -> &Function {
        &self.func
    }

    /// The type of a value.
    pub fn ty(&self, v: ValueId) -> &Type {
        self.func.ty(v)
    }

    /// Adds a parameter.
    pub fn param(&mut self, name: impl Into<String>, ty: Type, attrs: ParamAttrs) -> ValueId {
        let name = name.into();
        let v = self.func.new_value(ty);
        self.func.values[v.index()].name = Some(name.clone());
        self.func.params.push(Param {
            name,
            value: v,
            attrs,
        });
        v
    }

    /// Appends an op whose result types follow from its operands (all ops without
    /// regions). `result_hint` is needed by `const`, `splat`, `broadcast`, `reshape`
    /// and `cast` (see [`infer_result_types`]).
    pub fn op(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        result_hint: Option<&Type>,
        span: Span,
    ) -> Result<Vec<ValueId>, BuildError> {
        let tys: Vec<&Type> = operands.iter().map(|&v| self.func.ty(v)).collect();
        let results = infer_result_types(&kind, &tys, result_hint)
            .map_err(|m| BuildError::new(span.clone(), m))?;
        Ok(self.push_op(kind, operands.to_vec(), results, Vec::new(), span))
    }

    /// Like [`FunctionBuilder::op`] for an op with exactly one result.
    pub fn op1(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        result_hint: Option<&Type>,
        span: Span,
    ) -> Result<ValueId, BuildError> {
        let r = self.op(kind, operands, result_hint, span.clone())?;
        match r.as_slice() {
            [v] => Ok(*v),
            _ => Err(BuildError::new(span, "op does not have exactly one result")),
        }
    }

    /// A constant of type `ty` (a scalar or a splatted tile).
    pub fn constant(&mut self, c: ConstValue, ty: Type, span: Span) -> Result<ValueId, BuildError> {
        self.op1(OpKind::Const(c), &[], Some(&ty), span)
    }

    /// Appends an op with explicit result types and regions, unchecked (the verifier
    /// checks it). Used for `for`, `if`, `while` and terminators.
    pub fn push_op(
        &mut self,
        kind: OpKind,
        operands: Vec<ValueId>,
        result_types: Vec<Type>,
        regions: Vec<Region>,
        span: Span,
    ) -> Vec<ValueId> {
        let results: Vec<ValueId> = result_types
            .into_iter()
            .map(|t| self.func.new_value(t))
            .collect();
        let op = Op {
            kind,
            operands,
            results: results.clone(),
            regions,
            span,
        };
        self.stack
            .last_mut()
            .expect("the body region is always open")
            .ops
            .push(op);
        results
    }

    /// Opens a nested region whose arguments have `arg_types`; returns the arguments.
    /// Ops appended until [`FunctionBuilder::close_region`] go into it.
    pub fn open_region(&mut self, arg_types: &[Type]) -> Vec<ValueId> {
        let args: Vec<ValueId> = arg_types
            .iter()
            .map(|t| self.func.new_value(t.clone()))
            .collect();
        self.stack.push(Region {
            args: args.clone(),
            ops: Vec::new(),
        });
        args
    }

    /// Closes the innermost region opened by [`FunctionBuilder::open_region`].
    pub fn close_region(&mut self) -> Region {
        assert!(self.stack.len() > 1, "close_region without open_region");
        self.stack.pop().expect("checked above")
    }

    /// Depth of open nested regions (0 in the kernel body).
    pub fn depth(&self) -> usize {
        self.stack.len() - 1
    }

    /// Finishes the kernel. Panics if a nested region is still open (a builder bug).
    pub fn finish(mut self) -> Function {
        assert_eq!(self.stack.len(), 1, "unclosed regions at finish");
        self.func.body = self.stack.pop().expect("body");
        self.func
    }

    /// A value with no defining op, standing in for an op that failed to build so
    /// that tracing can continue; the function is discarded with the error.
    pub fn push_placeholder(&mut self, ty: Type) -> ValueId {
        self.func.new_value(ty)
    }

    /// Scalar `i32` constant, a common helper.
    pub fn const_i32(&mut self, v: i32, span: Span) -> Result<ValueId, BuildError> {
        self.constant(
            ConstValue::Int(v as i64),
            Type::scalar(ScalarType::I32),
            span,
        )
    }
}

//! Helpers shared by the passes' tests, and the tests of [`optimize`] and
//! [`replace_all_uses`].

use super::*;
use crate::builder::FunctionBuilder;
use crate::ir::{BinaryOp, ConstValue, Op, OpKind, ParamAttrs, Span};
use crate::types::{ScalarType, Type};
use crate::verify::verify;

pub(super) fn sp() -> Span {
    Span::new("p.rs", 1, 1)
}

pub(super) fn st(s: ScalarType) -> Type {
    Type::scalar(s)
}

pub(super) fn c(b: &mut FunctionBuilder, v: ConstValue, s: ScalarType) -> ValueId {
    b.constant(v, st(s), sp()).unwrap()
}

pub(super) fn bin(b: &mut FunctionBuilder, op: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
    b.op1(OpKind::Binary(op), &[x, y], None, sp()).unwrap()
}

/// Stores scalar `v` through a fresh pointer parameter, keeping it alive.
pub(super) fn sink(b: &mut FunctionBuilder, v: ValueId) {
    let s = b.ty(v).scalar_type().unwrap();
    let n = b.func().params.len();
    let p = b.param(
        format!("out{n}"),
        Type::global_ptr(s),
        ParamAttrs::default(),
    );
    b.op(OpKind::Store { has_mask: false }, &[p, v], None, sp())
        .unwrap();
}

/// The value operands of every store, in program order.
pub(super) fn stored(f: &Function) -> Vec<ValueId> {
    let mut out = Vec::new();
    f.walk(&mut |op| {
        if let OpKind::Store { .. } = op.kind {
            out.push(op.operands[1]);
        }
    });
    out
}

pub(super) fn def_of(f: &Function, v: ValueId) -> Option<Op> {
    let mut d = None;
    f.walk(&mut |op| {
        if op.results.contains(&v) {
            d = Some(op.clone());
        }
    });
    d
}

pub(super) fn const_of(f: &Function, v: ValueId) -> Option<ConstValue> {
    match def_of(f, v)?.kind {
        OpKind::Const(c) => Some(c),
        _ => None,
    }
}

pub(super) fn count(f: &Function, m: &str) -> usize {
    let mut n = 0;
    f.walk(&mut |op| n += (op.kind.mnemonic() == m) as usize);
    n
}

/// Optimizes, checks the result verifies and is a fixed point.
pub(super) fn opt(mut f: Function) -> Function {
    verify(&f).unwrap();
    optimize(&mut f);
    verify(&f).unwrap();
    // Debug text, as `PartialEq` on functions holding NaN constants is false.
    let before = format!("{f:?}");
    assert!(!canonicalize(&mut f) && !cse(&mut f) && !dce(&mut f));
    assert!(format!("{f:?}") == before, "not a fixed point");
    f
}

#[test]
fn replace_all_uses_rewrites_nested_operands() {
    let mut b = FunctionBuilder::new("k", sp());
    let x = b.param("x", st(ScalarType::I32), ParamAttrs::default());
    let y = b.param("y", st(ScalarType::I32), ParamAttrs::default());
    let c = b.param("c", st(ScalarType::I1), ParamAttrs::default());
    let mut arms = Vec::new();
    for _ in 0..2 {
        b.open_region(&[]);
        let s = bin(&mut b, BinaryOp::Add, x, x);
        sink(&mut b, s);
        b.push_op(OpKind::Yield, vec![], vec![], vec![], sp());
        arms.push(b.close_region());
    }
    b.push_op(OpKind::If, vec![c], vec![], arms, sp());
    let mut f = b.finish();
    assert_eq!(replace_all_uses(&mut f, x, y), 4);
    assert_eq!(replace_all_uses(&mut f, x, y), 0);
    verify(&f).unwrap();
}

#[test]
fn optimize_reaches_a_fixed_point() {
    // (x * (2 - 1)) + (x * (3 - 2)) - ((2*x) ... ) → x + x; dead copies go away.
    let mut b = FunctionBuilder::new("k", sp());
    let x = b.param("x", st(ScalarType::I64), ParamAttrs::default());
    let k = |b: &mut FunctionBuilder, v| c(b, ConstValue::Int(v), ScalarType::I64);
    let (one, two, three) = (k(&mut b, 1), k(&mut b, 2), k(&mut b, 3));
    let a = bin(&mut b, BinaryOp::Sub, two, one);
    let bb = bin(&mut b, BinaryOp::Sub, three, two);
    let xa = bin(&mut b, BinaryOp::Mul, x, a);
    let xb = bin(&mut b, BinaryOp::Mul, x, bb);
    let s = bin(&mut b, BinaryOp::Add, xa, xb);
    let d = bin(&mut b, BinaryOp::Sub, s, s);
    let r = bin(&mut b, BinaryOp::Add, s, d);
    sink(&mut b, r);
    let f = opt(b.finish());
    // const ops all dead; only `add x, x` and the store remain.
    assert_eq!(f.num_ops(), 2, "{:?}", f.body.ops);
    let add = def_of(&f, stored(&f)[0]).unwrap();
    assert_eq!(add.operands, vec![x, x]);
}

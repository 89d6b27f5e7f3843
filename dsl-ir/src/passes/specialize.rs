//! Specialization on launch facts (Triton's): parameters known to be 16-byte aligned
//! or multiples of 16, pointers into buffers under 2 GiB, integers equal to 1.

use crate::ir::{ConstValue, Function, Op, OpKind, ParamFacts};
use crate::types::{ScalarType, Type};

/// A copy of `func` specialized on launch facts, as Triton does: for each parameter whose
/// `divisible_by_16` is set, records that the pointer is 16-byte aligned or the
/// integer is a multiple of 16 ([`ParamAttrs::divisibility`](crate::ir::ParamAttrs::divisibility)), which lets codegen
/// prove wide, unmasked-per-vector memory accesses; for each pointer whose
/// `within_2gib` is set, records [`ParamAttrs::within_2gib`](crate::ir::ParamAttrs::within_2gib); for each integer
/// whose `equal_to_one` is set, records [`ParamAttrs::equal_to_one`](crate::ir::ParamAttrs::equal_to_one), makes every
/// use of it read a constant 1 and folds the body again ([`optimize`](super::optimize)),
/// so `i * stride` becomes `i`. Parameters declared
/// [`ParamAttrs::no_specialize`](crate::ir::ParamAttrs::no_specialize) get neither value fact. Facts past the parameter
/// list are ignored; float parameters are left alone.
pub fn specialize(func: &Function, facts: &[ParamFacts]) -> Function {
    let mut f = func.clone();
    let mut ones = Vec::new();
    for (p, fact) in f.params.iter_mut().zip(facts) {
        let ty = &func.values[p.value.index()].ty;
        let int = ty.scalar_type().is_some_and(|s| s.is_int()) && ty.shape.is_empty();
        let eligible = ty.elem.is_ptr() || int;
        let value_facts = !p.attrs.no_specialize;
        if fact.divisible_by_16 && eligible && value_facts {
            p.attrs.divisibility = Some(16);
        }
        if fact.equal_to_one && int && value_facts {
            p.attrs.equal_to_one = true;
            ones.push((p.value, ty.clone()));
        }
        if fact.within_2gib && ty.elem.is_ptr() {
            p.attrs.within_2gib = true;
        }
        if fact.tensor_map && *ty == Type::scalar(ScalarType::U64) {
            p.attrs.tensor_map = true;
        }
    }
    if ones.is_empty() {
        return f;
    }
    let span = f.span.clone();
    let mut defs = Vec::new();
    for (param, ty) in ones {
        let one = f.new_value(ty);
        super::replace_all_uses(&mut f, param, one);
        defs.push(Op {
            kind: OpKind::Const(ConstValue::Int(1)),
            operands: Vec::new(),
            results: vec![one],
            regions: Vec::new(),
            span: span.clone(),
        });
    }
    defs.append(&mut f.body.ops);
    f.body.ops = defs;
    super::optimize(&mut f);
    f
}

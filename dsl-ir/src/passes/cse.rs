//! Common-subexpression elimination: [`cse`] merges equal pure ops, scoped by region.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::resolve;
use crate::ir::{ConstValue, Function, OpKind, Region, ValueId};
use crate::types::Type;

/// Merges pure ops (see [`OpKind::is_pure`]) with equal kinds (constants compared
/// bit-exactly), operands and result types into the first one; returns whether
/// anything changed. Scoped by region: an op may reuse an equal op of its own region
/// that comes before it or of an enclosing region, never one of a sibling region.
/// Ops with side effects or regions (loads included) are never merged.
pub fn cse(f: &mut Function) -> bool {
    let mut cx = Cse {
        scopes: Vec::new(),
        map: HashMap::new(),
        changed: false,
    };
    let mut body = std::mem::take(&mut f.body);
    cx.region(f, &mut body);
    f.body = body;
    cx.changed
}

struct CseKey {
    kind: OpKind,
    operands: Vec<ValueId>,
    types: Vec<Type>,
}

impl PartialEq for CseKey {
    fn eq(&self, o: &Self) -> bool {
        let kinds = match (&self.kind, &o.kind) {
            (OpKind::Const(a), OpKind::Const(b)) => a.bit_eq(b),
            (a, b) => a == b,
        };
        kinds && self.operands == o.operands && self.types == o.types
    }
}

impl Eq for CseKey {}

impl Hash for CseKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.kind.mnemonic().hash(h);
        if let OpKind::Const(c) = &self.kind {
            match c {
                ConstValue::Bool(b) => b.hash(h),
                ConstValue::Int(i) => i.hash(h),
                ConstValue::Float(x) => x.to_bits().hash(h),
            }
        }
        self.operands.hash(h);
        self.types.hash(h);
    }
}

struct Cse {
    scopes: Vec<HashMap<CseKey, Vec<ValueId>>>,
    map: HashMap<ValueId, ValueId>,
    changed: bool,
}

impl Cse {
    fn region(&mut self, f: &Function, r: &mut Region) {
        self.scopes.push(HashMap::new());
        let ops = std::mem::take(&mut r.ops);
        let mut out = Vec::with_capacity(ops.len());
        for mut op in ops {
            for o in &mut op.operands {
                *o = resolve(&self.map, *o);
            }
            if op.kind.is_pure() && op.regions.is_empty() && !op.results.is_empty() {
                let key = CseKey {
                    kind: op.kind.clone(),
                    operands: op.operands.clone(),
                    types: op.results.iter().map(|&v| f.ty(v).clone()).collect(),
                };
                let found = self.scopes.iter().rev().find_map(|s| s.get(&key)).cloned();
                if let Some(prev) = found {
                    for (&res, p) in op.results.iter().zip(prev) {
                        self.map.insert(res, p);
                    }
                    self.changed = true;
                    continue;
                }
                self.scopes
                    .last_mut()
                    .expect("pushed above")
                    .insert(key, op.results.clone());
            }
            for sub in &mut op.regions {
                self.region(f, sub);
            }
            out.push(op);
        }
        r.ops = out;
        self.scopes.pop();
    }
}

#[cfg(test)]
mod tests {
    use crate::builder::FunctionBuilder;
    use crate::ir::{BinaryOp, ConstValue, OpKind, ParamAttrs};
    use crate::passes::tests::*;
    use crate::types::ScalarType;

    /// `x + x` at the top level, then in a `for` body (reuses the outer one), and in
    /// both arms of an `if` (each arm keeps its own, as they are siblings).
    #[test]
    fn cse_is_scoped_by_region() {
        let i32t = st(ScalarType::I32);
        let mut b = FunctionBuilder::new("k", sp());
        let x = b.param("x", i32t.clone(), ParamAttrs::default());
        let cond = b.param("c", st(ScalarType::I1), ParamAttrs::default());
        let outer = bin(&mut b, BinaryOp::Mul, x, x);
        sink(&mut b, outer);
        let zero = b.const_i32(0, sp()).unwrap();
        let four = b.const_i32(4, sp()).unwrap();
        let one = b.const_i32(1, sp()).unwrap();
        let args = b.open_region(&[i32t.clone(), i32t.clone()]);
        let inner = bin(&mut b, BinaryOp::Mul, x, x);
        let acc = bin(&mut b, BinaryOp::Add, args[1], inner);
        // Sibling regions of an `if`, each computing x - 1 twice.
        let mut arms = Vec::new();
        for _ in 0..2 {
            b.open_region(&[]);
            let a1 = bin(&mut b, BinaryOp::Sub, x, one);
            let a2 = bin(&mut b, BinaryOp::Sub, x, one);
            let s = bin(&mut b, BinaryOp::Add, a1, a2);
            b.push_op(OpKind::Yield, vec![s], vec![], vec![], sp());
            arms.push(b.close_region());
        }
        let r = b.push_op(OpKind::If, vec![cond], vec![i32t.clone()], arms, sp());
        let acc2 = bin(&mut b, BinaryOp::Add, acc, r[0]);
        b.push_op(OpKind::Yield, vec![acc2], vec![], vec![], sp());
        let body = b.close_region();
        let res = b.push_op(
            OpKind::For,
            vec![zero, four, one, zero],
            vec![i32t],
            vec![body],
            sp(),
        );
        sink(&mut b, res[0]);
        let f = opt(b.finish());
        assert_eq!(count(&f, "mul"), 1, "the loop reuses the outer x * x");
        let for_op = f.body.ops.iter().find(|o| o.kind == OpKind::For).unwrap();
        assert_eq!(for_op.regions[0].ops[0].operands[1], outer);
        let if_op = for_op.regions[0]
            .ops
            .iter()
            .find(|o| o.kind == OpKind::If)
            .unwrap();
        for arm in &if_op.regions {
            // One `sub` per arm: merged within the arm, not across arms.
            assert_eq!(
                arm.ops
                    .iter()
                    .filter(|o| o.kind.mnemonic() == "sub")
                    .count(),
                1
            );
        }
        assert_eq!(count(&f, "sub"), 2);
    }

    #[test]
    fn cse_merges_constants_bit_exactly() {
        use ConstValue::Float;
        let mut b = FunctionBuilder::new("k", sp());
        let vals = [
            c(&mut b, Float(0.0), ScalarType::F32),
            c(&mut b, Float(-0.0), ScalarType::F32),
            c(&mut b, Float(f64::NAN), ScalarType::F32),
            c(&mut b, Float(f64::NAN), ScalarType::F32),
            c(&mut b, Float(0.0), ScalarType::F32),
            c(&mut b, Float(0.0), ScalarType::F64),
        ];
        for v in vals {
            sink(&mut b, v);
        }
        let f = opt(b.finish());
        let v = stored(&f);
        assert_ne!(v[0], v[1]);
        assert_eq!(v[2], v[3]);
        assert_eq!(v[0], v[4]);
        assert_ne!(v[0], v[5]);
        assert_eq!(count(&f, "const"), 4);
    }
}

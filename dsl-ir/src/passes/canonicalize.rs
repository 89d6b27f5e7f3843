//! Canonicalization with constant folding: [`canonicalize`] rewrites ops into a
//! canonical form (constants on the right, identities removed, constant control flow
//! resolved) and replaces ops on constants by their value, computed by the evaluators
//! in `fold.rs`.

use std::collections::HashMap;

use super::fold::{eval_binary, eval_cast, eval_cmp, eval_unary, norm_int};
use super::resolve;
use crate::ir::{BinaryOp, CmpPred, ConstValue, Function, Op, OpKind, Region, UnaryOp, ValueId};
use crate::types::ScalarType;

/// Canonicalizes `f`; returns whether anything changed.
///
/// - Constant folding: `Binary`, `Unary` (integers; `neg`, `abs`, `floor`, `ceil`,
///   `sqrt` on floats), `Cmp`, `Select`, `Cast`, and `splat`/`broadcast`/`expand_dims`/
///   `reshape`/`permute` of a constant (a constant is a splat, so these give a new
///   constant of the result type).
/// - Identities: integer `x+0`, `x-0`, `x*1`, `x/1`, `x|0`, `x^0`, `x&-1`, `x<<0`,
///   `x>>0`, `x*0 → 0`, `x&0 → 0`, `x%1 → 0`, `x-x → 0`, `x^x → 0`, `x&x`, `x|x`,
///   `min/max(x,x)`, `cmp x, x`; boolean `and`/`or`/`xor` with constants; float
///   `x + -0.0`, `x - 0.0`, `x * 1.0`, `x / 1.0` (and nothing that is wrong for NaN or
///   `-0.0`, such as `x*0` or `x+0.0`); `neg(neg x)`, `not(not x)`; `select` with a
///   constant condition or equal arms; casts, broadcasts, reshapes and permutes that do
///   not change the type or order.
/// - Constants go to the right of commutative ops (not float `min`/`max`) and of
///   comparisons (mirroring the predicate).
/// - Control flow: an `if` with a constant condition is replaced by the ops of the
///   taken region; a `for` with constant bounds that runs zero times by its inits.
pub fn canonicalize(f: &mut Function) -> bool {
    let mut cx = Canon::default();
    let mut body = std::mem::take(&mut f.body);
    cx.region(f, &mut body);
    f.body = body;
    cx.changed
}

#[derive(Default)]
struct Canon {
    /// Replaced values.
    map: HashMap<ValueId, ValueId>,
    /// Values defined by `const`.
    consts: HashMap<ValueId, ConstValue>,
    /// Values defined by `unary`: the op and its operand.
    unaries: HashMap<ValueId, (UnaryOp, ValueId)>,
    changed: bool,
}

/// What to do with an op.
enum Fold {
    Keep,
    /// The op changed in place (e.g. operands swapped).
    Changed,
    /// Replace the op by a constant of its (single) result type.
    Const(ConstValue),
    /// Drop the op; its results become these values.
    Replace(Vec<ValueId>),
    /// Drop the op (an `if`) and splice in the ops of region `n`.
    Inline(usize),
}

impl Canon {
    fn region(&mut self, f: &Function, r: &mut Region) {
        let ops = std::mem::take(&mut r.ops);
        let mut out = Vec::with_capacity(ops.len());
        for mut op in ops {
            for o in &mut op.operands {
                *o = resolve(&self.map, *o);
            }
            for sub in &mut op.regions {
                self.region(f, sub);
            }
            match self.fold(f, &mut op) {
                Fold::Keep => {}
                Fold::Changed => self.changed = true,
                Fold::Const(c) => {
                    op.kind = OpKind::Const(c);
                    op.operands.clear();
                    self.changed = true;
                }
                Fold::Replace(vals) => {
                    for (&res, v) in op.results.iter().zip(vals) {
                        self.map.insert(res, v);
                    }
                    self.changed = true;
                    continue;
                }
                Fold::Inline(n) => {
                    let mut sub = op.regions.swap_remove(n);
                    let term = sub.ops.pop().expect("verified region ends in yield");
                    for (&res, &v) in op.results.iter().zip(&term.operands) {
                        self.map.insert(res, resolve(&self.map, v));
                    }
                    out.extend(sub.ops);
                    self.changed = true;
                    continue;
                }
            }
            match &op.kind {
                OpKind::Const(c) => {
                    self.consts.insert(op.results[0], *c);
                }
                OpKind::Unary(u) => {
                    self.unaries.insert(op.results[0], (*u, op.operands[0]));
                }
                _ => {}
            }
            out.push(op);
        }
        r.ops = out;
    }

    fn cst(&self, v: ValueId) -> Option<ConstValue> {
        self.consts.get(&v).copied()
    }

    fn fold(&self, f: &Function, op: &mut Op) -> Fold {
        let res_ty = || f.ty(op.results[0]).clone();
        let scalar_of = |v: ValueId| f.scalar_type(v);
        match op.kind.clone() {
            OpKind::Binary(b) => {
                let (x, y) = (op.operands[0], op.operands[1]);
                let Some(s) = scalar_of(x) else {
                    return Fold::Keep;
                };
                match (self.cst(x), self.cst(y)) {
                    (Some(a), Some(c)) => match eval_binary(s, b, a, c) {
                        Some(r) => Fold::Const(r),
                        None => Fold::Keep,
                    },
                    (Some(_), None)
                        if b.is_commutative()
                            && !(s.is_float() && matches!(b, BinaryOp::Min | BinaryOp::Max)) =>
                    {
                        op.operands.swap(0, 1);
                        Fold::Changed
                    }
                    (_, c) => binary_identity(s, b, x, y, c),
                }
            }
            OpKind::Unary(u) => {
                let x = op.operands[0];
                let Some(s) = scalar_of(x) else {
                    return Fold::Keep;
                };
                if let Some(a) = self.cst(x) {
                    return match eval_unary(s, u, a) {
                        Some(r) => Fold::Const(r),
                        None => Fold::Keep,
                    };
                }
                match (u, self.unaries.get(&x)) {
                    (UnaryOp::Neg, Some(&(UnaryOp::Neg, inner)))
                    | (UnaryOp::Not, Some(&(UnaryOp::Not, inner))) => Fold::Replace(vec![inner]),
                    _ => Fold::Keep,
                }
            }
            OpKind::Cmp(p) => {
                let (x, y) = (op.operands[0], op.operands[1]);
                let Some(s) = scalar_of(x) else {
                    return Fold::Keep;
                };
                match (self.cst(x), self.cst(y)) {
                    (Some(a), Some(c)) => match eval_cmp(s, p, a, c) {
                        Some(r) => Fold::Const(ConstValue::Bool(r)),
                        None => Fold::Keep,
                    },
                    (Some(_), None) => {
                        op.operands.swap(0, 1);
                        op.kind = OpKind::Cmp(mirror(p));
                        Fold::Changed
                    }
                    _ if x == y && s.is_int() => Fold::Const(ConstValue::Bool(matches!(
                        p,
                        CmpPred::Eq | CmpPred::Le | CmpPred::Ge
                    ))),
                    _ => Fold::Keep,
                }
            }
            OpKind::Select => {
                let (c, a, b) = (op.operands[0], op.operands[1], op.operands[2]);
                match self.cst(c) {
                    Some(ConstValue::Bool(true)) => Fold::Replace(vec![a]),
                    Some(ConstValue::Bool(false)) => Fold::Replace(vec![b]),
                    _ if a == b => Fold::Replace(vec![a]),
                    _ => Fold::Keep,
                }
            }
            OpKind::Cast => {
                let x = op.operands[0];
                let to = res_ty();
                if *f.ty(x) == to {
                    return Fold::Replace(vec![x]);
                }
                match (self.cst(x), scalar_of(x), to.scalar_type()) {
                    (Some(c), Some(from), Some(to)) => match eval_cast(from, to, c) {
                        Some(r) => Fold::Const(r),
                        None => Fold::Keep,
                    },
                    _ => Fold::Keep,
                }
            }
            OpKind::Splat
            | OpKind::Broadcast
            | OpKind::ExpandDims { .. }
            | OpKind::Reshape
            | OpKind::Permute { .. } => {
                let x = op.operands[0];
                if let Some(c) = self.cst(x) {
                    return Fold::Const(c);
                }
                let identity = match &op.kind {
                    OpKind::Permute { order } => {
                        order.iter().enumerate().all(|(i, &o)| i == o as usize)
                    }
                    OpKind::ExpandDims { .. } => false,
                    _ => true,
                };
                if identity && *f.ty(x) == res_ty() {
                    Fold::Replace(vec![x])
                } else {
                    Fold::Keep
                }
            }
            // A constant is already known exactly.
            OpKind::Hint { .. } => match self.cst(op.operands[0]) {
                Some(c) => Fold::Const(c),
                None => Fold::Keep,
            },
            OpKind::If => match self.cst(op.operands[0]) {
                Some(ConstValue::Bool(b)) if op.regions.len() == 2 => {
                    Fold::Inline(if b { 0 } else { 1 })
                }
                _ => Fold::Keep,
            },
            OpKind::For => {
                let (lb, ub) = (op.operands[0], op.operands[1]);
                match (self.cst(lb), self.cst(ub), scalar_of(lb)) {
                    (Some(ConstValue::Int(l)), Some(ConstValue::Int(u)), Some(s))
                        if norm_int(s, l) >= norm_int(s, u)
                            && op.operands.len() - 3 == op.results.len() =>
                    {
                        Fold::Replace(op.operands[3..].to_vec())
                    }
                    _ => Fold::Keep,
                }
            }
            _ => Fold::Keep,
        }
    }
}

/// `a op b` ⇔ `b mirror(op) a`.
fn mirror(p: CmpPred) -> CmpPred {
    match p {
        CmpPred::Eq => CmpPred::Eq,
        CmpPred::Ne => CmpPred::Ne,
        CmpPred::Lt => CmpPred::Gt,
        CmpPred::Le => CmpPred::Ge,
        CmpPred::Gt => CmpPred::Lt,
        CmpPred::Ge => CmpPred::Le,
    }
}

/// Identities of `x op y` where `c` is `y`'s constant value, if any.
fn binary_identity(
    s: ScalarType,
    b: BinaryOp,
    x: ValueId,
    y: ValueId,
    c: Option<ConstValue>,
) -> Fold {
    use BinaryOp as B;
    let keep_x = Fold::Replace(vec![x]);
    if s.is_float() {
        return match (b, c) {
            // x + -0.0 == x for every x (also -0.0 and NaN); x + 0.0 is not (-0.0).
            (B::Add, Some(ConstValue::Float(v))) if v == 0.0 && v.is_sign_negative() => keep_x,
            (B::Sub, Some(ConstValue::Float(v))) if v == 0.0 && v.is_sign_positive() => keep_x,
            (B::Mul | B::Div, Some(ConstValue::Float(1.0))) => keep_x,
            _ => Fold::Keep,
        };
    }
    if s.is_bool() {
        return match (b, c) {
            (B::And, Some(ConstValue::Bool(true)))
            | (B::Or, Some(ConstValue::Bool(false)))
            | (B::Xor, Some(ConstValue::Bool(false))) => keep_x,
            (B::And, Some(ConstValue::Bool(false))) => Fold::Const(ConstValue::Bool(false)),
            (B::Or, Some(ConstValue::Bool(true))) => Fold::Const(ConstValue::Bool(true)),
            (B::And | B::Or, _) if x == y => keep_x,
            (B::Xor, _) if x == y => Fold::Const(ConstValue::Bool(false)),
            _ => Fold::Keep,
        };
    }
    let zero = Fold::Const(ConstValue::Int(0));
    if x == y {
        return match b {
            B::And | B::Or | B::Min | B::Max => keep_x,
            B::Sub | B::Xor => zero,
            _ => Fold::Keep,
        };
    }
    let Some(ConstValue::Int(v)) = c else {
        return Fold::Keep;
    };
    let v = norm_int(s, v);
    let all_ones = norm_int(s, -1);
    match b {
        B::Add | B::Sub | B::Or | B::Xor if v == 0 => keep_x,
        B::Mul | B::Div if v == 1 => keep_x,
        B::Mul | B::And if v == 0 => zero,
        B::Rem if v == 1 => zero,
        B::And if v == all_ones => keep_x,
        B::Shl | B::Shr if (v as u64) & (s.bits() as u64 - 1) == 0 => keep_x,
        _ => Fold::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::FunctionBuilder;
    use crate::ir::ParamAttrs;
    use crate::passes::tests::*;
    use crate::types::Type;

    #[test]
    fn folds_integer_arithmetic_with_wrapping() {
        use ConstValue::Int;
        let mut b = FunctionBuilder::new("k", sp());
        let cases: Vec<(ScalarType, BinaryOp, i64, i64)> = vec![
            (ScalarType::I32, BinaryOp::Add, 3, 4),
            (ScalarType::I8, BinaryOp::Add, 127, 1),
            (ScalarType::U8, BinaryOp::Add, 200, 100),
            (ScalarType::U8, BinaryOp::Sub, 1, 2),
            (ScalarType::I32, BinaryOp::Div, -7, 2),
            (ScalarType::I32, BinaryOp::Rem, -7, 2),
            (ScalarType::U32, BinaryOp::Div, -1, 2),
            (ScalarType::I32, BinaryOp::Shl, 1, 33),
            (ScalarType::I8, BinaryOp::Shr, -128, 1),
            (ScalarType::U8, BinaryOp::Shr, 128, 1),
            (ScalarType::U64, BinaryOp::Max, -1, 1),
            (ScalarType::I64, BinaryOp::Min, -1, 1),
        ];
        for &(s, op, x, y) in &cases {
            let x = c(&mut b, Int(x), s);
            let y = c(&mut b, Int(y), s);
            let r = bin(&mut b, op, x, y);
            sink(&mut b, r);
        }
        let f = opt(b.finish());
        let got: Vec<_> = stored(&f)
            .iter()
            .map(|&v| const_of(&f, v).unwrap())
            .collect();
        let want = [7, -128, 44, 255, -3, -1, 0x7fff_ffff, 2, -64, 64, -1, -1].map(Int);
        assert_eq!(got, want);
    }

    #[test]
    fn does_not_fold_division_by_zero_or_overflow() {
        let mut b = FunctionBuilder::new("k", sp());
        for (op, x, y) in [
            (BinaryOp::Div, 1, 0),
            (BinaryOp::Rem, 1, 0),
            (BinaryOp::Div, i32::MIN as i64, -1),
            (BinaryOp::Rem, i32::MIN as i64, -1),
        ] {
            let x = c(&mut b, ConstValue::Int(x), ScalarType::I32);
            let y = c(&mut b, ConstValue::Int(y), ScalarType::I32);
            let r = bin(&mut b, op, x, y);
            sink(&mut b, r);
        }
        let f = opt(b.finish());
        assert_eq!(count(&f, "div") + count(&f, "rem"), 4);
    }

    #[test]
    fn folds_floats_cmp_select_cast_and_shapes() {
        use ConstValue::{Bool, Float, Int};
        let mut b = FunctionBuilder::new("k", sp());
        let x = c(&mut b, Float(1.5), ScalarType::F32);
        let y = c(&mut b, Float(2.25), ScalarType::F32);
        let s = bin(&mut b, BinaryOp::Add, x, y);
        sink(&mut b, s); // 3.75
        let t = c(&mut b, Float(0.1), ScalarType::F32);
        let t3 = bin(&mut b, BinaryOp::Mul, t, t);
        sink(&mut b, t3); // f32 rounding
        let h = c(&mut b, Float(1.0), ScalarType::F16);
        let h2 = c(&mut b, Float(2048.0), ScalarType::F16);
        let hs = bin(&mut b, BinaryOp::Add, h, h2);
        sink(&mut b, hs); // 2049 rounds to 2048 in f16
        let nan = c(&mut b, Float(f64::NAN), ScalarType::F32);
        let lt = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[nan, x], None, sp())
            .unwrap();
        let ne = b
            .op1(OpKind::Cmp(CmpPred::Ne), &[nan, nan], None, sp())
            .unwrap();
        let sel = b.op1(OpKind::Select, &[ne, x, y], None, sp()).unwrap();
        sink(&mut b, sel); // 1.5
        let ci = b
            .op1(OpKind::Cast, &[nan], Some(&st(ScalarType::I32)), sp())
            .unwrap();
        sink(&mut b, ci); // NaN as i32 = 0
        let big = c(&mut b, Float(1e10), ScalarType::F64);
        let cu = b
            .op1(OpKind::Cast, &[big], Some(&st(ScalarType::U8)), sp())
            .unwrap();
        sink(&mut b, cu); // saturates to 255
        let m1 = c(&mut b, Int(-1), ScalarType::I32);
        let cu64 = b
            .op1(OpKind::Cast, &[m1], Some(&st(ScalarType::U64)), sp())
            .unwrap();
        sink(&mut b, cu64);
        let sq = b
            .op1(OpKind::Unary(UnaryOp::Sqrt), &[y], None, sp())
            .unwrap();
        sink(&mut b, sq);
        // Shape ops on constants.
        let tile = Type::tile(ScalarType::F32, &[4]);
        let sp4 = b.op1(OpKind::Splat, &[x], Some(&tile), sp()).unwrap();
        let e = b
            .op1(OpKind::ExpandDims { axis: 0 }, &[sp4], None, sp())
            .unwrap();
        let tile2 = Type::tile(ScalarType::F32, &[8, 4]);
        let bc = b.op1(OpKind::Broadcast, &[e], Some(&tile2), sp()).unwrap();
        let rs = b
            .op1(
                OpKind::Reshape,
                &[bc],
                Some(&Type::tile(ScalarType::F32, &[32])),
                sp(),
            )
            .unwrap();
        let red = b
            .op1(
                OpKind::Reduce {
                    axis: 0,
                    op: crate::ir::ReduceOp::Sum,
                },
                &[rs],
                None,
                sp(),
            )
            .unwrap();
        sink(&mut b, red);
        sink(&mut b, lt);
        let f = opt(b.finish());
        let got: Vec<_> = stored(&f).iter().map(|&v| const_of(&f, v)).collect();
        assert_eq!(got[0], Some(Float(3.75)));
        assert_eq!(got[1], Some(Float((0.1f32 * 0.1f32) as f64)));
        assert_eq!(got[2], Some(Float(2048.0)));
        assert_eq!(got[3], Some(Float(1.5)));
        assert_eq!(got[4], Some(Int(0)));
        assert_eq!(got[5], Some(Int(255)));
        assert_eq!(got[6], Some(Int(-1)));
        assert_eq!(got[7], Some(Float(1.5)));
        assert_eq!(got[8], None, "reduce is not folded");
        assert_eq!(got[9], Some(Bool(false)));
        let red_in = def_of(&f, stored(&f)[8]).unwrap().operands[0];
        assert_eq!(const_of(&f, red_in), Some(Float(1.5)));
        assert_eq!(*f.ty(red_in), Type::tile(ScalarType::F32, &[32]));
    }

    #[test]
    fn integer_identities_and_commutation() {
        let mut b = FunctionBuilder::new("k", sp());
        let x = b.param("x", st(ScalarType::I32), ParamAttrs::default());
        let zero = b.const_i32(0, sp()).unwrap();
        let one = b.const_i32(1, sp()).unwrap();
        let two = b.const_i32(2, sp()).unwrap();
        let a = bin(&mut b, BinaryOp::Add, zero, x); // x
        let m = bin(&mut b, BinaryOp::Mul, a, one); // x
        let s = bin(&mut b, BinaryOp::Sub, m, zero); // x
        sink(&mut b, s);
        let z = bin(&mut b, BinaryOp::Mul, x, zero);
        sink(&mut b, z); // 0
        let xx = bin(&mut b, BinaryOp::Xor, x, x);
        sink(&mut b, xx); // 0
        let aa = bin(&mut b, BinaryOp::And, x, x);
        sink(&mut b, aa); // x
        let c2 = bin(&mut b, BinaryOp::Add, two, x); // x + 2
        sink(&mut b, c2);
        let n = b
            .op1(OpKind::Unary(UnaryOp::Neg), &[x], None, sp())
            .unwrap();
        let nn = b
            .op1(OpKind::Unary(UnaryOp::Neg), &[n], None, sp())
            .unwrap();
        sink(&mut b, nn); // x
        let eq = b
            .op1(OpKind::Cmp(CmpPred::Le), &[x, x], None, sp())
            .unwrap();
        let sel = b.op1(OpKind::Select, &[eq, x, two], None, sp()).unwrap();
        sink(&mut b, sel); // x
        let f = opt(b.finish());
        let v = stored(&f);
        assert_eq!(v[0], x);
        assert_eq!(const_of(&f, v[1]), Some(ConstValue::Int(0)));
        assert_eq!(const_of(&f, v[2]), Some(ConstValue::Int(0)));
        assert_eq!(v[3], x);
        let add = def_of(&f, v[4]).unwrap();
        assert_eq!(add.operands[0], x, "constant moved to the right");
        assert_eq!(const_of(&f, add.operands[1]), Some(ConstValue::Int(2)));
        assert_eq!(v[5], x);
        assert_eq!(v[6], x);
    }

    #[test]
    fn float_identities_only_when_exact() {
        use ConstValue::Float;
        let mut b = FunctionBuilder::new("k", sp());
        let x = b.param("x", st(ScalarType::F32), ParamAttrs::default());
        let pz = c(&mut b, Float(0.0), ScalarType::F32);
        let nz = c(&mut b, Float(-0.0), ScalarType::F32);
        let one = c(&mut b, Float(1.0), ScalarType::F32);
        let kept = [
            bin(&mut b, BinaryOp::Mul, x, pz), // NaN * 0 = NaN, -1 * 0 = -0
            bin(&mut b, BinaryOp::Add, x, pz), // -0 + 0 = +0
            bin(&mut b, BinaryOp::Sub, x, nz), // -0 - -0 = +0
            bin(&mut b, BinaryOp::Sub, x, x),  // NaN, inf
            bin(&mut b, BinaryOp::Min, pz, x), // min(+0, -0) unspecified: no swap
        ];
        let folded = [
            bin(&mut b, BinaryOp::Add, x, nz),
            bin(&mut b, BinaryOp::Sub, x, pz),
            bin(&mut b, BinaryOp::Mul, x, one),
            bin(&mut b, BinaryOp::Div, x, one),
        ];
        let e = b
            .op1(OpKind::Cmp(CmpPred::Eq), &[x, x], None, sp())
            .unwrap();
        for v in kept.into_iter().chain(folded).chain([e]) {
            sink(&mut b, v);
        }
        let f = opt(b.finish());
        let v = stored(&f);
        assert_eq!(v[..5], kept[..]);
        let min = def_of(&f, v[4]).unwrap();
        assert_eq!(const_of(&f, min.operands[0]), Some(Float(0.0)));
        assert!(v[5..9].iter().all(|&r| r == x));
        assert_eq!(v[9], e, "x == x is not folded for floats");
        // Min of the two zeros is not folded.
        let mut b = FunctionBuilder::new("k", sp());
        let pz = c(&mut b, Float(0.0), ScalarType::F32);
        let nz = c(&mut b, Float(-0.0), ScalarType::F32);
        let m = bin(&mut b, BinaryOp::Min, pz, nz);
        sink(&mut b, m);
        let f = opt(b.finish());
        assert_eq!(count(&f, "min"), 1);
    }

    #[test]
    fn constant_control_flow_is_simplified() {
        let i32t = st(ScalarType::I32);
        let mut b = FunctionBuilder::new("k", sp());
        let x = b.param("x", i32t.clone(), ParamAttrs::default());
        let t = c(&mut b, ConstValue::Bool(true), ScalarType::I1);
        let mut arms = Vec::new();
        for k in [10, 20] {
            b.open_region(&[]);
            let kk = b.const_i32(k, sp()).unwrap();
            let s = bin(&mut b, BinaryOp::Add, x, kk);
            b.push_op(OpKind::Yield, vec![s], vec![], vec![], sp());
            arms.push(b.close_region());
        }
        let r = b.push_op(OpKind::If, vec![t], vec![i32t.clone()], arms, sp());
        sink(&mut b, r[0]);
        let five = b.const_i32(5, sp()).unwrap();
        let args = b.open_region(&[i32t.clone(), i32t.clone()]);
        b.push_op(OpKind::Yield, vec![args[0]], vec![], vec![], sp());
        let body = b.close_region();
        let l = b.push_op(
            OpKind::For,
            vec![five, five, five, x],
            vec![i32t],
            vec![body],
            sp(),
        );
        sink(&mut b, l[0]);
        let f = opt(b.finish());
        assert_eq!(count(&f, "if") + count(&f, "for"), 0);
        let v = stored(&f);
        let add = def_of(&f, v[0]).unwrap();
        assert_eq!(const_of(&f, add.operands[1]), Some(ConstValue::Int(10)));
        assert_eq!(v[1], x);
    }
}

//! Optimization passes on verified IR: canonicalization with constant folding
//! ([`canonicalize`]), common-subexpression elimination ([`cse`]) and dead-code
//! elimination ([`dce`]); [`optimize`] runs them to a fixed point.
//!
//! Every rewrite preserves the semantics documented on [`OpKind`] exactly: integer
//! arithmetic wraps, shift amounts are taken modulo the bit width, floats behave as in
//! Rust (including NaN and signed zeros). Folds whose result the documentation leaves
//! open are not done: integer division or remainder by zero or of `MIN` by `-1`, `min`/
//! `max` of two zeros of different signs, ordering comparisons of `i1`, casts from or
//! to `i1`, transcendental functions, and conversions whose result depends on whether
//! the conversion rounds once or twice.
//!
//! The passes leave unused entries in [`Function::values`]; that is fine (the printer
//! renumbers values).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use half::{bf16, f16};

use crate::ir::{BinaryOp, CmpPred, ConstValue, Function, Op, OpKind, Region, UnaryOp, ValueId};
use crate::types::{ScalarType, Type};

/// Most rounds of [`optimize`] before it stops even without a fixed point.
pub const MAX_OPTIMIZE_ROUNDS: usize = 32;

/// Runs [`canonicalize`], [`cse`] and [`dce`] until none changes anything (at most
/// [`MAX_OPTIMIZE_ROUNDS`] rounds).
pub fn optimize(f: &mut Function) {
    for _ in 0..MAX_OPTIMIZE_ROUNDS {
        let mut changed = canonicalize(f);
        changed |= cse(f);
        changed |= dce(f);
        if !changed {
            break;
        }
    }
}

/// Rewrites every use (operand) of `old` into `new`, in all regions; returns how many
/// operands changed. Definitions are left alone.
pub fn replace_all_uses(f: &mut Function, old: ValueId, new: ValueId) -> usize {
    fn go(r: &mut Region, old: ValueId, new: ValueId) -> usize {
        let mut n = 0;
        for op in &mut r.ops {
            for o in &mut op.operands {
                if *o == old {
                    *o = new;
                    n += 1;
                }
            }
            for sub in &mut op.regions {
                n += go(sub, old, new);
            }
        }
        n
    }
    go(&mut f.body, old, new)
}

/// Follows `map` from `v` to the value that replaces it.
fn resolve(map: &HashMap<ValueId, ValueId>, mut v: ValueId) -> ValueId {
    while let Some(&n) = map.get(&v) {
        v = n;
    }
    v
}

// ---------------------------------------------------------------------------------
// Canonicalization and constant folding
// ---------------------------------------------------------------------------------

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

/// The canonical `i64` holding an integer of type `s`: sign-extended for signed types,
/// zero-extended for unsigned ones narrower than 64 bits, the bit pattern for `u64`.
fn norm_int(s: ScalarType, v: i64) -> i64 {
    match s {
        ScalarType::I8 => v as i8 as i64,
        ScalarType::I16 => v as i16 as i64,
        ScalarType::I32 => v as i32 as i64,
        ScalarType::U8 => v as u8 as i64,
        ScalarType::U16 => v as u16 as i64,
        ScalarType::U32 => v as u32 as i64,
        _ => v,
    }
}

/// The exact integer value of `v` as a `u64`-or-`i64`-covering `i128`.
fn int_value(s: ScalarType, v: i64) -> i128 {
    let v = norm_int(s, v);
    if s == ScalarType::U64 {
        v as u64 as i128
    } else {
        v as i128
    }
}

/// Rounds `x` to the precision of float type `s` (once, from `f64`).
fn round_float(s: ScalarType, x: f64) -> f64 {
    match s {
        ScalarType::F32 => x as f32 as f64,
        ScalarType::F16 => f16::from_f64(x).to_f64(),
        ScalarType::BF16 => bf16::from_f64(x).to_f64(),
        _ => x,
    }
}

/// Rounds an `f32` to float type `s` (`f32` or narrower) and widens it to `f64`.
fn from_f32(s: ScalarType, x: f32) -> f64 {
    match s {
        ScalarType::F16 => f16::from_f32(x).to_f64(),
        ScalarType::BF16 => bf16::from_f32(x).to_f64(),
        _ => x as f64,
    }
}

fn eval_binary(s: ScalarType, b: BinaryOp, a: ConstValue, c: ConstValue) -> Option<ConstValue> {
    use BinaryOp as B;
    match (a, c) {
        (ConstValue::Bool(a), ConstValue::Bool(c)) => Some(ConstValue::Bool(match b {
            B::And => a & c,
            B::Or => a | c,
            B::Xor => a ^ c,
            _ => return None,
        })),
        (ConstValue::Int(a), ConstValue::Int(c)) if s.is_int() => {
            eval_int_binary(s, b, a, c).map(ConstValue::Int)
        }
        (ConstValue::Float(a), ConstValue::Float(c)) if s.is_float() => {
            eval_float_binary(s, b, a, c).map(ConstValue::Float)
        }
        _ => None,
    }
}

fn eval_int_binary(s: ScalarType, b: BinaryOp, a: i64, c: i64) -> Option<i64> {
    use BinaryOp as B;
    let (a, c) = (norm_int(s, a), norm_int(s, c));
    let signed = s.is_signed_int();
    let (ua, uc) = (a as u64, c as u64);
    let min = norm_int(s, 1i64 << (s.bits() - 1));
    let amt = (uc & (s.bits() as u64 - 1)) as u32;
    let r = match b {
        B::Add => a.wrapping_add(c),
        B::Sub => a.wrapping_sub(c),
        B::Mul => a.wrapping_mul(c),
        B::Div | B::Rem => {
            if c == 0 || (signed && a == min && c == -1) {
                return None;
            }
            match (b, signed) {
                (B::Div, true) => a / c,
                (B::Div, false) => (ua / uc) as i64,
                (_, true) => a % c,
                (_, false) => (ua % uc) as i64,
            }
        }
        B::Min | B::Max => {
            let a_first = if signed { a <= c } else { ua <= uc };
            if a_first == (b == B::Min) { a } else { c }
        }
        B::And => a & c,
        B::Or => a | c,
        B::Xor => a ^ c,
        B::Shl => (ua << amt) as i64,
        B::Shr => {
            if signed {
                a >> amt
            } else {
                (ua >> amt) as i64
            }
        }
        B::Pow => return None,
    };
    Some(norm_int(s, r))
}

fn eval_float_binary(s: ScalarType, b: BinaryOp, a: f64, c: f64) -> Option<f64> {
    use BinaryOp as B;
    if matches!(b, B::Min | B::Max) && a == 0.0 && c == 0.0 && a.to_bits() != c.to_bits() {
        // Rust leaves min/max of +0.0 and -0.0 unspecified.
        return None;
    }
    if s == ScalarType::F64 {
        return Some(match b {
            B::Add => a + c,
            B::Sub => a - c,
            B::Mul => a * c,
            B::Div => a / c,
            B::Rem => a % c,
            B::Min => a.min(c),
            B::Max => a.max(c),
            _ => return None,
        });
    }
    // f32 arithmetic, then one rounding to f16/bf16: exact for these ops, since f32 has
    // more than twice the precision of f16 and bf16 plus two bits.
    let (a, c) = (round_float(s, a) as f32, round_float(s, c) as f32);
    let r = match b {
        B::Add => a + c,
        B::Sub => a - c,
        B::Mul => a * c,
        B::Div => a / c,
        B::Rem => a % c,
        B::Min => a.min(c),
        B::Max => a.max(c),
        _ => return None,
    };
    Some(from_f32(s, r))
}

fn eval_unary(s: ScalarType, u: UnaryOp, a: ConstValue) -> Option<ConstValue> {
    match a {
        ConstValue::Bool(a) => match u {
            UnaryOp::Not => Some(ConstValue::Bool(!a)),
            _ => None,
        },
        ConstValue::Int(a) if s.is_int() => {
            let a = norm_int(s, a);
            let r = match u {
                UnaryOp::Neg => a.wrapping_neg(),
                UnaryOp::Not => !a,
                UnaryOp::Abs if s.is_signed_int() => a.wrapping_abs(),
                UnaryOp::Abs => a,
                UnaryOp::Popc | UnaryOp::Clz => {
                    let bits = s.bits();
                    let low = (a as u64) & (u64::MAX >> (64 - bits));
                    if u == UnaryOp::Popc {
                        i64::from(low.count_ones())
                    } else {
                        i64::from(low.leading_zeros() - (64 - bits))
                    }
                }
                _ => return None,
            };
            Some(ConstValue::Int(norm_int(s, r)))
        }
        ConstValue::Float(a) if s.is_float() => {
            let a = round_float(s, a);
            let r = match u {
                UnaryOp::Neg => -a,
                UnaryOp::Abs => a.abs(),
                UnaryOp::Floor => a.floor(),
                UnaryOp::Ceil => a.ceil(),
                UnaryOp::Sqrt if s == ScalarType::F64 => a.sqrt(),
                UnaryOp::Sqrt => from_f32(s, (a as f32).sqrt()),
                _ => return None,
            };
            Some(ConstValue::Float(r))
        }
        _ => None,
    }
}

fn eval_cmp(s: ScalarType, p: CmpPred, a: ConstValue, c: ConstValue) -> Option<bool> {
    use std::cmp::Ordering;
    let ord: Option<Ordering> = match (a, c) {
        (ConstValue::Bool(a), ConstValue::Bool(c)) => {
            // Only equality: ordering of i1 is not pinned down (signed or not).
            return match p {
                CmpPred::Eq => Some(a == c),
                CmpPred::Ne => Some(a != c),
                _ => None,
            };
        }
        (ConstValue::Int(a), ConstValue::Int(c)) if s.is_int() => {
            Some(int_value(s, a).cmp(&int_value(s, c)))
        }
        (ConstValue::Float(a), ConstValue::Float(c)) if s.is_float() => {
            round_float(s, a).partial_cmp(&round_float(s, c))
        }
        _ => return None,
    };
    Some(match ord {
        None => p == CmpPred::Ne,
        Some(o) => match p {
            CmpPred::Eq => o == Ordering::Equal,
            CmpPred::Ne => o != Ordering::Equal,
            CmpPred::Lt => o == Ordering::Less,
            CmpPred::Le => o != Ordering::Greater,
            CmpPred::Gt => o == Ordering::Greater,
            CmpPred::Ge => o != Ordering::Less,
        },
    })
}

/// Rust `as` from the exact float `x` to integer type `t` (saturating, NaN to 0).
fn float_to_int(t: ScalarType, x: f64) -> i64 {
    match t {
        ScalarType::I8 => x as i8 as i64,
        ScalarType::I16 => x as i16 as i64,
        ScalarType::I32 => x as i32 as i64,
        ScalarType::I64 => x as i64,
        ScalarType::U8 => x as u8 as i64,
        ScalarType::U16 => x as u16 as i64,
        ScalarType::U32 => x as u32 as i64,
        _ => x as u64 as i64,
    }
}

fn eval_cast(from: ScalarType, to: ScalarType, c: ConstValue) -> Option<ConstValue> {
    if from.is_bool() || to.is_bool() {
        return None;
    }
    let same_bits = |a: f64, b: f64| a.to_bits() == b.to_bits();
    match c {
        ConstValue::Int(v) if from.is_int() => {
            let x = int_value(from, v);
            if to.is_int() {
                return Some(ConstValue::Int(norm_int(to, x as i64)));
            }
            // Round once from the exact value; fold only when rounding through f64 or
            // f32 first would give the same result.
            let via64 = round_float(to, x as f64);
            let via32 = from_f32(to, x as f32);
            let direct = match to {
                ScalarType::F64 => x as f64,
                ScalarType::F32 => x as f32 as f64,
                _ => via64,
            };
            let ok =
                same_bits(direct, via64) && (to == ScalarType::F64 || same_bits(direct, via32));
            ok.then_some(ConstValue::Float(direct))
        }
        ConstValue::Float(x) if from.is_float() => {
            let x = round_float(from, x);
            if to.is_int() {
                return Some(ConstValue::Int(float_to_int(to, x)));
            }
            let direct = round_float(to, x);
            let via32 = from_f32(to, x as f32);
            let ok = to == ScalarType::F64 || same_bits(direct, via32);
            ok.then_some(ConstValue::Float(direct))
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------------
// Common-subexpression elimination
// ---------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------
// Dead-code elimination
// ---------------------------------------------------------------------------------

/// Removes ops whose results are unused and whose removal cannot change behaviour;
/// returns whether anything changed:
///
/// - pure ops (see [`OpKind::is_pure`]) with no used result, repeatedly (a chain of
///   dead ops goes in one call);
/// - `for` and `if` ops with no used result whose regions hold only pure ops,
///   terminators and such `for`/`if` ops (no loads, stores, atomics, barriers or
///   `while`). A `for` always terminates, so deleting it is safe.
///
/// Never removed: ops with side effects, loads (they may fault), `while` (it may not
/// terminate), terminators, region arguments, and unused results of kept loops.
pub fn dce(f: &mut Function) -> bool {
    let mut uses = vec![0u32; f.values.len()];
    fn count(r: &Region, uses: &mut [u32]) {
        for op in &r.ops {
            for &o in &op.operands {
                uses[o.index()] += 1;
            }
            for sub in &op.regions {
                count(sub, uses);
            }
        }
    }
    count(&f.body, &mut uses);
    let mut changed = false;
    dce_region(&mut f.body, &mut uses, &mut changed);
    changed
}

/// True when the regions hold nothing that has an effect or may not terminate.
fn regions_removable(regions: &[Region]) -> bool {
    regions.iter().all(|r| {
        r.ops.iter().all(|op| match op.kind {
            OpKind::For | OpKind::If => regions_removable(&op.regions),
            OpKind::Yield => true,
            ref k => k.is_pure(),
        })
    })
}

fn uncount(op: &Op, uses: &mut [u32]) {
    for &o in &op.operands {
        uses[o.index()] -= 1;
    }
    for sub in &op.regions {
        for inner in &sub.ops {
            uncount(inner, uses);
        }
    }
}

fn dce_region(r: &mut Region, uses: &mut [u32], changed: &mut bool) {
    let mut i = r.ops.len();
    while i > 0 {
        i -= 1;
        let op = &mut r.ops[i];
        for sub in op.regions.iter_mut().rev() {
            dce_region(sub, uses, changed);
        }
        let unused = op.results.iter().all(|v| uses[v.index()] == 0);
        let removable = match op.kind {
            OpKind::For | OpKind::If => regions_removable(&op.regions),
            ref k => k.is_pure(),
        };
        if unused && removable {
            let op = r.ops.remove(i);
            uncount(&op, uses);
            *changed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::FunctionBuilder;
    use crate::ir::{AtomicOp, MemOrder, MemScope, ParamAttrs, Span};
    use crate::verify::verify;
    use proptest::prelude::*;

    fn sp() -> Span {
        Span::new("p.rs", 1, 1)
    }

    fn st(s: ScalarType) -> Type {
        Type::scalar(s)
    }

    fn c(b: &mut FunctionBuilder, v: ConstValue, s: ScalarType) -> ValueId {
        b.constant(v, st(s), sp()).unwrap()
    }

    fn bin(b: &mut FunctionBuilder, op: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
        b.op1(OpKind::Binary(op), &[x, y], None, sp()).unwrap()
    }

    /// Stores scalar `v` through a fresh pointer parameter, keeping it alive.
    fn sink(b: &mut FunctionBuilder, v: ValueId) {
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
    fn stored(f: &Function) -> Vec<ValueId> {
        let mut out = Vec::new();
        f.walk(&mut |op| {
            if let OpKind::Store { .. } = op.kind {
                out.push(op.operands[1]);
            }
        });
        out
    }

    fn def_of(f: &Function, v: ValueId) -> Option<Op> {
        let mut d = None;
        f.walk(&mut |op| {
            if op.results.contains(&v) {
                d = Some(op.clone());
            }
        });
        d
    }

    fn const_of(f: &Function, v: ValueId) -> Option<ConstValue> {
        match def_of(f, v)?.kind {
            OpKind::Const(c) => Some(c),
            _ => None,
        }
    }

    fn count(f: &Function, m: &str) -> usize {
        let mut n = 0;
        f.walk(&mut |op| n += (op.kind.mnemonic() == m) as usize);
        n
    }

    /// Optimizes, checks the result verifies and is a fixed point.
    fn opt(mut f: Function) -> Function {
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

    #[test]
    fn dce_keeps_effects_and_removes_dead_code() {
        let i32t = st(ScalarType::I32);
        let mut b = FunctionBuilder::new("k", sp());
        let p = b.param(
            "p",
            Type::global_ptr(ScalarType::I32),
            ParamAttrs::default(),
        );
        let x = b.param("x", i32t.clone(), ParamAttrs::default());
        // A dead chain of pure ops.
        let d1 = bin(&mut b, BinaryOp::Add, x, x);
        let d2 = bin(&mut b, BinaryOp::Mul, d1, x);
        let _d3 = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[d2, x], None, sp())
            .unwrap();
        // A dead load (kept: may fault), an atomic with unused result (kept).
        b.op1(
            OpKind::Load {
                has_mask: false,
                has_other: false,
            },
            &[p],
            None,
            sp(),
        )
        .unwrap();
        b.op1(
            OpKind::AtomicRmw {
                op: AtomicOp::Add,
                order: MemOrder::Relaxed,
                scope: MemScope::Device,
                has_mask: false,
            },
            &[p, x],
            None,
            sp(),
        )
        .unwrap();
        let zero = b.const_i32(0, sp()).unwrap();
        let one = b.const_i32(1, sp()).unwrap();
        // Loop with a store, unused results: kept.
        let args = b.open_region(&[i32t.clone(), i32t.clone()]);
        let q = b.op1(OpKind::AddPtr, &[p, args[0]], None, sp()).unwrap();
        b.op(OpKind::Store { has_mask: false }, &[q, args[1]], None, sp())
            .unwrap();
        let dead_in = bin(&mut b, BinaryOp::Mul, args[0], args[0]);
        let _ = dead_in;
        b.push_op(OpKind::Yield, vec![args[1]], vec![], vec![], sp());
        let body = b.close_region();
        b.push_op(
            OpKind::For,
            vec![zero, x, one, x],
            vec![i32t.clone()],
            vec![body],
            sp(),
        );
        // Pure loop with unused results: removed.
        let args = b.open_region(&[i32t.clone(), i32t.clone()]);
        let s = bin(&mut b, BinaryOp::Add, args[0], args[1]);
        b.push_op(OpKind::Yield, vec![s], vec![], vec![], sp());
        let body = b.close_region();
        b.push_op(
            OpKind::For,
            vec![zero, x, one, x],
            vec![i32t.clone()],
            vec![body],
            sp(),
        );
        // Pure while with unused results: kept (may not terminate).
        let before = b.open_region(std::slice::from_ref(&i32t));
        let c = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[before[0], x], None, sp())
            .unwrap();
        b.push_op(OpKind::Condition, vec![c, before[0]], vec![], vec![], sp());
        let before_r = b.close_region();
        let after = b.open_region(std::slice::from_ref(&i32t));
        b.push_op(OpKind::Yield, vec![after[0]], vec![], vec![], sp());
        let after_r = b.close_region();
        b.push_op(
            OpKind::While,
            vec![zero],
            vec![i32t],
            vec![before_r, after_r],
            sp(),
        );
        b.push_op(OpKind::Barrier, vec![], vec![], vec![], sp());
        let f = opt(b.finish());
        assert_eq!(count(&f, "for"), 1);
        assert_eq!(count(&f, "store"), 1);
        assert_eq!(count(&f, "while"), 1);
        assert_eq!(count(&f, "load"), 1);
        assert_eq!(count(&f, "atomic_rmw"), 1);
        assert_eq!(count(&f, "barrier"), 1);
        assert_eq!(count(&f, "mul"), 0, "dead ops removed, also inside loops");
        assert_eq!(count(&f, "add"), 0);
        assert_eq!(count(&f, "cmp"), 1, "the while's condition stays");
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

    // --- Property test: folding matches a direct evaluation -----------------------

    #[derive(Clone, Debug)]
    enum Node {
        Const(ConstValue),
        Bin(BinaryOp, usize, usize),
        Un(UnaryOp, usize),
        /// `select(cmp(a, b), c, d)`.
        Sel(CmpPred, [usize; 4]),
    }

    macro_rules! int_eval {
        ($bin:ident, $un:ident, $cmp:ident, $t:ty, $signed:expr) => {
            fn $bin(op: BinaryOp, a: i64, b: i64) -> Option<i64> {
                let (a, b) = (a as $t, b as $t);
                Some(match op {
                    BinaryOp::Add => a.wrapping_add(b),
                    BinaryOp::Sub => a.wrapping_sub(b),
                    BinaryOp::Mul => a.wrapping_mul(b),
                    BinaryOp::Div => a.checked_div(b)?,
                    BinaryOp::Rem => a.checked_rem(b)?,
                    BinaryOp::Min => a.min(b),
                    BinaryOp::Max => a.max(b),
                    BinaryOp::And => a & b,
                    BinaryOp::Or => a | b,
                    BinaryOp::Xor => a ^ b,
                    BinaryOp::Shl => a.wrapping_shl(b as u32),
                    BinaryOp::Shr => a.wrapping_shr(b as u32),
                    BinaryOp::Pow => return None,
                } as i64)
            }
            fn $un(op: UnaryOp, a: i64) -> Option<i64> {
                let a = a as $t;
                Some(match op {
                    UnaryOp::Neg => a.wrapping_neg(),
                    UnaryOp::Not => !a,
                    UnaryOp::Abs if $signed => (a as i128).unsigned_abs() as $t,
                    UnaryOp::Popc => a.count_ones() as $t,
                    UnaryOp::Clz => a.leading_zeros() as $t,
                    _ => return None,
                } as i64)
            }
            fn $cmp(a: i64, b: i64) -> std::cmp::Ordering {
                (a as $t).cmp(&(b as $t))
            }
        };
    }
    int_eval!(bin_i8, un_i8, cmp_i8, i8, true);
    int_eval!(bin_i32, un_i32, cmp_i32, i32, true);
    int_eval!(bin_i64, un_i64, cmp_i64, i64, true);
    int_eval!(bin_u8, un_u8, cmp_u8, u8, false);
    int_eval!(bin_u32, un_u32, cmp_u32, u32, false);
    int_eval!(bin_u64, un_u64, cmp_u64, u64, false);

    macro_rules! float_eval {
        ($bin:ident, $un:ident, $t:ty) => {
            fn $bin(op: BinaryOp, a: f64, b: f64) -> Option<f64> {
                let (a, b) = (a as $t, b as $t);
                Some(match op {
                    BinaryOp::Add => a + b,
                    BinaryOp::Sub => a - b,
                    BinaryOp::Mul => a * b,
                    BinaryOp::Div => a / b,
                    BinaryOp::Rem => a % b,
                    BinaryOp::Min | BinaryOp::Max
                        if a == 0.0 && b == 0.0 && a.to_bits() != b.to_bits() =>
                    {
                        return None
                    }
                    BinaryOp::Min => a.min(b),
                    BinaryOp::Max => a.max(b),
                    _ => return None,
                } as f64)
            }
            fn $un(op: UnaryOp, a: f64) -> Option<f64> {
                let a = a as $t;
                Some(match op {
                    UnaryOp::Neg => -a,
                    UnaryOp::Abs => a.abs(),
                    UnaryOp::Floor => a.floor(),
                    UnaryOp::Ceil => a.ceil(),
                    UnaryOp::Sqrt => a.sqrt(),
                    _ => return None,
                } as f64)
            }
        };
    }
    float_eval!(bin_f32, un_f32, f32);
    float_eval!(bin_f64, un_f64, f64);

    const TYPES: [ScalarType; 8] = [
        ScalarType::I8,
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::U8,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::F32,
        ScalarType::F64,
    ];

    type BinFn = fn(BinaryOp, i64, i64) -> Option<i64>;
    type UnFn = fn(UnaryOp, i64) -> Option<i64>;
    type CmpFn = fn(i64, i64) -> std::cmp::Ordering;

    fn int_fns(s: ScalarType) -> (BinFn, UnFn, CmpFn) {
        match s {
            ScalarType::I8 => (bin_i8, un_i8, cmp_i8),
            ScalarType::I32 => (bin_i32, un_i32, cmp_i32),
            ScalarType::I64 => (bin_i64, un_i64, cmp_i64),
            ScalarType::U8 => (bin_u8, un_u8, cmp_u8),
            ScalarType::U32 => (bin_u32, un_u32, cmp_u32),
            _ => (bin_u64, un_u64, cmp_u64),
        }
    }

    fn test_pred(p: CmpPred, o: Option<std::cmp::Ordering>) -> bool {
        use std::cmp::Ordering::*;
        match (p, o) {
            (CmpPred::Ne, None) => true,
            (_, None) => false,
            (CmpPred::Eq, Some(o)) => o == Equal,
            (CmpPred::Ne, Some(o)) => o != Equal,
            (CmpPred::Lt, Some(o)) => o == Less,
            (CmpPred::Le, Some(o)) => o != Greater,
            (CmpPred::Gt, Some(o)) => o == Greater,
            (CmpPred::Ge, Some(o)) => o != Less,
        }
    }

    /// Builds the node list from raw choices, evaluating as it goes; ops the folder
    /// must not fold (division by zero, ...) are replaced by `add`.
    fn build(
        s: ScalarType,
        raw: &[(u8, u8, [usize; 4], i64, f64)],
    ) -> (Vec<Node>, Vec<ConstValue>) {
        let mut nodes = Vec::new();
        let mut vals: Vec<ConstValue> = Vec::new();
        for (i, &(kind, opi, idx, iv, fv)) in raw.iter().enumerate() {
            let n = nodes.len();
            let pick = |k: usize| idx[k] % n.max(1);
            let konst = if s.is_float() {
                let specials = [0.0, -0.0, 1.0, -1.5, f64::INFINITY, f64::NAN, 1e-40];
                let x = if opi % 3 == 0 {
                    specials[opi as usize % specials.len()]
                } else {
                    fv
                };
                ConstValue::Float(if s == ScalarType::F32 {
                    x as f32 as f64
                } else {
                    x
                })
            } else {
                let small = [0, 1, -1, 2, i64::MIN, i64::MAX, 7, 64];
                let x = if opi % 3 == 0 {
                    small[opi as usize % small.len()]
                } else {
                    iv
                };
                let (b, ..) = int_fns(s);
                ConstValue::Int(b(BinaryOp::Or, x, 0).unwrap()) // normalize to the type
            };
            if i == 0 || kind % 5 == 0 {
                nodes.push(Node::Const(konst));
                vals.push(konst);
                continue;
            }
            let mut node = match kind % 5 {
                1 | 2 => Node::Bin(BinaryOp::ALL[opi as usize % 12], pick(0), pick(1)),
                3 => Node::Un(UnaryOp::ALL[opi as usize % UnaryOp::ALL.len()], pick(0)),
                _ => Node::Sel(
                    CmpPred::ALL[opi as usize % 6],
                    [pick(0), pick(1), pick(2), pick(3)],
                ),
            };
            let eval = |node: &Node| -> Option<ConstValue> {
                match (*node).clone() {
                    Node::Const(c) => Some(c),
                    Node::Bin(op, a, b) => match (vals[a], vals[b]) {
                        (ConstValue::Int(x), ConstValue::Int(y)) => {
                            int_fns(s).0(op, x, y).map(ConstValue::Int)
                        }
                        (ConstValue::Float(x), ConstValue::Float(y)) => {
                            let f = if s == ScalarType::F32 {
                                bin_f32
                            } else {
                                bin_f64
                            };
                            f(op, x, y).map(ConstValue::Float)
                        }
                        _ => None,
                    },
                    Node::Un(op, a) => match vals[a] {
                        ConstValue::Int(x) => int_fns(s).1(op, x).map(ConstValue::Int),
                        ConstValue::Float(x) => {
                            let f = if s == ScalarType::F32 { un_f32 } else { un_f64 };
                            f(op, x).map(ConstValue::Float)
                        }
                        _ => None,
                    },
                    Node::Sel(p, [a, b, c, d]) => {
                        let o = match (vals[a], vals[b]) {
                            (ConstValue::Int(x), ConstValue::Int(y)) => Some(int_fns(s).2(x, y)),
                            (ConstValue::Float(x), ConstValue::Float(y)) => x.partial_cmp(&y),
                            _ => None,
                        };
                        Some(if test_pred(p, o) { vals[c] } else { vals[d] })
                    }
                }
            };
            let v = match eval(&node) {
                Some(v) => v,
                None => {
                    let (a, b) = (pick(0), pick(1));
                    node = Node::Bin(BinaryOp::Add, a, b);
                    eval(&node).expect("add always evaluates")
                }
            };
            nodes.push(node);
            vals.push(v);
        }
        (nodes, vals)
    }

    fn same(a: ConstValue, b: ConstValue) -> bool {
        match (a, b) {
            (ConstValue::Float(x), ConstValue::Float(y)) if x.is_nan() && y.is_nan() => true,
            _ => a.bit_eq(&b),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn folding_matches_direct_evaluation(
            ty in 0usize..TYPES.len(),
            raw in proptest::collection::vec(
                (any::<u8>(), any::<u8>(), any::<[usize; 4]>(), any::<i64>(), any::<f64>()),
                1..24,
            ),
        ) {
            let s = TYPES[ty];
            let (nodes, vals) = build(s, &raw);
            let mut b = FunctionBuilder::new("k", sp());
            let mut ids: Vec<ValueId> = Vec::new();
            for n in &nodes {
                let v = match n {
                    Node::Const(c) => b.constant(*c, st(s), sp()).unwrap(),
                    Node::Bin(op, x, y) => bin(&mut b, *op, ids[*x], ids[*y]),
                    Node::Un(op, x) => {
                        b.op1(OpKind::Unary(*op), &[ids[*x]], None, sp()).unwrap()
                    }
                    Node::Sel(p, [x, y, c, d]) => {
                        let k = b.op1(OpKind::Cmp(*p), &[ids[*x], ids[*y]], None, sp()).unwrap();
                        b.op1(OpKind::Select, &[k, ids[*c], ids[*d]], None, sp()).unwrap()
                    }
                };
                ids.push(v);
            }
            for &v in &ids {
                sink(&mut b, v);
            }
            let mut f = b.finish();
            verify(&f).unwrap();
            canonicalize(&mut f);
            verify(&f).unwrap();
            for (i, (&v, want)) in stored(&f).iter().zip(&vals).enumerate() {
                let got = const_of(&f, v);
                prop_assert!(
                    got.is_some_and(|g| same(g, *want)),
                    "node {i} {:?}: got {got:?}, want {want:?}", nodes[i]
                );
            }
            let f = opt(f);
            prop_assert_eq!(count(&f, "const"), f.num_ops() - count(&f, "store"));
        }
    }
}

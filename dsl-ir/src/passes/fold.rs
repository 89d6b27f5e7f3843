//! The constant evaluators behind [`canonicalize`](fn@super::canonicalize): each
//! computes an op on constants exactly as the semantics documented on
//! [`OpKind`](crate::ir::OpKind) say, or declines (`None`) where they leave the result
//! open. Integers are held as the canonical `i64` of their type ([`norm_int`]), floats
//! as `f64` rounded to their type.

use half::{bf16, f16};

use crate::ir::{BinaryOp, CmpPred, ConstValue, UnaryOp};
use crate::types::ScalarType;

/// The canonical `i64` holding an integer of type `s`: sign-extended for signed types,
/// zero-extended for unsigned ones narrower than 64 bits, the bit pattern for `u64`.
pub(super) fn norm_int(s: ScalarType, v: i64) -> i64 {
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

pub(super) fn eval_binary(
    s: ScalarType,
    b: BinaryOp,
    a: ConstValue,
    c: ConstValue,
) -> Option<ConstValue> {
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

pub(super) fn eval_unary(s: ScalarType, u: UnaryOp, a: ConstValue) -> Option<ConstValue> {
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

pub(super) fn eval_cmp(s: ScalarType, p: CmpPred, a: ConstValue, c: ConstValue) -> Option<bool> {
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

pub(super) fn eval_cast(from: ScalarType, to: ScalarType, c: ConstValue) -> Option<ConstValue> {
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

#[cfg(test)]
mod tests {
    use crate::builder::FunctionBuilder;
    use crate::ir::{BinaryOp, CmpPred, ConstValue, OpKind, UnaryOp, ValueId};
    use crate::passes::canonicalize;
    use crate::passes::tests::*;
    use crate::types::ScalarType;
    use crate::verify::verify;
    use proptest::prelude::*;

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

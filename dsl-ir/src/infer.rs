//! Result-type rules of every op without regions: the single source of truth shared by
//! the builder (which computes result types) and the verifier (which checks them).

use crate::ir::{BinaryOp, HintKind, OpKind, ScaledFormat, UnaryOp};
use crate::types::{AddrSpace, Elem, ScalarType, Type};

/// Result types of an op of `kind` whose operands have `operands` types, or a message
/// saying why the operands are invalid. `result_hint` supplies what the operands cannot
/// determine: the result type of `const`, `splat`, `broadcast`, `reshape`, `cast`.
/// Ops with regions and terminators are checked by the verifier, not here.
pub fn infer_result_types(
    kind: &OpKind,
    operands: &[&Type],
    result_hint: Option<&Type>,
) -> Result<Vec<Type>, String> {
    let n = operands.len();
    let expect_n = |want: usize| -> Result<(), String> {
        if n == want {
            Ok(())
        } else {
            Err(format!(
                "`{}` takes {want} operand(s), got {n}",
                kind.mnemonic()
            ))
        }
    };
    let hint = |what: &str| -> Result<&Type, String> {
        result_hint.ok_or_else(|| format!("`{}` needs a result type ({what})", kind.mnemonic()))
    };
    match kind {
        OpKind::ProgramId { axis } | OpKind::NumPrograms { axis } => {
            expect_n(0)?;
            if *axis > 2 {
                return Err(format!("grid axis must be 0, 1 or 2, got {axis}"));
            }
            Ok(vec![Type::scalar(ScalarType::I32)])
        }
        OpKind::Const(c) => {
            expect_n(0)?;
            let t = hint("the constant's type")?;
            check_shape(&t.shape)?;
            let s = t
                .scalar_type()
                .ok_or_else(|| "a constant cannot be a pointer".to_string())?;
            use crate::ir::ConstValue as C;
            let ok = match c {
                C::Bool(_) => s.is_bool(),
                C::Int(_) => s.is_int(),
                C::Float(_) => s.is_float(),
            };
            if !ok {
                return Err(format!("constant {c:?} does not fit type {s}"));
            }
            Ok(vec![t.clone()])
        }
        OpKind::Arange { start, end } => {
            expect_n(0)?;
            let len = end - start;
            if len <= 0 || !(len as u64).is_power_of_two() || len > (1 << 20) {
                return Err(format!(
                    "arange length must be a power of two (got {start}..{end}, length {len})"
                ));
            }
            if *start < i32::MIN as i64 || *end > i32::MAX as i64 + 1 {
                return Err(format!("arange bounds {start}..{end} do not fit i32"));
            }
            Ok(vec![Type::tile(ScalarType::I32, &[len as u32])])
        }
        OpKind::LocalAlloc { len } => {
            expect_n(0)?;
            let t = hint("the element type")?;
            let ok = t.is_scalar()
                && matches!(
                    t.elem,
                    Elem::Ptr {
                        space: AddrSpace::Shared,
                        ..
                    }
                );
            if !ok {
                return Err(format!(
                    "local_alloc gives a ptr<T, shared> scalar, not {t}"
                ));
            }
            if *len == 0 {
                return Err("local_alloc of 0 elements".into());
            }
            Ok(vec![t.clone()])
        }
        OpKind::Splat => {
            expect_n(1)?;
            let t = hint("the tile shape")?;
            if !operands[0].is_scalar() {
                return Err(format!("splat needs a scalar, got {}", operands[0]));
            }
            check_shape(&t.shape)?;
            Ok(vec![operands[0].with_shape(&t.shape)])
        }
        OpKind::Broadcast => {
            expect_n(1)?;
            let t = hint("the target shape")?;
            let src = operands[0];
            check_shape(&t.shape)?;
            if src.rank() != t.rank() {
                return Err(format!(
                    "broadcast keeps the rank: cannot broadcast {src} to shape {:?}",
                    t.shape
                ));
            }
            for (a, b) in src.shape.iter().zip(&t.shape) {
                if a != b && *a != 1 {
                    return Err(format!("cannot broadcast {src} to shape {:?}", t.shape));
                }
            }
            Ok(vec![src.with_shape(&t.shape)])
        }
        OpKind::ExpandDims { axis } => {
            expect_n(1)?;
            let src = operands[0];
            let axis = *axis as usize;
            if axis > src.rank() {
                return Err(format!("expand_dims axis {axis} out of range for {src}"));
            }
            let mut shape = src.shape.clone();
            shape.insert(axis, 1);
            Ok(vec![src.with_shape(&shape)])
        }
        OpKind::Reshape => {
            expect_n(1)?;
            let t = hint("the new shape")?;
            let src = operands[0];
            check_shape(&t.shape)?;
            if src.numel() != t.numel() {
                return Err(format!(
                    "reshape must keep the element count: {src} has {}, shape {:?} has {}",
                    src.numel(),
                    t.shape,
                    t.numel()
                ));
            }
            Ok(vec![src.with_shape(&t.shape)])
        }
        OpKind::Hint { kind, values } => {
            expect_n(1)?;
            let src = operands[0];
            if !src.scalar_type().is_some_and(|s| s.is_int()) {
                return Err(format!(
                    "`{}` applies to integer scalars and tiles, not {src}",
                    kind.name()
                ));
            }
            let dims: Vec<u32> = if src.shape.is_empty() {
                vec![1]
            } else {
                src.shape.clone()
            };
            if values.len() != dims.len() {
                return Err(format!(
                    "`{}` needs one value per dimension of {src} ({}), got {values:?}",
                    kind.name(),
                    dims.len()
                ));
            }
            for (&v, &d) in values.iter().zip(&dims) {
                if v == 0 {
                    return Err(format!(
                        "`{}` values must be at least 1, got {values:?}",
                        kind.name()
                    ));
                }
                if *kind != HintKind::MultipleOf && v > d && !src.shape.is_empty() {
                    return Err(format!(
                        "`{}` value {v} exceeds the dimension's size {d} in {src}",
                        kind.name()
                    ));
                }
            }
            Ok(vec![src.clone()])
        }
        OpKind::Permute { order } => {
            expect_n(1)?;
            let src = operands[0];
            let mut seen = vec![false; src.rank()];
            if order.len() != src.rank() {
                return Err(format!(
                    "permute order {order:?} does not match rank of {src}"
                ));
            }
            for &o in order {
                let o = o as usize;
                if o >= src.rank() || seen[o] {
                    return Err(format!("permute order {order:?} is not a permutation"));
                }
                seen[o] = true;
            }
            let shape: Vec<u32> = order.iter().map(|&o| src.shape[o as usize]).collect();
            Ok(vec![src.with_shape(&shape)])
        }
        OpKind::Binary(op) => {
            expect_n(2)?;
            same_type(operands[0], operands[1], op.name())?;
            let s = scalar(operands[0], op.name())?;
            no_fp8_arith(s, op.name())?;
            if op.is_bitwise() && s.is_float() {
                return Err(format!("`{}` is not defined on {s}", op.name()));
            }
            if *op == BinaryOp::Pow && !s.is_float() {
                return Err(format!("`pow` needs float operands, got {s}"));
            }
            if matches!(op, BinaryOp::Shl | BinaryOp::Shr) && s.is_bool() {
                return Err(format!("`{}` is not defined on i1", op.name()));
            }
            if !op.is_bitwise() && s.is_bool() {
                return Err(format!("arithmetic `{}` is not defined on i1", op.name()));
            }
            Ok(vec![operands[0].clone()])
        }
        OpKind::Unary(op) => {
            expect_n(1)?;
            let s = scalar(operands[0], op.name())?;
            no_fp8_arith(s, op.name())?;
            if op.is_float_only() && !s.is_float() {
                return Err(format!("`{}` needs a float operand, got {s}", op.name()));
            }
            if op.is_int_only() && !s.is_int() {
                return Err(format!("`{}` needs an integer operand, got {s}", op.name()));
            }
            if *op == UnaryOp::Not && s.is_float() {
                return Err(format!("`not` is not defined on {s}"));
            }
            if matches!(op, UnaryOp::Neg | UnaryOp::Abs) && s.is_bool() {
                return Err(format!("`{}` is not defined on i1", op.name()));
            }
            Ok(vec![operands[0].clone()])
        }
        OpKind::Fma => {
            expect_n(3)?;
            same_type(operands[0], operands[1], "fma")?;
            same_type(operands[0], operands[2], "fma")?;
            let s = scalar(operands[0], "fma")?;
            if !s.is_float() {
                return Err(format!("`fma` needs float operands, got {s}"));
            }
            Ok(vec![operands[0].clone()])
        }
        OpKind::Cmp(p) => {
            expect_n(2)?;
            same_type(operands[0], operands[1], p.name())?;
            no_fp8_arith(scalar(operands[0], "cmp")?, p.name())?;
            Ok(vec![Type::tile(ScalarType::I1, &operands[0].shape)])
        }
        OpKind::Select => {
            expect_n(3)?;
            if operands[0].elem != Elem::Scalar(ScalarType::I1) {
                return Err(format!("select condition must be i1, got {}", operands[0]));
            }
            same_type(operands[1], operands[2], "select")?;
            if operands[0].shape != operands[1].shape {
                return Err(format!(
                    "select condition shape {:?} differs from value shape {:?}",
                    operands[0].shape, operands[1].shape
                ));
            }
            Ok(vec![operands[1].clone()])
        }
        OpKind::Cast => {
            expect_n(1)?;
            let t = hint("the target type")?;
            let from = scalar(operands[0], "cast")?;
            let to = t
                .scalar_type()
                .ok_or_else(|| "cannot cast to a pointer".to_string())?;
            // The 8-bit floats convert to and from the 16- and 32-bit floats only
            // (one rounding, the same on every target).
            let fp8_ok = |s: ScalarType| {
                matches!(s, ScalarType::F16 | ScalarType::BF16 | ScalarType::F32) || s.is_fp8()
            };
            if (from.is_fp8() || to.is_fp8()) && from != to && !(fp8_ok(from) && fp8_ok(to)) {
                return Err(format!(
                    "cast from {from} to {to}: the 8-bit floats convert only to and from f16, bf16 and f32"
                ));
            }
            Ok(vec![Type::tile(to, &operands[0].shape)])
        }
        OpKind::Bitcast => {
            expect_n(1)?;
            let t = hint("the target type")?;
            let from = scalar(operands[0], "bitcast")?;
            let to = t
                .scalar_type()
                .ok_or_else(|| "cannot bitcast to a pointer".to_string())?;
            if from.is_bool() || to.is_bool() {
                return Err(format!(
                    "`bitcast` from {from} to {to}: i1 has no bit layout"
                ));
            }
            if from.bits() != to.bits() {
                return Err(format!(
                    "`bitcast` from {from} to {to}: the widths differ ({} and {} bits)",
                    from.bits(),
                    to.bits()
                ));
            }
            Ok(vec![Type::tile(to, &operands[0].shape)])
        }
        OpKind::AddPtr => {
            expect_n(2)?;
            let (p, o) = (operands[0], operands[1]);
            if !p.elem.is_ptr() {
                return Err(format!("addptr needs pointers, got {p}"));
            }
            match o.scalar_type() {
                Some(s) if s.is_int() => {}
                _ => return Err(format!("addptr offsets must be integers, got {o}")),
            }
            if p.shape != o.shape {
                return Err(format!(
                    "addptr pointer shape {:?} differs from offset shape {:?}",
                    p.shape, o.shape
                ));
            }
            Ok(vec![p.clone()])
        }
        OpKind::Load {
            has_mask,
            has_other,
        } => {
            expect_n(1 + *has_mask as usize + *has_other as usize)?;
            if *has_other && !*has_mask {
                return Err("load with `other` needs a mask".into());
            }
            let pointee = pointee(operands[0], "load")?;
            let value = Type::tile(pointee, &operands[0].shape);
            if *has_mask {
                check_mask(operands[1], &operands[0].shape, "load")?;
            }
            if *has_other && *operands[2] != value {
                return Err(format!("load `other` must be {value}, got {}", operands[2]));
            }
            Ok(vec![value])
        }
        OpKind::Store { has_mask } => {
            expect_n(2 + *has_mask as usize)?;
            let pointee = pointee(operands[0], "store")?;
            let value = Type::tile(pointee, &operands[0].shape);
            if *operands[1] != value {
                return Err(format!(
                    "store of {} through pointers to {pointee}: expected {value}",
                    operands[1]
                ));
            }
            if *has_mask {
                check_mask(operands[2], &operands[0].shape, "store")?;
            }
            Ok(vec![])
        }
        OpKind::DescLoad { rank, has_pred } => {
            let d = crate::ir::DescOperands::new(*rank)?;
            expect_n(d.count() + *has_pred as usize)?;
            let pointee = d.check(operands, "desc_load")?;
            if *has_pred && *operands[d.extra()] != Type::scalar(ScalarType::I1) {
                return Err(format!(
                    "`desc_load` predicate must be i1, got {}",
                    operands[d.extra()]
                ));
            }
            let t = hint("the block shape")?;
            check_shape(&t.shape)?;
            let value = Type::tile(pointee, &t.shape);
            if *t != value || t.shape.len() != d.rank {
                return Err(format!(
                    "`desc_load` of rank {} through a descriptor of {pointee} yields a {}-D tile of {pointee}, not {t}",
                    d.rank, d.rank
                ));
            }
            Ok(vec![value])
        }
        OpKind::DescStore { rank } => {
            let d = crate::ir::DescOperands::new(*rank)?;
            expect_n(d.count() + 1)?;
            let pointee = d.check(operands, "desc_store")?;
            let v = operands[d.extra()];
            check_shape(&v.shape)?;
            if v.elem != Elem::Scalar(pointee) || v.shape.len() != d.rank {
                return Err(format!(
                    "`desc_store` of rank {} through a descriptor of {pointee} stores a {}-D tile of {pointee}, not {v}",
                    d.rank, d.rank
                ));
            }
            Ok(vec![])
        }
        OpKind::AtomicRmw {
            op,
            has_mask,
            scope,
            ..
        } => {
            expect_n(2 + *has_mask as usize)?;
            let pointee = pointee(operands[0], "atomic_rmw")?;
            local_scope(operands[0], *scope)?;
            let value = Type::tile(pointee, &operands[0].shape);
            if *operands[1] != value {
                return Err(format!(
                    "atomic_rmw value {} does not match pointers to {pointee}",
                    operands[1]
                ));
            }
            if pointee.is_bool() || pointee.bits() < 16 {
                return Err(format!("atomics on {pointee} are not supported"));
            }
            if pointee.is_float()
                && !matches!(
                    op,
                    crate::ir::AtomicOp::Add
                        | crate::ir::AtomicOp::Xchg
                        | crate::ir::AtomicOp::Min
                        | crate::ir::AtomicOp::Max
                )
            {
                return Err(format!(
                    "atomic `{}` is not defined on {pointee}",
                    op.name()
                ));
            }
            if *has_mask {
                check_mask(operands[2], &operands[0].shape, "atomic_rmw")?;
            }
            Ok(vec![value])
        }
        OpKind::AtomicCas {
            has_mask, scope, ..
        } => {
            expect_n(3 + *has_mask as usize)?;
            let pointee = pointee(operands[0], "atomic_cas")?;
            local_scope(operands[0], *scope)?;
            let value = Type::tile(pointee, &operands[0].shape);
            if pointee.is_float() || pointee.is_bool() || pointee.bits() < 16 {
                return Err(format!("atomic_cas on {pointee} is not supported"));
            }
            for o in &operands[1..3] {
                if **o != value {
                    return Err(format!("atomic_cas operand {o} must be {value}"));
                }
            }
            if *has_mask {
                check_mask(operands[3], &operands[0].shape, "atomic_cas")?;
            }
            Ok(vec![value])
        }
        OpKind::Dot => {
            expect_n(3)?;
            let (a, b, c) = (operands[0], operands[1], operands[2]);
            if a.rank() != 2 || b.rank() != 2 || c.rank() != 2 {
                return Err(format!("dot needs 2-D tiles, got {a}, {b}, {c}"));
            }
            let (sa, sb) = (scalar(a, "dot")?, scalar(b, "dot")?);
            if sa != sb {
                return Err(format!("dot operands differ in type: {a} and {b}"));
            }
            if a.shape[1] != b.shape[0] {
                return Err(format!(
                    "dot inner dimensions differ: {a} times {b} ({} vs {})",
                    a.shape[1], b.shape[0]
                ));
            }
            let acc = dot_acc_type(sa).ok_or_else(|| format!("dot is not defined on {sa}"))?;
            let want = Type::tile(acc, &[a.shape[0], b.shape[1]]);
            if *c != want {
                return Err(format!("dot accumulator must be {want}, got {c}"));
            }
            Ok(vec![want])
        }
        OpKind::DotScaled { format } => {
            expect_n(5)?;
            dot_scaled_type(*format, operands)
        }
        OpKind::Reduce { axis, op } | OpKind::Scan { axis, op, .. } => {
            expect_n(1)?;
            let src = operands[0];
            let s = scalar(src, kind.mnemonic())?;
            no_fp8_arith(s, kind.mnemonic())?;
            if (*axis as usize) >= src.rank() {
                return Err(format!(
                    "{} axis {axis} out of range for {src}",
                    kind.mnemonic()
                ));
            }
            let bitwise = matches!(
                op,
                crate::ir::ReduceOp::And | crate::ir::ReduceOp::Or | crate::ir::ReduceOp::Xor
            );
            if bitwise && s.is_float() {
                return Err(format!(
                    "{} `{}` is not defined on {s}",
                    kind.mnemonic(),
                    op.name()
                ));
            }
            if !bitwise && s.is_bool() {
                return Err(format!(
                    "{} `{}` is not defined on i1",
                    kind.mnemonic(),
                    op.name()
                ));
            }
            if matches!(kind, OpKind::Scan { .. }) {
                return Ok(vec![src.clone()]);
            }
            let mut shape = src.shape.clone();
            shape.remove(*axis as usize);
            Ok(vec![src.with_shape(&shape)])
        }
        OpKind::Barrier | OpKind::Fence { .. } | OpKind::BarrierAll => {
            expect_n(0)?;
            Ok(vec![])
        }
        OpKind::Print { .. } => {
            if let Some(t) = operands.iter().find(|t| t.elem.is_ptr()) {
                return Err(format!("`print` cannot print pointers, got {t}"));
            }
            let mut tiles = operands.iter().filter(|t| !t.is_scalar());
            if let Some(first) = tiles.next()
                && let Some(t) = tiles.find(|t| t.shape != first.shape)
            {
                return Err(format!(
                    "`print` operands are scalars or tiles of one shape, got shapes {:?} and {:?}",
                    first.shape, t.shape
                ));
            }
            Ok(vec![])
        }
        OpKind::Assert { .. } => {
            expect_n(1)?;
            if operands[0].elem != Elem::Scalar(ScalarType::I1) {
                return Err(format!(
                    "`assert` needs an i1 condition, got {}",
                    operands[0]
                ));
            }
            Ok(vec![])
        }
        OpKind::Rank | OpKind::WorldSize => {
            expect_n(0)?;
            Ok(vec![Type::scalar(ScalarType::I32)])
        }
        OpKind::RemotePtr => {
            expect_n(2)?;
            pointee(operands[0], "remote_ptr")?;
            if let Elem::Ptr { space, .. } = operands[0].elem
                && space != crate::types::AddrSpace::Global
            {
                return Err(format!(
                    "`remote_ptr` needs global pointers, got {}",
                    operands[0]
                ));
            }
            if *operands[1] != Type::scalar(ScalarType::I32) {
                return Err(format!(
                    "`remote_ptr` peer must be an i32 scalar, got {}",
                    operands[1]
                ));
            }
            Ok(vec![operands[0].clone()])
        }
        OpKind::Signal { .. } | OpKind::WaitUntil { .. } => {
            expect_n(2)?;
            let what = kind.mnemonic();
            let sig = Type {
                elem: Elem::Ptr {
                    pointee: ScalarType::U64,
                    space: crate::types::AddrSpace::Global,
                },
                shape: vec![],
            };
            if *operands[0] != sig {
                return Err(format!(
                    "`{what}` needs a scalar pointer to a u64 signal word ({sig}), got {}",
                    operands[0]
                ));
            }
            if *operands[1] != Type::scalar(ScalarType::U64) {
                return Err(format!(
                    "`{what}` value must be a u64 scalar, got {}",
                    operands[1]
                ));
            }
            if matches!(kind, OpKind::WaitUntil { .. }) {
                Ok(vec![Type::scalar(ScalarType::U64)])
            } else {
                Ok(vec![])
            }
        }
        OpKind::For | OpKind::If | OpKind::While | OpKind::Yield | OpKind::Condition => Err(
            format!("`{}` has regions or is a terminator", kind.mnemonic()),
        ),
    }
}

/// Atomics on block-local memory (`ptr<T, shared>`) have block scope: no other program
/// instance can see that memory.
fn local_scope(ptrs: &Type, scope: crate::ir::MemScope) -> Result<(), String> {
    if let Elem::Ptr {
        space: AddrSpace::Shared,
        ..
    } = ptrs.elem
        && scope != crate::ir::MemScope::Block
    {
        return Err(format!(
            "atomics on block-local memory have `block` scope, not `{}`",
            scope.name()
        ));
    }
    Ok(())
}

/// `Err` for arithmetic (`what`) on an 8-bit float, which is a storage and
/// matrix-unit type only.
fn no_fp8_arith(s: ScalarType, what: &str) -> Result<(), String> {
    if s.is_fp8() {
        return Err(format!(
            "`{what}` is not defined on {s}: the 8-bit floats are loaded, stored, cast (to f16, bf16 or f32) and multiplied by `dot`; cast to f16 or f32 for arithmetic"
        ));
    }
    Ok(())
}

/// The accumulator type of `dot` for an input type.
pub fn dot_acc_type(input: ScalarType) -> Option<ScalarType> {
    match input {
        ScalarType::F16
        | ScalarType::BF16
        | ScalarType::F32
        | ScalarType::F8E4M3
        | ScalarType::F8E5M2 => Some(ScalarType::F32),
        ScalarType::F64 => Some(ScalarType::F64),
        ScalarType::I8 => Some(ScalarType::I32),
        _ => None,
    }
}

/// Every dimension must be a power of two; at most 2^20 elements in all.
pub fn check_shape(shape: &[u32]) -> Result<(), String> {
    for &d in shape {
        if !d.is_power_of_two() {
            return Err(format!(
                "tile dimensions must be powers of two, got shape {shape:?}"
            ));
        }
    }
    let numel: u64 = shape.iter().map(|&d| d as u64).product();
    if numel > 1 << 20 {
        return Err(format!(
            "tile of shape {shape:?} has more than 2^20 elements"
        ));
    }
    Ok(())
}

fn same_type(a: &Type, b: &Type, what: &str) -> Result<(), String> {
    if a.shape != b.shape {
        return Err(format!("`{what}` operands differ in shape: {a} and {b}"));
    }
    if a.elem != b.elem {
        return Err(format!("`{what}` operands differ in type: {a} and {b}"));
    }
    Ok(())
}

fn scalar(t: &Type, what: &str) -> Result<ScalarType, String> {
    t.scalar_type()
        .ok_or_else(|| format!("`{what}` is not defined on pointers ({t})"))
}

fn pointee(t: &Type, what: &str) -> Result<ScalarType, String> {
    match t.elem {
        Elem::Ptr { pointee, .. } => Ok(pointee),
        Elem::Scalar(_) => Err(format!("`{what}` needs pointers, got {t}")),
    }
}

fn check_mask(m: &Type, shape: &[u32], what: &str) -> Result<(), String> {
    if m.elem != Elem::Scalar(ScalarType::I1) || m.shape != shape {
        return Err(format!(
            "`{what}` mask must be {}, got {m}",
            Type::tile(ScalarType::I1, shape)
        ));
    }
    Ok(())
}

/// The result type of `dot_scaled format a, a_scale, b, b_scale, acc`
/// ([`OpKind::DotScaled`]), or why the operands do not fit.
fn dot_scaled_type(format: ScaledFormat, ops: &[&Type]) -> Result<Vec<Type>, String> {
    let (a, sa, b, sb, acc) = (ops[0], ops[1], ops[2], ops[3], ops[4]);
    let name = format.name();
    if [a, sa, b, sb, acc].iter().any(|t| t.rank() != 2) {
        return Err(format!(
            "dot_scaled needs 2-D tiles, got {a}, {sa}, {b}, {sb}, {acc}"
        ));
    }
    let store = format.storage();
    for (what, t) in [("a", a), ("b", b)] {
        if t.scalar_type() != Some(store) {
            return Err(format!(
                "dot_scaled {name}: `{what}` must be a tile of {store}, got {t}"
            ));
        }
    }
    let per = format.per_element();
    let (m, k) = (a.shape[0], a.shape[1] * per);
    let (kb, n) = (b.shape[0], b.shape[1] * per);
    if kb != k {
        return Err(format!(
            "dot_scaled inner dimensions differ: {m}x{k} times {kb}x{n} ({a} times {b})"
        ));
    }
    let scale = sa.scalar_type();
    if sb.scalar_type() != scale {
        return Err(format!("dot_scaled scales differ in type: {sa} and {sb}"));
    }
    let v = match scale {
        Some(ScalarType::U8) => 32,
        Some(ScalarType::F8E4M3) if format == ScaledFormat::E2M1 => 16,
        _ => {
            return Err(format!(
                "dot_scaled {name}: scales are u8 (E8M0) tiles, or f8e4m3 tiles for e2m1 (NVFP4), got {sa}"
            ));
        }
    };
    if k % v != 0 {
        return Err(format!(
            "dot_scaled: K = {k} is not a multiple of the scale block {v}"
        ));
    }
    let want_sa = Type::tile(scale.unwrap_or(ScalarType::U8), &[m, k / v]);
    let want_sb = Type::tile(scale.unwrap_or(ScalarType::U8), &[k / v, n]);
    if *sa != want_sa || *sb != want_sb {
        return Err(format!(
            "dot_scaled scales must be {want_sa} and {want_sb} (one per {v} elements along K), got {sa} and {sb}"
        ));
    }
    let want = Type::tile(ScalarType::F32, &[m, n]);
    if *acc != want {
        return Err(format!("dot_scaled accumulator must be {want}, got {acc}"));
    }
    Ok(vec![want])
}

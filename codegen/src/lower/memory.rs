//! `addptr`, `load`, `store` and atomics.
//!
//! Masked accesses branch around the access (portable, and the backends turn short
//! branches into predicated instructions). Registers that hold `vec` consecutive
//! elements are accessed as one `<vec x T>` access aligned to its size when
//! [`crate::axis`] proves the pointers contiguous and aligned and the mask constant
//! over the vector. Stores and atomics are performed by one owner thread per element
//! when the layout replicates elements over threads. Where the back end drops the
//! ordering of `atomicrmw` ([`super::arch::Arch::rmw_needs_fences`]: NVPTX), a
//! release/acquire read-modify-write becomes `fence release; relaxed atom; fence
//! acquire` at the op's scope.

use inkwell::AtomicOrdering;
use inkwell::basic_block::BasicBlock;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue};
use tessera_ir::ir::{AtomicOp, MemOrder, Op, OpKind};
use tessera_ir::{AddrSpace, Elem, ScalarType};

use super::{LResult, LowerError, Lowerer, Tile, is_dup_reg};

pub(super) fn lower_addptr<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    let p = l.val(op.operands[0])?;
    let o = l.val(op.operands[1])?;
    let lay = if p.uniform || (l.rematerializable(op.operands[0]) && !o.uniform) {
        o.layout.clone()
    } else {
        p.layout.clone()
    };
    let p = l.relayout(op.operands[0], &p, &lay, &op.span)?;
    let o = l.relayout(op.operands[1], &o, &lay, &op.span)?;
    addptr_with(l, p, o)
}

/// `addptr` on a pointer tile and an offset tile already in one layout (uniform ones
/// in any).
pub(super) fn addptr_with<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    p: Tile<'ctx>,
    o: Tile<'ctx>,
) -> LResult<Tile<'ctx>> {
    let Elem::Ptr { pointee, .. } = p.elem else {
        return Err(LowerError::Llvm("addptr on a non-pointer".into()));
    };
    let oe = o.elem.scalar().unwrap_or(ScalarType::I64);
    let lay = if p.uniform {
        o.layout.clone()
    } else {
        p.layout.clone()
    };
    let et = l.mem_ty(Elem::Scalar(pointee));
    let uniform = p.uniform && o.uniform;
    let n = if uniform { 1 } else { lay.num_regs() };
    let i64t = l.cx.ctx.i64_type();
    let mut regs = Vec::with_capacity(n);
    for r in 0..n {
        let off = o.regs[r].into_int_value();
        let off = if oe.bits() == 64 {
            off
        } else if oe.is_signed_int() {
            l.cx.b.build_int_s_extend(off, i64t, "")?
        } else {
            l.cx.b.build_int_z_extend(off, i64t, "")?
        };
        let g = unsafe {
            l.cx.b
                .build_gep(et, p.regs[r].into_pointer_value(), &[off], "")?
        };
        regs.push(g.as_basic_value_enum());
    }
    if uniform {
        return Ok(l.uniform_tile(p.elem, lay, regs[0]));
    }
    Ok(Tile {
        elem: p.elem,
        layout: lay,
        regs,
        uniform: false,
    })
}

/// How many consecutive registers one access may cover.
fn vector_width(l: &Lowerer<'_, '_>, op: &Op, ptrs: &Tile<'_>, mask: Option<usize>) -> u32 {
    let Elem::Ptr { pointee, .. } = ptrs.elem else {
        return 1;
    };
    if pointee == ScalarType::I1 || ptrs.uniform {
        return 1;
    }
    let size = pointee.size_bytes() as u64;
    let lay = &ptrs.layout;
    if lay.shape.is_empty() {
        return 1;
    }
    // The dimension the leading register bases walk: the last one, or (a tile walked
    // column-major, see `Layout::blocked_columns`) the first of a 2-D one. Its
    // elements must be consecutive in memory (the axis analysis says so below).
    let rank = lay.shape.len();
    let d = if rank == 2 && lay.reg.first() == Some(&lay.shape[1]) {
        0
    } else {
        rank - 1
    };
    let (stride, extent) = (
        lay.shape[d + 1..].iter().product::<u32>() as u64,
        lay.shape[d] as u64,
    );
    // Leading register bases must walk consecutive elements along `d`.
    let mut run = 1u64;
    for (i, &b) in lay.reg.iter().enumerate() {
        if u64::from(b) == stride << i && (1u64 << (i + 1)) <= extent {
            run = 1 << (i + 1);
        } else {
            break;
        }
    }
    let info = l.axis.get(l.f, op.operands[0]);
    if info.contiguity.len() != rank {
        return 1;
    }
    let mut v = run
        .min(16 / size)
        .min(info.contiguity[d])
        .min(info.divisibility[d] / size);
    if let Some(mi) = mask {
        let m = l.axis.get(l.f, op.operands[mi]);
        v = v.min(m.constancy[d]);
    }
    if v == 0 {
        return 1;
    }
    1 << (63 - v.leading_zeros())
}

/// Emits `if cond { then() }` and returns the value phi'd with `other` on the false
/// edge (or nothing).
fn guarded<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    cond: Option<IntValue<'ctx>>,
    other: Option<BasicValueEnum<'ctx>>,
    then: impl FnOnce() -> LResult<Option<BasicValueEnum<'ctx>>>,
) -> LResult<Option<BasicValueEnum<'ctx>>> {
    let Some(c) = cond else {
        return then();
    };
    let cur: BasicBlock = l.cx.cur_block();
    let bt = l.cx.ctx.append_basic_block(l.kernel, "mask.then");
    let bm = l.cx.ctx.append_basic_block(l.kernel, "mask.end");
    l.cx.b.build_conditional_branch(c, bt, bm)?;
    l.cx.b.position_at_end(bt);
    let v = then()?;
    let end_t = l.cx.cur_block();
    l.cx.b.build_unconditional_branch(bm)?;
    l.cx.b.position_at_end(bm);
    match (v, other) {
        (Some(v), Some(o)) => {
            let phi = l.cx.b.build_phi(v.get_type(), "")?;
            phi.add_incoming(&[(&v as &dyn BasicValue, end_t), (&o as &dyn BasicValue, cur)]);
            Ok(Some(phi.as_basic_value()))
        }
        _ => Ok(None),
    }
}

fn and_opt<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    a: Option<IntValue<'ctx>>,
    b: Option<IntValue<'ctx>>,
) -> LResult<Option<IntValue<'ctx>>> {
    Ok(match (a, b) {
        (Some(a), Some(b)) => Some(l.cx.b.build_and(a, b, "")?),
        (a, None) => a,
        (None, b) => b,
    })
}

fn set_align(v: impl inkwell::values::AsValueRef, align: u32) {
    unsafe {
        inkwell::llvm_sys::core::LLVMSetAlignment(v.as_value_ref(), align);
    }
}

/// A load of `ty` (`bytes` bytes, aligned to them) at `p`; through the engine when
/// `remote` and `p` carries an off-node tag ([`super::engine`]).
fn load_at<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    space: AddrSpace,
    p: PointerValue<'ctx>,
    ty: BasicTypeEnum<'ctx>,
    bytes: u32,
    remote: bool,
) -> LResult<BasicValueEnum<'ctx>> {
    let near = |p| {
        let p = l.access_ptr(space, p, bytes, false, "load")?;
        let v = l.cx.b.build_load(ty, p, "")?;
        set_align(v, bytes);
        Ok(Some(v))
    };
    let v = if remote && space == AddrSpace::Global {
        l.split_remote(p, near, |a, pe| Ok(Some(l.engine_get(ty, a, pe)?)))?
    } else {
        near(p)?
    };
    v.ok_or_else(|| LowerError::Llvm("a load produced no value".into()))
}

/// A store of `v` (`bytes` bytes, aligned to them) at `p`; through the engine when
/// `remote` and `p` carries an off-node tag.
fn store_at<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    space: AddrSpace,
    p: PointerValue<'ctx>,
    v: BasicValueEnum<'ctx>,
    bytes: u32,
    remote: bool,
) -> LResult<()> {
    let near = |p| {
        let p = l.access_ptr(space, p, bytes, true, "store")?;
        let s = l.cx.b.build_store(p, v)?;
        set_align(s, bytes);
        Ok(None)
    };
    if remote && space == AddrSpace::Global {
        l.split_remote(p, near, |a, pe| {
            l.engine_put(v, a, pe)?;
            Ok(None)
        })?;
    } else {
        near(p)?;
    }
    Ok(())
}

pub(super) fn lower_load<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    let OpKind::Load {
        has_mask,
        has_other,
    } = op.kind
    else {
        unreachable!()
    };
    let ptrs = l.val(op.operands[0])?;
    let Elem::Ptr { pointee, space } = ptrs.elem else {
        return Err(LowerError::Llvm("load from a non-pointer".into()));
    };
    let remote = l.maybe_remote(op.operands[0]);
    let elem = Elem::Scalar(pointee);
    let mut ptrs = ptrs;
    let mut lay = ptrs.layout.clone();
    // Loads that feed only matrix units take 16-byte vectors (the `dot` operands are
    // staged through shared memory, whatever layout they arrive in), when the
    // pointers and mask can be recomputed in that layout.
    if !ptrs.uniform && l.feeds_only_dot(op.results[0]) {
        let vec = (16 / pointee.size_bytes().max(1)) as u32;
        let want = if super::dot::k_major_operand(l, op) {
            // Contiguous along `k` (dimension 0): 16-byte runs down the columns.
            crate::layout::Layout::blocked_columns(&lay.shape, vec, l.ws, l.nw)
        } else {
            super::dot::operand_load_layout(l, op.results[0], &lay.shape, vec)
                .unwrap_or_else(|| crate::layout::Layout::blocked(&lay.shape, vec, l.ws, l.nw))
        };
        if want != lay
            && l.rematerializable(op.operands[0])
            && (!has_mask || l.rematerializable(op.operands[1]))
        {
            ptrs = l.relayout(op.operands[0], &ptrs, &want, &op.span)?;
            lay = want;
        }
    } else if !ptrs.uniform
        && l.rematerializable(op.operands[0])
        && (!has_mask || l.rematerializable(op.operands[1]))
        && (!has_other || l.rematerializable(op.operands[2]))
    {
        // Loaded straight into the layout its consumer computes in; else in 16-byte
        // runs per thread where the tile has that many for every thread (narrow
        // elements: 8 f16 rather than the default 4).
        let want = l
            .consumer_layout(op.results[0])
            .unwrap_or_else(|| wide_layout(l, &lay, pointee.size_bytes() as u32));
        if want != lay {
            ptrs = l.relayout(op.operands[0], &ptrs, &want, &op.span)?;
            lay = want;
        }
    }
    let mask = if has_mask {
        let m = l.val(op.operands[1])?;
        if ptrs.uniform && !m.uniform {
            lay = m.layout.clone();
            ptrs = l.relayout(op.operands[0], &ptrs, &lay, &op.span)?;
        }
        Some(l.relayout(op.operands[1], &m, &lay, &op.span)?)
    } else {
        None
    };
    let other = if has_other {
        Some(l.relayout(op.operands[2], &l.val(op.operands[2])?, &lay, &op.span)?)
    } else {
        None
    };
    let reg_ty = l.ty(elem);
    let mem_ty = l.mem_ty(elem);
    let size = pointee.size_bytes() as u32;
    let zero = reg_ty.const_zero();
    let vec = vector_width(l, op, &ptrs, has_mask.then_some(1));
    let all_uniform = ptrs.uniform
        && mask.as_ref().is_none_or(|m| m.uniform)
        && other.as_ref().is_none_or(|o| o.uniform);
    if all_uniform && l.may_be_written(op.operands[0]) {
        // Every thread would load the same element, but the kernel may write it (this
        // program in a branch on the value, another program or rank): threads loading
        // it at different times could see different values of one "uniform" scalar.
        // Thread 0 loads once and the block shares the value through shared memory.
        let m = mask.as_ref().map(|m| m.regs[0].into_int_value());
        let o = l.store_to_mem(elem, other.as_ref().map_or(zero, |o| o.regs[0]))?;
        let p = ptrs.regs[0].into_pointer_value();
        let slot = l.scratch(size.max(1), &op.span);
        l.in_thread0(|l| {
            let v = guarded(l, m, Some(o), || {
                Ok(Some(load_at(l, space, p, mem_ty, size, remote)?))
            })?
            .expect("a value on both edges");
            l.smem_store(slot, v)?;
            Ok(())
        })?;
        l.barrier()?;
        let v = l.smem_load(mem_ty, slot)?;
        let v = l.reg_from_mem(elem, v)?;
        l.barrier()?;
        return Ok(Tile {
            elem,
            regs: vec![v; lay.num_regs()],
            layout: lay,
            uniform: true,
        });
    }
    if let Some(&(d, which, slot)) = l.plan.async_loads.get(&op.results[0]) {
        return async_copy(l, &ptrs, mask.as_ref(), &lay, vec * size, (d, which, slot));
    }
    let n = if all_uniform { 1 } else { lay.num_regs() };
    let mut regs: Vec<BasicValueEnum<'ctx>> = Vec::with_capacity(n);
    // On AMD, masked loads through a pointer into a buffer smaller than 2 GiB read
    // through a buffer resource: a masked-off access gets an out-of-range offset and
    // reads zero, with no exec-mask branch.
    let buffer = if has_mask && !all_uniform && space == AddrSpace::Global {
        buffer_base(l, op.operands[0])?
    } else {
        None
    };
    let mut r = 0;
    while r < n {
        let m = mask.as_ref().map(|m| m.regs[r].into_int_value());
        let p = ptrs.regs[r].into_pointer_value();
        if let (Some(base), Some(m)) = (buffer, m) {
            let len = if vec > 1 && r + vec as usize <= n {
                vec
            } else {
                1
            };
            let vt: BasicTypeEnum = match (len, mem_ty) {
                (1, t) => t,
                (_, BasicTypeEnum::FloatType(f)) => f.vec_type(len).into(),
                (_, BasicTypeEnum::IntType(i)) => i.vec_type(len).into(),
                _ => unreachable!("scalar memory type"),
            };
            let v = buffer_load(l, base, p, m, vt)?;
            let v = match &other {
                Some(o) if !(o.uniform && is_zero_const(o.regs[0])) => {
                    let mut fb: BasicValueEnum = vt.const_zero();
                    for i in 0..len as usize {
                        let x = l.store_to_mem(elem, o.regs[r + i])?;
                        fb = match fb {
                            BasicValueEnum::VectorValue(fv) => {
                                l.cx.b
                                    .build_insert_element(fv, x, l.cx.i32(i as i64), "")?
                                    .into()
                            }
                            _ => x,
                        };
                    }
                    l.cx.b.build_select(m, v, fb, "")?
                }
                _ => v,
            };
            match v {
                BasicValueEnum::VectorValue(vv) => {
                    for i in 0..len as usize {
                        let e = l.cx.b.build_extract_element(vv, l.cx.i32(i as i64), "")?;
                        regs.push(l.reg_from_mem(elem, e)?);
                    }
                }
                v => regs.push(l.reg_from_mem(elem, v)?),
            }
            r += len as usize;
            continue;
        }
        if vec > 1 && r + vec as usize <= n {
            let vt: BasicTypeEnum = match mem_ty {
                BasicTypeEnum::FloatType(f) => f.vec_type(vec).into(),
                BasicTypeEnum::IntType(i) => i.vec_type(vec).into(),
                _ => unreachable!("scalar memory type"),
            };
            // Masked-off vectors (the mask is constant over the vector) take `other`
            // (or zeros) on the branch's false edge: no per-element select.
            let BasicTypeEnum::VectorType(vty) = vt else {
                unreachable!()
            };
            let mut fallback = vty.const_zero();
            if let (Some(_), Some(o)) = (&m, &other) {
                for i in 0..vec as usize {
                    let x = l.store_to_mem(elem, o.regs[r + i])?;
                    fallback =
                        l.cx.b
                            .build_insert_element(fallback, x, l.cx.i32(i as i64), "")?;
                }
            }
            let loaded = guarded(l, m, Some(fallback.into()), || {
                Ok(Some(load_at(l, space, p, vt, vec * size, remote)?))
            })?
            .expect("a value on both edges")
            .into_vector_value();
            for i in 0..vec as usize {
                let e =
                    l.cx.b
                        .build_extract_element(loaded, l.cx.i32(i as i64), "")?;
                regs.push(l.reg_from_mem(elem, e)?);
            }
            r += vec as usize;
            continue;
        }
        let o = other.as_ref().map(|o| o.regs[r]).unwrap_or(zero);
        let v = guarded(l, m, Some(o), || {
            let v = load_at(l, space, p, mem_ty, size, remote)?;
            Ok(Some(l.reg_from_mem(elem, v)?))
        })?
        .expect("a value on both edges");
        regs.push(v);
        r += 1;
    }
    if all_uniform {
        // Every thread loaded the same element: the value is the same everywhere.
        return Ok(Tile {
            elem,
            regs: vec![regs[0]; lay.num_regs()],
            layout: lay,
            uniform: true,
        });
    }
    Ok(Tile {
        elem,
        layout: lay,
        regs,
        uniform: false,
    })
}

/// The blocked layout of 16 bytes of `bytes`-byte elements per thread when the tile
/// holds that many for every thread and `lay` has fewer; else `lay`.
fn wide_layout(
    l: &Lowerer<'_, '_>,
    lay: &crate::layout::Layout,
    bytes: u32,
) -> crate::layout::Layout {
    let vec = (16 / bytes.max(1)).max(1);
    if lay.numel() < vec * l.ws * l.nw
        || lay.reg.len() as u32 >= vec.trailing_zeros()
            && lay.reg[..vec.trailing_zeros() as usize]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == 1 << i)
    {
        return lay.clone();
    }
    crate::layout::Layout::blocked(&lay.shape, vec, l.ws, l.nw)
}

/// Whether load `op` can become asynchronous copies ([`super::arch::Arch::cp_async`])
/// of 16 bytes into a `dot`'s arrays: a global load with no `other` (masked-off
/// elements read zero), whose pointers and mask the lowering recomputes in the
/// 16-byte layout, with 16-byte runs of consecutive, aligned elements along `dim`
/// (the tile's dimension that runs along the rows of the `dot`'s array, see
/// `dot::array_row_dim`) and a mask constant over each run.
pub(super) fn async_copy_ok(l: &Lowerer<'_, '_>, op: &Op, dim: usize) -> bool {
    let OpKind::Load {
        has_mask,
        has_other,
    } = op.kind
    else {
        return false;
    };
    let ty = l.f.ty(op.operands[0]);
    let Elem::Ptr { pointee, space } = ty.elem else {
        return false;
    };
    let size = pointee.size_bytes() as u64;
    if has_other
        || space != AddrSpace::Global
        || pointee == ScalarType::I1
        || size == 0
        || l.maybe_remote(op.operands[0])
    {
        return false;
    }
    let v = 16 / size;
    let rank = ty.shape.len();
    // Along the last dimension, or down the columns of a 2-D tile.
    if 16 % size != 0 || !(dim + 1 == rank || (dim == 0 && rank == 2)) {
        return false;
    }
    if (ty.shape[dim] as u64) < v {
        return false;
    }
    if !l.will_be_rematerializable(op.operands[0])
        || (has_mask && !l.will_be_rematerializable(op.operands[1]))
    {
        return false;
    }
    let info = l.axis.get(l.f, op.operands[0]);
    if info.contiguity.len() != rank || info.contiguity[dim] < v || info.divisibility[dim] < 16 {
        return false;
    }
    // Down the columns, the load must be in `Layout::blocked_columns` (16-byte runs
    // along dimension 0), which a dot's K-major B operand takes (`k_major_operand`).
    if dim + 1 != rank && !super::dot::k_major_operand(l, op) {
        return false;
    }
    !has_mask || l.axis.get(l.f, op.operands[1]).constancy[dim] >= v
}

/// Lowers a load (pointers `ptrs`, `mask`, in layout `lay` of `bytes`-byte runs)
/// as asynchronous copies into its `dot`'s ring slot; the value lives there, so the
/// tile has no registers.
fn async_copy<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ptrs: &Tile<'ctx>,
    mask: Option<&Tile<'ctx>>,
    lay: &crate::layout::Layout,
    bytes: u32,
    (d, which, slot): (&Op, usize, super::AsyncSlot),
) -> LResult<Tile<'ctx>> {
    let Elem::Ptr { pointee, .. } = ptrs.elem else {
        return Err(LowerError::Llvm("load from a non-pointer".into()));
    };
    let size = pointee.size_bytes() as u32;
    if bytes != 16 {
        return Err(LowerError::Llvm(format!(
            "an asynchronous copy of {bytes} bytes (the load's layout has no 16-byte runs)"
        )));
    }
    let run = (bytes / size) as usize;
    let base = l.async_base(d, Some(slot))?;
    let mt = l.mem_ty(Elem::Scalar(pointee));
    let idx = l.elem_indices(lay)?;
    for r in (0..lay.num_regs()).step_by(run) {
        if is_dup_reg(lay, r) {
            continue;
        }
        let off = super::dot::operand_offset(l, d, which, idx[r])?;
        let dst = l.smem_ptr(base, mt, off)?;
        let src = ptrs.regs[r].into_pointer_value();
        let full = l.cx.i32(bytes as i64);
        let n = match mask {
            Some(m) => {
                l.cx.b
                    .build_select(m.regs[r].into_int_value(), full, l.cx.i32(0), "")?
                    .into_int_value()
            }
            None => full,
        };
        let site = l.new_site("cp.async");
        l.arch.cp_async(&l.cx, dst, src, bytes, n, site)?;
    }
    l.async_issued(d, slot)?;
    l.note(|| {
        format!(
            "asynchronous 16-byte copies (cp.async, zero-filled where masked) of operand {} into the dot's ring of arrays ({})",
            ["A", "B"][which],
            match slot {
                super::AsyncSlot::Fixed(s) => format!("slot {s}"),
                super::AsyncSlot::Next => "the slot being filled".to_string(),
            }
        )
    });
    Ok(Tile {
        elem: Elem::Scalar(pointee),
        layout: lay.clone(),
        regs: Vec::new(),
        uniform: false,
    })
}

/// Bytes of a raw buffer resource for a pointer into a buffer smaller than 2 GiB:
/// every in-bounds access ends at or before `2^31 - 1`.
const BUFFER_RECORDS: u32 = 0x7fff_ffff;
/// The offset masked-off accesses take: past [`BUFFER_RECORDS`], so they read zero.
const BUFFER_OUT_OF_RANGE: u32 = 0x8000_0000;

/// The base pointer of the buffer resource loads through `ptrs` may use: the
/// parameter the pointers are offsets of, when the target has buffer loads and the
/// launch knows that buffer is smaller than 2 GiB ([`ParamAttrs::within_2gib`]).
///
/// [`ParamAttrs::within_2gib`]: tessera_ir::ir::ParamAttrs::within_2gib
fn buffer_base<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    ptrs: tessera_ir::ValueId,
) -> LResult<Option<PointerValue<'ctx>>> {
    if !l.arch.has_buffer_load() {
        return Ok(None);
    }
    let Some(base) = l.pointer_base(ptrs) else {
        return Ok(None);
    };
    if !l
        .f
        .params
        .iter()
        .any(|p| p.value == base && p.attrs.within_2gib)
    {
        return Ok(None);
    }
    Ok(Some(l.val(base)?.regs[0].into_pointer_value()))
}

/// A `ty` load at `p` (a pointer into the buffer at `base`) through a buffer
/// resource, or zero where `m` is false (the target is given `p` and `m` too: the
/// emulator checks a masked-on lane's `p` against its buffer).
fn buffer_load<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    base: PointerValue<'ctx>,
    p: PointerValue<'ctx>,
    m: IntValue<'ctx>,
    ty: BasicTypeEnum<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    let b = &l.cx.b;
    let i64t = l.cx.ctx.i64_type();
    let off = b.build_int_sub(
        b.build_ptr_to_int(p, i64t, "")?,
        b.build_ptr_to_int(base, i64t, "")?,
        "",
    )?;
    let off = b.build_int_truncate(off, l.cx.ctx.i32_type(), "")?;
    let oob =
        l.cx.ctx
            .i32_type()
            .const_int(BUFFER_OUT_OF_RANGE as u64, false);
    let off = b.build_select(m, off, oob, "")?.into_int_value();
    let site = l.new_site("load");
    let lane = super::arch::BufferLane {
        offset: off,
        ptr: p,
        mask: m,
    };
    l.arch
        .buffer_load(&l.cx, base, BUFFER_RECORDS, lane, ty, site)
}

/// Whether `v` is a zero constant.
fn is_zero_const(v: BasicValueEnum<'_>) -> bool {
    match v {
        BasicValueEnum::IntValue(i) => i.get_zero_extended_constant() == Some(0),
        BasicValueEnum::FloatValue(f) => f.get_constant().is_some_and(|(x, _)| x.to_bits() == 0),
        _ => false,
    }
}

pub(super) fn lower_store<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<()> {
    let OpKind::Store { has_mask } = op.kind else {
        unreachable!()
    };
    let mut ptrs = l.val(op.operands[0])?;
    let Elem::Ptr { pointee, space } = ptrs.elem else {
        return Err(LowerError::Llvm("store to a non-pointer".into()));
    };
    let remote = l.maybe_remote(op.operands[0]);
    let elem = Elem::Scalar(pointee);
    let val = l.val(op.operands[1])?;
    let mut lay = ptrs.layout.clone();
    // The value keeps its layout when the pointers (and mask) can be recomputed in
    // it: a `dot` result is stored from its fragments, with no conversion.
    let cheap_addr =
        l.rematerializable(op.operands[0]) && (!has_mask || l.rematerializable(op.operands[2]));
    if !val.uniform && (ptrs.uniform || (cheap_addr && !l.rematerializable(op.operands[1]))) {
        lay = val.layout.clone();
        ptrs = l.relayout(op.operands[0], &ptrs, &lay, &op.span)?;
    }
    let val = l.relayout(op.operands[1], &val, &lay, &op.span)?;
    let mask = if has_mask {
        Some(l.relayout(op.operands[2], &l.val(op.operands[2])?, &lay, &op.span)?)
    } else {
        None
    };
    let owner = l.owner_predicate(&lay)?;
    let mem_ty = l.mem_ty(elem);
    let size = pointee.size_bytes() as u32;
    let vec = vector_width(l, op, &ptrs, has_mask.then_some(2));
    // A uniform pointer tile stores one value to one address: once.
    let n = if ptrs.uniform { 1 } else { lay.num_regs() };
    let owner = if ptrs.uniform && n == 1 {
        // Thread 0 only.
        Some(
            l.cx.b
                .build_int_compare(inkwell::IntPredicate::EQ, l.tid, l.cx.i32(0), "")?,
        )
    } else {
        owner
    };
    let mut r = 0;
    while r < n {
        if is_dup_reg(&lay, r) {
            r += 1;
            continue;
        }
        let m = mask.as_ref().map(|m| m.regs[r].into_int_value());
        let cond = and_opt(l, m, owner)?;
        let p = ptrs.regs[r].into_pointer_value();
        if vec > 1 && r + vec as usize <= n {
            let mut vv: BasicValueEnum = match mem_ty {
                BasicTypeEnum::FloatType(f) => f.vec_type(vec).get_poison().into(),
                BasicTypeEnum::IntType(i) => i.vec_type(vec).get_poison().into(),
                _ => unreachable!("scalar memory type"),
            };
            for i in 0..vec as usize {
                vv =
                    l.cx.b
                        .build_insert_element(
                            vv.into_vector_value(),
                            val.regs[r + i],
                            l.cx.i32(i as i64),
                            "",
                        )?
                        .into();
            }
            guarded(l, cond, None, || {
                store_at(l, space, p, vv, vec * size, remote)?;
                Ok(None)
            })?;
            r += vec as usize;
            continue;
        }
        let v = l.store_to_mem(elem, val.regs[r])?;
        guarded(l, cond, None, || {
            store_at(l, space, p, v, size, remote)?;
            Ok(None)
        })?;
        r += 1;
    }
    Ok(())
}

fn ordering(o: MemOrder) -> (AtomicOrdering, AtomicOrdering) {
    match o {
        MemOrder::Relaxed => (AtomicOrdering::Monotonic, AtomicOrdering::Monotonic),
        MemOrder::Acquire => (AtomicOrdering::Acquire, AtomicOrdering::Acquire),
        MemOrder::Release => (AtomicOrdering::Release, AtomicOrdering::Monotonic),
        MemOrder::AcqRel => (AtomicOrdering::AcquireRelease, AtomicOrdering::Acquire),
    }
}

pub(super) fn lower_atomic<'ctx>(l: &mut Lowerer<'_, 'ctx>, op: &Op) -> LResult<Tile<'ctx>> {
    use inkwell::llvm_sys::LLVMAtomicRMWBinOp as B;
    let (rmw, order, scope, has_mask) = match op.kind {
        OpKind::AtomicRmw {
            op: a,
            order,
            scope,
            has_mask,
        } => (Some(a), order, scope, has_mask),
        OpKind::AtomicCas {
            order,
            scope,
            has_mask,
        } => (None, order, scope, has_mask),
        _ => unreachable!(),
    };
    let mut ptrs = l.val(op.operands[0])?;
    let Elem::Ptr { pointee, space } = ptrs.elem else {
        return Err(LowerError::Llvm("atomic on a non-pointer".into()));
    };
    let remote = l.maybe_remote(op.operands[0]);
    let elem = Elem::Scalar(pointee);
    let nvals = if rmw.is_some() { 1 } else { 2 };
    let mut vals: Vec<Tile> = (0..nvals)
        .map(|i| l.val(op.operands[1 + i]))
        .collect::<LResult<_>>()?;
    let mut lay = ptrs.layout.clone();
    if ptrs.uniform
        && let Some(v) = vals.iter().find(|v| !v.uniform)
    {
        lay = v.layout.clone();
        ptrs = l.convert(&ptrs, &lay, &op.span)?;
    }
    for v in vals.iter_mut() {
        *v = l.convert(v, &lay, &op.span)?;
    }
    let mask = if has_mask {
        Some(l.convert(&l.val(op.operands[1 + nvals])?, &lay, &op.span)?)
    } else {
        None
    };
    let owner = l.owner_predicate(&lay)?;
    let ssid = l.cx.sync_scope_id(l.arch.sync_scope(scope));
    let (mut ord, fail) = ordering(order);
    // Back ends that drop `atomicrmw` orderings get explicit fences instead.
    let rmw_fences = rmw.is_some() && l.arch.rmw_needs_fences();
    let scope_name = l.arch.sync_scope(scope);
    if rmw_fences {
        ord = AtomicOrdering::Monotonic;
        if matches!(order, MemOrder::Release | MemOrder::AcqRel) {
            l.cx.fence(AtomicOrdering::Release, scope_name)?;
        }
    }
    let reg_ty = l.ty(elem);
    let zero = reg_ty.const_zero();
    let n = lay.num_regs();
    let mut regs: Vec<BasicValueEnum<'ctx>> = Vec::with_capacity(n);
    for r in 0..n {
        if is_dup_reg(&lay, r) {
            let first = (0..r)
                .rev()
                .find(|&q| {
                    !is_dup_reg(&lay, q) && lay.reg_offset(q as u32) == lay.reg_offset(r as u32)
                })
                .unwrap_or(0);
            regs.push(regs[first]);
            continue;
        }
        let m = mask.as_ref().map(|m| m.regs[r].into_int_value());
        let cond = and_opt(l, m, owner)?;
        let p: PointerValue = ptrs.regs[r].into_pointer_value();
        let v0 = vals[0].regs[r];
        let v1 = vals.get(1).map(|v| v.regs[r]);
        let b = l.cx.b.as_mut_ptr();
        let bytes = pointee.size_bytes() as u32;
        let near = |p: PointerValue<'ctx>| unsafe {
            use inkwell::llvm_sys::core as c;
            let p = l.access_ptr(space, p, bytes, true, "atomic")?;
            if let Some(a) = rmw
                && let Some(v) = l
                    .arch
                    .atomic_rmw_scoped(&l.cx, a, pointee, ord, scope, p, v0)?
            {
                return Ok(Some(v));
            }
            use inkwell::values::AsValueRef;
            let raw = match rmw {
                Some(a) => {
                    let f = pointee.is_float();
                    let s = pointee.is_signed_int();
                    let bop = match a {
                        AtomicOp::Add if f => B::LLVMAtomicRMWBinOpFAdd,
                        AtomicOp::Add => B::LLVMAtomicRMWBinOpAdd,
                        AtomicOp::Min if f => B::LLVMAtomicRMWBinOpFMinimum,
                        AtomicOp::Max if f => B::LLVMAtomicRMWBinOpFMaximum,
                        AtomicOp::Min if s => B::LLVMAtomicRMWBinOpMin,
                        AtomicOp::Max if s => B::LLVMAtomicRMWBinOpMax,
                        AtomicOp::Min => B::LLVMAtomicRMWBinOpUMin,
                        AtomicOp::Max => B::LLVMAtomicRMWBinOpUMax,
                        AtomicOp::And => B::LLVMAtomicRMWBinOpAnd,
                        AtomicOp::Or => B::LLVMAtomicRMWBinOpOr,
                        AtomicOp::Xor => B::LLVMAtomicRMWBinOpXor,
                        AtomicOp::Xchg => B::LLVMAtomicRMWBinOpXchg,
                    };
                    c::LLVMBuildAtomicRMWSyncScope(
                        b,
                        bop,
                        p.as_value_ref(),
                        v0.as_value_ref(),
                        ord.into(),
                        ssid,
                    )
                }
                None => {
                    let pair = c::LLVMBuildAtomicCmpXchgSyncScope(
                        b,
                        p.as_value_ref(),
                        v0.as_value_ref(),
                        v1.expect("cas has two values").as_value_ref(),
                        ord.into(),
                        fail.into(),
                        ssid,
                    );
                    c::LLVMBuildExtractValue(b, pair, 0, c"".as_ptr())
                }
            };
            Ok(Some(BasicValueEnum::new(raw)))
        };
        let res = guarded(l, cond, Some(zero), || {
            if !remote {
                return near(p);
            }
            l.split_remote(p, near, |a, pe| {
                let release = matches!(order, MemOrder::Release | MemOrder::AcqRel);
                let old = l.engine_atomic(&op.span, rmw, pointee, release, a, pe, v0, v1)?;
                Ok(Some(old))
            })
        })?
        .expect("a value on both edges");
        regs.push(res);
    }
    if rmw_fences && matches!(order, MemOrder::Acquire | MemOrder::AcqRel) {
        l.cx.fence(AtomicOrdering::Acquire, scope_name)?;
    }
    let t = Tile {
        elem,
        layout: lay.clone(),
        regs,
        uniform: false,
    };
    if owner.is_none() {
        return Ok(t);
    }
    // Replicas read the owner's result through shared memory.
    let mt = l.mem_ty(elem);
    let base = l.scratch(lay.numel() * pointee.size_bytes() as u32, &op.span);
    let idx = l.elem_indices(&lay)?;
    for (r, i) in idx.iter().enumerate() {
        if is_dup_reg(&lay, r) {
            continue;
        }
        let p = l.smem_ptr(base, mt, *i)?;
        let v = t.regs[r];
        guarded(l, owner, None, || {
            l.smem_store(p, v)?;
            Ok(None)
        })?;
    }
    l.barrier()?;
    let mut regs = Vec::with_capacity(n);
    for i in idx {
        let p = l.smem_ptr(base, mt, i)?;
        regs.push(l.smem_load(mt, p)?);
    }
    l.barrier()?;
    Ok(Tile { regs, ..t })
}

impl Lowerer<'_, '_> {
    /// Whether the memory `ptr` (a pointer value) points into may be written while
    /// the kernel runs: unless it derives from a parameter that no store or atomic of
    /// the kernel writes through, in a kernel that does not communicate (a peer may
    /// write any symmetric buffer). Parameters do not alias a written one (a
    /// `&mut Global` is exclusive at launch); a write through a pointer of unknown
    /// origin (loaded, loop-carried) may alias anything. The `readonly` attribute is
    /// not trusted on its own: textual IR may carry it on a parameter it writes.
    pub(super) fn may_be_written(&self, ptr: tessera_ir::ValueId) -> bool {
        if self.f.uses_comm() {
            return true;
        }
        let Some(base) = self.pointer_base(ptr) else {
            return true;
        };
        if !self.f.params.iter().any(|p| p.value == base) {
            return true;
        }
        let is_param = |v: tessera_ir::ValueId| self.f.params.iter().any(|p| p.value == v);
        let mut written = false;
        self.f.walk(&mut |o| {
            let writes = matches!(
                o.kind,
                OpKind::Store { .. }
                    | OpKind::AtomicRmw { .. }
                    | OpKind::AtomicCas { .. }
                    | OpKind::Signal { .. }
            );
            if !writes {
                return;
            }
            match o.operands.first().and_then(|&p| self.pointer_base(p)) {
                // Through this parameter, or through a pointer of unknown origin.
                Some(b) if b == base || !is_param(b) => written = true,
                None => written = true,
                // Through another parameter: no alias.
                Some(_) => {}
            }
        });
        written
    }

    /// The parameter or region argument a pointer value is an offset of (following
    /// `addptr`, splats and shape ops), if it can be told.
    pub(super) fn pointer_base(&self, mut v: tessera_ir::ValueId) -> Option<tessera_ir::ValueId> {
        for _ in 0..256 {
            let Some(op) = self.defs.get(&v) else {
                return Some(v);
            };
            match op.kind {
                OpKind::AddPtr
                | OpKind::Splat
                | OpKind::Broadcast
                | OpKind::ExpandDims { .. }
                | OpKind::Reshape
                | OpKind::Permute { .. } => v = op.operands[0],
                _ => return None,
            }
        }
        None
    }
}

//! [`Nvptx`], the NVIDIA PTX implementation of [`Arch`]: its inline-PTX helpers
//! (atomics with their ordering and scope, `cp.async`, `mbarrier`, TMA, `wgmma`,
//! `mma.sync`), the PTX ISA version flag ([`PTX_ISA_FLAG`]) and the `mma.sync`
//! fragment layouts ([`nv_m16n8k16`], [`nv_m16n8k32_s8`]).

use inkwell::attributes::AttributeLoc;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use tessera_ir::ScalarType;
use tessera_ir::ir::{AtomicOp, MemScope, SignalOp};

use super::{Arch, FragInfo, Math, MmaInfo, WgmmaA, axis_char, pack_words};
use crate::Target;
use crate::lower::{Cx, LResult, LowerError};

/// The PTX `.sem` of an LLVM ordering (`relaxed` for monotonic and weaker).
fn ptx_sem(ord: inkwell::AtomicOrdering) -> &'static str {
    use inkwell::AtomicOrdering as O;
    match ord {
        O::Acquire => "acquire",
        O::Release => "release",
        O::AcquireRelease | O::SequentiallyConsistent => "acq_rel",
        _ => "relaxed",
    }
}

/// Inline PTX `atom.{instr} $0, [$1], $2;` on the global address `p` with the value
/// `v` (register class `cons`: `r`, `l`, `f` or `d`); returns the old value. Used where
/// LLVM's NVPTX back end would drop an atomic's ordering or scope.
fn ptx_atom<'ctx>(
    cx: &Cx<'ctx>,
    instr: &str,
    cons: &str,
    p: PointerValue<'ctx>,
    v: BasicValueEnum<'ctx>,
) -> LResult<BasicValueEnum<'ctx>> {
    let vty: BasicTypeEnum = v.get_type();
    let i64t = cx.ctx.i64_type();
    let addr = cx.b.build_ptr_to_int(p, i64t, "")?;
    let fty = inkwell::types::BasicType::fn_type(&vty, &[i64t.into(), vty.into()], false);
    let asm = cx.ctx.create_inline_asm(
        fty,
        format!("atom.{instr} $0, [$1], $2;"),
        format!("={cons},l,{cons},~{{memory}}"),
        true,
        false,
        None,
        false,
    );
    cx.b.build_indirect_call(fty, asm, &[addr.into(), v.into()], "atom")?
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| LowerError::Llvm("atom asm returned void".into()))
}

/// NVIDIA PTX.
pub struct Nvptx {
    /// Compute capability.
    pub sm: u32,
    /// sm_90a: the architecture-specific instructions (`wgmma`).
    pub arch_specific: bool,
}

/// `ldmatrix` through the NVVM intrinsic (one `i32` per matrix).
fn nvvm_ldmatrix<'ctx>(
    cx: &Cx<'ctx>,
    p: PointerValue<'ctx>,
    num: u32,
    trans: bool,
) -> LResult<Vec<IntValue<'ctx>>> {
    let name = format!(
        "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{num}{}.b16",
        if trans { ".trans" } else { "" }
    );
    // Overloaded on the pointer type (a shared-memory pointer here).
    let v = cx.call_intrinsic(&name, &[p.get_type().into()], &[p.into()])?;
    if num == 1 {
        return Ok(vec![v.into_int_value()]);
    }
    let s = v.into_struct_value();
    (0..num)
        .map(|i| Ok(cx.b.build_extract_value(s, i, "")?.into_int_value()))
        .collect()
}

/// A side-effecting inline PTX statement with `(constraint, value)` inputs.
fn ptx_void<'ctx>(cx: &Cx<'ctx>, text: &str, ins: &[(&str, BasicValueEnum<'ctx>)]) -> LResult<()> {
    use inkwell::types::BasicMetadataTypeEnum as T;
    let params: Vec<T> = ins.iter().map(|(_, v)| T::from(v.get_type())).collect();
    let fty = cx.ctx.void_type().fn_type(&params, false);
    let mut cons: Vec<String> = ins.iter().map(|(c, _)| c.to_string()).collect();
    cons.push("~{memory}".into());
    let asm = cx.ctx.create_inline_asm(
        fty,
        text.to_string(),
        cons.join(","),
        true,
        false,
        None,
        false,
    );
    let args: Vec<inkwell::values::BasicMetadataValueEnum> =
        ins.iter().map(|(_, v)| (*v).into()).collect();
    cx.b.build_indirect_call(fty, asm, &args, "")?;
    Ok(())
}

/// The 32-bit shared-window address of shared pointer `p` (`ptr addrspace(3)`), as
/// PTX `.shared` operands take it.
fn shared_u32<'ctx>(cx: &Cx<'ctx>, p: PointerValue<'ctx>) -> LResult<IntValue<'ctx>> {
    if p.get_type().get_address_space() != inkwell::AddressSpace::from(3u16) {
        return Err(LowerError::Llvm(
            "a shared-memory operand that is not a shared pointer".into(),
        ));
    }
    Ok(cx.b.build_ptr_to_int(p, cx.ctx.i32_type(), "")?)
}

/// `cp.async.bulk.tensor.{R}d...mbarrier::complete_tx::bytes [dst], [tmap, {coords}],
/// [bar]`, multicast to the cluster's blocks in the 16-bit CTA `mask` when given.
fn ptx_tma_load<'ctx>(
    cx: &Cx<'ctx>,
    dst: PointerValue<'ctx>,
    tmap: IntValue<'ctx>,
    coords: &[IntValue<'ctx>],
    bar: PointerValue<'ctx>,
    mask: Option<IntValue<'ctx>>,
) -> LResult<()> {
    let mut ins: Vec<(&str, BasicValueEnum<'ctx>)> = vec![
        ("r", shared_u32(cx, dst)?.into()),
        ("l", tmap.into()),
        ("r", shared_u32(cx, bar)?.into()),
    ];
    let (multicast, mask_operand) = match mask {
        Some(m) => {
            ins.push(("h", m.into()));
            (".multicast::cluster", ", $3")
        }
        None => ("", ""),
    };
    let first = ins.len();
    let cs: Vec<String> = (0..coords.len())
        .map(|i| format!("${}", first + i))
        .collect();
    ins.extend(coords.iter().map(|c| ("r", BasicValueEnum::from(*c))));
    let text = format!(
        "cp.async.bulk.tensor.{}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes{multicast} [$0], [$1, {{{}}}], [$2]{mask_operand};",
        coords.len(),
        cs.join(", ")
    );
    ptx_void(cx, &text, &ins)
}

/// A side-effecting inline PTX statement with no operands.
fn ptx_stmt(cx: &Cx<'_>, text: &str) -> LResult<()> {
    let fty = cx.ctx.void_type().fn_type(&[], false);
    let asm = cx.ctx.create_inline_asm(
        fty,
        text.to_string(),
        "~{memory}".into(),
        true,
        false,
        None,
        false,
    );
    cx.b.build_indirect_call(fty, asm, &[], "")?;
    Ok(())
}

/// Inline PTX `text` whose first `accs.len()` operands are the 32-bit registers
/// `accs` (all `f32`, or all `i32`), read and written (tied `=f` / `=r` outputs);
/// `extra` are further `(constraint, value)` inputs, numbered after them. Returns the
/// registers after it.
fn ptx_with_accs<'ctx>(
    cx: &Cx<'ctx>,
    text: String,
    accs: &[BasicValueEnum<'ctx>],
    extra: &[(&str, BasicValueEnum<'ctx>)],
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    use inkwell::types::BasicMetadataTypeEnum as T;
    let n = accs.len();
    let acc_ty: BasicTypeEnum<'ctx> = match accs.first() {
        Some(v) => v.get_type(),
        None => cx.ctx.f32_type().into(),
    };
    let rc = if acc_ty.is_int_type() { "=r" } else { "=f" };
    let ret = cx.ctx.struct_type(&vec![acc_ty; n], false);
    let mut cons: Vec<String> = (0..n).map(|_| rc.to_string()).collect();
    cons.extend(extra.iter().map(|(c, _)| c.to_string()));
    cons.extend((0..n).map(|i| i.to_string()));
    cons.push("~{memory}".into());
    // Inputs: the extras, then the tied accumulators (so `$n..` are the extras).
    let mut params: Vec<T> = extra.iter().map(|(_, v)| T::from(v.get_type())).collect();
    params.extend(vec![T::from(acc_ty); n]);
    let fty = ret.fn_type(&params, false);
    let asm = cx
        .ctx
        .create_inline_asm(fty, text, cons.join(","), true, false, None, false);
    let mut args: Vec<inkwell::values::BasicMetadataValueEnum> =
        extra.iter().map(|(_, v)| (*v).into()).collect();
    args.extend(
        accs.iter()
            .map(|&v| inkwell::values::BasicMetadataValueEnum::from(v)),
    );
    let call = cx.b.build_indirect_call(fty, asm, &args, "")?;
    let s = call
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| LowerError::Llvm("asm returned void".into()))?
        .into_struct_value();
    (0..n as u32)
        .map(|i| Ok(cx.b.build_extract_value(s, i, "")?))
        .collect()
}

impl Nvptx {
    /// [`super::fp8x4_to_f16`], with sm_89's conversion instruction where the target
    /// has it: `cvt.rn.f16x2.e4m3x2` (PTX ISA 7.8, sm_89+; one instruction per pair,
    /// exact) for E4M3 on sm_90. (E5M2 needs only its bytes moved.)
    fn fp8x4_to_f16<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        input: ScalarType,
        w: IntValue<'ctx>,
    ) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
        if self.sm < 89 || input != ScalarType::F8E4M3 {
            return super::fp8x4_to_f16(cx, input, w);
        }
        let (i16t, i32t) = (cx.ctx.i16_type(), cx.ctx.i32_type());
        let pair = |x: IntValue<'ctx>| -> LResult<IntValue<'ctx>> {
            let x = cx.b.build_int_truncate(x, i16t, "")?;
            let h = cx.call_intrinsic("llvm.nvvm.e4m3x2.to.f16x2.rn", &[], &[x.into()])?;
            Ok(cx.b.build_bit_cast(h, i32t, "")?.into_int_value())
        };
        let hi = cx.b.build_right_shift(w, cx.i32(16), false, "")?;
        Ok((pair(w)?, pair(hi)?))
    }
}

impl Math for Nvptx {
    fn log2_approx<'ctx>(&self, cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
        // LLVM 22 NVPTX has no lowering of `llvm.log2.f32` (not even with `afn`).
        Ok(cx
            .call_intrinsic("llvm.nvvm.lg2.approx.f", &[], &[x.into()])?
            .into_float_value())
    }
}

impl Arch for Nvptx {
    fn has_cp_async(&self) -> bool {
        self.sm >= 80
    }

    fn fence_async_shared<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<()> {
        ptx_stmt(cx, "fence.proxy.async.shared::cta;")
    }

    fn wgmma_fence<'ctx>(&self, cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        ptx_stmt(cx, "wgmma.fence.sync.aligned;")
    }

    fn wgmma<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        input: ScalarType,
        n: u32,
        a: WgmmaA<'_, 'ctx>,
        desc_b: IntValue<'ctx>,
        trans_b: bool,
        scale_d: bool,
        acc: &[BasicValueEnum<'ctx>],
        _slot: u32,
        _site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        if !self.target().has_wgmma() {
            return Err(LowerError::Llvm("wgmma needs sm_90a".into()));
        }
        // (k of one instruction, dtype.atype.btype)
        let (k, types) = match input {
            ScalarType::F16 => (16, "f32.f16.f16"),
            ScalarType::BF16 => (16, "f32.bf16.bf16"),
            ScalarType::I8 => (32, "s32.s8.s8"),
            ScalarType::F8E4M3 => (32, "f32.e4m3.e4m3"),
            ScalarType::F8E5M2 => (32, "f32.e5m2.e5m2"),
            t => return Err(LowerError::Llvm(format!("wgmma on {t:?}"))),
        };
        let eight_bit = input.bits() == 8;
        if eight_bit && (trans_b || matches!(a, WgmmaA::Regs(_))) {
            return Err(LowerError::Llvm(
                "8-bit wgmma takes both operands K-major from shared memory".into(),
            ));
        }
        // Operands: $0..$r-1 the accumulators (outputs), then A (a descriptor, or
        // four registers), the B descriptor and the scale-d flag.
        let r = acc.len();
        let mut extra: Vec<(&str, BasicValueEnum<'ctx>)> = match a {
            WgmmaA::Desc(d) => vec![("l", d.into())],
            WgmmaA::Regs(regs) if regs.len() == 4 => {
                regs.iter().map(|&x| ("r", x.into())).collect()
            }
            WgmmaA::Regs(_) => return Err(LowerError::Llvm("wgmma A takes 4 registers".into())),
        };
        let na = extra.len();
        let a_text = match a {
            WgmmaA::Desc(_) => format!("${r}"),
            WgmmaA::Regs(_) => format!("{{${}, ${}, ${}, ${}}}", r, r + 1, r + 2, r + 3),
        };
        // imm-trans-a exists only for an A in shared memory (K-major here: 0).
        let trans_a = if matches!(a, WgmmaA::Desc(_)) {
            "0, "
        } else {
            ""
        };
        extra.push(("l", desc_b.into()));
        extra.push(("r", cx.i32(i64::from(scale_d)).into()));
        let regs: Vec<String> = (0..r).map(|i| format!("${i}")).collect();
        // Floating-point types take imm-scale-a and imm-scale-b, the 16-bit ones
        // also the transposes; integer types only scale-d.
        let imm = if input == ScalarType::I8 {
            String::new()
        } else if eight_bit {
            ", 1, 1".to_string()
        } else {
            format!(", 1, 1, {trans_a}{}", u32::from(trans_b))
        };
        let text = format!(
            "{{\n.reg .pred p;\nsetp.ne.b32 p, ${}, 0;\nwgmma.mma_async.sync.aligned.m64n{n}k{k}.{types} {{{}}}, {a_text}, ${}, p{imm};\n}}",
            r + na + 1,
            regs.join(","),
            r + na,
        );
        ptx_with_accs(cx, text, acc, &extra)
    }

    fn wgmma_commit<'ctx>(&self, cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        ptx_stmt(cx, "wgmma.commit_group.sync.aligned;")
    }

    fn wgmma_wait<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        pending: u32,
        accs: &[Vec<BasicValueEnum<'ctx>>],
        _site: u32,
    ) -> LResult<Vec<Vec<BasicValueEnum<'ctx>>>> {
        // The accumulators pass through the wait so that no later use moves above it.
        let all: Vec<BasicValueEnum<'ctx>> = accs.iter().flatten().copied().collect();
        let out = ptx_with_accs(
            cx,
            format!("wgmma.wait_group.sync.aligned {pending};"),
            &all,
            &[],
        )?;
        let mut it = out.into_iter();
        Ok(accs
            .iter()
            .map(|a| it.by_ref().take(a.len()).collect())
            .collect())
    }

    fn cp_async<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        bytes: u32,
        src_bytes: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        // `.cg` (L2 only) exists for 16 bytes; 4 and 8 take `.ca`.
        let name = match bytes {
            16 => "llvm.nvvm.cp.async.cg.shared.global.16.s",
            8 => "llvm.nvvm.cp.async.ca.shared.global.8.s",
            4 => "llvm.nvvm.cp.async.ca.shared.global.4.s",
            b => return Err(LowerError::Llvm(format!("cp.async of {b} bytes"))),
        };
        cx.call_intrinsic(name, &[], &[dst.into(), src.into(), src_bytes.into()])?;
        Ok(())
    }

    fn mbarrier_init<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        count: u32,
        _site: u32,
    ) -> LResult<()> {
        let b = shared_u32(cx, bar)?;
        ptx_void(
            cx,
            &format!("mbarrier.init.shared::cta.b64 [$0], {count};"),
            &[("r", b.into())],
        )
    }

    fn fence_mbarrier_init<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<()> {
        ptx_stmt(cx, "fence.mbarrier_init.release.cluster;")
    }

    fn mbarrier_inval<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        let b = shared_u32(cx, bar)?;
        ptx_void(
            cx,
            "mbarrier.inval.shared::cta.b64 [$0];",
            &[("r", b.into())],
        )
    }

    fn mbarrier_arrive_expect_tx<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        bytes: u32,
        _site: u32,
    ) -> LResult<()> {
        let b = shared_u32(cx, bar)?;
        ptx_void(
            cx,
            &format!(
                "{{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], {bytes};\n}}"
            ),
            &[("r", b.into())],
        )
    }

    fn mbarrier_arrive<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        let b = shared_u32(cx, bar)?;
        ptx_void(
            cx,
            "{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [$0];\n}",
            &[("r", b.into())],
        )
    }

    fn warp_sync<'ctx>(&self, cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        cx.call_intrinsic("llvm.nvvm.bar.warp.sync", &[], &[cx.i32(-1).into()])?;
        Ok(())
    }

    fn named_barrier<'ctx>(&self, cx: &Cx<'ctx>, id: u32, threads: u32, _site: u32) -> LResult<()> {
        ptx_stmt(cx, &format!("bar.sync {id}, {threads};"))
    }

    fn named_barrier_arrive<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        id: u32,
        threads: u32,
        _site: u32,
    ) -> LResult<()> {
        ptx_stmt(cx, &format!("bar.arrive {id}, {threads};"))
    }

    fn setmaxnreg<'ctx>(&self, cx: &Cx<'ctx>, inc: bool, regs: u32, _site: u32) -> LResult<()> {
        let action = if inc { "inc" } else { "dec" };
        ptx_stmt(cx, &format!("setmaxnreg.{action}.sync.aligned.u32 {regs};"))
    }

    fn mbarrier_wait<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        parity: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        let b = shared_u32(cx, bar)?;
        ptx_void(
            cx,
            "{\n.reg .pred p;\nTSR_MBAR_WAIT_${:uid}:\nmbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1;\n@!p bra TSR_MBAR_WAIT_${:uid};\n}",
            &[("r", b.into()), ("r", parity.into())],
        )
    }

    fn tma_load<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        dst: PointerValue<'ctx>,
        tmap: IntValue<'ctx>,
        coords: &[IntValue<'ctx>],
        bar: PointerValue<'ctx>,
        multicast: Option<IntValue<'ctx>>,
        _site: u32,
    ) -> LResult<()> {
        ptx_tma_load(cx, dst, tmap, coords, bar, multicast)
    }

    fn cluster_ctarank<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        Ok(cx
            .call_intrinsic("llvm.nvvm.read.ptx.sreg.cluster.ctarank", &[], &[])?
            .into_int_value())
    }

    fn cluster_sync<'ctx>(&self, cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        ptx_stmt(
            cx,
            "barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;",
        )
    }

    fn mbarrier_arrive_cluster<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        cta: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        let b = shared_u32(cx, bar)?;
        ptx_void(
            cx,
            "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, $0, $1;\nmbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}",
            &[("r", b.into()), ("r", cta.into())],
        )
    }

    fn tma_store<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        src: PointerValue<'ctx>,
        tmap: IntValue<'ctx>,
        coords: &[IntValue<'ctx>],
        _site: u32,
    ) -> LResult<()> {
        let sp = shared_u32(cx, src)?;
        let r = coords.len();
        let cs: Vec<String> = (0..r).map(|i| format!("${}", 2 + i)).collect();
        let text = format!(
            "cp.async.bulk.tensor.{r}d.global.shared::cta.tile.bulk_group [$0, {{{}}}], [$1];",
            cs.join(", ")
        );
        let mut ins: Vec<(&str, BasicValueEnum<'ctx>)> = vec![("l", tmap.into()), ("r", sp.into())];
        ins.extend(coords.iter().map(|c| ("r", BasicValueEnum::from(*c))));
        ptx_void(cx, &text, &ins)
    }

    fn tma_store_wait<'ctx>(&self, cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        ptx_stmt(
            cx,
            "cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;",
        )
    }

    fn cp_async_commit<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<()> {
        cx.call_intrinsic("llvm.nvvm.cp.async.commit.group", &[], &[])?;
        Ok(())
    }

    fn cp_async_wait<'ctx>(&self, cx: &Cx<'ctx>, n: u32) -> LResult<()> {
        cx.call_intrinsic(
            "llvm.nvvm.cp.async.wait.group",
            &[],
            &[cx.i32(n as i64).into()],
        )?;
        Ok(())
    }

    fn target(&self) -> Target {
        Target::Nvptx {
            sm: self.sm,
            arch_specific: self.arch_specific,
        }
    }

    fn thread_id<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        Ok(cx
            .call_intrinsic("llvm.nvvm.read.ptx.sreg.tid.x", &[], &[])?
            .into_int_value())
    }

    fn program_id<'ctx>(&self, cx: &Cx<'ctx>, axis: u8) -> LResult<IntValue<'ctx>> {
        let name = format!("llvm.nvvm.read.ptx.sreg.ctaid.{}", axis_char(axis));
        Ok(cx.call_intrinsic(&name, &[], &[])?.into_int_value())
    }

    fn num_programs<'ctx>(&self, cx: &Cx<'ctx>, axis: u8, _: u32) -> LResult<IntValue<'ctx>> {
        let name = format!("llvm.nvvm.read.ptx.sreg.nctaid.{}", axis_char(axis));
        Ok(cx.call_intrinsic(&name, &[], &[])?.into_int_value())
    }

    fn barrier<'ctx>(&self, cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        cx.call_intrinsic(
            "llvm.nvvm.barrier.cta.sync.aligned.all",
            &[],
            &[cx.i32(0).into()],
        )?;
        Ok(())
    }

    fn shuffle_xor<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        v: IntValue<'ctx>,
        mask: u32,
        _lane: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<IntValue<'ctx>> {
        let args = [
            cx.i32(-1).into(),
            v.into(),
            cx.i32(mask as i64).into(),
            cx.i32(0x1f).into(),
        ];
        Ok(cx
            .call_intrinsic("llvm.nvvm.shfl.sync.bfly.i32", &[], &args)?
            .into_int_value())
    }

    fn set_kernel_abi<'ctx>(&self, cx: &Cx<'ctx>, f: FunctionValue<'ctx>, num_threads: u32) {
        f.set_call_conventions(71);
        let n = num_threads.to_string();
        f.add_attribute(
            AttributeLoc::Function,
            cx.ctx.create_string_attribute("nvvm.maxntid", &n),
        );
    }

    fn timer_ns<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        // %globaltimer: nanoseconds (updated every microsecond or so).
        Ok(cx
            .call_intrinsic("llvm.nvvm.read.ptx.sreg.globaltimer", &[], &[])?
            .into_int_value())
    }

    fn rmw_needs_fences(&self) -> bool {
        true
    }

    /// System-scope read-modify-writes (peers' memory) as inline
    /// `atom.{sem}.sys.global`: LLVM 22 emits every `atomicrmw` as a relaxed `.gpu`
    /// atom, which does not make accesses from another GPU or the host morally strong
    /// (`cmpxchg` keeps its scope and ordering, so CAS stays LLVM's). 32/64-bit
    /// integers (add, min, max, and, or, xor, exch), f32/f64 add and exch; other types
    /// keep LLVM's lowering.
    fn atomic_rmw_scoped<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        op: AtomicOp,
        pointee: ScalarType,
        ord: inkwell::AtomicOrdering,
        scope: MemScope,
        p: PointerValue<'ctx>,
        v: BasicValueEnum<'ctx>,
    ) -> LResult<Option<BasicValueEnum<'ctx>>> {
        use ScalarType as S;
        if scope != MemScope::System {
            return Ok(None);
        }
        let bits = pointee.bits();
        let (cons, bty) = match pointee {
            S::I32 | S::U32 => ("r", "b32"),
            S::I64 | S::U64 => ("l", "b64"),
            S::F32 => ("f", "b32"),
            S::F64 => ("d", "b64"),
            _ => return Ok(None),
        };
        let signed = pointee.is_signed_int();
        let ity = if bits == 32 { "u32" } else { "u64" };
        let sty = if bits == 32 { "s32" } else { "s64" };
        let what = match (op, pointee.is_float()) {
            (AtomicOp::Xchg, _) => format!("exch.{bty}"),
            (AtomicOp::Add, false) => format!("add.{ity}"),
            (AtomicOp::Add, true) => format!("add.{}", if bits == 32 { "f32" } else { "f64" }),
            (AtomicOp::Min, false) => format!("min.{}", if signed { sty } else { ity }),
            (AtomicOp::Max, false) => format!("max.{}", if signed { sty } else { ity }),
            (AtomicOp::And, false) => format!("and.{bty}"),
            (AtomicOp::Or, false) => format!("or.{bty}"),
            (AtomicOp::Xor, false) => format!("xor.{bty}"),
            _ => return Ok(None),
        };
        let instr = format!("{}.sys.global.{what}", ptx_sem(ord));
        ptx_atom(cx, &instr, cons, p, v).map(Some)
    }

    fn poll_pause<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<()> {
        // `nanosleep.u32 100` (sm_70+).
        cx.call_intrinsic("llvm.nvvm.nanosleep", &[], &[cx.i32(100).into()])?;
        Ok(())
    }

    fn atomic_u64<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        op: SignalOp,
        p: PointerValue<'ctx>,
        v: IntValue<'ctx>,
        ord: inkwell::AtomicOrdering,
        scope: MemScope,
    ) -> LResult<IntValue<'ctx>> {
        let sc = match scope {
            MemScope::Block => "cta",
            MemScope::Device => "gpu",
            MemScope::System => "sys",
        };
        let what = match op {
            SignalOp::Set => "exch.b64",
            SignalOp::Add => "add.u64",
        };
        let instr = format!("{}.{sc}.global.{what}", ptx_sem(ord));
        Ok(ptx_atom(cx, &instr, "l", p, v.into())?.into_int_value())
    }

    fn sync_scope(&self, scope: MemScope) -> &'static str {
        match scope {
            MemScope::Block => "block",
            MemScope::Device => "device",
            MemScope::System => "",
        }
    }

    fn has_ldmatrix(&self) -> bool {
        self.sm >= 75
    }

    fn ldmatrix<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        p: PointerValue<'ctx>,
        num: u32,
        trans: bool,
        _site: u32,
    ) -> LResult<Vec<IntValue<'ctx>>> {
        nvvm_ldmatrix(cx, p, num, trans)
    }

    fn mma(&self, input: ScalarType) -> Option<MmaInfo> {
        if self.sm < 80 {
            return None;
        }
        match input {
            ScalarType::F16 | ScalarType::BF16 => Some(nv_m16n8k16()),
            ScalarType::I8 => Some(nv_m16n8k32_s8()),
            // `mma.sync` m16n8k32 on 8-bit floats, the `.s8` fragments: on sm_89 the
            // instruction (PTX ISA 8.4, `QMMA` in the SASS); elsewhere `emit_mma`
            // converts each fragment to f16 for two `mma.m16n8k16`
            // (`super::fp8_mma_as_f16`), what ptxas makes of the instruction on sm_90,
            // without the newer driver. Not sm_90a, whose 8-bit floats take `wgmma`
            // (else f16 `wgmma`, `crate::fp8`).
            ScalarType::F8E4M3 | ScalarType::F8E5M2 if !self.arch_specific => {
                Some(nv_m16n8k32_s8())
            }
            _ => None,
        }
    }

    fn emit_mma<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        input: ScalarType,
        a: &[BasicValueEnum<'ctx>],
        b: &[BasicValueEnum<'ctx>],
        c: &[BasicValueEnum<'ctx>],
        site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        if input.is_fp8() && self.sm != 89 {
            // No 8-bit float `mma.sync` (see `Self::mma`): two f16 ones.
            let cvt = |w: IntValue<'ctx>| self.fp8x4_to_f16(cx, input, w);
            return super::fp8_mma_as_f16(self, cx, a, b, c, site, &cvt);
        }
        let i32t = cx.ctx.i32_type();
        let (pa, pb) = (pack_words(cx, a)?, pack_words(cx, b)?);
        let (shape, types, acc_ty, rc): (&str, &str, BasicTypeEnum<'ctx>, &str) = match input {
            ScalarType::BF16 => (
                "m16n8k16",
                "f32.bf16.bf16.f32",
                cx.ctx.f32_type().into(),
                "f",
            ),
            ScalarType::F16 => ("m16n8k16", "f32.f16.f16.f32", cx.ctx.f32_type().into(), "f"),
            ScalarType::I8 => ("m16n8k32", "s32.s8.s8.s32", i32t.into(), "r"),
            ScalarType::F8E4M3 | ScalarType::F8E5M2 => {
                require_ptx_isa(cx, PTX_ISA_FP8_MMA);
                let t = if input == ScalarType::F8E4M3 {
                    "f32.e4m3.e4m3.f32"
                } else {
                    "f32.e5m2.e5m2.f32"
                };
                ("m16n8k32", t, cx.ctx.f32_type().into(), "f")
            }
            t => return Err(LowerError::Llvm(format!("mma.sync on {t:?}"))),
        };
        if pa.len() != 4 || pb.len() != 2 || c.len() != 4 {
            return Err(LowerError::Llvm(
                "mma.sync takes 4 A, 2 B and 4 C registers".into(),
            ));
        }
        let asm = format!(
            "mma.sync.aligned.{shape}.row.col.{types} {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};"
        );
        let ret = cx.ctx.struct_type(&[acc_ty; 4], false);
        let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> = vec![i32t.into(); 6];
        params.extend([inkwell::types::BasicMetadataTypeEnum::from(acc_ty); 4]);
        let fty = ret.fn_type(&params, false);
        let asm_ptr = cx.ctx.create_inline_asm(
            fty,
            asm,
            format!("={rc},={rc},={rc},={rc},r,r,r,r,r,r,0,1,2,3"),
            false,
            false,
            None,
            false,
        );
        let mut args: Vec<inkwell::values::BasicMetadataValueEnum> =
            pa.iter().chain(&pb).map(|&v| v.into()).collect();
        args.extend(
            c.iter()
                .map(|&v| -> inkwell::values::BasicMetadataValueEnum { v.into() }),
        );
        let call = cx.b.build_indirect_call(fty, asm_ptr, &args, "mma")?;
        let s = call
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| LowerError::Llvm("mma asm returned void".into()))?
            .into_struct_value();
        (0..4)
            .map(|i| Ok(cx.b.build_extract_value(s, i, "")?))
            .collect()
    }
}

/// The PTX ISA version (times 10) that `mma.sync` on 8-bit floats needs: 8.4 (CUDA
/// 12.4 drivers and later), past the 8.0 Tessera emits otherwise.
pub const PTX_ISA_FP8_MMA: u64 = 84;

/// The module flag through which a lowering asks [`crate::emit::emit_module`] for a
/// PTX ISA version above the target's default (the version times 10).
pub const PTX_ISA_FLAG: &str = "tessera.ptx_isa";

/// Records that the module needs PTX ISA `version` (times 10), see [`PTX_ISA_FLAG`].
fn require_ptx_isa(cx: &Cx<'_>, version: u64) {
    if cx.module.get_flag(PTX_ISA_FLAG).is_none() {
        let v = cx.ctx.i32_type().const_int(version, false);
        cx.module
            .add_basic_value_flag(PTX_ISA_FLAG, inkwell::module::FlagBehavior::Override, v);
    }
}

/// NVIDIA `mma.m16n8k16` with 16-bit A/B and f32 C/D (the module docs' layouts):
/// lane bits 0, 1 give `t` (k or column 2, 4), lane bits 2..4 give `g` (rows 1, 2, 4).
fn nv_m16n8k16() -> MmaInfo {
    let lane = vec![(0, 2), (0, 4), (1, 0), (2, 0), (4, 0)];
    MmaInfo {
        m: 16,
        n: 8,
        k: 16,
        c_reg: vec![(0, 1), (8, 0)],
        c_lane: lane.clone(),
        a: FragInfo {
            lane: lane.clone(),
            runs: vec![(0, 0, 2), (8, 0, 2), (0, 8, 2), (8, 8, 2)],
        },
        b: FragInfo {
            lane,
            runs: vec![(0, 0, 2), (0, 8, 2)],
        },
    }
}

/// NVIDIA `mma.m16n8k32` with `.s8` A/B and `.s32` C/D (PTX ISA, "Matrix Fragments for
/// mma.m16n8k32"), `g = lane >> 2`, `t = lane % 4`:
/// - A (16×32), 16 bytes `a0..a15` in 4 `.b32` registers: row `g` (+8 for `a4..a7`,
///   `a12..a15`), column `4t + (i & 3)` (+16 for `a8..a15`);
/// - B (32×8), 8 bytes `b0..b7`: row (k) `4t + (i & 3)` (+16 for `b4..b7`), column `g`;
/// - C/D (16×8), 4 `.s32`: as the f32 C/D of `m16n8k16`.
pub(crate) fn nv_m16n8k32_s8() -> MmaInfo {
    let lane = vec![(0, 4), (0, 8), (1, 0), (2, 0), (4, 0)];
    MmaInfo {
        m: 16,
        n: 8,
        k: 32,
        c_reg: vec![(0, 1), (8, 0)],
        c_lane: vec![(0, 2), (0, 4), (1, 0), (2, 0), (4, 0)],
        a: FragInfo {
            lane: lane.clone(),
            runs: vec![(0, 0, 4), (8, 0, 4), (0, 16, 4), (8, 16, 4)],
        },
        b: FragInfo {
            lane,
            runs: vec![(0, 0, 4), (0, 16, 4)],
        },
    }
}

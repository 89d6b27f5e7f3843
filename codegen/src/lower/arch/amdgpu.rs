//! [`Amdgpu`], the AMD GCN/CDNA/RDNA implementation of [`Arch`], and the MFMA
//! fragment layouts ([`amd_mfma_16`], [`amd_mfma_32`], and the block-scaled
//! [`amd_mfma_scaled`]).

use inkwell::AddressSpace;
use inkwell::attributes::AttributeLoc;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use tessera_ir::ScalarType;
use tessera_ir::ir::MemScope;

use super::{Arch, FragInfo, Math, MmaInfo, ScaledMma, axis_char};
use crate::Target;
use crate::lower::{Cx, LResult, LowerError};
use crate::target::AmdArch;

/// AMD GCN/CDNA/RDNA.
pub struct Amdgpu {
    /// The gfx architecture.
    pub arch: AmdArch,
}

/// The integer type a raw buffer load of `bytes` bytes returns (`i8`, `i16`, `i32`,
/// `<2 x i32>`, `<4 x i32>`), bit-cast to what the caller asked for.
fn buffer_word_type<'ctx>(cx: &Cx<'ctx>, bytes: u32) -> LResult<BasicTypeEnum<'ctx>> {
    let i32t = cx.ctx.i32_type();
    Ok(match bytes {
        1 => cx.ctx.i8_type().into(),
        2 => cx.ctx.i16_type().into(),
        4 => i32t.into(),
        8 => i32t.vec_type(2).into(),
        16 => i32t.vec_type(4).into(),
        b => return Err(LowerError::Llvm(format!("buffer load of {b} bytes"))),
    })
}

impl Math for Amdgpu {
    /// `v_exp_f32` itself (`llvm.amdgcn.exp2`: 1 ulp; results below 2^-126 flush to
    /// zero, as with Triton's `exp2` on AMD). `llvm.exp2` would wrap each one in five
    /// more instructions (a range check, a scale by 2^64 and its undoing) to keep
    /// subnormal results, which a softmax never needs.
    fn exp2_approx<'ctx>(&self, cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
        Ok(cx
            .call_intrinsic("llvm.amdgcn.exp2", &[x.get_type().into()], &[x.into()])?
            .into_float_value())
    }
}

impl Arch for Amdgpu {
    fn has_buffer_load(&self) -> bool {
        // Not on RDNA3: there the attention example's 64x64 tile (4 warps) spills 24
        // VGPRs through buffer loads and none through global ones (RDNA4 and CDNA:
        // none either way, and fewer instructions through buffer loads).
        self.arch != AmdArch::Gfx1100
    }

    fn native_nan_max(&self) -> bool {
        // `v_maximum_f32` comes with gfx950 and gfx12.
        matches!(
            self.arch,
            AmdArch::Gfx950 | AmdArch::Gfx1200 | AmdArch::Gfx1201
        )
    }

    fn buffer_load<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        base: PointerValue<'ctx>,
        num_records: u32,
        lane: super::BufferLane<'ctx>,
        ty: BasicTypeEnum<'ctx>,
        _site: u32,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let offset = lane.offset;
        let p8 = cx.ctx.ptr_type(AddressSpace::from(8u16));
        let bytes = crate::lower::type_size(ty);
        let word = buffer_word_type(cx, bytes)?;
        // Stride 0, `num_records` bytes; dword 3 as the GFX9 family wants it
        // (DST_SEL_XYZW, 32-bit data format), and on RDNA (gfx11, gfx12) the same
        // format with RESOURCE_LEVEL 1 (bit 24) and OOB_SELECT 3 (bits 28-29: a raw
        // buffer, out of range past `num_records`), the word Triton's AMD backend
        // gives both.
        let word3 = if self.arch.is_rdna() {
            0x3102_7000
        } else {
            0x27000
        };
        let rsrc = cx.call_intrinsic(
            "llvm.amdgcn.make.buffer.rsrc",
            &[p8.into(), base.get_type().into()],
            &[
                base.into(),
                cx.ctx.i16_type().const_zero().into(),
                cx.ctx
                    .i64_type()
                    .const_int(num_records as u64, false)
                    .into(),
                cx.i32(word3).into(),
            ],
        )?;
        let v = cx.call_intrinsic(
            "llvm.amdgcn.raw.ptr.buffer.load",
            &[word],
            &[rsrc, offset.into(), cx.i32(0).into(), cx.i32(0).into()],
        )?;
        Ok(cx.b.build_bit_cast(v, ty, "")?)
    }

    fn target(&self) -> Target {
        Target::Amdgpu(self.arch)
    }

    fn thread_id<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        Ok(cx
            .call_intrinsic("llvm.amdgcn.workitem.id.x", &[], &[])?
            .into_int_value())
    }

    fn warp_id<'ctx>(&self, cx: &Cx<'ctx>, tid: IntValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let sh = cx.i32(self.warp_size().trailing_zeros() as i64);
        let w = cx.b.build_right_shift(tid, sh, false, "")?;
        let i32t: BasicTypeEnum = cx.ctx.i32_type().into();
        Ok(cx
            .call_intrinsic("llvm.amdgcn.readfirstlane", &[i32t], &[w.into()])?
            .into_int_value())
    }

    fn program_id<'ctx>(&self, cx: &Cx<'ctx>, axis: u8) -> LResult<IntValue<'ctx>> {
        let name = format!("llvm.amdgcn.workgroup.id.{}", axis_char(axis));
        Ok(cx.call_intrinsic(&name, &[], &[])?.into_int_value())
    }

    fn num_programs<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        axis: u8,
        num_threads: u32,
    ) -> LResult<IntValue<'ctx>> {
        // hsa_kernel_dispatch_packet_t: grid_size_{x,y,z} are u32 at bytes 12, 16, 20.
        let p = cx
            .call_intrinsic("llvm.amdgcn.dispatch.ptr", &[], &[])?
            .into_pointer_value();
        let off = 12 + 4 * axis.min(2) as u64;
        let i8t = cx.ctx.i8_type();
        let gp = unsafe {
            cx.b.build_in_bounds_gep(i8t, p, &[cx.ctx.i64_type().const_int(off, false)], "")?
        };
        let ld = cx.b.build_load(cx.ctx.i32_type(), gp, "grid")?;
        if let Some(i) = inkwell::values::BasicValue::as_instruction_value(&ld) {
            let _ = i.set_alignment(4);
        }
        let wg = if axis == 0 { num_threads } else { 1 };
        Ok(cx
            .b
            .build_int_unsigned_div(ld.into_int_value(), cx.i32(wg as i64), "nprog")?)
    }

    fn barrier<'ctx>(&self, cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        cx.fence(inkwell::AtomicOrdering::Release, "workgroup")?;
        cx.call_intrinsic("llvm.amdgcn.s.barrier", &[], &[])?;
        cx.fence(inkwell::AtomicOrdering::Acquire, "workgroup")?;
        Ok(())
    }

    fn shuffle_xor<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        v: IntValue<'ctx>,
        mask: u32,
        lane: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<IntValue<'ctx>> {
        let src = cx.b.build_xor(lane, cx.i32(mask as i64), "")?;
        let addr = cx.b.build_left_shift(src, cx.i32(2), "")?;
        Ok(cx
            .call_intrinsic("llvm.amdgcn.ds.bpermute", &[], &[addr.into(), v.into()])?
            .into_int_value())
    }

    fn set_kernel_abi<'ctx>(&self, cx: &Cx<'ctx>, f: FunctionValue<'ctx>, num_threads: u32) {
        f.set_call_conventions(91);
        let n = format!("{num_threads},{num_threads}");
        f.add_attribute(
            AttributeLoc::Function,
            cx.ctx
                .create_string_attribute("amdgpu-flat-work-group-size", &n),
        );
        f.add_attribute(
            AttributeLoc::Function,
            cx.ctx
                .create_string_attribute("uniform-work-group-size", "true"),
        );
    }

    fn timer_ns<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        // The constant 100 MHz "REALTIME" counter (s_memrealtime on gfx9/gfx10,
        // s_sendmsg_rtn_b64 on gfx11): 10 ns per tick.
        let t = cx
            .call_intrinsic("llvm.readsteadycounter", &[], &[])?
            .into_int_value();
        Ok(cx
            .b
            .build_int_mul(t, cx.ctx.i64_type().const_int(10, false), "ns")?)
    }

    fn poll_pause<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<()> {
        // `s_sleep 2`: about 128 clocks.
        cx.call_intrinsic("llvm.amdgcn.s.sleep", &[], &[cx.i32(2).into()])?;
        Ok(())
    }

    /// Signals, waits and communication atomics at system scope are LLVM atomics with
    /// the system `syncscope` (`""`): LLVM's memory legalizer then emits the code
    /// sequences of AMDGPUUsage, "Memory Model GFX942" (tables "AMDHSA Memory Model
    /// Code Sequences GFX942"): a release at system scope is `buffer_wbl2 sc0 sc1` and
    /// `s_waitcnt vmcnt(0)` before the access, an acquire is `buffer_inv sc0 sc1` after
    /// it, and the load or store itself carries `sc0 sc1` (atomic read-modify-writes
    /// `sc1`). Those sequences give system-scope coherence on fine-grained or uncached
    /// memory, which is why AMD symmetric heaps are allocated uncached (the runtime's
    /// `HipDevice::alloc_raw`). `comm_release_acquire_sequences_amdgcn` in
    /// `tests/tests/codegen_offline.rs` checks the emitted sequences.
    fn sync_scope(&self, scope: MemScope) -> &'static str {
        match scope {
            MemScope::Block => "workgroup",
            MemScope::Device => "agent",
            MemScope::System => "",
        }
    }

    fn mma(&self, input: ScalarType) -> Option<MmaInfo> {
        if self.arch.is_rdna() {
            return self.wmma(input);
        }
        Some(amd_mfma_16(*self.mfma_per_lane(input).first()?))
    }

    fn mma_for(
        &self,
        input: ScalarType,
        m: u32,
        n: u32,
        k: u32,
        num_warps: u32,
    ) -> Option<MmaInfo> {
        if self.arch.is_rdna() {
            return self.wmma(input);
        }
        let pers = self.mfma_per_lane(input);
        for &per in &pers {
            let (small, wide) = (amd_mfma_16(per), amd_mfma_32(per));
            // 32x32 tiles only when there is one for every wave (else the 16x16 ones
            // keep more waves busy).
            if m.is_multiple_of(32)
                && n.is_multiple_of(32)
                && k.is_multiple_of(wide.k)
                && (m / 32) * (n / 32) >= num_warps
            {
                return Some(wide);
            }
            if k.is_multiple_of(small.k) {
                return Some(small);
            }
        }
        // No instruction's `k` divides the tile's: the widest, which the caller refuses.
        Some(amd_mfma_16(*pers.first()?))
    }

    fn emit_mma<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        input: ScalarType,
        a: &[BasicValueEnum<'ctx>],
        b: &[BasicValueEnum<'ctx>],
        c: &[BasicValueEnum<'ctx>],
        _site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        if self.arch.is_rdna() {
            return self.emit_wmma(cx, input, a, b, c);
        }
        let wide = c.len() == 16;
        let per = a.len() as u32;
        if per == 32 {
            return emit_f8f6f4(cx, input, wide, a, b, c, None);
        }
        // A and B: the lane's elements as one vector (`<4 x half>`, `<4 x i16>` for
        // bf16 (gfx950's 8-wide ones: `<8 x bfloat>`), or packed into `i32` (4 bytes)
        // / `i64` (8 bytes) for i8 and the 8-bit floats.
        let to: Option<BasicTypeEnum<'ctx>> = match input {
            ScalarType::BF16 if per == 8 => Some(cx.ctx.bf16_type().vec_type(per).into()),
            ScalarType::BF16 => Some(cx.ctx.i16_type().vec_type(per).into()),
            ScalarType::I8 | ScalarType::F8E4M3 | ScalarType::F8E5M2 if per == 8 => {
                Some(cx.ctx.i64_type().into())
            }
            ScalarType::I8 => Some(cx.ctx.i32_type().into()),
            _ => None,
        };
        let (va, vb) = (lane_vector(cx, a, to)?, lane_vector(cx, b, to)?);
        let vc = lane_vector(cx, c, None)?;
        let name = match (input, wide, per) {
            (ScalarType::BF16, false, 4) => "llvm.amdgcn.mfma.f32.16x16x16bf16.1k",
            (ScalarType::F16, false, 4) => "llvm.amdgcn.mfma.f32.16x16x16f16",
            (ScalarType::BF16, true, 4) => "llvm.amdgcn.mfma.f32.32x32x8bf16.1k",
            (ScalarType::F16, true, 4) => "llvm.amdgcn.mfma.f32.32x32x8f16",
            (ScalarType::F16, false, 8) => "llvm.amdgcn.mfma.f32.16x16x32.f16",
            (ScalarType::BF16, false, 8) => "llvm.amdgcn.mfma.f32.16x16x32.bf16",
            (ScalarType::F16, true, 8) => "llvm.amdgcn.mfma.f32.32x32x16.f16",
            (ScalarType::BF16, true, 8) => "llvm.amdgcn.mfma.f32.32x32x16.bf16",
            (ScalarType::F8E4M3, false, 8) => "llvm.amdgcn.mfma.f32.16x16x32.fp8.fp8",
            (ScalarType::F8E5M2, false, 8) => "llvm.amdgcn.mfma.f32.16x16x32.bf8.bf8",
            (ScalarType::F8E4M3, true, 8) => "llvm.amdgcn.mfma.f32.32x32x16.fp8.fp8",
            (ScalarType::F8E5M2, true, 8) => "llvm.amdgcn.mfma.f32.32x32x16.bf8.bf8",
            (ScalarType::I8, false, 4) => "llvm.amdgcn.mfma.i32.16x16x16i8",
            (ScalarType::I8, true, 4) => "llvm.amdgcn.mfma.i32.32x32x8i8",
            (ScalarType::I8, false, 8) => "llvm.amdgcn.mfma.i32.16x16x32.i8",
            (ScalarType::I8, true, 8) => "llvm.amdgcn.mfma.i32.32x32x16.i8",
            (t, _, _) => {
                return Err(LowerError::Llvm(format!(
                    "MFMA on {t:?} with {per} elements per lane"
                )));
            }
        };
        let z = cx.i32(0);
        let d = cx.call_intrinsic(name, &[], &[va, vb, vc, z.into(), z.into(), z.into()])?;
        elements(cx, d)
    }

    fn scaled_mma_for(
        &self,
        input: ScalarType,
        m: u32,
        n: u32,
        k: u32,
        num_warps: u32,
    ) -> Option<ScaledMma> {
        if self.arch != AmdArch::Gfx950 || !matches!(input, ScalarType::F8E4M3 | ScalarType::F8E5M2)
        {
            return None;
        }
        // As `mma_for`: 32x32 tiles when there is one for every wave, or when the
        // 16x16 instruction's `k` (128) does not divide the tile's.
        let wide = m.is_multiple_of(32) && n.is_multiple_of(32) && k.is_multiple_of(64);
        let small = m.is_multiple_of(16) && n.is_multiple_of(16) && k.is_multiple_of(128);
        if wide && ((m / 32) * (n / 32) >= num_warps || !small) {
            Some(amd_mfma_scaled(32))
        } else if small {
            Some(amd_mfma_scaled(16))
        } else {
            None
        }
    }

    fn emit_scaled_mma<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        input: ScalarType,
        a: &[BasicValueEnum<'ctx>],
        b: &[BasicValueEnum<'ctx>],
        c: &[BasicValueEnum<'ctx>],
        scales: [IntValue<'ctx>; 2],
        _site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        emit_f8f6f4(cx, input, c.len() == 16, a, b, c, Some(scales))
    }
}

impl Amdgpu {
    /// The elements of A (and of B) per lane of this target's MFMA instructions on
    /// `input`, the preferred first: 4 for f16/bf16 on gfx90a and gfx942, 8 then 4 on
    /// gfx950 (its double-`k` `v_mfma_f32_16x16x32_f16`, `..._32x32x16_f16`, and
    /// gfx942's, which it keeps, for a `k` of 16); for i8, 4 on gfx90a
    /// (`v_mfma_i32_16x16x16i8`, `..._32x32x8i8`) and 8 on gfx942 and gfx950 (the
    /// double-rate `v_mfma_i32_16x16x32_i8`, `..._32x32x16_i8`); for the 8-bit
    /// floats 32 then 8 on gfx950 (`v_mfma_f32_16x16x128_f8f6f4`, `32x32x64`, then
    /// `v_mfma_f32_16x16x32_{fp8_fp8,bf8_bf8}`, `32x32x16`). Empty without them.
    fn mfma_per_lane(&self, input: ScalarType) -> Vec<u32> {
        match (self.arch, input) {
            (AmdArch::Gfx950, ScalarType::F16 | ScalarType::BF16) => vec![8, 4],
            (AmdArch::Gfx90a | AmdArch::Gfx942, ScalarType::F16 | ScalarType::BF16) => vec![4],
            (AmdArch::Gfx90a, ScalarType::I8) => vec![4],
            (AmdArch::Gfx942 | AmdArch::Gfx950, ScalarType::I8) => vec![8],
            // gfx950's `f8f6f4` instructions (32 bytes a lane), and gfx942's 8-bit
            // float opcodes, which gfx950 reads as OCP E4M3/E5M2 (gfx942 as the FNUZ
            // encodings, so there they are multiplied as f16, `crate::fp8`).
            (AmdArch::Gfx950, ScalarType::F8E4M3 | ScalarType::F8E5M2) => vec![32, 8],
            _ => Vec::new(),
        }
    }

    /// RDNA's WMMA for `input`, wave32: [`rdna3_wmma`] (f16, bf16) or [`rdna4_wmma`]
    /// (f16, bf16, and OCP E4M3/E5M2 as `v_wmma_f32_16x16x16_{fp8_fp8,bf8_bf8}`).
    fn wmma(&self, input: ScalarType) -> Option<MmaInfo> {
        let rdna4 = [
            ScalarType::F16,
            ScalarType::BF16,
            ScalarType::F8E4M3,
            ScalarType::F8E5M2,
        ];
        match (self.arch, input) {
            (AmdArch::Gfx1100, ScalarType::F16 | ScalarType::BF16) => Some(rdna3_wmma()),
            (a, t) if a.is_gfx12() && rdna4.contains(&t) => Some(rdna4_wmma()),
            _ => None,
        }
    }

    /// One WMMA: `a` and `b` the lane's 16 (RDNA3) or 8 (RDNA4) elements, `c` its 8
    /// f32 accumulators. `llvm.amdgcn.wmma.f32.16x16x16.{f16,bf16}` takes `<N x half>`
    /// or `<N x i16>` (bf16 bits), `...{fp8.fp8,bf8.bf8}` `<2 x i32>` (8 bytes), and
    /// `<8 x float>`.
    fn emit_wmma<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        input: ScalarType,
        a: &[BasicValueEnum<'ctx>],
        b: &[BasicValueEnum<'ctx>],
        c: &[BasicValueEnum<'ctx>],
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        let per = a.len() as u32;
        // The operand type: `per` elements, 8-bit ones as `<per / 4 x i32>`.
        let (name, et, n): (&str, BasicTypeEnum<'ctx>, u32) = match input {
            ScalarType::F16 => (
                "llvm.amdgcn.wmma.f32.16x16x16.f16",
                cx.ctx.f16_type().into(),
                per,
            ),
            ScalarType::BF16 => (
                "llvm.amdgcn.wmma.f32.16x16x16.bf16",
                cx.ctx.i16_type().into(),
                per,
            ),
            ScalarType::F8E4M3 => (
                "llvm.amdgcn.wmma.f32.16x16x16.fp8.fp8",
                cx.ctx.i32_type().into(),
                per / 4,
            ),
            ScalarType::F8E5M2 => (
                "llvm.amdgcn.wmma.f32.16x16x16.bf8.bf8",
                cx.ctx.i32_type().into(),
                per / 4,
            ),
            t => return Err(LowerError::Llvm(format!("WMMA on {t:?}"))),
        };
        let vt: BasicTypeEnum<'ctx> = match et {
            BasicTypeEnum::IntType(t) => t.vec_type(n).into(),
            _ => et.into_float_type().vec_type(n).into(),
        };
        let (va, vb) = (lane_vector(cx, a, Some(vt))?, lane_vector(cx, b, Some(vt))?);
        let vc = lane_vector(cx, c, None)?;
        let d = cx.call_intrinsic(name, &[vc.get_type(), vt], &[va, vb, vc])?;
        elements(cx, d)
    }
}

/// `v` (a lane's elements, all of one type) as one vector of that type, bit-cast to
/// `to` where given.
fn lane_vector<'ctx>(
    cx: &Cx<'ctx>,
    v: &[BasicValueEnum<'ctx>],
    to: Option<BasicTypeEnum<'ctx>>,
) -> LResult<BasicValueEnum<'ctx>> {
    let n = v.len() as u32;
    let first = v
        .first()
        .ok_or_else(|| LowerError::Llvm("a matrix operand of no elements".into()))?;
    let mut acc = match first.get_type() {
        BasicTypeEnum::IntType(t) => t.vec_type(n),
        t => t.into_float_type().vec_type(n),
    }
    .get_poison();
    for (i, x) in v.iter().enumerate() {
        acc = cx.b.build_insert_element(acc, *x, cx.i32(i as i64), "")?;
    }
    Ok(match to {
        Some(t) => cx.b.build_bit_cast(acc, t, "")?,
        None => acc.into(),
    })
}

/// The elements of the vector `d` (a matrix instruction's D).
fn elements<'ctx>(cx: &Cx<'ctx>, d: BasicValueEnum<'ctx>) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let d = d.into_vector_value();
    (0..d.get_type().get_size() as u64)
        .map(|i| Ok(cx.b.build_extract_element(d, cx.i32(i as i64), "")?))
        .collect()
}

/// A lane's `p` consecutive `k` as runs of at most 16 (16 bytes of 8-bit elements,
/// the widest LDS read: gfx950's `f8f6f4` instructions hold 32 a lane).
fn lane_runs(p: u32) -> Vec<(u32, u32, u32)> {
    (0..p.div_ceil(16))
        .map(|i| (0, 16 * i, (p - 16 * i).min(16)))
        .collect()
}

/// One gfx950 `v_mfma_f32_{16x16x128,32x32x64}_f8f6f4` on OCP E4M3 or E5M2 (`cbsz`
/// and `blgp` 0 or 1): with `scales` (the lane's E8M0 scale of A and of B, byte 0
/// selected) the block-scaled `v_mfma_scale_f32_*`; without, the unscaled form, which
/// LLVM selects for `llvm.amdgcn.mfma.scale.f32.*.f8f6f4` with zero scale operands.
/// `a` and `b` are the lane's 32 bytes (`<8 x i32>`), `c` its accumulators.
fn emit_f8f6f4<'ctx>(
    cx: &Cx<'ctx>,
    input: ScalarType,
    wide: bool,
    a: &[BasicValueEnum<'ctx>],
    b: &[BasicValueEnum<'ctx>],
    c: &[BasicValueEnum<'ctx>],
    scales: Option<[IntValue<'ctx>; 2]>,
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let format = match input {
        ScalarType::F8E4M3 => 0,
        ScalarType::F8E5M2 => 1,
        t => return Err(LowerError::Llvm(format!("f8f6f4 MFMA on {t:?}"))),
    };
    let vt: BasicTypeEnum<'ctx> = cx.ctx.i32_type().vec_type(8).into();
    let (va, vb) = (lane_vector(cx, a, Some(vt))?, lane_vector(cx, b, Some(vt))?);
    let vc = lane_vector(cx, c, None)?;
    let name = if wide {
        "llvm.amdgcn.mfma.scale.f32.32x32x64.f8f6f4"
    } else {
        "llvm.amdgcn.mfma.scale.f32.16x16x128.f8f6f4"
    };
    let (z, f) = (cx.i32(0), cx.i32(format).into());
    let [sa, sb] = scales.unwrap_or([z, z]);
    let (z, sa, sb) = (z.into(), sa.into(), sb.into());
    let d = cx.call_intrinsic(name, &[vt, vt], &[va, vb, vc, f, f, z, sa, z, sb])?;
    elements(cx, d)
}

/// RDNA3's `v_wmma_f32_16x16x16_{f16,bf16}` in wave32 (RDNA3 ISA, "Wave Matrix
/// Multiply Accumulate"; GPUOpen's "WMMA on RDNA3"): every lane holds 16 elements of
/// A and of B, the whole `k` of one row of A (column of B), `lane % 16`, and the two
/// halves of the wave hold the same (lane bit 4 adds nothing: the upper half loads
/// what the lower does); C/D: `C[2 * v + lane / 16][lane % 16]`.
pub fn rdna3_wmma() -> MmaInfo {
    // Two 16-byte reads a lane.
    wmma((0, 0), (2, 0), (1, 0), vec![(0, 0, 8), (0, 8, 8)])
}

/// A 16x16x16 WMMA of wave32 whose A and B lanes hold row (column) `lane % 16`,
/// lane bit 4 adding `hi` to (row, `k`), the lane's elements the `runs`; C's lane
/// bits 0-3 the column, its register bits rows `c_row`, `2 c_row`, `4 c_row`, its
/// lane bit 4 `c_hi`.
fn wmma(
    hi: (u32, u32),
    c_row: (u32, u32),
    c_hi: (u32, u32),
    runs: Vec<(u32, u32, u32)>,
) -> MmaInfo {
    let lane = vec![(1, 0), (2, 0), (4, 0), (8, 0), hi];
    MmaInfo {
        m: 16,
        n: 16,
        k: 16,
        c_reg: vec![c_row, (2 * c_row.0, 0), (4 * c_row.0, 0)],
        c_lane: vec![(0, 1), (0, 2), (0, 4), (0, 8), c_hi],
        a: FragInfo {
            lane: lane.clone(),
            runs: runs.clone(),
        },
        b: FragInfo { lane, runs },
    }
}

/// RDNA4's `v_wmma_f32_16x16x16_{f16,bf16}` in wave32 (RDNA4 ISA, "Wave Matrix
/// Multiply Accumulate"; AMD's matrix instruction calculator): every lane holds 8
/// elements of A (of B) of row (column) `lane % 16`; C/D: `C[v + 8 (lane / 16)][lane
/// % 16]`. The ISA numbers the `k` of element `i` `8 (i / 4) + 4 (lane / 16) + i % 4`
/// (four at a time, interleaved between the half-waves); here both operands number
/// it `8 (lane / 16) + i` instead. The instruction sums the products of the elements
/// A and B hold in the same place, so any renumbering of `k` that A and B share
/// leaves D unchanged (the emulator computes with the ISA's numbering), and this one
/// makes each lane's elements 8 consecutive `k`: one 16-byte read, and staging
/// stores of 16 bytes. (Only an operand another instruction produced in the ISA's
/// numbering would need the ISA's; none does.)
pub fn rdna4_wmma() -> MmaInfo {
    wmma((0, 8), (1, 0), (8, 0), vec![(0, 0, 8)])
}

/// gfx950's `v_mfma_scale_f32_16x16x128_f8f6f4` (`m` 16) or `..._32x32x64_f8f6f4` (`m`
/// 32) on 8-bit floats, in the instruction's own numbering of `k` (AMD's "Matrix Core
/// Programming on CDNA3 and CDNA4", and the CDNA4 ISA): A's element `i` in `lane` is
/// `A[lane % m][K/2 (i / 16) + 16 (lane / m) + i % 16]` for the instruction's `K`
/// (128, 64): two runs of 16 (B's the same with the row read as B's column); C/D as
/// [`amd_mfma_16`] / [`amd_mfma_32`]. The lane's scale is that of row (column)
/// `lane % m`, block `lane / m` of the blocks of 32 `k`, which the hardware applies
/// to each block's sum.
pub fn amd_mfma_scaled(m: u32) -> ScaledMma {
    let mut info = if m == 16 {
        amd_mfma_16(32)
    } else {
        amd_mfma_32(32)
    };
    let rows = (0..m.trailing_zeros()).map(|j| (1 << j, 0));
    let groups = 0..(64 / m).trailing_zeros();
    let lane: Vec<(u32, u32)> = rows
        .clone()
        .chain(groups.clone().map(|j| (0, 16 << j)))
        .collect();
    let runs = vec![(0, 0, 16), (0, info.k / 2, 16)];
    info.a = FragInfo {
        lane: lane.clone(),
        runs: runs.clone(),
    };
    info.b = FragInfo { lane, runs };
    ScaledMma {
        info,
        scale_lane: rows.chain(groups.map(|j| (0, 1 << j))).collect(),
    }
}

/// AMD 16x16 MFMA with `p` elements of A and B per lane (`v_mfma_f32_16x16x16f16`:
/// 4; `v_mfma_i32_16x16x32_i8`: 8; CDNA3 ISA, AMD Matrix Instruction Calculator),
/// k = 4p, 64 lanes, item `i` in 0..p of A and B, 4 items `v` of C/D:
/// - A (16×4p): `A[lane % 16][p * (lane / 16) + i]`; B: `B[p * (lane / 16) + i][lane % 16]`;
/// - C/D (16×16): `C[4 * (lane / 16) + v][lane % 16]`.
pub fn amd_mfma_16(p: u32) -> MmaInfo {
    let lane = vec![(1, 0), (2, 0), (4, 0), (8, 0), (0, p), (0, 2 * p)];
    MmaInfo {
        m: 16,
        n: 16,
        k: 4 * p,
        c_reg: vec![(1, 0), (2, 0)],
        c_lane: vec![(0, 1), (0, 2), (0, 4), (0, 8), (4, 0), (8, 0)],
        a: FragInfo {
            lane: lane.clone(),
            runs: lane_runs(p),
        },
        b: FragInfo {
            lane,
            runs: lane_runs(p),
        },
    }
}

/// AMD 32x32 MFMA with `p` elements of A and B per lane (`v_mfma_f32_32x32x8f16`: 4;
/// `v_mfma_i32_32x32x16_i8`: 8; same sources), k = 2p, 64 lanes, item `i` in 0..p of
/// A and B, 16 items `v` of C/D:
/// - A (32×2p): `A[lane % 32][p * (lane / 32) + i]`; B: `B[p * (lane / 32) + i][lane % 32]`;
/// - C/D (32×32): `C[(v % 4) + 4 * (lane / 32) + 8 * (v / 4)][lane % 32]`.
pub fn amd_mfma_32(p: u32) -> MmaInfo {
    let lane = vec![(1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (0, p)];
    MmaInfo {
        m: 32,
        n: 32,
        k: 2 * p,
        c_reg: vec![(1, 0), (2, 0), (8, 0), (16, 0)],
        c_lane: vec![(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (4, 0)],
        a: FragInfo {
            lane: lane.clone(),
            runs: lane_runs(p),
        },
        b: FragInfo {
            lane,
            runs: lane_runs(p),
        },
    }
}

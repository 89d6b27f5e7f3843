//! [`Amdgpu`], the AMD GCN/CDNA/RDNA implementation of [`Arch`], and the MFMA
//! fragment layouts ([`amd_mfma_16`], [`amd_mfma_32`]).

use inkwell::AddressSpace;
use inkwell::attributes::AttributeLoc;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use tessera_ir::ScalarType;
use tessera_ir::ir::MemScope;

use super::{Arch, FragInfo, Math, MmaInfo, axis_char};
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
        matches!(self.arch, AmdArch::Gfx90a | AmdArch::Gfx942)
    }

    fn native_nan_max(&self) -> bool {
        // `v_maximum_f32` comes with gfx950 and gfx12.
        false
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
        // (DST_SEL_XYZW, 32-bit data format).
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
                cx.i32(0x27000).into(),
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
        Some(amd_mfma_16(self.mfma_per_lane(input)?))
    }

    fn mma_for(
        &self,
        input: ScalarType,
        m: u32,
        n: u32,
        k: u32,
        num_warps: u32,
    ) -> Option<MmaInfo> {
        let small = self.mma(input)?;
        let wide = amd_mfma_32(self.mfma_per_lane(input)?);
        // 32x32 tiles only when there is one for every wave (else the 16x16 ones keep
        // more waves busy).
        if m.is_multiple_of(32)
            && n.is_multiple_of(32)
            && k.is_multiple_of(wide.k)
            && (m / 32) * (n / 32) >= num_warps
        {
            Some(wide)
        } else {
            Some(small)
        }
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
        let wide = c.len() == 16;
        let per = a.len() as u32;
        // A and B: the lane's elements as one vector (`<4 x half>`, `<4 x i16>` for
        // bf16), or packed into `i32` (4 bytes) / `i64` (8 bytes) for i8.
        let operand = |v: &[BasicValueEnum<'ctx>]| -> LResult<BasicValueEnum<'ctx>> {
            let et = v[0].get_type();
            let vt = match et {
                BasicTypeEnum::IntType(t) => t.vec_type(per),
                _ => et.into_float_type().vec_type(per),
            };
            let mut acc = vt.get_poison();
            for (i, x) in v.iter().enumerate() {
                acc = cx.b.build_insert_element(acc, *x, cx.i32(i as i64), "")?;
            }
            Ok(match input {
                ScalarType::BF16 => {
                    cx.b.build_bit_cast(acc, cx.ctx.i16_type().vec_type(per), "")?
                }
                ScalarType::I8 if per == 8 => cx.b.build_bit_cast(acc, cx.ctx.i64_type(), "")?,
                ScalarType::I8 => cx.b.build_bit_cast(acc, cx.ctx.i32_type(), "")?,
                _ => acc.into(),
            })
        };
        let (va, vb) = (operand(a)?, operand(b)?);
        let ct = c[0].get_type();
        let mut vc = match ct {
            BasicTypeEnum::IntType(t) => t.vec_type(c.len() as u32),
            _ => ct.into_float_type().vec_type(c.len() as u32),
        }
        .get_poison();
        for (i, x) in c.iter().enumerate() {
            vc = cx.b.build_insert_element(vc, *x, cx.i32(i as i64), "")?;
        }
        let name = match (input, wide, per) {
            (ScalarType::BF16, false, 4) => "llvm.amdgcn.mfma.f32.16x16x16bf16.1k",
            (ScalarType::F16, false, 4) => "llvm.amdgcn.mfma.f32.16x16x16f16",
            (ScalarType::BF16, true, 4) => "llvm.amdgcn.mfma.f32.32x32x8bf16.1k",
            (ScalarType::F16, true, 4) => "llvm.amdgcn.mfma.f32.32x32x8f16",
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
        let d = cx
            .call_intrinsic(
                name,
                &[],
                &[va, vb, vc.into(), z.into(), z.into(), z.into()],
            )?
            .into_vector_value();
        (0..c.len() as u64)
            .map(|i| Ok(cx.b.build_extract_element(d, cx.i32(i as i64), "")?))
            .collect()
    }
}

impl Amdgpu {
    /// The elements of A (and of B) per lane of this target's MFMA instructions on
    /// `input`: 4 for f16/bf16 (gfx90a, gfx942) and for i8 on gfx90a
    /// (`v_mfma_i32_16x16x16i8`, `..._32x32x8i8`), 8 for i8 on gfx942 (its
    /// double-rate `v_mfma_i32_16x16x32_i8`, `..._32x32x16_i8`); `None` without them.
    fn mfma_per_lane(&self, input: ScalarType) -> Option<u32> {
        match (self.arch, input) {
            (AmdArch::Gfx90a | AmdArch::Gfx942, ScalarType::F16 | ScalarType::BF16) => Some(4),
            (AmdArch::Gfx90a, ScalarType::I8) => Some(4),
            (AmdArch::Gfx942, ScalarType::I8) => Some(8),
            _ => None,
        }
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
            runs: vec![(0, 0, p)],
        },
        b: FragInfo {
            lane,
            runs: vec![(0, 0, p)],
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
            runs: vec![(0, 0, p)],
        },
        b: FragInfo {
            lane,
            runs: vec![(0, 0, p)],
        },
    }
}

//! [`Emu`]: the [`Arch`] of the host SIMT emulator.
//!
//! Every target hook becomes a call to an `extern "C"` function of the emulator's
//! runtime (`crate::emu::runtime`), which knows the calling GPU thread's place in the
//! emulated block. Their signatures are declared once, in the ABI table
//! (`lower/arch/emu_abi.rs`), which both this lowering and the emulator's symbol list read;
//! what each does:
//!
//! | hook | runtime function |
//! |---|---|
//! | thread id | `i32 tessera_emu_tid()` |
//! | program id | `i32 tessera_emu_program_id(i32 axis)` |
//! | grid size | `i32 tessera_emu_num_programs(i32 axis)` |
//! | barrier | `void tessera_emu_barrier(i32 site)` |
//! | shuffle xor | `i32 tessera_emu_shuffle_xor(i32 v, i32 mask, i32 site)` |
//! | shared memory | `ptr tessera_emu_shared_base()` (a per-block host buffer) |
//! | global access | `ptr tessera_emu_check_global(ptr p, i32 bytes, i32 site)` (checked against the buffers of the site's [`crate::lower::Site::prov`]) |
//! | buffer load (emu-amd) | the range rule on the offset, then a checked load at the lane's own pointer where its mask holds (see [`Emu::buffer_load`](Arch::buffer_load)) |
//! | timer (ns) | `i64 tessera_emu_timer_ns()` (also parks the calling GPU thread: it is called in polling loops, and the thread waited for must get its turn) |
//! | integer divisor | `void tessera_emu_check_divisor(i32 is_zero, i32 site)` (reports a division by zero) |
//! | loop back edge | `void tessera_emu_yield()` (the other threads get a turn) |
//! | runtime loop header | `i32 tessera_emu_loop_ok(i32 site)` (0 once the launch's watchdog expired: the loop exits, the launch fails) |
//! | bad `remote_ptr` peer | `void tessera_emu_bad_peer(i32 peer, i32 world, i32 site)` (records the error) |
//! | shared access | `void tessera_emu_note_shared(ptr p, i32 bytes, i32 is_write, i32 site)` |
//! | `mma.sync` m16n8k16 | `void tessera_emu_mma_nv_{f16,bf16}(i32 a0..a3, i32 b0, b1, float c0..c3, ptr d, i32 site)` |
//! | `ldmatrix` (emu-nv) | `void tessera_emu_ldmatrix(ptr row, i32 num, i32 trans, ptr out, i32 site)` (one `i32` per matrix to `out`) |
//! | MFMA 32x32x8 | `void tessera_emu_mma_amd32_{f16,bf16}(ptr ab, ptr cd, i32 site)` (`[8 x i32]` A then B, 16-bit elements zero-extended; `[16 x float]` C in, D out) |
//! | shared address (descriptors) | `p - tessera_emu_shared_base()` |
//! | `fence.proxy.async.shared::cta` | `void tessera_emu_fence_proxy_async()` |
//! | `wgmma.fence` / `.commit_group` | `void tessera_emu_wgmma_{fence,commit}(i32 site)` |
//! | `wgmma.mma_async` m64nNk16 / m64nNk32 `.s8` (emu-sm90a) | `void tessera_emu_wgmma(i32 ty, i32 n, i64 desc_a, i64 desc_b, i32 flags, ptr acc, i32 slot, i32 site)` (ty: 0 f16, 1 bf16, 2 s8, 3 e4m3, 4 e5m2; flags: bit 0 `imm-trans-b`, bit 1 `scale-d`) (`[n/2 x i32]` accumulator words, f32 by their bits, in; poison out) |
//! | `wgmma.mma_async` with A in registers | `void tessera_emu_wgmma_rs(i32 ty, i32 n, i32 a0..a3, i64 desc_b, i32 flags, ptr acc, i32 slot, i32 site)` |
//! | `mbarrier.init` | `void tessera_emu_mbar_init(ptr bar, i32 count, i32 site)` |
//! | `mbarrier.inval` | `void tessera_emu_mbar_inval(ptr bar, i32 site)` |
//! | `mbarrier.arrive.expect_tx` | `void tessera_emu_mbar_expect_tx(ptr bar, i32 bytes, i32 site)` |
//! | `mbarrier.try_wait.parity` loop | `void tessera_emu_mbar_wait(ptr bar, i32 parity, i32 site)` |
//! | `cp.async.bulk.tensor` (TMA load) | `void tessera_emu_tma_load(ptr dst, i64 tmap, i32 rank, i32 c0, i32 c1, i32 c2, ptr bar, i32 site)` (coordinates innermost first; `tmap` the id of a registered [`crate::emu::tma::EmuTensorMap`]) |
//! | `cp.async.bulk.tensor ... .multicast::cluster` | `void tessera_emu_tma_load_multicast(ptr dst, i64 tmap, i32 rank, i32 c0, i32 c1, i32 c2, ptr bar, i32 mask, i32 site)` (lands in every block of the cluster whose rank is a bit of `mask`) |
//! | `%cluster_ctarank` | `i32 tessera_emu_cluster_ctarank()` |
//! | `barrier.cluster.arrive` + `.wait` | `void tessera_emu_cluster_sync(i32 site)` |
//! | `mapa` + `mbarrier.arrive.release.cluster.shared::cluster` | `void tessera_emu_mbar_arrive_cluster(ptr bar, i32 cta, i32 site)` (the mbarrier at `bar`'s offset in block `cta` of the cluster) |
//! | `cp.async.bulk.tensor` (TMA store) | `void tessera_emu_tma_store(ptr src, i64 tmap, i32 rank, i32 c0, i32 c1, i32 c2, i32 site)` |
//! | `cp.async.bulk.commit_group` + `wait_group.read 0` | `void tessera_emu_tma_store_wait(i32 site)` (the thread's stores read shared memory and write global memory now) |
//! | `wgmma.wait_group` | `void tessera_emu_wgmma_wait(i32 pending, ptr acc, i32 regs, i32 slot, i32 site)` per accumulator tile (its registers out) |
//! | MFMA 16x16x16 | `void tessera_emu_mma_amd_{f16,bf16}(i32 a0..a3, i32 b0..b3, float c0..c3, ptr d, i32 site)` (16-bit elements zero-extended) |
//! | 8-bit matrix instructions (`mma.sync` m16n8k32 `.s8`, `.e4m3`, `.e5m2`, MFMA `i32_16x16x32_i8`, `i32_32x32x16_i8`) | `void tessera_emu_mma_words(i32 kind, ptr ab, i32 a_words, ptr cd, i32 c_regs, i32 site)` (kind: 0 `.s8`, 1 and 2 the MFMA, 3 `.e4m3`, 4 `.e5m2` (sm_89's; emu-nv converts 8-bit float fragments to f16 as sm_80 does, `arch::fp8_mma_as_f16`); `[n x i32]` A then B, packed `.b32` registers; `[c_regs x i32]` C in, D out, f32 by their bits) |
//! | gfx950 MFMA `f32_16x16x32`, `f32_32x32x16`, RDNA3 and RDNA4 WMMA `f32_16x16x16` (f16, bf16, and E4M3/E5M2 on gfx950 and RDNA4; emu-gfx950, emu-gfx1100, emu-gfx1200) | `tessera_emu_mma_words` with kinds from 5 ([`crate::emu::mma::AmdMma::kind`]; gfx950's and RDNA4's OCP 8-bit float forms too): the elements packed into `.b32` registers, f32 accumulators by their bits |
//! | gfx950's block-scaled `v_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4` (`dot_scaled` on MXFP8, emu-gfx950) | `tessera_emu_mma_words` with their kinds: A, B, then the lane's E8M0 scale of A and of B (`Arch::emit_scaled_mma`) |
//!
//! The fragment contents are exactly what the GPU lowering puts in the instruction's
//! registers ([`Nvptx::mma`] / [`Amdgpu::mma`] layouts, `super::pack_words`
//! packing), and the runtime multiplies them with its own, independent, reading of the
//! vendors' layouts ([`crate::emu::mma`]). Atomics use the system scope `""` (host
//! atomics); the kernel uses the C calling convention; pointers live in address
//! space 0.

use inkwell::AddressSpace;
use inkwell::module::Linkage;
use inkwell::types::{BasicMetadataTypeEnum, BasicTypeEnum, FunctionType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FloatValue, FunctionValue, IntValue,
    PointerValue,
};
use tessera_ir::ScalarType;
use tessera_ir::ir::MemScope;

use super::{Amdgpu, Arch, Math, MmaInfo, Nvptx, ScaledMma, WgmmaA, pack_words};
use crate::Target;
use crate::emu::mma::{AmdElem, AmdMma};
use crate::lower::{Cx, LResult, LowerError, entry_alloca};
use crate::target::{AmdArch, EmuFlavor};

/// The host SIMT emulator.
pub struct Emu {
    /// Which GPU it imitates.
    pub flavor: EmuFlavor,
}

fn declare<'ctx>(cx: &Cx<'ctx>, name: &str, ty: FunctionType<'ctx>) -> FunctionValue<'ctx> {
    cx.module
        .get_function(name)
        .unwrap_or_else(|| cx.module.add_function(name, ty, Some(Linkage::External)))
}

/// Calls runtime function `name`, declared as its row of the ABI table
/// ([`super::emu_abi`]) says.
fn call<'ctx>(
    cx: &Cx<'ctx>,
    name: &str,
    args: &[BasicMetadataValueEnum<'ctx>],
) -> LResult<Option<BasicValueEnum<'ctx>>> {
    let ty = super::emu_abi::signature(cx.ctx, name)
        .ok_or_else(|| LowerError::Llvm(format!("`{name}` is not in the emulator's ABI table")))?;
    let f = declare(cx, name, ty);
    Ok(cx.b.build_call(f, args, "")?.try_as_basic_value().basic())
}

fn int_result<'ctx>(v: Option<BasicValueEnum<'ctx>>) -> LResult<IntValue<'ctx>> {
    v.map(|v| v.into_int_value())
        .ok_or_else(|| LowerError::Llvm("runtime call returned void".into()))
}

/// The NVIDIA fragment layouts every NVIDIA flavor shares (`mma.sync` m16n8k16).
const NV_MMA: Nvptx = Nvptx {
    sm: 80,
    arch_specific: false,
};

impl Emu {
    /// Whether the flavor imitates an NVIDIA GPU (warp 32, `ldmatrix`, `cp.async`,
    /// `mma.sync`).
    fn nv_like(&self) -> bool {
        matches!(self.flavor, EmuFlavor::Nv | EmuFlavor::Sm90a)
    }

    /// The AMD architecture an AMD flavour imitates: its layouts and matrix
    /// instructions are that architecture's.
    /// The instruction after gfx942's that a matrix instruction on `input` with
    /// `per_lane` elements of A and `c_regs` accumulators is on this flavour, if any
    /// (integer ones, and gfx942's, keep their own kinds).
    fn amd_mma(&self, input: ScalarType, per_lane: usize, c_regs: usize) -> Option<AmdMma> {
        let arch = self.amd()?.arch;
        if input == ScalarType::I8 {
            return None;
        }
        match (per_lane, c_regs) {
            _ if arch == AmdArch::Gfx1100 => Some(AmdMma::Wmma11),
            _ if arch.is_gfx12() => Some(AmdMma::Wmma12),
            (8, 4) if arch == AmdArch::Gfx950 => Some(AmdMma::Mfma16x16x32),
            (8, 16) if arch == AmdArch::Gfx950 => Some(AmdMma::Mfma32x32x16),
            (32, 4) if arch == AmdArch::Gfx950 => Some(AmdMma::Mfma16x16x128),
            (32, 16) if arch == AmdArch::Gfx950 => Some(AmdMma::Mfma32x32x64),
            _ => None,
        }
    }

    fn amd(&self) -> Option<Amdgpu> {
        match self.flavor.imitates() {
            Target::Amdgpu(arch) => Some(Amdgpu { arch }),
            _ => None,
        }
    }

    fn site<'ctx>(cx: &Cx<'ctx>, site: u32) -> BasicMetadataValueEnum<'ctx> {
        cx.i32(site as i64).into()
    }

    fn ptr_ty<'ctx>(cx: &Cx<'ctx>) -> inkwell::types::PointerType<'ctx> {
        cx.ctx.ptr_type(AddressSpace::default())
    }
}

impl Math for Emu {}

impl Arch for Emu {
    fn target(&self) -> Target {
        Target::Emu(self.flavor)
    }

    fn thread_id<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        int_result(call(cx, "tessera_emu_tid", &[])?)
    }

    fn program_id<'ctx>(&self, cx: &Cx<'ctx>, axis: u8) -> LResult<IntValue<'ctx>> {
        int_result(call(
            cx,
            "tessera_emu_program_id",
            &[cx.i32(axis.min(2) as i64).into()],
        )?)
    }

    fn num_programs<'ctx>(&self, cx: &Cx<'ctx>, axis: u8, _: u32) -> LResult<IntValue<'ctx>> {
        int_result(call(
            cx,
            "tessera_emu_num_programs",
            &[cx.i32(axis.min(2) as i64).into()],
        )?)
    }

    fn barrier<'ctx>(&self, cx: &Cx<'ctx>, site: u32) -> LResult<()> {
        call(cx, "tessera_emu_barrier", &[Emu::site(cx, site)])?;
        Ok(())
    }

    fn shuffle_xor<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        v: IntValue<'ctx>,
        mask: u32,
        _lane: IntValue<'ctx>,
        site: u32,
    ) -> LResult<IntValue<'ctx>> {
        let args = [v.into(), cx.i32(mask as i64).into(), Emu::site(cx, site)];
        int_result(call(cx, "tessera_emu_shuffle_xor", &args)?)
    }

    fn shared_base<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<Option<PointerValue<'ctx>>> {
        let v = call(cx, "tessera_emu_shared_base", &[])?
            .ok_or_else(|| LowerError::Llvm("runtime call returned void".into()))?;
        Ok(Some(v.into_pointer_value()))
    }

    fn check_global<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        ptr: PointerValue<'ctx>,
        bytes: u32,
        site: u32,
    ) -> LResult<PointerValue<'ctx>> {
        let args = [ptr.into(), cx.i32(bytes as i64).into(), Emu::site(cx, site)];
        let v = call(cx, "tessera_emu_check_global", &args)?
            .ok_or_else(|| LowerError::Llvm("runtime call returned void".into()))?;
        Ok(v.into_pointer_value())
    }

    fn note_shared<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        ptr: PointerValue<'ctx>,
        bytes: u32,
        is_write: bool,
        site: u32,
    ) -> LResult<()> {
        let args = [
            ptr.into(),
            cx.i32(bytes as i64).into(),
            cx.i32(is_write as i64).into(),
            Emu::site(cx, site),
        ];
        call(cx, "tessera_emu_note_shared", &args)?;
        Ok(())
    }

    fn timer_ns<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        int_result(call(cx, "tessera_emu_timer_ns", &[])?)
    }

    fn engine_site<'ctx>(&self, cx: &Cx<'ctx>, site: u32) -> LResult<()> {
        call(cx, "tessera_emu_engine_site", &[Emu::site(cx, site)])?;
        Ok(())
    }

    fn bad_peer<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        peer: IntValue<'ctx>,
        world: IntValue<'ctx>,
        site: u32,
    ) -> LResult<()> {
        let args = [peer.into(), world.into(), Emu::site(cx, site)];
        call(cx, "tessera_emu_bad_peer", &args)?;
        Ok(())
    }

    fn check_divisor<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        divisor: IntValue<'ctx>,
        site: u32,
    ) -> LResult<()> {
        let zero = divisor.get_type().const_zero();
        let is0 =
            cx.b.build_int_compare(inkwell::IntPredicate::EQ, divisor, zero, "div0")?;
        let is0 = cx.b.build_int_z_extend(is0, cx.ctx.i32_type(), "")?;
        call(
            cx,
            "tessera_emu_check_divisor",
            &[is0.into(), Emu::site(cx, site)],
        )?;
        Ok(())
    }

    fn loop_backedge<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<()> {
        call(cx, "tessera_emu_yield", &[])?;
        Ok(())
    }

    fn loop_continue<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        cond: IntValue<'ctx>,
        site: u32,
    ) -> LResult<IntValue<'ctx>> {
        let ok = int_result(call(cx, "tessera_emu_loop_ok", &[Emu::site(cx, site)])?)?;
        let ok =
            cx.b.build_int_compare(inkwell::IntPredicate::NE, ok, cx.i32(0), "")?;
        Ok(cx.b.build_and(cond, ok, "")?)
    }

    fn set_kernel_abi<'ctx>(&self, _cx: &Cx<'ctx>, _f: FunctionValue<'ctx>, _num_threads: u32) {
        // The C calling convention (LLVM's default) and external linkage.
    }

    fn sync_scope(&self, _scope: MemScope) -> &'static str {
        ""
    }

    fn mma_for(&self, input: ScalarType, m: u32, n: u32, k: u32, nw: u32) -> Option<MmaInfo> {
        match self.flavor {
            EmuFlavor::Nv if input.is_fp8() => self.mma(input),
            // sm_90a's 8-bit floats take `wgmma` (else f16 `wgmma`), no `mma.sync`.
            EmuFlavor::Sm90a if input.is_fp8() => None,
            EmuFlavor::Nv | EmuFlavor::Sm90a => NV_MMA.mma_for(input, m, n, k, nw),
            _ => self.amd()?.mma_for(input, m, n, k, nw),
        }
    }

    fn mma(&self, input: ScalarType) -> Option<MmaInfo> {
        match self.flavor {
            // emu-nv multiplies 8-bit floats as sm_80 does (`mma.sync` m16n8k32
            // fragments, each converted to f16 for two m16n8k16, see `emit_mma`; sm_89
            // reads the same fragments), emu-sm90a as sm_90a (`wgmma`, else f16).
            EmuFlavor::Nv if input.is_fp8() => Some(super::nv_m16n8k32_s8()),
            EmuFlavor::Sm90a if input.is_fp8() => None,
            EmuFlavor::Nv | EmuFlavor::Sm90a => NV_MMA.mma(input),
            _ => self.amd()?.mma(input),
        }
    }

    fn native_nan_max(&self) -> bool {
        self.nv_like()
    }

    fn has_ldmatrix(&self) -> bool {
        self.nv_like()
    }

    fn has_buffer_load(&self) -> bool {
        self.amd().is_some_and(|a| a.has_buffer_load())
    }

    fn has_cp_async(&self) -> bool {
        self.nv_like()
    }

    fn cp_async<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        bytes: u32,
        src_bytes: IntValue<'ctx>,
        site: u32,
    ) -> LResult<()> {
        let args = [
            dst.into(),
            src.into(),
            cx.i32(bytes as i64).into(),
            src_bytes.into(),
            Emu::site(cx, site),
        ];
        call(cx, "tessera_emu_cp_async", &args)?;
        Ok(())
    }

    fn mbarrier_init<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        count: u32,
        site: u32,
    ) -> LResult<()> {
        let args = [bar.into(), cx.i32(count as i64).into(), Emu::site(cx, site)];
        call(cx, "tessera_emu_mbar_init", &args)?;
        Ok(())
    }

    fn fence_mbarrier_init<'ctx>(&self, _cx: &Cx<'ctx>) -> LResult<()> {
        // Initialization is visible at once; the block barrier after it orders it.
        Ok(())
    }

    fn mbarrier_inval<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        site: u32,
    ) -> LResult<()> {
        call(
            cx,
            "tessera_emu_mbar_inval",
            &[bar.into(), Emu::site(cx, site)],
        )?;
        Ok(())
    }

    fn mbarrier_arrive_expect_tx<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        bytes: u32,
        site: u32,
    ) -> LResult<()> {
        let args = [bar.into(), cx.i32(bytes as i64).into(), Emu::site(cx, site)];
        call(cx, "tessera_emu_mbar_expect_tx", &args)?;
        Ok(())
    }

    fn mbarrier_arrive<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        site: u32,
    ) -> LResult<()> {
        call(
            cx,
            "tessera_emu_mbar_arrive",
            &[bar.into(), Emu::site(cx, site)],
        )?;
        Ok(())
    }

    fn warp_sync<'ctx>(&self, cx: &Cx<'ctx>, site: u32) -> LResult<()> {
        call(cx, "tessera_emu_warp_sync", &[Emu::site(cx, site)])?;
        Ok(())
    }

    fn named_barrier<'ctx>(&self, cx: &Cx<'ctx>, id: u32, threads: u32, site: u32) -> LResult<()> {
        let args = [
            cx.i32(id as i64).into(),
            cx.i32(threads as i64).into(),
            Emu::site(cx, site),
        ];
        call(cx, "tessera_emu_named_barrier", &args)?;
        Ok(())
    }

    fn named_barrier_arrive<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        id: u32,
        threads: u32,
        site: u32,
    ) -> LResult<()> {
        let args = [
            cx.i32(id as i64).into(),
            cx.i32(threads as i64).into(),
            Emu::site(cx, site),
        ];
        call(cx, "tessera_emu_named_barrier_arrive", &args)?;
        Ok(())
    }

    fn setmaxnreg<'ctx>(&self, cx: &Cx<'ctx>, inc: bool, regs: u32, site: u32) -> LResult<()> {
        let args = [
            cx.i32(i64::from(inc)).into(),
            cx.i32(regs as i64).into(),
            Emu::site(cx, site),
        ];
        call(cx, "tessera_emu_setmaxnreg", &args)?;
        Ok(())
    }

    fn mbarrier_wait<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        parity: IntValue<'ctx>,
        site: u32,
    ) -> LResult<()> {
        let args = [bar.into(), parity.into(), Emu::site(cx, site)];
        call(cx, "tessera_emu_mbar_wait", &args)?;
        Ok(())
    }

    fn tma_load<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        dst: PointerValue<'ctx>,
        tmap: IntValue<'ctx>,
        coords: &[IntValue<'ctx>],
        bar: PointerValue<'ctx>,
        multicast: Option<IntValue<'ctx>>,
        site: u32,
    ) -> LResult<()> {
        let c = |i: usize| -> BasicMetadataValueEnum<'ctx> {
            coords.get(i).copied().unwrap_or_else(|| cx.i32(0)).into()
        };
        let mut args = vec![
            dst.into(),
            tmap.into(),
            cx.i32(coords.len() as i64).into(),
            c(0),
            c(1),
            c(2),
            bar.into(),
        ];
        let name = match multicast {
            Some(mask) => {
                let mask = cx.b.build_int_z_extend(mask, cx.ctx.i32_type(), "")?;
                args.push(mask.into());
                "tessera_emu_tma_load_multicast"
            }
            None => "tessera_emu_tma_load",
        };
        args.push(Emu::site(cx, site));
        call(cx, name, &args)?;
        Ok(())
    }

    fn cluster_ctarank<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        int_result(call(cx, "tessera_emu_cluster_ctarank", &[])?)
    }

    fn cluster_sync<'ctx>(&self, cx: &Cx<'ctx>, site: u32) -> LResult<()> {
        call(cx, "tessera_emu_cluster_sync", &[Emu::site(cx, site)])?;
        Ok(())
    }

    fn mbarrier_arrive_cluster<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        bar: PointerValue<'ctx>,
        cta: IntValue<'ctx>,
        site: u32,
    ) -> LResult<()> {
        let args = [bar.into(), cta.into(), Emu::site(cx, site)];
        call(cx, "tessera_emu_mbar_arrive_cluster", &args)?;
        Ok(())
    }

    fn tma_store<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        src: PointerValue<'ctx>,
        tmap: IntValue<'ctx>,
        coords: &[IntValue<'ctx>],
        site: u32,
    ) -> LResult<()> {
        let c = |i: usize| -> BasicMetadataValueEnum<'ctx> {
            coords.get(i).copied().unwrap_or_else(|| cx.i32(0)).into()
        };
        let args = [
            src.into(),
            tmap.into(),
            cx.i32(coords.len() as i64).into(),
            c(0),
            c(1),
            c(2),
            Emu::site(cx, site),
        ];
        call(cx, "tessera_emu_tma_store", &args)?;
        Ok(())
    }

    fn tma_store_wait<'ctx>(&self, cx: &Cx<'ctx>, site: u32) -> LResult<()> {
        call(cx, "tessera_emu_tma_store_wait", &[Emu::site(cx, site)])?;
        Ok(())
    }

    fn cp_async_commit<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<()> {
        call(cx, "tessera_emu_cp_async_commit", &[])?;
        Ok(())
    }

    fn cp_async_wait<'ctx>(&self, cx: &Cx<'ctx>, n: u32) -> LResult<()> {
        call(cx, "tessera_emu_cp_async_wait", &[cx.i32(n as i64).into()])?;
        Ok(())
    }

    /// The ISA's range rule, checked here: in range when `offset + size <=
    /// num_records` (as unsigned 64-bit), then a load at `base + offset`; else zero,
    /// without touching memory. A masked-on lane is checked at its own pointer
    /// (`lane.ptr`) against its buffer, so one out of bounds (below the buffer
    /// included, whose offset wraps out of range) is reported, not read as zero; a
    /// masked-off lane is neither checked nor read.
    fn buffer_load<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        base: PointerValue<'ctx>,
        num_records: u32,
        lane: super::BufferLane<'ctx>,
        ty: BasicTypeEnum<'ctx>,
        site: u32,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let b = &cx.b;
        let i64t = cx.ctx.i64_type();
        let bytes = crate::lower::type_size(ty);
        let off = b.build_int_z_extend(lane.offset, i64t, "")?;
        let end = b.build_int_add(off, i64t.const_int(bytes as u64, false), "")?;
        let in_range = b.build_int_compare(
            inkwell::IntPredicate::ULE,
            end,
            i64t.const_int(num_records as u64, false),
            "",
        )?;
        let go = b.build_or(in_range, lane.mask, "")?;
        let f = b
            .get_insert_block()
            .and_then(|bb| bb.get_parent())
            .ok_or_else(|| LowerError::Llvm("builder outside a function".into()))?;
        let (load_bb, join) = (
            cx.ctx.append_basic_block(f, "buffer.access"),
            cx.ctx.append_basic_block(f, "buffer.join"),
        );
        let no_block = || LowerError::Llvm("builder outside a block".into());
        let from = b.get_insert_block().ok_or_else(no_block)?;
        b.build_conditional_branch(go, load_bb, join)?;
        b.position_at_end(load_bb);
        // SAFETY: a GEP over bytes of the buffer `base` points into; the checked
        // access below validates the address before it is dereferenced.
        let at = unsafe { b.build_gep(cx.ctx.i8_type(), base, &[off], "")? };
        // A masked-on lane: its own pointer, checked against its buffer (a masked-off
        // lane in range would be a lowering bug: its offset is checked instead).
        let at = b
            .build_select(lane.mask, lane.ptr, at, "")?
            .into_pointer_value();
        let p = self.check_global(cx, at, bytes, site)?;
        let v = b.build_load(ty, p, "")?;
        if let Some(i) = v.as_instruction_value() {
            let _ = i.set_alignment(bytes.min(16));
        }
        // Out of range reads zero (a masked-on lane there was reported above).
        let v = b.build_select(in_range, v, ty.const_zero(), "")?;
        let load_end = b.get_insert_block().ok_or_else(no_block)?;
        b.build_unconditional_branch(join)?;
        b.position_at_end(join);
        let phi = b.build_phi(ty, "")?;
        phi.add_incoming(&[(&ty.const_zero(), from), (&v, load_end)]);
        Ok(phi.as_basic_value())
    }

    fn ldmatrix<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        p: PointerValue<'ctx>,
        num: u32,
        trans: bool,
        site: u32,
    ) -> LResult<Vec<IntValue<'ctx>>> {
        if !self.nv_like() {
            return Err(LowerError::Llvm("ldmatrix on emu-amd".into()));
        }
        let i32t = cx.ctx.i32_type();
        let out_ty = i32t.array_type(4);
        let out = entry_alloca(cx, out_ty.into(), "ldm.out")?;
        let args = [
            p.into(),
            cx.i32(num as i64).into(),
            cx.i32(trans as i64).into(),
            out.into(),
            Emu::site(cx, site),
        ];
        call(cx, "tessera_emu_ldmatrix", &args)?;
        (0..num)
            .map(|i| {
                let q = unsafe {
                    // SAFETY: `out` is a `[4 x i32]` and `i < 4`.
                    cx.b.build_in_bounds_gep(out_ty, out, &[cx.i32(0), cx.i32(i as i64)], "")?
                };
                Ok(cx.b.build_load(i32t, q, "")?.into_int_value())
            })
            .collect()
    }

    fn shared_address<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        p: PointerValue<'ctx>,
    ) -> LResult<IntValue<'ctx>> {
        let base = call(cx, "tessera_emu_shared_base", &[])?
            .ok_or_else(|| LowerError::Llvm("runtime call returned void".into()))?
            .into_pointer_value();
        let i64t = cx.ctx.i64_type();
        let d = cx.b.build_int_sub(
            cx.b.build_ptr_to_int(p, i64t, "")?,
            cx.b.build_ptr_to_int(base, i64t, "")?,
            "",
        )?;
        Ok(cx.b.build_int_truncate(d, cx.ctx.i32_type(), "saddr")?)
    }

    fn fence_async_shared<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<()> {
        call(cx, "tessera_emu_fence_proxy_async", &[])?;
        Ok(())
    }

    fn wgmma_fence<'ctx>(&self, cx: &Cx<'ctx>, site: u32) -> LResult<()> {
        call(cx, "tessera_emu_wgmma_fence", &[Emu::site(cx, site)])?;
        Ok(())
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
        slot: u32,
        site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        if self.flavor != EmuFlavor::Sm90a {
            return Err(LowerError::Llvm("wgmma outside emu-sm90a".into()));
        }
        let (i32t, i64t) = (cx.ctx.i32_type(), cx.ctx.i64_type());
        let slot_ptr = store_words(cx, acc, "wgmma.acc")?;
        // `tessera_emu_wgmma` takes A's descriptor, `tessera_emu_wgmma_rs` its four
        // registers, in the same place.
        let (name, a_args): (&str, Vec<BasicMetadataValueEnum>) = match a {
            WgmmaA::Desc(d) => ("tessera_emu_wgmma", vec![d.into()]),
            WgmmaA::Regs(r) if r.len() == 4 => (
                "tessera_emu_wgmma_rs",
                r.iter().map(|&x| x.into()).collect(),
            ),
            WgmmaA::Regs(_) => return Err(LowerError::Llvm("wgmma A takes 4 registers".into())),
        };
        let a_ty: BasicMetadataTypeEnum = match a {
            WgmmaA::Desc(_) => i64t.into(),
            WgmmaA::Regs(_) => i32t.into(),
        };
        let mut params: Vec<BasicMetadataTypeEnum> = vec![i32t.into(), i32t.into()];
        params.extend(std::iter::repeat_n(a_ty, a_args.len()));
        params.extend::<[BasicMetadataTypeEnum; 5]>([
            i64t.into(),
            i32t.into(),
            Emu::ptr_ty(cx).into(),
            i32t.into(),
            i32t.into(),
        ]);
        let code = match input {
            ScalarType::F16 => 0,
            ScalarType::BF16 => 1,
            ScalarType::I8 => 2,
            ScalarType::F8E4M3 => 3,
            ScalarType::F8E5M2 => 4,
            t => return Err(LowerError::Llvm(format!("wgmma on {t:?}"))),
        };
        let mut args: Vec<BasicMetadataValueEnum> =
            vec![cx.i32(code).into(), cx.i32(n as i64).into()];
        args.extend(a_args);
        args.extend([
            desc_b.into(),
            cx.i32(i64::from(trans_b) | (i64::from(scale_d) << 1))
                .into(),
            slot_ptr.into(),
            cx.i32(slot as i64).into(),
            Emu::site(cx, site),
        ]);
        call(cx, name, &args)?;
        load_words(cx, slot_ptr, acc)
    }

    fn wgmma_commit<'ctx>(&self, cx: &Cx<'ctx>, site: u32) -> LResult<()> {
        call(cx, "tessera_emu_wgmma_commit", &[Emu::site(cx, site)])?;
        Ok(())
    }

    fn wgmma_wait<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        pending: u32,
        accs: &[Vec<BasicValueEnum<'ctx>>],
        site: u32,
    ) -> LResult<Vec<Vec<BasicValueEnum<'ctx>>>> {
        accs.iter()
            .enumerate()
            .map(|(slot, acc)| {
                let p = store_words(cx, acc, "wgmma.wait")?;
                let args = [
                    cx.i32(pending as i64).into(),
                    p.into(),
                    cx.i32(acc.len() as i64).into(),
                    cx.i32(slot as i64).into(),
                    Emu::site(cx, site),
                ];
                call(cx, "tessera_emu_wgmma_wait", &args)?;
                load_words(cx, p, acc)
            })
            .collect()
    }

    fn scaled_mma_for(
        &self,
        input: ScalarType,
        m: u32,
        n: u32,
        k: u32,
        nw: u32,
    ) -> Option<ScaledMma> {
        self.amd()?.scaled_mma_for(input, m, n, k, nw)
    }

    fn emit_scaled_mma<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        input: ScalarType,
        a: &[BasicValueEnum<'ctx>],
        b: &[BasicValueEnum<'ctx>],
        c: &[BasicValueEnum<'ctx>],
        scales: [IntValue<'ctx>; 2],
        site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        let ins = match c.len() {
            4 => AmdMma::ScaledMfma16x16x128,
            _ => AmdMma::ScaledMfma32x32x64,
        };
        emit_mma_words(
            cx,
            self.flavor,
            input,
            Some(ins),
            [a, b],
            c,
            Some(scales),
            site,
        )
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
        let i32t = cx.ctx.i32_type();
        let f32t = cx.ctx.f32_type();
        if input.is_fp8() && self.flavor == EmuFlavor::Nv {
            // As sm_80 and sm_90: the fragments converted to f16 (in the kernel's own
            // code, which this runs) for two f16 instructions.
            let cvt = |w: IntValue<'ctx>| super::fp8x4_to_f16(cx, input, w);
            return super::fp8_mma_as_f16(self, cx, a, b, c, site, &cvt);
        }
        if let Some(ins) = self.amd_mma(input, a.len(), c.len()) {
            return emit_mma_words(cx, self.flavor, input, Some(ins), [a, b], c, None, site);
        }
        if input == ScalarType::I8 || input.is_fp8() {
            return emit_mma_words(cx, self.flavor, input, None, [a, b], c, None, site);
        }
        let c: Vec<FloatValue<'ctx>> = c.iter().map(|v| v.into_float_value()).collect();
        let c = &c[..];
        if !self.nv_like() && c.len() == 16 {
            return emit_mfma_32x32x8(cx, input, a, b, c, site);
        }
        let (ints, name): (Vec<IntValue<'ctx>>, &str) = match self.flavor {
            EmuFlavor::Nv | EmuFlavor::Sm90a => {
                let mut v = pack_words(cx, a)?;
                v.extend(pack_words(cx, b)?);
                let name = if input == ScalarType::BF16 {
                    "tessera_emu_mma_nv_bf16"
                } else {
                    "tessera_emu_mma_nv_f16"
                };
                (v, name)
            }
            _ => {
                let i16t = cx.ctx.i16_type();
                let v = a
                    .iter()
                    .chain(b)
                    .map(|x| {
                        let bits = cx.b.build_bit_cast(*x, i16t, "")?.into_int_value();
                        Ok(cx.b.build_int_z_extend(bits, i32t, "")?)
                    })
                    .collect::<LResult<Vec<_>>>()?;
                let name = if input == ScalarType::BF16 {
                    "tessera_emu_mma_amd_bf16"
                } else {
                    "tessera_emu_mma_amd_f16"
                };
                (v, name)
            }
        };
        // The D fragment comes back through a stack slot.
        let dty = f32t.array_type(4);
        let d = entry_alloca(cx, dty.into(), "mma.d")?;
        let mut params: Vec<BasicMetadataTypeEnum> = vec![i32t.into(); ints.len()];
        params.extend([BasicMetadataTypeEnum::from(f32t); 4]);
        params.push(Emu::ptr_ty(cx).into());
        params.push(i32t.into());
        let mut args: Vec<BasicMetadataValueEnum> = ints.iter().map(|&v| v.into()).collect();
        args.extend(c.iter().map(|&v| BasicMetadataValueEnum::from(v)));
        args.push(d.into());
        args.push(Emu::site(cx, site));
        call(cx, name, &args)?;
        (0..4)
            .map(|i| {
                let p = unsafe {
                    // SAFETY: `d` is a `[4 x float]` and `i < 4`.
                    cx.b.build_in_bounds_gep(dty, d, &[cx.i32(0), cx.i32(i)], "")?
                };
                Ok(cx.b.build_load(f32t, p, "")?)
            })
            .collect()
    }
}

/// A matrix instruction whose operands travel as packed `.b32` registers: A's and
/// B's registers (four bytes or two 16-bit elements each, the first in the low bits)
/// go in an `[n x i32]` slot and the accumulators (`i32`, or `f32` by their bits) in
/// another, which
/// `void tessera_emu_mma_words(i32 kind, ptr ab, i32 a_words, ptr cd, i32 c_regs, i32 site)`
/// overwrites with D. `kind` names the instruction: 0 `mma.sync` m16n8k32 `.s8`
/// (emu-nv, emu-sm90a), 1 `v_mfma_i32_16x16x32_i8`, 2 `v_mfma_i32_32x32x16_i8` (the
/// AMD flavours, as gfx942), 3 and 4 `mma.sync` m16n8k32 `.e4m3` / `.e5m2`; from 5 the
/// instructions `ins` of gfx950 and RDNA ([`crate::emu::mma::AmdMma::kind`]).
#[allow(clippy::too_many_arguments)]
fn emit_mma_words<'ctx>(
    cx: &Cx<'ctx>,
    flavor: EmuFlavor,
    input: ScalarType,
    ins: Option<AmdMma>,
    [a, b]: [&[BasicValueEnum<'ctx>]; 2],
    c: &[BasicValueEnum<'ctx>],
    scales: Option<[IntValue<'ctx>; 2]>,
    site: u32,
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let i32t = cx.ctx.i32_type();
    let nv = matches!(flavor, EmuFlavor::Nv | EmuFlavor::Sm90a);
    let kind = match (ins, nv, c.len(), input) {
        (Some(ins), _, _, ScalarType::F16) => ins.kind(AmdElem::F16),
        (Some(ins), _, _, ScalarType::BF16) => ins.kind(AmdElem::Bf16),
        (Some(ins), _, _, ScalarType::F8E4M3) => ins.kind(AmdElem::E4M3),
        (Some(ins), _, _, ScalarType::F8E5M2) => ins.kind(AmdElem::E5M2),
        (None, true, 4, ScalarType::I8) => 0,
        (None, false, 4, ScalarType::I8) => 1,
        (None, false, 16, ScalarType::I8) => 2,
        (None, true, 4, ScalarType::F8E4M3) => 3,
        (None, true, 4, ScalarType::F8E5M2) => 4,
        (_, _, n, t) => {
            return Err(LowerError::Llvm(format!(
                "a matrix instruction on {t:?} with {n} accumulators on {flavor:?}"
            )));
        }
    };
    // f32 accumulators travel by their bits.
    let c: Vec<BasicValueEnum<'ctx>> = c
        .iter()
        .map(|x| Ok(cx.b.build_bit_cast(*x, i32t, "")?))
        .collect::<LResult<_>>()?;
    let c = &c[..];
    let float_acc = kind >= 3;
    let (pa, mut pb) = (pack_words(cx, a)?, pack_words(cx, b)?);
    // A block-scaled instruction's scales follow B's registers.
    pb.extend(scales.into_iter().flatten());
    let abty = i32t.array_type((pa.len() + pb.len()) as u32);
    let cdty = i32t.array_type(c.len() as u32);
    let ab = entry_alloca(cx, abty.into(), "mma.ab")?;
    let cd = entry_alloca(cx, cdty.into(), "mma.cd")?;
    let slot = |ty: inkwell::types::ArrayType<'ctx>, p: PointerValue<'ctx>, i: usize| {
        // SAFETY: `p` is an array of `ty`'s length, and every caller's `i` is below it.
        unsafe {
            cx.b.build_in_bounds_gep(ty, p, &[cx.i32(0), cx.i32(i as i64)], "")
        }
    };
    for (i, w) in pa.iter().chain(&pb).enumerate() {
        cx.b.build_store(slot(abty, ab, i)?, *w)?;
    }
    for (i, x) in c.iter().enumerate() {
        cx.b.build_store(slot(cdty, cd, i)?, *x)?;
    }
    call(
        cx,
        "tessera_emu_mma_words",
        &[
            cx.i32(kind.into()).into(),
            ab.into(),
            cx.i32(pa.len() as i64).into(),
            cd.into(),
            cx.i32(c.len() as i64).into(),
            Emu::site(cx, site),
        ],
    )?;
    (0..c.len())
        .map(|i| {
            let w = cx.b.build_load(i32t, slot(cdty, cd, i)?, "")?;
            Ok(if float_acc {
                cx.b.build_bit_cast(w, cx.ctx.f32_type(), "")?
            } else {
                w
            })
        })
        .collect()
}

/// A new `[n x i32]` stack slot (in the entry block) holding the 32-bit registers
/// `v` (`f32` ones by their bits).
fn store_words<'ctx>(
    cx: &Cx<'ctx>,
    v: &[BasicValueEnum<'ctx>],
    name: &str,
) -> LResult<PointerValue<'ctx>> {
    let i32t = cx.ctx.i32_type();
    let ty = i32t.array_type(v.len() as u32);
    let p = entry_alloca(cx, ty.into(), name)?;
    for (i, x) in v.iter().enumerate() {
        // SAFETY: `p` is an `[n x i32]` and `i < n`.
        let q = unsafe {
            cx.b.build_in_bounds_gep(ty, p, &[cx.i32(0), cx.i32(i as i64)], "")?
        };
        let w = cx.b.build_bit_cast(*x, i32t, "")?;
        cx.b.build_store(q, w)?;
    }
    Ok(p)
}

/// The words of the `[n x i32]` slot `p`, as registers of the types of `like`.
fn load_words<'ctx>(
    cx: &Cx<'ctx>,
    p: PointerValue<'ctx>,
    like: &[BasicValueEnum<'ctx>],
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let i32t = cx.ctx.i32_type();
    let ty = i32t.array_type(like.len() as u32);
    like.iter()
        .enumerate()
        .map(|(i, x)| {
            // SAFETY: `p` is an `[n x i32]` and `i < n`.
            let q = unsafe {
                cx.b.build_in_bounds_gep(ty, p, &[cx.i32(0), cx.i32(i as i64)], "")?
            };
            let w = cx.b.build_load(i32t, q, "")?;
            Ok(cx.b.build_bit_cast(w, x.get_type(), "")?)
        })
        .collect()
}

/// MFMA 32x32x8 on emu-amd: `a` and `b` (4 halves each, zero-extended to `i32`) go in
/// an `[8 x i32]` slot and the 16 accumulators in a `[16 x float]` slot that
/// `void tessera_emu_mma_amd32_{f16,bf16}(ptr ab, ptr cd, i32 site)` overwrites with D.
fn emit_mfma_32x32x8<'ctx>(
    cx: &Cx<'ctx>,
    input: ScalarType,
    a: &[BasicValueEnum<'ctx>],
    b: &[BasicValueEnum<'ctx>],
    c: &[FloatValue<'ctx>],
    site: u32,
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let (i16t, i32t, f32t) = (cx.ctx.i16_type(), cx.ctx.i32_type(), cx.ctx.f32_type());
    let abty = i32t.array_type(8);
    let cdty = f32t.array_type(16);
    let ab = entry_alloca(cx, abty.into(), "mfma.ab")?;
    let cd = entry_alloca(cx, cdty.into(), "mfma.cd")?;
    for (i, x) in a.iter().chain(b).enumerate() {
        let bits = cx.b.build_bit_cast(*x, i16t, "")?.into_int_value();
        let v = cx.b.build_int_z_extend(bits, i32t, "")?;
        // SAFETY: `ab` is an `[8 x i32]` and `i < 8` (4 elements of each operand).
        let p = unsafe {
            cx.b.build_in_bounds_gep(abty, ab, &[cx.i32(0), cx.i32(i as i64)], "")?
        };
        cx.b.build_store(p, v)?;
    }
    for (i, x) in c.iter().enumerate() {
        // SAFETY: `cd` is a `[16 x float]` and `i < 16`.
        let p = unsafe {
            cx.b.build_in_bounds_gep(cdty, cd, &[cx.i32(0), cx.i32(i as i64)], "")?
        };
        cx.b.build_store(p, *x)?;
    }
    let name = if input == ScalarType::BF16 {
        "tessera_emu_mma_amd32_bf16"
    } else {
        "tessera_emu_mma_amd32_f16"
    };
    call(cx, name, &[ab.into(), cd.into(), Emu::site(cx, site)])?;
    (0..16)
        .map(|i| {
            // SAFETY: as above.
            let p = unsafe {
                cx.b.build_in_bounds_gep(cdty, cd, &[cx.i32(0), cx.i32(i)], "")?
            };
            Ok(cx.b.build_load(f32t, p, "")?)
        })
        .collect()
}

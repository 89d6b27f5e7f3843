//! Everything target-specific the lowering emits, behind one trait: [`Arch`].
//!
//! The lowering in [`super`] is written once against `dyn Arch`; [`Nvptx`] and
//! [`Amdgpu`] implement it, and [`Emu`] (the host SIMT emulator)
//! turns every hook into a call into the emulator's runtime.
//!
//! Every barrier, shuffle, matrix instruction and memory access is emitted with a
//! *site* id: an index into the table the lowering returns ([`super::Site`]), naming
//! the op's source span. The GPU implementations ignore it; the emulator reports it.
//!
//! | what | NVPTX | AMDGPU |
//! |---|---|---|
//! | thread id | `llvm.nvvm.read.ptx.sreg.tid.x` | `llvm.amdgcn.workitem.id.x` |
//! | warp id | `tid >> 5` | `readfirstlane(tid >> log2(wave))` (scalar register) |
//! | program id | `llvm.nvvm.read.ptx.sreg.ctaid.{x,y,z}` | `llvm.amdgcn.workgroup.id.{x,y,z}` |
//! | grid size | `llvm.nvvm.read.ptx.sreg.nctaid.*` | HSA dispatch packet (`llvm.amdgcn.dispatch.ptr`): `grid_size_*` (u32 at bytes 12/16/20, in work-items) divided by the baked-in workgroup size |
//! | barrier | `llvm.nvvm.barrier.cta.sync.aligned.all(0)` (`bar.sync 0`, orders shared memory) | `fence syncscope("workgroup") release` + `llvm.amdgcn.s.barrier` + `fence syncscope("workgroup") acquire` |
//! | shuffle xor | `llvm.nvvm.shfl.sync.bfly.i32` (full mask) | `llvm.amdgcn.ds.bpermute` (byte address `(lane ^ m) * 4`) |
//! | kernel ABI | calling convention `ptx_kernel` (71), `"nvvm.maxntid"` attribute | `amdgpu_kernel` (91), `"amdgpu-flat-work-group-size"="N,N"` |
//! | timer (ns) | `llvm.nvvm.read.ptx.sreg.globaltimer` | `llvm.readsteadycounter` (`s_memrealtime` / `s_sendmsg_rtn_b64 REALTIME`: a 100 MHz clock, so ×10) |
//! | polling back-off | `llvm.nvvm.nanosleep(100)` | `llvm.amdgcn.s.sleep(2)` |
//! | bad `remote_ptr` peer | `llvm.trap` | `llvm.trap` |
//! | signal / counter atomics | inline `atom.{sem}.{cta,gpu,sys}.global.{exch.b64,add.u64}` (LLVM 22 drops the ordering and scope of NVPTX `atomicrmw`, emitting a relaxed `.gpu` atom) | `atomicrmw` with `syncscope` |
//! | atomics scopes | `block` / `device` / system (`""`) | `workgroup` / `agent` / system (`""`) |
//! | matrix unit | `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`, `...m16n8k32.row.col.s32.s8.s8.s32` (inline PTX; sm_80+), `...m16n8k32.row.col.f32.{e4m3,e5m2}...` (sm_89; sm_80, sm_86 and sm_90 convert its fragments to f16 for two m16n8k16, `fp8_mma_as_f16`); `wgmma.mma_async` (sm_90a, `lower::wgmma`) | `llvm.amdgcn.mfma.f32.{16x16x16,32x32x8}{f16,bf16.1k}` (gfx90a, gfx942), `...i32.{16x16x16,32x32x8}i8` (gfx90a), `...i32.{16x16x32,32x32x16}.i8` (gfx942) |
//!
//! # Matrix fragment layouts
//!
//! [`MmaInfo`] describes, per lane bit and register bit, which matrix coordinate a
//! fragment element has (every map is linear in the lane bits).
//!
//! NVIDIA `mma.m16n8k16` with `.f16`/`.bf16` A/B and `.f32` C/D (PTX ISA, "Matrix
//! Fragments for mma.m16n8k16 with floating point type"): with `g = lane >> 2` and
//! `t = lane % 4`,
//! - A (16×16, row-major), 8 halves `a0..a7` in 4 `.b32` registers: row `g` (+8 for
//!   `a2,a3,a6,a7`), column `2t + (i & 1)` (+8 for `a4..a7`);
//! - B (16×8, "col"), 4 halves `b0..b3`: row (k) `2t + (i & 1)` (+8 for `b2,b3`),
//!   column `g`;
//! - C/D (16×8), 4 floats `c0..c3`: row `g` (+8 for `c2,c3`), column `2t + (i & 1)`.
//!
//! AMD `v_mfma_f32_16x16x16f16` (AMD Matrix Instruction Calculator; CDNA3 ISA §7):
//! lane `l`, item `i` in 0..4:
//! - A: `A[l % 16][4 * (l / 16) + i]`; B: `B[4 * (l / 16) + i][l % 16]`;
//! - C/D: `C[4 * (l / 16) + i][l % 16]`.
//!
//! The bf16 variant (`.1k`) has the same layouts with `<4 x i16>` operands.
//!
//! The 8-bit integer instructions are in `nv_m16n8k32_s8`, [`amd_mfma_16`] and
//! [`amd_mfma_32`] (gfx942's `i8` MFMA hold 8 bytes of A and B per lane, twice the
//! `k` of the f16 ones).
//!
//! The NVIDIA implementation is in `nvptx.rs` (with its inline-PTX helpers and `mma`
//! layouts), the AMD one in `amdgpu.rs` (with its MFMA layouts); this file holds the
//! trait, the fragment descriptions, [`for_target`] and what both share.

use inkwell::AddressSpace;
use inkwell::types::{BasicTypeEnum, VectorType};
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use tessera_ir::ScalarType;
use tessera_ir::ir::{AtomicOp, MemScope, SignalOp};

use super::{Cx, LResult, LowerError};
use crate::Target;

mod amdgpu;
pub mod emu;
pub(crate) mod emu_abi;
mod nvptx;

pub use amdgpu::{Amdgpu, amd_mfma_16, amd_mfma_32};
pub use emu::Emu;
pub(crate) use nvptx::nv_m16n8k32_s8;
pub use nvptx::{Nvptx, PTX_ISA_FLAG, PTX_ISA_FP8_MMA};

/// Fragment description of one MMA operand: each lane bit's contribution to the
/// (outer, k) coordinates (outer = row for A, column for B), and the fragment's
/// elements as runs of consecutive k, in the order the instruction takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FragInfo {
    /// Per lane bit: (outer, k) added when the bit is set.
    pub lane: Vec<(u32, u32)>,
    /// Runs `(outer offset, k offset, length)`.
    pub runs: Vec<(u32, u32, u32)>,
}

/// One matrix instruction: `D[m×n] = A[m×k] · B[k×n] + C`, per warp.
#[derive(Clone, Debug)]
pub struct MmaInfo {
    /// Instruction shape.
    pub m: u32,
    /// Instruction shape.
    pub n: u32,
    /// Instruction shape.
    pub k: u32,
    /// C/D fragment: per register bit, (row, col).
    pub c_reg: Vec<(u32, u32)>,
    /// C/D fragment: per lane bit, (row, col).
    pub c_lane: Vec<(u32, u32)>,
    /// A fragment.
    pub a: FragInfo,
    /// B fragment.
    pub b: FragInfo,
}

impl MmaInfo {
    /// Whether the instruction can compute the transposed product: square, with A's
    /// fragment over `(m, k)` laid out as B's over `(n, k)` (AMD's MFMA). Then the B
    /// registers passed as A and the A registers as B give `Dᵀ = Bᵀ Aᵀ + Cᵀ`, whose
    /// fragment holds the C layout with rows and columns exchanged.
    pub fn transposable(&self) -> bool {
        self.m == self.n && self.a == self.b
    }
}

/// A block-scaled matrix instruction ([`Arch::scaled_mma_for`]): `D = C + Σ_j
/// sa_j sb_j Σ_{k in block j} A B` over blocks of 32 `k`.
#[derive(Clone, Debug)]
pub struct ScaledMma {
    /// The instruction, its A and B fragments in its own numbering of `k` (which
    /// the blocks of the scales follow: no renumbering as [`MmaInfo`]s may).
    pub info: MmaInfo,
    /// Which scale a lane holds: per lane bit, `(row, block)` of A's scales (of
    /// the instruction's `m x k / 32`), and `(column, block)` of B's.
    pub scale_lane: Vec<(u32, u32)>,
}

/// Where a [`Arch::wgmma`] reads its A operand.
#[derive(Clone, Copy, Debug)]
pub enum WgmmaA<'a, 'ctx> {
    /// From shared memory (K-major), through this matrix descriptor (`i64`).
    Desc(IntValue<'ctx>),
    /// From this thread's four `.b32` registers of the A fragment (two 16-bit
    /// elements each, the first in the low half): per warp of the warpgroup, the
    /// `mma.m16n8k16` A fragment of its 16 rows.
    Regs(&'a [IntValue<'ctx>]),
}

/// One lane's access through [`Arch::buffer_load`].
#[derive(Clone, Copy, Debug)]
pub struct BufferLane<'ctx> {
    /// The byte offset from the resource's base (an unsigned `i32`): the lane's own
    /// where `mask` holds, an out-of-range one where it does not.
    pub offset: IntValue<'ctx>,
    /// The lane's own pointer (`base + offset` where `mask` holds and the access is
    /// in bounds), for targets that check accesses (the emulator); GPUs ignore it.
    pub ptr: PointerValue<'ctx>,
    /// The lane's mask (`i1`): a lane whose mask is false is not accessed.
    pub mask: IntValue<'ctx>,
}

/// The approximate f32 math that `exp`, `exp2`, `log`, `log2` and `pow` lower to,
/// per target: every [`Arch`], and the host lowering (`super::host`, whose own small
/// arch is just this).
pub trait Math {
    /// Approximate f32 `log2` (≤ 2 ulp).
    fn log2_approx<'ctx>(&self, cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
        approx(cx, "llvm.log2", x)
    }
    /// Approximate f32 `2^x` for `exp2` and `exp` (default: LLVM's `llvm.exp2` with
    /// `afn`: NVIDIA `ex2.approx.f32`, ≤ 2 ulp, subnormal results kept).
    fn exp2_approx<'ctx>(&self, cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
        approx(cx, "llvm.exp2", x)
    }
}

/// Target-specific emission. Every method emits at the builder's position.
pub trait Arch: Math {
    /// The target.
    fn target(&self) -> Target;
    /// Threads per warp.
    fn warp_size(&self) -> u32 {
        self.target().warp_size()
    }
    /// The thread's index in the block (x), `i32`.
    fn thread_id<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>>;
    /// The warp's index in the block, `i32`, given the thread id.
    fn warp_id<'ctx>(&self, cx: &Cx<'ctx>, tid: IntValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let sh = cx.i32(self.warp_size().trailing_zeros() as i64);
        Ok(cx.b.build_right_shift(tid, sh, false, "warp")?)
    }
    /// The program (block) index along `axis`, `i32`.
    fn program_id<'ctx>(&self, cx: &Cx<'ctx>, axis: u8) -> LResult<IntValue<'ctx>>;
    /// The number of programs along `axis`, `i32`.
    fn num_programs<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        axis: u8,
        num_threads: u32,
    ) -> LResult<IntValue<'ctx>>;
    /// A block-wide barrier that also orders shared memory accesses.
    fn barrier<'ctx>(&self, cx: &Cx<'ctx>, site: u32) -> LResult<()>;
    /// The `i32` value of lane `lane ^ mask` of this warp (all lanes active).
    fn shuffle_xor<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        v: IntValue<'ctx>,
        mask: u32,
        lane: IntValue<'ctx>,
        site: u32,
    ) -> LResult<IntValue<'ctx>>;
    /// The base of the block's shared memory, emitted once at the kernel's entry, or
    /// `None` to use the module's static shared-memory global (GPUs).
    fn shared_base<'ctx>(&self, _cx: &Cx<'ctx>) -> LResult<Option<PointerValue<'ctx>>> {
        Ok(None)
    }
    /// Called before every global memory access of `bytes` bytes at `ptr`; returns the
    /// pointer to access. GPUs access `ptr` itself (no code is emitted).
    fn check_global<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        ptr: PointerValue<'ctx>,
        _bytes: u32,
        _site: u32,
    ) -> LResult<PointerValue<'ctx>> {
        Ok(ptr)
    }
    /// Called before every shared memory access of `bytes` bytes at `ptr` (race
    /// detection in the emulator; no code on GPUs).
    fn note_shared<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _ptr: PointerValue<'ctx>,
        _bytes: u32,
        _is_write: bool,
        _site: u32,
    ) -> LResult<()> {
        Ok(())
    }
    /// A monotonic clock in nanoseconds (`i64`), read by the polling loops of
    /// `wait_until` and `barrier_all` to time out.
    fn timer_ns<'ctx>(&self, cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>>;
    /// Emitted before each call of an off-node engine's device function
    /// ([`crate::lower::engine`]): GPUs emit nothing; the emulator notes the op
    /// (`site`) the call belongs to, for its error messages.
    fn engine_site<'ctx>(&self, _cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        Ok(())
    }
    /// Emitted on the path taken when a `remote_ptr` peer (`i32`) is outside
    /// `0..world` (`i32`): GPUs trap, the emulator reports the op and goes on with
    /// the local copy.
    fn bad_peer<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        _peer: IntValue<'ctx>,
        _world: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        cx.call_intrinsic("llvm.trap", &[], &[])?;
        Ok(())
    }
    /// An atomic `xchg` (`Set`) or `add` on the `u64` at `p` with ordering `ord` at
    /// `scope`; returns the old value. Signals and the `barrier_all` counter use it.
    fn atomic_u64<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        op: SignalOp,
        p: PointerValue<'ctx>,
        v: IntValue<'ctx>,
        ord: inkwell::AtomicOrdering,
        scope: MemScope,
    ) -> LResult<IntValue<'ctx>> {
        use inkwell::llvm_sys::LLVMAtomicRMWBinOp as B;
        use inkwell::values::AsValueRef;
        let bop = match op {
            SignalOp::Set => B::LLVMAtomicRMWBinOpXchg,
            SignalOp::Add => B::LLVMAtomicRMWBinOpAdd,
        };
        let ssid = cx.sync_scope_id(self.sync_scope(scope));
        // SAFETY: valid builder, pointer and value of matching types; the result is
        // the i64 old value.
        Ok(unsafe {
            IntValue::new(inkwell::llvm_sys::core::LLVMBuildAtomicRMWSyncScope(
                cx.b.as_mut_ptr(),
                bop,
                p.as_value_ref(),
                v.as_value_ref(),
                ord.into(),
                ssid,
            ))
        })
    }
    /// Emitted once per iteration of a polling loop (`wait_until`, `barrier_all`) to
    /// back off: GPUs sleep briefly so the spinning thread does not hammer the memory
    /// system; the emulator's timer already yields.
    fn poll_pause<'ctx>(&self, _cx: &Cx<'ctx>) -> LResult<()> {
        Ok(())
    }
    /// Emitted before an integer division or remainder by `divisor`: the emulator
    /// reports a zero divisor (the interpreter does too); GPUs emit nothing and the
    /// division yields 0.
    fn check_divisor<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _divisor: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        Ok(())
    }
    /// Emitted at the back edge of every runtime loop (`for`, `while`): the
    /// emulator lets the other threads run there; GPUs emit nothing.
    fn loop_backedge<'ctx>(&self, _cx: &Cx<'ctx>) -> LResult<()> {
        Ok(())
    }
    /// The condition a runtime loop (`for`, `while`; `site` names it) goes on with,
    /// at its header: `cond` on GPUs; the emulator also stops every loop once the
    /// launch's watchdog has expired (the launch then fails naming the loop).
    fn loop_continue<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        cond: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<IntValue<'ctx>> {
        Ok(cond)
    }
    /// True when the back end drops the ordering of `atomicrmw` (LLVM 22 NVPTX emits a
    /// relaxed `atom` for every ordering): the lowering then brackets a relaxed
    /// `atomicrmw` with fences at the op's scope (release before, acquire after).
    fn rmw_needs_fences(&self) -> bool {
        false
    }
    /// A user `atomic_rmw` on one element, emitted by the target itself when LLVM's
    /// `atomicrmw` would lose its scope; `None` lets the lowering emit the LLVM
    /// instruction. `ord` is the instruction's own ordering (monotonic when the
    /// lowering brackets it with fences). The default: always `None`.
    #[allow(clippy::too_many_arguments)]
    fn atomic_rmw_scoped<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _op: AtomicOp,
        _pointee: ScalarType,
        _ord: inkwell::AtomicOrdering,
        _scope: MemScope,
        _p: PointerValue<'ctx>,
        _v: BasicValueEnum<'ctx>,
    ) -> LResult<Option<BasicValueEnum<'ctx>>> {
        Ok(None)
    }
    /// Declares the kernel's ABI: calling convention and launch bounds.
    fn set_kernel_abi<'ctx>(&self, cx: &Cx<'ctx>, f: FunctionValue<'ctx>, num_threads: u32);
    /// The LLVM `syncscope` name of a memory scope.
    fn sync_scope(&self, scope: MemScope) -> &'static str;
    /// Whether the target has a one-instruction NaN-propagating f32 `max`/`min`
    /// (NVIDIA `max.NaN.f32`, sm_80+); without it a reduction's `max` takes the split
    /// of `reduce::float_extreme` rather than a chain of LLVM's expansions.
    fn native_nan_max(&self) -> bool {
        true
    }
    /// True when f64 transcendental functions (exp, log, sin, ...) can be emitted.
    fn has_f64_math(&self) -> bool {
        false
    }
    /// The matrix instruction for `dot` on `input` elements, if any.
    fn mma(&self, input: ScalarType) -> Option<MmaInfo>;
    /// The matrix instruction for a `dot` of an `m x k` by `k x n` tile on
    /// `num_warps` warps: the largest the target has that tiles it with a tile for
    /// every warp (default: [`Arch::mma`]).
    fn mma_for(
        &self,
        input: ScalarType,
        _m: u32,
        _n: u32,
        _k: u32,
        _num_warps: u32,
    ) -> Option<MmaInfo> {
        self.mma(input)
    }
    /// The block-scaled matrix instruction for a `dot_scaled` on `input` elements
    /// with E8M0 scales over blocks of 32 `k` (MXFP8), of an `m x k` by `k x n` tile
    /// on `num_warps` warps, if the target has one that tiles it (gfx950's
    /// `v_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4`). Default: none (the op is
    /// expanded into decoding ops and an f32 `dot`).
    fn scaled_mma_for(
        &self,
        _input: ScalarType,
        _m: u32,
        _n: u32,
        _k: u32,
        _num_warps: u32,
    ) -> Option<ScaledMma> {
        None
    }
    /// Emits one instruction of [`Arch::scaled_mma_for`]: [`Arch::emit_mma`]'s
    /// operands, and the lane's E8M0 scale of A and of B (`i32`, the scale in the low
    /// byte, [`ScaledMma::scale_lane`]).
    #[allow(clippy::too_many_arguments)]
    fn emit_scaled_mma<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _input: ScalarType,
        _a: &[BasicValueEnum<'ctx>],
        _b: &[BasicValueEnum<'ctx>],
        _c: &[BasicValueEnum<'ctx>],
        _scales: [IntValue<'ctx>; 2],
        _site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        Err(LowerError::Llvm(
            "a block-scaled matrix instruction on a target without one".into(),
        ))
    }
    /// Whether [`Arch::ldmatrix`] is available (NVIDIA sm_75+).
    fn has_ldmatrix(&self) -> bool {
        false
    }
    /// The default [`crate::CompileOptions::num_stages`]: tiles of `dot` operands in
    /// flight in a loop ([`crate::pipeline`]).
    fn default_num_stages(&self) -> u32 {
        match self.target().vendor() {
            crate::target::Vendor::Nvidia => 3,
            _ => 2,
        }
    }
    /// Whether [`Arch::cp_async`] is available (NVIDIA sm_80+).
    fn has_cp_async(&self) -> bool {
        false
    }
    /// `cp.async.{ca,cg}.shared.global [dst], [src], bytes, src_bytes` (PTX ISA,
    /// "cp.async"): an asynchronous copy of `bytes` (4, 8 or 16; both addresses
    /// aligned to it) from global `src` to shared `dst`, zero past `src_bytes`.
    fn cp_async<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _dst: PointerValue<'ctx>,
        _src: PointerValue<'ctx>,
        _bytes: u32,
        _src_bytes: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm("cp.async on a target without it".into()))
    }
    /// `cp.async.commit_group`: the copies issued since the last commit form a group.
    fn cp_async_commit<'ctx>(&self, _cx: &Cx<'ctx>) -> LResult<()> {
        Err(LowerError::Llvm("cp.async on a target without it".into()))
    }
    /// `cp.async.wait_group n`: waits until at most the newest `n` groups are pending.
    fn cp_async_wait<'ctx>(&self, _cx: &Cx<'ctx>, _n: u32) -> LResult<()> {
        Err(LowerError::Llvm("cp.async on a target without it".into()))
    }
    /// `mbarrier.init.shared::cta.b64 [bar], count` (PTX ISA, "mbarrier.init"):
    /// phase 0 in progress, `count` arrivals pending, transaction count 0.
    fn mbarrier_init<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _bar: PointerValue<'ctx>,
        _count: u32,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm(
            "mbarriers on a target without them".into(),
        ))
    }
    /// `fence.mbarrier_init.release.cluster`: the initializations are visible to
    /// the async proxy (TMA completes on them).
    fn fence_mbarrier_init<'ctx>(&self, _cx: &Cx<'ctx>) -> LResult<()> {
        Err(LowerError::Llvm(
            "mbarriers on a target without them".into(),
        ))
    }
    /// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes`: raises the
    /// current phase's transaction count by `bytes`, then arrives.
    fn mbarrier_arrive_expect_tx<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _bar: PointerValue<'ctx>,
        _bytes: u32,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm(
            "mbarriers on a target without them".into(),
        ))
    }
    /// `mbarrier.arrive.shared::cta.b64 _, [bar]` (PTX ISA, "mbarrier.arrive"): one
    /// arrival on the current phase (release semantics at CTA scope: this thread's
    /// earlier accesses are ordered before a wait that sees the phase complete).
    fn mbarrier_arrive<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _bar: PointerValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm(
            "mbarriers on a target without them".into(),
        ))
    }
    /// `bar.warp.sync 0xffffffff` (PTX ISA, "bar.warp.sync"): waits until every lane
    /// of the warp reached it, ordering their accesses before whatever each lane does
    /// next (one lane then speaks for the warp).
    fn warp_sync<'ctx>(&self, _cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        Err(LowerError::Llvm(
            "warp synchronization on a target without warp specialization".into(),
        ))
    }
    /// `bar.sync id, threads` (PTX ISA, "barrier"): named barrier `id` (1 to 15)
    /// releases once `threads` threads (a multiple of the warp size) of the block
    /// arrive at it (waiting there, or passing by [`Arch::named_barrier_arrive`]).
    /// Warp-specialized kernels synchronize their consumers with it while the
    /// producer runs on.
    fn named_barrier<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _id: u32,
        _threads: u32,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm(
            "named barriers on a target without warp specialization".into(),
        ))
    }
    /// `bar.arrive id, threads` (PTX ISA, "barrier"): arrives at named barrier `id`
    /// without waiting; the barrier completes once `threads` threads arrived, those
    /// waiting at it by [`Arch::named_barrier`] included. Ping-pong consumer groups
    /// hand the matrix units to each other with it.
    fn named_barrier_arrive<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _id: u32,
        _threads: u32,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm(
            "named barriers on a target without warp specialization".into(),
        ))
    }
    /// `setmaxnreg.{inc,dec}.sync.aligned.u32 regs` (PTX ISA, "setmaxnreg", sm_90a):
    /// the executing warpgroup's per-thread register limit becomes `regs` (a multiple
    /// of 8 from 24 to 256), taking registers from the block's pool (`inc`, which
    /// waits until they are free) or giving them back (`dec`). Every warp of the
    /// warpgroup executes it.
    fn setmaxnreg<'ctx>(&self, _cx: &Cx<'ctx>, _inc: bool, _regs: u32, _site: u32) -> LResult<()> {
        Err(LowerError::Llvm("setmaxnreg on a target without it".into()))
    }
    /// `mbarrier.inval.shared::cta.b64 [bar]` (PTX ISA, "mbarrier.inval"): the mbarrier
    /// is no longer one, so its memory may be used for something else (or initialized
    /// again).
    fn mbarrier_inval<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _bar: PointerValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm(
            "mbarriers on a target without them".into(),
        ))
    }
    /// Waits (`mbarrier.try_wait.parity` in a loop) until the phase of parity
    /// `parity` (an `i32`, 0 or 1) of `bar` has completed.
    fn mbarrier_wait<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _bar: PointerValue<'ctx>,
        _parity: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm(
            "mbarriers on a target without them".into(),
        ))
    }
    /// `%cluster_ctarank` (PTX ISA, "Special registers"): this block's rank in its
    /// thread-block cluster, `x + cx * (y + cy * z)` for its place `(x, y, z)` in a
    /// cluster of `cx * cy * cz` blocks (0 without clusters).
    fn cluster_ctarank<'ctx>(&self, _cx: &Cx<'ctx>) -> LResult<IntValue<'ctx>> {
        Err(LowerError::Llvm("clusters on a target without them".into()))
    }
    /// `barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned`
    /// (PTX ISA, "barrier.cluster"): every thread of every block of the cluster
    /// waits for all the others; what each did before is visible to all after
    /// (mbarriers initialized before it may take remote arrivals and copies).
    fn cluster_sync<'ctx>(&self, _cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        Err(LowerError::Llvm("clusters on a target without them".into()))
    }
    /// `mapa.shared::cluster.u32 r, bar, cta; mbarrier.arrive.release.cluster.shared::cluster.b64
    /// _, [r]` (PTX ISA, "mapa", "mbarrier.arrive"): one arrival on the mbarrier at
    /// the same shared offset as `bar` in the block of cluster rank `cta` (an `i32`),
    /// releasing this thread's earlier shared reads at cluster scope.
    fn mbarrier_arrive_cluster<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _bar: PointerValue<'ctx>,
        _cta: IntValue<'ctx>,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm("clusters on a target without them".into()))
    }
    /// `cp.async.bulk.tensor.{R}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    /// [dst], [tmap, {coords}], [bar]` (PTX ISA, "cp.async.bulk.tensor"): copies the
    /// box at `coords` (innermost first, `i32`) of the tensor map at generic address
    /// `tmap` (an `i64`) to shared `dst`, out-of-bounds elements zero, and completes
    /// its bytes on `bar`'s transaction count. With `multicast` (an `i16` CTA mask,
    /// `.multicast::cluster ... mask`), the box lands at the same shared offsets as
    /// `dst` and `bar` in every block of the cluster whose rank is a set bit, each
    /// completing its bytes on its own mbarrier.
    #[allow(clippy::too_many_arguments)]
    fn tma_load<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _dst: PointerValue<'ctx>,
        _tmap: IntValue<'ctx>,
        _coords: &[IntValue<'ctx>],
        _bar: PointerValue<'ctx>,
        _multicast: Option<IntValue<'ctx>>,
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm("TMA on a target without it".into()))
    }
    /// `cp.async.bulk.tensor.{R}d.global.shared::cta.tile.bulk_group [tmap, {coords}],
    /// [src]`: writes the box at shared `src` to the tensor at `coords` (innermost
    /// first), the elements outside the tensor not written; part of the thread's open
    /// bulk group.
    fn tma_store<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _src: PointerValue<'ctx>,
        _tmap: IntValue<'ctx>,
        _coords: &[IntValue<'ctx>],
        _site: u32,
    ) -> LResult<()> {
        Err(LowerError::Llvm("TMA on a target without it".into()))
    }
    /// `cp.async.bulk.commit_group` then `cp.async.bulk.wait_group.read 0`: every
    /// bulk store of the thread has read its shared memory.
    fn tma_store_wait<'ctx>(&self, _cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        Err(LowerError::Llvm("TMA on a target without it".into()))
    }
    /// Whether [`Arch::buffer_load`] is available (AMD).
    fn has_buffer_load(&self) -> bool {
        false
    }
    /// A raw buffer load (AMD CDNA3 ISA, `BUFFER_LOAD_DWORD*`; RDNA3/RDNA4 ISA, `BUFFER_LOAD_B*`) through a buffer
    /// resource of stride 0 and `num_records` bytes at global pointer `base`, offset
    /// enabled): the `ty` value (1, 2, 4, 8 or 16 bytes) at byte offset `lane.offset`
    /// (an unsigned `i32`), or zero when the access is out of range (`offset + size >
    /// num_records`). Callers keep every access wholly in or wholly out of range, and
    /// masked-off lanes out of range. A checking target (the emulator) checks a
    /// masked-on lane's own pointer `lane.ptr` against its buffer instead of reading
    /// zero silently where it is out of bounds.
    fn buffer_load<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _base: PointerValue<'ctx>,
        _num_records: u32,
        _lane: BufferLane<'ctx>,
        _ty: BasicTypeEnum<'ctx>,
        _site: u32,
    ) -> LResult<BasicValueEnum<'ctx>> {
        Err(LowerError::Llvm(
            "buffer load on a target without it".into(),
        ))
    }
    /// `ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16` (PTX ISA, "Warp-level
    /// matrix load instruction: ldmatrix"): lane `8 * i + j` gives the address `p` of
    /// row `j` of matrix `i` (`i < num`; 8 16-bit elements, 16-byte aligned); returns,
    /// per matrix, the `i32` holding this lane's two elements: row `lane / 4`, columns
    /// `2 * (lane % 4)` and `+ 1` (transposed: rows `2 * (lane % 4)` and `+ 1` of
    /// column `lane / 4`), the first in the low half.
    fn ldmatrix<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _p: PointerValue<'ctx>,
        _num: u32,
        _trans: bool,
        _site: u32,
    ) -> LResult<Vec<IntValue<'ctx>>> {
        Err(LowerError::Llvm("ldmatrix on a target without it".into()))
    }
    /// The 32-bit shared-memory address of `p` (a pointer into the block's shared
    /// memory): the offset in the `.shared` window on GPUs (what matrix descriptors
    /// hold), the offset from the block's shared base in the emulator.
    fn shared_address<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        p: PointerValue<'ctx>,
    ) -> LResult<IntValue<'ctx>> {
        Ok(cx.b.build_ptr_to_int(p, cx.ctx.i32_type(), "saddr")?)
    }
    /// `fence.proxy.async.shared::cta`: orders this thread's earlier generic-proxy
    /// shared-memory accesses (stores, `cp.async`) before later async-proxy ones
    /// (`wgmma` operand reads). Only emitted on targets with [`Target::has_wgmma`].
    fn fence_async_shared<'ctx>(&self, _cx: &Cx<'ctx>) -> LResult<()> {
        Err(LowerError::Llvm("wgmma on a target without it".into()))
    }
    /// `wgmma.fence.sync.aligned`: orders earlier register accesses before the
    /// following `wgmma.mma_async`s (needed before the first one of a `dot`).
    fn wgmma_fence<'ctx>(&self, _cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        Err(LowerError::Llvm("wgmma on a target without it".into()))
    }
    /// `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} d, a, b_desc, scale-d, 1, 1,
    /// [0,] {trans_b}` (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"),
    /// or `...m64n{n}k32.s32.s8.s8 d, a_desc, b_desc, scale-d` for `i8`:
    /// `D = A·B + D` for the warpgroup's 64 x n tile, A (64 x 16, or 64 x 32 bytes)
    /// from shared memory (K-major) or registers ([`WgmmaA`], 16-bit types only), B
    /// (N-major when `trans_b`, 16-bit types only; K-major otherwise) from shared
    /// memory through its matrix descriptor; `acc` holds this thread's `n / 2`
    /// accumulators (the D fragment: `f32`, or `i32` for `i8`). Returns the accumulators, which are only defined
    /// after a [`Arch::wgmma_wait`] covering the instruction; `slot` names the
    /// accumulator tile (the emulator tracks it). With `scale_d` false (the `scale-d`
    /// predicate) the instruction computes `D = A·B`, ignoring `acc`.
    #[allow(clippy::too_many_arguments)]
    fn wgmma<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _input: ScalarType,
        _n: u32,
        _a: WgmmaA<'_, 'ctx>,
        _desc_b: IntValue<'ctx>,
        _trans_b: bool,
        _scale_d: bool,
        _acc: &[BasicValueEnum<'ctx>],
        _slot: u32,
        _site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
        Err(LowerError::Llvm("wgmma on a target without it".into()))
    }
    /// `wgmma.commit_group.sync.aligned`: the `wgmma`s issued since the last commit
    /// form a group.
    fn wgmma_commit<'ctx>(&self, _cx: &Cx<'ctx>, _site: u32) -> LResult<()> {
        Err(LowerError::Llvm("wgmma on a target without it".into()))
    }
    /// `wgmma.wait_group.sync.aligned pending`: waits until at most `pending` groups
    /// are in flight; `accs[slot]` are the accumulator tiles of the waited-for
    /// `wgmma`s, returned defined.
    fn wgmma_wait<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _pending: u32,
        _accs: &[Vec<BasicValueEnum<'ctx>>],
        _site: u32,
    ) -> LResult<Vec<Vec<BasicValueEnum<'ctx>>>> {
        Err(LowerError::Llvm("wgmma on a target without it".into()))
    }
    /// Emits one matrix instruction: `a` and `b` hold the fragment elements in
    /// [`FragInfo::runs`] order, `c` the accumulator fragment (`f32`, or `i32` for
    /// `i8` inputs); returns D.
    fn emit_mma<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        input: ScalarType,
        a: &[BasicValueEnum<'ctx>],
        b: &[BasicValueEnum<'ctx>],
        c: &[BasicValueEnum<'ctx>],
        site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>>;
}

/// The implementation for a target.
pub fn for_target(t: Target) -> Box<dyn Arch> {
    match t {
        Target::Nvptx { sm, arch_specific } => Box::new(Nvptx { sm, arch_specific }),
        Target::Amdgpu(a) => Box::new(Amdgpu { arch: a }),
        Target::Emu(flavor) => Box::new(Emu { flavor }),
    }
}

/// Packs fragment elements into `i32` registers, `32 / bits` per register with the
/// first in the low bits (the `.b32` operand registers of `mma.sync`: two 16-bit or
/// four 8-bit elements).
pub(crate) fn pack_words<'ctx>(
    cx: &Cx<'ctx>,
    v: &[BasicValueEnum<'ctx>],
) -> LResult<Vec<IntValue<'ctx>>> {
    let i32t = cx.ctx.i32_type();
    let Some(first) = v.first() else {
        return Ok(Vec::new());
    };
    let ty = first.get_type();
    let bits = match ty {
        BasicTypeEnum::IntType(t) => t.get_bit_width(),
        BasicTypeEnum::FloatType(_) if cx.ctx.f32_type() == ty.into_float_type() => 32,
        BasicTypeEnum::FloatType(_) => 16,
        _ => {
            return Err(LowerError::Llvm(format!(
                "packing {ty:?} fragment elements"
            )));
        }
    };
    let per = (32 / bits.max(1)) as usize;
    v.chunks(per)
        .map(|p| {
            let vt: BasicTypeEnum = match ty {
                BasicTypeEnum::IntType(t) => t.vec_type(per as u32).into(),
                _ => ty.into_float_type().vec_type(per as u32).into(),
            };
            let mut acc = vt.into_vector_type().get_poison();
            for (i, x) in p.iter().enumerate() {
                acc = cx.b.build_insert_element(acc, *x, cx.i32(i as i64), "")?;
            }
            Ok(cx.b.build_bit_cast(acc, i32t, "")?.into_int_value())
        })
        .collect()
}

/// `mma.m16n8k32` on 8-bit floats (E4M3 or E5M2: A four `.b32` registers of four
/// bytes, B two, C four f32, the fragments of `nv_m16n8k32_s8`) on an NVIDIA target
/// without that instruction (sm_80, sm_86, sm_90; emu-nv as they): each register's
/// bytes become f16 (`cvt`: a `.b32` of four 8-bit floats to the f16 pairs of its bytes
/// 0, 1 and 2, 3, see [`fp8x4_to_f16`]), and `arch` multiplies them with two f16
/// `mma.m16n8k16` (exact: every 8-bit float is an f16, and products of f16 are exact in
/// f32), one per half of the 32 `k`. (A fragment that several instructions read is
/// converted for each; LLVM keeps one of the identical conversions.)
///
/// A lane holds the same `k` of A and B: bytes `4t..4t+4` of `k` (and `16 + 4t..`)
/// with `t = lane % 4`, where the f16 fragments hold `k = 2t, 2t + 1` and
/// `8 + 2t, 8 + 2t + 1`. The conversion keeps every element in its lane and maps
/// `k = 16s + 4t + j` to f16 slot `2t + j` (`j < 2`) or `8 + 2t + j - 2` of step `s`,
/// in A and in B alike: step `s` sums the products of `k` in `16s..16s + 16`, as an f16
/// `dot` stepping 16 at a time would, in another order within the instruction.
/// So the operands stay 8-bit up to the registers (half the shared memory and
/// its traffic of f16 arrays, loads by `cp.async`) and only one k-step's fragments are
/// ever f16, instead of whole f16 tiles ([`crate::fp8`]'s cast).
pub(crate) fn fp8_mma_as_f16<'ctx, A: Arch + ?Sized>(
    arch: &A,
    cx: &Cx<'ctx>,
    a: &[BasicValueEnum<'ctx>],
    b: &[BasicValueEnum<'ctx>],
    c: &[BasicValueEnum<'ctx>],
    site: u32,
    cvt: &dyn Fn(IntValue<'ctx>) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)>,
) -> LResult<Vec<BasicValueEnum<'ctx>>> {
    let (pa, pb) = (pack_words(cx, a)?, pack_words(cx, b)?);
    if pa.len() != 4 || pb.len() != 2 || c.len() != 4 {
        return Err(LowerError::Llvm(
            "mma.m16n8k32 takes 4 A, 2 B and 4 C registers".into(),
        ));
    }
    let a16 = pa.iter().map(|&w| cvt(w)).collect::<LResult<Vec<_>>>()?;
    let b16 = pb.iter().map(|&w| cvt(w)).collect::<LResult<Vec<_>>>()?;
    let mut d = c.to_vec();
    for s in 0..2 {
        // A: rows g and g + 8 (registers 2s and 2s + 1), k pairs (2t..) then (8 + 2t..).
        let (x, y) = (a16[2 * s], a16[2 * s + 1]);
        let af: [BasicValueEnum<'ctx>; 4] = [x.0.into(), y.0.into(), x.1.into(), y.1.into()];
        let bf: [BasicValueEnum<'ctx>; 2] = [b16[s].0.into(), b16[s].1.into()];
        d = arch.emit_mma(cx, ScalarType::F16, &af, &bf, &d, site)?;
    }
    Ok(d)
}

/// The four 8-bit floats `input` (E4M3 or E5M2) of the `.b32` `w` (element `i` in
/// byte `i`) as f16, exactly: `(f16x2 of bytes 0 and 1, f16x2 of bytes 2 and 3)`, the
/// first of each pair in the low half. Integer and f16 arithmetic, on every target.
///
/// A byte shuffle (one `prmt` on NVIDIA) puts each byte at the top of a 16-bit half.
/// An E5M2 there is its f16 (the same sign, exponent and bias, two fewer mantissa
/// bits), infinities and NaNs included. An E4M3 `S.EEEE.MMM` with its magnitude moved
/// down one bit is the f16 `S.0EEEE.MMM0000000`, its value times 2^-8 (bias 15 for
/// 7; subnormals too, exponent field 0 in both), so an exact f16 multiplication by
/// 256 gives its value. Its NaN (`S.1111.111`) comes out of that as ±480
/// (`0x5f80`), which the exponent bit it lacks (`0x2000`) makes a NaN again.
pub(crate) fn fp8x4_to_f16<'ctx>(
    cx: &Cx<'ctx>,
    input: ScalarType,
    w: IntValue<'ctx>,
) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
    let bd = &cx.b;
    let (i8t, i32t) = (cx.ctx.i8_type(), cx.ctx.i32_type());
    let c = |x: u32| i32t.const_int(u64::from(x), false);
    let bytes = bd
        .build_bit_cast(w, i8t.vec_type(4), "")?
        .into_vector_value();
    let zero = i8t.vec_type(4).const_zero();
    // Lanes 4.. of the shuffle are `zero`'s: bytes `i` and `j` on top of the halves.
    let spread = |i: u64, j: u64| -> LResult<IntValue<'ctx>> {
        let mask = [4, i, 4, j].map(|x| i32t.const_int(x, false));
        let v = bd.build_shuffle_vector(bytes, zero, VectorType::const_vector(&mask), "")?;
        Ok(bd.build_bit_cast(v, i32t, "")?.into_int_value())
    };
    let (lo, hi) = (spread(0, 1)?, spread(2, 3)?);
    if input == ScalarType::F8E5M2 {
        return Ok((lo, hi));
    }
    let f16x2 = cx.ctx.f16_type().vec_type(2);
    let k256 = cx.ctx.f16_type().const_float(256.0);
    let scale = VectorType::const_vector(&[k256, k256]);
    let e4m3 = |x: IntValue<'ctx>| -> LResult<IntValue<'ctx>> {
        let sign = bd.build_and(x, c(0x8000_8000), "")?;
        let mag = bd.build_and(x, c(0x7f00_7f00), "")?;
        let y = bd.build_or(sign, bd.build_right_shift(mag, c(1), false, "")?, "")?;
        let f = bd.build_bit_cast(y, f16x2, "")?.into_vector_value();
        let v = bd.build_float_mul(f, scale, "")?;
        let v = bd.build_bit_cast(v, i32t, "")?.into_int_value();
        // A NaN's magnitude `0x7f00` sets bit 15 of `mag + 0x100` (no other does, and
        // no carry leaves the half), moved to the exponent bit 13.
        let nan = bd.build_and(
            bd.build_int_add(mag, c(0x0100_0100), "")?,
            c(0x8000_8000),
            "",
        )?;
        let nan = bd.build_right_shift(nan, c(2), false, "")?;
        Ok(bd.build_or(v, nan, "")?)
    };
    Ok((e4m3(lo)?, e4m3(hi)?))
}

/// The letter of grid axis `axis` in intrinsic names (`x`, `y`, `z`).
fn axis_char(axis: u8) -> char {
    ['x', 'y', 'z'][axis.min(2) as usize]
}

/// Address space of a shared-memory pointer.
pub fn shared_space(t: Target) -> AddressSpace {
    AddressSpace::from(t.shared_addrspace())
}

/// An approximate math intrinsic (`afn`: the backends' hardware approximations,
/// `ex2.approx`, `lg2.approx`, `sin.approx`, `v_exp_f32`, ...).
pub(crate) fn approx<'ctx>(
    cx: &Cx<'ctx>,
    name: &str,
    v: FloatValue<'ctx>,
) -> LResult<FloatValue<'ctx>> {
    let r = cx.call_intrinsic(name, &[v.get_type().into()], &[v.into()])?;
    with_fast_math(r, inkwell::llvm_sys::LLVMFastMathApproxFunc);
    Ok(r.into_float_value())
}

/// Sets the fast-math `flags` (`LLVMFastMath*`) of `v`, the floating-point call or
/// instruction just built.
pub(crate) fn with_fast_math(v: BasicValueEnum<'_>, flags: inkwell::llvm_sys::LLVMFastMathFlags) {
    // SAFETY: `v` is a live floating-point instruction of the module being built;
    // its fast-math flags only change what LLVM may assume about its operands.
    unsafe {
        use inkwell::values::AsValueRef;
        inkwell::llvm_sys::core::LLVMSetFastMathFlags(v.as_value_ref(), flags);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::OptimizationLevel;
    use inkwell::context::Context;
    use tessera_ir::fp8::{F8E4M3, F8E5M2};

    /// [`fp8x4_to_f16`], JIT-compiled for the host: `u64 f(u32 w)` returns the two
    /// words, bytes 0 and 1's in the low half.
    fn compiled(input: ScalarType) -> extern "C" fn(u32) -> u64 {
        crate::emu::jit::init();
        let ctx = Box::leak(Box::new(Context::create()));
        let cx = Cx {
            ctx,
            module: ctx.create_module("fp8x4_to_f16"),
            b: ctx.create_builder(),
            host: true,
        };
        let (i32t, i64t) = (ctx.i32_type(), ctx.i64_type());
        let f = cx
            .module
            .add_function("cvt", i64t.fn_type(&[i32t.into()], false), None);
        cx.b.position_at_end(ctx.append_basic_block(f, "entry"));
        let w = f.get_nth_param(0).expect("param").into_int_value();
        let (lo, hi) = fp8x4_to_f16(&cx, input, w).expect("lowers");
        let b = &cx.b;
        let lo = b.build_int_z_extend(lo, i64t, "").expect("zext");
        let hi = b.build_int_z_extend(hi, i64t, "").expect("zext");
        let hi = b
            .build_left_shift(hi, i64t.const_int(32, false), "")
            .expect("shl");
        let r = b.build_or(lo, hi, "").expect("or");
        b.build_return(Some(&r)).expect("ret");
        let addr = crate::emu::jit::jit_for_host(
            cx.module,
            OptimizationLevel::Default,
            "default<O2>",
            false,
            "cvt",
        )
        .expect("jit");
        // SAFETY: `cvt` has this signature, and its code is never freed.
        unsafe { std::mem::transmute::<usize, extern "C" fn(u32) -> u64>(addr) }
    }

    /// Every 8-bit float of both formats, in each byte of the word, becomes its f16:
    /// the same bits (subnormals, zeros and infinities included), or a NaN of the
    /// same sign for a NaN.
    #[test]
    fn fp8_words_convert_to_their_f16_pairs() {
        type Decode = fn(u8) -> f32;
        let e4m3: Decode = |x| F8E4M3::from_bits(x).to_f32();
        let e5m2: Decode = |x| F8E5M2::from_bits(x).to_f32();
        for (input, value) in [(ScalarType::F8E4M3, e4m3), (ScalarType::F8E5M2, e5m2)] {
            let cvt = compiled(input);
            for v in 0..=255u8 {
                let bytes = [v, v ^ 0x80, v.wrapping_add(0x5b), !v];
                let got = cvt(u32::from_le_bytes(bytes));
                for (i, &x) in bytes.iter().enumerate() {
                    let h = half::f16::from_bits((got >> (16 * i)) as u16);
                    let want = value(x);
                    if want.is_nan() {
                        assert!(
                            h.is_nan() && h.is_sign_negative() == (x & 0x80 != 0),
                            "{input:?} {x:#04x} (byte {i}): {h:?}"
                        );
                    } else {
                        assert_eq!(
                            h.to_bits(),
                            half::f16::from_f32(want).to_bits(),
                            "{input:?} {x:#04x} (byte {i}): {h:?}, want {want}"
                        );
                    }
                }
            }
        }
    }
}

//! Everything target-specific the lowering emits, behind one trait: [`Arch`].
//!
//! The lowering in [`super`] is written once against `dyn Arch`; [`Nvptx`] and
//! [`Amdgpu`] implement it, and [`super::emu_arch::Emu`] (the host SIMT emulator)
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
//! | matrix unit | `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`, `...m16n8k32.row.col.s32.s8.s8.s32` (inline PTX; sm_80+); `wgmma.mma_async` (sm_90a, `lower::wgmma`) | `llvm.amdgcn.mfma.f32.{16x16x16,32x32x8}{f16,bf16.1k}` (gfx90a, gfx942), `...i32.{16x16x16,32x32x8}i8` (gfx90a), `...i32.{16x16x32,32x32x16}.i8` (gfx942) |
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

use inkwell::AddressSpace;
use inkwell::attributes::AttributeLoc;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use tessera_ir::ScalarType;
use tessera_ir::ir::{AtomicOp, MemScope, SignalOp};

use super::{Cx, LResult, LowerError};
use crate::Target;
use crate::target::AmdArch;

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

/// Target-specific emission. Every method emits at the builder's position.
pub trait Arch {
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
    /// Approximate f32 `log2` (≤ 2 ulp).
    fn log2_approx<'ctx>(&self, cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
        super::elementwise::approx(cx, "llvm.log2", x)
    }
    /// Approximate f32 `2^x` for `exp2` and `exp` (default: LLVM's `llvm.exp2` with
    /// `afn`: NVIDIA `ex2.approx.f32`, ≤ 2 ulp, subnormal results kept).
    fn exp2_approx<'ctx>(&self, cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
        super::elementwise::approx(cx, "llvm.exp2", x)
    }
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
    /// `cp.async.bulk.tensor.{R}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    /// [dst], [tmap, {coords}], [bar]` (PTX ISA, "cp.async.bulk.tensor"): copies the
    /// box at `coords` (innermost first, `i32`) of the tensor map at generic address
    /// `tmap` (an `i64`) to shared `dst`, out-of-bounds elements zero, and completes
    /// its bytes on `bar`'s transaction count.
    fn tma_load<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _dst: PointerValue<'ctx>,
        _tmap: IntValue<'ctx>,
        _coords: &[IntValue<'ctx>],
        _bar: PointerValue<'ctx>,
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
    /// Whether [`Arch::buffer_load`] is available (AMD CDNA).
    fn has_buffer_load(&self) -> bool {
        false
    }
    /// A raw buffer load (AMD CDNA3 ISA, `BUFFER_LOAD_DWORD*` through a buffer
    /// resource of stride 0 and `num_records` bytes at global pointer `base`, offset
    /// enabled): the `ty` value (1, 2, 4, 8 or 16 bytes) at byte offset `offset` (an
    /// unsigned `i32`), or zero when the access is out of range (`offset + size >
    /// num_records`). Callers keep every access wholly in or wholly out of range.
    fn buffer_load<'ctx>(
        &self,
        _cx: &Cx<'ctx>,
        _base: PointerValue<'ctx>,
        _num_records: u32,
        _offset: IntValue<'ctx>,
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

/// The implementation for a target.
pub fn for_target(t: Target) -> Box<dyn Arch> {
    match t {
        Target::Nvptx { sm, arch_specific } => Box::new(Nvptx { sm, arch_specific }),
        Target::Amdgpu(a) => Box::new(Amdgpu { arch: a }),
        Target::Emu(flavor) => Box::new(super::emu_arch::Emu { flavor }),
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

/// NVIDIA PTX.
pub struct Nvptx {
    /// Compute capability.
    pub sm: u32,
    /// sm_90a: the architecture-specific instructions (`wgmma`).
    pub arch_specific: bool,
}

/// AMD GCN/CDNA/RDNA.
pub struct Amdgpu {
    /// The gfx architecture.
    pub arch: AmdArch,
}

fn axis_char(axis: u8) -> char {
    ['x', 'y', 'z'][axis.min(2) as usize]
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
        _site: u32,
    ) -> LResult<()> {
        let d = shared_u32(cx, dst)?;
        let b = shared_u32(cx, bar)?;
        let r = coords.len();
        let cs: Vec<String> = (0..r).map(|i| format!("${}", 3 + i)).collect();
        let text = format!(
            "cp.async.bulk.tensor.{r}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$0], [$1, {{{}}}], [$2];",
            cs.join(", ")
        );
        let mut ins: Vec<(&str, BasicValueEnum<'ctx>)> =
            vec![("r", d.into()), ("l", tmap.into()), ("r", b.into())];
        ins.extend(coords.iter().map(|c| ("r", BasicValueEnum::from(*c))));
        ptx_void(cx, &text, &ins)
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

    fn log2_approx<'ctx>(&self, cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
        // LLVM 22 NVPTX has no lowering of `llvm.log2.f32` (not even with `afn`).
        Ok(cx
            .call_intrinsic("llvm.nvvm.lg2.approx.f", &[], &[x.into()])?
            .into_float_value())
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
            // `mma.sync` m16n8k32 on 8-bit floats (PTX ISA 8.4): the `.s8` fragments,
            // `QMMA` in sm_89's SASS. Not on sm_90, where ptxas turns it into
            // conversions and f16 `HMMA.16816` (what the f16 path gives, without the
            // newer driver), nor sm_90a (`wgmma`, `crate::fp8`).
            ScalarType::F8E4M3 | ScalarType::F8E5M2 if self.sm == 89 => Some(nv_m16n8k32_s8()),
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
        _site: u32,
    ) -> LResult<Vec<BasicValueEnum<'ctx>>> {
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
pub(crate) fn nv_m16n8k16() -> MmaInfo {
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

impl Arch for Amdgpu {
    fn has_buffer_load(&self) -> bool {
        matches!(self.arch, AmdArch::Gfx90a | AmdArch::Gfx942)
    }

    fn native_nan_max(&self) -> bool {
        // `v_maximum_f32` comes with gfx950 and gfx12.
        false
    }

    /// `v_exp_f32` itself (`llvm.amdgcn.exp2`: 1 ulp; results below 2^-126 flush to
    /// zero, as with Triton's `exp2` on AMD). `llvm.exp2` would wrap each one in five
    /// more instructions (a range check, a scale by 2^64 and its undoing) to keep
    /// subnormal results, which a softmax never needs.
    fn exp2_approx<'ctx>(&self, cx: &Cx<'ctx>, x: FloatValue<'ctx>) -> LResult<FloatValue<'ctx>> {
        Ok(cx
            .call_intrinsic("llvm.amdgcn.exp2", &[x.get_type().into()], &[x.into()])?
            .into_float_value())
    }

    fn buffer_load<'ctx>(
        &self,
        cx: &Cx<'ctx>,
        base: PointerValue<'ctx>,
        num_records: u32,
        offset: IntValue<'ctx>,
        ty: BasicTypeEnum<'ctx>,
        _site: u32,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let p8 = cx.ctx.ptr_type(AddressSpace::from(8u16));
        let bytes = super::type_size(ty);
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

/// Address space of a shared-memory pointer.
pub fn shared_space(t: Target) -> AddressSpace {
    AddressSpace::from(t.shared_addrspace())
}

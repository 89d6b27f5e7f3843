//! Tile IR to SIMT LLVM IR, written once for every target.
//!
//! # Value representation
//!
//! Every IR value lowers to a [`Tile`]: a [`Layout`] (which element each register of
//! each thread holds) and one LLVM scalar per register. Scalars (rank 0) have one
//! register holding the same value in every thread. Pointers are `ptr addrspace(1)`
//! (global) or `ptr addrspace(3)` (shared); `i1` stays `i1` in registers and is a byte
//! in memory. A tile is *uniform* when every element has the same value (`const`,
//! `splat`, and elementwise ops on uniform operands): it converts to any layout for
//! free, and elementwise ops on it are computed once.
//!
//! # Layout assignment (v1)
//!
//! Every tile op produces the canonical [`Layout::blocked`] layout of its shape with
//! 4 contiguous elements per thread, except: elementwise ops keep their first
//! non-uniform operand's layout (other operands are converted to it), `expand_dims`
//! and `reshape` keep the layout (the flat order is unchanged), `reduce` produces the
//! sliced layout of its operand, and `dot` on matrix units produces the instruction's
//! accumulator layout. A pre-pass gives a loop-carried value that is fed by a `dot`
//! the accumulator layout, so the accumulator stays in MMA registers across
//! iterations. `broadcast` and `permute` gather, from the operand, the elements each
//! register of the result's canonical layout needs: a register renaming when each
//! thread already holds them, otherwise a round trip through shared memory.
//!
//! Cheap index and mask values (aranges, splats, integer arithmetic, compares,
//! pointer offsets) are never converted through shared memory where their consumer
//! needs another layout: `remat` recomputes them in that layout (broadcast sources,
//! elementwise operands, the pointers and mask of a load or store). So the offsets
//! and masks of a matmul's loads cost no barrier, and a load that feeds only `dot`
//! takes the 16-byte blocked layout ([`Layout::blocked`] with `16 / size` elements per
//! thread) when its pointers can be recomputed in it; a store keeps the value's layout
//! (a `dot` result is stored straight from its fragments) when its pointers can.
//!
//! Layout conversions through shared memory write each register at its element index
//! (replicated threads write the same value to the same place, which is benign), then
//! barrier, read, barrier. All scratch lives in one static `[N x i8] addrspace(3)`
//! global sized to the largest need of any op ([`KernelMeta::shared_bytes`]).
//!
//! # Semantics that differ from the interpreter
//!
//! - Integer division or remainder by zero yields 0 on a GPU; the interpreter and the
//!   emulator report it as an error naming the op's line (the emulator through
//!   `Arch::check_divisor`), so a kernel that divides by zero is caught on the CPU.
//!   `MIN / -1` wraps as in the interpreter. Emitted as selects around a safe
//!   divisor, since `sdiv`/`udiv` by zero and `sdiv MIN, -1` are UB in LLVM.
//! - `reduce` combines in a tree (registers, then butterfly shuffles over lanes, then
//!   warps in order), not strictly left to right, so float sums may round
//!   differently; `scan` is sequential per line and rounds exactly like the
//!   interpreter (one thread walks each line through shared memory: O(n) per line —
//!   simple, not fast). The FMA `dot` adds products in increasing `k` without fusing
//!   (bit-exact with the interpreter); `mma`/`mfma` accumulate in hardware order.
//! - Math functions (`f32`; `f16`/`bf16` computed in `f32` and rounded):
//!
//!   | op | emitted as | accuracy (f32) |
//!   |---|---|---|
//!   | `exp2`, `log2` | `llvm.exp2`, `llvm.log2` (`ex2.approx`, `lg2.approx` / `v_exp_f32`, `v_log_f32`) | ≤ 2 ulp |
//!   | `exp`, `log` | `exp2(x·log2 e)`, `log2(x)·ln 2` | ≤ 2 ulp + input scaling (relative ≈ 2^-22 for large \|x\|) |
//!   | `sqrt`, `rsqrt` | `llvm.sqrt` (correctly rounded), `1 / sqrt` | 0.5 ulp, ≤ 1 ulp |
//!   | `sin`, `cos` | `llvm.sin`, `llvm.cos` (`sin.approx` / `v_sin_f32`) | ≈ 2^-21 absolute for \|x\| ≤ π; degrades for large \|x\| |
//!   | `tanh` | odd Taylor polynomial to x^15 for \|x\| < 0.55, else `1 - 2/(exp(2|x|)+1)` with the sign | ≤ 4 ulp |
//!   | `erf` | Taylor series to x^15 for \|x\| < 0.5, else Abramowitz–Stegun 7.1.26 | ≤ 1.5e-7 absolute |
//!   | `floor`, `ceil`, `abs`, `fma` | LLVM intrinsics | exact |
//!
//!   f64 transcendental functions are `Unsupported` (no libdevice/ocml linked yet);
//!   f64 `sqrt`, `floor`, `ceil`, `fma`, arithmetic and casts work.
//! - Plain loads and stores are ordinary (non-atomic) accesses.
//!
//! # Communication
//!
//! Kernels that use communication ops take the hidden parameters of [`crate::comm`];
//! `comm` lowers `rank`, `world_size`, `remote_ptr`, `signal`, `wait_until`, `fence`
//! and `barrier_all` (see that module for the memory-model sequences).

pub mod arch;
#[cfg(test)]
mod banks;
mod comm;
mod convert;
mod dot;
mod elementwise;
pub mod engine;
mod fmod;
pub(crate) mod host;
mod memory;
pub mod prov;
mod reduce;
mod remat;
mod tma;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use inkwell::AddressSpace;
use inkwell::basic_block::BasicBlock;
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FunctionValue, GlobalValue, IntValue,
    PointerValue,
};
use tessera_ir::ir::{ConstValue, Op, OpKind, Region};
use tessera_ir::{AddrSpace, Elem, Function, ScalarType, Span, ValueId};

use crate::axis::AxisAnalysis;
use crate::layout::{Layout, broadcast_bit_images, permute_bit_images};
use crate::{CodegenError, CompileOptions, KernelMeta, Target};
use arch::Arch;

/// Internal lowering error, turned into [`CodegenError`] at the entry point.
#[derive(Debug)]
pub enum LowerError {
    /// Not supported on this target, at this op.
    Unsupported {
        /// The op's span.
        span: Span,
        /// What.
        message: String,
    },
    /// An LLVM builder failure (a bug).
    Llvm(String),
}

impl From<BuilderError> for LowerError {
    fn from(e: BuilderError) -> Self {
        LowerError::Llvm(e.to_string())
    }
}

/// Result of lowering steps.
pub type LResult<T> = Result<T, LowerError>;

/// A stack slot of `ty` in the function's entry block (an alloca inside a loop would
/// grow the stack every iteration).
pub(super) fn entry_alloca<'ctx>(
    cx: &Cx<'ctx>,
    ty: inkwell::types::BasicTypeEnum<'ctx>,
    name: &str,
) -> LResult<PointerValue<'ctx>> {
    let fnv =
        cx.b.get_insert_block()
            .and_then(|bb| bb.get_parent())
            .ok_or_else(|| LowerError::Llvm("alloca outside a function".into()))?;
    let entry = fnv
        .get_first_basic_block()
        .ok_or_else(|| LowerError::Llvm("function without entry block".into()))?;
    let tb = cx.ctx.create_builder();
    match entry.get_first_instruction() {
        Some(i) => tb.position_before(&i),
        None => tb.position_at_end(entry),
    }
    Ok(tb.build_alloca(ty, name)?)
}

fn unsupported<T>(span: &Span, message: impl Into<String>) -> LResult<T> {
    Err(LowerError::Unsupported {
        span: span.clone(),
        message: message.into(),
    })
}

/// The LLVM emission context handed to [`Arch`] implementations.
pub struct Cx<'ctx> {
    /// The LLVM context.
    pub ctx: &'ctx Context,
    /// The module being built.
    pub module: Module<'ctx>,
    /// The builder, positioned where code goes.
    pub b: Builder<'ctx>,
    /// The code runs on the host CPU (the compiled CPU device, the emulator): a
    /// conversion that some of the host's vector extensions implement with an
    /// instruction that flushes subnormals (AVX512-BF16's `vcvtneps2bf16` for
    /// f32 to bf16) is written out in integer arithmetic instead, so results do not
    /// depend on the host's extensions.
    pub host: bool,
}

impl<'ctx> Cx<'ctx> {
    /// An `i32` constant.
    pub fn i32(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i32_type().const_int(v as u64, true)
    }

    /// The integer type of `bits` bits (1, 8, 16, 32 or 64).
    pub fn int_ty(&self, bits: u32) -> inkwell::types::IntType<'ctx> {
        match bits {
            1 => self.ctx.bool_type(),
            8 => self.ctx.i8_type(),
            16 => self.ctx.i16_type(),
            32 => self.ctx.i32_type(),
            _ => self.ctx.i64_type(),
        }
    }

    /// Calls intrinsic `name` (overloaded on `tys`); a void call returns `i32 0`.
    pub fn call_intrinsic(
        &self,
        name: &str,
        tys: &[BasicTypeEnum<'ctx>],
        args: &[BasicValueEnum<'ctx>],
    ) -> LResult<BasicValueEnum<'ctx>> {
        let i = Intrinsic::find(name)
            .ok_or_else(|| LowerError::Llvm(format!("unknown intrinsic {name}")))?;
        let f = i
            .get_declaration(&self.module, tys)
            .ok_or_else(|| LowerError::Llvm(format!("bad overload of {name}")))?;
        let args: Vec<BasicMetadataValueEnum> = args.iter().map(|&a| a.into()).collect();
        let call = self.b.build_call(f, &args, "")?;
        Ok(call
            .try_as_basic_value()
            .basic()
            .unwrap_or_else(|| self.i32(0).into()))
    }

    /// A fence with a sync scope (`""` = system).
    pub fn fence(&self, ord: inkwell::AtomicOrdering, scope: &str) -> LResult<()> {
        let ssid = self.sync_scope_id(scope);
        unsafe {
            inkwell::llvm_sys::core::LLVMBuildFenceSyncScope(
                self.b.as_mut_ptr(),
                ord.into(),
                ssid,
                c"".as_ptr(),
            );
        }
        Ok(())
    }

    /// The id of a sync scope name (`""` is the system scope).
    pub fn sync_scope_id(&self, scope: &str) -> u32 {
        unsafe {
            inkwell::llvm_sys::core::LLVMGetSyncScopeID(
                self.ctx.raw(),
                scope.as_ptr() as *const _,
                scope.len(),
            )
        }
    }

    fn cur_block(&self) -> BasicBlock<'ctx> {
        self.b
            .get_insert_block()
            .expect("the builder is always positioned")
    }
}

/// One lowered IR value.
#[derive(Clone, Debug)]
pub struct Tile<'ctx> {
    /// The IR element type.
    pub elem: Elem,
    /// Which element each register holds.
    pub layout: Layout,
    /// One value per register.
    pub regs: Vec<BasicValueEnum<'ctx>>,
    /// Every element has the same value (all registers are the same SSA value).
    pub uniform: bool,
}

/// Where a runtime hook was emitted: the op (mnemonic and source span) and what the
/// hook does there. The lowering numbers every barrier, shuffle, matrix instruction and
/// memory access it emits; [`Arch`] hooks receive the number (a *site id*), an index
/// into the table [`lower_with_sites`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// The op's source span.
    pub span: Span,
    /// The op's mnemonic (`load`, `dot`, `reduce`, ...).
    pub op: &'static str,
    /// What the hook does (`barrier`, `shuffle`, `mma`, `global load`, `shared store`, ...).
    pub what: &'static str,
    /// For a hook emitted while lowering a memory access (`load`, `store`, atomics,
    /// `signal`, `wait_until`, tensor-descriptor accesses): the buffers the accessed
    /// pointer derives from ([`prov::analyze`]), which a checking target checks its
    /// global accesses against; `None`: any buffer of the launch.
    pub prov: Option<std::sync::Arc<prov::Provenance>>,
}

/// The result of [`lower_with_sites`].
pub struct Lowered<'ctx> {
    /// The module holding the kernel.
    pub module: Module<'ctx>,
    /// Launch facts.
    pub meta: KernelMeta,
    /// The site table: site id → op.
    pub sites: Vec<Site>,
    /// With [`lower_with_layouts`]: the lowered IR (after [`crate::pipeline`]) with
    /// each op's result layouts and layout conversions as comments.
    pub layouts: Option<String>,
}

/// Lowers `func` for `target` like [`lower_kernel`] and returns the IR it lowered
/// (after [`crate::pipeline`]) annotated, before each op, with the layout of each
/// result and every layout change the op needed: register renamings, values
/// recomputed in another layout, conversions through shared memory, operands kept in
/// a `dot`'s shared arrays, and the matrix instruction and arrays of each `dot`.
/// What `TESSERA_DUMP=layout` writes.
pub fn lower_with_layouts(
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<String, CodegenError> {
    let ctx = Context::create();
    let arch = arch::for_target(target);
    let l = lower_impl(&ctx, func, arch.as_ref(), opts, true)?;
    Ok(l.layouts.unwrap_or_default())
}

/// Lowers `func` into a new LLVM module for `target`: one kernel entry point named
/// like the function, taking its parameters in order (pointers as global-address-space
/// pointers, scalars by value), run by `opts.num_warps * warp_size` threads per block.
pub fn lower_kernel<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<(Module<'ctx>, KernelMeta), CodegenError> {
    if !opts.num_warps.is_power_of_two() || opts.num_warps > 16 {
        return Err(CodegenError::Options(format!(
            "num_warps must be a power of two from 1 to 16, got {}",
            opts.num_warps
        )));
    }
    if opts.num_stages.is_some_and(|s| !(1..=8).contains(&s)) {
        return Err(CodegenError::Options(format!(
            "num_stages must be from 1 to 8, got {:?}",
            opts.num_stages
        )));
    }
    let arch = arch::for_target(target);
    lower_with_arch(ctx, func, arch.as_ref(), opts)
}

/// [`lower_kernel`] with an explicit [`Arch`] (the emulator plugs in here).
pub fn lower_with_arch<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
) -> Result<(Module<'ctx>, KernelMeta), CodegenError> {
    let l = lower_with_sites(ctx, func, arch, opts)?;
    Ok((l.module, l.meta))
}

/// [`lower_with_arch`], also returning the site table the [`Arch`] hooks were given.
pub fn lower_with_sites<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
) -> Result<Lowered<'ctx>, CodegenError> {
    lower_impl(ctx, func, arch, opts, false)
}

fn lower_impl<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
) -> Result<Lowered<'ctx>, CodegenError> {
    if func.uses_comm() {
        engine::check(arch.target(), opts.engine)?;
    }
    // `dot`s of 8-bit floats: on `wgmma` or `mma.sync` m16n8k32 (sm_89's instruction,
    // or its fragments converted to f16 in registers on sm_80, sm_86 and sm_90) as they
    // are where they can be (else the whole kernel again with them on f16), elsewhere
    // on f16 (`crate::fp8`).
    if crate::fp8::has_fp8_dot(func) {
        if (arch.target().has_wgmma() || arch.mma(ScalarType::F8E4M3).is_some())
            && let Ok(l) = lower_as_is(ctx, func, arch, opts, with_layouts)
        {
            return Ok(l);
        }
        if let Some(up) = crate::fp8::upcast_dots(func) {
            return lower_as_is(ctx, &up, arch, opts, with_layouts);
        }
    }
    lower_as_is(ctx, func, arch, opts, with_layouts)
}

/// [`lower_impl`] with the `dot`s as they are.
fn lower_as_is<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
) -> Result<Lowered<'ctx>, CodegenError> {
    let stages = opts
        .num_stages
        .unwrap_or_else(|| arch.default_num_stages())
        .clamp(1, 8);
    let (l, rings) = match lower_staged(ctx, func, arch, opts, with_layouts, stages) {
        Ok(x) => x,
        // By default, a kernel whose pipelined form the target cannot hold (its
        // operand tiles in flight exceed the shared memory) takes fewer stages, down
        // to none; the first error stands if every count fails, or if the user chose
        // the stages.
        Err(e @ CodegenError::Unsupported { .. }) if opts.num_stages.is_none() && stages > 1 => {
            let fewer = [2, 1].into_iter().filter(|&s| s < stages);
            for s in fewer {
                if let Ok((l, _)) = lower_staged(ctx, func, arch, opts, with_layouts, s) {
                    return Ok(l);
                }
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    // By default, more than 2 stages are for `cp.async` rings: where no loop got one
    // (unknown alignment, no `cp.async`), register prefetch keeps one tile in flight
    // (a deeper one would hold every further tile in registers).
    if opts.num_stages.is_none() && stages > 2 && !rings {
        return Ok(lower_staged(ctx, func, arch, opts, with_layouts, 2)?.0);
    }
    Ok(l)
}

/// [`lower_impl`] with `stages`; also whether a loop got a `cp.async` ring.
///
/// Tensor-descriptor accesses become masked memory ops
/// ([`tessera_ir::tensor_desc::expand`]) except the accesses [`tma::tma_candidate`]
/// keeps for TMA; when one of those does not end up in a `dot`'s ring, the kernel is
/// lowered again with every access expanded.
fn lower_staged<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
    stages: u32,
) -> Result<(Lowered<'ctx>, bool), CodegenError> {
    let target = arch.target();
    let mut expanded = func.clone();
    let keep = |f: &Function, op: &Op| tma::tma_candidate(target, f, op, stages);
    tessera_ir::tensor_desc::expand(&mut expanded, &keep);
    let kept = tessera_ir::tensor_desc::count(&expanded);
    match lower_expanded(ctx, &expanded, arch, opts, with_layouts, stages) {
        Err(_) if kept > 0 => {
            let mut all = func.clone();
            tessera_ir::tensor_desc::expand(&mut all, &|_, _| false);
            lower_expanded(ctx, &all, arch, opts, with_layouts, stages)
        }
        r => r,
    }
}

/// [`lower_staged`] of a kernel whose descriptor accesses are expanded or TMA loads.
fn lower_expanded<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
    stages: u32,
) -> Result<(Lowered<'ctx>, bool), CodegenError> {
    let target = arch.target();
    // Only loads feeding `dot`s on the matrix units: their loop keeps the tile in the
    // `dot`'s shared arrays (`Lowerer::plan_staging`), not in registers.
    let nw = opts.num_warps;
    let matrix_dot = |f: &Function, d: &Op| {
        let (a, b) = (f.ty(d.operands[0]), f.ty(d.operands[1]));
        let (Some(s), [m, k], [_, n]) = (a.scalar_type(), &a.shape[..], &b.shape[..]) else {
            return false;
        };
        // (8-bit floats: on `wgmma`, and on `mma.sync` where `mma_for` has them, see
        // `crate::fp8`.)
        (s.is_fp8() && target.has_wgmma())
            || arch
                .mma_for(s, *m, *n, *k, nw)
                .is_some_and(|i| m % i.m == 0 && n % i.n == 0 && k % i.k == 0)
    };
    let pipelined = crate::pipeline::pipeline_loads(func, stages, &matrix_dot);
    let func = &pipelined;
    let err = |e: LowerError| match e {
        LowerError::Unsupported { span, message } => CodegenError::Unsupported {
            kernel: func.name.clone(),
            target,
            span,
            message,
        },
        LowerError::Llvm(message) => CodegenError::Llvm {
            kernel: func.name.clone(),
            target,
            message,
        },
    };
    let module = ctx.create_module(&func.name);
    if !target.triple().is_empty() {
        module.set_triple(&inkwell::targets::TargetTriple::create(target.triple()));
    }
    let cx = Cx {
        ctx,
        module,
        b: ctx.create_builder(),
        host: matches!(target, crate::target::Target::Emu(_)),
    };
    let num_threads = opts.num_warps * arch.warp_size();
    let mut l = Lowerer::new(cx, arch, func, opts.num_warps).map_err(err)?;
    l.engine = opts.engine;
    if with_layouts {
        l.notes = Some(RefCell::new(HashMap::new()));
    }
    l.run().map_err(err)?;
    let shared_bytes = l.finish_shared().map_err(err)?;
    let layouts = l.notes.take().map(|n| {
        let n = n.into_inner();
        tessera_ir::printer::print_function_with_notes(func, &|op| {
            n.get(&(op as *const Op)).cloned().unwrap_or_default()
        })
    });
    let meta = KernelMeta {
        name: kernel_symbol(&func.name),
        num_threads,
        shared_bytes,
    };
    let rings = !l.async_dots.is_empty();
    Ok((
        Lowered {
            sites: l.sites.into_inner(),
            module: l.cx.module,
            meta,
            layouts,
        },
        rings,
    ))
}

pub(crate) struct Lowerer<'a, 'ctx> {
    pub cx: Cx<'ctx>,
    pub arch: &'a dyn Arch,
    pub f: &'a Function,
    pub ws: u32,
    pub nw: u32,
    pub vals: HashMap<ValueId, Tile<'ctx>>,
    pub axis: AxisAnalysis,
    pub kernel: FunctionValue<'ctx>,
    smem: GlobalValue<'ctx>,
    /// The arch's shared-memory base, when it provides one (the emulator).
    smem_base: Option<PointerValue<'ctx>>,
    smem_bytes: u32,
    smem_span: Option<Span>,
    pub tid: IntValue<'ctx>,
    pub lane: IntValue<'ctx>,
    pub warp: IntValue<'ctx>,
    hints: HashMap<ValueId, Layout>,
    /// The op defining each value (none for parameters and region arguments).
    pub(crate) defs: HashMap<ValueId, &'a Op>,
    /// Where a value flows on through a loop: a `for` init to its region argument, a
    /// `yield`ed value to the next iteration's argument and the loop's result.
    flows: HashMap<ValueId, Vec<ValueId>>,
    /// Loop-carried `dot` operands kept in the `dot`'s shared arrays instead of
    /// registers (see [`Self::lower_for`]): the region argument, the `dot` and the
    /// operand index.
    staged: HashMap<ValueId, (&'a Op, usize)>,
    /// Operands of matrix-path `dot`s in a loop that are defined before the loop:
    /// written into the `dot`'s own arrays once, before the loop (`(dot, which)`).
    invariant: HashSet<(*const Op, usize)>,
    /// Where each of those `dot`s' arrays start, past the start of shared memory.
    pipe_dots: HashMap<*const Op, u32>,
    /// Where each `local_alloc` array starts, past the start of shared memory.
    locals: HashMap<*const Op, u32>,
    /// Shared memory the arrays of [`Self::pipe_dots`] take (scratch comes after).
    pipe_bytes: u32,
    /// A reduction's result (and what `expand_dims`/`reshape` make of it): the layout
    /// of the tile it was reduced from. Broadcasting it back to that shape produces
    /// that layout, a register renaming (each thread holds the combined value of
    /// its own elements), like Triton's slice layouts and their parents.
    parents: HashMap<ValueId, Layout>,
    /// Whether `dot` operand pipelines may use asynchronous copies ([`Arch::cp_async`]).
    allow_async: bool,
    /// `dot`s whose operands arrive by asynchronous copies into a ring of arrays.
    async_dots: HashMap<*const Op, AsyncDot>,
    /// The loads that become asynchronous copies: their `dot`, operand, and slot.
    async_loads: HashMap<ValueId, (&'a Op, usize, AsyncSlot)>,
    /// Region arguments of those pipelines (they hold nothing in registers).
    async_args: std::collections::HashSet<ValueId>,
    /// Asynchronous copies issued per (`dot`, slot) so far: the group is committed
    /// when both operands' are.
    async_issued: RefCell<HashMap<(*const Op, Option<u32>), u32>>,
    /// While lowering a pipelined loop's body: per `dot`, the byte offsets (within its
    /// ring) of the slot its operands are read from and of the slot being filled.
    async_slots: RefCell<HashMap<*const Op, (IntValue<'ctx>, IntValue<'ctx>)>>,
    /// TMA rings whose mbarriers the current run of their loop initialized.
    tma_inited: RefCell<HashSet<*const Op>>,
    sites: RefCell<Vec<Site>>,
    /// The hidden parameters of a communicating kernel ([`crate::comm`]).
    comm: Option<comm::CommVals<'ctx>>,
    /// Comm ops lowered so far (the next one's index in [`crate::comm::comm_sites`]).
    comm_sites: usize,
    /// The block that returns early (programs whose wait failed).
    comm_exit: Option<BasicBlock<'ctx>>,
    /// How off-node peers are reached ([`engine`]).
    engine: crate::CommEngine,
    /// The op being lowered (span, mnemonic), for new sites.
    cur_op: RefCell<(Span, &'static str)>,
    /// The op being lowered, for [`Self::note`].
    cur_op_ptr: std::cell::Cell<*const Op>,
    /// Per value ([`ValueId::index`]): the buffers a global pointer derives from.
    prov: Vec<Option<std::sync::Arc<prov::Provenance>>>,
    /// The provenance of the pointer the op being lowered accesses, for new sites.
    cur_prov: RefCell<Option<std::sync::Arc<prov::Provenance>>>,
    /// With [`lower_with_layouts`]: notes per op.
    notes: Option<RefCell<HashMap<*const Op, Vec<String>>>>,
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    fn new(cx: Cx<'ctx>, arch: &'a dyn Arch, f: &'a Function, nw: u32) -> LResult<Self> {
        let target = arch.target();
        let ws = arch.warp_size();
        let mut params: Vec<BasicMetadataTypeEnum> = Vec::new();
        for p in &f.params {
            let t = match f.ty(p.value).elem {
                Elem::Scalar(ScalarType::I1) => cx.ctx.i8_type().into(),
                e => llvm_type(cx.ctx, target, e),
            };
            params.push(t.into());
        }
        let uses_comm = f.uses_comm();
        if uses_comm {
            // The hidden parameters of `crate::comm::HIDDEN_PARAMS`.
            let global = cx
                .ctx
                .ptr_type(AddressSpace::from(target.global_addrspace()));
            params.extend([
                cx.ctx.i32_type().into(),
                cx.ctx.i32_type().into(),
                global.into(),
                cx.ctx.i64_type().into(),
            ] as [BasicMetadataTypeEnum; 4]);
        }
        let fty = cx.ctx.void_type().fn_type(&params, false);
        let kernel = cx.module.add_function(&kernel_symbol(&f.name), fty, None);
        let comm = if uses_comm {
            let n = f.params.len() as u32;
            let p = |i: u32, name: &str| {
                let v = kernel
                    .get_nth_param(n + i)
                    .expect("the hidden parameters were declared");
                v.set_name(name);
                v
            };
            Some(comm::CommVals {
                rank: p(0, "tessera.rank").into_int_value(),
                world: p(1, "tessera.world_size").into_int_value(),
                bases: p(2, "tessera.heap_bases").into_pointer_value(),
                timeout: p(3, "tessera.timeout_ns").into_int_value(),
            })
        } else {
            None
        };
        arch.set_kernel_abi(&cx, kernel, nw * ws);
        let entry = cx.ctx.append_basic_block(kernel, "entry");
        cx.b.position_at_end(entry);
        let placeholder = cx.module.add_global(
            cx.ctx.i8_type().array_type(1),
            Some(arch::shared_space(target)),
            "__tessera_smem_placeholder",
        );
        let tid = arch.thread_id(&cx)?;
        let lane = cx.b.build_and(tid, cx.i32(ws as i64 - 1), "lane")?;
        let warp = arch.warp_id(&cx, tid)?;
        let smem_base = arch.shared_base(&cx)?;
        Ok(Lowerer {
            cx,
            arch,
            f,
            ws,
            nw,
            vals: HashMap::new(),
            axis: AxisAnalysis::run(f),
            kernel,
            smem: placeholder,
            smem_base,
            smem_bytes: 0,
            smem_span: None,
            tid,
            lane,
            warp,
            hints: HashMap::new(),
            allow_async: true,
            parents: HashMap::new(),
            async_dots: HashMap::new(),
            async_loads: HashMap::new(),
            async_args: std::collections::HashSet::new(),
            async_issued: RefCell::new(HashMap::new()),
            async_slots: RefCell::new(HashMap::new()),
            tma_inited: RefCell::new(HashSet::new()),
            staged: HashMap::new(),
            invariant: HashSet::new(),
            pipe_dots: HashMap::new(),
            locals: HashMap::new(),
            pipe_bytes: 0,
            flows: {
                let mut m = HashMap::new();
                collect_flows(&f.body, &mut m);
                m
            },
            defs: {
                let mut d = HashMap::new();
                collect_defs(&f.body, &mut d);
                d
            },
            sites: RefCell::new(Vec::new()),
            cur_op: RefCell::new((f.span.clone(), "kernel")),
            cur_op_ptr: std::cell::Cell::new(std::ptr::null()),
            prov: prov::analyze(f),
            cur_prov: RefCell::new(None),
            notes: None,
            comm,
            comm_sites: 0,
            comm_exit: None,
            engine: crate::CommEngine::Direct,
        })
    }

    pub fn target(&self) -> Target {
        self.arch.target()
    }

    fn run(&mut self) -> LResult<()> {
        for (i, p) in self.f.params.iter().enumerate() {
            let e = self.f.ty(p.value).elem;
            let mut v = self
                .kernel
                .get_nth_param(i as u32)
                .expect("one LLVM parameter per kernel parameter");
            if e == Elem::Scalar(ScalarType::I1) {
                v = self
                    .cx
                    .b
                    .build_int_compare(
                        inkwell::IntPredicate::NE,
                        v.into_int_value(),
                        self.cx.ctx.i8_type().const_zero(),
                        "",
                    )?
                    .into();
            }
            v.set_name(&p.name);
            let t = self.scalar_tile(e, v);
            self.vals.insert(p.value, t);
        }
        self.compute_hints(&self.f.body);
        self.plan_locals();
        self.plan_staging(&self.f.body);
        let body = &self.f.body;
        self.lower_region(body)?;
        // Puts to off-node peers are delivered before the kernel ends.
        self.engine_quiet()?;
        self.cx.b.build_return(None)?;
        Ok(())
    }

    /// Replaces the placeholder shared global with one of the final size.
    fn finish_shared(&mut self) -> LResult<u32> {
        let bytes = self.pipe_bytes + self.smem_bytes;
        let limit = self.target().shared_memory_limit();
        if bytes > limit {
            let span = self
                .smem_span
                .clone()
                .unwrap_or_else(|| self.f.span.clone());
            return unsupported(
                &span,
                format!("{bytes} bytes of shared memory (the limit is {limit})"),
            );
        }
        let old = self.smem;
        if bytes > 0 && self.smem_base.is_none() {
            let dynamic = self.target().dynamic_shared(bytes);
            // Dynamic shared memory is an unsized external array the launch sizes.
            let ty = self
                .cx
                .ctx
                .i8_type()
                .array_type(if dynamic { 0 } else { bytes });
            let g = self.cx.module.add_global(
                ty,
                Some(arch::shared_space(self.target())),
                "__tessera_smem",
            );
            if dynamic {
                g.set_linkage(Linkage::External);
            } else {
                g.set_linkage(Linkage::Internal);
                g.set_initializer(&ty.get_undef());
            }
            g.set_alignment(self.smem_align());
            old.as_pointer_value()
                .replace_all_uses_with(g.as_pointer_value());
        }
        unsafe { old.delete() };
        Ok(bytes)
    }

    /// The alignment of every array in shared memory: 16 bytes, or on targets with
    /// `wgmma` the 1024 bytes its 128-byte swizzle repeats over (offsets stay
    /// multiples of it, and so does the block's shared memory).
    pub(crate) fn smem_align(&self) -> u32 {
        if self.target().has_wgmma() {
            dot::wgmma::ARRAY_ALIGN
        } else {
            16
        }
    }

    /// Reserves `bytes` of scratch for the op at `span`; returns the base pointer.
    pub fn scratch(&mut self, bytes: u32, span: &Span) -> PointerValue<'ctx> {
        let bytes = bytes.div_ceil(16) * 16;
        if bytes > self.smem_bytes {
            self.smem_bytes = bytes;
            self.smem_span = Some(span.clone());
        }
        self.smem_at(self.pipe_bytes)
    }

    /// The start of shared memory plus `offset` bytes.
    fn smem_at(&self, offset: u32) -> PointerValue<'ctx> {
        let base = self
            .smem_base
            .unwrap_or_else(|| self.smem.as_pointer_value());
        if offset == 0 {
            return base;
        }
        let i8t = self.cx.ctx.i8_type();
        // SAFETY: an offset inside the block's shared memory, which `finish_shared`
        // sizes to hold the staged arrays and the scratch after them.
        unsafe {
            self.cx
                .b
                .build_in_bounds_gep(i8t, base, &[self.cx.i32(offset as i64)], "")
                .unwrap_or(base)
        }
    }

    /// The shared arrays of `dot` `op` when a loop stages an operand of it there.
    pub fn pipe_base(&self, op: &Op) -> Option<PointerValue<'ctx>> {
        let off = *self.pipe_dots.get(&(op as *const Op))?;
        Some(self.smem_at(off))
    }

    /// Whether operand `which` of `dot` `op` is already in the `dot`'s shared arrays:
    /// a loop-carried operand kept there, or a loop-invariant one written there
    /// before the loop.
    pub fn is_staged(&self, op: &Op, which: usize) -> bool {
        self.staged.contains_key(&op.operands[which])
            || self.invariant.contains(&(op as *const Op, which))
    }

    /// Whether `v` is defined by an op of `r` (or of a region nested in it).
    fn defined_in(r: &Region, v: ValueId) -> bool {
        r.ops
            .iter()
            .any(|o| o.results.contains(&v) || o.regions.iter().any(|s| Self::defined_in(s, v)))
    }

    /// Finds the loop-carried values to keep in shared memory: a region argument of a
    /// `for` whose one use is operand A or B of a `dot` on the matrix path (and whose
    /// final value is not used after the loop). The loop writes the initial and each
    /// yielded tile into the `dot`'s own arrays and waits at a barrier, so the value
    /// crosses the back edge in shared memory, not registers: a pipelined operand
    /// load ([`crate::pipeline`]) overlaps the `dot` before it, with no register
    /// copies.
    /// Places the kernel's `local_alloc` arrays (at any depth: one array per op) at
    /// the start of shared memory, each aligned as every shared array is.
    fn plan_locals(&mut self) {
        let mut allocs = Vec::new();
        self.f.walk(&mut |op| {
            if let OpKind::LocalAlloc { len } = op.kind {
                allocs.push((op as *const Op, len, op.results[0], op.span.clone()));
            }
        });
        for (op, len, result, span) in allocs {
            let elem = match self.f.ty(result).elem {
                Elem::Ptr { pointee, .. } => pointee,
                Elem::Scalar(s) => s,
            };
            let bytes = (len as u64 * elem.size_bytes() as u64).min(u32::MAX as u64) as u32;
            self.locals.insert(op, self.pipe_bytes);
            self.pipe_bytes = self.pipe_bytes.saturating_add(
                bytes
                    .checked_next_multiple_of(self.smem_align())
                    .unwrap_or(u32::MAX),
            );
            if self.smem_span.is_none() {
                self.smem_span = Some(span);
            }
        }
    }

    fn plan_staging(&mut self, r: &'a Region) {
        for op in &r.ops {
            for sub in &op.regions {
                self.plan_staging(sub);
            }
            if op.kind != OpKind::For {
                continue;
            }
            if self.allow_async && self.arch.has_cp_async() {
                self.plan_async(op, r);
            }
            let body = &op.regions[0];
            // Loop-invariant operands of the body's own dots (Q in attention): written
            // into the dot's arrays once, before the loop, instead of every iteration.
            for d in body.ops.iter().filter(|o| o.kind == OpKind::Dot) {
                let key = d as *const Op;
                if self.async_dots.contains_key(&key) {
                    continue;
                }
                let Some(bytes) = dot::matrix_staging_bytes(self, d) else {
                    continue;
                };
                for which in 0..2 {
                    let v = d.operands[which];
                    if body.args.contains(&v) || Self::defined_in(body, v) {
                        continue;
                    }
                    self.invariant.insert((key, which));
                    if !self.pipe_dots.contains_key(&key) {
                        self.pipe_dots.insert(key, self.pipe_bytes);
                        self.pipe_bytes += bytes.next_multiple_of(self.smem_align());
                    }
                }
            }
            for (j, &arg) in body.args.iter().enumerate().skip(1) {
                if self.staged.contains_key(&arg) {
                    continue;
                }
                let mut uses: Vec<(&'a Op, usize)> = Vec::new();
                remat::visit_uses(body, arg, &mut |o, i| uses.push((o, i)));
                let result_used = op.results.get(j - 1).is_some_and(|&res| {
                    let mut any = false;
                    remat::visit_uses(&self.f.body, res, &mut |_, _| any = true);
                    any
                });
                let [(d, i)] = uses[..] else {
                    continue;
                };
                if d.kind != OpKind::Dot || i >= 2 || result_used {
                    continue;
                }
                let Some(bytes) = dot::matrix_staging_bytes(self, d) else {
                    continue;
                };
                self.staged.insert(arg, (d, i));
                let key = d as *const Op;
                if !self.pipe_dots.contains_key(&key) {
                    self.pipe_dots.insert(key, self.pipe_bytes);
                    self.pipe_bytes += bytes.next_multiple_of(self.smem_align());
                }
            }
        }
    }

    /// The uses of `v` in `r` (and nested regions).
    fn uses_in(r: &'a Region, v: ValueId) -> Vec<(&'a Op, usize)> {
        let mut out = Vec::new();
        remat::visit_uses(r, v, &mut |o, i| out.push((o, i)));
        out
    }

    /// Plans asynchronous copies for the pipelined operands of the `dot`s in loop
    /// `for_op` (in region `parent`): both operands of a matrix-path `dot` must come
    /// as [`crate::pipeline`] leaves them, a chain of region arguments `t0 .. t(d-1)`
    /// (`t0` the `dot`'s operand, each yielded as the one before, the last fed by a
    /// load in the body) whose initial values are loads just before the loop, every
    /// load one [`Arch::cp_async`] can do. Then each load copies straight into a ring
    /// of `d + 1` copies of the `dot`'s arrays (iteration `i` in slot `i % (d + 1)`),
    /// the region arguments hold nothing, and the loop waits for iteration `i`'s
    /// group at its top (see [`Self::lower_for`]).
    fn plan_async(&mut self, for_op: &'a Op, parent: &'a Region) {
        let body = &for_op.regions[0];
        let Some(y) = body.ops.last() else {
            return;
        };
        let def_in = |r: &'a Region, v: ValueId| r.ops.iter().find(|o| o.results.contains(&v));
        // Per dot: per operand, (args of the chain, prologue loads, loop load).
        type Chain<'b> = (Vec<ValueId>, Vec<&'b Op>, &'b Op);
        let mut chains: Vec<(&'a Op, usize, Chain<'a>)> = Vec::new();
        for &a0 in body.args.iter().skip(1) {
            let [(d, which)] = Self::uses_in(body, a0)[..] else {
                continue;
            };
            if d.kind != OpKind::Dot || which >= 2 || dot::matrix_staging_bytes(self, d).is_none() {
                continue;
            }
            let dim = dot::array_row_dim(self, d, which);
            let arg_index = |a: ValueId| body.args.iter().position(|&x| x == a);
            let mut args = vec![a0];
            let mut cur = a0;
            let last = loop {
                let Some(k) = arg_index(cur) else { break None };
                let next = y.operands[k - 1];
                if let Some(k2) = arg_index(next) {
                    // `next` is yielded as `cur` (operand `k - 1`), and used nowhere else.
                    let uses = Self::uses_in(body, next);
                    let only_yield =
                        uses.len() == 1 && std::ptr::eq(uses[0].0, y) && uses[0].1 == k - 1;
                    if k2 == 0 || !only_yield || args.contains(&next) {
                        break None;
                    }
                    args.push(next);
                    cur = next;
                    continue;
                }
                break def_in(body, next).filter(|l| {
                    Self::uses_in(body, next).len() == 1 && self.ring_load_ok(l, d, which, dim)
                });
            };
            let Some(last) = last else {
                continue;
            };
            let mut pro = Vec::new();
            for &a in &args {
                let Some(k) = arg_index(a) else { break };
                let init = for_op.operands[3 + k - 1];
                match def_in(parent, init) {
                    Some(l)
                        if std::mem::discriminant(&l.kind)
                            == std::mem::discriminant(&last.kind)
                            && Self::uses_in(parent, init).len() == 1
                            && self.ring_load_ok(l, d, which, dim) =>
                    {
                        pro.push(l)
                    }
                    _ => break,
                }
            }
            if pro.len() == args.len() {
                chains.push((d, which, (args, pro, last)));
            }
        }
        for (d, which, (args, ..)) in &chains {
            if *which != 0 {
                continue;
            }
            let Some((_, _, (b_args, ..))) = chains
                .iter()
                .find(|(d2, w2, _)| std::ptr::eq(*d2, *d) && *w2 == 1)
            else {
                continue;
            };
            if b_args.len() != args.len() {
                continue;
            }
            let ahead = args.len() as u32;
            let slot_bytes = dot::matrix_staging_bytes(self, d)
                .unwrap_or(0)
                .next_multiple_of(self.smem_align());
            let overlap = if self.target().has_wgmma() {
                Self::chained_acc(body, d)
            } else {
                None
            };
            let slots = ahead + 1 + u32::from(overlap.is_some());
            let tma = chains
                .iter()
                .filter(|(d2, _, (_, _, last))| {
                    std::ptr::eq(*d2, *d) && matches!(last.kind, OpKind::DescLoad { .. })
                })
                .count() as u32;
            let bar_bytes = if tma > 0 { slots * tma::MBAR_BYTES } else { 0 };
            let bytes = slots * slot_bytes + bar_bytes;
            if self.pipe_bytes + bytes > self.target().shared_memory_limit() {
                continue;
            }
            self.async_dots.insert(
                *d as *const Op,
                AsyncDot {
                    offset: self.pipe_bytes,
                    slot_bytes,
                    slots,
                    ahead,
                    overlap,
                    tma,
                    bars: self.pipe_bytes + slots * slot_bytes,
                },
            );
            // Whatever follows (arrays, scratch) starts aligned as arrays must.
            self.pipe_bytes += bytes.next_multiple_of(self.smem_align());
            self.pipe_dots
                .insert(*d as *const Op, self.async_dots[&(*d as *const Op)].offset);
            for (d2, w2, (cargs, pro, last)) in &chains {
                if !std::ptr::eq(*d2, *d) {
                    continue;
                }
                for &a in cargs {
                    self.async_args.insert(a);
                }
                self.staged.insert(cargs[0], (d2, *w2));
                for (s, l) in pro.iter().enumerate() {
                    self.async_loads
                        .insert(l.results[0], (d2, *w2, AsyncSlot::Fixed(s as u32)));
                }
                self.async_loads
                    .insert(last.results[0], (d2, *w2, AsyncSlot::Next));
            }
        }
    }

    /// Whether load `l` (a `load` by `cp.async`, or a `desc_load` by TMA) can copy
    /// operand `which` of `dot` `d` into its ring.
    fn ring_load_ok(&self, l: &Op, d: &Op, which: usize, dim: usize) -> bool {
        match l.kind {
            OpKind::Load { .. } => memory::async_copy_ok(self, l, dim),
            OpKind::DescLoad { .. } => tma::ring_ok(self, l, d, which),
            _ => false,
        }
    }

    /// The index (in `body`'s arguments) of the accumulator that `dot` `d` only
    /// chains: `d`'s C is that argument, used nowhere else in the body, and `d`'s result
    /// is yielded for it and used nowhere else.
    fn chained_acc(body: &'a Region, d: &Op) -> Option<usize> {
        let j = body.args.iter().position(|&a| a == d.operands[2])?;
        let y = body.ops.last()?;
        if j == 0 || y.kind != OpKind::Yield || y.operands.get(j - 1) != Some(&d.results[0]) {
            return None;
        }
        let arg_uses = Self::uses_in(body, d.operands[2]);
        let res_uses = Self::uses_in(body, d.results[0]);
        let only = |u: &[(&Op, usize)], op: &Op, i: usize| {
            u.len() == 1 && std::ptr::eq(u[0].0, op) && u[0].1 == i
        };
        (only(&arg_uses, d, 2) && only(&res_uses, y, j - 1)).then_some(j)
    }

    /// The asynchronous-copy ring of `dot` `op`, if it has one.
    pub(crate) fn async_dot(&self, op: &Op) -> Option<AsyncDot> {
        self.async_dots.get(&(op as *const Op)).copied()
    }

    /// The array base of slot `slot` of `op`'s ring (the read slot for `None`... see
    /// [`AsyncSlot`]): `Fixed` slots are constant, `Next` and the read slot come from
    /// the loop being lowered.
    pub(crate) fn async_base(
        &self,
        op: &Op,
        slot: Option<AsyncSlot>,
    ) -> LResult<PointerValue<'ctx>> {
        let a = self
            .async_dot(op)
            .ok_or_else(|| LowerError::Llvm("no ring for this dot".into()))?;
        let base = self.smem_at(a.offset);
        let off = match slot {
            Some(AsyncSlot::Fixed(s)) => return Ok(self.smem_at(a.offset + s * a.slot_bytes)),
            Some(AsyncSlot::Next) => self
                .async_slots
                .borrow()
                .get(&(op as *const Op))
                .map(|s| s.1),
            None => self
                .async_slots
                .borrow()
                .get(&(op as *const Op))
                .map(|s| s.0),
        }
        .ok_or_else(|| LowerError::Llvm("a ring slot outside its loop".into()))?;
        // SAFETY: a byte offset inside the ring, which `finish_shared` sizes.
        Ok(unsafe {
            self.cx
                .b
                .build_in_bounds_gep(self.cx.ctx.i8_type(), base, &[off], "")?
        })
    }

    /// Counts an asynchronous copy of operand `which` for `dot` `op` into `slot`;
    /// commits the group once both operands' copies are issued.
    pub(crate) fn async_issued(&self, op: &Op, slot: AsyncSlot) -> LResult<()> {
        let key = (
            op as *const Op,
            match slot {
                AsyncSlot::Fixed(s) => Some(s),
                AsyncSlot::Next => None,
            },
        );
        let n = {
            let mut m = self.async_issued.borrow_mut();
            let n = m.entry(key).or_insert(0);
            *n += 1;
            *n
        };
        // (A ring whose operands both come by TMA has no cp.async group.)
        if n == 2 && self.async_dot(op).is_some_and(|r| r.tma < 2) {
            self.arch.cp_async_commit(&self.cx)?;
        }
        Ok(())
    }

    /// A new site id for a hook emitted for the current op (with the provenance of
    /// the pointer it accesses, if it is a memory access: [`Site::prov`]).
    pub fn new_site(&self, what: &'static str) -> u32 {
        let (span, op) = self.cur_op.borrow().clone();
        let prov = self.cur_prov.borrow().clone();
        let mut sites = self.sites.borrow_mut();
        sites.push(Site {
            span,
            op,
            what,
            prov,
        });
        sites.len() as u32 - 1
    }

    /// Loads `ty` from shared memory at `p` (telling the arch, see [`Arch::note_shared`]).
    pub fn smem_load(
        &self,
        ty: BasicTypeEnum<'ctx>,
        p: PointerValue<'ctx>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let site = self.new_site("shared load");
        self.arch
            .note_shared(&self.cx, p, type_size(ty), false, site)?;
        Ok(self.cx.b.build_load(ty, p, "")?)
    }

    /// Stores `v` to shared memory at `p` (telling the arch, see [`Arch::note_shared`]).
    pub fn smem_store(
        &self,
        p: PointerValue<'ctx>,
        v: BasicValueEnum<'ctx>,
    ) -> LResult<inkwell::values::InstructionValue<'ctx>> {
        let site = self.new_site("shared store");
        self.arch
            .note_shared(&self.cx, p, type_size(v.get_type()), true, site)?;
        Ok(self.cx.b.build_store(p, v)?)
    }

    /// The pointer through which to access `bytes` bytes at `p`, a pointer of the IR
    /// address space `space` ([`Arch::check_global`] / [`Arch::note_shared`]).
    pub fn access_ptr(
        &self,
        space: AddrSpace,
        p: PointerValue<'ctx>,
        bytes: u32,
        is_write: bool,
        what: &'static str,
    ) -> LResult<PointerValue<'ctx>> {
        let site = self.new_site(what);
        match space {
            AddrSpace::Global => self.arch.check_global(&self.cx, p, bytes, site),
            AddrSpace::Shared => {
                self.arch.note_shared(&self.cx, p, bytes, is_write, site)?;
                Ok(p)
            }
        }
    }

    // ----- helpers -------------------------------------------------------------

    /// The default layout of a tile: 4 consecutive elements per thread, fewer where
    /// the tile has enough elements for every thread but not 4 each (a 256-element
    /// row on 128 threads: 2 each, where 4 would leave half the warps replicating the
    /// other half's loads). Tiles smaller than the block replicate whatever the width.
    pub fn canonical(&self, shape: &[u32]) -> Layout {
        if shape.is_empty() {
            return Layout::uniform(shape, self.ws, self.nw);
        }
        let threads = self.ws * self.nw;
        let numel = crate::layout::numel(shape);
        let mut vec = 4;
        while numel >= threads && vec > 1 && numel < vec * threads {
            vec /= 2;
        }
        Layout::blocked(shape, vec, self.ws, self.nw)
    }

    pub fn scalar_tile(&self, elem: Elem, v: BasicValueEnum<'ctx>) -> Tile<'ctx> {
        Tile {
            elem,
            layout: self.canonical(&[]),
            regs: vec![v],
            uniform: true,
        }
    }

    pub fn uniform_tile(&self, elem: Elem, layout: Layout, v: BasicValueEnum<'ctx>) -> Tile<'ctx> {
        Tile {
            elem,
            regs: vec![v; layout.num_regs()],
            layout,
            uniform: true,
        }
    }

    pub fn val(&self, v: ValueId) -> LResult<Tile<'ctx>> {
        self.vals
            .get(&v)
            .cloned()
            .ok_or_else(|| LowerError::Llvm(format!("value {v} used before definition")))
    }

    pub fn ty(&self, e: Elem) -> BasicTypeEnum<'ctx> {
        llvm_type(self.cx.ctx, self.target(), e)
    }

    /// The in-memory type of an element (`i1` is a byte, pointers are `i64` in scratch).
    pub fn mem_ty(&self, e: Elem) -> BasicTypeEnum<'ctx> {
        match e {
            Elem::Scalar(ScalarType::I1) => self.cx.ctx.i8_type().into(),
            Elem::Ptr { .. } => self.cx.ctx.i64_type().into(),
            e => self.ty(e),
        }
    }

    pub fn store_to_mem(&self, e: Elem, v: BasicValueEnum<'ctx>) -> LResult<BasicValueEnum<'ctx>> {
        Ok(match e {
            Elem::Scalar(ScalarType::I1) => self
                .cx
                .b
                .build_int_z_extend(v.into_int_value(), self.cx.ctx.i8_type(), "")?
                .into(),
            Elem::Ptr { .. } => self
                .cx
                .b
                .build_ptr_to_int(v.into_pointer_value(), self.cx.ctx.i64_type(), "")?
                .into(),
            _ => v,
        })
    }

    pub fn reg_from_mem(&self, e: Elem, v: BasicValueEnum<'ctx>) -> LResult<BasicValueEnum<'ctx>> {
        Ok(match e {
            Elem::Scalar(ScalarType::I1) => self
                .cx
                .b
                .build_int_compare(
                    inkwell::IntPredicate::NE,
                    v.into_int_value(),
                    self.cx.ctx.i8_type().const_zero(),
                    "",
                )?
                .into(),
            Elem::Ptr { .. } => self
                .cx
                .b
                .build_int_to_ptr(v.into_int_value(), self.ty(e).into_pointer_type(), "")?
                .into(),
            _ => v,
        })
    }

    /// The thread-dependent part of a layout's element index (`i32`).
    pub fn thread_offset(&self, l: &Layout) -> LResult<IntValue<'ctx>> {
        let b = &self.cx.b;
        let mut acc = self.cx.i32(0);
        for (src, bases) in [(self.lane, &l.lane), (self.warp, &l.warp)] {
            for (i, &base) in bases.iter().enumerate() {
                if base == 0 {
                    continue;
                }
                let bit = b.build_and(
                    b.build_right_shift(src, self.cx.i32(i as i64), false, "")?,
                    self.cx.i32(1),
                    "",
                )?;
                let term = b.build_int_mul(bit, self.cx.i32(base as i64), "")?;
                acc = b.build_xor(acc, term, "")?;
            }
        }
        Ok(acc)
    }

    /// The element index of every register of a layout (`i32`).
    pub fn elem_indices(&self, l: &Layout) -> LResult<Vec<IntValue<'ctx>>> {
        let thr = self.thread_offset(l)?;
        let mask = l.thread_mask();
        (0..l.num_regs() as u32)
            .map(|r| {
                let off = l.reg_offset(r);
                let c = self.cx.i32(off as i64);
                Ok(if off == 0 {
                    thr
                } else if off & mask == 0 {
                    self.cx.b.build_int_nuw_add(thr, c, "")?
                } else {
                    self.cx.b.build_xor(thr, c, "")?
                })
            })
            .collect()
    }

    /// `i1` that is true in exactly one thread of each set of threads holding the
    /// same elements (the lane and warp bits with zero bases are 0), or `None` when
    /// no threads replicate.
    pub fn owner_predicate(&self, l: &Layout) -> LResult<Option<IntValue<'ctx>>> {
        let zero_bits = |bases: &[u32]| {
            bases
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == 0)
                .fold(0u32, |a, (i, _)| a | 1 << i)
        };
        let (zl, zw) = (zero_bits(&l.lane), zero_bits(&l.warp));
        if zl == 0 && zw == 0 {
            return Ok(None);
        }
        let b = &self.cx.b;
        let x = b.build_or(
            b.build_and(self.lane, self.cx.i32(zl as i64), "")?,
            b.build_left_shift(
                b.build_and(self.warp, self.cx.i32(zw as i64), "")?,
                self.cx.i32(8),
                "",
            )?,
            "",
        )?;
        Ok(Some(b.build_int_compare(
            inkwell::IntPredicate::EQ,
            x,
            self.cx.i32(0),
            "owner",
        )?))
    }

    pub fn smem_ptr(
        &self,
        base: PointerValue<'ctx>,
        ty: BasicTypeEnum<'ctx>,
        idx: IntValue<'ctx>,
    ) -> LResult<PointerValue<'ctx>> {
        Ok(unsafe { self.cx.b.build_in_bounds_gep(ty, base, &[idx], "")? })
    }

    pub fn barrier(&self) -> LResult<()> {
        let site = self.new_site("barrier");
        self.arch.barrier(&self.cx, site)
    }

    /// `t` in layout `to` without moving data between threads (the same layout, a
    /// uniform value, or a register renaming where every thread already holds what
    /// it needs), if possible.
    pub fn convert_cheap(&self, t: &Tile<'ctx>, to: &Layout) -> Option<Tile<'ctx>> {
        if t.layout == *to {
            return Some(t.clone());
        }
        if t.uniform {
            return Some(self.uniform_tile(t.elem, to.clone(), t.regs[0]));
        }
        if t.layout.lane == to.lane && t.layout.warp == to.warp {
            let mut by_off = HashMap::new();
            for r in 0..t.layout.num_regs() as u32 {
                by_off.entry(t.layout.reg_offset(r)).or_insert(r);
            }
            let regs: Option<Vec<_>> = (0..to.num_regs() as u32)
                .map(|r| by_off.get(&to.reg_offset(r)).map(|&s| t.regs[s as usize]))
                .collect();
            if let Some(regs) = regs {
                return Some(Tile {
                    elem: t.elem,
                    layout: to.clone(),
                    regs,
                    uniform: false,
                });
            }
        }
        None
    }

    /// `t` in layout `to` (same shape); through shared memory unless
    /// [`Self::convert_cheap`] applies. Prefer [`Self::relayout`] where the value's id
    /// is known: it recomputes cheap values instead.
    pub fn convert(&mut self, t: &Tile<'ctx>, to: &Layout, span: &Span) -> LResult<Tile<'ctx>> {
        if let Some(r) = self.convert_cheap(t, to) {
            if r.layout != t.layout && !t.uniform {
                self.note(|| format!("convert by register renaming: {} -> {}", t.layout, to));
            }
            return Ok(r);
        }
        if let Some(r) = self.convert_by_shuffles(t, to)? {
            self.note(|| format!("convert by warp shuffles: {} -> {}", t.layout, to));
            return Ok(r);
        }
        let mt = self.mem_ty(t.elem);
        let size = type_bytes(t.elem);
        let sw = convert::conversion_swizzle(&t.layout, to, size, self.ws);
        self.note(|| {
            format!(
                "convert through shared memory (swizzle {sw:?}): {} -> {}",
                t.layout, to
            )
        });
        let base = self.scratch(t.layout.numel() * size, span);
        let place = |idx: IntValue<'ctx>| -> LResult<IntValue<'ctx>> {
            let Some((s, v, w)) = sw else {
                return Ok(idx);
            };
            let b = &self.cx.b;
            let hi = b.build_and(
                b.build_right_shift(idx, self.cx.i32(s as i64), false, "")?,
                self.cx.i32((1 << w) - 1),
                "",
            )?;
            let x = b.build_left_shift(hi, self.cx.i32(v as i64), "")?;
            Ok(b.build_xor(idx, x, "")?)
        };
        let src_idx = self.elem_indices(&t.layout)?;
        for (r, idx) in src_idx.iter().enumerate() {
            if is_dup_reg(&t.layout, r) {
                continue;
            }
            let p = self.smem_ptr(base, mt, place(*idx)?)?;
            let v = self.store_to_mem(t.elem, t.regs[r])?;
            self.smem_store(p, v)?;
        }
        self.barrier()?;
        let dst_idx = self.elem_indices(to)?;
        let mut regs = Vec::with_capacity(dst_idx.len());
        for idx in dst_idx {
            let p = self.smem_ptr(base, mt, place(idx)?)?;
            let v = self.smem_load(mt, p)?;
            regs.push(self.reg_from_mem(t.elem, v)?);
        }
        self.barrier()?;
        Ok(Tile {
            elem: t.elem,
            layout: to.clone(),
            regs,
            uniform: false,
        })
    }

    // ----- layout hints --------------------------------------------------------

    /// Loop-carried values fed by a `dot` get the `dot`'s result layout; so do those
    /// fed by a nested loop's carried value that has a hint (a loop over the sources
    /// of a sequence-parallel attention, around the loop over each one's keys), which
    /// therefore cross both back edges with no conversion. Inner loops first.
    fn compute_hints(&mut self, r: &Region) {
        for op in &r.ops {
            for sub in &op.regions {
                self.compute_hints(sub);
            }
            if op.kind == OpKind::For {
                let body = &op.regions[0];
                if let Some(y) = body.ops.last() {
                    for (i, &yv) in y.operands.iter().enumerate() {
                        let def = body.ops.iter().find(|o| o.results.contains(&yv));
                        let Some(&arg) = body.args.get(i + 1) else {
                            continue;
                        };
                        match def {
                            Some(d) if d.kind == OpKind::Dot => {
                                if let Some(l) = dot::mma_layout(self, d) {
                                    self.hints.insert(arg, l);
                                }
                            }
                            Some(d) if d.kind == OpKind::For => {
                                // Result `j` of the inner loop is its body's argument
                                // `j + 1`.
                                let j = d.results.iter().position(|&x| x == yv);
                                let inner = j.and_then(|j| d.regions[0].args.get(j + 1));
                                if let Some(&ia) = inner
                                    && let Some(l) = self.hints.get(&ia).cloned()
                                {
                                    self.hints.insert(arg, l);
                                    if let Some(p) = self.parents.get(&ia).cloned() {
                                        self.parents.insert(arg, p);
                                    }
                                }
                            }
                            _ => {
                                if let Some((l, parent)) = self.reduce_hint(body, yv, 0) {
                                    self.hints.insert(arg, l);
                                    self.parents.insert(arg, parent);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The layout for a loop-carried statistic of a `dot` result (FlashAttention's
    /// running row max and sum): a value of `body` computed elementwise from a
    /// reduction along `axis` of a tile that the body computes elementwise from a
    /// `dot` gets that `dot`'s accumulator layout sliced along `axis`, the layout the
    /// reduction produces, so the statistic crosses the back edge and meets the
    /// reduction with no conversion.
    /// Returns the sliced layout and its parent (the accumulator layout).
    fn reduce_hint(&self, body: &Region, v: ValueId, depth: u32) -> Option<(Layout, Layout)> {
        if depth > 8 {
            return None;
        }
        let d = body.ops.iter().find(|o| o.results.contains(&v))?;
        match &d.kind {
            OpKind::Reduce { axis, .. } => {
                let root = Self::dot_root(body, d.operands[0], 0)?;
                let parent = dot::mma_layout(self, root)?;
                Some((parent.sliced(*axis as usize), parent))
            }
            OpKind::Binary(_) | OpKind::Unary(_) | OpKind::Fma | OpKind::Select => d
                .operands
                .iter()
                .find_map(|&o| self.reduce_hint(body, o, depth + 1)),
            _ => None,
        }
    }

    /// The `dot` of `body` that `v` is computed from elementwise (same shape), if any.
    fn dot_root(body: &Region, v: ValueId, depth: u32) -> Option<&Op> {
        if depth > 8 {
            return None;
        }
        let d = body.ops.iter().find(|o| o.results.contains(&v))?;
        match &d.kind {
            OpKind::Dot => Some(d),
            OpKind::Binary(_) | OpKind::Unary(_) | OpKind::Fma | OpKind::Select | OpKind::Cast => d
                .operands
                .iter()
                .find_map(|&o| Self::dot_root(body, o, depth + 1)),
            _ => None,
        }
    }

    // ----- regions and ops -----------------------------------------------------

    /// Lowers a region's ops; returns the operands of its terminator (if any).
    fn lower_region(&mut self, r: &Region) -> LResult<Vec<Tile<'ctx>>> {
        for op in &r.ops {
            if op.kind.is_terminator() {
                return op.operands.iter().map(|&v| self.val(v)).collect();
            }
            self.lower_op(op)?;
        }
        Ok(Vec::new())
    }

    fn set(&mut self, v: ValueId, t: Tile<'ctx>) {
        self.vals.insert(v, t);
    }

    fn result_shape(&self, op: &Op) -> Vec<u32> {
        self.f.ty(op.results[0]).shape.clone()
    }

    /// Makes `op` the op that new sites belong to (again, after its regions).
    fn restore_op(&self, op: &Op) {
        *self.cur_op.borrow_mut() = (op.span.clone(), op.kind.mnemonic());
        self.cur_op_ptr.set(op as *const Op);
        *self.cur_prov.borrow_mut() =
            prov::accessed_pointer(op).and_then(|p| self.prov.get(p.index()).cloned().flatten());
    }

    /// Records a layout note for the op being lowered (with [`lower_with_layouts`]).
    pub fn note(&self, text: impl FnOnce() -> String) {
        if let Some(n) = &self.notes {
            n.borrow_mut()
                .entry(self.cur_op_ptr.get())
                .or_default()
                .push(text());
        }
    }

    fn lower_op(&mut self, op: &Op) -> LResult<()> {
        let span = &op.span;
        self.restore_op(op);
        match &op.kind {
            OpKind::ProgramId { axis } => {
                let v = self.arch.program_id(&self.cx, *axis)?;
                let t = self.scalar_tile(Elem::Scalar(ScalarType::I32), v.into());
                self.set(op.results[0], t);
            }
            OpKind::NumPrograms { axis } => {
                let v = self.arch.num_programs(&self.cx, *axis, self.nw * self.ws)?;
                let t = self.scalar_tile(Elem::Scalar(ScalarType::I32), v.into());
                self.set(op.results[0], t);
            }
            OpKind::Const(c) => {
                let ty = self.f.ty(op.results[0]).clone();
                let v = self.constant(ty.elem, *c)?;
                let t = self.uniform_tile(ty.elem, self.canonical(&ty.shape), v);
                self.set(op.results[0], t);
            }
            OpKind::LocalAlloc { .. } => {
                let off = *self
                    .locals
                    .get(&(op as *const Op))
                    .ok_or_else(|| LowerError::Llvm("local_alloc without an array".into()))?;
                let elem = self.f.ty(op.results[0]).elem;
                let t = self.scalar_tile(elem, self.smem_at(off).into());
                self.set(op.results[0], t);
            }
            OpKind::Arange { start, .. } => {
                let shape = self.result_shape(op);
                let l = self.canonical(&shape);
                let idx = self.elem_indices(&l)?;
                let s = self.cx.i32(*start);
                let regs = idx
                    .into_iter()
                    .map(|i| Ok(self.cx.b.build_int_add(i, s, "")?.into()))
                    .collect::<LResult<Vec<_>>>()?;
                let t = Tile {
                    elem: Elem::Scalar(ScalarType::I32),
                    layout: l,
                    regs,
                    uniform: false,
                };
                self.set(op.results[0], t);
            }
            OpKind::Splat => {
                let src = self.val(op.operands[0])?;
                let l = self.canonical(&self.result_shape(op));
                let t = self.uniform_tile(src.elem, l, src.regs[0]);
                self.set(op.results[0], t);
            }
            OpKind::ExpandDims { .. } | OpKind::Reshape | OpKind::Hint { .. } => {
                let src = self.val(op.operands[0])?;
                let shape = self.result_shape(op);
                let t = Tile {
                    layout: src.layout.with_shape(&shape),
                    ..src
                };
                if let Some(p) = self.parents.get(&op.operands[0]).cloned() {
                    self.parents.insert(op.results[0], p);
                }
                self.set(op.results[0], t);
            }
            OpKind::Broadcast | OpKind::Permute { .. } => {
                let src = self.val(op.operands[0])?;
                let shape = self.result_shape(op);
                let d = match self.parents.get(&op.operands[0]) {
                    Some(p) if op.kind == OpKind::Broadcast && p.shape == shape => p.clone(),
                    _ => self.canonical(&shape),
                };
                let images = match &op.kind {
                    OpKind::Permute { order } => permute_bit_images(&src.layout.shape, order),
                    _ => broadcast_bit_images(&src.layout.shape, &shape),
                };
                let p = d.compose_bits(&src.layout.shape, &images);
                let g = self.relayout(op.operands[0], &src, &p, span)?;
                let t = Tile { layout: d, ..g };
                self.set(op.results[0], t);
            }
            OpKind::Binary(_)
            | OpKind::Unary(_)
            | OpKind::Fma
            | OpKind::Cmp(_)
            | OpKind::Select
            | OpKind::Cast
            | OpKind::Bitcast => {
                let t = elementwise::lower(self, op)?;
                // A value computed elementwise from a reduction, in its layout, keeps
                // the reduction's parent (a running maximum broadcast back is free).
                let parent = op.operands.iter().find_map(|o| {
                    let p = self.parents.get(o)?;
                    (self.vals.get(o)?.layout == t.layout).then(|| p.clone())
                });
                if let Some(p) = parent {
                    self.parents.insert(op.results[0], p);
                }
                self.set(op.results[0], t);
            }
            OpKind::AddPtr => {
                let t = memory::lower_addptr(self, op)?;
                self.set(op.results[0], t);
            }
            OpKind::Load { .. } => {
                let t = memory::lower_load(self, op)?;
                self.set(op.results[0], t);
            }
            OpKind::Store { .. } => memory::lower_store(self, op)?,
            OpKind::DescLoad { .. } => {
                let t = tma::lower_desc_load(self, op)?;
                self.set(op.results[0], t);
            }
            OpKind::DescStore { .. } => tma::lower_desc_store(self, op)?,
            OpKind::AtomicRmw { .. } | OpKind::AtomicCas { .. } => {
                let t = memory::lower_atomic(self, op)?;
                self.set(op.results[0], t);
            }
            OpKind::Dot => {
                let t = dot::lower(self, op)?;
                self.set(op.results[0], t);
            }
            OpKind::Reduce { axis, op: rop } => {
                let t = reduce::lower_reduce(self, op, *axis as usize, *rop)?;
                let from = self.val(op.operands[0])?.layout;
                if !from.is_thread_uniform() {
                    self.parents.insert(op.results[0], from);
                }
                self.set(op.results[0], t);
            }
            OpKind::Scan {
                axis,
                op: rop,
                reverse,
            } => {
                let t = reduce::lower_scan(self, op, *axis as usize, *rop, *reverse)?;
                self.set(op.results[0], t);
            }
            OpKind::Barrier => self.barrier()?,
            OpKind::Print { .. } | OpKind::Assert { .. } => {
                return unsupported(
                    span,
                    "`print`/`assert` must be lowered first (tessera_ir::debug::lower_debug_ops)",
                );
            }
            OpKind::For => self.lower_for(op)?,
            OpKind::If => self.lower_if(op)?,
            OpKind::While => self.lower_while(op)?,
            OpKind::Yield | OpKind::Condition => {
                return unsupported(span, "a terminator outside its region's end");
            }
            OpKind::Rank
            | OpKind::WorldSize
            | OpKind::RemotePtr
            | OpKind::Signal { .. }
            | OpKind::WaitUntil { .. }
            | OpKind::Fence { .. }
            | OpKind::BarrierAll => {
                let site = self.comm_sites;
                self.comm_sites += 1;
                self.lower_comm(op, site)?;
            }
        }
        if self.notes.is_some() {
            self.restore_op(op);
            for &r in &op.results {
                if let Some(t) = self.vals.get(&r) {
                    let what = if t.regs.is_empty() {
                        "in shared memory".to_string()
                    } else if t.uniform {
                        format!("uniform {}", t.layout)
                    } else {
                        t.layout.to_string()
                    };
                    self.note(|| format!("layout {what}"));
                }
            }
        }
        Ok(())
    }

    pub fn constant(&self, e: Elem, c: ConstValue) -> LResult<BasicValueEnum<'ctx>> {
        let ty = self.ty(e);
        Ok(match (e, c) {
            (Elem::Scalar(ScalarType::I1), ConstValue::Bool(b)) => {
                self.cx.ctx.bool_type().const_int(b as u64, false).into()
            }
            (Elem::Scalar(s), ConstValue::Int(i)) if s.is_int() => ty
                .into_int_type()
                .const_int(i as u64, s.is_signed_int())
                .into(),
            (Elem::Scalar(s), ConstValue::Float(x)) if s.is_float() => {
                ty.into_float_type().const_float(x).into()
            }
            _ => return Err(LowerError::Llvm(format!("constant {c:?} of type {e}"))),
        })
    }

    fn phis(&self, t: &Tile<'ctx>) -> LResult<Vec<inkwell::values::PhiValue<'ctx>>> {
        let ty = self.ty(t.elem);
        t.regs
            .iter()
            .map(|_| Ok(self.cx.b.build_phi(ty, "")?))
            .collect()
    }

    fn phi_tile(&self, t: &Tile<'ctx>, phis: &[inkwell::values::PhiValue<'ctx>]) -> Tile<'ctx> {
        Tile {
            elem: t.elem,
            layout: t.layout.clone(),
            regs: phis.iter().map(|p| p.as_basic_value()).collect(),
            uniform: false,
        }
    }

    fn lower_for(&mut self, op: &Op) -> LResult<()> {
        let span = &op.span;
        let body = &op.regions[0];
        let lb = self.val(op.operands[0])?.regs[0].into_int_value();
        let ub = self.val(op.operands[1])?.regs[0].into_int_value();
        let step = self.val(op.operands[2])?.regs[0].into_int_value();
        let mut inits = Vec::new();
        let mut staged_any = false;
        // The `dot`s of this loop fed by asynchronous copies (`plan_async`).
        let mut rings: Vec<(&Op, AsyncDot)> = Vec::new();
        for a in &body.args {
            if let Some(&(d, _)) = self.staged.get(a)
                && self.async_args.contains(a)
                && let Some(r) = self.async_dot(d)
                && !rings.iter().any(|(x, _)| std::ptr::eq(*x, d))
            {
                rings.push((d, r));
            }
        }
        for (i, &v) in op.operands[3..].iter().enumerate() {
            let t = self.val(v)?;
            if body
                .args
                .get(i + 1)
                .is_some_and(|a| self.async_args.contains(a))
            {
                // In the ring already (the prologue's copies).
                inits.push(t);
                continue;
            }
            if let Some(t) =
                self.stage_carried(body.args.get(i + 1), &t, "the first iteration's")?
            {
                staged_any = true;
                inits.push(t);
                continue;
            }
            let t = match body
                .args
                .get(i + 1)
                .and_then(|a| self.hints.get(a))
                .cloned()
            {
                Some(h) if h.shape == t.layout.shape => self.convert(&t, &h, span)?,
                _ => t,
            };
            inits.push(t);
        }
        for d in body.ops.iter().filter(|o| o.kind == OpKind::Dot) {
            for which in 0..2 {
                if !self.invariant.contains(&(d as *const Op, which)) {
                    continue;
                }
                let base = self.pipe_base(d).ok_or_else(|| {
                    LowerError::Llvm("an invariant operand without arrays".into())
                })?;
                let t = self.val(d.operands[which])?;
                self.note(|| {
                    format!(
                        "the loop-invariant operand {} of the loop's dot written into the dot's shared arrays",
                        ["A", "B"][which]
                    )
                });
                dot::stage_operand(self, d, which, &t, base)?;
                staged_any = true;
            }
        }
        if staged_any {
            self.barrier()?;
        }
        let pre = self.cx.cur_block();
        let header = self.cx.ctx.append_basic_block(self.kernel, "for.header");
        let bb_body = self.cx.ctx.append_basic_block(self.kernel, "for.body");
        let exit = self.cx.ctx.append_basic_block(self.kernel, "for.exit");
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(header);
        let iv = self.cx.b.build_phi(lb.get_type(), "iv")?;
        iv.add_incoming(&[(&lb, pre)]);
        let mut phis = Vec::new();
        for t in &inits {
            let ps = self.phis(t)?;
            for (p, r) in ps.iter().zip(&t.regs) {
                p.add_incoming(&[(r as &dyn BasicValue, pre)]);
            }
            phis.push(ps);
        }
        // Per ring: the byte offsets of the slot read this iteration and of the slot
        // its copies for iteration `i + ahead` fill.
        let i32t = self.cx.ctx.i32_type();
        let mut ring_phis = Vec::new();
        for (d, r) in &rings {
            let (rd, wr, ph) = (
                self.cx.b.build_phi(i32t, "ring.read")?,
                self.cx.b.build_phi(i32t, "ring.fill")?,
                // The mbarrier phase parity of the slot read (TMA rings).
                self.cx.b.build_phi(i32t, "ring.phase")?,
            );
            rd.add_incoming(&[(&self.cx.i32(0), pre)]);
            wr.add_incoming(&[(&self.cx.i32((r.ahead * r.slot_bytes) as i64), pre)]);
            ph.add_incoming(&[(&self.cx.i32(0), pre)]);
            self.async_slots.borrow_mut().insert(
                *d as *const Op,
                (
                    rd.as_basic_value().into_int_value(),
                    wr.as_basic_value().into_int_value(),
                ),
            );
            ring_phis.push((rd, wr, ph, *r));
        }
        let ivv = iv.as_basic_value().into_int_value();
        let c = self
            .cx
            .b
            .build_int_compare(inkwell::IntPredicate::SLT, ivv, ub, "")?;
        self.restore_op(op);
        let site = self.new_site("for");
        let c = self.arch.loop_continue(&self.cx, c, site)?;
        self.cx.b.build_conditional_branch(c, bb_body, exit)?;
        self.cx.b.position_at_end(bb_body);
        if let Some(ahead) = rings.iter().map(|(_, r)| r.ahead).min() {
            // This iteration's copies have landed (at most the `ahead - 1` newer groups
            // are pending, and the TMA copies' mbarrier phase is complete) and are
            // visible to the block; every thread is done with the slot the loop's
            // copies refill next (read in the previous iteration).
            if rings.iter().any(|(_, r)| r.tma < 2) {
                self.note(|| {
                    format!(
                        "cp.async.wait_group {} and a barrier at the top of each iteration",
                        ahead - 1
                    )
                });
                self.arch.cp_async_wait(&self.cx, ahead - 1)?;
            }
            for (d, rd, _, ph, r) in ring_phis
                .iter()
                .zip(&rings)
                .map(|((rd, wr, ph, r), (d, _))| (d, rd, wr, ph, r))
            {
                if r.tma == 0 {
                    continue;
                }
                self.note(|| {
                    "TMA ring: a wait for the read slot's mbarrier phase and a barrier at the top of each iteration".to_string()
                });
                let bar = self.bar_at(r, rd.as_basic_value().into_int_value())?;
                let site = self.new_site("mbarrier.try_wait");
                let _ = d;
                self.arch.mbarrier_wait(
                    &self.cx,
                    bar,
                    ph.as_basic_value().into_int_value(),
                    site,
                )?;
            }
            self.barrier()?;
        }
        let ive = self.f.ty(op.operands[0]).elem;
        if let Some(&a) = body.args.first() {
            let t = self.scalar_tile(ive, ivv.into());
            self.set(a, t);
        }
        let carried: Vec<Tile> = inits
            .iter()
            .zip(&phis)
            .map(|(t, p)| self.phi_tile(t, p))
            .collect();
        for (a, t) in body.args.iter().skip(1).zip(&carried) {
            self.set(*a, t.clone());
        }
        let ys = self.lower_region(body)?;
        self.restore_op(op);
        let mut ys_conv = Vec::new();
        for (j, (y, t)) in ys.iter().zip(&inits).enumerate() {
            if body
                .args
                .get(j + 1)
                .is_some_and(|a| self.async_args.contains(a))
            {
                ys_conv.push(y.clone());
                continue;
            }
            // The `dot` that read the staged tile ended at a barrier: overwrite it.
            if let Some(s) = self.stage_carried(body.args.get(j + 1), y, "the next iteration's")? {
                ys_conv.push(s);
                continue;
            }
            ys_conv.push(self.convert(y, &t.layout, span)?);
        }
        if staged_any {
            self.barrier()?;
        }
        let next = self.cx.b.build_int_add(ivv, step, "iv.next")?;
        let mut ring_next = Vec::new();
        for (rd, wr, ph, r) in &ring_phis {
            let size = self.cx.i32((r.slots * r.slot_bytes) as i64);
            let adv =
                |p: &inkwell::values::PhiValue<'ctx>| -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
                    let b = &self.cx.b;
                    let n = b.build_int_add(
                        p.as_basic_value().into_int_value(),
                        self.cx.i32(r.slot_bytes as i64),
                        "",
                    )?;
                    let wrap = b.build_int_compare(inkwell::IntPredicate::EQ, n, size, "")?;
                    Ok((
                        b.build_select(wrap, self.cx.i32(0), n, "")?
                            .into_int_value(),
                        wrap,
                    ))
                };
            let ((nr, wrap), (nw, _)) = (adv(rd)?, adv(wr)?);
            // The read slot's parity flips each time the ring wraps around.
            let b = &self.cx.b;
            let flip = b.build_xor(ph.as_basic_value().into_int_value(), self.cx.i32(1), "")?;
            let np = b
                .build_select(wrap, flip, ph.as_basic_value().into_int_value(), "")?
                .into_int_value();
            ring_next.push((nr, nw, np));
        }
        self.arch.loop_backedge(&self.cx)?;
        let latch = self.cx.cur_block();
        iv.add_incoming(&[(&next, latch)]);
        for ((rd, wr, ph, _), (nr, nw, np)) in ring_phis.iter().zip(&ring_next) {
            rd.add_incoming(&[(nr, latch)]);
            wr.add_incoming(&[(nw, latch)]);
            ph.add_incoming(&[(np, latch)]);
        }
        for (ps, y) in phis.iter().zip(&ys_conv) {
            for (p, r) in ps.iter().zip(&y.regs) {
                p.add_incoming(&[(r as &dyn BasicValue, latch)]);
            }
        }
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(exit);
        let mut carried = carried;
        if !rings.is_empty() {
            // The copies for iterations past the end land before anything else (TMA
            // copies past the end are never issued).
            if rings.iter().any(|(_, r)| r.tma < 2) {
                self.arch.cp_async_wait(&self.cx, 0)?;
            }
            for (d, r) in &rings {
                self.async_slots.borrow_mut().remove(&(*d as *const Op));
                self.tma_inited.borrow_mut().remove(&(*d as *const Op));
                // The last iteration's wgmma group, left in flight, completes.
                if let Some(j) = r.overlap
                    && let Some(t) = carried.get_mut(j - 1)
                {
                    *t = dot::wgmma::finish_in_flight(self, d, t)?;
                }
            }
        }
        for (i, (r, t)) in op.results.iter().zip(carried).enumerate() {
            // A carried statistic keeps its parent after the loop (see
            // `reduce_hint`) when it kept the layout.
            if let Some(p) = body.args.get(i + 1).and_then(|a| self.parents.get(a))
                && self.hints.get(&body.args[i + 1]) == Some(&t.layout)
            {
                self.parents.insert(*r, p.clone());
            }
            self.set(*r, t);
        }
        Ok(())
    }

    /// When region argument `arg` is staged ([`Self::plan_staging`]), writes `t` into
    /// its `dot`'s shared array (the caller adds the barrier) and returns the
    /// register-less tile that stands for it.
    fn stage_carried(
        &mut self,
        arg: Option<&ValueId>,
        t: &Tile<'ctx>,
        which_tile: &str,
    ) -> LResult<Option<Tile<'ctx>>> {
        let Some(&(d, which)) = arg.and_then(|a| self.staged.get(a)) else {
            return Ok(None);
        };
        let base = self
            .pipe_base(d)
            .ok_or_else(|| LowerError::Llvm("a staged dot without arrays".into()))?;
        self.note(|| {
            format!(
                "{which_tile} operand {} of the loop's dot written into the dot's shared arrays",
                ["A", "B"][which]
            )
        });
        dot::stage_operand(self, d, which, t, base)?;
        Ok(Some(Tile {
            elem: t.elem,
            layout: t.layout.clone(),
            regs: Vec::new(),
            uniform: false,
        }))
    }

    fn lower_if(&mut self, op: &Op) -> LResult<()> {
        let span = &op.span;
        let cond = self.val(op.operands[0])?.regs[0].into_int_value();
        let bt = self.cx.ctx.append_basic_block(self.kernel, "if.then");
        let be = self.cx.ctx.append_basic_block(self.kernel, "if.else");
        let bm = self.cx.ctx.append_basic_block(self.kernel, "if.end");
        self.cx.b.build_conditional_branch(cond, bt, be)?;
        self.cx.b.position_at_end(bt);
        let yt = self.lower_region(&op.regions[0])?;
        self.restore_op(op);
        let end_t = self.cx.cur_block();
        self.cx.b.build_unconditional_branch(bm)?;
        self.cx.b.position_at_end(be);
        let ye = self.lower_region(&op.regions[1])?;
        self.restore_op(op);
        let mut ye_conv = Vec::new();
        for (y, t) in ye.iter().zip(&yt) {
            ye_conv.push(self.convert(y, &t.layout, span)?);
        }
        let end_e = self.cx.cur_block();
        self.cx.b.build_unconditional_branch(bm)?;
        self.cx.b.position_at_end(bm);
        for ((r, t), e) in op.results.iter().zip(&yt).zip(&ye_conv) {
            let ps = self.phis(t)?;
            for ((p, a), b) in ps.iter().zip(&t.regs).zip(&e.regs) {
                p.add_incoming(&[(a as &dyn BasicValue, end_t), (b as &dyn BasicValue, end_e)]);
            }
            let tile = self.phi_tile(t, &ps);
            self.set(*r, tile);
        }
        Ok(())
    }

    fn lower_while(&mut self, op: &Op) -> LResult<()> {
        let span = &op.span;
        let inits: Vec<Tile> = op
            .operands
            .iter()
            .map(|&v| self.val(v))
            .collect::<LResult<_>>()?;
        let pre = self.cx.cur_block();
        let header = self.cx.ctx.append_basic_block(self.kernel, "while.before");
        let after = self.cx.ctx.append_basic_block(self.kernel, "while.after");
        let exit = self.cx.ctx.append_basic_block(self.kernel, "while.exit");
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(header);
        let mut phis = Vec::new();
        for t in &inits {
            let ps = self.phis(t)?;
            for (p, r) in ps.iter().zip(&t.regs) {
                p.add_incoming(&[(r as &dyn BasicValue, pre)]);
            }
            phis.push(ps);
        }
        for ((a, t), ps) in op.regions[0].args.iter().zip(&inits).zip(&phis) {
            let tile = self.phi_tile(t, ps);
            self.set(*a, tile);
        }
        let cv = self.lower_region(&op.regions[0])?;
        self.restore_op(op);
        let Some((cond, fwd)) = cv.split_first() else {
            return unsupported(span, "a `while` whose before-region lacks a condition");
        };
        let site = self.new_site("while");
        let c = self
            .arch
            .loop_continue(&self.cx, cond.regs[0].into_int_value(), site)?;
        self.cx.b.build_conditional_branch(c, after, exit)?;
        self.cx.b.position_at_end(after);
        for (a, t) in op.regions[1].args.iter().zip(fwd) {
            self.set(*a, t.clone());
        }
        let ys = self.lower_region(&op.regions[1])?;
        self.restore_op(op);
        let mut ys_conv = Vec::new();
        for (y, t) in ys.iter().zip(&inits) {
            ys_conv.push(self.convert(y, &t.layout, span)?);
        }
        self.arch.loop_backedge(&self.cx)?;
        let latch = self.cx.cur_block();
        for (ps, y) in phis.iter().zip(&ys_conv) {
            for (p, r) in ps.iter().zip(&y.regs) {
                p.add_incoming(&[(r as &dyn BasicValue, latch)]);
            }
        }
        self.cx.b.build_unconditional_branch(header)?;
        self.cx.b.position_at_end(exit);
        for (r, t) in op.results.iter().zip(fwd) {
            self.set(*r, t.clone());
        }
        Ok(())
    }
}

/// The object-file symbol of a kernel named `name` (what [`KernelMeta::name`] holds
/// and a driver looks up): the name itself when it is a plain ASCII identifier
/// (`[A-Za-z_][A-Za-z0-9_]*`, every target's assembler takes it) not starting with
/// `__tsr_`, `tessera_` or `__tessera` (the emulator's hooks and Tessera's own
/// symbols); otherwise `__tsr_` and the name's UTF-8 bytes, ASCII letters and digits
/// kept and every other byte written `_` and two hex digits. Distinct names give
/// distinct symbols (the encoding can be read back, and plain names never carry the
/// prefix). Rust allows kernels named `r#match` or `núcleo`; LLVM aborts on some
/// such symbols, and PTX identifiers are ASCII.
pub fn kernel_symbol(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__tsr_")
        && !name.starts_with("tessera_")
        && !name.starts_with("__tessera");
    if plain {
        return name.to_string();
    }
    let mut s = String::from("__tsr_");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() {
            s.push(b as char);
        } else {
            s.push_str(&format!("_{b:02x}"));
        }
    }
    s
}

/// Records the defining op of every value defined in `r` and its nested regions.
/// A `dot` fed by asynchronous copies: `slots` arrays of `slot_bytes` from `offset`
/// in shared memory, `ahead` iterations' copies in flight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AsyncDot {
    offset: u32,
    slot_bytes: u32,
    slots: u32,
    ahead: u32,
    /// Operands filled by TMA copies (0, 1 or 2): the mbarriers' arrival count.
    tma: u32,
    /// Where the slots' mbarriers start (one per slot, after the slots), when `tma > 0`.
    bars: u32,
    /// On `wgmma` targets, the loop-carried accumulator (its index in the body's
    /// arguments) when the dot only chains it (`acc = dot(a, b, acc)`): each
    /// iteration then leaves its wgmma group in flight (`wait_group 1`), the ring has
    /// one more slot so the slot being refilled is never one an in-flight group
    /// reads, and the loop ends with `wait_group 0`.
    pub(crate) overlap: Option<usize>,
}

/// Which array of the ring an asynchronous copy fills.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AsyncSlot {
    /// Slot `s`: the prologue's copy for iteration `s`.
    Fixed(u32),
    /// The loop's copy for iteration `i + ahead`: the slot being filled.
    Next,
}

fn collect_flows(r: &Region, m: &mut HashMap<ValueId, Vec<ValueId>>) {
    for op in &r.ops {
        if op.kind == OpKind::For {
            let body = &op.regions[0];
            for (i, &init) in op.operands.iter().skip(3).enumerate() {
                if let Some(&a) = body.args.get(i + 1) {
                    m.entry(init).or_default().push(a);
                }
            }
            if let Some(y) = body.ops.last() {
                for (j, &v) in y.operands.iter().enumerate() {
                    let to = m.entry(v).or_default();
                    to.extend(body.args.get(j + 1).copied());
                    to.extend(op.results.get(j).copied());
                }
            }
        }
        for sub in &op.regions {
            collect_flows(sub, m);
        }
    }
}

fn collect_defs<'a>(r: &'a Region, d: &mut HashMap<ValueId, &'a Op>) {
    for op in &r.ops {
        for &v in &op.results {
            d.insert(v, op);
        }
        for sub in &op.regions {
            collect_defs(sub, d);
        }
    }
}

/// True when register `r` duplicates a lower register (it has a bit set whose basis
/// is zero).
pub fn is_dup_reg(l: &Layout, r: usize) -> bool {
    l.reg
        .iter()
        .enumerate()
        .any(|(i, &b)| b == 0 && r >> i & 1 == 1)
}

/// Bytes of a value of an LLVM register type (pointers are 8 bytes, `i1` one).
pub fn type_size(t: BasicTypeEnum<'_>) -> u32 {
    match t {
        BasicTypeEnum::IntType(i) => i.get_bit_width().div_ceil(8),
        BasicTypeEnum::FloatType(f) => {
            let ctx = f.get_context();
            if f == ctx.f64_type() {
                8
            } else if f == ctx.f32_type() {
                4
            } else {
                2
            }
        }
        BasicTypeEnum::VectorType(v) => v.get_size() * type_size(v.get_element_type()),
        BasicTypeEnum::ArrayType(a) => a.len() * type_size(a.get_element_type()),
        _ => 8,
    }
}

/// Bytes of one element in scratch memory.
pub fn type_bytes(e: Elem) -> u32 {
    match e {
        Elem::Scalar(s) => s.size_bytes() as u32,
        Elem::Ptr { .. } => 8,
    }
}

/// The LLVM register type of an IR element.
pub fn llvm_type<'ctx>(ctx: &'ctx Context, target: Target, e: Elem) -> BasicTypeEnum<'ctx> {
    match e {
        Elem::Scalar(s) => match s {
            ScalarType::I1 => ctx.bool_type().into(),
            ScalarType::I8 | ScalarType::U8 => ctx.i8_type().into(),
            // The 8-bit floats live in registers as their bits.
            ScalarType::F8E4M3 | ScalarType::F8E5M2 => ctx.i8_type().into(),
            ScalarType::I16 | ScalarType::U16 => ctx.i16_type().into(),
            ScalarType::I32 | ScalarType::U32 => ctx.i32_type().into(),
            ScalarType::I64 | ScalarType::U64 => ctx.i64_type().into(),
            ScalarType::F16 => ctx.f16_type().into(),
            ScalarType::BF16 => ctx.bf16_type().into(),
            ScalarType::F32 => ctx.f32_type().into(),
            ScalarType::F64 => ctx.f64_type().into(),
        },
        Elem::Ptr { space, .. } => {
            let a = match space {
                AddrSpace::Global => target.global_addrspace(),
                AddrSpace::Shared => target.shared_addrspace(),
            };
            ctx.ptr_type(AddressSpace::from(a)).as_basic_type_enum()
        }
    }
}

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
//! global sized to the largest need of any op ([`crate::KernelMeta::shared_bytes`]).
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
//!
//! # Files
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`Tile`], [`Cx`], the lowerer's state, values and the op dispatch |
//! | `entry.rs` | the entry points ([`lower_kernel`], [`lower_with_layouts`], ...): pipelining, descriptor expansion, stage and f16 fallbacks |
//! | `plan/` | the decisions made before emitting: layout hints, shared arrays, rings of asynchronous copies (data the lowering reads, printed by `TESSERA_DUMP=layout`) |
//! | `smem.rs` | the block's shared memory: placement, scratch, accesses the emulator checks |
//! | `control.rs` | `for`, `if`, `while` |
//! | `convert.rs`, `remat.rs` | layout conversions; values recomputed in another layout |
//! | `elementwise.rs`, `fmod.rs`, `reduce.rs` | element semantics, reductions and scans |
//! | `memory.rs`, `tma.rs` | loads, stores, atomics, `cp.async`; TMA and mbarriers |
//! | `spec.rs` | warp specialization of a TMA ring loop (sm_90a): the producer warpgroup's loop of copies, the consumers' release of ring slots |
//! | `dot/` | `dot`, one strategy per file over one shared-memory module |
//! | `comm.rs`, `engine.rs` | communication ops; how off-node peers are reached |
//! | `arch/` | the targets: [`arch::Arch`] for NVPTX, AMDGPU and the emulator, and [`arch::Math`] |
//! | `host/` | the other lowering: tile IR to host code for the CPU device |
//! | `prov.rs`, `banks.rs` | pointer provenance; the independent bank-conflict oracle (tests) |

pub mod arch;
#[cfg(test)]
mod banks;
mod comm;
mod control;
mod convert;
mod dot;
pub(crate) mod elementwise;
pub mod engine;
mod entry;
mod fmod;
pub(crate) mod host;
mod memory;
mod plan;
pub mod prov;
mod reduce;
mod remat;
mod smem;
mod spec;
mod tma;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use inkwell::AddressSpace;
use inkwell::basic_block::BasicBlock;
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FunctionValue, GlobalValue, IntValue, PointerValue,
};
use tessera_ir::ir::{ConstValue, Op, OpKind, Region};
use tessera_ir::{AddrSpace, Elem, Function, ScalarType, Span, ValueId};

use crate::Target;
use crate::axis::AxisAnalysis;
use crate::layout::{Layout, broadcast_bit_images, permute_bit_images};
use arch::Arch;
pub use entry::{Lowered, lower_kernel, lower_with_arch, lower_with_layouts, lower_with_sites};
pub(crate) use plan::{AsyncDot, AsyncSlot};

/// Internal lowering error, turned into [`crate::CodegenError`] at the entry point.
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

/// Which threads the code being emitted runs on (see [`plan::WarpSpec`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SpecRole {
    /// Every thread of the block (a kernel without warp specialization, or the
    /// part before its loop).
    All,
    /// The producer thread, in its loop of copies.
    Producer,
    /// The consumer warps, from the loop on.
    Consumers,
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
    /// The op defining each value (none for parameters and region arguments).
    pub(crate) defs: HashMap<ValueId, &'a Op>,
    /// Where a value flows on through a loop: a `for` init to its region argument, a
    /// `yield`ed value to the next iteration's argument and the loop's result.
    flows: HashMap<ValueId, Vec<ValueId>>,
    /// The decisions made before lowering ([`plan`]): layouts of carried values,
    /// arrays in shared memory, rings of asynchronous copies.
    pub(crate) plan: plan::Plan<'a>,
    /// A reduction's result (and what `expand_dims`/`reshape` make of it): the layout
    /// of the tile it was reduced from. Broadcasting it back to that shape produces
    /// that layout, a register renaming (each thread holds the combined value of
    /// its own elements), like Triton's slice layouts and their parents. Starts as
    /// the plan's [`plan::Plan::parents`].
    parents: HashMap<ValueId, Layout>,
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
    /// [`crate::CompileOptions::warp_specialize`].
    pub(crate) warp_specialize: Option<bool>,
    /// Whether loop `dot`s may alternate between two copies of their staged arrays
    /// ([`plan::Plan::double`]; the entry lowers a kernel again without when it runs
    /// out of shared memory).
    pub(crate) double_buffer: bool,
    /// Whether each double-buffered `dot` of the loop bodies being lowered reads
    /// the second copy of its arrays in this copy of the body (`control::lower_copy`).
    reads_second: HashMap<*const Op, bool>,
    /// Lowering a second copy of a loop body (`control::lower_unrolled`): its
    /// notes are the first copy's, not recorded again.
    copy_lowering: std::cell::Cell<bool>,
    /// [`crate::CompileOptions::consumer_groups`].
    pub(crate) consumer_groups: Option<u32>,
    /// [`crate::CompileOptions::cluster`] on targets with clusters, else `[1, 1, 1]`.
    pub(crate) cluster: [u32; 3],
    /// Where a warp-specialized kernel's lowering is ([`plan::WarpSpec`]).
    pub(crate) spec_role: SpecRole,
    /// In a persistent warp-specialized kernel's loop over tiles, the consumers'
    /// ring position (byte offset of the next slot read, its full-mbarrier parity),
    /// carried from tile to tile (`control.rs`).
    pub(crate) ring_cursor: Option<(IntValue<'ctx>, IntValue<'ctx>)>,
    /// Ping-pong consumers ([`plan::WarpSpec::groups`]), from the split on: this
    /// thread's group and its private shared memory (`spec.rs`).
    pub(crate) group: Option<spec::Group<'ctx>>,
    /// In a ping-pong kernel's loop over tiles: the tile being computed and the
    /// block's walk (`spec.rs`).
    pub(crate) pingpong: Option<spec::Walk<'ctx>>,
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
            plan: plan::Plan::default(),
            parents: HashMap::new(),
            async_issued: RefCell::new(HashMap::new()),
            async_slots: RefCell::new(HashMap::new()),
            tma_inited: RefCell::new(HashSet::new()),
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
            warp_specialize: None,
            double_buffer: true,
            reads_second: HashMap::new(),
            copy_lowering: std::cell::Cell::new(false),
            consumer_groups: None,
            cluster: [1, 1, 1],
            spec_role: SpecRole::All,
            ring_cursor: None,
            group: None,
            pingpong: None,
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
        let plan = plan::build(self);
        self.parents = plan.parents.clone();
        self.smem_span = plan.first_array.clone();
        if let Some(n) = &self.notes {
            n.borrow_mut().extend(plan.notes(self.f));
        }
        self.plan = plan;
        if self.plan.warp_spec.is_some() {
            // The producer warpgroup too.
            self.arch
                .set_kernel_abi(&self.cx, self.kernel, self.block_threads());
        }
        let body = &self.f.body;
        self.lower_region(body)?;
        // Puts to off-node peers are delivered before the kernel ends.
        self.engine_quiet()?;
        if self.plan.store_staging.is_some() {
            // The last TMA stores read the staging box before the block exits.
            let site = self.new_site("cp.async.bulk.wait_group.read");
            self.in_thread0(|l| l.arch.tma_store_wait(&l.cx, site))?;
        }
        self.cx.b.build_return(None)?;
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

    pub fn barrier(&self) -> LResult<()> {
        let site = self.new_site("barrier");
        if self.spec_role == SpecRole::Consumers {
            // The producer warpgroup has gone its own way: the consumers' barrier
            // (their group's, `1 + group`, for ping-pong consumers).
            let threads = self.nw * self.ws;
            return self.per_group(|l, g| l.arch.named_barrier(&l.cx, 1 + g, threads, site));
        }
        self.arch.barrier(&self.cx, site)
    }

    /// Threads per block: `num_warps` warps, and the producer warpgroup of a
    /// warp-specialized kernel.
    pub(crate) fn block_threads(&self) -> u32 {
        self.nw * self.ws * self.spec_groups()
            + if self.plan.warp_spec.is_some() {
                4 * self.ws
            } else {
                0
            }
    }

    /// Consumer groups of the warp-specialized loop (1 without one).
    pub(crate) fn spec_groups(&self) -> u32 {
        self.plan.warp_spec.as_ref().map_or(1, |w| w.groups)
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
        if let Some(n) = self.notes.as_ref().filter(|_| !self.copy_lowering.get()) {
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
                    .plan
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
            OpKind::DotScaled { .. } => {
                return unsupported(span, "`dot_scaled` not expanded before the lowering");
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
}

/// The object-file symbol of a kernel named `name` (what [`crate::KernelMeta::name`] holds
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

/// Records the defining op of every value defined in `r` and its nested regions.
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

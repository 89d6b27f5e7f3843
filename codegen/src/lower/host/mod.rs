//! Tile IR to host code: the compiled CPU device's lowering ([`crate::cpu`]).
//!
//! One LLVM function runs one program instance. Where the SIMT lowering spreads a
//! tile over the threads of a block, this one keeps it whole: a tile value lives in
//! a slot of a per-thread *scratch* area (row-major, one slot per op result), and each
//! tile op is a loop nest over its elements that LLVM's loop vectorizer turns into
//! vector code for the host. Values that are equal in every element (constants,
//! splats, program ids, and every 0-d value) stay scalars, used by every element;
//! affine index tiles (`arange` and arithmetic on it) stay a base and strides; and an
//! elementwise op whose only user is in its own region is *fused*: computed where
//! its user reads an element, so that a chain of elementwise ops ending in a store,
//! a reduction or a loop-carried value is one loop with no slot in between.
//! The element semantics are the SIMT lowering's own helpers
//! ([`super::elementwise`]), which the emulator checks against the interpreter.
//!
//! The function is
//! `i32 kernel(ptr params, ptr lens, ptr pids, ptr scratch, ptr err, ptr comm)`:
//! `params[i]` is a 64-bit word holding buffer `i`'s base address or scalar `i`'s
//! bytes (little-endian, low bytes first), `lens[i]` buffer `i`'s size in bytes,
//! `pids` six `i32`s (the program id, then the grid), `scratch` the thread's scratch
//! area (at least [`HostLowered::scratch_bytes`], 64-byte aligned), `err`
//! [`ERR_WORDS`] 64-bit words (`err[3..5]` belong to the watchdog poll, `err[5..]` to
//! the waits), `comm` the world's words: this rank, the number of ranks, then for
//! parameter `k` and rank `r` at `2 + k * size + r` the distance in bytes from this
//! rank's copy of a symmetric buffer to rank `r`'s. It returns 0, or 1 after writing
//! `[site, lane, index]` to `err`: a memory access outside its buffer (with the
//! checks on), an integer division by zero, a non-positive `for` step, a peer
//! outside the world, a wait that failed (lane: the runtime's status), or a loop
//! stopped by the watchdog (lane `u64::MAX`). Sites are described by [`HostSite`].
//!
//! **Communication**: `rank` and `world_size` read `comm`; `remote_ptr` adds the
//! distance to the peer's copy (so loads and stores through it are plain host
//! accesses, the peers' heaps being mapped in this process); `signal` is one
//! `atomicrmw` with the op's ordering; `fence` an LLVM `fence`; `wait_until` and
//! `barrier_all` call the runtime ([`WAIT`], [`BARRIER`]), which polls, lets the other
//! program instances run while it waits (they are coroutines) and times out. Atomics,
//! tensor descriptors and the debug ops are not lowered: [`LowerError::Unsupported`]
//! names the first one, and the caller runs that kernel on the interpreter.
//!
//! **Files.** This file holds the ABI above, the lowerer `H` with its value table and
//! the op dispatch; `fusion.rs` and `provenance.rs` the two analyses run before
//! lowering (which ops are fused into their user, which buffers a pointer may
//! reach); `values.rs` the value forms and elementwise ops; `memory.rs` loads,
//! stores and their bounds checks; `dot.rs` and `reduce.rs` those ops; `control.rs`
//! loops, branches and the watchdog's poll; `comm.rs` the communication ops.

use std::collections::HashMap;

use inkwell::AddressSpace;
use inkwell::IntPredicate;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::context::Context;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum, VectorType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FunctionValue, IntValue, PointerValue,
};
use inkwell::{AtomicOrdering, AtomicRMWBinOp};
use tessera_ir::ir::{
    BinaryOp, CmpPred, ConstValue, MemOrder, Op, OpKind, ReduceOp, Region, SignalOp, UnaryOp,
    ValueId,
};
use tessera_ir::{Elem, Function, ScalarType, Span};

use super::arch::Math;
use super::elementwise;
use super::{Cx, LResult, LowerError};
use fusion::fusible;
use provenance::{Prov, provenance};

mod comm;
mod control;
mod dot;
mod fusion;
mod memory;
mod provenance;
mod reduce;
mod values;

/// The host's own small arch: the host lowering shares the SIMT lowering's element
/// semantics ([`super::elementwise`]), which need only the approximate math, and
/// takes LLVM's portable intrinsics for it (the host's libm or vector code).
struct HostMath;

impl Math for HostMath {}

/// The name of the lowered function.
pub(crate) const HOST_KERNEL: &str = "__tessera_cpu_kernel";

/// The runtime's watchdog poll (`i32 (ptr err)`), see [`crate::cpu`].
pub(crate) const POLL: &str = "__tessera_cpu_poll";

/// The runtime's wait (`i32 (ptr word, i32 pred, i64 value, ptr err)`, `pred` the
/// comparison's index in [`CmpPred::ALL`]): returns 0
/// once `*word pred value` holds (the observed word in `err[5]`), or a [`WaitStatus`]
/// code with `err[5..]` describing the failure.
pub(crate) const WAIT: &str = "__tessera_cpu_wait";

/// The runtime's `barrier_all` (`i32 (ptr err)`), with [`WAIT`]'s results.
pub(crate) const BARRIER: &str = "__tessera_cpu_barrier";

/// The runtime's check of an access through a pointer that may point into
/// a peer's copy (`i64 (i64 param, i64 addr, i64 bytes)`, param -1: any buffer):
/// `i64::MIN` when `bytes` at `addr` lie inside the buffer, else the byte offset
/// from the nearest copy.
pub(crate) const CHECK: &str = "__tessera_cpu_check";

/// Words of the kernel's failure record.
pub(crate) const ERR_WORDS: usize = 8;

/// Why a wait failed (the lane of its failure record).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(u64)]
pub(crate) enum WaitStatus {
    /// It ran out of time: `err[5]` holds the last value seen, `err[6]` the word's
    /// address, `err[7]` the awaited value (for `barrier_all`: the arrivals, then the
    /// participants twice).
    Timeout = 1,
    /// Another rank (or program) failed: `err[5]` holds the failed rank.
    Aborted = 2,
}

/// What a failure site checks.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SiteKind {
    /// A load or store through a pointer derived from parameter `param` (`None`:
    /// from one of several, checked against every buffer); `remote`: possibly into
    /// a peer's copy of it.
    Access { param: Option<usize>, remote: bool },
    /// A `remote_ptr`'s peer (`index`: the peer).
    Peer,
    /// A `wait_until` (with its comparison) or `barrier_all` (`None`).
    Wait(Option<CmpPred>),
    /// An integer division or remainder.
    DivZero,
    /// A `for` loop's step (and its watchdog).
    Step,
    /// A `while` loop's watchdog.
    Loop,
}

/// A place where the compiled kernel can fail.
#[derive(Clone, Debug)]
pub(crate) struct HostSite {
    /// What is checked.
    pub kind: SiteKind,
    /// The op's mnemonic.
    pub op: &'static str,
    /// The op's source location.
    pub span: Span,
    /// The shape of the op's tile (lanes are reported as multi-indices of it).
    pub shape: Vec<u32>,
}

/// A kernel lowered for the host.
pub(crate) struct HostLowered<'ctx> {
    /// The module holding [`HOST_KERNEL`].
    pub module: inkwell::module::Module<'ctx>,
    /// Failure sites, by id.
    pub sites: Vec<HostSite>,
    /// Scratch bytes one program instance needs.
    pub scratch_bytes: u64,
    /// Parameter pairs whose buffers the code assumes do not overlap (a fused load
    /// from the first reads while a store into the second runs): the launcher checks
    /// them and runs an overlapping launch on the interpreter.
    pub disjoint: Vec<(usize, usize)>,
    /// Parameters the code reaches peers' copies of (`remote_ptr`): they must be
    /// symmetric buffers.
    pub remote: Vec<usize>,
}

/// A lowered value.
#[derive(Clone, Copy)]
enum V<'ctx> {
    /// The same scalar in every element (and every 0-d value).
    U(BasicValueEnum<'ctx>),
    /// A tile in scratch (or in a loop's slot), row-major.
    T(PointerValue<'ctx>),
    /// An affine tile, `H::aff[k]`: element `idx` is `base + Σ idx[d] * strides[d]`
    /// (offsets and pointers built from `arange`, program ids and scalars): never
    /// materialized where it is only read, so that a load through it is a
    /// contiguous (vectorizable) access.
    A(usize),
    /// A fused elementwise tile, `H::fused[k]`: an elementwise op over other values,
    /// computed where an element is read instead of in a loop of its own (see
    /// [`fusible`]), so that a chain of elementwise ops ending in a store, a
    /// loop-carried value or another consumer is one loop with no slot in between.
    F(usize),
}

/// A fused elementwise op (see [`V::F`]).
struct Fused<'ctx> {
    op: Op,
    ins: Vec<V<'ctx>>,
    /// Instructions per element, counting fused inputs as often as they are read
    /// (bounded by [`FUSE_COST`], so that shared inputs cannot blow up).
    cost: u32,
    /// The slots it reads (its own inputs' and its fused inputs').
    reads: Vec<PointerValue<'ctx>>,
    /// A load: its check site, and the buffer it reads.
    site: Option<usize>,
    prov: Prov,
}

/// The most instructions per element a fused value may stand for.
const FUSE_COST: u32 = 48;

/// An affine tile (see [`V::A`]): an integer base with strides of its type, or a
/// pointer base with `i64` strides in elements of its pointee.
struct Affine<'ctx> {
    base: BasicValueEnum<'ctx>,
    strides: Vec<IntValue<'ctx>>,
}

struct H<'a, 'ctx> {
    cx: Cx<'ctx>,
    f: &'a Function,
    func: FunctionValue<'ctx>,
    arch: HostMath,
    vals: HashMap<ValueId, V<'ctx>>,
    aff: Vec<Affine<'ctx>>,
    fused: Vec<Fused<'ctx>>,
    /// Per value: its elementwise op may be fused into its only user ([`fusible`]).
    fusible: Vec<bool>,
    prov: Vec<Prov>,
    sites: Vec<HostSite>,
    /// Accesses are checked against their buffers (every access that happens).
    checked: bool,
    /// The sanitizer: every access the program makes is checked, as the interpreter
    /// checks it (loads are not fused, so none is skipped).
    sanitize: bool,
    scratch_bytes: u64,
    params: PointerValue<'ctx>,
    lens: PointerValue<'ctx>,
    pids: PointerValue<'ctx>,
    scratch: PointerValue<'ctx>,
    err: PointerValue<'ctx>,
    comm: PointerValue<'ctx>,
    /// The kernel reaches peers' memory (`remote_ptr`): accesses through pointers of
    /// mixed provenance are checked against the peers' copies too.
    remote: bool,
    /// Per parameter: a buffer's base address and length in bytes ([`H::extent`]).
    extents: Vec<Option<(IntValue<'ctx>, IntValue<'ctx>)>>,
    /// Fused loads whose whole tile was found inside its buffer by the code being
    /// emitted now ([`H::chunked`]): read without checks there.
    trusted: Vec<usize>,
}

fn unsupported<T>(op: &Op, why: &str) -> LResult<T> {
    Err(LowerError::Unsupported {
        span: op.span.clone(),
        message: format!("`{}` {why}", op.kind.mnemonic()),
    })
}

/// Lowers `func` for the host; `checked`: every memory access that happens is
/// checked against its buffer (a vector run at its ends); `sanitize`: every access
/// the program makes, loads unfused.
pub(crate) fn lower_host<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    checked: bool,
    sanitize: bool,
) -> LResult<HostLowered<'ctx>> {
    // `dot_scaled`: decoded and scaled to f32, then an f32 `dot` (its definition).
    let expanded =
        tessera_ir::passes::expand_dot_scaled(func).map_err(|message| LowerError::Unsupported {
            span: func.span.clone(),
            message,
        })?;
    if let Some(g) = expanded {
        return lower_host(ctx, &g, checked, sanitize);
    }
    let checked = checked || sanitize;
    let module = ctx.create_module(&func.name);
    let ptr = ctx.ptr_type(AddressSpace::default());
    let fty = ctx.i32_type().fn_type(&[ptr.into(); 6], false);
    let fnv = module.add_function(HOST_KERNEL, fty, None);
    let noalias = ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("noalias"), 0);
    for i in 0..6 {
        fnv.add_attribute(AttributeLoc::Param(i), noalias);
    }
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(fnv, "entry"));
    let p = |i: u32| -> LResult<PointerValue<'ctx>> {
        Ok(fnv
            .get_nth_param(i)
            .ok_or_else(|| LowerError::Llvm("missing parameter".into()))?
            .into_pointer_value())
    };
    let prov = provenance(func);
    let fusion = fusible(func, &prov);
    let mut remote = Vec::new();
    func.walk(&mut |op| {
        if op.kind == OpKind::RemotePtr
            && let Some(Prov::Param(k) | Prov::Remote(k)) =
                op.operands.first().map(|v| prov[v.index()])
        {
            remote.push(k);
        }
    });
    remote.sort_unstable();
    remote.dedup();
    let mut h = H {
        cx: Cx {
            ctx,
            module,
            b,
            host: true,
        },
        f: func,
        func: fnv,
        arch: HostMath,
        vals: HashMap::new(),
        aff: Vec::new(),
        fused: Vec::new(),
        fusible: fusion.ok,
        prov,
        sites: Vec::new(),
        checked,
        sanitize,
        scratch_bytes: 0,
        params: p(0)?,
        lens: p(1)?,
        pids: p(2)?,
        scratch: p(3)?,
        err: p(4)?,
        comm: p(5)?,
        remote: !remote.is_empty(),
        extents: Vec::new(),
        trusted: Vec::new(),
    };
    for (i, prm) in func.params.iter().enumerate() {
        let ty = h.lty(func.ty(prm.value).elem);
        let i64t = h.cx.ctx.i64_type();
        let slot = h.gep(i64t.into(), h.params, h.i64(i as u64))?;
        let v = h.cx.b.build_load(ty, slot, &prm.name)?;
        h.vals.insert(prm.value, V::U(v));
        let extent = if matches!(func.ty(prm.value).elem, Elem::Ptr { .. }) {
            let base = h.cx.b.build_load(i64t, slot, "")?.into_int_value();
            let ls = h.gep(i64t.into(), h.lens, h.i64(i as u64))?;
            let len = h.cx.b.build_load(i64t, ls, "")?.into_int_value();
            Some((base, len))
        } else {
            None
        };
        h.extents.push(extent);
    }
    h.region(&func.body)?;
    h.cx.b
        .build_return(Some(&h.cx.ctx.i32_type().const_zero()))?;
    let H {
        cx,
        sites,
        scratch_bytes,
        ..
    } = h;
    Ok(HostLowered {
        module: cx.module,
        sites,
        scratch_bytes,
        // (Loads are fused only without the sanitizer.)
        disjoint: if sanitize {
            Vec::new()
        } else {
            fusion.disjoint
        },
        remote,
    })
}

fn llvm_order(o: MemOrder) -> AtomicOrdering {
    match o {
        MemOrder::Relaxed => AtomicOrdering::Monotonic,
        MemOrder::Acquire => AtomicOrdering::Acquire,
        MemOrder::Release => AtomicOrdering::Release,
        MemOrder::AcqRel => AtomicOrdering::AcquireRelease,
    }
}

fn elem_bytes(e: Elem) -> u64 {
    match e {
        Elem::Scalar(s) => (s.bits().max(8) / 8) as u64,
        Elem::Ptr { .. } => 8,
    }
}

impl<'a, 'ctx> H<'a, 'ctx> {
    fn i64(&self, v: u64) -> IntValue<'ctx> {
        self.cx.ctx.i64_type().const_int(v, false)
    }

    fn lty(&self, e: Elem) -> BasicTypeEnum<'ctx> {
        let c = self.cx.ctx;
        match e {
            Elem::Ptr { .. } => c.ptr_type(AddressSpace::default()).into(),
            Elem::Scalar(s) => match s {
                ScalarType::F16 => c.f16_type().into(),
                ScalarType::BF16 => c.bf16_type().into(),
                ScalarType::F32 => c.f32_type().into(),
                ScalarType::F64 => c.f64_type().into(),
                s => self.cx.int_ty(s.bits()).into(),
            },
        }
    }

    /// The type of an element in a tile slot: `i1` is kept as a byte (0 or 1), so
    /// that masks load and store as vectors.
    fn mem_ty(&self, e: Elem) -> BasicTypeEnum<'ctx> {
        if e == Elem::Scalar(ScalarType::I1) {
            self.cx.ctx.i8_type().into()
        } else {
            self.lty(e)
        }
    }

    fn elem(&self, v: ValueId) -> Elem {
        self.f.ty(v).elem
    }

    fn shape(&self, v: ValueId) -> Vec<u64> {
        self.f.ty(v).shape.iter().map(|&d| d as u64).collect()
    }

    fn numel(&self, v: ValueId) -> u64 {
        self.shape(v).iter().product()
    }

    fn gep(
        &self,
        ty: BasicTypeEnum<'ctx>,
        base: PointerValue<'ctx>,
        i: IntValue<'ctx>,
    ) -> LResult<PointerValue<'ctx>> {
        // SAFETY (of the generated code, not of this call): indices stay inside
        // the slot or buffer (buffer accesses are checked unless compiled
        // unchecked).
        Ok(unsafe { self.cx.b.build_gep(ty, base, &[i], "") }?)
    }

    fn val(&self, v: ValueId) -> LResult<V<'ctx>> {
        self.vals
            .get(&v)
            .copied()
            .ok_or_else(|| LowerError::Llvm(format!("{v} used before it is defined")))
    }

    /// A fresh scratch slot for `n` elements of `e`.
    fn slot(&mut self, e: Elem, n: u64) -> LResult<PointerValue<'ctx>> {
        let off = self.scratch_bytes.next_multiple_of(64);
        self.scratch_bytes = off + n * elem_bytes(e);
        let i8t = self.cx.ctx.i8_type().into();
        self.gep(i8t, self.scratch, self.i64(off))
    }

    /// Element `i` of `v` (of element type `e`; a uniform, materialized or fused
    /// tile).
    fn get(&self, v: V<'ctx>, e: Elem, i: IntValue<'ctx>) -> LResult<BasicValueEnum<'ctx>> {
        match v {
            V::U(x) => Ok(x),
            V::T(p) => {
                let ty = self.mem_ty(e);
                let a = self.gep(ty, p, i)?;
                let x = self.cx.b.build_load(ty, a, "")?;
                if e == Elem::Scalar(ScalarType::I1) {
                    let t = self.cx.ctx.bool_type();
                    return Ok(self
                        .cx
                        .b
                        .build_int_truncate(x.into_int_value(), t, "")?
                        .into());
                }
                Ok(x)
            }
            // Elementwise over its inputs at the same linear index (an affine
            // input has no linear form and is refused).
            V::F(k) => {
                let fu = &self.fused[k];
                if matches!(fu.op.kind, OpKind::Load { .. }) {
                    return self.load_elem(k, i, &|h, v, e| h.get(v, e, i));
                }
                let args: Vec<BasicValueEnum<'ctx>> = fu
                    .ins
                    .iter()
                    .zip(&fu.op.operands)
                    .map(|(&v, &id)| self.get(v, self.elem(id), i))
                    .collect::<LResult<_>>()?;
                self.apply(&fu.op, &args)
            }
            V::A(_) => Err(LowerError::Llvm(
                "an affine tile read by linear index".into(),
            )),
        }
    }

    /// Element `idx` (row-major index `lin`) of `v`, of element type `e`.
    fn get_at(
        &self,
        v: V<'ctx>,
        e: Elem,
        idx: &[IntValue<'ctx>],
        lin: IntValue<'ctx>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let k = match v {
            V::A(k) => k,
            V::F(k) => {
                let fu = &self.fused[k];
                if matches!(fu.op.kind, OpKind::Load { .. }) {
                    return self.load_elem(k, lin, &|h, v, e| h.get_at(v, e, idx, lin));
                }
                let args: Vec<BasicValueEnum<'ctx>> = fu
                    .ins
                    .iter()
                    .zip(&fu.op.operands)
                    .map(|(&v, &id)| self.get_at(v, self.elem(id), idx, lin))
                    .collect::<LResult<_>>()?;
                return self.apply(&fu.op, &args);
            }
            _ => return self.get(v, e, lin),
        };
        let a = &self.aff[k];
        let b = &self.cx.b;
        match e {
            Elem::Ptr { pointee, .. } => {
                let mut off = self.i64(0);
                for (&i, &st) in idx.iter().zip(&a.strides) {
                    if st.get_zero_extended_constant() == Some(0) {
                        continue;
                    }
                    off = b.build_int_add(off, b.build_int_mul(i, st, "")?, "")?;
                }
                let ty = self.lty(Elem::Scalar(pointee));
                // SAFETY (generated code): address arithmetic, checked at the access.
                Ok(unsafe { b.build_gep(ty, a.base.into_pointer_value(), &[off], "") }?.into())
            }
            Elem::Scalar(_) => {
                let mut acc = a.base.into_int_value();
                let t = acc.get_type();
                for (&i, &st) in idx.iter().zip(&a.strides) {
                    if st.get_zero_extended_constant() == Some(0) {
                        continue;
                    }
                    let i = b.build_int_truncate_or_bit_cast(i, t, "")?;
                    acc = b.build_int_add(acc, b.build_int_mul(i, st, "")?, "")?;
                }
                Ok(acc.into())
            }
        }
    }

    fn affine(&mut self, base: BasicValueEnum<'ctx>, strides: Vec<IntValue<'ctx>>) -> V<'ctx> {
        self.aff.push(Affine { base, strides });
        V::A(self.aff.len() - 1)
    }

    /// `v` (typed like value `ty`) as a uniform or materialized tile.
    fn mat_v(&mut self, v: V<'ctx>, ty: ValueId) -> LResult<V<'ctx>> {
        if !matches!(v, V::A(_) | V::F(_)) {
            return Ok(v);
        }
        let e = self.elem(ty);
        let out = self.slot(e, self.numel(ty))?;
        self.copy_tile(out, v, ty)?;
        Ok(V::T(out))
    }

    /// Value `id` as a uniform or materialized tile.
    fn mat(&mut self, id: ValueId) -> LResult<V<'ctx>> {
        let v = self.val(id)?;
        self.mat_v(v, id)
    }

    fn put(
        &self,
        p: PointerValue<'ctx>,
        e: Elem,
        i: IntValue<'ctx>,
        x: BasicValueEnum<'ctx>,
    ) -> LResult<()> {
        let a = self.gep(self.mem_ty(e), p, i)?;
        let x = if e == Elem::Scalar(ScalarType::I1) {
            let t = self.cx.ctx.i8_type();
            self.cx
                .b
                .build_int_z_extend(x.into_int_value(), t, "")?
                .into()
        } else {
            x
        };
        self.cx.b.build_store(a, x)?;
        Ok(())
    }

    fn block(&self, name: &str) -> BasicBlock<'ctx> {
        self.cx.ctx.append_basic_block(self.func, name)
    }

    fn here(&self) -> LResult<BasicBlock<'ctx>> {
        self.cx
            .b
            .get_insert_block()
            .ok_or_else(|| LowerError::Llvm("builder without a block".into()))
    }

    /// `for i in 0..n { f(i) }` (an `i64` induction variable).
    fn counted(
        &mut self,
        n: u64,
        f: &mut dyn FnMut(&mut Self, IntValue<'ctx>) -> LResult<()>,
    ) -> LResult<()> {
        if n == 0 {
            return Ok(());
        }
        let pre = self.here()?;
        let head = self.block("loop");
        let exit = self.block("done");
        self.cx.b.build_unconditional_branch(head)?;
        self.cx.b.position_at_end(head);
        let i64t = self.cx.ctx.i64_type();
        let phi = self.cx.b.build_phi(i64t, "i")?;
        phi.add_incoming(&[(&i64t.const_zero(), pre)]);
        let i = phi.as_basic_value().into_int_value();
        f(self, i)?;
        let next = self.cx.b.build_int_add(i, self.i64(1), "")?;
        let latch = self.here()?;
        phi.add_incoming(&[(&next, latch)]);
        let more = self
            .cx
            .b
            .build_int_compare(IntPredicate::ULT, next, self.i64(n), "")?;
        self.cx.b.build_conditional_branch(more, head, exit)?;
        self.cx.b.position_at_end(exit);
        Ok(())
    }

    /// Loop nest over `shape` (outermost first); `f` gets the multi-index.
    fn nest(
        &mut self,
        shape: &[u64],
        f: &mut dyn FnMut(&mut Self, &[IntValue<'ctx>]) -> LResult<()>,
    ) -> LResult<()> {
        fn go<'a, 'ctx>(
            h: &mut H<'a, 'ctx>,
            shape: &[u64],
            idx: &mut Vec<IntValue<'ctx>>,
            f: &mut dyn FnMut(&mut H<'a, 'ctx>, &[IntValue<'ctx>]) -> LResult<()>,
        ) -> LResult<()> {
            if idx.len() == shape.len() {
                return f(h, idx);
            }
            let d = shape[idx.len()];
            h.counted(d, &mut |h, i| {
                idx.push(i);
                let r = go(h, shape, idx, f);
                idx.pop();
                r
            })
        }
        go(self, shape, &mut Vec::new(), f)
    }

    /// `Σ idx[d] * strides[d]`.
    fn linear(&self, idx: &[IntValue<'ctx>], strides: &[u64]) -> LResult<IntValue<'ctx>> {
        let mut acc = self.i64(0);
        for (&i, &s) in idx.iter().zip(strides) {
            if s == 0 {
                continue;
            }
            let t = self.cx.b.build_int_mul(i, self.i64(s), "")?;
            acc = self.cx.b.build_int_add(acc, t, "")?;
        }
        Ok(acc)
    }

    /// A failure branch: when `ok` is false, records `[site, lane, index]` and returns 1.
    fn check(
        &self,
        ok: IntValue<'ctx>,
        site: usize,
        lane: IntValue<'ctx>,
        index: IntValue<'ctx>,
    ) -> LResult<()> {
        let fail = self.block("fail");
        let cont = self.block("ok");
        let ok = self.likely(ok)?;
        self.cx.b.build_conditional_branch(ok, cont, fail)?;
        self.cx.b.position_at_end(fail);
        let i64t: BasicTypeEnum = self.cx.ctx.i64_type().into();
        for (k, v) in [self.i64(site as u64), lane, index].into_iter().enumerate() {
            let a = self.gep(i64t, self.err, self.i64(k as u64))?;
            self.cx.b.build_store(a, v)?;
        }
        self.cx
            .b
            .build_return(Some(&self.cx.ctx.i32_type().const_int(1, false)))?;
        self.cx.b.position_at_end(cont);
        Ok(())
    }

    fn site(&mut self, op: &Op, kind: SiteKind, shape: Vec<u32>) -> usize {
        self.sites.push(HostSite {
            kind,
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            shape,
        });
        self.sites.len() - 1
    }

    fn region(&mut self, r: &Region) -> LResult<Vec<V<'ctx>>> {
        for op in &r.ops {
            match op.kind {
                OpKind::Yield | OpKind::Condition => {
                    return op.operands.iter().map(|&v| self.val(v)).collect();
                }
                _ => self.op(op)?,
            }
        }
        Ok(Vec::new())
    }

    fn set(&mut self, op: &Op, v: V<'ctx>) {
        self.vals.insert(op.results[0], v);
    }

    fn op(&mut self, op: &Op) -> LResult<()> {
        let b = &self.cx.b;
        match &op.kind {
            OpKind::ProgramId { axis } | OpKind::NumPrograms { axis } => {
                if *axis > 2 {
                    return unsupported(op, "on a grid axis above 2");
                }
                let k = *axis as u64
                    + if matches!(op.kind, OpKind::NumPrograms { .. }) {
                        3
                    } else {
                        0
                    };
                let i32t = self.cx.ctx.i32_type();
                let a = self.gep(i32t.into(), self.pids, self.i64(k))?;
                let v = b.build_load(i32t, a, "pid")?;
                self.set(op, V::U(v));
            }
            OpKind::Const(c) => {
                let e = self.elem(op.results[0]);
                let Elem::Scalar(s) = e else {
                    return unsupported(op, "of a pointer");
                };
                if s.is_fp8() {
                    return unsupported(op, "of an 8-bit float");
                }
                let ty = self.lty(e);
                let v: BasicValueEnum = match (*c, s.is_float()) {
                    (ConstValue::Float(x), true) => ty.into_float_type().const_float(x).into(),
                    (ConstValue::Int(x), true) => ty.into_float_type().const_float(x as f64).into(),
                    (ConstValue::Bool(x), _) => {
                        ty.into_int_type().const_int(x as u64, false).into()
                    }
                    (ConstValue::Int(x), false) => {
                        ty.into_int_type().const_int(x as u64, true).into()
                    }
                    (ConstValue::Float(x), false) => {
                        ty.into_int_type().const_int(x as i64 as u64, true).into()
                    }
                };
                self.set(op, V::U(v));
            }
            OpKind::Arange { start, .. } => {
                let ty = self.lty(self.elem(op.results[0])).into_int_type();
                let v = self.affine(
                    ty.const_int(*start as u64, true).into(),
                    vec![ty.const_int(1, false)],
                );
                self.set(op, v);
            }
            OpKind::Splat => {
                let src = self.mat(op.operands[0])?;
                let e = self.elem(op.operands[0]);
                let x = self.get(src, e, self.i64(0))?;
                self.set(op, V::U(x));
            }
            OpKind::ExpandDims { .. } | OpKind::Reshape | OpKind::Hint { .. } => {
                let v = self.val(op.operands[0])?;
                let v = match self.view(v, op)? {
                    Some(v) => v,
                    None => self.mat_v(v, op.operands[0])?,
                };
                self.set(op, v);
            }
            OpKind::Broadcast | OpKind::Permute { .. } => {
                let v = self.val(op.operands[0])?;
                let v = match self.view(v, op)? {
                    Some(v @ (V::A(_) | V::F(_))) => {
                        self.set(op, v);
                        return Ok(());
                    }
                    Some(v) => v,
                    None => self.mat_v(v, op.operands[0])?,
                };
                let n = self.numel(op.results[0]);
                let src = self.shape(op.operands[0]);
                let dst = self.shape(op.results[0]);
                let (V::T(p), false) = (
                    v,
                    op.kind == OpKind::Broadcast && self.numel(op.operands[0]) == n,
                ) else {
                    // A uniform tile, or a broadcast that adds no element.
                    self.set(op, v);
                    return Ok(());
                };
                let mut st = vec![0u64; src.len()];
                let mut acc = 1;
                for d in (0..src.len()).rev() {
                    st[d] = if src[d] == 1 { 0 } else { acc };
                    acc *= src[d];
                }
                let sst: Vec<u64> = match &op.kind {
                    OpKind::Permute { order } => {
                        if order.len() != src.len() {
                            return unsupported(op, "with a bad order");
                        }
                        order.iter().map(|&o| st[o as usize]).collect()
                    }
                    _ => st,
                };
                let e = self.elem(op.results[0]);
                let out = self.slot(e, n)?;
                let dst_st = row_major(&dst);
                self.nest(&dst, &mut |h, idx| {
                    let si = h.linear(idx, &sst)?;
                    let di = h.linear(idx, &dst_st)?;
                    let x = h.get(V::T(p), e, si)?;
                    h.put(out, e, di, x)
                })?;
                self.set(op, V::T(out));
            }
            OpKind::Binary(_)
            | OpKind::Unary(_)
            | OpKind::Fma
            | OpKind::Cmp(_)
            | OpKind::Select
            | OpKind::Cast
            | OpKind::Bitcast
            | OpKind::AddPtr => self.elementwise(op)?,
            OpKind::Load {
                has_mask,
                has_other,
            } => self.load(op, *has_mask, *has_other)?,
            OpKind::Store { has_mask } => self.store(op, *has_mask)?,
            OpKind::Dot => self.dot(op)?,
            OpKind::DotScaled { .. } => {
                return Err(LowerError::Unsupported {
                    span: op.span.clone(),
                    message: "`dot_scaled` not expanded before the lowering".into(),
                });
            }
            OpKind::Reduce { axis, op: rop } => self.reduce(op, *axis, *rop, None)?,
            OpKind::Scan {
                axis,
                op: rop,
                reverse,
            } => self.reduce(op, *axis, *rop, Some(*reverse))?,
            OpKind::For => self.for_op(op)?,
            OpKind::If => self.if_op(op)?,
            // One program instance runs as one thread: nothing to wait for.
            OpKind::Barrier => {}
            OpKind::While => self.while_op(op)?,
            OpKind::Rank
            | OpKind::WorldSize
            | OpKind::RemotePtr
            | OpKind::Signal { .. }
            | OpKind::WaitUntil { .. }
            | OpKind::Fence { .. }
            | OpKind::BarrierAll => self.comm_op(op)?,
            _ => return unsupported(op, "is not compiled for the CPU"),
        }
        Ok(())
    }
}

/// The vector of `w` elements of `t`.
fn vec_of(t: BasicTypeEnum<'_>, w: u32) -> LResult<inkwell::types::VectorType<'_>> {
    match t {
        BasicTypeEnum::IntType(t) => Ok(t.vec_type(w)),
        BasicTypeEnum::FloatType(t) => Ok(t.vec_type(w)),
        BasicTypeEnum::PointerType(t) => Ok(t.vec_type(w)),
        t => Err(LowerError::Llvm(format!("no vector of {t}"))),
    }
}

/// Sets the alignment of a load.
fn set_align(v: BasicValueEnum<'_>, bytes: u64) {
    if let Some(i) = inkwell::values::BasicValue::as_instruction_value(&v) {
        let _ = i.set_alignment(bytes as u32);
    }
}

fn row_major(shape: &[u64]) -> Vec<u64> {
    let mut st = vec![0u64; shape.len()];
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        st[d] = acc;
        acc *= shape[d];
    }
    st
}

fn param_of(p: Prov) -> Option<usize> {
    match p {
        Prov::Param(k) | Prov::Remote(k) => Some(k),
        _ => None,
    }
}

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

use super::arch::Emu;
use super::elementwise;
use super::{Cx, LResult, LowerError};
use crate::target::EmuFlavor;

/// Rows of a `dot` register block ([`H::micro_kernel`]) for `vl`-lane rows of
/// `acc`: as many as keep every accumulator, one row of `pb` and a broadcast in this
/// machine's vector registers (16 of 256 bits with AVX2, 32 of 512 with AVX-512), at
/// most 8. With AVX2 that is 6 rows of 16 f32 lanes (with 8 the inner loop spilled
/// and reloaded accumulators every step).
fn register_rows(acc: ScalarType, vl: u64) -> u64 {
    let wide = crate::host_cpu::wide_vectors();
    let (regs, bits) = if wide { (32, 512) } else { (16, 256) };
    let per_row = (vl * acc.bits() as u64).div_ceil(bits);
    ((regs - per_row - 1) / per_row).clamp(1, 8)
}

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

/// Where a pointer value points: into parameter `k`'s buffer, into some rank's
/// copy of it, into one of several buffers, or not known yet.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Prov {
    Unset,
    Param(usize),
    Remote(usize),
    Mixed,
}

impl Prov {
    fn merge(self, o: Prov) -> Prov {
        match (self, o) {
            (Prov::Unset, x) | (x, Prov::Unset) => x,
            (a, b) if a == b => a,
            (Prov::Param(a) | Prov::Remote(a), Prov::Param(b) | Prov::Remote(b)) if a == b => {
                Prov::Remote(a)
            }
            _ => Prov::Mixed,
        }
    }
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
    arch: Emu,
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
        arch: Emu {
            flavor: EmuFlavor::Nv,
        },
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

/// Which values may be computed where they are read ([`V::F`]) rather than
/// materialized, and what that assumes of the buffers.
struct Fusion {
    /// Per value: fusible.
    ok: Vec<bool>,
    /// Parameter pairs `(read, written)` whose buffers must not overlap: a fused load
    /// from the first is evaluated after (or while) a store to the second runs.
    disjoint: Vec<(usize, usize)>,
}

/// Per value: whether it may be computed where it is read ([`V::F`]) rather than
/// materialized. That is the result of an elementwise op (not an integer division,
/// whose check must happen once, nor pointer arithmetic) or of a load from a
/// parameter's buffer, whose every use is by one op in the region that defines it (so
/// it is never recomputed per element by several consumers, nor per iteration of a
/// loop nested in its region). A load is read where the chain of fused ops it feeds
/// ends (its *sink*), so between it and that sink no op may write memory, except
/// stores into other parameters' buffers (recorded in [`Fusion::disjoint`]).
fn fusible(f: &Function, prov: &[Prov]) -> Fusion {
    /// What an op does to memory.
    #[derive(Clone, Copy, PartialEq)]
    enum Eff {
        Pure,
        /// A store through pointers into this buffer.
        Store(Prov),
        Other,
    }
    struct Walk<'f> {
        f: &'f Function,
        prov: &'f [Prov],
        /// Per value: the region defining it (`usize::MAX`: a parameter or region
        /// argument, never fused).
        def: Vec<usize>,
        /// Per value: the op defining it.
        def_op: Vec<usize>,
        /// Per value: its only user so far, `(region, op)`.
        user: Vec<Option<(usize, usize)>>,
        ok: Vec<bool>,
        /// Per value: a load from parameter `k`'s buffer.
        load: Vec<Option<usize>>,
        /// Per op (in walk order): its effect and first result.
        eff: Vec<Eff>,
        result: Vec<Option<ValueId>>,
        regions: usize,
        ops: usize,
    }
    impl Walk<'_> {
        fn region(&mut self, r: &Region) {
            let me = self.regions;
            for op in &r.ops {
                self.ops += 1;
                let user = (me, self.ops);
                for &v in &op.operands {
                    let i = v.index();
                    match self.user[i] {
                        _ if self.def[i] != me => self.ok[i] = false,
                        None => self.user[i] = Some(user),
                        Some(u) if u == user => {}
                        Some(_) => self.ok[i] = false,
                    }
                }
                let float = |v: ValueId| self.f.ty(v).elem.scalar().is_some_and(|s| s.is_float());
                let elementwise = match &op.kind {
                    OpKind::Binary(BinaryOp::Div | BinaryOp::Rem) => float(op.operands[0]),
                    OpKind::Binary(_)
                    | OpKind::Unary(_)
                    | OpKind::Fma
                    | OpKind::Cmp(_)
                    | OpKind::Select
                    | OpKind::Cast
                    | OpKind::Bitcast => true,
                    _ => false,
                };
                let load = match (&op.kind, op.operands.first(), op.results.first()) {
                    (OpKind::Load { .. }, Some(&p), Some(&res))
                        if !self.f.ty(res).shape.is_empty() =>
                    {
                        match self.prov[p.index()] {
                            Prov::Param(k) => Some(k),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                let eff = match &op.kind {
                    OpKind::Store { .. } => Eff::Store(self.prov[op.operands[0].index()]),
                    OpKind::DescStore { .. }
                    | OpKind::AtomicRmw { .. }
                    | OpKind::AtomicCas { .. }
                    | OpKind::LocalAlloc { .. }
                    | OpKind::Signal { .. }
                    | OpKind::WaitUntil { .. }
                    | OpKind::Fence { .. }
                    | OpKind::BarrierAll
                    | OpKind::Print { .. }
                    | OpKind::Assert { .. } => Eff::Other,
                    _ => Eff::Pure,
                };
                self.eff.push(eff);
                self.result.push(op.results.first().copied());
                for &res in &op.results {
                    self.def[res.index()] = me;
                    self.def_op[res.index()] = self.ops;
                    self.ok[res.index()] = elementwise || load.is_some();
                    self.load[res.index()] = load;
                }
                for sub in &op.regions {
                    self.regions += 1;
                    for &a in &sub.args {
                        self.def[a.index()] = usize::MAX;
                    }
                    self.region(sub);
                }
            }
        }
    }
    let n = f.values.len();
    let mut w = Walk {
        f,
        prov,
        def: vec![usize::MAX; n],
        def_op: vec![0; n],
        user: vec![None; n],
        ok: vec![false; n],
        load: vec![None; n],
        // Op numbers start at 1.
        eff: vec![Eff::Pure],
        result: vec![None],
        regions: 0,
        ops: 0,
    };
    w.region(&f.body);
    let mut ok: Vec<bool> = (0..n).map(|i| w.ok[i] && w.user[i].is_some()).collect();
    let mut disjoint = Vec::new();
    for v in 0..n {
        let (Some(k), true) = (w.load[v], ok[v]) else {
            continue;
        };
        // The sink: follow single users through fusible elementwise ops.
        let mut sink = w.user[v].map_or(0, |u| u.1);
        while let Some(r) = w.result[sink] {
            match (ok[r.index()], w.user[r.index()]) {
                (true, Some(u)) => sink = u.1,
                _ => break,
            }
        }
        let mut pairs = Vec::new();
        let clear = (w.def_op[v] + 1..=sink).all(|i| match w.eff[i] {
            Eff::Pure => true,
            Eff::Store(Prov::Param(j)) if j != k => {
                pairs.push((k, j));
                true
            }
            _ => false,
        });
        if clear {
            disjoint.extend(pairs);
        } else {
            ok[v] = false;
        }
    }
    disjoint.sort_unstable();
    disjoint.dedup();
    Fusion { ok, disjoint }
}

/// Which parameter's buffer every pointer value points into (loop-carried pointers
/// take a second pass).
fn provenance(f: &Function) -> Vec<Prov> {
    let mut p = vec![Prov::Unset; f.values.len()];
    for (k, prm) in f.params.iter().enumerate() {
        if matches!(f.ty(prm.value).elem, Elem::Ptr { .. }) {
            p[prm.value.index()] = Prov::Param(k);
        }
    }
    fn yields(r: &Region) -> &[ValueId] {
        r.ops
            .last()
            .filter(|o| o.kind == OpKind::Yield)
            .map_or(&[], |o| &o.operands[..])
    }
    fn walk(r: &Region, p: &mut Vec<Prov>) {
        for op in &r.ops {
            let get = |p: &Vec<Prov>, v: ValueId| p[v.index()];
            match &op.kind {
                OpKind::AddPtr
                | OpKind::Splat
                | OpKind::Broadcast
                | OpKind::ExpandDims { .. }
                | OpKind::Reshape
                | OpKind::Permute { .. }
                | OpKind::Hint { .. } => {
                    let v = get(p, op.operands[0]);
                    p[op.results[0].index()] = v;
                }
                OpKind::Select => {
                    let v = get(p, op.operands[1]).merge(get(p, op.operands[2]));
                    p[op.results[0].index()] = v;
                }
                OpKind::RemotePtr => {
                    p[op.results[0].index()] = match get(p, op.operands[0]) {
                        Prov::Param(k) | Prov::Remote(k) => Prov::Remote(k),
                        x => x,
                    };
                }
                OpKind::For => {
                    let body = &op.regions[0];
                    for (i, &a) in body.args.iter().skip(1).enumerate() {
                        let v = get(p, a).merge(get(p, op.operands[3 + i]));
                        p[a.index()] = v;
                    }
                    walk(body, p);
                    for (i, &y) in yields(body).iter().enumerate() {
                        if let (Some(&a), Some(&r)) = (body.args.get(1 + i), op.results.get(i)) {
                            let v = get(p, a).merge(get(p, y));
                            p[a.index()] = v;
                            p[r.index()] = v;
                        }
                    }
                }
                OpKind::If => {
                    for r in &op.regions {
                        walk(r, p);
                        for (i, &y) in yields(r).iter().enumerate() {
                            if let Some(&res) = op.results.get(i) {
                                let v = get(p, res).merge(get(p, y));
                                p[res.index()] = v;
                            }
                        }
                    }
                }
                _ => {
                    for r in &op.regions {
                        walk(r, p);
                    }
                }
            }
        }
    }
    walk(&f.body, &mut p);
    walk(&f.body, &mut p);
    p
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

    /// `v` seen through shape op `op` (`expand_dims`, `reshape`, `hint`, `broadcast`,
    /// `permute`) without copying it, where that is possible: a uniform value as it
    /// is, an affine tile with new strides, a fused elementwise tree with each input
    /// seen the same way if it reads no memory (so a mask built from indices stays a
    /// few instructions per element through broadcasts), and a materialized tile
    /// through the ops that keep
    /// its row-major order. `None`: it must be materialized first.
    fn view(&mut self, v: V<'ctx>, op: &Op) -> LResult<Option<V<'ctx>>> {
        let keeps_order = matches!(
            op.kind,
            OpKind::ExpandDims { .. } | OpKind::Reshape | OpKind::Hint { .. }
        ) || (op.kind == OpKind::Broadcast
            && self.numel(op.operands[0]) == self.numel(op.results[0]));
        match v {
            V::U(_) => Ok(Some(v)),
            V::T(_) => Ok(keeps_order.then_some(v)),
            V::A(k) => self.affine_view(k, op).map(Some),
            // Only trees over indices and uniforms: those are cheap to recompute by
            // every user (a view may have several), and read no memory.
            V::F(k) if self.fused[k].reads.is_empty() && !self.has_load(k) => {
                let mut ins = Vec::with_capacity(self.fused[k].ins.len());
                for i in 0..self.fused[k].ins.len() {
                    match self.view(self.fused[k].ins[i], op)? {
                        Some(x) => ins.push(x),
                        None => return Ok(None),
                    }
                }
                let fu = &self.fused[k];
                let f = Fused {
                    op: fu.op.clone(),
                    ins,
                    cost: fu.cost,
                    reads: fu.reads.clone(),
                    site: None,
                    prov: Prov::Unset,
                };
                self.fused.push(f);
                Ok(Some(V::F(self.fused.len() - 1)))
            }
            V::F(_) => Ok(None),
        }
    }

    /// Whether fused tree `fused[k]` holds a load.
    fn has_load(&self, k: usize) -> bool {
        matches!(self.fused[k].op.kind, OpKind::Load { .. })
            || self.fused[k]
                .ins
                .iter()
                .any(|v| matches!(*v, V::F(j) if self.has_load(j)))
    }

    /// Affine tile `aff[k]` through shape op `op`.
    fn affine_view(&mut self, k: usize, op: &Op) -> LResult<V<'ctx>> {
        match &op.kind {
            OpKind::Broadcast | OpKind::Permute { .. } => {
                let src = self.shape(op.operands[0]);
                let dst = self.shape(op.results[0]);
                let st = self.aff[k].strides.clone();
                let zero = st[0].get_type().const_zero();
                let strides = match &op.kind {
                    OpKind::Permute { order } if order.len() == st.len() => {
                        order.iter().map(|&o| st[o as usize]).collect()
                    }
                    OpKind::Permute { .. } => return unsupported(op, "with a bad order"),
                    _ => (0..st.len())
                        .map(|d| {
                            if src[d] == 1 && dst[d] != 1 {
                                zero
                            } else {
                                st[d]
                            }
                        })
                        .collect(),
                };
                let base = self.aff[k].base;
                Ok(self.affine(base, strides))
            }
            _ => self.reshaped(k, op),
        }
    }

    /// An affine tile through `expand_dims`, `reshape` or `hint`: the same strides
    /// for the dimensions that are not 1, zero for the others; materialized where a
    /// reshape moves elements between dimensions.
    fn reshaped(&mut self, k: usize, op: &Op) -> LResult<V<'ctx>> {
        let src = self.shape(op.operands[0]);
        let dst = self.shape(op.results[0]);
        let big = |s: &[u64]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        if big(&src) != big(&dst) {
            return self.mat_v(V::A(k), op.operands[0]);
        }
        let st = self.aff[k].strides.clone();
        let zero = st[0].get_type().const_zero();
        let mut kept = src
            .iter()
            .zip(&st)
            .filter(|(d, _)| **d != 1)
            .map(|(_, s)| *s);
        let strides = dst
            .iter()
            .map(|&d| {
                if d == 1 {
                    zero
                } else {
                    kept.next().unwrap_or(zero)
                }
            })
            .collect();
        let base = self.aff[k].base;
        Ok(self.affine(base, strides))
    }

    /// `op` on affine and uniform operands, when the result is affine too: integer
    /// `+`, `-`, `*` (by a uniform), and `addptr`.
    fn affine_op(&mut self, op: &Op, ins: &[V<'ctx>]) -> LResult<Option<V<'ctx>>> {
        if !ins.iter().any(|v| matches!(v, V::A(_)))
            || !ins.iter().all(|v| matches!(v, V::A(_) | V::U(_)))
        {
            return Ok(None);
        }
        let rank = self.shape(op.results[0]).len();
        let int = |e: Elem| {
            e.scalar()
                .is_some_and(|s| s.is_int() && s != ScalarType::I1)
        };
        // (base, strides) of an operand, uniform ones with zero strides.
        let parts = |h: &Self, v: V<'ctx>, zero: IntValue<'ctx>| match v {
            V::A(k) => (h.aff[k].base, h.aff[k].strides.clone()),
            V::U(x) => (x, vec![zero; rank]),
            V::T(_) | V::F(_) => unreachable!("checked above"),
        };
        let b = &self.cx.b;
        match op.kind {
            OpKind::Binary(bop @ (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul))
                if int(self.elem(op.results[0])) =>
            {
                let t = self.lty(self.elem(op.results[0])).into_int_type();
                let (x, xs) = parts(self, ins[0], t.const_zero());
                let (y, ys) = parts(self, ins[1], t.const_zero());
                let (x, y) = (x.into_int_value(), y.into_int_value());
                let (base, strides) = match bop {
                    BinaryOp::Add => (
                        b.build_int_add(x, y, "")?,
                        xs.iter()
                            .zip(&ys)
                            .map(|(&p, &q)| b.build_int_add(p, q, ""))
                            .collect::<Result<_, _>>()?,
                    ),
                    BinaryOp::Sub => (
                        b.build_int_sub(x, y, "")?,
                        xs.iter()
                            .zip(&ys)
                            .map(|(&p, &q)| b.build_int_sub(p, q, ""))
                            .collect::<Result<_, _>>()?,
                    ),
                    _ => match (ins[0], ins[1]) {
                        (V::A(_), V::U(_)) => (
                            b.build_int_mul(x, y, "")?,
                            xs.iter()
                                .map(|&p| b.build_int_mul(p, y, ""))
                                .collect::<Result<_, _>>()?,
                        ),
                        (V::U(_), V::A(_)) => (
                            b.build_int_mul(x, y, "")?,
                            ys.iter()
                                .map(|&q| b.build_int_mul(x, q, ""))
                                .collect::<Result<_, _>>()?,
                        ),
                        _ => return Ok(None),
                    },
                };
                Ok(Some(self.affine(base.into(), strides)))
            }
            OpKind::AddPtr => {
                let (Elem::Ptr { pointee, .. }, Some(os)) = (
                    self.elem(op.operands[0]),
                    self.elem(op.operands[1]).scalar(),
                ) else {
                    return Ok(None);
                };
                let i64t = self.cx.ctx.i64_type();
                let (p, ps) = parts(self, ins[0], i64t.const_zero());
                let (o, ost) = parts(
                    self,
                    ins[1],
                    self.lty(Elem::Scalar(os)).into_int_type().const_zero(),
                );
                let signed = os.is_signed_int();
                let o = b.build_int_cast_sign_flag(o.into_int_value(), i64t, signed, "")?;
                let ty = self.lty(Elem::Scalar(pointee));
                // SAFETY (generated code): address arithmetic, checked at the access.
                let base = unsafe { b.build_gep(ty, p.into_pointer_value(), &[o], "") }?;
                let strides = ps
                    .iter()
                    .zip(&ost)
                    .map(|(&p, &q)| {
                        let q = b.build_int_cast_sign_flag(q, i64t, signed, "")?;
                        b.build_int_add(p, q, "")
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Some(self.affine(base.into(), strides)))
            }
            _ => Ok(None),
        }
    }

    fn elementwise(&mut self, op: &Op) -> LResult<()> {
        let ins: Vec<V<'ctx>> = op
            .operands
            .iter()
            .map(|&v| self.val(v))
            .collect::<LResult<_>>()?;
        if let Some(v) = self.affine_op(op, &ins)? {
            self.set(op, v);
            return Ok(());
        }
        let res_e = self.elem(op.results[0]);
        let in_e = self.elem(op.operands[if op.kind == OpKind::Select { 1 } else { 0 }]);
        if matches!(
            op.kind,
            OpKind::Cmp(_)
                | OpKind::Cast
                | OpKind::Bitcast
                | OpKind::Unary(_)
                | OpKind::Binary(_)
                | OpKind::Fma
        ) && in_e.scalar().is_none()
        {
            return unsupported(op, "on pointers");
        }
        let s_in = in_e.scalar().unwrap_or(ScalarType::I64);
        let div = matches!(op.kind, OpKind::Binary(BinaryOp::Div | BinaryOp::Rem)) && s_in.is_int();
        let div_site = div.then(|| {
            let shape = self.f.ty(op.results[0]).shape.clone();
            self.site(op, SiteKind::DivZero, shape)
        });
        if ins.iter().all(|v| matches!(v, V::U(_))) {
            let v = self.one(op, &ins, div_site, &[], self.i64(0))?;
            self.set(op, V::U(v));
            return Ok(());
        }
        // Fused (computed where it is read): an op with one user in its region, or a
        // comparison of affine and uniform values (a mask, one instruction to redo).
        let index_only =
            matches!(op.kind, OpKind::Cmp(_)) && ins.iter().all(|v| matches!(v, V::A(_) | V::U(_)));
        if div_site.is_none() && op.kind != OpKind::AddPtr {
            let k = self.push_fused(op, ins, None, Prov::Unset);
            let v = V::F(k);
            let fused = (index_only || self.fusible[op.results[0].index()])
                && self.fused[k].cost <= FUSE_COST;
            // Otherwise materialized here, by vector runs where they fit ([`Self::lanes`]).
            let v = if fused {
                v
            } else {
                self.mat_v(v, op.results[0])?
            };
            self.set(op, v);
            return Ok(());
        }
        let shape = self.shape(op.results[0]);
        let out = self.slot(res_e, shape.iter().product())?;
        let rm = row_major(&shape);
        self.nest(&shape, &mut |h, idx| {
            let i = h.linear(idx, &rm)?;
            let v = h.one(op, &ins, div_site, idx, i)?;
            h.put(out, res_e, i, v)
        })?;
        self.set(op, V::T(out));
        Ok(())
    }

    /// Records `op` over `ins` as fused value `fused[k]` and returns `k` (a load: with
    /// its check site and buffer).
    fn push_fused(&mut self, op: &Op, ins: Vec<V<'ctx>>, site: Option<usize>, prov: Prov) -> usize {
        let mut cost = 1;
        let mut reads = Vec::new();
        for v in &ins {
            match *v {
                V::T(p) => reads.push(p),
                V::F(k) => {
                    cost += self.fused[k].cost;
                    reads.extend_from_slice(&self.fused[k].reads);
                }
                _ => {}
            }
        }
        self.fused.push(Fused {
            op: Op {
                regions: Vec::new(),
                ..op.clone()
            },
            ins,
            cost,
            reads,
            site,
            prov,
        });
        self.fused.len() - 1
    }

    /// Element `idx` (row-major `i`) of elementwise `op` over `ins`, checking an
    /// integer divisor against zero at `div_site`.
    fn one(
        &mut self,
        op: &Op,
        ins: &[V<'ctx>],
        div_site: Option<usize>,
        idx: &[IntValue<'ctx>],
        i: IntValue<'ctx>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let args: Vec<BasicValueEnum<'ctx>> = ins
            .iter()
            .zip(&op.operands)
            .map(|(&v, &id)| self.get_at(v, self.elem(id), idx, i))
            .collect::<LResult<_>>()?;
        if let Some(site) = div_site {
            let y = args[1].into_int_value();
            let ok =
                self.cx
                    .b
                    .build_int_compare(IntPredicate::NE, y, y.get_type().const_zero(), "")?;
            self.check(ok, site, i, self.i64(0))?;
        }
        self.apply(op, &args)
    }

    /// Elementwise `op` on one element of each operand, `args`.
    fn apply(&self, op: &Op, args: &[BasicValueEnum<'ctx>]) -> LResult<BasicValueEnum<'ctx>> {
        let res_e = self.elem(op.results[0]);
        let in_e = self.elem(op.operands[if op.kind == OpKind::Select { 1 } else { 0 }]);
        let s_in = in_e.scalar().unwrap_or(ScalarType::I64);
        let s_out = res_e.scalar().unwrap_or(ScalarType::I64);
        let cx = &self.cx;
        Ok(match &op.kind {
            OpKind::Binary(BinaryOp::Pow) => {
                elementwise::pow(cx, &self.arch, s_in, args[0], args[1], &op.span)?
            }
            OpKind::Binary(bop) => elementwise::binary(cx, *bop, s_in, args[0], args[1])?,
            // exp and log in plain arithmetic, which vectorizes (a libm call per
            // element would not); the other functions as the SIMT lowering's.
            OpKind::Unary(u @ (UnaryOp::Exp | UnaryOp::Exp2))
                if matches!(s_in, ScalarType::F32 | ScalarType::F16 | ScalarType::BF16) =>
            {
                elementwise::exp_poly(cx, s_in, args[0], *u == UnaryOp::Exp2)?
            }
            OpKind::Unary(u @ (UnaryOp::Log | UnaryOp::Log2))
                if matches!(s_in, ScalarType::F32 | ScalarType::F16 | ScalarType::BF16) =>
            {
                elementwise::log_poly(cx, s_in, args[0], *u == UnaryOp::Log2)?
            }
            OpKind::Unary(u) => elementwise::unary(cx, &self.arch, *u, s_in, args[0], &op.span)?,
            OpKind::Fma => elementwise::fma(cx, s_in, args)?,
            OpKind::Cmp(p) => elementwise::cmp(cx, *p, s_in, args[0], args[1])?,
            OpKind::Select => {
                cx.b.build_select(args[0].into_int_value(), args[1], args[2], "")?
            }
            OpKind::Cast => elementwise::cast(cx, s_in, s_out, args[0])?,
            OpKind::Bitcast => cx.b.build_bit_cast(args[0], self.lty(res_e), "")?,
            OpKind::AddPtr => {
                let Elem::Ptr { pointee, .. } = self.elem(op.operands[0]) else {
                    return unsupported(op, "on a non-pointer");
                };
                let off = args[1].into_int_value();
                let signed = self
                    .elem(op.operands[1])
                    .scalar()
                    .is_none_or(|s| s.is_signed_int());
                let off =
                    cx.b.build_int_cast_sign_flag(off, cx.ctx.i64_type(), signed, "")?;
                let ty = self.lty(Elem::Scalar(pointee));
                // SAFETY (generated code): plain address arithmetic; accesses
                // are checked where they happen.
                unsafe { cx.b.build_gep(ty, args[0].into_pointer_value(), &[off], "") }?.into()
            }
            _ => return unsupported(op, "is not elementwise"),
        })
    }

    /// Whether a pointer of provenance `prov` may point into a peer's memory.
    fn reaches_peers(&self, prov: Prov) -> bool {
        match prov {
            Prov::Remote(_) => true,
            Prov::Mixed | Prov::Unset => self.remote,
            Prov::Param(_) => false,
        }
    }

    /// With checks on: `addr` must lie inside the buffer its pointer came from
    /// (for a pointer that may reach a peer: inside some rank's copy of it, which
    /// the runtime's [`CHECK`] knows).
    fn check_access(
        &self,
        site: usize,
        prov: Prov,
        addr: PointerValue<'ctx>,
        esize: u64,
        lane: IntValue<'ctx>,
    ) -> LResult<()> {
        let (ok, index) = self.in_bounds(prov, addr, esize)?;
        self.check(ok, site, lane, index)
    }

    /// Whether the `esize` bytes at `addr` lie inside the buffer of provenance `prov`
    /// (for a pointer that may reach a peer: inside some rank's copy of it, which the
    /// runtime's [`CHECK`] knows), and the element index of `addr` in it.
    fn in_bounds(
        &self,
        prov: Prov,
        addr: PointerValue<'ctx>,
        esize: u64,
    ) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
        let b = &self.cx.b;
        let i64t = self.cx.ctx.i64_type();
        let a = b.build_ptr_to_int(addr, i64t, "")?;
        if self.reaches_peers(prov) {
            let k = param_of(prov).map_or(-1i64, |k| k as i64);
            let f = self.runtime_fn(CHECK, i64t.into(), &[i64t.into(); 3])?;
            let off = b
                .build_call(
                    f,
                    &[self.i64(k as u64).into(), a.into(), self.i64(esize).into()],
                    "",
                )?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| LowerError::Llvm("check returns nothing".into()))?
                .into_int_value();
            let ok = b.build_int_compare(IntPredicate::EQ, off, self.i64(i64::MIN as u64), "")?;
            let index = b.build_int_signed_div(off, self.i64(esize), "")?;
            return Ok((ok, index));
        }
        let params: Vec<usize> = match prov {
            Prov::Param(k) => vec![k],
            _ => (0..self.f.params.len())
                .filter(|&k| matches!(self.f.ty(self.f.params[k].value).elem, Elem::Ptr { .. }))
                .collect(),
        };
        let mut ok = self.cx.ctx.bool_type().const_zero();
        let mut first_off = None;
        for k in params {
            let b = &self.cx.b;
            let (base, len) = self.extent(k)?;
            let off = b.build_int_sub(a, base, "")?;
            let lim = b.build_int_sub(len, self.i64(esize), "")?;
            let lo = b.build_int_compare(IntPredicate::SGE, off, self.i64(0), "")?;
            let hi = b.build_int_compare(IntPredicate::SLE, off, lim, "")?;
            let inb = b.build_and(lo, hi, "")?;
            ok = b.build_or(ok, inb, "")?;
            first_off.get_or_insert(off);
        }
        let index = match first_off {
            Some(off) => self.cx.b.build_int_signed_div(off, self.i64(esize), "")?,
            None => self.i64(0),
        };
        Ok((ok, index))
    }

    /// Whether the `w` elements of `esize` bytes from `addr` (one vector access) lie
    /// inside the buffer of provenance `prov`: the bytes the access touches (not the
    /// addresses the lanes' own offsets give, which an index overflow could leave
    /// apart), tested as one range, so a run costs a subtraction and a comparison
    /// (the buffer's base and bounds are loop-invariant), not `w` checks. The result
    /// is marked likely: a run that fails takes the lane-by-lane path, whose checks
    /// report the first element outside, as the interpreter does.
    fn run_in_bounds(
        &self,
        prov: Prov,
        addr: PointerValue<'ctx>,
        esize: u64,
        w: u32,
    ) -> LResult<IntValue<'ctx>> {
        let b = &self.cx.b;
        let bytes = w as u64 * esize;
        let ok = match prov {
            Prov::Param(k) if !self.reaches_peers(prov) => {
                let i64t = self.cx.ctx.i64_type();
                let a = b.build_ptr_to_int(addr, i64t, "")?;
                let (base, len) = self.extent(k)?;
                // off in [0, len - bytes]: `lim >= 0` and `off <= lim` unsigned (a
                // negative `off` is a huge unsigned one).
                let off = b.build_int_sub(a, base, "")?;
                let lim = b.build_int_sub(len, self.i64(bytes), "")?;
                let fits = b.build_int_compare(IntPredicate::SGE, lim, self.i64(0), "")?;
                let inside = b.build_int_compare(IntPredicate::ULE, off, lim, "")?;
                b.build_and(fits, inside, "")?
            }
            _ => {
                let (first, _) = self.in_bounds(prov, addr, esize)?;
                let i8t = self.cx.ctx.i8_type().into();
                let last = self.gep(i8t, addr, self.i64(bytes - esize))?;
                let (last, _) = self.in_bounds(prov, last, esize)?;
                b.build_and(first, last, "")?
            }
        };
        self.likely(ok)
    }

    /// With checks on: the lanes of the run of `mask.len()` elements of `esize`
    /// bytes from `addr` (row-major elements from `lin0`) where `mask` holds lie
    /// inside parameter `param`'s buffer, tested by one vector comparison; the first
    /// lane outside fails the kernel at `site` with its own index.
    fn check_lanes(
        &self,
        site: usize,
        param: usize,
        addr: PointerValue<'ctx>,
        esize: u64,
        mask: inkwell::values::VectorValue<'ctx>,
        lin0: IntValue<'ctx>,
    ) -> LResult<()> {
        let b = &self.cx.b;
        let w = mask.get_type().get_size();
        let i64t = self.cx.ctx.i64_type();
        let a = b.build_ptr_to_int(addr, i64t, "")?;
        let (base, len) = self.extent(param)?;
        let off0 = b.build_int_sub(a, base, "")?;
        let lim = b.build_int_sub(len, self.i64(esize), "")?;
        let steps: Vec<IntValue<'ctx>> = (0..w).map(|j| self.i64(j as u64 * esize)).collect();
        let offs = b.build_int_add(
            self.splat(off0.into(), w)?,
            VectorType::const_vector(&steps),
            "",
        )?;
        let zero = i64t.vec_type(w).const_zero();
        let lo = b.build_int_compare(IntPredicate::SGE, offs, zero, "")?;
        let hi = b.build_int_compare(IntPredicate::SLE, offs, self.splat(lim.into(), w)?, "")?;
        let inside = b.build_and(lo, hi, "")?;
        let bad = b.build_and(mask, b.build_not(inside, "")?, "")?;
        let word_t = self
            .cx
            .ctx
            .custom_width_int_type(
                std::num::NonZero::new(w).unwrap_or(std::num::NonZero::<u32>::MIN),
            )
            .map_err(|m| LowerError::Llvm(m.into()))?;
        let word = b.build_bit_cast(bad, word_t, "")?.into_int_value();
        let ok = b.build_int_compare(IntPredicate::EQ, word, word_t.const_zero(), "")?;
        // The first bad lane (its bit's position; only read when there is one).
        let j = self
            .cx
            .call_intrinsic(
                "llvm.cttz",
                &[word_t.into()],
                &[word.into(), self.cx.ctx.bool_type().const_zero().into()],
            )?
            .into_int_value();
        let j = b.build_int_z_extend_or_bit_cast(j, i64t, "")?;
        let lane = b.build_int_add(lin0, j, "")?;
        let index = b.build_int_add(b.build_int_signed_div(off0, self.i64(esize), "")?, j, "")?;
        self.check(ok, site, lane, index)
    }

    /// Parameter `k`'s base address and length in bytes, read once at the
    /// function's entry (so that every check uses the same values, which LLVM need
    /// not reload after the kernel's stores, nor speculate inside its branches).
    fn extent(&self, k: usize) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)> {
        self.extents
            .get(k)
            .copied()
            .flatten()
            .ok_or_else(|| LowerError::Llvm(format!("parameter {k} is not a buffer")))
    }

    /// `c`, marked as most likely true (`llvm.expect`): the checks' failure paths
    /// are laid out of the way.
    fn likely(&self, c: IntValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let t = self.cx.ctx.bool_type();
        Ok(self
            .cx
            .call_intrinsic(
                "llvm.expect",
                &[t.into()],
                &[c.into(), t.const_all_ones().into()],
            )?
            .into_int_value())
    }

    fn load(&mut self, op: &Op, has_mask: bool, has_other: bool) -> LResult<()> {
        let Elem::Ptr { pointee, .. } = self.elem(op.operands[0]) else {
            return unsupported(op, "through a non-pointer");
        };
        let e = Elem::Scalar(pointee);
        let ty = self.lty(e);
        let ptrs = self.val(op.operands[0])?;
        let pe = self.elem(op.operands[0]);
        let mask = has_mask.then(|| self.val(op.operands[1])).transpose()?;
        let n = self.numel(op.results[0]);
        let prov = self.prov[op.operands[0].index()];
        let site = self.checked.then(|| {
            let shape = self.f.ty(op.results[0]).shape.clone();
            self.site(
                op,
                SiteKind::Access {
                    param: param_of(prov),
                    remote: self.reaches_peers(prov),
                },
                shape,
            )
        });
        // Fused: read where its user reads it ([`fusible`] checked that nothing
        // writes that buffer in between).
        // Not with the sanitizer: a fused load is read only where its consumer reads
        // it (a masked store's live lanes), and every access the program makes must
        // be checked, as the interpreter checks it.
        let fused = self.fusible[op.results[0].index()]
            && !self.sanitize
            && !(matches!(ptrs, V::U(_)) && mask.is_none_or(|m| matches!(m, V::U(_))));
        // Materialized, a computed `other` is materialized first: the vector path,
        // which skips it, then stays open (and it is read once per masked-off lane,
        // not recomputed).
        let other = match (has_other, fused) {
            (false, _) => None,
            (true, true) => Some(self.val(op.operands[2])?),
            (true, false) => Some(self.mat(op.operands[2])?),
        };
        let mut ins = vec![ptrs];
        ins.extend(mask);
        ins.extend(other);
        let k = self.push_fused(op, ins, site, prov);
        if fused {
            self.set(op, V::F(k));
            return Ok(());
        }
        if matches!(ptrs, V::U(_)) && mask.is_none_or(|m| matches!(m, V::U(_))) && n == 1 {
            let v = self.load_elem(k, self.i64(0), &|h, v, e| h.get_at(v, e, &[], h.i64(0)))?;
            self.set(op, V::U(v));
            return Ok(());
        }
        let out = self.slot(e, n)?;
        let shape = self.shape(op.results[0]);
        let prov_site = site.map(|s| (s, prov));
        self.chunked(
            &shape,
            (ptrs, pe, e),
            mask,
            prov_site,
            // (The load itself: its lanes are trusted with its tile.)
            Some(V::F(k)),
            &mut |h, idx, i| {
                let v = h.load_elem(k, i, &|h, v, e| h.get_at(v, e, idx, i))?;
                h.put(out, e, i, v)
            },
            &mut |h, _, lin0, addr0, w| {
                let vt = vec_of(ty, w)?;
                let x = h.cx.b.build_load(vt, addr0, "")?;
                set_align(x, elem_bytes(e));
                let dst = h.gep(ty, out, lin0)?;
                let st = h.cx.b.build_store(dst, x)?;
                let _ = st.set_alignment(elem_bytes(e) as u32);
                Ok(())
            },
        )?;
        if self.f.ty(op.results[0]).shape.is_empty() {
            let v = self.get(V::T(out), e, self.i64(0))?;
            self.set(op, V::U(v));
        } else {
            self.set(op, V::T(out));
        }
        Ok(())
    }

    /// One element (row-major index `lin`) of the load `fused[k]`, its operands' elements
    /// read by `at`: the mask tested first, a masked-off lane taking `other` (or zero)
    /// without touching memory, the address checked with checks on.
    fn load_elem(
        &self,
        k: usize,
        lin: IntValue<'ctx>,
        at: &dyn Fn(&Self, V<'ctx>, Elem) -> LResult<BasicValueEnum<'ctx>>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let fu = &self.fused[k];
        let (
            OpKind::Load {
                has_mask,
                has_other,
            },
            Elem::Ptr { pointee, .. },
        ) = (&fu.op.kind, self.elem(fu.op.operands[0]))
        else {
            return unsupported(&fu.op, "is not a load through pointers");
        };
        let pe = self.elem(fu.op.operands[0]);
        let e = Elem::Scalar(pointee);
        let ty = self.lty(e);
        let fill = match (has_other, fu.ins.get(2)) {
            (true, Some(&o)) => at(self, o, e)?,
            _ => ty.const_zero(),
        };
        let m = match (has_mask, fu.ins.get(1)) {
            (true, Some(&m)) => Some(at(self, m, Elem::Scalar(ScalarType::I1))?.into_int_value()),
            _ => None,
        };
        // (After the operands, which may have branched.)
        let pre = self.here()?;
        let (on, join) = (self.block("ld"), self.block("ldj"));
        match m {
            Some(m) => self.cx.b.build_conditional_branch(m, on, join)?,
            None => self.cx.b.build_unconditional_branch(on)?,
        };
        self.cx.b.position_at_end(on);
        let addr = at(self, fu.ins[0], pe)?.into_pointer_value();
        if let Some(s) = fu.site
            && !self.trusted.contains(&k)
        {
            self.check_access(s, fu.prov, addr, elem_bytes(e), lin)?;
        }
        let x = self.cx.b.build_load(ty, addr, "")?;
        let on_end = self.here()?;
        self.cx.b.build_unconditional_branch(join)?;
        self.cx.b.position_at_end(join);
        let phi = self.cx.b.build_phi(ty, "")?;
        phi.add_incoming(&[(&x, on_end)]);
        if *has_mask {
            phi.add_incoming(&[(&fill, pre)]);
        }
        Ok(phi.as_basic_value())
    }

    fn store(&mut self, op: &Op, has_mask: bool) -> LResult<()> {
        let Elem::Ptr { pointee, .. } = self.elem(op.operands[0]) else {
            return unsupported(op, "through a non-pointer");
        };
        let e = Elem::Scalar(pointee);
        let ptrs = self.val(op.operands[0])?;
        let pe = self.elem(op.operands[0]);
        let vals = self.val(op.operands[1])?;
        let mask = has_mask.then(|| self.val(op.operands[2])).transpose()?;
        let shape = if self.numel(op.operands[0]) >= self.numel(op.operands[1]) {
            self.shape(op.operands[0])
        } else {
            self.shape(op.operands[1])
        };
        let prov = self.prov[op.operands[0].index()];
        let site = self.checked.then(|| {
            let shape = self.f.ty(op.operands[0]).shape.clone();
            self.site(
                op,
                SiteKind::Access {
                    param: param_of(prov),
                    remote: self.reaches_peers(prov),
                },
                shape,
            )
        });
        let bool_e = Elem::Scalar(ScalarType::I1);
        let ty = self.lty(e);
        // An affine value is materialized (the chunks read tile slots or compute a
        // fused value lane by lane).
        let vals = match vals {
            V::A(_) => self.mat_v(vals, op.operands[1])?,
            v => v,
        };
        let prov_site = site.map(|s| (s, prov));
        self.chunked(
            &shape,
            (ptrs, pe, e),
            mask,
            prov_site,
            Some(vals),
            &mut |h, idx, i| {
                let (on, join) = (h.block("st"), h.block("stj"));
                match mask {
                    Some(m) => {
                        let m = h.get_at(m, bool_e, idx, i)?.into_int_value();
                        h.cx.b.build_conditional_branch(m, on, join)?;
                    }
                    None => {
                        h.cx.b.build_unconditional_branch(on)?;
                    }
                }
                h.cx.b.position_at_end(on);
                let addr = h.get_at(ptrs, pe, idx, i)?.into_pointer_value();
                if let Some(s) = site {
                    h.check_access(s, prov, addr, elem_bytes(e), i)?;
                }
                let x = h.get_at(vals, e, idx, i)?;
                h.cx.b.build_store(addr, x)?;
                h.cx.b.build_unconditional_branch(join)?;
                h.cx.b.position_at_end(join);
                Ok(())
            },
            &mut |h, full, lin0, addr0, w| {
                let vt = vec_of(ty, w)?;
                let x: BasicValueEnum = match vals {
                    V::U(x) => h.splat(x, w)?.into(),
                    V::F(_) => h.lanes(vals, e, full, lin0, w)?.into(),
                    _ => {
                        let src = h.gep(
                            ty,
                            match vals {
                                V::T(p) => p,
                                _ => {
                                    return Err(LowerError::Llvm(
                                        "affine values stored by chunks".into(),
                                    ));
                                }
                            },
                            lin0,
                        )?;
                        let x = h.cx.b.build_load(vt, src, "")?;
                        set_align(x, elem_bytes(e));
                        x
                    }
                };
                let st = h.cx.b.build_store(addr0, x)?;
                let _ = st.set_alignment(elem_bytes(e) as u32);
                Ok(())
            },
        )
    }

    /// The `w` elements of `v` from multi-index `idx` (row-major index `lin0`) along
    /// the last dimension, as a vector: a slot's run and a contiguous fused load
    /// (checked at the run's ends) as vector loads, a fused elementwise op lane by lane
    /// over its operands' vectors, anything else lane by lane (straight-line code
    /// that LLVM's SLP vectorizer turns into vector instructions).
    fn lanes(
        &self,
        v: V<'ctx>,
        e: Elem,
        idx: &[IntValue<'ctx>],
        lin0: IntValue<'ctx>,
        w: u32,
    ) -> LResult<inkwell::values::VectorValue<'ctx>> {
        let b = &self.cx.b;
        let i32t = self.cx.ctx.i32_type();
        let bool_e = Elem::Scalar(ScalarType::I1);
        match v {
            V::U(x) => return self.splat(x, w),
            V::T(p) if e != bool_e => {
                let ty = self.lty(e);
                let x = b.build_load(vec_of(ty, w)?, self.gep(ty, p, lin0)?, "")?;
                set_align(x, elem_bytes(e));
                return Ok(x.into_vector_value());
            }
            // An integer index tile: its first lane plus the last stride times 0..w.
            V::A(k)
                if matches!(e, Elem::Scalar(_))
                    && !idx.is_empty()
                    && self.aff[k].strides.len() == idx.len() =>
            {
                let x0 = self.get_at(v, e, idx, lin0)?.into_int_value();
                let t = x0.get_type();
                let st = self.aff[k].strides[idx.len() - 1];
                let iota: Vec<IntValue<'ctx>> =
                    (0..w).map(|j| t.const_int(j as u64, false)).collect();
                let steps = b.build_int_mul(
                    self.splat(st.into(), w)?,
                    VectorType::const_vector(&iota),
                    "",
                )?;
                return Ok(b.build_int_add(self.splat(x0.into(), w)?, steps, "")?);
            }
            V::F(k) => {
                let fu = &self.fused[k];
                let ops = &fu.op.operands;
                match fu.op.kind {
                    OpKind::Load {
                        has_mask,
                        has_other,
                    } if self.unit_stride(fu.ins[0]) => {
                        let site = fu.site.filter(|_| !self.trusted.contains(&k));
                        let prov = fu.prov;
                        let pe = self.elem(ops[0]);
                        let vt = vec_of(self.lty(e), w)?;
                        let addr0 = self.get_at(fu.ins[0], pe, idx, lin0)?.into_pointer_value();
                        if !has_mask && site.is_none() {
                            let x = b.build_load(vt, addr0, "")?;
                            set_align(x, elem_bytes(e));
                            return Ok(x.into_vector_value());
                        }
                        let m = if has_mask {
                            Some(self.lanes(fu.ins[1], bool_e, idx, lin0, w)?)
                        } else {
                            None
                        };
                        let pass = if has_other {
                            self.lanes(fu.ins[2], e, idx, lin0, w)?
                        } else {
                            vt.const_zero()
                        };
                        // A run whose mask holds everywhere (the common case) takes a
                        // plain load: a masked one costs half again on AMD Zen 2
                        // (layernorm's first pass, measured). So does a run inside
                        // its buffer, where accesses are checked.
                        let all = match m {
                            Some(m) => self.all_set(m)?,
                            None => self.cx.ctx.bool_type().const_all_ones(),
                        };
                        let all = match site {
                            Some(_) => {
                                let inb = self.run_in_bounds(prov, addr0, elem_bytes(e), w)?;
                                b.build_and(all, inb, "")?
                            }
                            None => all,
                        };
                        let (full, part, join) =
                            (self.block("ldv"), self.block("ldm"), self.block("ldvj"));
                        b.build_conditional_branch(all, full, part)?;
                        b.position_at_end(full);
                        let x = b.build_load(vt, addr0, "")?;
                        set_align(x, elem_bytes(e));
                        b.build_unconditional_branch(join)?;
                        b.position_at_end(part);
                        // A partly masked run (a tile's edge), or one that leaves its
                        // buffer: with checks, lane by lane, each lane loaded (and
                        // checked) only where its mask holds.
                        let y = match (site, m, prov) {
                            (None, Some(m), _) => {
                                self.masked_load(vt, addr0, m, pass, elem_bytes(e))?
                            }
                            // One buffer: every live lane checked at once (a vector
                            // comparison), the first one outside reported.
                            (Some(s), m, Prov::Param(p)) if !self.reaches_peers(prov) => {
                                let m = match m {
                                    Some(m) => m,
                                    None => self.splat(
                                        self.cx.ctx.bool_type().const_all_ones().into(),
                                        w,
                                    )?,
                                };
                                self.check_lanes(s, p, addr0, elem_bytes(e), m, lin0)?;
                                self.masked_load(vt, addr0, m, pass, elem_bytes(e))?
                            }
                            _ => {
                                let mut y = vt.get_undef();
                                for j in 0..w {
                                    let mut at = idx.to_vec();
                                    let r = at.len();
                                    at[r - 1] =
                                        b.build_int_add(idx[r - 1], self.i64(j as u64), "")?;
                                    let lin = b.build_int_add(lin0, self.i64(j as u64), "")?;
                                    let x = self
                                        .load_elem(k, lin, &|h, v, e| h.get_at(v, e, &at, lin))?;
                                    let jj = i32t.const_int(j as u64, false);
                                    y = b.build_insert_element(y, x, jj, "")?;
                                }
                                y
                            }
                        };
                        let part_end = self.here()?;
                        b.build_unconditional_branch(join)?;
                        b.position_at_end(join);
                        let phi = b.build_phi(vt, "")?;
                        phi.add_incoming(&[(&x, full), (&y, part_end)]);
                        return Ok(phi.as_basic_value().into_vector_value());
                    }
                    OpKind::Load { .. } => {}
                    _ if ops.iter().all(|&o| matches!(self.elem(o), Elem::Scalar(_))) => {
                        let vs: Vec<_> = fu
                            .ins
                            .iter()
                            .zip(ops)
                            .map(|(&v, &o)| self.lanes(v, self.elem(o), idx, lin0, w))
                            .collect::<LResult<_>>()?;
                        let mut out = vec_of(self.lty(e), w)?.get_undef();
                        for j in 0..w {
                            let jj = i32t.const_int(j as u64, false);
                            let args: Vec<BasicValueEnum<'ctx>> = vs
                                .iter()
                                .map(|&x| b.build_extract_element(x, jj, ""))
                                .collect::<Result<_, _>>()?;
                            let x = self.apply(&fu.op, &args)?;
                            out = b.build_insert_element(out, x, jj, "")?;
                        }
                        return Ok(out);
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        let r = idx.len();
        let mut out = vec_of(self.lty(e), w)?.get_undef();
        for j in 0..w {
            let mut at = idx.to_vec();
            if r > 0 {
                at[r - 1] = b.build_int_add(idx[r - 1], self.i64(j as u64), "")?;
            }
            let lin = b.build_int_add(lin0, self.i64(j as u64), "")?;
            let x = self.get_at(v, e, &at, lin)?;
            let k = i32t.const_int(j as u64, false);
            out = b.build_insert_element(out, x, k, "")?;
        }
        Ok(out)
    }

    /// `llvm.masked.load` of a `vt` from `addr` (aligned to `align` bytes): lanes
    /// where `mask` is false are not read and take `pass`'s.
    fn masked_load(
        &self,
        vt: inkwell::types::VectorType<'ctx>,
        addr: PointerValue<'ctx>,
        mask: inkwell::values::VectorValue<'ctx>,
        pass: inkwell::values::VectorValue<'ctx>,
        align: u64,
    ) -> LResult<inkwell::values::VectorValue<'ctx>> {
        let intr = inkwell::intrinsics::Intrinsic::find("llvm.masked.load")
            .ok_or_else(|| LowerError::Llvm("no llvm.masked.load".into()))?;
        let decl = intr
            .get_declaration(&self.cx.module, &[vt.into(), addr.get_type().into()])
            .ok_or_else(|| LowerError::Llvm(format!("no llvm.masked.load for {vt}")))?;
        let call = self
            .cx
            .b
            .build_call(decl, &[addr.into(), mask.into(), pass.into()], "")?;
        let kind = Attribute::get_named_enum_kind_id("align");
        call.add_attribute(
            AttributeLoc::Param(0),
            self.cx.ctx.create_enum_attribute(kind, align),
        );
        call.try_as_basic_value()
            .basic()
            .map(|x| x.into_vector_value())
            .ok_or_else(|| LowerError::Llvm("llvm.masked.load returned nothing".into()))
    }

    /// Whether pointer tile `v` is affine with a unit stride along its last dimension.
    fn unit_stride(&self, v: V<'ctx>) -> bool {
        match v {
            V::A(k) => {
                self.aff[k]
                    .strides
                    .last()
                    .and_then(|s| s.get_zero_extended_constant())
                    == Some(1)
            }
            _ => false,
        }
    }

    /// Whether every lane of the `i1` vector `bits` is set.
    fn all_set(&self, bits: inkwell::values::VectorValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let w = bits.get_type().get_size();
        let word_t = self
            .cx
            .ctx
            .custom_width_int_type(
                std::num::NonZero::new(w).unwrap_or(std::num::NonZero::<u32>::MIN),
            )
            .map_err(|m| LowerError::Llvm(m.into()))?;
        let b = &self.cx.b;
        let word = b.build_bit_cast(bits, word_t, "")?.into_int_value();
        Ok(b.build_int_compare(IntPredicate::EQ, word, word_t.const_all_ones(), "")?)
    }

    /// `x` in every lane of a `w`-lane vector.
    fn splat(
        &self,
        x: BasicValueEnum<'ctx>,
        w: u32,
    ) -> LResult<inkwell::values::VectorValue<'ctx>> {
        let vt = vec_of(x.get_type(), w)?;
        let mut v = vt.get_undef();
        for k in 0..w {
            let k = self.cx.ctx.i32_type().const_int(k as u64, false);
            v = self.cx.b.build_insert_element(v, x, k, "")?;
        }
        Ok(v)
    }

    /// [`Self::chunked_once`], in two versions where accesses are checked: when the
    /// whole tile's addresses through `ptrs`, and those of the contiguous loads fused
    /// into `reads` (what a store writes), lie inside their buffers (one test each,
    /// from the affine pointers' extremes), loops without per-run checks; else the
    /// loops with them (a tile at a buffer's edge, or an access outside one).
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn chunked(
        &mut self,
        shape: &[u64],
        (ptrs, pe, e): (V<'ctx>, Elem, Elem),
        mask: Option<V<'ctx>>,
        check: Option<(usize, Prov)>,
        reads: Option<V<'ctx>>,
        lane: &mut dyn FnMut(&mut Self, &[IntValue<'ctx>], IntValue<'ctx>) -> LResult<()>,
        chunk: &mut dyn FnMut(
            &mut Self,
            &[IntValue<'ctx>],
            IntValue<'ctx>,
            PointerValue<'ctx>,
            u32,
        ) -> LResult<()>,
    ) -> LResult<()> {
        let Some((_, prov)) = check else {
            return self.chunked_once(shape, (ptrs, pe, e), mask, None, lane, chunk);
        };
        let own = self.tile_in_bounds(ptrs, prov, shape, elem_bytes(e))?;
        self.versioned(shape, own, reads, &mut |h, fast| {
            let check = if fast && own.is_some() { None } else { check };
            h.chunked_once(shape, (ptrs, pe, e), mask, check, lane, chunk)
        })
    }

    /// Emits `emit` in two versions where that saves checks: when `own` (a tile's
    /// own pointer test, if any) and the tile tests of the contiguous loads fused into
    /// `reads` all hold, `emit(true)` with those loads read unchecked ([`H::trusted`]);
    /// else `emit(false)`, every access checked. Once, checked, when there is nothing
    /// to test.
    fn versioned(
        &mut self,
        shape: &[u64],
        own: Option<IntValue<'ctx>>,
        reads: Option<V<'ctx>>,
        emit: &mut dyn FnMut(&mut Self, bool) -> LResult<()>,
    ) -> LResult<()> {
        let mut loads = Vec::new();
        if let Some(v) = reads {
            self.fused_loads(v, &mut loads);
        }
        let mut ok = own;
        let mut trusted = Vec::new();
        for k in loads {
            let fu = &self.fused[k];
            let (Some(&p), Elem::Ptr { pointee, .. }) =
                (fu.ins.first(), self.elem(fu.op.operands[0]))
            else {
                continue;
            };
            if fu.site.is_none() || self.shape(fu.op.results[0]) != shape {
                continue;
            }
            let prov = fu.prov;
            let esize = elem_bytes(Elem::Scalar(pointee));
            if let Some(t) = self.tile_in_bounds(p, prov, shape, esize)? {
                ok = Some(match ok {
                    Some(o) => self.cx.b.build_and(o, t, "")?,
                    None => t,
                });
                trusted.push(k);
            }
        }
        let Some(ok) = ok else {
            return emit(self, false);
        };
        let ok = self.likely(ok)?;
        let (fast, slow, join) = (self.block("tile"), self.block("edge"), self.block("tilej"));
        self.cx.b.build_conditional_branch(ok, fast, slow)?;
        self.cx.b.position_at_end(fast);
        let saved = std::mem::replace(&mut self.trusted, trusted);
        let r = emit(self, true);
        self.trusted = saved;
        r?;
        self.cx.b.build_unconditional_branch(join)?;
        self.cx.b.position_at_end(slow);
        emit(self, false)?;
        self.cx.b.build_unconditional_branch(join)?;
        self.cx.b.position_at_end(join);
        Ok(())
    }

    /// The fused loads `v` reads (through fused elementwise ops).
    fn fused_loads(&self, v: V<'ctx>, out: &mut Vec<usize>) {
        if let V::F(k) = v {
            if matches!(self.fused[k].op.kind, OpKind::Load { .. }) {
                out.push(k);
            }
            for &i in &self.fused[k].ins {
                self.fused_loads(i, out);
            }
        }
    }

    /// Whether every address of the affine pointer tile `ptrs` over `shape` (its
    /// extremes: the base plus each dimension's most negative and most positive
    /// step) lies inside the one buffer of provenance `prov`; `None` for a pointer
    /// that is not affine or may reach several buffers (checked access by access).
    fn tile_in_bounds(
        &self,
        ptrs: V<'ctx>,
        prov: Prov,
        shape: &[u64],
        esize: u64,
    ) -> LResult<Option<IntValue<'ctx>>> {
        let (V::A(k), Prov::Param(p)) = (ptrs, prov) else {
            return Ok(None);
        };
        if self.reaches_peers(prov) || self.aff[k].strides.len() != shape.len() {
            return Ok(None);
        }
        let b = &self.cx.b;
        let i64t = self.cx.ctx.i64_type();
        let (mut lo, mut hi) = (self.i64(0), self.i64(0));
        for (&n, &st) in shape.iter().zip(&self.aff[k].strides) {
            if n == 0 {
                return Ok(None);
            }
            let st = b.build_int_s_extend_or_bit_cast(st, i64t, "")?;
            let ext = b.build_int_mul(st, self.i64(n - 1), "")?;
            let neg = b.build_int_compare(IntPredicate::SLT, ext, self.i64(0), "")?;
            let down = b.build_select(neg, ext, self.i64(0), "")?.into_int_value();
            let up = b.build_select(neg, self.i64(0), ext, "")?.into_int_value();
            lo = b.build_int_add(lo, down, "")?;
            hi = b.build_int_add(hi, up, "")?;
        }
        let base = self.aff[k].base.into_pointer_value();
        let a = b.build_ptr_to_int(base, i64t, "")?;
        let (start, len) = self.extent(p)?;
        // Byte offsets of the lowest and highest element from the buffer's start.
        let off = b.build_int_sub(a, start, "")?;
        let lo_b = b.build_int_add(off, b.build_int_mul(lo, self.i64(esize), "")?, "")?;
        let hi_b = b.build_int_add(off, b.build_int_mul(hi, self.i64(esize), "")?, "")?;
        let lim = b.build_int_sub(len, self.i64(esize), "")?;
        let above = b.build_int_compare(IntPredicate::SGE, lo_b, self.i64(0), "")?;
        let below = b.build_int_compare(IntPredicate::SLE, hi_b, lim, "")?;
        Ok(Some(b.build_and(above, below, "")?))
    }

    /// Runs `lane(idx, lin)` for every element of `shape`, except that where
    /// `ptrs` (element type `pe`, pointing to `e`) is affine with a unit stride along
    /// the last dimension (a multiple of 8), a run of `w` lanes along it whose
    /// `mask` holds everywhere runs `chunk(idx0, lin0, addr0, w)` instead: one vector
    /// access from the run's first address (whose run the checks cover at both
    /// ends, `check`).
    #[allow(clippy::type_complexity)]
    fn chunked_once(
        &mut self,
        shape: &[u64],
        (ptrs, pe, e): (V<'ctx>, Elem, Elem),
        mask: Option<V<'ctx>>,
        check: Option<(usize, Prov)>,
        lane: &mut dyn FnMut(&mut Self, &[IntValue<'ctx>], IntValue<'ctx>) -> LResult<()>,
        chunk: &mut dyn FnMut(
            &mut Self,
            &[IntValue<'ctx>],
            IntValue<'ctx>,
            PointerValue<'ctx>,
            u32,
        ) -> LResult<()>,
    ) -> LResult<()> {
        let rm = row_major(shape);
        let r = shape.len();
        let unit = self.unit_stride(ptrs);
        let last = shape.last().copied().unwrap_or(0);
        let w: u32 = if last % 16 == 0 { 16 } else { 8 };
        let vectorizable = unit
            && last % w as u64 == 0
            && e != Elem::Scalar(ScalarType::I1)
            && !matches!(mask, Some(V::A(_)))
            && (mask.is_some() || !matches!(ptrs, V::U(_)));
        if !vectorizable {
            return self.nest(shape, &mut |h, idx| {
                let i = h.linear(idx, &rm)?;
                lane(h, idx, i)
            });
        }
        let mut outer = shape.to_vec();
        outer[r - 1] = last / w as u64;
        self.nest(&outer, &mut |h, idx| {
            let b = &h.cx.b;
            let mut full = idx.to_vec();
            full[r - 1] = b.build_int_mul(idx[r - 1], h.i64(w as u64), "")?;
            let lin0 = h.linear(&full, &rm)?;
            let all = match mask {
                None => h.cx.ctx.bool_type().const_all_ones(),
                Some(V::U(m)) => m.into_int_value(),
                Some(V::T(p)) => {
                    let i8t = h.cx.ctx.i8_type();
                    let src = h.gep(i8t.into(), p, lin0)?;
                    let mv = b.build_load(i8t.vec_type(w), src, "")?.into_vector_value();
                    let bits = b.build_int_compare(
                        IntPredicate::NE,
                        mv,
                        i8t.vec_type(w).const_zero(),
                        "",
                    )?;
                    h.all_set(bits)?
                }
                Some(m @ V::F(_)) => {
                    let bits = h.lanes(m, Elem::Scalar(ScalarType::I1), &full, lin0, w)?;
                    h.all_set(bits)?
                }
                Some(V::A(_)) => unreachable!("not vectorizable"),
            };
            let addr0 = h.get_at(ptrs, pe, &full, lin0)?.into_pointer_value();
            let all = match check {
                Some((_, prov)) => {
                    let inb = h.run_in_bounds(prov, addr0, elem_bytes(e), w)?;
                    h.cx.b.build_and(all, inb, "")?
                }
                None => all,
            };
            let (fast, slow, join) = (h.block("vec"), h.block("lanes"), h.block("vecj"));
            h.cx.b.build_conditional_branch(all, fast, slow)?;
            h.cx.b.position_at_end(fast);
            chunk(h, &full, lin0, addr0, w)?;
            h.cx.b.build_unconditional_branch(join)?;
            h.cx.b.position_at_end(slow);
            h.counted(w as u64, &mut |h, j| {
                let mut at = full.clone();
                at[r - 1] = h.cx.b.build_int_add(full[r - 1], j, "")?;
                let lin = h.cx.b.build_int_add(lin0, j, "")?;
                lane(h, &at, lin)
            })?;
            h.cx.b.build_unconditional_branch(join)?;
            h.cx.b.position_at_end(join);
            Ok(())
        })
    }

    /// Materializes `v` (a tile of `n` elements of `from`) as a tile of `to` in a
    /// fresh slot (once per tile: `dot` converts its operands before the products).
    fn converted(
        &mut self,
        v: V<'ctx>,
        from: ScalarType,
        to: ScalarType,
        n: u64,
    ) -> LResult<PointerValue<'ctx>> {
        if let (V::T(p), true) = (v, from == to) {
            return Ok(p);
        }
        let out = self.slot(Elem::Scalar(to), n)?;
        self.counted(n, &mut |h, i| {
            let x = h.get(v, Elem::Scalar(from), i)?;
            let y = elementwise::cast(&h.cx, from, to, x)?;
            h.put(out, Elem::Scalar(to), i, y)
        })?;
        Ok(out)
    }

    fn dot(&mut self, op: &Op) -> LResult<()> {
        let (sa, sb) = (self.shape(op.operands[0]), self.shape(op.operands[1]));
        if sa.len() != 2 || sb.len() != 2 || op.operands.len() < 3 {
            return unsupported(op, "of tiles that are not 2-D");
        }
        let (m, k, n) = (sa[0], sa[1], sb[1]);
        let re = self.elem(op.results[0]);
        let (Some(acc), Some(ta), Some(tb), Some(tc)) = (
            re.scalar(),
            self.elem(op.operands[0]).scalar(),
            self.elem(op.operands[1]).scalar(),
            self.elem(op.operands[2]).scalar(),
        ) else {
            return unsupported(op, "of pointers");
        };
        let (a, b, c) = (
            self.mat(op.operands[0])?,
            self.mat(op.operands[1])?,
            self.mat(op.operands[2])?,
        );
        let pa = self.converted(a, ta, acc, m * k)?;
        let pb = self.converted(b, tb, acc, k * n)?;
        let out = self.slot(re, m * n)?;
        let ea = Elem::Scalar(acc);
        let vl: u64 = if acc == ScalarType::F64 { 8 } else { 16 };
        let micro = matches!(acc, ScalarType::F32 | ScalarType::F64) && n % vl == 0;
        // The accumulators start from `c` where it is a tile of `acc` already.
        let init = match c {
            V::T(p) if micro && tc == acc => p,
            _ => {
                self.counted(m * n, &mut |h, i| {
                    let x = h.get(c, Elem::Scalar(tc), i)?;
                    let x = elementwise::cast(&h.cx, tc, acc, x)?;
                    h.put(out, re, i, x)
                })?;
                out
            }
        };
        if micro {
            let mr = register_rows(acc, vl);
            let (blocks, rest) = (m / mr, m % mr);
            let mk = (m, n, k);
            self.micro_kernel(out, init, pa, pb, acc, mk, vl, (0, blocks, mr))?;
            if rest > 0 {
                self.micro_kernel(out, init, pa, pb, acc, mk, vl, (blocks * mr, 1, rest))?;
            }
            self.set(op, V::T(out));
            return Ok(());
        }
        self.nest(&[m, k], &mut |h, mk| {
            let aik = h.get(V::T(pa), ea, h.linear(mk, &[k, 1])?)?;
            h.counted(n, &mut |h, j| {
                let bi =
                    h.cx.b
                        .build_int_add(h.cx.b.build_int_mul(mk[1], h.i64(n), "")?, j, "")?;
                let oi =
                    h.cx.b
                        .build_int_add(h.cx.b.build_int_mul(mk[0], h.i64(n), "")?, j, "")?;
                let bkj = h.get(V::T(pb), ea, bi)?;
                let o = h.get(V::T(out), ea, oi)?;
                let r: BasicValueEnum = if acc.is_float() {
                    h.cx.call_intrinsic("llvm.fmuladd", &[h.lty(ea)], &[aik, bkj, o])?
                } else {
                    let p =
                        h.cx.b
                            .build_int_mul(aik.into_int_value(), bkj.into_int_value(), "")?;
                    h.cx.b.build_int_add(p, o.into_int_value(), "")?.into()
                };
                h.put(out, ea, oi, r)
            })
        })?;
        self.set(op, V::T(out));
        Ok(())
    }

    /// `out = init + pa · pb` (row-major `m x k` by `k x n`, all of float type `acc`;
    /// `init` may be `out`) for `blocks` register blocks from row `row0`: `mr` rows by
    /// one `vl`-lane vector of columns, whose `mr` accumulators stay in registers over
    /// the whole `k` loop (one vector load of `pb` and `mr` broadcasts of `pa` per
    /// step).
    #[allow(clippy::too_many_arguments)]
    fn micro_kernel(
        &mut self,
        out: PointerValue<'ctx>,
        init: PointerValue<'ctx>,
        pa: PointerValue<'ctx>,
        pb: PointerValue<'ctx>,
        acc: ScalarType,
        (_m, n, k): (u64, u64, u64),
        vl: u64,
        (row0, blocks, mr): (u64, u64, u64),
    ) -> LResult<()> {
        let ty = self.lty(Elem::Scalar(acc));
        let vt = vec_of(ty, vl as u32)?;
        let align = elem_bytes(Elem::Scalar(acc)) as u32;
        self.nest(&[blocks, n / vl], &mut |h, ij| {
            let b = &h.cx.b;
            let i0 = b.build_int_add(b.build_int_mul(ij[0], h.i64(mr), "")?, h.i64(row0), "")?;
            let j0 = b.build_int_mul(ij[1], h.i64(vl), "")?;
            let row = |h: &Self, r: u64, stride: u64| -> LResult<IntValue<'ctx>> {
                let b = &h.cx.b;
                let i = b.build_int_add(i0, h.i64(r), "")?;
                Ok(b.build_int_mul(i, h.i64(stride), "")?)
            };
            let mut starts = Vec::with_capacity(mr as usize);
            let mut dsts = Vec::with_capacity(mr as usize);
            for r in 0..mr {
                let at = h.cx.b.build_int_add(row(h, r, n)?, j0, "")?;
                let x = h.cx.b.build_load(vt, h.gep(ty, init, at)?, "")?;
                set_align(x, align as u64);
                starts.push(x);
                dsts.push(h.gep(ty, out, at)?);
            }
            let pre = h.here()?;
            let (head, exit) = (h.block("mk"), h.block("mkdone"));
            h.cx.b.build_unconditional_branch(head)?;
            h.cx.b.position_at_end(head);
            let i64t = h.cx.ctx.i64_type();
            let kp = h.cx.b.build_phi(i64t, "k")?;
            kp.add_incoming(&[(&i64t.const_zero(), pre)]);
            let kv = kp.as_basic_value().into_int_value();
            let mut phis = Vec::with_capacity(mr as usize);
            for x in &starts {
                let p = h.cx.b.build_phi(vt, "acc")?;
                p.add_incoming(&[(x, pre)]);
                phis.push(p);
            }
            let bi =
                h.cx.b
                    .build_int_add(h.cx.b.build_int_mul(kv, h.i64(n), "")?, j0, "")?;
            let bp = h.gep(ty, pb, bi)?;
            let bv = h.cx.b.build_load(vt, bp, "")?;
            set_align(bv, align as u64);
            let mut next = Vec::with_capacity(mr as usize);
            for (r, p) in phis.iter().enumerate() {
                let ai = h.cx.b.build_int_add(row(h, r as u64, k)?, kv, "")?;
                let a = h.get(V::T(pa), Elem::Scalar(acc), ai)?;
                let av = h.splat(a, vl as u32)?;
                let y = h.cx.call_intrinsic(
                    "llvm.fmuladd",
                    &[vt.into()],
                    &[av.into(), bv, p.as_basic_value()],
                )?;
                next.push(y);
            }
            let k1 = h.cx.b.build_int_add(kv, h.i64(1), "")?;
            let latch = h.here()?;
            kp.add_incoming(&[(&k1, latch)]);
            for (p, y) in phis.iter().zip(&next) {
                p.add_incoming(&[(y, latch)]);
            }
            let more =
                h.cx.b
                    .build_int_compare(IntPredicate::ULT, k1, h.i64(k), "")?;
            h.cx.b.build_conditional_branch(more, head, exit)?;
            h.cx.b.position_at_end(exit);
            for (p, y) in dsts.iter().zip(&next) {
                let st = h.cx.b.build_store(*p, *y)?;
                let _ = st.set_alignment(align);
            }
            Ok(())
        })
    }

    /// `reduce` (`scan` = None) or `scan` (`Some(reverse)`) along `axis`.
    fn reduce(&mut self, op: &Op, axis: u8, rop: ReduceOp, scan: Option<bool>) -> LResult<()> {
        let shape = self.shape(op.operands[0]);
        let a = axis as usize;
        if a >= shape.len() {
            return unsupported(op, "along a missing axis");
        }
        let e = self.elem(op.operands[0]);
        let Some(s) = e.scalar() else {
            return unsupported(op, "of pointers");
        };
        let bop = match rop {
            ReduceOp::Sum => BinaryOp::Add,
            ReduceOp::Prod => BinaryOp::Mul,
            ReduceOp::Min => BinaryOp::Min,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::And => BinaryOp::And,
            ReduceOp::Or => BinaryOp::Or,
            ReduceOp::Xor => BinaryOp::Xor,
        };
        let pre: u64 = shape[..a].iter().product();
        let len = shape[a];
        let post: u64 = shape[a + 1..].iter().product();
        let src = self.mat(op.operands[0])?;
        let re = self.elem(op.results[0]);
        let n_out = self.numel(op.results[0]);
        let out = self.slot(re, n_out)?;
        let combine = |h: &Self, x: BasicValueEnum<'ctx>, y: BasicValueEnum<'ctx>| {
            let r = elementwise::binary(&h.cx, bop, s, x, y)?;
            if scan.is_none()
                && matches!(s, ScalarType::F32 | ScalarType::F64)
                && bop == BinaryOp::Add
            {
                // A sum may be reassociated (vectorized), as every backend's tree does.
                super::arch::with_fast_math(r, inkwell::llvm_sys::LLVMFastMathAllowReassoc);
            }
            Ok::<_, LowerError>(r)
        };
        if len == 0 {
            return unsupported(op, "along an empty axis");
        }
        let w: u32 = if len.is_multiple_of(16) { 16 } else { 8 };
        let by_vectors = scan.is_none()
            && post == 1
            && len.is_multiple_of(w as u64)
            && matches!(src, V::T(_))
            && match bop {
                BinaryOp::Add => !s.is_float() || matches!(s, ScalarType::F32 | ScalarType::F64),
                BinaryOp::Max | BinaryOp::Min => !matches!(s, ScalarType::F16 | ScalarType::BF16),
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => s.is_int(),
                _ => false,
            }
            && s != ScalarType::I1
            && !s.is_fp8();
        match scan {
            None if by_vectors => {
                // Along the contiguous last axis: `w` partial results in a vector,
                // one vector of the row folded in per step, then the lanes folded
                // pairwise (a reassociation only for float sums, as any vector sum).
                let V::T(sp) = src else {
                    return unsupported(op, "of an unmaterialized tile");
                };
                let ty = self.lty(e);
                let vt = vec_of(ty, w)?;
                let fold = |h: &Self,
                            x: inkwell::values::VectorValue<'ctx>,
                            y: inkwell::values::VectorValue<'ctx>|
                 -> LResult<inkwell::values::VectorValue<'ctx>> {
                    let b = &h.cx.b;
                    let intr = |name: &str| -> LResult<inkwell::values::VectorValue<'ctx>> {
                        Ok(h.cx
                            .call_intrinsic(name, &[vt.into()], &[x.into(), y.into()])?
                            .into_vector_value())
                    };
                    let signed = s.is_signed_int();
                    Ok(match (bop, s.is_float()) {
                        (BinaryOp::Add, true) => {
                            let r = b.build_float_add(x, y, "")?;
                            super::arch::with_fast_math(
                                r.into(),
                                inkwell::llvm_sys::LLVMFastMathAllowReassoc,
                            );
                            r
                        }
                        (BinaryOp::Add, false) => b.build_int_add(x, y, "")?,
                        (BinaryOp::Max, true) => intr("llvm.maximum")?,
                        (BinaryOp::Min, true) => intr("llvm.minimum")?,
                        (BinaryOp::Max, false) => {
                            intr(if signed { "llvm.smax" } else { "llvm.umax" })?
                        }
                        (BinaryOp::Min, false) => {
                            intr(if signed { "llvm.smin" } else { "llvm.umin" })?
                        }
                        (BinaryOp::And, _) => b.build_and(x, y, "")?,
                        (BinaryOp::Or, _) => b.build_or(x, y, "")?,
                        _ => b.build_xor(x, y, "")?,
                    })
                };
                let chunks = len / w as u64;
                self.counted(pre, &mut |h, p| {
                    let row = h.cx.b.build_int_mul(p, h.i64(len), "")?;
                    let at = |h: &Self, c: IntValue<'ctx>| -> LResult<_> {
                        let i = h.cx.b.build_int_add(
                            row,
                            h.cx.b.build_int_mul(c, h.i64(w as u64), "")?,
                            "",
                        )?;
                        let x = h.cx.b.build_load(vt, h.gep(ty, sp, i)?, "")?;
                        set_align(x, elem_bytes(e));
                        Ok(x.into_vector_value())
                    };
                    let first = at(h, h.i64(0))?;
                    let acc = h.slot(e, w as u64)?;
                    let st = h.cx.b.build_store(acc, first)?;
                    let _ = st.set_alignment(elem_bytes(e) as u32);
                    h.counted(chunks - 1, &mut |h, c| {
                        let c = h.cx.b.build_int_add(c, h.i64(1), "")?;
                        let x = at(h, c)?;
                        let a = h.cx.b.build_load(vt, acc, "")?.into_vector_value();
                        let y = fold(h, a, x)?;
                        h.cx.b.build_store(acc, y)?;
                        Ok(())
                    })?;
                    let a = h.cx.b.build_load(vt, acc, "")?.into_vector_value();
                    let mut lanes: Vec<BasicValueEnum<'ctx>> = (0..w)
                        .map(|j| {
                            let j = h.cx.ctx.i32_type().const_int(j as u64, false);
                            h.cx.b.build_extract_element(a, j, "")
                        })
                        .collect::<Result<_, _>>()?;
                    while lanes.len() > 1 {
                        let half = lanes.len() / 2;
                        let mut next = Vec::with_capacity(half);
                        for j in 0..half {
                            next.push(combine(h, lanes[j], lanes[j + half])?);
                        }
                        lanes = next;
                    }
                    h.put(out, re, p, lanes[0])
                })?;
            }
            None => {
                // out[p, q] = in[p, 0, q]; then in[p, r, q] folded in, q innermost.
                self.nest(&[pre, post], &mut |h, pq| {
                    let si = h.linear(pq, &[len * post, 1])?;
                    let oi = h.linear(pq, &[post, 1])?;
                    let x = h.get(src, e, si)?;
                    h.put(out, re, oi, x)
                })?;
                if len > 1 {
                    self.nest(&[pre, len - 1, post], &mut |h, prq| {
                        let r = h.cx.b.build_int_add(prq[1], h.i64(1), "")?;
                        let si = h.linear(&[prq[0], r, prq[2]], &[len * post, post, 1])?;
                        let oi = h.linear(&[prq[0], prq[2]], &[post, 1])?;
                        let x = h.get(src, e, si)?;
                        let acc = h.get(V::T(out), re, oi)?;
                        let y = combine(h, acc, x)?;
                        h.put(out, re, oi, y)
                    })?;
                }
            }
            Some(reverse) => {
                self.nest(&[pre, post], &mut |h, pq| {
                    let first = if reverse { len - 1 } else { 0 };
                    let at = |h: &Self, r: IntValue<'ctx>| {
                        h.linear(&[pq[0], r, pq[1]], &[len * post, post, 1])
                    };
                    let i0 = at(h, h.i64(first))?;
                    let x = h.get(src, e, i0)?;
                    h.put(out, re, i0, x)?;
                    h.counted(len - 1, &mut |h, r| {
                        // Step r + 1 from the start (from the end when reversed).
                        let (cur, prev) = if reverse {
                            let c = h.cx.b.build_int_sub(h.i64(len - 2), r, "")?;
                            (c, h.cx.b.build_int_add(c, h.i64(1), "")?)
                        } else {
                            (h.cx.b.build_int_add(r, h.i64(1), "")?, r)
                        };
                        let (ci, pi) = (at(h, cur)?, at(h, prev)?);
                        let acc = h.get(V::T(out), re, pi)?;
                        let x = h.get(src, e, ci)?;
                        let y = combine(h, acc, x)?;
                        h.put(out, re, ci, y)
                    })
                })?;
            }
        }
        if self.f.ty(op.results[0]).shape.is_empty() {
            let v = self.get(V::T(out), re, self.i64(0))?;
            self.set(op, V::U(v));
        } else {
            self.set(op, V::T(out));
        }
        Ok(())
    }

    /// A slot holding a loop-carried or branch-merged value of `v`'s type: a scalar
    /// slot (promoted to registers by LLVM) for 0-d values, a tile slot otherwise.
    fn carrier(&mut self, v: ValueId) -> LResult<(PointerValue<'ctx>, bool)> {
        let e = self.elem(v);
        if self.f.ty(v).shape.is_empty() {
            let p = super::entry_alloca(&self.cx, self.lty(e), "carried")?;
            Ok((p, false))
        } else {
            let n = self.numel(v);
            Ok((self.slot(e, n)?, true))
        }
    }

    /// Writes `vals` (typed like `tys`) into the carriers, through temporaries where a
    /// value reads another carrier (a swap): every value is read before any carrier
    /// is written.
    fn fill_carriers(
        &mut self,
        carriers: &[(PointerValue<'ctx>, bool)],
        tys: &[ValueId],
        vals: &[V<'ctx>],
    ) -> LResult<()> {
        let mut staged: Vec<V<'ctx>> = Vec::with_capacity(vals.len());
        for (k, &v) in vals.iter().enumerate() {
            let reads: Vec<PointerValue<'ctx>> = match v {
                V::T(p) => vec![p],
                V::F(f) => self.fused[f].reads.clone(),
                _ => Vec::new(),
            };
            let aliased = carriers
                .iter()
                .enumerate()
                .any(|(j, c)| j != k && c.1 && reads.contains(&c.0));
            if aliased {
                staged.push(self.staged(v, tys[k])?);
            } else {
                staged.push(v);
            }
        }
        for (k, v) in staged.into_iter().enumerate() {
            let (p, tile) = carriers[k];
            let e = self.elem(tys[k]);
            if tile {
                if matches!(v, V::T(q) if q == p) {
                    continue;
                }
                self.copy_tile(p, v, tys[k])?;
            } else {
                let x = self.get(v, e, self.i64(0))?;
                self.cx.b.build_store(p, x)?;
            }
        }
        Ok(())
    }

    /// `v` (typed like `ty`) copied into a fresh slot.
    fn staged(&mut self, v: V<'ctx>, ty: ValueId) -> LResult<V<'ctx>> {
        if matches!(v, V::U(_)) {
            return Ok(v);
        }
        let tmp = self.slot(self.elem(ty), self.numel(ty))?;
        self.copy_tile(tmp, v, ty)?;
        Ok(V::T(tmp))
    }

    /// Writes every element of `v` (typed like `ty`) to slot `dst`: a fused value by
    /// runs along the last dimension where it divides into them (see [`Self::lanes`]).
    fn copy_tile(&mut self, dst: PointerValue<'ctx>, v: V<'ctx>, ty: ValueId) -> LResult<()> {
        let e = self.elem(ty);
        let shape = self.shape(ty);
        let rm = row_major(&shape);
        let last = shape.last().copied().unwrap_or(0);
        let w: u32 = if last % 16 == 0 { 16 } else { 8 };
        if matches!(v, V::F(_))
            && matches!(e, Elem::Scalar(s) if s != ScalarType::I1)
            && last > 0
            && last % w as u64 == 0
        {
            let r = shape.len();
            let mut outer = shape.clone();
            outer[r - 1] = last / w as u64;
            let lt = self.lty(e);
            return self.versioned(&shape, None, Some(v), &mut |h, _| {
                h.nest(&outer, &mut |h, idx| {
                    let mut full = idx.to_vec();
                    full[r - 1] = h.cx.b.build_int_mul(idx[r - 1], h.i64(w as u64), "")?;
                    let lin0 = h.linear(&full, &rm)?;
                    let x = h.lanes(v, e, &full, lin0, w)?;
                    let st = h.cx.b.build_store(h.gep(lt, dst, lin0)?, x)?;
                    let _ = st.set_alignment(elem_bytes(e) as u32);
                    Ok(())
                })
            });
        }
        self.nest(&shape, &mut |h, idx| {
            let i = h.linear(idx, &rm)?;
            let x = h.get_at(v, e, idx, i)?;
            h.put(dst, e, i, x)
        })
    }

    fn carried_value(&self, c: (PointerValue<'ctx>, bool), v: ValueId) -> LResult<V<'ctx>> {
        if c.1 {
            Ok(V::T(c.0))
        } else {
            Ok(V::U(self.cx.b.build_load(
                self.lty(self.elem(v)),
                c.0,
                "",
            )?))
        }
    }

    fn for_op(&mut self, op: &Op) -> LResult<()> {
        if op.operands.len() < 3 || op.regions.len() != 1 {
            return unsupported(op, "without bounds and a body");
        }
        let body = &op.regions[0];
        let Some((&iv_arg, iter_args)) = body.args.split_first() else {
            return unsupported(op, "without an induction variable");
        };
        let ity = self.lty(self.elem(op.operands[0])).into_int_type();
        let signed = self
            .elem(op.operands[0])
            .scalar()
            .is_none_or(|s| s.is_signed_int());
        let bound = |h: &mut Self, k: usize| -> LResult<IntValue<'ctx>> {
            let v = h.val(op.operands[k])?;
            let x = h.get(v, h.elem(op.operands[k]), h.i64(0))?.into_int_value();
            Ok(h.cx.b.build_int_cast_sign_flag(x, ity, signed, "")?)
        };
        let (lb, ub, step) = (bound(self, 0)?, bound(self, 1)?, bound(self, 2)?);
        let site = self.site(op, SiteKind::Step, Vec::new());
        let pos = self
            .cx
            .b
            .build_int_compare(IntPredicate::SGT, step, ity.const_zero(), "")?;
        let step64 = self
            .cx
            .b
            .build_int_s_extend_or_bit_cast(step, self.cx.ctx.i64_type(), "")?;
        self.check(pos, site, self.i64(0), step64)?;
        let carriers: Vec<_> = iter_args
            .iter()
            .map(|&a| self.carrier(a))
            .collect::<LResult<_>>()?;
        let inits: Vec<V<'ctx>> = op.operands[3..]
            .iter()
            .map(|&v| self.val(v))
            .collect::<LResult<_>>()?;
        self.fill_carriers(&carriers, iter_args, &inits)?;
        let pre = self.here()?;
        let head = self.block("for");
        let body_bb = self.block("body");
        let exit = self.block("endfor");
        self.cx.b.build_unconditional_branch(head)?;
        self.cx.b.position_at_end(head);
        let phi = self.cx.b.build_phi(ity, "iv")?;
        phi.add_incoming(&[(&lb, pre)]);
        let iv = phi.as_basic_value().into_int_value();
        let pred = if signed {
            IntPredicate::SLT
        } else {
            IntPredicate::ULT
        };
        let go = self.cx.b.build_int_compare(pred, iv, ub, "")?;
        self.cx.b.build_conditional_branch(go, body_bb, exit)?;
        self.cx.b.position_at_end(body_bb);
        self.poll(site)?;
        self.vals.insert(iv_arg, V::U(iv.into()));
        for (k, &a) in iter_args.iter().enumerate() {
            let v = self.carried_value(carriers[k], a)?;
            self.vals.insert(a, v);
        }
        let ys = self.region(body)?;
        if ys.len() != iter_args.len() {
            return unsupported(op, "whose body yields the wrong number of values");
        }
        self.fill_carriers(&carriers, iter_args, &ys)?;
        let next = self.cx.b.build_int_add(iv, step, "")?;
        // Past the type's end the loop is over (the interpreter counts in i64).
        let no_wrap = self.cx.b.build_int_compare(pred, iv, next, "")?;
        let latch = self.here()?;
        phi.add_incoming(&[(&next, latch)]);
        self.cx.b.build_conditional_branch(no_wrap, head, exit)?;
        self.cx.b.position_at_end(exit);
        for (k, &r) in op.results.iter().enumerate() {
            let Some(&c) = carriers.get(k) else {
                return unsupported(op, "with more results than carried values");
            };
            let v = self.carried_value(c, iter_args[k])?;
            self.vals.insert(r, v);
        }
        Ok(())
    }

    /// The runtime function `name` (declared on first use).
    fn runtime_fn(
        &self,
        name: &str,
        ret: BasicTypeEnum<'ctx>,
        params: &[BasicMetadataTypeEnum<'ctx>],
    ) -> LResult<FunctionValue<'ctx>> {
        Ok(self.cx.module.get_function(name).unwrap_or_else(|| {
            self.cx.module.add_function(
                name,
                ret.fn_type(params, false),
                Some(inkwell::module::Linkage::External),
            )
        }))
    }

    /// `comm[i]`.
    fn comm_word(&self, i: IntValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let i64t = self.cx.ctx.i64_type();
        let a = self.gep(i64t.into(), self.comm, i)?;
        Ok(self.cx.b.build_load(i64t, a, "")?.into_int_value())
    }

    /// A scalar operand (a 0-d value, or a tile equal in every element).
    fn scalar_operand(&mut self, op: &Op, k: usize) -> LResult<BasicValueEnum<'ctx>> {
        match self.val(op.operands[k])? {
            V::U(x) => Ok(x),
            _ if self.numel(op.operands[k]) == 1 => {
                let e = self.elem(op.operands[k]);
                let t = self.mat(op.operands[k])?;
                self.get(t, e, self.i64(0))
            }
            _ => unsupported(op, "with a tile where a scalar is expected"),
        }
    }

    /// `rank`, `world_size`, `remote_ptr`, `signal`, `wait_until`, `fence`,
    /// `barrier_all` (see the module docs).
    fn comm_op(&mut self, op: &Op) -> LResult<()> {
        let i64t = self.cx.ctx.i64_type();
        let i32t = self.cx.ctx.i32_type();
        let ptr = self.cx.ctx.ptr_type(AddressSpace::default());
        match &op.kind {
            OpKind::Rank | OpKind::WorldSize => {
                let w = self.comm_word(self.i64((op.kind == OpKind::WorldSize) as u64))?;
                let v = self.cx.b.build_int_truncate(w, i32t, "")?;
                self.set(op, V::U(v.into()));
            }
            OpKind::RemotePtr => {
                let Some(k) = param_of(self.prov[op.operands[0].index()]) else {
                    return unsupported(op, "of pointers into several buffers");
                };
                let peer = self.scalar_operand(op, 1)?.into_int_value();
                let peer = self.cx.b.build_int_s_extend(peer, i64t, "")?;
                let size = self.comm_word(self.i64(1))?;
                let site = self.site(op, SiteKind::Peer, Vec::new());
                let ok = self
                    .cx
                    .b
                    .build_int_compare(IntPredicate::ULT, peer, size, "")?;
                self.check(ok, site, self.i64(0), peer)?;
                let b = &self.cx.b;
                let at = b.build_int_mul(self.i64(k as u64), size, "")?;
                let at = b.build_int_add(at, peer, "")?;
                let at = b.build_int_add(at, self.i64(2), "")?;
                let delta = self.comm_word(at)?;
                let i8t: BasicTypeEnum = self.cx.ctx.i8_type().into();
                let pe = self.elem(op.operands[0]);
                let v = match self.val(op.operands[0])? {
                    V::U(p) => V::U(self.gep(i8t, p.into_pointer_value(), delta)?.into()),
                    V::A(a) => {
                        let base = self.gep(i8t, self.aff[a].base.into_pointer_value(), delta)?;
                        let strides = self.aff[a].strides.clone();
                        self.affine(base.into(), strides)
                    }
                    v => {
                        let v = self.mat_v(v, op.operands[0])?;
                        let n = self.numel(op.results[0]);
                        let out = self.slot(pe, n)?;
                        self.counted(n, &mut |h, i| {
                            let p = h.get(v, pe, i)?.into_pointer_value();
                            let q = h.gep(i8t, p, delta)?;
                            h.put(out, pe, i, q.into())
                        })?;
                        V::T(out)
                    }
                };
                self.set(op, v);
            }
            OpKind::Signal { op: sop, order, .. } => {
                let p = self.scalar_operand(op, 0)?.into_pointer_value();
                let v = self.scalar_operand(op, 1)?.into_int_value();
                self.check_word(op, p)?;
                let bop = match sop {
                    SignalOp::Set => AtomicRMWBinOp::Xchg,
                    SignalOp::Add => AtomicRMWBinOp::Add,
                };
                self.cx.b.build_atomicrmw(bop, p, v, llvm_order(*order))?;
            }
            OpKind::WaitUntil { pred, .. } => {
                let p = self.scalar_operand(op, 0)?.into_pointer_value();
                let v = self.scalar_operand(op, 1)?.into_int_value();
                self.check_word(op, p)?;
                // The runtime receives the comparison as its index in `CmpPred::ALL`.
                let code = CmpPred::ALL.iter().position(|q| q == pred).unwrap_or(0);
                let f = self.runtime_fn(
                    WAIT,
                    i32t.into(),
                    &[ptr.into(), i32t.into(), i64t.into(), ptr.into()],
                )?;
                let args = [
                    p.into(),
                    i32t.const_int(code as u64, false).into(),
                    v.into(),
                    self.err.into(),
                ];
                let site = self.site(op, SiteKind::Wait(Some(*pred)), Vec::new());
                self.wait_call(f, &args, site)?;
                let seen = self.gep(i64t.into(), self.err, self.i64(5))?;
                let x = self.cx.b.build_load(i64t, seen, "seen")?;
                self.set(op, V::U(x));
            }
            OpKind::Fence { order, .. } => {
                if *order != MemOrder::Relaxed {
                    self.cx.b.build_fence(llvm_order(*order), false, "")?;
                }
            }
            OpKind::BarrierAll => {
                let f = self.runtime_fn(BARRIER, i32t.into(), &[ptr.into()])?;
                let site = self.site(op, SiteKind::Wait(None), Vec::new());
                self.wait_call(f, &[self.err.into()], site)?;
            }
            _ => return unsupported(op, "is not a communication op"),
        }
        Ok(())
    }

    /// With checks on: the signal word at `p` lies inside its buffer.
    fn check_word(&mut self, op: &Op, p: PointerValue<'ctx>) -> LResult<()> {
        if !self.checked {
            return Ok(());
        }
        let prov = self.prov[op.operands[0].index()];
        let site = self.site(
            op,
            SiteKind::Access {
                param: param_of(prov),
                remote: self.reaches_peers(prov),
            },
            Vec::new(),
        );
        self.check_access(site, prov, p, 8, self.i64(0))
    }

    /// Calls a runtime wait; a nonzero status fails the kernel at `site` (the
    /// status as the lane).
    fn wait_call(
        &self,
        f: FunctionValue<'ctx>,
        args: &[BasicMetadataValueEnum<'ctx>],
        site: usize,
    ) -> LResult<()> {
        let i64t = self.cx.ctx.i64_type();
        let rc = self
            .cx
            .b
            .build_call(f, args, "")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| LowerError::Llvm("wait returns nothing".into()))?
            .into_int_value();
        let ok = self.cx.b.build_int_compare(
            IntPredicate::EQ,
            rc,
            self.cx.ctx.i32_type().const_zero(),
            "",
        )?;
        let status = self.cx.b.build_int_z_extend(rc, i64t, "")?;
        self.check(ok, site, status, self.i64(0))
    }

    /// The watchdog, once per iteration of a `for` or `while` loop: the runtime's
    /// `__tessera_cpu_poll(err)` returns 1 once the launch's deadline has passed, and
    /// the kernel fails at `site` (lane `u64::MAX` marks the timeout).
    fn poll(&mut self, site: usize) -> LResult<()> {
        let ctx = self.cx.ctx;
        let ptr = ctx.ptr_type(AddressSpace::default());
        let f = self.cx.module.get_function(POLL).unwrap_or_else(|| {
            self.cx.module.add_function(
                POLL,
                ctx.i32_type().fn_type(&[ptr.into()], false),
                Some(inkwell::module::Linkage::External),
            )
        });
        let rc = self
            .cx
            .b
            .build_call(f, &[self.err.into()], "")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| LowerError::Llvm("poll returns nothing".into()))?
            .into_int_value();
        let ok =
            self.cx
                .b
                .build_int_compare(IntPredicate::EQ, rc, ctx.i32_type().const_zero(), "")?;
        self.check(ok, site, self.i64(u64::MAX), self.i64(0))
    }

    fn while_op(&mut self, op: &Op) -> LResult<()> {
        if op.regions.len() != 2 {
            return unsupported(op, "without two regions");
        }
        let (before, after) = (&op.regions[0], &op.regions[1]);
        if before.args.len() != op.operands.len() || after.args.len() != op.results.len() {
            return unsupported(op, "whose regions take the wrong number of values");
        }
        let site = self.site(op, SiteKind::Loop, Vec::new());
        let carried: Vec<_> = before
            .args
            .iter()
            .map(|&a| self.carrier(a))
            .collect::<LResult<_>>()?;
        let forwarded: Vec<_> = op
            .results
            .iter()
            .map(|&r| self.carrier(r))
            .collect::<LResult<_>>()?;
        let inits: Vec<V<'ctx>> = op
            .operands
            .iter()
            .map(|&v| self.val(v))
            .collect::<LResult<_>>()?;
        self.fill_carriers(&carried, &before.args, &inits)?;
        let (head, body, exit) = (
            self.block("while"),
            self.block("do"),
            self.block("endwhile"),
        );
        self.cx.b.build_unconditional_branch(head)?;
        self.cx.b.position_at_end(head);
        self.poll(site)?;
        for (k, &a) in before.args.iter().enumerate() {
            let v = self.carried_value(carried[k], a)?;
            self.vals.insert(a, v);
        }
        let t = self.region(before)?;
        let Some((&c, fwd)) = t.split_first() else {
            return unsupported(op, "whose first region does not end in `condition`");
        };
        if fwd.len() != op.results.len() {
            return unsupported(op, "that forwards the wrong number of values");
        }
        let c = self
            .get(c, Elem::Scalar(ScalarType::I1), self.i64(0))?
            .into_int_value();
        self.fill_carriers(&forwarded, &op.results, fwd)?;
        self.cx.b.build_conditional_branch(c, body, exit)?;
        self.cx.b.position_at_end(body);
        for (k, &a) in after.args.iter().enumerate() {
            let v = self.carried_value(forwarded[k], a)?;
            self.vals.insert(a, v);
        }
        let ys = self.region(after)?;
        if ys.len() != before.args.len() {
            return unsupported(op, "whose second region yields the wrong number of values");
        }
        self.fill_carriers(&carried, &before.args, &ys)?;
        self.cx.b.build_unconditional_branch(head)?;
        self.cx.b.position_at_end(exit);
        for (k, &r) in op.results.iter().enumerate() {
            let v = self.carried_value(forwarded[k], r)?;
            self.vals.insert(r, v);
        }
        Ok(())
    }

    fn if_op(&mut self, op: &Op) -> LResult<()> {
        if op.regions.len() != 2 {
            return unsupported(op, "without two regions");
        }
        let c = self.val(op.operands[0])?;
        let c = self
            .get(c, Elem::Scalar(ScalarType::I1), self.i64(0))?
            .into_int_value();
        let carriers: Vec<_> = op
            .results
            .iter()
            .map(|&r| self.carrier(r))
            .collect::<LResult<_>>()?;
        let (then_bb, else_bb, join) =
            (self.block("then"), self.block("else"), self.block("endif"));
        self.cx.b.build_conditional_branch(c, then_bb, else_bb)?;
        for (r, bb) in op.regions.iter().zip([then_bb, else_bb]) {
            self.cx.b.position_at_end(bb);
            let ys = self.region(r)?;
            if ys.len() != op.results.len() {
                return unsupported(op, "whose regions yield the wrong number of values");
            }
            self.fill_carriers(&carriers, &op.results, &ys)?;
            self.cx.b.build_unconditional_branch(join)?;
        }
        self.cx.b.position_at_end(join);
        for (k, &r) in op.results.iter().enumerate() {
            let v = self.carried_value(carriers[k], r)?;
            self.vals.insert(r, v);
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

//! Communication ops: `rank`, `world_size`, `remote_ptr`, `signal`, `wait_until`,
//! `fence`, `barrier_all`, on the hidden parameters of [`crate::comm`].
//!
//! - `rank` / `world_size`: the hidden parameters.
//! - `remote_ptr p, peer`: `p + (bases[peer] - bases[rank])` per register (the two
//!   table entries are loaded once per op). A peer outside `0..world_size` goes
//!   through [`Arch::bad_peer`](super::arch::Arch::bad_peer) (GPU: `llvm.trap`;
//!   emulator: an error naming the op) and then uses this rank's copy.
//! - `signal` (block-cooperative release): every thread issues a release fence at the
//!   op's scope (on AMDGPU that is `s_waitcnt vmcnt(0)` plus a cache writeback: each
//!   wave must drain its own stores, a fence in one wave does not cover the others),
//!   then a block barrier, then thread 0 alone performs the `atomicrmw xchg`/`add`
//!   with the op's ordering and scope. The barrier makes every thread's fenced stores
//!   happen-before thread 0's release, which is cumulative.
//! - `wait_until`: thread 0 polls the word with acquire loads at the op's scope until
//!   the predicate holds, also reading its rank's `ABORT` control word and
//!   [`Arch::timer_ns`](super::arch::Arch::timer_ns), backing off between polls
//!   ([`Arch::poll_pause`](super::arch::Arch::poll_pause)). Then it writes the outcome
//!   (observed value, status) to shared memory; a block barrier; every thread reads
//!   it; a barrier (the scratch is reused by the next op). On success every thread
//!   issues an acquire fence at the op's scope (thread 0's acquire alone would not
//!   order the other threads' later loads on weak GPUs). On failure (timeout, or a
//!   peer aborted the world) thread 0 first writes the rank's error record, a timeout
//!   also sets every rank's `ABORT`, and then the whole program returns.
//! - `fence`: an LLVM `fence` with the op's ordering and scope (relaxed: nothing).
//! - `barrier_all`: block barrier; thread 0: release fence (system), reads rank 0's
//!   `BARRIER_GEN` word, `atomicrmw add` on rank 0's `BARRIER` count; the arrival that
//!   completes `world_size * num_programs` resets the count to 0 and increments the
//!   generation (release), the others poll (as `wait_until`) until the generation
//!   changes; then as `wait_until`'s success path with a system-scope acquire. Each
//!   barrier counts its own participants, so kernels with different grids can share
//!   a world.

use inkwell::AddressSpace;
use inkwell::llvm_sys::core as c;
use inkwell::values::{AsValueRef, BasicValue, IntValue, PointerValue};
use inkwell::{AtomicOrdering, IntPredicate};
use tessera_ir::interp::ctrl;
use tessera_ir::ir::{CmpPred, MemOrder, MemScope, Op, OpKind, SignalOp};
use tessera_ir::{AddrSpace, Elem, ScalarType};

use super::{LResult, LowerError, Lowerer, Tile};
use crate::comm as abi;

/// The hidden parameters, as LLVM values.
#[derive(Clone, Copy)]
pub(crate) struct CommVals<'ctx> {
    pub rank: IntValue<'ctx>,
    pub world: IntValue<'ctx>,
    pub bases: PointerValue<'ctx>,
    pub timeout: IntValue<'ctx>,
}

fn set_align(v: impl AsValueRef, align: u32) {
    unsafe { c::LLVMSetAlignment(v.as_value_ref(), align) }
}

fn fence_order(o: MemOrder) -> Option<AtomicOrdering> {
    match o {
        MemOrder::Relaxed => None,
        MemOrder::Acquire => Some(AtomicOrdering::Acquire),
        MemOrder::Release => Some(AtomicOrdering::Release),
        MemOrder::AcqRel => Some(AtomicOrdering::AcquireRelease),
    }
}

fn rmw_order(o: MemOrder) -> AtomicOrdering {
    match o {
        MemOrder::Relaxed => AtomicOrdering::Monotonic,
        MemOrder::Acquire => AtomicOrdering::Acquire,
        MemOrder::Release => AtomicOrdering::Release,
        MemOrder::AcqRel => AtomicOrdering::AcquireRelease,
    }
}

fn int_pred(p: CmpPred) -> IntPredicate {
    match p {
        CmpPred::Eq => IntPredicate::EQ,
        CmpPred::Ne => IntPredicate::NE,
        CmpPred::Lt => IntPredicate::ULT,
        CmpPred::Le => IntPredicate::ULE,
        CmpPred::Gt => IntPredicate::UGT,
        CmpPred::Ge => IntPredicate::UGE,
    }
}

/// What thread 0's polling loop reads each iteration: (observed, done).
type Probe<'p, 'a, 'ctx> =
    &'p dyn Fn(&Lowerer<'a, 'ctx>) -> LResult<(IntValue<'ctx>, IntValue<'ctx>)>;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    fn cv(&self) -> LResult<CommVals<'ctx>> {
        self.comm.ok_or_else(|| {
            LowerError::Llvm("communication op in a kernel without hidden parameters".into())
        })
    }

    fn i64c(&self, v: u64) -> IntValue<'ctx> {
        self.cx.ctx.i64_type().const_int(v, false)
    }

    /// `heap_bases[r]` (`r`: `i32`).
    fn heap_base(&self, r: IntValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let cv = self.cv()?;
        let i64t = self.cx.ctx.i64_type();
        let idx = self.cx.b.build_int_z_extend(r, i64t, "")?;
        // SAFETY: the launcher passes a table of `world_size` entries and `r` is a
        // rank (checked by the callers).
        let p = unsafe { self.cx.b.build_in_bounds_gep(i64t, cv.bases, &[idx], "")? };
        let v = self.cx.b.build_load(i64t, p, "heap.base")?;
        set_align(v, 8);
        Ok(v.into_int_value())
    }

    /// Pointer to control word `w` of the heap at `base`.
    fn ctrl_word(&self, base: IntValue<'ctx>, w: usize) -> LResult<PointerValue<'ctx>> {
        let a = self.cx.b.build_int_add(base, self.i64c(8 * w as u64), "")?;
        let pt = self
            .cx
            .ctx
            .ptr_type(AddressSpace::from(self.target().global_addrspace()));
        Ok(self.cx.b.build_int_to_ptr(a, pt, "ctrl")?)
    }

    fn atomic_load(
        &self,
        p: PointerValue<'ctx>,
        ord: AtomicOrdering,
        scope: &str,
    ) -> LResult<IntValue<'ctx>> {
        let v = self.cx.b.build_load(self.cx.ctx.i64_type(), p, "")?;
        set_align(v, 8);
        unsafe {
            c::LLVMSetOrdering(v.as_value_ref(), ord.into());
            c::LLVMSetAtomicSyncScopeID(v.as_value_ref(), self.cx.sync_scope_id(scope));
        }
        Ok(v.into_int_value())
    }

    /// An atomic load (`ord`, system scope) of the `u64` word at `p`, which may be an
    /// off-node peer's (through the engine).
    fn word_load(&self, p: PointerValue<'ctx>, ord: AtomicOrdering) -> LResult<IntValue<'ctx>> {
        let v = self.word_atomic(p, None, self.i64c(0), |p| {
            Ok(Some(self.atomic_load(p, ord, "")?.into()))
        })?;
        v.map(|v| v.into_int_value())
            .ok_or_else(|| LowerError::Llvm("a word load produced no value".into()))
    }

    /// `op` (system scope, `ord`) on the `u64` word at `p`, which may be an off-node
    /// peer's (through the engine); the old value.
    fn word_rmw(
        &self,
        op: SignalOp,
        p: PointerValue<'ctx>,
        v: IntValue<'ctx>,
        ord: AtomicOrdering,
    ) -> LResult<IntValue<'ctx>> {
        let r = self.word_atomic(p, Some(op), v, |p| {
            Ok(Some(
                self.arch
                    .atomic_u64(&self.cx, op, p, v, ord, MemScope::System)?
                    .into(),
            ))
        })?;
        r.map(|v| v.into_int_value())
            .ok_or_else(|| LowerError::Llvm("a word update produced no value".into()))
    }

    fn atomic_store(&self, p: PointerValue<'ctx>, v: IntValue<'ctx>) -> LResult<()> {
        let s = self.cx.b.build_store(p, v)?;
        set_align(s, 8);
        unsafe { c::LLVMSetOrdering(s.as_value_ref(), AtomicOrdering::Monotonic.into()) };
        Ok(())
    }

    /// `cmpxchg p, 0, new` (acq_rel, system); true when it swapped.
    fn cas_zero(&self, p: PointerValue<'ctx>, new: IntValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let ssid = self.cx.sync_scope_id("");
        let zero = self.i64c(0);
        // SAFETY: valid builder, pointer and values of matching types.
        let ok = unsafe {
            let pair = c::LLVMBuildAtomicCmpXchgSyncScope(
                self.cx.b.as_mut_ptr(),
                p.as_value_ref(),
                zero.as_value_ref(),
                new.as_value_ref(),
                AtomicOrdering::AcquireRelease.into(),
                AtomicOrdering::Acquire.into(),
                ssid,
            );
            IntValue::new(c::LLVMBuildExtractValue(
                self.cx.b.as_mut_ptr(),
                pair,
                1,
                c"".as_ptr(),
            ))
        };
        Ok(ok)
    }

    /// Runs `body` in thread 0 only.
    pub(super) fn in_thread0(
        &mut self,
        body: impl FnOnce(&mut Self) -> LResult<()>,
    ) -> LResult<()> {
        let is0 = self
            .cx
            .b
            .build_int_compare(IntPredicate::EQ, self.tid, self.cx.i32(0), "t0")?;
        self.when(is0, body)
    }

    /// Runs `body` where the `i1` `cond` holds (a branch around it).
    pub(super) fn when(
        &mut self,
        cond: inkwell::values::IntValue<'ctx>,
        body: impl FnOnce(&mut Self) -> LResult<()>,
    ) -> LResult<()> {
        let bt = self.cx.ctx.append_basic_block(self.kernel, "when");
        let bm = self.cx.ctx.append_basic_block(self.kernel, "when.join");
        self.cx.b.build_conditional_branch(cond, bt, bm)?;
        self.cx.b.position_at_end(bt);
        body(self)?;
        self.cx.b.build_unconditional_branch(bm)?;
        self.cx.b.position_at_end(bm);
        Ok(())
    }

    /// The block that returns from the kernel (programs that give up jump there).
    fn exit_block(&mut self) -> inkwell::basic_block::BasicBlock<'ctx> {
        if let Some(bb) = self.comm_exit {
            return bb;
        }
        let bb = self.cx.ctx.append_basic_block(self.kernel, "comm.exit");
        let b = self.cx.ctx.create_builder();
        b.position_at_end(bb);
        // A fresh block: building `ret` cannot fail.
        let _ = b.build_return(None);
        self.comm_exit = Some(bb);
        bb
    }

    /// The program's linear id, `i64`.
    fn program_linear(&self) -> LResult<IntValue<'ctx>> {
        let i64t = self.cx.ctx.i64_type();
        let nt = self.nw * self.ws;
        let z = |v: IntValue<'ctx>| self.cx.b.build_int_z_extend(v, i64t, "");
        let (x, y, zz) = (
            z(self.arch.program_id(&self.cx, 0)?)?,
            z(self.arch.program_id(&self.cx, 1)?)?,
            z(self.arch.program_id(&self.cx, 2)?)?,
        );
        let gx = z(self.arch.num_programs(&self.cx, 0, nt)?)?;
        let gy = z(self.arch.num_programs(&self.cx, 1, nt)?)?;
        let b = &self.cx.b;
        let t = b.build_int_add(y, b.build_int_mul(gy, zz, "")?, "")?;
        Ok(b.build_int_add(x, b.build_int_mul(gx, t, "")?, "pid.lin")?)
    }

    /// Writes this rank's error record (first writer wins) and, for a timeout, sets
    /// every rank's `ABORT` to `1 + rank`.
    fn error_record(
        &mut self,
        site: usize,
        kind: u64,
        expected: IntValue<'ctx>,
        observed: IntValue<'ctx>,
    ) -> LResult<()> {
        let cv = self.cv()?;
        let me = self.heap_base(cv.rank)?;
        let won = self.cas_zero(
            self.ctrl_word(me, abi::ERR_SITE)?,
            self.i64c(site as u64 + 1),
        )?;
        let bw = self.cx.ctx.append_basic_block(self.kernel, "rec.write");
        let bd = self.cx.ctx.append_basic_block(self.kernel, "rec.done");
        self.cx.b.build_conditional_branch(won, bw, bd)?;
        self.cx.b.position_at_end(bw);
        let pid = self.program_linear()?;
        for (w, v) in [
            (abi::ERR_KIND, self.i64c(kind)),
            (abi::ERR_EXPECTED, expected),
            (abi::ERR_OBSERVED, observed),
            (abi::ERR_PROGRAM, pid),
        ] {
            self.atomic_store(self.ctrl_word(me, w)?, v)?;
        }
        self.cx.b.build_unconditional_branch(bd)?;
        self.cx.b.position_at_end(bd);
        if kind != abi::KIND_TIMEOUT {
            return Ok(());
        }
        // for r in 0..world: cas(ABORT of r, 0, 1 + rank)
        let i32t = self.cx.ctx.i32_type();
        let pre = self.cx.cur_block();
        let head = self.cx.ctx.append_basic_block(self.kernel, "abort.loop");
        let body = self.cx.ctx.append_basic_block(self.kernel, "abort.body");
        let done = self.cx.ctx.append_basic_block(self.kernel, "abort.done");
        let mark = self
            .cx
            .b
            .build_int_z_extend(cv.rank, self.cx.ctx.i64_type(), "")?;
        let mark = self.cx.b.build_int_add(mark, self.i64c(1), "")?;
        self.cx.b.build_unconditional_branch(head)?;
        self.cx.b.position_at_end(head);
        let r = self.cx.b.build_phi(i32t, "r")?;
        r.add_incoming(&[(&self.cx.i32(0), pre)]);
        let rv = r.as_basic_value().into_int_value();
        let more = self
            .cx
            .b
            .build_int_compare(IntPredicate::SLT, rv, cv.world, "")?;
        self.cx.b.build_conditional_branch(more, body, done)?;
        self.cx.b.position_at_end(body);
        let base = self.heap_base(rv)?;
        let abort_p = self.ctrl_word(base, ctrl::ABORT)?;
        if self.engine_on() {
            self.split_remote(
                abort_p,
                |p| {
                    self.cas_zero(p, mark)?;
                    Ok(None)
                },
                |addr, pe| {
                    self.engine_cas_zero(addr, mark, pe)?;
                    Ok(None)
                },
            )?;
        } else {
            self.cas_zero(abort_p, mark)?;
        }
        let next = self.cx.b.build_int_add(rv, self.cx.i32(1), "")?;
        r.add_incoming(&[(&next, self.cx.cur_block())]);
        let latch = self.cx.b.build_unconditional_branch(head)?;
        self.no_unroll(latch);
        self.cx.b.position_at_end(done);
        Ok(())
    }

    /// Marks the loop whose latch branch is `br` `llvm.loop.unroll.disable` (a cold
    /// path: unrolling only grows the code).
    fn no_unroll(&self, br: inkwell::values::InstructionValue<'ctx>) {
        use inkwell::llvm_sys::debuginfo as di;
        let ctx = self.cx.ctx.raw();
        let name = "llvm.loop.unroll.disable";
        // SAFETY: metadata built in this context; the temporary node is replaced by
        // the final (self-referential) loop id, as LLVM's loop metadata requires.
        unsafe {
            let s = c::LLVMMDStringInContext2(ctx, name.as_ptr() as *const _, name.len());
            let mut one = [s];
            let disable = c::LLVMMDNodeInContext2(ctx, one.as_mut_ptr(), 1);
            let tmp = di::LLVMTemporaryMDNode(ctx, std::ptr::null_mut(), 0);
            let mut ops = [tmp, disable];
            let id = c::LLVMMDNodeInContext2(ctx, ops.as_mut_ptr(), 2);
            di::LLVMMetadataReplaceAllUsesWith(tmp, id);
            let kind = c::LLVMGetMDKindIDInContext(ctx, c"llvm.loop".as_ptr(), 9);
            c::LLVMSetMetadata(br.as_value_ref(), kind, c::LLVMMetadataAsValue(ctx, id));
        }
    }

    /// Thread 0's loop: `probe` until done; else abort/timeout. Stores (observed,
    /// status) to `smem[0]`, `smem[1]` (`i64`s).
    fn poll_loop(
        &mut self,
        site: usize,
        expected: IntValue<'ctx>,
        probe: Probe<'_, 'a, 'ctx>,
        smem: PointerValue<'ctx>,
    ) -> LResult<()> {
        let cv = self.cv()?;
        let i64t = self.cx.ctx.i64_type();
        let start = self.arch.timer_ns(&self.cx)?;
        let me = self.heap_base(cv.rank)?;
        let abort_p = self.ctrl_word(me, ctrl::ABORT)?;
        let bl = self.cx.ctx.append_basic_block(self.kernel, "poll");
        let bc = self.cx.ctx.append_basic_block(self.kernel, "poll.abort");
        let btm = self.cx.ctx.append_basic_block(self.kernel, "poll.time");
        let bok = self.cx.ctx.append_basic_block(self.kernel, "poll.ok");
        let bab = self.cx.ctx.append_basic_block(self.kernel, "poll.aborted");
        let bto = self.cx.ctx.append_basic_block(self.kernel, "poll.timeout");
        let bend = self.cx.ctx.append_basic_block(self.kernel, "poll.end");
        self.cx.b.build_unconditional_branch(bl)?;
        self.cx.b.position_at_end(bl);
        let (obs, done) = probe(self)?;
        self.cx.b.build_conditional_branch(done, bok, bc)?;
        self.cx.b.position_at_end(bc);
        let ab = self.atomic_load(abort_p, AtomicOrdering::Monotonic, "")?;
        let aborted = self
            .cx
            .b
            .build_int_compare(IntPredicate::NE, ab, self.i64c(0), "")?;
        self.cx.b.build_conditional_branch(aborted, bab, btm)?;
        self.cx.b.position_at_end(btm);
        self.arch.poll_pause(&self.cx)?;
        let now = self.arch.timer_ns(&self.cx)?;
        let el = self.cx.b.build_int_sub(now, start, "")?;
        let late = self
            .cx
            .b
            .build_int_compare(IntPredicate::SGE, el, cv.timeout, "")?;
        self.cx.b.build_conditional_branch(late, bto, bl)?;
        let publish = |l: &Self, status: u64| -> LResult<()> {
            let p0 = l.smem_ptr(smem, i64t.into(), l.cx.i32(0))?;
            l.smem_store(p0, obs.into())?;
            let p1 = l.smem_ptr(smem, i64t.into(), l.cx.i32(1))?;
            l.smem_store(p1, l.i64c(status).into())?;
            l.cx.b.build_unconditional_branch(bend)?;
            Ok(())
        };
        self.cx.b.position_at_end(bok);
        publish(self, 0)?;
        self.cx.b.position_at_end(bab);
        self.error_record(site, abi::KIND_ABORTED, expected, obs)?;
        publish(self, 1)?;
        self.cx.b.position_at_end(bto);
        self.error_record(site, abi::KIND_TIMEOUT, expected, obs)?;
        publish(self, 1)?;
        self.cx.b.position_at_end(bend);
        Ok(())
    }

    /// After thread 0's loop: every thread reads the outcome; failed programs return;
    /// the others acquire at `scope`. Returns the observed value.
    fn publish_outcome(
        &mut self,
        smem: PointerValue<'ctx>,
        scope: MemScope,
    ) -> LResult<IntValue<'ctx>> {
        let i64t = self.cx.ctx.i64_type();
        self.barrier()?;
        let p0 = self.smem_ptr(smem, i64t.into(), self.cx.i32(0))?;
        let obs = self.smem_load(i64t.into(), p0)?.into_int_value();
        let p1 = self.smem_ptr(smem, i64t.into(), self.cx.i32(1))?;
        let status = self.smem_load(i64t.into(), p1)?.into_int_value();
        self.barrier()?;
        let failed =
            self.cx
                .b
                .build_int_compare(IntPredicate::NE, status, self.i64c(0), "failed")?;
        let exit = self.exit_block();
        let cont = self.cx.ctx.append_basic_block(self.kernel, "comm.ok");
        self.cx.b.build_conditional_branch(failed, exit, cont)?;
        self.cx.b.position_at_end(cont);
        self.cx
            .fence(AtomicOrdering::Acquire, self.arch.sync_scope(scope))?;
        Ok(obs)
    }

    /// Lowers one communication op; `site` is its index in [`crate::comm::comm_sites`].
    pub(super) fn lower_comm(&mut self, op: &Op, site: usize) -> LResult<()> {
        let span = &op.span;
        match op.kind {
            OpKind::Rank | OpKind::WorldSize => {
                let cv = self.cv()?;
                let v = if op.kind == OpKind::Rank {
                    cv.rank
                } else {
                    cv.world
                };
                let t = self.scalar_tile(Elem::Scalar(ScalarType::I32), v.into());
                self.vals.insert(op.results[0], t);
            }
            OpKind::RemotePtr => {
                let t = self.lower_remote_ptr(op)?;
                self.vals.insert(op.results[0], t);
            }
            OpKind::Fence { order, scope } => {
                if matches!(order, MemOrder::Release | MemOrder::AcqRel)
                    && scope == MemScope::System
                {
                    // `quiet`: this thread's off-node puts are delivered.
                    self.engine_quiet()?;
                }
                if let Some(o) = fence_order(order) {
                    self.cx.fence(o, self.arch.sync_scope(scope))?;
                }
            }
            OpKind::Signal {
                op: sop,
                order,
                scope,
            } => {
                let p = self.val(op.operands[0])?.regs[0].into_pointer_value();
                let v = self.val(op.operands[1])?.regs[0].into_int_value();
                let sc = self.arch.sync_scope(scope);
                if matches!(order, MemOrder::Release | MemOrder::AcqRel) {
                    // Every thread (every wave on AMD) drains its own stores, and
                    // its off-node puts are delivered.
                    self.engine_quiet()?;
                    self.cx.fence(AtomicOrdering::Release, sc)?;
                }
                self.barrier()?;
                self.in_thread0(|l| {
                    let near = |p| {
                        let p = l.access_ptr(AddrSpace::Global, p, 8, true, "signal")?;
                        l.arch
                            .atomic_u64(&l.cx, sop, p, v, rmw_order(order), scope)?;
                        Ok(None)
                    };
                    if !l.engine_on() {
                        near(p)?;
                        return Ok(());
                    }
                    l.split_remote(p, near, |addr, pe| {
                        let code = match sop {
                            SignalOp::Set => super::engine::NVSHMEM_SIGNAL_SET,
                            SignalOp::Add => super::engine::NVSHMEM_SIGNAL_ADD,
                        };
                        let code = l.cx.i32(code as i64);
                        l.engine_signal(addr, v, code, pe)?;
                        Ok(None)
                    })?;
                    Ok(())
                })?;
            }
            OpKind::WaitUntil { pred, scope } => {
                let p = self.val(op.operands[0])?.regs[0].into_pointer_value();
                let expected = self.val(op.operands[1])?.regs[0].into_int_value();
                let smem = self.scratch(16, span);
                let sc = self.arch.sync_scope(scope);
                self.in_thread0(|l| {
                    let p = l.access_ptr(AddrSpace::Global, p, 8, false, "wait_until")?;
                    let probe = |l: &Lowerer<'a, 'ctx>| {
                        let obs = l.atomic_load(p, AtomicOrdering::Acquire, sc)?;
                        let done =
                            l.cx.b
                                .build_int_compare(int_pred(pred), obs, expected, "")?;
                        Ok((obs, done))
                    };
                    l.poll_loop(site, expected, &probe, smem)
                })?;
                let obs = self.publish_outcome(smem, scope)?;
                let t = self.scalar_tile(Elem::Scalar(ScalarType::U64), obs.into());
                self.vals.insert(op.results[0], t);
            }
            OpKind::BarrierAll => {
                let cv = self.cv()?;
                let smem = self.scratch(16, span);
                let nt = self.nw * self.ws;
                // Every thread's off-node puts are delivered before it arrives.
                self.engine_quiet()?;
                self.barrier()?;
                self.in_thread0(|l| {
                    let i64t = l.cx.ctx.i64_type();
                    l.cx.fence(AtomicOrdering::Release, "")?;
                    let base0 = l.heap_base(l.cx.i32(0))?;
                    let cnt = l.ctrl_word(base0, ctrl::BARRIER)?;
                    let gen_ptr = l.ctrl_word(base0, ctrl::BARRIER_GEN)?;
                    // Sense reversal by generation (see `ctrl::BARRIER_GEN`): read the
                    // generation, arrive; the last arriver resets the count and
                    // publishes the next generation, the others poll for it. Rank 0's
                    // words may be on another node (through the engine).
                    let gen_seen = l.word_load(gen_ptr, AtomicOrdering::Acquire)?;
                    let old = l.word_rmw(
                        SignalOp::Add,
                        cnt,
                        l.i64c(1),
                        AtomicOrdering::AcquireRelease,
                    )?;
                    let mut total = l.cx.b.build_int_z_extend(cv.world, i64t, "")?;
                    for axis in 0..3 {
                        let n = l.arch.num_programs(&l.cx, axis, nt)?;
                        let n = l.cx.b.build_int_z_extend(n, i64t, "")?;
                        total = l.cx.b.build_int_mul(total, n, "")?;
                    }
                    let arrived = l.cx.b.build_int_add(old, l.i64c(1), "")?;
                    let last =
                        l.cx.b
                            .build_int_compare(IntPredicate::UGE, arrived, total, "last")?;
                    let b_last = l.cx.ctx.append_basic_block(l.kernel, "barrier.last");
                    let b_cont = l.cx.ctx.append_basic_block(l.kernel, "barrier.cont");
                    l.cx.b.build_conditional_branch(last, b_last, b_cont)?;
                    l.cx.b.position_at_end(b_last);
                    l.word_rmw(SignalOp::Set, cnt, l.i64c(0), AtomicOrdering::Monotonic)?;
                    l.word_rmw(SignalOp::Add, gen_ptr, l.i64c(1), AtomicOrdering::Release)?;
                    l.cx.b.build_unconditional_branch(b_cont)?;
                    l.cx.b.position_at_end(b_cont);
                    let probe = |l: &Lowerer<'a, 'ctx>| {
                        let g = l.word_load(gen_ptr, AtomicOrdering::Acquire)?;
                        let done =
                            l.cx.b
                                .build_int_compare(IntPredicate::NE, g, gen_seen, "")?;
                        // Reported on timeout: how many had arrived.
                        let obs = l.word_load(cnt, AtomicOrdering::Monotonic)?;
                        Ok((obs, done))
                    };
                    l.poll_loop(site, total, &probe, smem)
                })?;
                self.publish_outcome(smem, MemScope::System)?;
            }
            _ => return Err(LowerError::Llvm("not a communication op".into())),
        }
        Ok(())
    }

    fn lower_remote_ptr(&mut self, op: &Op) -> LResult<Tile<'ctx>> {
        let cv = self.cv()?;
        let ptrs = self.val(op.operands[0])?;
        let peer = self.val(op.operands[1])?.regs[0].into_int_value();
        let ok = self
            .cx
            .b
            .build_int_compare(IntPredicate::ULT, peer, cv.world, "peer.ok")?;
        let bad = self.cx.ctx.append_basic_block(self.kernel, "peer.bad");
        let cont = self.cx.ctx.append_basic_block(self.kernel, "peer.cont");
        self.cx.b.build_conditional_branch(ok, cont, bad)?;
        self.cx.b.position_at_end(bad);
        let site = self.new_site("remote_ptr");
        self.arch.bad_peer(&self.cx, peer, cv.world, site)?;
        self.cx.b.build_unconditional_branch(cont)?;
        self.cx.b.position_at_end(cont);
        let safe = self
            .cx
            .b
            .build_select(ok, peer, cv.rank, "peer")?
            .into_int_value();
        let me = self.heap_base(cv.rank)?;
        let them = self.heap_base(safe)?;
        let delta = self.cx.b.build_int_sub(them, me, "heap.delta")?;
        let i8t = self.cx.ctx.i8_type();
        let n = if ptrs.uniform { 1 } else { ptrs.regs.len() };
        let mut regs = Vec::with_capacity(n);
        for r in 0..n {
            // SAFETY: plain (not inbounds) byte offset from one heap to another.
            let g = unsafe {
                self.cx
                    .b
                    .build_gep(i8t, ptrs.regs[r].into_pointer_value(), &[delta], "remote")?
            };
            regs.push(g.as_basic_value_enum());
        }
        if ptrs.uniform {
            return Ok(self.uniform_tile(ptrs.elem, ptrs.layout.clone(), regs[0]));
        }
        Ok(Tile { regs, ..ptrs })
    }
}

#[cfg(test)]
mod hidden_param_tests {
    use tessera_ir::ir::{CmpPred, ConstValue, MemScope, OpKind, ParamAttrs};
    use tessera_ir::{Function, FunctionBuilder, ScalarType, Span, Type};

    /// A kernel with a `u64` signal parameter and, if `with_comm`, `rank`,
    /// `wait_until` and `barrier_all`.
    fn kernel(with_comm: bool) -> Function {
        let sp = |line| Span::new("k.rs", line, 9);
        let mut b = FunctionBuilder::new("k", sp(1));
        let sig = b.param(
            "sig",
            Type::global_ptr(ScalarType::U64),
            ParamAttrs::default(),
        );
        if with_comm {
            b.op1(OpKind::Rank, &[], None, sp(2)).unwrap();
            let v = b
                .constant(ConstValue::Int(7), Type::scalar(ScalarType::U64), sp(3))
                .unwrap();
            let w = OpKind::WaitUntil {
                pred: CmpPred::Ge,
                scope: MemScope::System,
            };
            b.op1(w, &[sig, v], None, sp(3)).unwrap();
            b.op(OpKind::BarrierAll, &[], None, sp(4)).unwrap();
        }
        b.finish()
    }

    #[test]
    fn only_communicating_kernels_get_hidden_parameters() {
        use inkwell::context::Context;
        for (comm, n) in [(false, 1), (true, 5)] {
            let f = kernel(comm);
            for t in [
                crate::Target::nvptx(90),
                crate::Target::Amdgpu(crate::AmdArch::Gfx942),
            ] {
                let ctx = Context::create();
                let (m, _) =
                    crate::lower::lower_kernel(&ctx, &f, t, &crate::CompileOptions::default())
                        .expect("lowers");
                let k = m.get_function("k").expect("kernel");
                assert_eq!(k.count_params(), n, "{t} comm={comm}");
                m.verify().unwrap_or_else(|e| panic!("{t}: {e}"));
            }
        }
    }
}

//! Communication on Tile IR: `rank`, `world_size`, `remote_ptr`, `signal`,
//! `wait_until`, `fence` and `barrier_all` on the hidden parameters and control words
//! of [`crate::comm`] (the same ABI as the SIMT lowering, so the runtime launches
//! both alike and decodes the same error record).
//!
//! A program is one tile thread, so what the SIMT lowering does in thread 0 behind
//! block barriers is plain program order here, and the order against the program's
//! other accesses is the tokens':
//!
//! - `signal` is an `atomic_rmw` (`xchg` or `add`) with the op's ordering and scope
//!   that waits for every earlier access's token, so a release publishes them.
//! - `wait_until` polls with acquire loads in a `loop` whose token is carried through
//!   every iteration (a load whose token fed nothing would be deleted); the acquire's
//!   token then orders every later access, reads included.
//! - `fence` has no op of its own in Tile IR: it is an `atomic_rmw add 0` with the
//!   fence's ordering and scope on the rank's `ABORT` word, which waits for every
//!   earlier access and is waited for by every later one.
//! - `barrier_all` is the SIMT lowering's generation barrier on rank 0's words.
//! - `remote_ptr` adds `heap_bases[peer] - heap_bases[rank]` to each address; a peer
//!   outside the world fails an `assert` (reported by the launch) and uses this
//!   rank's copy.
//!
//! **Timeouts.** Tile IR has no clock: a wait gives up after `timeout_ns / 128` polls
//! (each poll is at least one system-scope load and one check of `ABORT`), so the
//! time it waits before failing scales with the poll's latency rather than matching
//! `TESSERA_WAIT_TIMEOUT` exactly. A failed wait writes the error record (and on a
//! timeout sets every rank's `ABORT`) as the SIMT lowering does; then the program
//! returns, or, for a wait inside a loop (Tile IR cannot return from one), runs on
//! with its later waits released at once by `ABORT`: the launch reports the failure
//! either way.

use tessera_ir::comm as abi;
use tessera_ir::interp::ctrl;
use tessera_ir::ir::{MemOrder, MemScope, SignalOp};

use super::*;

/// One poll in `timeout_ns >> POLL_SHIFT` (128 ns a poll).
const POLL_SHIFT: i64 = 7;

impl Lowerer<'_> {
    /// The hidden parameters (rank, world size, heap-base table, timeout).
    fn cv(&self, op: &Op) -> Result<[Value; 4], CodegenError> {
        self.comm
            .ok_or_else(|| self.unsupported(op, "in a kernel without hidden parameters"))
    }

    fn i64c(&mut self, v: i64) -> Value {
        self.const_splat(ScalarType::I64, ConstValue::Int(v), &[])
    }

    fn i32c(&mut self, v: i64) -> Value {
        self.const_splat(ScalarType::I32, ConstValue::Int(v), &[])
    }

    fn t0(s: TScalar) -> Type {
        tile(&[], TileElementType::Scalar(s))
    }

    fn word_ptr_ty() -> Type {
        tile(
            &[],
            TileElementType::Pointer(Box::new(PointerType {
                pointee: TScalar::I64,
            })),
        )
    }

    fn bin(&mut self, code: Opcode, a: Value, b: Value, s: TScalar) -> Value {
        let attrs: Vec<(&str, Attribute)> = match code {
            Opcode::AddI | Opcode::SubI | Opcode::MulI => {
                vec![("overflow", Attribute::i32(0))]
            }
            Opcode::ShRI | Opcode::MaxI => vec![("signedness", Attribute::i32(0))],
            _ => vec![],
        };
        self.op1(code, &[a, b], Self::t0(s), &attrs)
    }

    fn cmp_u(&mut self, pred: CmpPred, a: Value, b: Value) -> Value {
        let p = cmp_predicate(pred);
        self.op1(
            Opcode::CmpI,
            &[a, b],
            Self::t0(TScalar::I1),
            &[
                ("comparison_predicate", Attribute::i32(p)),
                ("signedness", Attribute::i32(0)),
            ],
        )
    }

    /// `heap_bases[r]` (`r`: `i32`). The table is written before the launch and only
    /// read: its loads need no order.
    fn heap_base(&mut self, bases: Value, r: Value) -> Value {
        let p = self.op1(Opcode::Offset, &[bases, r], Self::word_ptr_ty(), &[]);
        let tok =
            self.emit(OpBuilder::new(Opcode::MakeToken, Location::Unknown).result(Type::Token))[0];
        self.grouped(
            Opcode::LoadPtrTko,
            &[Some(p), None, None, Some(tok)],
            vec![Self::t0(TScalar::I64), Type::Token],
            &[("memory_ordering_semantics", Attribute::i32(0))],
        )[0]
    }

    /// Pointer to control word `w` of the heap at `base` (an `i64`).
    fn ctrl_word(&mut self, base: Value, w: usize) -> Value {
        let off = self.i64c(8 * w as i64);
        let a = self.bin(Opcode::AddI, base, off, TScalar::I64);
        self.op1(Opcode::IntToPtr, &[a], Self::word_ptr_ty(), &[])
    }

    /// An atomic load of the word at `p` (`ordering`, `scope`) after `tok`; the
    /// value and its token.
    fn word_load(&mut self, p: Value, order: MemOrder, scope: MemScope, tok: Value) -> [Value; 2] {
        let out = self.grouped(
            Opcode::LoadPtrTko,
            &[Some(p), None, None, Some(tok)],
            vec![Self::t0(TScalar::I64), Type::Token],
            &[
                ("memory_ordering_semantics", Attribute::i32(ordering(order))),
                ("memory_scope", Attribute::i32(memory_scope(scope))),
            ],
        );
        [out[0], out[1]]
    }

    /// `atomic_rmw` `mode` (3 add, 9 xchg) of `v` on the word at `p` after `tok`; the
    /// old value and the token.
    fn word_rmw(
        &mut self,
        p: Value,
        mode: i64,
        v: Value,
        order: MemOrder,
        scope: MemScope,
        tok: Value,
    ) -> [Value; 2] {
        let out = self.grouped(
            Opcode::AtomicRMW,
            &[Some(p), Some(v), None, Some(tok)],
            vec![Self::t0(TScalar::I64), Type::Token],
            &[
                ("memory_ordering_semantics", Attribute::i32(ordering(order))),
                ("memory_scope", Attribute::i32(memory_scope(scope))),
                ("mode", Attribute::i32(mode)),
            ],
        );
        [out[0], out[1]]
    }

    /// `cas(p, 0, new)` (acq_rel, system) after `tok`: whether it swapped, and the
    /// token.
    fn cas_zero(&mut self, p: Value, new: Value, tok: Value) -> [Value; 2] {
        let zero = self.i64c(0);
        let out = self.grouped(
            Opcode::AtomicCAS,
            &[Some(p), Some(zero), Some(new), None, Some(tok)],
            vec![Self::t0(TScalar::I64), Type::Token],
            &[
                ("memory_ordering_semantics", Attribute::i32(4)),
                ("memory_scope", Attribute::i32(2)),
            ],
        );
        let zero = self.i64c(0);
        let won = self.cmp_u(CmpPred::Eq, out[0], zero);
        [won, out[1]]
    }

    /// A relaxed system-scope store of `v` to the word at `p` after `tok`; its token.
    fn word_store(&mut self, p: Value, v: Value, tok: Value) -> Value {
        self.grouped(
            Opcode::StorePtrTko,
            &[Some(p), Some(v), None, Some(tok)],
            vec![Type::Token],
            &[
                ("memory_ordering_semantics", Attribute::i32(1)),
                ("memory_scope", Attribute::i32(2)),
            ],
        )[0]
    }

    /// Builds `if cond { body }` whose region yields the token `body` returns; the
    /// `if`'s token (the body's, or `tok` when it did not run).
    fn if_tok(
        &mut self,
        cond: Value,
        tok: Value,
        body: impl FnOnce(&mut Self, Value) -> Result<Value, CodegenError>,
    ) -> Result<Value, CodegenError> {
        let (then, blk, _) = build_single_block_region(&mut self.m, &[]);
        let outer = std::mem::replace(&mut self.blk, blk);
        let t = body(self, tok)?;
        self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operand(t));
        let (els, blk, _) = build_single_block_region(&mut self.m, &[]);
        self.blk = blk;
        self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operand(tok));
        self.blk = outer;
        Ok(self.emit(
            OpBuilder::new(Opcode::If, Location::Unknown)
                .operand(cond)
                .result(Type::Token)
                .regions(vec![then, els]),
        )[0])
    }

    /// The program's linear id, `x + gx * (y + gy * z)`, as an `i64`.
    fn program_linear(&mut self) -> Value {
        let id = |l: &mut Self, axis, count| {
            let v = l.block_id(axis, count);
            l.zext64(v)
        };
        let (x, y, z) = (id(self, 0, false), id(self, 1, false), id(self, 2, false));
        let (gx, gy) = (id(self, 0, true), id(self, 1, true));
        let t = self.bin(Opcode::MulI, gy, z, TScalar::I64);
        let t = self.bin(Opcode::AddI, y, t, TScalar::I64);
        let t = self.bin(Opcode::MulI, gx, t, TScalar::I64);
        self.bin(Opcode::AddI, x, t, TScalar::I64)
    }

    /// The `i32` `v` zero-extended to an `i64`.
    fn zext64(&mut self, v: Value) -> Value {
        self.op1(
            Opcode::ExtI,
            &[v],
            Self::t0(TScalar::I64),
            &[("signedness", Attribute::i32(0))],
        )
    }

    /// The total number of programs times the world size, as an `i64`.
    fn arrivals(&mut self, world: Value) -> Value {
        let mut total = self.zext64(world);
        for axis in 0..3 {
            let n = self.block_id(axis, true);
            let n = self.zext64(n);
            total = self.bin(Opcode::MulI, total, n, TScalar::I64);
        }
        total
    }

    /// Writes this rank's error record of kind `kind` (an `i64`: [`abi::KIND_TIMEOUT`]
    /// or [`abi::KIND_ABORTED`]; first writer wins) and, for a timeout, sets every
    /// rank's `ABORT` to `1 + rank`; returns the token after it.
    #[allow(clippy::too_many_arguments)]
    fn error_record(
        &mut self,
        op: &Op,
        site: usize,
        kind: Value,
        expected: Value,
        observed: Value,
        tok: Value,
    ) -> Result<Value, CodegenError> {
        let [rank, world, bases, _] = self.cv(op)?;
        let me = self.heap_base(bases, rank);
        let site_p = self.ctrl_word(me, abi::ERR_SITE);
        let mark = self.i64c(site as i64 + 1);
        let [won, tok] = self.cas_zero(site_p, mark, tok);
        let tok = self.if_tok(won, tok, |l, mut tok| {
            let pid = l.program_linear();
            for (w, v) in [
                (abi::ERR_KIND, kind),
                (abi::ERR_EXPECTED, expected),
                (abi::ERR_OBSERVED, observed),
                (abi::ERR_PROGRAM, pid),
            ] {
                let p = l.ctrl_word(me, w);
                tok = l.word_store(p, v, tok);
            }
            Ok(tok)
        })?;
        // A timeout: for r in 0..world: cas(ABORT of r, 0, 1 + rank).
        let timeout = self.i64c(abi::KIND_TIMEOUT as i64);
        let timed_out = self.cmp_u(CmpPred::Eq, kind, timeout);
        self.if_tok(timed_out, tok, |l, tok| {
            let r64 = l.zext64(rank);
            let one = l.i64c(1);
            let mark = l.bin(Opcode::AddI, r64, one, TScalar::I64);
            let (lb, step) = (l.i32c(0), l.i32c(1));
            let (body, blk, args) =
                build_single_block_region(&mut l.m, &[Self::t0(TScalar::I32), Type::Token]);
            let outer = std::mem::replace(&mut l.blk, blk);
            let base = l.heap_base(bases, args[0]);
            let p = l.ctrl_word(base, ctrl::ABORT);
            let [_, t] = l.cas_zero(p, mark, args[1]);
            l.emit(OpBuilder::new(Opcode::Continue, Location::Unknown).operand(t));
            l.blk = outer;
            Ok(l.emit(
                OpBuilder::new(Opcode::For, Location::Unknown)
                    .operands([lb, world, step, tok])
                    .result(Type::Token)
                    .region(body),
            )[0])
        })
    }

    /// Polls until `probe` (given the token to wait for: the observed value, whether
    /// it is done, its token) is done, `ABORT` is set or the poll budget is spent;
    /// the latter two write the error record (after the loop: the loop itself stays
    /// small). Returns (observed, failed, token).
    fn poll(
        &mut self,
        op: &Op,
        site: usize,
        expected: Value,
        tok0: Value,
        probe: &dyn Fn(&mut Self, Value) -> [Value; 3],
    ) -> Result<[Value; 3], CodegenError> {
        let [rank, _, bases, timeout] = self.cv(op)?;
        let me = self.heap_base(bases, rank);
        let abort_p = self.ctrl_word(me, ctrl::ABORT);
        let shift = self.i64c(POLL_SHIFT);
        let budget = self.bin(Opcode::ShRI, timeout, shift, TScalar::I64);
        let one = self.i64c(1);
        let budget = self.bin(Opcode::MaxI, budget, one, TScalar::I64);
        let zero = self.i64c(0);
        let i64t = Self::t0(TScalar::I64);
        // (polls, observed, status: 0 done or a record kind, token)
        let tys = vec![i64t.clone(), i64t.clone(), i64t, Type::Token];
        let (region, blk, args) = build_single_block_region(&mut self.m, &tys);
        let outer = std::mem::replace(&mut self.blk, blk);
        let (count, tok_in) = (args[0], args[3]);
        let [obs, done, tok] = probe(self, tok_in);
        // Done: out with the acquire's token.
        self.if_break_with(done, |_| Ok(vec![count, obs, zero, tok]))?;
        let [ab, tok] = self.word_load(abort_p, MemOrder::Relaxed, MemScope::System, tok);
        let aborted = self.cmp_u(CmpPred::Ne, ab, zero);
        let kind = self.i64c(abi::KIND_ABORTED as i64);
        self.if_break_with(aborted, |_| Ok(vec![count, obs, kind, tok]))?;
        let next = self.bin(Opcode::AddI, count, one, TScalar::I64);
        let late = self.cmp_u(CmpPred::Ge, next, budget);
        let kind = self.i64c(abi::KIND_TIMEOUT as i64);
        self.if_break_with(late, |_| Ok(vec![count, obs, kind, tok]))?;
        self.emit(
            OpBuilder::new(Opcode::Continue, Location::Unknown).operands([next, obs, zero, tok]),
        );
        self.blk = outer;
        let out = self.emit(
            OpBuilder::new(Opcode::Loop, Location::Unknown)
                .operands([zero, zero, zero, tok0])
                .results(tys)
                .region(region),
        );
        let (obs, status, tok) = (out[1], out[2], out[3]);
        let failed = self.cmp_u(CmpPred::Ne, status, zero);
        let tok = self.if_tok(failed, tok, |l, tok| {
            l.error_record(op, site, status, expected, obs, tok)
        })?;
        Ok([obs, failed, tok])
    }

    /// `if cond { ...; break values }`, `body` building the `...` and giving the
    /// values.
    fn if_break_with(
        &mut self,
        cond: Value,
        body: impl FnOnce(&mut Self) -> Result<Vec<Value>, CodegenError>,
    ) -> Result<(), CodegenError> {
        let (then, blk, _) = build_single_block_region(&mut self.m, &[]);
        let outer = std::mem::replace(&mut self.blk, blk);
        let values = body(self)?;
        self.emit(OpBuilder::new(Opcode::Break, Location::Unknown).operands(values));
        self.blk = outer;
        self.if_then(cond, then);
        Ok(())
    }

    /// After a wait: its token orders every later access (an acquire); a failed
    /// wait returns from the kernel where Tile IR allows it (outside loops).
    fn after_wait(&mut self, failed: Value, tok: Value) {
        self.last_write = Some(tok);
        if self.loop_depth == 0 {
            let (then, blk, _) = build_single_block_region(&mut self.m, &[]);
            let outer = std::mem::replace(&mut self.blk, blk);
            self.emit(OpBuilder::new(Opcode::Return, Location::Unknown));
            self.blk = outer;
            self.if_then(failed, then);
        }
    }

    /// Lowers one communication op; `site` is its index in [`crate::comm::comm_sites`].
    pub(super) fn comm_op(&mut self, op: &Op, site: usize) -> Result<(), CodegenError> {
        let [rank, world, bases, _] = self.cv(op)?;
        match op.kind {
            OpKind::Rank => {
                self.vals.insert(op.results[0], rank);
            }
            OpKind::WorldSize => {
                self.vals.insert(op.results[0], world);
            }
            OpKind::RemotePtr => {
                let r = op.results[0];
                let shape = self.f.ty(r).shape.clone();
                let ty = self.ty(r);
                let (ptrs, peer) = (self.val(op.operands[0]), self.val(op.operands[1]));
                let ok = self.cmp_u(CmpPred::Lt, peer, world);
                self.emit(
                    OpBuilder::new(Opcode::Assert, Location::Unknown)
                        .operand(ok)
                        .attr(
                            "message",
                            Attribute::String(format!(
                                "{}: remote_ptr: the peer is outside the world",
                                op.span
                            )),
                        ),
                );
                let safe = self.op1(
                    Opcode::Select,
                    &[ok, peer, rank],
                    Self::t0(TScalar::I32),
                    &[],
                );
                let me = self.heap_base(bases, rank);
                let them = self.heap_base(bases, safe);
                let delta = self.bin(Opcode::SubI, them, me, TScalar::I64);
                let delta = self.splat(delta, TileElementType::Scalar(TScalar::I64), &shape);
                let i64s = tile(&shape, TileElementType::Scalar(TScalar::I64));
                let a = self.op1(Opcode::PtrToInt, &[ptrs], i64s.clone(), &[]);
                let a = self.op1(
                    Opcode::AddI,
                    &[a, delta],
                    i64s,
                    &[("overflow", Attribute::i32(0))],
                );
                let v = self.op1(Opcode::IntToPtr, &[a], ty, &[]);
                self.vals.insert(r, v);
            }
            OpKind::Fence { order, scope } => {
                if order == MemOrder::Relaxed {
                    return Ok(());
                }
                let me = self.heap_base(bases, rank);
                let p = self.ctrl_word(me, ctrl::ABORT);
                let zero = self.i64c(0);
                let tok = self.write_token();
                let [_, t] = self.word_rmw(p, 3, zero, order, scope, tok);
                self.last_write = Some(t);
            }
            OpKind::Signal {
                op: sop,
                order,
                scope,
            } => {
                let (p, v) = (self.val(op.operands[0]), self.val(op.operands[1]));
                let mode = match sop {
                    SignalOp::Set => 9,
                    SignalOp::Add => 3,
                };
                let tok = self.write_token();
                let [_, t] = self.word_rmw(p, mode, v, order, scope, tok);
                self.last_write = Some(t);
            }
            OpKind::WaitUntil { pred, scope } => {
                let (p, expected) = (self.val(op.operands[0]), self.val(op.operands[1]));
                let tok = self.read_token();
                let probe = move |l: &mut Self, tok: Value| {
                    let [obs, t] = l.word_load(p, MemOrder::Acquire, scope, tok);
                    let done = l.cmp_u(pred, obs, expected);
                    [obs, done, t]
                };
                let [obs, failed, tok] = self.poll(op, site, expected, tok, &probe)?;
                self.after_wait(failed, tok);
                self.vals.insert(op.results[0], obs);
            }
            OpKind::BarrierAll => {
                let zero_r = self.i32c(0);
                let base0 = self.heap_base(bases, zero_r);
                let cnt = self.ctrl_word(base0, ctrl::BARRIER);
                let gen_p = self.ctrl_word(base0, ctrl::BARRIER_GEN);
                // Sense reversal by generation (see `ctrl::BARRIER_GEN`), as the SIMT
                // lowering: read the generation, arrive (after every earlier access);
                // the last arriver resets the count and publishes the next
                // generation, the others poll for it.
                let tok = self.read_token();
                let [gen_seen, t] = self.word_load(gen_p, MemOrder::Acquire, MemScope::System, tok);
                self.reads.push(t);
                let tok = self.write_token();
                let one = self.i64c(1);
                let [old, tok] =
                    self.word_rmw(cnt, 3, one, MemOrder::AcqRel, MemScope::System, tok);
                let total = self.arrivals(world);
                let arrived = self.bin(Opcode::AddI, old, one, TScalar::I64);
                let last = self.cmp_u(CmpPred::Ge, arrived, total);
                let tok = self.if_tok(last, tok, |l, tok| {
                    let zero = l.i64c(0);
                    let [_, t] = l.word_rmw(cnt, 9, zero, MemOrder::Relaxed, MemScope::System, tok);
                    let one = l.i64c(1);
                    let [_, t] = l.word_rmw(gen_p, 3, one, MemOrder::Release, MemScope::System, t);
                    Ok(t)
                })?;
                let probe = move |l: &mut Self, tok: Value| {
                    let [g, t] = l.word_load(gen_p, MemOrder::Acquire, MemScope::System, tok);
                    let done = l.cmp_u(CmpPred::Ne, g, gen_seen);
                    // Reported on timeout: how many had arrived.
                    let [n, t] = l.word_load(cnt, MemOrder::Relaxed, MemScope::System, t);
                    [n, done, t]
                };
                let [_, failed, tok] = self.poll(op, site, total, tok, &probe)?;
                self.reads.clear();
                self.after_wait(failed, tok);
            }
            _ => return Err(self.unsupported(op, "is not a communication op")),
        }
        Ok(())
    }
}

//! Communication ops of the interpreter: remote pointers, signals, waits and
//! barriers, run by a program instance ([`Prog`]) against its [`CommWorld`].

use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use super::InterpError;
use super::buffer::{HostBuffer, std_order};
use super::comm::{CommWorld, ctrl};
use super::prog::{Prog, R};
use super::value::{Data, PtrTile, Slots};
use crate::ir::{AtomicOp, CmpPred, MemOrder, Op, OpKind, SignalOp};

/// Spins, then yields, then sleeps (up to 200 µs) between polls.
struct Backoff(u32);

impl Backoff {
    fn snooze(&mut self) {
        self.0 += 1;
        if self.0 < 64 {
            std::hint::spin_loop();
        } else if self.0 < 256 {
            std::thread::yield_now();
        } else {
            let us = (self.0 - 256).min(200) as u64;
            std::thread::sleep(Duration::from_micros(us.max(5)));
        }
    }
}

impl Prog<'_, '_> {
    fn world(&self) -> &CommWorld {
        &self.ex.world
    }

    fn u64_scalar(&self, op: &Op, k: usize) -> R<u64> {
        match self.val(op, k)? {
            Data::U64(v) if v.len() == 1 => Ok(v[0]),
            _ => Err(self.invalid(op, format!("operand {k} must be a u64 scalar"))),
        }
    }

    /// The `u64` word a scalar signal pointer designates, with a name for messages.
    fn signal_word(&self, op: &Op) -> R<(&HostBuffer, usize, String)> {
        let p = self.ptrs(op, 0)?;
        if p.offs.len() != 1 {
            return Err(self.invalid(op, "signal pointer must be a scalar"));
        }
        let (b, idx) = self.locate::<u64>(op, p, 0, &[])?;
        let name = format!("signal `{}`[{idx}]", self.slot_name(p.slots.get(0)));
        Ok((b, idx, name))
    }

    /// Fails when the world was aborted or the wait ran out of time.
    fn wait_check(
        &self,
        op: &Op,
        start: Instant,
        what: impl FnOnce() -> String,
        pred: CmpPred,
        expected: u64,
        observed: u64,
    ) -> R<()> {
        let w = self.world();
        if let Some(failed_rank) = w.failed_rank() {
            return Err(InterpError::Aborted {
                kernel: self.kernel(),
                op: op.kind.mnemonic(),
                span: op.span.clone(),
                rank: w.rank,
                program_id: self.pid,
                failed_rank,
            }
            .into());
        }
        if start.elapsed() >= w.timeout {
            return Err(InterpError::WaitTimeout {
                kernel: self.kernel(),
                op: op.kind.mnemonic(),
                span: op.span.clone(),
                rank: w.rank,
                program_id: self.pid,
                what: what(),
                pred: pred.symbol(),
                expected,
                observed,
                timeout: w.timeout,
            }
            .into());
        }
        Ok(())
    }

    /// Executes a communication op; `Some(data)` for ops with a result.
    pub(super) fn comm_op(&mut self, op: &Op) -> R<Option<Data>> {
        match op.kind {
            OpKind::Rank => Ok(Some(Data::I32(vec![self.world().rank as i32]))),
            OpKind::WorldSize => Ok(Some(Data::I32(vec![self.world().size as i32]))),
            OpKind::RemotePtr => self.remote_ptr(op).map(Some),
            OpKind::Signal { op: sop, order, .. } => {
                let v = self.u64_scalar(op, 1)?;
                let (b, idx, _) = self.signal_word(op)?;
                let aop = match sop {
                    SignalOp::Set => AtomicOp::Xchg,
                    SignalOp::Add => AtomicOp::Add,
                };
                // `signal_word` located `idx` inside `b`, a buffer of u64.
                b.rmw::<u64>(idx, aop, v, std_order(order))
                    .map_err(|e| self.transport(op, e))?;
                Ok(None)
            }
            OpKind::WaitUntil { pred, .. } => {
                let v = self.u64_scalar(op, 1)?;
                let (b, idx, name) = self.signal_word(op)?;
                let start = Instant::now();
                let mut backoff = Backoff(0);
                loop {
                    let seen = b.load_word(idx).map_err(|e| self.transport(op, e))?;
                    if pred.holds(seen, v) {
                        fence(Ordering::Acquire);
                        return Ok(Some(Data::U64(vec![seen])));
                    }
                    self.wait_check(op, start, || name.clone(), pred, v, seen)?;
                    b.progress();
                    backoff.snooze();
                }
            }
            OpKind::Fence { order, .. } => {
                if order != MemOrder::Relaxed {
                    fence(std_order(order));
                    // `quiet` and ordering fences complete this rank's puts through
                    // a communication engine (nothing to do without one).
                    self.world()
                        .quiet()
                        .map_err(|e| self.transport(op, e.to_string()))?;
                }
                Ok(None)
            }
            OpKind::BarrierAll => {
                self.barrier_all(op)?;
                Ok(None)
            }
            _ => Err(self.invalid(op, "not a communication op")),
        }
    }

    fn barrier_all(&self, op: &Op) -> R<()> {
        let w = self.world();
        let (Some(counter), Some(generation)) =
            (w.word(0, ctrl::BARRIER), w.word(0, ctrl::BARRIER_GEN))
        else {
            return Err(self.invalid(op, "the world has no control words"));
        };
        let per_rank: u64 = self.ex.grid.iter().map(|&g| g as u64).product();
        let total = per_rank * w.size as u64;
        let rmw = |b: &HostBuffer, i: usize, aop: AtomicOp, v: u64, o: Ordering| {
            // `word` checked the type and bounds.
            b.rmw::<u64>(i, aop, v, o)
                .map(Option::unwrap_or_default)
                .map_err(|e| self.transport(op, e))
        };
        let load = |b: &HostBuffer, i: usize| b.load_word(i).map_err(|e| self.transport(op, e));
        // Sense reversal by generation: read the generation, then arrive; the last to
        // arrive resets the count (before anyone can arrive at the next barrier: they
        // are all still waiting) and publishes the next generation.
        let gen_seen = load(generation, ctrl::BARRIER_GEN)?;
        fence(Ordering::Acquire);
        let old = rmw(counter, ctrl::BARRIER, AtomicOp::Add, 1, Ordering::AcqRel)?;
        if old + 1 >= total {
            rmw(counter, ctrl::BARRIER, AtomicOp::Xchg, 0, Ordering::Relaxed)?;
            rmw(
                generation,
                ctrl::BARRIER_GEN,
                AtomicOp::Add,
                1,
                Ordering::Release,
            )?;
            return Ok(());
        }
        let start = Instant::now();
        let mut backoff = Backoff(0);
        loop {
            if load(generation, ctrl::BARRIER_GEN)? != gen_seen {
                fence(Ordering::Acquire);
                return Ok(());
            }
            let arrived = load(counter, ctrl::BARRIER)?;
            let what = || {
                format!(
                    "arrivals of all {total} program instances ({} rank(s) x {per_rank}; {arrived} arrived)",
                    w.size,
                )
            };
            self.wait_check(op, start, what, CmpPred::Ge, total, arrived)?;
            generation.progress();
            w.progress();
            backoff.snooze();
        }
    }

    fn remote_ptr(&self, op: &Op) -> R<Data> {
        let p = self.ptrs(op, 0)?;
        let peer = self.int_scalar(op, 1)?;
        let w = self.world();
        if peer < 0 || peer >= w.size as i128 {
            return Err(InterpError::BadPeer {
                kernel: self.kernel(),
                op: op.kind.mnemonic(),
                span: op.span.clone(),
                rank: w.rank,
                program_id: self.pid,
                peer: peer as i64,
                world_size: w.size,
            }
            .into());
        }
        let map = |slot: u32, lane: usize| -> R<u32> {
            match self.ex.remote_base.get(slot as usize).copied().flatten() {
                Some(base) => Ok(base + peer as u32),
                None => {
                    let shape = self.operand_ty(op, 0)?.shape.clone();
                    Err(self.bad_ptr(
                        op,
                        lane,
                        &shape,
                        format!(
                            "`{}` is not a symmetric buffer of this rank, so it has no copy on a peer",
                            self.slot_name(slot)
                        ),
                    ))
                }
            }
        };
        let slots = match &p.slots {
            Slots::Uniform(s) => Slots::Uniform(map(*s, 0)?),
            Slots::Lanes(v) => Slots::Lanes(
                v.iter()
                    .enumerate()
                    .map(|(i, &s)| map(s, i))
                    .collect::<R<Vec<_>>>()?,
            ),
        };
        Ok(Data::Ptr(PtrTile {
            slots,
            offs: p.offs.clone(),
        }))
    }
}

//! One program instance: its values, the per-op semantics and control flow
//! (memory accesses are in `memory.rs`, communication in `comm_ops.rs`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::InterpError;
use super::arith::{self, ArithErr, Operand};
use super::buffer::HostBuffer;
use super::comm::CommWorld;

use super::tiles::{
    add_offsets, const_data, gather_data, select_data, strided_index, strides, unravel, usize_shape,
};
use super::value::{Data, Slots, map_data};
use crate::ir::{Function, Op, OpKind, Region, ValueId};
use crate::types::Type;

/// Shared state of one launch.
pub(super) struct Exec<'a> {
    pub(super) f: &'a Function,
    pub(super) grid: [u32; 3],
    pub(super) bufs: Vec<Option<&'a HostBuffer>>,
    /// For each slot of a symmetric parameter: the slot of rank 0's copy (rank `r`'s
    /// copy is at `base + r`).
    pub(super) remote_base: Vec<Option<u32>>,
    pub(super) slot_names: Vec<String>,
    pub(super) params: Vec<(ValueId, Data)>,
    pub(super) plan: Plan,
    pub(super) world: CommWorld,
    /// Lowest linear program id known to have failed.
    pub(super) best: AtomicU64,
    pub(super) err: Mutex<Option<(u64, InterpError)>>,
    /// The watchdog's deadline and limit ([`run_limited`]).
    pub(super) watchdog: Option<(std::time::Instant, std::time::Duration)>,
}

/// Why a program instance stopped.
pub(super) enum Stop {
    Error(Box<InterpError>),
    /// A lower program id failed; this one's result no longer matters.
    Cancelled,
}

impl From<InterpError> for Stop {
    fn from(e: InterpError) -> Stop {
        Stop::Error(Box::new(e))
    }
}

pub(super) type R<T> = Result<T, Stop>;

/// How a region ended.
pub(super) enum Term {
    Fall,
    Yield(Vec<Data>),
    Cond(bool, Vec<Data>),
}

impl Exec<'_> {
    pub(super) fn run_program(&self, env: &mut [Option<Data>], lin: u64) {
        if lin > self.best.load(Ordering::Relaxed) {
            return;
        }
        for v in env.iter_mut() {
            *v = None;
        }
        for (v, d) in &self.params {
            if let Some(slot) = env.get_mut(v.index()) {
                *slot = Some(d.clone());
            }
        }
        let [gx, gy, _] = self.grid.map(|g| g as u64);
        let pid = [
            (lin % gx) as u32,
            ((lin / gx) % gy) as u32,
            (lin / (gx * gy)) as u32,
        ];
        let mut p = Prog {
            ex: self,
            env,
            pid,
            lin,
            locals: Vec::new(),
            local_of: HashMap::new(),
        };
        let r = p.region(&self.f.body, &self.plan.body);
        if let Err(Stop::Error(e)) = r {
            // Abandoned waits rank below the failure that caused them.
            let abandoned = matches!(*e, InterpError::Aborted { .. });
            if !abandoned {
                self.world.abort();
            }
            let key = lin | if abandoned { 1 << 63 } else { 0 };
            let mut g = self.err.lock().unwrap_or_else(|e| e.into_inner());
            if g.as_ref().is_none_or(|(l, _)| key < *l) {
                *g = Some((key, *e));
            }
            self.best.fetch_min(key, Ordering::Relaxed);
        }
    }
}

/// One program instance.
pub(super) struct Prog<'a, 'e> {
    pub(super) ex: &'a Exec<'a>,
    pub(super) env: &'e mut [Option<Data>],
    pub(super) pid: [u32; 3],
    pub(super) lin: u64,
    /// This program instance's block-local arrays (`local_alloc`), by slot
    /// `LOCAL_SLOT + index`, and the index of each op's array.
    pub(super) locals: Vec<(HostBuffer, String)>,
    pub(super) local_of: HashMap<*const Op, u32>,
}

/// The first buffer slot of block-local memory (below it: the launch's buffers).
pub(super) const LOCAL_SLOT: u32 = 1 << 31;

impl Prog<'_, '_> {
    pub(super) fn kernel(&self) -> String {
        self.ex.f.name.clone()
    }

    pub(super) fn invalid(&self, op: &Op, message: impl Into<String>) -> Stop {
        InterpError::InvalidIr {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            message: message.into(),
        }
        .into()
    }

    /// A communication engine's failure during `op`.
    pub(super) fn transport(&self, op: &Op, message: String) -> Stop {
        InterpError::Transport {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            program_id: self.pid,
            message,
        }
        .into()
    }

    pub(super) fn unsupported(&self, op: &Op, message: impl Into<String>) -> Stop {
        InterpError::Unsupported {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            message: message.into(),
        }
        .into()
    }

    pub(super) fn arith_err(&self, op: &Op, e: ArithErr, shape: &[u32]) -> Stop {
        match e {
            ArithErr::DivZero(i) => InterpError::DivisionByZero {
                kernel: self.kernel(),
                op: op.kind.mnemonic(),
                span: op.span.clone(),
                program_id: self.pid,
                lane: unravel(shape, i),
            }
            .into(),
            ArithErr::Unsupported(m) => self.invalid(op, m),
        }
    }

    /// Fails the program when the launch's watchdog expired (at each loop test).
    pub(super) fn check_watchdog(&self, op: &Op) -> R<()> {
        match self.ex.watchdog {
            Some((deadline, timeout)) if std::time::Instant::now() >= deadline => {
                Err(InterpError::LaunchTimeout {
                    kernel: self.kernel(),
                    op: op.kind.mnemonic(),
                    span: op.span.clone(),
                    program: self.lin,
                    timeout,
                }
                .into())
            }
            _ => Ok(()),
        }
    }

    pub(super) fn check_cancel(&self) -> R<()> {
        if self.ex.best.load(Ordering::Relaxed) < self.lin {
            Err(Stop::Cancelled)
        } else {
            Ok(())
        }
    }

    pub(super) fn ty(&self, op: &Op, v: ValueId) -> R<&Type> {
        match self.ex.f.values.get(v.index()) {
            Some(d) => Ok(&d.ty),
            None => Err(self.invalid(op, format!("unknown value {v}"))),
        }
    }

    pub(super) fn operand_ty(&self, op: &Op, k: usize) -> R<&Type> {
        let v = *op
            .operands
            .get(k)
            .ok_or_else(|| self.invalid(op, format!("missing operand {k}")))?;
        self.ty(op, v)
    }

    pub(super) fn result_ty(&self, op: &Op) -> R<&Type> {
        let v = *op
            .results
            .first()
            .ok_or_else(|| self.invalid(op, "missing result"))?;
        self.ty(op, v)
    }

    pub(super) fn val(&self, op: &Op, k: usize) -> R<&Data> {
        let v = *op
            .operands
            .get(k)
            .ok_or_else(|| self.invalid(op, format!("missing operand {k}")))?;
        match self.env.get(v.index()) {
            Some(Some(d)) => Ok(d),
            _ => Err(self.invalid(op, format!("{v} is used before it is defined"))),
        }
    }

    /// Operand `k` by value: moved out at its last use, cloned otherwise.
    pub(super) fn owned(&mut self, op: &Op, take: u64, k: usize) -> R<Data> {
        if k < 64 && take & (1 << k) != 0 {
            let v = op.operands[k];
            if let Some(d) = self.env.get_mut(v.index()).and_then(Option::take) {
                return Ok(d);
            }
        }
        self.val(op, k).cloned()
    }

    pub(super) fn set(&mut self, op: &Op, i: usize, d: Data) -> R<()> {
        let v = *op
            .results
            .get(i)
            .ok_or_else(|| self.invalid(op, format!("missing result {i}")))?;
        match self.env.get_mut(v.index()) {
            Some(slot) => {
                *slot = Some(d);
                Ok(())
            }
            None => Err(self.invalid(op, format!("unknown value {v}"))),
        }
    }

    pub(super) fn bind(&mut self, op: &Op, args: &[ValueId], vals: Vec<Data>) -> R<()> {
        if args.len() != vals.len() {
            return Err(self.invalid(
                op,
                format!(
                    "region takes {} argument(s), got {}",
                    args.len(),
                    vals.len()
                ),
            ));
        }
        for (a, d) in args.iter().zip(vals) {
            match self.env.get_mut(a.index()) {
                Some(slot) => *slot = Some(d),
                None => return Err(self.invalid(op, format!("unknown value {a}"))),
            }
        }
        Ok(())
    }

    pub(super) fn check_len(&self, op: &Op, d: &Data, n: usize) -> R<()> {
        if d.len() != n {
            return Err(self.invalid(
                op,
                format!("tile has {} elements, its type says {n}", d.len()),
            ));
        }
        Ok(())
    }

    pub(super) fn region(&mut self, r: &Region, p: &PlanRegion) -> R<Term> {
        for (op, pop) in r.ops.iter().zip(&p.ops) {
            if let Some(t) = self.op(op, pop)? {
                return Ok(t);
            }
        }
        Ok(Term::Fall)
    }

    pub(super) fn int_scalar(&self, op: &Op, k: usize) -> R<i128> {
        self.val(op, k)?
            .int_at(0)
            .ok_or_else(|| self.invalid(op, format!("operand {k} must be an integer scalar")))
    }

    pub(super) fn bool_scalar(&self, op: &Op, k: usize) -> R<bool> {
        match self.val(op, k)? {
            Data::I1(v) if v.len() == 1 => Ok(v[0]),
            _ => Err(self.invalid(op, format!("operand {k} must be an i1 scalar"))),
        }
    }

    pub(super) fn op(&mut self, op: &Op, pop: &PlanOp) -> R<Option<Term>> {
        let take = pop.take;
        let d = match &op.kind {
            OpKind::ProgramId { axis } | OpKind::NumPrograms { axis } => {
                let a = *axis as usize;
                if a > 2 {
                    return Err(self.invalid(op, format!("grid axis {axis}")));
                }
                let x = if matches!(op.kind, OpKind::ProgramId { .. }) {
                    self.pid[a]
                } else {
                    self.ex.grid[a]
                };
                Data::I32(vec![x as i32])
            }
            OpKind::Const(c) => {
                let t = self.result_ty(op)?;
                let st = t
                    .scalar_type()
                    .ok_or_else(|| self.invalid(op, "pointer constant"))?;
                const_data(*c, st, t.numel())
            }
            OpKind::Arange { start, end } => {
                if end.saturating_sub(*start) > 1 << 24 {
                    return Err(self.invalid(op, "arange too long"));
                }
                Data::I32((*start..*end).map(|x| x as i32).collect())
            }
            OpKind::Splat => {
                let n = self.result_ty(op)?.numel();
                let d = self.val(op, 0)?;
                self.check_len(op, d, 1)?;
                if pop.lazy {
                    // Every use broadcasts one-element operands itself.
                    d.clone()
                } else {
                    map_data!(d, |v| vec![v[0]; n])
                }
            }
            OpKind::Broadcast => {
                let src = usize_shape(self.operand_ty(op, 0)?);
                let dst = usize_shape(self.result_ty(op)?);
                let n_src: usize = src.iter().product();
                let n_dst: usize = dst.iter().product();
                if src.len() != dst.len() {
                    return Err(self.invalid(op, "broadcast changes the rank"));
                }
                if n_src == n_dst {
                    self.owned(op, take, 0)?
                } else {
                    let d = self.val(op, 0)?;
                    self.check_len(op, d, n_src)?;
                    if n_src == 1 {
                        map_data!(d, |v| vec![v[0]; n_dst])
                    } else {
                        let mut st = strides(&src);
                        for (i, s) in st.iter_mut().enumerate() {
                            if src[i] == 1 {
                                *s = 0;
                            }
                        }
                        gather_data(d, &strided_index(&dst, &st))
                    }
                }
            }
            OpKind::ExpandDims { .. } | OpKind::Reshape | OpKind::Hint { .. } => {
                self.owned(op, take, 0)?
            }
            OpKind::Permute { order } => {
                let src = usize_shape(self.operand_ty(op, 0)?);
                if order.len() != src.len() || order.iter().any(|&o| o as usize >= src.len()) {
                    return Err(self.invalid(op, "bad permutation"));
                }
                let st = strides(&src);
                let dst: Vec<usize> = order.iter().map(|&o| src[o as usize]).collect();
                let pst: Vec<usize> = order.iter().map(|&o| st[o as usize]).collect();
                let d = self.val(op, 0)?;
                self.check_len(op, d, src.iter().product())?;
                gather_data(d, &strided_index(&dst, &pst))
            }
            OpKind::Binary(b) => {
                let a = if take & 1 != 0 {
                    Operand::Own(self.owned(op, take, 0)?)
                } else {
                    Operand::Ref(self.val(op, 0)?)
                };
                let r = arith::binary(*b, a, self.val(op, 1)?);
                let shape = &self.result_ty(op)?.shape;
                r.map_err(|e| self.arith_err(op, e, shape))?
            }
            OpKind::Unary(u) => {
                let r = arith::unary(*u, self.val(op, 0)?);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::Fma => {
                let r = arith::fma(self.val(op, 0)?, self.val(op, 1)?, self.val(op, 2)?);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::Cmp(p) => {
                let r = arith::cmp(*p, self.val(op, 0)?, self.val(op, 1)?);
                Data::I1(r.map_err(|e| self.arith_err(op, e, &[]))?)
            }
            OpKind::Select => {
                let Data::I1(c) = self.val(op, 0)? else {
                    return Err(self.invalid(op, "select condition must be i1"));
                };
                select_data(c, self.val(op, 1)?, self.val(op, 2)?)
                    .ok_or_else(|| self.invalid(op, "select operands differ in type"))?
            }
            OpKind::Cast => {
                let to = self
                    .result_ty(op)?
                    .scalar_type()
                    .ok_or_else(|| self.invalid(op, "cast to a pointer"))?;
                let r = arith::cast(self.val(op, 0)?, to);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::LocalAlloc { len } => self.local_alloc(op, *len)?,
            OpKind::Bitcast => {
                let to = self
                    .result_ty(op)?
                    .scalar_type()
                    .ok_or_else(|| self.invalid(op, "bitcast to a pointer"))?;
                let r = arith::bitcast(self.val(op, 0)?, to);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::AddPtr => {
                let Data::Ptr(mut p) = self.owned(op, take, 0)? else {
                    return Err(self.invalid(op, "addptr needs pointers"));
                };
                let n = self.val(op, 1)?.len();
                if p.offs.len() == 1 && n != 1 {
                    // A one-element (lazily splatted) pointer: broadcast it.
                    if let Slots::Lanes(l) = &mut p.slots {
                        *l = vec![l[0]; n];
                    }
                }
                if !add_offsets(&mut p.offs, self.val(op, 1)?) {
                    return Err(
                        self.invalid(op, "addptr offsets must be integers of the same shape")
                    );
                }
                Data::Ptr(p)
            }
            OpKind::Load {
                has_mask,
                has_other,
            } => self.load(op, *has_mask, *has_other)?,
            OpKind::Store { has_mask } => {
                self.store(op, *has_mask)?;
                return Ok(None);
            }
            OpKind::DescLoad { rank, .. } => self.desc_load(op, *rank)?,
            OpKind::DescStore { rank } => {
                self.desc_store(op, *rank)?;
                return Ok(None);
            }
            OpKind::AtomicRmw { .. } | OpKind::AtomicCas { .. } => self.atomic(op)?,
            OpKind::Dot => {
                let (ta, tb) = (self.operand_ty(op, 0)?, self.operand_ty(op, 1)?);
                if ta.rank() != 2 || tb.rank() != 2 {
                    return Err(self.invalid(op, "dot needs 2-D tiles"));
                }
                let dims = (
                    ta.shape[0] as usize,
                    ta.shape[1] as usize,
                    tb.shape[1] as usize,
                );
                let acc = self.owned(op, take, 2)?;
                let r = arith::dot(self.val(op, 0)?, self.val(op, 1)?, acc, dims);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::DotScaled { format } => {
                let (ta, tb) = (self.operand_ty(op, 0)?, self.operand_ty(op, 2)?);
                if ta.rank() != 2 || tb.rank() != 2 {
                    return Err(self.invalid(op, "dot_scaled needs 2-D tiles"));
                }
                let per = format.per_element() as usize;
                let dims = (
                    ta.shape[0] as usize,
                    ta.shape[1] as usize * per,
                    tb.shape[1] as usize * per,
                );
                let acc = self.owned(op, take, 4)?;
                let ins = [
                    self.val(op, 0)?,
                    self.val(op, 1)?,
                    self.val(op, 2)?,
                    self.val(op, 3)?,
                ];
                let r = arith::dot_scaled(*format, ins, acc, dims);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::Reduce { axis, op: rop } | OpKind::Scan { axis, op: rop, .. } => {
                let shape = usize_shape(self.operand_ty(op, 0)?);
                let a = *axis as usize;
                if a >= shape.len() {
                    return Err(self.invalid(op, format!("axis {axis} out of range")));
                }
                let dims = (
                    shape[..a].iter().product(),
                    shape[a],
                    shape[a + 1..].iter().product(),
                );
                let scan = match op.kind {
                    OpKind::Scan { reverse, .. } => Some(reverse),
                    _ => None,
                };
                let r = arith::reduce_or_scan(*rop, self.val(op, 0)?, dims, scan);
                r.map_err(|e| self.arith_err(op, e, &[]))?
            }
            OpKind::For => {
                self.for_op(op, pop)?;
                return Ok(None);
            }
            OpKind::If => {
                let c = self.bool_scalar(op, 0)?;
                let i = if c { 0 } else { 1 };
                let (Some(r), Some(p)) = (op.regions.get(i), pop.regions.get(i)) else {
                    return Err(self.invalid(op, "if needs two regions"));
                };
                let vals = match self.region(r, p)? {
                    Term::Yield(v) => v,
                    Term::Fall => Vec::new(),
                    Term::Cond(..) => return Err(self.invalid(op, "`condition` in an if")),
                };
                if vals.len() != op.results.len() {
                    return Err(self.invalid(op, "if region yields the wrong number of values"));
                }
                for (i, d) in vals.into_iter().enumerate() {
                    self.set(op, i, d)?;
                }
                return Ok(None);
            }
            OpKind::While => {
                self.while_op(op, pop)?;
                return Ok(None);
            }
            OpKind::Yield => {
                let vals = (0..op.operands.len())
                    .map(|k| self.owned(op, take, k))
                    .collect::<R<Vec<_>>>()?;
                return Ok(Some(Term::Yield(vals)));
            }
            OpKind::Condition => {
                let c = self.bool_scalar(op, 0)?;
                let vals = (1..op.operands.len())
                    .map(|k| self.owned(op, take, k))
                    .collect::<R<Vec<_>>>()?;
                return Ok(Some(Term::Cond(c, vals)));
            }
            OpKind::Barrier => return Ok(None),
            OpKind::Print { .. } | OpKind::Assert { .. } => {
                return Err(self.invalid(
                    op,
                    "`print`/`assert` must be lowered first (tessera_ir::debug::lower_debug_ops)",
                ));
            }
            OpKind::Rank
            | OpKind::WorldSize
            | OpKind::RemotePtr
            | OpKind::Signal { .. }
            | OpKind::WaitUntil { .. }
            | OpKind::Fence { .. }
            | OpKind::BarrierAll => match self.comm_op(op)? {
                Some(d) => d,
                None => return Ok(None),
            },
        };
        self.set(op, 0, d)?;
        Ok(None)
    }

    pub(super) fn for_op(&mut self, op: &Op, pop: &PlanOp) -> R<()> {
        if op.operands.len() < 3 {
            return Err(self.invalid(op, "for needs lb, ub, step"));
        }
        let ity = self
            .operand_ty(op, 0)?
            .scalar_type()
            .filter(|t| t.is_int())
            .ok_or_else(|| self.invalid(op, "for bounds must be integers"))?;
        let (lb, ub, step) = (
            self.int_scalar(op, 0)?,
            self.int_scalar(op, 1)?,
            self.int_scalar(op, 2)?,
        );
        if step <= 0 {
            return Err(self.unsupported(op, format!("for step must be positive, got {step}")));
        }
        let mut iters = (3..op.operands.len())
            .map(|k| self.owned(op, pop.take, k))
            .collect::<R<Vec<_>>>()?;
        let (Some(body), Some(pbody)) = (op.regions.first(), pop.regions.first()) else {
            return Err(self.invalid(op, "for needs a body"));
        };
        let Some((&iv_arg, iter_args)) = body.args.split_first() else {
            return Err(self.invalid(op, "for body needs an induction variable"));
        };
        let mut iv = lb;
        while iv < ub {
            self.check_cancel()?;
            self.check_watchdog(op)?;
            let ivd = Data::int_scalar(ity, iv).ok_or_else(|| self.invalid(op, "bad iv"))?;
            self.bind(op, &[iv_arg], vec![ivd])?;
            self.bind(op, iter_args, iters)?;
            iters = match self.region(body, pbody)? {
                Term::Yield(v) => v,
                Term::Fall if iter_args.is_empty() => Vec::new(),
                _ => return Err(self.invalid(op, "for body must end in yield")),
            };
            iv += step;
        }
        if iters.len() != op.results.len() {
            return Err(self.invalid(op, "for yields the wrong number of values"));
        }
        for (i, d) in iters.into_iter().enumerate() {
            self.set(op, i, d)?;
        }
        Ok(())
    }

    pub(super) fn while_op(&mut self, op: &Op, pop: &PlanOp) -> R<()> {
        let mut carried = (0..op.operands.len())
            .map(|k| self.owned(op, pop.take, k))
            .collect::<R<Vec<_>>>()?;
        let (Some(before), Some(after), Some(pb), Some(pa)) = (
            op.regions.first(),
            op.regions.get(1),
            pop.regions.first(),
            pop.regions.get(1),
        ) else {
            return Err(self.invalid(op, "while needs two regions"));
        };
        loop {
            self.check_cancel()?;
            self.check_watchdog(op)?;
            self.bind(op, &before.args, carried)?;
            let (c, fwd) = match self.region(before, pb)? {
                Term::Cond(c, v) => (c, v),
                _ => return Err(self.invalid(op, "while before-region must end in condition")),
            };
            if !c {
                if fwd.len() != op.results.len() {
                    return Err(self.invalid(op, "while forwards the wrong number of values"));
                }
                for (i, d) in fwd.into_iter().enumerate() {
                    self.set(op, i, d)?;
                }
                return Ok(());
            }
            self.bind(op, &after.args, fwd)?;
            carried = match self.region(after, pa)? {
                Term::Yield(v) => v,
                Term::Fall if before.args.is_empty() => Vec::new(),
                _ => return Err(self.invalid(op, "while after-region must end in yield")),
            };
        }
    }

    // ----- memory -----
}

/// Per-op facts computed once per launch.
pub(super) struct PlanOp {
    /// Bit `k`: operand `k` may be moved out of the environment (its last use, in the
    /// region that defines it, and not used twice by this op).
    pub(super) take: u64,
    /// For `splat`: every use broadcasts a one-element operand itself (`binary`, `cmp`,
    /// `addptr` whose other operand is not a splat), so the splat keeps one element.
    pub(super) lazy: bool,
    pub(super) regions: Vec<PlanRegion>,
}

pub(super) struct PlanRegion {
    pub(super) ops: Vec<PlanOp>,
}

pub(super) struct Plan {
    pub(super) body: PlanRegion,
}

impl Plan {
    pub(super) fn new(f: &Function) -> Plan {
        const NONE: usize = usize::MAX;
        let nv = f.values.len();
        let mut def_region = vec![NONE; nv];
        let mut last_use = vec![(NONE, NONE); nv];
        for p in &f.params {
            if let Some(d) = def_region.get_mut(p.value.index()) {
                *d = 0;
            }
        }
        struct Walk<'a> {
            def_region: &'a mut Vec<usize>,
            last_use: &'a mut Vec<(usize, usize)>,
            /// Defined by a `splat`.
            splat: Vec<bool>,
            /// A splat all of whose uses accept a one-element operand.
            lazy: Vec<bool>,
            seq: usize,
            rid: usize,
        }
        impl Walk<'_> {
            fn scan(&mut self, r: &Region, rid: usize) {
                for a in &r.args {
                    if let Some(d) = self.def_region.get_mut(a.index()) {
                        *d = rid;
                    }
                }
                for op in &r.ops {
                    let s = self.seq;
                    self.seq += 1;
                    for (k, o) in op.operands.iter().enumerate() {
                        if let Some(u) = self.last_use.get_mut(o.index()) {
                            *u = (s, rid);
                        }
                        if self.splat.get(o.index()) == Some(&true) {
                            let broadcasts = matches!(
                                op.kind,
                                OpKind::Binary(_) | OpKind::Cmp(_) | OpKind::AddPtr
                            ) && op.operands.len() == 2
                                && !self.splat[op.operands[1 - k].index()];
                            if !broadcasts {
                                self.lazy[o.index()] = false;
                            }
                        }
                    }
                    for res in &op.results {
                        if let Some(d) = self.def_region.get_mut(res.index()) {
                            *d = rid;
                        }
                        if op.kind == OpKind::Splat && res.index() < self.splat.len() {
                            self.splat[res.index()] = true;
                            self.lazy[res.index()] = true;
                        }
                    }
                    for sub in &op.regions {
                        self.rid += 1;
                        let id = self.rid;
                        self.scan(sub, id);
                    }
                }
            }
            fn build(&mut self, r: &Region, rid: usize) -> PlanRegion {
                let mut ops = Vec::with_capacity(r.ops.len());
                for op in &r.ops {
                    let s = self.seq;
                    self.seq += 1;
                    let mut take = 0u64;
                    for (k, o) in op.operands.iter().enumerate().take(64) {
                        let i = o.index();
                        if i < self.last_use.len()
                            && self.last_use[i] == (s, rid)
                            && self.def_region[i] == rid
                            && op.operands.iter().filter(|x| *x == o).count() == 1
                        {
                            take |= 1 << k;
                        }
                    }
                    let mut regions = Vec::with_capacity(op.regions.len());
                    for sub in &op.regions {
                        self.rid += 1;
                        let id = self.rid;
                        regions.push(self.build(sub, id));
                    }
                    let lazy = op.kind == OpKind::Splat
                        && op
                            .results
                            .first()
                            .is_some_and(|r| self.lazy.get(r.index()) == Some(&true));
                    ops.push(PlanOp {
                        take,
                        lazy,
                        regions,
                    });
                }
                PlanRegion { ops }
            }
        }
        let mut w = Walk {
            def_region: &mut def_region,
            last_use: &mut last_use,
            splat: vec![false; nv],
            lazy: vec![false; nv],
            seq: 0,
            rid: 0,
        };
        w.scan(&f.body, 0);
        w.seq = 0;
        w.rid = 0;
        let body = w.build(&f.body, 0);
        Plan { body }
    }
}

//! Fused all-reduce + residual add + RMSNorm ([`AllReduceRmsNorm`], kernel
//! [`allreduce_rmsnorm_kernel`]): every rank sums the ranks' partial activations (one
//! shot, reading its peers' copies), adds the residual and normalizes each row.

use super::{
    MAX_PROGRAMS, NORM_BLOCK, arrivals, check_len, check_programs, comm_err, programs_for,
    team_barrier, to_i32,
};
use crate::buffer::Element;
use crate::prelude::*;

/// Fused all-reduce + residual add + RMSNorm (one shot), one rank's part.
///
/// `x` (symmetric, `rows x hidden`) holds this rank's partial sums. Program 0 first
/// sets word `rank` of every rank's `sig` to `epoch` ("my `x` is ready"); every
/// program waits for all ranks' words, then, for each of its rows, reads the row from
/// every rank (in rank order, so every rank computes bit-identical results), adds the
/// residual, stores `h` (rounded to `T`) back into `residual`, and writes
/// `out = h * rsqrt(mean(h²) + eps) * weight` (statistics in f32, from the rounded `h`).
/// `sig` holds `world_size + 1` words, the last one for the closing [`team_barrier`].
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn allreduce_rmsnorm_kernel<T: Float, const BLOCK: usize>(
    x: &Symmetric<T>,
    residual: &mut Global<T>,
    weight: &Global<T>,
    out: &mut Global<T>,
    sig: &mut Symmetric<u64>,
    rows: i32,
    hidden: i32,
    eps: f32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let cols = arange::<BLOCK>();
    if pid.eq(0) {
        for p in 0..ws {
            sig.signal(p, me, epoch, SignalOp::Set);
        }
    }
    for p in 0..ws {
        sig.wait_until(p, CmpPred::Ge, epoch);
    }
    let hf = hidden.cast::<f32>();
    for row in (pid..rows).step_by(np) {
        let base = row * hidden;
        let mut sq = zeros::<f32, S1<BLOCK>>();
        for off in (0..hidden).step_by(BLOCK) {
            let c = off + cols;
            let mask = c.lt(hidden);
            let mut acc = zeros::<f32, S1<BLOCK>>();
            for p in 0..ws {
                acc += x.on(p).load(base + c, mask).cast::<f32>();
            }
            let h = (acc + residual.load(base + c, mask).cast::<f32>()).cast::<T>();
            residual.store(base + c, h, mask);
            let hv = h.cast::<f32>();
            sq += hv * hv;
        }
        let rstd = (sq.sum::<0>() / hf + eps).rsqrt();
        for off in (0..hidden).step_by(BLOCK) {
            let c = off + cols;
            let mask = c.lt(hidden);
            let h = residual.load(base + c, mask).cast::<f32>();
            let w = weight.load(c, mask).cast::<f32>();
            out.store(base + c, (h * rstd * w).cast::<T>(), mask);
        }
    }

    team_barrier(sig, ws, arrivals(epoch));
}

/// Fused all-reduce + residual add + RMSNorm (one shot): with `x` the symmetric
/// per-rank partial sums, every rank computes `h = Σ_ranks x + residual` (written
/// back to `residual`, as the next residual stream) and
/// `out = h * rsqrt(mean(h²) + eps) * weight`. See [`allreduce_rmsnorm_kernel`].
pub struct AllReduceRmsNorm<T: Float + Element> {
    rows: usize,
    hidden: usize,
    eps: f32,
    sig: SymBuffer<u64>,
    epoch: u64,
    programs: u32,
    _t: std::marker::PhantomData<T>,
}

impl<T: Float + Element> std::fmt::Debug for AllReduceRmsNorm<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AllReduceRmsNorm<{}>({}x{}, eps {}, {} programs, epoch {})",
            T::TY,
            self.rows,
            self.hidden,
            self.eps,
            self.programs,
            self.epoch
        )
    }
}

impl<T: Float + Element> AllReduceRmsNorm<T> {
    /// Plans the operation on `rows x hidden` activations (collective). Errors of
    /// the plan's calls name the caller's line first ([`Error::Collective`]).
    #[track_caller]
    pub fn new(
        rank: &Rank,
        rows: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<AllReduceRmsNorm<T>, Error> {
        Self::new_impl(rank, rows, hidden, eps).map_err(Error::in_call("AllReduceRmsNorm::new"))
    }

    fn new_impl(
        rank: &Rank,
        rows: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<AllReduceRmsNorm<T>, Error> {
        if rows == 0 || hidden == 0 {
            return Err(comm_err(
                rank,
                format!("AllReduceRmsNorm needs a nonempty shape, got {rows}x{hidden}"),
            ));
        }
        to_i32(rank, "rows*hidden", rows * hidden)?;
        let sig = rank.alloc_signals(rank.size() as usize + 1)?;
        rank.barrier()?;
        Ok(AllReduceRmsNorm {
            rows,
            hidden,
            eps,
            sig,
            epoch: 0,
            programs: programs_for(rank, rows, MAX_PROGRAMS),
            _t: std::marker::PhantomData,
        })
    }

    /// Sets the number of program instances per rank (1..=1024; the same on every
    /// rank).
    #[track_caller]
    pub fn with_programs(
        mut self,
        rank: &Rank,
        programs: u32,
    ) -> Result<AllReduceRmsNorm<T>, Error> {
        self.programs = check_programs(rank, programs)
            .map_err(Error::in_call("AllReduceRmsNorm::with_programs"))?;
        Ok(self)
    }

    /// Runs on every rank (collective).
    #[track_caller]
    pub fn run(
        &mut self,
        rank: &Rank,
        x: &SymBuffer<T>,
        residual: &mut Buffer<T>,
        weight: &Buffer<T>,
        out: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        allreduce_rmsnorm_kernel<T, NORM_BLOCK>: Kernel<Comptime = ()>,
    {
        self.run_impl(rank, x, residual, weight, out)
            .map_err(Error::in_call("AllReduceRmsNorm::run"))
    }

    fn run_impl(
        &mut self,
        rank: &Rank,
        x: &SymBuffer<T>,
        residual: &mut Buffer<T>,
        weight: &Buffer<T>,
        out: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        allreduce_rmsnorm_kernel<T, NORM_BLOCK>: Kernel<Comptime = ()>,
    {
        let len = self.rows * self.hidden;
        check_len("AllReduceRmsNorm: x", x, len)?;
        check_len("AllReduceRmsNorm: the residual", residual, len)?;
        check_len("AllReduceRmsNorm: the weight", weight, self.hidden)?;
        check_len("AllReduceRmsNorm: the output", out, len)?;
        self.epoch += 1;
        allreduce_rmsnorm_kernel::<T, NORM_BLOCK>::launch(
            rank.device(),
            self.programs,
            (
                x,
                residual,
                weight,
                out,
                &mut self.sig,
                self.rows as i32,
                self.hidden as i32,
                self.eps,
                self.epoch,
            ),
        )
    }
}

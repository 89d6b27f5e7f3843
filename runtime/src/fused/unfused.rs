//! The unfused sequences the fused kernels replace, built from separate kernels: the
//! baselines of the tests and benchmarks.

use super::{
    BK, BM, BN, GemmElem, MAX_PROGRAMS, NORM_BLOCK, arrivals, check_len, gemm_tile, programs_for,
    team_barrier,
};
use crate::buffer::Element;
use crate::prelude::*;

/// All-gather of row shards: each program copies chunks (`TM` rows) of this rank's
/// `ms x k` shard `a` into rows `rank*ms..` of `gathered` on every rank (this one
/// included). Starts and ends with a [`team_barrier`] on `sig[0]`: nobody writes
/// into a peer's `gathered` while that peer may still be reading the previous
/// contents, and everything is there when the kernel returns.
#[kernel]
pub fn gather_rows_kernel<T: DotInput<Acc = f32>, const TM: usize, const TK: usize>(
    a: &Global<T>,
    gathered: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    ms: i32,
    k: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let nchunk = (ms + (TM as i32 - 1)) / TM as i32;
    let rows = arange::<TM>();
    let rk = arange::<TK>();
    team_barrier(sig, 0, arrivals(epoch * 2 - 1));
    for ch in (pid..nchunk).step_by(np) {
        let r = (ch * TM as i32 + rows).expand_dims::<1>();
        let r_ok = r.lt(ms);
        for k0 in (0..k).step_by(TK) {
            let kk = (k0 + rk).expand_dims::<0>();
            let mask = r_ok & kk.lt(k);
            let v = a.load(r * k + kk, mask);
            for i in 0..ws {
                gathered.put_nbi((me + i) % ws, (me * ms + r) * k + kk, v, mask);
            }
        }
    }
    team_barrier(sig, 0, arrivals(epoch * 2));
}

/// Tiled `c = a · b` (`m x k` times `k x n`), one `TM x TN` tile per program
/// instance, the same tile code (and summation order) as the fused kernels.
#[kernel]
pub fn gemm_kernel<T: DotInput<Acc = f32>, const TM: usize, const TN: usize, const TK: usize>(
    a: &Global<T>,
    b: &Global<T>,
    c: &mut Global<T>,
    m: i32,
    n: i32,
    k: i32,
) {
    let r = (program_id(0) * TM as i32 + arange::<TM>()).expand_dims::<1>();
    let cn = (program_id(1) * TN as i32 + arange::<TN>()).expand_dims::<0>();
    let r_ok = r.lt(m);
    let acc = gemm_tile::<T, TM, TN, TK>(a, r, r_ok, b, cn, n, k);
    c.store(r * n + cn, acc.cast::<T>(), r_ok & cn.lt(n));
}

/// The unfused counterpart of [`super::AgGemm`]: all-gather the shards into a
/// symmetric `(size*ms) x k` buffer ([`gather_rows_kernel`]), then `c = A · b`
/// ([`gemm_kernel`], one program per output tile).
pub struct AgThenGemm<T: GemmElem> {
    ms: usize,
    n: usize,
    k: usize,
    gathered: SymBuffer<T>,
    sig: SymBuffer<u64>,
    epoch: u64,
}

impl<T: GemmElem> std::fmt::Debug for AgThenGemm<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AgThenGemm<{}>(shard {}x{}, n {})",
            T::TY,
            self.ms,
            self.k,
            self.n
        )
    }
}

impl<T: GemmElem> AgThenGemm<T> {
    /// Plans it for `shard_rows x k` shards and a `k x n` `B` (collective).
    #[track_caller]
    pub fn new(rank: &Rank, shard_rows: usize, n: usize, k: usize) -> Result<AgThenGemm<T>, Error> {
        Self::new_impl(rank, shard_rows, n, k).map_err(Error::in_call("AgThenGemm::new"))
    }

    fn new_impl(
        rank: &Rank,
        shard_rows: usize,
        n: usize,
        k: usize,
    ) -> Result<AgThenGemm<T>, Error> {
        let m = shard_rows * rank.size() as usize;
        let gathered = rank.alloc::<T>(m * k)?;
        let sig = rank.alloc_signals(1)?;
        rank.barrier()?;
        Ok(AgThenGemm {
            ms: shard_rows,
            n,
            k,
            gathered,
            sig,
            epoch: 0,
        })
    }

    /// Runs it on every rank (collective), like [`super::AgGemm::run`].
    #[track_caller]
    pub fn run(
        &mut self,
        rank: &Rank,
        a: &Buffer<T>,
        b: &Buffer<T>,
        c: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        gather_rows_kernel<T, BM, BK>: Kernel<Comptime = ()>,
        gemm_kernel<T, BM, BN, BK>: Kernel<Comptime = ()>,
    {
        self.run_impl(rank, a, b, c)
            .map_err(Error::in_call("AgThenGemm::run"))
    }

    fn run_impl(
        &mut self,
        rank: &Rank,
        a: &Buffer<T>,
        b: &Buffer<T>,
        c: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        gather_rows_kernel<T, BM, BK>: Kernel<Comptime = ()>,
        gemm_kernel<T, BM, BN, BK>: Kernel<Comptime = ()>,
    {
        let (ms, n, k) = (self.ms, self.n, self.k);
        let m = ms * rank.size() as usize;
        check_len("AgThenGemm: the A shard", a, ms * k)?;
        check_len("AgThenGemm: B", b, k * n)?;
        check_len("AgThenGemm: C", c, m * n)?;
        let dev = rank.device();
        self.epoch += 1;
        let programs = programs_for(rank, ms.div_ceil(BM), MAX_PROGRAMS);
        gather_rows_kernel::<T, BM, BK>::launch(
            dev,
            programs,
            (
                a,
                &mut self.gathered,
                &mut self.sig,
                ms as i32,
                k as i32,
                self.epoch,
            ),
        )?;
        let grid = (m.div_ceil(BM), n.div_ceil(BN));
        gemm_kernel::<T, BM, BN, BK>::launch(
            dev,
            grid,
            (&*self.gathered, b, c, m as i32, n as i32, k as i32),
        )
    }

    /// The gathered `A` of the last run.
    pub fn gathered(&self) -> &SymBuffer<T> {
        &self.gathered
    }
}

/// Reduce-scatter of row blocks: `out` (`ms x n`) = the sum over ranks (f32, in
/// rank order, rounded once) of rows `rank*ms..` of every rank's `part`
/// (`world_size*ms x n`). Starts and ends with a [`team_barrier`] on `sig[0]`.
#[kernel]
pub fn reduce_scatter_rows_kernel<T: Float, const B: usize>(
    part: &Symmetric<T>,
    out: &mut Global<T>,
    sig: &mut Symmetric<u64>,
    ms: i32,
    n: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let (pid, np) = (program_id(0), num_programs(0));
    let len = ms * n;
    team_barrier(sig, 0, arrivals(epoch * 2 - 1));
    for off in (pid * B as i32..len).step_by(np * B as i32) {
        let i = off + arange::<B>();
        let mask = i.lt(len);
        let mut acc = zeros::<f32, S1<B>>();
        for p in 0..ws {
            acc += part.on(p).load(me * len + i, mask).cast::<f32>();
        }
        out.store(i, acc.cast::<T>(), mask);
    }
    team_barrier(sig, 0, arrivals(epoch * 2));
}

/// One-shot all-reduce (sum) of `len` elements: `out` = the sum over ranks (f32,
/// in rank order, rounded once) of every rank's `x`. Starts and ends with a
/// [`team_barrier`] on `sig[0]`.
#[kernel]
pub fn all_reduce_kernel<T: Float, const B: usize>(
    x: &Symmetric<T>,
    out: &mut Global<T>,
    sig: &mut Symmetric<u64>,
    len: i32,
    epoch: u64,
) {
    let ws = world_size();
    let (pid, np) = (program_id(0), num_programs(0));
    team_barrier(sig, 0, arrivals(epoch * 2 - 1));
    for off in (pid * B as i32..len).step_by(np * B as i32) {
        let i = off + arange::<B>();
        let mask = i.lt(len);
        let mut acc = zeros::<f32, S1<B>>();
        for p in 0..ws {
            acc += x.on(p).load(i, mask).cast::<f32>();
        }
        out.store(i, acc.cast::<T>(), mask);
    }
    team_barrier(sig, 0, arrivals(epoch * 2));
}

/// One program per row: `h = sum + residual` (rounded to `T`, written back into
/// `residual`), `out = h * rsqrt(mean(h²) + eps) * weight`.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn residual_rmsnorm_kernel<T: Float, const B: usize>(
    sum: &Global<T>,
    residual: &mut Global<T>,
    weight: &Global<T>,
    out: &mut Global<T>,
    hidden: i32,
    eps: f32,
) {
    let base = program_id(0) * hidden;
    let cols = arange::<B>();
    let mut sq = zeros::<f32, S1<B>>();
    for off in (0..hidden).step_by(B) {
        let c = off + cols;
        let mask = c.lt(hidden);
        let s = sum.load(base + c, mask).cast::<f32>();
        let h = (s + residual.load(base + c, mask).cast::<f32>()).cast::<T>();
        residual.store(base + c, h, mask);
        let hv = h.cast::<f32>();
        sq += hv * hv;
    }
    let rstd = (sq.sum::<0>() / hidden.cast::<f32>() + eps).rsqrt();
    for off in (0..hidden).step_by(B) {
        let c = off + cols;
        let mask = c.lt(hidden);
        let h = residual.load(base + c, mask).cast::<f32>();
        let w = weight.load(c, mask).cast::<f32>();
        out.store(base + c, (h * rstd * w).cast::<T>(), mask);
    }
}

/// Elements a program of the element-wise collectives handles per step (the `B` of
/// [`reduce_scatter_rows_kernel`] and [`all_reduce_kernel`] the plans launch).
pub const EB: usize = 1024;

/// The unfused counterpart of [`super::GemmReduceScatter`]: each rank computes its
/// full partial product ([`gemm_kernel`], rounded to `T`) into a symmetric buffer,
/// then [`reduce_scatter_rows_kernel`] sums the row blocks.
pub struct GemmThenReduceScatter<T: GemmElem> {
    ms: usize,
    n: usize,
    kr: usize,
    part: SymBuffer<T>,
    sig: SymBuffer<u64>,
    epoch: u64,
}

impl<T: GemmElem> std::fmt::Debug for GemmThenReduceScatter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GemmThenReduceScatter<{}>(block {}x{}, kr {})",
            T::TY,
            self.ms,
            self.n,
            self.kr
        )
    }
}

impl<T: GemmElem> GemmThenReduceScatter<T> {
    /// Plans it like [`super::GemmReduceScatter::new`] (collective).
    #[track_caller]
    pub fn new(
        rank: &Rank,
        m: usize,
        n: usize,
        kr: usize,
    ) -> Result<GemmThenReduceScatter<T>, Error> {
        Self::new_impl(rank, m, n, kr).map_err(Error::in_call("GemmThenReduceScatter::new"))
    }

    fn new_impl(
        rank: &Rank,
        m: usize,
        n: usize,
        kr: usize,
    ) -> Result<GemmThenReduceScatter<T>, Error> {
        let ws = rank.size() as usize;
        if m == 0 || n == 0 || kr == 0 || !m.is_multiple_of(ws) {
            return Err(Error::Comm {
                rank: rank.rank(),
                message: format!(
                    "GemmThenReduceScatter needs a nonempty shape with m a multiple of the {ws} ranks, got m {m}, n {n}, kr {kr}"
                ),
            });
        }
        let part = rank.alloc::<T>(m * n)?;
        let sig = rank.alloc_signals(1)?;
        rank.barrier()?;
        Ok(GemmThenReduceScatter {
            ms: m / ws,
            n,
            kr,
            part,
            sig,
            epoch: 0,
        })
    }

    /// Runs it on every rank (collective), like [`super::GemmReduceScatter::run`].
    #[track_caller]
    pub fn run(
        &mut self,
        rank: &Rank,
        a: &Buffer<T>,
        b: &Buffer<T>,
        out: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        gemm_kernel<T, BM, BN, BK>: Kernel<Comptime = ()>,
        reduce_scatter_rows_kernel<T, EB>: Kernel<Comptime = ()>,
    {
        self.run_impl(rank, a, b, out)
            .map_err(Error::in_call("GemmThenReduceScatter::run"))
    }

    fn run_impl(
        &mut self,
        rank: &Rank,
        a: &Buffer<T>,
        b: &Buffer<T>,
        out: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        gemm_kernel<T, BM, BN, BK>: Kernel<Comptime = ()>,
        reduce_scatter_rows_kernel<T, EB>: Kernel<Comptime = ()>,
    {
        let (ms, n, kr) = (self.ms, self.n, self.kr);
        let m = ms * rank.size() as usize;
        check_len("GemmThenReduceScatter: A", a, m * kr)?;
        check_len("GemmThenReduceScatter: B", b, kr * n)?;
        check_len("GemmThenReduceScatter: the output", out, ms * n)?;
        let dev = rank.device();
        self.epoch += 1;
        let grid = (m.div_ceil(BM), n.div_ceil(BN));
        let (m32, n32, k32) = (m as i32, n as i32, kr as i32);
        gemm_kernel::<T, BM, BN, BK>::launch(dev, grid, (a, b, &mut *self.part, m32, n32, k32))?;
        let programs = programs_for(rank, (ms * n).div_ceil(EB), MAX_PROGRAMS);
        reduce_scatter_rows_kernel::<T, EB>::launch(
            dev,
            programs,
            (&self.part, out, &mut self.sig, ms as i32, n32, self.epoch),
        )
    }
}

/// The unfused counterpart of [`super::AllReduceRmsNorm`]: a one-shot all-reduce
/// kernel ([`all_reduce_kernel`]) into a local buffer, then
/// [`residual_rmsnorm_kernel`].
pub struct AllReduceThenRmsNorm<T: Float + Element> {
    rows: usize,
    hidden: usize,
    eps: f32,
    sum: Buffer<T>,
    sig: SymBuffer<u64>,
    epoch: u64,
}

impl<T: Float + Element> std::fmt::Debug for AllReduceThenRmsNorm<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AllReduceThenRmsNorm<{}>({}x{}, eps {})",
            T::TY,
            self.rows,
            self.hidden,
            self.eps
        )
    }
}

impl<T: Float + Element> AllReduceThenRmsNorm<T> {
    /// Plans it like [`super::AllReduceRmsNorm::new`] (collective).
    #[track_caller]
    pub fn new(
        rank: &Rank,
        rows: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<AllReduceThenRmsNorm<T>, Error> {
        Self::new_impl(rank, rows, hidden, eps).map_err(Error::in_call("AllReduceThenRmsNorm::new"))
    }

    fn new_impl(
        rank: &Rank,
        rows: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<AllReduceThenRmsNorm<T>, Error> {
        let sum = rank.device().alloc::<T>(rows * hidden)?;
        let sig = rank.alloc_signals(1)?;
        rank.barrier()?;
        Ok(AllReduceThenRmsNorm {
            rows,
            hidden,
            eps,
            sum,
            sig,
            epoch: 0,
        })
    }

    /// Runs it on every rank (collective), like [`super::AllReduceRmsNorm::run`].
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
        all_reduce_kernel<T, EB>: Kernel<Comptime = ()>,
        residual_rmsnorm_kernel<T, NORM_BLOCK>: Kernel<Comptime = ()>,
    {
        self.run_impl(rank, x, residual, weight, out)
            .map_err(Error::in_call("AllReduceThenRmsNorm::run"))
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
        all_reduce_kernel<T, EB>: Kernel<Comptime = ()>,
        residual_rmsnorm_kernel<T, NORM_BLOCK>: Kernel<Comptime = ()>,
    {
        let len = self.rows * self.hidden;
        check_len("AllReduceThenRmsNorm: x", x, len)?;
        check_len("AllReduceThenRmsNorm: the residual", residual, len)?;
        check_len("AllReduceThenRmsNorm: the weight", weight, self.hidden)?;
        check_len("AllReduceThenRmsNorm: the output", out, len)?;
        let dev = rank.device();
        self.epoch += 1;
        let programs = programs_for(rank, len.div_ceil(EB), MAX_PROGRAMS);
        all_reduce_kernel::<T, EB>::launch(
            dev,
            programs,
            (x, &mut self.sum, &mut self.sig, len as i32, self.epoch),
        )?;
        residual_rmsnorm_kernel::<T, NORM_BLOCK>::launch(
            dev,
            self.rows,
            (
                &self.sum,
                residual,
                weight,
                out,
                self.hidden as i32,
                self.eps,
            ),
        )
    }
}

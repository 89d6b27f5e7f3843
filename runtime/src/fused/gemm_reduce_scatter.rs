//! Fused GEMM + reduce-scatter ([`GemmReduceScatter`], kernel [`gemm_rs_kernel`]):
//! every rank multiplies its K-slices, pushes the partial tiles (in f32) to the ranks
//! that own their rows, and reduces the partials of its own row block in rank order.

use super::{
    BK, BM, BN, GemmElem, MAX_PROGRAMS, arrivals, check_len, check_programs, comm_err, gemm_tile,
    programs_for, team_barrier, to_i32,
};
use crate::prelude::*;

/// Fused GEMM + reduce-scatter, one rank's part.
///
/// `a` (`m x kr`, `m = world_size*ms`) and `b` (`kr x n`) are this rank's K-slices;
/// `out` (`ms x n`) receives rows `rank*ms..` of `Σ_ranks a · b`. Each program
/// computes partial tiles (those owned by `rank+1` first, its own block last) and
/// writes them, in f32, into the owner's staging slot for this rank (`stage`,
/// symmetric, `world_size*ms*n` f32), then sets the owner's signal word
/// `rank*tiles + tile` to `epoch`. Then each program reduces tiles of this rank's
/// block: it waits for every source's signal of the tile and sums the staged partials
/// in rank order (so the result does not depend on timing). `sig` holds
/// `world_size * tiles + 1` words, the last one for the closing [`team_barrier`].
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn gemm_rs_kernel<T: DotInput<Acc = f32>, const TM: usize, const TN: usize, const TK: usize>(
    a: &Global<T>,
    b: &Global<T>,
    out: &mut Global<T>,
    stage: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    ms: i32,
    n: i32,
    kr: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let nchunk = (ms + (TM as i32 - 1)) / TM as i32;
    let ntn = (n + (TN as i32 - 1)) / TN as i32;
    let tiles = nchunk * ntn;
    let rows = arange::<TM>();
    let cols = arange::<TN>();

    // 1. Partial tiles, pushed to their owners' staging slots.
    for t in (pid..ws * tiles).step_by(np) {
        let owner = (me + 1 + t / tiles) % ws;
        let tt = t % tiles;
        let r = ((tt / ntn) * TM as i32 + rows).expand_dims::<1>();
        let cn = ((tt % ntn) * TN as i32 + cols).expand_dims::<0>();
        let r_ok = r.lt(ms);
        let acc = gemm_tile::<T, TM, TN, TK>(a, owner * ms + r, r_ok, b, cn, n, kr);
        stage.put_nbi(owner, (me * ms + r) * n + cn, acc, r_ok & cn.lt(n));
        sig.signal(owner, me * tiles + tt, epoch, SignalOp::Set);
    }

    // 2. Reduce this rank's block, tile by tile, sources in rank order.
    for tt in (pid..tiles).step_by(np) {
        let r = ((tt / ntn) * TM as i32 + rows).expand_dims::<1>();
        let cn = ((tt % ntn) * TN as i32 + cols).expand_dims::<0>();
        let mask = r.lt(ms) & cn.lt(n);
        let mut acc = zeros::<f32, S2<TM, TN>>();
        for s in 0..ws {
            sig.wait_until(s * tiles + tt, CmpPred::Ge, epoch);
            acc += stage.load((s * ms + r) * n + cn, mask);
        }
        out.store(r * n + cn, acc.cast::<T>(), mask);
    }

    team_barrier(sig, ws * tiles, arrivals(epoch));
}

/// Fused GEMM + reduce-scatter: rank `r` ends with rows `r*ms..(r+1)*ms` of
/// `Σ_ranks A_r · B_r`, each rank holding a K-slice (`A_r`: `m x kr`, `B_r`:
/// `kr x n`). See [`gemm_rs_kernel`].
///
/// Partial tiles travel in f32 to the owner's per-source staging slots and the owner
/// reduces them in rank order: deterministic, and f16/bf16 partials are not rounded
/// before the sum. (Remote f32 atomic adds into the owner's output would need no
/// staging memory and no reduction pass, but their order, hence the rounding, would
/// change from run to run, and they only work for f32 outputs.) Staging costs
/// `m * n` f32 per rank.
pub struct GemmReduceScatter<T: GemmElem> {
    ms: usize,
    n: usize,
    kr: usize,
    stage: SymBuffer<f32>,
    sig: SymBuffer<u64>,
    epoch: u64,
    programs: u32,
    _t: std::marker::PhantomData<T>,
}

impl<T: GemmElem> std::fmt::Debug for GemmReduceScatter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GemmReduceScatter<{}>(block {}x{}, kr {}, {} programs, epoch {})",
            T::TY,
            self.ms,
            self.n,
            self.kr,
            self.programs,
            self.epoch
        )
    }
}

impl<T: GemmElem> GemmReduceScatter<T> {
    /// Plans the product of `m x kr` and `kr x n` K-slices, `m` a multiple of the
    /// number of ranks (collective). Errors of the plan's calls name the caller's line
    /// first ([`Error::Collective`]).
    #[track_caller]
    pub fn new(rank: &Rank, m: usize, n: usize, kr: usize) -> Result<GemmReduceScatter<T>, Error> {
        Self::new_impl(rank, m, n, kr).map_err(Error::in_call("GemmReduceScatter::new"))
    }

    fn new_impl(rank: &Rank, m: usize, n: usize, kr: usize) -> Result<GemmReduceScatter<T>, Error> {
        let ws = rank.size() as usize;
        if m == 0 || n == 0 || kr == 0 || !m.is_multiple_of(ws) {
            return Err(comm_err(
                rank,
                format!(
                    "GemmReduceScatter needs a nonempty shape with m a multiple of the {ws} ranks, got m {m}, n {n}, kr {kr}"
                ),
            ));
        }
        for (what, v) in [("m*kr", m * kr), ("kr*n", kr * n), ("m*n", m * n)] {
            to_i32(rank, what, v)?;
        }
        let ms = m / ws;
        let tiles = ms.div_ceil(BM) * n.div_ceil(BN);
        let stage = rank.alloc::<f32>(m * n)?;
        let sig = rank.alloc_signals(ws * tiles + 1)?;
        rank.barrier()?;
        Ok(GemmReduceScatter {
            ms,
            n,
            kr,
            stage,
            sig,
            epoch: 0,
            programs: programs_for(rank, ws * tiles, MAX_PROGRAMS),
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
    ) -> Result<GemmReduceScatter<T>, Error> {
        self.programs = check_programs(rank, programs)
            .map_err(Error::in_call("GemmReduceScatter::with_programs"))?;
        Ok(self)
    }

    /// Runs on every rank (collective): `out` (`ms x n`) receives this rank's block.
    #[track_caller]
    pub fn run(
        &mut self,
        rank: &Rank,
        a: &Buffer<T>,
        b: &Buffer<T>,
        out: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        gemm_rs_kernel<T, BM, BN, BK>: Kernel<Comptime = ()>,
    {
        self.run_impl(rank, a, b, out)
            .map_err(Error::in_call("GemmReduceScatter::run"))
    }

    fn run_impl(
        &mut self,
        rank: &Rank,
        a: &Buffer<T>,
        b: &Buffer<T>,
        out: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        gemm_rs_kernel<T, BM, BN, BK>: Kernel<Comptime = ()>,
    {
        let m = self.ms * rank.size() as usize;
        check_len("GemmReduceScatter: A", a, m * self.kr)?;
        check_len("GemmReduceScatter: B", b, self.kr * self.n)?;
        check_len("GemmReduceScatter: the output", out, self.ms * self.n)?;
        self.epoch += 1;
        gemm_rs_kernel::<T, BM, BN, BK>::launch(
            rank.device(),
            self.programs,
            (
                a,
                b,
                out,
                &mut self.stage,
                &mut self.sig,
                self.ms as i32,
                self.n as i32,
                self.kr as i32,
                self.epoch,
            ),
        )
    }
}

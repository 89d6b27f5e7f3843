//! Fused all-gather + GEMM ([`AgGemm`], kernel [`ag_gemm_kernel`]): `C = gather(A) · B`
//! with `A` row-sharded over the ranks and `B` replicated. Each rank pushes its shard
//! to the peers chunk by chunk and multiplies the rows it has while the others arrive.

use super::{
    BK, BM, BN, GemmElem, MAX_PROGRAMS, arrivals, check_len, check_programs, comm_err, gemm_tile,
    programs_for, team_barrier, to_i32,
};
use crate::prelude::*;

/// Fused all-gather + GEMM, one rank's part: `c = gather(a) · b`.
///
/// `a` is this rank's `ms x k` shard (rows `rank*ms..` of the gathered `A`), `b` the
/// replicated `k x n` matrix, `c` the `(world_size*ms) x n` output. `a_full` is the
/// symmetric `(world_size*ms) x k` staging buffer peers push their shards into, `sig`
/// holds `world_size * nchunk + 1` signal words (`nchunk = ceil(ms/TM)`): word
/// `s*nchunk + i` is set to `epoch` on every other rank once chunk `i` (`TM` rows) of
/// rank `s`'s shard is there; the last word is the closing [`team_barrier`]'s.
///
/// Each program first pushes its chunks of the local shard to every peer (to
/// `rank+1` first, so that the ranks form a ring at each step), then computes the output
/// tiles of the local shard (no waiting), then those of the other shards in the order
/// they arrive (`rank-1`, `rank-2`, ...), each waiting only for the chunk its rows are
/// in.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn ag_gemm_kernel<T: DotInput<Acc = f32>, const TM: usize, const TN: usize, const TK: usize>(
    a: &Global<T>,
    b: &Global<T>,
    c: &mut Global<T>,
    a_full: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    ms: i32,
    n: i32,
    k: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let nchunk = (ms + (TM as i32 - 1)) / TM as i32;
    let ntn = (n + (TN as i32 - 1)) / TN as i32;
    let rows = arange::<TM>();
    let cols = arange::<TN>();
    let rk = arange::<TK>();

    // 1. Push this rank's shard, chunk by chunk, to every peer; signal each chunk.
    for ch in (pid..nchunk).step_by(np) {
        let r = (ch * TM as i32 + rows).expand_dims::<1>();
        let r_ok = r.lt(ms);
        let dst = me * ms + r;
        for k0 in (0..k).step_by(TK) {
            let kk = (k0 + rk).expand_dims::<0>();
            let mask = r_ok & kk.lt(k);
            let v = a.load(r * k + kk, mask);
            for i in 1..ws {
                a_full.put_nbi((me + i) % ws, dst * k + kk, v, mask);
            }
        }
        for i in 1..ws {
            sig.signal((me + i) % ws, me * nchunk + ch, epoch, SignalOp::Set);
        }
    }

    // 2. Output tiles of the local shard: its rows are here already.
    let per_shard = nchunk * ntn;
    for t in (pid..per_shard).step_by(np) {
        let r = ((t / ntn) * TM as i32 + rows).expand_dims::<1>();
        let cn = ((t % ntn) * TN as i32 + cols).expand_dims::<0>();
        let r_ok = r.lt(ms);
        let acc = gemm_tile::<T, TM, TN, TK>(a, r, r_ok, b, cn, n, k);
        c.store((me * ms + r) * n + cn, acc.cast::<T>(), r_ok & cn.lt(n));
    }

    // 3. The other shards, in arrival order; each tile waits for its chunk only.
    let remote = (ws - 1) * per_shard;
    for t in (pid..remote).step_by(np) {
        let s = (me + ws - 1 - t / per_shard) % ws;
        let tt = t % per_shard;
        let chunk = tt / ntn;
        sig.wait_until(s * nchunk + chunk, CmpPred::Ge, epoch);
        let r = (chunk * TM as i32 + rows).expand_dims::<1>();
        let cn = ((tt % ntn) * TN as i32 + cols).expand_dims::<0>();
        let r_ok = r.lt(ms);
        let g = s * ms + r;
        let acc = gemm_tile::<T, TM, TN, TK>(a_full, g, r_ok, b, cn, n, k);
        c.store(g * n + cn, acc.cast::<T>(), r_ok & cn.lt(n));
    }

    // Nobody reuses `a_full` (or changes its shard) before every rank is done.
    team_barrier(sig, ws * nchunk, arrivals(epoch));
}

/// Fused all-gather + GEMM: `C = gather(A) · B` on every rank, with `A` row-sharded
/// (rank `r` holds rows `r*ms..(r+1)*ms`) and `B` replicated. See [`ag_gemm_kernel`].
pub struct AgGemm<T: GemmElem> {
    ms: usize,
    n: usize,
    k: usize,
    a_full: SymBuffer<T>,
    sig: SymBuffer<u64>,
    epoch: u64,
    programs: u32,
}

impl<T: GemmElem> std::fmt::Debug for AgGemm<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AgGemm<{}>(shard {}x{}, n {}, {} programs, epoch {})",
            T::TY,
            self.ms,
            self.k,
            self.n,
            self.programs,
            self.epoch
        )
    }
}

impl<T: GemmElem> AgGemm<T> {
    /// Plans `C = gather(A) · B` for shards of `shard_rows x k` and `B` of `k x n`
    /// (collective: every rank calls it with the same shape, in the same order as its
    /// other symmetric allocations). Allocates the `(size*shard_rows) x k` staging
    /// buffer and the signal words.
    ///
    /// Errors of the plan's calls name the caller's line first
    /// ([`Error::Collective`]).
    #[track_caller]
    pub fn new(rank: &Rank, shard_rows: usize, n: usize, k: usize) -> Result<AgGemm<T>, Error> {
        Self::new_impl(rank, shard_rows, n, k).map_err(Error::in_call("AgGemm::new"))
    }

    fn new_impl(rank: &Rank, shard_rows: usize, n: usize, k: usize) -> Result<AgGemm<T>, Error> {
        let ws = rank.size() as usize;
        let m = shard_rows * ws;
        for (what, v) in [("m", m), ("n", n), ("k", k), ("m*k", m * k), ("m*n", m * n)] {
            to_i32(rank, what, v)?;
        }
        if shard_rows == 0 || n == 0 || k == 0 {
            return Err(comm_err(
                rank,
                format!("AgGemm needs a nonempty shape, got shard {shard_rows}x{k}, n {n}"),
            ));
        }
        let nchunk = shard_rows.div_ceil(BM);
        let a_full = rank.alloc::<T>(m * k)?;
        let sig = rank.alloc_signals(ws * nchunk + 1)?;
        let tiles = ws * nchunk * n.div_ceil(BN);
        // Allocation zeroes this rank's copy: no peer may signal into it before.
        rank.barrier()?;
        Ok(AgGemm {
            ms: shard_rows,
            n,
            k,
            a_full,
            sig,
            epoch: 0,
            programs: programs_for(rank, tiles, MAX_PROGRAMS),
        })
    }

    /// Sets the number of program instances per rank (1..=1024; the same on every
    /// rank).
    #[track_caller]
    pub fn with_programs(mut self, rank: &Rank, programs: u32) -> Result<AgGemm<T>, Error> {
        self.programs =
            check_programs(rank, programs).map_err(Error::in_call("AgGemm::with_programs"))?;
        Ok(self)
    }

    /// Runs on every rank (collective): `a` is this rank's `shard_rows x k` shard, `b`
    /// the `k x n` matrix, `c` receives the `(size*shard_rows) x n` product.
    #[track_caller]
    pub fn run(
        &mut self,
        rank: &Rank,
        a: &Buffer<T>,
        b: &Buffer<T>,
        c: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        ag_gemm_kernel<T, BM, BN, BK>: Kernel<Comptime = ()>,
    {
        self.run_impl(rank, a, b, c)
            .map_err(Error::in_call("AgGemm::run"))
    }

    fn run_impl(
        &mut self,
        rank: &Rank,
        a: &Buffer<T>,
        b: &Buffer<T>,
        c: &mut Buffer<T>,
    ) -> Result<(), Error>
    where
        ag_gemm_kernel<T, BM, BN, BK>: Kernel<Comptime = ()>,
    {
        let ws = rank.size() as usize;
        check_len("AgGemm: the A shard", a, self.ms * self.k)?;
        check_len("AgGemm: B", b, self.k * self.n)?;
        check_len("AgGemm: C", c, ws * self.ms * self.n)?;
        self.epoch += 1;
        ag_gemm_kernel::<T, BM, BN, BK>::launch(
            rank.device(),
            self.programs,
            (
                a,
                b,
                c,
                &mut self.a_full,
                &mut self.sig,
                self.ms as i32,
                self.n as i32,
                self.k as i32,
                self.epoch,
            ),
        )
    }

    /// The gathered `A` of the last run (rows of the other ranks' shards; this rank's
    /// own rows are not copied there).
    pub fn gathered(&self) -> &SymBuffer<T> {
        &self.a_full
    }
}

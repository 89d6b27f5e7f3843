//! Fused compute + communication kernels: all-gather + GEMM, GEMM + reduce-scatter,
//! all-reduce + residual add + RMSNorm.
//!
//! Each operation is a *plan*: built once per rank (collectively, with the same shapes
//! on every rank), it allocates its symmetric workspace (staging buffers and signal
//! words), waits at a host barrier (allocation zeroes the local copy, so no peer may
//! signal into it before every rank has allocated) and is then run any number of
//! times. Signals are monotonic epoch counters:
//! run `e` (1, 2, ...) sets signal words to `e` and waits for `>= e`, so nothing is
//! ever reset. Every kernel ends with a barrier of all its program instances on all
//! ranks ([`team_barrier`], on the plan's own signal word), so a run returns on a rank
//! only once every rank is done reading the workspace and the inputs of this run: the
//! next run may overwrite them.
//!
//! The kernels are *persistent*: a fixed number of program instances per rank
//! ([`MAX_PROGRAMS`] by default, at most 1024, all resident at once) loop over the
//! tiles, so that waiting programs never block programs that have not started.
//!
//! | plan | inputs on rank `r` | output on rank `r` |
//! |---|---|---|
//! | [`AgGemm`] | `A_r` (`ms x k`, rows `r*ms..` of `A`), `B` (`k x n`) | `C = A · B` (`ws*ms x n`) |
//! | [`GemmReduceScatter`] | `A_r` (`m x kr`), `B_r` (`kr x n`) | rows `r*ms..(r+1)*ms` of `Σ_r A_r · B_r` |
//! | [`AllReduceRmsNorm`] | `x_r` (`rows x hidden`, symmetric), `residual`, `weight` | `h = Σ x + residual` (in `residual`), `out = rmsnorm(h) * weight` |
//!
//! GEMMs take f32, f16 or bf16 inputs and accumulate in f32 (`dot`).

use crate::buffer::Element;
use crate::prelude::*;

/// Default number of program instances per rank of the fused kernels.
pub const MAX_PROGRAMS: u32 = 64;

/// The most program instances per rank of a kernel that waits (all are resident at
/// once; the CPU interpreter's limit, `MAX_RESIDENT`).
pub const MAX_RESIDENT: u32 = 1024;

/// GEMM tile rows.
pub const BM: usize = 64;
/// GEMM tile columns.
pub const BN: usize = 64;
/// GEMM tile depth (the `k` step).
pub const BK: usize = 32;
/// Columns an RMSNorm program handles per step.
pub const NORM_BLOCK: usize = 256;

/// `BM x BN` tile of `a[rows, :] · b[:, cols]` in f32: `rows` index `a` (row-major,
/// `k` columns) and must be valid where `row_ok`; `cols` index `b` (`n` columns).
#[helper]
#[allow(clippy::too_many_arguments)]
fn gemm_tile<T: DotInput<Acc = f32>, const TM: usize, const TN: usize, const TK: usize>(
    a: &Global<T>,
    rows: Tile<i32, (D<TM>, One)>,
    row_ok: Tile<bool, (D<TM>, One)>,
    b: &Global<T>,
    cols: Tile<i32, (One, D<TN>)>,
    n: Scalar<i32>,
    k: Scalar<i32>,
) -> Tile<f32, S2<TM, TN>> {
    let rk = arange::<TK>();
    let col_ok = cols.lt(n);
    let mut acc = zeros::<f32, S2<TM, TN>>();
    for k0 in (0..k).step_by(TK) {
        let kk = k0 + rk;
        let (k_col, k_row) = (kk.expand_dims::<0>(), kk.expand_dims::<1>());
        let a_tile = a.load(rows * k + k_col, row_ok & k_col.lt(k));
        let b_tile = b.load(k_row * n + cols, k_row.lt(k) & col_ok);
        acc = dot(a_tile, b_tile, acc);
    }
    acc
}

/// A barrier of every program instance of every rank of one kernel, built on the
/// plan's own signal word `word` (monotonic): each program adds 1 to `word` on every
/// rank (a release), then waits (acquire) until its own copy reaches `target`, the
/// number of arrivals of this and all earlier barriers on that word
/// (`epoch * world_size * num_programs` for one barrier per run).
///
/// Same guarantee as `barrier_all`, but each rank counts on (and polls) its own copy,
/// not one word on rank 0, at the price of `world_size` signals per program.
#[helper]
// The `#[helper]` expansion of `0..ws` trips this lint (not the kernel macro's).
#[allow(clippy::zero_prefixed_literal)]
pub fn team_barrier<W: tessera_ir::dsl::Offsets<Shape = ()> + Copy>(
    sig: &mut Symmetric<u64>,
    word: W,
    target: Scalar<u64>,
) {
    let ws = world_size();
    for p in 0..ws {
        sig.signal(p, word, 1u64, SignalOp::Add);
    }
    sig.wait_until(word, CmpPred::Ge, target);
}

/// `epoch * world_size * num_programs(0)`: the arrivals of `epoch` barriers.
#[helper]
pub(crate) fn arrivals(epoch: Scalar<u64>) -> Scalar<u64> {
    epoch * world_size().cast::<u64>() * num_programs(0).cast::<u64>()
}

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

/// Element types of the fused GEMMs: f32, f16, bf16 (accumulated in f32).
pub trait GemmElem: DotInput<Acc = f32> + Element + Float {}
impl GemmElem for f32 {}
impl GemmElem for f16 {}
impl GemmElem for bf16 {}

pub(crate) fn comm_err(rank: &Rank, message: String) -> Error {
    Error::Comm {
        rank: rank.rank(),
        message,
    }
}

pub(crate) fn check_len<T: Element>(what: &str, b: &Buffer<T>, want: usize) -> Result<(), Error> {
    if b.len() == want {
        Ok(())
    } else {
        Err(Error::BufferSize(format!(
            "{what} holds {} elements, the plan needs {want}",
            b.len()
        )))
    }
}

fn to_i32(rank: &Rank, what: &str, v: usize) -> Result<i32, Error> {
    i32::try_from(v).map_err(|_| comm_err(rank, format!("{what} = {v} does not fit in i32")))
}

pub(crate) fn programs_for(work: usize, max: u32) -> u32 {
    (work.max(1) as u64).min(max as u64) as u32
}

fn check_programs(rank: &Rank, programs: u32) -> Result<u32, Error> {
    if (1..=MAX_RESIDENT).contains(&programs) {
        Ok(programs)
    } else {
        Err(comm_err(
            rank,
            format!("a fused kernel needs 1 to 1024 program instances per rank, got {programs}"),
        ))
    }
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
    pub fn new(rank: &Rank, shard_rows: usize, n: usize, k: usize) -> Result<AgGemm<T>, Error> {
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
            programs: programs_for(tiles, MAX_PROGRAMS),
        })
    }

    /// Sets the number of program instances per rank (1..=1024; the same on every
    /// rank).
    pub fn with_programs(mut self, rank: &Rank, programs: u32) -> Result<AgGemm<T>, Error> {
        self.programs = check_programs(rank, programs)?;
        Ok(self)
    }

    /// Runs on every rank (collective): `a` is this rank's `shard_rows x k` shard, `b`
    /// the `k x n` matrix, `c` receives the `(size*shard_rows) x n` product.
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
    /// number of ranks (collective).
    pub fn new(rank: &Rank, m: usize, n: usize, kr: usize) -> Result<GemmReduceScatter<T>, Error> {
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
            programs: programs_for(ws * tiles, MAX_PROGRAMS),
            _t: std::marker::PhantomData,
        })
    }

    /// Sets the number of program instances per rank (1..=1024; the same on every
    /// rank).
    pub fn with_programs(
        mut self,
        rank: &Rank,
        programs: u32,
    ) -> Result<GemmReduceScatter<T>, Error> {
        self.programs = check_programs(rank, programs)?;
        Ok(self)
    }

    /// Runs on every rank (collective): `out` (`ms x n`) receives this rank's block.
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
    /// Plans the operation on `rows x hidden` activations (collective).
    pub fn new(
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
            programs: programs_for(rows, MAX_PROGRAMS),
            _t: std::marker::PhantomData,
        })
    }

    /// Sets the number of program instances per rank (1..=1024; the same on every
    /// rank).
    pub fn with_programs(
        mut self,
        rank: &Rank,
        programs: u32,
    ) -> Result<AllReduceRmsNorm<T>, Error> {
        self.programs = check_programs(rank, programs)?;
        Ok(self)
    }

    /// Runs on every rank (collective).
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

/// The unfused sequences the fused kernels replace, built from separate kernels: the
/// baselines of the tests and benchmarks.
pub mod unfused {
    use super::{
        BK, BM, BN, GemmElem, MAX_PROGRAMS, NORM_BLOCK, arrivals, check_len, gemm_tile,
        programs_for, team_barrier,
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
    pub fn gemm_kernel<
        T: DotInput<Acc = f32>,
        const TM: usize,
        const TN: usize,
        const TK: usize,
    >(
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
        pub fn new(
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
            let (ms, n, k) = (self.ms, self.n, self.k);
            let m = ms * rank.size() as usize;
            check_len("AgThenGemm: the A shard", a, ms * k)?;
            check_len("AgThenGemm: B", b, k * n)?;
            check_len("AgThenGemm: C", c, m * n)?;
            let dev = rank.device();
            self.epoch += 1;
            let programs = programs_for(ms.div_ceil(BM), MAX_PROGRAMS);
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

    /// Elements a program of the element-wise collectives handles per step.
    const EB: usize = 1024;

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
        pub fn new(
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
            let (ms, n, kr) = (self.ms, self.n, self.kr);
            let m = ms * rank.size() as usize;
            check_len("GemmThenReduceScatter: A", a, m * kr)?;
            check_len("GemmThenReduceScatter: B", b, kr * n)?;
            check_len("GemmThenReduceScatter: the output", out, ms * n)?;
            let dev = rank.device();
            self.epoch += 1;
            let grid = (m.div_ceil(BM), n.div_ceil(BN));
            let (m32, n32, k32) = (m as i32, n as i32, kr as i32);
            gemm_kernel::<T, BM, BN, BK>::launch(
                dev,
                grid,
                (a, b, &mut *self.part, m32, n32, k32),
            )?;
            let programs = programs_for((ms * n).div_ceil(EB), MAX_PROGRAMS);
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
        pub fn new(
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
            let len = self.rows * self.hidden;
            check_len("AllReduceThenRmsNorm: x", x, len)?;
            check_len("AllReduceThenRmsNorm: the residual", residual, len)?;
            check_len("AllReduceThenRmsNorm: the weight", weight, self.hidden)?;
            check_len("AllReduceThenRmsNorm: the output", out, len)?;
            let dev = rank.device();
            self.epoch += 1;
            let programs = programs_for(len.div_ceil(EB), MAX_PROGRAMS);
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
}

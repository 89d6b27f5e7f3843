//! Fused compute + communication kernels: all-gather + GEMM, GEMM + reduce-scatter,
//! all-reduce + residual add + RMSNorm, and sequence-parallel attention
//! ([`sp_attention`]).
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
//!
//! **Files.** Each plan lives in its own file, next to its kernel: `ag_gemm.rs`
//! ([`AgGemm`], [`ag_gemm_kernel`]), `gemm_reduce_scatter.rs` ([`GemmReduceScatter`],
//! [`gemm_rs_kernel`]) and `allreduce_rmsnorm.rs` ([`AllReduceRmsNorm`],
//! [`allreduce_rmsnorm_kernel`]). This file holds what they share: the tile sizes and
//! program counts, the GEMM tile helper, [`team_barrier`], [`GemmElem`] and the shape
//! checks. [`unfused`] (`unfused.rs`) holds the unfused sequences the plans replace.
//! [`sp_attention`] (`sp_attention.rs`, also `tessera::sp_attention`) holds
//! sequence-parallel attention: its plan, its kernel and the unfused sequence it is
//! compared with.

mod ag_gemm;
mod allreduce_rmsnorm;
mod gemm_reduce_scatter;
pub mod sp_attention;
pub mod unfused;

pub use ag_gemm::{AgGemm, ag_gemm_kernel};
pub use allreduce_rmsnorm::{AllReduceRmsNorm, allreduce_rmsnorm_kernel};
pub use gemm_reduce_scatter::{GemmReduceScatter, gemm_rs_kernel};

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

/// Program instances per rank for `work` units of it, at most `max`. On the compiled
/// CPU device every program of a waiting kernel is a coroutine, and the ranks sharing
/// the machine run theirs on as many threads as it has cores: programs beyond
/// `cores / ranks` per rank only add switches and handshakes (the fused AG+GEMM demo
/// on 4 ranks and 2 cores: 1.8 ms with the GPU's 60 programs per rank, 0.8 ms with 1),
/// so that is the cap there, as the SM count is on a GPU. On a part of a device
/// shared by several ranks ([`crate::Device::partition`]) the cap is one program per
/// multiprocessor of the part, so every rank's programs are resident together.
pub(crate) fn programs_for(rank: &Rank, work: usize, max: u32) -> u32 {
    let props = rank.device().properties();
    let max = match props.part {
        Some(_) => max.min(props.multiprocessors.max(1)),
        None => max,
    };
    #[cfg(feature = "jit")]
    let max = if matches!(rank.device().backend, crate::device::Backend::Cpu) {
        let sharing = rank.ranks_per_node().unwrap_or(rank.size()).max(1) as usize;
        (tessera_codegen::cpu::cores() / sharing).clamp(1, max as usize) as u32
    } else {
        max
    };
    #[cfg(not(feature = "jit"))]
    let _ = rank;
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

//! Collective operations over the ranks of a [`World`](crate::World): all-reduce,
//! all-gather, reduce-scatter, broadcast and all-to-all-v, as methods of [`Rank`].
//!
//! Every data-moving and reducing step is a `#[kernel]` written in Tessera
//! (`collectives/kernels.rs`), launched on [`Rank::device`]; the host only picks an
//! algorithm, sizes the grid and keeps the workspace. Every rank must call the same
//! collectives, with buffers of the same lengths, in the same order (as with NCCL or
//! MPI). They run on every kind of rank: CPU ranks (the interpreter) and emulator
//! ranks (the SIMT emulator, given every rank's host heap base) reach their peers
//! through the host heaps; GPU ranks reach them in device memory (peer access, or
//! CUDA/HIP IPC for ranks as processes) through the heap-base table each rank
//! uploads.
//!
//! # Algorithms
//!
//! - **One-shot all-reduce** ([`AllReduceAlgo::OneShot`]): each rank copies its input
//!   into its staging slot, signals, and after the handshake reads *all* peers' slots
//!   and reduces locally. One synchronization, `(n-1)·N` bytes read per rank: best for
//!   small messages.
//! - **Two-shot all-reduce** ([`AllReduceAlgo::TwoShot`]): reduce-scatter then
//!   all-gather, in one kernel. Rank `r` owns segment `r` (`N/n` elements): it reads
//!   segment `r` of every peer, reduces, and pushes the result into segment `r` of
//!   every peer. `2(n-1)/n·N` bytes moved per rank: best for large messages.
//! - **Low-latency all-reduce** ([`AllReduceAlgo::LowLatency`]): one-shot with the LL
//!   protocol below.
//! - **Hierarchical all-reduce** ([`AllReduceAlgo::Hierarchical`]), for ranks on
//!   nodes of `L` consecutive ranks ([`Rank::ranks_per_node`]): local rank `l`
//!   reduces segment `l` over its node (direct loads) into `f32` partials, reads
//!   the partials of rank `l` of every other node through the off-node engine,
//!   combines them in node order and stores the segment on its node; one pipelined
//!   kernel (`ar_hier`, steps of [`HIER_STEP_CHUNKS`] chunks). **All-gather**
//!   likewise ([`AllGatherAlgo::Hierarchical`], `ag_hier`): inputs cross nodes only
//!   to the rank of the same local index, which forwards them on its node.
//! - [`AllReduceAlgo::Auto`] takes LL up to [`LL_MAX_BYTES`] (0: never, on CPU
//!   ranks LL measured slower than plain), one-shot up to [`ONE_SHOT_MAX_BYTES`]
//!   (4 KiB), two-shot above: crossovers measured on CPU ranks with 2, 4 and 8 ranks,
//!   see those constants and BENCHMARKS.md "Collectives on CPU ranks". On ranks
//!   split over nodes of several ranks it takes the hierarchical all-reduce from
//!   [`HIER_AR_MIN_BYTES`] on ([`AllGatherAlgo::Auto`]: from [`HIER_AG_MIN_BYTES`]),
//!   measured on the MPI transport.
//! - **All-gather** pushes each rank's input into block `rank` of every output;
//!   **reduce-scatter** and **broadcast** pull; **all-to-all-v** first exchanges the
//!   per-destination counts (a one-program kernel gathers every rank's count row into
//!   a `ws x (ws+1)` matrix), then each rank pulls its blocks from every source.
//!
//! Reductions (`Sum`, `Max`, `Min`) load, `.cast::<f32>()`, combine in `f32` over the
//! ranks **in rank order** (`((x0 ∘ x1) ∘ x2) ∘ ...`) and round once to the element
//! type. Every rank and every algorithm therefore gets the same bits, equal to a host
//! reference that combines in `f32` in rank order and rounds once; the
//! hierarchical all-reduce combines each node's ranks in rank order, then the
//! nodes' partials in node order (the same bits on every rank and transport; a sum
//! may round differently from the rank order on 2 or more nodes of 2 or more
//! ranks).
//!
//! # Synchronization
//!
//! Handshakes use signal words from [`Rank::alloc_signals`]: a program instance
//! `signal`s (release) one word per source on every peer, then `wait_until`s
//! (acquire, times out) its own words. Values are **epochs**: a per-rank counter
//! incremented by every collective kernel launch, the same on every rank because
//! every rank launches the same sequence. A word is written only by its source rank
//! with increasing epochs and a wait asks for `>= epoch`, so nothing is ever reset.
//! Kernels that wait use at most [`MAX_PROGRAMS`] program instances per rank (every
//! instance of a waiting kernel must be resident); each loops over its chunks of
//! [`TILE`] elements (persistent style) and synchronizes with the same
//! program of every peer, which handles the same chunks.
//!
//! A buffer that a peer reads must not change until the peer is done: one-shot reads
//! staging slots double-buffered by epoch parity (a rank two calls ahead has passed a
//! handshake with this rank in between); the other kernels end with a second
//! handshake ("done reading / pushing") before they return.
//!
//! # LL protocol
//!
//! NCCL's LL idea with a 64-bit word per element: `word = epoch << 32 | bits`, where
//! `bits` is the element's bit pattern zero-extended to 32 bits (f32: all 32; f16 and
//! bf16: the low 16) and `epoch` is the low 32 bits of the call's epoch. The writer
//! stores words straight into slot `rank` of every peer's LL buffer; no signal. A
//! reader polls its slots until every word is `>= epoch << 32` (a 64-bit store is
//! single-copy atomic, so data and flag arrive together); it waits with `wait_until`
//! on the first word not ready yet, so polling backs off and times out like any wait.
//! LL buffers are double-buffered by epoch parity. Costs: 8 bytes per element per peer
//! (2x the data for f32, 4x for f16), so LL is for small messages
//! ([`LL_MAX_ELEMS`]). The 32-bit flag wraps after 2^32 calls: past that, LL requests
//! fall back to the plain one-shot.
//!
//! # Workspace
//!
//! Each rank keeps a workspace (signal pad, count buffers, staging and LL buffers),
//! allocated collectively on first use and grown (collectively, by doubling) when a
//! larger message needs more staging; grown-out regions are not reused (the heap is a
//! bump allocator), so size the heap for the largest message (one-shot staging needs
//! `2·N` bytes; LL needs `2·n·8` bytes per element). Allocation zeroes each rank's
//! copy, so creating or growing the workspace ends with a host barrier (no rank
//! signals or writes into a peer's region before the peer has zeroed it); calls that
//! do not grow it need no host synchronization.
//!
//! # Errors
//!
//! A collective that fails names the caller's file:line:col first, then the call and
//! what failed inside the library ([`Error::Collective`]): a wait of a library kernel
//! that timed out (its line in `collectives/kernels.rs`, the rank, the values), an
//! argument, a full heap. For example ``src/main.rs:12:7: `all_reduce` failed:
//! runtime/src/collectives/kernels.rs:50:13: `wait_until` timed out ... on rank 0 ...``.
//! Match on [`Error::inner`]. An error that only reports another rank's failure is
//! returned unwrapped.

mod kernels;

use crate::buffer::Element;
use crate::world::{Rank, SymBuffer};
use crate::{Buffer, Error};
pub use kernels::TILE;
use kernels::{OP_MAX, OP_MIN, OP_SUM};
use tessera_ir::ScalarType;
use tessera_ir::dsl::{Float, Int};
use tessera_ir::ir::ReduceOp;

use half::{bf16, f16};

/// Element types the collectives move and reduce: `f32`, `f16`, `bf16` (reductions
/// accumulate in `f32`).
pub trait CollElem: Element + Float {
    /// The unsigned integer of the same width (the LL protocol moves bit patterns).
    type Bits: Element + Int;
}
impl CollElem for f32 {
    type Bits = u32;
}
impl CollElem for f16 {
    type Bits = u16;
}
impl CollElem for bf16 {
    type Bits = u16;
}

/// How [`Rank::all_reduce_with`] reduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// By message size: LL up to [`LL_MAX_BYTES`], one-shot up to
    /// [`ONE_SHOT_MAX_BYTES`], two-shot above.
    Auto,
    /// Every rank reads every peer's data and reduces locally (one handshake).
    OneShot,
    /// Reduce-scatter of segments, then all-gather of the reduced segments.
    TwoShot,
    /// One-shot over the low-latency protocol (data and flag in one 64-bit word);
    /// messages up to [`LL_MAX_ELEMS`] elements.
    LowLatency,
    /// For ranks on several nodes ([`Rank::ranks_per_node`]): reduce on the node,
    /// combine the nodes' partials across nodes, store on the node, in one
    /// pipelined kernel. Sums combine in node order (see the module docs).
    Hierarchical,
}

/// How [`Rank::all_gather_with`] gathers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllGatherAlgo {
    /// [`AllGatherAlgo::Hierarchical`] for ranks on several nodes of several ranks
    /// each from [`HIER_AG_MIN_BYTES`] of input on, else [`AllGatherAlgo::Flat`].
    Auto,
    /// Every rank pushes its input to every rank.
    Flat,
    /// Every rank pushes its input across nodes only to the ranks of the same local
    /// index, which forward it on their node (one pipelined kernel).
    Hierarchical,
}

/// Most program instances per rank of a collective kernel.
pub const MAX_PROGRAMS: usize = 4;

/// Largest all-reduce (in elements) that [`AllReduceAlgo::LowLatency`] takes.
pub const LL_MAX_ELEMS: usize = 64 * 1024;

/// [`AllReduceAlgo::Auto`] uses the LL protocol for messages up to this many bytes:
/// **0**, Auto never picks LL on CPU ranks.
///
/// Measured on CPU ranks (2-core VM; `cargo run --release --example coll_bench -- 64
/// ll`, BENCHMARKS.md "Collectives on CPU ranks"): LL was slower than the plain
/// one-shot at most sizes from 4 B to 64 KiB on 2, 4 and 8 ranks (LL/plain time 0.8 to
/// 4.7, median 1.4). In the interpreter a launch costs the same whatever the
/// protocol, and LL's extra per-element work (8-byte words, flag checks, the unpacking
/// through scratch) outweighs the one signal round trip it saves; that round trip is
/// what LL wins on a GPU, to be measured there.
pub const LL_MAX_BYTES: usize = 0;

/// [`AllReduceAlgo::Auto`] uses one-shot up to this many bytes, two-shot above.
///
/// Measured on CPU ranks (2-core VM; `cargo run --release --example coll_bench -- 1
/// crossover`, BENCHMARKS.md "Collectives on CPU ranks"): with 8 ranks one-shot was
/// faster up to 4 KiB and two-shot from 8 KiB on (2x at 16 KiB, 4.3x at 32 KiB); with
/// 2 and 4 ranks the two were within noise up to 4 KiB and two-shot won from 8 KiB on
/// (one-shot reads every peer's whole buffer: `n` times the data of two-shot's
/// segment reads, on 2 shared cores).
pub const ONE_SHOT_MAX_BYTES: usize = 4 * 1024;

/// [`AllReduceAlgo::Auto`] takes [`AllReduceAlgo::Hierarchical`] from this many
/// bytes on, for ranks on several nodes of several ranks each.
///
/// Measured on the MPI transport (`scripts/mpi-check.sh 4 --nodes 2`, run by CI in
/// release: 2 emulated nodes of 2 CPU ranks, heaps mapped within a node, TCP between
/// nodes; BENCHMARKS.md "Hierarchical collectives"), hierarchical time over flat
/// time in four runs: 0.58 to 1.13 at 64 KiB (median 0.87), 0.60 to 1.05 at 256 KiB
/// (three of four faster), 0.42 to 0.90 at 1 MiB, and 3.9 to 7.3 at 16 KiB. It
/// moves half the elements across nodes (the emulator's engine count), but does
/// 1.75 times the flat two-shot's loads and stores on 2 x 2 ranks, which costs
/// where those are slow (a debug build: never faster up to 1 MiB). On GPU nodes, to
/// be measured.
pub const HIER_AR_MIN_BYTES: usize = 256 * 1024;

/// [`AllGatherAlgo::Auto`] takes [`AllGatherAlgo::Hierarchical`] from this many
/// bytes of input per rank on, for ranks on several nodes of several ranks each:
/// measured as [`HIER_AR_MIN_BYTES`], it was faster in every run only at 1 MiB
/// (0.73 to 0.93 of the flat all-gather's time; 0.77 to 1.54 at 256 KiB), although
/// one copy of the input crosses to each other node instead of one to each
/// off-node rank.
pub const HIER_AG_MIN_BYTES: usize = 1024 * 1024;

/// Chunks of [`TILE`] elements per step of the hierarchical kernels' pipeline:
/// a program raises its progress across nodes once per step (128 KiB of `f32`).
pub const HIER_STEP_CHUNKS: usize = 32;

/// Whether [`AllReduceAlgo::Auto`] takes LL for a message of `bytes` (> 0) bytes.
// (Written so that it stays meaningful while the measured threshold is 0.)
#[allow(clippy::absurd_extreme_comparisons, clippy::impossible_comparisons)]
pub fn auto_ll(bytes: usize) -> bool {
    bytes > 0 && bytes <= LL_MAX_BYTES
}

/// Signal words per kernel launch region: 2 handshakes x programs x ranks.
fn sig_words(ws: usize) -> usize {
    2 * MAX_PROGRAMS * ws
}

/// A rank's collectives workspace (see the [module docs](self)).
pub(crate) struct Workspace {
    /// Epoch of the last collective kernel launched.
    epoch: u64,
    /// Signal pad: `sig_words(ws)` words.
    sig: SymBuffer<u64>,
    /// Count rows for all-to-all-v: `1 + ws` per rank.
    counts: SymBuffer<i32>,
    /// Gathered count rows: `ws x (1 + ws)`.
    matrix: SymBuffer<i32>,
    /// Staging (one-shot): raw bytes as u64 words.
    stage: Option<SymBuffer<u64>>,
    /// LL buffers and scratch: raw bytes as u64 words.
    ll: Option<SymBuffer<u64>>,
    /// The hierarchical kernels' signal words: `3 * MAX_PROGRAMS * ws`.
    hsig: Option<SymBuffer<u64>>,
}

/// Bytes of `len` elements of `T`.
fn bytes_of<T>(len: usize) -> usize {
    len * std::mem::size_of::<T>()
}

/// Number of program instances for `chunks` chunks.
fn programs(chunks: usize) -> u32 {
    chunks.clamp(1, MAX_PROGRAMS) as u32
}

fn op_code(rank: &Rank, op: ReduceOp) -> Result<usize, Error> {
    match op {
        ReduceOp::Sum => Ok(OP_SUM),
        ReduceOp::Max => Ok(OP_MAX),
        ReduceOp::Min => Ok(OP_MIN),
        other => Err(rank_err(
            rank,
            format!("collectives reduce with Sum, Max or Min, not {other:?}"),
        )),
    }
}

/// The collectives, as numbered in a call record.
const CALLS: [&str; 5] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "all_to_all_v",
];
const OPS: [&str; 3] = ["Sum", "Max", "Min"];
const ALGOS: [AllReduceAlgo; 5] = [
    AllReduceAlgo::Auto,
    AllReduceAlgo::OneShot,
    AllReduceAlgo::TwoShot,
    AllReduceAlgo::LowLatency,
    AllReduceAlgo::Hierarchical,
];
const GATHER_ALGOS: [AllGatherAlgo; 3] = [
    AllGatherAlgo::Auto,
    AllGatherAlgo::Flat,
    AllGatherAlgo::Hierarchical,
];

/// A collective call as the three words every rank must agree on
/// ([`Rank::agree_on_call`]): which collective, the element type, the reduction
/// (`OP_*`), the algorithm asked for (its index in [`ALGOS`] or [`GATHER_ALGOS`]),
/// the element count, the root.
fn call_words<T: CollElem>(
    call: usize,
    op: usize,
    algo: usize,
    count: usize,
    root: u32,
) -> [u64; 3] {
    let ty = ScalarType::ALL
        .iter()
        .position(|t| *t == T::TY)
        .unwrap_or(0);
    [
        call as u64 | (ty as u64) << 8 | (op as u64) << 16 | (algo as u64) << 24,
        count as u64,
        u64::from(root),
    ]
}

/// The call [`call_words`] describes, for an error message.
fn describe_call(w: [u64; 3]) -> String {
    let field = |shift: u32| ((w[0] >> shift) & 0xff) as usize;
    let name = CALLS
        .get(field(0))
        .copied()
        .unwrap_or("an unknown collective");
    let ty = ScalarType::ALL
        .get(field(8))
        .map_or("?".to_string(), |t| t.to_string());
    match field(0) {
        0 => format!(
            "{name}({}, {ty}, {} elements, {:?})",
            OPS.get(field(16)).copied().unwrap_or("?"),
            w[1],
            ALGOS.get(field(24)).copied().unwrap_or(AllReduceAlgo::Auto)
        ),
        1 => format!(
            "{name}({ty}, {} elements, {:?})",
            w[1],
            GATHER_ALGOS
                .get(field(24))
                .copied()
                .unwrap_or(AllGatherAlgo::Auto)
        ),
        2 => format!(
            "{name}({}, {ty}, {} elements)",
            OPS.get(field(16)).copied().unwrap_or("?"),
            w[1]
        ),
        3 => format!("{name}({ty}, {} elements, root {})", w[1], w[2]),
        4 => format!("{name}({ty})"),
        _ => format!("{name}({ty}, {} elements)", w[1]),
    }
}

fn algo_index(algo: AllReduceAlgo) -> usize {
    ALGOS.iter().position(|a| *a == algo).unwrap_or(0)
}

fn rank_err(rank: &Rank, message: String) -> Error {
    Error::Comm {
        rank: rank.rank(),
        message,
    }
}

/// `len` as a kernel `i32`, or an error naming `what`.
fn as_i32(rank: &Rank, len: usize, what: &str) -> Result<i32, Error> {
    i32::try_from(len).map_err(|_| {
        rank_err(
            rank,
            format!("{what} has {len} elements; collectives handle up to 2^31-1"),
        )
    })
}

impl Rank {
    /// Runs `f` with this rank's workspace, creating it (collectively) on first use.
    fn with_ws<R>(
        &self,
        f: impl FnOnce(&Rank, &mut Workspace) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut g = self.coll.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let ws = self.size() as usize;
            *g = Some(Box::new(Workspace {
                epoch: 0,
                sig: self.alloc_signals(sig_words(ws))?,
                counts: self.alloc::<i32>(ws + 1)?,
                matrix: self.alloc::<i32>(ws * (ws + 1))?,
                stage: None,
                ll: None,
                hsig: None,
            }));
            // Allocation zeroes this rank's copy: no rank may signal into a peer's
            // pad before the peer has done so.
            self.barrier()?;
        }
        match g.as_mut().and_then(|w| w.downcast_mut::<Workspace>()) {
            Some(w) => f(self, w),
            None => Err(rank_err(self, "no collectives workspace".into())),
        }
    }

    fn check_owned<T: Element>(&self, buf: &SymBuffer<T>, what: &str) -> Result<(), Error> {
        if self.owns(buf) {
            Ok(())
        } else {
            Err(rank_err(
                self,
                format!(
                    "{what} ({buf:?}) was not allocated by this world's ranks (use Rank::alloc / Rank::upload of the rank that calls the collective)"
                ),
            ))
        }
    }

    /// In place: every rank ends with the element-wise reduction (`Sum`, `Max` or
    /// `Min`, in `f32`, over the ranks in rank order) of every rank's `buf`. Picks the
    /// algorithm by size ([`AllReduceAlgo::Auto`]). Errors name the caller's line
    /// first (see [Errors](self#errors)).
    #[track_caller]
    pub fn all_reduce<T: CollElem>(
        &self,
        buf: &mut SymBuffer<T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.all_reduce_impl(buf, op, AllReduceAlgo::Auto)
            .map_err(Error::in_call("all_reduce"))
    }

    /// [`Rank::all_reduce`] with a chosen algorithm. [`AllReduceAlgo::LowLatency`]
    /// fails for messages over [`LL_MAX_ELEMS`] elements.
    #[track_caller]
    pub fn all_reduce_with<T: CollElem>(
        &self,
        buf: &mut SymBuffer<T>,
        op: ReduceOp,
        algo: AllReduceAlgo,
    ) -> Result<(), Error> {
        self.all_reduce_impl(buf, op, algo)
            .map_err(Error::in_call("all_reduce_with"))
    }

    fn all_reduce_impl<T: CollElem>(
        &self,
        buf: &mut SymBuffer<T>,
        op: ReduceOp,
        algo: AllReduceAlgo,
    ) -> Result<(), Error> {
        let code = op_code(self, op)?;
        self.check_owned(buf, "the all_reduce buffer")?;
        let n = buf.len();
        let n32 = as_i32(self, n, "the all_reduce buffer")?;
        self.agree_on_call(
            call_words::<T>(0, code, algo_index(algo), n, 0),
            describe_call,
        )?;
        if n == 0 {
            return Ok(());
        }
        if algo == AllReduceAlgo::LowLatency && n > LL_MAX_ELEMS {
            return Err(rank_err(
                self,
                format!("the low-latency all_reduce takes up to {LL_MAX_ELEMS} elements, got {n}"),
            ));
        }
        let bytes = bytes_of::<T>(n);
        let per_node = self.ranks_per_node();
        let split = per_node.is_some_and(|l| l > 1 && l < self.size());
        self.with_ws(|r, w| {
            let epoch = w.epoch + 1;
            let ll_ok = epoch < u32::MAX as u64;
            let algo = match algo {
                AllReduceAlgo::Auto if split && bytes >= HIER_AR_MIN_BYTES => {
                    AllReduceAlgo::Hierarchical
                }
                AllReduceAlgo::Auto if auto_ll(bytes) && n <= LL_MAX_ELEMS && ll_ok => {
                    AllReduceAlgo::LowLatency
                }
                AllReduceAlgo::Auto if bytes <= ONE_SHOT_MAX_BYTES => AllReduceAlgo::OneShot,
                AllReduceAlgo::Auto => AllReduceAlgo::TwoShot,
                AllReduceAlgo::LowLatency if !ll_ok => AllReduceAlgo::OneShot,
                a => a,
            };
            match (algo, code) {
                (AllReduceAlgo::OneShot, OP_SUM) => r.one_shot::<T, OP_SUM>(w, buf, n32),
                (AllReduceAlgo::OneShot, OP_MAX) => r.one_shot::<T, OP_MAX>(w, buf, n32),
                (AllReduceAlgo::OneShot, _) => r.one_shot::<T, OP_MIN>(w, buf, n32),
                (AllReduceAlgo::TwoShot, OP_SUM) => r.two_shot::<T, OP_SUM>(w, buf, n32),
                (AllReduceAlgo::TwoShot, OP_MAX) => r.two_shot::<T, OP_MAX>(w, buf, n32),
                (AllReduceAlgo::TwoShot, _) => r.two_shot::<T, OP_MIN>(w, buf, n32),
                (AllReduceAlgo::Hierarchical, OP_SUM) => r.hier::<T, OP_SUM>(w, buf, n32),
                (AllReduceAlgo::Hierarchical, OP_MAX) => r.hier::<T, OP_MAX>(w, buf, n32),
                (AllReduceAlgo::Hierarchical, _) => r.hier::<T, OP_MIN>(w, buf, n32),
                (_, OP_SUM) => r.low_latency::<T, OP_SUM>(w, buf, n32),
                (_, OP_MAX) => r.low_latency::<T, OP_MAX>(w, buf, n32),
                (_, _) => r.low_latency::<T, OP_MIN>(w, buf, n32),
            }
        })
    }

    /// A workspace region of at least `bytes` bytes (grown collectively).
    fn region(&self, slot: &mut Option<SymBuffer<u64>>, bytes: usize) -> Result<usize, Error> {
        let have = slot.as_ref().map_or(0, |b| b.len() * 8);
        if have < bytes {
            let want = bytes.max(have * 2).max(64 * 1024).div_ceil(8);
            *slot = Some(self.alloc::<u64>(want)?);
            // As for the signal pad: peers write into this region only once every
            // rank has allocated (and zeroed) its copy.
            self.barrier()?;
        }
        slot.as_ref()
            .map(|b| b.heap_offset())
            .ok_or_else(|| rank_err(self, "no workspace region".into()))
    }

    /// The node size the hierarchical kernels run with: every node holds `L`
    /// consecutive ranks (one node when the ranks are not placed), or an error.
    fn hier_layout(&self, what: &str) -> Result<usize, Error> {
        self.ranks_per_node().map(|l| l as usize).ok_or_else(|| {
            rank_err(
                self,
                format!(
                    "the hierarchical {what} needs nodes of equally many consecutive ranks; this world's nodes are {:?}",
                    self.nodes()
                ),
            )
        })
    }

    /// The hierarchical kernels' signal words and the call's `(epoch, tick)`
    /// (`tick`: the epoch shifted left by 24, the base of the progress marks).
    fn hier_sync(&self, w: &mut Workspace) -> Result<(u64, u64), Error> {
        if w.hsig.is_none() {
            w.hsig = Some(self.alloc_signals(3 * MAX_PROGRAMS * self.size() as usize)?);
            // As for the signal pad: no rank signals into a peer's words before the
            // peer has zeroed them.
            self.barrier()?;
        }
        let epoch = Self::next_epoch(w);
        if epoch >= 1 << 40 {
            return Err(rank_err(
                self,
                "2^40 collective calls: the hierarchical kernels' progress marks would wrap".into(),
            ));
        }
        Ok((epoch, epoch << 24))
    }

    fn hier<T: CollElem, const OP: usize>(
        &self,
        w: &mut Workspace,
        buf: &mut SymBuffer<T>,
        n: i32,
    ) -> Result<(), Error> {
        let l = self.hier_layout("all_reduce")?;
        let seg = (n as usize).div_ceil(l);
        // f32 partials, double-buffered by epoch parity (as the one-shot's slots).
        let off = self.region(&mut w.stage, 2 * bytes_of::<f32>(seg))?;
        let half = w.stage.as_ref().map_or(0, |b| b.len() * 8) / 4 / 2;
        let half32 = as_i32(self, 2 * half, "the hierarchical staging region")? / 2;
        let mut stage = self.sym_view::<f32>(off, 2 * half)?;
        let (epoch, tick) = self.hier_sync(w)?;
        let stage_off = if epoch.is_multiple_of(2) { 0 } else { half32 };
        let grid = programs(seg.div_ceil(TILE));
        let hsig = w
            .hsig
            .as_mut()
            .ok_or_else(|| rank_err(self, "no hierarchical signal words".into()))?;
        kernels::ar_hier::<T, OP>::launch(
            self.device(),
            grid,
            (
                buf,
                &mut stage,
                hsig,
                n,
                seg as i32,
                l as i32,
                stage_off,
                HIER_STEP_CHUNKS as i32,
                epoch,
                tick,
            ),
        )
    }

    fn next_epoch(w: &mut Workspace) -> u64 {
        w.epoch += 1;
        w.epoch
    }

    fn one_shot<T: CollElem, const OP: usize>(
        &self,
        w: &mut Workspace,
        buf: &mut SymBuffer<T>,
        n: i32,
    ) -> Result<(), Error> {
        let n_us = n as usize;
        let off = self.region(&mut w.stage, 2 * bytes_of::<T>(n_us))?;
        // Two slots of a size fixed per region, so that a slot never moves while a
        // slow peer may still read it.
        let half = w.stage.as_ref().map_or(0, |b| b.len() * 8) / std::mem::size_of::<T>() / 2;
        let half32 = as_i32(self, 2 * half, "the one-shot staging region")? / 2;
        let mut stage = self.sym_view::<T>(off, 2 * half)?;
        let epoch = Self::next_epoch(w);
        let stage_off = if epoch.is_multiple_of(2) { 0 } else { half32 };
        let grid = programs(n_us.div_ceil(TILE));
        kernels::ar_one_shot::<T, OP>::launch(
            self.device(),
            grid,
            (buf, &mut stage, &mut w.sig, n, stage_off, 0, epoch),
        )
    }

    fn two_shot<T: CollElem, const OP: usize>(
        &self,
        w: &mut Workspace,
        buf: &mut SymBuffer<T>,
        n: i32,
    ) -> Result<(), Error> {
        let ws = self.size() as usize;
        let seg = (n as usize).div_ceil(ws);
        let epoch = Self::next_epoch(w);
        let grid = programs(seg.div_ceil(TILE));
        kernels::ar_two_shot::<T, OP>::launch(
            self.device(),
            grid,
            (buf, &mut w.sig, n, seg as i32, 0, epoch),
        )
    }

    fn low_latency<T: CollElem, const OP: usize>(
        &self,
        w: &mut Workspace,
        buf: &mut SymBuffer<T>,
        n: i32,
    ) -> Result<(), Error> {
        let ws = self.size() as usize;
        let n_us = n as usize;
        // Slots: 2 parities x ws sources x cap words; then MAX_PROGRAMS scratch tiles.
        let cap = LL_MAX_ELEMS.min(n_us.next_multiple_of(TILE));
        let ll_words = 2 * ws * cap;
        let scratch_bytes = MAX_PROGRAMS * TILE * 4;
        let off = self.region(&mut w.ll, ll_words * 8 + scratch_bytes)?;
        // The region may be larger than asked: keep `cap` fixed per region size so
        // a slot's place does not move between calls of different sizes.
        let region_words = w.ll.as_ref().map_or(0, |b| b.len());
        let cap = ((region_words - scratch_bytes / 8) / (2 * ws)).min(i32::MAX as usize / 2);
        let mut ll = self.sym_view::<u64>(off, 2 * ws * cap)?;
        let scratch_off = off + 2 * ws * cap * 8;
        let mut scratch_bits = self.sym_view::<T::Bits>(scratch_off, MAX_PROGRAMS * TILE)?;
        let scratch = self.sym_view::<T>(scratch_off, MAX_PROGRAMS * TILE)?;
        let bits = self.sym_view::<T::Bits>(buf.heap_offset(), n_us)?;
        let epoch = Self::next_epoch(w);
        let ll_off = if epoch.is_multiple_of(2) { 0 } else { ws * cap };
        let flag = (epoch & 0xffff_ffff) << 32;
        let grid = programs(n_us.div_ceil(TILE));
        kernels::ar_ll::<T, T::Bits, OP>::launch(
            self.device(),
            grid,
            (
                buf,
                &bits,
                &mut ll,
                &mut scratch_bits,
                &scratch,
                n,
                ll_off as i32,
                cap as i32,
                flag,
            ),
        )
    }

    /// `output[r*n .. (r+1)*n]` = `input` of rank `r`, with `n = input.len()`;
    /// `output.len()` must be `n * size()`. Picks the algorithm by topology and size
    /// ([`AllGatherAlgo::Auto`]).
    #[track_caller]
    pub fn all_gather<T: CollElem>(
        &self,
        input: &SymBuffer<T>,
        output: &mut SymBuffer<T>,
    ) -> Result<(), Error> {
        self.all_gather_impl(input, output, AllGatherAlgo::Auto)
            .map_err(Error::in_call("all_gather"))
    }

    /// [`Rank::all_gather`] with a chosen algorithm. [`AllGatherAlgo::Hierarchical`]
    /// fails for ranks whose nodes do not hold equally many consecutive ranks.
    #[track_caller]
    pub fn all_gather_with<T: CollElem>(
        &self,
        input: &SymBuffer<T>,
        output: &mut SymBuffer<T>,
        algo: AllGatherAlgo,
    ) -> Result<(), Error> {
        self.all_gather_impl(input, output, algo)
            .map_err(Error::in_call("all_gather_with"))
    }

    fn all_gather_impl<T: CollElem>(
        &self,
        input: &SymBuffer<T>,
        output: &mut SymBuffer<T>,
        algo: AllGatherAlgo,
    ) -> Result<(), Error> {
        self.check_owned(input, "the all_gather input")?;
        self.check_owned(output, "the all_gather output")?;
        let ws = self.size() as usize;
        let n = input.len();
        if output.len() != n * ws {
            return Err(rank_err(
                self,
                format!(
                    "all_gather: the output has {} elements, expected input length {n} x {ws} ranks = {}",
                    output.len(),
                    n * ws
                ),
            ));
        }
        as_i32(self, n * ws, "the all_gather output")?;
        let index = GATHER_ALGOS.iter().position(|a| *a == algo).unwrap_or(0);
        self.agree_on_call(call_words::<T>(1, 0, index, n, 0), describe_call)?;
        if n == 0 {
            return Ok(());
        }
        let split = self
            .ranks_per_node()
            .is_some_and(|l| l > 1 && l < self.size());
        let hier = match algo {
            AllGatherAlgo::Auto => split && bytes_of::<T>(n) >= HIER_AG_MIN_BYTES,
            AllGatherAlgo::Flat => false,
            AllGatherAlgo::Hierarchical => true,
        };
        self.with_ws(|r, w| {
            let grid = programs(n.div_ceil(TILE));
            if hier {
                let l = r.hier_layout("all_gather")?;
                let (epoch, tick) = r.hier_sync(w)?;
                let hsig = w
                    .hsig
                    .as_mut()
                    .ok_or_else(|| rank_err(r, "no hierarchical signal words".into()))?;
                return kernels::ag_hier::<T>::launch(
                    r.device(),
                    grid,
                    (
                        input,
                        output,
                        hsig,
                        n as i32,
                        l as i32,
                        HIER_STEP_CHUNKS as i32,
                        epoch,
                        tick,
                    ),
                );
            }
            let epoch = Self::next_epoch(w);
            kernels::all_gather_k::<T>::launch(
                r.device(),
                grid,
                (input, output, &mut w.sig, n as i32, 0, epoch),
            )
        })
    }

    /// `input.len()` must be `n * size()`; `output` (length `n`) on rank `r` becomes the
    /// reduction over ranks (in `f32`, rank order) of `input[r*n .. (r+1)*n]`.
    #[track_caller]
    pub fn reduce_scatter<T: CollElem>(
        &self,
        input: &SymBuffer<T>,
        output: &mut SymBuffer<T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.reduce_scatter_impl(input, output, op)
            .map_err(Error::in_call("reduce_scatter"))
    }

    fn reduce_scatter_impl<T: CollElem>(
        &self,
        input: &SymBuffer<T>,
        output: &mut SymBuffer<T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        let code = op_code(self, op)?;
        self.check_owned(input, "the reduce_scatter input")?;
        self.check_owned(output, "the reduce_scatter output")?;
        let ws = self.size() as usize;
        let n = output.len();
        if input.len() != n * ws {
            return Err(rank_err(
                self,
                format!(
                    "reduce_scatter: the input has {} elements, expected output length {n} x {ws} ranks = {}",
                    input.len(),
                    n * ws
                ),
            ));
        }
        as_i32(self, n * ws, "the reduce_scatter input")?;
        self.agree_on_call(call_words::<T>(2, code, 0, n, 0), describe_call)?;
        if n == 0 {
            return Ok(());
        }
        self.with_ws(|r, w| {
            let epoch = Self::next_epoch(w);
            let grid = programs(n.div_ceil(TILE));
            let args = (input, output, &mut w.sig, n as i32, 0, epoch);
            match code {
                OP_SUM => kernels::reduce_scatter_k::<T, OP_SUM>::launch(r.device(), grid, args),
                OP_MAX => kernels::reduce_scatter_k::<T, OP_MAX>::launch(r.device(), grid, args),
                _ => kernels::reduce_scatter_k::<T, OP_MIN>::launch(r.device(), grid, args),
            }
        })
    }

    /// Every rank's `buf` becomes `root`'s.
    #[track_caller]
    pub fn broadcast<T: CollElem>(&self, buf: &mut SymBuffer<T>, root: u32) -> Result<(), Error> {
        self.broadcast_impl(buf, root)
            .map_err(Error::in_call("broadcast"))
    }

    fn broadcast_impl<T: CollElem>(&self, buf: &mut SymBuffer<T>, root: u32) -> Result<(), Error> {
        self.check_owned(buf, "the broadcast buffer")?;
        if root >= self.size() {
            return Err(rank_err(
                self,
                format!(
                    "broadcast root {root} is outside a world of {} ranks",
                    self.size()
                ),
            ));
        }
        let n = buf.len();
        let n32 = as_i32(self, n, "the broadcast buffer")?;
        self.agree_on_call(call_words::<T>(3, 0, 0, n, root), describe_call)?;
        if n == 0 {
            return Ok(());
        }
        self.with_ws(|r, w| {
            let epoch = Self::next_epoch(w);
            kernels::broadcast_k::<T>::launch(
                r.device(),
                programs(n.div_ceil(TILE)),
                (buf, &mut w.sig, n32, root as i32, 0, epoch),
            )
        })
    }

    /// All-to-all with per-destination counts (MoE dispatch/combine). `send` holds,
    /// contiguously in destination-rank order, `send_counts[d]` elements for rank `d`.
    /// On return `recv` holds, contiguously in source-rank order, what every source
    /// sent to this rank; returns those counts (per source). Fails on every rank
    /// (consistently) when some rank's counts are invalid or some rank's `recv` is too
    /// small.
    #[track_caller]
    pub fn all_to_all_v<T: CollElem>(
        &self,
        send: &SymBuffer<T>,
        send_counts: &[usize],
        recv: &mut SymBuffer<T>,
    ) -> Result<Vec<usize>, Error> {
        self.all_to_all_v_impl(send, send_counts, recv)
            .map_err(Error::in_call("all_to_all_v"))
    }

    fn all_to_all_v_impl<T: CollElem>(
        &self,
        send: &SymBuffer<T>,
        send_counts: &[usize],
        recv: &mut SymBuffer<T>,
    ) -> Result<Vec<usize>, Error> {
        self.check_owned(send, "the all_to_all_v send buffer")?;
        self.check_owned(recv, "the all_to_all_v receive buffer")?;
        // Counts differ between ranks by design (they are checked collectively below).
        self.agree_on_call(call_words::<T>(4, 0, 0, 0, 0), describe_call)?;
        let ws = self.size() as usize;
        let me = self.rank() as usize;
        // A local problem is not returned at once: the other ranks would wait for this
        // one. It is published (valid = 0) so that every rank fails the same way.
        let total = send_counts
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c));
        let local_problem = if send_counts.len() != ws {
            Some(format!(
                "{} send counts for a world of {ws} ranks",
                send_counts.len()
            ))
        } else {
            match total {
                Some(t)
                    if t <= send.len() && send_counts.iter().all(|&c| c <= i32::MAX as usize) =>
                {
                    None
                }
                _ => Some(format!(
                    "the send counts add up to more than the send buffer's {} elements",
                    send.len()
                )),
            }
        };
        as_i32(self, recv.len(), "the all_to_all_v receive buffer")?;
        as_i32(self, send.len(), "the all_to_all_v send buffer")?;
        let mut row = vec![0i32; ws + 1];
        if local_problem.is_none() {
            row[0] = 1;
            for (d, &c) in send_counts.iter().enumerate() {
                row[1 + d] = c as i32;
            }
        }
        self.with_ws(|r, w| {
            w.counts.copy_from(&row)?;
            let epoch = Self::next_epoch(w);
            kernels::a2a_counts::launch(
                r.device(),
                1u32,
                (&w.counts, &mut w.matrix, &mut w.sig, 0, epoch),
            )?;
            let m = w.matrix.download()?;
            let at = |src: usize, col: usize| m[src * (ws + 1) + col];
            if let Some(msg) = local_problem {
                return Err(rank_err(r, format!("all_to_all_v: {msg}")));
            }
            if let Some(bad) = (0..ws).find(|&s| at(s, 0) != 1) {
                return Err(rank_err(
                    r,
                    format!("all_to_all_v: rank {bad} passed invalid send counts"),
                ));
            }
            for d in 0..ws {
                let need: usize = (0..ws).map(|s| at(s, 1 + d) as usize).sum();
                if need > recv.len() {
                    return Err(rank_err(
                        r,
                        format!(
                            "all_to_all_v: rank {d} receives {need} elements, the receive buffer holds {}",
                            recv.len()
                        ),
                    ));
                }
            }
            // Per source: offset in its send buffer, offset in my recv, count.
            let mut meta = Vec::with_capacity(3 * ws);
            let mut recv_counts = Vec::with_capacity(ws);
            let mut dst = 0usize;
            // Every rank must launch the same grid: size it by the largest count of all.
            let largest = (0..ws)
                .flat_map(|s| (0..ws).map(move |d| (s, d)))
                .map(|(s, d)| at(s, 1 + d) as usize)
                .max()
                .unwrap_or(0);
            for s in 0..ws {
                let src: usize = (0..me).map(|d| at(s, 1 + d) as usize).sum();
                let cnt = at(s, 1 + me) as usize;
                meta.extend([src as i32, dst as i32, cnt as i32]);
                recv_counts.push(cnt);
                dst += cnt;
            }
            let meta: Buffer<i32> = r.device().upload(&meta)?;
            let epoch = Self::next_epoch(w);
            kernels::a2a_data::<T>::launch(
                r.device(),
                programs(largest.div_ceil(TILE)),
                (send, recv, &meta, &mut w.sig, 0, epoch),
            )?;
            Ok(recv_counts)
        })
    }
}

/// Precompiles the flat all-reduce's sum kernels (one-shot, two-shot, low-latency) on
/// elements of type `T` for `target` into `store`: a small set for a world across
/// nodes, whose kernels are compiled with `opts.engine` set to the vendor's engine
/// (the GPU check's NVSHMEM world runs them). Returns the written files.
#[cfg(feature = "jit")]
pub fn precompile_all_reduce_sum<T: CollElem>(
    target: crate::aot::Target,
    opts: &crate::aot::CompileOptions,
    store: &crate::ArtifactStore,
) -> Result<Vec<std::path::PathBuf>, Error> {
    use crate::aot::precompile_launches as all;
    let (t, o, s) = (target, opts, store);
    let mut out = all::<kernels::ar_one_shot<T, OP_SUM>>(&(), t, o, s)?;
    out.extend(all::<kernels::ar_two_shot<T, OP_SUM>>(&(), t, o, s)?);
    out.extend(all::<kernels::ar_ll<T, T::Bits, OP_SUM>>(&(), t, o, s)?);
    Ok(out)
}

/// Precompiles every kernel the collectives launch on elements of type `T` (every
/// algorithm and reduction: all-reduce one-shot, two-shot, low-latency and
/// hierarchical, all-gather flat and hierarchical,
/// all-gather, reduce-scatter, broadcast, all-to-all) for `target` into `store`, under
/// the keys launches look up: what a build without `jit` needs to run the collectives
/// on a GPU (the GPU check's pack holds them for `f32`). Returns the written files.
#[cfg(feature = "jit")]
pub fn precompile<T: CollElem>(
    target: crate::aot::Target,
    opts: &crate::aot::CompileOptions,
    store: &crate::ArtifactStore,
) -> Result<Vec<std::path::PathBuf>, Error> {
    let mut out = Vec::new();
    for ir in kernel_irs::<T>()? {
        out.extend(crate::aot::precompile_ir_launches(
            &ir, target, opts, store,
        )?);
    }
    Ok(out)
}

/// The IR of every kernel the collectives launch on elements of type `T` (the list
/// [`precompile`] compiles), as [`crate::kernel_ir`] gives it: for offline checks of
/// other backends (`tessera::codegen::tileir`).
pub fn kernel_irs<T: CollElem>() -> Result<Vec<std::sync::Arc<tessera_ir::Function>>, Error> {
    use crate::kernel_ir as ir;
    Ok(vec![
        ir::<kernels::ar_one_shot<T, OP_SUM>>(&())?,
        ir::<kernels::ar_one_shot<T, OP_MAX>>(&())?,
        ir::<kernels::ar_one_shot<T, OP_MIN>>(&())?,
        ir::<kernels::ar_two_shot<T, OP_SUM>>(&())?,
        ir::<kernels::ar_two_shot<T, OP_MAX>>(&())?,
        ir::<kernels::ar_two_shot<T, OP_MIN>>(&())?,
        ir::<kernels::ar_ll<T, T::Bits, OP_SUM>>(&())?,
        ir::<kernels::ar_ll<T, T::Bits, OP_MAX>>(&())?,
        ir::<kernels::ar_ll<T, T::Bits, OP_MIN>>(&())?,
        ir::<kernels::ar_hier<T, OP_SUM>>(&())?,
        ir::<kernels::ar_hier<T, OP_MAX>>(&())?,
        ir::<kernels::ar_hier<T, OP_MIN>>(&())?,
        ir::<kernels::all_gather_k<T>>(&())?,
        ir::<kernels::ag_hier<T>>(&())?,
        ir::<kernels::reduce_scatter_k<T, OP_SUM>>(&())?,
        ir::<kernels::reduce_scatter_k<T, OP_MAX>>(&())?,
        ir::<kernels::reduce_scatter_k<T, OP_MIN>>(&())?,
        ir::<kernels::broadcast_k<T>>(&())?,
        ir::<kernels::a2a_counts>(&())?,
        ir::<kernels::a2a_data<T>>(&())?,
    ])
}

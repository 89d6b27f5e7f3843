//! The SIMT emulator's host runtime: the same SIMT LLVM IR the GPU targets get runs
//! on the host, with the GPU's meaning for barriers, warp shuffles and matrix
//! instructions supplied here.
//!
//! **Public surface.** One launch entry, [`launch_with`] (an [`EmuKernel`]: the IR,
//! flavour and options; an [`EmuLaunch`]: grid, arguments, [`EmuWorld`],
//! [`EmuLimits`]), and its shorthand [`launch`]; the errors ([`EmuError`]); tensor
//! maps for `emu-sm90a`'s TMA copies ([`EmuTensorMap`], registered for a launch as a
//! [`TensorMapHandle`]); what tests observe ([`compiled_kernels`],
//! [`engine_ops_total`]); and [`mma`], the vendors' matrix instructions as a
//! reference model. Everything else is the crate's own:
//!
//! - `grid`: runs a kernel over its grid (argument slots, the workers, the first
//!   error);
//! - `team`: the threads of a block as coroutines; barriers and warp collectives
//!   that report divergence and timeouts instead of hanging;
//! - [`mma`]: the matrix instructions with the vendors' fragment layouts, written
//!   independently of the lowering so a wrong layout computes a wrong product;
//!   `wgmma`: Hopper's warpgroup matrix instructions from shared memory;
//! - `tma`: tensor maps, box copies and mbarriers of sm_90;
//! - `jit`: the lowering with the emulator's arch ([`crate::lower::arch::emu`]),
//!   compiled for the host by LLVM's MCJIT, cached in memory;
//! - `runtime`: the functions the compiled kernels call (thread and block ids,
//!   barriers, shuffles, bounds checks, race detection; `runtime/copies.rs`:
//!   `cp.async`, mbarriers and TMA; `runtime/matrix.rs`: `ldmatrix`, `mma`,
//!   `wgmma`), and `shmem`/`puts`: the NVSHMEM calls of the off-node engine.
//!
//! # Execution model
//!
//! A GPU thread is a stackful coroutine ([`corosensei`], stacks from
//! `host::stack::StackArena`); a block's threads are driven by one OS thread
//! (`team::Team::step`): each runs until it parks at a barrier, an unfinished warp
//! collective, a polling loop or a loop's back edge, then the next runs. A launch
//! uses a pool of OS threads the size of the machine (never more than there are
//! blocks), and no OS thread per GPU thread anywhere:
//!
//! - threads that never meet (no barrier, shuffle, matrix instruction or shared
//!   memory) need no coroutine: each worker calls the kernel for every thread of its
//!   blocks in turn;
//! - otherwise each worker takes the next block, runs its threads as coroutines to
//!   the end, and reuses the block's state (shared memory, stacks) for its next one;
//! - kernels that wait for other blocks or ranks (`wait_until`, `barrier_all`:
//!   [`Function::uses_blocking`]) keep every block live at once: worker `w` owns
//!   blocks `w, w + W, ...` (each with its own shared memory) and steps them round
//!   robin; a thread in a polling loop parks, so the thread it waits for runs. The
//!   only limit is memory, checked before the launch ([`EmuError::OutOfMemory`]).
//!
//! Warp collectives are computed once per warp, by the last lane to arrive (a matrix
//! instruction's product from the gathered fragments, scattered to the lanes).
//! Per-thread state (thread id, block, shared-memory base, error sink, yielder)
//! lives in a `runtime::ThreadCtx` the driving OS thread points a thread-local at
//! before resuming the thread; a coroutine never moves to another OS thread.
//!
//! Communicating kernels take the hidden parameters of [`crate::comm`]; the heaps
//! are host memory, so remote accesses are plain host accesses, checked against
//! every rank's copy of the buffer they derive from.
//!
//! Checks: every global access is bounds-checked against the buffer its pointer
//! derives from, the kernel parameter the lowering traced it to
//! ([`crate::lower::prov`], recorded in the access's [`crate::lower::Site`]): an
//! address inside another buffer of the launch is out of bounds all the same. A
//! pointer of mixed provenance (a `select` or loop-carried value over several
//! parameters' pointers) is checked against each of those buffers; one traced
//! through `remote_ptr` against every rank's copy of its buffer; one the lowering
//! could not trace against every buffer of the launch. An access outside its
//! buffer(s) is reported with the op's `file:line:col`, block, thread, the buffer's
//! parameter name and the element index relative to it (the nearest candidate's),
//! as the interpreter reports it, and redirected to a per-thread scratch area so it
//! does no harm; masked-off lanes are neither checked nor accessed (the AMD flavor's
//! buffer loads included: a masked-on lane out of range is reported, not read as
//! zero). Shared-memory accesses are checked for
//! races between barriers; barriers report divergence and time out
//! (`$TESSERA_EMU_TIMEOUT_MS`, default 60 s).

mod grid;
pub(crate) mod jit;
pub mod mma;
mod puts;
pub(crate) mod runtime;
mod shmem;
pub(crate) mod team;
pub(crate) mod tma;
pub(crate) mod wgmma;

pub use jit::compiled_kernels;
pub use tma::{EmuTensorMap, TensorMapHandle};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tessera_ir::interp::KernelArg;
use tessera_ir::{Function, Span};

use crate::target::EmuFlavor;
use crate::{CodegenError, CompileOptions};

/// Why an emulated launch failed. Errors in the kernel name the op's
/// `file:line:col`, the block and the thread.
#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    /// The lowering rejected the kernel.
    #[error(transparent)]
    Compile(#[from] CodegenError),
    /// LLVM could not JIT-compile the lowered kernel for the host (a Tessera bug).
    #[error("internal error: the emulator's JIT failed for kernel `{kernel}`: {message}")]
    Jit {
        /// The kernel.
        kernel: String,
        /// What happened.
        message: String,
    },
    /// The launch's OS threads could not be created.
    #[error("the emulator could not start its threads: {message}")]
    Threads {
        /// The OS's message.
        message: String,
    },
    /// The launch needs more memory than the machine has available (checked before
    /// it starts), or its thread stacks could not be reserved.
    #[error(
        "{span}: kernel `{kernel}` needs about {needed_mib} MiB to run {ranks} rank(s) x {blocks} block(s) x {threads} threads at once on the emulator ({what}); {available}"
    )]
    OutOfMemory {
        /// The kernel.
        kernel: String,
        /// Where it is defined.
        span: Span,
        /// Ranks of the world launching it at once (1 outside a waiting kernel's world).
        ranks: u64,
        /// Blocks live at once (per rank).
        blocks: u64,
        /// Threads per block.
        threads: u32,
        /// The estimate (MiB).
        needed_mib: u64,
        /// What the estimate counts.
        what: String,
        /// What is available, or the OS's message.
        available: String,
    },
    /// Launch arguments that do not match the kernel's parameters.
    #[error("{span}: bad arguments for kernel `{kernel}`, parameter `{param}`: {message}")]
    Args {
        /// The kernel.
        kernel: String,
        /// Where the kernel is defined.
        span: Span,
        /// The parameter (`<count>` for a wrong number of arguments).
        param: String,
        /// What is wrong.
        message: String,
    },
    /// A memory access outside the buffer its pointer derives from.
    #[error(
        "{span}: out-of-bounds {op} in kernel `{kernel}`: index {index} of buffer `{buffer}` (len {len}) at block {b}, thread {thread}",
        b = fmt3(.block)
    )]
    OutOfBounds {
        /// The kernel.
        kernel: String,
        /// The op's mnemonic.
        op: &'static str,
        /// The op's source location.
        span: Span,
        /// The block (program id).
        block: [u32; 3],
        /// The thread in the block.
        thread: u32,
        /// The buffer the pointer derives from (its parameter name; of several
        /// candidates, the nearest to the address).
        buffer: String,
        /// The element index relative to that buffer (negative below it).
        index: i64,
        /// That buffer's length in elements.
        len: usize,
    },
    /// An access of `bytes` bytes at an address that is not a multiple of `bytes`
    /// (the lowering promised that alignment; a GPU would fault).
    #[error(
        "{span}: misaligned {bytes}-byte {op} in kernel `{kernel}`: byte offset {offset_bytes} of buffer `{buffer}` at block {b}, thread {thread}",
        b = fmt3(.block)
    )]
    Misaligned {
        /// The kernel.
        kernel: String,
        /// The op's mnemonic.
        op: &'static str,
        /// The op's source location.
        span: Span,
        /// The block (program id).
        block: [u32; 3],
        /// The thread in the block.
        thread: u32,
        /// The buffer accessed.
        buffer: String,
        /// The byte offset in that buffer.
        offset_bytes: usize,
        /// The access size (and required alignment).
        bytes: u32,
    },
    /// A matrix or asynchronous instruction used against its rules (a `wgmma`
    /// without its fence, accumulators touched while in flight, an operand layout
    /// the emulator does not model); on a GPU the result would be undefined.
    #[error(
        "{span}: invalid {op} in kernel `{kernel}` at block {b}, thread {thread}: {message}",
        b = fmt3(.block)
    )]
    Instruction {
        /// The kernel.
        kernel: String,
        /// The op's mnemonic.
        op: &'static str,
        /// The op's source location.
        span: Span,
        /// The block (program id).
        block: [u32; 3],
        /// The thread in the block.
        thread: u32,
        /// What is wrong.
        message: String,
    },
    /// A barrier that some threads of the block never reached.
    #[error(
        "{span}: barrier (in `{op}`) in kernel `{kernel}` not reached by {missing} threads of block {b} ({detail})",
        b = fmt3(.block)
    )]
    BarrierDivergence {
        /// The kernel.
        kernel: String,
        /// The op that emitted the barrier.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// The block.
        block: [u32; 3],
        /// Threads that did not arrive.
        missing: u32,
        /// Where the others were.
        detail: String,
    },
    /// A barrier that did not complete in time.
    #[error(
        "{span}: barrier (in `{op}`) in kernel `{kernel}` timed out in block {b}: {waiting} of {threads} threads waiting",
        b = fmt3(.block)
    )]
    Timeout {
        /// The kernel.
        kernel: String,
        /// The op that emitted the barrier.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// The block.
        block: [u32; 3],
        /// Threads waiting.
        waiting: u32,
        /// Threads in the block.
        threads: u32,
    },
    /// The launch ran past its watchdog ([`EmuLimits::timeout`]): every runtime
    /// loop stopped at its next test; names the loop the first thread stopped in.
    #[error(
        "{span}: kernel `{kernel}` ran past its {:.3} s launch timeout (TESSERA_LAUNCH_TIMEOUT): stopped in this `{op}` loop (block {b}, thread {thread})",
        timeout.as_secs_f64(),
        b = fmt3(.block)
    )]
    LaunchTimeout {
        /// The kernel.
        kernel: String,
        /// The loop (`for` or `while`).
        op: &'static str,
        /// Its source location.
        span: Span,
        /// The first block that stopped.
        block: [u32; 3],
        /// Its thread.
        thread: u32,
        /// The limit.
        timeout: Duration,
    },
    /// A `wait_until` or `barrier_all` timed out, or gave up because another rank
    /// failed ([`crate::comm::CommFault::Aborted`]: a consequence, not a cause).
    #[error(transparent)]
    Comm(Box<crate::comm::CommFault>),
    /// A `remote_ptr` (`buf.on(peer)`, `put`, `get`, `signal`) with a peer outside
    /// the world.
    #[error(
        "{span}: `{op}` in kernel `{kernel}` on rank {rank}: peer {peer} is outside the world of {world_size} rank(s) (block {b}, thread {thread})",
        b = fmt3(.block)
    )]
    BadPeer {
        /// The kernel.
        kernel: String,
        /// The op's mnemonic.
        op: &'static str,
        /// The op's source location.
        span: Span,
        /// The rank.
        rank: u32,
        /// The block.
        block: [u32; 3],
        /// The thread in the block.
        thread: u32,
        /// The peer asked for.
        peer: i32,
        /// Number of ranks.
        world_size: i32,
    },
    /// An integer division or remainder by zero (on a GPU it yields 0; the emulator
    /// and the interpreter report it).
    #[error(
        "{span}: integer division by zero in `{op}` of kernel `{kernel}` at block {b}, thread {thread}",
        b = fmt3(.block)
    )]
    DivisionByZero {
        /// The kernel.
        kernel: String,
        /// The op's mnemonic.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// The block.
        block: [u32; 3],
        /// The thread.
        thread: u32,
    },
    /// Two threads accessed the same shared memory without a barrier in between.
    #[error(
        "{span}: shared-memory race ({kind}) in `{op}` of kernel `{kernel}`, block {b}: thread {writer} writes and thread {reader} reads without a barrier in between (other access at {other_span})",
        b = fmt3(.block)
    )]
    SharedRace {
        /// The kernel.
        kernel: String,
        /// The op of the second access.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// Source location of the first access.
        other_span: Span,
        /// The block.
        block: [u32; 3],
        /// The writing thread.
        writer: u32,
        /// The reading thread.
        reader: u32,
        /// `read after write` or `write after read`.
        kind: &'static str,
    },
}

fn fmt3(b: &[u32; 3]) -> String {
    format!("({}, {}, {})", b[0], b[1], b[2])
}

/// The symbols JIT-compiled kernels may call (the runtime's and the NVSHMEM calls'),
/// with their addresses.
pub(crate) fn symbols() -> Vec<(&'static str, usize)> {
    let mut v = runtime::symbols();
    v.extend(shmem::symbols());
    v
}

/// How long a barrier may wait before the launch fails with [`EmuError::Timeout`],
/// unless [`EmuLimits::barrier_timeout`] says otherwise.
pub const DEFAULT_BARRIER_TIMEOUT: Duration = Duration::from_secs(60);

/// The world a communicating kernel runs in on the emulator: this rank and every
/// rank's symmetric heap (host memory of this process, laid out as described in
/// [`crate::comm`]: control words first). Launches write through the heap addresses,
/// so only [`EmuWorld::new`], which is `unsafe`, makes one.
#[derive(Clone, Debug)]
pub struct EmuWorld {
    /// This rank, `0..heap_bases.len()`.
    rank: u32,
    /// Every rank's heap base address.
    heap_bases: Vec<u64>,
    /// How long a wait polls before failing.
    timeout: Duration,
    /// Each rank's node, when the ranks are on several ([`EmuWorld::with_nodes`]).
    nodes: Option<Vec<u32>>,
    /// Calls of the off-node engine's functions so far ([`EmuWorld::engine_ops`]).
    engine_ops: Arc<AtomicU64>,
}

impl EmuWorld {
    /// The world of rank `rank` among the heaps at `heap_bases` (one per rank), whose
    /// waits fail after `timeout`.
    ///
    /// # Safety
    ///
    /// Every address in `heap_bases` must be the start of host memory of this process
    /// that is [`crate::comm::HEAP_ALIGN`]-aligned, starts with
    /// [`tessera_ir::interp::ctrl::WORDS`] control words, holds every symmetric buffer
    /// a launch passes at its offset, and stays alive, writable and accessed only
    /// atomically or by launches for as long as any launch uses this world: kernels
    /// read and write peers' heaps through these addresses.
    pub unsafe fn new(rank: u32, heap_bases: Vec<u64>, timeout: Duration) -> EmuWorld {
        EmuWorld {
            rank,
            heap_bases,
            timeout,
            nodes: None,
            engine_ops: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Places rank `r` on node `nodes[r]` (one entry per rank): peers on this rank's
    /// node are reached through memory, the others only through the off-node engine
    /// the kernel is compiled for ([`crate::CommEngine`]; the heap-base table marks
    /// them, [`crate::comm::tagged_bases`]), as on a cluster. A communicating kernel
    /// compiled with [`crate::CommEngine::Direct`] cannot run in such a world.
    pub fn with_nodes(mut self, nodes: Vec<u32>) -> EmuWorld {
        self.nodes = Some(nodes);
        self
    }

    /// How many calls of the off-node engine's device functions that reach a PE's
    /// memory (puts, gets, atomics, signals; quiets do not count) the kernels of this
    /// world (and its clones) have made.
    pub fn engine_ops(&self) -> u64 {
        self.engine_ops.load(Ordering::Relaxed)
    }
}

/// Calls of the off-node engine's device functions that reach a PE's memory, made by
/// every emulated launch of this process so far (see [`EmuWorld::with_nodes`]): a test's evidence that
/// off-node traffic took the engine's path.
pub fn engine_ops_total() -> u64 {
    shmem::TOTAL.load(Ordering::Relaxed)
}

/// A kernel as the emulator compiles it: its IR, the flavour whose lowering runs, and
/// the compilation options (the JIT's cache key, with the IR's text).
#[derive(Clone, Copy, Debug)]
pub struct EmuKernel<'a> {
    /// The kernel.
    pub func: &'a Function,
    /// Which GPU's lowering and warp width.
    pub flavor: EmuFlavor,
    /// Warps per block, pipeline stages, the off-node engine.
    pub opts: &'a CompileOptions,
}

impl<'a> EmuKernel<'a> {
    /// `func` lowered for `flavor` with `opts`.
    pub fn new(func: &'a Function, flavor: EmuFlavor, opts: &'a CompileOptions) -> EmuKernel<'a> {
        EmuKernel { func, flavor, opts }
    }
}

/// One launch of an [`EmuKernel`]: the grid, the arguments, the world, the limits.
/// `EmuLaunch { grid, args, ..Default::default() }` is a launch as rank 0 of a world
/// of one, with the default limits.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmuLaunch<'a> {
    /// Blocks along x, y and z.
    pub grid: [u32; 3],
    /// One per kernel parameter, in order (as for [`tessera_ir::interp::run`]): a
    /// buffer, every rank's copy of a symmetric buffer, or a scalar. A tensor-map
    /// parameter takes a [`TensorMapHandle::id`] (or 0: no map).
    pub args: &'a [KernelArg],
    /// The world a communicating kernel runs in; `None`: rank 0 of a world of one,
    /// with control words of its own.
    pub world: Option<&'a EmuWorld>,
    /// The watchdog, the barrier timeout, dumps.
    pub limits: EmuLimits,
}

/// Limits and debugging switches of one emulated launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmuLimits {
    /// A watchdog: once the launch has run this long, every runtime loop (`for`,
    /// `while`) stops at its next test and the launch fails with
    /// [`EmuError::LaunchTimeout`] naming the loop. `None`: no limit.
    pub timeout: Option<Duration>,
    /// How long a barrier may wait before the launch fails with
    /// [`EmuError::Timeout`]; `None`: [`DEFAULT_BARRIER_TIMEOUT`].
    pub barrier_timeout: Option<Duration>,
    /// Print the JIT-compiled LLVM module to standard error when it is built.
    pub dump_llvm: bool,
}

/// Runs `kernel` on the SIMT emulator: the real lowering for its flavour,
/// JIT-compiled for the host (cached), over `launch.grid` blocks of
/// `opts.num_warps * warp_size` threads, on `launch.args`. This is the emulator's
/// one launch entry ([`launch`] is its shorthand).
///
/// Blocks run in parallel on a pool of OS threads (see the module docs). Every
/// global access is checked against the buffer it derives from, every shared access is
/// checked for races, and barriers report divergence; no block starts after one has
/// failed, and the first error (lowest block, then thread) is returned. Buffers are
/// written in place.
///
/// Communicating kernels get the hidden parameters of [`crate::comm`] for
/// `launch.world`; [`KernelArg::Symmetric`] arguments pass this rank's copy and
/// make every rank's copy valid for the bounds checker (named like
/// `data (rank 2's copy)`). Kernels that wait (`wait_until`, `barrier_all`) keep all
/// their blocks live at once, as coroutines (the limit is memory:
/// [`EmuError::OutOfMemory`]). A failing thread sets every rank's `ABORT` word,
/// releasing their waits. A wait that fails comes back as [`EmuError::Comm`],
/// decoded from (and cleared in) this rank's error record.
///
/// A kernel with tensor maps (`emu-sm90a`) reads them through the handles its
/// arguments name: register each [`EmuTensorMap`] and keep its handle until this
/// returns.
pub fn launch_with(kernel: &EmuKernel<'_>, launch: &EmuLaunch<'_>) -> Result<(), EmuError> {
    grid::run(kernel, launch)
}

/// [`launch_with`] of `func` for `flavor` with `opts` over `grid` on `args`, as rank 0
/// of a world of one with the default limits.
pub fn launch(
    func: &Function,
    flavor: EmuFlavor,
    opts: &CompileOptions,
    grid: [u32; 3],
    args: &[KernelArg],
) -> Result<(), EmuError> {
    launch_with(
        &EmuKernel::new(func, flavor, opts),
        &EmuLaunch {
            grid,
            args,
            ..Default::default()
        },
    )
}

/// The block coordinates of linear block `lin`.
pub(crate) fn block_of(grid: [u32; 3], lin: u64) -> [u32; 3] {
    let [gx, gy, _] = grid.map(|g| g as u64);
    [
        (lin % gx) as u32,
        ((lin / gx) % gy) as u32,
        (lin / (gx * gy)) as u32,
    ]
}

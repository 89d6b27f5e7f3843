//! The SIMT emulator's host runtime: the same SIMT LLVM IR the GPU targets get runs
//! on the host, with the GPU's meaning for barriers, warp shuffles and matrix
//! instructions supplied here.
//!
//! - [`team`]: the threads of a block as coroutines; barriers and warp collectives
//!   that report divergence and timeouts instead of hanging;
//! - [`mma`]: the matrix instructions with the vendors' fragment layouts, written
//!   independently of the lowering so a wrong layout computes a wrong product;
//! - [`jit`]: the lowering with the emulator's arch ([`crate::lower::arch::emu`]),
//!   compiled for the host by LLVM's MCJIT, cached in memory;
//! - `stack`: the coroutines' stacks, many to a reserved (not committed) mapping;
//! - `runtime`: the functions the compiled kernels call (thread and block ids,
//!   barriers, shuffles, matrix instructions, bounds checks, race detection);
//! - [`launch`]: runs a kernel over a grid and reports the first error.
//!
//! # Execution model
//!
//! A GPU thread is a stackful coroutine ([`corosensei`], stacks from
//! `host::stack::StackArena`); a block's threads are driven by one OS thread
//! ([`team::Team::step`]): each runs until it parks at a barrier, an unfinished warp
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

pub mod jit;
pub mod mma;
mod puts;
pub(crate) mod runtime;
mod shmem;
pub mod team;
pub mod tma;
pub mod wgmma;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corosensei::{Coroutine, CoroutineResult, Yielder};

use tessera_ir::interp::KernelArg;
use tessera_ir::{Elem, Function, Span};

use crate::host::scalar_slot;
use crate::host::stack::{ArenaStack, StackArena};
use crate::target::EmuFlavor;
use crate::{CodegenError, CompileOptions};
use runtime::{Block, Buf, CommCtx, Launch, ThreadCtx};
use team::{Park, Step, Team};

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

/// Runs `func` on the SIMT emulator: the real lowering for `flavor`, JIT-compiled
/// for the host (cached), over a `grid` of blocks of `opts.num_warps * warp_size`
/// threads, on the buffers and scalars of `args` (as for
/// [`tessera_ir::interp::run`]: one per parameter, in order).
///
/// Blocks run in parallel on a pool of OS threads (see the module docs). Every
/// global access is checked against the buffer it derives from, every shared access is
/// checked for races, and barriers report divergence; no block starts after one has
/// failed, and the first error (lowest block, then thread) is returned. Buffers are
/// written in place.
///
/// A communicating kernel runs as rank 0 of a world of one (use [`launch_in_world`]).
pub fn launch(
    func: &Function,
    flavor: EmuFlavor,
    opts: &CompileOptions,
    grid: [u32; 3],
    args: &[KernelArg],
) -> Result<(), EmuError> {
    launch_in_world(func, flavor, opts, grid, args, None)
}

/// [`launch`] as one rank of a world. Communicating kernels get the hidden
/// parameters of [`crate::comm`] (with `world = None`: rank 0 of 1, with control
/// words of its own); [`KernelArg::Symmetric`] arguments pass this rank's copy and
/// make every rank's copy valid for the bounds checker (named like
/// `data (rank 2's copy)`). Kernels that wait (`wait_until`, `barrier_all`) keep all
/// their blocks live at once, as coroutines (the limit is memory:
/// [`EmuError::OutOfMemory`]). A failing thread sets every rank's
/// `ABORT` word, releasing their waits. A wait that fails leaves its error record in
/// this rank's control words ([`crate::comm::decode_record`]); the launch itself
/// returns `Ok` then.
pub fn launch_in_world(
    func: &Function,
    flavor: EmuFlavor,
    opts: &CompileOptions,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&EmuWorld>,
) -> Result<(), EmuError> {
    launch_limited(func, flavor, opts, grid, args, world, &EmuLimits::default())
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

/// [`launch_in_world`] under `limits`.
pub fn launch_limited(
    func: &Function,
    flavor: EmuFlavor,
    opts: &CompileOptions,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&EmuWorld>,
    limits: &EmuLimits,
) -> Result<(), EmuError> {
    if !opts.num_warps.is_power_of_two() || opts.num_warps > 16 {
        return Err(CodegenError::Options(format!(
            "num_warps must be a power of two from 1 to 16, got {}",
            opts.num_warps
        ))
        .into());
    }
    let arg_err = |param: &str, message: String| EmuError::Args {
        kernel: func.name.clone(),
        span: func.span.clone(),
        param: param.to_string(),
        message,
    };
    if args.len() != func.params.len() {
        return Err(arg_err(
            "<count>",
            format!(
                "expected {} arguments, got {}",
                func.params.len(),
                args.len()
            ),
        ));
    }
    let uses_comm = func.uses_comm();
    // A world of one with its own control words when none is given.
    let own_ctrl = vec![0u64; tessera_ir::interp::ctrl::WORDS + 32];
    let (rank, heap_bases, timeout) = match world {
        Some(w) => (w.rank, w.heap_bases.clone(), w.timeout),
        None => {
            let base = (own_ctrl.as_ptr() as u64).next_multiple_of(256);
            (0, vec![base], tessera_ir::interp::DEFAULT_WAIT_TIMEOUT)
        }
    };
    let engine_ops = world.map_or_else(|| Arc::new(AtomicU64::new(0)), |w| w.engine_ops.clone());
    // The table the kernel gets: off-node peers tagged (see `crate::comm`).
    let table = match world.and_then(|w| w.nodes.as_ref()) {
        Some(nodes) if uses_comm => {
            if nodes.len() != heap_bases.len() {
                return Err(arg_err(
                    "<world>",
                    format!(
                        "{} node entries for {} ranks",
                        nodes.len(),
                        heap_bases.len()
                    ),
                ));
            }
            let mine = nodes.get(rank as usize).copied();
            let split = nodes.iter().any(|&n| Some(n) != mine);
            if split && opts.engine == crate::CommEngine::Direct {
                return Err(arg_err(
                    "<world>",
                    "the ranks are on several nodes, but the kernel was compiled without an off-node engine (CompileOptions::engine)".into(),
                ));
            }
            crate::comm::tagged_bases(&heap_bases, rank as usize, |r| Some(nodes[r]) == mine)
                .ok_or_else(|| {
                    arg_err(
                        "<world>",
                        format!(
                            "a world of {} ranks on several nodes (at most {})",
                            heap_bases.len(),
                            crate::comm::MAX_TAGGED_RANKS
                        ),
                    )
                })?
        }
        _ => heap_bases.clone(),
    };
    if uses_comm && rank as usize >= heap_bases.len() {
        return Err(arg_err(
            "<world>",
            format!(
                "rank {rank} outside a world of {} heap(s)",
                heap_bases.len()
            ),
        ));
    }
    let mut slots = vec![0u64; args.len()];
    let mut buffers = Vec::new();
    for (k, ((p, a), slot)) in func
        .params
        .iter()
        .zip(args)
        .zip(slots.iter_mut())
        .enumerate()
    {
        let param = k as u32;
        match (func.ty(p.value).elem, a) {
            (Elem::Ptr { pointee, .. }, KernelArg::Buffer(b)) => {
                if b.elem() != pointee {
                    return Err(arg_err(
                        &p.name,
                        format!("expected a buffer of {pointee}, got one of {}", b.elem()),
                    ));
                }
                let base = b.as_mut_ptr() as usize;
                *slot = base as u64;
                buffers.push(Buf {
                    base,
                    len_bytes: b.size_bytes(),
                    elem_bytes: pointee.size_bytes(),
                    name: p.name.clone(),
                    param,
                    own: true,
                });
            }
            (Elem::Ptr { pointee, .. }, KernelArg::Symmetric(copies)) => {
                let Some(mine) = copies.get(rank as usize) else {
                    return Err(arg_err(
                        &p.name,
                        format!(
                            "a symmetric buffer of {} copies for rank {rank}",
                            copies.len()
                        ),
                    ));
                };
                if mine.elem() != pointee {
                    return Err(arg_err(
                        &p.name,
                        format!(
                            "expected a symmetric buffer of {pointee}, got one of {}",
                            mine.elem()
                        ),
                    ));
                }
                *slot = mine.as_mut_ptr() as u64;
                for (r, b) in copies.iter().enumerate() {
                    buffers.push(Buf {
                        base: b.as_mut_ptr() as usize,
                        len_bytes: b.size_bytes(),
                        elem_bytes: pointee.size_bytes(),
                        name: if r == rank as usize {
                            p.name.clone()
                        } else {
                            format!("{} (rank {r}'s copy)", p.name)
                        },
                        param,
                        own: r == rank as usize,
                    });
                }
            }
            (Elem::Scalar(t), KernelArg::Scalar(s)) if s.ty() == t => *slot = scalar_slot(*s),
            (e, a) => {
                let got = match a {
                    KernelArg::Buffer(b) => format!("a buffer of {}", b.elem()),
                    KernelArg::Symmetric(_) => "a symmetric buffer".to_string(),
                    KernelArg::Scalar(s) => format!("a scalar {s}"),
                };
                return Err(arg_err(&p.name, format!("expected {e}, got {got}")));
            }
        }
    }
    let table_addr = table.as_ptr() as u64;
    if uses_comm {
        let hidden = crate::comm::HiddenArgs {
            rank,
            world_size: heap_bases.len() as u32,
            heap_bases: table_addr,
            timeout,
        };
        for v in hidden.values() {
            slots.push(match v {
                crate::comm::HiddenValue::U32(x) => x as u64,
                crate::comm::HiddenValue::U64(x) => x,
            });
        }
    }
    let arg_ptrs: Vec<*const u8> = slots.iter().map(|s| s as *const u64 as *const u8).collect();
    let k = jit::compile(func, flavor, opts, limits.dump_llvm)?;
    let total: u64 = grid.iter().map(|&g| g as u64).product();
    if total == 0 {
        return Ok(());
    }
    let threads = k.meta.num_threads;
    let warp = crate::Target::Emu(flavor).warp_size();
    let shared_bytes = k.meta.shared_bytes as usize;
    let concurrent = func.uses_blocking();
    // Threads that never meet (no barrier, shuffle, matrix instruction or shared
    // memory) need no coroutines.
    let independent = !concurrent
        && shared_bytes == 0
        && !k
            .sites
            .iter()
            .any(|s| matches!(s.what, "barrier" | "shuffle" | "mma"));
    let workers = (crate::host::cores() as u64).min(total);
    let live_blocks = if concurrent { total } else { workers };
    // The ranks of a world launch their kernels at the same time (one program, many
    // ranks): a waiting kernel's memory is checked for all of them at once.
    let ranks = if concurrent && uses_comm {
        heap_bases.len() as u64
    } else {
        1
    };
    check_memory(func, ranks, live_blocks, threads, shared_bytes, independent)?;
    // A team barrier must not give up before the waits do.
    let mut team_timeout = limits.barrier_timeout.unwrap_or(DEFAULT_BARRIER_TIMEOUT);
    if uses_comm {
        team_timeout = team_timeout.max(timeout.saturating_add(Duration::from_secs(10)));
    }
    let launch = Launch {
        kernel: &func.name,
        kernel_span: &func.span,
        sites: &k.sites,
        grid,
        buffers,
        comm: uses_comm.then(|| CommCtx {
            rank,
            heap_bases: heap_bases.clone(),
            engine_ops: engine_ops.clone(),
        }),
        errors: Mutex::new(Vec::new()),
        failed: AtomicBool::new(false),
        watchdog: limits.timeout.map(|t| (std::time::Instant::now() + t, t)),
        expired: AtomicBool::new(false),
    };
    let job = Job {
        launch: &launch,
        entry: k.entry,
        args: arg_ptrs.as_ptr() as usize,
        threads,
        warp,
        shared_bytes,
        total,
        workers,
        next: AtomicU64::new(0),
        team_timeout,
        frame_bytes: k.frame_bytes,
    };
    // Every worker's stacks are reserved before any block runs (a resident block may
    // wait for another worker's), and the workers start together once all exist.
    let arenas = (0..workers)
        .map(|w| match (independent, concurrent) {
            (true, _) => Ok(None),
            (false, false) => job.arena(threads as usize).map(Some),
            (false, true) => job
                .arena(threads as usize * job.owned(w as usize).len())
                .map(Some),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let start = (Mutex::new(None::<bool>), std::sync::Condvar::new());
    let outcome = std::thread::scope(|s| {
        let mut handles = Vec::new();
        let mut spawn_error = None;
        for (w, arena) in arenas.iter().enumerate() {
            let (job, start) = (&job, &start);
            let spawned = std::thread::Builder::new()
                .name(format!("emu-worker-{w}"))
                .stack_size(8 << 20)
                .spawn_scoped(s, move || {
                    let mut go = start.0.lock().unwrap_or_else(|p| p.into_inner());
                    while go.is_none() {
                        go = start.1.wait(go).unwrap_or_else(|p| p.into_inner());
                    }
                    if *go != Some(true) {
                        return Ok(());
                    }
                    drop(go);
                    match arena {
                        None => {
                            job.run_independent();
                            Ok(())
                        }
                        Some(a) if concurrent => job.run_resident(w as u64, a),
                        Some(a) => job.run_blocks(a),
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    spawn_error = Some(e.to_string());
                    break;
                }
            }
        }
        *start.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(spawn_error.is_none());
        start.1.notify_all();
        if let Some(message) = spawn_error {
            return Err(EmuError::Threads { message });
        }
        let mut first = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|_| {
                Err(EmuError::Threads {
                    message: "an emulator worker panicked".into(),
                })
            });
            if first.is_ok() {
                first = r;
            }
        }
        first
    });
    outcome?;
    let comm = launch.comm.as_ref().map(|c| c.heap_bases[c.rank as usize]);
    first_error(launch)?;
    match comm {
        Some(base) => take_record(func, rank, base, timeout),
        None => Ok(()),
    }
}

/// Resident memory a coroutine's stack is expected to touch (a kernel frame and the
/// runtime calls it makes; see BENCHMARKS.md for measured depths).
const STACK_RESIDENT_ESTIMATE: u64 = 16 << 10;

/// Checks that `ranks` x `blocks` live blocks of `threads` threads with `shared`
/// bytes of shared memory each fit in the memory the machine has available.
fn check_memory(
    func: &Function,
    ranks: u64,
    blocks: u64,
    threads: u32,
    shared: usize,
    independent: bool,
) -> Result<(), EmuError> {
    let coroutines = if independent {
        0
    } else {
        blocks * threads as u64
    };
    // Shared memory and its two race-detection shadow words per byte, the team's
    // exchange slots, a context and a stack per thread.
    let per_block = shared as u64 * 17 + threads as u64 * (2 * team::SLOT_WORDS as u64 * 8 + 256);
    let needed = blocks
        .saturating_mul(per_block)
        .saturating_add(coroutines.saturating_mul(STACK_RESIDENT_ESTIMATE))
        .saturating_mul(ranks);
    let Some(avail) = available_memory() else {
        return Ok(());
    };
    if needed <= avail {
        return Ok(());
    }
    Err(EmuError::OutOfMemory {
        kernel: func.name.clone(),
        span: func.span.clone(),
        ranks,
        blocks,
        threads,
        needed_mib: needed >> 20,
        what: format!(
            "{shared} B of shared memory per block with its race shadow, {} KiB of stack per thread",
            STACK_RESIDENT_ESTIMATE >> 10
        ),
        available: format!(
            "{} MiB are available (use a smaller grid or fewer warps)",
            avail >> 20
        ),
    })
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (`None` where it cannot be read).
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One launch as the workers see it.
struct Job<'a> {
    launch: &'a Launch<'a>,
    entry: unsafe extern "C" fn(*const *const u8),
    /// The argument pointer array (as an address: shared by the workers).
    args: usize,
    threads: u32,
    warp: u32,
    shared_bytes: usize,
    total: u64,
    workers: u64,
    /// The next block to take (sequential launches).
    next: AtomicU64,
    team_timeout: Duration,
    /// The kernel's largest stack frame (sizes the threads' stacks).
    frame_bytes: u64,
}

/// How long a block has polled without progress ([`Team::progress`]).
#[derive(Default)]
struct PollClock {
    progress: u64,
    since: Option<Instant>,
}

impl PollClock {
    /// After a step that ended with threads that yielded: true when the block made
    /// progress (or computes) since the last check. Times the team out when threads
    /// have waited at a barrier for `timeout` without progress (the emulator's
    /// barrier timeout, `$TESSERA_EMU_TIMEOUT_MS`); a block where nobody waits is
    /// never timed out here.
    fn check(&mut self, team: &Team, timeout: Duration) -> bool {
        let p = team.progress();
        let waiting = team.waiting().is_some();
        if p != self.progress || self.since.is_none() || !waiting {
            let moved = p != self.progress || team.computing();
            self.progress = p;
            self.since = Some(Instant::now());
            return moved;
        }
        if self.since.is_some_and(|t| t.elapsed() > timeout) && !team.cancelled() {
            team.time_out();
            self.since = None;
        }
        team.computing()
    }
}

/// A GPU thread as a coroutine on an arena stack.
type Thread<'s> = Coroutine<(), Park, (), ArenaStack<'s>>;

impl Job<'_> {
    /// The next block for a worker of a sequential launch: none once the launch has
    /// failed (blocks taken before still finish, so the lowest failing block is the
    /// one reported).
    fn take(&self) -> Option<u64> {
        if self.launch.failed.load(Ordering::Acquire) {
            return None;
        }
        let lin = self.next.fetch_add(1, Ordering::AcqRel);
        (lin < self.total).then_some(lin)
    }

    fn arena(&self, count: usize) -> Result<StackArena, EmuError> {
        StackArena::new(count, self.frame_bytes).map_err(|e| EmuError::OutOfMemory {
            kernel: self.launch.kernel.to_string(),
            span: self.launch.kernel_span.clone(),
            ranks: 1,
            blocks: (count / self.threads.max(1) as usize) as u64,
            threads: self.threads,
            needed_mib: (e.bytes >> 20) as u64,
            what: format!("{count} coroutine stacks reserved"),
            available: format!("the reservation failed: {}", e.message),
        })
    }

    /// Every thread of the blocks this worker takes, one after another (threads that
    /// never meet: any order is a valid schedule).
    fn run_independent(&self) {
        let blk = Block::new(Team::new(self.threads, self.warp), 0);
        while let Some(lin) = self.take() {
            for tid in 0..self.threads {
                let ctx = ThreadCtx::new(tid, self.launch, &blk, lin);
                let _guard = runtime::enter(&ctx);
                // SAFETY: `entry` is the JIT-compiled wrapper of this launch's kernel
                // and `args` holds one pointer per kernel parameter to a value of its
                // type, alive for the launch; buffer pointers cover their buffers, and
                // the runtime checks every global access against them. The kernel
                // calls no collective, so running its threads one after another is a
                // valid schedule.
                unsafe { (self.entry)(self.args as *const *const u8) };
            }
        }
    }

    /// The coroutine of thread `ctx` on `stack`.
    fn spawn<'s>(&self, ctx: &ThreadCtx<'_>, stack: ArenaStack<'s>) -> Thread<'s> {
        let (entry, args) = (self.entry, self.args);
        let ctx = ctx as *const ThreadCtx<'_> as usize;
        let body = move |y: &Yielder<(), Park>, ()| {
            // SAFETY: the context outlives the coroutine: the worker keeps it until
            // the coroutine has finished (every coroutine is driven to its end).
            let ctx = unsafe { &*(ctx as *const ThreadCtx<'_>) };
            ctx.yielder.set(y as *const Yielder<(), Park>);
            // SAFETY: as in `run_independent`; the kernel's collectives park the
            // coroutine through `ctx.yielder` and resume when the team releases them.
            unsafe { entry(args as *const *const u8) };
            ctx.yielder.set(std::ptr::null());
        };
        // SAFETY: the closure borrows nothing (it holds addresses); what they point to
        // (the context, the arguments, the launch) outlives the coroutine, which the
        // worker drives to completion before any of it goes.
        unsafe { Coroutine::with_stack_unchecked(stack, body) }
    }

    /// Resumes thread `tid` of a block (its context made current); `None` when it
    /// ended. Aborts the process if the thread overflowed its stack.
    fn resume(
        &self,
        threads: &mut [Option<Thread<'_>>],
        ctxs: &[ThreadCtx<'_>],
        arena: &StackArena,
        first_stack: usize,
        tid: u32,
    ) -> Option<Park> {
        let t = tid as usize;
        runtime::switch_to(&ctxs[t]);
        let cancelled = self.team_cancelled(ctxs);
        let co = threads[t].as_mut()?;
        let r = co.resume(());
        if !arena.intact(first_stack + t) {
            eprintln!(
                "tessera emulator: thread {tid} of kernel `{}` overflowed its {} KiB stack; aborting",
                self.launch.kernel,
                arena.bytes >> 10
            );
            std::process::abort();
        }
        match r {
            CoroutineResult::Yield(Park::Poll | Park::Yield) if cancelled => {
                // The team timed out and this thread still loops: end it.
                // SAFETY: the coroutine is suspended in `tessera_emu_timer_ns` or
                // `tessera_emu_yield`, called from JIT-compiled kernel code: those
                // frames hold only plain values and references (nothing to drop), and
                // no other code refers to the coroutine's stack; the stack returns to
                // the arena when the coroutine is dropped.
                unsafe { co.force_reset() };
                threads[t] = None;
                None
            }
            CoroutineResult::Yield(p) => Some(p),
            CoroutineResult::Return(()) => {
                threads[t] = None;
                None
            }
        }
    }

    /// Whether the team of the block `ctxs` belong to timed out.
    fn team_cancelled(&self, ctxs: &[ThreadCtx<'_>]) -> bool {
        ctxs.first().is_some_and(|c| c.blk.team.cancelled())
    }

    /// Records the team's own error (divergence, timeout) for its block.
    fn record_team(&self, blk: &Block, ctx: &ThreadCtx<'_>) {
        if let Some((tid, e)) = blk.team.take_error() {
            let e = self
                .launch
                .team_error(e, ctx.block.get(), blk.team.threads());
            self.launch.record(ctx.block_lin.get(), tid, e);
        }
    }

    /// The blocks worker `w` owns in a launch of a waiting kernel.
    fn owned(&self, w: usize) -> Vec<u64> {
        (w as u64..self.total)
            .step_by(self.workers as usize)
            .collect()
    }

    /// Sequential launches: this worker takes blocks one at a time and runs each
    /// block's threads as coroutines (on `arena`'s stacks) to the end.
    fn run_blocks(&self, arena: &StackArena) -> Result<(), EmuError> {
        let blk = Block::new(Team::new(self.threads, self.warp), self.shared_bytes);
        while let Some(lin) = self.take() {
            blk.team.reset();
            blk.clear_shadow();
            let ctxs: Vec<ThreadCtx<'_>> = (0..self.threads)
                .map(|tid| ThreadCtx::new(tid, self.launch, &blk, lin))
                .collect();
            let mut threads: Vec<Option<Thread<'_>>> = ctxs
                .iter()
                .enumerate()
                // SAFETY: stack `i` for thread `i`; the previous block's coroutines
                // on these stacks have all been dropped (the last iteration's vector).
                .map(|(i, c)| Some(self.spawn(c, unsafe { arena.stack(i) })))
                .collect();
            let _guard = runtime::enter(&ctxs[0]);
            let mut poll = PollClock::default();
            while blk
                .team
                .step(|tid| self.resume(&mut threads, &ctxs, arena, 0, tid))
                == Step::Yielded
            {
                // A kernel that polls without waiting for anyone else (only
                // blocking kernels wait): bounded like a barrier.
                poll.check(&blk.team, self.team_timeout);
            }
            self.record_team(&blk, &ctxs[0]);
        }
        Ok(())
    }

    /// Waiting kernels: every block live at once; worker `w` owns blocks `w, w + W,
    /// ...` and steps them round robin until all have ended.
    fn run_resident(&self, w: u64, arena: &StackArena) -> Result<(), EmuError> {
        let mine = self.owned(w as usize);
        let n = self.threads as usize;
        let blocks: Vec<Block> = mine
            .iter()
            .map(|_| Block::new(Team::new(self.threads, self.warp), self.shared_bytes))
            .collect();
        let ctxs: Vec<Vec<ThreadCtx<'_>>> = mine
            .iter()
            .zip(&blocks)
            .map(|(&lin, blk)| {
                (0..self.threads)
                    .map(|tid| ThreadCtx::new(tid, self.launch, blk, lin))
                    .collect()
            })
            .collect();
        let mut threads: Vec<Vec<Option<Thread<'_>>>> = ctxs
            .iter()
            .enumerate()
            .map(|(b, cs)| {
                cs.iter()
                    .enumerate()
                    // SAFETY: stack `b * n + i` for thread `i` of local block `b`:
                    // each once.
                    .map(|(i, c)| Some(self.spawn(c, unsafe { arena.stack(b * n + i) })))
                    .collect()
            })
            .collect();
        let Some(first) = ctxs.first().and_then(|c| c.first()) else {
            return Ok(());
        };
        let _guard = runtime::enter(first);
        let mut done = vec![false; mine.len()];
        let mut poll: Vec<PollClock> = mine.iter().map(|_| PollClock::default()).collect();
        let mut idle_rounds = 0u32;
        while done.iter().any(|d| !d) {
            let mut progressed = false;
            for b in 0..mine.len() {
                if done[b] {
                    continue;
                }
                let blk = &blocks[b];
                let step = blk
                    .team
                    .step(|tid| self.resume(&mut threads[b], &ctxs[b], arena, b * n, tid));
                match step {
                    Step::Done => {
                        done[b] = true;
                        progressed = true;
                        self.record_team(blk, &ctxs[b][0]);
                    }
                    Step::Yielded => {
                        progressed |= poll[b].check(&blk.team, self.team_timeout);
                        self.record_team(blk, &ctxs[b][0]);
                    }
                }
            }
            // Every live block only polled: the threads they wait for belong to other
            // workers or ranks. Back off a little (more the longer nothing moves).
            if progressed {
                idle_rounds = 0;
            } else {
                idle_rounds = idle_rounds.saturating_add(1);
                if idle_rounds > 4 {
                    std::thread::sleep(Duration::from_micros(
                        (5u64 << (idle_rounds - 4).min(5)).min(100),
                    ));
                } else {
                    std::thread::yield_now();
                }
            }
        }
        Ok(())
    }
}

/// Reads (and clears) the error record in the control words of the heap at `base`.
fn take_record(func: &Function, rank: u32, base: u64, timeout: Duration) -> Result<(), EmuError> {
    let n = crate::comm::ERR_PROGRAM + 1;
    // SAFETY: the heap starts with its control words (`EmuWorld`'s contract), and the
    // launch is over: nothing else of this rank writes them now.
    let words: Vec<u64> = (0..n)
        .map(|w| unsafe { &*((base as usize + 8 * w) as *const AtomicU64) }.load(Ordering::Acquire))
        .collect();
    let fault = crate::comm::decode_record(func, rank, &words, timeout);
    if fault.is_some() {
        // SAFETY: as above.
        unsafe { &*((base as usize + 8 * crate::comm::ERR_SITE) as *const AtomicU64) }
            .store(0, Ordering::Release);
    }
    fault.map_or(Ok(()), |f| Err(EmuError::Comm(Box::new(f))))
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

/// The recorded error of the lowest (block, thread), if any.
fn first_error(launch: Launch<'_>) -> Result<(), EmuError> {
    let mut errs = launch
        .errors
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    // A watchdog stop is the cause of whatever the stopped loops did next.
    let stop = errs
        .iter()
        .position(|e| matches!(e.2, EmuError::LaunchTimeout { .. }));
    match stop {
        Some(i) => Err(errs.swap_remove(i).2),
        None => match errs.into_iter().min_by_key(|e| (e.0, e.1)) {
            Some((_, _, e)) => Err(e),
            None => Ok(()),
        },
    }
}

//! The SIMT emulator's host runtime: the same SIMT LLVM IR the GPU targets get runs
//! on the host, with the GPU's meaning for barriers, warp shuffles and matrix
//! instructions supplied here.
//!
//! - [`team`]: the threads of a block as OS threads; barriers and warp collectives
//!   that report divergence and timeouts instead of hanging;
//! - [`mma`]: the matrix instructions with the vendors' fragment layouts, written
//!   independently of the lowering so a wrong layout computes a wrong product;
//! - [`jit`]: the lowering with the emulator's arch ([`crate::lower::emu_arch`]),
//!   compiled for the host by LLVM's MCJIT, cached in memory;
//! - `runtime`: the functions the compiled kernels call (thread and block ids,
//!   barriers, shuffles, matrix instructions, bounds checks, race detection);
//! - [`launch`]: runs a kernel over a grid and reports the first error.
//!
//! # Execution model
//!
//! One launch runs a team of `num_warps * warp_size` OS threads (warp 32 for
//! [`EmuFlavor::Nv`], 64 for [`EmuFlavor::Amd`]). Blocks run one after another: every
//! thread calls the kernel for block 0, leaves the team (a barrier some threads never
//! reach is reported, not hung), meets the others at a block-end barrier, and goes on
//! with block 1. Per-thread state (thread id, block, shared-memory base, error sink)
//! lives in a thread-local. Shared memory is one host buffer per launch, reused by
//! each block in turn.
//!
//! Kernels that wait for other blocks or ranks (`wait_until`, `barrier_all`:
//! [`Function::uses_blocking`]) would deadlock that way, so their blocks all run at
//! once, each on its own team with its own shared memory ([`launch_in_world`]).
//! Communicating kernels take the hidden parameters of [`crate::comm`]; the heaps
//! are host memory, so remote accesses are plain host accesses, checked against
//! every rank's copy of the symmetric buffers.
//!
//! Checks: every global access is bounds-checked against the launch's buffers (an
//! access outside all of them is reported with the op's `file:line:col`, block,
//! thread and the element index relative to the nearest buffer, and redirected to a
//! per-thread scratch area so it does no harm); shared-memory accesses are checked for
//! races between barriers; barriers report divergence and time out
//! (`$TESSERA_EMU_TIMEOUT_MS`, default 60 s).

pub mod jit;
pub mod mma;
pub(crate) mod runtime;
pub mod team;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Condvar, Mutex};
use std::time::Duration;

use tessera_ir::interp::{KernelArg, Scalar};
use tessera_ir::{Elem, Function, Span};

use crate::target::EmuFlavor;
use crate::{CodegenError, CompileOptions};
use runtime::{Block, Buf, CommCtx, Launch, ThreadCtx};
use team::Team;

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
    /// The team's OS threads could not be created.
    #[error("the emulator could not start its threads: {message}")]
    Threads {
        /// The OS's message.
        message: String,
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
    /// A memory access outside every buffer of the launch.
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
        /// The buffer nearest to the address (its parameter name).
        buffer: String,
        /// The element index relative to that buffer.
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
    /// A kernel that waits (`wait_until`, `barrier_all`) needs all its blocks running
    /// at once, one OS thread per GPU thread: this grid is too large for that.
    #[error(
        "{span}: kernel `{kernel}` waits for other blocks or ranks, so the emulator runs its {blocks} block(s) x {threads} threads at once; the limit is {max_blocks} blocks and {max_threads} threads (use a smaller grid or fewer warps)"
    )]
    TooManyBlocks {
        /// The kernel.
        kernel: String,
        /// Where it is defined.
        span: Span,
        /// Blocks in the grid.
        blocks: u64,
        /// Threads per block.
        threads: u32,
        /// The most blocks.
        max_blocks: u64,
        /// The most threads in all.
        max_threads: u64,
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

/// How long a barrier may wait before the launch fails with [`EmuError::Timeout`]:
/// `$TESSERA_EMU_TIMEOUT_MS`, else 60 s.
fn barrier_timeout() -> Duration {
    let ms = std::env::var("TESSERA_EMU_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60_000);
    Duration::from_millis(ms)
}

/// A scalar's bytes in a zero-padded 8-byte slot (`i1` is one byte).
fn scalar_slot(s: Scalar) -> u64 {
    match s {
        Scalar::I1(x) => x as u64,
        Scalar::I8(x) => x as u8 as u64,
        Scalar::I16(x) => x as u16 as u64,
        Scalar::I32(x) => x as u32 as u64,
        Scalar::I64(x) => x as u64,
        Scalar::U8(x) => x as u64,
        Scalar::U16(x) => x as u64,
        Scalar::U32(x) => x as u64,
        Scalar::U64(x) => x,
        Scalar::F16(x) => x.to_bits() as u64,
        Scalar::BF16(x) => x.to_bits() as u64,
        Scalar::F32(x) => x.to_bits() as u64,
        Scalar::F64(x) => x.to_bits(),
    }
}

/// The world a communicating kernel runs in on the emulator: this rank and every
/// rank's symmetric heap (host memory of this process, laid out as described in
/// [`crate::comm`]: control words first).
#[derive(Clone, Debug)]
pub struct EmuWorld {
    /// This rank, `0..heap_bases.len()`.
    pub rank: u32,
    /// Every rank's heap base address (at least [`crate::comm::HEAP_ALIGN`]-aligned;
    /// each heap starts with [`tessera_ir::interp::ctrl::WORDS`] control words). The
    /// heaps must stay alive and writable for the launch.
    pub heap_bases: Vec<u64>,
    /// How long a wait polls before failing.
    pub timeout: Duration,
}

/// The most blocks of a waiting kernel the emulator runs at once (as the
/// interpreter's limit on resident program instances).
pub const MAX_RESIDENT_BLOCKS: u64 = 1024;
/// The most OS threads (blocks x threads per block) of one launch of a waiting kernel.
pub const MAX_RESIDENT_THREADS: u64 = 8192;

/// Runs `func` on the SIMT emulator: the real lowering for `flavor`, JIT-compiled
/// for the host (cached), over a `grid` of blocks of `opts.num_warps * warp_size`
/// OS threads, on the buffers and scalars of `args` (as for
/// [`tessera_ir::interp::run`]: one per parameter, in order).
///
/// Blocks run one after another on one team of threads. Every global access is
/// checked against the launch's buffers, every shared access is checked for races,
/// and barriers report divergence; the first error (lowest block, then thread) is
/// returned after the failing block finishes. Buffers are written in place.
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
/// `data (rank 2's copy)`). Kernels that wait (`wait_until`, `barrier_all`) run all
/// their blocks at once, each on its own team (at most [`MAX_RESIDENT_BLOCKS`]
/// blocks and [`MAX_RESIDENT_THREADS`] threads). A failing thread sets every rank's
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
            (0, vec![base], tessera_ir::interp::default_wait_timeout())
        }
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
    for ((p, a), slot) in func.params.iter().zip(args).zip(slots.iter_mut()) {
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
    let table_addr = heap_bases.as_ptr() as u64;
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
    let k = jit::compile(func, flavor, opts)?;
    let total: u64 = grid.iter().map(|&g| g as u64).product();
    if total == 0 {
        return Ok(());
    }
    let threads = k.meta.num_threads;
    let warp = crate::Target::Emu(flavor).warp_size();
    let shared_bytes = k.meta.shared_bytes as usize;
    let concurrent = func.uses_blocking();
    if concurrent && (total > MAX_RESIDENT_BLOCKS || total * threads as u64 > MAX_RESIDENT_THREADS)
    {
        return Err(EmuError::TooManyBlocks {
            kernel: func.name.clone(),
            span: func.span.clone(),
            blocks: total,
            threads,
            max_blocks: MAX_RESIDENT_BLOCKS,
            max_threads: MAX_RESIDENT_THREADS,
        });
    }
    // A team barrier must not give up before the waits do.
    let mut team_timeout = barrier_timeout();
    if uses_comm {
        team_timeout = team_timeout.max(timeout.saturating_add(Duration::from_secs(10)));
    }
    let nblocks = if concurrent { total as usize } else { 1 };
    let launch = Launch {
        kernel: &func.name,
        kernel_span: &func.span,
        sites: &k.sites,
        grid,
        buffers,
        blocks: (0..nblocks)
            .map(|_| Block::new(Team::new(threads, warp, team_timeout), shared_bytes))
            .collect(),
        comm: uses_comm.then(|| CommCtx {
            rank,
            heap_bases: heap_bases.clone(),
        }),
        errors: Mutex::new(Vec::new()),
        failed: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    };
    // Threads that never meet (no barrier, shuffle, matrix instruction or shared
    // memory) need no team: a few workers run the (block, thread) pairs one by one.
    let independent = shared_bytes == 0
        && !k
            .sites
            .iter()
            .any(|s| matches!(s.what, "barrier" | "shuffle" | "mma"));
    if independent && !concurrent {
        let workers = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1)
            .min(total);
        let spawn_error = std::thread::scope(|s| {
            let mut spawn_error = None;
            for w in 0..workers {
                let launch = &launch;
                let entry = k.entry;
                let arg_addr = arg_ptrs.as_ptr() as usize;
                let spawned = std::thread::Builder::new()
                    .name(format!("emu-worker-{w}"))
                    .stack_size(8 << 20)
                    .spawn_scoped(s, move || {
                        run_independent(w, workers, threads, launch, entry, arg_addr, total)
                    });
                if let Err(e) = spawned {
                    spawn_error = Some(e.to_string());
                    launch.stop.store(true, Ordering::Release);
                    break;
                }
            }
            spawn_error
        });
        if let Some(message) = spawn_error {
            return Err(EmuError::Threads { message });
        }
        return first_error(launch);
    }
    let sync = Barrier::new(threads as usize);
    // Threads start once all of them exist (`Some(true)`), or go home (`Some(false)`).
    let start = (Mutex::new(None::<bool>), Condvar::new());
    let entry = k.entry;
    let arg_addr = arg_ptrs.as_ptr() as usize;
    let spawn_error = std::thread::scope(|s| {
        let mut spawn_error = None;
        'spawn: for b in 0..nblocks as u64 {
            for tid in 0..threads {
                let (launch, sync, start) = (&launch, &sync, &start);
                let name = if concurrent {
                    format!("emu-{b}-{tid}")
                } else {
                    format!("emu-{tid}")
                };
                // Waiting kernels run many threads at once: smaller stacks.
                let stack = if concurrent { 2 << 20 } else { 8 << 20 };
                let spawned = std::thread::Builder::new()
                    .name(name)
                    .stack_size(stack)
                    .spawn_scoped(s, move || {
                        let mut go = start.0.lock().unwrap_or_else(|p| p.into_inner());
                        while go.is_none() {
                            go = start.1.wait(go).unwrap_or_else(|p| p.into_inner());
                        }
                        if *go == Some(true) {
                            drop(go);
                            if concurrent {
                                run_block(b, tid, launch, entry, arg_addr);
                            } else {
                                run_thread(tid, launch, sync, entry, arg_addr, total);
                            }
                        }
                    });
                if let Err(e) = spawned {
                    spawn_error = Some(e.to_string());
                    break 'spawn;
                }
            }
        }
        *start.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(spawn_error.is_none());
        start.1.notify_all();
        spawn_error
    });
    if let Some(message) = spawn_error {
        return Err(EmuError::Threads { message });
    }
    let comm = launch.comm.as_ref().map(|c| c.heap_bases[c.rank as usize]);
    first_error(launch)?;
    match comm {
        Some(base) => take_record(func, rank, base, timeout),
        None => Ok(()),
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
fn block_of(grid: [u32; 3], lin: u64) -> [u32; 3] {
    let [gx, gy, _] = grid.map(|g| g as u64);
    [
        (lin % gx) as u32,
        ((lin / gx) % gy) as u32,
        (lin / (gx * gy)) as u32,
    ]
}

/// Thread `tid` of block `lin`, on that block's own team (all blocks run at once).
fn run_block(
    lin: u64,
    tid: u32,
    launch: &Launch<'_>,
    entry: unsafe extern "C" fn(*const *const u8),
    args: usize,
) {
    let blk = &launch.blocks[lin as usize];
    let ctx = ThreadCtx {
        tid,
        launch,
        blk,
        block: std::cell::Cell::new(block_of(launch.grid, lin)),
        block_lin: std::cell::Cell::new(lin),
        epoch: std::cell::Cell::new(0),
        scratch: std::cell::UnsafeCell::new(runtime::Scratch([0; 64])),
    };
    let _guard = runtime::enter(&ctx);
    // SAFETY: as in `run_thread`.
    unsafe { entry(args as *const *const u8) };
    if let Err(e) = blk.team.exit(tid) {
        let e = launch.team_error(e, ctx.block.get(), blk.team.threads());
        launch.record(lin, tid, e);
    }
}

/// The recorded error of the lowest (block, thread), if any.
fn first_error(launch: Launch<'_>) -> Result<(), EmuError> {
    let errs = launch
        .errors
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    match errs.into_iter().min_by_key(|e| (e.0, e.1)) {
        Some((_, _, e)) => Err(e),
        None => Ok(()),
    }
}

/// Worker `w` of `workers` runs every thread of blocks `w, w + workers, ...` in turn
/// (for kernels whose threads never interact).
fn run_independent(
    w: u64,
    workers: u64,
    threads: u32,
    launch: &Launch<'_>,
    entry: unsafe extern "C" fn(*const *const u8),
    args: usize,
    total: u64,
) {
    let mut lin = w;
    while lin < total && !launch.stop.load(Ordering::Relaxed) {
        let block = block_of(launch.grid, lin);
        for tid in 0..threads {
            let ctx = ThreadCtx {
                tid,
                launch,
                blk: &launch.blocks[0],
                block: std::cell::Cell::new(block),
                block_lin: std::cell::Cell::new(lin),
                epoch: std::cell::Cell::new(0),
                scratch: std::cell::UnsafeCell::new(runtime::Scratch([0; 64])),
            };
            let _guard = runtime::enter(&ctx);
            // SAFETY: as in `run_thread`; the kernel calls no collective, so running
            // its threads one after another is a valid schedule.
            unsafe { entry(args as *const *const u8) };
        }
        if launch.failed.load(Ordering::Acquire) {
            // Blocks below this one still run (the lowest failing block is reported).
            launch.stop.store(true, Ordering::Release);
        }
        lin += workers;
    }
}

fn run_thread(
    tid: u32,
    launch: &Launch<'_>,
    sync: &Barrier,
    entry: unsafe extern "C" fn(*const *const u8),
    args: usize,
    total: u64,
) {
    let blk = &launch.blocks[0];
    let ctx = ThreadCtx {
        tid,
        launch,
        blk,
        block: std::cell::Cell::new([0; 3]),
        block_lin: std::cell::Cell::new(0),
        epoch: std::cell::Cell::new(0),
        scratch: std::cell::UnsafeCell::new(runtime::Scratch([0; 64])),
    };
    let _guard = runtime::enter(&ctx);
    for lin in 0..total {
        ctx.block.set(block_of(launch.grid, lin));
        ctx.block_lin.set(lin);
        ctx.epoch.set(0);
        // SAFETY: `entry` is the JIT-compiled wrapper of this launch's kernel and
        // `args` holds one pointer per kernel parameter to a value of its type, alive
        // for the launch; buffer pointers cover their buffers, and the runtime checks
        // every global access against them.
        unsafe { entry(args as *const *const u8) };
        if let Err(e) = blk.team.exit(tid) {
            let e = launch.team_error(e, ctx.block.get(), blk.team.threads());
            launch.record(lin, tid, e);
        }
        sync.wait();
        // Every thread has finished the block: decide (once) whether to go on. The
        // decision is read after the second barrier, before anyone can fail again.
        if tid == 0 {
            blk.team.reset();
            blk.clear_shadow();
            let failed = launch.failed.load(Ordering::Acquire);
            launch.stop.store(failed, Ordering::Release);
        }
        sync.wait();
        if launch.stop.load(Ordering::Acquire) {
            break;
        }
    }
}

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
use runtime::{Buf, Launch, ThreadCtx};
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

/// Runs `func` on the SIMT emulator: the real lowering for `flavor`, JIT-compiled
/// for the host (cached), over a `grid` of blocks of `opts.num_warps * warp_size`
/// OS threads, on the buffers and scalars of `args` (as for
/// [`tessera_ir::interp::run`]: one per parameter, in order).
///
/// Blocks run one after another on one team of threads. Every global access is
/// checked against the launch's buffers, every shared access is checked for races,
/// and barriers report divergence; the first error (lowest block, then thread) is
/// returned after the failing block finishes. Buffers are written in place.
pub fn launch(
    func: &Function,
    flavor: EmuFlavor,
    opts: &CompileOptions,
    grid: [u32; 3],
    args: &[KernelArg],
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
    let arg_ptrs: Vec<*const u8> = slots.iter().map(|s| s as *const u64 as *const u8).collect();
    let k = jit::compile(func, flavor, opts)?;
    let total: u64 = grid.iter().map(|&g| g as u64).product();
    if total == 0 {
        return Ok(());
    }
    let threads = k.meta.num_threads;
    let warp = crate::Target::Emu(flavor).warp_size();
    let shared_bytes = k.meta.shared_bytes as usize;
    let mut shared = vec![0u128; shared_bytes.div_ceil(16).max(1)];
    let launch = Launch {
        kernel: &func.name,
        kernel_span: &func.span,
        sites: &k.sites,
        grid,
        buffers,
        team: Team::new(threads, warp, barrier_timeout()),
        shared: shared.as_mut_ptr() as *mut u8,
        shared_bytes,
        shadow_write: (0..shared_bytes).map(|_| AtomicU64::new(0)).collect(),
        shadow_read: (0..shared_bytes).map(|_| AtomicU64::new(0)).collect(),
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
    if independent {
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
        for tid in 0..threads {
            let (launch, sync, start) = (&launch, &sync, &start);
            let spawned = std::thread::Builder::new()
                .name(format!("emu-{tid}"))
                .stack_size(8 << 20)
                .spawn_scoped(s, move || {
                    let mut go = start.0.lock().unwrap_or_else(|p| p.into_inner());
                    while go.is_none() {
                        go = start.1.wait(go).unwrap_or_else(|p| p.into_inner());
                    }
                    if *go == Some(true) {
                        drop(go);
                        run_thread(tid, launch, sync, entry, arg_addr, total);
                    }
                });
            if let Err(e) = spawned {
                spawn_error = Some(e.to_string());
                break;
            }
        }
        *start.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(spawn_error.is_none());
        start.1.notify_all();
        spawn_error
    });
    drop(shared);
    if let Some(message) = spawn_error {
        return Err(EmuError::Threads { message });
    }
    first_error(launch)
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
    let [gx, gy, _] = launch.grid.map(|g| g as u64);
    let mut lin = w;
    while lin < total && !launch.stop.load(Ordering::Relaxed) {
        let block = [
            (lin % gx) as u32,
            ((lin / gx) % gy) as u32,
            (lin / (gx * gy)) as u32,
        ];
        for tid in 0..threads {
            let ctx = ThreadCtx {
                tid,
                launch,
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
    let ctx = ThreadCtx {
        tid,
        launch,
        block: std::cell::Cell::new([0; 3]),
        block_lin: std::cell::Cell::new(0),
        epoch: std::cell::Cell::new(0),
        scratch: std::cell::UnsafeCell::new(runtime::Scratch([0; 64])),
    };
    let _guard = runtime::enter(&ctx);
    let [gx, gy, _] = launch.grid.map(|g| g as u64);
    for lin in 0..total {
        ctx.block.set([
            (lin % gx) as u32,
            ((lin / gx) % gy) as u32,
            (lin / (gx * gy)) as u32,
        ]);
        ctx.block_lin.set(lin);
        ctx.epoch.set(0);
        // SAFETY: `entry` is the JIT-compiled wrapper of this launch's kernel and
        // `args` holds one pointer per kernel parameter to a value of its type, alive
        // for the launch; buffer pointers cover their buffers, and the runtime checks
        // every global access against them.
        unsafe { entry(args as *const *const u8) };
        if let Err(e) = launch.team.exit(tid) {
            let e = launch.team_error(e, ctx.block.get());
            launch.record(lin, tid, e);
        }
        sync.wait();
        // Every thread has finished the block: decide (once) whether to go on. The
        // decision is read after the second barrier, before anyone can fail again.
        if tid == 0 {
            launch.team.reset();
            launch.clear_shadow();
            let failed = launch.failed.load(Ordering::Acquire);
            launch.stop.store(failed, Ordering::Release);
        }
        sync.wait();
        if launch.stop.load(Ordering::Acquire) {
            break;
        }
    }
}

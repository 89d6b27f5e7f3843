//! Running a kernel over its grid: the launch's argument slots (buffers, scalars,
//! a communicating kernel's hidden parameters), the JIT-compiled kernel, the memory
//! check, and the workers that take its blocks (threads as plain calls, as
//! coroutines block by block, or every block resident for kernels that wait); the
//! first error (lowest block, then thread) is the launch's.
//!
//! Contract: [`run`] is [`super::launch_with`]'s body; it writes the buffers in place
//! and returns once every worker has ended. Nothing here is public outside the
//! emulator.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corosensei::{Coroutine, CoroutineResult, Yielder};

use tessera_ir::interp::KernelArg;
use tessera_ir::{Elem, Function};

use super::runtime::{self, Block, Buf, CommCtx, Launch, ThreadCtx};
use super::team::{self, Park, Step, Team};
use super::{DEFAULT_BARRIER_TIMEOUT, EmuError, EmuKernel, EmuLaunch, jit};
use crate::CodegenError;
use crate::host::scalar_slot;
use crate::host::stack::{ArenaStack, StackArena};

/// Runs `kernel` as `how` says (see [`super::launch_with`]).
pub(super) fn run(kernel: &EmuKernel<'_>, how: &EmuLaunch<'_>) -> Result<(), EmuError> {
    let EmuKernel { func, flavor, opts } = *kernel;
    let EmuLaunch {
        grid,
        args,
        world,
        ref limits,
    } = *how;
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
    // Thread-block clusters: sm_90a's (other flavours run the grid as it is).
    let cluster = if flavor == crate::EmuFlavor::Sm90a {
        opts.cluster
    } else {
        [1, 1, 1]
    };
    tessera_ir::cluster::check(cluster, grid)
        .map_err(|m| arg_err("<grid>", format!("{m} (CompileOptions::cluster)")))?;
    let csize = cluster.iter().map(|&c| c as u64).product::<u64>();
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
        && csize == 1
        && shared_bytes == 0
        && !k
            .sites
            .iter()
            .any(|s| matches!(s.what, "barrier" | "shuffle" | "mma"));
    // Workers take whole clusters (a cluster's blocks run together on one).
    let workers = (crate::host::cores() as u64).min(total / csize);
    let live_blocks = if concurrent { total } else { workers * csize };
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
        cluster,
        csize,
        next: AtomicU64::new(0),
        team_timeout,
        frame_bytes: k.frame_bytes,
    };
    // Every worker's stacks are reserved before any block runs (a resident block may
    // wait for another worker's), and the workers start together once all exist.
    let arenas = (0..workers)
        .map(|w| match (independent, concurrent) {
            (true, _) => Ok(None),
            (false, false) => job.arena(threads as usize * csize as usize).map(Some),
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
                        Some(a) if csize > 1 => job.run_clusters(a),
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
    /// The thread-block cluster's shape, and its blocks (1: no clusters).
    cluster: [u32; 3],
    csize: u64,
    /// The next block (or cluster) to take (sequential launches).
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
        (lin < self.total / self.csize).then_some(lin)
    }

    /// The linear indices of the blocks of cluster `k` (clusters numbered like
    /// blocks, over the grid divided by the cluster's shape), by cluster rank
    /// (`x + cx * (y + cy * z)` for the block's place in its cluster).
    fn cluster_blocks(&self, k: u64) -> Vec<u64> {
        let [cx, cy, cz] = self.cluster.map(|c| c as u64);
        let [gx, gy, gz] = self.launch.grid.map(|g| g as u64);
        let kc = super::block_of([(gx / cx) as u32, (gy / cy) as u32, (gz / cz) as u32], k)
            .map(|v| v as u64);
        (0..self.csize)
            .map(|r| {
                let p = tessera_ir::cluster::place(self.cluster, r as u32).map(|v| v as u64);
                let (x, y, z) = (kc[0] * cx + p[0], kc[1] * cy + p[1], kc[2] * cz + p[2]);
                x + gx * (y + gy * z)
            })
            .collect()
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

    /// The blocks worker `w` owns in a launch of a waiting kernel: those of clusters
    /// `w, w + W, ...`, each cluster's by rank.
    fn owned(&self, w: usize) -> Vec<u64> {
        (w as u64..self.total / self.csize)
            .step_by(self.workers as usize)
            .flat_map(|k| self.cluster_blocks(k))
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

    /// Waiting kernels: every block live at once; worker `w` owns the blocks of
    /// clusters `w, w + W, ...` (a cluster of one block without clusters) and steps
    /// them round robin until all have ended.
    fn run_resident(&self, w: u64, arena: &StackArena) -> Result<(), EmuError> {
        let mine = self.owned(w as usize);
        let blocks = self.blocks(mine.len());
        self.drive(&mine, &blocks, arena);
        Ok(())
    }

    /// `count` fresh blocks, clusters of `csize` consecutive ones (ranked in order).
    fn blocks(&self, count: usize) -> Vec<Block> {
        (0..count)
            .map(|b| {
                Block::new(Team::new(self.threads, self.warp), self.shared_bytes)
                    .with_rank((b as u64 % self.csize) as u32)
            })
            .collect()
    }

    /// Sequential launches of a kernel in clusters: this worker takes a cluster at a
    /// time and runs its blocks' threads together (a cluster's blocks are
    /// co-resident: they wait for each other at cluster barriers and mbarriers).
    fn run_clusters(&self, arena: &StackArena) -> Result<(), EmuError> {
        let blocks = self.blocks(self.csize as usize);
        while let Some(k) = self.take() {
            for blk in &blocks {
                blk.team.reset();
                blk.clear_shadow();
            }
            self.drive(&self.cluster_blocks(k), &blocks, arena);
        }
        Ok(())
    }

    /// Runs blocks `lins` (clusters of `csize` consecutive ones) on `blocks`, their
    /// threads on `arena`'s stacks, stepping the blocks round robin until all have
    /// ended.
    fn drive(&self, lins: &[u64], blocks: &[Block], arena: &StackArena) {
        let n = self.threads as usize;
        let cs = self.csize as usize;
        let ctxs: Vec<Vec<ThreadCtx<'_>>> = lins
            .iter()
            .enumerate()
            .map(|(b, &lin)| {
                let first = b - b % cs;
                (0..self.threads)
                    .map(|tid| {
                        ThreadCtx::in_cluster(
                            tid,
                            self.launch,
                            &blocks[first..first + cs],
                            b % cs,
                            lin,
                        )
                    })
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
                    // each once (the coroutines of an earlier call on this arena
                    // were all dropped when it returned).
                    .map(|(i, c)| Some(self.spawn(c, unsafe { arena.stack(b * n + i) })))
                    .collect()
            })
            .collect();
        let Some(first) = ctxs.first().and_then(|c| c.first()) else {
            return;
        };
        let _guard = runtime::enter(first);
        let mut done = vec![false; lins.len()];
        let mut poll: Vec<PollClock> = lins.iter().map(|_| PollClock::default()).collect();
        let mut idle_rounds = 0u32;
        while done.iter().any(|d| !d) {
            let mut progressed = false;
            for b in 0..lins.len() {
                if done[b] {
                    continue;
                }
                let blk = ctxs[b][0].blk;
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

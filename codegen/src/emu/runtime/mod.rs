//! The functions JIT-compiled kernels call (see [`crate::lower::arch::emu`]), and the
//! per-launch and per-thread state they work on.
//!
//! The OS thread driving a block points a thread-local at the [`ThreadCtx`] of the
//! GPU thread (coroutine) it resumes; the `extern "C"` functions below find their
//! thread's id, block, team, shared memory and error sink there, and park the
//! coroutine (through its yielder) at barriers, unfinished warp collectives and
//! polling loops. They never panic (a panic cannot unwind through
//! JIT-compiled frames): misuse is recorded as an [`EmuError`] and the launch stops
//! after the current block.
//!
//! **Shared-memory race detection.** Every shared byte has two shadow words: the last
//! write and the last read, each `(barrier epoch, thread + 1, site)`. A thread's epoch
//! is the number of block barriers it has passed in the current block. Reading a byte
//! that another thread wrote in the same epoch (no barrier in between), or writing a
//! byte that another thread read in the same epoch, is a race. Replicated threads
//! writing the same value to the same place (which the lowering does on purpose) is
//! not reported.

//!
//! Files: this one holds the launch's and the threads' state, the calls every
//! kernel may make (ids, barriers, shuffles, timers, global and shared accesses with
//! their checks) and the symbol table; `copies.rs` the asynchronous copies
//! (`cp.async`, mbarriers, TMA loads and stores); `matrix.rs` the matrix
//! instructions (`ldmatrix`, `mma`, `wgmma`).

use std::cell::{Cell, RefCell, UnsafeCell};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use corosensei::Yielder;

use tessera_ir::Span;

use super::EmuError;
use super::team::{Park, Team, TeamError};
use super::wgmma::WgState;
use crate::lower::Site;
use copies::{AsyncCopies, TmaStore};

mod copies;
mod matrix;

/// A buffer argument of a launch (or one rank's copy of a symmetric one).
pub(crate) struct Buf {
    pub base: usize,
    pub len_bytes: usize,
    pub elem_bytes: usize,
    pub name: String,
    /// The kernel parameter it is passed for.
    pub param: u32,
    /// This rank's buffer (a plain buffer, or this rank's copy of a symmetric one);
    /// false for a peer's copy, reached only through `remote_ptr`.
    pub own: bool,
}

impl Buf {
    /// Whether the `n` bytes at `addr` lie in the buffer.
    fn holds(&self, addr: usize, n: usize) -> bool {
        addr >= self.base
            && addr
                .checked_add(n)
                .is_some_and(|e| e <= self.base + self.len_bytes)
    }

    /// How far the `n` bytes at `addr` are from lying in the buffer.
    fn distance(&self, addr: usize, n: usize) -> usize {
        if addr < self.base {
            self.base - addr
        } else {
            addr.saturating_add(n)
                .saturating_sub(self.base + self.len_bytes)
        }
    }
}

/// The state of one running block: its team of threads, its shared memory and the
/// race-detection shadow. Each worker of a launch reuses one for every block it runs;
/// launches of blocking kernels have one per block (all blocks are live at once). A
/// block is touched only by the OS thread that drives it.
pub(crate) struct Block {
    pub team: Team,
    /// The block's shared memory (owned by `_mem`).
    pub shared: *mut u8,
    pub shared_bytes: usize,
    pub shadow_write: Vec<Cell<u64>>,
    pub shadow_read: Vec<Cell<u64>>,
    /// Per byte: the reader's warp's [`Block::warp_arrivals`] at the last read.
    pub shadow_read_arrivals: Vec<Cell<u32>>,
    /// Per warp: the mbarrier arrivals (`mbarrier.arrive`, with or without
    /// `expect_tx`) its threads made. A shared read is stamped with its warp's count,
    /// so a thread that acquires a later arrival of that warp knows the read is
    /// behind it. Counted per warp, as one lane arrives for its warp after a warp
    /// collective (a `wgmma` group retired) that every lane's reads belong to.
    pub warp_arrivals: Vec<Cell<u32>>,
    /// The block's mbarriers, by offset in shared memory.
    pub mbars: RefCell<std::collections::HashMap<usize, super::tma::Mbar>>,
    /// Its rank in its thread-block cluster (0 without clusters).
    pub rank: u32,
    /// Arrivals at the cluster's barriers so far (`barrier.cluster`; counted on the
    /// cluster's block of rank 0).
    pub cluster_arrivals: Cell<u64>,
    _mem: Vec<u128>,
}

impl Block {
    pub(crate) fn new(team: Team, shared_bytes: usize) -> Block {
        // 1024 bytes of slack: the shared base is 1024-aligned, as the `wgmma`
        // swizzle patterns (address bits 4..10) and the lowering assume.
        let mut mem = vec![0u128; shared_bytes.div_ceil(16).max(1) + 64];
        let raw = mem.as_mut_ptr() as *mut u8;
        let pad = (raw as usize).next_multiple_of(1024) - raw as usize;
        Block {
            team,
            // SAFETY: `pad < 1024` and the allocation has 1024 bytes past
            // `shared_bytes`.
            shared: unsafe { raw.add(pad) },
            shared_bytes,
            shadow_write: (0..shared_bytes).map(|_| Cell::new(0)).collect(),
            shadow_read: (0..shared_bytes).map(|_| Cell::new(0)).collect(),
            shadow_read_arrivals: (0..shared_bytes).map(|_| Cell::new(0)).collect(),
            warp_arrivals: (0..32).map(|_| Cell::new(0)).collect(),
            mbars: RefCell::new(std::collections::HashMap::new()),
            rank: 0,
            cluster_arrivals: Cell::new(0),
            _mem: mem,
        }
    }

    /// The same block as rank `rank` of its cluster.
    pub(crate) fn with_rank(mut self, rank: u32) -> Block {
        self.rank = rank;
        self
    }

    /// Clears the race-detection shadow for the next block.
    pub(crate) fn clear_shadow(&self) {
        for w in self.shadow_write.iter().chain(&self.shadow_read) {
            w.set(0);
        }
        for a in self.shadow_read_arrivals.iter().chain(&self.warp_arrivals) {
            a.set(0);
        }
        self.mbars.borrow_mut().clear();
        self.cluster_arrivals.set(0);
    }
}

/// The world a communicating launch runs in (see [`crate::comm`]).
pub(crate) struct CommCtx {
    pub rank: u32,
    /// Every rank's heap base (host addresses).
    pub heap_bases: Vec<u64>,
    /// Calls of the off-node engine's functions ([`super::shmem`]), counted.
    pub engine_ops: std::sync::Arc<AtomicU64>,
}

impl CommCtx {
    /// Sets every rank's `ABORT` control word to `1 + rank` (first failure wins).
    pub(crate) fn abort(&self) {
        for &b in &self.heap_bases {
            let word = (b as usize + 8 * tessera_ir::interp::ctrl::ABORT) as *const AtomicU64;
            // SAFETY: every heap starts with its control words, 8-byte aligned, alive
            // for the launch (the launcher's contract, `EmuWorld`).
            let _ = unsafe { &*word }.compare_exchange(
                0,
                self.rank as u64 + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
}

/// Everything shared by the threads of one launch.
pub(crate) struct Launch<'a> {
    pub kernel: &'a str,
    pub kernel_span: &'a Span,
    pub sites: &'a [Site],
    pub grid: [u32; 3],
    pub buffers: Vec<Buf>,
    /// The world of a communicating kernel.
    pub comm: Option<CommCtx>,
    /// Errors with their (linear block, thread) for picking the first.
    pub errors: Mutex<Vec<(u64, u32, EmuError)>>,
    pub failed: AtomicBool,
    /// The watchdog's deadline and limit ([`crate::emu::EmuLimits`]).
    pub watchdog: Option<(std::time::Instant, std::time::Duration)>,
    /// Set when the watchdog expired: every loop stops at its next test.
    pub expired: AtomicBool,
}

/// Errors kept per launch (the first is reported; a broken kernel may fail millions of
/// times).
const MAX_ERRORS: usize = 64;

impl Launch<'_> {
    /// The buffers a global access at `site` may touch: those of the kernel
    /// parameters its pointer derives from ([`Site::prov`]; any rank's copy after a
    /// `remote_ptr`, else this rank's), or every buffer of the launch where the
    /// lowering gave no provenance (or none of those parameters has a buffer).
    pub(crate) fn access_buffers(&self, site: u32) -> impl Iterator<Item = &Buf> + Clone {
        let prov = self
            .sites
            .get(site as usize)
            .and_then(|s| s.prov.as_deref());
        let of =
            move |b: &Buf| prov.is_none_or(|p| p.params.contains(&b.param) && (b.own || p.remote));
        let any = prov.is_none() || !self.buffers.iter().any(of);
        self.buffers.iter().filter(move |b| any || of(b))
    }

    pub(crate) fn site(&self, site: u32) -> (Span, &'static str) {
        match self.sites.get(site as usize) {
            Some(s) => (s.span.clone(), s.op),
            None => (self.kernel_span.clone(), "kernel"),
        }
    }

    pub(crate) fn record(&self, block_lin: u64, tid: u32, e: EmuError) {
        self.failed.store(true, Ordering::Release);
        if let Some(c) = &self.comm {
            // Release the other ranks' (and this rank's other blocks') waits.
            c.abort();
        }
        let mut errs = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errs.len() < MAX_ERRORS {
            errs.push((block_lin, tid, e));
        } else if let Some(worst) = (0..errs.len()).max_by_key(|&i| (errs[i].0, errs[i].1))
            && (block_lin, tid) < (errs[worst].0, errs[worst].1)
        {
            // Blocks run in parallel: keep the lowest (block, thread) errors.
            errs[worst] = (block_lin, tid, e);
        }
    }

    /// Turns a team error into an [`EmuError`].
    pub(crate) fn team_error(&self, e: TeamError, block: [u32; 3], threads: u32) -> EmuError {
        match e {
            TeamError::BarrierDivergence {
                site,
                waiting,
                exited,
                elsewhere,
            } => {
                let (span, op) = self.site(site);
                let mut detail = format!("{exited} had exited");
                if let Some((s2, n)) = elsewhere {
                    let (span2, op2) = self.site(s2);
                    detail.push_str(&format!(", {n} wait at the barrier of `{op2}` at {span2}"));
                }
                EmuError::BarrierDivergence {
                    kernel: self.kernel.to_string(),
                    op,
                    span,
                    block,
                    missing: threads.saturating_sub(waiting),
                    detail,
                }
            }
            TeamError::Timeout {
                site,
                waiting,
                threads,
            } => {
                let (span, op) = self.site(site);
                EmuError::Timeout {
                    kernel: self.kernel.to_string(),
                    op,
                    span,
                    block,
                    waiting,
                    threads,
                }
            }
        }
    }
}

/// One emulated thread.
pub(crate) struct ThreadCtx<'a> {
    pub tid: u32,
    pub launch: &'a Launch<'a>,
    /// The running block's team and shared memory.
    pub blk: &'a Block,
    /// The blocks of its thread-block cluster, by rank (`blk` alone without
    /// clusters), all driven by this OS thread.
    pub cluster: &'a [Block],
    /// Cluster barriers (`barrier.cluster`) this thread arrived at.
    pub cluster_gen: Cell<u64>,
    pub block: Cell<[u32; 3]>,
    pub block_lin: Cell<u64>,
    /// Block barriers passed in the current block.
    pub epoch: Cell<u32>,
    /// Per warp of the block: the highest of its arrival counts (see
    /// [`Block::warp_arrivals`]) this thread acquired (a wait that saw the mbarrier
    /// phase they completed).
    pub acquired: RefCell<Vec<u32>>,
    /// Where out-of-bounds accesses go instead.
    pub scratch: UnsafeCell<Scratch>,
    /// The yielder of the coroutine this thread runs as (null when it runs as a
    /// plain call: threads that never meet).
    pub yielder: Cell<*const Yielder<(), Park>>,
    /// This thread's `cp.async` copies not yet waited for.
    pub copies: RefCell<AsyncCopies>,
    /// This thread's `wgmma` state.
    pub wg: RefCell<WgState>,
    /// The byte range (`lo..hi`, offsets in the block's shared memory) that spans
    /// this thread's shared-memory writes (generic proxy) since its last
    /// `fence.proxy.async`; `None`: none since.
    pub wg_dirty: Cell<Option<(usize, usize)>>,
    /// TMA stores issued and not yet waited for (`cp.async.bulk.wait_group.read`).
    pub tma_stores: RefCell<Vec<TmaStore>>,
    /// The site of the off-node engine call being made ([`super::shmem`]).
    pub engine_site: Cell<u32>,
    /// This thread's off-node puts not yet delivered (at its next quiet).
    pub puts: super::puts::PendingPuts,
}

impl Drop for ThreadCtx<'_> {
    fn drop(&mut self) {
        // Puts still queued when the thread ends are delivered (the lowering quiets
        // at the kernel's end; a program that gave up early may not have).
        if !self.puts.is_empty() {
            self.puts.deliver();
        }
    }
}

impl<'a> ThreadCtx<'a> {
    /// Thread `tid` of `blk`, at block `lin` of the launch's grid.
    pub(crate) fn new(tid: u32, launch: &'a Launch<'a>, blk: &'a Block, lin: u64) -> ThreadCtx<'a> {
        ThreadCtx::in_cluster(tid, launch, std::slice::from_ref(blk), 0, lin)
    }

    /// Thread `tid` of block `cluster[rank]`, at block `lin` of the launch's grid.
    pub(crate) fn in_cluster(
        tid: u32,
        launch: &'a Launch<'a>,
        cluster: &'a [Block],
        rank: usize,
        lin: u64,
    ) -> ThreadCtx<'a> {
        ThreadCtx {
            tid,
            launch,
            blk: &cluster[rank],
            cluster,
            cluster_gen: Cell::new(0),
            block: Cell::new(super::block_of(launch.grid, lin)),
            block_lin: Cell::new(lin),
            epoch: Cell::new(0),
            acquired: RefCell::new(Vec::new()),
            scratch: UnsafeCell::new(Scratch([0; 64])),
            yielder: Cell::new(std::ptr::null()),
            copies: RefCell::new(AsyncCopies::default()),
            wg: RefCell::new(WgState::default()),
            wg_dirty: Cell::new(None),
            tma_stores: RefCell::new(Vec::new()),
            engine_site: Cell::new(u32::MAX),
            puts: Default::default(),
        }
    }

    /// This thread's warp's mbarrier arrivals ([`Block::warp_arrivals`]).
    pub(crate) fn warp_arrivals(&self) -> &Cell<u32> {
        &self.blk.warp_arrivals[self.warp() % self.blk.warp_arrivals.len()]
    }

    /// This thread's warp.
    pub(crate) fn warp(&self) -> usize {
        (self.tid / self.blk.team.warp_size()) as usize
    }

    /// This thread's warp across its cluster (`rank * 32 + warp`): the index of
    /// its arrivals in [`ThreadCtx::acquired`].
    pub(crate) fn cluster_warp(&self) -> usize {
        self.blk.rank as usize * 32 + self.warp()
    }

    /// Suspends the calling coroutine (returns at once outside one).
    fn park(&self, p: Park) {
        let y = self.yielder.get();
        if !y.is_null() {
            // SAFETY: the coroutine stored its own yielder before running the kernel;
            // it lives on the coroutine's stack for as long as the coroutine runs,
            // and only the coroutine itself (running now) calls `park`.
            unsafe { &*y }.suspend(p);
        }
    }
}

/// A harmless place for a bad access (up to 64 bytes, any alignment up to 64).
#[repr(C, align(64))]
pub(crate) struct Scratch(pub [u8; 64]);

thread_local! {
    static CURRENT: Cell<*const ()> = const { Cell::new(std::ptr::null()) };
}

/// Makes `ctx` the calling thread's context until the guard drops.
pub(crate) fn enter<'a>(ctx: &'a ThreadCtx<'a>) -> impl Drop + 'a {
    struct Guard<'a>(std::marker::PhantomData<&'a ()>);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(std::ptr::null()));
        }
    }
    CURRENT.with(|c| c.set(ctx as *const ThreadCtx as *const ()));
    Guard(std::marker::PhantomData)
}

/// Makes `ctx` the calling thread's context (the scheduler, before resuming the
/// coroutine of `ctx`'s thread; `enter`'s guard, held around the whole schedule,
/// clears it at the end).
pub(crate) fn switch_to(ctx: &ThreadCtx<'_>) {
    CURRENT.with(|c| c.set(ctx as *const ThreadCtx as *const ()));
}

/// Runs `f` on the calling thread's context, or returns `default` outside a launch.
pub(super) fn with<R>(default: R, f: impl FnOnce(&ThreadCtx<'_>) -> R) -> R {
    let p = CURRENT.with(|c| c.get());
    if p.is_null() {
        return default;
    }
    // SAFETY: `enter`/`switch_to` stored a pointer to a `ThreadCtx` that outlives the
    // guard (which clears the pointer) of the schedule driving it; kernels (the only
    // callers) run inside that scope, on the thread whose context was set.
    f(unsafe { &*(p as *const ThreadCtx<'_>) })
}

impl ThreadCtx<'_> {
    pub(super) fn fail(&self, e: EmuError) {
        self.launch.record(self.block_lin.get(), self.tid, e);
    }
}

extern "C" fn tessera_emu_tid() -> i32 {
    with(0, |c| c.tid as i32)
}

extern "C" fn tessera_emu_program_id(axis: i32) -> i32 {
    with(0, |c| c.block.get()[axis.clamp(0, 2) as usize] as i32)
}

extern "C" fn tessera_emu_num_programs(axis: i32) -> i32 {
    with(1, |c| c.launch.grid[axis.clamp(0, 2) as usize] as i32)
}

extern "C" fn tessera_emu_barrier(site: i32) {
    with((), |c| {
        c.blk.team.barrier(c.tid, site as u32, |p| c.park(p));
        c.epoch.set(c.epoch.get() + 1);
    })
}

/// `bar.sync id, threads` (PTX ISA, "barrier"): waits until `threads` threads of the
/// block arrived at named barrier `id` (waiting there, or passing by `bar.arrive`).
/// An id outside 1..16 (0 is the block barrier, which takes every thread) or a
/// count that is not a positive multiple of the warp size, or more than the
/// block's threads, is an error.
extern "C" fn tessera_emu_named_barrier(id: i32, threads: i32, site: i32) {
    named_barrier(id, threads, site, true)
}

/// `bar.arrive id, threads` (PTX ISA, "barrier"): arrives at named barrier `id`
/// without waiting (the producer's side of a producer/consumer barrier, whose
/// `threads` count both sides); checked as [`tessera_emu_named_barrier`].
extern "C" fn tessera_emu_named_barrier_arrive(id: i32, threads: i32, site: i32) {
    named_barrier(id, threads, site, false)
}

fn named_barrier(id: i32, threads: i32, site: i32, wait: bool) {
    with((), |c| {
        let team = &c.blk.team;
        let warp = team.warp_size() as i32;
        if !(1..super::team::NAMED_BARRIERS as i32).contains(&id)
            || threads <= 0
            || threads % warp != 0
            || threads as u32 > team.threads()
        {
            wg_fail(
                c,
                site,
                format!(
                    "bar.{} {id}, {threads}: a named barrier takes an id from 1 to 15 and a positive multiple of the warp size up to the block's {} threads",
                    if wait { "sync" } else { "arrive" },
                    team.threads()
                ),
            );
            return;
        }
        team.named_barrier(c.tid, id as u32, threads as u32, site as u32, wait, |p| {
            c.park(p)
        });
        c.epoch.set(c.epoch.get() + 1);
    })
}

/// `bar.warp.sync 0xffffffff`: a warp collective that carries nothing (every lane
/// of the warp waits for the others).
extern "C" fn tessera_emu_warp_sync(site: i32) {
    with((), |c| {
        c.blk
            .team
            .warp_collective(c.tid, site as u32, &[], |p| c.park(p), |_| {});
    })
}

/// `setmaxnreg.{inc,dec}.sync.aligned.u32 regs` (PTX ISA, "setmaxnreg"): checked (a
/// multiple of 8 from 24 to 256), no effect (the emulator has no register file).
extern "C" fn tessera_emu_setmaxnreg(_inc: i32, regs: i32, site: i32) {
    with((), |c| {
        if !(24..=256).contains(&regs) || regs % 8 != 0 {
            wg_fail(
                c,
                site,
                format!(
                    "setmaxnreg {regs}: the register count must be a multiple of 8 from 24 to 256"
                ),
            );
        }
    })
}

/// `%cluster_ctarank`: the block's rank in its cluster.
extern "C" fn tessera_emu_cluster_ctarank() -> i32 {
    with(0, |c| c.blk.rank as i32)
}

/// `barrier.cluster.arrive.release` then `barrier.cluster.wait.acquire` (PTX ISA,
/// "barrier.cluster"): the thread waits until every thread of every block of its
/// cluster arrived at this barrier (the blocks of a cluster are driven together, so
/// the others run while it polls); a barrier that never completes is an error after
/// 10 s. For the race check it is a block barrier too.
extern "C" fn tessera_emu_cluster_sync(site: i32) {
    with((), |c| {
        let head = &c.cluster[0];
        let total = c.cluster.len() as u64 * c.blk.team.threads() as u64;
        let g = c.cluster_gen.get() + 1;
        c.cluster_gen.set(g);
        head.cluster_arrivals.set(head.cluster_arrivals.get() + 1);
        let start = std::time::Instant::now();
        while head.cluster_arrivals.get() < g * total {
            if c.launch.failed.load(Ordering::Relaxed) {
                return;
            }
            if start.elapsed() > std::time::Duration::from_secs(10) {
                let arrived = head.cluster_arrivals.get().saturating_sub((g - 1) * total);
                wg_fail(
                    c,
                    site,
                    format!(
                        "a cluster barrier that never completed: {arrived} of the cluster's {total} threads arrived"
                    ),
                );
                return;
            }
            c.park(Park::Poll);
        }
        c.epoch.set(c.epoch.get() + 1);
    })
}

extern "C" fn tessera_emu_shuffle_xor(v: i32, mask: i32, site: i32) -> i32 {
    with(0, |c| {
        c.blk
            .team
            .shuffle_xor(c.tid, site as u32, v as u32, mask as u32, |p| c.park(p)) as i32
    })
}

extern "C" fn tessera_emu_shared_base() -> *mut u8 {
    with(std::ptr::null_mut(), |c| c.blk.shared)
}

pub(super) extern "C" fn tessera_emu_check_global(p: *mut u8, bytes: i32, site: i32) -> *mut u8 {
    with(p, |c| {
        let addr = p as usize;
        let n = bytes.max(1) as usize;
        // Only the buffers the access's pointer derives from: an address that lands
        // in another buffer is out of bounds all the same.
        let bufs = c.launch.access_buffers(site as u32);
        let inside = bufs.clone().find(|b| b.holds(addr, n));
        // The lowering aligns every access to its size (a GPU faults otherwise).
        if inside.is_some() && addr.is_multiple_of(n) {
            return p;
        }
        let (span, op) = c.launch.site(site as u32);
        if let Some(b) = inside {
            c.fail(EmuError::Misaligned {
                kernel: c.launch.kernel.to_string(),
                op,
                span,
                block: c.block.get(),
                thread: c.tid,
                buffer: b.name.clone(),
                offset_bytes: addr - b.base,
                bytes: n as u32,
            });
            return c.scratch.get() as *mut u8;
        }
        let e = match bufs.min_by_key(|b| b.distance(addr, n)) {
            Some(b) => EmuError::OutOfBounds {
                kernel: c.launch.kernel.to_string(),
                op,
                span,
                block: c.block.get(),
                thread: c.tid,
                buffer: b.name.clone(),
                index: (addr as i128 - b.base as i128).div_euclid(b.elem_bytes.max(1) as i128)
                    as i64,
                len: b.len_bytes / b.elem_bytes.max(1),
            },
            None => EmuError::OutOfBounds {
                kernel: c.launch.kernel.to_string(),
                op,
                span,
                block: c.block.get(),
                thread: c.tid,
                buffer: "<no buffer>".into(),
                index: addr as i64,
                len: 0,
            },
        };
        c.fail(e);
        c.scratch.get() as *mut u8
    })
}

/// Nanoseconds since the first call (a monotonic clock). Kernels call it in polling
/// loops, so it also parks the polling thread ([`Park::Poll`]): the thread being
/// waited for (of this block, another block or another rank) gets its turn.
extern "C" fn tessera_emu_timer_ns() -> i64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    with((), |c| {
        if c.yielder.get().is_null() {
            std::thread::yield_now();
        } else {
            c.park(Park::Poll);
        }
    });
    i64::try_from(epoch.elapsed().as_nanos()).unwrap_or(i64::MAX)
}

/// Reports an integer division or remainder by zero (`is_zero` nonzero); the kernel
/// goes on with the GPU's result, 0.
extern "C" fn tessera_emu_check_divisor(is_zero: i32, site: i32) {
    if is_zero == 0 {
        return;
    }
    with((), |c| {
        let (span, op) = c.launch.site(site as u32);
        c.fail(EmuError::DivisionByZero {
            kernel: c.launch.kernel.to_string(),
            op,
            span,
            block: c.block.get(),
            thread: c.tid,
        });
    })
}

/// Called at every loop back edge: the other threads of the block (and the other
/// blocks of a waiting kernel) get a turn, so a thread that spins on a value another
/// thread of its block writes makes progress, as on a GPU.
extern "C" fn tessera_emu_loop_ok(site: i32) -> i32 {
    with(1, |c| {
        let Some((deadline, limit)) = c.launch.watchdog else {
            return 1;
        };
        if c.launch.expired.load(Ordering::Relaxed) {
            return 0;
        }
        if std::time::Instant::now() < deadline {
            return 1;
        }
        if !c.launch.expired.swap(true, Ordering::AcqRel) {
            let (span, op) = c.launch.site(site as u32);
            c.fail(EmuError::LaunchTimeout {
                kernel: c.launch.kernel.to_string(),
                op,
                span,
                block: c.block.get(),
                thread: c.tid,
                timeout: limit,
            });
        }
        0
    })
}

extern "C" fn tessera_emu_yield() {
    with((), |c| c.park(Park::Yield));
}

extern "C" fn tessera_emu_bad_peer(peer: i32, world: i32, site: i32) {
    with((), |c| {
        let (span, op) = c.launch.site(site as u32);
        c.fail(EmuError::BadPeer {
            kernel: c.launch.kernel.to_string(),
            op,
            span,
            rank: c.launch.comm.as_ref().map_or(0, |w| w.rank),
            block: c.block.get(),
            thread: c.tid,
            peer,
            world_size: world,
        });
    })
}

fn pack(epoch: u32, tid: u32, site: u32) -> u64 {
    (epoch as u64) << 32 | ((tid + 1) as u64 & 0xffff) << 16 | (site as u64 & 0xffff)
}

extern "C" fn tessera_emu_note_shared(p: *mut u8, bytes: i32, is_write: i32, site: i32) {
    with((), |c| {
        note_shared(c, p, bytes, is_write != 0, site);
    })
}

/// Checks a shared access of `bytes` at `p` by thread `c` (bounds, races) and records
/// it in the race shadow; false (with the error recorded) when it is out of bounds.
fn note_shared(c: &ThreadCtx<'_>, p: *const u8, bytes: i32, is_write: bool, site: i32) -> bool {
    let is_write = is_write as i32;
    {
        let l = c.launch;
        let k = c.blk;
        let off = (p as usize).wrapping_sub(k.shared as usize);
        let n = bytes.max(1) as usize;
        if off.checked_add(n).is_none_or(|end| end > k.shared_bytes) {
            let (span, op) = l.site(site as u32);
            c.fail(EmuError::OutOfBounds {
                kernel: l.kernel.to_string(),
                op,
                span,
                block: c.block.get(),
                thread: c.tid,
                buffer: "<shared memory>".into(),
                index: off as i64,
                len: k.shared_bytes,
            });
            return false;
        }
        if is_write != 0 {
            let (lo, hi) = c.wg_dirty.get().unwrap_or((off, off + n));
            c.wg_dirty.set(Some((lo.min(off), hi.max(off + n))));
        }
        let epoch = c.epoch.get();
        let me = pack(epoch, c.tid, site as u32);
        let owner = |w: u64| ((w >> 16) & 0xffff) as u32;
        for b in off..off + n {
            let (check, mark) = if is_write != 0 {
                (&k.shadow_read[b], &k.shadow_write[b])
            } else {
                (&k.shadow_write[b], &k.shadow_read[b])
            };
            let other = check.get();
            if other != 0
                && (other >> 32) as u32 == epoch
                && owner(other) != c.tid + 1
                && !l.failed.load(Ordering::Relaxed)
            {
                let (span, op) = l.site(site as u32);
                let (other_span, _) = l.site((other & 0xffff) as u32);
                let them = owner(other) - 1;
                let (writer, reader) = if is_write != 0 {
                    (c.tid, them)
                } else {
                    (them, c.tid)
                };
                c.fail(EmuError::SharedRace {
                    kernel: l.kernel.to_string(),
                    op,
                    span,
                    other_span,
                    block: c.block.get(),
                    writer,
                    reader,
                    kind: if is_write != 0 {
                        "write after read"
                    } else {
                        "read after write"
                    },
                });
            }
            mark.set(me);
            if is_write == 0 {
                k.shadow_read_arrivals[b].set(c.warp_arrivals().get());
            }
        }
    }
    true
}

/// Records a shared-memory access of `bytes` at `p` that is not aligned to its size.
fn misaligned_shared(c: &ThreadCtx<'_>, p: *const u8, bytes: u32, site: i32) {
    let (span, op) = c.launch.site(site as u32);
    c.fail(EmuError::Misaligned {
        kernel: c.launch.kernel.to_string(),
        op,
        span,
        block: c.block.get(),
        thread: c.tid,
        buffer: "<shared memory>".into(),
        offset_bytes: (p as usize).wrapping_sub(c.blk.shared as usize),
        bytes,
    });
}

/// Copies `dst.len()` bytes out of global memory at `src`. Threads of other blocks
/// (other OS threads, and other ranks' launches in a world) may write that memory at
/// the same time, so the emulator reads it with relaxed atomic loads: its own reads
/// are then no data race in Rust's memory model, and they observe what a GPU's weak
/// loads may (any value written, without ordering).
///
/// # Safety
///
/// The `dst.len()` bytes at `src` are valid for reads, and accessed by Rust code only
/// atomically while others may write them.
unsafe fn read_global(src: *const u8, dst: &mut [u8]) {
    for (i, d) in dst.iter_mut().enumerate() {
        // SAFETY: in bounds (the caller's contract); a byte needs no alignment.
        *d = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// Writes `src` into global memory at `dst` with relaxed atomic stores (see
/// [`read_global`]).
///
/// # Safety
///
/// The `src.len()` bytes at `dst` are valid for writes, and accessed by Rust code only
/// atomically while others may access them.
unsafe fn write_global(dst: *mut u8, src: &[u8]) {
    for (i, b) in src.iter().enumerate() {
        // SAFETY: in bounds (the caller's contract); a byte needs no alignment.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(*b, Ordering::Relaxed);
    }
}

/// Records an invalid use of a matrix instruction (`wgmma`, an `i8` `mma`) at `site`.
fn wg_fail(c: &ThreadCtx<'_>, site: i32, message: String) {
    let (span, op) = c.launch.site(site as u32);
    c.fail(EmuError::Instruction {
        kernel: c.launch.kernel.to_string(),
        op,
        span,
        block: c.block.get(),
        thread: c.tid,
        message,
    });
}

/// The runtime functions by their bare names, for [`symbols`].
mod abi {
    pub(super) use super::super::shmem::tessera_emu_engine_site;
    pub(super) use super::copies::*;
    pub(super) use super::matrix::*;
    pub(super) use super::*;
}

/// Resolves every row of the ABI table to its runtime function, which must have
/// the row's type.
macro_rules! resolve {
    ($(fn $name:ident($($p:ident: $t:ty),* $(,)?) $(-> $r:ty)?;)*) => {
        vec![$({
            let f: extern "C" fn($($t),*) $(-> $r)? = abi::$name;
            (stringify!($name), f as usize)
        }),*]
    };
}

/// The emulator runtime's symbols (the NVSHMEM calls' are `shmem`'s), with their
/// addresses: one per row of the ABI table ([`crate::lower::arch::emu_abi`]), and the
/// host floor's compiler builtins.
pub(crate) fn symbols() -> Vec<(&'static str, usize)> {
    let table: Vec<(&'static str, usize)> = crate::lower::arch::emu_abi::emu_abi!(resolve);
    table.into_iter().chain(crate::host::builtins()).collect()
}

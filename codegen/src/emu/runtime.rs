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

use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use corosensei::Yielder;

use tessera_ir::Span;

use super::EmuError;
use super::mma::{self, Half};
use super::team::{Park, Team, TeamError};
use super::wgmma::{self as wg, POISON, WgOp, WgState, WgType};
use crate::lower::Site;

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
    /// The block's mbarriers, by offset in shared memory.
    pub mbars: RefCell<std::collections::HashMap<usize, super::tma::Mbar>>,
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
            mbars: RefCell::new(std::collections::HashMap::new()),
            _mem: mem,
        }
    }

    /// Clears the race-detection shadow for the next block.
    pub(crate) fn clear_shadow(&self) {
        for w in self.shadow_write.iter().chain(&self.shadow_read) {
            w.set(0);
        }
        self.mbars.borrow_mut().clear();
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
    pub block: Cell<[u32; 3]>,
    pub block_lin: Cell<u64>,
    /// Block barriers passed in the current block.
    pub epoch: Cell<u32>,
    /// Where out-of-bounds accesses go instead.
    pub scratch: UnsafeCell<Scratch>,
    /// The yielder of the coroutine this thread runs as (null when it runs as a
    /// plain call: threads that never meet).
    pub yielder: Cell<*const Yielder<(), Park>>,
    /// This thread's `cp.async` copies not yet waited for.
    pub copies: RefCell<AsyncCopies>,
    /// This thread's `wgmma` state.
    pub wg: RefCell<WgState>,
    /// Shared memory written (generic proxy) since the last `fence.proxy.async`.
    pub wg_dirty: Cell<bool>,
    /// TMA stores issued and not yet waited for (`cp.async.bulk.wait_group.read`).
    pub tma_stores: RefCell<Vec<TmaStore>>,
    /// The site of the off-node engine call being made ([`super::shmem`]).
    pub engine_site: Cell<u32>,
    /// This thread's off-node puts not yet delivered (at its next quiet).
    pub puts: super::puts::PendingPuts,
}

/// A TMA store: it reads its box from shared memory and writes global memory when
/// the issuing thread waits for its bulk group.
pub(crate) struct TmaStore {
    src_off: usize,
    map: super::tma::EmuTensorMap,
    coords: [i32; 3],
    site: i32,
}

/// One `cp.async`: the bytes read from global memory when it was issued, to land at
/// `dst` in shared memory when a `cp.async.wait_group` covers its group.
pub(crate) struct AsyncCopy {
    dst: usize,
    bytes: [u8; 16],
    len: usize,
    site: i32,
}

/// A thread's `cp.async` groups (PTX ISA, "cp.async.commit_group" and
/// "cp.async.wait_group"): the copies issued since the last commit, and the committed
/// groups, oldest first.
#[derive(Default)]
pub(crate) struct AsyncCopies {
    open: Vec<AsyncCopy>,
    committed: VecDeque<Vec<AsyncCopy>>,
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
        ThreadCtx {
            tid,
            launch,
            blk,
            block: Cell::new(super::block_of(launch.grid, lin)),
            block_lin: Cell::new(lin),
            epoch: Cell::new(0),
            scratch: UnsafeCell::new(Scratch([0; 64])),
            yielder: Cell::new(std::ptr::null()),
            copies: RefCell::new(AsyncCopies::default()),
            wg: RefCell::new(WgState::default()),
            wg_dirty: Cell::new(false),
            tma_stores: RefCell::new(Vec::new()),
            engine_site: Cell::new(u32::MAX),
            puts: Default::default(),
        }
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
            c.wg_dirty.set(true);
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

/// `cp.async.cg.shared.global [dst], [src], bytes, src_bytes` (PTX ISA, "cp.async"):
/// copies `bytes` (4, 8 or 16, both addresses aligned to it) from global `src` to
/// shared `dst`, the bytes past `src_bytes` zero (`src_bytes = 0` reads nothing).
/// The copy is asynchronous: here the source is read now and the destination written
/// only when a `cp.async.wait_group` covers the copy's group, so a kernel that reads
/// the destination without waiting reads stale data, as it may on a GPU.
extern "C" fn tessera_emu_cp_async(
    dst: *mut u8,
    src: *const u8,
    bytes: i32,
    src_bytes: i32,
    site: i32,
) {
    with((), |c| {
        let len = bytes.clamp(1, 16) as usize;
        let n = (src_bytes.max(0) as usize).min(len);
        if !(dst as usize).is_multiple_of(len) {
            misaligned_shared(c, dst, len as u32, site);
            return;
        }
        let mut data = [0u8; 16];
        if n > 0 {
            let p = tessera_emu_check_global(src as *mut u8, len as i32, site);
            // SAFETY: `check_global` returned `src` after checking that `len >= n`
            // bytes there lie in a buffer of the launch, or a scratch area as large.
            unsafe { read_global(p, &mut data[..n]) };
        }
        c.copies.borrow_mut().open.push(AsyncCopy {
            dst: dst as usize,
            bytes: data,
            len,
            site,
        });
    })
}

/// `cp.async.commit_group`: the copies issued since the last commit form a group.
extern "C" fn tessera_emu_cp_async_commit() {
    with((), |c| {
        let mut q = c.copies.borrow_mut();
        let g = std::mem::take(&mut q.open);
        q.committed.push_back(g);
    })
}

/// `cp.async.wait_group n`: every committed group but the newest `n` lands in shared
/// memory (checked and recorded as this thread's writes).
extern "C" fn tessera_emu_cp_async_wait(n: i32) {
    with((), |c| {
        let keep = n.max(0) as usize;
        loop {
            let g = {
                let mut q = c.copies.borrow_mut();
                if q.committed.len() <= keep {
                    break;
                }
                q.committed.pop_front()
            };
            for cp in g.into_iter().flatten() {
                if note_shared(c, cp.dst as *const u8, cp.len as i32, true, cp.site) {
                    // SAFETY: `note_shared` checked that the `len` bytes at `dst` lie
                    // in this block's shared memory.
                    unsafe {
                        std::ptr::copy_nonoverlapping(cp.bytes.as_ptr(), cp.dst as *mut u8, cp.len)
                    };
                }
            }
        }
    })
}

/// The mbarrier at shared `bar` of thread `c`'s block: its offset, or `None` (with
/// the error recorded) when `bar` is not an 8-byte aligned place in shared memory.
fn mbar_offset(c: &ThreadCtx<'_>, bar: *const u8, site: i32) -> Option<usize> {
    if !(bar as usize).is_multiple_of(8) {
        misaligned_shared(c, bar, 8, site);
        return None;
    }
    let off = (bar as usize).wrapping_sub(c.blk.shared as usize);
    if off.checked_add(8).is_none_or(|e| e > c.blk.shared_bytes) {
        wg_fail(
            c,
            site,
            format!(
                "an mbarrier at shared offset {off:#x}, outside the block's {} bytes",
                c.blk.shared_bytes
            ),
        );
        return None;
    }
    Some(off)
}

/// `mbarrier.init.shared::cta.b64 [bar], count` (see [`super::tma`]).
extern "C" fn tessera_emu_mbar_init(bar: *mut u8, count: i32, site: i32) {
    with((), |c| {
        let Some(off) = mbar_offset(c, bar, site) else {
            return;
        };
        let mut m = c.blk.mbars.borrow_mut();
        if m.get(&off)
            .is_some_and(|b| !b.landings.is_empty() || b.tx != 0)
        {
            drop(m);
            wg_fail(
                c,
                site,
                "mbarrier.init of an mbarrier with copies in flight".into(),
            );
            return;
        }
        m.insert(off, super::tma::Mbar::new(count.max(1) as u32));
    })
}

/// `mbarrier.inval.shared::cta.b64 [bar]`: the mbarrier is gone (a later use other
/// than `mbarrier.init` is an error); invalidating one with copies in flight, or no
/// mbarrier at all, is an error.
extern "C" fn tessera_emu_mbar_inval(bar: *mut u8, site: i32) {
    with((), |c| {
        let Some(off) = mbar_offset(c, bar, site) else {
            return;
        };
        let mut m = c.blk.mbars.borrow_mut();
        let why = match m.get(&off) {
            None => "mbarrier.inval of an mbarrier never initialized",
            Some(b) if !b.landings.is_empty() || b.tx != 0 => {
                "mbarrier.inval of an mbarrier with copies in flight"
            }
            Some(_) => {
                m.remove(&off);
                return;
            }
        };
        drop(m);
        wg_fail(c, site, why.into());
    })
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes`.
extern "C" fn tessera_emu_mbar_expect_tx(bar: *mut u8, bytes: i32, site: i32) {
    with((), |c| {
        let Some(off) = mbar_offset(c, bar, site) else {
            return;
        };
        let mut m = c.blk.mbars.borrow_mut();
        let Some(b) = m.get_mut(&off) else {
            drop(m);
            wg_fail(
                c,
                site,
                "mbarrier.arrive.expect_tx on an mbarrier never initialized".into(),
            );
            return;
        };
        if b.pending == 0 {
            drop(m);
            wg_fail(
                c,
                site,
                "an arrival on an mbarrier phase with none pending".into(),
            );
            return;
        }
        b.tx += i64::from(bytes);
        b.pending -= 1;
        b.try_complete();
    })
}

/// Whether the async proxy's access to the shared byte whose other-kind shadow word is
/// `other` (`shadow_read` for a TMA write, `shadow_write` for a TMA read) races with
/// another thread's access since thread `c`'s last block barrier; records the race.
fn async_proxy_race(c: &ThreadCtx<'_>, other: u64, is_write: bool, site: i32) -> bool {
    let owner = ((other >> 16) & 0xffff) as u32;
    if other == 0
        || (other >> 32) as u32 != c.epoch.get()
        || owner == c.tid + 1
        || c.launch.failed.load(Ordering::Relaxed)
    {
        return false;
    }
    let (span, op) = c.launch.site(site as u32);
    let (other_span, _) = c.launch.site((other & 0xffff) as u32);
    let (writer, reader, kind) = if is_write {
        (c.tid, owner - 1, "write after read")
    } else {
        (owner - 1, c.tid, "read after write")
    };
    c.fail(EmuError::SharedRace {
        kernel: c.launch.kernel.to_string(),
        op,
        span,
        other_span,
        block: c.block.get(),
        writer,
        reader,
        kind,
    });
    true
}

/// `len` bytes of global memory at `addr` a TMA box row reads or writes: the run
/// must lie in the buffer the descriptor's base pointer derives from (TMA needs no
/// alignment); else `None`, the error recorded.
fn box_row(c: &ThreadCtx<'_>, addr: u64, len: usize, site: i32) -> Option<*mut u8> {
    let a = addr as usize;
    if c.launch
        .access_buffers(site as u32)
        .any(|b| b.holds(a, len))
    {
        return Some(a as *mut u8);
    }
    // Reports the access (out of bounds) as a plain access would.
    tessera_emu_check_global(a as *mut u8, 1, site);
    if !c.launch.failed.load(Ordering::Relaxed) {
        wg_fail(
            c,
            site,
            format!("a TMA box row of {len} bytes at {addr:#x} outside its buffer"),
        );
    }
    None
}

/// The registered tensor map a rank-`rank` TMA `what` at `site` goes through, or
/// `None` (the error recorded).
fn tensor_map(
    c: &ThreadCtx<'_>,
    tmap: i64,
    rank: i32,
    what: &str,
    site: i32,
) -> Option<super::tma::EmuTensorMap> {
    let Some(m) = super::tma::lookup(tmap as u64) else {
        wg_fail(
            c,
            site,
            format!("a TMA {what} through tensor map {tmap:#x}, which the launch did not build"),
        );
        return None;
    };
    if m.rank as i32 != rank {
        wg_fail(
            c,
            site,
            format!(
                "a rank-{rank} TMA {what} through a tensor map of rank {}",
                m.rank
            ),
        );
        return None;
    }
    Some(m)
}

/// The shared offset of a TMA box of `n` bytes at `p` (128-byte aligned, inside the
/// block's shared memory), or `None` (the error recorded).
fn box_offset(c: &ThreadCtx<'_>, p: *const u8, n: usize, what: &str, site: i32) -> Option<usize> {
    let off = (p as usize).wrapping_sub(c.blk.shared as usize);
    if !off.is_multiple_of(128) || off.checked_add(n).is_none_or(|e| e > c.blk.shared_bytes) {
        wg_fail(
            c,
            site,
            format!(
                "a TMA {what} of a {n}-byte box at shared offset {off:#x} (it must be 128-byte aligned, inside the block's {} bytes)",
                c.blk.shared_bytes
            ),
        );
        return None;
    }
    Some(off)
}

/// `cp.async.bulk.tensor.{rank}d...mbarrier::complete_tx::bytes [dst], [tmap, {c0,
/// c1, c2}], [bar]` (see [`super::tma`]): the box is read from global memory now and
/// lands in shared memory when a thread waits for `bar`'s phase. Writing over bytes
/// another thread read since the last block barrier is a race.
#[allow(clippy::too_many_arguments)]
extern "C" fn tessera_emu_tma_load(
    dst: *mut u8,
    tmap: i64,
    rank: i32,
    c0: i32,
    c1: i32,
    c2: i32,
    bar: *mut u8,
    site: i32,
) {
    with((), |c| {
        let Some(boff) = mbar_offset(c, bar, site) else {
            return;
        };
        let Some(m) = tensor_map(c, tmap, rank, "copy", site) else {
            return;
        };
        let n = m.box_bytes();
        let Some(off) = box_offset(c, dst, n, "copy", site) else {
            return;
        };
        // The write must not overtake reads of other threads since the last barrier.
        if (off..off + n).any(|b| async_proxy_race(c, c.blk.shadow_read[b].get(), true, site)) {
            return;
        }
        let mut image = vec![0u8; n];
        let row_bytes = (m.box_dims[0] * m.elem_bytes) as usize;
        for (lin, run) in m.rows([c0, c1, c2]) {
            if let Some((addr, at, len)) = run {
                let Some(src) = box_row(c, addr, len, site) else {
                    return;
                };
                // SAFETY: the `len` bytes at `src` lie in a buffer of the launch
                // (`box_row`); `lin + at + len <= lin + row_bytes <= n`.
                unsafe { read_global(src, &mut image[lin + at..lin + at + len]) };
            }
            debug_assert!(lin + row_bytes <= n);
        }
        let chunks = (0..n)
            .step_by(16)
            .map(|lin| {
                let mut ch = [0u8; 16];
                ch.copy_from_slice(&image[lin..lin + 16]);
                (off + m.swizzled(off, lin), ch)
            })
            .collect();
        let mut bars = c.blk.mbars.borrow_mut();
        let Some(b) = bars.get_mut(&boff) else {
            drop(bars);
            wg_fail(
                c,
                site,
                "a TMA copy completing on an mbarrier never initialized".into(),
            );
            return;
        };
        b.landings.push(super::tma::Landing {
            chunks,
            bytes: n as i64,
        });
    })
}

/// `cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group [tmap, {c0, c1,
/// c2}], [src]` (see [`super::tma`]): recorded; the box is read from shared memory
/// and written to the tensor (its elements inside the tensor only) when the thread
/// waits for its bulk group, so a kernel that overwrites the box before waiting
/// stores the overwritten data. Shared memory this thread wrote since its last
/// `fence.proxy.async` is an error (the async proxy may not see it).
#[allow(clippy::too_many_arguments)]
extern "C" fn tessera_emu_tma_store(
    src: *mut u8,
    tmap: i64,
    rank: i32,
    c0: i32,
    c1: i32,
    c2: i32,
    site: i32,
) {
    with((), |c| {
        let Some(m) = tensor_map(c, tmap, rank, "store", site) else {
            return;
        };
        let n = m.box_bytes();
        let Some(off) = box_offset(c, src, n, "store", site) else {
            return;
        };
        if c.wg_dirty.get() {
            wg_fail(
                c,
                site,
                "a TMA store of shared memory written without a fence.proxy.async after the writes"
                    .into(),
            );
            return;
        }
        c.tma_stores.borrow_mut().push(TmaStore {
            src_off: off,
            map: m,
            coords: [c0, c1, c2],
            site,
        });
    })
}

/// `cp.async.bulk.commit_group; cp.async.bulk.wait_group.read 0`: the thread's TMA
/// stores read their boxes (a byte another thread wrote since the last block
/// barrier is a race) and write the tensor.
extern "C" fn tessera_emu_tma_store_wait(_site: i32) {
    with((), |c| {
        let stores = std::mem::take(&mut *c.tma_stores.borrow_mut());
        for st in stores {
            let (m, off, site) = (st.map, st.src_off, st.site);
            let n = m.box_bytes();
            let mut image = vec![0u8; n];
            for lin in (0..n).step_by(16) {
                let at = off + m.swizzled(off, lin);
                if (at..at + 16)
                    .any(|b| async_proxy_race(c, c.blk.shadow_write[b].get(), false, site))
                {
                    return;
                }
                // SAFETY: `tma_store` checked that the box lies in shared memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        c.blk.shared.add(at),
                        image.as_mut_ptr().add(lin),
                        16,
                    )
                };
            }
            for (lin, run) in m.rows(st.coords) {
                let Some((addr, at, len)) = run else { continue };
                let Some(dst) = box_row(c, addr, len, site) else {
                    return;
                };
                // SAFETY: the `len` bytes at `dst` lie in a buffer of the launch.
                unsafe { write_global(dst, &image[lin + at..lin + at + len]) };
            }
        }
    })
}

/// Waits for the phase of parity `parity` of the mbarrier at `bar` (the
/// `mbarrier.try_wait.parity` loop): lands the copies that complete on it, then
/// polls until its arrivals are in; a phase that cannot complete is an error after a
/// few seconds.
extern "C" fn tessera_emu_mbar_wait(bar: *mut u8, parity: i32, site: i32) {
    with((), |c| {
        let Some(off) = mbar_offset(c, bar, site) else {
            return;
        };
        let start = std::time::Instant::now();
        loop {
            let mut bars = c.blk.mbars.borrow_mut();
            let Some(b) = bars.get_mut(&off) else {
                drop(bars);
                wg_fail(
                    c,
                    site,
                    "mbarrier wait on an mbarrier never initialized".into(),
                );
                return;
            };
            if (b.phase & 1) as i32 != parity & 1 {
                return;
            }
            for l in std::mem::take(&mut b.landings) {
                for (o, ch) in l.chunks {
                    // SAFETY: `tma_load` checked that the box lies in shared memory.
                    unsafe { std::ptr::copy_nonoverlapping(ch.as_ptr(), c.blk.shared.add(o), 16) };
                    // Written by the async proxy: visible to every thread after the wait.
                    for w in &c.blk.shadow_write[o..o + 16] {
                        w.set(0);
                    }
                }
                b.tx -= l.bytes;
            }
            if b.tx < 0 {
                let tx = b.tx;
                drop(bars);
                wg_fail(
                    c,
                    site,
                    format!(
                        "TMA copies delivered {} bytes more than mbarrier.arrive.expect_tx announced",
                        -tx
                    ),
                );
                return;
            }
            b.try_complete();
            if (b.phase & 1) as i32 != parity & 1 {
                return;
            }
            let (pending, tx) = (b.pending, b.tx);
            drop(bars);
            if start.elapsed() > std::time::Duration::from_secs(5)
                || c.launch.failed.load(Ordering::Relaxed)
            {
                if !c.launch.failed.load(Ordering::Relaxed) {
                    wg_fail(
                        c,
                        site,
                        format!(
                            "an mbarrier phase of parity {parity} never completed: {pending} arrivals and {tx} transaction bytes outstanding"
                        ),
                    );
                }
                return;
            }
            c.park(Park::Poll);
        }
    })
}

/// `ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16`, from the PTX ISA's
/// description (not from the lowering's fragment tables): lane `8 * i + j` holds the
/// address of row `j` of 8x8 matrix `i` (eight 16-bit elements, 16 bytes, 16-byte
/// aligned); afterwards lane `t` holds, for each matrix, elements `(t / 4, 2 * (t % 4))`
/// and `(t / 4, 2 * (t % 4) + 1)` (row, column) packed low to high, or with `.trans`
/// `(2 * (t % 4), t / 4)` and `(2 * (t % 4) + 1, t / 4)`. Computed once per warp.
extern "C" fn tessera_emu_ldmatrix(p: *const u8, num: i32, trans: i32, out: *mut u32, site: i32) {
    with((), |c| {
        let num = num.clamp(1, 4) as usize;
        let lane = (c.tid % 32) as usize;
        // The row this lane addresses is read by the instruction (when it is used).
        let mut ok = true;
        if lane < 8 * num {
            if !(p as usize).is_multiple_of(16) {
                misaligned_shared(c, p, 16, site);
                ok = false;
            }
            ok &= note_shared(c, p, 16, false, site);
        }
        let addr = if ok { p as u64 } else { 0 };
        let (shared, len) = (c.blk.shared as usize, c.blk.shared_bytes);
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &[addr],
            |p| c.park(p),
            |w| {
                let row = |i: usize| -> [u16; 8] {
                    let a = w.read(i as u32, 0) as usize;
                    let inside = a >= shared && a + 16 <= shared + len && a.is_multiple_of(16);
                    if !inside {
                        return [0; 8];
                    }
                    // SAFETY: 16 bytes inside the block's shared memory, 16-byte
                    // aligned (checked above); the warp's threads are parked here.
                    let bytes = unsafe { *(a as *const [u8; 16]) };
                    std::array::from_fn(|e| u16::from_le_bytes([bytes[2 * e], bytes[2 * e + 1]]))
                };
                let rows: Vec<[u16; 8]> = (0..8 * num).map(row).collect();
                for t in 0..w.lanes() as usize {
                    for m in 0..num {
                        let (r0, c0, r1, c1) = if trans != 0 {
                            (2 * (t % 4), t / 4, 2 * (t % 4) + 1, t / 4)
                        } else {
                            (t / 4, 2 * (t % 4), t / 4, 2 * (t % 4) + 1)
                        };
                        let lo = rows[8 * m + r0][c0] as u64;
                        let hi = rows[8 * m + r1][c1] as u64;
                        w.write(t as u32, m, lo | hi << 16);
                    }
                }
            },
        );
        for (m, v) in r.iter().take(num).enumerate() {
            // SAFETY: the kernel passes a pointer to its `[4 x i32]` stack slot.
            unsafe { out.add(m).write(*v as u32) };
        }
    })
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

/// `fence.proxy.async.shared::cta` (this thread's shared writes are visible to its
/// later `wgmma` operand reads).
extern "C" fn tessera_emu_fence_proxy_async() {
    with((), |c| c.wg_dirty.set(false))
}

/// `wgmma.fence.sync.aligned`.
extern "C" fn tessera_emu_wgmma_fence(_site: i32) {
    with((), |c| c.wg.borrow_mut().fenced = true)
}

/// `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{f16,bf16}` (see [`super::wgmma`]):
/// `acc` holds this thread's `n / 2` accumulators, which read as [`POISON`] until a
/// wait completes the instruction. `ty` is 0 for f16, 1 for bf16; `flags` bit 0 is
/// `imm-trans-b`, bit 1 `scale-d` (clear: `D = A·B`, the registers are not read).
#[allow(clippy::too_many_arguments)]
extern "C" fn tessera_emu_wgmma(
    ty: i32,
    n: i32,
    desc_a: i64,
    desc_b: i64,
    flags: i32,
    acc: *mut u32,
    slot: i32,
    site: i32,
) {
    with((), |c| {
        wg_issue(c, (ty, n), (desc_a, None), desc_b, flags, acc, slot, site)
    })
}

/// `wgmma.mma_async` with A from registers: `a0..a3` are this thread's A fragment
/// registers (see [`super::wgmma`]); the warp's lanes exchange them here (the
/// instruction is warp-synchronous), each keeping its quad's, and the rest is
/// [`tessera_emu_wgmma`].
#[allow(clippy::too_many_arguments)]
extern "C" fn tessera_emu_wgmma_rs(
    ty: i32,
    n: i32,
    a0: i32,
    a1: i32,
    a2: i32,
    a3: i32,
    desc_b: i64,
    flags: i32,
    acc: *mut u32,
    slot: i32,
    site: i32,
) {
    with((), |c| {
        let dep = [a0, a1, a2, a3].map(|x| x as u32 as u64);
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep,
            |p| c.park(p),
            |w| {
                for l in 0..w.lanes() {
                    let quad = l & !3;
                    for q in 0..4 {
                        for j in 0..4 {
                            w.write(l, (4 * q + j) as usize, w.read(quad + q, j as usize));
                        }
                    }
                }
            },
        );
        let quad: [u32; 16] = std::array::from_fn(|i| r[i] as u32);
        wg_issue(c, (ty, n), (0, Some(quad)), desc_b, flags, acc, slot, site)
    })
}

/// Issues one `wgmma.mma_async` for thread `c` (see [`tessera_emu_wgmma`]).
#[allow(clippy::too_many_arguments)]
fn wg_issue(
    c: &ThreadCtx<'_>,
    (ty, n): (i32, i32),
    (desc_a, a_quad): (i64, Option<[u32; 16]>),
    desc_b: i64,
    flags: i32,
    acc: *mut u32,
    slot: i32,
    site: i32,
) {
    let (trans_b, scale_d) = (flags & 1 != 0, flags & 2 != 0);
    {
        if !(8..=256).contains(&n) || n % 8 != 0 {
            return wg_fail(c, site, format!("N = {n} (8 to 256, a multiple of 8)"));
        }
        let regs = n as usize / 2;
        // SAFETY: the kernel passes its `[n / 2 x i32]` stack slot.
        let acc = unsafe { std::slice::from_raw_parts_mut(acc, regs) };
        let slot = slot as u32;
        if c.wg_dirty.get() {
            return wg_fail(
                c,
                site,
                "the thread wrote shared memory since its last fence.proxy.async: the \
                 wgmma operand reads may not see it"
                    .into(),
            );
        }
        let mut st = c.wg.borrow_mut();
        if st.pending(slot) {
            // Chained onto an in-flight wgmma: the registers must be untouched.
            if acc.iter().any(|&v| v != POISON) {
                drop(st);
                return wg_fail(
                    c,
                    site,
                    "accumulator registers of an in-flight wgmma were modified".into(),
                );
            }
        } else {
            if !st.fenced {
                drop(st);
                return wg_fail(
                    c,
                    site,
                    "no wgmma.fence between writing the accumulator registers and the wgmma".into(),
                );
            }
            st.regs.insert(slot, acc.to_vec());
        }
        st.open.push(WgOp {
            ty: match ty {
                0 => WgType::F16,
                1 => WgType::Bf16,
                2 => WgType::S8,
                3 => WgType::E4M3,
                _ => WgType::E5M2,
            },
            n: n as u32,
            desc_a: desc_a as u64,
            desc_b: desc_b as u64,
            trans_b,
            scale_d,
            a_quad,
            slot,
            site,
        });
        acc.fill(POISON);
    }
}

/// `wgmma.commit_group.sync.aligned`.
extern "C" fn tessera_emu_wgmma_commit(_site: i32) {
    with((), |c| {
        let mut st = c.wg.borrow_mut();
        let g = std::mem::take(&mut st.open);
        st.committed.push_back(g);
    })
}

/// `wgmma.wait_group.sync.aligned pending`: completes every committed group but the
/// newest `pending` (reading their operands from shared memory now), then writes
/// `slot`'s `regs` accumulators to `acc` if none of its wgmmas is still in flight
/// (else [`POISON`]).
extern "C" fn tessera_emu_wgmma_wait(pending: i32, acc: *mut u32, regs: i32, slot: i32, site: i32) {
    with((), |c| {
        let keep = pending.max(0) as usize;
        loop {
            let g = {
                let mut st = c.wg.borrow_mut();
                if st.committed.len() <= keep {
                    break;
                }
                st.committed.pop_front()
            };
            for op in g.into_iter().flatten() {
                let mut regs = c.wg.borrow_mut().regs.remove(&op.slot).unwrap_or_default();
                regs.resize((op.n / 2) as usize, 0);
                let (shared, len) = (c.blk.shared, c.blk.shared_bytes);
                let eb = op.ty.bytes() as usize;
                let r = wg::execute(&op, c.tid, &mut regs, |addr| {
                    let a = addr as usize;
                    if a + eb > len {
                        return Err(format!(
                            "an operand element at shared address {a:#x} is outside the block's {len} bytes"
                        ));
                    }
                    // SAFETY: `eb` bytes inside the block's shared memory (checked).
                    let p = unsafe { shared.add(a) };
                    note_shared(c, p, eb as i32, false, op.site);
                    // SAFETY: as above; unaligned reads of a u8 / u16 are fine.
                    Ok(unsafe {
                        if eb == 1 {
                            p.read() as u16
                        } else {
                            (p as *const u16).read_unaligned()
                        }
                    })
                });
                if let Err(m) = r {
                    wg_fail(c, op.site, m);
                }
                c.wg.borrow_mut().regs.insert(op.slot, regs);
            }
        }
        let regs = regs.max(0) as usize;
        // SAFETY: the kernel passes its `[regs x i32]` stack slot.
        let out = unsafe { std::slice::from_raw_parts_mut(acc, regs) };
        let mut st = c.wg.borrow_mut();
        let slot = slot as u32;
        if st.pending(slot) {
            out.fill(POISON);
            return;
        }
        // The accumulators are ordinary registers again: the next wgmma on them
        // needs a new wgmma.fence.
        st.fenced = false;
        let v = st.regs.remove(&slot);
        drop(st);
        match v {
            Some(v) if v.len() == regs => out.copy_from_slice(&v),
            Some(_) => wg_fail(
                c,
                site,
                "wait for an accumulator tile of another size".into(),
            ),
            // Nothing in flight: the registers stay as they are.
            None => {}
        }
    })
}

fn nv_mma(ty: Half, a: [u32; 4], b: [u32; 2], cf: [f32; 4], d: *mut f32, site: i32) {
    with((), |c| {
        let mut dep = [0u64; 10];
        for i in 0..4 {
            dep[i] = a[i] as u64;
            dep[6 + i] = cf[i].to_bits() as u64;
        }
        dep[4] = b[0] as u64;
        dep[5] = b[1] as u64;
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep,
            |p| c.park(p),
            |w| {
                // Once per warp: gather every lane's fragments, multiply, scatter D.
                let av: Vec<[u32; 4]> = gather(w, 0, |x| x as u32);
                let bv: Vec<[u32; 2]> = gather(w, 4, |x| x as u32);
                let cv: Vec<[f32; 4]> = gather(w, 6, as_f32);
                scatter_d(w, &mma::nv_m16n8k16(ty, &av, &bv, &cv));
            },
        );
        write_d(r, d);
    })
}

/// Every lane's `N` deposit words from word `first` on, each converted by `f`.
fn gather<const N: usize, T>(
    w: &super::team::WarpView<'_>,
    first: usize,
    f: impl Fn(u64) -> T,
) -> Vec<[T; N]> {
    (0..w.lanes())
        .map(|l| std::array::from_fn(|i| f(w.read(l, first + i))))
        .collect()
}

/// An f32 from the low half of a deposit word.
fn as_f32(x: u64) -> f32 {
    f32::from_bits(x as u32)
}

/// Writes every lane's D fragment to its result slots.
fn scatter_d<const N: usize>(w: &super::team::WarpView<'_>, d: &[[f32; N]]) {
    for (l, frag) in d.iter().enumerate().take(w.lanes() as usize) {
        for (i, v) in frag.iter().enumerate() {
            w.write(l as u32, i, v.to_bits() as u64);
        }
    }
}

/// Writes a lane's D fragment (zeros after a team error) to the kernel's
/// `[4 x float]` stack slot `d`.
fn write_d(r: [u64; super::team::SLOT_WORDS], d: *mut f32) {
    for (i, v) in r.iter().take(4).enumerate() {
        // SAFETY: the kernel passes a pointer to its `[4 x float]` stack slot.
        unsafe { d.add(i).write(f32::from_bits(*v as u32)) };
    }
}

fn amd_mma(ty: Half, ab: [u32; 8], cf: [f32; 4], d: *mut f32, site: i32) {
    with((), |c| {
        let mut dep = [0u64; 12];
        for i in 0..8 {
            dep[i] = ab[i] as u64;
        }
        for i in 0..4 {
            dep[8 + i] = cf[i].to_bits() as u64;
        }
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep,
            |p| c.park(p),
            |w| {
                let av: Vec<[u16; 4]> = gather(w, 0, |x| x as u16);
                let bv: Vec<[u16; 4]> = gather(w, 4, |x| x as u16);
                let cv: Vec<[f32; 4]> = gather(w, 8, as_f32);
                scatter_d(w, &mma::amd_16x16x16(ty, &av, &bv, &cv));
            },
        );
        write_d(r, d);
    })
}

macro_rules! nv_entry {
    ($name:ident, $ty:expr) => {
        #[allow(clippy::too_many_arguments)]
        extern "C" fn $name(
            a0: u32,
            a1: u32,
            a2: u32,
            a3: u32,
            b0: u32,
            b1: u32,
            c0: f32,
            c1: f32,
            c2: f32,
            c3: f32,
            d: *mut f32,
            site: i32,
        ) {
            nv_mma($ty, [a0, a1, a2, a3], [b0, b1], [c0, c1, c2, c3], d, site)
        }
    };
}

macro_rules! amd_entry {
    ($name:ident, $ty:expr) => {
        #[allow(clippy::too_many_arguments)]
        extern "C" fn $name(
            a0: u32,
            a1: u32,
            a2: u32,
            a3: u32,
            b0: u32,
            b1: u32,
            b2: u32,
            b3: u32,
            c0: f32,
            c1: f32,
            c2: f32,
            c3: f32,
            d: *mut f32,
            site: i32,
        ) {
            amd_mma(
                $ty,
                [a0, a1, a2, a3, b0, b1, b2, b3],
                [c0, c1, c2, c3],
                d,
                site,
            )
        }
    };
}

fn amd_mma32(ty: Half, ab: *const u32, cd: *mut f32, site: i32) {
    with((), |c| {
        let mut dep = [0u64; 24];
        for (i, d) in dep.iter_mut().enumerate().take(8) {
            // SAFETY: the kernel passes its `[8 x i32]` slot.
            *d = unsafe { ab.add(i).read() } as u64;
        }
        for i in 0..16 {
            // SAFETY: the kernel passes its `[16 x float]` slot.
            dep[8 + i] = unsafe { cd.add(i).read() }.to_bits() as u64;
        }
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep,
            |p| c.park(p),
            |w| {
                let av: Vec<[u16; 4]> = gather(w, 0, |x| x as u16);
                let bv: Vec<[u16; 4]> = gather(w, 4, |x| x as u16);
                let cv: Vec<[f32; 16]> = gather(w, 8, as_f32);
                scatter_d(w, &mma::amd_32x32x8(ty, &av, &bv, &cv));
            },
        );
        for (i, v) in r.iter().take(16).enumerate() {
            // SAFETY: as above.
            unsafe { cd.add(i).write(f32::from_bits(*v as u32)) };
        }
    })
}

/// `tessera_emu_mma_i8(kind, ab, a_words, cd, c_regs, site)`: see
/// `lower::arch::emu::emit_mma_i8`. The instruction's shape follows from `kind`; a
/// slot of another size is an emulator error, not a guess.
extern "C" fn tessera_emu_mma_i8(
    kind: i32,
    ab: *const u32,
    a_words: i32,
    cd: *mut i32,
    c_regs: i32,
    site: i32,
) {
    // (A words, B words, C registers) of each instruction.
    let want: (usize, usize, usize) = match kind {
        0 | 3 | 4 => (4, 2, 4),
        1 => (2, 2, 4),
        _ => (2, 2, 16),
    };
    let (na, nc) = (a_words.max(0) as usize, c_regs.max(0) as usize);
    if (na, nc) != (want.0, want.2) {
        with((), |c| {
            wg_fail(
                c,
                site,
                format!("i8 matrix instruction {kind} with {na} A registers and {nc} accumulators"),
            )
        });
        return;
    }
    let nab = want.0 + want.1;
    with((), |c| {
        let mut dep = [0u64; super::team::SLOT_WORDS];
        for (i, d) in dep.iter_mut().enumerate().take(nab) {
            // SAFETY: the kernel passes its `[a_words + b_words x i32]` slot.
            *d = unsafe { ab.add(i).read() } as u64;
        }
        for i in 0..nc {
            // SAFETY: the kernel passes its `[c_regs x i32]` slot.
            dep[nab + i] = unsafe { cd.add(i).read() } as u32 as u64;
        }
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep[..nab + nc],
            |p| c.park(p),
            |w| {
                let as_i32 = |x: u64| x as u32 as i32;
                let scatter = |d: &[Vec<i32>]| {
                    for (l, frag) in d.iter().enumerate().take(w.lanes() as usize) {
                        for (i, v) in frag.iter().enumerate() {
                            w.write(l as u32, i, *v as u32 as u64);
                        }
                    }
                };
                let d: Vec<Vec<i32>> = match kind {
                    3 | 4 => mma::nv_m16n8k32_f8(
                        if kind == 3 {
                            mma::Fp8::E4M3
                        } else {
                            mma::Fp8::E5M2
                        },
                        &gather::<4, _>(w, 0, |x| x as u32),
                        &gather::<2, _>(w, 4, |x| x as u32),
                        &gather::<4, _>(w, 6, |x| f32::from_bits(x as u32)),
                    )
                    .iter()
                    .map(|x| x.iter().map(|f| f.to_bits() as i32).collect())
                    .collect(),
                    0 => mma::nv_m16n8k32_s8(
                        &gather::<4, _>(w, 0, |x| x as u32),
                        &gather::<2, _>(w, 4, |x| x as u32),
                        &gather::<4, _>(w, 6, as_i32),
                    )
                    .iter()
                    .map(|x| x.to_vec())
                    .collect(),
                    1 => mma::amd_i8::<4>(
                        16,
                        &gather::<2, _>(w, 0, |x| x as u32),
                        &gather::<2, _>(w, 2, |x| x as u32),
                        &gather::<4, _>(w, 4, as_i32),
                    )
                    .iter()
                    .map(|x| x.to_vec())
                    .collect(),
                    _ => mma::amd_i8::<16>(
                        32,
                        &gather::<2, _>(w, 0, |x| x as u32),
                        &gather::<2, _>(w, 2, |x| x as u32),
                        &gather::<16, _>(w, 4, as_i32),
                    )
                    .iter()
                    .map(|x| x.to_vec())
                    .collect(),
                };
                scatter(&d);
            },
        );
        for (i, v) in r.iter().take(nc).enumerate() {
            // SAFETY: as above.
            unsafe { cd.add(i).write(*v as u32 as i32) };
        }
    })
}

extern "C" fn tessera_emu_mma_amd32_f16(ab: *const u32, cd: *mut f32, site: i32) {
    amd_mma32(Half::F16, ab, cd, site)
}

extern "C" fn tessera_emu_mma_amd32_bf16(ab: *const u32, cd: *mut f32, site: i32) {
    amd_mma32(Half::Bf16, ab, cd, site)
}

nv_entry!(tessera_emu_mma_nv_f16, Half::F16);
nv_entry!(tessera_emu_mma_nv_bf16, Half::Bf16);
amd_entry!(tessera_emu_mma_amd_f16, Half::F16);
amd_entry!(tessera_emu_mma_amd_bf16, Half::Bf16);

/// The emulator runtime's symbols (the NVSHMEM calls' are `shmem`'s), with their
/// addresses.
pub(crate) fn symbols() -> Vec<(&'static str, usize)> {
    vec![
        ("tessera_emu_tid", tessera_emu_tid as *const () as usize),
        (
            "tessera_emu_program_id",
            tessera_emu_program_id as *const () as usize,
        ),
        (
            "tessera_emu_num_programs",
            tessera_emu_num_programs as *const () as usize,
        ),
        (
            "tessera_emu_barrier",
            tessera_emu_barrier as *const () as usize,
        ),
        (
            "tessera_emu_shuffle_xor",
            tessera_emu_shuffle_xor as *const () as usize,
        ),
        (
            "tessera_emu_shared_base",
            tessera_emu_shared_base as *const () as usize,
        ),
        (
            "tessera_emu_check_global",
            tessera_emu_check_global as *const () as usize,
        ),
        (
            "tessera_emu_timer_ns",
            tessera_emu_timer_ns as *const () as usize,
        ),
        ("tessera_emu_yield", tessera_emu_yield as *const () as usize),
        (
            "tessera_emu_check_divisor",
            tessera_emu_check_divisor as *const () as usize,
        ),
        (
            "tessera_emu_mma_i8",
            tessera_emu_mma_i8 as *const () as usize,
        ),
        (
            "tessera_emu_mma_amd32_f16",
            tessera_emu_mma_amd32_f16 as *const () as usize,
        ),
        (
            "tessera_emu_mma_amd32_bf16",
            tessera_emu_mma_amd32_bf16 as *const () as usize,
        ),
        (
            "tessera_emu_fence_proxy_async",
            tessera_emu_fence_proxy_async as *const () as usize,
        ),
        (
            "tessera_emu_wgmma_fence",
            tessera_emu_wgmma_fence as *const () as usize,
        ),
        ("tessera_emu_wgmma", tessera_emu_wgmma as *const () as usize),
        (
            "tessera_emu_wgmma_rs",
            tessera_emu_wgmma_rs as *const () as usize,
        ),
        (
            "tessera_emu_wgmma_commit",
            tessera_emu_wgmma_commit as *const () as usize,
        ),
        (
            "tessera_emu_wgmma_wait",
            tessera_emu_wgmma_wait as *const () as usize,
        ),
        (
            "tessera_emu_ldmatrix",
            tessera_emu_ldmatrix as *const () as usize,
        ),
        (
            "tessera_emu_cp_async",
            tessera_emu_cp_async as *const () as usize,
        ),
        (
            "tessera_emu_cp_async_commit",
            tessera_emu_cp_async_commit as *const () as usize,
        ),
        (
            "tessera_emu_cp_async_wait",
            tessera_emu_cp_async_wait as *const () as usize,
        ),
        (
            "tessera_emu_mbar_init",
            tessera_emu_mbar_init as *const () as usize,
        ),
        (
            "tessera_emu_mbar_inval",
            tessera_emu_mbar_inval as *const () as usize,
        ),
        (
            "tessera_emu_mbar_expect_tx",
            tessera_emu_mbar_expect_tx as *const () as usize,
        ),
        (
            "tessera_emu_mbar_wait",
            tessera_emu_mbar_wait as *const () as usize,
        ),
        (
            "tessera_emu_tma_load",
            tessera_emu_tma_load as *const () as usize,
        ),
        (
            "tessera_emu_tma_store",
            tessera_emu_tma_store as *const () as usize,
        ),
        (
            "tessera_emu_tma_store_wait",
            tessera_emu_tma_store_wait as *const () as usize,
        ),
        (
            "tessera_emu_bad_peer",
            tessera_emu_bad_peer as *const () as usize,
        ),
        (
            "tessera_emu_loop_ok",
            tessera_emu_loop_ok as *const () as usize,
        ),
        (
            "tessera_emu_note_shared",
            tessera_emu_note_shared as *const () as usize,
        ),
        (
            "tessera_emu_mma_nv_f16",
            tessera_emu_mma_nv_f16 as *const () as usize,
        ),
        (
            "tessera_emu_mma_nv_bf16",
            tessera_emu_mma_nv_bf16 as *const () as usize,
        ),
        (
            "tessera_emu_mma_amd_f16",
            tessera_emu_mma_amd_f16 as *const () as usize,
        ),
        (
            "tessera_emu_mma_amd_bf16",
            tessera_emu_mma_amd_bf16 as *const () as usize,
        ),
    ]
    .into_iter()
    .chain(crate::host::builtins())
    .collect()
}

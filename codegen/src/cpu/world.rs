//! Communicating kernels on the compiled CPU device: what the compiled code calls
//! (`wait_until`, `barrier_all`, the sanitizer's check of accesses that may reach a
//! peer) and how the program instances of a kernel that waits are run.
//!
//! **Memory.** Every rank's heap is mapped in this process (thread ranks share it;
//! process ranks map each other's heaps), so a remote access is a host access at the
//! peer's copy: the launch passes, per symmetric parameter and rank, the distance
//! from this rank's copy to that rank's ([`Comm::words`]). Buffers reached through a
//! communication engine (ranks on other nodes) are not compiled: such a launch runs
//! on the interpreter.
//!
//! **Waiting.** A kernel that waits (`wait_until`, `barrier_all`) needs every program
//! instance resident. Each is a stackful coroutine ([`corosensei`], stacks from the
//! emulator's arenas, reserved and committed only where touched); a launch runs them
//! on a few OS threads (the world's ranks together as many as the machine has cores;
//! at most one per program), worker `w` owning programs `w, w + W, ...` and resuming
//! them round robin. A wait polls its word once per turn and suspends while the
//! comparison fails; a round in which no program got anywhere (no wait succeeded,
//! none finished) backs off (spin, then yield the core for up to 2 ms, then sleep:
//! [`Backoff`]). Stacks and scratch areas are pooled between launches. Long loops also give the others a turn (every 1024th
//! iteration, at the watchdog's poll), so a program that spins on memory instead of
//! waiting cannot starve the one it waits for. Coroutines stay on their worker.
//!
//! **Protocol.** Signals are `atomicrmw`s on the word; a wait loads it (relaxed) until
//! the comparison holds, then fences (acquire); `barrier_all` counts arrivals in rank
//! 0's control words with the interpreter's protocol ([`ctrl`]), so compiled and
//! interpreted ranks can meet at one barrier. A wait gives up after the world's
//! timeout, and stops when any rank has failed (its abort word), as on the
//! interpreter.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use corosensei::{Coroutine, CoroutineResult, Yielder};
use tessera_ir::interp::{CommWorld, ctrl};
use tessera_ir::ir::CmpPred;

use crate::host::stack::{ArenaStack, StackArena};
use crate::lower::host::WaitStatus;

/// What the runtime functions need of the launch.
pub(super) struct Comm<'a> {
    /// The world (this rank, every rank's control words, the timeout).
    pub world: &'a CommWorld,
    /// The kernel's `comm` words (see `lower::host`).
    pub words: Vec<u64>,
    /// Per pointer parameter: every buffer an access through it may reach (this
    /// rank's, then for a symmetric buffer every rank's copy), `(address, bytes)`.
    pub reach: Vec<Vec<(u64, u64)>>,
    /// Program instances of the launch on every rank (`barrier_all`'s participants).
    pub participants: u64,
}

thread_local! {
    /// The launch of the program running on this thread.
    static COMM: Cell<*const Comm<'static>> = const { Cell::new(std::ptr::null()) };
    /// The coroutine running on this thread (null: a plain call).
    static YIELDER: Cell<*const Yielder<(), ()>> = const { Cell::new(std::ptr::null()) };
    /// Whether a program got anywhere since the worker last looked.
    static PROGRESS: Cell<bool> = const { Cell::new(false) };
}

/// Makes `comm` the launch of the programs this thread runs until the guard drops.
pub(super) fn enter(comm: &Comm<'_>) -> impl Drop {
    struct Leave(*const Comm<'static>);
    impl Drop for Leave {
        fn drop(&mut self) {
            COMM.with(|c| c.set(self.0));
        }
    }
    let prev = COMM.with(|c| c.replace((comm as *const Comm<'_>).cast()));
    Leave(prev)
}

fn with_comm<T>(f: impl FnOnce(&Comm<'_>) -> T) -> Option<T> {
    let p = COMM.with(Cell::get);
    // SAFETY: `enter` set the pointer to a launch that outlives the guard, and the
    // guard is alive while the launch's programs run on this thread (the kernel calls
    // the runtime only from inside a program).
    (!p.is_null()).then(|| f(unsafe { &*p }))
}

/// Lets the other programs of this worker run (a coroutine suspends; a plain call
/// backs off with `b`).
fn pause(b: &mut Backoff) {
    let y = YIELDER.with(Cell::get);
    if y.is_null() {
        b.snooze();
    } else {
        // SAFETY: the worker points `YIELDER` at the yielder of the coroutine it
        // resumes, which is running (this code is on its stack).
        unsafe { (*y).suspend(()) };
        // The worker may have resumed others meanwhile: the thread-local is this
        // coroutine's again (the worker sets it before each resume).
    }
}

/// Gives the other programs a turn from a long loop (the watchdog's poll).
pub(super) fn loop_turn() {
    let y = YIELDER.with(Cell::get);
    if !y.is_null() {
        PROGRESS.with(|p| p.set(true));
        // SAFETY: as in `pause`.
        unsafe { (*y).suspend(()) };
    }
}

/// Between polls: spins, then yields the core (to other ranks' threads) for up to
/// [`YIELD_FOR`], then sleeps 50 µs at a time. Sleeping early costs more than it
/// saves: a sleep lasts at least the kernel's timer slack (50 µs), and a rank that
/// sleeps through its peer's signal makes that peer wait for it in turn at the next
/// step. (Timed alternately against a 60 µs window on the 4 KiB all_reduce on 2
/// ranks, the two did not differ measurably: BENCHMARKS.md.)
#[derive(Default)]
struct Backoff {
    polls: u32,
    since: Option<Instant>,
}

/// How long a waiting thread keeps its core (yielding it to other runnable threads)
/// before it sleeps.
const YIELD_FOR: Duration = Duration::from_millis(2);

impl Backoff {
    fn snooze(&mut self) {
        self.polls = self.polls.saturating_add(1);
        if self.polls < 64 {
            std::hint::spin_loop();
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() < YIELD_FOR {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Polls `ready` until it returns `Some` (stored in `err[5]`, status 0), the world
/// aborts (`Aborted`, the failed rank in `err[5]`) or the world's timeout passes
/// (`Timeout`, `stalled()` in `err[5..8]`).
fn wait_for(
    err: *mut u64,
    mut ready: impl FnMut() -> Option<u64>,
    stalled: impl Fn() -> [u64; 3],
) -> i32 {
    // SAFETY: the compiled kernel passes its failure record, `ERR_WORDS` words that
    // its launch owns for the program's run (no other program touches them).
    let rec = unsafe { std::slice::from_raw_parts_mut(err, crate::lower::host::ERR_WORDS) };
    let mut check = || {
        let v = ready()?;
        fence(Ordering::Acquire);
        PROGRESS.with(|p| p.set(true));
        Some(v)
    };
    // Most waits find their word set (nothing else to look up then).
    if let Some(v) = check() {
        rec[5] = v;
        return 0;
    }
    let waited = with_comm(|c| {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        for polls in 0u32.. {
            pause(&mut backoff);
            if let Some(v) = check() {
                rec[5] = v;
                return 0;
            }
            if let Some(r) = c.world.failed_rank() {
                rec[5] = r as u64;
                return WaitStatus::Aborted as i32;
            }
            // The clock only now and then (reading it costs as much as a poll).
            if polls % 64 == 63 && start.elapsed() >= c.world.timeout {
                break;
            }
        }
        // Out of time (or four billion polls: past any timeout).
        rec[5..8].copy_from_slice(&stalled());
        WaitStatus::Timeout as i32
    });
    waited.unwrap_or_else(|| {
        rec[5..8].copy_from_slice(&stalled());
        WaitStatus::Timeout as i32
    })
}

/// `wait_until` (see `lower::host::WAIT`).
pub(super) extern "C" fn tessera_cpu_wait(
    word: *const u64,
    pred: i32,
    value: u64,
    err: *mut u64,
) -> i32 {
    let pred = CmpPred::ALL
        .get(pred as usize)
        .copied()
        .unwrap_or(CmpPred::Eq);
    // SAFETY: `word` is the signal word the kernel computed: a `u64` element of one
    // of the launch's buffers (checked before the call unless the kernel was compiled
    // with `Checks::unchecked`, whose caller vouches for every index), 8-byte aligned like every
    // `u64` element of a host buffer, and other programs and ranks access it only
    // atomically while the launch runs.
    let w = unsafe { AtomicU64::from_ptr(word.cast_mut()) };
    wait_for(
        err,
        || {
            let seen = w.load(Ordering::Relaxed);
            pred.holds(seen, value).then_some(seen)
        },
        || [w.load(Ordering::Relaxed), word as u64, value],
    )
}

/// `barrier_all` (see `lower::host::BARRIER`): the interpreter's protocol on rank 0's
/// control words.
pub(super) extern "C" fn tessera_cpu_barrier(err: *mut u64) -> i32 {
    let Some((base, total)) = with_comm(|c| {
        (
            c.world.ctrl.first().map(|b| b.as_mut_ptr() as usize),
            c.participants,
        )
    }) else {
        return WaitStatus::Timeout as i32;
    };
    let Some(base) = base else {
        return WaitStatus::Timeout as i32;
    };
    // SAFETY: rank 0's control words, `ctrl::WORDS` u64s at the start of its heap
    // (`launch` checked the buffer is host memory of at least that many words),
    // mapped for the world's life and accessed only atomically.
    let (counter, generation) = unsafe {
        let words = base as *mut u64;
        (
            AtomicU64::from_ptr(words.add(ctrl::BARRIER)),
            AtomicU64::from_ptr(words.add(ctrl::BARRIER_GEN)),
        )
    };
    let gen_seen = generation.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    let old = counter.fetch_add(1, Ordering::AcqRel);
    if old + 1 >= total {
        counter.store(0, Ordering::Relaxed);
        generation.fetch_add(1, Ordering::Release);
        PROGRESS.with(|p| p.set(true));
        return 0;
    }
    wait_for(
        err,
        || (generation.load(Ordering::Relaxed) != gen_seen).then_some(0),
        || [counter.load(Ordering::Relaxed), total, total],
    )
}

/// The sanitizer's check of an access that may reach a peer (see
/// `lower::host::CHECK`). The access must lie inside some rank's copy of the
/// parameter's buffer (any buffer of the launch for a pointer of mixed origin): the
/// interpreter checks it against the one peer's copy the pointer was made for, which
/// only differs for an access that overruns one rank's copy into another's.
pub(super) extern "C" fn tessera_cpu_check(param: i64, addr: i64, bytes: i64) -> i64 {
    with_comm(|c| {
        let all: Vec<&(u64, u64)> = match usize::try_from(param) {
            Ok(k) => c
                .reach
                .get(k)
                .map(|r| r.iter().collect())
                .unwrap_or_default(),
            Err(_) => c.reach.iter().flatten().collect(),
        };
        let mut nearest: Option<i64> = None;
        for &&(base, len) in &all {
            let off = addr.wrapping_sub(base as i64);
            if off >= 0 && off.saturating_add(bytes) <= len as i64 {
                return i64::MIN;
            }
            if nearest.is_none_or(|n| off.unsigned_abs() < n.unsigned_abs()) {
                nearest = Some(off);
            }
        }
        nearest.unwrap_or(0).max(i64::MIN + 1)
    })
    .unwrap_or(0)
}

/// A program instance as a coroutine on an arena stack.
type Program<'s> = Coroutine<(), (), (), ArenaStack<'s>>;

/// Stack arenas and scratch areas kept between launches of waiting kernels: reserving
/// stacks (a mapping, a guard page each) and touching fresh scratch pages cost a
/// small launch more than running it.
struct Pool {
    arenas: Vec<StackArena>,
    scratch: Vec<Vec<u64>>,
}

/// The most arenas (and scratch areas) kept.
const POOLED: usize = 16;

/// The most stacks the pooled arenas hold together (each guarded stack counts
/// against the process's budget of guarded stacks, `stack::GUARDED_STACKS`, which
/// the emulator shares).
const POOLED_STACKS: usize = 4096;

/// The largest scratch area kept (bytes).
const POOLED_SCRATCH: usize = 64 << 20;

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    static POOL: std::sync::Mutex<Pool> = std::sync::Mutex::new(Pool {
        arenas: Vec::new(),
        scratch: Vec::new(),
    });
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// An arena of at least `count` stacks: the smallest pooled one that is large
/// enough, or a new one.
fn take_arena(count: usize) -> Result<StackArena, String> {
    {
        let mut p = pool();
        if let Some(i) = (0..p.arenas.len())
            .filter(|&i| p.arenas[i].count() >= count)
            .min_by_key(|&i| p.arenas[i].count())
        {
            return Ok(p.arenas.swap_remove(i));
        }
    }
    StackArena::new(count.next_power_of_two(), 0).map_err(|e| {
        format!(
            "{count} coroutine stacks ({} MiB reserved): {}",
            e.bytes >> 20,
            e.message
        )
    })
}

/// Runs programs `0..total` as coroutines on `workers` OS threads (see the module
/// docs), `run(lin, scratch)` being one whole program with its own `scratch_words`
/// words of scratch. Fails when the stacks cannot be reserved or the threads
/// started.
pub(super) fn run_resident(
    comm: &Comm<'_>,
    total: u64,
    workers: usize,
    scratch_words: usize,
    run: &(dyn Fn(u64, &mut [u64]) + Sync),
) -> Result<(), String> {
    let workers = workers.clamp(1, total.max(1) as usize);
    let worker = |w: usize| -> Result<(), String> {
        let _launch = enter(comm);
        let mine: Vec<u64> = (w as u64..total).step_by(workers).collect();
        let arena = take_arena(mine.len())?;
        let mut scratch = pool().scratch.pop().unwrap_or_default();
        scratch.resize(mine.len() * scratch_words, 0);
        let mut areas = scratch.chunks_mut(scratch_words.max(1));
        let yielders: Vec<Cell<*const Yielder<(), ()>>> =
            mine.iter().map(|_| Cell::new(std::ptr::null())).collect();
        let mut progs: Vec<Option<Program<'_>>> = mine
            .iter()
            .enumerate()
            .map(|(i, &lin)| {
                let slot = &yielders[i] as *const Cell<*const Yielder<(), ()>> as usize;
                let run = run as *const (dyn Fn(u64, &mut [u64]) + Sync);
                let area = areas.next().unwrap_or_default();
                let area = (area.as_mut_ptr() as usize, area.len());
                let body = move |y: &Yielder<(), ()>, ()| {
                    // SAFETY: `yielders` outlives every coroutine (each is driven to
                    // its end below, before the vector goes).
                    unsafe { &*(slot as *const Cell<*const Yielder<(), ()>>) }
                        .set(y as *const Yielder<(), ()>);
                    YIELDER.with(|c| c.set(y as *const Yielder<(), ()>));
                    // SAFETY: this program's own part of `scratch`, which outlives
                    // the coroutine (as above) and no other program touches.
                    let area =
                        unsafe { std::slice::from_raw_parts_mut(area.0 as *mut u64, area.1) };
                    // SAFETY: `run` outlives the coroutines, as above.
                    unsafe { (*run)(lin, area) };
                };
                // SAFETY: each stack is given to one coroutine; the closure holds only
                // addresses of what outlives it (the coroutine is driven to its end).
                let stack = unsafe { arena.stack(i) };
                // SAFETY: as above: what the body refers to outlives the coroutine.
                Some(unsafe { Coroutine::with_stack_unchecked(stack, body) })
            })
            .collect();
        let mut live = progs.len();
        let mut backoff = Backoff::default();
        while live > 0 {
            PROGRESS.with(|p| p.set(false));
            for (i, slot) in progs.iter_mut().enumerate() {
                let Some(co) = slot.as_mut() else { continue };
                YIELDER.with(|c| c.set(yielders[i].get()));
                let r = co.resume(());
                YIELDER.with(|c| c.set(std::ptr::null()));
                if !arena.intact(i) {
                    eprintln!(
                        "tessera: a program instance overflowed its {} KiB stack on the CPU device; aborting",
                        arena.bytes >> 10
                    );
                    std::process::abort();
                }
                if let CoroutineResult::Return(()) = r {
                    *slot = None;
                    live -= 1;
                    PROGRESS.with(|p| p.set(true));
                }
            }
            if PROGRESS.with(Cell::get) {
                backoff = Backoff::default();
            } else {
                backoff.snooze();
            }
        }
        // Every coroutine has finished: the stacks and scratch are free again.
        drop(progs);
        let mut p = pool();
        let stacks: usize = p.arenas.iter().map(StackArena::count).sum();
        if p.arenas.len() < POOLED && stacks + arena.count() <= POOLED_STACKS {
            p.arenas.push(arena);
        }
        if p.scratch.len() < POOLED && scratch.capacity() * 8 <= POOLED_SCRATCH {
            p.scratch.push(scratch);
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..workers)
            .map(|w| {
                std::thread::Builder::new()
                    .name(format!("tessera-cpu-{w}"))
                    .spawn_scoped(s, move || worker(w))
            })
            .collect();
        let mut out = worker(0);
        for h in handles {
            let r = match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err("a worker thread panicked".into())),
                Err(e) => Err(format!("could not start a worker thread: {e}")),
            };
            if out.is_ok() {
                out = r;
            }
        }
        out
    })
}

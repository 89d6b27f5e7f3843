//! The MPI transport (feature `mpi`): the ranks of a world are the processes of an
//! MPI job (`mpirun`, `srun`), one CPU rank each, on any number of nodes. Every byte
//! between ranks goes through MPI one-sided communication:
//!
//! - each rank's symmetric heap is its part of one RMA window
//!   (`MPI_Win_allocate`, displacement unit 1: offsets are bytes), opened once for
//!   passive-target access to every rank (`MPI_Win_lock_all`);
//! - a rank reads and writes its own heap directly (it is local memory), and so the
//!   heaps of its node's other ranks where MPI can share memory between them (the
//!   node's heaps are then allocated together, `MPI_Win_allocate_shared`, and the
//!   window over every rank is created on them, `MPI_Win_create`; [`SHARED_VAR`]
//!   turns this off); it reaches other
//!   peers through the window: loads are `MPI_Rget`, stores `MPI_Put`, atomics
//!   `MPI_Compare_and_swap` (in a loop applying the CPU's own operation, so results
//!   are bit-exact with the other transports) and signals `MPI_Fetch_and_op`
//!   (`MPI_SUM`). Atomics on mapped heaps (a rank's own included) go through the
//!   window too: MPI's atomics are only atomic with one another;
//! - ordering (see [`tessera_ir::interp::RemoteMemory`]): a put completes at the
//!   next get, atomic or quiet of this process (`MPI_Win_flush` of each rank with
//!   puts pending; until then the put's data is a copy of its own), each get and
//!   atomic completes before it returns, and a kernel's launch ends with a quiet: the
//!   language's release/acquire orderings hold;
//! - waits poll local window memory, letting MPI progress between polls
//!   (`MPI_Iprobe`, `MPI_Win_sync`): with a software transport (TCP) a peer's put
//!   lands only when the target process calls into MPI;
//! - the team segment (host barriers, failure record, allocation checks) is rank 0's
//!   part of a second window, reached through the engine by every rank.
//!
//! **A rank that stops answering** (stopped, hung, or busy elsewhere for longer than
//! the world's wait timeout) fails the others' operations on it within the wait
//! timeout with an error naming it (`rank N stopped answering (rank M timed out
//! ...)`), as a process world's barrier does, instead of blocking them inside MPI:
//!
//! - every wait for a peer is a request polled with `MPI_Test` against a deadline
//!   of the wait timeout, the process-wide MPI lock released between polls (the
//!   process's other threads go on; polling serves the peers' requests, as a
//!   blocking call would): gets (`MPI_Rget`), the collectives (`MPI_Iallgather`,
//!   `MPI_Iallreduce`, `MPI_Ibarrier`), and probes: an `MPI_Rget` of the location
//!   an atomic just targeted (`MPI_Compare_and_swap` and `MPI_Fetch_and_op` have no
//!   request form), and of a byte of each rank whose puts must complete. The target
//!   answers them in order after what it was sent before (Open MPI's `osc/pt2pt`
//!   serves one origin's operations in order), so once a probe is back, the call
//!   that completes the operations (`MPI_Win_flush_local`, or `MPI_Win_flush` for
//!   puts and where `osc/pt2pt`'s local flush would wait for other requests, see
//!   [`Peer::complete_at_origin`]) waits at most for one more answer of a rank that
//!   just answered;
//! - `osc/pt2pt` grants the `MPI_Win_lock_all` epoch to each peer lazily, by a round
//!   trip, and waits for every grant inside each later call of the window: every
//!   peer is reached once when the window opens, while every rank is there to
//!   answer ([`Window::reach_every_rank`]);
//! - every MPI call that may wait for others is watched: one that has not returned
//!   within the wait timeout (a rank that stopped in the instant between answering
//!   a probe and the flush; a one-sided component that completes operations inside
//!   the call, as `osc/ucx`'s atomics do; the collective creation and freeing of
//!   windows, entered right after a polled collective every rank passed) leaves its
//!   thread inside MPI for good, holding the MPI lock, so a watchdog thread ends
//!   the process (exit status 1) with the error naming the rank;
//! - a request that outlived its deadline stays active in MPI (RMA requests cannot
//!   be cancelled; its buffers are leaked): its rank is recorded as stopped, and
//!   every later operation on it fails at once with the same error, while the other
//!   ranks stay reachable. The world is told (on a thread of its own), which records
//!   the stopped rank as the root cause for the other ranks and abandons the
//!   world's windows. A collective past its deadline breaks the whole transport (no
//!   MPI call is made after it). Either way windows are left to the process's exit
//!   instead of being freed collectively, and MPI is not finalized (both would wait
//!   for the stopped rank): `mpirun` then ends the job. Windows of a world that
//!   failed otherwise (a rank's error, a host barrier's timeout) are freed only if
//!   every rank comes to free them within the wait timeout (an `MPI_Ibarrier`),
//!   and left alike when not.
//!
//! MPI is initialized once per process (`MPI_THREAD_SERIALIZED`: every call here
//! holds one process-wide lock, so program instances on many threads share it) and
//! finalized when the last world of the process is gone; a process can thus join
//! MPI worlds one after another but not after the last one ended (MPI cannot be
//! initialized twice). Freeing a window is collective: a rank's [`Rank`] and the
//! symmetric buffers it allocated are released together on every rank. A healthy
//! world's ranks wait for one another there for as long as it takes (a rank may
//! finish long after another), as `MPI_Finalize` does at the job's end.
//!
//! [`Rank`]: super::Rank

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use mpi::ffi;
use tessera_ir::interp::{HostMemory, RemoteMemory};

/// The process's MPI library, initialized (finalized when dropped).
pub(super) struct Mpi {
    universe: Mutex<Option<mpi::environment::Universe>>,
    /// This process's rank in `MPI_COMM_WORLD`.
    pub(super) rank: u32,
    /// `MPI_COMM_WORLD`'s size.
    pub(super) size: u32,
}

/// Every MPI call holds it (`MPI_THREAD_SERIALIZED`).
static LOCK: Mutex<()> = Mutex::new(());
/// The live library, if any.
static LIB: Mutex<Weak<Mpi>> = Mutex::new(Weak::new());
/// Why this process's MPI transport is broken, once it is (a collective outlived its
/// deadline, see the module docs): no MPI call is made after it is set.
static BROKEN: OnceLock<String> = OnceLock::new();
/// The ranks that stopped answering this process (a request to each outlived its
/// deadline), with the error naming each. Requests to them stay active in MPI (RMA
/// requests cannot be cancelled), so nothing waits for them again: operations on
/// them fail at once, and windows and MPI are left to the process's exit.
static STOPPED: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

type Guard = MutexGuard<'static, ()>;

/// The MPI lock, or the reason the transport is broken (then no MPI call may be
/// made).
fn lock() -> Result<Guard, String> {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    match BROKEN.get() {
        None => Ok(g),
        Some(why) => Err(why.clone()),
    }
}

/// Marks the transport broken because of `why` (the first reason stays) and answers
/// the reason in force.
fn break_transport(why: String) -> String {
    BROKEN.get_or_init(|| why).clone()
}

fn stopped_ranks() -> MutexGuard<'static, Vec<(u32, String)>> {
    STOPPED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The error naming `rank` if it stopped answering this process.
fn stopped(rank: u32) -> Option<String> {
    stopped_ranks()
        .iter()
        .find(|(r, _)| *r == rank)
        .map(|(_, why)| why.clone())
}

/// Why freeing collectively (windows, MPI) would wait for a rank that is not
/// coming, if it would: the transport is broken, or a rank stopped answering.
fn cannot_free() -> Option<String> {
    BROKEN
        .get()
        .cloned()
        .or_else(|| stopped_ranks().first().map(|(_, why)| why.clone()))
}

/// Records that `rank` stopped answering (`why()`: the error naming it, unless it
/// was recorded already): answers the error in force, and whether it is new.
fn mark_stopped(rank: u32, why: impl FnOnce() -> String) -> (String, bool) {
    let mut s = stopped_ranks();
    match s.iter().find(|(r, _)| *r == rank) {
        Some((_, w)) => (w.clone(), false),
        None => {
            let w = why();
            s.push((rank, w.clone()));
            (w, true)
        }
    }
}

/// The error of a request to rank `target` that outlived its deadline.
fn stopped_answering(me: u32, target: u32, what: &str, timeout: Duration) -> String {
    format!(
        "rank {target} stopped answering (rank {me} timed out after {:.3} s waiting for {what}: stopped, hung or busy elsewhere?); this process no longer reaches it",
        timeout.as_secs_f64()
    )
}

/// The error of a collective that outlived its deadline.
fn collective_late(what: &str, timeout: Duration) -> String {
    format!(
        "a rank of the MPI job stopped answering: {what} did not complete within {:.3} s (a rank has not reached it: stopped, hung or busy elsewhere?); this process's MPI transport is unusable from now on",
        timeout.as_secs_f64()
    )
}

/// `MPI_REQUEST_NULL`.
fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading MPI's predefined handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// When a wait that began now and may last `timeout` is late (`None`: never).
fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Polls `reqs` (requests this process started; `MPI_Test` turns each into
/// `MPI_REQUEST_NULL` once complete) until every one completes, releasing the MPI
/// lock between polls. When `late()` says the deadline passed first, the error is
/// `on_late(i)` (`i`: a request still active), called with the lock released. The
/// requests then stay active in MPI: the caller leaks their buffers.
fn poll(
    mut g: Guard,
    reqs: &mut [ffi::MPI_Request],
    late: impl Fn() -> bool,
    on_late: impl FnOnce(usize) -> String,
) -> Result<Guard, String> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let mut active = None;
        for (i, r) in reqs.iter_mut().enumerate() {
            let mut done: c_int = 0;
            // SAFETY: a request of this process (or MPI_REQUEST_NULL, which tests
            // complete), under the MPI lock.
            check("MPI_Test", unsafe {
                ffi::MPI_Test(r, &mut done, ffi::RSMPI_STATUS_IGNORE)
            })?;
            if done == 0 {
                active.get_or_insert(i);
            }
        }
        let Some(i) = active else {
            return Ok(g);
        };
        if late() {
            drop(g);
            return Err(on_late(i));
        }
        drop(g);
        // Busy like MPI's own blocking calls (their progress needs this process's
        // calls), yielding the core after a short spin.
        spins = spins.saturating_add(1);
        if spins < 64 && start.elapsed() < Duration::from_micros(50) {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        g = lock()?;
    }
}

/// A blocking MPI call in progress (they hold the MPI lock: one at a time), watched
/// by [`watchdog`].
#[derive(Clone, Copy)]
struct Blocked {
    /// When it must have returned.
    until: Instant,
    timeout: Duration,
    /// The call.
    what: &'static str,
    /// This rank, and the rank it waits for (`None`: a collective).
    me: u32,
    target: Option<u32>,
}

impl Blocked {
    fn message(&self) -> String {
        match self.target {
            Some(t) => stopped_answering(self.me, t, self.what, self.timeout),
            None => collective_late(self.what, self.timeout),
        }
    }
}

static BLOCKED: Mutex<Option<Blocked>> = Mutex::new(None);
static WATCHDOG: OnceLock<()> = OnceLock::new();

/// Runs `call`, a blocking MPI call with no request form that waits for rank
/// `target` (`None`: for every rank of a collective), made only once that rank
/// answered (see the module docs). If it has not returned `timeout` after it began,
/// this thread is stuck inside MPI holding the MPI lock for good: [`watchdog`] then
/// ends the process, naming the rank.
fn watched<T>(
    me: u32,
    target: Option<u32>,
    what: &'static str,
    timeout: Duration,
    call: impl FnOnce() -> T,
) -> T {
    let slot = || BLOCKED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(until) = deadline(timeout) {
        WATCHDOG.get_or_init(|| {
            let _ = std::thread::Builder::new()
                .name("tessera-mpi-watchdog".into())
                .spawn(watchdog);
        });
        *slot() = Some(Blocked {
            until,
            timeout,
            what,
            me,
            target,
        });
    }
    let out = call();
    *slot() = None;
    out
}

/// Ends the process when a [`watched`] call outlives its deadline: its thread cannot
/// be given an error (it is inside MPI, holding the MPI lock that every other MPI
/// call of the process waits for). Says why (stderr and the log), then exits with
/// status 1 without running exit handlers (MPI's could wait for the same rank).
fn watchdog() {
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let late = *BLOCKED.lock().unwrap_or_else(|e| e.into_inner());
        let Some(b) = late.filter(|b| Instant::now() >= b.until) else {
            continue;
        };
        let why = break_transport(b.message());
        log::error!("{why}");
        eprintln!(
            "error: {why}; {} is stuck inside MPI, so this process ends here (exit status 1)",
            b.what
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: ends the process at once; nothing runs after it.
        unsafe { libc::_exit(1) };
    }
}

/// The MPI error message of `code`.
fn mpi_err(what: &str, code: c_int) -> String {
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: `buf` has room for MPI_MAX_ERROR_STRING (256) characters here.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    let text = if rc == 0 {
        String::from_utf8_lossy(&buf[..len.clamp(0, 512) as usize]).into_owned()
    } else {
        format!("error code {code}")
    };
    format!("{what} failed: {text}")
}

fn check(what: &str, code: c_int) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(mpi_err(what, code))
    }
}

impl Mpi {
    /// The process's MPI library, initialized on first use.
    pub(super) fn get() -> Result<Arc<Mpi>, String> {
        let mut live = LIB.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = live.upgrade() {
            return Ok(m);
        }
        let _g = lock()?;
        let mut finalized: c_int = 0;
        // SAFETY: MPI_Finalized may be called at any time.
        check("MPI_Finalized", unsafe {
            ffi::MPI_Finalized(&mut finalized)
        })?;
        if finalized != 0 {
            return Err(
                "MPI was finalized when this process's last MPI world ended; it cannot be initialized again (keep a world alive for the process's lifetime)"
                    .into(),
            );
        }
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| {
                "MPI is already initialized by other code of this process".to_string()
            })?;
        if !matches!(
            threading,
            mpi::Threading::Serialized | mpi::Threading::Multiple
        ) {
            return Err(format!(
                "the MPI library offers thread support {threading:?}; Tessera needs MPI_THREAD_SERIALIZED"
            ));
        }
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: MPI is initialized; the out-pointers are valid.
        unsafe {
            check(
                "MPI_Comm_rank",
                ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank),
            )?;
            check(
                "MPI_Comm_size",
                ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size),
            )?;
        }
        warn_about_known_bugs(rank);
        let m = Arc::new(Mpi {
            universe: Mutex::new(Some(universe)),
            rank: rank as u32,
            size: size as u32,
        });
        *live = Arc::downgrade(&m);
        Ok(m)
    }

    /// Every rank's `mine` (all of the same length), by rank: `MPI_Iallgather` on
    /// `MPI_COMM_WORLD`, polled against `timeout`.
    pub(super) fn allgather_u64(
        &self,
        mine: &[u64],
        timeout: Duration,
    ) -> Result<Vec<Vec<u64>>, String> {
        let n = mine.len();
        let g = lock()?;
        // SAFETY: reading MPI's predefined handle.
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        let (_g, all) = iallgather_u64(g, world, mine, self.size as usize, timeout)?;
        Ok(all.chunks(n.max(1)).map(<[u64]>::to_vec).collect())
    }

    /// `MPI_Iallreduce` of one int over `MPI_COMM_WORLD`, polled against `timeout`:
    /// the smallest (`min`) or the largest of the ranks' `mine`.
    fn allreduce_int(&self, mine: c_int, min: bool, timeout: Duration) -> Result<c_int, String> {
        let g = lock()?;
        // Owned: leaked if the collective does not complete (MPI keeps them).
        let bufs = Box::into_raw(Box::new([mine, 0]));
        let mut req = null_request();
        // SAFETY: one int each way (`bufs` lives until the request completes, or
        // forever); the operations are MPI's predefined ones.
        let done = unsafe {
            check(
                "MPI_Iallreduce",
                ffi::MPI_Iallreduce(
                    bufs.cast::<c_int>().cast(),
                    bufs.cast::<c_int>().add(1).cast(),
                    1,
                    ffi::RSMPI_INT32_T,
                    if min { ffi::RSMPI_MIN } else { ffi::RSMPI_MAX },
                    ffi::RSMPI_COMM_WORLD,
                    &mut req,
                ),
            )
        }
        .and_then(|()| {
            let late = deadline(timeout);
            poll(
                g,
                std::slice::from_mut(&mut req),
                || late.is_some_and(|d| Instant::now() >= d),
                |_| break_transport(collective_late("MPI_Allreduce", timeout)),
            )
        });
        match done {
            // SAFETY: the collective completed: MPI is done with `bufs`.
            Ok(_g) => Ok(unsafe { Box::from_raw(bufs) }[1]),
            Err(e) => Err(e),
        }
    }

    /// A barrier that also tells every rank whether every rank succeeded: `problem`
    /// is this rank's failure at `what`, if any; an error on every rank when any
    /// rank had one (its own, or one naming the first rank that failed). Bounded by
    /// `timeout`.
    pub(super) fn agree(
        &self,
        problem: Option<String>,
        what: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        let mine = if problem.is_some() {
            self.rank as c_int
        } else {
            c_int::MAX
        };
        let first = self.allreduce_int(mine, true, timeout)?;
        match problem {
            Some(p) => Err(p),
            None if first != c_int::MAX => Err(format!(
                "rank {first} could not {what} (its own error says why)"
            )),
            None => Ok(()),
        }
    }
}

/// Every rank of `comm`'s `mine` (all of the same length), by rank (`size` of
/// them): `MPI_Iallgather`, polled against `timeout` (`g`: the MPI lock, handed
/// back).
fn iallgather_u64(
    g: Guard,
    comm: ffi::MPI_Comm,
    mine: &[u64],
    size: usize,
    timeout: Duration,
) -> Result<(Guard, Vec<u64>), String> {
    let n = mine.len();
    // Owned: leaked if the collective does not complete (MPI keeps them).
    let send: *mut [u64] = Box::into_raw(mine.to_vec().into_boxed_slice());
    let all: *mut [u64] = Box::into_raw(vec![0u64; n * size].into_boxed_slice());
    let mut req = null_request();
    // SAFETY: `n` u64s sent, `n` per rank received into `all`; both live until the
    // request completes (or forever).
    let done = unsafe {
        check(
            "MPI_Iallgather",
            ffi::MPI_Iallgather(
                send.cast::<u64>().cast(),
                n as c_int,
                ffi::RSMPI_UINT64_T,
                all.cast::<u64>().cast(),
                n as c_int,
                ffi::RSMPI_UINT64_T,
                comm,
                &mut req,
            ),
        )
    }
    .and_then(|()| {
        let late = deadline(timeout);
        poll(
            g,
            std::slice::from_mut(&mut req),
            || late.is_some_and(|d| Instant::now() >= d),
            |_| break_transport(collective_late("MPI_Allgather", timeout)),
        )
    });
    match done {
        Ok(g) => {
            // SAFETY: the collective completed: MPI is done with both buffers.
            let (send, all) = unsafe { (Box::from_raw(send), Box::from_raw(all)) };
            drop(send);
            Ok((g, all.into_vec()))
        }
        Err(e) => Err(e),
    }
}

/// Open MPI 3 and 4 crash in `MPI_Compare_and_swap` when their `osc/rdma` one-sided
/// component runs over the `vader` shared-memory transport (open-mpi/ompi#7967,
/// #11349), which is what they pick on one node unless told otherwise; Tessera's
/// atomics are compare-and-swaps. Says so (rank 0, once) unless the run chose its
/// one-sided component (`OMPI_MCA_osc`).
fn warn_about_known_bugs(rank: c_int) {
    let mut buf = vec![0u8; 8192];
    let mut len: c_int = 0;
    // SAFETY: `buf` has room for MPI_MAX_LIBRARY_VERSION_STRING characters.
    if rank != 0 || unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) } != 0
    {
        return;
    }
    let version = String::from_utf8_lossy(&buf[..len.clamp(0, 8192) as usize]).into_owned();
    let old_ompi = ["Open MPI v3.", "Open MPI v4."]
        .iter()
        .any(|v| version.starts_with(v));
    if old_ompi && std::env::var_os("OMPI_MCA_osc").is_none() {
        log::warn!(
            "{}: its osc/rdma component crashes in MPI_Compare_and_swap over shared memory (open-mpi/ompi#11349); if this job dies with a segmentation fault in mca_btl_vader, run mpirun with `--mca osc ^rdma` (or export OMPI_MCA_osc=^rdma)",
            version.lines().next().unwrap_or("Open MPI").trim()
        );
    }
}

/// The variable that turns the sharing of a node's heaps off (`0`) or on (`1`, the
/// default where the library allows it).
pub(crate) const SHARED_VAR: &str = "TESSERA_MPI_SHARED";

/// Why the heaps of a node's processes must not be allocated together, if they must
/// not: [`SHARED_VAR`]` = 0`, or an Open MPI run whose one-sided components exclude
/// `osc/sm` (`OMPI_MCA_osc`, e.g. `pt2pt` or `^sm`), which cannot allocate shared
/// windows. `get` reads one environment variable.
fn shared_heaps_off(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    match get(SHARED_VAR).as_deref().map(str::trim) {
        Some("0") => return Some(format!("{SHARED_VAR}=0")),
        Some("1") => return None,
        _ => {}
    }
    let osc = get("OMPI_MCA_osc")?;
    let list = osc.trim();
    let (excluding, names) = match list.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let has_sm = names.split(',').any(|n| n.trim() == "sm");
    (excluding == has_sm)
        .then(|| format!("Open MPI's one-sided components are `{list}`, without `sm`"))
}

impl Drop for Mpi {
    fn drop(&mut self) {
        let universe = self
            .universe
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match cannot_free().map_or_else(lock, Err) {
            // Finalizes MPI (every window of this library is gone: they hold an
            // `Arc`). It waits for every process of the job: the job's end.
            Ok(_g) => drop(universe),
            // Finalizing would wait for a rank that stopped answering: the
            // process's exit cleans up (`mpirun` then ends the job).
            Err(why) => {
                log::warn!("MPI is left unfinalized: {why}");
                std::mem::forget(universe);
            }
        }
    }
}

/// What the windows of one world share: the world's wait timeout, which bounds
/// every wait for a peer, whether the world failed (set by the world, see the
/// module docs), and what to tell the world when a rank stops answering.
pub(crate) struct Fate {
    timeout: Duration,
    failed: AtomicBool,
    on_stall: OnceLock<StallHook>,
}

/// Called with a rank that stopped answering this one.
pub(crate) type StallHook = Box<dyn Fn(u32) + Send + Sync>;

impl Fate {
    pub(super) fn new(timeout: Duration) -> Fate {
        Fate {
            timeout,
            failed: AtomicBool::new(false),
            on_stall: OnceLock::new(),
        }
    }

    /// Sets what to do when a rank stops answering this one (once).
    pub(crate) fn on_stall(&self, hook: StallHook) {
        let _ = self.on_stall.set(hook);
    }

    /// Tells the world that `rank` stopped answering: on a thread of its own (the
    /// world then writes to every rank, each write bounded by the wait timeout),
    /// so that the operation that found it out fails at once.
    fn stalled(self: &Arc<Fate>, rank: u32) {
        if self.on_stall.get().is_none() {
            return;
        }
        let fate = self.clone();
        let _ = std::thread::Builder::new()
            .name("tessera-mpi-stall".into())
            .spawn(move || {
                if let Some(hook) = fate.on_stall.get() {
                    hook(rank);
                }
            });
    }

    /// Marks the world as failed: its windows are then freed only if every rank
    /// comes to free them within the wait timeout.
    pub(crate) fn abandon(&self) {
        self.failed.store(true, Ordering::Release);
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// One RMA window: this rank's part is local memory, every rank's is reachable.
pub(super) struct Window {
    win: ffi::MPI_Win,
    /// This rank's part.
    base: NonNull<u8>,
    len: usize,
    /// The requests of this window that are active (being polled, or abandoned
    /// when they outlived their deadline, see [`STOPPED`]).
    active: AtomicUsize,
    /// The target ranges (rank, start, end) of the puts issued since their target's
    /// last flush: MPI leaves two puts to overlapping bytes unordered until a flush,
    /// so a put that overlaps a pending one completes the pending ones first. Each
    /// keeps the copy of its data that MPI reads until the put completes (only
    /// touched under the MPI lock).
    pending: Mutex<Vec<Pending>>,
    /// This rank in `MPI_COMM_WORLD`.
    me: u32,
    /// The world's wait timeout, and whether the world failed.
    fate: Arc<Fate>,
    /// The node's shared allocation this window was created over, if any (freed after
    /// the window: the field drops after `Drop::drop` ran).
    node: Option<NodeShared>,
    /// Kept for as long as the window lives (freed before MPI is finalized).
    _mpi: Arc<Mpi>,
    /// Whether the passive-target epoch is open (`MPI_Win_lock_all` succeeded): only
    /// then does dropping flush and close it.
    locked: bool,
}

/// A put not yet completed at its target: the target, the byte range, and the copy
/// of the data MPI reads from until then (leaked if the target stops answering).
struct Pending {
    target: u32,
    start: usize,
    end: usize,
    _data: Box<[u8]>,
}

/// The memory of a node's ranks, allocated together so that each maps the others'
/// (`MPI_Win_allocate_shared` on the node's communicator).
struct NodeShared {
    win: ffi::MPI_Win,
    comm: ffi::MPI_Comm,
    /// The node's ranks (in `MPI_COMM_WORLD`) and where their parts are mapped here.
    parts: Vec<(u32, NonNull<u8>)>,
    /// The world's wait timeout (bounds the collective free).
    timeout: Duration,
    me: u32,
}

impl Drop for NodeShared {
    fn drop(&mut self) {
        // A broken transport leaves it to the process's exit (see the module docs).
        let Ok(_g) = lock() else {
            return;
        };
        // SAFETY: live handles, freed once, collectively on the node (every rank frees
        // its windows in the same order, after every rank came to free the world
        // window over this memory, which is gone).
        watched(self.me, None, "MPI_Win_free", self.timeout, || unsafe {
            let _ = ffi::MPI_Win_free(&mut self.win);
            let _ = ffi::MPI_Comm_free(&mut self.comm);
        });
    }
}

// SAFETY: the window handle is only used under the process-wide MPI lock
// (MPI_THREAD_SERIALIZED); its local memory is accessed atomically or through raw
// pointers only, like every heap.
unsafe impl Send for Window {}
// SAFETY: as above.
unsafe impl Sync for Window {}

impl Window {
    /// Collectively allocates a window of `len` bytes per rank on `MPI_COMM_WORLD`,
    /// zeroes its first `zero` local bytes and opens the passive-target epoch to
    /// every rank. Returns after every rank has done so. `fate`: the world's.
    pub(super) fn allocate(
        mpi: &Arc<Mpi>,
        len: usize,
        zero: usize,
        fate: &Arc<Fate>,
    ) -> Result<Window, String> {
        let size = ffi::MPI_Aint::try_from(len)
            .map_err(|_| format!("a window of {len} bytes is too large"))?;
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        let mut base: *mut u8 = std::ptr::null_mut();
        {
            let _g = lock()?;
            // SAFETY: MPI is initialized; `base` and `win` receive the results.
            watched(
                mpi.rank,
                None,
                "MPI_Win_allocate",
                fate.timeout,
                || unsafe {
                    check(
                        "MPI_Win_allocate",
                        ffi::MPI_Win_allocate(
                            size,
                            1,
                            ffi::RSMPI_INFO_NULL,
                            ffi::RSMPI_COMM_WORLD,
                            (&mut base as *mut *mut u8).cast::<c_void>(),
                            win.as_mut_ptr(),
                        ),
                    )
                },
            )?;
        }
        // SAFETY: MPI_Win_allocate succeeded, so it wrote the handle.
        let win = unsafe { win.assume_init() };
        // A zero-byte part is never accessed, and MPI may answer it with any address
        // (Open MPI 4 gives an unaligned one): an aligned dangling pointer instead.
        let base = if len == 0 {
            Some(NonNull::<u64>::dangling().cast())
        } else {
            NonNull::new(base)
        };
        Window::open(mpi, win, base, len, zero, None, fate)
    }

    /// Zeroes the first `zero` local bytes of a fresh window (`base`: its local part,
    /// `None` if MPI gave none), opens its epoch and waits for every rank. Collective
    /// even when it fails: every rank learns whether every rank opened the window
    /// (and all free it), so that a failure on one rank is an error on all, not a
    /// hang in the next collective.
    fn open(
        mpi: &Arc<Mpi>,
        win: ffi::MPI_Win,
        base: Option<NonNull<u8>>,
        len: usize,
        zero: usize,
        node: Option<NodeShared>,
        fate: &Arc<Fate>,
    ) -> Result<Window, String> {
        let mut problem = match base {
            None => Some("MPI returned no memory for the window".to_string()),
            Some(b) if !(b.as_ptr() as usize).is_multiple_of(8) => {
                Some("MPI returned window memory that is not 8-byte aligned".into())
            }
            Some(b) => {
                // SAFETY: `zero.min(len)` bytes of the fresh local part; nobody
                // accesses it before the agreement below.
                unsafe { std::ptr::write_bytes(b.as_ptr(), 0, zero.min(len)) };
                None
            }
        };
        let mut w = Window {
            win,
            // Only dereferenced once every rank agreed that it is valid.
            base: base.unwrap_or(NonNull::<u64>::dangling().cast()),
            len,
            active: AtomicUsize::new(0),
            pending: Mutex::new(Vec::new()),
            me: mpi.rank,
            fate: fate.clone(),
            node,
            _mpi: mpi.clone(),
            locked: false,
        };
        if problem.is_none() {
            problem = lock()
                .and_then(|_g| {
                    // SAFETY: a live window (`MPI_MODE_NOCHECK`: nothing to wait for).
                    unsafe {
                        check(
                            "MPI_Win_lock_all",
                            ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, w.win),
                        )
                        .inspect(|()| w.locked = true)
                        .and_then(|()| check("MPI_Win_sync", ffi::MPI_Win_sync(w.win)))
                    }
                    .and_then(|()| w.reach_every_rank(mpi.size))
                })
                .err();
        }
        // On failure `w` is dropped, freeing the window on every rank alike.
        mpi.agree(problem, "open the window", fate.timeout)?;
        Ok(w)
    }

    /// Accesses every other rank's part once, while every rank is here to answer
    /// (the lock held). Open MPI's `osc/pt2pt` opens a `MPI_Win_lock_all` epoch to
    /// each peer lazily, by a round trip on the first access to it, and until every
    /// such grant it asked for arrived, each request-based operation and flush of the
    /// window (to any rank) waits for them inside MPI: a peer that stopped before
    /// this process first reached it would block it there for good. An empty
    /// `MPI_Rget` from each rank asks for every grant; `MPI_Win_flush` of one rank
    /// waits for them (watched: every rank is in this same step).
    fn reach_every_rank(&self, size: u32) -> Result<(), String> {
        if size < 2 {
            return Ok(());
        }
        let late = deadline(self.fate.timeout);
        for r in (0..size).filter(|&r| r != self.me) {
            let mut req = null_request();
            // An empty get writes nothing: `byte` only has to be a valid address.
            let byte: &'static mut u8 = Box::leak(Box::new(0u8));
            // SAFETY: see above; the window is in a passive epoch.
            unsafe {
                check(
                    "MPI_Rget",
                    ffi::MPI_Rget(
                        (byte as *mut u8).cast(),
                        0,
                        ffi::RSMPI_UINT8_T,
                        r as c_int,
                        0,
                        0,
                        ffi::RSMPI_UINT8_T,
                        self.win,
                        &mut req,
                    ),
                )?;
                // Complete at once in `osc/pt2pt`; a round trip in others (every
                // rank is here to answer, within the wait timeout).
                let mut done: c_int = 0;
                while done == 0 {
                    check(
                        "MPI_Test",
                        ffi::MPI_Test(&mut req, &mut done, ffi::RSMPI_STATUS_IGNORE),
                    )?;
                    if done == 0 && late.is_some_and(|d| Instant::now() >= d) {
                        return Err(break_transport(collective_late(
                            "opening a window",
                            self.fate.timeout,
                        )));
                    }
                }
                // The request is complete: the byte can go.
                drop(Box::from_raw(byte));
            }
        }
        let next = (self.me + 1) % size;
        watched(
            self.me,
            Some(next),
            "MPI_Win_flush",
            self.fate.timeout,
            || {
                // SAFETY: a live window in a passive-target epoch.
                check("MPI_Win_flush", unsafe {
                    ffi::MPI_Win_flush(next as c_int, self.win)
                })
            },
        )
    }

    /// As [`Window::allocate`], with the ranks of each node allocating their parts
    /// together (`MPI_Win_allocate_shared`) so that each maps its node's other parts
    /// ([`Window::mapped`]); the window over every rank is then created on that
    /// memory (`MPI_Win_create`). `None` (every rank agreeing) when sharing is turned
    /// off ([`SHARED_VAR`]) or the library is known not to do it
    /// ([`shared_heaps_off`]): use [`Window::allocate`]. A library that fails it
    /// anyway is an error naming [`SHARED_VAR`].
    ///
    /// `group`: split each node's ranks further into groups of that many
    /// consecutive ranks (`world rank / group`), each sharing only among itself.
    pub(super) fn allocate_node_shared(
        mpi: &Arc<Mpi>,
        len: usize,
        zero: usize,
        group: Option<usize>,
        fate: &Arc<Fate>,
    ) -> Result<Option<Window>, String> {
        if group == Some(0) {
            return Err("ranks_per_node(0): a node holds at least one rank".into());
        }
        let size = ffi::MPI_Aint::try_from(len)
            .map_err(|_| format!("a window of {len} bytes is too large"))?;
        let timeout = fate.timeout;
        // Decided before trying: MPI leaves its state undefined after an error (MPI
        // 3.1, section 8.3), so a failure is an error, not a fallback. Every rank
        // takes the decision of the most restrictive one.
        let reason = shared_heaps_off(|k| std::env::var(k).ok());
        let off = mpi.allreduce_int(c_int::from(reason.is_some()), false, timeout)?;
        if off != 0 {
            if mpi.rank == 0 {
                let why = reason.unwrap_or_else(|| "another rank's environment says so".into());
                log::info!(
                    "the heaps are not shared between the processes of a node ({why}); every peer is reached through MPI calls"
                );
            }
            return Ok(None);
        }
        // Declared before the lock's guard, so that an early return releases the lock
        // before the node's allocation is freed (which takes it).
        let mut holder: Option<NodeShared> = None;
        let g = lock()?;
        // Collectives with no request form, right after the agreement above that
        // every rank passed: watched.
        let collective = |what: &'static str, call: &mut dyn FnMut() -> c_int| -> c_int {
            watched(mpi.rank, None, what, timeout, call)
        };
        let mut comm = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: MPI is initialized; the out-pointer receives the communicator.
        let mut comm = unsafe {
            check(
                "MPI_Comm_split_type",
                collective("MPI_Comm_split_type", &mut || {
                    ffi::MPI_Comm_split_type(
                        ffi::RSMPI_COMM_WORLD,
                        ffi::RSMPI_COMM_TYPE_SHARED,
                        mpi.rank as c_int,
                        ffi::RSMPI_INFO_NULL,
                        comm.as_mut_ptr(),
                    )
                }),
            )?;
            let mut comm = comm.assume_init();
            // A library that cannot share memory answers with an error, not an abort.
            if let Err(e) = check(
                "MPI_Comm_set_errhandler",
                ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN),
            ) {
                let _ = ffi::MPI_Comm_free(&mut comm);
                return Err(e);
            }
            if let Some(g) = group {
                let color = (mpi.rank as usize / g) as c_int;
                let mut part = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
                let rc = collective("MPI_Comm_split", &mut || {
                    ffi::MPI_Comm_split(comm, color, mpi.rank as c_int, part.as_mut_ptr())
                });
                let _ = ffi::MPI_Comm_free(&mut comm);
                check("MPI_Comm_split", rc)?;
                comm = part.assume_init();
            }
            comm
        };
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        let mut base: *mut u8 = std::ptr::null_mut();
        // SAFETY: collective on the node; `base` and `win` receive the results.
        let rc = collective("MPI_Win_allocate_shared", &mut || unsafe {
            ffi::MPI_Win_allocate_shared(
                size,
                1,
                ffi::RSMPI_INFO_NULL,
                comm,
                (&mut base as *mut *mut u8).cast::<c_void>(),
                win.as_mut_ptr(),
            )
        });
        if rc != 0 {
            // Nothing to free but the communicator (see above: no fallback).
            // SAFETY: the communicator is live.
            unsafe {
                let _ = ffi::MPI_Comm_free(&mut comm);
            }
            drop(g);
            return Err(format!(
                "{}: this MPI cannot share memory between the processes of a node; \
                 run with {SHARED_VAR}=0 to reach every peer through MPI calls",
                mpi_err("MPI_Win_allocate_shared", rc)
            ));
        }
        // From here on the node's allocation is owned (freed on every early return).
        let node = holder.insert(NodeShared {
            // SAFETY: MPI_Win_allocate_shared succeeded, so it wrote the handle.
            win: unsafe { win.assume_init() },
            comm,
            parts: Vec::new(),
            timeout,
            me: mpi.rank,
        });
        let base = NonNull::new(base).ok_or("MPI_Win_allocate_shared returned no memory")?;
        // The node's ranks, in node order, and their parts.
        let mut node_size: c_int = 0;
        // SAFETY: a live communicator.
        check("MPI_Comm_size", unsafe {
            ffi::MPI_Comm_size(node.comm, &mut node_size)
        })?;
        let (g, world_ranks) = iallgather_u64(
            g,
            node.comm,
            &[u64::from(mpi.rank)],
            node_size.max(0) as usize,
            timeout,
        )?;
        for (i, &wr) in world_ranks.iter().enumerate() {
            let (mut sz, mut disp, mut p): (ffi::MPI_Aint, c_int, *mut u8) =
                (0, 0, std::ptr::null_mut());
            // SAFETY: a live shared window; the out-pointers are valid.
            check("MPI_Win_shared_query", unsafe {
                ffi::MPI_Win_shared_query(
                    node.win,
                    i as c_int,
                    &mut sz,
                    &mut disp,
                    (&mut p as *mut *mut u8).cast::<c_void>(),
                )
            })?;
            match NonNull::new(p) {
                Some(p) if sz as usize >= len => node.parts.push((wr as u32, p)),
                _ => return Err(format!("node rank {i}'s shared part is missing or short")),
            }
        }
        let mut world = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        // SAFETY: this rank's part of the node's allocation, `len` bytes, outlives the
        // window (`node` is freed after it).
        check(
            "MPI_Win_create",
            collective("MPI_Win_create", &mut || unsafe {
                ffi::MPI_Win_create(
                    base.as_ptr().cast(),
                    size,
                    1,
                    ffi::RSMPI_INFO_NULL,
                    ffi::RSMPI_COMM_WORLD,
                    world.as_mut_ptr(),
                )
            }),
        )?;
        drop(g);
        // SAFETY: MPI_Win_create succeeded.
        let world = unsafe { world.assume_init() };
        Window::open(mpi, world, Some(base), len, zero, holder.take(), fate).map(Some)
    }

    /// Where rank `r`'s part is mapped in this process: this rank's, and those of
    /// the ranks of its node when the window was allocated with
    /// [`Window::allocate_node_shared`].
    pub(super) fn mapped(&self, r: u32) -> Option<NonNull<u8>> {
        if r == self.me {
            return Some(self.base);
        }
        self.node
            .as_ref()?
            .parts
            .iter()
            .find(|(wr, _)| *wr == r)
            .map(|(_, p)| *p)
    }

    /// Polls `reqs`, requests to rank `target(i)` (`what`, for the error) just
    /// started under the lock `g`, against the world's wait timeout from now (see
    /// [`poll`]); a rank that outlives it stopped answering (see
    /// [`Window::stall`]), and its request stays counted in [`Window::active`].
    fn poll(
        &self,
        g: Guard,
        reqs: &mut [ffi::MPI_Request],
        target: impl Fn(usize) -> u32,
        what: &str,
    ) -> Result<Guard, String> {
        self.active.fetch_add(reqs.len(), Ordering::AcqRel);
        let late = deadline(self.fate.timeout);
        let g = poll(
            g,
            reqs,
            || late.is_some_and(|d| Instant::now() >= d),
            |i| self.stall(target(i), what),
        )?;
        self.active.fetch_sub(reqs.len(), Ordering::AcqRel);
        Ok(g)
    }

    /// Records that rank `target` outlived a wait for `what` (see [`STOPPED`]) and,
    /// the first time, tells the world (it records the root cause for the other
    /// ranks, as a host barrier's timeout does); answers the error naming the rank.
    /// Called without the MPI lock.
    fn stall(&self, target: u32, what: &str) -> String {
        let (why, new) = mark_stopped(target, || {
            stopped_answering(self.me, target, what, self.fate.timeout)
        });
        if new {
            self.fate.stalled(target);
        }
        why
    }

    /// Completes at their targets the puts issued so far (the lock held, handed
    /// back): each rank with puts pending is probed with a one-byte `MPI_Rget` (a
    /// read: it cannot disturb the pending puts) polled against the wait timeout,
    /// then flushed (`MPI_Win_flush`, which has no request form, once the rank
    /// answered: watched). Puts that other threads issue meanwhile stay pending
    /// unless their target was flushed too.
    fn complete_puts(&self, g: Guard) -> Result<Guard, String> {
        // Each rank with puts pending, and a byte of its part that a put targets.
        let targets: Vec<(u32, usize)> = {
            let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let mut t: Vec<(u32, usize)> = Vec::new();
            for p in pending.iter() {
                if !t.iter().any(|&(x, _)| x == p.target) {
                    t.push((p.target, p.start));
                }
            }
            t
        };
        if targets.is_empty() {
            return Ok(g);
        }
        // Puts to a rank that stopped answering can never complete.
        if let Some(why) = targets.iter().find_map(|&(t, _)| stopped(t)) {
            return Err(why);
        }
        // Owned: leaked if a probe does not complete (MPI keeps it).
        let probe: *mut [u8] = Box::into_raw(vec![0u8; targets.len()].into_boxed_slice());
        let mut reqs = vec![null_request(); targets.len()];
        for (i, &(t, at)) in targets.iter().enumerate() {
            // SAFETY: one byte into `probe[i]`, which outlives the request; the
            // target byte is inside the target's part (a put targeted it).
            let rc = watched(self.me, Some(t), "MPI_Rget", self.fate.timeout, || unsafe {
                ffi::MPI_Rget(
                    probe.cast::<u8>().add(i).cast(),
                    1,
                    ffi::RSMPI_UINT8_T,
                    t as c_int,
                    at as ffi::MPI_Aint,
                    1,
                    ffi::RSMPI_UINT8_T,
                    self.win,
                    &mut reqs[i],
                )
            });
            check("MPI_Rget", rc)?;
        }
        let g = self.poll(
            g,
            &mut reqs,
            |i| targets[i].0,
            "the completion of puts to it",
        )?;
        // SAFETY: every probe completed: MPI is done with the buffer.
        drop(unsafe { Box::from_raw(probe) });
        for &(t, _) in &targets {
            // SAFETY: a live window in a passive-target epoch.
            watched(self.me, Some(t), "MPI_Win_flush", self.fate.timeout, || {
                check("MPI_Win_flush", unsafe {
                    ffi::MPI_Win_flush(t as c_int, self.win)
                })
            })?;
        }
        // Complete: their copies go.
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| !targets.iter().any(|&(t, _)| t == p.target));
        Ok(g)
    }

    /// Whether this process has no request of the window active and no put pending:
    /// then a local flush waits for nothing but its own target (see
    /// [`Peer::complete_at_origin`]). The lock held.
    fn alone(&self) -> bool {
        self.active.load(Ordering::Acquire) == 0
            && self
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
    }

    /// Whether every rank came to free this window (an `MPI_Ibarrier` on
    /// `MPI_COMM_WORLD`, where windows are created): for as long as it takes while
    /// the world is healthy, within the wait timeout once it failed (then the
    /// transport breaks: the window and MPI are left to the process's exit).
    fn all_leaving(&self) -> bool {
        if cannot_free().is_some() {
            return false;
        }
        let Ok(g) = lock() else {
            return false;
        };
        let mut req = null_request();
        // SAFETY: MPI is initialized; `req` receives the request.
        if unsafe { ffi::MPI_Ibarrier(ffi::RSMPI_COMM_WORLD, &mut req) } != 0 {
            return false;
        }
        let timeout = self.fate.timeout;
        let since = Instant::now();
        poll(
            g,
            std::slice::from_mut(&mut req),
            || self.fate.failed() && since.elapsed() >= timeout,
            |_| {
                break_transport(format!(
                    "a rank of the MPI job did not come to free the windows of a failed world within {:.3} s (stopped, hung or busy elsewhere?); the windows and MPI are left to this process's exit",
                    timeout.as_secs_f64()
                ))
            },
        )
        .is_ok()
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        let leave = |w: &mut Window| {
            // Freeing would wait for a rank that is not coming: leave the window, the
            // node's allocation under it and the data of puts MPI may still read, to
            // the process's exit.
            std::mem::forget(w.node.take());
            std::mem::forget(std::mem::take(
                w.pending.get_mut().unwrap_or_else(|e| e.into_inner()),
            ));
        };
        if !self.all_leaving() {
            leave(self);
            return;
        }
        let Ok(_g) = lock() else {
            leave(self);
            return;
        };
        // SAFETY: a live window; freeing is collective (every rank frees its windows
        // in the same order, see the module docs), and every rank is here. Errors are
        // fatal in MPI's default handler; nothing is left to report them to here.
        watched(
            self.me,
            None,
            "MPI_Win_free",
            self.fate.timeout,
            || unsafe {
                if self.locked {
                    let _ = ffi::MPI_Win_flush_all(self.win);
                    let _ = ffi::MPI_Win_unlock_all(self.win);
                }
                let _ = ffi::MPI_Win_free(&mut self.win);
            },
        );
    }
}

/// The largest count one MPI call moves (its counts are `int`s).
const CHUNK: usize = 1 << 30;
/// Puts tracked before a flush (past it, the next put flushes first).
const MAX_PENDING: usize = 1024;

/// Rank `target`'s part of a window (`len` bytes), reached through MPI.
pub(super) struct Peer {
    pub(super) win: Arc<Window>,
    pub(super) target: u32,
    pub(super) len: usize,
}

impl Peer {
    /// Runs `call`, MPI calls on the target (see [`watched`]): most start requests
    /// and return, but some one-sided components complete operations inside the
    /// call (`osc/ucx`'s atomics, for one).
    fn watched<T>(&self, what: &'static str, call: impl FnOnce() -> T) -> T {
        watched(
            self.win.me,
            Some(self.target),
            what,
            self.win.fate.timeout,
            call,
        )
    }

    /// Starts the probe that follows an atomic (`MPI_Compare_and_swap`,
    /// `MPI_Fetch_and_op`: neither has a request form) on the same location: an
    /// `MPI_Rget` of one `ty` at `disp` into `out`, whose request `req` completes
    /// once the target answered it, after the atomic in practice (see the module
    /// docs). The lock held.
    ///
    /// # Safety
    /// `out` holds one `ty` and outlives the request; `disp` is inside the
    /// target's part.
    unsafe fn probe(
        &self,
        out: *mut u8,
        ty: ffi::MPI_Datatype,
        disp: ffi::MPI_Aint,
        req: &mut ffi::MPI_Request,
    ) -> Result<(), String> {
        // SAFETY: as the caller promised; the window is in a passive epoch.
        check("MPI_Rget", unsafe {
            ffi::MPI_Rget(
                out.cast(),
                1,
                ty,
                self.target as c_int,
                disp,
                1,
                ty,
                self.win.win,
                req,
            )
        })
    }

    /// Completes at the origin the atomic whose probe came back (the lock held): its
    /// result buffer is then its own. `MPI_Win_flush_local` waits for nothing the
    /// target has not sent already, except in `osc/pt2pt`, where it waits for
    /// every request and put of the window, to any rank: unless this process has
    /// none ([`Window::alone`]), a flush of the target completes it instead (one
    /// more answer of a rank that just answered). Watched.
    fn complete_at_origin(&self) -> Result<(), String> {
        let (what, flush): (_, unsafe extern "C" fn(c_int, ffi::MPI_Win) -> c_int) =
            if self.win.alone() {
                ("MPI_Win_flush_local", ffi::MPI_Win_flush_local)
            } else {
                ("MPI_Win_flush", ffi::MPI_Win_flush)
            };
        self.watched(what, || {
            // SAFETY: a live window in a passive-target epoch.
            check(what, unsafe { flush(self.target as c_int, self.win.win) })
        })
    }

    /// The MPI lock for an operation on the target, unless it stopped answering.
    fn lock(&self) -> Result<Guard, String> {
        match stopped(self.target) {
            Some(why) => Err(why),
            None => lock(),
        }
    }

    fn range(&self, offset: usize, n: usize) -> Result<ffi::MPI_Aint, String> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => ffi::MPI_Aint::try_from(offset)
                .map_err(|_| format!("offset {offset} is too large for MPI")),
            _ => Err(format!(
                "{n} bytes at offset {offset} are outside rank {}'s {} bytes",
                self.target, self.len
            )),
        }
    }

    fn uint(width: usize) -> Result<ffi::MPI_Datatype, String> {
        // SAFETY: reading MPI's predefined datatype handles.
        Ok(unsafe {
            match width {
                1 => ffi::RSMPI_UINT8_T,
                2 => ffi::RSMPI_UINT16_T,
                4 => ffi::RSMPI_UINT32_T,
                8 => ffi::RSMPI_UINT64_T,
                w => return Err(format!("no {w}-byte atomic")),
            }
        })
    }
}

impl RemoteMemory for Peer {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        self.range(offset, out.len())?;
        let g = self.lock()?;
        let g = self.win.complete_puts(g)?;
        // Owned: leaked if the get does not complete (MPI keeps it).
        let buf: *mut [u8] = Box::into_raw(vec![0u8; out.len()].into_boxed_slice());
        let mut reqs = Vec::with_capacity(out.len().div_ceil(CHUNK));
        self.watched("MPI_Rget", || {
            for k in 0..out.len().div_ceil(CHUNK) {
                let n = CHUNK.min(out.len() - k * CHUNK);
                let disp = self.range(offset + k * CHUNK, n)?;
                let mut req = null_request();
                // SAFETY: `n` bytes of `buf`, which outlives the request; the target
                // range is inside the target's part (checked); the window is in a
                // passive epoch.
                check("MPI_Rget", unsafe {
                    ffi::MPI_Rget(
                        buf.cast::<u8>().add(k * CHUNK).cast(),
                        n as c_int,
                        ffi::RSMPI_UINT8_T,
                        self.target as c_int,
                        disp,
                        n as c_int,
                        ffi::RSMPI_UINT8_T,
                        self.win.win,
                        &mut req,
                    )
                })?;
                reqs.push(req);
            }
            Ok::<(), String>(())
        })?;
        let g = self
            .win
            .poll(g, &mut reqs, |_| self.target, "a get from its heap")?;
        drop(g);
        // SAFETY: the get completed: MPI is done with the buffer.
        let buf = unsafe { Box::from_raw(buf) };
        out.copy_from_slice(&buf);
        Ok(())
    }

    fn put(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        self.range(offset, data.len())?;
        let mut g = self.lock()?;
        let end = offset + data.len();
        let overlaps = {
            let p = self.win.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.len() >= MAX_PENDING
                || p.iter()
                    .any(|q| q.target == self.target && q.start < end && offset < q.end)
        };
        if overlaps {
            g = self.win.complete_puts(g)?;
        }
        if data.is_empty() {
            return Ok(());
        }
        // A copy, kept until the put completed at its target (`data` may be reused
        // when this returns): nothing to wait for here.
        let copy = Box::<[u8]>::from(data);
        let issued = self.watched("MPI_Put", || {
            for k in 0..data.len().div_ceil(CHUNK) {
                let n = CHUNK.min(data.len() - k * CHUNK);
                let disp = self.range(offset + k * CHUNK, n)?;
                // SAFETY: `n` bytes of the copy, which lives until the put completed
                // (or forever); the target range is inside the target's part
                // (checked); the window is in a passive epoch.
                check("MPI_Put", unsafe {
                    ffi::MPI_Put(
                        copy.as_ptr().add(k * CHUNK).cast(),
                        n as c_int,
                        ffi::RSMPI_UINT8_T,
                        self.target as c_int,
                        disp,
                        n as c_int,
                        ffi::RSMPI_UINT8_T,
                        self.win.win,
                    )
                })?;
            }
            Ok::<(), String>(())
        });
        if let Err(e) = issued {
            // MPI may read the copy still.
            std::mem::forget(copy);
            return Err(e);
        }
        // Completed at its target by the next get, atomic or quiet (of any thread).
        self.win
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Pending {
                target: self.target,
                start: offset,
                end,
                _data: copy,
            });
        drop(g);
        Ok(())
    }

    fn compare_and_swap(
        &self,
        offset: usize,
        width: usize,
        expected: u64,
        desired: u64,
    ) -> Result<u64, String> {
        let disp = self.range(offset, width)?;
        if !offset.is_multiple_of(width) {
            return Err(format!(
                "a {width}-byte atomic at unaligned offset {offset}"
            ));
        }
        let ty = Peer::uint(width)?;
        // The operands as `width`-byte integers in memory (native byte order).
        let bytes = |v: u64| -> [u8; 8] {
            let mut b = [0u8; 8];
            match width {
                1 => b[0] = v as u8,
                2 => b[..2].copy_from_slice(&(v as u16).to_ne_bytes()),
                4 => b[..4].copy_from_slice(&(v as u32).to_ne_bytes()),
                _ => b = v.to_ne_bytes(),
            }
            b
        };
        // New, expected, seen, and the probe's. Owned: leaked if the operation does
        // not complete (MPI keeps them).
        let bufs: *mut [[u8; 8]; 4] =
            Box::into_raw(Box::new([bytes(desired), bytes(expected), [0; 8], [0; 8]]));
        let at = |i: usize| -> *mut u8 {
            // SAFETY: `i < 4`: inside the live allocation.
            unsafe { bufs.cast::<[u8; 8]>().add(i).cast::<u8>() }
        };
        let g = self.lock()?;
        let g = self.win.complete_puts(g)?;
        let mut probe = null_request();
        // SAFETY: the buffers hold `width` bytes each and outlive the operations;
        // the target range was checked.
        self.watched("MPI_Compare_and_swap", || unsafe {
            check(
                "MPI_Compare_and_swap",
                ffi::MPI_Compare_and_swap(
                    at(0).cast(),
                    at(1).cast(),
                    at(2).cast(),
                    ty,
                    self.target as c_int,
                    disp,
                    self.win.win,
                ),
            )?;
            self.probe(at(3), ty, disp, &mut probe)
        })?;
        let g = self.win.poll(
            g,
            std::slice::from_mut(&mut probe),
            |_| self.target,
            "a compare-and-swap on its heap",
        )?;
        self.complete_at_origin()?;
        drop(g);
        // SAFETY: both operations completed: MPI is done with the buffers.
        let seen = unsafe { Box::from_raw(bufs) }[2];
        Ok(match width {
            1 => u64::from(seen[0]),
            2 => u64::from(u16::from_ne_bytes([seen[0], seen[1]])),
            4 => u64::from(u32::from_ne_bytes([seen[0], seen[1], seen[2], seen[3]])),
            _ => u64::from_ne_bytes(seen),
        })
    }

    fn fetch_add_u64(&self, offset: usize, v: u64) -> Result<u64, String> {
        let disp = self.range(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(format!("an 8-byte atomic at unaligned offset {offset}"));
        }
        let g = self.lock()?;
        let g = self.win.complete_puts(g)?;
        // The operand, the result and the probe's. Owned: leaked if the operation
        // does not complete (MPI keeps them).
        let bufs: *mut [u64; 3] = Box::into_raw(Box::new([v, 0, 0]));
        let at = |i: usize| -> *mut u64 {
            // SAFETY: `i < 3`: inside the live allocation.
            unsafe { bufs.cast::<u64>().add(i) }
        };
        let mut probe = null_request();
        // SAFETY: 8-byte operands that outlive the operations; the target range was
        // checked.
        self.watched("MPI_Fetch_and_op", || unsafe {
            check(
                "MPI_Fetch_and_op",
                ffi::MPI_Fetch_and_op(
                    at(0).cast(),
                    at(1).cast(),
                    ffi::RSMPI_UINT64_T,
                    self.target as c_int,
                    disp,
                    ffi::RSMPI_SUM,
                    self.win.win,
                ),
            )?;
            self.probe(at(2).cast(), ffi::RSMPI_UINT64_T, disp, &mut probe)
        })?;
        let g = self.win.poll(
            g,
            std::slice::from_mut(&mut probe),
            |_| self.target,
            "an atomic on its heap",
        )?;
        self.complete_at_origin()?;
        drop(g);
        // SAFETY: both operations completed: MPI is done with the buffers.
        Ok(unsafe { Box::from_raw(bufs) }[1])
    }

    fn load_u64(&self, offset: usize) -> Result<u64, String> {
        // An atomic read (a get racing with other ranks' atomics is undefined in MPI).
        self.fetch_add_u64(offset, 0)
    }

    fn quiet(&self) -> Result<(), String> {
        let g = lock()?;
        self.win.complete_puts(g).map(drop)
    }

    fn progress(&self) {
        // A broken transport makes no MPI call.
        let Ok(_g) = lock() else {
            return;
        };
        let mut flag: c_int = 0;
        // SAFETY: MPI is initialized; probing does not receive anything (the
        // window's own traffic runs on its own communicator), it lets MPI progress.
        // MPI_Win_sync makes the peers' updates of local window memory visible to
        // this process's loads (MPI's separate memory model).
        unsafe {
            let _ = ffi::MPI_Iprobe(
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                ffi::RSMPI_COMM_WORLD,
                &mut flag,
                ffi::RSMPI_STATUS_IGNORE,
            );
            let _ = ffi::MPI_Win_sync(self.win.win);
        }
    }
}

/// A rank's part of a window mapped in this process (this rank's own, or a peer's on
/// the same node) as plain host memory; its atomics go through the window
/// ([`HostMemory::engine`]).
pub(super) struct Part {
    win: Arc<Window>,
    target: u32,
    base: NonNull<u8>,
}

impl Part {
    /// Rank `target`'s part, if it is mapped here ([`Window::mapped`]).
    pub(super) fn mapped(win: &Arc<Window>, target: u32) -> Option<Part> {
        Some(Part {
            base: win.mapped(target)?,
            win: win.clone(),
            target,
        })
    }
}

// SAFETY: the memory is accessed only atomically or through raw pointers, like
// every heap; the window keeps it alive.
unsafe impl Send for Part {}
// SAFETY: as above.
unsafe impl Sync for Part {}

// SAFETY: mapped parts hold at least the window's `len` bytes (checked when the node's
// parts were queried), 8-byte aligned (MPI aligns allocations; this rank's is
// checked), until the window and the node's allocation are freed, which `win` delays
// past this value.
unsafe impl HostMemory for Part {
    fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }
    fn len(&self) -> usize {
        self.win.len
    }
    fn engine(&self) -> Option<Arc<dyn RemoteMemory>> {
        Some(Arc::new(Peer {
            win: self.win.clone(),
            target: self.target,
            len: self.win.len,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::test_env as env;

    #[test]
    fn shared_heaps_follow_the_variable_then_open_mpi_components() {
        assert_eq!(shared_heaps_off(env(&[])), None);
        let off = shared_heaps_off(env(&[(SHARED_VAR, "0")]));
        assert_eq!(off.as_deref(), Some("TESSERA_MPI_SHARED=0"));
        // The variable wins over the components.
        let on = [(SHARED_VAR, "1"), ("OMPI_MCA_osc", "pt2pt")];
        assert_eq!(shared_heaps_off(env(&on)), None);
        for (osc, off) in [
            ("pt2pt", true),
            ("^sm", true),
            ("^rdma,sm", true),
            ("^rdma", false),
            ("sm,pt2pt", false),
            (" sm ", false),
        ] {
            let got = shared_heaps_off(env(&[("OMPI_MCA_osc", osc)]));
            assert_eq!(got.is_some(), off, "OMPI_MCA_osc={osc}: {got:?}");
        }
        // Anything else in the variable (`World::mpi` refuses it): the components decide.
        let junk = [(SHARED_VAR, "maybe"), ("OMPI_MCA_osc", "pt2pt")];
        assert!(shared_heaps_off(env(&junk)).is_some());
    }
}

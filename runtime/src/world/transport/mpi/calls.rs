//! How every MPI call of the transport is made: under one process-wide lock
//! (`MPI_THREAD_SERIALIZED`), with waits for peers polled against a deadline and
//! blocking calls watched, so that a rank that stops answering is an error naming it
//! (or, for a call stuck inside MPI, the end of the process) instead of a hang.
//!
//! Contract: [`lock`] gives the MPI lock unless the transport is broken (then no MPI
//! call may be made); [`poll`] completes requests or fails at the deadline, the lock
//! released between polls; [`watched`] runs a blocking call that waits for a rank,
//! and ends the process (exit status 1, naming the rank) if it outlives the wait
//! timeout; the ranks that stopped answering are recorded ([`mark_stopped`]), and
//! every later operation on them fails at once.

use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use mpi::ffi;

/// Every MPI call holds it (`MPI_THREAD_SERIALIZED`).
static LOCK: Mutex<()> = Mutex::new(());
/// Why this process's MPI transport is broken, once it is (a collective outlived its
/// deadline, see the `mpi` module docs): no MPI call is made after it is set.
static BROKEN: OnceLock<String> = OnceLock::new();
/// The ranks that stopped answering this process (a request to each outlived its
/// deadline), with the error naming each. Requests to them stay active in MPI (RMA
/// requests cannot be cancelled), so nothing waits for them again: operations on
/// them fail at once, and windows and MPI are left to the process's exit.
static STOPPED: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

/// The MPI lock, held by every MPI call.
pub(super) type Guard = MutexGuard<'static, ()>;

/// The MPI lock, or the reason the transport is broken (then no MPI call may be
/// made).
pub(super) fn lock() -> Result<Guard, String> {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    match BROKEN.get() {
        None => Ok(g),
        Some(why) => Err(why.clone()),
    }
}

/// Marks the transport broken because of `why` (the first reason stays) and answers
/// the reason in force.
pub(super) fn break_transport(why: String) -> String {
    BROKEN.get_or_init(|| why).clone()
}

fn stopped_ranks() -> MutexGuard<'static, Vec<(u32, String)>> {
    STOPPED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The error naming `rank` if it stopped answering this process.
pub(super) fn stopped(rank: u32) -> Option<String> {
    stopped_ranks()
        .iter()
        .find(|(r, _)| *r == rank)
        .map(|(_, why)| why.clone())
}

/// Why freeing collectively (windows, MPI) would wait for a rank that is not
/// coming, if it would: the transport is broken, or a rank stopped answering.
pub(super) fn cannot_free() -> Option<String> {
    BROKEN
        .get()
        .cloned()
        .or_else(|| stopped_ranks().first().map(|(_, why)| why.clone()))
}

/// Records that `rank` stopped answering (`why()`: the error naming it, unless it
/// was recorded already): answers the error in force, and whether it is new.
pub(super) fn mark_stopped(rank: u32, why: impl FnOnce() -> String) -> (String, bool) {
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
pub(super) fn stopped_answering(me: u32, target: u32, what: &str, timeout: Duration) -> String {
    format!(
        "rank {target} stopped answering (rank {me} timed out after {:.3} s waiting for {what}: stopped, hung or busy elsewhere?); this process no longer reaches it",
        timeout.as_secs_f64()
    )
}

/// The error of a collective that outlived its deadline.
pub(super) fn collective_late(what: &str, timeout: Duration) -> String {
    format!(
        "a rank of the MPI job stopped answering: {what} did not complete within {:.3} s (a rank has not reached it: stopped, hung or busy elsewhere?); this process's MPI transport is unusable from now on",
        timeout.as_secs_f64()
    )
}

/// `MPI_REQUEST_NULL`.
pub(super) fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading MPI's predefined handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// When a wait that began now and may last `timeout` is late (`None`: never).
pub(super) fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Polls `reqs` (requests this process started; `MPI_Test` turns each into
/// `MPI_REQUEST_NULL` once complete) until every one completes, releasing the MPI
/// lock between polls. When `late()` says the deadline passed first, the error is
/// `on_late(i)` (`i`: a request still active), called with the lock released. The
/// requests then stay active in MPI: the caller leaks their buffers.
pub(super) fn poll(
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
/// answered (see the `mpi` module docs). If it has not returned `timeout` after it began,
/// this thread is stuck inside MPI holding the MPI lock for good: [`watchdog`] then
/// ends the process, naming the rank.
pub(super) fn watched<T>(
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
pub(super) fn mpi_err(what: &str, code: c_int) -> String {
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

pub(super) fn check(what: &str, code: c_int) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(mpi_err(what, code))
    }
}

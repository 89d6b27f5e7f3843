//! MPI windows ([`Window`]): each rank's part is local memory, every rank's is
//! reachable through MPI one-sided communication; allocated on `MPI_COMM_WORLD`, or
//! over memory the ranks of a node allocate together so that each maps the others'.
//! And what the windows of one world share ([`Fate`]).
//!
//! Contract: windows are allocated and freed collectively, in the same order on
//! every rank; [`Window::allocate`] and [`Window::allocate_node_shared`] return once
//! every rank opened the window (a failure on one rank is an error on all, not a
//! hang); every peer is reached once while every rank is there to answer; puts are
//! completed at their targets by [`Window::complete_puts`] (a probe polled against
//! the wait timeout, then a watched flush); a window of a failed world, or one a rank
//! stopped answering, is freed only if every rank comes to free it in time, and is
//! left to the process's exit otherwise.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use mpi::ffi;

use super::calls::{
    Guard, break_transport, cannot_free, check, collective_late, deadline, lock, mark_stopped,
    mpi_err, null_request, poll, stopped, stopped_answering, watched,
};
use super::library::{Mpi, SHARED_VAR, iallgather_u64, shared_heaps_off};

/// What the windows of one world share: the world's wait timeout, which bounds
/// every wait for a peer, whether the world failed (set by the world, see the `mpi`
/// module docs), and what to tell the world when a rank stops answering.
pub(crate) struct Fate {
    pub(super) timeout: Duration,
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
    pub(super) win: ffi::MPI_Win,
    /// This rank's part.
    base: NonNull<u8>,
    pub(super) len: usize,
    /// The requests of this window that are active (being polled, or abandoned
    /// when they outlived their deadline, see [`mark_stopped`]).
    active: AtomicUsize,
    /// The target ranges (rank, start, end) of the puts issued since their target's
    /// last flush: MPI leaves two puts to overlapping bytes unordered until a flush,
    /// so a put that overlaps a pending one completes the pending ones first. Each
    /// keeps the copy of its data that MPI reads until the put completes (only
    /// touched under the MPI lock).
    pub(super) pending: Mutex<Vec<Pending>>,
    /// This rank in `MPI_COMM_WORLD`.
    pub(super) me: u32,
    /// The world's wait timeout, and whether the world failed.
    pub(super) fate: Arc<Fate>,
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
pub(super) struct Pending {
    pub(super) target: u32,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) _data: Box<[u8]>,
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
        // A broken transport leaves it to the process's exit (see the `mpi` module docs).
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
    pub(super) fn poll(
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

    /// Records that rank `target` outlived a wait for `what` (see [`mark_stopped`]) and,
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
    pub(super) fn complete_puts(&self, g: Guard) -> Result<Guard, String> {
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
    /// [`Peer::complete_at_origin`](super::peer::Peer::complete_at_origin)). The lock
    /// held.
    pub(super) fn alone(&self) -> bool {
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
        // in the same order, see the `mpi` module docs), and every rank is here. Errors are
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

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
//!   peers through the window: loads are `MPI_Get`, stores `MPI_Put`, atomics
//!   `MPI_Compare_and_swap` (in a loop applying the CPU's own operation, so results
//!   are bit-exact with the other transports) and signals `MPI_Fetch_and_op`
//!   (`MPI_SUM`). Atomics on mapped heaps (a rank's own included) go through the
//!   window too: MPI's atomics are only atomic with one another;
//! - ordering (see [`tessera_ir::interp::RemoteMemory`]): a put completes at the
//!   next get, atomic or quiet of this process (`MPI_Win_flush_all`), each get and
//!   atomic completes before it returns (`MPI_Win_flush`), and a kernel's launch
//!   ends with a quiet: the language's release/acquire orderings hold;
//! - waits poll local window memory, letting MPI progress between polls
//!   (`MPI_Iprobe`, `MPI_Win_sync`): with a software transport (TCP) a peer's put
//!   lands only when the target process calls into MPI;
//! - the team segment (host barriers, failure record, allocation checks) is rank 0's
//!   part of a second window, reached through the engine by every rank.
//!
//! MPI is initialized once per process (`MPI_THREAD_SERIALIZED`: every call here
//! holds one process-wide lock, so program instances on many threads share it) and
//! finalized when the last world of the process is gone; a process can thus join
//! MPI worlds one after another but not after the last one ended (MPI cannot be
//! initialized twice). Freeing a window is collective: a rank's [`Rank`] and the
//! symmetric buffers it allocated are released together on every rank.
//!
//! [`Rank`]: super::Rank

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

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

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
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
        let _g = lock();
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

    /// Every rank's `mine` (all of the same length), by rank: `MPI_Allgather` on
    /// `MPI_COMM_WORLD`.
    pub(super) fn allgather_u64(&self, mine: &[u64]) -> Result<Vec<Vec<u64>>, String> {
        let n = mine.len();
        let mut all = vec![0u64; n * self.size as usize];
        let _g = lock();
        // SAFETY: `n` u64s sent, `n` per rank received into `all`.
        check("MPI_Allgather", unsafe {
            ffi::MPI_Allgather(
                mine.as_ptr().cast(),
                n as c_int,
                ffi::RSMPI_UINT64_T,
                all.as_mut_ptr().cast(),
                n as c_int,
                ffi::RSMPI_UINT64_T,
                ffi::RSMPI_COMM_WORLD,
            )
        })?;
        Ok(all.chunks(n.max(1)).map(<[u64]>::to_vec).collect())
    }

    /// `MPI_Allreduce` of one int over `MPI_COMM_WORLD`: the smallest (`min`) or the
    /// largest of the ranks' `mine`.
    fn allreduce_int(&self, mine: c_int, min: bool) -> Result<c_int, String> {
        let mut out: c_int = 0;
        let _g = lock();
        // SAFETY: one int each way; the operations are MPI's predefined ones.
        check("MPI_Allreduce", unsafe {
            ffi::MPI_Allreduce(
                (&mine as *const c_int).cast(),
                (&mut out as *mut c_int).cast(),
                1,
                ffi::RSMPI_INT32_T,
                if min { ffi::RSMPI_MIN } else { ffi::RSMPI_MAX },
                ffi::RSMPI_COMM_WORLD,
            )
        })?;
        Ok(out)
    }

    /// A barrier that also tells every rank whether every rank succeeded: `problem`
    /// is this rank's failure at `what`, if any; an error on every rank when any
    /// rank had one (its own, or one naming the first rank that failed).
    pub(super) fn agree(&self, problem: Option<String>, what: &str) -> Result<(), String> {
        let mine = if problem.is_some() {
            self.rank as c_int
        } else {
            c_int::MAX
        };
        let first = self.allreduce_int(mine, true)?;
        match problem {
            Some(p) => Err(p),
            None if first != c_int::MAX => Err(format!(
                "rank {first} could not {what} (its own error says why)"
            )),
            None => Ok(()),
        }
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
        let _g = lock();
        // Finalizes MPI (every window of this library is gone: they hold an `Arc`).
        drop(
            self.universe
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }
}

/// One RMA window: this rank's part is local memory, every rank's is reachable.
pub(super) struct Window {
    win: ffi::MPI_Win,
    /// This rank's part.
    base: NonNull<u8>,
    len: usize,
    /// The target ranges (rank, start, end) of the puts issued since the last flush:
    /// MPI leaves two puts to overlapping bytes unordered until a flush, so a put
    /// that overlaps a pending one flushes first (only touched under the MPI lock).
    pending: Mutex<Vec<(u32, usize, usize)>>,
    /// This rank in `MPI_COMM_WORLD`.
    me: u32,
    /// The node's shared allocation this window was created over, if any (freed after
    /// the window: the field drops after `Drop::drop` ran).
    node: Option<NodeShared>,
    /// Kept for as long as the window lives (freed before MPI is finalized).
    _mpi: Arc<Mpi>,
    /// Whether the passive-target epoch is open (`MPI_Win_lock_all` succeeded): only
    /// then does dropping flush and close it.
    locked: bool,
}

/// The memory of a node's ranks, allocated together so that each maps the others'
/// (`MPI_Win_allocate_shared` on the node's communicator).
struct NodeShared {
    win: ffi::MPI_Win,
    comm: ffi::MPI_Comm,
    /// The node's ranks (in `MPI_COMM_WORLD`) and where their parts are mapped here.
    parts: Vec<(u32, NonNull<u8>)>,
}

impl Drop for NodeShared {
    fn drop(&mut self) {
        let _g = lock();
        // SAFETY: live handles, freed once, collectively on the node (every rank frees
        // its windows in the same order); the world window over this memory is gone.
        unsafe {
            let _ = ffi::MPI_Win_free(&mut self.win);
            let _ = ffi::MPI_Comm_free(&mut self.comm);
        }
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
    /// every rank. Returns after every rank has done so.
    pub(super) fn allocate(mpi: &Arc<Mpi>, len: usize, zero: usize) -> Result<Window, String> {
        let size = ffi::MPI_Aint::try_from(len)
            .map_err(|_| format!("a window of {len} bytes is too large"))?;
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        let mut base: *mut u8 = std::ptr::null_mut();
        {
            let _g = lock();
            // SAFETY: MPI is initialized; `base` and `win` receive the results.
            unsafe {
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
                )?;
            }
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
        Window::open(mpi, win, base, len, zero, None)
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
            pending: Mutex::new(Vec::new()),
            me: mpi.rank,
            node,
            _mpi: mpi.clone(),
            locked: false,
        };
        if problem.is_none() {
            let _g = lock();
            // SAFETY: a live window.
            problem = unsafe {
                check(
                    "MPI_Win_lock_all",
                    ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, w.win),
                )
                .inspect(|()| w.locked = true)
                .and_then(|()| check("MPI_Win_sync", ffi::MPI_Win_sync(w.win)))
            }
            .err();
        }
        // On failure `w` is dropped, freeing the window on every rank alike.
        mpi.agree(problem, "open the window")?;
        Ok(w)
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
    ) -> Result<Option<Window>, String> {
        if group == Some(0) {
            return Err("ranks_per_node(0): a node holds at least one rank".into());
        }
        let size = ffi::MPI_Aint::try_from(len)
            .map_err(|_| format!("a window of {len} bytes is too large"))?;
        // Decided before trying: MPI leaves its state undefined after an error (MPI
        // 3.1, section 8.3), so a failure is an error, not a fallback. Every rank
        // takes the decision of the most restrictive one.
        let reason = shared_heaps_off(|k| std::env::var(k).ok());
        let off = mpi.allreduce_int(c_int::from(reason.is_some()), false)?;
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
        let g = lock();
        let mut comm = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: MPI is initialized; the out-pointer receives the communicator.
        let mut comm = unsafe {
            check(
                "MPI_Comm_split_type",
                ffi::MPI_Comm_split_type(
                    ffi::RSMPI_COMM_WORLD,
                    ffi::RSMPI_COMM_TYPE_SHARED,
                    mpi.rank as c_int,
                    ffi::RSMPI_INFO_NULL,
                    comm.as_mut_ptr(),
                ),
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
                let rc = ffi::MPI_Comm_split(comm, color, mpi.rank as c_int, part.as_mut_ptr());
                let _ = ffi::MPI_Comm_free(&mut comm);
                check("MPI_Comm_split", rc)?;
                comm = part.assume_init();
            }
            comm
        };
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        let mut base: *mut u8 = std::ptr::null_mut();
        // SAFETY: collective on the node; `base` and `win` receive the results.
        let rc = unsafe {
            ffi::MPI_Win_allocate_shared(
                size,
                1,
                ffi::RSMPI_INFO_NULL,
                comm,
                (&mut base as *mut *mut u8).cast::<c_void>(),
                win.as_mut_ptr(),
            )
        };
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
        });
        let base = NonNull::new(base).ok_or("MPI_Win_allocate_shared returned no memory")?;
        // The node's ranks, in node order, and their parts.
        let mut node_size: c_int = 0;
        // SAFETY: a live communicator.
        check("MPI_Comm_size", unsafe {
            ffi::MPI_Comm_size(node.comm, &mut node_size)
        })?;
        let mut world_ranks = vec![0 as c_int; node_size.max(0) as usize];
        let me = mpi.rank as c_int;
        // SAFETY: one int sent, `node_size` received.
        check("MPI_Allgather", unsafe {
            ffi::MPI_Allgather(
                (&me as *const c_int).cast(),
                1,
                ffi::RSMPI_INT32_T,
                world_ranks.as_mut_ptr().cast(),
                1,
                ffi::RSMPI_INT32_T,
                node.comm,
            )
        })?;
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
        check("MPI_Win_create", unsafe {
            ffi::MPI_Win_create(
                base.as_ptr().cast(),
                size,
                1,
                ffi::RSMPI_INFO_NULL,
                ffi::RSMPI_COMM_WORLD,
                world.as_mut_ptr(),
            )
        })?;
        drop(g);
        // SAFETY: MPI_Win_create succeeded.
        let world = unsafe { world.assume_init() };
        Window::open(mpi, world, Some(base), len, zero, holder.take()).map(Some)
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

    /// Flushes the puts issued so far (the lock is held).
    fn flush_if_dirty(&self, _g: &MutexGuard<'_, ()>) -> Result<(), String> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !pending.is_empty() {
            pending.clear();
            // SAFETY: a live window in a passive-target epoch.
            check("MPI_Win_flush_all", unsafe {
                ffi::MPI_Win_flush_all(self.win)
            })?;
        }
        Ok(())
    }

    fn flush(&self, target: u32, _g: &MutexGuard<'_, ()>) -> Result<(), String> {
        // SAFETY: a live window in a passive-target epoch.
        check("MPI_Win_flush", unsafe {
            ffi::MPI_Win_flush(target as c_int, self.win)
        })
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        let _g = lock();
        // SAFETY: a live window; freeing is collective (every rank frees its windows
        // in the same order, see the module docs). Errors are fatal in MPI's default
        // handler; nothing is left to report them to here.
        unsafe {
            if self.locked {
                let _ = ffi::MPI_Win_flush_all(self.win);
                let _ = ffi::MPI_Win_unlock_all(self.win);
            }
            let _ = ffi::MPI_Win_free(&mut self.win);
        }
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
        let g = lock();
        self.win.flush_if_dirty(&g)?;
        for (k, chunk) in out.chunks_mut(CHUNK).enumerate() {
            let disp = self.range(offset + k * CHUNK, chunk.len())?;
            // SAFETY: `chunk` is valid for its length; the target range is inside
            // the target's part (checked); the window is in a passive epoch.
            check("MPI_Get", unsafe {
                ffi::MPI_Get(
                    chunk.as_mut_ptr().cast(),
                    chunk.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    self.target as c_int,
                    disp,
                    chunk.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    self.win.win,
                )
            })?;
        }
        // The data is there once the flush returns (`out` must stay put until then).
        self.win.flush(self.target, &g)
    }

    fn put(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        self.range(offset, data.len())?;
        let g = lock();
        let end = offset + data.len();
        let overlaps = {
            let p = self.win.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.len() >= MAX_PENDING
                || p.iter()
                    .any(|&(t, s, e)| t == self.target && s < end && offset < e)
        };
        if overlaps {
            self.win.flush_if_dirty(&g)?;
        }
        for (k, chunk) in data.chunks(CHUNK).enumerate() {
            let disp = self.range(offset + k * CHUNK, chunk.len())?;
            // SAFETY: as for `get`.
            check("MPI_Put", unsafe {
                ffi::MPI_Put(
                    chunk.as_ptr().cast(),
                    chunk.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    self.target as c_int,
                    disp,
                    chunk.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    self.win.win,
                )
            })?;
        }
        // `data` may be reused when this returns: complete the put locally (remote
        // completion waits for the next flush).
        // SAFETY: a live window in a passive-target epoch.
        check("MPI_Win_flush_local", unsafe {
            ffi::MPI_Win_flush_local(self.target as c_int, self.win.win)
        })?;
        self.win
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((self.target, offset, end));
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
        let (want, new) = (bytes(expected), bytes(desired));
        let mut seen = [0u8; 8];
        let g = lock();
        self.win.flush_if_dirty(&g)?;
        // SAFETY: the buffers hold `width` bytes; the target range was checked.
        check("MPI_Compare_and_swap", unsafe {
            ffi::MPI_Compare_and_swap(
                new.as_ptr().cast(),
                want.as_ptr().cast(),
                seen.as_mut_ptr().cast(),
                ty,
                self.target as c_int,
                disp,
                self.win.win,
            )
        })?;
        self.win.flush(self.target, &g)?;
        drop(g);
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
        let mut old = 0u64;
        let g = lock();
        self.win.flush_if_dirty(&g)?;
        // SAFETY: 8-byte operands; the target range was checked.
        check("MPI_Fetch_and_op", unsafe {
            ffi::MPI_Fetch_and_op(
                (&v as *const u64).cast(),
                (&mut old as *mut u64).cast(),
                ffi::RSMPI_UINT64_T,
                self.target as c_int,
                disp,
                ffi::RSMPI_SUM,
                self.win.win,
            )
        })?;
        self.win.flush(self.target, &g)?;
        Ok(old)
    }

    fn load_u64(&self, offset: usize) -> Result<u64, String> {
        // An atomic read (a get racing with other ranks' atomics is undefined in MPI).
        self.fetch_add_u64(offset, 0)
    }

    fn quiet(&self) -> Result<(), String> {
        let g = lock();
        self.win.flush_if_dirty(&g)
    }

    fn progress(&self) {
        let _g = lock();
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

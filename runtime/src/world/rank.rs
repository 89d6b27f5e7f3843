//! One rank of a world ([`Rank`]): its device, host barriers, symmetric allocation
//! and failure reporting; and the rank's part attached to its device ([`RankComm`],
//! the [`RankLink`] through which launches of communicating kernels find their rank,
//! world and heaps). A transport hands the rank what it keeps of it: the connections
//! to the other processes ([`PeerLink`]) and its session ([`TransportSession`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tessera_ir::interp::{CommWorld, HostBuffer, ctrl};

use crate::backend::GpuArg;
use crate::buffer::{Element, Storage};
use crate::device::{Device, RankLink};
use crate::error::Error;

use super::gpu::GpuRank;
use super::heap::{CTRL_BYTES, Cursor, Heaps, SYM_ALIGN, Shared, TransportSession};
use super::symmetric::SymBuffer;
use super::team::{AllocRecord, Stop};

/// A transport's connections from this process to the other processes of its world
/// (ranks as processes), kept by the rank until it leaves (dropped last).
pub(super) trait PeerLink: Send + Sync {
    /// Leaves the world: says goodbye and closes the connections. Rank 0 first waits,
    /// up to `patience`, for every peer to leave or die; it answers the peers that had
    /// not left by then.
    fn leave(self: Box<Self>, patience: Duration) -> Vec<u32>;
}

/// What a transport's watch over its connections calls when a peer's process dies.
pub(super) type PeerDied = Arc<dyn Fn(u32) + Send + Sync>;

/// Starts a transport's [`PeerLink`] for a rank being made, given what to call when
/// a peer dies (`Err`: why it could not).
pub(super) type StartLink = Box<dyn FnOnce(PeerDied) -> Result<Box<dyn PeerLink>, String>>;

/// A rank's part in a world, attached to its [`Device`] handle so that launches of
/// communicating kernels know their rank, world and heaps.
struct RankComm {
    rank: u32,
    shared: Arc<Shared>,
    /// GPU worlds: the heap-base table in this rank's device memory.
    gpu: Option<GpuRank>,
}

impl RankComm {
    /// The wait timeout in nanoseconds (the `timeout_ns` kernel parameter).
    fn timeout_ns(&self) -> u64 {
        u64::try_from(self.shared.timeout.as_nanos()).unwrap_or(u64::MAX)
    }
}

impl RankLink for RankComm {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn world_id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    fn interp_world(&self) -> CommWorld {
        self.shared.interp_world(self.rank)
    }

    fn host_heap_bases(&self) -> Vec<u64> {
        match &self.shared.heaps {
            // (An MPI world's peers have no address here: its ranks are CPU ranks,
            // the emulator is refused when it is joined.)
            Heaps::Host(hs) => hs
                .iter()
                .map(|h| h.base().map_or(0, |b| b as u64))
                .collect(),
            Heaps::Gpu(_) => Vec::new(),
        }
    }

    fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    fn nodes(&self) -> Option<Vec<u32>> {
        self.shared.nodes.as_ref().map(|n| n.to_vec())
    }

    /// `rank: i32, world_size: i32, heap_bases: ptr, timeout_ns: i64`
    /// ([`tessera_codegen::comm`] ABI), the heap-base table being `size` `u64`s in
    /// this rank's device memory, entry `p` = rank `p`'s heap base as this rank's GPU
    /// sees it.
    fn gpu_hidden_args(&self) -> Option<[GpuArg; 4]> {
        let table = self.gpu.as_ref()?.table.ptr;
        Some([
            GpuArg::U32(self.rank),
            GpuArg::U32(self.shared.size),
            GpuArg::U64(table),
            GpuArg::U64(self.timeout_ns().min(i64::MAX as u64)),
        ])
    }

    fn ctrl_words(&self) -> Result<Vec<u64>, Error> {
        match &self.shared.heaps {
            Heaps::Host(_) => {
                let w = self.interp_world();
                Ok((0..ctrl::WORDS)
                    .map(|i| w.read(self.rank as usize, i))
                    .collect())
            }
            Heaps::Gpu(hs) => hs[self.rank as usize].ctrl_words(),
        }
    }

    fn abort(&self) {
        self.shared.abort(self.rank, false);
    }
}

/// `Some(L)` when `nodes` (a node per rank) are blocks of `L` consecutive ranks,
/// each block a node of its own.
pub(crate) fn regular_nodes(nodes: &[u32]) -> Option<u32> {
    let first = *nodes.first()?;
    let l = nodes.iter().take_while(|&&x| x == first).count();
    if !nodes.len().is_multiple_of(l) {
        return None;
    }
    let mut seen = std::collections::HashSet::new();
    for block in nodes.chunks(l) {
        if block.iter().any(|&x| x != block[0]) || !seen.insert(block[0]) {
            return None;
        }
    }
    u32::try_from(l).ok()
}

/// One rank of a world: its index, its device, its heap.
pub struct Rank {
    rank: u32,
    shared: Arc<Shared>,
    device: Device,
    cursor: std::sync::Mutex<Cursor>,
    barriers: AtomicU64,
    /// Collective calls made so far (their agreement across ranks is checked).
    calls: AtomicU64,
    /// The collectives' workspace (signal pads, staging buffers, call counter),
    /// allocated collectively on the first collective call.
    /// (Type-erased: the collectives sit above the world and own its type.)
    pub(crate) coll: std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Ranks as processes: the connections to the other ranks (dropped last).
    link: Option<Box<dyn PeerLink>>,
}

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rank({} of {})", self.rank, self.shared.size)
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.abort();
        } else if self.link.is_some()
            && matches!(self.shared.heaps, Heaps::Gpu(_))
            && self.failed_rank().is_none()
        {
            // Leaving is collective for GPU heaps: the peers opened this rank's heap
            // through IPC, and it is freed when this process's last handle goes.
            // (Host heaps are shared files: a mapping outlives its creator.)
            let _ = self.barrier();
        }
        // Others' host barriers this rank will not arrive at stop at once.
        self.shared
            .team
            .leave(self.rank, self.barriers.load(Ordering::Acquire));
        // Leave the world (a process rank says goodbye; rank 0 waits for the others,
        // for as long as a wait may take, or not at all once the world has failed).
        if let Some(link) = self.link.take() {
            let patience = if self.failed_rank().is_some() {
                Duration::ZERO
            } else {
                self.shared.timeout
            };
            let stuck = link.leave(patience);
            if !stuck.is_empty() && !patience.is_zero() {
                let ranks: Vec<String> = stuck.iter().map(u32::to_string).collect();
                log::warn!(
                    "rank {} leaves the world although rank(s) {} did not leave within {:.3} s (still working, stopped or hung?); from now on their deaths are seen by timeouts only",
                    self.rank,
                    ranks.join(", "),
                    patience.as_secs_f64()
                );
            }
        }
    }
}

impl Rank {
    pub(super) fn new(
        rank: u32,
        shared: Arc<Shared>,
        base: &Device,
        gpu: Option<GpuRank>,
        link: Option<Box<dyn PeerLink>>,
    ) -> Rank {
        let mut device = base.clone();
        device.comm = Some(Arc::new(RankComm {
            rank,
            shared: shared.clone(),
            gpu,
        }));
        Rank {
            rank,
            device,
            cursor: std::sync::Mutex::new(Cursor {
                signal_next: CTRL_BYTES,
                data_next: CTRL_BYTES + shared.signal_bytes,
                count: 0,
            }),
            shared,
            barriers: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            coll: std::sync::Mutex::new(None),
            link,
        }
    }

    /// This rank's index, `0..size()`.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.shared.size
    }

    /// The node of every rank (indexed by rank): as [`World::ranks_per_node`]
    /// placed them, or for an MPI world the processes that map each other's heaps;
    /// every rank on node 0 when nothing places them.
    ///
    /// [`World::ranks_per_node`]: super::World::ranks_per_node
    pub fn nodes(&self) -> Vec<u32> {
        match &self.shared.nodes {
            Some(n) => n.to_vec(),
            None => vec![0; self.shared.size as usize],
        }
    }

    /// `Some(L)` when every node holds `L` consecutive ranks (`size()` when the
    /// ranks share one node), `None` for any other placement. The hierarchical
    /// collectives need such nodes.
    pub fn ranks_per_node(&self) -> Option<u32> {
        regular_nodes(&self.nodes())
    }

    /// This rank's device: launches on it run as this rank (kernels see `rank()`,
    /// `world_size()` and the symmetric heaps).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Marks this rank as failed: every rank's device-side waits and host barriers
    /// stop with an error naming it. [`World::run`](super::World::run) and
    /// [`World::run_process`](super::World::run_process) do it when the rank's code
    /// fails; call it when handling a failure yourself.
    pub fn abort(&self) {
        self.shared.abort(self.rank, false);
    }

    /// Checks that this rank's next collective call, `call` (three words; `describe`
    /// names one), is the one every other rank makes as its call of the same number:
    /// the first rank there records it, the others compare. A mismatch fails the
    /// world, so every rank's waits stop, and is an error naming both calls.
    pub(crate) fn agree_on_call(
        &self,
        call: [u64; 3],
        describe: fn([u64; 3]) -> String,
    ) -> Result<(), Error> {
        let sh = &self.shared;
        let index = self.calls.fetch_add(1, Ordering::Relaxed) as usize;
        let me = self.rank;
        let other_failed = || sh.interp_world(me).failed_rank();
        match sh.team.check_call(index, call, sh.timeout, &other_failed) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(theirs)) => {
                self.abort();
                Err(self.err(format!(
                    "collective call #{index} differs between ranks: this rank called {}, another rank {}; every rank must make the same collective calls in the same order",
                    describe(call),
                    describe(theirs)
                )))
            }
            Err(stop) => Err(self.stopped(stop, "a collective call")),
        }
    }

    pub(super) fn err(&self, message: String) -> Error {
        Error::Comm {
            rank: self.rank,
            message,
        }
    }

    fn stopped(&self, stop: Stop, what: &str) -> Error {
        match stop {
            Stop::Failed { rank, died: true } => self.err(format!(
                "abandoned {what}: rank {rank}'s process exited without leaving the world"
            )),
            Stop::Failed { rank, .. } if self.shared.team.failed_by_leaving(rank) => {
                self.err(format!(
                    "abandoned {what}: rank {rank} left the world (dropped its Rank) while others still needed it"
                ))
            }
            Stop::Failed { rank, .. } => match self.shared.team.stalled_on(rank) {
                Some(m) => self.err(format!(
                    "abandoned {what}: rank {m} stopped answering (rank {rank} timed out waiting for it: stopped, hung or busy elsewhere?)"
                )),
                None => self.err(format!("abandoned {what}: rank {rank} failed")),
            },
            Stop::Unreachable { message } => {
                self.abort();
                self.err(format!("abandoned {what}: {message}"))
            }
            Stop::Left { rank } => {
                // The others' waits stop too, naming the rank that left.
                self.shared.abort_by_leaving(rank);
                self.err(format!(
                    "abandoned {what}: rank {rank} left the world (dropped its Rank) before arriving, so it never will"
                ))
            }
            Stop::Timeout { missing } => {
                match missing.first() {
                    Some(&m) => self.shared.abort_waiting_for(self.rank, m),
                    None => self.abort(),
                }
                let who = match missing.as_slice() {
                    [] => String::new(),
                    [r] => format!(": rank {r} never arrived (stopped, hung or busy elsewhere?)"),
                    rs => format!(
                        ": ranks {} never arrived (stopped, hung or busy elsewhere?)",
                        rs.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                    ),
                };
                self.err(format!(
                    "{what} timed out after {:.3} s{who}",
                    self.shared.timeout.as_secs_f64()
                ))
            }
        }
    }

    /// A zeroed symmetric buffer of `len` elements. Collective and synchronizing, like
    /// `shmem_malloc`: every rank allocates the same buffers in the same order, and the
    /// call returns once every rank has made (and initialized) the allocation, so peers
    /// may write into it right away.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<SymBuffer<T>, Error> {
        self.alloc_in::<T>(len, false, None)
    }

    /// A symmetric buffer holding `data` on this rank (collective and synchronizing,
    /// like [`Rank::alloc`]; each rank passes its own data of the same length).
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<SymBuffer<T>, Error> {
        self.alloc_in::<T>(data.len(), false, Some(data))
    }

    /// `n` zeroed `u64` signal words in the signal region (collective and
    /// synchronizing, like [`Rank::alloc`]).
    pub fn alloc_signals(&self, n: usize) -> Result<SymBuffer<u64>, Error> {
        self.alloc_in::<u64>(n, true, None)
    }

    fn alloc_in<T: Element>(
        &self,
        len: usize,
        signals: bool,
        init: Option<&[T]>,
    ) -> Result<SymBuffer<T>, Error> {
        let sh = &self.shared;
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| self.err(format!("{len} elements overflow the heap")))?;
        let mut cur = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        let (next, end) = if signals {
            (cur.signal_next, CTRL_BYTES + sh.signal_bytes)
        } else {
            (cur.data_next, sh.heap_bytes)
        };
        let offset = next;
        let new_next = offset
            .checked_add(bytes.max(1).next_multiple_of(SYM_ALIGN))
            .filter(|&n| n <= end)
            .ok_or_else(|| {
                self.err(format!(
                    "symmetric {} region full: {bytes} bytes asked, {} of {} left (raise World::{})",
                    if signals { "signal" } else { "data" },
                    end.saturating_sub(offset),
                    end - if signals { CTRL_BYTES } else { CTRL_BYTES + sh.signal_bytes },
                    if signals { "signal_bytes" } else { "heap_bytes" },
                ))
            })?;
        let rec = AllocRecord {
            signals,
            offset,
            bytes,
            elem: T::TY,
        };
        let me = self.rank;
        let other_failed = || sh.interp_world(me).failed_rank();
        match sh
            .team
            .check_alloc(cur.count, rec, sh.timeout, &other_failed)
        {
            Ok(Ok(())) => {}
            Ok(Err(other)) => {
                return Err(self.err(format!(
                    "symmetric allocation #{} differs between ranks: this rank asked for {} x {} ({} bytes, {}), another rank for {} x {} ({} bytes, {}); every rank must allocate the same buffers in the same order",
                    cur.count,
                    len,
                    T::TY,
                    bytes,
                    if signals { "signals" } else { "data" },
                    other.bytes / other.elem.size_bytes().max(1),
                    other.elem,
                    other.bytes,
                    if other.signals { "signals" } else { "data" },
                )));
            }
            Err(stop) => return Err(self.stopped(stop, "a symmetric allocation")),
        }
        let (local_storage, copies) = match &sh.heaps {
            Heaps::Host(hs) => {
                let mut copies = Vec::with_capacity(hs.len());
                for h in hs.iter() {
                    copies.push(Arc::new(h.view(offset, T::TY, len)?));
                }
                let copies: Arc<[Arc<HostBuffer>]> = copies.into();
                (Storage::Host(copies[self.rank as usize].clone()), copies)
            }
            Heaps::Gpu(hs) => (
                hs[self.rank as usize].view(offset, bytes)?,
                Arc::from(Vec::new()),
            ),
        };
        if signals {
            cur.signal_next = new_next;
        } else {
            cur.data_next = new_next;
        }
        cur.count += 1;
        drop(cur);
        let local = self.device.buffer::<T>(local_storage, len);
        let mut b = SymBuffer {
            local,
            copies,
            shared: sh.clone(),
            offset,
        };
        // Heaps are zeroed once and never reused, but a user may have written past a
        // region before; make the contract hold. Then wait for every rank to have
        // done the same: a peer's first write must not land before this
        // initialization (it would be erased).
        match init {
            Some(data) => b.local.copy_from(data)?,
            None => b.local.fill(T::zeroed())?,
        }
        self.barrier()?;
        Ok(b)
    }

    /// A view of `len` elements of `U` at byte `heap_offset` of every rank's heap (the
    /// same memory as an existing symmetric allocation, seen as another type): used by
    /// the collectives for workspaces and bit-level aliases. Not collective, not zeroed.
    pub(crate) fn sym_view<U: Element>(
        &self,
        heap_offset: usize,
        len: usize,
    ) -> Result<SymBuffer<U>, Error> {
        let sh = &self.shared;
        let bytes = len
            .checked_mul(std::mem::size_of::<U>())
            .ok_or_else(|| self.err(format!("{len} elements overflow the heap")))?;
        let (local_storage, copies) = match &sh.heaps {
            Heaps::Host(hs) => {
                let mut copies = Vec::with_capacity(hs.len());
                for h in hs.iter() {
                    copies.push(Arc::new(h.view(heap_offset, U::TY, len)?));
                }
                let copies: Arc<[Arc<HostBuffer>]> = copies.into();
                (Storage::Host(copies[self.rank as usize].clone()), copies)
            }
            Heaps::Gpu(hs) => (
                hs[self.rank as usize].view(heap_offset, bytes)?,
                Arc::from(Vec::new()),
            ),
        };
        Ok(SymBuffer {
            local: self.device.buffer::<U>(local_storage, len),
            copies,
            shared: sh.clone(),
            offset: heap_offset,
        })
    }

    /// Keeps a transport's session (an NVSHMEM session, what the MPI windows of an
    /// MPI world share) with the world's shared state: it lives as long as the
    /// world's ranks and buffers, and is abandoned when the world fails.
    pub(super) fn keep_session(&self, session: Arc<dyn TransportSession>) {
        let _ = self.shared.session.set(session);
    }

    /// What a transport calls when a rank stops answering this one: it fails the
    /// world naming that rank, as a host barrier's timeout does (the other ranks then
    /// name it too). Holds the world weakly.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(super) fn stall_hook(&self) -> impl Fn(u32) + Send + Sync + 'static {
        let shared = Arc::downgrade(&self.shared);
        let me = self.rank;
        move |missing| {
            if let Some(s) = shared.upgrade() {
                s.abort_waiting_for(me, missing);
            }
        }
    }

    /// Whether `buf` was allocated in this world's heaps (not another world's).
    pub(crate) fn owns<T: Element>(&self, buf: &SymBuffer<T>) -> bool {
        Arc::ptr_eq(&buf.shared, &self.shared)
    }

    /// Host barrier: returns once every rank has called it (the same number of times),
    /// after this rank's device work is done. Fails when another rank failed or when
    /// the wait timeout passes.
    pub fn barrier(&self) -> Result<(), Error> {
        self.device.synchronize()?;
        let sh = &self.shared;
        let generation = self.barriers.fetch_add(1, Ordering::AcqRel);
        let me = self.rank;
        let other_failed = || sh.interp_world(me).failed_rank();
        sh.team
            .barrier(me, generation, sh.size, sh.timeout, &other_failed)
            .map_err(|(stop, arrived)| {
                let what = format!("a host barrier ({arrived} of {} ranks arrived)", sh.size);
                self.stopped(stop, &what)
            })
    }

    /// Lets this rank's transport make progress: answers the other ranks'
    /// operations on this rank's heap that wait for this process. Device-side waits
    /// and host barriers do this while they poll; call it from a host loop that waits
    /// for something else while other ranks may still need this rank (over MPI, whose
    /// one-sided operations may progress only inside MPI calls). Does nothing where
    /// the transport needs nothing (threads, processes that map each other's heaps).
    pub fn progress(&self) {
        self.shared.team.progress();
    }

    /// How long device-side waits and host barriers wait before failing.
    pub fn wait_timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// The first rank that failed, if any.
    pub fn failed_rank(&self) -> Option<u32> {
        self.shared.failed(self.rank)
    }
}

#[cfg(test)]
mod node_tests {
    use super::regular_nodes;

    #[test]
    fn regular_nodes_are_equal_blocks_of_consecutive_ranks() {
        assert_eq!(regular_nodes(&[0, 0, 0, 0]), Some(4));
        assert_eq!(regular_nodes(&[0, 0, 1, 1]), Some(2));
        assert_eq!(regular_nodes(&[5, 3, 9]), Some(1));
        assert_eq!(regular_nodes(&[0, 0, 1, 1, 1, 1]), None, "unequal nodes");
        assert_eq!(regular_nodes(&[0, 1, 0, 1]), None, "not consecutive");
        assert_eq!(regular_nodes(&[0, 0, 1, 1, 0, 0]), None, "node 0 twice");
        assert_eq!(regular_nodes(&[0, 0, 1]), None, "size not a multiple");
        assert_eq!(regular_nodes(&[]), None);
    }
}

//! Worlds of ranks: symmetric heaps, symmetric buffers and host-side team operations.
//!
//! Tessera programs that communicate are SPMD, as with `torchrun`, NVSHMEM or MPI:
//! every rank runs the same code on its own device and calls the same collective
//! operations in the same order. A world's ranks are either
//!
//! - **threads of this process**: [`World::local`]`(n)` then [`World::run`], which
//!   calls a closure once per rank with its [`Rank`] handle; or
//! - **processes of one node**, one rank each, started by `torchrun` or
//!   [`spawn_local`]: [`World::launched`] (or [`World::from_env`]) reads `RANK`,
//!   `WORLD_SIZE`, `LOCAL_RANK` and the bootstrap socket (`TESSERA_BOOTSTRAP`, else
//!   derived from `MASTER_ADDR`/`MASTER_PORT`; see [`procs`]), and [`World::join`]
//!   returns this process's [`Rank`] once every rank has joined
//!   ([`World::run_process`] joins, runs a closure and leaves).
//!
//! Either way a [`Rank`] offers the same operations ([`Rank::alloc`],
//! [`Rank::upload`], [`Rank::alloc_signals`], [`Rank::barrier`], [`Rank::device`]) and
//! kernels launched on its device see the same semantics: the control words live in
//! the shared heaps, so `barrier_all`, waits, aborts and timeouts work across
//! processes as across threads.
//!
//! **Devices.** Ranks run on the CPU or the SIMT emulator (heaps in host memory:
//! plain allocations for threads, `memfd` segments mapped by every process for
//! processes), or on GPUs (heaps in device memory, see `gpu`: one process driving
//! several GPUs through peer access with [`World::on_each`], or one rank per process
//! exporting its heap through CUDA/HIP IPC). Without a usable GPU, asking for one
//! fails with [`Error::DeviceUnavailable`] when the [`Device`] is opened. Launching a
//! communicating kernel on a GPU is not wired yet: the launch reports it.
//!
//! **Symmetric heap.** Each rank owns one heap (`heap_bytes`, 256 MiB by default or
//! `TESSERA_HEAP_BYTES`), laid out identically on every rank:
//!
//! | bytes | what |
//! |---|---|
//! | `0..256` | control words ([`tessera_ir::interp::ctrl`]): barrier counter, abort flag |
//! | `256..256+signal_bytes` | signal pads ([`Rank::alloc_signals`]), zeroed |
//! | the rest | data ([`Rank::alloc`]) |
//!
//! Both regions are bump allocators with 256-byte alignment, so the k-th allocation
//! lands at the same offset on every rank; each allocation is checked against the
//! other ranks' through a table in the team segment (a rank allocating a different
//! size or kind is an [`Error::Comm`], not silent corruption; the first 8192
//! allocations of a world are checked). Memory is released when the world ends (for
//! processes: when the last process holding a mapping exits).
//!
//! **Team segment.** Besides the heaps, a world shares one small segment of host
//! memory (`team`): the host barrier's counter, the failure record and the
//! allocation table, all lock-free words, so host barriers and checks work the same
//! for threads and processes.
//!
//! **Failure.** A rank whose code fails (an `Err` from the closure given to
//! [`World::run`] or [`World::run_process`], a panic, or [`Rank::abort`]) marks the
//! world as failed: every rank's device-side waits and host barriers stop with an
//! error naming it instead of hanging, and [`World::run`] returns the first
//! root-cause error (not the consequences). A process that exits without leaving
//! the world (dropping its [`Rank`]) is detected by the bootstrap connections'
//! watchdog and reported as dead the same way, within milliseconds.
//!
//! **Several ranks on one GPU** ([`World::on`] with a GPU, for testing) get separate
//! heaps but share the GPU's stream: kernels of different ranks run one after the
//! other, so a kernel that waits for another rank's kernel in the same round times
//! out. Use one GPU per rank for such kernels.

mod gpu;
pub mod procs;
mod team;

pub use procs::{LaunchEnv, spawn_local, spawn_local_with};

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tessera_ir::interp::{CommWorld, HostBuffer, HostMemory, InterpError, ctrl};
use tessera_ir::types::ScalarType;

use crate::buffer::{Buffer, Element, Storage};
use crate::{Device, Error};

use gpu::{GpuDev, GpuHeap, GpuRank};
use team::{AllocRecord, Stop, Team};

/// Bytes of control words at the start of every heap.
pub const CTRL_BYTES: usize = ctrl::WORDS * 8;
/// Alignment of every symmetric allocation.
pub const SYM_ALIGN: usize = 256;

/// A rank's heap in host memory: zeroed, 4096-byte aligned.
struct HostHeap {
    /// The mapping's start, taken once: the heap is only accessed through raw pointers
    /// (atomics, kernels), never through references into `map`.
    ptr: NonNull<u8>,
    len: usize,
    /// An anonymous private mapping: its pages are zero and take no memory until
    /// first touched, so a rank's resident memory follows what the world uses (eight
    /// thread ranks of 256 MiB heaps no longer write 2 GiB at start).
    _map: memmap2::MmapMut,
}

impl HostHeap {
    fn new(len: usize) -> Result<HostHeap, String> {
        let len = len.max(CTRL_BYTES);
        let mut map = memmap2::MmapMut::map_anon(len)
            .map_err(|e| format!("cannot map a heap of {len} bytes: {e}"))?;
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| format!("cannot map a heap of {len} bytes"))?;
        Ok(HostHeap {
            ptr,
            len,
            _map: map,
        })
    }
}

// SAFETY: the heap is plain memory accessed only atomically or through raw pointers.
unsafe impl Send for HostHeap {}
// SAFETY: as above.
unsafe impl Sync for HostHeap {}

// SAFETY: `ptr` is valid for `len` bytes, page-aligned (an mmap), until drop.
unsafe impl HostMemory for HostHeap {
    fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Every rank's heap, as this process reaches them.
pub(crate) enum Heaps {
    /// Host memory (ranks as threads: allocations; as processes: shared mappings).
    Host(Arc<[Arc<dyn HostMemory>]>),
    /// GPU memory (allocated here or opened through IPC).
    Gpu(Arc<[Arc<GpuHeap>]>),
}

/// State shared by the ranks of one world (in this process).
pub(crate) struct Shared {
    size: u32,
    team: Team,
    /// Every rank's heap.
    pub(crate) heaps: Heaps,
    /// Every rank's control words (views of the host heaps' first bytes; empty for
    /// GPU heaps).
    ctrl: Arc<[Arc<HostBuffer>]>,
    timeout: Duration,
    signal_bytes: usize,
    heap_bytes: usize,
}

impl Shared {
    fn new(
        size: u32,
        team: Team,
        heaps: Heaps,
        timeout: Duration,
        signal_bytes: usize,
        heap_bytes: usize,
    ) -> Result<Shared, Error> {
        let ctrl = match &heaps {
            Heaps::Host(hs) => {
                let mut v = Vec::with_capacity(hs.len());
                for h in hs.iter() {
                    v.push(Arc::new(HostBuffer::view(
                        h.clone(),
                        0,
                        ScalarType::U64,
                        ctrl::WORDS,
                    )?));
                }
                v.into()
            }
            Heaps::Gpu(_) => Arc::from(Vec::new()),
        };
        Ok(Shared {
            size,
            team,
            heaps,
            ctrl,
            timeout,
            signal_bytes,
            heap_bytes,
        })
    }

    fn interp_world(&self, rank: u32) -> CommWorld {
        CommWorld {
            rank,
            size: self.size,
            ctrl: self.ctrl.clone(),
            timeout: self.timeout,
        }
    }

    /// The rank that failed first, if any: recorded in the team segment, or by a
    /// kernel in this rank's control words.
    fn failed(&self, me: u32) -> Option<u32> {
        self.team
            .failed()
            .map(|(r, _)| r)
            .or_else(|| self.interp_world(me).failed_rank())
    }

    /// Marks `rank` as failed (`died`: its process exited) everywhere: the team
    /// segment and every heap's abort word, releasing host barriers and device waits.
    fn abort(&self, rank: u32, died: bool) {
        self.team.fail(rank, died);
        self.release(rank);
    }

    /// Marks `rank` as failed because it left the world while others needed it.
    fn abort_by_leaving(&self, rank: u32) {
        self.team.fail_by_leaving(rank);
        self.release(rank);
    }

    /// Raises every heap's abort word naming `rank`, releasing device waits.
    fn release(&self, rank: u32) {
        match &self.heaps {
            Heaps::Host(_) => self.interp_world(rank).abort(),
            Heaps::Gpu(hs) => {
                for h in hs.iter() {
                    // Best effort: the world is failing already.
                    let _ = h.raise_abort(rank);
                }
            }
        }
    }
}

/// A rank's part in a world, attached to its [`Device`] handle so that launches of
/// communicating kernels know their rank, world and heaps.
pub(crate) struct RankComm {
    pub(crate) rank: u32,
    pub(crate) shared: Arc<Shared>,
    /// GPU worlds: the heap-base table in this rank's device memory.
    gpu: Option<GpuRank>,
}

#[allow(dead_code)] // The GPU accessors are for the GPU launch path (in progress).
impl RankComm {
    /// The interpreter's view of this rank's world.
    pub(crate) fn interp_world(&self) -> CommWorld {
        self.shared.interp_world(self.rank)
    }

    /// Number of ranks.
    pub(crate) fn size(&self) -> u32 {
        self.shared.size
    }

    /// Host worlds (CPU, emulator): every rank's heap base address as this process
    /// sees it (the emulator's `heap_bases` table). Empty for GPU worlds.
    pub(crate) fn host_heap_bases(&self) -> Vec<u64> {
        match &self.shared.heaps {
            Heaps::Host(hs) => hs.iter().map(|h| h.base() as u64).collect(),
            Heaps::Gpu(_) => Vec::new(),
        }
    }

    /// How long device-side waits poll.
    pub(crate) fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// The values of a communicating kernel's hidden parameters on this rank, given
    /// the device address of the heap-base table ([`tessera_codegen::comm`] ABI:
    /// `rank: i32, world_size: i32, heap_bases: ptr, timeout_ns: i64`), as GPU
    /// launch arguments.
    pub(crate) fn hidden_gpu_args(&self, heap_table: u64) -> [crate::launch::GpuArg; 4] {
        use crate::launch::GpuArg;
        [
            GpuArg::U32(self.rank),
            GpuArg::U32(self.shared.size),
            GpuArg::U64(heap_table),
            GpuArg::U64(self.timeout_ns().min(i64::MAX as u64)),
        ]
    }

    /// The wait timeout in nanoseconds (the `timeout_ns` kernel parameter).
    pub(crate) fn timeout_ns(&self) -> u64 {
        u64::try_from(self.shared.timeout.as_nanos()).unwrap_or(u64::MAX)
    }

    /// GPU worlds: the device address of the heap-base table (`size` `u64`s, entry `p`
    /// = rank `p`'s heap base as this rank's GPU sees it), the `heap_bases` kernel
    /// parameter.
    pub(crate) fn heap_bases_device_ptr(&self) -> Option<u64> {
        self.gpu.as_ref().map(|g| g.table.ptr)
    }

    /// GPU worlds: the same table on the host.
    pub(crate) fn heap_bases(&self) -> Option<&[u64]> {
        self.gpu.as_ref().map(|g| g.bases.as_slice())
    }

    /// This rank's control words (`ctrl::WORDS` `u64`s, read after the work queued
    /// on its device): where a launch finds the device-side error record.
    pub(crate) fn ctrl_words(&self) -> Result<Vec<u64>, Error> {
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

    /// Marks this rank as failed (e.g. after a device-side error), releasing the
    /// other ranks.
    pub(crate) fn abort(&self) {
        self.shared.abort(self.rank, false);
    }
}

/// How the ranks of a world are laid out.
#[derive(Clone, Debug)]
enum Layout {
    /// All ranks as threads of this process.
    Threads,
    /// This process is one rank of a world of processes.
    Process(LaunchEnv),
}

/// A world of ranks to run SPMD code on: build it, then [`World::run`] (ranks as
/// threads) or [`World::join`] (this process as one rank).
#[derive(Clone, Debug)]
pub struct World {
    size: usize,
    layout: Layout,
    devices: Vec<Device>,
    heap_bytes: usize,
    signal_bytes: usize,
    timeout: Duration,
}

fn default_heap_bytes() -> usize {
    std::env::var("TESSERA_HEAP_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(256 << 20)
}

impl World {
    /// `size` ranks as threads of this process, each on the CPU device (change with
    /// [`World::on`] or [`World::on_each`]).
    pub fn local(size: usize) -> World {
        World {
            size,
            layout: Layout::Threads,
            devices: vec![Device::cpu()],
            heap_bytes: default_heap_bytes(),
            signal_bytes: 1 << 20,
            timeout: tessera_ir::interp::default_wait_timeout(),
        }
    }

    /// The world this process was launched into (by `torchrun` or [`spawn_local`]:
    /// `RANK`, `WORLD_SIZE`, ...; see [`procs`]), as a builder: configure it like a
    /// local world (every rank must configure it the same), then [`World::join`].
    /// Without `WORLD_SIZE`, a world of one rank.
    pub fn launched() -> Result<World, Error> {
        let env = LaunchEnv::from_env()?;
        Ok(World {
            size: env.size as usize,
            layout: Layout::Process(env),
            ..World::local(1)
        })
    }

    /// Joins the launched world with the default configuration (CPU device, heap size
    /// from `TESSERA_HEAP_BYTES`): `World::launched()?.join()`.
    pub fn from_env() -> Result<Rank, Error> {
        World::launched()?.join()
    }

    /// Runs every rank on (a handle of) `device`. Several ranks on one GPU get heaps
    /// of their own but share its stream (see the module docs).
    pub fn on(mut self, device: &Device) -> World {
        self.devices = vec![device.clone()];
        self
    }

    /// Runs rank `r` on `devices[r]` (e.g. one GPU each; a launched world's process
    /// takes `devices[RANK]`). Needs as many devices as ranks (or one, like
    /// [`World::on`]).
    pub fn on_each(mut self, devices: &[Device]) -> World {
        self.devices = devices.to_vec();
        self
    }

    /// Bytes of each rank's symmetric heap (control words and signals included).
    pub fn heap_bytes(mut self, bytes: usize) -> World {
        self.heap_bytes = bytes;
        self
    }

    /// Bytes of each heap reserved for signal pads (1 MiB by default).
    pub fn signal_bytes(mut self, bytes: usize) -> World {
        self.signal_bytes = bytes;
        self
    }

    /// How long a device-side wait or host barrier waits before failing (default:
    /// `TESSERA_WAIT_TIMEOUT` seconds, else 30 s). Also bounds a process world's
    /// bootstrap.
    pub fn wait_timeout(mut self, timeout: Duration) -> World {
        self.timeout = timeout;
        self
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    fn comm_err(message: String) -> Error {
        Error::Comm { rank: 0, message }
    }

    fn check(&self) -> Result<(), Error> {
        if self.size == 0 || self.size > 1024 {
            return Err(Self::comm_err(format!(
                "a world needs 1 to 1024 ranks, got {}",
                self.size
            )));
        }
        let min = CTRL_BYTES + self.signal_bytes;
        if self.heap_bytes < min {
            return Err(Self::comm_err(format!(
                "a heap of {} bytes cannot hold the control words and {} bytes of signals",
                self.heap_bytes, self.signal_bytes
            )));
        }
        Ok(())
    }

    /// The device of rank `r`.
    fn device_of(&self, r: usize) -> Result<&Device, Error> {
        match self.devices.len() {
            1 => Ok(&self.devices[0]),
            n if n == self.size => Ok(&self.devices[r]),
            n => Err(Self::comm_err(format!(
                "World::on_each got {n} devices for {} ranks",
                self.size
            ))),
        }
    }

    fn team_segment() -> Result<Team, Error> {
        let mem: Arc<dyn HostMemory> =
            Arc::new(HostHeap::new(team::TEAM_BYTES).map_err(Self::comm_err)?);
        Team::new(mem, true).map_err(Self::comm_err)
    }

    /// Every rank's heap for ranks as threads: host memory, or GPU memory with peer
    /// access between the ranks' GPUs.
    fn thread_heaps(&self) -> Result<Heaps, Error> {
        let gpus: Vec<Option<GpuDev>> = (0..self.size)
            .map(|r| self.device_of(r).map(GpuDev::of))
            .collect::<Result<_, _>>()?;
        if gpus.iter().all(Option::is_none) {
            let mut heaps: Vec<Arc<dyn HostMemory>> = Vec::with_capacity(self.size);
            for _ in 0..self.size {
                heaps.push(Arc::new(
                    HostHeap::new(self.heap_bytes).map_err(Self::comm_err)?,
                ));
            }
            return Ok(Heaps::Host(heaps.into()));
        }
        let mut heaps = Vec::with_capacity(self.size);
        for (r, g) in gpus.iter().enumerate() {
            let g = g.as_ref().ok_or_else(|| {
                Self::comm_err(format!(
                    "rank {r} is on {}: a world's ranks are all on GPUs or all on the host",
                    self.devices[r.min(self.devices.len() - 1)].id()
                ))
            })?;
            heaps.push(Arc::new(GpuHeap::alloc(g, self.heap_bytes)?));
        }
        // Peer access between every pair of distinct GPUs.
        for a in 0..self.size {
            for b in 0..self.size {
                let (da, db) = (self.device_of(a)?, self.device_of(b)?);
                if a != b && da != db {
                    da.enable_peer_access(db)?;
                }
            }
        }
        Ok(Heaps::Gpu(heaps.into()))
    }

    /// Runs `f` once per rank (ranks as threads), concurrently, and returns the
    /// ranks' results in rank order. When a rank fails, the others are released
    /// (their waits and barriers fail) and the first root-cause error is returned.
    ///
    /// For a launched world (ranks as processes) use [`World::join`] or
    /// [`World::run_process`].
    pub fn run<R: Send>(
        &self,
        f: impl Fn(&Rank) -> Result<R, Error> + Sync,
    ) -> Result<Vec<R>, Error> {
        if let Layout::Process(_) = self.layout {
            return Err(Self::comm_err(
                "World::run runs ranks as threads; this world is launched as processes: use World::join or World::run_process".into(),
            ));
        }
        self.check()?;
        let heaps = self.thread_heaps()?;
        let gpu_heaps = match &heaps {
            Heaps::Gpu(h) => Some(h.clone()),
            Heaps::Host(_) => None,
        };
        let shared = Arc::new(Shared::new(
            self.size as u32,
            Self::team_segment()?,
            heaps,
            self.timeout,
            self.signal_bytes,
            self.heap_bytes,
        )?);
        let mut ranks = Vec::with_capacity(self.size);
        for r in 0..self.size {
            let device = self.device_of(r)?;
            let gpu = match (&gpu_heaps, GpuDev::of(device)) {
                (Some(h), Some(g)) => Some(GpuRank::new(&g, h)?),
                _ => None,
            };
            ranks.push(Rank::new(r as u32, shared.clone(), device, gpu, None));
        }
        let results: Vec<Result<R, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .iter()
                .map(|rank| {
                    let f = &f;
                    s.spawn(move || {
                        // A panic must release the other ranks now, not when this
                        // thread is joined (they may be waiting for it until then).
                        let out =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(rank)))
                                .unwrap_or_else(|payload| {
                                    Err(Error::Comm {
                                        rank: rank.rank(),
                                        message: format!(
                                            "the rank's closure panicked: {}",
                                            panic_message(payload.as_ref())
                                        ),
                                    })
                                });
                        if out.is_err() {
                            rank.abort();
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(r, h)| {
                    h.join().unwrap_or_else(|_| {
                        shared.abort(r as u32, false);
                        Err(Error::Comm {
                            rank: r as u32,
                            message: "the rank's closure panicked".into(),
                        })
                    })
                })
                .collect()
        });
        drop(ranks);
        let mut first_consequence = None;
        let mut out = Vec::with_capacity(results.len());
        for r in results {
            match r {
                Ok(v) => out.push(v),
                Err(e) if is_consequence(&e) => {
                    first_consequence.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        match first_consequence {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Joins a launched world as this process's rank (collective: every process of
    /// the world calls it with the same configuration). Returns when every rank has
    /// joined: each process then reaches every rank's heap. Keep the [`Rank`] until
    /// this process is done with the world: dropping it leaves the world, and a
    /// process that exits without leaving counts as dead (the others' waits fail).
    pub fn join(&self) -> Result<Rank, Error> {
        let Layout::Process(env) = &self.layout else {
            return Err(Self::comm_err(
                "World::join is for a launched world (World::launched / World::from_env); World::local runs its ranks with World::run".into(),
            ));
        };
        self.check()?;
        let me = env.rank;
        let err = move |message: String| Error::Comm { rank: me, message };
        let device = self.device_of(me as usize)?;
        let gpu = GpuDev::of(device);
        if env.size == 1 {
            // A world of one: nothing to exchange.
            let heaps = match &gpu {
                None => Heaps::Host(Arc::from(vec![Arc::new(
                    HostHeap::new(self.heap_bytes).map_err(err)?,
                ) as Arc<dyn HostMemory>])),
                Some(g) => Heaps::Gpu(Arc::from(vec![Arc::new(GpuHeap::alloc(
                    g,
                    self.heap_bytes,
                )?)])),
            };
            return self.make_rank(0, heaps, Self::team_segment()?, device, None);
        }
        let kind = match &gpu {
            None => 0,
            Some(GpuDev::Cuda(_)) => 1,
            #[cfg(feature = "hip")]
            Some(GpuDev::Hip(_)) => 2,
        };
        let config = [
            u64::from(env.size),
            self.heap_bytes as u64,
            self.signal_bytes as u64,
            kind,
        ];
        // This rank's contribution: a shared-memory heap, or an exported GPU heap.
        let (mine, own_gpu) = match &gpu {
            None => (
                procs::Contribution {
                    heap_fd: Some(
                        procs::memfd(&format!("tessera-heap-rank{me}"), self.heap_bytes)
                            .map_err(err)?,
                    ),
                    blob: Vec::new(),
                },
                None,
            ),
            Some(g) => {
                let h = Arc::new(GpuHeap::alloc(g, self.heap_bytes)?);
                (
                    procs::Contribution {
                        heap_fd: None,
                        blob: h.handle()?,
                    },
                    Some(h),
                )
            }
        };
        let joined = procs::bootstrap(env, config, mine, self.timeout).map_err(err)?;
        let team = Team::new(
            Arc::new(procs::map(joined.team_fd.as_fd_ref(), team::TEAM_BYTES).map_err(err)?),
            me == 0,
        )
        .map_err(err)?;
        let heaps = match (&gpu, own_gpu) {
            (None, _) => {
                let mut hs: Vec<Arc<dyn HostMemory>> = Vec::with_capacity(joined.all.len());
                for (r, c) in joined.all.iter().enumerate() {
                    let fd = c.heap_fd.as_ref().ok_or_else(|| {
                        err(format!("rank {r} sent no heap (mixed host and GPU ranks?)"))
                    })?;
                    hs.push(Arc::new(
                        procs::map(fd.as_fd_ref(), self.heap_bytes).map_err(err)?,
                    ));
                }
                Heaps::Host(hs.into())
            }
            (Some(g), Some(own)) => {
                let mut hs = Vec::with_capacity(joined.all.len());
                for (r, c) in joined.all.iter().enumerate() {
                    if r == me as usize {
                        hs.push(own.clone());
                    } else {
                        hs.push(Arc::new(GpuHeap::open(g, &c.blob, self.heap_bytes)?));
                    }
                }
                Heaps::Gpu(hs.into())
            }
            (Some(_), None) => return Err(err("internal: no GPU heap".into())),
        };
        // Rank 0 created the team segment; make sure everybody mapped it (and every
        // heap) before anyone fails or allocates through it.
        let rank = self.make_rank(me, heaps, team, device, Some(joined.peers))?;
        rank.barrier()?;
        Ok(rank)
    }

    fn make_rank(
        &self,
        me: u32,
        heaps: Heaps,
        team: Team,
        device: &Device,
        peers: Option<Vec<(u32, std::os::unix::net::UnixStream)>>,
    ) -> Result<Rank, Error> {
        let gpu = match (&heaps, GpuDev::of(device)) {
            (Heaps::Gpu(h), Some(g)) => Some(GpuRank::new(&g, h)?),
            _ => None,
        };
        let shared = Arc::new(Shared::new(
            self.size as u32,
            team,
            heaps,
            self.timeout,
            self.signal_bytes,
            self.heap_bytes,
        )?);
        let link = match peers {
            Some(p) => {
                let s = shared.clone();
                let died: Arc<dyn Fn(u32) + Send + Sync> = Arc::new(move |r| s.abort(r, true));
                Some(
                    procs::Link::start(me, p, died)
                        .map_err(|message| Error::Comm { rank: me, message })?,
                )
            }
            None => None,
        };
        Ok(Rank::new(me, shared, device, gpu, link))
    }

    /// Joins the launched world ([`World::join`]), runs `f` as this process's rank and
    /// leaves. When `f` fails, the world is marked as failed first, so the other
    /// ranks' waits and barriers stop instead of timing out.
    pub fn run_process<R>(&self, f: impl FnOnce(&Rank) -> Result<R, Error>) -> Result<R, Error> {
        let rank = self.join()?;
        let out = f(&rank);
        if out.is_err() {
            rank.abort();
        }
        out
    }
}

/// Borrowing an owned descriptor (a tiny helper for readability).
trait AsFdRef {
    fn as_fd_ref(&self) -> std::os::fd::BorrowedFd<'_>;
}
impl AsFdRef for std::os::fd::OwnedFd {
    fn as_fd_ref(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}

/// The message of a panic payload (`panic!` with a literal or a format string).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// True for errors that only report another rank's failure.
fn is_consequence(e: &Error) -> bool {
    match e {
        Error::Exec(ie) => matches!(**ie, InterpError::Aborted { .. }),
        Error::Comm { message, .. } => message.starts_with("abandoned"),
        #[cfg(feature = "jit")]
        Error::Emu(ee) => match &**ee {
            tessera_codegen::emu::EmuError::Comm(f) => {
                matches!(**f, tessera_codegen::comm::CommFault::Aborted { .. })
            }
            _ => false,
        },
        #[cfg(feature = "jit")]
        Error::CommFault(f) => matches!(**f, tessera_codegen::comm::CommFault::Aborted { .. }),
        _ => false,
    }
}

/// Bump cursors of one rank's heap regions.
#[derive(Debug)]
struct Cursor {
    signal_next: usize,
    data_next: usize,
    count: usize,
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
    pub(crate) coll: std::sync::Mutex<Option<crate::collectives::Workspace>>,
    /// Ranks as processes: the connections to the other ranks (dropped last).
    link: Option<procs::Link>,
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
                eprintln!(
                    "tessera: rank {} leaves the world although rank(s) {} did not leave within {:.3} s (still working, stopped or hung?); from now on their deaths are seen by timeouts only",
                    self.rank,
                    ranks.join(", "),
                    patience.as_secs_f64()
                );
            }
        }
    }
}

impl Rank {
    fn new(
        rank: u32,
        shared: Arc<Shared>,
        base: &Device,
        gpu: Option<GpuRank>,
        link: Option<procs::Link>,
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

    /// This rank's device: launches on it run as this rank (kernels see `rank()`,
    /// `world_size()` and the symmetric heaps).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Marks this rank as failed: every rank's device-side waits and host barriers
    /// stop with an error naming it. [`World::run`] and [`World::run_process`] do it
    /// when the rank's code fails; call it when handling a failure yourself.
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

    fn err(&self, message: String) -> Error {
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
            Stop::Failed { rank, .. } => self.err(format!("abandoned {what}: rank {rank} failed")),
            Stop::Left { rank } => {
                // The others' waits stop too, naming the rank that left.
                self.shared.abort_by_leaving(rank);
                self.err(format!(
                    "abandoned {what}: rank {rank} left the world (dropped its Rank) before arriving, so it never will"
                ))
            }
            Stop::Timeout { missing } => {
                self.abort();
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
                    copies.push(Arc::new(HostBuffer::view(h.clone(), offset, T::TY, len)?));
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
                    copies.push(Arc::new(HostBuffer::view(
                        h.clone(),
                        heap_offset,
                        U::TY,
                        len,
                    )?));
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

    /// How long device-side waits and host barriers wait before failing.
    pub fn wait_timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// The first rank that failed, if any.
    pub fn failed_rank(&self) -> Option<u32> {
        self.shared.failed(self.rank)
    }
}

/// A symmetric buffer: the same allocation on every rank of a world. Dereferences to
/// this rank's copy (a [`Buffer`], for upload/download), and is passed to kernels for
/// `&Symmetric<T>` / `&mut Symmetric<T>` parameters.
pub struct SymBuffer<T: Element> {
    local: Buffer<T>,
    /// Every rank's copy (host worlds; empty for GPU worlds).
    pub(crate) copies: Arc<[Arc<HostBuffer>]>,
    shared: Arc<Shared>,
    offset: usize,
}

impl<T: Element> std::fmt::Debug for SymBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SymBuffer<{}>[{}] at heap offset {}",
            T::TY,
            self.local.len(),
            self.offset
        )
    }
}

impl<T: Element> SymBuffer<T> {
    /// The world this buffer was allocated in.
    pub(crate) fn world_shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Byte offset of the allocation in every rank's heap.
    pub fn heap_offset(&self) -> usize {
        self.offset
    }

    /// This rank's copy.
    pub fn local(&self) -> &Buffer<T> {
        &self.local
    }

    /// Reads rank `peer`'s copy from the host (for checks and debugging).
    pub fn download_peer(&self, peer: u32) -> Result<Vec<T>, Error> {
        let size = self.shared.size;
        if peer >= size {
            return Err(Error::Comm {
                rank: 0,
                message: format!("peer {peer} is outside a world of {size} rank(s)"),
            });
        }
        let bytes = match &self.shared.heaps {
            Heaps::Host(_) => self.copies[peer as usize].read_bytes(),
            Heaps::Gpu(hs) => {
                // The peer's writes are ordered by its own stream: wait for ours.
                self.local.device().synchronize()?;
                hs[peer as usize].read(self.offset, std::mem::size_of::<T>() * self.local.len())?
            }
        };
        let mut out = vec![T::zeroed(); self.local.len()];
        let dst = bytemuck::cast_slice_mut::<T, u8>(&mut out);
        if bytes.len() != dst.len() {
            return Err(Error::BufferSize(format!(
                "read {} bytes of rank {peer}'s copy for {} elements",
                bytes.len(),
                self.local.len()
            )));
        }
        dst.copy_from_slice(&bytes);
        Ok(out)
    }
}

impl<T: Element> Deref for SymBuffer<T> {
    type Target = Buffer<T>;
    fn deref(&self) -> &Buffer<T> {
        &self.local
    }
}

impl<T: Element> DerefMut for SymBuffer<T> {
    fn deref_mut(&mut self) -> &mut Buffer<T> {
        &mut self.local
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn small(n: usize) -> World {
        World::local(n)
            .heap_bytes(1 << 16)
            .signal_bytes(4096)
            .wait_timeout(Duration::from_secs(5))
    }

    #[test]
    fn allocations_and_barriers_across_threads() {
        let out = small(3)
            .run(|r| {
                let mut offsets = Vec::new();
                for round in 0..5u32 {
                    let b = r.upload(&[r.rank() * 100 + round; 7])?;
                    let s = r.alloc_signals(3)?;
                    offsets.push((b.heap_offset(), s.heap_offset()));
                    r.barrier()?;
                    // Every rank's copy, read through the shared heaps.
                    for p in 0..r.size() {
                        assert_eq!(b.download_peer(p)?, vec![p * 100 + round; 7]);
                    }
                    r.barrier()?;
                }
                Ok(offsets)
            })
            .unwrap();
        assert!(out.iter().all(|o| *o == out[0]));
        assert_eq!(out[0][0], (CTRL_BYTES + 4096, CTRL_BYTES));
        assert_eq!(out[0][1].0, CTRL_BYTES + 4096 + SYM_ALIGN);
    }

    #[test]
    fn mismatched_allocations_are_reported() {
        let e = small(2)
            .run(|r| {
                if r.rank() == 0 {
                    r.alloc::<f32>(10)?;
                } else {
                    r.alloc::<i32>(12)?;
                }
                Ok(())
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("differs between ranks"), "{e}");
    }

    #[test]
    fn a_failing_rank_releases_a_host_barrier() {
        let t = Instant::now();
        let e = small(2)
            .run(|r| {
                if r.rank() == 1 {
                    return Err(r.err("boom".into()));
                }
                r.barrier()
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("boom"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn a_missing_rank_times_out_a_host_barrier() {
        let e = small(2)
            .wait_timeout(Duration::from_millis(200))
            .run(|r| if r.rank() == 0 { r.barrier() } else { Ok(()) })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("host barrier (1 of 2 ranks arrived) timed out"),
            "{e}"
        );
    }

    #[test]
    fn a_process_outside_a_launch_is_a_world_of_one() {
        if std::env::var_os("WORLD_SIZE").is_some() {
            return; // launched by torchrun-like tooling: not this test's subject
        }
        let w = World::launched()
            .unwrap()
            .heap_bytes(1 << 16)
            .signal_bytes(4096);
        assert_eq!(w.size(), 1);
        assert!(w.run(|_| Ok(())).is_err(), "run is for threads");
        let got = w
            .run_process(|r| {
                assert_eq!((r.rank(), r.size()), (0, 1));
                let b = r.upload(&[3.5f32, -1.0, 7.25])?;
                r.barrier()?;
                b.download_peer(0)
            })
            .unwrap();
        assert_eq!(got, vec![3.5, -1.0, 7.25]);
    }

    #[test]
    fn bad_configurations() {
        let e = small(2)
            .on_each(&[Device::cpu(), Device::cpu(), Device::cpu()])
            .run(|_| Ok(()))
            .unwrap_err();
        assert!(e.to_string().contains("3 devices for 2 ranks"), "{e}");
        let e = small(2).join().unwrap_err();
        assert!(e.to_string().contains("launched world"), "{e}");
        let e = small(0).run(|_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("1 to 1024"), "{e}");
    }
}

//! Worlds of ranks: symmetric heaps, symmetric buffers and host-side team operations.
//!
//! Tessera programs that communicate are SPMD, as with `torchrun`, NVSHMEM or MPI:
//! every rank runs the same code on its own device and calls the same collective
//! operations in the same order. A world's ranks are either
//!
//! - **threads of this process**: [`World::local`]`(n)` then [`World::run`], which
//!   calls a closure once per rank with its [`Rank`] handle; or
//! - **processes of one node** sharing memory, one rank each, started by `torchrun` or
//!   [`spawn_local`]: [`World::launched`] (or [`World::from_env`]) reads `RANK`,
//!   `WORLD_SIZE`, `LOCAL_RANK` and the bootstrap socket (`TESSERA_BOOTSTRAP`, else
//!   derived from `MASTER_ADDR`/`MASTER_PORT`; see [`procs`]), and [`World::join`]
//!   returns this process's [`Rank`] once every rank has joined
//!   ([`World::run_process`] joins, runs a closure and leaves).
//!
//! - **processes of an MPI job**, on one node or many, started by `mpirun` or `srun`
//!   (feature `mpi`): [`World::mpi`], or [`World::launched`], which picks MPI for a
//!   process an MPI launcher started (or with `TESSERA_TRANSPORT=mpi`). Ranks are CPU
//!   ranks; each heap is the rank's part of an MPI window; the heaps of a node's
//!   ranks are mapped by each of them where MPI can share memory, and every other
//!   access to a peer (and every atomic) goes through MPI one-sided communication
//!   (`MPI_Get`, `MPI_Put`, `MPI_Compare_and_swap`, `MPI_Fetch_and_op`; see
//!   `mpi.rs`), as does the team segment. Results are bit-for-bit those of the other transports
//!   (`scripts/mpi-check.sh` checks it, with shared memory disabled).
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
//! fails with [`Error::DeviceUnavailable`] when the [`Device`] is opened.
//! Communicating kernels launch on every kind of rank: on a GPU rank they get the
//! address of the rank's heap-base table (every rank's heap as this GPU sees it,
//! reached through peer access or IPC), on an emulator rank every rank's host heap
//! base, and on a CPU rank the interpreter reads the host heaps directly.
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
//!
//! **Files.** This file holds [`World`]: its builder, [`World::run`] (ranks as
//! threads) and [`World::join`] (ranks as processes). `rank.rs` holds [`Rank`] (host
//! barriers, symmetric allocation, failure reporting) and the rank's link to its
//! device, through which launches of communicating kernels find their world;
//! `symmetric.rs` holds [`SymBuffer`]; `heap.rs` the host heaps, the state the ranks
//! of a world share and the allocation cursors; `gpu.rs` the heaps in GPU memory;
//! `team.rs` the team segment; [`procs`] the bootstrap of ranks as processes.

mod gpu;
mod heap;
#[cfg(feature = "mpi")]
mod mpi;
pub mod nvshmem;
pub mod procs;
mod rank;
pub mod rendezvous;
mod shmem_world;
mod symmetric;
mod team;

pub use heap::{CTRL_BYTES, SYM_ALIGN};
pub use procs::{LaunchEnv, spawn_local, spawn_local_with};
pub use rank::Rank;
pub use symmetric::SymBuffer;

use std::sync::Arc;
use std::time::Duration;

use tessera_ir::interp::HostMemory;

use crate::device::Device;
use crate::error::Error;

use gpu::{GpuDev, GpuHeap, GpuRank, gpu_of};
use heap::{Heaps, HostHeap, HostHeapRef, Shared};
use team::Team;

/// How the ranks of a world are laid out, and the transport between them.
#[derive(Clone, Debug)]
enum Layout {
    /// All ranks as threads of this process.
    Threads,
    /// This process is one rank of a world of processes on one node (shared memory).
    Process(LaunchEnv),
    /// This process is one rank of an MPI job (one node or many).
    #[cfg(feature = "mpi")]
    Mpi(MpiLib),
    /// This process is one GPU rank of an NVSHMEM world (one node or many).
    Nvshmem(shmem_world::ShmemLaunch),
}

/// The process's MPI library, held by a world that will join through it.
#[cfg(feature = "mpi")]
#[derive(Clone)]
struct MpiLib(Arc<mpi::Mpi>);

#[cfg(feature = "mpi")]
impl std::fmt::Debug for MpiLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mpi(rank {} of {})", self.0.rank, self.0.size)
    }
}

/// Variables that MPI launchers (`mpirun` of Open MPI or MPICH, `srun`) set in the
/// processes they start.
const MPI_LAUNCHER_VARS: &[&str] = &["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];

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
    /// Ranks per (emulated) node ([`World::ranks_per_node`]).
    ranks_per_node: Option<usize>,
}

impl World {
    /// `size` ranks as threads of this process, each on the CPU device (change with
    /// [`World::on`] or [`World::on_each`]).
    pub fn local(size: usize) -> World {
        // The configured defaults (`TESSERA_HEAP_BYTES`, `TESSERA_WAIT_TIMEOUT`); a bad
        // variable falls back to the built-in defaults here and is reported when the
        // world is run or joined (`World::check`).
        let config = crate::config::get().unwrap_or_default();
        World {
            size,
            layout: Layout::Threads,
            devices: vec![Device::cpu()],
            heap_bytes: config.heap_bytes,
            signal_bytes: 1 << 20,
            timeout: config.wait_timeout,
            ranks_per_node: None,
        }
    }

    /// The world this process was launched into (by `torchrun` or [`spawn_local`]:
    /// `RANK`, `WORLD_SIZE`, ...; see [`procs`]), as a builder: configure it like a
    /// local world (every rank must configure it the same), then [`World::join`].
    /// Without `WORLD_SIZE`, a world of one rank.
    ///
    /// The transport is chosen here: `TESSERA_TRANSPORT=mpi` (or, with it unset, a
    /// process started by an MPI launcher, `mpirun` or `srun`, and no `WORLD_SIZE`)
    /// makes it [`World::mpi`]; otherwise the ranks are processes of one node that
    /// share memory (`TESSERA_TRANSPORT=shm`).
    pub fn launched() -> Result<World, Error> {
        match transport(|k| std::env::var(k).ok())? {
            Transport::Mpi => return World::mpi(),
            Transport::Nvshmem => return World::nvshmem(),
            Transport::Shm => {}
        }
        let env = LaunchEnv::from_env()?;
        Ok(World {
            size: env.size as usize,
            layout: Layout::Process(env),
            ..World::local(1)
        })
    }

    /// The world of the MPI job this process belongs to (started by `mpirun` or
    /// `srun`, on one node or many), as a builder: configure it like a local world
    /// (every rank must configure it the same), then [`World::join`]. Initializes MPI
    /// (finalized when the last world of the process is gone). Ranks are CPU ranks
    /// that reach their peers through MPI one-sided communication, or directly for
    /// the peers of their node where MPI can share memory (see the module docs). Needs the `mpi` feature; without it, an error saying so.
    pub fn mpi() -> Result<World, Error> {
        #[cfg(feature = "mpi")]
        {
            if let Ok(v) = std::env::var(mpi::SHARED_VAR)
                && !matches!(v.trim(), "0" | "1")
            {
                return Err(Self::comm_err(format!(
                    "{}={v:?}: expected 0 (every peer through MPI calls) or 1 (share the heaps of a node's processes)",
                    mpi::SHARED_VAR
                )));
            }
            let lib = mpi::Mpi::get().map_err(Self::comm_err)?;
            Ok(World {
                size: lib.size as usize,
                layout: Layout::Mpi(MpiLib(lib)),
                ..World::local(1)
            })
        }
        #[cfg(not(feature = "mpi"))]
        Err(Self::comm_err(
            "this process was asked to join an MPI world (TESSERA_TRANSPORT=mpi, or started by mpirun/srun) but Tessera was built without its `mpi` feature: rebuild with `--features mpi` (needs an MPI library, e.g. Debian's libopenmpi-dev)".into(),
        ))
    }

    /// The NVSHMEM world this process was launched into, one rank per GPU, on one
    /// node or many (started by `torchrun`: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `MASTER_ADDR`, `MASTER_PORT`, and `TESSERA_BOOTSTRAP_SECRET` set to the same
    /// random value for every rank; the rendezvous listens on `MASTER_PORT + 1`, or
    /// `TESSERA_RENDEZVOUS_PORT`), as a builder: give the rank its GPU
    /// (`.on(&Device::cuda(local_rank)?)`, or [`World::on_each`] with the node's
    /// GPUs, indexed by `LOCAL_RANK`), configure it like a local world, then
    /// [`World::join`]. [`World::launched`] picks it with `TESSERA_TRANSPORT=nvshmem`.
    ///
    /// Ranks reach the peers of their node that NVSHMEM maps by loads and stores, and
    /// every other peer through NVSHMEM: kernels launched on the rank's device are
    /// compiled with NVSHMEM's device library linked
    /// ([`CommEngine::Nvshmem`](tessera_codegen::CommEngine)) when the ranks span
    /// nodes; the host reaches other nodes with NVSHMEM's host-side calls. NVSHMEM's
    /// host library is loaded at run time (`TESSERA_NVSHMEM_HOME`, see
    /// [`nvshmem`]); the rendezvous is Tessera's own, over TCP ([`rendezvous`]).
    /// With [`World::ranks_per_node`] the nodes are blocks of ranks instead of host
    /// names (`ranks_per_node(1)` sends every peer through NVSHMEM, on one machine
    /// too). See `shmem_world.rs` for the steps of joining.
    pub fn nvshmem() -> Result<World, Error> {
        let launch = shmem_world::ShmemLaunch::from_vars(|k| {
            std::env::var(k).ok().filter(|v| !v.trim().is_empty())
        })?;
        Ok(World {
            size: launch.size as usize,
            layout: Layout::Nvshmem(launch),
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

    /// Places the ranks on nodes of `n` consecutive ranks each (rank `r` on node
    /// `r / n`), for ranks as threads ([`World::run`]) on the emulator: peers of a
    /// rank's node are reached through memory, the others only through the off-node
    /// engine, NVSHMEM (kernels are compiled with
    /// [`CommEngine::Nvshmem`](tessera_codegen::CommEngine), whose device functions
    /// the emulator implements from their documented semantics), as on a cluster of
    /// GPU nodes. Every kernel, collective and fused plan runs unchanged and must
    /// give the results of a one-node world. On the CPU device (the reference
    /// interpreter) the placement changes nothing; on GPUs, and for `emu-amd`
    /// (rocSHMEM), running such a world is an error naming what is missing.
    ///
    /// For an MPI world ([`World::launched`] under `mpirun`, feature `mpi`) it splits
    /// each node's processes into groups of `n` consecutive ranks that map each
    /// other's heaps, and reach the other groups through MPI calls: nodes of `n`
    /// ranks emulated on fewer machines. Either way the placement is what the
    /// hierarchical collectives follow ([`Rank::nodes`]).
    pub fn ranks_per_node(mut self, n: usize) -> World {
        self.ranks_per_node = Some(n);
        self
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Each rank's node under [`World::ranks_per_node`]; `None` without it.
    fn nodes(&self, gpu: bool) -> Result<Option<Arc<[u32]>>, Error> {
        let Some(n) = self.ranks_per_node else {
            return Ok(None);
        };
        if n == 0 {
            return Err(Self::comm_err(
                "ranks_per_node(0): a node holds at least one rank".into(),
            ));
        }
        if gpu && n < self.size {
            return Err(Self::comm_err(format!(
                "ranks_per_node({n}) puts these GPU ranks, threads of one process, on several nodes: GPU ranks across nodes are processes of an NVSHMEM world (World::nvshmem, one process per GPU); threads on emulated nodes run on the emulator (Device::emu)"
            )));
        }
        Ok(Some((0..self.size).map(|r| (r / n) as u32).collect()))
    }

    fn comm_err(message: String) -> Error {
        Error::Comm { rank: 0, message }
    }

    fn check(&self) -> Result<(), Error> {
        // An unusable `TESSERA_*` variable is an error, not a silent default.
        crate::config::get()?;
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
            Arc::new(HostHeap::new(team::TEAM_BYTES, "cpu", Self::comm_err)?);
        Team::new(mem, true).map_err(Self::comm_err)
    }

    /// Every rank's heap for ranks as threads: host memory, or GPU memory with peer
    /// access between the ranks' GPUs.
    fn thread_heaps(&self) -> Result<Heaps, Error> {
        let gpus: Vec<Option<GpuDev>> = (0..self.size)
            .map(|r| self.device_of(r).map(gpu_of))
            .collect::<Result<_, _>>()?;
        if gpus.iter().all(Option::is_none) {
            let mut heaps = Vec::with_capacity(self.size);
            for r in 0..self.size {
                let device = self.device_of(r)?.id();
                heaps.push(HostHeapRef::Local(Arc::new(HostHeap::new(
                    self.heap_bytes,
                    &device,
                    Self::comm_err,
                )?)));
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
        if !matches!(self.layout, Layout::Threads) {
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
        let nodes = self.nodes(gpu_heaps.is_some())?;
        let mut shared = Shared::new(
            self.size as u32,
            Self::team_segment()?,
            heaps,
            self.timeout,
            self.signal_bytes,
            self.heap_bytes,
        )?;
        shared.nodes = nodes;
        let shared = Arc::new(shared);
        let mut ranks = Vec::with_capacity(self.size);
        for r in 0..self.size {
            let device = self.device_of(r)?;
            let gpu = match (&gpu_heaps, gpu_of(device)) {
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
        #[cfg(feature = "mpi")]
        if let Layout::Mpi(lib) = &self.layout {
            return self.join_mpi(&lib.0);
        }
        if let Layout::Nvshmem(launch) = &self.layout {
            return shmem_world::join(self, launch);
        }
        let Layout::Process(env) = &self.layout else {
            return Err(Self::comm_err(
                "World::join is for a launched world (World::launched / World::from_env); World::local runs its ranks with World::run".into(),
            ));
        };
        if self.ranks_per_node.is_some() {
            return Err(Self::comm_err(
                "ranks_per_node places ranks as threads (World::run) on emulated nodes; a launched world's ranks are processes of one node".into(),
            ));
        }
        self.check()?;
        let me = env.rank;
        let err = move |message: String| Error::Comm { rank: me, message };
        let device = self.device_of(me as usize)?;
        let gpu = gpu_of(device);
        if env.size == 1 {
            // A world of one: nothing to exchange.
            let heaps = match &gpu {
                None => Heaps::Host(Arc::from(vec![HostHeapRef::Local(Arc::new(
                    HostHeap::new(self.heap_bytes, &device.id(), err)?,
                ))])),
                Some(g) => Heaps::Gpu(Arc::from(vec![Arc::new(GpuHeap::alloc(
                    g,
                    self.heap_bytes,
                )?)])),
            };
            return self.make_rank(0, heaps, Self::team_segment()?, device, None, None);
        }
        let kind = match gpu.as_ref().map(|g| g.kind()) {
            None => 0,
            Some(crate::DeviceKind::Hip) => 2,
            Some(_) => 1,
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
                let mut hs = Vec::with_capacity(joined.all.len());
                for (r, c) in joined.all.iter().enumerate() {
                    let fd = c.heap_fd.as_ref().ok_or_else(|| {
                        err(format!("rank {r} sent no heap (mixed host and GPU ranks?)"))
                    })?;
                    hs.push(HostHeapRef::Local(Arc::new(
                        procs::map(fd.as_fd_ref(), self.heap_bytes).map_err(err)?,
                    )));
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
        let rank = self.make_rank(me, heaps, team, device, Some(joined.peers), None)?;
        rank.barrier()?;
        Ok(rank)
    }

    /// [`World::join`] for an MPI world: the heaps and the team segment are MPI
    /// windows (see `mpi`).
    #[cfg(feature = "mpi")]
    fn join_mpi(&self, lib: &Arc<mpi::Mpi>) -> Result<Rank, Error> {
        let me = lib.rank;
        let err = move |message: String| Error::Comm { rank: me, message };
        // Every rank learns whether every rank can join and with which sizes before
        // anything collective that could wait forever for a rank that gave up.
        let local = self.check().and_then(|()| {
            let device = self.device_of(me as usize)?;
            if matches!(device.backend, crate::device::Backend::Cpu | crate::device::Backend::Interp) {
                Ok(device)
            } else {
                Err(err(format!(
                    "the MPI transport runs CPU ranks (the interpreter reaches peers through MPI); this rank's device is {}",
                    device.id()
                )))
            }
        });
        // Every wait for a peer is bounded by the wait timeout (see `mpi`).
        let fate = Arc::new(mpi::Fate::new(self.timeout));
        let all = lib
            .allgather_u64(
                &[
                    u64::from(local.is_ok()),
                    self.heap_bytes as u64,
                    self.signal_bytes as u64,
                ],
                self.timeout,
            )
            .map_err(err)?;
        let device = local?;
        if let Some(r) = all.iter().position(|c| c[0] == 0) {
            return Err(err(format!(
                "rank {r} could not join the MPI world (its own error says why)"
            )));
        }
        let mine = &all[me as usize];
        if let Some((r, c)) = all.iter().enumerate().find(|(_, c)| c[1..] != mine[1..]) {
            return Err(err(format!(
                "ranks configure the world differently: this rank has a heap of {} bytes with {} bytes of signals, rank {r} {} and {}; every rank must configure it the same",
                self.heap_bytes, self.signal_bytes, c[1], c[2]
            )));
        }
        // Windows are allocated collectively, in the same order on every rank. The
        // heaps of a node's ranks are allocated together where MPI can share memory,
        // so that each rank maps its node's other heaps.
        let zero = CTRL_BYTES + self.signal_bytes;
        let heap = Arc::new(
            match mpi::Window::allocate_node_shared(
                lib,
                self.heap_bytes,
                zero,
                self.ranks_per_node,
                &fate,
            )
            .map_err(err)?
            {
                Some(w) => w,
                None => mpi::Window::allocate(lib, self.heap_bytes, zero, &fate).map_err(err)?,
            },
        );
        let team_bytes = if me == 0 { team::TEAM_BYTES } else { 0 };
        let team_win =
            Arc::new(mpi::Window::allocate(lib, team_bytes, team_bytes, &fate).map_err(err)?);
        let team_mem = Arc::new(mpi::Peer {
            win: team_win,
            target: 0,
            len: team::TEAM_BYTES,
        });
        // Rank 0 writes the magic word before the others check it. Each step ends in
        // an agreement, so that a failure on one rank is an error on all (not a hang).
        let team = if me == 0 {
            Some(Team::remote(team_mem.clone(), true))
        } else {
            None
        };
        let problem = team.as_ref().and_then(|t| t.as_ref().err().cloned());
        lib.agree(problem, "set up the team segment", self.timeout)
            .map_err(err)?;
        let team = match team {
            Some(t) => t,
            None => Team::remote(team_mem, false),
        };
        lib.agree(
            team.as_ref().err().cloned(),
            "open the team segment",
            self.timeout,
        )
        .map_err(err)?;
        let team = team.map_err(err)?;
        let heaps: Vec<HostHeapRef> = (0..lib.size)
            .map(|r| match mpi::Part::mapped(&heap, r) {
                // This rank's heap, and its node's others where mapped: direct loads
                // and stores, atomics through the window.
                Some(part) => HostHeapRef::Local(Arc::new(part)),
                None => HostHeapRef::Remote(Arc::new(mpi::Peer {
                    win: heap.clone(),
                    target: r,
                    len: self.heap_bytes,
                })),
            })
            .collect();
        // Each rank's node: the lowest rank whose heap it maps (its own included).
        let first = (0..lib.size)
            .find(|&r| mpi::Part::mapped(&heap, r).is_some())
            .unwrap_or(me);
        let nodes: Arc<[u32]> = lib
            .allgather_u64(&[u64::from(first)], self.timeout)
            .map_err(err)?
            .iter()
            .map(|v| v.first().map_or(0, |&x| x as u32))
            .collect();
        let rank = self.make_rank(
            me,
            Heaps::Host(heaps.into()),
            team,
            device,
            None,
            Some(nodes),
        )?;
        // A failed world's windows are freed only if every rank comes to free them.
        rank.set_mpi(fate);
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
        nodes: Option<Arc<[u32]>>,
    ) -> Result<Rank, Error> {
        let gpu = match (&heaps, gpu_of(device)) {
            (Heaps::Gpu(h), Some(g)) => Some(GpuRank::new(&g, h)?),
            _ => None,
        };
        let mut shared = Shared::new(
            self.size as u32,
            team,
            heaps,
            self.timeout,
            self.signal_bytes,
            self.heap_bytes,
        )?;
        shared.nodes = nodes;
        let shared = Arc::new(shared);
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

/// The transport a launched process joins its world through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// Processes of one node sharing memory.
    Shm,
    /// An MPI job.
    Mpi,
    /// GPU ranks on NVSHMEM.
    Nvshmem,
}

/// The transport of a launched process (see [`World::launched`]), from the variables
/// `get` reads.
fn transport(get: impl Fn(&str) -> Option<String>) -> Result<Transport, Error> {
    let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    match var("TESSERA_TRANSPORT").as_deref().map(str::trim) {
        Some("mpi") => Ok(Transport::Mpi),
        Some("shm") => Ok(Transport::Shm),
        Some("nvshmem") => Ok(Transport::Nvshmem),
        Some(other) => Err(Error::Config(format!(
            "TESSERA_TRANSPORT=`{other}`: expected `shm`, `mpi` or `nvshmem`"
        ))),
        None => {
            let launcher =
                var("WORLD_SIZE").is_none() && MPI_LAUNCHER_VARS.iter().any(|k| var(k).is_some());
            if launcher && !cfg!(feature = "mpi") {
                // A build without MPI under `srun` stays what it was: a world of one.
                log::warn!(
                    "started by an MPI launcher but built without Tessera's `mpi` feature: this process is a world of one (rebuild with --features mpi to join the MPI job's world)"
                );
            }
            Ok(if launcher && cfg!(feature = "mpi") {
                Transport::Mpi
            } else {
                Transport::Shm
            })
        }
    }
}

/// The variables `vars` as a lookup, as the launch-parsing functions take them (tests).
#[cfg(test)]
fn test_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
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

/// True for errors that only report another rank's failure (also when a collective
/// or fused plan wraps one with the user's call site).
fn is_consequence(e: &Error) -> bool {
    e.reports_another_rank()
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
    fn the_transport_follows_the_launcher_and_the_variable() {
        fn transport_of(vars: &[(&str, &str)]) -> Result<Transport, Error> {
            transport(test_env(vars))
        }
        fn with(vars: &[(&str, &str)]) -> Result<bool, Error> {
            transport_of(vars).map(|t| t == Transport::Mpi)
        }
        assert_eq!(
            transport_of(&[("WORLD_SIZE", "2"), ("TESSERA_TRANSPORT", "nvshmem")]).unwrap(),
            Transport::Nvshmem
        );
        assert!(!with(&[]).unwrap());
        assert!(!with(&[("WORLD_SIZE", "4"), ("RANK", "1")]).unwrap());
        for launcher in MPI_LAUNCHER_VARS {
            // (Without the `mpi` feature a launched process stays a world of one.)
            assert_eq!(
                with(&[(launcher, "4")]).unwrap(),
                cfg!(feature = "mpi"),
                "{launcher}"
            );
        }
        // torchrun's variables win over an MPI launcher's; the variable over both.
        assert!(!with(&[("WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap());
        assert!(with(&[("WORLD_SIZE", "2"), ("TESSERA_TRANSPORT", " mpi ")]).unwrap());
        assert!(!with(&[("PMI_SIZE", "2"), ("TESSERA_TRANSPORT", "shm")]).unwrap());
        let e = with(&[("TESSERA_TRANSPORT", "ib")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TESSERA_TRANSPORT=`ib`") && e.contains("`shm`, `mpi` or `nvshmem`"),
            "{e}"
        );
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn an_mpi_world_without_the_feature_says_so() {
        let e = World::mpi().unwrap_err().to_string();
        assert!(
            e.contains("without its `mpi` feature") && e.contains("--features mpi"),
            "{e}"
        );
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

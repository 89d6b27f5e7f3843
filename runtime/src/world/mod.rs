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
//!   `transport/mpi/`), as does the team segment. Results are bit-for-bit those of
//!   the other transports (`scripts/mpi-check.sh` checks it, with shared memory
//!   disabled).
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
//! **Several ranks on one GPU** ([`World::on`] with a GPU, or an emulator) run
//! truly at once: each rank gets a part of the device ([`Device::partition`]): its
//! own stream and its own share of the multiprocessors (a CUDA green context, a HIP
//! CU mask, or launches sized to the share), so every rank's waiting kernels are
//! resident together. A waiting kernel with more programs than its rank's share
//! holds fails to launch, saying so; the fused plans and the collectives size their
//! launches to it. Peers are reached by plain device pointers, through the same heap
//! table as across GPUs: communication is then device-local memory traffic.
//!
//! **Files.** This folder holds the abstraction; the transports live under
//! `transport/`. This file holds [`World`]: its builder, [`World::run`] (ranks as
//! threads), and [`World::launched`] and [`World::join`] (ranks as processes), which
//! pick the transport and hand the joining to it. `rank.rs` holds [`Rank`] (host
//! barriers, symmetric allocation, failure reporting), the rank's link to its
//! device, through which launches of communicating kernels find their world, and
//! what a rank keeps of its transport; `symmetric.rs` holds [`SymBuffer`]; `heap.rs`
//! the host heaps, the state the ranks of a world share and the allocation cursors;
//! `gpu.rs` the heaps in GPU memory; `team.rs` the team segment.
//!
//! `transport/mod.rs` chooses a launched process's transport; each transport has a
//! folder or file of its own there and its own `join`: [`procs`]
//! (`transport/procs/`: processes of one node, shared memory; its bootstrap,
//! watchdog and launcher), `transport/mpi/` (an MPI job, feature `mpi`), [`nvshmem`]
//! (`transport/nvshmem/`: GPU ranks on NVSHMEM, with its host library) and
//! [`rendezvous`] (`transport/rendezvous.rs`: the TCP rendezvous a world across nodes
//! meets at).

mod gpu;
mod heap;
mod rank;
mod symmetric;
mod team;
mod transport;

pub use heap::{CTRL_BYTES, SYM_ALIGN};
pub use rank::Rank;
pub use symmetric::SymBuffer;
pub use transport::procs::{LaunchEnv, spawn_local, spawn_local_with};
pub use transport::{nvshmem, procs, rendezvous};

use std::sync::Arc;
use std::time::Duration;

use tessera_ir::interp::HostMemory;

use crate::device::Device;
use crate::error::Error;

use gpu::{GpuDev, GpuHeap, GpuRank, gpu_of};
use heap::{Heaps, HostHeap, HostHeapRef, Shared};
use rank::StartLink;
use team::Team;
use transport::Transport;
#[cfg(feature = "mpi")]
use transport::mpi;

/// How the ranks of a world are laid out, and the transport between them.
#[derive(Clone, Debug)]
enum Layout {
    /// All ranks as threads of this process.
    Threads,
    /// This process is one rank of a world of processes on one node (shared memory).
    Process(LaunchEnv),
    /// This process is one rank of an MPI job (one node or many).
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiLib),
    /// This process is one GPU rank of an NVSHMEM world (one node or many).
    Nvshmem(nvshmem::ShmemLaunch),
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
        match transport::chosen(|k| std::env::var(k).ok())? {
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
            let lib = mpi::MpiLib::open()?;
            Ok(World {
                size: lib.size(),
                layout: Layout::Mpi(lib),
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
    /// too). See [`nvshmem`] for the steps of joining.
    pub fn nvshmem() -> Result<World, Error> {
        let launch = nvshmem::ShmemLaunch::from_vars(|k| {
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

    /// Runs every rank on `device`. For ranks as threads on a GPU or an emulator,
    /// each rank gets a part of it ([`Device::partition`]: its own stream and share
    /// of the multiprocessors), so the ranks' kernels run at once (see the module
    /// docs); [`Rank::device`] is the rank's part.
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

    /// Each rank's device for ranks as threads: ranks sharing a GPU or an emulator
    /// get a part of it each ([`Device::partition`]: their own stream and share of
    /// the multiprocessors), so their waiting kernels run at once; a device given
    /// as a part already, and the CPU, are used as they are.
    fn rank_devices(&self) -> Result<Vec<Device>, Error> {
        let mut out: Vec<Option<Device>> = vec![None; self.size];
        for r in 0..self.size {
            if out[r].is_some() {
                continue;
            }
            let d = self.device_of(r)?;
            let sharing: Vec<usize> = (r..self.size)
                .filter(|&q| self.device_of(q).is_ok_and(|e| e == d))
                .collect();
            let parts = if sharing.len() > 1 && d.properties().part.is_none() {
                d.partition(sharing.len())?
            } else {
                vec![d.clone(); sharing.len()]
            };
            for (q, part) in sharing.into_iter().zip(parts) {
                out[q] = Some(part);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Every rank's heap for ranks as threads (rank `r` on `devices[r]`): host
    /// memory, or GPU memory with peer access between the ranks' GPUs.
    fn thread_heaps(&self, devices: &[Device]) -> Result<Heaps, Error> {
        let gpus: Vec<Option<GpuDev>> = devices.iter().map(gpu_of).collect();
        if gpus.iter().all(Option::is_none) {
            let mut heaps = Vec::with_capacity(self.size);
            for d in devices {
                let device = d.id();
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
                    devices[r].id()
                ))
            })?;
            heaps.push(Arc::new(GpuHeap::alloc(g, self.heap_bytes)?));
        }
        // Peer access between every pair of distinct GPUs.
        for (a, da) in devices.iter().enumerate() {
            for (b, db) in devices.iter().enumerate() {
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
        let devices = self.rank_devices()?;
        let heaps = self.thread_heaps(&devices)?;
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
        for (r, device) in devices.iter().enumerate() {
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
        match &self.layout {
            Layout::Threads => Err(Self::comm_err(
                "World::join is for a launched world (World::launched / World::from_env); World::local runs its ranks with World::run".into(),
            )),
            Layout::Process(env) => procs::join(self, env),
            #[cfg(feature = "mpi")]
            Layout::Mpi(lib) => mpi::join(self, lib),
            Layout::Nvshmem(launch) => nvshmem::join(self, launch),
        }
    }

    /// This process's rank `me` of the world, once its transport has every rank's
    /// heap and the team segment. `link`: for ranks as processes, starts the
    /// transport's watch over the connections to the other processes (a peer that
    /// dies fails the world); `nodes`: each rank's node, when the transport knows.
    fn make_rank(
        &self,
        me: u32,
        heaps: Heaps,
        team: Team,
        device: &Device,
        link: Option<StartLink>,
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
        let link = match link {
            Some(start) => {
                let s = shared.clone();
                let died: rank::PeerDied = Arc::new(move |r| s.abort(r, true));
                Some(start(died).map_err(|message| Error::Comm { rank: me, message })?)
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

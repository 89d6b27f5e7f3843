//! Ranks as processes on one node: shared-memory segments, the bootstrap socket, the
//! liveness watchdog and a local launcher.
//!
//! **Launch environment** (what `torchrun` sets, and [`spawn_local`]): `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, optionally `LOCAL_WORLD_SIZE` (must equal `WORLD_SIZE`:
//! a world lives on one node), the bootstrap socket and its secret:
//!
//! - `TESSERA_BOOTSTRAP`: a Unix socket path, or `@name` for a Linux abstract socket.
//! - else `MASTER_ADDR`/`MASTER_PORT` (and `TORCHELASTIC_RUN_ID` when set): a socket
//!   named after them in the per-user folder (`$XDG_RUNTIME_DIR/tessera`, else
//!   `/tmp/tessera-<uid>`, created `0700`), so `torchrun` needs nothing more. (Only
//!   the names are used: no TCP connection is made.) [`spawn_local`] also uses a
//!   socket in that folder.
//! - `TESSERA_BOOTSTRAP_SECRET` (optional; [`spawn_local`] sets a random one): what
//!   every rank presents to rank 0.
//!
//! Without `WORLD_SIZE` the process is a world of one rank.
//!
//! **Bootstrap.** Rank 0 listens; every other rank connects (retrying until the wait
//! timeout), checks with `SO_PEERCRED` that the listener is a process of its own user,
//! and sends the secret, its rank, the world's configuration (size, heap and signal
//! bytes, kind) and its contribution: the file descriptor of its heap (a sealed
//! `memfd`, passed with `SCM_RIGHTS`) for host worlds, an IPC handle of its device heap
//! for GPU worlds. Rank 0 checks each connection on a thread of its own within a
//! per-connection limit: the peer's user (`SO_PEERCRED`), then the secret, before it
//! sends anything; a connection that fails either, or says nothing in time, is dropped
//! while accepting goes on. Rank 0 then checks that everybody agrees and answers each
//! rank with the team segment's descriptor and every rank's contribution; each process
//! maps every heap (`mmap(MAP_SHARED)`, refusing a segment not sealed against
//! shrinking) or opens every IPC handle. The connections stay open.
//!
//! **Liveness.** After the bootstrap the connections carry one message: `B`, "this
//! rank leaves" (sent when its [`crate::Rank`] is dropped). A connection that closes
//! without it means the process died: rank 0 sees its peers die, the others see rank
//! 0 die, and the watchdog thread marks the world as failed in the team segment and
//! in every rank's control words, so every rank's waits and host barriers stop with
//! an error naming the dead rank. A rank that leaves records it in the team segment
//! first, so the others' host barriers that need it fail at once. Rank 0, the hub
//! that sees every peer's death, waits for every peer to leave (or die) before it
//! says goodbye, but for at most the wait timeout (a stopped peer must not keep it
//! alive; after it the others see deaths by timeouts only). On GPUs leaving
//! is collective (a host barrier when the `Rank` is dropped), since a process's
//! device heap, opened by the others through IPC, is freed when it goes; host heaps
//! are shared files whose mappings outlive their creator.
//!
//! **Why a local socket**: one node is all shared memory (and CUDA/HIP IPC) can
//! reach, and a Unix socket is the one channel that can carry file descriptors and
//! tell who is at the other end; it needs no port. Multi-node worlds would use the
//! vendors' device libraries (NVSHMEM, rocSHMEM), see the design notes.
//!
//! **Entry.** `join` is this transport's part of [`World::join`]: it bootstraps
//! this process's rank of a world the launch environment describes and returns its
//! [`Rank`] once every rank has mapped every heap.
//!
//! **Files.** This file holds `join`; `env.rs` the launch environment
//! ([`LaunchEnv`], [`SECRET_VAR`], the per-user socket folder); `segment.rs` the
//! shared-memory segments (`memfd`, sealed, mapped); `socket.rs` the socket I/O
//! (descriptor passing, deadlines, `SO_PEERCRED`); `bootstrap.rs` the bootstrap
//! protocol; `watchdog.rs` the connections kept after it and their watchdog
//! (liveness); `launcher.rs` [`spawn_local`].

mod bootstrap;
mod env;
mod launcher;
mod segment;
mod socket;
mod watchdog;

pub use env::{LaunchEnv, SECRET_VAR};
pub use launcher::{spawn_local, spawn_local_with};

use std::os::fd::AsFd;
use std::sync::Arc;

use crate::error::Error;
use crate::world::gpu::{GpuHeap, gpu_of};
use crate::world::heap::{Heaps, HostHeap, HostHeapRef};
use crate::world::rank::{PeerLink, StartLink};
use crate::world::team::{TEAM_BYTES, Team};
use crate::world::{Rank, World};

/// Joins the world of processes `env` describes as this process's rank, with
/// `world`'s configuration ([`World::join`] of a world [`World::launched`] on this
/// transport).
pub(in crate::world) fn join(world: &World, env: &LaunchEnv) -> Result<Rank, Error> {
    if world.ranks_per_node.is_some() {
        return Err(World::comm_err(
            "ranks_per_node places ranks as threads (World::run) on emulated nodes; a launched world's ranks are processes of one node".into(),
        ));
    }
    world.check()?;
    let me = env.rank;
    let err = move |message: String| Error::Comm { rank: me, message };
    let device = world.device_of(me as usize)?;
    let gpu = gpu_of(device);
    if env.size == 1 {
        // A world of one: nothing to exchange.
        let heaps = match &gpu {
            None => Heaps::Host(Arc::from(vec![HostHeapRef::Local(Arc::new(
                HostHeap::new(world.heap_bytes, &device.id(), err)?,
            ))])),
            Some(g) => Heaps::Gpu(Arc::from(vec![Arc::new(GpuHeap::alloc(
                g,
                world.heap_bytes,
            )?)])),
        };
        return world.make_rank(0, heaps, World::team_segment()?, device, None, None);
    }
    let kind = match gpu.as_ref().map(|g| g.kind()) {
        None => 0,
        Some(crate::DeviceKind::Hip) => 2,
        Some(_) => 1,
    };
    let config = [
        u64::from(env.size),
        world.heap_bytes as u64,
        world.signal_bytes as u64,
        kind,
    ];
    // This rank's contribution: a shared-memory heap, or an exported GPU heap.
    let (mine, own_gpu) = match &gpu {
        None => (
            bootstrap::Contribution {
                heap_fd: Some(
                    segment::memfd(&format!("tessera-heap-rank{me}"), world.heap_bytes)
                        .map_err(err)?,
                ),
                blob: Vec::new(),
            },
            None,
        ),
        Some(g) => {
            let h = Arc::new(GpuHeap::alloc(g, world.heap_bytes)?);
            (
                bootstrap::Contribution {
                    heap_fd: None,
                    blob: h.handle()?,
                },
                Some(h),
            )
        }
    };
    let joined = bootstrap::bootstrap(env, config, mine, world.timeout).map_err(err)?;
    let team = Team::new(
        Arc::new(segment::map(joined.team_fd.as_fd(), TEAM_BYTES).map_err(err)?),
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
                    segment::map(fd.as_fd(), world.heap_bytes).map_err(err)?,
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
                    hs.push(Arc::new(GpuHeap::open(g, &c.blob, world.heap_bytes)?));
                }
            }
            Heaps::Gpu(hs.into())
        }
        (Some(_), None) => return Err(err("internal: no GPU heap".into())),
    };
    // The connections stay open, watched: a peer's process that dies fails the world.
    let peers = joined.peers;
    let link: StartLink = Box::new(move |died| {
        watchdog::Link::start(me, peers, died).map(|l| Box::new(l) as Box<dyn PeerLink>)
    });
    // Rank 0 created the team segment; make sure everybody mapped it (and every
    // heap) before anyone fails or allocates through it.
    let rank = world.make_rank(me, heaps, team, device, Some(link), None)?;
    rank.barrier()?;
    Ok(rank)
}

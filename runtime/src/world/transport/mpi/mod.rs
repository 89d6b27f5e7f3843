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
//! **Entry.** `MpiLib::open` is [`World::mpi`]'s part (MPI initialized, the job's
//! rank and size), and `join` this transport's part of [`World::join`]: the heaps and
//! the team segment become MPI windows.
//!
//! **Files.** This file holds `join` and `MpiLib`; `calls.rs` how every MPI call is
//! made (the process-wide lock, polling against deadlines, the watchdog of blocking
//! calls, the ranks that stopped answering); `library.rs` the process's MPI library
//! ([`Mpi`]: initialization, finalization, the collectives); `window.rs` the windows
//! ([`Window`]) and what a world's windows share ([`Fate`]); `peer.rs` a peer's part
//! reached through MPI ([`Peer`]) or mapped here ([`Part`]).
//!
//! [`Rank`]: crate::world::Rank

mod calls;
mod library;
mod peer;
mod window;

use std::sync::Arc;

use crate::error::Error;
use crate::world::heap::{CTRL_BYTES, Heaps, HostHeapRef, TransportSession};
use crate::world::team::{TEAM_BYTES, Team};
use crate::world::{Rank, World};
use library::{Mpi, SHARED_VAR};
use peer::{Part, Peer};
use window::{Fate, Window};

/// The process's MPI library, held by a world that will join through it.
#[derive(Clone)]
pub(in crate::world) struct MpiLib(Arc<Mpi>);

impl std::fmt::Debug for MpiLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mpi(rank {} of {})", self.0.rank, self.0.size)
    }
}

impl MpiLib {
    /// The process's MPI library, initialized on first use ([`World::mpi`]); the
    /// sharing of a node's heaps ([`SHARED_VAR`]) must be `0` or `1` when set.
    pub(in crate::world) fn open() -> Result<MpiLib, Error> {
        if let Ok(v) = std::env::var(SHARED_VAR)
            && !matches!(v.trim(), "0" | "1")
        {
            return Err(World::comm_err(format!(
                "{}={v:?}: expected 0 (every peer through MPI calls) or 1 (share the heaps of a node's processes)",
                SHARED_VAR
            )));
        }
        Mpi::get().map(MpiLib).map_err(World::comm_err)
    }

    /// The number of ranks of the job (`MPI_COMM_WORLD`'s size).
    pub(in crate::world) fn size(&self) -> usize {
        self.0.size as usize
    }
}

impl TransportSession for Fate {
    fn abandon(&self) {
        Fate::abandon(self);
    }
}

/// Joins the MPI job's world as this process's rank, with `world`'s configuration
/// ([`World::join`] of a world [`World::mpi`] made): the heaps and the team segment
/// are MPI windows (see the module docs).
pub(in crate::world) fn join(world: &World, lib: &MpiLib) -> Result<Rank, Error> {
    let lib = &lib.0;
    let me = lib.rank;
    let err = move |message: String| Error::Comm { rank: me, message };
    // Every rank learns whether every rank can join and with which sizes before
    // anything collective that could wait forever for a rank that gave up.
    let local = world.check().and_then(|()| {
        let device = world.device_of(me as usize)?;
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
    let fate = Arc::new(Fate::new(world.timeout));
    let all = lib
        .allgather_u64(
            &[
                u64::from(local.is_ok()),
                world.heap_bytes as u64,
                world.signal_bytes as u64,
            ],
            world.timeout,
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
            world.heap_bytes, world.signal_bytes, c[1], c[2]
        )));
    }
    // Windows are allocated collectively, in the same order on every rank. The
    // heaps of a node's ranks are allocated together where MPI can share memory,
    // so that each rank maps its node's other heaps.
    let zero = CTRL_BYTES + world.signal_bytes;
    let heap = Arc::new(
        match Window::allocate_node_shared(lib, world.heap_bytes, zero, world.ranks_per_node, &fate)
            .map_err(err)?
        {
            Some(w) => w,
            None => Window::allocate(lib, world.heap_bytes, zero, &fate).map_err(err)?,
        },
    );
    let team_bytes = if me == 0 { TEAM_BYTES } else { 0 };
    let team_win = Arc::new(Window::allocate(lib, team_bytes, team_bytes, &fate).map_err(err)?);
    let team_mem = Arc::new(Peer {
        win: team_win,
        target: 0,
        len: TEAM_BYTES,
    });
    // Rank 0 writes the magic word before the others check it. Each step ends in
    // an agreement, so that a failure on one rank is an error on all (not a hang).
    let team = if me == 0 {
        Some(Team::remote(team_mem.clone(), true))
    } else {
        None
    };
    let problem = team.as_ref().and_then(|t| t.as_ref().err().cloned());
    lib.agree(problem, "set up the team segment", world.timeout)
        .map_err(err)?;
    let team = match team {
        Some(t) => t,
        None => Team::remote(team_mem, false),
    };
    lib.agree(
        team.as_ref().err().cloned(),
        "open the team segment",
        world.timeout,
    )
    .map_err(err)?;
    let team = team.map_err(err)?;
    let heaps: Vec<HostHeapRef> = (0..lib.size)
        .map(|r| match Part::mapped(&heap, r) {
            // This rank's heap, and its node's others where mapped: direct loads
            // and stores, atomics through the window.
            Some(part) => HostHeapRef::Local(Arc::new(part)),
            None => HostHeapRef::Remote(Arc::new(Peer {
                win: heap.clone(),
                target: r,
                len: world.heap_bytes,
            })),
        })
        .collect();
    // Each rank's node: the lowest rank whose heap it maps (its own included).
    let first = (0..lib.size)
        .find(|&r| Part::mapped(&heap, r).is_some())
        .unwrap_or(me);
    let nodes: Arc<[u32]> = lib
        .allgather_u64(&[u64::from(first)], world.timeout)
        .map_err(err)?
        .iter()
        .map(|v| v.first().map_or(0, |&x| x as u32))
        .collect();
    let rank = world.make_rank(
        me,
        Heaps::Host(heaps.into()),
        team,
        device,
        None,
        Some(nodes),
    )?;
    // The windows are tied to the world: they are abandoned when it fails (a failed
    // world's windows are freed only if every rank comes to free them), and a rank
    // that stops answering this one fails the world naming it.
    fate.on_stall(Box::new(rank.stall_hook()));
    rank.keep_session(fate);
    rank.barrier()?;
    Ok(rank)
}

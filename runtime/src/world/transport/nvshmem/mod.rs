//! The NVSHMEM transport: worlds of GPU ranks across nodes on NVSHMEM
//! ([`World::nvshmem`]), one process per GPU, on any number of nodes, started by
//! `torchrun` (or anything that sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR` and `MASTER_PORT`); and NVSHMEM's host library, loaded at run time
//! (`libnvshmem_host.so.3`: NVSHMEM's `lib/`, or the `nvidia/nvshmem/lib` folder of
//! the `nvidia-nvshmem-cu12` wheel), which this module's public items are:
//! [`NvshmemHost::load`] finds and opens it, [`bootstrap_unique_id`] hands rank 0's
//! unique id to every rank through the [`rendezvous`], and [`NvshmemHost::init`]
//! initializes NVSHMEM on the rank's GPU, returning the [`Session`] that allocates
//! symmetric memory and finalizes NVSHMEM when dropped.
//!
//! Joining (`join`), every rank:
//!
//! 1. checks its own configuration, and that its device is a CUDA GPU, before
//!    NVSHMEM is called (NVSHMEM ends the process on some of its own failures);
//! 2. meets the others at the TCP rendezvous ([`rendezvous`], authenticated
//!    by `TESSERA_BOOTSTRAP_SECRET`), handing out whether it can join, its heap and
//!    signal sizes, its host name and (rank 0) NVSHMEM's unique id: a rank that
//!    cannot join, or configured the world differently, makes every rank fail with
//!    an error naming it, before anything collective;
//! 3. initializes NVSHMEM on its GPU ([`NvshmemHost::init`]) and
//!    allocates, collectively, its heap, the team segment and a staging area as
//!    NVSHMEM symmetric memory (`nvshmem_malloc`; the control words and signal pads
//!    zeroed);
//! 4. builds its heap-base table: its own heap; a peer of its node that NVSHMEM maps
//!    (`nvshmem_ptr`: NVLink or PCIe peer access) by that address; every other peer
//!    by a tagged entry ([`tessera_ir::comm::tagged_bases`]), which kernels compiled
//!    for a world across nodes turn into NVSHMEM device calls.
//!
//! The rendezvous listens on `MASTER_ADDR`, port `MASTER_PORT + 1` (torchrun's own
//! store holds `MASTER_PORT`) or `TESSERA_RENDEZVOUS_PORT`.
//!
//! A rank's node is the first rank with its host name, or with
//! [`World::ranks_per_node`] rank `r`'s node is `r / n`: on one machine,
//! `ranks_per_node(1)` sends every peer through NVSHMEM's functions, which is how the
//! GPU check exercises the off-node path on a single node.
//!
//! From the host, the team segment (host barriers, the failure record, the
//! allocation checks; rank 0's copy) and the heaps of other nodes are reached with
//! NVSHMEM's host-side calls (`ShmemPeer`), as the MPI transport reaches its
//! peers with MPI's. Every module linked with NVSHMEM's device library is
//! initialized with `nvshmemx_cumodule_init` when the CUDA backend loads it.
//!
//! Leaving: NVSHMEM is finalized (collectively) when the last of the rank's buffers
//! and its [`Rank`] are gone; after a failure it is left to the process's
//! exit instead, since finalizing waits for every PE.
//!
//! **Files.** This file holds the launch (the variables [`World::nvshmem`] reads),
//! what each rank hands out at the rendezvous, and `join`, this transport's part of
//! [`World::join`]; `peer.rs` holds `ShmemPeer`, the host's reach into another
//! node's memory; `host.rs` NVSHMEM's host library (its FFI, [`NvshmemHost`],
//! [`Session`], the unique id).

mod host;
mod peer;

pub use host::{
    HOST_FUNCTIONS, HOST_LIBRARY, NVSHMEM_HOME_VAR, NvshmemHost, Session, UNIQUE_ID_BYTES,
    UniqueId, bootstrap_unique_id, links_device_library,
};

use std::sync::Arc;

use tessera_ir::interp::RemoteMemory;

use super::procs::SECRET_VAR;
use super::rendezvous;
use crate::backend::RawStream;
use crate::error::Error;
use crate::world::gpu::{GpuHeap, gpu_of};
use crate::world::heap::{CTRL_BYTES, Heaps, TransportSession};
use crate::world::team::{TEAM_BYTES, Team};
use crate::world::{Rank, World};
use host::init_modules_with;
use peer::{STAGE_BYTES, ShmemPeer, Stage};

/// The port of an NVSHMEM world's rendezvous on `MASTER_ADDR` (default:
/// `MASTER_PORT + 1`).
pub(in crate::world) const RENDEZVOUS_PORT_VAR: &str = "TESSERA_RENDEZVOUS_PORT";

/// The variables of a rank of an NVSHMEM world (as `torchrun` sets them).
#[derive(Clone)]
pub(in crate::world) struct ShmemLaunch {
    /// `RANK`.
    pub(in crate::world) rank: u32,
    /// `WORLD_SIZE`.
    pub(in crate::world) size: u32,
    /// `LOCAL_RANK` (defaults to `RANK`): which of the node's GPUs is this rank's.
    pub(in crate::world) local_rank: u32,
    /// `MASTER_ADDR:MASTER_PORT`: rank 0's rendezvous.
    pub(in crate::world) addr: String,
    /// `TESSERA_BOOTSTRAP_SECRET`.
    secret: String,
}

impl std::fmt::Debug for ShmemLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ShmemLaunch(rank {} of {}, local rank {}, rendezvous {})",
            self.rank, self.size, self.local_rank, self.addr
        )
    }
}

impl ShmemLaunch {
    /// Reads the launch from the variables `get` returns (set and not blank).
    pub(in crate::world) fn from_vars(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<ShmemLaunch, Error> {
        let bad = |message: String| Error::Comm { rank: 0, message };
        let need = |k: &str| {
            get(k).ok_or_else(|| {
                bad(format!(
                    "an NVSHMEM world needs {k}: start the ranks with torchrun (or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and {} yourself)",
                    SECRET_VAR
                ))
            })
        };
        let num = |k: &str, v: String| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| bad(format!("{k}={v:?} is not a rank count or index")))
        };
        let size = num("WORLD_SIZE", need("WORLD_SIZE")?)?;
        let rank = num("RANK", need("RANK")?)?;
        if size == 0 || size > 255 || rank >= size {
            return Err(bad(format!(
                "RANK={rank} WORLD_SIZE={size}: an NVSHMEM world holds 1 to 255 ranks (the heap-base table's tags) and 0 <= RANK < WORLD_SIZE"
            )));
        }
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => num("LOCAL_RANK", v)?,
            None => rank,
        };
        let host = need("MASTER_ADDR")?;
        // torchrun's agent on the first node serves its own store at MASTER_PORT, so
        // the rendezvous takes the next port unless told otherwise.
        let port = match get(RENDEZVOUS_PORT_VAR) {
            Some(v) => num(RENDEZVOUS_PORT_VAR, v)?,
            None => num("MASTER_PORT", need("MASTER_PORT")?)?
                .checked_add(1)
                .ok_or_else(|| bad("MASTER_PORT is too large".into()))?,
        };
        if port == 0 || port > u32::from(u16::MAX) {
            return Err(bad(format!(
                "the rendezvous port {port} is not a TCP port (MASTER_PORT + 1, or {RENDEZVOUS_PORT_VAR})"
            )));
        }
        let secret = get(SECRET_VAR).ok_or_else(|| {
            bad(format!(
                "an NVSHMEM world meets over TCP and needs {0}: set it to the same random value for every rank (e.g. `export {0}=$(openssl rand -hex 16)` before torchrun, passed to every node)",
                SECRET_VAR
            ))
        })?;
        let addr = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(ShmemLaunch {
            rank,
            size,
            local_rank,
            addr,
            secret,
        })
    }
}

/// What each rank hands out at the rendezvous.
struct Offer {
    /// Whether the rank can join (else its own error says why).
    ok: bool,
    heap_bytes: u64,
    signal_bytes: u64,
    host: String,
    /// Rank 0's NVSHMEM unique id.
    uid: Option<UniqueId>,
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.push(u8::from(self.ok));
        v.extend_from_slice(&self.heap_bytes.to_le_bytes());
        v.extend_from_slice(&self.signal_bytes.to_le_bytes());
        let host = self.host.as_bytes();
        let n = host.len().min(255);
        v.push(n as u8);
        v.extend_from_slice(&host[..n]);
        if let Some(id) = &self.uid {
            v.extend_from_slice(&id.0);
        }
        v
    }

    fn decode(b: &[u8]) -> Option<Offer> {
        let ok = *b.first()? != 0;
        let heap_bytes = u64::from_le_bytes(b.get(1..9)?.try_into().ok()?);
        let signal_bytes = u64::from_le_bytes(b.get(9..17)?.try_into().ok()?);
        let n = *b.get(17)? as usize;
        let host = String::from_utf8_lossy(b.get(18..18 + n)?).into_owned();
        let rest = &b[18 + n..];
        let uid = match rest.len() {
            0 => None,
            UNIQUE_ID_BYTES => Some(UniqueId(rest.try_into().ok()?)),
            _ => return None,
        };
        Some(Offer {
            ok,
            heap_bytes,
            signal_bytes,
            host,
            uid,
        })
    }
}

/// This machine's host name (empty when it cannot be read).
fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// Each rank's node: by host name (the first rank with the same name), or in blocks
/// of `per_node` consecutive ranks.
pub(in crate::world) fn nodes_of(hosts: &[String], per_node: Option<usize>) -> Vec<u32> {
    match per_node {
        Some(n) => (0..hosts.len()).map(|r| (r / n.max(1)) as u32).collect(),
        None => hosts
            .iter()
            .map(|h| hosts.iter().position(|x| x == h).unwrap_or(0) as u32)
            .collect(),
    }
}

/// Joins the NVSHMEM world `launch` describes with `world`'s configuration.
pub(in crate::world) fn join(world: &World, launch: &ShmemLaunch) -> Result<Rank, Error> {
    let me = launch.rank;
    let err = move |message: String| Error::Comm { rank: me, message };
    // 1. What this rank can check alone, NVSHMEM not called yet.
    let local = world.check().and_then(|()| {
        let device = match world.devices.len() {
            1 => &world.devices[0],
            _ => world.devices.get(launch.local_rank as usize).ok_or_else(|| {
                err(format!(
                    "World::on_each got {} devices, and LOCAL_RANK is {}: an NVSHMEM world's ranks take the device of their local rank (one per GPU of the node)",
                    world.devices.len(),
                    launch.local_rank
                ))
            })?,
        };
        let is_cuda = matches!(device.kind(), crate::DeviceKind::Cuda);
        if !is_cuda {
            return Err(err(format!(
                "an NVSHMEM world's ranks run on CUDA GPUs (World::on(&Device::cuda(LOCAL_RANK)?)); this rank's device is {}",
                device.id()
            )));
        }
        let host = NvshmemHost::load()?;
        let uid = if me == 0 {
            Some(host.unique_id()?)
        } else {
            None
        };
        Ok((device.clone(), host, uid))
    });
    // 2. The rendezvous: everybody learns whether everybody can join, and how.
    let offer = Offer {
        ok: local.is_ok(),
        heap_bytes: world.heap_bytes as u64,
        signal_bytes: world.signal_bytes as u64,
        host: host_name(),
        uid: local.as_ref().ok().and_then(|l| l.2),
    };
    let all = rendezvous::exchange(
        &launch.addr,
        me,
        launch.size,
        launch.secret.as_bytes(),
        &offer.encode(),
        world.timeout,
    )?;
    let (device, host, _) = local?;
    let offers: Vec<Offer> = all
        .iter()
        .enumerate()
        .map(|(r, b)| {
            Offer::decode(b).ok_or_else(|| err(format!("rank {r}'s rendezvous offer is malformed")))
        })
        .collect::<Result<_, _>>()?;
    if let Some(r) = offers.iter().position(|o| !o.ok) {
        return Err(err(format!(
            "rank {r} could not join the NVSHMEM world (its own error says why)"
        )));
    }
    if let Some((r, o)) = offers
        .iter()
        .enumerate()
        .find(|(_, o)| (o.heap_bytes, o.signal_bytes) != (offer.heap_bytes, offer.signal_bytes))
    {
        return Err(err(format!(
            "ranks configure the world differently: this rank has a heap of {} bytes with {} bytes of signals, rank {r} {} and {}; every rank must configure it the same",
            offer.heap_bytes, offer.signal_bytes, o.heap_bytes, o.signal_bytes
        )));
    }
    let uid = offers[0]
        .uid
        .ok_or_else(|| err("rank 0 brought no NVSHMEM unique id".into()))?;
    let hosts: Vec<String> = offers.into_iter().map(|o| o.host).collect();
    let nodes = nodes_of(&hosts, world.ranks_per_node);
    // 3. NVSHMEM and the symmetric allocations (collective, same order everywhere).
    let session = Arc::new(host.init(me, launch.size, &uid, &device)?);
    init_modules_with(&session);
    let gpu = gpu_of(&device).ok_or_else(|| err("internal: no GPU".into()))?;
    let heap = session.malloc(world.heap_bytes)?;
    let team_at = session.malloc(TEAM_BYTES)?;
    let stage_at = session.malloc(STAGE_BYTES)?;
    let zeroes = vec![0u8; CTRL_BYTES + world.signal_bytes];
    gpu.htod(heap, &zeroes, RawStream::DEFAULT)?;
    if me == 0 {
        gpu.htod(team_at, &vec![0u8; TEAM_BYTES], RawStream::DEFAULT)?;
    }
    session.barrier_all();
    let stage = Arc::new(Stage {
        at: stage_at,
        lock: std::sync::Mutex::new(()),
    });
    let peer = |sym: u64, pe: u32, len: usize| ShmemPeer {
        session: session.clone(),
        dev: gpu.clone(),
        sym,
        pe,
        len,
        stage: stage.clone(),
    };
    // The team segment: rank 0's copy, initialized by rank 0 first.
    let team_mem: Arc<dyn RemoteMemory> = Arc::new(peer(team_at, 0, TEAM_BYTES));
    let team = if me == 0 {
        Some(Team::remote(team_mem.clone(), true))
    } else {
        None
    };
    session.barrier_all();
    let team = match team {
        Some(t) => t,
        None => Team::remote(team_mem, false),
    }
    .map_err(err)?;
    // 4. The heap-base table: mapped where NVSHMEM maps and the peer is on this
    // rank's node, tagged otherwise.
    let tagged =
        tessera_ir::comm::tagged_bases(&vec![heap; launch.size as usize], me as usize, |_| false)
            .ok_or_else(|| err(format!("{} ranks are too many to tag", launch.size)))?;
    let keep: Arc<dyn std::any::Any + Send + Sync> = session.clone();
    let mut heaps = Vec::with_capacity(launch.size as usize);
    for p in 0..launch.size {
        let h = if p == me {
            GpuHeap::shmem(&gpu, heap, world.heap_bytes, keep.clone())
        } else {
            let mapped = (nodes[p as usize] == nodes[me as usize])
                .then(|| session.ptr(heap, p))
                .flatten();
            match mapped {
                Some(at) => GpuHeap::shmem(&gpu, at, world.heap_bytes, keep.clone()),
                None => GpuHeap::remote(
                    &gpu,
                    tagged[p as usize],
                    Arc::new(peer(heap, p, world.heap_bytes)),
                ),
            }
        };
        heaps.push(Arc::new(h));
    }
    let nodes: Arc<[u32]> = nodes.into();
    let rank = world.make_rank(
        me,
        Heaps::Gpu(heaps.into()),
        team,
        &device,
        None,
        Some(nodes),
    )?;
    rank.keep_session(session);
    rank.barrier()?;
    Ok(rank)
}

impl TransportSession for Session {
    fn abandon(&self) {
        Session::abandon(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::test_env as vars;

    #[test]
    fn the_launch_comes_from_torchruns_variables() {
        let full = [
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
            ("TESSERA_BOOTSTRAP_SECRET", "s3cret"),
        ];
        let l = ShmemLaunch::from_vars(vars(&full)).unwrap();
        assert_eq!((l.rank, l.size, l.local_rank), (5, 8, 1));
        assert_eq!(l.addr, "node0:29501");
        let mut own = full.to_vec();
        own.push(("TESSERA_RENDEZVOUS_PORT", "4000"));
        assert_eq!(
            ShmemLaunch::from_vars(vars(&own)).unwrap().addr,
            "node0:4000"
        );
        own[6] = ("TESSERA_RENDEZVOUS_PORT", "70000");
        let e = ShmemLaunch::from_vars(vars(&own)).unwrap_err().to_string();
        assert!(e.contains("not a TCP port"), "{e}");
        // IPv6 addresses get brackets; the secret is never printed.
        let mut v6 = full;
        v6[3] = ("MASTER_ADDR", "fe80::1");
        let l = ShmemLaunch::from_vars(vars(&v6)).unwrap();
        assert_eq!(l.addr, "[fe80::1]:29501");
        assert!(!format!("{l:?}").contains("s3cret"));
        // Each missing or bad variable is named.
        for (i, (k, _)) in full.iter().enumerate() {
            if *k == "LOCAL_RANK" {
                continue;
            }
            let mut missing: Vec<(&str, &str)> = full.to_vec();
            missing.remove(i);
            let e = ShmemLaunch::from_vars(vars(&missing))
                .unwrap_err()
                .to_string();
            assert!(e.contains(k), "{k}: {e}");
        }
        let mut bad = full;
        bad[0] = ("RANK", "8");
        let e = ShmemLaunch::from_vars(vars(&bad)).unwrap_err().to_string();
        assert!(e.contains("0 <= RANK < WORLD_SIZE"), "{e}");
        bad[0] = ("RANK", "x");
        let e = ShmemLaunch::from_vars(vars(&bad)).unwrap_err().to_string();
        assert!(e.contains("RANK=\"x\""), "{e}");
    }

    #[test]
    fn offers_survive_the_wire() {
        let mut id = UniqueId([7; UNIQUE_ID_BYTES]);
        id.0[0] = 1;
        for uid in [None, Some(id)] {
            let o = Offer {
                ok: uid.is_some(),
                heap_bytes: 1 << 28,
                signal_bytes: 4096,
                host: "gpu-node-17".into(),
                uid,
            };
            let d = Offer::decode(&o.encode()).unwrap();
            assert_eq!(
                (d.ok, d.heap_bytes, d.signal_bytes, d.host.as_str(), d.uid),
                (o.ok, o.heap_bytes, o.signal_bytes, "gpu-node-17", o.uid)
            );
        }
        // Truncated or padded offers are refused, not misread.
        let enc = Offer {
            ok: true,
            heap_bytes: 1,
            signal_bytes: 2,
            host: "h".into(),
            uid: None,
        }
        .encode();
        assert!(Offer::decode(&enc[..enc.len() - 1]).is_none());
        let mut longer = enc.clone();
        longer.push(0);
        assert!(Offer::decode(&longer).is_none());
    }

    /// Ranks whose devices are not CUDA GPUs meet at the rendezvous and stop with
    /// their own error, in bounded time, NVSHMEM never called.
    #[test]
    fn ranks_without_a_gpu_stop_cleanly_after_meeting() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port()
            .to_string();
        let t = std::time::Instant::now();
        let errors: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let port = port.clone();
                    s.spawn(move || {
                        let rank = r.to_string();
                        let launch = ShmemLaunch::from_vars(vars(&[
                            ("RANK", &rank),
                            ("WORLD_SIZE", "2"),
                            ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", "1"),
                            ("TESSERA_RENDEZVOUS_PORT", &port),
                            ("TESSERA_BOOTSTRAP_SECRET", "test"),
                        ]))
                        .unwrap();
                        let w = World {
                            size: 2,
                            layout: crate::world::Layout::Nvshmem(launch),
                            ..World::local(1)
                                .heap_bytes(1 << 16)
                                .signal_bytes(4096)
                                .wait_timeout(std::time::Duration::from_secs(20))
                        };
                        w.join().unwrap_err().to_string()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for e in &errors {
            assert!(e.contains("run on CUDA GPUs") && e.contains("cpu"), "{e}");
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(15));
        // A world of threads cannot be an NVSHMEM world.
        let w = World {
            size: 1,
            layout: crate::world::Layout::Nvshmem(
                ShmemLaunch::from_vars(vars(&[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "1"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", "1"),
                    ("TESSERA_RENDEZVOUS_PORT", &port),
                    ("TESSERA_BOOTSTRAP_SECRET", "test"),
                ]))
                .unwrap(),
            ),
            ..World::local(1)
        };
        let e = w.run(|_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("World::join"), "{e}");
    }

    #[test]
    fn nodes_follow_host_names_or_the_placement() {
        let hosts: Vec<String> = ["a", "a", "b", "b", "a"].map(String::from).to_vec();
        assert_eq!(nodes_of(&hosts, None), vec![0, 0, 2, 2, 0]);
        assert_eq!(nodes_of(&hosts, Some(1)), vec![0, 1, 2, 3, 4]);
        assert_eq!(nodes_of(&hosts, Some(2)), vec![0, 0, 1, 1, 2]);
    }
}

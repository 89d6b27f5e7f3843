//! The heaps of a world's ranks and what the ranks of a world share: host heaps
//! ([`HostHeap`]; ranks as processes map `memfd` segments instead, see `procs`), every
//! rank's heap as this process reaches it ([`Heaps`]), the shared state ([`Shared`]:
//! team segment, control words, sizes, failure marking) and a rank's allocation
//! cursors ([`Cursor`]).

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use tessera_ir::interp::{CommWorld, HostBuffer, HostMemory, RemoteMemory, ctrl};
use tessera_ir::types::ScalarType;

use crate::error::Error;

use super::gpu::GpuHeap;
use super::team::Team;

/// Bytes of control words at the start of every heap.
pub const CTRL_BYTES: usize = ctrl::WORDS * 8;
/// Alignment of every symmetric allocation.
pub const SYM_ALIGN: usize = 256;

/// A rank's heap in host memory: zeroed, 4096-byte aligned.
pub(super) struct HostHeap {
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
    /// A heap of `len` bytes (at least the control words) for a rank on `device`:
    /// [`Error::OutOfMemory`] naming `device` when the system refuses the memory,
    /// `other(message)` for any other failure.
    pub(super) fn new(
        len: usize,
        device: &str,
        other: impl FnOnce(String) -> Error,
    ) -> Result<HostHeap, Error> {
        let len = len.max(CTRL_BYTES);
        let mut map = match memmap2::MmapMut::map_anon(len) {
            Ok(map) => map,
            Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => {
                return Err(Error::OutOfMemory {
                    bytes: len as u64,
                    device: device.into(),
                });
            }
            Err(e) => return Err(other(format!("cannot map a heap of {len} bytes: {e}"))),
        };
        let Some(ptr) = NonNull::new(map.as_mut_ptr()) else {
            return Err(other(format!("cannot map a heap of {len} bytes")));
        };
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

/// A rank's heap in host memory, as this process reaches it.
#[derive(Clone)]
pub(super) enum HostHeapRef {
    /// Mapped here (ranks as threads: allocations; as processes of one node: shared
    /// mappings; an MPI rank's own heap).
    Local(Arc<dyn HostMemory>),
    /// Another rank's, reached through a communication engine (MPI).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Remote(Arc<dyn RemoteMemory>),
}

impl HostHeapRef {
    /// `len` elements of `elem` at byte `offset` of the heap.
    pub(super) fn view(
        &self,
        offset: usize,
        elem: ScalarType,
        len: usize,
    ) -> Result<HostBuffer, Error> {
        Ok(match self {
            HostHeapRef::Local(m) => HostBuffer::view(m.clone(), offset, elem, len)?,
            HostHeapRef::Remote(m) => HostBuffer::remote(m.clone(), offset, elem, len)?,
        })
    }

    /// The heap's address in this process (`None` when reached through an engine).
    pub(super) fn base(&self) -> Option<*mut u8> {
        match self {
            HostHeapRef::Local(m) => Some(m.base()),
            HostHeapRef::Remote(_) => None,
        }
    }
}

/// Every rank's heap, as this process reaches them.
pub(super) enum Heaps {
    /// Host memory (mapped here, or reached through an engine).
    Host(Arc<[HostHeapRef]>),
    /// GPU memory (allocated here or opened through IPC).
    Gpu(Arc<[Arc<GpuHeap>]>),
}

/// State shared by the ranks of one world (in this process).
pub(super) struct Shared {
    pub(super) size: u32,
    pub(super) team: Team,
    /// Every rank's heap.
    pub(super) heaps: Heaps,
    /// Every rank's control words (views of the host heaps' first bytes; empty for
    /// GPU heaps).
    ctrl: Arc<[Arc<HostBuffer>]>,
    pub(super) timeout: Duration,
    pub(super) signal_bytes: usize,
    pub(super) heap_bytes: usize,
    /// Each rank's node, when the ranks are placed on several
    /// ([`super::World::ranks_per_node`]).
    pub(super) nodes: Option<Arc<[u32]>>,
    /// The transport's session of a world that has one (an NVSHMEM world's NVSHMEM
    /// session, what the MPI windows of an MPI world share), abandoned when the world
    /// fails.
    pub(super) session: std::sync::OnceLock<Arc<dyn TransportSession>>,
}

/// What a transport keeps for a joined world while the world lives (held with its
/// shared state, so it goes with the last of the world's ranks and buffers).
pub(super) trait TransportSession: Send + Sync {
    /// The world failed: ending the session must not wait for every rank (NVSHMEM is
    /// not finalized; the MPI windows are freed only if every rank comes to free
    /// them in time).
    fn abandon(&self);
}

impl Shared {
    pub(super) fn new(
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
                    v.push(Arc::new(h.view(0, ScalarType::U64, ctrl::WORDS)?));
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
            nodes: None,
            session: std::sync::OnceLock::new(),
        })
    }

    pub(super) fn interp_world(&self, rank: u32) -> CommWorld {
        CommWorld {
            rank,
            size: self.size,
            ctrl: self.ctrl.clone(),
            timeout: self.timeout,
        }
    }

    /// The rank that failed first, if any: recorded in the team segment, or by a
    /// kernel in this rank's control words.
    pub(super) fn failed(&self, me: u32) -> Option<u32> {
        self.team
            .failed()
            .map(|(r, _)| r)
            .or_else(|| self.interp_world(me).failed_rank())
    }

    /// Marks `rank` as failed (`died`: its process exited) everywhere: the team
    /// segment and every heap's abort word, releasing host barriers and device waits.
    pub(super) fn abort(&self, rank: u32, died: bool) {
        self.team.fail(rank, died);
        self.release(rank);
    }

    /// Marks `rank` as failed because it timed out waiting for rank `missing`.
    pub(super) fn abort_waiting_for(&self, rank: u32, missing: u32) {
        self.team.fail_waiting_for(rank, missing);
        self.release(rank);
    }

    /// Marks `rank` as failed because it left the world while others needed it.
    pub(super) fn abort_by_leaving(&self, rank: u32) {
        self.team.fail_by_leaving(rank);
        self.release(rank);
    }

    /// Raises every heap's abort word naming `rank`, releasing device waits.
    fn release(&self, rank: u32) {
        if let Some(s) = self.session.get() {
            s.abandon();
        }
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

/// Bump cursors of one rank's heap regions.
#[derive(Debug)]
pub(super) struct Cursor {
    pub(super) signal_next: usize,
    pub(super) data_next: usize,
    pub(super) count: usize,
}

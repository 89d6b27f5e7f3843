//! Symmetric heaps in GPU memory.
//!
//! Each rank's heap is one raw allocation of `heap_bytes` on its GPU (`cuMemAlloc`,
//! not cudarc's stream-ordered pool, whose memory cannot be exported; on AMD
//! uncached memory from `hipExtMallocWithFlags`, which peers' writes reach, see
//! `GpuBackend::alloc_exportable` of the HIP backend),
//! zeroed, laid out like a host heap (control words, signals, data). A rank reaches
//! its peers' heaps by address:
//!
//! - **one process, several GPUs** ([`crate::World::local`] with
//!   [`crate::World::on_each`]): peer access is enabled between every pair of the
//!   world's GPUs (`cuCtxEnablePeerAccess`, `hipDeviceEnablePeerAccess`); with unified
//!   addressing a peer's heap has the same address on every GPU.
//! - **one rank per process** ([`crate::World::launched`] on a GPU): each rank exports
//!   its heap with `cuIpcGetMemHandle` / `hipIpcGetMemHandle`, the 64-byte handles
//!   travel over the bootstrap socket, and every rank opens the others'
//!   (`cuIpcOpenMemHandle` / `hipIpcOpenMemHandle`, lazily enabling peer access),
//!   getting addresses valid in its own context.
//!
//! Either way each rank uploads once the *heap-base table*: `size` `u64`s, entry `p`
//! the address of rank `p`'s heap as this rank's GPU sees it. Kernels receive its
//! address (the `heap_bases` hidden parameter, `RankLink::gpu_hidden_args`) and translate `buf.on(peer)` as
//! `table[peer] + (ptr - table[rank])`.
//!
//! **Registering an existing buffer** (using a user's `cuMemAlloc`ed buffer as
//! symmetric memory without a copy) is not offered: translation needs the buffer at
//! the same offset from every rank's heap base, and an arbitrary allocation lies
//! outside the heap at an unrelated address on each rank; giving it its own table
//! would make every `buf.on(peer)` depend on which allocation a pointer came from,
//! which a kernel cannot know for pointers it computes. Allocate communicated data in
//! the heap instead ([`crate::Rank::alloc`], [`crate::Rank::upload`]): it is an
//! ordinary [`crate::Buffer`] for every other purpose.

use std::sync::Arc;

use tessera_ir::interp::ctrl;

use crate::backend::{DevMem, GpuBackend, RawStream};
use crate::buffer::Storage;
use crate::device::{Backend, Device};
use crate::error::Error;

/// A GPU through which a heap is reached.
pub(crate) type GpuDev = Arc<dyn GpuBackend>;

/// The GPU of `device`, `None` for the CPU and the emulator.
pub(crate) fn gpu_of(device: &Device) -> Option<GpuDev> {
    match &device.backend {
        Backend::Gpu(g) => Some(g.clone()),
        _ => None,
    }
}

/// How a [`GpuHeap`] is held, and so released.
enum Hold {
    /// Allocated here ([`GpuBackend::alloc_exportable`]): freed on drop.
    Alloc,
    /// Opened from another process's IPC handle: closed on drop.
    Ipc,
    /// NVSHMEM's symmetric memory, this rank's or a peer's mapped by `nvshmem_ptr`:
    /// released when NVSHMEM is finalized (the session it keeps alive).
    Shmem(#[allow(dead_code)] Arc<dyn std::any::Any + Send + Sync>),
    /// A peer on another node: no address here; reads, writes and the abort word go
    /// through the engine.
    Remote(Arc<dyn tessera_ir::interp::RemoteMemory>),
}

/// One rank's heap as this process reaches it: allocated here, opened from another
/// process's IPC handle, or NVSHMEM's (see [`Hold`]).
pub(crate) struct GpuHeap {
    dev: GpuDev,
    /// Its address on `dev`, or for a heap on another node the heap-base table's
    /// tagged entry ([`tessera_ir::comm::tagged_bases`]).
    pub(crate) ptr: u64,
    /// Its size in bytes.
    pub(crate) len: usize,
    hold: Hold,
}

impl Drop for GpuHeap {
    fn drop(&mut self) {
        match self.hold {
            Hold::Alloc => self.dev.free_exportable(self.ptr),
            Hold::Ipc => self.dev.ipc_close(self.ptr),
            Hold::Shmem(_) | Hold::Remote(_) => {}
        }
    }
}

impl GpuHeap {
    /// A zeroed heap of `len` bytes on `dev`.
    pub(crate) fn alloc(dev: &GpuDev, len: usize) -> Result<GpuHeap, Error> {
        let ptr = dev.alloc_exportable(len)?;
        Ok(GpuHeap {
            dev: dev.clone(),
            ptr,
            len,
            hold: Hold::Alloc,
        })
    }

    /// Opens a heap of `len` bytes another process exported as `handle`.
    pub(crate) fn open(dev: &GpuDev, handle: &[u8], len: usize) -> Result<GpuHeap, Error> {
        let ptr = dev.ipc_open(handle)?;
        Ok(GpuHeap {
            dev: dev.clone(),
            ptr,
            len,
            hold: Hold::Ipc,
        })
    }

    /// NVSHMEM's symmetric memory at `ptr` on `dev` (this rank's heap, or a peer's
    /// mapped here), kept valid by `session`.
    pub(crate) fn shmem(
        dev: &GpuDev,
        ptr: u64,
        len: usize,
        session: Arc<dyn std::any::Any + Send + Sync>,
    ) -> GpuHeap {
        GpuHeap {
            dev: dev.clone(),
            ptr,
            len,
            hold: Hold::Shmem(session),
        }
    }

    /// A peer's heap on another node, reached through `engine`; `tagged` is its
    /// heap-base table entry.
    pub(crate) fn remote(
        dev: &GpuDev,
        tagged: u64,
        engine: Arc<dyn tessera_ir::interp::RemoteMemory>,
    ) -> GpuHeap {
        GpuHeap {
            dev: dev.clone(),
            ptr: tagged,
            len: engine.len(),
            hold: Hold::Remote(engine),
        }
    }

    /// Its IPC handle (for a heap allocated here).
    pub(crate) fn handle(&self) -> Result<Vec<u8>, Error> {
        self.dev.ipc_handle(self.ptr)
    }

    fn check(&self, offset: usize, bytes: usize) -> Result<u64, Error> {
        offset
            .checked_add(bytes)
            .filter(|&e| e <= self.len)
            .map(|_| self.ptr.wrapping_add(offset as u64))
            .ok_or_else(|| {
                Error::BufferSize(format!(
                    "bytes {offset}..{} are outside a heap of {} bytes",
                    offset.saturating_add(bytes),
                    self.len
                ))
            })
    }

    /// `bytes` bytes at `offset` (after the work queued on the device's stream).
    pub(crate) fn read(&self, offset: usize, bytes: usize) -> Result<Vec<u8>, Error> {
        let at = self.check(offset, bytes)?;
        let mut out = vec![0u8; bytes];
        match &self.hold {
            Hold::Remote(e) => e.get(offset, &mut out).map_err(Self::engine_err)?,
            _ => self.dev.dtoh(at, &mut out, RawStream::DEFAULT)?,
        }
        Ok(out)
    }

    /// Writes `data` at `offset` (delivered when this returns).
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        let at = self.check(offset, data.len())?;
        match &self.hold {
            Hold::Remote(e) => e
                .put(offset, data)
                .and_then(|()| e.quiet())
                .map_err(Self::engine_err),
            _ => self.dev.htod(at, data, RawStream::DEFAULT),
        }
    }

    fn engine_err(message: String) -> Error {
        Error::Comm { rank: 0, message }
    }

    /// Raises the abort word (`1 + failed rank`) without waiting for running kernels.
    pub(crate) fn raise_abort(&self, failed_rank: u32) -> Result<(), Error> {
        let word = ctrl::ABORT * 8;
        if let Hold::Remote(e) = &self.hold {
            // An atomic through the engine; the first failure recorded stays.
            return e
                .compare_and_swap(word, 8, 0, u64::from(failed_rank) + 1)
                .map(|_| ())
                .map_err(Self::engine_err);
        }
        // The word is a little-endian u64, zero until now: writing its low half is
        // enough (failed_rank + 1 <= 1024).
        self.dev.poke_u32(self.ptr + word as u64, failed_rank + 1)
    }

    /// The control words (after the work queued on the device's stream): read them
    /// after a launch to find a device-side error record.
    pub(crate) fn ctrl_words(&self) -> Result<Vec<u64>, Error> {
        let bytes = self.read(0, ctrl::WORDS * 8)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }

    /// A buffer storage viewing `bytes` bytes at `offset`, keeping the heap alive.
    pub(crate) fn view(self: &Arc<Self>, offset: usize, bytes: usize) -> Result<Storage, Error> {
        let at = self.check(offset, bytes)?;
        if matches!(self.hold, Hold::Remote(_)) {
            return Err(Self::engine_err(
                "a heap on another node has no address here to view".into(),
            ));
        }
        let owner: Arc<dyn std::any::Any + Send + Sync> = self.clone();
        Ok(Storage::Device(DevMem::view(&self.dev, at, owner)))
    }
}

/// A rank's GPU side: its heap-base table in its device's memory.
pub(crate) struct GpuRank {
    /// The table: entry `p` is rank `p`'s heap address as this rank's GPU sees it.
    pub(crate) table: GpuHeap,
}

impl GpuRank {
    /// Uploads the table of `heaps` (every rank's heap as `dev` sees it) to `dev`.
    pub(crate) fn new(dev: &GpuDev, heaps: &[Arc<GpuHeap>]) -> Result<GpuRank, Error> {
        let bases: Vec<u64> = heaps.iter().map(|h| h.ptr).collect();
        let table = GpuHeap::alloc(dev, bases.len() * 8)?;
        let bytes: Vec<u8> = bases.iter().flat_map(|b| b.to_le_bytes()).collect();
        table.write(0, &bytes)?;
        Ok(GpuRank { table })
    }
}

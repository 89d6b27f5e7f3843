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

/// One rank's heap as this process reaches it: allocated here, or opened from another
/// process's IPC handle. Freed (or closed) on drop.
pub(crate) struct GpuHeap {
    dev: GpuDev,
    /// Its address on `dev`.
    pub(crate) ptr: u64,
    /// Its size in bytes.
    pub(crate) len: usize,
    owned: bool,
}

impl Drop for GpuHeap {
    fn drop(&mut self) {
        if self.owned {
            self.dev.free_exportable(self.ptr)
        } else {
            self.dev.ipc_close(self.ptr)
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
            owned: true,
        })
    }

    /// Opens a heap of `len` bytes another process exported as `handle`.
    pub(crate) fn open(dev: &GpuDev, handle: &[u8], len: usize) -> Result<GpuHeap, Error> {
        let ptr = dev.ipc_open(handle)?;
        Ok(GpuHeap {
            dev: dev.clone(),
            ptr,
            len,
            owned: false,
        })
    }

    /// Its IPC handle (for a heap allocated here).
    pub(crate) fn handle(&self) -> Result<Vec<u8>, Error> {
        self.dev.ipc_handle(self.ptr)
    }

    fn check(&self, offset: usize, bytes: usize) -> Result<u64, Error> {
        offset
            .checked_add(bytes)
            .filter(|&e| e <= self.len)
            .map(|_| self.ptr + offset as u64)
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
        self.dev.dtoh(at, &mut out, RawStream::DEFAULT)?;
        Ok(out)
    }

    /// Writes `data` at `offset`.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        let at = self.check(offset, data.len())?;
        self.dev.htod(at, data, RawStream::DEFAULT)
    }

    /// Raises the abort word (`1 + failed rank`) without waiting for running kernels.
    pub(crate) fn raise_abort(&self, failed_rank: u32) -> Result<(), Error> {
        // The word is a little-endian u64, zero until now: writing its low half is
        // enough (failed_rank + 1 <= 1024).
        let at = self.ptr + (ctrl::ABORT * 8) as u64;
        self.dev.poke_u32(at, failed_rank + 1)
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

//! The host's reach into the memory of a PE on another node of an NVSHMEM world
//! ([`ShmemPeer`]): the team segment and other nodes' heaps, through NVSHMEM's
//! host-side calls.
//!
//! Contract: reads and writes go through this rank's staging area (symmetric memory,
//! one host transfer at a time), in chunks of [`STAGE_BYTES`]; a `put` is complete
//! when it returns; atomics are NVSHMEM's own (4 and 8 bytes); every access is
//! checked against the allocation's bounds (and alignment for atomics) first, and
//! the rank's CUDA context is made current for it.

use std::sync::Arc;

use tessera_ir::interp::RemoteMemory;

use super::host::Session;
use crate::backend::RawStream;
use crate::world::gpu::GpuDev;

/// Bytes of each rank's staging area: the host's reads and writes of another node's
/// memory go through it (NVSHMEM's host-side calls take symmetric local buffers).
pub(super) const STAGE_BYTES: usize = 1 << 20;

/// A rank's staging area (symmetric memory), one host transfer at a time.
pub(super) struct Stage {
    pub(super) at: u64,
    pub(super) lock: std::sync::Mutex<()>,
}

/// A PE's symmetric allocation reached from the host with NVSHMEM's host-side calls:
/// reads and writes through the staging area (`nvshmem_getmem`/`_putmem`, then a
/// copy between the host and the staging area), atomics as NVSHMEM's.
pub(super) struct ShmemPeer {
    pub(super) session: Arc<Session>,
    pub(super) dev: GpuDev,
    /// The allocation's symmetric address (this PE's copy).
    pub(super) sym: u64,
    pub(super) pe: u32,
    pub(super) len: usize,
    pub(super) stage: Arc<Stage>,
}

impl ShmemPeer {
    fn at(&self, offset: usize, bytes: usize, align: usize) -> Result<u64, String> {
        let end = offset.checked_add(bytes).filter(|&e| e <= self.len);
        if end.is_none() || !offset.is_multiple_of(align) {
            return Err(format!(
                "bytes {offset}..{} of PE {}'s symmetric memory: outside its {} bytes or not {align}-byte aligned",
                offset.saturating_add(bytes),
                self.pe,
                self.len
            ));
        }
        Ok(self.sym + offset as u64)
    }

    /// Makes the rank's CUDA context current on this thread (NVSHMEM's host calls
    /// act in it).
    fn bind(&self) -> Result<(), String> {
        match self
            .dev
            .as_any()
            .downcast_ref::<crate::backend::cuda::CudaDevice>()
        {
            Some(d) => d.make_current().map_err(|e| e.to_string()),
            None => Err("NVSHMEM's peers are reached from CUDA devices only".into()),
        }
    }
}

impl RemoteMemory for ShmemPeer {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        let at = self.at(offset, out.len(), 1)?;
        self.bind()?;
        let _one = self.stage.lock.lock().unwrap_or_else(|e| e.into_inner());
        for (i, chunk) in out.chunks_mut(STAGE_BYTES).enumerate() {
            let from = at + (i * STAGE_BYTES) as u64;
            // SAFETY: `from..` lies in the allocation (checked), the staging area is
            // this PE's symmetric memory of STAGE_BYTES, the context is bound.
            unsafe {
                self.session
                    .getmem(self.stage.at, from, chunk.len(), self.pe)
            };
            self.dev
                .dtoh(self.stage.at, chunk, RawStream::DEFAULT)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn put(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        let at = self.at(offset, data.len(), 1)?;
        self.bind()?;
        let _one = self.stage.lock.lock().unwrap_or_else(|e| e.into_inner());
        for (i, chunk) in data.chunks(STAGE_BYTES).enumerate() {
            self.dev
                .htod(self.stage.at, chunk, RawStream::DEFAULT)
                .map_err(|e| e.to_string())?;
            let to = at + (i * STAGE_BYTES) as u64;
            // SAFETY: as in `get`; a blocking put, so the staging area is free
            // again when it returns.
            unsafe { self.session.putmem(to, self.stage.at, chunk.len(), self.pe) };
        }
        Ok(())
    }

    fn compare_and_swap(
        &self,
        offset: usize,
        width: usize,
        expected: u64,
        desired: u64,
    ) -> Result<u64, String> {
        let at = self.at(offset, width, width.max(1))?;
        self.bind()?;
        match width {
            // SAFETY: an aligned word of the allocation, the context bound.
            8 => Ok(unsafe { self.session.cas_u64(at, expected, desired, self.pe) }),
            // SAFETY: as above.
            4 => Ok(u64::from(unsafe {
                self.session
                    .cas_u32(at, expected as u32, desired as u32, self.pe)
            })),
            w => Err(format!(
                "NVSHMEM has no {w}-byte atomics (only 4 and 8 bytes)"
            )),
        }
    }

    fn fetch_add_u64(&self, offset: usize, v: u64) -> Result<u64, String> {
        let at = self.at(offset, 8, 8)?;
        self.bind()?;
        // SAFETY: an aligned word of the allocation, the context bound.
        Ok(unsafe { self.session.fetch_add_u64(at, v, self.pe) })
    }

    fn load_u64(&self, offset: usize) -> Result<u64, String> {
        let at = self.at(offset, 8, 8)?;
        self.bind()?;
        // SAFETY: as above.
        Ok(unsafe { self.session.fetch_u64(at, self.pe) })
    }

    fn quiet(&self) -> Result<(), String> {
        self.bind()?;
        self.session.quiet();
        Ok(())
    }
}

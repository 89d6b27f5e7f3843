//! Symmetric buffers ([`SymBuffer`]): the same allocation in every rank's heap,
//! dereferencing to this rank's copy, and their kernel launch arguments
//! ([`LaunchArg::symmetric`], [`LaunchArg::symmetric_mut`]).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use tessera_ir::interp::HostBuffer;

use crate::buffer::{Buffer, Element};
use crate::error::Error;
use crate::launch::LaunchArg;

use super::heap::{Heaps, Shared};

/// A symmetric buffer: the same allocation on every rank of a world. Dereferences to
/// this rank's copy (a [`Buffer`], for upload/download), and is passed to kernels for
/// `&Symmetric<T>` / `&mut Symmetric<T>` parameters.
pub struct SymBuffer<T: Element> {
    pub(super) local: Buffer<T>,
    /// Every rank's copy (host worlds; empty for GPU worlds).
    pub(super) copies: Arc<[Arc<HostBuffer>]>,
    pub(super) shared: Arc<Shared>,
    pub(super) offset: usize,
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

impl<'a> LaunchArg<'a> {
    /// A read-only symmetric buffer argument.
    pub fn symmetric<T: Element>(b: &'a SymBuffer<T>) -> LaunchArg<'a> {
        LaunchArg::symmetric_parts(
            &b.local().storage,
            b.local().len() * T::TY.size_bytes(),
            b.device(),
            &b.copies,
            Arc::as_ptr(&b.shared) as usize,
        )
    }

    /// A written symmetric buffer argument.
    pub fn symmetric_mut<T: Element>(b: &'a mut SymBuffer<T>) -> LaunchArg<'a> {
        Self::symmetric(b)
    }
}

impl<T: Element> SymBuffer<T> {
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
            Heaps::Host(_) => self.copies[peer as usize].read_bytes()?,
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

//! Typed device buffers.

use std::marker::PhantomData;
use std::sync::Arc;

use tessera_ir::dsl::DType;
use tessera_ir::interp::HostBuffer;

use crate::device::Backend;
use crate::{Device, Error};

/// Element types a buffer can hold: every Tessera element type but `bool`.
pub trait Element: DType + bytemuck::Pod {}
impl<T: DType + bytemuck::Pod> Element for T {}

/// Where a buffer's bytes are.
pub(crate) enum Storage {
    /// Host memory, shared with the interpreter (the CPU device).
    Host(Arc<HostBuffer>),
    /// CUDA device memory.
    Cuda(crate::cuda::CudaBuf),
    /// HIP device memory.
    #[cfg(feature = "hip")]
    Hip(crate::hip::HipBuf),
}

/// A buffer of `T` on a device. Kernels take `&Buffer<T>` for `&Global<T>` parameters
/// and `&mut Buffer<T>` for `&mut Global<T>`, so Rust's borrow rules rule out a
/// buffer being written through one argument while read through another.
pub struct Buffer<T: Element> {
    pub(crate) storage: Storage,
    len: usize,
    device: Device,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer<{}>[{}] on {}",
            T::TY,
            self.len(),
            self.device.id()
        )
    }
}

fn byte_len<T>(len: usize) -> usize {
    len * std::mem::size_of::<T>()
}

impl Device {
    pub(crate) fn buffer<T: Element>(&self, storage: Storage, len: usize) -> Buffer<T> {
        Buffer {
            storage,
            len,
            device: self.clone(),
            _t: PhantomData,
        }
    }

    /// A zero-filled buffer of `len` elements.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Buffer<T>, Error> {
        let storage = match &self.backend {
            Backend::Cpu | Backend::Emu(_) => Storage::Host(Arc::new(HostBuffer::new(T::TY, len))),
            Backend::Cuda(d) => Storage::Cuda(d.alloc(byte_len::<T>(len))?),
            #[cfg(feature = "hip")]
            Backend::Hip(d) => Storage::Hip(d.alloc(byte_len::<T>(len))?),
        };
        Ok(self.buffer(storage, len))
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>, Error> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let storage = match &self.backend {
            Backend::Cpu | Backend::Emu(_) => {
                Storage::Host(Arc::new(HostBuffer::from_bytes(T::TY, bytes)?))
            }
            Backend::Cuda(d) => Storage::Cuda(d.upload(bytes)?),
            #[cfg(feature = "hip")]
            Backend::Hip(d) => Storage::Hip(d.upload(bytes)?),
        };
        Ok(self.buffer(storage, data.len()))
    }
}

impl<T: Element> Buffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn bytes(&self) -> Result<Vec<u8>, Error> {
        match &self.storage {
            Storage::Host(h) => Ok(h.read_bytes()),
            Storage::Cuda(c) => c.dev.read(c, byte_len::<T>(self.len)),
            #[cfg(feature = "hip")]
            Storage::Hip(b) => b.dev.read(b, byte_len::<T>(self.len)),
        }
    }

    /// Copies the contents to the host (on a GPU, after the work queued before it).
    pub fn download(&self) -> Result<Vec<T>, Error> {
        let bytes = self.bytes()?;
        let mut out = vec![T::zeroed(); self.len()];
        let dst = bytemuck::cast_slice_mut::<T, u8>(&mut out);
        if bytes.len() != dst.len() {
            return Err(Error::BufferSize(format!(
                "read {} bytes for {} elements",
                bytes.len(),
                self.len()
            )));
        }
        dst.copy_from_slice(&bytes);
        Ok(out)
    }

    /// Overwrites the contents with `data`, which must have [`Buffer::len`] elements.
    pub fn copy_from(&mut self, data: &[T]) -> Result<(), Error> {
        if data.len() != self.len() {
            return Err(Error::BufferSize(format!(
                "copying {} elements into a buffer of {}",
                data.len(),
                self.len()
            )));
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        match &mut self.storage {
            Storage::Host(h) => h.write_bytes(0, bytes).map_err(Error::from),
            Storage::Cuda(c) => {
                let dev = c.dev.clone();
                dev.write(c, bytes)
            }
            #[cfg(feature = "hip")]
            Storage::Hip(b) => b.dev.write(b, bytes),
        }
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: T) -> Result<(), Error> {
        self.copy_from(&vec![value; self.len()])
    }

    /// A copy of this buffer on `device`: a device-to-device copy on the same GPU, a
    /// peer copy between GPUs of one vendor (`cuMemcpyPeer`, `hipMemcpyPeer`; faster
    /// after [`Device::enable_peer_access`]), and through the host otherwise.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer<T>, Error> {
        match (&self.storage, &device.backend) {
            (Storage::Cuda(src), Backend::Cuda(d)) => {
                let mut dst = d.alloc(byte_len::<T>(self.len))?;
                d.copy_device(src, &mut dst)?;
                Ok(device.buffer(Storage::Cuda(dst), self.len))
            }
            #[cfg(feature = "hip")]
            (Storage::Hip(src), Backend::Hip(d)) => {
                let dst = d.alloc(byte_len::<T>(self.len))?;
                d.copy_device(src, &dst, byte_len::<T>(self.len))?;
                Ok(device.buffer(Storage::Hip(dst), self.len))
            }
            _ => device.upload(&self.download()?),
        }
    }
}

//! Typed device buffers.

use std::marker::PhantomData;
use std::sync::Arc;

use tessera_ir::dsl::DType;
use tessera_ir::interp::HostBuffer;

use crate::backend::{DevMem, RawStream};
use crate::device::{Backend, Device, Stream};
use crate::error::Error;

/// Element types a buffer can hold: every Tessera element type but `bool`.
pub trait Element: DType + bytemuck::Pod {}
impl<T: DType + bytemuck::Pod> Element for T {}

/// Where a buffer's bytes are.
pub(crate) enum Storage {
    /// Host memory, shared with the interpreter (the CPU device).
    Host(Arc<HostBuffer>),
    /// GPU memory.
    Device(DevMem),
}

impl Storage {
    /// The device address of GPU memory, `None` for host memory.
    pub(crate) fn device_address(&self) -> Option<u64> {
        match self {
            Storage::Device(m) => Some(m.ptr),
            Storage::Host(_) => None,
        }
    }
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
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => {
                Storage::Host(Arc::new(HostBuffer::new(T::TY, len)))
            }
            Backend::Gpu(g) => Storage::Device(DevMem::alloc(g, byte_len::<T>(len))?),
        };
        Ok(self.buffer(storage, len))
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>, Error> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let storage = match &self.backend {
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => {
                Storage::Host(Arc::new(HostBuffer::from_bytes(T::TY, bytes)?))
            }
            Backend::Gpu(g) => {
                let m = DevMem::alloc(g, bytes.len())?;
                g.htod(m.ptr, bytes, RawStream::DEFAULT)?;
                Storage::Device(m)
            }
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

    /// Checks that `stream` is a stream of this buffer's device.
    fn check_stream(&self, stream: &Stream) -> Result<RawStream, Error> {
        if stream.device() != &self.device {
            return Err(Error::Usage(format!(
                "a buffer of {} used on a stream of {}",
                self.device.id(),
                stream.device().id()
            )));
        }
        Ok(stream.raw())
    }

    /// Copies the contents to the host (on a GPU, after the work queued before it on
    /// the default stream).
    pub fn download(&self) -> Result<Vec<T>, Error> {
        self.download_raw(RawStream::DEFAULT)
    }

    /// Copies the contents to the host after the work queued before it on `stream`.
    pub fn download_on(&self, stream: &Stream) -> Result<Vec<T>, Error> {
        let raw = self.check_stream(stream)?;
        self.download_raw(raw)
    }

    fn download_raw(&self, stream: RawStream) -> Result<Vec<T>, Error> {
        let mut out = vec![T::zeroed(); self.len()];
        let dst = bytemuck::cast_slice_mut::<T, u8>(&mut out);
        match &self.storage {
            Storage::Host(h) => {
                let bytes = h.read_bytes()?;
                if bytes.len() != dst.len() {
                    return Err(Error::BufferSize(format!(
                        "read {} bytes for {} elements",
                        bytes.len(),
                        self.len()
                    )));
                }
                dst.copy_from_slice(&bytes);
            }
            Storage::Device(m) => m.gpu.dtoh(m.ptr, dst, stream)?,
        }
        Ok(out)
    }

    /// Overwrites the contents with `data`, which must have [`Buffer::len`] elements
    /// (on a GPU, after the work queued before it on the default stream).
    pub fn copy_from(&mut self, data: &[T]) -> Result<(), Error> {
        self.copy_from_raw(data, RawStream::DEFAULT)
    }

    /// Overwrites the contents with `data` after the work queued before on `stream`.
    pub fn copy_from_on(&mut self, data: &[T], stream: &Stream) -> Result<(), Error> {
        let raw = self.check_stream(stream)?;
        self.copy_from_raw(data, raw)
    }

    fn copy_from_raw(&mut self, data: &[T], stream: RawStream) -> Result<(), Error> {
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
            Storage::Device(m) => m.gpu.htod(m.ptr, bytes, stream),
        }
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: T) -> Result<(), Error> {
        self.copy_from(&vec![value; self.len()])
    }

    /// A copy of this buffer on `device`: a device-to-device copy on the same GPU, a
    /// peer copy between GPUs of one vendor (`cuMemcpyDtoDAsync` under unified
    /// addressing, `hipMemcpyPeerAsync`; faster after
    /// [`Device::enable_peer_access`]), and through the host otherwise. A copy between
    /// two GPUs returns when it is done.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer<T>, Error> {
        match (&self.storage, &device.backend) {
            (Storage::Device(src), Backend::Gpu(g)) if src.gpu.kind() == g.kind() => {
                let bytes = byte_len::<T>(self.len);
                let dst = DevMem::alloc(g, bytes)?;
                g.copy(
                    dst.ptr,
                    src.gpu.as_ref(),
                    src.ptr,
                    bytes,
                    RawStream::DEFAULT,
                )?;
                if src.gpu.ordinal() != g.ordinal() {
                    // The source may be freed as soon as this returns, on its own
                    // device's stream, which is not ordered with this device's.
                    g.synchronize(RawStream::DEFAULT)?;
                }
                Ok(device.buffer(Storage::Device(dst), self.len))
            }
            _ => device.upload(&self.download()?),
        }
    }
}

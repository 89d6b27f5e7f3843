//! Typed device buffers.

use std::marker::PhantomData;
use std::sync::Arc;

use tessera_ir::dsl::DType;
use tessera_ir::interp::{HostBuffer, InterpError, alloc_bytes};

use crate::backend::{DevMem, RawStream};
use crate::device::{Backend, Device, Stream};
use crate::error::Error;

/// Element types a buffer can hold: every Tessera element type but `bool`. Any
/// [`Num`](tessera_ir::dsl::Num) type is one; `#[kernel]` requires it of a generic
/// buffer element type at launch, so a kernel may bound that type with just `DType`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the element type of a buffer",
    label = "buffers hold i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, F8E4M3 or F8E5M2",
    note = "`bool` has no memory layout in buffers: store masks as `u8` or `i32` (`mask.cast::<u8>()`)"
)]
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

/// The bytes of `len` elements of `T`, or [`Error::OutOfMemory`] on `device` when
/// that overflows `usize` (no memory holds it).
fn byte_len<T>(len: usize, device: &Device) -> Result<usize, Error> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| Error::OutOfMemory {
            bytes: alloc_bytes(len, std::mem::size_of::<T>()),
            device: device.id(),
        })
}

/// `len` copies of `value` in a new vector, or [`Error::OutOfMemory`] on `device` when
/// the host cannot allocate it (instead of aborting the process).
fn try_vec<T: Clone>(value: T, len: usize, device: &Device) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        bytes: alloc_bytes(len, std::mem::size_of::<T>()),
        device: device.id(),
    })?;
    v.resize(len, value);
    Ok(v)
}

/// An error of host memory (the CPU device's, the interpreter's, the emulators'):
/// [`InterpError::OutOfMemory`] as [`Error::OutOfMemory`] on `device`.
fn host_err(device: &Device) -> impl FnOnce(InterpError) -> Error + '_ {
    move |e| match e {
        InterpError::OutOfMemory { bytes } => Error::OutOfMemory {
            bytes,
            device: device.id(),
        },
        e => Error::from(e),
    }
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

    /// A zero-filled buffer of `len` elements. Fails with [`Error::OutOfMemory`]
    /// (naming the size and the device) when the memory cannot be allocated.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Buffer<T>, Error> {
        let storage = match &self.backend {
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => Storage::Host(Arc::new(
                HostBuffer::try_new(T::TY, len).map_err(host_err(self))?,
            )),
            Backend::Gpu(g) => Storage::Device(DevMem::alloc(g, byte_len::<T>(len, self)?)?),
        };
        Ok(self.buffer(storage, len))
    }

    /// A buffer holding a copy of `data`. Fails with [`Error::OutOfMemory`] when the
    /// memory cannot be allocated.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>, Error> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let storage = match &self.backend {
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => Storage::Host(Arc::new(
                HostBuffer::from_bytes(T::TY, bytes).map_err(host_err(self))?,
            )),
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
        let mut out = try_vec(T::zeroed(), self.len(), &self.device)?;
        let dst = bytemuck::cast_slice_mut::<T, u8>(&mut out);
        match &self.storage {
            Storage::Host(h) => {
                let bytes = h.read_bytes().map_err(host_err(&self.device))?;
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
        let data = try_vec(value, self.len(), &self.device)?;
        self.copy_from(&data)
    }

    /// A copy of this buffer on `device`: a device-to-device copy on the same GPU, a
    /// peer copy between GPUs of one vendor (`cuMemcpyDtoDAsync` under unified
    /// addressing, `hipMemcpyPeerAsync`; faster after
    /// [`Device::enable_peer_access`]), and through the host otherwise. A copy between
    /// two GPUs returns when it is done.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer<T>, Error> {
        match (&self.storage, &device.backend) {
            (Storage::Device(src), Backend::Gpu(g)) if src.gpu.kind() == g.kind() => {
                let bytes = byte_len::<T>(self.len, device)?;
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

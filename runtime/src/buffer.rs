//! Typed device buffers.

use std::marker::PhantomData;
use std::sync::Arc;

use tessera_ir::dsl::DType;
use tessera_ir::interp::HostBuffer;

use crate::{Device, Error};

/// Element types a buffer can hold: every Tessera element type but `bool`.
pub trait Element: DType + bytemuck::Pod {}
impl<T: DType + bytemuck::Pod> Element for T {}

/// A buffer of `T` on a device. Kernels take `&Buffer<T>` for `&Global<T>` parameters
/// and `&mut Buffer<T>` for `&mut Global<T>`, so Rust's borrow rules rule out a
/// buffer being written through one argument while read through another.
pub struct Buffer<T: Element> {
    pub(crate) raw: Arc<HostBuffer>,
    device: Device,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer<{}>[{}] on {}", T::TY, self.len(), self.device)
    }
}

impl Device {
    /// A zero-filled buffer of `len` elements.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Buffer<T>, Error> {
        Ok(Buffer {
            raw: Arc::new(HostBuffer::new(T::TY, len)),
            device: self.clone(),
            _t: PhantomData,
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>, Error> {
        Ok(Buffer {
            raw: Arc::new(HostBuffer::from_bytes(T::TY, bytemuck::cast_slice(data))?),
            device: self.clone(),
            _t: PhantomData,
        })
    }
}

impl<T: Element> Buffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// True when it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Copies the contents to the host.
    pub fn download(&self) -> Result<Vec<T>, Error> {
        let bytes = self.raw.read_bytes();
        let mut out = vec![T::zeroed(); self.len()];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
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
        self.raw
            .write_bytes(0, bytemuck::cast_slice(data))
            .map_err(Error::from)
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: T) -> Result<(), Error> {
        self.copy_from(&vec![value; self.len()])
    }
}

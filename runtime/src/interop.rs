//! Memory others own: raw pointers, foreign allocations and DLPack tensors.
//!
//! - [`Buffer::device_ptr`] is a buffer's address (a device address on a GPU, a host
//!   address on the CPU and the emulator), for passing to other libraries.
//! - [`Device::wrap`] (`unsafe`) makes a [`Buffer`] of memory someone else allocated:
//!   Tessera never frees it, and keeps the `owner` you give alive as long as the
//!   buffer (and any launch using it) lives. [`Buffer::from_cuda_slice`] does this
//!   safely for a cudarc `CudaSlice` (the buffer owns the slice); a Tessera
//!   [`crate::Stream`]'s `CUstream`/`hipStream_t` is [`crate::Stream::as_raw`], for
//!   cudarc's raw stream calls and other libraries.
//! - [`Buffer::into_dlpack`] hands a buffer to a DLPack consumer (PyTorch, JAX,
//!   NumPy, ... through their `from_dlpack`), zero-copy: the tensor owns the buffer
//!   and frees it when the consumer calls its deleter. [`Buffer::from_dlpack`] takes
//!   a DLPack tensor (a compact one of the buffer's element type on the buffer's
//!   device), zero-copy: the buffer owns the tensor and calls its deleter when the
//!   last use ends. DLPack comes from the `dlpark` crate (re-exported as
//!   [`dlpark`]); tensors use the versioned ABI
//!   (`DLManagedTensorVersioned`, DLPack 1.x).
//!
//! Host memory the interpreter runs on is read and written in aligned 8-byte words,
//! so wrapped host memory must be 8-byte aligned and a whole number of words long.

use std::sync::Arc;

use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType};
use tessera_ir::interp::{HostBuffer, HostMemory};
use tessera_ir::types::ScalarType;

use crate::backend::DevMem;
use crate::buffer::{Buffer, Element, Storage};
use crate::device::{Backend, Device};
use crate::error::Error;
use crate::properties::DeviceKind;

/// The `dlpark` crate (DLPack in Rust), for naming its types.
pub use dlpark;

impl<T: Element> Buffer<T> {
    /// The address of its first element: a device address on a GPU (valid in the
    /// device's context), a host address on the CPU and the emulator. It stays valid
    /// while the buffer lives. Work queued on the device (its zero fill or upload
    /// included) may still be using it: a library working on a stream that is not
    /// ordered with Tessera's (a non-blocking stream) calls [`Device::synchronize`]
    /// first.
    pub fn device_ptr(&self) -> u64 {
        match &self.storage {
            Storage::Host(h) => h.as_mut_ptr() as u64,
            Storage::Device(m) => m.ptr,
        }
    }
}

/// Foreign host memory the interpreter views (kept alive by its owner).
struct ForeignHost {
    base: *mut u8,
    len: usize,
    _owner: Box<dyn std::any::Any + Send + Sync>,
}

// SAFETY: `Device::wrap`'s contract: `base` is valid for reads and writes of `len`
// bytes, 8-byte aligned, while the owner lives (it lives in this value), and the
// caller accesses it only through the buffer while the buffer lives.
unsafe impl HostMemory for ForeignHost {
    fn base(&self) -> *mut u8 {
        self.base
    }
    fn len(&self) -> usize {
        self.len
    }
}
// SAFETY: plain memory; access goes through atomic words (see `HostMemory`).
unsafe impl Send for ForeignHost {}
// SAFETY: as above.
unsafe impl Sync for ForeignHost {}

impl Device {
    /// A buffer of `len` elements of memory someone else owns, at `ptr`: a device
    /// address on this GPU, or a host address for the CPU and the emulator. Tessera
    /// never frees it; `owner` (anything: the allocation's handle, a guard, `()`) is
    /// dropped with the buffer, on a GPU after the device has finished its queued work
    /// (every launch that may use the memory).
    ///
    /// Host memory must be 8-byte aligned and `len * size_of::<T>()` a multiple of 8
    /// (the interpreter accesses whole words); an error says otherwise.
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for reads and writes of `len * size_of::<T>()` bytes on this
    /// device while `owner` lives, hold initialized `T`s, and not be freed or
    /// accessed by anything but this buffer (and kernels launched with it) until the
    /// buffer and its launches are done.
    pub unsafe fn wrap<T: Element>(
        &self,
        ptr: u64,
        len: usize,
        owner: impl Send + Sync + 'static,
    ) -> Result<Buffer<T>, Error> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::BufferSize(format!("{len} elements overflow usize")))?;
        let storage = match &self.backend {
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => {
                if !ptr.is_multiple_of(8) || !bytes.is_multiple_of(8) || ptr == 0 {
                    return Err(Error::Usage(format!(
                        "host memory at {ptr:#x} of {bytes} bytes: the CPU and the emulator need it 8-byte aligned and a multiple of 8 bytes long"
                    )));
                }
                let mem = ForeignHost {
                    base: ptr as usize as *mut u8,
                    len: bytes,
                    _owner: Box::new(owner),
                };
                let view = HostBuffer::view(Arc::new(mem), 0, T::TY, len)?;
                Storage::Host(Arc::new(view))
            }
            Backend::Gpu(g) => {
                let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(owner);
                Storage::Device(DevMem::foreign(g, ptr, owner))
            }
        };
        Ok(self.buffer(storage, len))
    }

    /// This device as DLPack names it.
    fn dl_device(&self) -> DLDevice {
        match self.kind() {
            DeviceKind::Cpu | DeviceKind::Emu => DLDevice::CPU,
            DeviceKind::Cuda => DLDevice::cuda(self.ordinal() as i32),
            DeviceKind::Hip => DLDevice {
                device_type: DLDeviceType::ROCM,
                device_id: self.ordinal() as i32,
            },
        }
    }
}

impl<T: Element + cudarc::driver::DeviceRepr> Buffer<T> {
    /// A buffer over a cudarc `CudaSlice` on `device` (the CUDA device the slice is
    /// on), zero-copy: the buffer owns the slice, which frees its memory when the
    /// buffer and its launches are done. The work queued on the slice's stream is
    /// finished first (Tessera's launches use its own streams).
    pub fn from_cuda_slice(
        device: &Device,
        slice: cudarc::driver::CudaSlice<T>,
    ) -> Result<Buffer<T>, Error> {
        let same_context = match &device.backend {
            Backend::Gpu(g) => g
                .as_any()
                .downcast_ref::<crate::backend::cuda::CudaDevice>()
                .is_some_and(|d| d.cu_ctx() == slice.context().cu_ctx()),
            _ => false,
        };
        if !same_context {
            return Err(Error::Usage(format!(
                "a CudaSlice of cuda:{} (its context) used as a buffer of {}: the slice must come from the device's primary context",
                slice.ordinal(),
                device.id()
            )));
        }
        slice.stream().synchronize().map_err(|e| Error::Driver {
            device: device.id(),
            what: "waiting for the CudaSlice's stream".into(),
            message: format!("{e:?}"),
        })?;
        let ptr = {
            use cudarc::driver::DevicePtr;
            let (ptr, _sync) = slice.device_ptr(slice.stream());
            ptr
        };
        let len = slice.len();
        // SAFETY: the slice is `len` initialized `T`s of device memory on this CUDA
        // device (checked above), moved into the buffer as its owner, so nothing
        // else reaches it while the buffer lives.
        unsafe { device.wrap(ptr, len, slice) }
    }
}

/// DLPack's name for a Tessera element type.
fn dl_dtype(t: ScalarType) -> Option<DLDataType> {
    Some(match t {
        ScalarType::I8 => DLDataType::I8,
        ScalarType::I16 => DLDataType::I16,
        ScalarType::I32 => DLDataType::I32,
        ScalarType::I64 => DLDataType::I64,
        ScalarType::U8 => DLDataType::U8,
        ScalarType::U16 => DLDataType::U16,
        ScalarType::U32 => DLDataType::U32,
        ScalarType::U64 => DLDataType::U64,
        ScalarType::F16 => DLDataType::scalar(dlpark::ffi::DLDataTypeCode::FLOAT, 16),
        ScalarType::BF16 => DLDataType::scalar(dlpark::ffi::DLDataTypeCode::BFLOAT, 16),
        ScalarType::F32 => DLDataType::F32,
        ScalarType::F64 => DLDataType::F64,
        // OCP FP8: `float8_e4m3fn` and `float8_e5m2` in PyTorch's and DLPack's words.
        ScalarType::F8E4M3 => DLDataType::F8E4M3FN,
        ScalarType::F8E5M2 => DLDataType::F8E5M2,
        ScalarType::I1 => return None,
    })
}

fn dl_err(what: impl std::fmt::Display) -> Error {
    Error::Usage(format!("DLPack: {what}"))
}

impl<T: Element> Buffer<T> {
    /// This buffer as a one-dimensional DLPack tensor, zero-copy: the tensor owns
    /// the buffer (freed by the consumer's call of its deleter). Queued work on the
    /// buffer's device is finished first, since a consumer may read it at once on
    /// another stream.
    pub fn into_dlpack(self) -> Result<dlpark::versioned::Dlpack, Error> {
        let dtype =
            dl_dtype(T::TY).ok_or_else(|| dl_err(format!("no DLPack type for {}", T::TY)))?;
        self.device().synchronize()?;
        let device = self.device().dl_device();
        let data = self.device_ptr() as usize as *mut std::ffi::c_void;
        let len = i64::try_from(self.len()).map_err(dl_err)?;
        let mut t = dlpark::metadata::Fixed::new([len], [1i64])
            .initialize(Box::new(self))
            .map_err(dl_err)?;
        t.set_data(data).set_device(device).set_dtype(dtype);
        // SAFETY: `data` is the buffer's memory (kept alive by the context, the
        // buffer itself), `len` elements of `dtype` on `device`, with explicit
        // compact strides; nothing else aliases it once the buffer is moved in.
        Ok(unsafe { t.finish() })
    }

    /// The DLPack tensor `tensor` as a buffer on `device`, zero-copy: it must be a
    /// compact (contiguous) tensor of `T` on `device` (CPU tensors for the CPU and
    /// the emulator); its shape is flattened. The buffer owns the tensor and calls
    /// its deleter when the buffer and its launches are done.
    pub fn from_dlpack(
        device: &Device,
        tensor: dlpark::versioned::Dlpack,
    ) -> Result<Buffer<T>, Error> {
        let want =
            dl_dtype(T::TY).ok_or_else(|| dl_err(format!("no DLPack type for {}", T::TY)))?;
        if tensor.flags().contains(dlpark::DlpackFlags::READ_ONLY) {
            return Err(dl_err(
                "the tensor is read-only; Tessera buffers are writable",
            ));
        }
        let (ptr, len) = {
            let t = tensor.validate().map_err(dl_err)?;
            if !t.dtype().matches(want) {
                return Err(dl_err(format!(
                    "the tensor's element type is {:?}, the buffer's {} ({:?})",
                    t.dtype(),
                    T::TY,
                    want
                )));
            }
            let dev = t.device();
            if (dev.device_type, dev.device_id) != {
                let d = device.dl_device();
                (d.device_type, d.device_id)
            } {
                return Err(dl_err(format!(
                    "the tensor is on DLPack device ({}, {}), not on {}",
                    dev.device_type.0,
                    dev.device_id,
                    device.id()
                )));
            }
            if !t.is_compact().map_err(dl_err)? {
                return Err(dl_err("the tensor is not contiguous (compact row-major)"));
            }
            let base = t.data_ptr() as u64;
            let ptr = base
                .checked_add(t.byte_offset())
                .ok_or_else(|| dl_err("the data pointer plus offset overflows"))?;
            (ptr, t.num_elements())
        };
        // SAFETY: the tensor describes `len` elements of `T` at `ptr` on `device`
        // (checked above: type, device, compactness), kept alive by the tensor, which
        // the buffer owns; DLPack hands the consumer the tensor's data.
        unsafe { device.wrap::<T>(ptr, len, tensor) }
    }
}

//! The CUDA backend: cudarc's driver API, with `libcuda` loaded at run time.
//!
//! cudarc panics when it cannot load `libcuda`, so every entry point here first
//! checks [`driver_present`] and turns a missing driver into
//! [`Error::DeviceUnavailable`]. Each device has one context (the primary context),
//! one stream (its default stream: see [`crate::Device`]) and a cache of loaded
//! modules keyed by the kernel's [`crate::disk_cache::CacheKey`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg, sys,
};
use cudarc::nvrtc::Ptx;

use crate::Error;
use crate::artifact::KernelBinary;
use crate::device::DeviceProperties;
use crate::launch::GpuArg;

/// The message every CUDA entry point gives on a machine without the driver.
pub(crate) const NO_DRIVER: &str = "no CUDA driver found (libcuda.so could not be loaded)";

/// True when `libcuda` can be loaded (then cudarc's calls do not panic).
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The number of CUDA devices (0 without a driver or when `cuInit` fails).
pub(crate) fn count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

fn driver_err(device: usize, what: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
    let what = what.into();
    move |e| Error::Driver {
        device: format!("cuda:{device}"),
        what,
        message: describe(&e),
    }
}

fn describe(e: &DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("{e:?}"),
    }
}

/// One loaded kernel.
pub(crate) struct CudaKernel {
    func: CudaFunction,
    bin: KernelBinary,
}

/// An open CUDA device.
pub(crate) struct CudaDevice {
    pub(crate) ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pub(crate) props: DeviceProperties,
    kernels: Mutex<HashMap<String, Arc<CudaKernel>>>,
    /// A non-blocking stream for control-word writes (created on first use).
    control: Mutex<Option<Arc<CudaStream>>>,
    /// Tensor maps built for launches, by their bytes: device copies a kernel reads
    /// through `cp.async.bulk.tensor` (kept, since a kernel in flight may read one).
    tensor_maps: Mutex<HashMap<Vec<u8>, CudaSlice<u8>>>,
}

/// Device memory (at least one byte is allocated, so empty buffers are valid too).
pub(crate) struct CudaBuf {
    pub(crate) mem: CudaMem,
    pub(crate) dev: Arc<CudaDevice>,
}

/// Where a [`CudaBuf`]'s bytes are.
pub(crate) enum CudaMem {
    /// An allocation of its own.
    Owned(CudaSlice<u8>),
    /// A range of memory owned elsewhere (a symmetric heap: cudarc's `CudaSlice`
    /// cannot view a raw range), kept alive by `_owner`.
    View {
        ptr: u64,
        bytes: usize,
        _owner: Arc<dyn Send + Sync>,
    },
}

impl CudaBuf {
    /// A view of `bytes` bytes at device address `ptr`, valid while `owner` lives.
    pub(crate) fn view(
        dev: Arc<CudaDevice>,
        ptr: u64,
        bytes: usize,
        owner: Arc<dyn Send + Sync>,
    ) -> CudaBuf {
        CudaBuf {
            mem: CudaMem::View {
                ptr,
                bytes,
                _owner: owner,
            },
            dev,
        }
    }

    /// The device address.
    pub(crate) fn address(&self) -> u64 {
        match &self.mem {
            CudaMem::Owned(s) => self.dev.address(s),
            CudaMem::View { ptr, .. } => *ptr,
        }
    }

    /// Size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        match &self.mem {
            CudaMem::Owned(s) => s.len(),
            CudaMem::View { bytes, .. } => *bytes,
        }
    }
}

/// The compilation target for compute capability `major.minor`: PTX for the newest
/// known architecture not above it (PTX is JIT-compiled forward by the driver).
pub(crate) fn target_for(major: u32, minor: u32) -> Option<&'static str> {
    match major * 10 + minor {
        // sm_90a code runs on 9.0 only (architecture-specific PTX is not forward
        // compatible); later GPUs JIT the portable sm_90 PTX.
        90 => Some("sm_90a"),
        91.. => Some("sm_90"),
        89 => Some("sm_89"),
        86..=88 => Some("sm_86"),
        80..=85 => Some("sm_80"),
        _ => None,
    }
}

/// Opens CUDA device `ordinal` (once per process; later calls share it).
pub(crate) fn open(ordinal: usize) -> Result<Arc<CudaDevice>, Error> {
    let name = format!("cuda:{ordinal}");
    if !driver_present() {
        return Err(Error::DeviceUnavailable {
            device: name,
            reason: NO_DRIVER.into(),
        });
    }
    static OPEN: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    let open = OPEN.get_or_init(|| Mutex::new(HashMap::new()));
    let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = open.get(&ordinal) {
        return Ok(d.clone());
    }
    let n = CudaContext::device_count().map_err(|e| Error::DeviceUnavailable {
        device: name.clone(),
        reason: format!("the CUDA driver failed to initialize: {}", describe(&e)),
    })?;
    if ordinal >= n.max(0) as usize {
        return Err(Error::DeviceUnavailable {
            device: name,
            reason: format!("{n} CUDA device(s) present"),
        });
    }
    let ctx = CudaContext::new(ordinal).map_err(driver_err(ordinal, "creating a context"))?;
    let attr = |a| {
        ctx.attribute(a)
            .map(|v| v.max(0) as u64)
            .map_err(driver_err(ordinal, "querying device attributes"))
    };
    use sys::CUdevice_attribute as A;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(driver_err(ordinal, "querying the compute capability"))?;
    let (major, minor) = (major.max(0) as u32, minor.max(0) as u32);
    let target = target_for(major, minor).ok_or_else(|| Error::DeviceUnavailable {
        device: format!("cuda:{ordinal}"),
        reason: format!("compute capability {major}.{minor} is below Tessera's minimum, 8.0"),
    })?;
    let props = DeviceProperties {
        name: ctx
            .name()
            .map_err(driver_err(ordinal, "querying the name"))?,
        target: target.to_string(),
        compute_capability: Some((major, minor)),
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        warp_size: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)? as u32,
        shared_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)? as usize,
        shared_per_block_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as usize,
        total_memory: ctx
            .total_mem()
            .map_err(driver_err(ordinal, "querying the memory size"))?,
    };
    let dev = Arc::new(CudaDevice {
        ordinal,
        stream: ctx.default_stream(),
        ctx,
        props,
        kernels: Mutex::new(HashMap::new()),
        tensor_maps: Mutex::new(HashMap::new()),
        control: Mutex::new(None),
    });
    open.insert(ordinal, dev.clone());
    Ok(dev)
}

impl CudaDevice {
    fn err(&self, what: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
        driver_err(self.ordinal, what)
    }

    /// A zero-filled allocation of `bytes` bytes.
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<CudaBuf, Error> {
        let slice = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(self.err(format!("allocating {bytes} bytes")))?;
        Ok(CudaBuf {
            mem: CudaMem::Owned(slice),
            dev: self.clone(),
        })
    }

    /// An allocation holding `data`.
    pub(crate) fn upload(self: &Arc<Self>, data: &[u8]) -> Result<CudaBuf, Error> {
        let mut buf = self.alloc(data.len())?;
        self.write(&mut buf, data)?;
        Ok(buf)
    }

    /// Copies `data` to the start of `dst` (at most its size).
    pub(crate) fn write(&self, dst: &mut CudaBuf, data: &[u8]) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        match &mut dst.mem {
            CudaMem::Owned(s) => self
                .stream
                .memcpy_htod(data, s)
                .map_err(self.err("copying to the device")),
            CudaMem::View { ptr, bytes, .. } => {
                let n = data.len().min(*bytes);
                self.htod(*ptr, &data[..n])
            }
        }
    }

    /// The first `bytes` bytes of `src` (waits for the stream).
    pub(crate) fn read(&self, src: &CudaBuf, bytes: usize) -> Result<Vec<u8>, Error> {
        match &src.mem {
            CudaMem::Owned(s) => {
                let mut v = self
                    .stream
                    .clone_dtoh(s)
                    .map_err(self.err("copying to the host"))?;
                v.truncate(bytes);
                Ok(v)
            }
            CudaMem::View {
                ptr, bytes: len, ..
            } => self.dtoh(*ptr, bytes.min(*len)),
        }
    }

    /// Copies `data` to device address `dst` on the stream (after the work queued
    /// before it); waits for the copy, since `data` is pageable host memory.
    pub(crate) fn htod(&self, dst: u64, data: &[u8]) -> Result<(), Error> {
        let what = "copying to the device";
        self.ctx.bind_to_thread().map_err(self.err(what))?;
        // SAFETY: the caller guarantees `dst` is device memory of at least
        // `data.len()` bytes, alive; `data` lives until the stream is synchronized.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, data, self.stream.cu_stream())
                .map_err(self.err(what))?;
        }
        self.synchronize()
    }

    /// The device address of a tensor map (`cuTensorMapEncodeTiled`) of the tensor
    /// at device address `base` with `elem_bytes`-byte elements, `dims` and element
    /// `strides` (outermost first, the last stride 1), read in boxes of `box_dims`
    /// (outermost first) with the `swizzle`-byte swizzle (32, 64 or 128), zero fill.
    pub(crate) fn tensor_map(
        self: &Arc<Self>,
        base: u64,
        elem_bytes: u32,
        dims: &[u64],
        strides: &[u64],
        box_dims: &[u32],
        swizzle: u32,
    ) -> Result<u64, Error> {
        use cudarc::driver::sys;
        let what = "building a tensor map (cuTensorMapEncodeTiled)";
        let r = dims.len();
        let dt = match elem_bytes {
            1 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            2 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        };
        let sw = match swizzle {
            128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        };
        // The driver takes dimensions innermost first, and the byte strides of
        // dimensions 1.. only.
        let gdim: Vec<u64> = dims.iter().rev().copied().collect();
        let gstride: Vec<u64> = strides
            .iter()
            .rev()
            .skip(1)
            .map(|&s| s * elem_bytes as u64)
            .collect();
        let bdim: Vec<u32> = box_dims.iter().rev().copied().collect();
        let estride = vec![1u32; r];
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        self.ctx.bind_to_thread().map_err(self.err(what))?;
        // SAFETY: `map` is a writable 64-byte aligned `CUtensorMap`; the arrays hold
        // `r` (`r - 1` for the strides) entries, as the call's rank says.
        let res = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                dt,
                r as u32,
                base as *mut std::ffi::c_void,
                gdim.as_ptr(),
                gstride.as_ptr(),
                bdim.as_ptr(),
                estride.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sw,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if res != sys::CUresult::CUDA_SUCCESS {
            return Err(self.err(what)(cudarc::driver::DriverError(res)));
        }
        // SAFETY: the driver wrote the map; it is plain bytes.
        let map = unsafe { map.assume_init() };
        let bytes: Vec<u8> = map.opaque.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut maps = self.tensor_maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = maps.get(&bytes) {
            return Ok(self.address(b));
        }
        if maps.len() >= 4096 {
            // Kernels launched earlier may still read the maps: let them finish.
            self.synchronize()?;
            maps.clear();
        }
        let mut slice = self
            .stream
            .alloc_zeros::<u8>(bytes.len())
            .map_err(self.err(what))?;
        self.stream
            .memcpy_htod(&bytes, &mut slice)
            .map_err(self.err(what))?;
        let addr = self.address(&slice);
        maps.insert(bytes, slice);
        Ok(addr)
    }

    /// `bytes` bytes from device address `src`, after the work queued on the stream.
    pub(crate) fn dtoh(&self, src: u64, bytes: usize) -> Result<Vec<u8>, Error> {
        let what = "copying to the host";
        let mut out = vec![0u8; bytes];
        if bytes == 0 {
            return Ok(out);
        }
        self.ctx.bind_to_thread().map_err(self.err(what))?;
        // SAFETY: the caller guarantees `src` is device memory of at least `bytes`
        // bytes; `out` lives until the stream is synchronized below.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut out, src, self.stream.cu_stream())
                .map_err(self.err(what))?;
        }
        self.synchronize()?;
        Ok(out)
    }

    /// A zeroed allocation of `bytes` bytes made with `cuMemAlloc` (not the stream
    /// pool cudarc uses: pool memory cannot be exported with `cuIpcGetMemHandle`).
    /// Free with [`CudaDevice::free_raw`].
    pub(crate) fn alloc_raw(&self, bytes: usize) -> Result<u64, Error> {
        let what = format!("allocating a symmetric heap of {bytes} bytes");
        self.ctx.bind_to_thread().map_err(self.err(what.clone()))?;
        // SAFETY: plain allocation in the bound context.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }
            .map_err(self.err(what.clone()))?;
        // SAFETY: `ptr` holds `bytes.max(1)` bytes.
        if let Err(e) = unsafe { cudarc::driver::result::memset_d8_sync(ptr, 0, bytes.max(1)) } {
            self.free_raw(ptr);
            return Err(self.err(what)(e));
        }
        // The zeroes must land before a peer (another process) can see the heap; and
        // create the control stream now: creating it later (cudarc's `new_stream`)
        // would synchronize the context, i.e. wait for a kernel that is waiting.
        let ready = self
            .synchronize()
            .and_then(|_| self.control_stream().map(|_| ()));
        if let Err(e) = ready {
            self.free_raw(ptr);
            return Err(e);
        }
        Ok(ptr)
    }

    /// Frees an [`CudaDevice::alloc_raw`] allocation (errors are ignored: this runs
    /// in destructors).
    pub(crate) fn free_raw(&self, ptr: u64) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `alloc_raw`, freed once.
            let _ = unsafe { cudarc::driver::result::free_sync(ptr) };
        }
    }

    /// The IPC handle of an [`CudaDevice::alloc_raw`] allocation.
    pub(crate) fn ipc_handle(&self, ptr: u64) -> Result<Vec<u8>, Error> {
        let what = "exporting the heap (cuIpcGetMemHandle)";
        self.ctx.bind_to_thread().map_err(self.err(what))?;
        // SAFETY: zeroed plain data, written by the driver.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: `ptr` is the base of a cuMemAlloc allocation.
        unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) }
            .result()
            .map_err(self.err(what))?;
        Ok(h.reserved.iter().map(|&c| c as u8).collect())
    }

    /// Opens another process's IPC handle: the allocation's address in this context.
    /// Close with [`CudaDevice::ipc_close`].
    pub(crate) fn ipc_open(&self, handle: &[u8]) -> Result<u64, Error> {
        let what = "opening a peer's heap (cuIpcOpenMemHandle)";
        // SAFETY: zeroed plain data.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        if handle.len() != h.reserved.len() {
            return Err(Error::Driver {
                device: format!("cuda:{}", self.ordinal),
                what: what.into(),
                message: format!("an IPC handle of {} bytes, 64 expected", handle.len()),
            });
        }
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as _;
        }
        self.ctx.bind_to_thread().map_err(self.err(what))?;
        let mut ptr = 0;
        // SAFETY: a handle made by cuIpcGetMemHandle in another process.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .map_err(self.err(what))?;
        Ok(ptr)
    }

    /// Closes an address opened by [`CudaDevice::ipc_open`] (errors ignored).
    pub(crate) fn ipc_close(&self, ptr: u64) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: opened by `ipc_open`, closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
        }
    }

    /// Writes the 32-bit `value` at device address `dst` on a separate non-blocking
    /// stream, so that it lands while a kernel is running on the default stream (used
    /// to raise a heap's abort word under a kernel that waits).
    pub(crate) fn poke_u32(&self, dst: u64, value: u32) -> Result<(), Error> {
        let what = "raising the abort word";
        let stream = self.control_stream()?;
        // Called from watchdog threads too: make the context current.
        self.ctx.bind_to_thread().map_err(self.err(what))?;
        // SAFETY: `dst` is 4 bytes of live device memory (a heap's control word).
        unsafe { sys::cuMemsetD32Async(dst, value, 1, stream.cu_stream()) }
            .result()
            .map_err(self.err(what))?;
        stream.synchronize().map_err(self.err(what))
    }

    fn control_stream(&self) -> Result<Arc<CudaStream>, Error> {
        let mut g = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = &*g {
            return Ok(s.clone());
        }
        let s = self
            .ctx
            .new_stream()
            .map_err(self.err("creating a control stream"))?;
        *g = Some(s.clone());
        Ok(s)
    }

    /// Copies `src` (on this or another CUDA device: a peer copy) into `dst` on this
    /// device, on this device's stream.
    pub(crate) fn copy_device(&self, src: &CudaBuf, dst: &mut CudaBuf) -> Result<(), Error> {
        // The source's stream may still be writing it.
        if !Arc::ptr_eq(&src.dev, &dst.dev) {
            src.dev.synchronize()?;
        }
        let what = "copying between devices";
        if let (CudaMem::Owned(s), CudaMem::Owned(d)) = (&src.mem, &mut dst.mem) {
            return self.stream.memcpy_dtod(s, d).map_err(self.err(what));
        }
        let n = src.bytes().min(dst.bytes());
        self.ctx.bind_to_thread().map_err(self.err(what))?;
        // SAFETY: both ranges are live device memory of at least `n` bytes (unified
        // addressing makes a peer's address valid here after peer access).
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.address(),
                src.address(),
                n,
                self.stream.cu_stream(),
            )
        }
        .map_err(self.err(what))
    }

    /// The raw device address of `s`.
    pub(crate) fn address(&self, s: &CudaSlice<u8>) -> u64 {
        let (ptr, _sync) = s.device_ptr(&self.stream);
        ptr
    }

    pub(crate) fn synchronize(&self) -> Result<(), Error> {
        self.stream
            .synchronize()
            .map_err(self.err("synchronizing the stream"))
    }

    pub(crate) fn time<R>(
        &self,
        f: impl FnOnce() -> Result<R, Error>,
    ) -> Result<(R, Duration), Error> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .ctx
            .new_event(flags)
            .map_err(self.err("creating an event"))?;
        let end = self
            .ctx
            .new_event(flags)
            .map_err(self.err("creating an event"))?;
        start
            .record(&self.stream)
            .map_err(self.err("recording an event"))?;
        let r = f()?;
        end.record(&self.stream)
            .map_err(self.err("recording an event"))?;
        end.synchronize()
            .map_err(self.err("waiting for an event"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(self.err("reading an event's time"))?;
        Ok((r, Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3)))
    }

    pub(crate) fn enable_peer_access(&self, other: &CudaDevice) -> Result<(), Error> {
        let what = format!("enabling peer access to cuda:{}", other.ordinal);
        self.ctx.bind_to_thread().map_err(self.err(what.clone()))?;
        // SAFETY: both contexts are alive (held by the devices).
        let r = unsafe { sys::cuCtxEnablePeerAccess(other.ctx.cu_ctx(), 0) };
        match r {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            e => Err(self.err(what)(DriverError(e))),
        }
    }

    /// The loaded kernel with key `key`, loading `bin()`'s PTX on first use.
    pub(crate) fn kernel(
        &self,
        key: &str,
        bin: impl FnOnce() -> Result<KernelBinary, Error>,
    ) -> Result<Arc<CudaKernel>, Error> {
        if let Some(k) = self.lock_kernels().get(key) {
            return Ok(k.clone());
        }
        let bin = bin()?;
        let what = format!("loading kernel `{}` ({})", bin.name, bin.target);
        let src = String::from_utf8(bin.binary.clone())
            .ok()
            .filter(|s| !s.contains('\0'))
            .ok_or_else(|| Error::Artifact {
                path: format!("kernel `{}`", bin.name),
                reason: "the PTX is not NUL-free UTF-8 text".into(),
            })?;
        if bin.name.contains('\0') {
            return Err(Error::Artifact {
                path: format!("kernel `{}`", bin.name),
                reason: "the entry name contains NUL".into(),
            });
        }
        let module = match self.ctx.load_module(Ptx::from_src(src.clone())) {
            Ok(m) => m,
            Err(e) => {
                // The driver's own words on the PTX it refused, if it has any.
                let mut err = self.err(what.clone())(e);
                if let (Error::Driver { message, .. }, Some(log)) =
                    (&mut err, self.jit_error_log(&src))
                {
                    message.push_str("; the driver's JIT log: ");
                    message.push_str(log.trim());
                }
                return Err(err);
            }
        };
        let func = module
            .load_function(&bin.name)
            .map_err(self.err(what.clone()))?;
        if bin.shared_bytes > crate::artifact::DYNAMIC_SHARED_PAST {
            // Dynamic shared memory past 48 KiB needs the kernel's opt-in.
            func.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bin.shared_bytes as i32,
            )
            .map_err(self.err(what))?;
        }
        let k = Arc::new(CudaKernel { func, bin });
        Ok(self
            .lock_kernels()
            .entry(key.to_string())
            .or_insert(k)
            .clone())
    }

    /// The error log of the driver's PTX JIT for `ptx` (why it refuses the module),
    /// or `None` when it loads or says nothing.
    fn jit_error_log(&self, ptx: &str) -> Option<String> {
        let ptx = std::ffi::CString::new(ptx).ok()?;
        self.ctx.bind_to_thread().ok()?;
        let mut log = vec![0u8; 16 * 1024];
        let mut opts = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // The size option's value is the integer itself, in the pointer slot.
        let mut vals: [*mut std::ffi::c_void; 2] = [
            log.as_mut_ptr() as *mut std::ffi::c_void,
            log.len() as *mut std::ffi::c_void,
        ];
        let mut module = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image; two options whose values are a buffer
        // and its size, the driver writing at most that many bytes into it; the
        // context is current on this thread.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                ptx.as_ptr() as *const std::ffi::c_void,
                opts.len() as u32,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        if r == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: loaded just above, unloaded once.
            unsafe { sys::cuModuleUnload(module) };
            return None;
        }
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        (end > 0).then(|| String::from_utf8_lossy(&log[..end]).into_owned())
    }

    fn lock_kernels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<CudaKernel>>> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Launches `k` on the stream: `grid` blocks of `num_threads` threads, with the
    /// parameters in order (device addresses and scalars by value).
    pub(crate) fn launch(
        &self,
        k: &CudaKernel,
        grid: [u32; 3],
        args: &[GpuArg],
        waits: bool,
    ) -> Result<(), Error> {
        let what = format!("launching kernel `{}`", k.bin.name);
        let shared = k.bin.shared_bytes as usize;
        crate::launch::check_grid(
            &k.bin.name,
            crate::launch::GridLimits::Cuda,
            grid,
            k.bin.num_threads,
        )?;
        let dynamic = if k.bin.shared_bytes > crate::artifact::DYNAMIC_SHARED_PAST {
            shared
        } else {
            0
        };
        if waits {
            let per_sm = k
                .func
                .occupancy_max_active_blocks_per_multiprocessor(k.bin.num_threads, dynamic, None)
                .map_err(self.err(format!("querying the occupancy of `{}`", k.bin.name)))?;
            let programs = grid.iter().map(|&g| g as u64).product();
            crate::launch::check_resident(
                &k.bin.name,
                &self.props.name,
                programs,
                per_sm,
                self.props.multiprocessors,
            )?;
        }
        if shared > self.props.shared_per_block_optin {
            return Err(Error::Launch {
                kernel: k.bin.name.clone(),
                reason: format!(
                    "it needs {shared} bytes of shared memory, {} has {} per block",
                    self.props.name, self.props.shared_per_block_optin
                ),
            });
        }
        let mut b = self.stream.launch_builder(&k.func);
        for a in args {
            match a {
                GpuArg::U8(v) => b.arg(v),
                GpuArg::U16(v) => b.arg(v),
                GpuArg::U32(v) => b.arg(v),
                GpuArg::U64(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid[0], grid[1], grid[2]),
            block_dim: (k.bin.num_threads, 1, 1),
            // Declared in the PTX up to 48 KiB, dynamic past it (`KernelBinary`).
            shared_mem_bytes: dynamic as u32,
        };
        // SAFETY: the arguments match the kernel's parameters in number and size
        // (checked against the IR by `launch`), device addresses belong to live
        // buffers of this device borrowed for the call, and the kernel's accesses
        // are bounds-masked by construction.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(self.err(what))
    }
}

#[cfg(test)]
mod target_tests {
    use super::target_for;

    /// Compute capability 9.0 gets the architecture-specific sm_90a (wgmma), which
    /// only 9.0 runs; newer GPUs the portable sm_90 PTX, older ones their own.
    #[test]
    fn capabilities_map_to_targets() {
        assert_eq!(target_for(9, 0), Some("sm_90a"));
        assert_eq!(target_for(10, 0), Some("sm_90"));
        assert_eq!(target_for(8, 9), Some("sm_89"));
        assert_eq!(target_for(8, 6), Some("sm_86"));
        assert_eq!(target_for(8, 0), Some("sm_80"));
        assert_eq!(target_for(7, 5), None);
    }
}

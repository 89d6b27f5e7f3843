//! The CUDA backend: cudarc's driver API, with `libcuda` loaded at run time.
//!
//! cudarc panics when it cannot load `libcuda`, so every entry point here first
//! checks [`driver_present`] and turns a missing driver into
//! [`Error::DeviceUnavailable`]. Each device has one context (the primary context),
//! whose legacy null stream is its default stream (see [`crate::Device`]), and a
//! cache of loaded modules keyed by the kernel's [`crate::disk_cache::CacheKey`].
//! Buffers come from the stream-ordered pool (`cuMemAllocAsync`) where the device has
//! one, symmetric heaps from `cuMemAlloc` (exportable).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaFunction, DriverError, result, sys};
use cudarc::nvrtc::Ptx;

use super::{
    DYNAMIC_SHARED_PAST, GpuArg, GpuBackend, GpuKernel, GridLimits, KernelBinary, RawEvent,
    RawStream, TensorMap, TensorMapSpec, before_copy, downcast_kernel,
};
use crate::error::Error;
use crate::properties::{DeviceKind, DeviceProperties};

mod green;

/// The message every CUDA entry point gives on a machine without the driver.
pub(crate) const NO_DRIVER: &str = "no CUDA driver found (libcuda.so could not be loaded)";

/// True when `libcuda` can be loaded (then cudarc's calls do not panic).
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The driver's CUDA API version (`(13, 0)` for 13000), if it says.
fn driver_version() -> Option<(u32, u32)> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: called after the driver loaded and a context exists; the driver writes
    // one int.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    (r == sys::CUresult::CUDA_SUCCESS && v > 0).then_some((v as u32 / 1000, (v as u32 % 1000) / 10))
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

/// The error of allocating `bytes` bytes on device `device`: [`Error::OutOfMemory`] for
/// `CUDA_ERROR_OUT_OF_MEMORY`, [`Error::Driver`] (doing `what`) for the others.
fn alloc_err(device: usize, bytes: usize, what: String) -> impl FnOnce(DriverError) -> Error {
    move |e| {
        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            Error::OutOfMemory {
                bytes: bytes as u64,
                device: format!("cuda:{device}"),
            }
        } else {
            driver_err(device, what)(e)
        }
    }
}

fn describe(e: &DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
        _ => format!("{e:?}"),
    }
}

/// Whether PTX `ptx` was linked with NVSHMEM's device library: it defines NVSHMEM's
/// device state (`nvshmemi_device_state_d` and the like), which the host must fill
/// with `nvshmemx_cumodule_init` after loading the module and before its kernels run.
pub(crate) fn links_nvshmem(ptx: &str) -> bool {
    ptx.lines()
        .any(|l| l.contains(".const") && l.contains(" nvshmemi_device_state_d"))
}

/// What initializes a module linked with NVSHMEM ([`links_nvshmem`]): set by the
/// process's NVSHMEM session while it lives (`world::nvshmem`), `None` otherwise.
pub(crate) type ModuleInit = Arc<dyn Fn(sys::CUmodule) -> Result<(), String> + Send + Sync>;

static MODULE_INIT: Mutex<Option<ModuleInit>> = Mutex::new(None);

/// Sets (or, with `None`, clears) the process's [`ModuleInit`].
pub(crate) fn set_module_init(init: Option<ModuleInit>) {
    *MODULE_INIT.lock().unwrap_or_else(|e| e.into_inner()) = init;
}

/// One loaded kernel.
pub(crate) struct CudaKernel {
    func: CudaFunction,
    bin: KernelBinary,
}

impl GpuKernel for CudaKernel {
    fn binary(&self) -> &KernelBinary {
        &self.bin
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An open CUDA device.
pub(crate) struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    props: DeviceProperties,
    /// Whether the device has stream-ordered allocation (`cuMemAllocAsync`).
    async_alloc: bool,
    kernels: Mutex<HashMap<String, Arc<CudaKernel>>>,
    /// A non-blocking stream for control-word writes (created with the first heap).
    control: Mutex<Option<Stream>>,
    /// Tensor maps built for launches, by their bytes: device copies a kernel reads
    /// through `cp.async.bulk.tensor` (kept, since a kernel in flight may read one).
    tensor_maps: Mutex<HashMap<Vec<u8>, Arc<MapMemory>>>,
    /// A part of the device in a green context of its own ([`green`]): the device in
    /// its primary context, which raises abort words (a green context may be current
    /// on one thread at a time; the part's rank thread uses it).
    parent: Option<Arc<CudaDevice>>,
    /// The green context, destroyed last (after the modules loaded in it).
    _green: Option<green::GreenCtx>,
}

/// The device memory of one tensor map, freed (in stream order) when the last
/// handle goes: the cache's, or a launch's that was handed it.
struct MapMemory {
    ptr: u64,
    ctx: Arc<CudaContext>,
    async_alloc: bool,
}

impl Drop for MapMemory {
    fn drop(&mut self) {
        // SAFETY: the context is alive (held here); the map was allocated by
        // `CudaDevice::alloc` in it and is freed once, after the work queued before
        // on the legacy stream (which waits for the blocking streams' work).
        unsafe {
            if result::ctx::set_current(self.ctx.cu_ctx()).is_ok() {
                let _ = if self.async_alloc {
                    result::free_async(self.ptr, std::ptr::null_mut())
                } else {
                    result::free_sync(self.ptr)
                };
            }
        }
    }
}

/// A raw stream handle, usable from any thread.
#[derive(Clone, Copy)]
struct Stream(sys::CUstream);
// SAFETY: a CUstream is a handle the driver accepts from any thread.
unsafe impl Send for Stream {}

fn cu_stream(s: RawStream) -> sys::CUstream {
    s.0 as usize as sys::CUstream
}

fn cu_event(e: RawEvent) -> sys::CUevent {
    e.0 as usize as sys::CUevent
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
        driver_version: driver_version(),
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        warp_size: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)? as u32,
        shared_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)? as usize,
        shared_per_block_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as usize,
        total_memory: ctx
            .total_mem()
            .map_err(driver_err(ordinal, "querying the memory size"))?,
        part: None,
    };
    // SAFETY: reads one attribute of a valid device.
    let async_alloc = unsafe {
        result::device::get_attribute(
            ctx.cu_device(),
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        )
    }
    .is_ok_and(|v| v > 0);
    let dev = Arc::new(CudaDevice {
        ordinal,
        ctx,
        props,
        async_alloc,
        kernels: Mutex::new(HashMap::new()),
        tensor_maps: Mutex::new(HashMap::new()),
        control: Mutex::new(None),
        parent: None,
        _green: None,
    });
    open.insert(ordinal, dev.clone());
    Ok(dev)
}
impl CudaDevice {
    fn err(&self, what: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
        driver_err(self.ordinal, what)
    }

    /// The device's context (the primary context).
    pub(crate) fn cu_ctx(&self) -> sys::CUcontext {
        self.ctx.cu_ctx()
    }

    /// Makes the device's context current on this thread (for libraries that use the
    /// current context, such as NVSHMEM's host library).
    pub(crate) fn make_current(&self) -> Result<(), Error> {
        self.bind("binding its context")
    }

    /// Makes the context current on this thread (every entry point may be called
    /// from any thread: watchdogs, rank threads).
    fn bind(&self, what: &str) -> Result<(), Error> {
        self.ctx.bind_to_thread().map_err(self.err(what))
    }

    /// Makes the context current for a cleanup call (a free, a destroy): unlike
    /// [`CudaDevice::bind`], it does not take an error cudarc stored in the context
    /// earlier, which would skip the cleanup and leak.
    fn bind_for_cleanup(&self) -> bool {
        // SAFETY: the context is alive (held by `self.ctx`).
        unsafe { result::ctx::set_current(self.ctx.cu_ctx()) }.is_ok()
    }

    fn control_stream(&self) -> Result<Stream, Error> {
        let mut g = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = *g {
            return Ok(s);
        }
        let what = "creating a control stream";
        self.bind(what)?;
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(self.err(what))?;
        *g = Some(Stream(s));
        Ok(Stream(s))
    }

    /// Copies `data` into a new device allocation (the tensor maps' storage).
    fn upload_raw(&self, data: &[u8]) -> Result<u64, Error> {
        let ptr = self.alloc(data.len().max(1), RawStream::DEFAULT)?;
        if let Err(e) = self.htod(ptr, data, RawStream::DEFAULT) {
            self.free(ptr, RawStream::DEFAULT);
            return Err(e);
        }
        Ok(ptr)
    }

    /// Loads a cubin that `tileiras` compiled from Tile IR (a `tileir-sm_*` binary):
    /// no PTX JIT and no NVSHMEM; the launch takes a block of (1, 1, 1), the Tile IR
    /// convention ([`KernelBinary::num_threads`] is 1).
    fn load_cubin(
        &self,
        key: &str,
        bin: KernelBinary,
        what: &str,
    ) -> Result<Arc<dyn GpuKernel>, Error> {
        if !bin.binary.starts_with(b"\x7fELF") {
            return Err(Error::Artifact {
                path: format!("kernel `{}`", bin.name),
                reason: format!("the {} binary is not a cubin (ELF)", bin.target),
            });
        }
        let module = self
            .ctx
            .load_module(Ptx::from_binary(bin.binary.clone()))
            .map_err(self.err(what.to_string()))?;
        let func = module
            .load_function(&bin.name)
            .map_err(self.err(what.to_string()))?;
        Ok(self.keep_kernel(key, CudaKernel { func, bin }))
    }

    /// `k` under `key` in the loaded kernels (the first loaded wins a race).
    fn keep_kernel(&self, key: &str, k: CudaKernel) -> Arc<dyn GpuKernel> {
        self.lock_kernels()
            .entry(key.to_string())
            .or_insert(Arc::new(k))
            .clone()
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

    /// Initializes NVSHMEM's device state in the module of `func` (a kernel linked
    /// with NVSHMEM's device library) through the process's NVSHMEM session.
    fn init_nvshmem_module(&self, func: &CudaFunction, kernel: &str) -> Result<(), Error> {
        let init = MODULE_INIT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Error::Launch {
                kernel: kernel.to_string(),
                reason: "it is linked with NVSHMEM's device library (compiled for a world across nodes), but NVSHMEM is not initialized in this process: launch it on a rank of an NVSHMEM world (World::nvshmem)".into(),
            })?;
        let what = format!("finding the module of kernel `{kernel}`");
        self.bind(&what)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `func` is a live function of a module loaded in the bound context;
        // the driver writes the module's handle into `module`.
        let r = unsafe { sys::cuFuncGetModule(&mut module, func.cu_function()) };
        r.result().map_err(self.err(what))?;
        init(module).map_err(|reason| Error::Launch {
            kernel: kernel.to_string(),
            reason: format!("initializing NVSHMEM in its module: {reason}"),
        })
    }

    fn lock_kernels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<CudaKernel>>> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Dynamic shared memory a launch of `bin` passes (declared in the PTX up to
    /// 48 KiB, dynamic past it: [`KernelBinary`]).
    /// Launches `k` in thread-block clusters of `cluster` blocks
    /// (`cuLaunchKernelEx` with the cluster-dimension attribute), after asking the
    /// driver how many such clusters fit at once (`cuOccupancyMaxActiveClusters`):
    /// none (a cluster's shared memory or threads exceed what one GPC holds) is an
    /// error naming the limit. The context is bound.
    fn launch_clusters(
        &self,
        k: &CudaKernel,
        grid: [u32; 3],
        cluster: [u32; 3],
        params: &mut [*mut std::ffi::c_void],
        stream: RawStream,
    ) -> Result<(), Error> {
        let what = format!("launching kernel `{}` in clusters", k.bin.name);
        // SAFETY: a plain-data union; the cluster dimension is the member the
        // attribute's id selects.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.clusterDim.x = cluster[0];
        value.clusterDim.y = cluster[1];
        value.clusterDim.z = cluster[2];
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value,
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid[0],
            gridDimY: grid[1],
            gridDimZ: grid[2],
            blockDimX: k.bin.num_threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: Self::dynamic_shared(&k.bin) as u32,
            hStream: cu_stream(stream),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut fit = 0i32;
        // SAFETY: `config` and the attribute it points to live across the call; the
        // function belongs to this (bound) context.
        let r =
            unsafe { sys::cuOccupancyMaxActiveClusters(&mut fit, k.func.cu_function(), &config) };
        if r != sys::CUresult::CUDA_SUCCESS || fit < 1 {
            return Err(Error::Launch {
                kernel: k.bin.name.clone(),
                reason: format!(
                    "{} cannot hold a cluster of {}x{}x{} blocks of {} threads with {} bytes of shared memory each at once ({}; use a smaller cluster)",
                    self.props.name,
                    cluster[0],
                    cluster[1],
                    cluster[2],
                    k.bin.num_threads,
                    k.bin.shared_bytes,
                    if r == sys::CUresult::CUDA_SUCCESS {
                        "cuOccupancyMaxActiveClusters: 0".to_string()
                    } else {
                        format!("cuOccupancyMaxActiveClusters: {r:?}")
                    }
                ),
            });
        }
        // SAFETY: as for `cuLaunchKernel` in `launch` (the parameters match the
        // kernel's, the buffers are live, `stream` belongs to this context); the
        // configuration and its attribute live across the call.
        let r = unsafe {
            sys::cuLaunchKernelEx(
                &config,
                k.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            e => Err(self.err(what)(DriverError(e))),
        }
    }

    fn dynamic_shared(bin: &KernelBinary) -> usize {
        if bin.shared_bytes > DYNAMIC_SHARED_PAST {
            bin.shared_bytes as usize
        } else {
            0
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Ok(Some(s)) = self.control.get_mut().map(|s| s.take())
            && self.bind_for_cleanup()
        {
            // SAFETY: created by `control_stream`, destroyed once.
            let _ = unsafe { result::stream::destroy(s.0) };
        }
    }
}

impl GpuBackend for CudaDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn props(&self) -> &DeviceProperties {
        &self.props
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn alloc(&self, bytes: usize, stream: RawStream) -> Result<u64, Error> {
        let what = format!("allocating {bytes} bytes");
        self.bind(&what)?;
        let stream = cu_stream(stream);
        // SAFETY: an allocation in the bound context, zeroed on `stream` (of this
        // context) before any other work queued there (or synchronously) can use it.
        unsafe {
            let ptr = if self.async_alloc {
                result::malloc_async(stream, bytes)
            } else {
                result::malloc_sync(bytes)
            }
            .map_err(alloc_err(self.ordinal, bytes, what.clone()))?;
            if let Err(e) = result::memset_d8_async(ptr, 0, bytes, stream) {
                self.free(ptr, RawStream(stream as usize as u64));
                return Err(self.err(what)(e));
            }
            Ok(ptr)
        }
    }

    fn free(&self, ptr: u64, stream: RawStream) {
        if !self.bind_for_cleanup() {
            return;
        }
        // SAFETY: allocated by `alloc` in this context, freed once, after the work
        // queued on `stream`.
        let _ = unsafe {
            if self.async_alloc {
                result::free_async(ptr, cu_stream(stream))
            } else {
                result::free_sync(ptr)
            }
        };
    }

    /// A zeroed allocation made with `cuMemAlloc` (not the stream pool: pool memory
    /// cannot be exported with `cuIpcGetMemHandle`).
    fn alloc_exportable(&self, bytes: usize) -> Result<u64, Error> {
        let what = format!("allocating a symmetric heap of {bytes} bytes");
        self.bind(&what)?;
        // SAFETY: plain allocation in the bound context.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(alloc_err(
            self.ordinal,
            bytes.max(1),
            what.clone(),
        ))?;
        // SAFETY: `ptr` holds `bytes.max(1)` bytes.
        if let Err(e) = unsafe { result::memset_d8_sync(ptr, 0, bytes.max(1)) } {
            self.free_exportable(ptr);
            return Err(self.err(what)(e));
        }
        // The zeroes must land before a peer (another process) can see the heap; the
        // control stream (for raising the abort word under a waiting kernel) is made
        // now, so a failure to make it shows here rather than in a watchdog.
        let ready = self
            .synchronize(RawStream::DEFAULT)
            .and_then(|_| self.control_stream().map(|_| ()));
        if let Err(e) = ready {
            self.free_exportable(ptr);
            return Err(e);
        }
        Ok(ptr)
    }

    fn free_exportable(&self, ptr: u64) {
        if self.bind_for_cleanup() {
            // SAFETY: allocated by `alloc_exportable`, freed once.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    fn htod(&self, dst: u64, data: &[u8], stream: RawStream) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        let what = "copying to the device";
        self.bind(what)?;
        // SAFETY: the caller guarantees `dst` is device memory of at least
        // `data.len()` bytes, alive; `data` lives until the stream is synchronized.
        unsafe {
            result::memcpy_htod_async(dst, data, cu_stream(stream)).map_err(self.err(what))?;
        }
        self.synchronize(stream)
    }

    fn dtoh(&self, src: u64, out: &mut [u8], stream: RawStream) -> Result<(), Error> {
        if out.is_empty() {
            return Ok(());
        }
        let what = "copying to the host";
        self.bind(what)?;
        // SAFETY: the caller guarantees `src` is device memory of at least
        // `out.len()` bytes; `out` lives until the stream is synchronized below.
        unsafe {
            result::memcpy_dtoh_async(out, src, cu_stream(stream)).map_err(self.err(what))?;
        }
        self.synchronize(stream)
    }

    fn copy(
        &self,
        dst: u64,
        src_dev: &dyn GpuBackend,
        src: u64,
        bytes: usize,
        stream: RawStream,
    ) -> Result<(), Error> {
        if !before_copy(self, src_dev, bytes)? {
            return Ok(());
        }
        let what = "copying between devices";
        self.bind(what)?;
        // SAFETY: both ranges are live device memory of at least `bytes` bytes
        // (unified addressing makes a peer's address valid here).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, cu_stream(stream)) }
            .map_err(self.err(what))
    }

    fn poke_u32(&self, dst: u64, value: u32) -> Result<(), Error> {
        if let Some(p) = &self.parent {
            return p.poke_u32(dst, value);
        }
        let what = "raising the abort word";
        let stream = self.control_stream()?;
        self.bind(what)?;
        // SAFETY: `dst` is 4 bytes of live device memory (a heap's control word); the
        // stream is ours.
        unsafe {
            sys::cuMemsetD32Async(dst, value, 1, stream.0)
                .result()
                .and_then(|_| result::stream::synchronize(stream.0))
        }
        .map_err(self.err(what))
    }

    fn synchronize(&self, stream: RawStream) -> Result<(), Error> {
        let what = "synchronizing the stream";
        self.bind(what)?;
        // SAFETY: a stream of this context (or the null stream).
        unsafe { result::stream::synchronize(cu_stream(stream)) }.map_err(self.err(what))
    }

    fn synchronize_device(&self) -> Result<(), Error> {
        let what = "synchronizing the device";
        self.bind(what)?;
        result::ctx::synchronize().map_err(self.err(what))
    }

    fn stream_create(&self) -> Result<RawStream, Error> {
        let what = "creating a stream";
        self.bind(what)?;
        // A blocking stream: ordered with the legacy default stream.
        let s =
            result::stream::create(result::stream::StreamKind::Default).map_err(self.err(what))?;
        Ok(RawStream(s as usize as u64))
    }

    fn part_stream(&self, _units: std::ops::Range<u32>) -> Result<(RawStream, bool), Error> {
        let what = "creating a stream";
        self.bind(what)?;
        // Non-blocking: neither waits for the legacy default stream nor makes it
        // wait (another part's waiting kernel must not hold this part's work up).
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(self.err(what))?;
        Ok((RawStream(s as usize as u64), false))
    }

    /// Green contexts, on drivers for CUDA 12.4 and later ([`green`]).
    fn confined_parts(&self, parts: u32) -> Option<Result<Vec<Arc<dyn GpuBackend>>, Error>> {
        let has = self.props.driver_version.is_some_and(|v| v >= (12, 4));
        has.then(|| green::split(self, parts))
    }

    fn stream_destroy(&self, stream: RawStream) {
        if stream != RawStream::DEFAULT && self.bind_for_cleanup() {
            // SAFETY: created by `stream_create`, destroyed once (the driver lets
            // its queued work finish).
            let _ = unsafe { result::stream::destroy(cu_stream(stream)) };
        }
    }

    fn event_create(&self) -> Result<RawEvent, Error> {
        let what = "creating an event";
        self.bind(what)?;
        let e =
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(self.err(what))?;
        Ok(RawEvent(e as usize as u64))
    }

    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<(), Error> {
        let what = "recording an event";
        self.bind(what)?;
        // SAFETY: a live event and stream of this context.
        unsafe { result::event::record(cu_event(event), cu_stream(stream)) }.map_err(self.err(what))
    }

    fn event_synchronize(&self, event: RawEvent) -> Result<(), Error> {
        let what = "waiting for an event";
        self.bind(what)?;
        // SAFETY: a live event.
        unsafe { result::event::synchronize(cu_event(event)) }.map_err(self.err(what))
    }

    fn event_elapsed(&self, start: RawEvent, end: RawEvent) -> Result<Duration, Error> {
        let what = "reading an event's time";
        self.bind(what)?;
        // SAFETY: live, recorded events.
        let ms = unsafe { result::event::elapsed(cu_event(start), cu_event(end)) }
            .map_err(self.err(what))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    fn event_destroy(&self, event: RawEvent) {
        if self.bind_for_cleanup() {
            // SAFETY: created by `event_create`, destroyed once.
            let _ = unsafe { result::event::destroy(cu_event(event)) };
        }
    }

    fn load(
        &self,
        key: &str,
        bin: &mut dyn FnMut() -> Result<KernelBinary, Error>,
    ) -> Result<Arc<dyn GpuKernel>, Error> {
        if let Some(k) = self.lock_kernels().get(key) {
            return Ok(k.clone());
        }
        let bin = bin()?;
        let what = format!("loading kernel `{}` ({})", bin.name, bin.target);
        if bin.shared_bytes as usize > self.props.shared_per_block_optin {
            // Before the driver's bare "invalid value" from the opt-in below.
            return Err(Error::Launch {
                kernel: bin.name.clone(),
                reason: format!(
                    "it needs {} bytes of shared memory, {} has {} per block",
                    bin.shared_bytes, self.props.name, self.props.shared_per_block_optin
                ),
            });
        }
        if bin.name.contains('\0') {
            return Err(Error::Artifact {
                path: format!("kernel `{}`", bin.name),
                reason: "the entry name contains NUL".into(),
            });
        }
        if bin.target.starts_with("tileir-") {
            return self.load_cubin(key, bin, &what);
        }
        let src = String::from_utf8(bin.binary.clone())
            .ok()
            .filter(|s| !s.contains('\0'))
            .ok_or_else(|| Error::Artifact {
                path: format!("kernel `{}`", bin.name),
                reason: "the PTX is not NUL-free UTF-8 text".into(),
            })?;
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
        if links_nvshmem(&src) {
            self.init_nvshmem_module(&func, &bin.name)?;
        }
        if bin.shared_bytes > DYNAMIC_SHARED_PAST {
            // Dynamic shared memory past 48 KiB needs the kernel's opt-in.
            func.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bin.shared_bytes as i32,
            )
            .map_err(self.err(what))?;
        }
        Ok(self.keep_kernel(key, CudaKernel { func, bin }))
    }

    fn occupancy(&self, kernel: &dyn GpuKernel) -> Result<u32, Error> {
        let k: &CudaKernel = downcast_kernel(kernel, &self.id())?;
        self.bind("querying the occupancy")?;
        k.func
            .occupancy_max_active_blocks_per_multiprocessor(
                k.bin.num_threads,
                Self::dynamic_shared(&k.bin),
                None,
            )
            .map_err(self.err(format!("querying the occupancy of `{}`", k.bin.name)))
    }

    fn launch(
        &self,
        kernel: &dyn GpuKernel,
        grid: [u32; 3],
        cluster: [u32; 3],
        args: &[GpuArg],
        waits: bool,
        stream: RawStream,
    ) -> Result<(), Error> {
        let k: &CudaKernel = downcast_kernel(kernel, &self.id())?;
        let what = format!("launching kernel `{}`", k.bin.name);
        let shared = k.bin.shared_bytes as usize;
        self.check_launch(kernel, grid, waits, GridLimits::Cuda)?;
        if shared > self.props.shared_per_block_optin {
            return Err(Error::Launch {
                kernel: k.bin.name.clone(),
                reason: format!(
                    "it needs {shared} bytes of shared memory, {} has {} per block",
                    self.props.name, self.props.shared_per_block_optin
                ),
            });
        }
        // Each parameter's value lives in `args`; the driver reads them through
        // pointers (and copies them before the call returns).
        let mut params: Vec<_> = args.iter().map(GpuArg::as_param).collect();
        self.bind(&what)?;
        if cluster != [1, 1, 1] {
            return self.launch_clusters(k, grid, cluster, &mut params, stream);
        }
        // SAFETY: the arguments match the kernel's parameters in number and size
        // (checked against the IR by `launch`), device addresses belong to live
        // buffers of this device borrowed for the call, the kernel's accesses are
        // bounds-masked by construction, and `stream` is a stream of this context.
        unsafe {
            result::launch_kernel(
                k.func.cu_function(),
                (grid[0], grid[1], grid[2]),
                (k.bin.num_threads, 1, 1),
                Self::dynamic_shared(&k.bin) as u32,
                cu_stream(stream),
                &mut params,
            )
        }
        .map_err(self.err(what))
    }

    fn tensor_map(&self, spec: &TensorMapSpec<'_>) -> Result<Option<TensorMap>, Error> {
        let what = "building a tensor map (cuTensorMapEncodeTiled)";
        let r = spec.dims.len();
        let dt = match spec.elem_bytes {
            1 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            2 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        };
        let sw = match spec.swizzle {
            128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        };
        // The driver takes dimensions innermost first, and the byte strides of
        // dimensions 1.. only.
        let gdim: Vec<u64> = spec.dims.iter().rev().copied().collect();
        let gstride: Vec<u64> = spec
            .strides
            .iter()
            .rev()
            .skip(1)
            .map(|&s| s * spec.elem_bytes as u64)
            .collect();
        let bdim: Vec<u32> = spec.box_dims.iter().rev().copied().collect();
        let estride = vec![1u32; r];
        if gstride.len() + 1 != r || bdim.len() != r {
            return Ok(None);
        }
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        self.bind(what)?;
        // SAFETY: `map` is a writable 64-byte aligned `CUtensorMap`; the arrays hold
        // `r` (`r - 1` for the strides) entries, as the call's rank says.
        let res = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                dt,
                r as u32,
                spec.base as *mut std::ffi::c_void,
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
            // A map the driver will not encode: the launch reads through loads.
            return Ok(None);
        }
        // SAFETY: the driver wrote the map; it is plain bytes.
        let map = unsafe { map.assume_init() };
        let bytes: Vec<u8> = map.opaque.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut maps = self.tensor_maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = maps.get(&bytes) {
            return Ok(Some(TensorMap::new(m.ptr, m.clone())));
        }
        if maps.len() >= 4096 {
            // Kernels launched earlier may still read the maps: let them finish. A map
            // handed out for a launch not queued yet lives on in that launch's handle.
            self.synchronize_device()?;
            maps.clear();
        }
        let ptr = self.upload_raw(&bytes)?;
        let m = Arc::new(MapMemory {
            ptr,
            ctx: self.ctx.clone(),
            async_alloc: self.async_alloc,
        });
        maps.insert(bytes, m.clone());
        Ok(Some(TensorMap::new(ptr, m)))
    }

    fn enable_peer_access(&self, other: &dyn GpuBackend) -> Result<(), Error> {
        let what = format!("enabling peer access to {}", other.id());
        let Some(other) = other.as_any().downcast_ref::<CudaDevice>() else {
            return Err(Error::DeviceUnavailable {
                device: other.id(),
                reason: format!("no peer access between {} and {}", self.id(), other.id()),
            });
        };
        self.bind(&what)?;
        // SAFETY: both contexts are alive (held by the devices).
        let r = unsafe { sys::cuCtxEnablePeerAccess(other.ctx.cu_ctx(), 0) };
        match r {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            e => Err(self.err(what)(DriverError(e))),
        }
    }

    fn ipc_handle(&self, ptr: u64) -> Result<Vec<u8>, Error> {
        let what = "exporting the heap (cuIpcGetMemHandle)";
        self.bind(what)?;
        // SAFETY: zeroed plain data, written by the driver.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: `ptr` is the base of a cuMemAlloc allocation.
        unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) }
            .result()
            .map_err(self.err(what))?;
        Ok(h.reserved.iter().map(|&c| c as u8).collect())
    }

    fn ipc_open(&self, handle: &[u8]) -> Result<u64, Error> {
        let what = "opening a peer's heap (cuIpcOpenMemHandle)";
        // SAFETY: zeroed plain data.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        if handle.len() != h.reserved.len() {
            return Err(Error::Driver {
                device: self.id(),
                what: what.into(),
                message: format!("an IPC handle of {} bytes, 64 expected", handle.len()),
            });
        }
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as _;
        }
        self.bind(what)?;
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

    fn ipc_close(&self, ptr: u64) {
        if self.bind_for_cleanup() {
            // SAFETY: opened by `ipc_open`, closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
        }
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

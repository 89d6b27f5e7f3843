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
}

/// Device memory (at least one byte is allocated, so empty buffers are valid too).
pub(crate) struct CudaBuf {
    pub(crate) slice: CudaSlice<u8>,
    pub(crate) dev: Arc<CudaDevice>,
}

/// The compilation target for compute capability `major.minor`: PTX for the newest
/// known architecture not above it (PTX is JIT-compiled forward by the driver).
pub(crate) fn target_for(major: u32, minor: u32) -> Option<&'static str> {
    match major * 10 + minor {
        90.. => Some("sm_90"),
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
            slice,
            dev: self.clone(),
        })
    }

    /// An allocation holding `data`.
    pub(crate) fn upload(self: &Arc<Self>, data: &[u8]) -> Result<CudaBuf, Error> {
        let mut buf = self.alloc(data.len())?;
        self.write(&mut buf.slice, data)?;
        Ok(buf)
    }

    /// Copies `data` to the start of `dst`.
    pub(crate) fn write(&self, dst: &mut CudaSlice<u8>, data: &[u8]) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_htod(data, dst)
            .map_err(self.err("copying to the device"))
    }

    /// The first `bytes` bytes of `src` (waits for the stream).
    pub(crate) fn read(&self, src: &CudaSlice<u8>, bytes: usize) -> Result<Vec<u8>, Error> {
        let mut v = self
            .stream
            .clone_dtoh(src)
            .map_err(self.err("copying to the host"))?;
        v.truncate(bytes);
        Ok(v)
    }

    /// Copies `src` (on this or another CUDA device: a peer copy) into `dst` on this
    /// device, on this device's stream.
    pub(crate) fn copy_device(&self, src: &CudaBuf, dst: &mut CudaBuf) -> Result<(), Error> {
        // The source's stream may still be writing it.
        if !Arc::ptr_eq(&src.dev, &dst.dev) {
            src.dev.synchronize()?;
        }
        self.stream
            .memcpy_dtod(&src.slice, &mut dst.slice)
            .map_err(self.err("copying between devices"))
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
        let module = self
            .ctx
            .load_module(Ptx::from_src(src))
            .map_err(self.err(what.clone()))?;
        let func = module.load_function(&bin.name).map_err(self.err(what))?;
        let k = Arc::new(CudaKernel { func, bin });
        Ok(self
            .lock_kernels()
            .entry(key.to_string())
            .or_insert(k)
            .clone())
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
    ) -> Result<(), Error> {
        let what = format!("launching kernel `{}`", k.bin.name);
        let shared = k.bin.shared_bytes as usize;
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
            // Shared memory is static (declared in the PTX), see `KernelBinary`.
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's parameters in number and size
        // (checked against the IR by `launch`), device addresses belong to live
        // buffers of this device borrowed for the call, and the kernel's accesses
        // are bounds-masked by construction.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(self.err(what))
    }
}

//! The HIP backend (feature `hip`): the HIP runtime API through hip-sys.
//!
//! `hipGetDeviceCount` answering an error or zero devices makes every entry point
//! return [`Error::DeviceUnavailable`]. Each device uses HIP's null stream of that
//! device as its default stream (see [`crate::Device`]); kernels are HSACO code objects
//! loaded with `hipModuleLoadData` and launched with `hipModuleLaunchKernel`.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hip_sys::hiprt as h;

use crate::Error;
use crate::artifact::KernelBinary;
use crate::device::DeviceProperties;
use crate::launch::GpuArg;

fn describe(e: h::hipError_t) -> String {
    // SAFETY: hipGetErrorString returns a static string for every code.
    let s = unsafe { h::hipGetErrorString(e) };
    if s.is_null() {
        format!("{e:?}")
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        format!("{e:?} ({})", unsafe { CStr::from_ptr(s) }.to_string_lossy())
    }
}

fn check(ordinal: usize, what: &str, e: h::hipError_t) -> Result<(), Error> {
    if e == h::hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(Error::Driver {
            device: format!("hip:{ordinal}"),
            what: what.to_string(),
            message: describe(e),
        })
    }
}

/// The number of HIP devices (0 when the runtime reports an error, e.g.
/// `hipErrorNoDevice`).
pub(crate) fn count() -> usize {
    count_or_error().unwrap_or(0)
}

fn count_or_error() -> Result<usize, String> {
    let mut n: std::os::raw::c_int = 0;
    // SAFETY: writes one int.
    let e = unsafe { h::hipGetDeviceCount(&mut n) };
    if e == h::hipError_t::hipSuccess {
        Ok(n.max(0) as usize)
    } else {
        Err(describe(e))
    }
}

/// One loaded kernel.
pub(crate) struct HipKernel {
    func: h::hipFunction_t,
    _module: h::hipModule_t,
    bin: KernelBinary,
}
// SAFETY: HIP module and function handles may be used from any thread.
unsafe impl Send for HipKernel {}
// SAFETY: as above.
unsafe impl Sync for HipKernel {}

/// An open HIP device.
pub(crate) struct HipDevice {
    pub(crate) ordinal: usize,
    pub(crate) props: DeviceProperties,
    kernels: Mutex<HashMap<String, Arc<HipKernel>>>,
}

/// Device memory (at least one byte).
pub(crate) struct HipBuf {
    pub(crate) ptr: *mut c_void,
    pub(crate) dev: Arc<HipDevice>,
    /// For a view into memory owned elsewhere (a symmetric heap): its owner, kept
    /// alive; the view is not freed.
    pub(crate) owner: Option<Arc<dyn Send + Sync>>,
}

impl HipBuf {
    /// A view of device memory at `ptr`, valid while `owner` lives.
    pub(crate) fn view(dev: Arc<HipDevice>, ptr: u64, owner: Arc<dyn Send + Sync>) -> HipBuf {
        HipBuf {
            ptr: ptr as *mut c_void,
            dev,
            owner: Some(owner),
        }
    }
}
// SAFETY: a device pointer is plain data; access is ordered by the device's stream.
unsafe impl Send for HipBuf {}
// SAFETY: as above.
unsafe impl Sync for HipBuf {}

impl Drop for HipBuf {
    fn drop(&mut self) {
        if self.owner.is_some() {
            return;
        }
        // SAFETY: allocated by hipMalloc on this device; freed once.
        unsafe {
            let _ = h::hipSetDevice(self.dev.ordinal as i32);
            let _ = h::hipFree(self.ptr);
        }
    }
}

/// Opens HIP device `ordinal` (once per process).
pub(crate) fn open(ordinal: usize) -> Result<Arc<HipDevice>, Error> {
    let name = format!("hip:{ordinal}");
    let n = count_or_error().map_err(|e| Error::DeviceUnavailable {
        device: name.clone(),
        reason: format!("no HIP device found (hipGetDeviceCount: {e})"),
    })?;
    if ordinal >= n {
        return Err(Error::DeviceUnavailable {
            device: name,
            reason: format!("no HIP device found ({n} present)"),
        });
    }
    static OPEN: OnceLock<Mutex<HashMap<usize, Arc<HipDevice>>>> = OnceLock::new();
    let open = OPEN.get_or_init(|| Mutex::new(HashMap::new()));
    let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = open.get(&ordinal) {
        return Ok(d.clone());
    }
    // The struct grew across HIP versions: leave room for a newer runtime's.
    #[repr(C)]
    struct Props {
        p: h::hipDeviceProp_t,
        _room: [u8; 4096],
    }
    let mut props = std::mem::MaybeUninit::<Props>::zeroed();
    // SAFETY: writes at most sizeof(hipDeviceProp_t) (of a HIP version) bytes.
    check(ordinal, "querying device properties", unsafe {
        h::hipGetDeviceProperties(&mut (*props.as_mut_ptr()).p, ordinal as i32)
    })?;
    // SAFETY: zero-initialized plain data, filled by HIP.
    let p = unsafe { props.assume_init() }.p;
    let cstr = |s: &[std::os::raw::c_char]| {
        let bytes: Vec<u8> = s
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let arch = cstr(&p.gcnArchName);
    let target = arch.split(':').next().unwrap_or("").to_string();
    let dev = Arc::new(HipDevice {
        ordinal,
        props: DeviceProperties {
            name: cstr(&p.name),
            target,
            compute_capability: None,
            multiprocessors: p.multiProcessorCount.max(0) as u32,
            warp_size: p.warpSize.max(0) as u32,
            shared_per_block: p.sharedMemPerBlock,
            shared_per_block_optin: p.sharedMemPerBlock,
            total_memory: p.totalGlobalMem,
        },
        kernels: Mutex::new(HashMap::new()),
    });
    open.insert(ordinal, dev.clone());
    Ok(dev)
}

impl HipDevice {
    fn set(&self, what: &str) -> Result<(), Error> {
        // SAFETY: plain call.
        check(self.ordinal, what, unsafe {
            h::hipSetDevice(self.ordinal as i32)
        })
    }

    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<HipBuf, Error> {
        let what = format!("allocating {bytes} bytes");
        self.set(&what)?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check(self.ordinal, &what, unsafe {
            h::hipMalloc(&mut ptr, bytes.max(1))
        })?;
        let buf = HipBuf {
            ptr,
            dev: self.clone(),
            owner: None,
        };
        // SAFETY: `bytes.max(1)` bytes were just allocated.
        check(self.ordinal, &what, unsafe {
            h::hipMemset(ptr, 0, bytes.max(1))
        })?;
        Ok(buf)
    }

    pub(crate) fn upload(self: &Arc<Self>, data: &[u8]) -> Result<HipBuf, Error> {
        let buf = self.alloc(data.len())?;
        self.write(&buf, data)?;
        Ok(buf)
    }

    pub(crate) fn write(&self, dst: &HipBuf, data: &[u8]) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        self.set("copying to the device")?;
        // SAFETY: dst holds at least data.len() bytes (checked by the caller).
        check(self.ordinal, "copying to the device", unsafe {
            h::hipMemcpyHtoD(dst.ptr, data.as_ptr() as *mut c_void, data.len())
        })
    }

    pub(crate) fn read(&self, src: &HipBuf, bytes: usize) -> Result<Vec<u8>, Error> {
        let mut out = vec![0u8; bytes];
        if bytes == 0 {
            return Ok(out);
        }
        self.set("copying to the host")?;
        // SAFETY: src holds at least `bytes` bytes; hipMemcpyDtoH waits for the work
        // queued before it on the null stream.
        check(self.ordinal, "copying to the host", unsafe {
            h::hipMemcpyDtoH(out.as_mut_ptr() as *mut c_void, src.ptr, bytes)
        })?;
        Ok(out)
    }

    pub(crate) fn copy_device(
        &self,
        src: &HipBuf,
        dst: &HipBuf,
        bytes: usize,
    ) -> Result<(), Error> {
        self.set("copying between devices")?;
        // SAFETY: both hold at least `bytes` bytes.
        check(self.ordinal, "copying between devices", unsafe {
            h::hipMemcpyPeer(
                dst.ptr,
                dst.dev.ordinal as i32,
                src.ptr,
                src.dev.ordinal as i32,
                bytes,
            )
        })
    }

    pub(crate) fn synchronize(&self) -> Result<(), Error> {
        self.set("synchronizing")?;
        // SAFETY: plain call.
        check(self.ordinal, "synchronizing", unsafe {
            h::hipDeviceSynchronize()
        })
    }

    pub(crate) fn time<R>(
        &self,
        f: impl FnOnce() -> Result<R, Error>,
    ) -> Result<(R, Duration), Error> {
        self.set("creating events")?;
        let mut ev = [std::ptr::null_mut(); 2];
        for e in &mut ev {
            // SAFETY: writes one handle.
            check(self.ordinal, "creating an event", unsafe {
                h::hipEventCreate(e)
            })?;
        }
        let run = || -> Result<(R, Duration), Error> {
            // SAFETY: live events, null stream.
            check(self.ordinal, "recording an event", unsafe {
                h::hipEventRecord(ev[0], std::ptr::null_mut())
            })?;
            let r = f()?;
            self.set("recording an event")?;
            let mut ms = 0f32;
            // SAFETY: live events.
            unsafe {
                check(
                    self.ordinal,
                    "recording an event",
                    h::hipEventRecord(ev[1], std::ptr::null_mut()),
                )?;
                check(
                    self.ordinal,
                    "waiting for an event",
                    h::hipEventSynchronize(ev[1]),
                )?;
                check(
                    self.ordinal,
                    "reading an event's time",
                    h::hipEventElapsedTime(&mut ms, ev[0], ev[1]),
                )?;
            }
            Ok((r, Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3)))
        };
        let result = run();
        for e in ev {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { h::hipEventDestroy(e) };
        }
        result
    }

    /// A zeroed `hipMalloc` allocation of `bytes` bytes (exportable with
    /// `hipIpcGetMemHandle`); free with [`HipDevice::free_raw`].
    pub(crate) fn alloc_raw(&self, bytes: usize) -> Result<u64, Error> {
        let what = format!("allocating a symmetric heap of {bytes} bytes");
        self.set(&what)?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check(self.ordinal, &what, unsafe {
            h::hipMalloc(&mut ptr, bytes.max(1))
        })?;
        // SAFETY: `bytes.max(1)` bytes were just allocated.
        if let Err(e) = check(self.ordinal, &what, unsafe {
            h::hipMemset(ptr, 0, bytes.max(1))
        })
        .and_then(|_| self.synchronize())
        {
            self.free_raw(ptr as u64);
            return Err(e);
        }
        Ok(ptr as u64)
    }

    /// Frees an [`HipDevice::alloc_raw`] allocation (errors ignored: destructors).
    pub(crate) fn free_raw(&self, ptr: u64) {
        // SAFETY: allocated by `alloc_raw`, freed once.
        unsafe {
            let _ = h::hipSetDevice(self.ordinal as i32);
            let _ = h::hipFree(ptr as *mut c_void);
        }
    }

    /// Copies `data` to device address `dst` (synchronous).
    pub(crate) fn htod(&self, dst: u64, data: &[u8]) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        self.set("copying to the device")?;
        // SAFETY: the caller guarantees `dst` holds `data.len()` bytes.
        check(self.ordinal, "copying to the device", unsafe {
            h::hipMemcpyHtoD(dst as *mut c_void, data.as_ptr() as *mut c_void, data.len())
        })
    }

    /// `bytes` bytes from device address `src` (after the queued work).
    pub(crate) fn dtoh(&self, src: u64, bytes: usize) -> Result<Vec<u8>, Error> {
        let mut out = vec![0u8; bytes];
        if bytes == 0 {
            return Ok(out);
        }
        self.set("copying to the host")?;
        // SAFETY: the caller guarantees `src` holds `bytes` bytes.
        check(self.ordinal, "copying to the host", unsafe {
            h::hipMemcpyDtoH(out.as_mut_ptr() as *mut c_void, src as *mut c_void, bytes)
        })?;
        Ok(out)
    }

    /// The IPC handle of an [`HipDevice::alloc_raw`] allocation.
    pub(crate) fn ipc_handle(&self, ptr: u64) -> Result<Vec<u8>, Error> {
        let what = "exporting the heap (hipIpcGetMemHandle)";
        self.set(what)?;
        // SAFETY: zeroed plain data, written by HIP.
        let mut hd: h::hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
        // SAFETY: `ptr` is the base of a hipMalloc allocation.
        check(self.ordinal, what, unsafe {
            h::hipIpcGetMemHandle(&mut hd, ptr as *mut c_void)
        })?;
        Ok(hd.reserved.iter().map(|&c| c as u8).collect())
    }

    /// Opens another process's IPC handle: its address here. Close with
    /// [`HipDevice::ipc_close`].
    pub(crate) fn ipc_open(&self, handle: &[u8]) -> Result<u64, Error> {
        let what = "opening a peer's heap (hipIpcOpenMemHandle)";
        // SAFETY: zeroed plain data.
        let mut hd: h::hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
        if handle.len() != hd.reserved.len() {
            return Err(Error::Driver {
                device: format!("hip:{}", self.ordinal),
                what: what.into(),
                message: format!("an IPC handle of {} bytes, 64 expected", handle.len()),
            });
        }
        for (d, s) in hd.reserved.iter_mut().zip(handle) {
            *d = *s as _;
        }
        self.set(what)?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a handle made by hipIpcGetMemHandle in another process.
        check(self.ordinal, what, unsafe {
            h::hipIpcOpenMemHandle(&mut ptr, hd, h::hipIpcMemLazyEnablePeerAccess)
        })?;
        Ok(ptr as u64)
    }

    /// Closes an address opened by [`HipDevice::ipc_open`] (errors ignored).
    pub(crate) fn ipc_close(&self, ptr: u64) {
        // SAFETY: opened by `ipc_open`, closed once.
        unsafe {
            let _ = h::hipSetDevice(self.ordinal as i32);
            let _ = h::hipIpcCloseMemHandle(ptr as *mut c_void);
        }
    }

    /// Writes the 32-bit `value` at `dst` on a non-blocking stream, so that it lands
    /// while a kernel runs on the null stream (raising a heap's abort word).
    pub(crate) fn poke_u32(&self, dst: u64, value: u32) -> Result<(), Error> {
        let what = "raising the abort word";
        self.set(what)?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(self.ordinal, what, unsafe {
            h::hipStreamCreateWithFlags(&mut stream, h::hipStreamNonBlocking)
        })?;
        // SAFETY: `dst` is 4 bytes of live device memory; the stream is ours.
        let r = unsafe {
            check(
                self.ordinal,
                what,
                h::hipMemsetD32Async(dst as *mut c_void, value as i32, 1, stream),
            )
            .and_then(|_| check(self.ordinal, what, h::hipStreamSynchronize(stream)))
        };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { h::hipStreamDestroy(stream) };
        r
    }

    pub(crate) fn enable_peer_access(&self, other: &HipDevice) -> Result<(), Error> {
        let what = format!("enabling peer access to hip:{}", other.ordinal);
        self.set(&what)?;
        // SAFETY: plain call.
        let e = unsafe { h::hipDeviceEnablePeerAccess(other.ordinal as i32, 0) };
        if e == h::hipError_t::hipErrorPeerAccessAlreadyEnabled {
            return Ok(());
        }
        check(self.ordinal, &what, e)
    }

    pub(crate) fn kernel(
        &self,
        key: &str,
        bin: impl FnOnce() -> Result<KernelBinary, Error>,
    ) -> Result<Arc<HipKernel>, Error> {
        if let Some(k) = self.lock_kernels().get(key) {
            return Ok(k.clone());
        }
        let bin = bin()?;
        let what = format!("loading kernel `{}` ({})", bin.name, bin.target);
        let name = CString::new(bin.name.clone()).map_err(|_| Error::Artifact {
            path: format!("kernel `{}`", bin.name),
            reason: "the entry name contains NUL".into(),
        })?;
        self.set(&what)?;
        let mut module = std::ptr::null_mut();
        // SAFETY: the image is a complete code object, alive for the call.
        check(self.ordinal, &what, unsafe {
            h::hipModuleLoadData(&mut module, bin.binary.as_ptr() as *const c_void)
        })?;
        let mut func = std::ptr::null_mut();
        // SAFETY: live module, NUL-terminated name.
        check(self.ordinal, &what, unsafe {
            h::hipModuleGetFunction(&mut func, module, name.as_ptr())
        })?;
        let k = Arc::new(HipKernel {
            func,
            _module: module,
            bin,
        });
        Ok(self
            .lock_kernels()
            .entry(key.to_string())
            .or_insert(k)
            .clone())
    }

    fn lock_kernels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<HipKernel>>> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn launch(
        &self,
        k: &HipKernel,
        grid: [u32; 3],
        args: &[GpuArg],
    ) -> Result<(), Error> {
        let what = format!("launching kernel `{}`", k.bin.name);
        self.set(&what)?;
        // Each parameter's value lives in `args`; HIP reads them through pointers.
        let mut params: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                GpuArg::U8(v) => v as *const u8 as *mut c_void,
                GpuArg::U16(v) => v as *const u16 as *mut c_void,
                GpuArg::U32(v) => v as *const u32 as *mut c_void,
                GpuArg::U64(v) => v as *const u64 as *mut c_void,
            })
            .collect();
        // SAFETY: the parameters match the kernel's (checked by `launch`), and the
        // pointers stay valid for the call (HIP copies the values).
        check(self.ordinal, &what, unsafe {
            h::hipModuleLaunchKernel(
                k.func,
                grid[0],
                grid[1],
                grid[2],
                k.bin.num_threads,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

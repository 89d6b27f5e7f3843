//! The HIP backend (feature `hip`): the HIP runtime API, loaded at run time.
//!
//! `libamdhip64` is opened with `dlopen` on first use (`libamdhip64.so`, then the
//! `.so.7`, `.so.6` and `.so.5` names, then `$HIP_PATH/lib` and `/opt/rocm/lib`), so a
//! binary built with `hip` starts on a machine without ROCm, and with any ROCm
//! version: no runtime found, `hipGetDeviceCount` answering an error or zero devices
//! make every entry point return [`Error::DeviceUnavailable`]. Error codes stay
//! integers (a code this file does not know is reported by number, never undefined
//! behaviour), and device properties come from `hipDeviceGetAttribute`, whose numbering
//! is stable across ROCm versions, rather than from `hipDeviceProp_t`, whose layout is
//! not. Each device uses HIP's null stream of that device as its default stream (see
//! [`crate::Device`]); kernels are HSACO code objects loaded with `hipModuleLoadData`
//! and launched with `hipModuleLaunchKernel`.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The HIP runtime API as this backend uses it: types, constants and the entry points,
/// which forward to `libamdhip64` (resolved once, see [`api`]); without a runtime every
/// call answers `hipErrorNotInitialized`.
#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    clippy::too_many_arguments
)]
mod h {
    use std::ffi::{c_char, c_int, c_uint, c_void};

    /// A HIP status code (`hipError_t`), kept as the integer HIP returns.
    #[repr(transparent)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct hipError_t(pub c_int);

    impl hipError_t {
        pub const hipSuccess: hipError_t = hipError_t(0);
        /// Also `hipErrorMemoryAllocation` (the same code).
        pub const hipErrorOutOfMemory: hipError_t = hipError_t(2);
        pub const hipErrorNotInitialized: hipError_t = hipError_t(3);
        pub const hipErrorPeerAccessAlreadyEnabled: hipError_t = hipError_t(704);
    }

    pub type hipDeviceptr_t = *mut c_void;
    pub type hipStream_t = *mut c_void;
    pub type hipEvent_t = *mut c_void;
    pub type hipModule_t = *mut c_void;
    pub type hipFunction_t = *mut c_void;

    /// `hipIpcMemHandle_t`: 64 opaque bytes.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct hipIpcMemHandle_t {
        pub reserved: [c_char; 64],
    }

    pub const hipStreamNonBlocking: c_uint = 1;
    pub const hipIpcMemLazyEnablePeerAccess: c_uint = 1;
    /// `hipExtMallocWithFlags` flag: device memory no cache keeps (`hip_runtime_api.h`:
    /// `hipDeviceMallocUncached`).
    pub const hipDeviceMallocUncached: c_uint = 3;

    /// `hipDeviceAttribute_t` values (the CUDA-compatible range, numbered alike since
    /// ROCm 5.0).
    pub const hipDeviceAttributeMultiprocessorCount: c_int = 63;
    pub const hipDeviceAttributeMaxSharedMemoryPerBlock: c_int = 74;
    pub const hipDeviceAttributeSharedMemPerBlockOptin: c_int = 75;
    pub const hipDeviceAttributeWarpSize: c_int = 87;

    /// Declares the entry points: a table of function pointers resolved from the
    /// library, and a forwarding function of the same name for each.
    macro_rules! api {
        ($($name:ident: fn($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
            /// The resolved entry points (the library stays loaded with them).
            pub struct Api {
                _lib: libloading::Library,
                $($name: unsafe extern "C" fn($($ty),*) -> $ret,)*
            }

            impl Api {
                /// Resolves every entry point from `lib`.
                pub fn resolve(lib: libloading::Library) -> Result<Api, String> {
                    // SAFETY: each symbol is the HIP runtime function of that name,
                    // whose C signature the declaration above follows; the pointers
                    // are used only while `lib` (kept in the table) is loaded.
                    unsafe {
                        $(let $name = *lib
                            .get::<unsafe extern "C" fn($($ty),*) -> $ret>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map_err(|e| format!("{}: {e}", stringify!($name)))?;)*
                        Ok(Api { _lib: lib, $($name,)* })
                    }
                }
            }

            $(
                /// Forwards to the HIP runtime's function of the same name.
                ///
                /// # Safety
                ///
                /// As the HIP function's contract.
                pub unsafe fn $name($($arg: $ty),*) -> $ret {
                    match super::api() {
                        // SAFETY: the caller keeps the HIP function's contract.
                        Ok(a) => unsafe { (a.$name)($($arg),*) },
                        Err(_) => not_loaded(),
                    }
                }
            )*
        };
    }

    /// What an entry point answers without a runtime.
    trait NotLoaded {
        fn not_loaded() -> Self;
    }
    impl NotLoaded for hipError_t {
        fn not_loaded() -> Self {
            hipError_t::hipErrorNotInitialized
        }
    }
    impl NotLoaded for *const c_char {
        fn not_loaded() -> Self {
            std::ptr::null()
        }
    }
    fn not_loaded<T: NotLoaded>() -> T {
        T::not_loaded()
    }

    api! {
        hipGetErrorString: fn(e: hipError_t) -> *const c_char;
        hipGetDeviceCount: fn(n: *mut c_int) -> hipError_t;
        hipSetDevice: fn(d: c_int) -> hipError_t;
        hipDeviceGetAttribute: fn(v: *mut c_int, attr: c_int, d: c_int) -> hipError_t;
        hipDeviceGetName: fn(name: *mut c_char, len: c_int, d: c_int) -> hipError_t;
        hipDeviceTotalMem: fn(bytes: *mut usize, d: c_int) -> hipError_t;
        hipGetDeviceProperties: fn(props: *mut c_void, d: c_int) -> hipError_t;
        hipMalloc: fn(p: *mut *mut c_void, bytes: usize) -> hipError_t;
        hipExtMallocWithFlags: fn(p: *mut *mut c_void, bytes: usize, flags: c_uint) -> hipError_t;
        hipFree: fn(p: *mut c_void) -> hipError_t;
        hipMemset: fn(p: *mut c_void, v: c_int, bytes: usize) -> hipError_t;
        hipMemsetD32Async: fn(p: hipDeviceptr_t, v: c_int, n: usize, s: hipStream_t) -> hipError_t;
        hipMemcpyHtoDAsync: fn(dst: hipDeviceptr_t, src: *mut c_void, bytes: usize, s: hipStream_t) -> hipError_t;
        hipMemcpyDtoHAsync: fn(dst: *mut c_void, src: hipDeviceptr_t, bytes: usize, s: hipStream_t) -> hipError_t;
        hipMemcpyPeerAsync: fn(dst: *mut c_void, dd: c_int, src: *const c_void, sd: c_int, bytes: usize, s: hipStream_t) -> hipError_t;
        hipDeviceSynchronize: fn() -> hipError_t;
        hipDeviceEnablePeerAccess: fn(peer: c_int, flags: c_uint) -> hipError_t;
        hipEventCreate: fn(e: *mut hipEvent_t) -> hipError_t;
        hipEventRecord: fn(e: hipEvent_t, s: hipStream_t) -> hipError_t;
        hipEventSynchronize: fn(e: hipEvent_t) -> hipError_t;
        hipEventElapsedTime: fn(ms: *mut f32, a: hipEvent_t, b: hipEvent_t) -> hipError_t;
        hipEventDestroy: fn(e: hipEvent_t) -> hipError_t;
        hipStreamCreateWithFlags: fn(s: *mut hipStream_t, flags: c_uint) -> hipError_t;
        hipExtStreamCreateWithCUMask: fn(s: *mut hipStream_t, words: u32, mask: *const u32) -> hipError_t;
        hipStreamSynchronize: fn(s: hipStream_t) -> hipError_t;
        hipStreamDestroy: fn(s: hipStream_t) -> hipError_t;
        hipIpcGetMemHandle: fn(h: *mut hipIpcMemHandle_t, p: *mut c_void) -> hipError_t;
        hipIpcOpenMemHandle: fn(p: *mut *mut c_void, h: hipIpcMemHandle_t, flags: c_uint) -> hipError_t;
        hipIpcCloseMemHandle: fn(p: *mut c_void) -> hipError_t;
        hipModuleLoadData: fn(m: *mut hipModule_t, image: *const c_void) -> hipError_t;
        hipModuleGetFunction: fn(f: *mut hipFunction_t, m: hipModule_t, name: *const c_char) -> hipError_t;
        hipModuleOccupancyMaxActiveBlocksPerMultiprocessor: fn(n: *mut c_int, f: hipFunction_t, block: c_int, shared: usize) -> hipError_t;
        hipModuleLaunchKernel: fn(
            f: hipFunction_t,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            s: hipStream_t,
            params: *mut *mut c_void,
            extra: *mut *mut c_void
        ) -> hipError_t;
    }
}

/// The library names tried, in order.
fn hip_library_candidates() -> Vec<std::path::PathBuf> {
    let mut out: Vec<std::path::PathBuf> = [
        "libamdhip64.so",
        "libamdhip64.so.7",
        "libamdhip64.so.6",
        "libamdhip64.so.5",
    ]
    .iter()
    .map(Into::into)
    .collect();
    if let Ok(p) = std::env::var("HIP_PATH") {
        out.push(std::path::Path::new(&p).join("lib/libamdhip64.so"));
    }
    out.push("/opt/rocm/lib/libamdhip64.so".into());
    out
}

/// The HIP runtime, loaded on first use; the error says what was tried.
fn api() -> Result<&'static h::Api, &'static str> {
    static API: OnceLock<Result<h::Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let mut tried = Vec::new();
        for c in hip_library_candidates() {
            // SAFETY: loading the HIP runtime runs its initializers, which have no
            // preconditions.
            match unsafe { libloading::Library::new(&c) } {
                Ok(lib) => {
                    return h::Api::resolve(lib).map_err(|e| format!("{}: {e}", c.display()));
                }
                Err(e) => tried.push(format!("{}: {e}", c.display())),
            }
        }
        Err(format!("no HIP runtime found (tried {})", tried.join("; ")))
    })
    .as_ref()
    .map_err(String::as_str)
}

use super::{
    GpuArg, GpuBackend, GpuKernel, GridLimits, KernelBinary, RawEvent, RawStream, before_copy,
    downcast_kernel,
};
use crate::error::Error;
use crate::properties::{DeviceKind, DeviceProperties};

fn describe(e: h::hipError_t) -> String {
    if let Err(why) = api() {
        return why.to_string();
    }
    // SAFETY: hipGetErrorString returns a static string for every code (an unknown
    // one included).
    let s = unsafe { h::hipGetErrorString(e) };
    if s.is_null() {
        format!("HIP error {}", e.0)
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        format!(
            "HIP error {} ({})",
            e.0,
            unsafe { CStr::from_ptr(s) }.to_string_lossy()
        )
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

/// As [`check`] for an allocation of `bytes` bytes, with `hipErrorOutOfMemory` as
/// [`Error::OutOfMemory`].
fn check_alloc(ordinal: usize, what: &str, bytes: usize, e: h::hipError_t) -> Result<(), Error> {
    if e == h::hipError_t::hipErrorOutOfMemory {
        return Err(Error::OutOfMemory {
            bytes: bytes as u64,
            device: format!("hip:{ordinal}"),
        });
    }
    check(ordinal, what, e)
}

/// The number of HIP devices (0 when the runtime reports an error, e.g.
/// `hipErrorNoDevice`).
pub(crate) fn count() -> usize {
    count_or_error().unwrap_or(0)
}

fn count_or_error() -> Result<usize, String> {
    api().map_err(str::to_string)?;
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

impl GpuKernel for HipKernel {
    fn binary(&self) -> &KernelBinary {
        &self.bin
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An open HIP device.
pub(crate) struct HipDevice {
    ordinal: usize,
    props: DeviceProperties,
    kernels: Mutex<HashMap<String, Arc<HipKernel>>>,
}

fn name_of(ordinal: usize) -> String {
    format!("hip:{ordinal}")
}

/// The first NUL-terminated `gfx<digits and letters>` string in `bytes` (the
/// architecture name in a `hipDeviceProp_t`), with its feature suffix.
fn gcn_arch_name(bytes: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 4 <= bytes.len() {
        if &bytes[i..i + 3] == b"gfx" && bytes[i + 3].is_ascii_alphanumeric() {
            let end = bytes[i..].iter().position(|&b| b == 0)? + i;
            let s = std::str::from_utf8(&bytes[i..end]).ok()?;
            let arch = s.split(':').next().unwrap_or("");
            if arch[3..].bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Some(s.to_string());
            }
        }
        i += 1;
    }
    None
}

/// Opens HIP device `ordinal` (once per process).
pub(crate) fn open(ordinal: usize) -> Result<Arc<HipDevice>, Error> {
    let name = format!("hip:{ordinal}");
    if let Err(why) = api() {
        return Err(Error::DeviceUnavailable {
            device: name,
            reason: why.to_string(),
        });
    }
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
    let attr = |a: std::os::raw::c_int, what: &str| -> Result<i32, Error> {
        let mut v = 0;
        // SAFETY: writes one int.
        check(ordinal, what, unsafe {
            h::hipDeviceGetAttribute(&mut v, a, ordinal as i32)
        })?;
        Ok(v)
    };
    let multiprocessors = attr(
        h::hipDeviceAttributeMultiprocessorCount,
        "querying the CU count",
    )?;
    let warp_size = attr(h::hipDeviceAttributeWarpSize, "querying the wavefront size")?;
    let shared = attr(
        h::hipDeviceAttributeMaxSharedMemoryPerBlock,
        "querying shared memory",
    )?;
    let shared_optin = attr(
        h::hipDeviceAttributeSharedMemPerBlockOptin,
        "querying shared memory",
    )
    .unwrap_or(shared);
    let mut name = [0 as std::os::raw::c_char; 256];
    // SAFETY: writes at most `name.len()` bytes, NUL-terminated.
    check(ordinal, "querying the device name", unsafe {
        h::hipDeviceGetName(name.as_mut_ptr(), name.len() as i32, ordinal as i32)
    })?;
    let mut total_memory = 0usize;
    // SAFETY: writes one size.
    check(ordinal, "querying the memory size", unsafe {
        h::hipDeviceTotalMem(&mut total_memory, ordinal as i32)
    })?;
    // The architecture name (`gfx942:sramecc+:xnack-`) is only in `hipDeviceProp_t`,
    // whose layout changed across ROCm versions: read it into a buffer larger than any
    // version's struct and take the one `gfx…` string in it.
    let mut props = vec![0u8; 16 * 1024];
    // SAFETY: writes at most sizeof(hipDeviceProp_t) of this runtime's version, which
    // is far below the buffer's size.
    check(ordinal, "querying device properties", unsafe {
        h::hipGetDeviceProperties(props.as_mut_ptr() as *mut c_void, ordinal as i32)
    })?;
    let arch = gcn_arch_name(&props).ok_or_else(|| Error::Driver {
        device: name_of(ordinal),
        what: "querying device properties".into(),
        message: "the runtime's device properties name no gfx architecture".into(),
    })?;
    let cstr = |s: &[std::os::raw::c_char]| {
        let bytes: Vec<u8> = s
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let target = arch.split(':').next().unwrap_or("").to_string();
    if !(1..=1024).contains(&warp_size) || multiprocessors < 0 || shared < 0 {
        return Err(Error::Driver {
            device: name_of(ordinal),
            what: "querying device properties".into(),
            message: format!(
                "implausible properties: {multiprocessors} CUs, wavefront {warp_size}, {shared} B shared"
            ),
        });
    }
    let dev = Arc::new(HipDevice {
        ordinal,
        props: DeviceProperties {
            name: cstr(&name),
            target,
            compute_capability: None,
            driver_version: None,
            multiprocessors: multiprocessors as u32,
            warp_size: warp_size as u32,
            shared_per_block: shared as usize,
            shared_per_block_optin: shared_optin.max(shared) as usize,
            total_memory,
            part: None,
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

    fn lock_kernels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<HipKernel>>> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn hip_stream(s: RawStream) -> h::hipStream_t {
    s.0 as usize as h::hipStream_t
}

fn hip_event(e: RawEvent) -> h::hipEvent_t {
    e.0 as usize as h::hipEvent_t
}

impl GpuBackend for HipDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Hip
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

    /// `hipMalloc` and `hipMemset` are synchronous: the allocation is ready for any
    /// stream.
    fn alloc(&self, bytes: usize, _stream: RawStream) -> Result<u64, Error> {
        let what = format!("allocating {bytes} bytes");
        self.set(&what)?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check_alloc(self.ordinal, &what, bytes, unsafe {
            h::hipMalloc(&mut ptr, bytes)
        })?;
        // SAFETY: `bytes` bytes were just allocated.
        if let Err(e) = check(self.ordinal, &what, unsafe { h::hipMemset(ptr, 0, bytes) }) {
            self.free(ptr as u64, RawStream::DEFAULT);
            return Err(e);
        }
        Ok(ptr as u64)
    }

    /// `hipFree` waits for the device's work.
    fn free(&self, ptr: u64, _stream: RawStream) {
        // SAFETY: allocated by hipMalloc on this device; freed once.
        unsafe {
            let _ = h::hipSetDevice(self.ordinal as i32);
            let _ = h::hipFree(ptr as *mut c_void);
        }
    }

    /// A zeroed symmetric heap of `bytes` bytes in *uncached* device memory
    /// (`hipExtMallocWithFlags(.., hipDeviceMallocUncached)`), exportable with
    /// `hipIpcGetMemHandle`.
    ///
    /// Why not `hipMalloc`: its memory is coarse-grained, which is coherent for
    /// device-scope synchronization only. ROCm's "Hardware atomics operation support"
    /// says system-scope atomics on coarse-grained memory do not achieve system-scope
    /// coherence, and LLVM's AMDGPUUsage ("Memory Model GFX942") keeps one agent's L2
    /// coherent with other agents' writes only through the memory type (MTYPE) of the
    /// pages: on MI300X a GPU could keep a stale line of its own heap in L2, so a wait
    /// could spin on an old signal value forever and pushed data could read stale.
    /// Uncached memory is always read from and written to memory, so a peer's writes
    /// are seen, and the system-scope release/acquire sequences the lowering emits
    /// around signals and waits (`buffer_wbl2 sc0 sc1` before a release, `buffer_inv
    /// sc0 sc1` after an acquire, `sc0 sc1` on the access; see
    /// `tessera_codegen::lower::arch`) order the data. AMD's MORI allocates its whole
    /// symmetric heap this way and exports it with `hipIpcGetMemHandle`, as this
    /// runtime does. The price: heap data is not cached, so a kernel that rereads
    /// gathered data many times should copy it to a plain buffer (or shared memory)
    /// first.
    fn alloc_exportable(&self, bytes: usize) -> Result<u64, Error> {
        let what = format!("allocating a symmetric heap of {bytes} bytes (uncached)");
        self.set(&what)?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check_alloc(self.ordinal, &what, bytes.max(1), unsafe {
            h::hipExtMallocWithFlags(&mut ptr, bytes.max(1), h::hipDeviceMallocUncached)
        })?;
        // SAFETY: `bytes.max(1)` bytes were just allocated.
        if let Err(e) = check(self.ordinal, &what, unsafe {
            h::hipMemset(ptr, 0, bytes.max(1))
        })
        .and_then(|_| self.synchronize(RawStream::DEFAULT))
        {
            self.free_exportable(ptr as u64);
            return Err(e);
        }
        Ok(ptr as u64)
    }

    fn free_exportable(&self, ptr: u64) {
        self.free(ptr, RawStream::DEFAULT);
    }

    fn htod(&self, dst: u64, data: &[u8], stream: RawStream) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        let what = "copying to the device";
        self.set(what)?;
        // SAFETY: the caller guarantees `dst` holds `data.len()` bytes; `data` lives
        // until the stream is synchronized below.
        check(self.ordinal, what, unsafe {
            h::hipMemcpyHtoDAsync(
                dst as *mut c_void,
                data.as_ptr() as *mut c_void,
                data.len(),
                hip_stream(stream),
            )
        })?;
        self.synchronize(stream)
    }

    fn dtoh(&self, src: u64, out: &mut [u8], stream: RawStream) -> Result<(), Error> {
        if out.is_empty() {
            return Ok(());
        }
        let what = "copying to the host";
        self.set(what)?;
        // SAFETY: the caller guarantees `src` holds `out.len()` bytes; `out` lives
        // until the stream is synchronized below.
        check(self.ordinal, what, unsafe {
            h::hipMemcpyDtoHAsync(
                out.as_mut_ptr() as *mut c_void,
                src as *mut c_void,
                out.len(),
                hip_stream(stream),
            )
        })?;
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
        self.set(what)?;
        // SAFETY: both ranges hold at least `bytes` bytes of live device memory.
        check(self.ordinal, what, unsafe {
            h::hipMemcpyPeerAsync(
                dst as *mut c_void,
                self.ordinal as i32,
                src as *const c_void,
                src_dev.ordinal() as i32,
                bytes,
                hip_stream(stream),
            )
        })
    }

    fn poke_u32(&self, dst: u64, value: u32) -> Result<(), Error> {
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

    fn synchronize(&self, stream: RawStream) -> Result<(), Error> {
        let what = "synchronizing";
        self.set(what)?;
        // SAFETY: a stream of this device, or the null stream.
        // The null stream is HIP's legacy default stream: synchronizing it also waits
        // for the work queued before on blocking streams.
        check(self.ordinal, what, unsafe {
            h::hipStreamSynchronize(hip_stream(stream))
        })
    }

    fn synchronize_device(&self) -> Result<(), Error> {
        let what = "synchronizing the device";
        self.set(what)?;
        // SAFETY: plain call.
        check(self.ordinal, what, unsafe { h::hipDeviceSynchronize() })
    }

    fn stream_create(&self) -> Result<RawStream, Error> {
        let what = "creating a stream";
        self.set(what)?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one handle; flags 0: a blocking stream, ordered with the null
        // stream.
        check(self.ordinal, what, unsafe {
            h::hipStreamCreateWithFlags(&mut stream, 0)
        })?;
        Ok(RawStream(stream as usize as u64))
    }

    /// A stream whose kernels run on CUs `units` only (`hipExtStreamCreateWithCUMask`,
    /// one bit per CU in 32-bit words).
    fn part_stream(&self, units: std::ops::Range<u32>) -> Result<(RawStream, bool), Error> {
        let what = "creating a CU-masked stream";
        self.set(what)?;
        let cus = self.props.multiprocessors;
        let mut mask = vec![0u32; cus.div_ceil(32) as usize];
        for cu in units.filter(|&c| c < cus) {
            mask[(cu / 32) as usize] |= 1 << (cu % 32);
        }
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one handle; `mask` holds `mask.len()` words.
        check(self.ordinal, what, unsafe {
            h::hipExtStreamCreateWithCUMask(&mut stream, mask.len() as u32, mask.as_ptr())
        })?;
        Ok((RawStream(stream as usize as u64), true))
    }

    fn stream_destroy(&self, stream: RawStream) {
        if stream != RawStream::DEFAULT {
            // SAFETY: created by `stream_create` on this device, destroyed once.
            unsafe {
                let _ = h::hipSetDevice(self.ordinal as i32);
                let _ = h::hipStreamDestroy(hip_stream(stream));
            }
        }
    }

    fn event_create(&self) -> Result<RawEvent, Error> {
        let what = "creating an event";
        self.set(what)?;
        let mut e = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(self.ordinal, what, unsafe { h::hipEventCreate(&mut e) })?;
        Ok(RawEvent(e as usize as u64))
    }

    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<(), Error> {
        let what = "recording an event";
        self.set(what)?;
        // SAFETY: a live event and stream of this device.
        check(self.ordinal, what, unsafe {
            h::hipEventRecord(hip_event(event), hip_stream(stream))
        })
    }

    fn event_synchronize(&self, event: RawEvent) -> Result<(), Error> {
        // SAFETY: a live event.
        check(self.ordinal, "waiting for an event", unsafe {
            h::hipEventSynchronize(hip_event(event))
        })
    }

    fn event_elapsed(&self, start: RawEvent, end: RawEvent) -> Result<Duration, Error> {
        let mut ms = 0f32;
        // SAFETY: live, recorded events.
        check(self.ordinal, "reading an event's time", unsafe {
            h::hipEventElapsedTime(&mut ms, hip_event(start), hip_event(end))
        })?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    fn event_destroy(&self, event: RawEvent) {
        // SAFETY: created by `event_create` on this device, destroyed once.
        unsafe {
            let _ = h::hipSetDevice(self.ordinal as i32);
            let _ = h::hipEventDestroy(hip_event(event));
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
        let k: Arc<HipKernel> = self
            .lock_kernels()
            .entry(key.to_string())
            .or_insert(k)
            .clone();
        Ok(k)
    }

    fn occupancy(&self, kernel: &dyn GpuKernel) -> Result<u32, Error> {
        let k: &HipKernel = downcast_kernel(kernel, &self.id())?;
        let what = format!("querying the occupancy of `{}`", k.bin.name);
        self.set(&what)?;
        let mut per_cu = 0;
        // SAFETY: writes one int; live function.
        check(self.ordinal, &what, unsafe {
            h::hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_cu,
                k.func,
                k.bin.num_threads as i32,
                0,
            )
        })?;
        Ok(per_cu.max(0) as u32)
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
        let k: &HipKernel = downcast_kernel(kernel, &self.id())?;
        let what = format!("launching kernel `{}`", k.bin.name);
        if cluster != [1, 1, 1] {
            return Err(Error::Launch {
                kernel: k.bin.name.clone(),
                reason: "AMD GPUs have no thread-block clusters".into(),
            });
        }
        self.check_launch(kernel, grid, waits, GridLimits::Hip)?;
        self.set(&what)?;
        // Each parameter's value lives in `args`; HIP reads them through pointers.
        let mut params: Vec<_> = args.iter().map(GpuArg::as_param).collect();
        // SAFETY: the parameters match the kernel's (checked by `launch`), the
        // pointers stay valid for the call (HIP copies the values), and `stream` is
        // a stream of this device.
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
                hip_stream(stream),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn enable_peer_access(&self, other: &dyn GpuBackend) -> Result<(), Error> {
        if other.kind() != DeviceKind::Hip {
            return Err(Error::DeviceUnavailable {
                device: other.id(),
                reason: format!("no peer access between {} and {}", self.id(), other.id()),
            });
        }
        let what = format!("enabling peer access to {}", other.id());
        self.set(&what)?;
        // SAFETY: plain call.
        let e = unsafe { h::hipDeviceEnablePeerAccess(other.ordinal() as i32, 0) };
        if e == h::hipError_t::hipErrorPeerAccessAlreadyEnabled {
            return Ok(());
        }
        check(self.ordinal, &what, e)
    }

    fn ipc_handle(&self, ptr: u64) -> Result<Vec<u8>, Error> {
        let what = "exporting the heap (hipIpcGetMemHandle)";
        self.set(what)?;
        // SAFETY: zeroed plain data, written by HIP.
        let mut hd: h::hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
        // SAFETY: `ptr` is the base of an exportable allocation.
        check(self.ordinal, what, unsafe {
            h::hipIpcGetMemHandle(&mut hd, ptr as *mut c_void)
        })?;
        Ok(hd.reserved.iter().map(|&c| c as u8).collect())
    }

    fn ipc_open(&self, handle: &[u8]) -> Result<u64, Error> {
        let what = "opening a peer's heap (hipIpcOpenMemHandle)";
        // SAFETY: zeroed plain data.
        let mut hd: h::hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
        if handle.len() != hd.reserved.len() {
            return Err(Error::Driver {
                device: self.id(),
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

    fn ipc_close(&self, ptr: u64) {
        // SAFETY: opened by `ipc_open`, closed once.
        unsafe {
            let _ = h::hipSetDevice(self.ordinal as i32);
            let _ = h::hipIpcCloseMemHandle(ptr as *mut c_void);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arch_name_is_found_in_any_layout() {
        let mut props = vec![0u8; 2048];
        props[..19].copy_from_slice(b"AMD Instinct MI300X");
        props[1200..1222].copy_from_slice(b"gfx942:sramecc+:xnack-");
        assert_eq!(
            gcn_arch_name(&props).as_deref(),
            Some("gfx942:sramecc+:xnack-")
        );
        let mut props = vec![0u8; 512];
        props[300..306].copy_from_slice(b"gfx90a");
        assert_eq!(gcn_arch_name(&props).as_deref(), Some("gfx90a"));
        // Not an architecture: no name, or `gfx` not followed by one.
        assert_eq!(gcn_arch_name(&[0u8; 64]), None);
        assert_eq!(gcn_arch_name(b"the gfx-card\0"), None);
    }

    #[test]
    fn error_codes_stay_integers() {
        // A code no HIP version defines is described by number, not undefined.
        let s = describe(h::hipError_t(123_456));
        assert!(s.contains("123456") || s.contains("no HIP runtime"), "{s}");
    }
}

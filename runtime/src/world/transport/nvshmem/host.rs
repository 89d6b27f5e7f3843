//! NVSHMEM's host library, for GPU ranks on several nodes (issue 19): loaded at run
//! time (`libnvshmem_host.so.3`: NVSHMEM's `lib/`, or the `nvidia/nvshmem/lib` folder
//! of the `nvidia-nvshmem-cu12` wheel, which PyTorch installs), and bootstrapped with
//! a unique id that rank 0 draws and the TCP rendezvous ([`rendezvous`])
//! hands to every rank, authenticated by the job's secret.
//!
//! The steps, for rank `r` of `n`, one process per GPU:
//!
//! 1. [`NvshmemHost::load`] finds and opens the library;
//! 2. [`bootstrap_unique_id`]: rank 0 draws the id (`nvshmemx_get_uniqueid`), every
//!    rank gets it from the rendezvous at `MASTER_ADDR:MASTER_PORT`;
//! 3. [`NvshmemHost::init`] binds the rank's CUDA device and initializes NVSHMEM
//!    with the id (`nvshmemx_set_attr_uniqueid_args`, then the host library's own
//!    `nvshmemx_hostlib_init_attr` with `NVSHMEMX_INIT_WITH_UNIQUEID`: the kernels'
//!    device side is NVSHMEM's bitcode, linked by the compiler); the returned
//!    [`Session`] allocates symmetric memory (`nvshmem_malloc`), maps peers on the
//!    node (`nvshmem_ptr`) and finalizes NVSHMEM when dropped.
//!
//! What fails, fails with an error that says why and what to do: no library (the
//! folders searched and [`NVSHMEM_HOME_VAR`]), a library without one of the functions
//! (another major version), no CUDA driver or device (checked before NVSHMEM is
//! called: its own failures end the process), a second session in one process.
//!
//! The structures passed to the library are NVSHMEM 3's (`nvshmemx_uniqueid_v1`,
//! `nvshmemx_init_attr_v2`), with the sizes its headers assert.

use std::ffi::{c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use tessera_ir::comm::NVSHMEM_HOME_VAR;

use crate::device::{Backend, Device};
use crate::error::Error;
use crate::world::transport::rendezvous;

/// The host library's file name (NVSHMEM 3).
pub const HOST_LIBRARY: &str = "libnvshmem_host.so.3";

/// Bytes of NVSHMEM's unique id (`nvshmemx_uniqueid_t`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// NVSHMEM's unique id: rank 0 draws it, every rank initializes with it.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId(version {:#x})", self.version())
    }
}

impl UniqueId {
    /// The version word NVSHMEM 3 writes first (`(1 << 16) + 128`).
    pub const VERSION: u32 = (1 << 16) + UNIQUE_ID_BYTES as u32;

    /// The id's version word.
    pub fn version(&self) -> u32 {
        u32::from_ne_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }

    fn empty() -> UniqueId {
        let mut id = UniqueId([0; UNIQUE_ID_BYTES]);
        id.0[..4].copy_from_slice(&Self::VERSION.to_ne_bytes());
        id
    }
}

/// `nvshmemx_uniqueid_args_v1`.
#[repr(C)]
struct UidArgs {
    version: c_int,
    id: *const UniqueId,
    myrank: c_int,
    nranks: c_int,
}

/// `nvshmemx_init_args_v2`.
#[repr(C)]
struct InitArgs {
    version: c_int,
    uid_args: UidArgs,
    cuda_device_id: c_int,
    content: [u8; 92],
}

/// `nvshmemx_init_attr_v2`.
#[repr(C)]
struct InitAttr {
    version: c_int,
    mpi_comm: *mut c_void,
    args: InitArgs,
}

const _: () = assert!(std::mem::size_of::<UniqueId>() == 128);
const _: () = assert!(std::mem::size_of::<UidArgs>() == 24);
const _: () = assert!(std::mem::size_of::<InitArgs>() == 128);
const _: () = assert!(std::mem::size_of::<InitAttr>() == 144);

/// `NVSHMEMX_INIT_WITH_UNIQUEID`.
const INIT_WITH_UNIQUEID: c_uint = 1 << 3;

impl InitAttr {
    /// `NVSHMEMX_INIT_ATTR_INITIALIZER`: version words, no MPI communicator, no id.
    fn new() -> InitAttr {
        InitAttr {
            version: (2 << 16) + 144,
            mpi_comm: std::ptr::null_mut(),
            args: InitArgs {
                version: (2 << 16) + 128,
                uid_args: UidArgs {
                    version: (1 << 16) + 24,
                    id: std::ptr::null(),
                    myrank: -1,
                    nranks: -1,
                },
                cuda_device_id: -1,
                content: [0; 92],
            },
        }
    }
}

type GetUid = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type SetUidArgs = unsafe extern "C" fn(c_int, c_int, *const UniqueId, *mut InitAttr) -> c_int;
type InitAttrFn = unsafe extern "C" fn(c_uint, *mut InitAttr) -> c_int;
type Finalize = unsafe extern "C" fn();
type Int = unsafe extern "C" fn() -> c_int;
type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void);
type Ptr = unsafe extern "C" fn(*const c_void, c_int) -> *mut c_void;
type Barrier = unsafe extern "C" fn();
type ModuleInit = unsafe extern "C" fn(*mut c_void) -> c_int;
type Rma = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int);
type Fetch64 = unsafe extern "C" fn(*const u64, c_int) -> u64;
type Cas64 = unsafe extern "C" fn(*mut u64, u64, u64, c_int) -> u64;
type Cas32 = unsafe extern "C" fn(*mut u32, u32, u32, c_int) -> u32;
type FetchAdd64 = unsafe extern "C" fn(*mut u64, u64, c_int) -> u64;

/// The host library's functions Tessera calls (each must be there).
pub const HOST_FUNCTIONS: &[&str] = &[
    "nvshmemx_get_uniqueid",
    "nvshmemx_set_attr_uniqueid_args",
    "nvshmemx_hostlib_init_attr",
    "nvshmemx_hostlib_finalize",
    "nvshmemx_init_status",
    "nvshmem_my_pe",
    "nvshmem_n_pes",
    "nvshmem_malloc",
    "nvshmem_free",
    "nvshmem_ptr",
    "nvshmem_barrier_all",
    "nvshmemx_cumodule_init",
    "nvshmem_getmem",
    "nvshmem_putmem",
    "nvshmem_quiet",
    "nvshmem_uint64_atomic_fetch",
    "nvshmem_uint64_atomic_compare_swap",
    "nvshmem_uint32_atomic_compare_swap",
    "nvshmem_uint64_atomic_fetch_add",
];

struct Fns {
    get_uid: GetUid,
    set_uid_args: SetUidArgs,
    init_attr: InitAttrFn,
    finalize: Finalize,
    init_status: Int,
    my_pe: Int,
    n_pes: Int,
    malloc: Malloc,
    free: Free,
    ptr: Ptr,
    barrier_all: Barrier,
    cumodule_init: ModuleInit,
    getmem: Rma,
    putmem: Rma,
    quiet: Barrier,
    fetch64: Fetch64,
    cas64: Cas64,
    cas32: Cas32,
    fetch_add64: FetchAdd64,
}

impl Fns {
    fn resolve(lib: &libloading::Library, path: &Path) -> Result<Fns, Error> {
        fn get<T: Copy>(lib: &libloading::Library, path: &Path, name: &str) -> Result<T, Error> {
            // SAFETY: `T` is the function's C signature in NVSHMEM 3's headers
            // (`nvshmemx_api.h`, `nvshmem_api.h`); the pointer is used only while the
            // library stays loaded (`NvshmemHost` owns both).
            unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s) }.map_err(|e| {
                Error::Usage(format!(
                    "{} has no `{name}` ({e}): Tessera needs NVSHMEM 3's host library",
                    path.display()
                ))
            })
        }
        let f = HOST_FUNCTIONS;
        Ok(Fns {
            get_uid: get(lib, path, f[0])?,
            set_uid_args: get(lib, path, f[1])?,
            init_attr: get(lib, path, f[2])?,
            finalize: get(lib, path, f[3])?,
            init_status: get(lib, path, f[4])?,
            my_pe: get(lib, path, f[5])?,
            n_pes: get(lib, path, f[6])?,
            malloc: get(lib, path, f[7])?,
            free: get(lib, path, f[8])?,
            ptr: get(lib, path, f[9])?,
            barrier_all: get(lib, path, f[10])?,
            cumodule_init: get(lib, path, f[11])?,
            getmem: get(lib, path, f[12])?,
            putmem: get(lib, path, f[13])?,
            quiet: get(lib, path, f[14])?,
            fetch64: get(lib, path, f[15])?,
            cas64: get(lib, path, f[16])?,
            cas32: get(lib, path, f[17])?,
            fetch_add64: get(lib, path, f[18])?,
        })
    }
}

/// NVSHMEM's host library, loaded ([`NvshmemHost::load`]).
pub struct NvshmemHost {
    fns: Fns,
    path: PathBuf,
    /// A session is live ([`NvshmemHost::init`]): NVSHMEM is initialized once at a
    /// time per process.
    live: AtomicBool,
    // Dropped last: the function pointers above point into it.
    _lib: libloading::Library,
}

impl std::fmt::Debug for NvshmemHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NvshmemHost({})", self.path.display())
    }
}

/// The library of this process, once loaded (it is never unloaded: NVSHMEM keeps
/// threads and state of its own).
static LOADED: Mutex<Option<Arc<NvshmemHost>>> = Mutex::new(None);

impl NvshmemHost {
    /// The folders searched for [`HOST_LIBRARY`], in order (see
    /// [`tessera_ir::comm::nvshmem_dirs`]).
    pub fn search_dirs() -> Vec<PathBuf> {
        tessera_ir::comm::nvshmem_dirs()
    }

    /// Finds and opens the host library (once per process; later calls return the
    /// same library), or an error naming the folders searched and
    /// [`NVSHMEM_HOME_VAR`].
    pub fn load() -> Result<Arc<NvshmemHost>, Error> {
        let mut g = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = g.as_ref() {
            return Ok(h.clone());
        }
        let h = Arc::new(Self::find(&Self::search_dirs())?);
        *g = Some(h.clone());
        Ok(h)
    }

    /// Opens [`HOST_LIBRARY`] from the folder `dir` (its `lib/`, then itself), not
    /// cached: for a program that knows where its NVSHMEM is. Use one library per
    /// process.
    pub fn load_from(dir: &Path) -> Result<Arc<NvshmemHost>, Error> {
        Self::find(&[dir.join("lib"), dir.to_path_buf()]).map(Arc::new)
    }

    fn find(dirs: &[PathBuf]) -> Result<NvshmemHost, Error> {
        let Some(path) = dirs
            .iter()
            .map(|d| d.join(HOST_LIBRARY))
            .find(|p| p.is_file())
        else {
            let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            return Err(Error::Usage(format!(
                "{HOST_LIBRARY} (NVSHMEM's host library) was not found in {}: set {NVSHMEM_HOME_VAR} to an NVSHMEM installation (for example the `nvidia/nvshmem` folder the pip package nvidia-nvshmem-cu12 installs in site-packages)",
                searched.join(", ")
            )));
        };
        Self::open(&path)
    }

    fn open(path: &Path) -> Result<NvshmemHost, Error> {
        // SAFETY: loading runs the library's initializers; NVSHMEM's host library
        // only registers its own state there (it starts nothing before
        // `nvshmemx_hostlib_init_attr`).
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
            Error::Usage(format!(
                "{} (NVSHMEM's host library) could not be loaded: {e}",
                path.display()
            ))
        })?;
        Ok(NvshmemHost {
            fns: Fns::resolve(&lib, path)?,
            path: path.to_path_buf(),
            live: AtomicBool::new(false),
            _lib: lib,
        })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Draws a unique id (`nvshmemx_get_uniqueid`: rank 0 does, once per job). It
    /// names this host's bootstrap address; no GPU is needed.
    pub fn unique_id(&self) -> Result<UniqueId, Error> {
        let mut id = UniqueId::empty();
        // SAFETY: `id` is a writable `nvshmemx_uniqueid_t` with its version set.
        let rc = unsafe { (self.fns.get_uid)(&mut id) };
        if rc != 0 {
            return Err(Error::Usage(format!(
                "nvshmemx_get_uniqueid failed (status {rc})"
            )));
        }
        Ok(id)
    }

    /// Initializes NVSHMEM as rank `rank` of `size` with `id` (every rank's the
    /// same), on the CUDA device `device` (bound to this thread first). The CUDA
    /// driver and the device are checked before NVSHMEM is called: NVSHMEM ends the
    /// process on some of its own failures.
    pub fn init(
        self: &Arc<Self>,
        rank: u32,
        size: u32,
        id: &UniqueId,
        device: &Device,
    ) -> Result<Session, Error> {
        if size == 0 || rank >= size {
            return Err(Error::Usage(format!(
                "NVSHMEM: rank {rank} of a world of {size}"
            )));
        }
        if id.version() != UniqueId::VERSION {
            return Err(Error::Usage(format!(
                "NVSHMEM: the unique id has version {:#x}, not NVSHMEM 3's {:#x} (was it drawn by this library?)",
                id.version(),
                UniqueId::VERSION
            )));
        }
        let cuda = match &device.backend {
            Backend::Gpu(g) => g
                .as_any()
                .downcast_ref::<crate::backend::cuda::CudaDevice>()
                .map(|d| d.make_current()),
            _ => None,
        };
        match cuda {
            Some(r) => r?,
            None => {
                return Err(Error::DeviceUnavailable {
                    device: device.id(),
                    reason: if crate::backend::cuda::driver_present() {
                        "NVSHMEM runs on CUDA devices; this rank's device is not one".into()
                    } else {
                        format!(
                            "NVSHMEM needs a CUDA device, and {}",
                            crate::backend::cuda::NO_DRIVER
                        )
                    },
                });
            }
        }
        if self.live.swap(true, Ordering::AcqRel) {
            return Err(Error::Usage(
                "NVSHMEM is already initialized in this process (one Session at a time)".into(),
            ));
        }
        let mut attr = InitAttr::new();
        let (r, n) = (rank as c_int, size as c_int);
        // SAFETY: `id` and `attr` are NVSHMEM 3's structures, initialized with their
        // version words; the library copies the id.
        let rc = unsafe { (self.fns.set_uid_args)(r, n, id, &mut attr) };
        let rc = if rc == 0 {
            // SAFETY: as above; the device's context is current on this thread.
            unsafe { (self.fns.init_attr)(INIT_WITH_UNIQUEID, &mut attr) }
        } else {
            rc
        };
        if rc != 0 {
            self.live.store(false, Ordering::Release);
            return Err(Error::Comm {
                rank,
                message: format!("NVSHMEM's initialization failed (status {rc})"),
            });
        }
        Ok(Session {
            host: self.clone(),
            abandoned: AtomicBool::new(false),
            calls: Mutex::new(()),
        })
    }
}

/// NVSHMEM initialized in this process ([`NvshmemHost::init`]); finalized when
/// dropped. Symmetric allocations must be freed before.
pub struct Session {
    host: Arc<NvshmemHost>,
    /// Set when the world using the session failed: finalizing (collective) could
    /// then wait for a PE that is gone, so the process leaves NVSHMEM to its exit.
    abandoned: AtomicBool,
    /// Host-side communication calls, one at a time.
    calls: Mutex<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session(PE {} of {})", self.my_pe(), self.n_pes())
    }
}

impl Session {
    /// This process's PE (`nvshmem_my_pe`).
    pub fn my_pe(&self) -> u32 {
        // SAFETY: NVSHMEM is initialized while the session lives.
        unsafe { (self.host.fns.my_pe)() }.max(0) as u32
    }

    /// The number of PEs (`nvshmem_n_pes`).
    pub fn n_pes(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (self.host.fns.n_pes)() }.max(0) as u32
    }

    /// Whether NVSHMEM reports itself initialized (`nvshmemx_init_status`).
    pub fn initialized(&self) -> bool {
        // SAFETY: callable at any time.
        (unsafe { (self.host.fns.init_status)() }) > 0
    }

    /// `bytes` of symmetric device memory (`nvshmem_malloc`: collective, every PE
    /// allocates the same sizes in the same order), as a device address.
    pub fn malloc(&self, bytes: usize) -> Result<u64, Error> {
        // SAFETY: NVSHMEM is initialized; the call is collective by contract.
        let p = unsafe { (self.host.fns.malloc)(bytes) };
        if p.is_null() {
            return Err(Error::Comm {
                rank: self.my_pe(),
                message: format!(
                    "nvshmem_malloc of {bytes} bytes failed (is NVSHMEM_SYMMETRIC_SIZE large enough?)"
                ),
            });
        }
        Ok(p as u64)
    }

    /// Frees what [`Session::malloc`] returned (collective).
    ///
    /// # Safety
    /// `addr` came from [`Session::malloc`] of this session, is freed once, and no
    /// kernel or copy uses it any more.
    pub unsafe fn free(&self, addr: u64) {
        // SAFETY: the caller's contract.
        unsafe { (self.host.fns.free)(addr as *mut c_void) }
    }

    /// Where PE `pe`'s copy of the symmetric address `addr` is mapped on this GPU
    /// (`nvshmem_ptr`): `Some` for peers reached by loads and stores (this GPU, its
    /// node's peers over NVLink or PCIe), `None` for the others, which only the
    /// engine's functions reach.
    pub fn ptr(&self, addr: u64, pe: u32) -> Option<u64> {
        // SAFETY: NVSHMEM is initialized; `nvshmem_ptr` only computes an address.
        let p = unsafe { (self.host.fns.ptr)(addr as *const c_void, pe as c_int) };
        (!p.is_null()).then_some(p as u64)
    }

    /// Every PE's host-side barrier, with its memory completed (`nvshmem_barrier_all`).
    pub fn barrier_all(&self) {
        let _one = self.lock();
        // SAFETY: NVSHMEM is initialized.
        unsafe { (self.host.fns.barrier_all)() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Initializes NVSHMEM's device state in a loaded CUDA module
    /// (`nvshmemx_cumodule_init`): needed by every module linked with NVSHMEM's
    /// device library before its kernels run.
    ///
    /// # Safety
    /// `module` is a live `CUmodule` of the device NVSHMEM was initialized on.
    pub unsafe fn cumodule_init(&self, module: *mut c_void) -> Result<(), String> {
        let _one = self.lock();
        // SAFETY: the caller's contract; NVSHMEM is initialized.
        let rc = unsafe { (self.host.fns.cumodule_init)(module) };
        match rc {
            0 => Ok(()),
            rc => Err(format!("nvshmemx_cumodule_init failed (status {rc})")),
        }
    }

    /// Copies `bytes` bytes from PE `pe`'s copy of the symmetric address `src` to
    /// `dst` (`nvshmem_getmem`, host-initiated; complete on return).
    ///
    /// # Safety
    /// `src..src+bytes` lies in one symmetric allocation, `dst..dst+bytes` in
    /// symmetric memory of this PE, and the calling thread has the session's CUDA
    /// context current.
    pub(crate) unsafe fn getmem(&self, dst: u64, src: u64, bytes: usize, pe: u32) {
        let _one = self.lock();
        // SAFETY: the caller's contract.
        unsafe {
            (self.host.fns.getmem)(dst as *mut c_void, src as *const c_void, bytes, pe as c_int)
        }
    }

    /// Copies `bytes` bytes from `src` on this PE to PE `pe`'s copy of the symmetric
    /// address `dst` (`nvshmem_putmem`: `src` is free again on return, the data is
    /// delivered at the next [`Session::quiet`]).
    ///
    /// # Safety
    /// As [`Session::getmem`], `dst` being the symmetric range and `src` this PE's.
    pub(crate) unsafe fn putmem(&self, dst: u64, src: u64, bytes: usize, pe: u32) {
        let _one = self.lock();
        // SAFETY: the caller's contract.
        unsafe {
            (self.host.fns.putmem)(dst as *mut c_void, src as *const c_void, bytes, pe as c_int)
        }
    }

    /// Completes this PE's puts (`nvshmem_quiet`).
    pub(crate) fn quiet(&self) {
        let _one = self.lock();
        // SAFETY: NVSHMEM is initialized.
        unsafe { (self.host.fns.quiet)() }
    }

    /// Atomic read of PE `pe`'s `u64` at symmetric address `addr`.
    ///
    /// # Safety
    /// `addr` is an 8-byte aligned symmetric address.
    pub(crate) unsafe fn fetch_u64(&self, addr: u64, pe: u32) -> u64 {
        let _one = self.lock();
        // SAFETY: the caller's contract.
        unsafe { (self.host.fns.fetch64)(addr as *const u64, pe as c_int) }
    }

    /// Atomic compare-and-swap of PE `pe`'s `u64` at symmetric address `addr`:
    /// returns the value found.
    ///
    /// # Safety
    /// As [`Session::fetch_u64`].
    pub(crate) unsafe fn cas_u64(&self, addr: u64, expected: u64, desired: u64, pe: u32) -> u64 {
        let _one = self.lock();
        // SAFETY: the caller's contract.
        unsafe { (self.host.fns.cas64)(addr as *mut u64, expected, desired, pe as c_int) }
    }

    /// [`Session::cas_u64`] on a `u32` (4-byte aligned).
    ///
    /// # Safety
    /// `addr` is a 4-byte aligned symmetric address.
    pub(crate) unsafe fn cas_u32(&self, addr: u64, expected: u32, desired: u32, pe: u32) -> u32 {
        let _one = self.lock();
        // SAFETY: the caller's contract.
        unsafe { (self.host.fns.cas32)(addr as *mut u32, expected, desired, pe as c_int) }
    }

    /// Atomic fetch-and-add on PE `pe`'s `u64` at symmetric address `addr`.
    ///
    /// # Safety
    /// As [`Session::fetch_u64`].
    pub(crate) unsafe fn fetch_add_u64(&self, addr: u64, v: u64, pe: u32) -> u64 {
        let _one = self.lock();
        // SAFETY: the caller's contract.
        unsafe { (self.host.fns.fetch_add64)(addr as *mut u64, v, pe as c_int) }
    }

    /// Marks the session's world as failed: dropping the session then leaves NVSHMEM
    /// unfinalized (the process's exit cleans up) instead of finalizing, which
    /// waits for every PE.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        crate::backend::cuda::set_module_init(None);
        if !self.abandoned.load(Ordering::Acquire) {
            // SAFETY: NVSHMEM was initialized by this session, and is finalized once.
            unsafe { (self.host.fns.finalize)() };
        }
        self.host.live.store(false, Ordering::Release);
    }
}

/// Whether PTX text was linked with NVSHMEM's device library: it defines NVSHMEM's
/// device state (`nvshmemi_device_state_d`), which `nvshmemx_cumodule_init` fills
/// after the module is loaded. The CUDA backend does that for every such module,
/// through the process's NVSHMEM session (an NVSHMEM world's), and refuses to run
/// one without a session.
pub fn links_device_library(ptx: &str) -> bool {
    crate::backend::cuda::links_nvshmem(ptx)
}

/// Makes `session` initialize every CUDA module linked with NVSHMEM that this process
/// loads from now on, until the session is dropped.
pub(crate) fn init_modules_with(session: &Arc<Session>) {
    let weak = Arc::downgrade(session);
    crate::backend::cuda::set_module_init(Some(Arc::new(move |module| {
        let s = weak
            .upgrade()
            .ok_or_else(|| "the NVSHMEM session has ended".to_string())?;
        // SAFETY: the CUDA backend passes the live module it has just loaded, on the
        // device of the world whose session this is.
        unsafe { s.cumodule_init(module.cast()) }
    })));
}

/// Step 2: rank 0 draws NVSHMEM's unique id and every rank of `size` gets it through
/// the TCP rendezvous at `addr` (`MASTER_ADDR:MASTER_PORT`), authenticated with
/// `secret` ([`rendezvous::exchange`]); errors are bounded by `timeout`.
pub fn bootstrap_unique_id(
    host: &NvshmemHost,
    addr: &str,
    rank: u32,
    size: u32,
    secret: &[u8],
    timeout: Duration,
) -> Result<UniqueId, Error> {
    let mine = if rank == 0 {
        host.unique_id()?.0.to_vec()
    } else {
        Vec::new()
    };
    let all = rendezvous::exchange(addr, rank, size, secret, &mine, timeout)?;
    let first = all.first().map(Vec::as_slice).unwrap_or_default();
    let bytes: [u8; UNIQUE_ID_BYTES] = first.try_into().map_err(|_| Error::Comm {
        rank,
        message: format!(
            "the rendezvous brought rank 0's NVSHMEM unique id as {} bytes, not {UNIQUE_ID_BYTES}",
            first.len()
        ),
    })?;
    Ok(UniqueId(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_nvshmem_3s_layout() {
        let a = InitAttr::new();
        let base = &a as *const InitAttr as usize;
        let at = |p: *const u8| p as usize - base;
        assert_eq!(at(&a.mpi_comm as *const _ as *const u8), 8);
        assert_eq!(at(&a.args as *const _ as *const u8), 16);
        assert_eq!(at(&a.args.uid_args as *const _ as *const u8), 24);
        assert_eq!(at(&a.args.uid_args.id as *const _ as *const u8), 32);
        assert_eq!(at(&a.args.uid_args.myrank as *const _ as *const u8), 40);
        assert_eq!(at(&a.args.cuda_device_id as *const _ as *const u8), 48);
        assert_eq!(UniqueId::empty().version(), (1 << 16) + 128);
    }
}

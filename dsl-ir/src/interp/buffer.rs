//! Device memory of the CPU device: [`HostBuffer`], element access and atomics.
//!
//! A buffer is a `Box<[AtomicU64]>`; each element is accessed with a relaxed atomic load
//! or store of its own width (`AtomicU32::from_ptr` and friends), so that many program
//! instances running on rayon threads may read and write one buffer concurrently without
//! undefined behaviour (on x86 these compile to plain moves). Atomic ops use real atomic
//! read-modify-write instructions of the element width (CAS loops for floats).

use std::sync::Arc;
use std::sync::atomic::{
    AtomicI8, AtomicI16, AtomicI32, AtomicI64, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering,
    fence,
};

use half::{bf16, f16};

use super::InterpError;
use super::minmax::{fmax, fmin};
use crate::ir::{AtomicOp, MemOrder};
use crate::types::ScalarType;

pub(crate) mod sealed {
    use std::sync::atomic::Ordering;

    /// Raw element access; implemented for the element types only.
    pub trait Mem: Sized {
        /// Reads element `i`.
        ///
        /// # Safety
        /// `base` must point to a live, 8-byte aligned buffer of atomics holding at least
        /// `i + 1` elements of this type.
        unsafe fn load(base: *const u8, i: usize) -> Self;
        /// Writes element `i`.
        ///
        /// # Safety
        /// As for [`Mem::load`].
        unsafe fn store(base: *const u8, i: usize, v: Self);
        /// Atomic read-modify-write of element `i`; `None` when the op is not defined on
        /// this type.
        ///
        /// # Safety
        /// As for [`Mem::load`].
        unsafe fn rmw(
            base: *const u8,
            i: usize,
            op: super::AtomicOp,
            v: Self,
            o: Ordering,
        ) -> Option<Self>;
        /// Atomic compare-and-swap of element `i`, returning the old value; `None` for
        /// floats and `i1`.
        ///
        /// # Safety
        /// As for [`Mem::load`].
        unsafe fn cas(base: *const u8, i: usize, exp: Self, des: Self, o: Ordering)
        -> Option<Self>;
    }
}

/// A Rust type that is the in-memory form of a [`ScalarType`]: `bool` (`i1`, one byte),
/// `i8`..`i64`, `u8`..`u64`, [`half::f16`], [`half::bf16`], `f32`, `f64`,
/// [`crate::fp8::F8E4M3`], [`crate::fp8::F8E5M2`].
/// Sealed: implemented for exactly these types.
pub trait Element: sealed::Mem + Copy + Send + Sync + 'static {
    /// The scalar type this Rust type represents.
    const TY: ScalarType;
}

/// Failure ordering of a CAS whose success ordering is `o`.
fn fail_order(o: Ordering) -> Ordering {
    match o {
        Ordering::Acquire | Ordering::AcqRel => Ordering::Acquire,
        Ordering::SeqCst => Ordering::SeqCst,
        _ => Ordering::Relaxed,
    }
}

/// The std ordering of an IR memory order (scope is ignored on the CPU).
pub(crate) fn std_order(o: MemOrder) -> Ordering {
    match o {
        MemOrder::Relaxed => Ordering::Relaxed,
        MemOrder::Acquire => Ordering::Acquire,
        MemOrder::Release => Ordering::Release,
        MemOrder::AcqRel => Ordering::AcqRel,
    }
}

macro_rules! int_elem {
    ($t:ty, $at:ty, $st:ident) => {
        impl sealed::Mem for $t {
            #[inline(always)]
            unsafe fn load(base: *const u8, i: usize) -> $t {
                // SAFETY: the caller guarantees `i` is in bounds; the storage is aligned.
                unsafe { <$at>::from_ptr((base as *mut $t).add(i)) }.load(Ordering::Relaxed)
            }
            #[inline(always)]
            unsafe fn store(base: *const u8, i: usize, v: $t) {
                // SAFETY: as for `load`.
                unsafe { <$at>::from_ptr((base as *mut $t).add(i)) }.store(v, Ordering::Relaxed)
            }
            unsafe fn rmw(
                base: *const u8,
                i: usize,
                op: AtomicOp,
                v: $t,
                o: Ordering,
            ) -> Option<$t> {
                // SAFETY: as for `load`.
                let a = unsafe { <$at>::from_ptr((base as *mut $t).add(i)) };
                Some(match op {
                    AtomicOp::Add => a.fetch_add(v, o),
                    AtomicOp::Min => a.fetch_min(v, o),
                    AtomicOp::Max => a.fetch_max(v, o),
                    AtomicOp::And => a.fetch_and(v, o),
                    AtomicOp::Or => a.fetch_or(v, o),
                    AtomicOp::Xor => a.fetch_xor(v, o),
                    AtomicOp::Xchg => a.swap(v, o),
                })
            }
            unsafe fn cas(base: *const u8, i: usize, exp: $t, des: $t, o: Ordering) -> Option<$t> {
                // SAFETY: as for `load`.
                let a = unsafe { <$at>::from_ptr((base as *mut $t).add(i)) };
                Some(match a.compare_exchange(exp, des, o, fail_order(o)) {
                    Ok(v) | Err(v) => v,
                })
            }
        }
        impl Element for $t {
            const TY: ScalarType = ScalarType::$st;
        }
    };
}

int_elem!(i8, AtomicI8, I8);
int_elem!(i16, AtomicI16, I16);
int_elem!(i32, AtomicI32, I32);
int_elem!(i64, AtomicI64, I64);
int_elem!(u8, AtomicU8, U8);
int_elem!(u16, AtomicU16, U16);
int_elem!(u32, AtomicU32, U32);
int_elem!(u64, AtomicU64, U64);

impl sealed::Mem for bool {
    #[inline(always)]
    unsafe fn load(base: *const u8, i: usize) -> bool {
        // SAFETY: the caller guarantees `i` is in bounds.
        unsafe { AtomicU8::from_ptr((base as *mut u8).add(i)) }.load(Ordering::Relaxed) != 0
    }
    #[inline(always)]
    unsafe fn store(base: *const u8, i: usize, v: bool) {
        // SAFETY: as for `load`.
        unsafe { AtomicU8::from_ptr((base as *mut u8).add(i)) }.store(v as u8, Ordering::Relaxed)
    }
    unsafe fn rmw(_: *const u8, _: usize, _: AtomicOp, _: bool, _: Ordering) -> Option<bool> {
        None
    }
    unsafe fn cas(_: *const u8, _: usize, _: bool, _: bool, _: Ordering) -> Option<bool> {
        None
    }
}
impl Element for bool {
    const TY: ScalarType = ScalarType::I1;
}

macro_rules! float_elem {
    ($t:ty, $bits:ty, $at:ty, $st:ident) => {
        impl sealed::Mem for $t {
            #[inline(always)]
            unsafe fn load(base: *const u8, i: usize) -> $t {
                // SAFETY: the caller guarantees `i` is in bounds; the storage is aligned.
                let b =
                    unsafe { <$at>::from_ptr((base as *mut $bits).add(i)) }.load(Ordering::Relaxed);
                <$t>::from_bits(b)
            }
            #[inline(always)]
            unsafe fn store(base: *const u8, i: usize, v: $t) {
                // SAFETY: as for `load`.
                unsafe { <$at>::from_ptr((base as *mut $bits).add(i)) }
                    .store(v.to_bits(), Ordering::Relaxed)
            }
            unsafe fn rmw(
                base: *const u8,
                i: usize,
                op: AtomicOp,
                v: $t,
                o: Ordering,
            ) -> Option<$t> {
                // SAFETY: as for `load`.
                let a = unsafe { <$at>::from_ptr((base as *mut $bits).add(i)) };
                let f: fn($t, $t) -> $t = match op {
                    AtomicOp::Add => |x, y| x + y,
                    AtomicOp::Min => fmin,
                    AtomicOp::Max => fmax,
                    AtomicOp::Xchg => return Some(<$t>::from_bits(a.swap(v.to_bits(), o))),
                    AtomicOp::And | AtomicOp::Or | AtomicOp::Xor => return None,
                };
                let old = match a.fetch_update(o, fail_order(o), |b| {
                    Some(f(<$t>::from_bits(b), v).to_bits())
                }) {
                    Ok(b) | Err(b) => b,
                };
                Some(<$t>::from_bits(old))
            }
            unsafe fn cas(_: *const u8, _: usize, _: $t, _: $t, _: Ordering) -> Option<$t> {
                None
            }
        }
        impl Element for $t {
            const TY: ScalarType = ScalarType::$st;
        }
    };
}

float_elem!(f16, u16, AtomicU16, F16);
float_elem!(bf16, u16, AtomicU16, BF16);
float_elem!(f32, u32, AtomicU32, F32);
float_elem!(f64, u64, AtomicU64, F64);

macro_rules! fp8_elem {
    ($t:ty, $st:ident) => {
        impl sealed::Mem for $t {
            #[inline(always)]
            unsafe fn load(base: *const u8, i: usize) -> $t {
                // SAFETY: the caller guarantees `i` is in bounds.
                <$t>::from_bits(
                    unsafe { AtomicU8::from_ptr((base as *mut u8).add(i)) }.load(Ordering::Relaxed),
                )
            }
            #[inline(always)]
            unsafe fn store(base: *const u8, i: usize, v: $t) {
                // SAFETY: as for `load`.
                unsafe { AtomicU8::from_ptr((base as *mut u8).add(i)) }
                    .store(v.to_bits(), Ordering::Relaxed)
            }
            unsafe fn rmw(_: *const u8, _: usize, _: AtomicOp, _: $t, _: Ordering) -> Option<$t> {
                None
            }
            unsafe fn cas(_: *const u8, _: usize, _: $t, _: $t, _: Ordering) -> Option<$t> {
                None
            }
        }
        impl Element for $t {
            const TY: ScalarType = ScalarType::$st;
        }
    };
}

fp8_elem!(crate::fp8::F8E4M3, F8E4M3);
fp8_elem!(crate::fp8::F8E5M2, F8E5M2);

/// Device memory of the CPU device: `len` elements of type `elem`, zero-initialized.
///
/// Safe to share between threads (`Arc<HostBuffer>`): every access is atomic (relaxed
/// for plain loads and stores), so concurrent program instances never cause undefined
/// behaviour, only the racy values a GPU would also produce. Byte images use the host's
/// native byte order (little-endian on every supported host).
pub struct HostBuffer {
    elem: ScalarType,
    len: usize,
    words: Words,
}

/// Host memory that [`HostBuffer`]s can be views of: a rank's symmetric heap (private
/// memory, or a shared mapping that other processes see too).
///
/// # Safety
/// `base()` must stay valid for reads and writes of `len()` bytes, 8-byte aligned, for
/// as long as the value lives, and be accessed only atomically or through raw pointers
/// (never through `&mut` references) while views exist.
pub unsafe trait HostMemory: Send + Sync + 'static {
    /// Start of the memory.
    fn base(&self) -> *mut u8;
    /// Size in bytes.
    fn len(&self) -> usize;
    /// True for zero bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The engine through which atomics on this memory must go, when other ranks
    /// update it through a communication engine (a rank's heap in an MPI window: the
    /// engine's atomics are only atomic with one another). Byte `k` of the memory is
    /// byte `k` of the engine's view. `None` (the default) for plain memory, whose
    /// atomics are the CPU's.
    fn engine(&self) -> Option<Arc<dyn RemoteMemory>> {
        None
    }
}

/// Memory reached through a communication engine rather than a pointer: another
/// rank's symmetric heap over MPI one-sided communication, say. Offsets are bytes from
/// the start of the memory.
///
/// **Ordering.** A [`RemoteMemory::put`] may complete later; every `get`, atomic and
/// [`RemoteMemory::quiet`] first completes every earlier `put` of this process (to any
/// rank of the engine), and atomics are complete when they return. A program instance
/// thus observes its own writes, and a signal it raises after writing data is seen
/// after that data: the documented release/acquire orderings of the language hold.
pub trait RemoteMemory: Send + Sync + 'static {
    /// Size in bytes.
    fn len(&self) -> usize;
    /// True for zero bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads `out.len()` bytes at `offset` (complete on return).
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<(), String>;
    /// Writes `data` at `offset` (complete at the next `get`, atomic or `quiet`).
    fn put(&self, offset: usize, data: &[u8]) -> Result<(), String>;
    /// Atomic compare-and-swap of the `width`-byte (1, 2, 4 or 8) unsigned integer at
    /// `offset` (a multiple of `width`): returns the value found.
    fn compare_and_swap(
        &self,
        offset: usize,
        width: usize,
        expected: u64,
        desired: u64,
    ) -> Result<u64, String>;
    /// Atomic fetch-and-add of the `u64` at `offset` (a multiple of 8): returns the
    /// value found. Signals use it.
    fn fetch_add_u64(&self, offset: usize, v: u64) -> Result<u64, String>;
    /// Atomic read of the `u64` at `offset` (a multiple of 8): a word that other
    /// ranks update with atomics (signals, counters). A plain `get` by default.
    fn load_u64(&self, offset: usize) -> Result<u64, String> {
        let mut b = [0u8; 8];
        self.get(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }
    /// Completes every `put` of this process.
    fn quiet(&self) -> Result<(), String>;
    /// Lets the engine make progress on operations that other ranks target at this
    /// process (a polling loop calls it between polls). Does nothing by default.
    fn progress(&self) {}
}

enum Words {
    Owned(Box<[AtomicU64]>),
    View {
        ptr: *const AtomicU64,
        nwords: usize,
        _owner: Arc<dyn HostMemory>,
        /// The memory's engine and the view's byte offset in it (see
        /// [`HostMemory::engine`]).
        engine: Option<(Arc<dyn RemoteMemory>, usize)>,
    },
    /// Memory of another rank: `mem`'s bytes from `offset` on.
    Remote {
        mem: Arc<dyn RemoteMemory>,
        offset: usize,
    },
}

// SAFETY: the view's memory is kept alive by `_owner` and only accessed atomically, as
// the owned storage is; `HostMemory` requires `Send + Sync`.
unsafe impl Send for Words {}
// SAFETY: as above.
unsafe impl Sync for Words {}

impl Words {
    /// The storage in this address space (`None` for another rank's memory).
    fn slice(&self) -> Option<&[AtomicU64]> {
        match self {
            Words::Owned(b) => Some(b),
            // SAFETY: `HostMemory` guarantees `nwords * 8` live, aligned bytes.
            Words::View { ptr, nwords, .. } => {
                Some(unsafe { std::slice::from_raw_parts(*ptr, *nwords) })
            }
            Words::Remote { .. } => None,
        }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer<{}>[{}]", self.elem, self.len)
    }
}

impl HostBuffer {
    /// A zeroed buffer of `len` elements of type `elem`.
    ///
    /// # Panics
    /// When the memory cannot be allocated (as `Vec` does); [`HostBuffer::try_new`]
    /// returns an error instead.
    pub fn new(elem: ScalarType, len: usize) -> HostBuffer {
        match HostBuffer::try_new(elem, len) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        }
    }

    /// A zeroed buffer of `len` elements of type `elem`, or
    /// [`InterpError::OutOfMemory`] when its size does not fit in the address space
    /// or the allocator refuses it (instead of aborting the process, as a failed
    /// `Vec` allocation does).
    ///
    /// Under Linux's memory overcommit, an allocation the system grants may still
    /// fail later, when its pages are touched (zeroing them here): only the requests
    /// the allocator refuses outright are reported.
    pub fn try_new(elem: ScalarType, len: usize) -> Result<HostBuffer, InterpError> {
        let oom = || InterpError::OutOfMemory {
            bytes: super::alloc_bytes(len, elem.size_bytes()),
        };
        let nwords = len
            .checked_mul(elem.size_bytes())
            .ok_or_else(oom)?
            .div_ceil(8);
        let mut words: Vec<AtomicU64> = Vec::new();
        // Fails for more than `isize::MAX` bytes (the capacity check) and for what
        // the allocator refuses.
        words.try_reserve_exact(nwords).map_err(|_| oom())?;
        words.resize_with(nwords, || AtomicU64::new(0));
        Ok(HostBuffer {
            elem,
            len,
            words: Words::Owned(words.into_boxed_slice()),
        })
    }

    /// Checks that `len` elements of `elem` at `byte_offset` fit in `mem_len` bytes
    /// (with 8-byte alignment); returns the number of whole words they span.
    fn fit(
        byte_offset: usize,
        elem: ScalarType,
        len: usize,
        mem_len: usize,
        aligned: bool,
    ) -> Result<usize, InterpError> {
        let bytes = len.checked_mul(elem.size_bytes());
        let nwords = bytes.map(|b| b.div_ceil(8));
        match nwords {
            Some(nwords)
                if aligned
                    && byte_offset.is_multiple_of(8)
                    && byte_offset
                        .checked_add(nwords * 8)
                        .is_some_and(|end| end <= mem_len) =>
            {
                Ok(nwords)
            }
            _ => Err(InterpError::Host {
                message: format!(
                    "a view of {len} {elem} at byte {byte_offset} does not fit in {mem_len} bytes of memory (or is not 8-byte aligned)"
                ),
            }),
        }
    }

    /// A buffer of `len` elements of `elem` that lives inside `mem`, starting
    /// `byte_offset` bytes in (a symmetric allocation in a heap): not zeroed, not
    /// copied. Fails unless the range lies inside `mem` and `byte_offset` is a
    /// multiple of 8.
    pub fn view(
        mem: Arc<dyn HostMemory>,
        byte_offset: usize,
        elem: ScalarType,
        len: usize,
    ) -> Result<HostBuffer, InterpError> {
        let aligned = (mem.base() as usize).is_multiple_of(8);
        let nwords = Self::fit(byte_offset, elem, len, mem.len(), aligned)?;
        // SAFETY: in bounds of the memory, checked by `fit`.
        let ptr = unsafe { mem.base().add(byte_offset) } as *const AtomicU64;
        let engine = mem.engine().map(|e| (e, byte_offset));
        Ok(HostBuffer {
            elem,
            len,
            words: Words::View {
                ptr,
                nwords,
                _owner: mem,
                engine,
            },
        })
    }

    /// A buffer of `len` elements of `elem` in another rank's memory reached through
    /// `mem`, starting `byte_offset` bytes in: every access goes through the engine.
    /// Fails unless the range lies inside `mem` and `byte_offset` is a multiple of 8.
    pub fn remote(
        mem: Arc<dyn RemoteMemory>,
        byte_offset: usize,
        elem: ScalarType,
        len: usize,
    ) -> Result<HostBuffer, InterpError> {
        Self::fit(byte_offset, elem, len, mem.len(), true)?;
        Ok(HostBuffer {
            elem,
            len,
            words: Words::Remote {
                mem,
                offset: byte_offset,
            },
        })
    }

    /// A buffer holding the byte image `bytes` (native byte order); its length must be a
    /// multiple of the element size. Fails with [`InterpError::OutOfMemory`] when the
    /// copy cannot be allocated.
    pub fn from_bytes(elem: ScalarType, bytes: &[u8]) -> Result<HostBuffer, InterpError> {
        let es = elem.size_bytes();
        if !bytes.len().is_multiple_of(es) {
            return Err(InterpError::Host {
                message: format!(
                    "{} bytes is not a whole number of {elem} elements ({es} bytes each)",
                    bytes.len()
                ),
            });
        }
        let b = HostBuffer::try_new(elem, bytes.len() / es)?;
        b.write_bytes(0, bytes)?;
        Ok(b)
    }

    /// A buffer holding a copy of `data`.
    ///
    /// # Panics
    /// When the copy cannot be allocated (see [`HostBuffer::try_new`]).
    pub fn from_slice<T: Element>(data: &[T]) -> HostBuffer {
        let b = HostBuffer::new(T::TY, data.len());
        if let Some(base) = b.local_base() {
            for (i, &v) in data.iter().enumerate() {
                // SAFETY: `i < len` and the buffer holds `len` elements of `T`.
                unsafe { T::store(base, i, v) }
            }
        }
        b
    }

    /// The elements, read as `T` (which must be the buffer's element type).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, InterpError> {
        if T::TY != self.elem {
            return Err(InterpError::Host {
                message: format!("cannot read a buffer of {} as {}", self.elem, T::TY),
            });
        }
        self.load_range(0, self.len)
            .map_err(|message| InterpError::Host { message })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn elem(&self) -> ScalarType {
        self.elem
    }

    /// Size in bytes (`len * elem.size_bytes()`).
    pub fn size_bytes(&self) -> usize {
        self.len * self.elem.size_bytes()
    }

    /// True for memory of another rank reached through a communication engine
    /// ([`HostBuffer::remote`]), which has no address here.
    pub fn is_remote(&self) -> bool {
        matches!(self.words, Words::Remote { .. })
    }

    /// Start of the storage in this address space, for element access through
    /// [`sealed::Mem`]; `None` for another rank's memory.
    pub(crate) fn local_base(&self) -> Option<*const u8> {
        self.words.slice().map(|w| w.as_ptr() as *const u8)
    }

    /// The engine that atomics on this buffer go through, and the byte offset of
    /// element 0 in its view (`None`: the CPU's own atomics).
    fn engine(&self) -> Option<(&dyn RemoteMemory, usize)> {
        match &self.words {
            Words::Owned(_) => None,
            Words::View { engine, .. } => engine.as_ref().map(|(e, off)| (&**e, *off)),
            Words::Remote { mem, offset } => Some((&**mem, *offset)),
        }
    }

    /// The start of the storage, for foreign code that accesses the buffer in place
    /// (the SIMT emulator's JIT-compiled kernels): 8-byte aligned, [`Self::size_bytes`]
    /// bytes long, in the host's byte order. Writing through it is sound only while no
    /// Rust code accesses the buffer concurrently (it is interior-mutable storage).
    /// Null for another rank's memory ([`HostBuffer::is_remote`]).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.local_base()
            .map_or(std::ptr::null_mut(), |p| p as *mut u8)
    }

    /// A copy of the whole byte image (read through the engine for another rank's
    /// memory, which can fail; [`InterpError::OutOfMemory`] when the copy cannot be
    /// allocated).
    pub fn read_bytes(&self) -> Result<Vec<u8>, InterpError> {
        let n = self.size_bytes();
        let alloc = |bytes: usize| {
            let mut v = Vec::new();
            v.try_reserve_exact(bytes)
                .map_err(|_| InterpError::OutOfMemory {
                    bytes: super::alloc_bytes(bytes, 1),
                })
                .map(|()| v)
        };
        match (&self.words, self.words.slice()) {
            (_, Some(words)) => {
                let mut out = alloc(words.len() * 8)?;
                for w in words {
                    out.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
                }
                out.truncate(n);
                Ok(out)
            }
            (Words::Remote { mem, offset }, None) => {
                let mut out = alloc(n)?;
                out.resize(n, 0);
                mem.get(*offset, &mut out)
                    .map_err(|message| InterpError::Host { message })?;
                Ok(out)
            }
            _ => unreachable!("only remote buffers have no local storage"),
        }
    }

    /// Writes the byte image `bytes` starting at element `offset_elems`; fails (writing
    /// nothing) unless the range lies inside the buffer.
    pub fn write_bytes(&self, offset_elems: usize, bytes: &[u8]) -> Result<(), InterpError> {
        let start = offset_elems.checked_mul(self.elem.size_bytes());
        let end = start.and_then(|s| s.checked_add(bytes.len()));
        let (start, end) = match (start, end) {
            (Some(s), Some(e)) if e <= self.size_bytes() => (s, e),
            _ => {
                return Err(InterpError::Host {
                    message: format!(
                        "write of {} bytes at element {offset_elems} is outside a buffer of {} bytes",
                        bytes.len(),
                        self.size_bytes()
                    ),
                });
            }
        };
        let Some(words) = self.words.slice() else {
            let Words::Remote { mem, offset } = &self.words else {
                unreachable!("only remote buffers have no local storage")
            };
            return mem
                .put(offset + start, bytes)
                .map_err(|message| InterpError::Host { message });
        };
        let base = words.as_ptr() as *const u8;
        let mut pos = start;
        let mut src = bytes;
        // Unaligned head, byte by byte.
        while pos < end && pos % 8 != 0 {
            // SAFETY: `pos < end <= size_bytes`.
            unsafe { u8::store(base, pos, src[0]) };
            pos += 1;
            src = &src[1..];
        }
        // Whole words.
        while end - pos >= 8 {
            let w = u64::from_ne_bytes(src[..8].try_into().expect("8 bytes"));
            words[pos / 8].store(w, Ordering::Relaxed);
            pos += 8;
            src = &src[8..];
        }
        // Tail.
        while pos < end {
            // SAFETY: `pos < end <= size_bytes`.
            unsafe { u8::store(base, pos, src[0]) };
            pos += 1;
            src = &src[1..];
        }
        Ok(())
    }

    // ------------------------------------------------------------- element access
    // The interpreter reads and writes through these (callers check bounds and that
    // `T` is the element type): plain memory directly, another rank's through its
    // engine.

    /// Element `i`.
    #[inline]
    pub(crate) fn load<T: Element>(&self, i: usize) -> Result<T, String> {
        debug_assert!(T::TY == self.elem && i < self.len);
        match self.local_base() {
            // SAFETY: `i < len` (the callers' contract) and the buffer holds `T`s.
            Some(base) => Ok(unsafe { T::load(base, i) }),
            None => Ok(self.load_range::<T>(i, 1)?[0]),
        }
    }

    /// Writes element `i`.
    #[inline]
    pub(crate) fn store<T: Element>(&self, i: usize, v: T) -> Result<(), String> {
        debug_assert!(T::TY == self.elem && i < self.len);
        match self.local_base() {
            // SAFETY: `i < len` (the callers' contract) and the buffer holds `T`s.
            Some(base) => {
                unsafe { T::store(base, i, v) };
                Ok(())
            }
            None => self.store_range(i, &[v], None),
        }
    }

    /// Elements `start..start + n`.
    pub(crate) fn load_range<T: Element>(&self, start: usize, n: usize) -> Result<Vec<T>, String> {
        debug_assert!(T::TY == self.elem && start + n <= self.len);
        match (&self.words, self.local_base()) {
            // SAFETY: `start + n <= len` (the callers' contract) and the buffer holds `T`s.
            (_, Some(base)) => Ok((start..start + n)
                .map(|i| unsafe { T::load(base, i) })
                .collect()),
            (Words::Remote { mem, offset }, None) => {
                let es = size_of::<T>();
                let mut bytes = vec![0u8; n * es];
                mem.get(offset + start * es, &mut bytes)?;
                Ok(bytes.chunks_exact(es).map(decode::<T>).collect())
            }
            _ => unreachable!("only remote buffers have no local storage"),
        }
    }

    /// Writes `vals` to elements `start..`, skipping those whose `mask` is false.
    pub(crate) fn store_range<T: Element>(
        &self,
        start: usize,
        vals: &[T],
        mask: Option<&[bool]>,
    ) -> Result<(), String> {
        debug_assert!(T::TY == self.elem && start + vals.len() <= self.len);
        let on = |i: usize| mask.is_none_or(|m| m[i]);
        match (&self.words, self.local_base()) {
            (_, Some(base)) => {
                for (i, &v) in vals.iter().enumerate() {
                    if on(i) {
                        // SAFETY: `start + len <= self.len` (the callers' contract).
                        unsafe { T::store(base, start + i, v) }
                    }
                }
                Ok(())
            }
            (Words::Remote { mem, offset }, None) => {
                // One put for each run of written elements.
                let es = size_of::<T>();
                let mut i = 0;
                while i < vals.len() {
                    if !on(i) {
                        i += 1;
                        continue;
                    }
                    let run_start = i;
                    let mut bytes = Vec::new();
                    while i < vals.len() && on(i) {
                        bytes.extend_from_slice(&encode(vals[i])[..es]);
                        i += 1;
                    }
                    mem.put(offset + (start + run_start) * es, &bytes)?;
                }
                Ok(())
            }
            _ => unreachable!("only remote buffers have no local storage"),
        }
    }

    /// Atomic read-modify-write of element `i` with ordering `o`: the old value, or
    /// `None` when `op` is not defined on `T`.
    pub(crate) fn rmw<T: Element>(
        &self,
        i: usize,
        op: AtomicOp,
        v: T,
        o: Ordering,
    ) -> Result<Option<T>, String> {
        debug_assert!(T::TY == self.elem && i < self.len);
        let Some((engine, off)) = self.engine() else {
            let base = self.local_base().expect("plain memory is local");
            // SAFETY: `i < len` (the callers' contract) and the buffer holds `T`s.
            return Ok(unsafe { T::rmw(base, i, op, v, o) });
        };
        // This process's earlier accesses (local ones included) come first.
        fence(Ordering::SeqCst);
        let es = size_of::<T>();
        let at = off + i * es;
        if T::TY == ScalarType::U64 && op == AtomicOp::Add {
            let old = engine.fetch_add_u64(at, to_uint(v))?;
            fence(Ordering::SeqCst);
            return Ok(Some(from_uint(old)));
        }
        if combine(op, v, v).is_none() {
            return Ok(None);
        }
        // A compare-and-swap loop applying the same operation as the CPU's atomics.
        let mut cur = {
            let mut b = [0u8; 8];
            engine.get(at, &mut b[..es])?;
            decode::<T>(&b[..es])
        };
        loop {
            let new = combine(op, cur, v).expect("checked above");
            let seen = engine.compare_and_swap(at, es, to_uint(cur), to_uint(new))?;
            if seen == to_uint(cur) {
                fence(Ordering::SeqCst);
                return Ok(Some(cur));
            }
            cur = from_uint(seen);
        }
    }

    /// Atomic compare-and-swap of element `i`: the old value, or `None` when `T` has
    /// no compare-and-swap.
    pub(crate) fn cas<T: Element>(
        &self,
        i: usize,
        expected: T,
        desired: T,
        o: Ordering,
    ) -> Result<Option<T>, String> {
        debug_assert!(T::TY == self.elem && i < self.len);
        let Some((engine, off)) = self.engine() else {
            let base = self.local_base().expect("plain memory is local");
            // SAFETY: `i < len` (the callers' contract) and the buffer holds `T`s.
            return Ok(unsafe { T::cas(base, i, expected, desired, o) });
        };
        // The CPU's rules: which types have a compare-and-swap.
        let probe = AtomicU64::new(0);
        // SAFETY: one aligned word holds any element.
        if unsafe { T::cas(probe.as_ptr() as *const u8, 0, expected, expected, o) }.is_none() {
            return Ok(None);
        }
        fence(Ordering::SeqCst);
        let es = size_of::<T>();
        let seen =
            engine.compare_and_swap(off + i * es, es, to_uint(expected), to_uint(desired))?;
        fence(Ordering::SeqCst);
        Ok(Some(from_uint(seen)))
    }

    /// Element `i` of a `u64` buffer read atomically (signal and control words,
    /// which other ranks update with atomics).
    pub(crate) fn load_word(&self, i: usize) -> Result<u64, String> {
        debug_assert!(self.elem == ScalarType::U64 && i < self.len);
        match &self.words {
            Words::Remote { mem, offset } => mem.load_u64(offset + i * 8),
            _ => self.load::<u64>(i),
        }
    }

    /// Lets this buffer's engine (if any) make progress: polling loops call it.
    pub(crate) fn progress(&self) {
        if let Some((e, _)) = self.engine() {
            e.progress();
        }
    }

    /// Completes this process's writes through this buffer's engine (if any).
    pub fn quiet(&self) -> Result<(), InterpError> {
        match self.engine() {
            Some((e, _)) => e.quiet().map_err(|message| InterpError::Host { message }),
            None => Ok(()),
        }
    }
}

/// The in-memory bytes of `v` (the first `size_of::<T>()` of the 8).
fn encode<T: Element>(v: T) -> [u8; 8] {
    let w = AtomicU64::new(0);
    // SAFETY: one aligned 8-byte word holds any element type.
    unsafe { T::store(w.as_ptr() as *const u8, 0, v) };
    w.into_inner().to_ne_bytes()
}

/// The element whose in-memory bytes are `b` (`size_of::<T>()` of them).
fn decode<T: Element>(b: &[u8]) -> T {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    let w = AtomicU64::new(u64::from_ne_bytes(w));
    // SAFETY: as for `encode`.
    unsafe { T::load(w.as_ptr() as *const u8, 0) }
}

/// The element's bytes as an unsigned integer of its width (what an engine's
/// compare-and-swap compares).
fn to_uint<T: Element>(v: T) -> u64 {
    let b = encode(v);
    match size_of::<T>() {
        1 => u64::from(b[0]),
        2 => u64::from(u16::from_ne_bytes([b[0], b[1]])),
        4 => u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        _ => u64::from_ne_bytes(b),
    }
}

/// Inverse of [`to_uint`].
fn from_uint<T: Element>(u: u64) -> T {
    match size_of::<T>() {
        1 => decode(&[u as u8]),
        2 => decode(&(u as u16).to_ne_bytes()),
        4 => decode(&(u as u32).to_ne_bytes()),
        _ => decode(&u.to_ne_bytes()),
    }
}

/// `op` applied to `old` and `v` exactly as the CPU's atomics apply it (`None` when
/// `op` is not defined on `T`).
fn combine<T: Element>(op: AtomicOp, old: T, v: T) -> Option<T> {
    let w = AtomicU64::new(0);
    let p = w.as_ptr() as *const u8;
    // SAFETY: one aligned 8-byte word holds any element type.
    unsafe {
        T::store(p, 0, old);
        T::rmw(p, 0, op, v, Ordering::Relaxed)?;
        Some(T::load(p, 0))
    }
}

use sealed::Mem as _;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Sizes that can never be allocated are errors naming the size, not aborts:
    /// beyond `isize::MAX` bytes, beyond the address space (2^62 bytes: more than
    /// 57-bit virtual addresses reach), and counts whose byte size overflows 64 bits
    /// (reported as `u64::MAX` bytes "or more").
    #[test]
    fn impossible_allocations_are_errors() {
        let cases: [(ScalarType, usize, u64, &str); 6] = [
            (
                ScalarType::F32,
                usize::MAX / 8,
                (usize::MAX / 8) as u64 * 4,
                " bytes",
            ),
            (ScalarType::U8, 1 << 62, 1 << 62, " bytes"),
            (ScalarType::U16, 1 << 62, 1 << 63, " bytes"),
            (ScalarType::F8E4M3, usize::MAX - 1, u64::MAX - 1, " bytes"),
            (ScalarType::F64, usize::MAX, u64::MAX, " bytes or more"),
            (ScalarType::U32, 1 << 62, u64::MAX, " bytes or more"),
        ];
        for (elem, len, bytes, tail) in cases {
            let e = HostBuffer::try_new(elem, len).expect_err("cannot be allocated");
            assert_eq!(e, InterpError::OutOfMemory { bytes }, "{len} {elem}");
            let msg = e.to_string();
            assert!(
                msg.ends_with(&format!("cannot allocate {bytes}{tail}")),
                "{msg}"
            );
        }
    }

    /// What fits is allocated and zeroed, every element of it (sizes that are not a
    /// whole number of words included).
    #[test]
    fn try_new_gives_zeroed_buffers() {
        for (elem, len) in [
            (ScalarType::F32, 1001),
            (ScalarType::U8, 13),
            (ScalarType::F64, 0),
        ] {
            let b = HostBuffer::try_new(elem, len).expect("small");
            assert_eq!((b.len(), b.elem()), (len, elem));
            let bytes = b.read_bytes().expect("read");
            assert_eq!(bytes.len(), len * elem.size_bytes());
            assert!(bytes.iter().all(|&x| x == 0));
        }
        let data: Vec<u8> = (0..=255).collect();
        let b = HostBuffer::from_bytes(ScalarType::U16, &data).expect("whole elements");
        assert_eq!(b.read_bytes().expect("read"), data);
    }

    /// An engine over bytes of this process: puts wait in a queue until the next
    /// get, atomic or quiet (the weakest completion the contract allows), and every
    /// call is counted.
    struct Fake {
        mem: Mutex<Vec<u8>>,
        pending: Mutex<Vec<(usize, Vec<u8>)>>,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl Fake {
        fn new(len: usize) -> Arc<Fake> {
            Arc::new(Fake {
                mem: Mutex::new(vec![0; len]),
                pending: Mutex::new(Vec::new()),
                calls: Default::default(),
            })
        }
        fn complete(&self) {
            let mut m = self.mem.lock().unwrap();
            for (off, d) in self.pending.lock().unwrap().drain(..) {
                m[off..off + d.len()].copy_from_slice(&d);
            }
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
        fn uint(&self, off: usize, w: usize) -> u64 {
            let m = self.mem.lock().unwrap();
            let mut b = [0u8; 8];
            b[..w].copy_from_slice(&m[off..off + w]);
            u64::from_le_bytes(b)
        }
        fn set_uint(&self, off: usize, w: usize, v: u64) {
            self.mem.lock().unwrap()[off..off + w].copy_from_slice(&v.to_le_bytes()[..w]);
        }
    }

    impl RemoteMemory for Fake {
        fn len(&self) -> usize {
            self.mem.lock().unwrap().len()
        }
        fn get(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
            self.complete();
            out.copy_from_slice(&self.mem.lock().unwrap()[offset..offset + out.len()]);
            Ok(())
        }
        fn put(&self, offset: usize, data: &[u8]) -> Result<(), String> {
            if offset + data.len() > self.len() {
                return Err("outside".into());
            }
            self.pending.lock().unwrap().push((offset, data.to_vec()));
            Ok(())
        }
        fn compare_and_swap(&self, o: usize, w: usize, e: u64, d: u64) -> Result<u64, String> {
            self.complete();
            let seen = self.uint(o, w);
            if seen == e {
                self.set_uint(o, w, d);
            }
            Ok(seen)
        }
        fn fetch_add_u64(&self, o: usize, v: u64) -> Result<u64, String> {
            self.complete();
            let seen = self.uint(o, 8);
            self.set_uint(o, 8, seen.wrapping_add(v));
            Ok(seen)
        }
        fn quiet(&self) -> Result<(), String> {
            self.complete();
            Ok(())
        }
    }

    /// The same random sequence of stores, loads and atomics on a plain buffer and
    /// on a remote one: every old value and the final contents are bit-identical.
    fn same_as_local<T: Element + PartialEq + std::fmt::Debug>(vals: &[T]) {
        let n = vals.len();
        let local = HostBuffer::new(T::TY, n);
        let fake = Fake::new(64 + size_of_val(vals) + 8);
        let remote = HostBuffer::remote(fake.clone(), 64, T::TY, n).unwrap();
        assert!(remote.is_remote() && remote.as_mut_ptr().is_null());
        let bits = |b: &HostBuffer| b.read_bytes().unwrap();
        let half: Vec<bool> = (0..n).map(|i| i % 3 != 1).collect();
        for b in [&local, &remote] {
            b.store_range(0, vals, None).unwrap();
            b.store_range(0, &vals[1..], Some(&half[1..])).unwrap();
        }
        assert_eq!(bits(&local), bits(&remote));
        for (k, op) in AtomicOp::ALL.iter().enumerate() {
            for i in 0..n {
                let v = vals[(i * 7 + k) % n];
                let (a, b) = (
                    local.rmw(i, *op, v, Ordering::AcqRel).unwrap(),
                    remote.rmw(i, *op, v, Ordering::AcqRel).unwrap(),
                );
                assert_eq!(a.map(encode), b.map(encode), "{op:?} on {} at {i}", T::TY);
                let e = local.load::<T>((i + 1) % n).unwrap();
                let (a, b) = (
                    local.cas((i + 1) % n, e, v, Ordering::AcqRel).unwrap(),
                    remote.cas((i + 1) % n, e, v, Ordering::AcqRel).unwrap(),
                );
                assert_eq!(a.map(encode), b.map(encode), "cas on {} at {i}", T::TY);
            }
            assert_eq!(bits(&local), bits(&remote), "after {op:?} on {}", T::TY);
        }
        let l = local.load_range::<T>(1, n - 1).unwrap();
        let r = remote.load_range::<T>(1, n - 1).unwrap();
        assert_eq!(
            l.into_iter().map(encode).collect::<Vec<_>>(),
            r.into_iter().map(encode).collect::<Vec<_>>()
        );
        // The bytes before and after the view are untouched.
        assert_eq!(fake.uint(56, 8), 0);
        assert_eq!(fake.uint(64 + size_of_val(vals), 8), 0);
        assert!(fake.calls.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn remote_buffers_behave_as_local_ones() {
        let ints: Vec<i64> = (0..37).map(|i| (i * 7919 % 211) - 100).collect();
        same_as_local::<i32>(
            &ints
                .iter()
                .map(|&v| v as i32 * 1_000_003)
                .collect::<Vec<_>>(),
        );
        same_as_local::<u64>(
            &ints
                .iter()
                .map(|&v| (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect::<Vec<_>>(),
        );
        same_as_local::<u8>(&ints.iter().map(|&v| v as u8).collect::<Vec<_>>());
        same_as_local::<i16>(&ints.iter().map(|&v| v as i16 * 300).collect::<Vec<_>>());
        let mut fl: Vec<f32> = ints.iter().map(|&v| v as f32 * 0.37).collect();
        fl[5] = f32::NAN;
        fl[9] = -0.0;
        same_as_local::<f32>(&fl);
        same_as_local::<f64>(&fl.iter().map(|&v| v as f64 * 1.5).collect::<Vec<_>>());
        same_as_local::<f16>(&fl.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>());
        same_as_local::<bf16>(&fl.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>());
        same_as_local::<bool>(&ints.iter().map(|&v| v > 0).collect::<Vec<_>>());
    }

    #[test]
    fn remote_views_are_bounds_checked_and_writes_complete_at_quiet() {
        let fake = Fake::new(256);
        assert!(HostBuffer::remote(fake.clone(), 4, ScalarType::F32, 4).is_err());
        assert!(HostBuffer::remote(fake.clone(), 200, ScalarType::F32, 20).is_err());
        let b = HostBuffer::remote(fake.clone(), 8, ScalarType::U32, 4).unwrap();
        b.write_bytes(1, &7u32.to_le_bytes()).unwrap();
        assert_eq!(fake.uint(12, 4), 0, "a put may complete later");
        b.quiet().unwrap();
        assert_eq!(fake.uint(12, 4), 7);
        assert_eq!(b.to_vec::<u32>().unwrap(), vec![0, 7, 0, 0]);
        assert!(b.write_bytes(4, &[1]).is_err());
    }
}

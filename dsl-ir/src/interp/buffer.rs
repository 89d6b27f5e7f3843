//! Device memory of the CPU device: [`HostBuffer`], element access and atomics.
//!
//! A buffer is a `Box<[AtomicU64]>`; each element is accessed with a relaxed atomic load
//! or store of its own width (`AtomicU32::from_ptr` and friends), so that many program
//! instances running on rayon threads may read and write one buffer concurrently without
//! undefined behaviour (on x86 these compile to plain moves). Atomic ops use real atomic
//! read-modify-write instructions of the element width (CAS loops for floats).

use std::sync::atomic::{
    AtomicI8, AtomicI16, AtomicI32, AtomicI64, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering,
};

use half::{bf16, f16};

use super::InterpError;
use super::arith::{fmax, fmin};
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
/// [`float8::F8E4M3`], [`float8::F8E5M2`].
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
                    AtomicOp::Add => |x, y| super::arith::Num::add(x, y),
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

fp8_elem!(float8::F8E4M3, F8E4M3);
fp8_elem!(float8::F8E5M2, F8E5M2);

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
}

enum Words {
    Owned(Box<[AtomicU64]>),
    View {
        ptr: *const AtomicU64,
        nwords: usize,
        _owner: std::sync::Arc<dyn HostMemory>,
    },
}

// SAFETY: the view's memory is kept alive by `_owner` and only accessed atomically, as
// the owned storage is; `HostMemory` requires `Send + Sync`.
unsafe impl Send for Words {}
// SAFETY: as above.
unsafe impl Sync for Words {}

impl Words {
    fn slice(&self) -> &[AtomicU64] {
        match self {
            Words::Owned(b) => b,
            // SAFETY: `HostMemory` guarantees `nwords * 8` live, aligned bytes.
            Words::View { ptr, nwords, .. } => unsafe { std::slice::from_raw_parts(*ptr, *nwords) },
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
    pub fn new(elem: ScalarType, len: usize) -> HostBuffer {
        let bytes = len * elem.size_bytes();
        let words = (0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        HostBuffer {
            elem,
            len,
            words: Words::Owned(words),
        }
    }

    /// A buffer of `len` elements of `elem` that lives inside `mem`, starting
    /// `byte_offset` bytes in (a symmetric allocation in a heap): not zeroed, not
    /// copied. Fails unless the range lies inside `mem` and `byte_offset` is a
    /// multiple of 8.
    pub fn view(
        mem: std::sync::Arc<dyn HostMemory>,
        byte_offset: usize,
        elem: ScalarType,
        len: usize,
    ) -> Result<HostBuffer, InterpError> {
        let bytes = len.checked_mul(elem.size_bytes());
        let end = bytes.and_then(|b| b.checked_add(byte_offset));
        let nwords = bytes.map(|b| b.div_ceil(8));
        match (end, nwords) {
            (Some(_), Some(nwords))
                if byte_offset.is_multiple_of(8)
                    && (mem.base() as usize).is_multiple_of(8)
                    && byte_offset + nwords * 8 <= mem.len() =>
            {
                // SAFETY: in bounds of the memory, checked above.
                let ptr = unsafe { mem.base().add(byte_offset) } as *const AtomicU64;
                Ok(HostBuffer {
                    elem,
                    len,
                    words: Words::View {
                        ptr,
                        nwords,
                        _owner: mem,
                    },
                })
            }
            _ => Err(InterpError::Host {
                message: format!(
                    "a view of {len} {elem} at byte {byte_offset} does not fit in {} bytes of memory (or is not 8-byte aligned)",
                    mem.len()
                ),
            }),
        }
    }

    /// A buffer holding the byte image `bytes` (native byte order); its length must be a
    /// multiple of the element size.
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
        let b = HostBuffer::new(elem, bytes.len() / es);
        b.write_bytes(0, bytes)?;
        Ok(b)
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T]) -> HostBuffer {
        let b = HostBuffer::new(T::TY, data.len());
        let base = b.base();
        for (i, &v) in data.iter().enumerate() {
            // SAFETY: `i < len` and the buffer holds `len` elements of `T`.
            unsafe { T::store(base, i, v) }
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
        let base = self.base();
        // SAFETY: `i < len` and the buffer holds `len` elements of `T`.
        Ok((0..self.len).map(|i| unsafe { T::load(base, i) }).collect())
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

    /// Start of the storage, for element access through [`sealed::Mem`].
    pub(crate) fn base(&self) -> *const u8 {
        self.words.slice().as_ptr() as *const u8
    }

    /// The start of the storage, for foreign code that accesses the buffer in place
    /// (the SIMT emulator's JIT-compiled kernels): 8-byte aligned, [`Self::size_bytes`]
    /// bytes long, in the host's byte order. Writing through it is sound only while no
    /// Rust code accesses the buffer concurrently (it is interior-mutable storage).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.words.slice().as_ptr() as *mut u8
    }

    /// A copy of the whole byte image.
    pub fn read_bytes(&self) -> Vec<u8> {
        let n = self.size_bytes();
        let words = self.words.slice();
        let mut out = Vec::with_capacity(words.len() * 8);
        for w in words {
            out.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        out.truncate(n);
        out
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
        let base = self.base();
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
            self.words.slice()[pos / 8].store(w, Ordering::Relaxed);
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
}

use sealed::Mem as _;

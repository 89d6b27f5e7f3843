//! The emulator's NVSHMEM device functions: the ones [`crate::lower::engine`] calls
//! for off-node peers, implemented from NVSHMEM's and OpenSHMEM's documented
//! semantics on the emulated world's heaps, so a kernel compiled with
//! [`crate::CommEngine::Nvshmem`] runs here as on a GPU cluster (with
//! [`super::EmuWorld::with_nodes`] choosing which peers are off-node).
//!
//! - An address argument is a symmetric address **on the calling rank**; the
//!   function acts on the same offset of rank `pe`'s heap, bounds-checked like every
//!   emulated access against the buffer the op's pointer derives from (every rank's
//!   copy of it; errors name the op that made the call).
//! - `nvshmem_<T>_p` is not visible at once: the put waits in the calling thread's
//!   queue until that thread's next `nvshmem_quiet` (OpenSHMEM: a put is complete, and
//!   visible to every PE, only after a quiet). A lowering that signals before
//!   quieting delivers the signal first, and the data too late, as a network would.
//! - `nvshmem_<T>_g`, the atomics and `nvshmemx_signal_op` act at once (atomically;
//!   a signal is not ordered after earlier puts without a quiet, as documented).
//! - Every call that reaches a PE's memory (puts, gets, atomics, signals; not
//!   `nvshmem_quiet`) counts in the world's engine-operation counter
//!   ([`super::EmuWorld::engine_ops`]), so tests can tell that off-node traffic took
//!   this path, and how much of it.

use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

use super::EmuError;
use super::puts::Put;
use super::runtime::{ThreadCtx, tessera_emu_check_global, with};

/// Every engine call of the process ([`super::engine_ops_total`]).
pub(crate) static TOTAL: AtomicU64 = AtomicU64::new(0);

/// NVSHMEM's `NVSHMEM_SIGNAL_SET` and `NVSHMEM_SIGNAL_ADD` (`nvshmemx_signal_op_t`,
/// in NVSHMEM's `nvshmem_common_transport.h`).
const SIGNAL_SET: i32 = 9;
const SIGNAL_ADD: i32 = 10;

fn fail(c: &ThreadCtx<'_>, message: String) {
    let (span, op) = c.launch.site(c.engine_site.get());
    c.fail(EmuError::Instruction {
        kernel: c.launch.kernel.to_string(),
        op,
        span,
        block: c.block.get(),
        thread: c.tid,
        message,
    });
}

/// The host address of the `bytes` at symmetric address `addr` of rank `pe`, checked;
/// `None` after recording the error.
fn target(c: &ThreadCtx<'_>, what: &str, addr: usize, bytes: usize, pe: i32) -> Option<usize> {
    count(c);
    resolve(c, what, addr, bytes, pe)
}

/// Counts one engine call that reaches a PE's memory.
fn count(c: &ThreadCtx<'_>) {
    if let Some(w) = c.launch.comm.as_ref() {
        w.engine_ops.fetch_add(1, Ordering::Relaxed);
        TOTAL.fetch_add(1, Ordering::Relaxed);
    }
}

/// [`target`] without counting: one piece of a larger transfer.
fn resolve(c: &ThreadCtx<'_>, what: &str, addr: usize, bytes: usize, pe: i32) -> Option<usize> {
    let Some(w) = c.launch.comm.as_ref() else {
        fail(c, format!("{what} in a kernel without a world"));
        return None;
    };
    let n = w.heap_bases.len();
    if pe < 0 || pe as usize >= n {
        fail(c, format!("{what} to PE {pe} of a world of {n}"));
        return None;
    }
    let off = addr.wrapping_sub(w.heap_bases[w.rank as usize] as usize);
    let real = (w.heap_bases[pe as usize] as usize).wrapping_add(off);
    // The control words at the start of every heap (`barrier_all`'s counters, the
    // abort word) are no launch buffer, but the lowering's own targets.
    let ctrl_bytes = 8 * tessera_ir::interp::ctrl::WORDS;
    if off.checked_add(bytes).is_some_and(|end| end <= ctrl_bytes) && off.is_multiple_of(bytes) {
        return Some(real);
    }
    let p = tessera_emu_check_global(real as *mut u8, bytes as i32, c.engine_site.get() as i32);
    (p as usize == real).then_some(real)
}

fn read(addr: usize, bytes: u8) -> u64 {
    // SAFETY: `target` checked that `addr..addr + bytes` lies in a buffer of the
    // launch (or a heap's control words) and is aligned to `bytes`; emulated threads
    // access memory atomically or through such checked addresses.
    unsafe {
        match bytes {
            1 => AtomicU8::from_ptr(addr as *mut u8).load(Ordering::Acquire) as u64,
            2 => AtomicU16::from_ptr(addr as *mut u16).load(Ordering::Acquire) as u64,
            4 => AtomicU32::from_ptr(addr as *mut u32).load(Ordering::Acquire) as u64,
            _ => AtomicU64::from_ptr(addr as *mut u64).load(Ordering::Acquire),
        }
    }
}

extern "C" fn nvshmem_quiet() {
    with((), |c| c.puts.deliver())
}

extern "C" fn nvshmemx_signal_op(addr: *mut u64, value: u64, op: i32, pe: i32) {
    with((), |c| {
        let Some(a) = target(c, "nvshmemx_signal_op", addr as usize, 8, pe) else {
            return;
        };
        // SAFETY: `target` checked that the 8 bytes at `a` lie in a buffer of the launch
        // (or a heap's control words), aligned.
        let word = unsafe { AtomicU64::from_ptr(a as *mut u64) };
        match op {
            SIGNAL_SET => word.store(value, Ordering::SeqCst),
            SIGNAL_ADD => {
                word.fetch_add(value, Ordering::SeqCst);
            }
            _ => fail(c, format!("nvshmemx_signal_op with signal operation {op}")),
        }
    })
}

macro_rules! put_get {
    ($($t:ty, $bytes:expr, $p:ident, $g:ident;)*) => {$(
        extern "C" fn $p(addr: *mut $t, value: $t, pe: i32) {
            with((), |c| {
                if let Some(a) = target(c, stringify!($p), addr as usize, $bytes, pe) {
                    // SAFETY: `target` checked that `a..a + $bytes` lies in a buffer
                    // of the launch and is aligned to `$bytes`.
                    unsafe { c.puts.push(Put { addr: a, bits: value as u64, bytes: $bytes }) };
                }
            })
        }
        extern "C" fn $g(addr: *const $t, pe: i32) -> $t {
            with(0, |c| match target(c, stringify!($g), addr as usize, $bytes, pe) {
                Some(a) => read(a, $bytes) as $t,
                None => 0,
            })
        }
    )*};
}

put_get! {
    u8, 1, nvshmem_uint8_p, nvshmem_uint8_g;
    u16, 2, nvshmem_uint16_p, nvshmem_uint16_g;
    u32, 4, nvshmem_uint32_p, nvshmem_uint32_g;
    u64, 8, nvshmem_uint64_p, nvshmem_uint64_g;
}

/// The pieces of a contiguous transfer of `len` bytes at `addr`: each the largest
/// power of two up to 8 bytes that the address and the rest allow, so that aligned
/// elements of up to 8 bytes each land whole (as the per-element functions' do).
fn pieces(addr: usize, len: usize) -> impl Iterator<Item = (usize, u8)> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let mut n = 8usize;
        while n > 1 && (!(addr + at).is_multiple_of(n) || len - at < n) {
            n /= 2;
        }
        let piece = (at, n as u8);
        at += n;
        Some(piece)
    })
}

/// `nvshmem_putmem`: `nelems` bytes from the calling thread's `source` to PE `pe`'s
/// symmetric `dest`, delivered at the thread's next quiet (the source may be reused
/// on return: it is copied now).
extern "C" fn nvshmem_putmem(dest: *mut u8, source: *const u8, nelems: usize, pe: i32) {
    with((), |c| {
        count(c);
        for (off, n) in pieces(dest as usize, nelems) {
            let Some(a) = resolve(c, "nvshmem_putmem", dest as usize + off, n as usize, pe) else {
                return;
            };
            let mut b = [0u8; 8];
            // SAFETY: `source` is the thread's own `nelems` bytes (a stack slot of the
            // lowering); `off + n <= nelems`.
            unsafe { std::ptr::copy_nonoverlapping(source.add(off), b.as_mut_ptr(), n as usize) };
            // SAFETY: `resolve` checked that `a..a + n` lies in a buffer of the launch
            // (`pieces` makes `n` 1, 2, 4 or 8 and `a` aligned to it).
            unsafe {
                c.puts.push(Put {
                    addr: a,
                    bits: u64::from_le_bytes(b),
                    bytes: n,
                })
            };
        }
    })
}

/// `nvshmem_getmem`: `nelems` bytes of PE `pe`'s symmetric `source` into the calling
/// thread's `dest`, read now.
extern "C" fn nvshmem_getmem(dest: *mut u8, source: *const u8, nelems: usize, pe: i32) {
    with((), |c| {
        count(c);
        for (off, n) in pieces(source as usize, nelems) {
            let Some(a) = resolve(c, "nvshmem_getmem", source as usize + off, n as usize, pe)
            else {
                return;
            };
            let b = read(a, n).to_le_bytes();
            // SAFETY: `dest` is the thread's own `nelems` bytes; `off + n <= nelems`.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dest.add(off), n as usize) };
        }
    })
}

macro_rules! amos {
    ($($t:ty, $atomic:ty, $bytes:expr, $add:ident, $and:ident, $or:ident, $xor:ident, $swap:ident, $cas:ident;)*) => {$(
        extern "C" fn $add(addr: *mut $t, v: $t, pe: i32) -> $t {
            amo(stringify!($add), addr as usize, $bytes, pe, |a: &$atomic| a.fetch_add(v, Ordering::SeqCst))
        }
        extern "C" fn $and(addr: *mut $t, v: $t, pe: i32) -> $t {
            amo(stringify!($and), addr as usize, $bytes, pe, |a: &$atomic| a.fetch_and(v, Ordering::SeqCst))
        }
        extern "C" fn $or(addr: *mut $t, v: $t, pe: i32) -> $t {
            amo(stringify!($or), addr as usize, $bytes, pe, |a: &$atomic| a.fetch_or(v, Ordering::SeqCst))
        }
        extern "C" fn $xor(addr: *mut $t, v: $t, pe: i32) -> $t {
            amo(stringify!($xor), addr as usize, $bytes, pe, |a: &$atomic| a.fetch_xor(v, Ordering::SeqCst))
        }
        extern "C" fn $swap(addr: *mut $t, v: $t, pe: i32) -> $t {
            amo(stringify!($swap), addr as usize, $bytes, pe, |a: &$atomic| a.swap(v, Ordering::SeqCst))
        }
        extern "C" fn $cas(addr: *mut $t, cond: $t, v: $t, pe: i32) -> $t {
            amo(stringify!($cas), addr as usize, $bytes, pe, |a: &$atomic| {
                match a.compare_exchange(cond, v, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(x) | Err(x) => x,
                }
            })
        }
    )*};
}

/// An atomic on rank `pe`'s word at symmetric address `addr`; 0 after an error.
fn amo<A, T: Default>(
    what: &str,
    addr: usize,
    bytes: usize,
    pe: i32,
    f: impl FnOnce(&A) -> T,
) -> T {
    with(T::default(), |c| match target(c, what, addr, bytes, pe) {
        // SAFETY: `target` checked the address is inside a buffer and aligned to
        // `bytes`, the size of the atomic type `A`.
        Some(a) => f(unsafe { &*(a as *const A) }),
        None => T::default(),
    })
}

amos! {
    u32, AtomicU32, 4, nvshmem_uint32_atomic_fetch_add, nvshmem_uint32_atomic_fetch_and,
        nvshmem_uint32_atomic_fetch_or, nvshmem_uint32_atomic_fetch_xor,
        nvshmem_uint32_atomic_swap, nvshmem_uint32_atomic_compare_swap;
    u64, AtomicU64, 8, nvshmem_uint64_atomic_fetch_add, nvshmem_uint64_atomic_fetch_and,
        nvshmem_uint64_atomic_fetch_or, nvshmem_uint64_atomic_fetch_xor,
        nvshmem_uint64_atomic_swap, nvshmem_uint64_atomic_compare_swap;
}

extern "C" fn nvshmem_uint64_atomic_fetch(addr: *const u64, pe: i32) -> u64 {
    amo(
        "nvshmem_uint64_atomic_fetch",
        addr as usize,
        8,
        pe,
        |a: &AtomicU64| a.load(Ordering::SeqCst),
    )
}

extern "C" fn nvshmem_uint64_atomic_set(addr: *mut u64, v: u64, pe: i32) {
    amo(
        "nvshmem_uint64_atomic_set",
        addr as usize,
        8,
        pe,
        |a: &AtomicU64| a.store(v, Ordering::SeqCst),
    )
}

pub(crate) extern "C" fn tessera_emu_engine_site(site: i32) {
    with((), |c| c.engine_site.set(site as u32))
}

/// The functions above, by name (the JIT resolves the lowering's calls to them).
pub(crate) fn symbols() -> Vec<(&'static str, usize)> {
    macro_rules! syms {
        ($($f:ident),* $(,)?) => { vec![$((stringify!($f), $f as *const () as usize)),*] };
    }
    syms![
        nvshmem_quiet,
        nvshmemx_signal_op,
        nvshmem_uint8_p,
        nvshmem_uint16_p,
        nvshmem_uint32_p,
        nvshmem_uint64_p,
        nvshmem_uint8_g,
        nvshmem_uint16_g,
        nvshmem_uint32_g,
        nvshmem_uint64_g,
        nvshmem_uint32_atomic_fetch_add,
        nvshmem_uint32_atomic_fetch_and,
        nvshmem_uint32_atomic_fetch_or,
        nvshmem_uint32_atomic_fetch_xor,
        nvshmem_uint32_atomic_swap,
        nvshmem_uint32_atomic_compare_swap,
        nvshmem_uint64_atomic_fetch_add,
        nvshmem_uint64_atomic_fetch_and,
        nvshmem_uint64_atomic_fetch_or,
        nvshmem_uint64_atomic_fetch_xor,
        nvshmem_uint64_atomic_swap,
        nvshmem_uint64_atomic_compare_swap,
        nvshmem_uint64_atomic_fetch,
        nvshmem_uint64_atomic_set,
        nvshmem_putmem,
        nvshmem_getmem,
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn transfers_split_into_aligned_pieces() {
        let p: Vec<(usize, u8)> = super::pieces(0x1000, 16).collect();
        assert_eq!(p, [(0, 8), (8, 8)]);
        let p: Vec<(usize, u8)> = super::pieces(0x1004, 12).collect();
        assert_eq!(p, [(0, 4), (4, 8)]);
        let p: Vec<(usize, u8)> = super::pieces(0x1002, 7).collect();
        assert_eq!(p, [(0, 2), (2, 4), (6, 1)]);
        assert_eq!(super::pieces(0x1000, 0).count(), 0);
    }

    #[test]
    fn every_function_the_lowering_calls_is_implemented() {
        let have: Vec<&str> = super::symbols().iter().map(|(n, _)| *n).collect();
        for f in crate::lower::engine::NVSHMEM_FUNCTIONS {
            assert!(have.contains(f), "the emulator lacks {f}");
        }
    }
}

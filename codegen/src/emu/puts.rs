//! The puts an emulated thread has queued (`nvshmem_*_put_nbi`), delivered at its
//! next quiet, fence or end: a leaf that the thread context (`runtime`) and the
//! NVSHMEM calls (`shmem`) share.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

/// A put waiting for its thread's next quiet.
pub(crate) struct Put {
    pub(crate) addr: usize,
    pub(crate) bits: u64,
    pub(crate) bytes: u8,
}

fn write(addr: usize, bits: u64, bytes: u8) {
    // SAFETY: `PendingPuts::push`'s callers vouch that `addr..addr + bytes` lies in a
    // buffer of the launch and is aligned to `bytes`; emulated threads access memory
    // atomically or through such checked addresses.
    unsafe {
        match bytes {
            1 => AtomicU8::from_ptr(addr as *mut u8).store(bits as u8, Ordering::Relaxed),
            2 => AtomicU16::from_ptr(addr as *mut u16).store(bits as u16, Ordering::Relaxed),
            4 => AtomicU32::from_ptr(addr as *mut u32).store(bits as u32, Ordering::Relaxed),
            _ => AtomicU64::from_ptr(addr as *mut u64).store(bits, Ordering::Relaxed),
        }
    }
}

/// A thread's queue of puts.
#[derive(Default)]
pub(crate) struct PendingPuts(RefCell<Vec<Put>>);

impl PendingPuts {
    /// Queues `p`.
    ///
    /// # Safety
    ///
    /// `p.addr..p.addr + p.bytes` lies in a buffer of the launch or a heap's control
    /// words (memory that outlives the thread) and is aligned to `p.bytes` (1, 2, 4 or 8): delivering writes it.
    pub(crate) unsafe fn push(&self, p: Put) {
        self.0.borrow_mut().push(p);
    }

    /// Whether none is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }

    /// Delivers the queued puts, then a sequentially consistent fence.
    pub(crate) fn deliver(&self) {
        let puts = std::mem::take(&mut *self.0.borrow_mut());
        for p in puts {
            write(p.addr, p.bits, p.bytes);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

//! Stacks for the emulator's GPU threads (coroutines): many stacks carved out of one
//! anonymous mapping, reserved but not committed (`MAP_NORESERVE`), so a stack costs
//! only the pages its thread touches.
//!
//! Each stack has a guard page below it (`PROT_NONE`) while the process holds at
//! most [`GUARDED_STACKS`] guarded stacks: each guard splits the mapping, and Linux
//! limits a process to about 65,000 mappings (`vm.max_map_count`). Stacks beyond that
//! budget (the 200,000-thread worlds of waiting kernels) have none; they are
//! [`STACK_BYTES`] deep, far more than a kernel frame and the runtime functions it
//! calls use (a few KiB, see BENCHMARKS.md), and their lowest word holds a canary that
//! the scheduler checks every time the thread parks or ends: a clobbered canary aborts
//! the process with a message instead of going on with corrupted memory.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

use corosensei::stack::{Stack, StackPointer};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

/// Usable bytes of one stack (reserved, committed only where touched).
pub const STACK_BYTES: usize = 256 << 10;

/// The most guarded stacks the process holds at once (two mappings each).
pub const GUARDED_STACKS: usize = 12_288;

/// Guarded stacks currently held by live arenas.
static GUARDED: AtomicUsize = AtomicUsize::new(0);

const CANARY: u64 = 0x7e55_e7a5_7ac0_ca11;

/// `count` stacks in one mapping, unmapped when dropped (after every coroutine on
/// them has finished: the coroutines borrow the arena).
pub(crate) struct StackArena {
    base: usize,
    len: usize,
    stride: usize,
    guard: usize,
    count: usize,
    guarded: bool,
}

/// Why an arena could not be made.
#[derive(Debug)]
pub(crate) struct ArenaError {
    pub bytes: usize,
    pub message: String,
}

impl StackArena {
    /// Reserves `count` stacks.
    pub(crate) fn new(count: usize) -> Result<StackArena, ArenaError> {
        let page = rustix::param::page_size();
        let guard = page;
        let stride = STACK_BYTES + guard;
        let len = stride.checked_mul(count.max(1)).ok_or(ArenaError {
            bytes: usize::MAX,
            message: "size overflow".into(),
        })?;
        // SAFETY: a fresh anonymous private mapping at an address of the kernel's
        // choosing aliases nothing.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| ArenaError {
            bytes: len,
            message: e.to_string(),
        })? as usize;
        let guarded = GUARDED.fetch_add(count, Ordering::AcqRel) + count <= GUARDED_STACKS;
        if !guarded {
            GUARDED.fetch_sub(count, Ordering::AcqRel);
        }
        let arena = StackArena {
            base,
            len,
            stride,
            guard,
            count,
            guarded,
        };
        for i in 0..count {
            let low = base + i * stride;
            if guarded {
                // SAFETY: the page lies inside the mapping made above, which nothing
                // uses yet.
                unsafe { rustix::mm::mprotect(low as *mut _, guard, MprotectFlags::empty()) }
                    .map_err(|e| ArenaError {
                        bytes: len,
                        message: format!("guard page: {e}"),
                    })?;
            }
            // SAFETY: the first usable word of stack `i`, inside the mapping, aligned.
            unsafe { ((low + guard) as *mut u64).write(CANARY) };
        }
        Ok(arena)
    }

    /// Stack `i` (`i < len()`). Each stack may be given to one coroutine at a time.
    pub(crate) fn stack(&self, i: usize) -> ArenaStack<'_> {
        assert!(i < self.count, "stack index out of range");
        let low = self.base + i * self.stride;
        ArenaStack {
            low,
            top: low + self.stride,
            _arena: std::marker::PhantomData,
        }
    }

    /// Whether stack `i`'s canary is intact (it overflowed otherwise).
    pub(crate) fn intact(&self, i: usize) -> bool {
        let low = self.base + i * self.stride + self.guard;
        // SAFETY: the canary word of stack `i`, inside the mapping; a coroutine
        // running on that stack is suspended or finished (the caller is its scheduler),
        // so nothing writes it concurrently.
        unsafe { (low as *const u64).read_volatile() == CANARY }
    }
}

impl Drop for StackArena {
    fn drop(&mut self) {
        if self.guarded {
            GUARDED.fetch_sub(self.count, Ordering::AcqRel);
        }
        // SAFETY: the mapping made in `new`; the stacks borrow the arena, so no
        // coroutine runs on it any more.
        let _ = unsafe { rustix::mm::munmap(self.base as *mut _, self.len) };
    }
}

/// One stack of an arena (`top` is the highest address; stacks grow down).
pub(crate) struct ArenaStack<'a> {
    low: usize,
    top: usize,
    _arena: std::marker::PhantomData<&'a StackArena>,
}

// SAFETY: the range belongs to the arena, which outlives the stack (the lifetime); the
// arena hands each stack to one coroutine at a time. `top` and `low` are
// page-aligned (hence aligned to `STACK_ALIGNMENT`), the usable part is
// `STACK_BYTES` (> `MIN_STACK_SIZE`), and `low` includes the guard page. Unguarded
// stacks (past `GUARDED_STACKS`) rely on the canary check described in the module
// docs instead of a guard page.
unsafe impl Stack for ArenaStack<'_> {
    fn base(&self) -> StackPointer {
        NonZeroUsize::new(self.top).unwrap_or(NonZeroUsize::MIN)
    }

    fn limit(&self) -> StackPointer {
        NonZeroUsize::new(self.low).unwrap_or(NonZeroUsize::MIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_are_disjoint_and_aligned() {
        let a = StackArena::new(3).expect("arena");
        let s: Vec<_> = (0..3).map(|i| a.stack(i)).collect();
        for w in s.windows(2) {
            assert!(w[0].base().get() <= w[1].limit().get());
        }
        for st in &s {
            assert_eq!(st.base().get() % 4096, 0);
            assert!(st.base().get() - st.limit().get() >= STACK_BYTES);
        }
        assert!((0..3).all(|i| a.intact(i)));
    }
}

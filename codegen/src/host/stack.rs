//! Stacks for the emulator's GPU threads (coroutines): many stacks carved out of one
//! anonymous mapping, reserved but not committed (`MAP_NORESERVE`), so a stack costs
//! only the pages its thread touches.
//!
//! Each stack has a guard page below it (`PROT_NONE`) while the process holds at
//! most [`GUARDED_STACKS`] guarded stacks: each guard splits the mapping, and Linux
//! limits a process to about 65,000 mappings (`vm.max_map_count`). Stacks beyond that
//! budget (the 200,000-thread worlds of waiting kernels) have none; instead every
//! stack is sized from the kernel's largest frame (LLVM reports it when it compiles the
//! kernel) plus [`RUNTIME_STACK_BYTES`] for the runtime functions the kernel calls, so
//! the code on it cannot reach its end, and its lowest word holds a canary that the
//! scheduler checks every time the thread parks or ends: a clobbered canary aborts the
//! process with a message instead of going on with corrupted memory. The kernel is
//! compiled with stack probes, so a large frame touches each page it spans (and hits a
//! guard page rather than jumping over it).

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

use corosensei::stack::{Stack, StackPointer};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

/// Usable bytes of one stack at least (reserved, committed only where touched): a
/// launch's stacks are the kernel's largest frame plus [`RUNTIME_STACK_BYTES`], and
/// never less than this.
pub const STACK_BYTES: usize = 256 << 10;

/// Stack kept for the emulator's runtime functions a kernel calls (bounds checks,
/// collectives, error reports: shallow Rust code) above the kernel's own frame.
pub const RUNTIME_STACK_BYTES: usize = 128 << 10;

/// The most guarded stacks the process holds at once (two mappings each).
pub const GUARDED_STACKS: usize = 12_288;

/// Guarded stacks currently held by live arenas.
static GUARDED: AtomicUsize = AtomicUsize::new(0);

const CANARY: u64 = 0x7e55_e7a5_7ac0_ca11;

/// `count` stacks in one mapping, unmapped when dropped (after every coroutine on
/// them has finished: the coroutines borrow the arena).
pub(crate) struct StackArena {
    /// Usable bytes per stack.
    pub bytes: usize,
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
    /// Reserves `count` stacks deep enough for a kernel whose largest frame is
    /// `frame_bytes`.
    pub(crate) fn new(count: usize, frame_bytes: u64) -> Result<StackArena, ArenaError> {
        let page = rustix::param::page_size();
        let guard = page;
        let bytes = (frame_bytes as usize)
            .saturating_add(RUNTIME_STACK_BYTES)
            .max(STACK_BYTES)
            .next_multiple_of(page);
        let stride = bytes + guard;
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
        // Small pages only: a transparent huge page would commit 2 MiB where a
        // thread touches a few KiB. (Advice only: failure changes nothing else.)
        // SAFETY: the range is the mapping made above.
        let _ = unsafe {
            rustix::mm::madvise(base as *mut _, len, rustix::mm::Advice::LinuxNoHugepage)
        };
        let guarded = GUARDED.fetch_add(count, Ordering::AcqRel) + count <= GUARDED_STACKS;
        if !guarded {
            GUARDED.fetch_sub(count, Ordering::AcqRel);
        }
        let arena = StackArena {
            bytes,
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

    /// Number of stacks.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Stack `i` (`i < count`).
    ///
    /// # Safety
    ///
    /// Each stack may be given to one coroutine at a time: the caller must not ask
    /// for stack `i` again while a coroutine made with it is alive.
    pub(crate) unsafe fn stack(&self, i: usize) -> ArenaStack<'_> {
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

// SAFETY: the range belongs to the arena, which outlives the stack (the lifetime);
// `StackArena::stack`'s contract gives each stack to one coroutine at a time. `top`
// and `low` are page-aligned (hence aligned to `STACK_ALIGNMENT`), the usable part is
// at least `STACK_BYTES` (> `MIN_STACK_SIZE`), and `low` includes the guard page.
// Unguarded stacks (past `GUARDED_STACKS`) have no guard page; instead they are sized
// from the kernel's largest frame as LLVM reports it plus `RUNTIME_STACK_BYTES` for
// the runtime's shallow Rust frames, so the code that runs on them cannot reach
// their end; the canary check of the module docs backs that up.
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
        let a = StackArena::new(3, 300 << 10).expect("arena");
        assert!(a.bytes >= (300 << 10) + RUNTIME_STACK_BYTES);
        // SAFETY: each stack once, and no coroutine uses them.
        let s: Vec<_> = (0..3).map(|i| unsafe { a.stack(i) }).collect();
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

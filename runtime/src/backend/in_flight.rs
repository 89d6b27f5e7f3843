//! The LLVM work running in the background: CPU compilations
//! (`Compiled::cpu_compiling`) and the CPU device's preparation
//! (`Device::cpu`, which readies LLVM's host target and JIT on a thread of its own).
//!
//! A thread that started one waits, when it ends, until none is running (at most
//! [`AT_EXIT`]): for the main thread that is the process's exit, so a
//! kernel compiled in the background reaches the disk cache (the next process finds
//! it there instead of compiling again), and LLVM is never compiling while the
//! process runs its exit handlers, which destroy LLVM's static objects (a compile
//! racing them dies in instruction selection). The wait is a thread-local's
//! destructor: glibc's `exit` runs the exiting thread's thread-local destructors
//! before any `atexit` handler, whereas a handler registered with `atexit` would
//! run after the destructors of the statics LLVM creates while it compiles.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest a thread's end (the process's exit) waits for background
/// compilations.
pub(crate) const AT_EXIT: Duration = Duration::from_secs(10);

static RUNNING: Mutex<usize> = Mutex::new(0);
static ENDED: Condvar = Condvar::new();

struct WaitAtEnd;

impl Drop for WaitAtEnd {
    fn drop(&mut self) {
        let deadline = Instant::now() + AT_EXIT;
        let mut n = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            n = ENDED
                .wait_timeout(n, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

thread_local! {
    static GUARD: WaitAtEnd = const { WaitAtEnd };
}

/// Background LLVM work starts (on behalf of this thread).
fn begin() {
    GUARD.with(|_| ());
    *RUNNING.lock().unwrap_or_else(|p| p.into_inner()) += 1;
}

/// Background LLVM work has ended.
fn end() {
    let mut n = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
    *n = n.saturating_sub(1);
    ENDED.notify_all();
}

/// Ends the work of its thread when dropped, even by a panic.
struct End;

impl Drop for End {
    fn drop(&mut self) {
        end();
    }
}

/// Runs `f` (LLVM work) on a thread of its own named `name`, running until `f`
/// returns or panics, which this thread's end (the process's exit, for the main
/// thread) waits for; an error, counting nothing, when no thread could start.
pub(crate) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    begin();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _end = End;
            f()
        });
    if spawned.is_err() {
        end();
    }
    spawned.map(drop)
}

//! Where `device_print` output goes: standard output, or a capture in tests.
//!
//! A launch of a kernel that calls `device_print` or `device_assert` decodes its
//! output buffer when the kernel is done ([`tessera_ir::debug`]) and hands the lines
//! to the output: they are written to standard output, one `println!`-style line each,
//! unless the launching thread is inside [`capture_output`].

use std::cell::RefCell;
use std::io::Write as _;

thread_local! {
    static CAPTURE: RefCell<Vec<Vec<String>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f`, collecting the `device_print` lines of the kernels it launches on this
/// thread instead of writing them to standard output. Returns `f`'s result and the
/// lines, in order. Captures nest (the innermost one gets the lines); launches on
/// other threads (the ranks of a thread world) print as usual.
pub fn capture_output<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    CAPTURE.with(|c| c.borrow_mut().push(Vec::new()));
    // Pops the capture when `f` panics, so a later capture starts clean.
    struct Unwind;
    impl Drop for Unwind {
        fn drop(&mut self) {
            if std::thread::panicking() {
                CAPTURE.with(|c| c.borrow_mut().pop());
            }
        }
    }
    let _unwind = Unwind;
    let r = f();
    let lines = CAPTURE.with(|c| c.borrow_mut().pop()).unwrap_or_default();
    (r, lines)
}

/// Hands one launch's lines to the innermost capture, or writes them to standard
/// output (a closed or full stdout is ignored, as GPU `printf` output would be lost).
pub(crate) fn emit(lines: &[String]) {
    if lines.is_empty() {
        return;
    }
    let captured = CAPTURE.with(|c| match c.borrow_mut().last_mut() {
        Some(v) => {
            v.extend_from_slice(lines);
            true
        }
        None => false,
    });
    if captured {
        return;
    }
    let mut out = std::io::stdout().lock();
    for l in lines {
        if writeln!(out, "{l}").is_err() {
            return;
        }
    }
    let _ = out.flush();
}

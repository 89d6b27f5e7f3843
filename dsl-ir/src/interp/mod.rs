//! The reference interpreter: the semantics every backend (GPU, emulator) must match,
//! and the CPU device of the runtime.
//!
//! [`run`] executes a kernel [`Function`](crate::ir::Function) over a 3-D grid of program instances. Every
//! instance evaluates the body sequentially on dense tile values; instances run in
//! parallel on rayon threads and share [`HostBuffer`]s. A sanitizer checks every memory
//! access: an element index outside `[0, len)` of its buffer is an
//! [`InterpError::OutOfBounds`] naming the kernel, the op's source span, the program id,
//! the offending tile element and the buffer's parameter.
//!
//! # Semantics
//!
//! **Grid and values.** `program_id`/`num_programs` are `i32`. Tiles are dense and
//! row-major; `reshape` keeps the row-major element order, `permute` makes result dim
//! `i` the operand's dim `order[i]`, `broadcast` repeats size-1 dims, `splat` and
//! `const` fill the result shape. Pointers are (buffer, element offset) pairs; a pointer
//! parameter points at element 0 of its buffer, `addptr` adds integer offsets (any
//! integer type, sign- or zero-extended to `i64`, wrapping).
//!
//! **Integers** (`i8`..`i64`, `u8`..`u64`):
//! - `add`, `sub`, `mul`, `neg`, `abs`, reduction/scan `sum`/`prod`, `atomic add` and
//!   `dot` accumulation wrap (two's complement); `abs(MIN) == MIN`.
//! - `div` truncates toward zero, `rem` has the sign of the dividend; `MIN / -1` wraps
//!   to `MIN` and `MIN % -1 == 0`. **Division or remainder by zero is an error**
//!   ([`InterpError::DivisionByZero`], naming the lane), never UB or a panic.
//! - `shl`/`shr` take the shift amount modulo the bit width (Rust `wrapping_shl`);
//!   `shr` is arithmetic for signed, logical for unsigned types.
//! - `cmp` is signed or unsigned by the operand type; for `i1`, `false < true`.
//!
//! **Floats** (`f16`, `bf16`, `f32`, `f64`):
//! - IEEE 754 arithmetic with round-to-nearest-even, via Rust's operators; `rem` is
//!   C `fmod` (Rust `%`).
//! - `f16`/`bf16`: every op converts its operands to `f32`, computes, and rounds the
//!   result back to `f16`/`bf16` (nearest even) — one rounding per op, which for
//!   `+ - * / sqrt` equals the correctly rounded half-precision result. Math functions
//!   (`exp`, `log`, `tanh`, ...) likewise compute in f32. `fma` rounds once (exact
//!   product, sum rounded to odd in f64, then to the half type).
//! - `f32`/`f64` math uses Rust std (`exp`, `exp2`, `ln`, `log2`, `sqrt`, `sin`, `cos`,
//!   `tanh`, `floor`, `ceil`); `rsqrt(x) = 1 / sqrt(x)`; `erf` is libm's (musl)
//!   `erff`/`erf` (error below 1 ulp); `fma` is `mul_add` (single rounding).
//! - **`min`/`max` propagate NaN** (IEEE 754-2019 `minimum`/`maximum`, PTX `min.NaN`):
//!   the result is NaN when either operand is NaN, and `-0.0 < +0.0`. The same rule
//!   holds for `reduce`/`scan` `min`/`max` and float `atomic_rmw min/max`.
//! - `cmp` is ordered (false when either side is NaN) except `ne`, true with a NaN.
//!
//! **`cast`** (Rust `as` semantics): float to int saturates, NaN gives 0; int to float
//! rounds to nearest even (correctly, also for 64-bit integers to `f16`/`bf16`); float
//! to float rounds to nearest even (`f64` to `f16`/`bf16` correctly, without double
//! rounding); int to int truncates, sign- or zero-extends by the source type; to `i1`:
//! nonzero (NaN included) is `true`; from `i1`: `true` is 1. The 8-bit floats
//! (`f8e4m3`, `f8e5m2`, OCP) convert to and from `f16`/`bf16`/`f32` only (the verifier
//! rejects the rest): to them rounds to nearest even and saturates to the largest
//! finite value (±448, ±57344; infinities too), NaN stays NaN (`0x7f` for E4M3; E5M2
//! `0x7e` with the source's top two mantissa bits ORed in), bit for bit the
//! `satfinite` conversion of CUDA ([`crate::fp8`]'s); from them is exact. They
//! have no arithmetic.
//!
//! **Memory.** `load`/`store`/atomics with a mask do not access masked-off lanes at all
//! (no bounds check there); a masked-off `load` lane yields `other`, or zero without
//! `other`; a masked-off atomic lane yields zero. Every accessed lane's element index
//! must lie in `[0, len)` of its buffer, else [`InterpError::OutOfBounds`] names the
//! first offending lane in row-major order. Lanes of one op are performed in row-major
//! order (lanes of a `store` to one address: the last wins; atomics to one address are
//! all applied). Plain loads/stores are relaxed atomic accesses of the element width;
//! `atomic_rmw`/`atomic_cas` are real atomic RMW operations (CAS loops for float ops)
//! with the given ordering (`relaxed`, `acquire`, `release`, `acq_rel`); the scope is
//! ignored on the CPU. Float atomics support `add`, `min`, `max`, `xchg`.
//!
//! **`dot`**: `f16`/`bf16`/`f32` inputs accumulate in `f32` (half inputs are converted
//! to f32, where their products are exact), `f64` in `f64`, `i8` in `i32` (wrapping),
//! `f8e4m3`/`f8e5m2` in `f32` (exact products, like the halves).
//! Each result element is `acc + a[i][0]*b[0][j] + a[i][1]*b[1][j] + ...`, added in
//! order of increasing `k`, each product and sum rounded to the accumulator type (no
//! fused multiply-add).
//!
//! **`reduce`/`scan`** combine sequentially along the axis, in order of increasing index
//! (decreasing for a reverse scan): `((x0 ∘ x1) ∘ x2) ∘ ...`, rounding every step to the
//! element type (so an `f16` sum rounds to f16 after each addition). The scan is
//! inclusive. Results are deterministic.
//!
//! **Control flow.** `for lb, ub, step` runs the body for `iv = lb, lb+step, ...` while
//! `iv < ub` (an empty range yields the inits); a non-positive step is an
//! [`InterpError::Unsupported`] error. `if` runs one region, `while` alternates its
//! before/after regions until the `condition` is false, yielding the forwarded values.
//! `barrier` is a no-op: each program instance runs as one thread.
//!
//! **Communication** ([`run_in_world`]). A launch may run as one rank of a
//! [`CommWorld`]: `rank`/`world_size` come from it, and buffers passed as
//! [`KernelArg::Symmetric`] have one copy per rank. `remote_ptr p, peer` retargets the
//! pointers of a symmetric buffer's local copy to the same elements of `peer`'s copy
//! (a peer outside `0..world_size` is [`InterpError::BadPeer`]; a pointer into a
//! non-symmetric buffer is [`InterpError::InvalidPointer`]); accesses through it are
//! bounds-checked against that copy. `signal` is one atomic `xchg`/`add` on the `u64`
//! word with the op's ordering (a program instance is one thread, so a release covers
//! all its earlier accesses). `wait_until` polls the word (relaxed loads, then an
//! acquire fence once the comparison holds), yielding to other threads between polls;
//! `fence` is a `std::sync::atomic::fence` (none for `relaxed`). `barrier_all` adds one
//! to an arrival counter in rank 0's control words ([`ctrl`]) and waits until the
//! counter reaches the next multiple of `world_size × programs per rank`. Scopes are
//! all honoured as `system` (the strongest). Kernels with `wait_until`/`barrier_all` run
//! every program instance on its own thread, so that all can be waiting at once (as a
//! GPU needs the whole grid resident), at most [`MAX_RESIDENT`] of them. Every
//! wait gives up after the world's timeout with [`InterpError::WaitTimeout`] naming the
//! rank, op, line, word and the expected and observed values; a failing program
//! instance sets every rank's abort word, so the others stop waiting
//! ([`InterpError::Aborted`]) instead of hanging.
//!
//! **Errors and parallelism.** When program instances fail, [`run`] returns the error of
//! the lowest failing program id (linear order `x + nx * (y + ny * z)`): instances with
//! a higher id than a known failure are skipped or stopped early, lower ones still run.
//!
//! **Files.** `exec.rs` checks the arguments and drives the grid; `prog.rs` runs one
//! program instance (values, per-op semantics, control flow) over the per-launch
//! plan of its regions; `memory.rs` its loads, stores, atomics and descriptor
//! accesses; `comm_ops.rs` its communication ops over `comm.rs`'s world; `tiles.rs`
//! the operations on dense tile data; `arith.rs` and `minmax.rs` element
//! arithmetic; `value.rs` and `buffer.rs` values, arguments and host memory.

// Interpreter errors are cold and carry the whole diagnostic.
#![allow(clippy::result_large_err)]

/// Dispatches on a scalar type, binding the Rust element type to `$T`.
macro_rules! with_type {
    ($st:expr, $T:ident => $body:expr) => {
        match $st {
            crate::types::ScalarType::I1 => {
                type $T = bool;
                $body
            }
            crate::types::ScalarType::I8 => {
                type $T = i8;
                $body
            }
            crate::types::ScalarType::I16 => {
                type $T = i16;
                $body
            }
            crate::types::ScalarType::I32 => {
                type $T = i32;
                $body
            }
            crate::types::ScalarType::I64 => {
                type $T = i64;
                $body
            }
            crate::types::ScalarType::U8 => {
                type $T = u8;
                $body
            }
            crate::types::ScalarType::U16 => {
                type $T = u16;
                $body
            }
            crate::types::ScalarType::U32 => {
                type $T = u32;
                $body
            }
            crate::types::ScalarType::U64 => {
                type $T = u64;
                $body
            }
            crate::types::ScalarType::F16 => {
                type $T = half::f16;
                $body
            }
            crate::types::ScalarType::BF16 => {
                type $T = half::bf16;
                $body
            }
            crate::types::ScalarType::F32 => {
                type $T = f32;
                $body
            }
            crate::types::ScalarType::F64 => {
                type $T = f64;
                $body
            }
            crate::types::ScalarType::F8E4M3 => {
                type $T = crate::fp8::F8E4M3;
                $body
            }
            crate::types::ScalarType::F8E5M2 => {
                type $T = crate::fp8::F8E5M2;
                $body
            }
        }
    };
}

mod arith;
mod buffer;
mod comm;
mod comm_ops;
mod exec;
mod memory;
mod minmax;
mod prog;
mod tiles;
mod value;

#[cfg(test)]
mod tests;

use std::fmt::Write as _;

pub use buffer::{Element, HostBuffer, HostMemory, RemoteMemory};
pub use comm::{CommWorld, DEFAULT_WAIT_TIMEOUT, MAX_RESIDENT, ctrl};
pub use exec::{run, run_claimed, run_in_world, run_limited};
pub use value::{KernelArg, Scalar};

use crate::ir::Span;

/// An error of [`run`] or of host buffer access. Every kernel error names the kernel and
/// the source span of the op (`file:line:col`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// A memory access outside its buffer (found by the sanitizer).
    #[error(
        "{span}: out-of-bounds {op} in kernel `{kernel}`: index {index} of buffer `{buffer}` (len {len}) at program_id {pid}, tile element {el}",
        pid = fmt_pid(.program_id),
        el = fmt_lane(.lane)
    )]
    OutOfBounds {
        /// Kernel name.
        kernel: String,
        /// Mnemonic of the op (`load`, `store`, `atomic_rmw`, `atomic_cas`).
        op: &'static str,
        /// Source location of the op.
        span: Span,
        /// The failing program instance.
        program_id: [u32; 3],
        /// The element offset accessed.
        index: i64,
        /// Multi-index of the offending element within the op's tile.
        lane: Vec<u32>,
        /// Name of the pointer parameter whose buffer was accessed.
        buffer: String,
        /// Length of that buffer, in elements.
        len: usize,
    },
    /// Integer division or remainder by zero.
    #[error(
        "{span}: integer division by zero in `{op}` in kernel `{kernel}` at program_id {pid}, tile element {el}",
        pid = fmt_pid(.program_id),
        el = fmt_lane(.lane)
    )]
    DivisionByZero {
        /// Kernel name.
        kernel: String,
        /// `div` or `rem`.
        op: &'static str,
        /// Source location of the op.
        span: Span,
        /// The failing program instance.
        program_id: [u32; 3],
        /// Multi-index of the zero divisor within the tile.
        lane: Vec<u32>,
    },
    /// Launch arguments that do not match the kernel's parameters.
    #[error("{span}: bad arguments for kernel `{kernel}`, parameter `{param}`: {message}")]
    ArgMismatch {
        /// Kernel name.
        kernel: String,
        /// Where the kernel is defined.
        span: Span,
        /// The parameter concerned (`<count>` for a wrong number of arguments).
        param: String,
        /// What is wrong.
        message: String,
    },
    /// An op the interpreter cannot execute with these operands (for example a
    /// non-positive `for` step, or an atomic op on an unsupported type).
    #[error("{span}: unsupported `{op}` in kernel `{kernel}`: {message}")]
    Unsupported {
        /// Kernel name.
        kernel: String,
        /// Mnemonic of the op.
        op: &'static str,
        /// Source location of the op.
        span: Span,
        /// What is unsupported.
        message: String,
    },
    /// A pointer that does not point into a buffer argument of the right element type.
    #[error(
        "{span}: invalid pointer in `{op}` in kernel `{kernel}` at program_id {pid}, tile element {el}: {message}",
        pid = fmt_pid(.program_id),
        el = fmt_lane(.lane)
    )]
    InvalidPointer {
        /// Kernel name.
        kernel: String,
        /// Mnemonic of the op.
        op: &'static str,
        /// Source location of the op.
        span: Span,
        /// The failing program instance.
        program_id: [u32; 3],
        /// Multi-index of the offending element.
        lane: Vec<u32>,
        /// What is wrong.
        message: String,
    },
    /// Host memory for a buffer could not be allocated ([`HostBuffer::try_new`]): more
    /// bytes than the address space holds, or than the allocator grants.
    #[error("out of host memory: cannot allocate {}", fmt_bytes(*.bytes))]
    OutOfMemory {
        /// The size asked for, in bytes; `u64::MAX` stands for that many or more (an
        /// element count whose size overflows 64 bits), see [`alloc_bytes`].
        bytes: u64,
    },
    /// IR that the verifier should have rejected (a value used before definition,
    /// operands of the wrong type, a region without its terminator, ...).
    #[error("{span}: malformed IR at `{op}` in kernel `{kernel}`: {message}")]
    InvalidIr {
        /// Kernel name.
        kernel: String,
        /// Mnemonic of the op.
        op: &'static str,
        /// Source location of the op.
        span: Span,
        /// What is wrong.
        message: String,
    },
    /// A `wait_until` or `barrier_all` that did not complete within the wait timeout
    /// (`TESSERA_WAIT_TIMEOUT`): a missing signal, or a rank that never arrived.
    #[error(
        "{span}: `{op}` timed out after {secs:.3} s in kernel `{kernel}` on rank {rank}, program_id {pid}: {what} expected {pred} {expected}, observed {observed}",
        pid = fmt_pid(.program_id),
        secs = .timeout.as_secs_f64()
    )]
    WaitTimeout {
        /// Kernel name.
        kernel: String,
        /// `wait_until` or `barrier_all`.
        op: &'static str,
        /// Source location of the wait.
        span: Span,
        /// The waiting rank.
        rank: u32,
        /// The waiting program instance.
        program_id: [u32; 3],
        /// What was awaited: ``signal `sig`[3]`` or the barrier's arrival counter.
        what: String,
        /// The comparison (`==`, `>=`, ...).
        pred: &'static str,
        /// The value compared against.
        expected: u64,
        /// The last value read.
        observed: u64,
        /// How long it waited.
        timeout: std::time::Duration,
    },
    /// A wait abandoned because another rank (or program instance) of the world failed;
    /// that failure is reported by its own launch.
    #[error(
        "{span}: `{op}` in kernel `{kernel}` on rank {rank}, program_id {pid} abandoned: rank {failed_rank} failed",
        pid = fmt_pid(.program_id)
    )]
    Aborted {
        /// Kernel name.
        kernel: String,
        /// The abandoned op.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// This rank.
        rank: u32,
        /// This program instance.
        program_id: [u32; 3],
        /// The rank that failed first.
        failed_rank: u32,
    },
    /// A peer index outside `0..world_size`.
    #[error(
        "{span}: bad peer {peer} in `{op}` in kernel `{kernel}` on rank {rank}, program_id {pid}: the world has {world_size} rank(s)",
        pid = fmt_pid(.program_id)
    )]
    BadPeer {
        /// Kernel name.
        kernel: String,
        /// The op.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// This rank.
        rank: u32,
        /// This program instance.
        program_id: [u32; 3],
        /// The peer asked for.
        peer: i64,
        /// Number of ranks.
        world_size: u32,
    },
    /// A kernel that waits for other program instances, launched with more program
    /// instances than can run at once.
    #[error(
        "{span}: kernel `{kernel}` waits for other program instances (wait_until/barrier_all), so all of them must run at once: a grid of {programs} exceeds the limit of {limit}"
    )]
    TooManyPrograms {
        /// Kernel name.
        kernel: String,
        /// Where the kernel is defined.
        span: Span,
        /// Program instances launched.
        programs: u64,
        /// The most that may run at once.
        limit: u64,
    },
    /// The launch ran past its watchdog ([`run_limited`]).
    #[error(
        "{span}: kernel `{kernel}` ran past its {:.3} s launch timeout (TESSERA_LAUNCH_TIMEOUT): stopped in this `{op}` loop (program {program})",
        timeout.as_secs_f64()
    )]
    LaunchTimeout {
        /// Kernel name.
        kernel: String,
        /// The loop (`for` or `while`).
        op: &'static str,
        /// Its source location.
        span: Span,
        /// The program's linear id.
        program: u64,
        /// The limit.
        timeout: std::time::Duration,
    },
    /// The grid has more program instances than a `u64` counts.
    #[error("kernel `{kernel}`: a grid of {grid:?} has more than 2^64 program instances")]
    GridTooLarge {
        /// Kernel name.
        kernel: String,
        /// The grid.
        grid: [u32; 3],
    },
    /// A communication engine (MPI, ...) failed an access to another rank's memory.
    #[error(
        "{span}: `{op}` in kernel `{kernel}` at program_id {pid}: the communication engine failed: {message}",
        pid = fmt_pid(.program_id)
    )]
    Transport {
        /// Kernel name.
        kernel: String,
        /// The op.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// The program instance.
        program_id: [u32; 3],
        /// The engine's message.
        message: String,
    },
    /// A host-side [`HostBuffer`] access out of range or of the wrong type.
    #[error("host buffer access: {message}")]
    Host {
        /// What is wrong.
        message: String,
    },
}

/// The bytes of `count` elements of `elem_bytes` bytes each, saturated at `u64::MAX`
/// (the size [`InterpError::OutOfMemory`] reports).
pub fn alloc_bytes(count: usize, elem_bytes: usize) -> u64 {
    u64::try_from(count as u128 * elem_bytes as u128).unwrap_or(u64::MAX)
}

/// `bytes` as an out-of-memory message writes it (`u64::MAX`: that or more).
fn fmt_bytes(bytes: u64) -> String {
    if bytes == u64::MAX {
        format!("{bytes} bytes or more")
    } else {
        format!("{bytes} bytes")
    }
}

fn fmt_pid(p: &[u32; 3]) -> String {
    format!("({}, {}, {})", p[0], p[1], p[2])
}

fn fmt_lane(l: &[u32]) -> String {
    let mut s = String::from("[");
    for (i, x) in l.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{x}");
    }
    s.push(']');
    s
}

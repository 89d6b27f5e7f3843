//! The typed tracing front-end that `#[kernel]` functions are written against.
//!
//! A kernel body is ordinary Rust that runs once, at IR-build time, inside [`trace`].
//! Comptime values (const generics, `#[comptime]` parameters, Rust integers) are plain
//! Rust values; runtime values are [`Tile`]s: typed handles to IR values whose element
//! type and static shape live in the Rust type (`Tile<f32, S2<64, 32>>`). Operators and
//! methods on tiles append ops to the kernel being traced, each with the caller's
//! source location (`#[track_caller]`), so every op carries the user's file:line:col.
//!
//! Shapes are tuples of dimensions: `()` for a scalar, `(D<N>,)`, `(D<M>, D<N>)`, ...
//! with the aliases [`S1`], [`S2`], [`S3`]. A dimension is either `D<N>` (N a power of
//! two, enforced by the trait bound `Const<N>: Pow2`) or [`One`], the size-1 dimension
//! made by `expand_dims`, which broadcasts against any `D<N>`. Shape mismatches, `dot`
//! inner-dimension mismatches, stores of the wrong element type and non-power-of-two
//! dimensions are therefore Rust type errors with Tessera's own messages.
//!
//! Errors that only appear while building (a reshape that changes the element count,
//! a comptime value assigned in a runtime loop) are recorded with their span; the op
//! yields a placeholder value so tracing can continue, and [`trace`] returns the first
//! error.

mod argreduce;
mod batched;
mod combine;
mod comm;
mod control;
mod debug;
mod desc;
mod hint;
mod local;
mod net;
mod ops;
mod random;
mod shape;
mod sort;

pub use batched::dot_batched;
pub use combine::{Combine, associative_scan, reduce_with};
pub use comm::{Peer, Symmetric, Token, barrier_all, fence, quiet, rank, world_size};
pub use control::{
    Carry, CondBranch, CtInt, ForRange, LoopIndex, MAX_COMPTIME_ITERATIONS,
    MAX_COMPTIME_ITERATIONS_PER_KERNEL, Opaque, OrdOp, RtBound, RustOrd, ScalarCond, WhileCond,
    compare, for_range, if_else, while_cond, while_loop,
};
pub use debug::{PrintArgs, device_assert, device_print};
pub use desc::{Coords, TensorDesc};
pub use hint::HintValues;
pub use local::Local;
pub use ops::*;
pub use random::{Seed, rand, randint, randint4x, randn, umulhi};
pub use shape::*;

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

use half::{bf16, f16};

use crate::builder::{BuildError, FunctionBuilder};
use crate::ir::{ConstValue, Function, OpKind, ParamAttrs, Span, ValueId};
use crate::types::{ScalarType, Type};

// ---------------------------------------------------------------------------------
// Element types

mod sealed {
    pub trait Sealed {}
}

/// A Tessera element type: `bool`, `i8`..`i64`, `u8`..`u64`, `f16`, `bf16`, `f32`,
/// `f64`, the 8-bit floats `F8E4M3`, `F8E5M2`, and the block-scaled storage types
/// `E2M1x2`, `E8M0` ([`crate::mx`]).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Tessera element type",
    label = "expected one of bool, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, F8E4M3, F8E5M2, E2M1x2, E8M0",
    note = "kernel scalar parameters and buffer elements must be element types"
)]
pub trait DType: sealed::Sealed + Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The IR scalar type.
    const TY: ScalarType;
    /// This value as an IR constant.
    fn to_const(self) -> ConstValue;
}

/// Numeric element types (integers and floats): plain old data, so buffers of them
/// can be viewed as bytes. Tile arithmetic (`+ - * / %`, reductions) needs it; in a
/// kernel generic over its element type, bound the type with it (`T: Num`), or with
/// [`Float`] or [`Int`].
#[diagnostic::on_unimplemented(
    message = "tiles of `{Self}` have no arithmetic: `{Self}` is not a numeric element type",
    label = "arithmetic needs integer or float (not 8-bit float) elements",
    note = "the 8-bit floats F8E4M3 and F8E5M2 are storage and `dot` types: cast to f32 or f16 first (`.cast::<f32>()`), and back with `.cast::<F8E4M3>()`",
    note = "in a kernel generic over its element type, bound it: `T: Num` (arithmetic), `T: Float` (also `exp`, `sqrt`, ...) or `T: Int` (also bit operations)"
)]
pub trait Num: DType + bytemuck::Pod + NumElem<Elem = Self> {}

/// `Self`, for the [`Num`] types only (a supertrait of `Num`, implemented for each):
/// the arithmetic operators ask for an operand of `<T as NumElem>::Elem`, so that for
/// a `T` that is not `Num` (an 8-bit float) only that is reported, not also that a
/// float literal is no operand of `T`.
pub trait NumElem {
    /// `Self`.
    type Elem: DType;
}
/// Integer element types (not `bool`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an integer element type",
    label = "expected one of i8, i16, i32, i64, u8, u16, u32, u64",
    note = "in a kernel generic over its element type, bound it with `T: Int`"
)]
pub trait Int: Num {}
/// Float element types.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a float element type with arithmetic",
    label = "expected one of f16, bf16, f32, f64",
    note = "the 8-bit floats F8E4M3 and F8E5M2 are storage and `dot` types: cast to f32 or f16 first (`.cast::<f32>()`), and back with `.cast::<F8E4M3>()`",
    note = "in a kernel generic over its element type, bound it with `T: Float`"
)]
pub trait Float: Num {}

macro_rules! dtype_int {
    ($($t:ty => $s:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl DType for $t {
            const TY: ScalarType = ScalarType::$s;
            fn to_const(self) -> ConstValue { ConstValue::Int(self as i64) }
        }
        impl Int for $t {}
        impl Num for $t {}
        impl NumElem for $t { type Elem = $t; }
    )*};
}
dtype_int!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64);

macro_rules! dtype_float {
    ($($t:ty => $s:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl DType for $t {
            const TY: ScalarType = ScalarType::$s;
            fn to_const(self) -> ConstValue { ConstValue::Float(f64::from(self)) }
        }
        impl Float for $t {}
        impl Num for $t {}
        impl NumElem for $t { type Elem = $t; }
    )*};
}
dtype_float!(f16 => F16, bf16 => BF16, f32 => F32, f64 => F64);

/// The 8-bit floats ([`crate::fp8::F8E4M3`], [`crate::fp8::F8E5M2`]): element types of
/// buffers and tiles that are loaded, stored, cast to and from f16/bf16/f32 and
/// multiplied by [`ops::dot`]; not [`Num`], so arithmetic on them does not compile.
macro_rules! dtype_fp8 {
    ($($t:ty => $s:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl DType for $t {
            const TY: ScalarType = ScalarType::$s;
            fn to_const(self) -> ConstValue { ConstValue::Float(self.to_f64()) }
        }
    )*};
}
dtype_fp8!(crate::fp8::F8E4M3 => F8E4M3, crate::fp8::F8E5M2 => F8E5M2);

/// The block-scaled storage types ([`crate::mx::E2M1x2`], [`crate::mx::E8M0`]): `u8`
/// tiles in the IR, read by [`ops::dot_scaled`]; no arithmetic.
macro_rules! dtype_mx {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl DType for $t {
            const TY: ScalarType = ScalarType::U8;
            fn to_const(self) -> ConstValue { ConstValue::Int(i64::from(self.0)) }
        }
    )*};
}
dtype_mx!(crate::mx::E2M1x2, crate::mx::E8M0);

impl sealed::Sealed for bool {}
impl DType for bool {
    const TY: ScalarType = ScalarType::I1;
    fn to_const(self) -> ConstValue {
        ConstValue::Bool(self)
    }
}

// ---------------------------------------------------------------------------------
// The tracing context

struct Ctx {
    b: FunctionBuilder,
    error: Option<BuildError>,
    /// The kernel's name.
    name: String,
}

/// The number of the next [`trace`] (process-wide, from 1): tiles and buffers carry the
/// number of the trace that made them (0: made outside any trace).
static NEXT_TRACE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// How many finished traces [`TRACE_NAMES`] remembers, to name the kernel a tile
/// escaped from.
const TRACE_NAMES_KEPT: usize = 64;

thread_local! {
    static CTX: RefCell<Option<Ctx>> = const { RefCell::new(None) };
    /// True while this thread traces a kernel: its panics become build errors.
    static TRACING: Cell<bool> = const { Cell::new(false) };
    /// Where the last panic while tracing happened (set by the panic hook).
    static PANIC_AT: RefCell<Option<Span>> = const { RefCell::new(None) };
    /// How deep `#[helper]` calls are nested.
    static HELPER_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Comptime loop iterations run while building the current kernel.
    static COMPTIME_ITERATIONS: Cell<u64> = const { Cell::new(0) };
    /// `#[helper]` calls while tracing this kernel (see [`MAX_HELPER_CALLS`]).
    static HELPER_CALLS: Cell<u64> = const { Cell::new(0) };
    /// The number of the trace in progress on this thread (0: none).
    static CURRENT_TRACE: Cell<u64> = const { Cell::new(0) };
    /// The kernels of the last [`TRACE_NAMES_KEPT`] traces on this thread, by number.
    static TRACE_NAMES: RefCell<std::collections::VecDeque<(u64, String)>> =
        const { RefCell::new(std::collections::VecDeque::new()) };
}

/// Which trace made a tile or buffer handle. Tiles and buffers are handles to values
/// of the kernel being built, meaningless once it is built: using one made by another
/// kernel's trace (kept in a thread-local) is a build error, and the raw-pointer marker
/// makes the handles `!Send` and `!Sync`, so a `static` (a `Mutex` in one) cannot
/// hold one at all.
#[derive(Clone, Copy)]
struct OnlyInsideItsKernel {
    trace: u64,
    _only_inside_its_kernel: PhantomData<*const ()>,
}

impl OnlyInsideItsKernel {
    /// The trace in progress.
    fn current() -> OnlyInsideItsKernel {
        OnlyInsideItsKernel {
            trace: CURRENT_TRACE.with(Cell::get),
            _only_inside_its_kernel: PhantomData,
        }
    }

    /// `id` if this handle was made by the trace in progress (or no trace is in
    /// progress: the op then fails as any op outside a trace does); otherwise records
    /// the build error (at the caller) and returns a placeholder of type `ty`, so
    /// tracing goes on.
    #[track_caller]
    fn check(self, id: ValueId, what: &str, ty: impl FnOnce() -> Type) -> ValueId {
        let current = CURRENT_TRACE.with(Cell::get);
        if self.trace == current || current == 0 {
            return id;
        }
        escaped(self.trace, what, Span::caller());
        with_builder(|b| b.push_placeholder(ty()))
    }
}

/// Records the error for a `what` (a tile, a buffer) made by trace `made_by` and used
/// at `span` while building another kernel.
#[cold]
fn escaped(made_by: u64, what: &str, span: Span) {
    let origin = TRACE_NAMES.with(|n| {
        n.borrow()
            .iter()
            .find(|(t, _)| *t == made_by)
            .map(|(_, name)| format!("kernel `{name}`"))
    });
    let origin = match origin {
        Some(o) => o,
        None if made_by == 0 => "no kernel (outside any kernel build)".to_string(),
        None => "another kernel".to_string(),
    };
    let name = with(|c| c.name.clone());
    record_error(BuildError::new(
        span,
        format!(
            "{what} made while building {origin} is used while building kernel `{name}`: a \
             {what} cannot outlive its kernel (it is a handle to a value of the kernel being \
             built); do not keep tiles or buffers in statics, thread-locals or other state \
             that outlives the kernel, pass them as arguments of #[helper] functions instead"
        ),
    ));
}

/// Counts one iteration of a comptime loop (`what`: "`for`", "`while`", at `span`)
/// against [`MAX_COMPTIME_ITERATIONS_PER_KERNEL`]; past it, ends the build (unwinding to
/// [`trace`]) with an error at the loop.
#[inline]
pub(crate) fn comptime_iteration(what: &str, span: &Span) {
    let n = COMPTIME_ITERATIONS.with(|c| {
        let n = c.get() + 1;
        c.set(n);
        n
    });
    if n > MAX_COMPTIME_ITERATIONS_PER_KERNEL {
        comptime_budget_exceeded(what, span);
    }
}

#[cold]
fn comptime_budget_exceeded(what: &str, span: &Span) {
    if !TRACING.with(Cell::get) {
        // Not building a kernel (the count is reset by `trace`): nothing to bound.
        COMPTIME_ITERATIONS.with(|c| c.set(0));
        return;
    }
    std::panic::panic_any(BuildError::new(
        span.clone(),
        format!(
            "this comptime {what} loop crossed the limit of \
             {MAX_COMPTIME_ITERATIONS_PER_KERNEL} comptime loop iterations while building the \
             kernel (all comptime loops together: nested loops multiply, loops in helpers \
             count): comptime loops run while the kernel is built, unrolled; make the outer \
             loops runtime loops (`Scalar<i32>` bounds)"
        ),
    ));
}

/// Installs (once per process) a panic hook that, on a thread tracing a kernel,
/// records where the panic happened and prints nothing (the panic becomes the build
/// error), and otherwise defers to the hook installed before. A panic inside Tessera's
/// own sources while tracing (an internal bug, not the kernel's `panic!`/`assert!`) is
/// also passed to the hook before, so that its message and backtrace are printed.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if TRACING.with(Cell::get) {
                let at = info
                    .location()
                    .map(|l| Span::new(l.file(), l.line(), l.column()));
                PANIC_AT.with(|p| *p.borrow_mut() = at);
                if info.payload().downcast_ref::<BuildError>().is_none()
                    && info.location().is_some_and(|l| internal_source(l.file()))
                {
                    previous(info);
                }
            } else {
                previous(info);
            }
        }));
    });
}

/// True if `file` (a panic location) is among the sources of Tessera's tracing
/// front-end or runtime, rather than in a kernel or a helper.
fn internal_source(file: &str) -> bool {
    let file = file.replace('\\', "/");
    ["dsl-ir/src/", "runtime/src/"]
        .iter()
        .any(|d| file.starts_with(d) || file.contains(&format!("/{d}")))
}

/// The most deeply nested `#[helper]` calls while tracing: deeper is a build error
/// (a recursive helper whose comptime base case is never reached), not a stack
/// overflow.
pub const MAX_HELPER_DEPTH: u32 = 256;

/// The most `#[helper]` calls while tracing one kernel: a helper that recurses in both
/// branches of a runtime `if` (both are traced) makes `2^depth` calls within the depth
/// limit; past this many the build ends with an error naming the helper.
pub const MAX_HELPER_CALLS: u64 = 1 << 16;

/// One `#[helper]` call in progress (its guard, made by [`enter_helper`]).
pub struct HelperCall {
    _private: (),
}

impl Drop for HelperCall {
    fn drop(&mut self) {
        HELPER_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Called by `#[helper]` functions on entry (`name`, defined at `file:line:col`):
/// counts the nesting of helper calls, and ends the build with an error naming the
/// helper when it exceeds [`MAX_HELPER_DEPTH`].
pub fn enter_helper(name: &str, file: &str, line: u32, col: u32) -> HelperCall {
    let depth = HELPER_DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    let calls = HELPER_CALLS.with(|c| {
        c.set(c.get() + 1);
        c.get()
    });
    let call = HelperCall { _private: () };
    let why = if depth > MAX_HELPER_DEPTH {
        Some(format!(
            "helper `{name}` is nested more than {MAX_HELPER_DEPTH} calls deep: a \
             recursive #[helper] must reach its base case through comptime arguments \
             (helpers are inlined while the kernel is built)"
        ))
    } else if calls > MAX_HELPER_CALLS {
        Some(format!(
            "more than {MAX_HELPER_CALLS} #[helper] calls while building this kernel (the \
             last one: `{name}`): helpers are inlined, and a helper that calls itself in \
             both branches of a runtime `if` (both are traced) doubles the calls at every \
             level; branch at comptime or recurse in one branch"
        ))
    } else {
        None
    };
    if let Some(message) = why {
        let err = BuildError::new(Span::new(file, line, col), message);
        if TRACING.with(Cell::get) {
            // Unwinds to `trace`, which returns it.
            std::panic::panic_any(err);
        }
        panic!("{err}");
    }
    call
}

/// Runs `f` with the kernel builder. Panics when no kernel is being traced: tiles only
/// exist inside [`trace`].
fn with<R>(f: impl FnOnce(&mut Ctx) -> R) -> R {
    CTX.with(|c| {
        let mut c = c.borrow_mut();
        let ctx = c
            .as_mut()
            .expect("Tessera tile operations can only run while a #[kernel] is being built");
        f(ctx)
    })
}

/// Records `err` unless an earlier error is already recorded.
pub(crate) fn record_error(err: BuildError) {
    with(|c| {
        if c.error.is_none() {
            c.error = Some(err);
        }
    })
}

/// Appends an op with one result; on a type error, records it and returns a
/// placeholder of type `fallback` so tracing can go on.
pub(crate) fn emit1(
    kind: OpKind,
    operands: &[ValueId],
    hint: Option<&Type>,
    fallback: Type,
    span: Span,
) -> ValueId {
    with(|c| match c.b.op1(kind, operands, hint, span) {
        Ok(v) => v,
        Err(e) => {
            if c.error.is_none() {
                c.error = Some(e);
            }
            c.b.push_placeholder(fallback)
        }
    })
}

/// Appends an op without results (store, barrier).
pub(crate) fn emit0(kind: OpKind, operands: &[ValueId], span: Span) {
    with(|c| {
        if let Err(e) = c.b.op(kind, operands, None, span)
            && c.error.is_none()
        {
            c.error = Some(e);
        }
    })
}

/// Runs `f` with direct access to the builder (control flow).
pub(crate) fn with_builder<R>(f: impl FnOnce(&mut FunctionBuilder) -> R) -> R {
    with(|c| f(&mut c.b))
}

/// The type of a value of the kernel being traced.
pub(crate) fn type_of(v: ValueId) -> Type {
    with(|c| c.b.ty(v).clone())
}

/// Builds the IR of one kernel: sets up the tracing context, lets `body` declare the
/// parameters (through [`KernelParams`]) and trace the body, and returns the function
/// or the first error recorded while tracing. A panic while tracing (a `panic!` or
/// failed `assert!` in the kernel, or a helper nested too deep) is caught and returned
/// as an error naming the kernel, at the panic's location. Nested calls are an error.
pub fn trace(
    name: &str,
    span: Span,
    body: impl FnOnce(&mut KernelParams),
) -> Result<Function, BuildError> {
    let busy = CTX.with(|c| c.borrow().is_some());
    if busy {
        return Err(BuildError::new(
            span,
            format!("cannot build kernel `{name}` while another kernel is being built"),
        ));
    }
    CTX.with(|c| {
        *c.borrow_mut() = Some(Ctx {
            b: FunctionBuilder::new(name, span.clone()),
            error: None,
            name: name.to_string(),
        })
    });
    let number = NEXT_TRACE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CURRENT_TRACE.with(|t| t.set(number));
    TRACE_NAMES.with(|n| {
        let mut n = n.borrow_mut();
        if n.len() == TRACE_NAMES_KEPT {
            n.pop_front();
        }
        n.push_back((number, name.to_string()));
    });
    // Clear the context even if the body panics, so the thread stays usable.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            CTX.with(|c| *c.borrow_mut() = None);
            CURRENT_TRACE.with(|t| t.set(0));
        }
    }
    let reset = Reset;
    install_panic_hook();
    TRACING.with(|t| t.set(true));
    PANIC_AT.with(|p| *p.borrow_mut() = None);
    COMPTIME_ITERATIONS.with(|c| c.set(0));
    HELPER_CALLS.with(|c| c.set(0));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut params = KernelParams { _private: () };
        body(&mut params);
    }));
    TRACING.with(|t| t.set(false));
    let ctx = CTX.with(|c| c.borrow_mut().take());
    drop(reset);
    let Some(ctx) = ctx else {
        return Err(BuildError::new(
            span,
            format!("internal error: the tracing context of kernel `{name}` was lost"),
        ));
    };
    // An error recorded before a panic is its likely cause: report it first.
    if let Some(e) = ctx.error {
        return Err(e);
    }
    if let Err(payload) = outcome {
        return Err(panic_error(name, span, &ctx.b, payload));
    }
    Ok(ctx.b.finish())
}

/// The build error for a panic while tracing kernel `name`: at the panic's location
/// (the kernel's if unknown), with its message.
fn panic_error(
    name: &str,
    span: Span,
    b: &FunctionBuilder,
    payload: Box<dyn std::any::Any + Send>,
) -> BuildError {
    let payload = match payload.downcast::<BuildError>() {
        Ok(e) => return *e,
        Err(p) => p,
    };
    let message = if let Some(m) = payload.downcast_ref::<&str>() {
        (*m).to_string()
    } else if let Some(m) = payload.downcast_ref::<String>() {
        m.clone()
    } else {
        "(a panic without a message)".to_string()
    };
    let at = PANIC_AT.with(|p| p.borrow_mut().take()).unwrap_or(span);
    let runtime = if b.depth() > 0 {
        "; this code is inside a runtime `if`/`for`/`while`, which is traced whatever its \
         runtime condition (both branches of an `if`), so a `panic!`/`assert!` there fails the \
         build even if the branch is never taken at run time (check at run time with \
         `device_assert`, or branch at comptime)"
    } else {
        ""
    };
    BuildError::new(
        at,
        format!("kernel `{name}` panicked while being built: {message}{runtime}"),
    )
}

/// Declares kernel parameters, in launch order, while tracing.
pub struct KernelParams {
    _private: (),
}

impl KernelParams {
    /// A buffer parameter: a pointer to global memory of `T`.
    pub fn buffer<T: DType>(&mut self, name: &str, readonly: bool) -> Global<T> {
        let id = with_builder(|b| {
            b.param(
                name,
                Type::global_ptr(T::TY),
                ParamAttrs {
                    readonly,
                    divisibility: None,
                    within_2gib: false,
                    tensor_map: false,
                    ..ParamAttrs::default()
                },
            )
        });
        Global::from_ptr(id)
    }

    /// A symmetric buffer parameter (one copy per rank, see [`Symmetric`]).
    pub fn symmetric<T: DType>(&mut self, name: &str, readonly: bool) -> Symmetric<T> {
        Symmetric {
            local: self.buffer(name, readonly),
        }
    }

    /// A runtime scalar parameter.
    pub fn scalar<T: DType>(&mut self, name: &str) -> Scalar<T> {
        let id = with_builder(|b| b.param(name, Type::scalar(T::TY), ParamAttrs::default()));
        Tile::from_id(id)
    }

    /// A runtime scalar parameter launches do not specialize on (`#[no_specialize]`,
    /// [`ParamAttrs::no_specialize`]).
    pub fn scalar_unspecialized<T: DType>(&mut self, name: &str) -> Scalar<T> {
        let attrs = ParamAttrs {
            no_specialize: true,
            ..ParamAttrs::default()
        };
        let id = with_builder(|b| b.param(name, Type::scalar(T::TY), attrs));
        Tile::from_id(id)
    }
}

// ---------------------------------------------------------------------------------
// Tiles and buffers

/// A runtime value: a tile of `T` with static shape `S` (a scalar when `S = ()`).
/// Tiles are cheap `Copy` handles to IR values of the kernel being built: they cannot
/// outlive it (they are neither `Send` nor `Sync`, so no `static` holds one, and one
/// kept elsewhere, in a thread-local, fails the build of the kernel that uses it).
pub struct Tile<T: DType, S: Shape> {
    id: ValueId,
    origin: OnlyInsideItsKernel,
    _t: PhantomData<fn() -> (T, S)>,
}

impl<T: DType, S: Shape> Clone for Tile<T, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: DType, S: Shape> Copy for Tile<T, S> {}

impl<T: DType, S: Shape> std::fmt::Debug for Tile<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tile<{}, {:?}>({})", T::TY, S::dims(), self.id)
    }
}

/// A runtime scalar.
pub type Scalar<T> = Tile<T, ()>;

impl<T: DType, S: Shape> Tile<T, S> {
    /// Wraps an IR value of the kernel being built (the caller guarantees its type).
    pub fn from_id(id: ValueId) -> Self {
        Tile {
            id,
            origin: OnlyInsideItsKernel::current(),
            _t: PhantomData,
        }
    }

    /// The IR value. A tile made while building another kernel records a build error
    /// (a tile cannot outlive its kernel) and gives a placeholder.
    #[track_caller]
    pub fn id(self) -> ValueId {
        self.origin.check(self.id, "tile", Self::ir_type)
    }

    /// The IR type of tiles of this Rust type.
    pub fn ir_type() -> Type {
        Type::tile(T::TY, &S::dims())
    }
}

/// A kernel buffer parameter: a pointer to `T` elements in global memory. Kernel
/// signatures take `&Global<T>` (read-only) or `&mut Global<T>` (written); stores and
/// atomics need `&mut`.
pub struct Global<T: DType> {
    ptr: ValueId,
    origin: OnlyInsideItsKernel,
    _t: PhantomData<fn() -> T>,
}

impl<T: DType> std::fmt::Debug for Global<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Global<{}>({})", T::TY, self.ptr)
    }
}

impl<T: DType> Global<T> {
    /// Wraps a pointer value (the caller guarantees its type is `ptr<T>`). Crate
    /// private: a writable `Global` made from a read-only one's pointer would get
    /// around `&Global` (the verifier refuses such writes too).
    pub(crate) fn from_ptr(ptr: ValueId) -> Global<T> {
        Global {
            ptr,
            origin: OnlyInsideItsKernel::current(),
            _t: PhantomData,
        }
    }

    /// The pointer value. A buffer of another kernel's build (a `Local` kept in a
    /// thread-local) records a build error and gives a placeholder.
    #[track_caller]
    pub fn id(&self) -> ValueId {
        self.origin
            .check(self.ptr, "buffer", || Type::global_ptr(T::TY))
    }
}

/// Makes a constant tile of `T` with shape `S` from an IR constant.
#[track_caller]
pub(crate) fn constant<T: DType, S: Shape>(c: ConstValue) -> Tile<T, S> {
    let ty = Tile::<T, S>::ir_type();
    Tile::from_id(emit1(
        OpKind::Const(c),
        &[],
        Some(&ty),
        ty.clone(),
        Span::caller(),
    ))
}

/// Converts a Rust literal or comptime number into a constant of type `T`, checking
/// that it is representable.
pub(crate) fn literal_const(
    ty: ScalarType,
    lit: LitValue,
    span: &Span,
) -> Result<ConstValue, BuildError> {
    let err = |m: String| BuildError::new(span.clone(), m);
    match (lit, ty) {
        (LitValue::Bool(b), ScalarType::I1) => Ok(ConstValue::Bool(b)),
        (LitValue::Bool(_), _) => Err(err(format!("a bool cannot be used as {ty}"))),
        (_, ScalarType::I1) => Err(err("a number cannot be used as a bool (i1)".into())),
        (LitValue::Int(i), t) if t.is_float() => Ok(ConstValue::Float(round_to(i as f64, t))),
        (LitValue::Int(i), t) => {
            let bits = t.bits();
            let fits = if t.is_signed_int() {
                let min = -(1i128 << (bits - 1));
                let max = (1i128 << (bits - 1)) - 1;
                (min..=max).contains(&i)
            } else {
                (0..=((1i128 << bits) - 1)).contains(&i)
            };
            if !fits {
                return Err(err(format!("the constant {i} does not fit in {t}")));
            }
            Ok(ConstValue::Int(i as i64))
        }
        (LitValue::Float(x), t) if t.is_float() => Ok(ConstValue::Float(round_to(x, t))),
        (LitValue::Float(x), t) => Err(err(format!(
            "the float constant {x} cannot be used as the integer type {t}"
        ))),
    }
}

/// Rounds an f64 to the precision of a float type (an IR constant of type `t` holds
/// exactly the value the type can represent).
pub(crate) fn round_to(x: f64, t: ScalarType) -> f64 {
    match t {
        ScalarType::F16 => f64::from(f16::from_f64(x)),
        ScalarType::BF16 => f64::from(bf16::from_f64(x)),
        ScalarType::F32 => f64::from(x as f32),
        _ => x,
    }
}

/// A Rust number or bool used where a tile is expected.
#[derive(Clone, Copy, Debug)]
pub enum LitValue {
    /// Any Rust integer.
    Int(i128),
    /// Any Rust float.
    Float(f64),
    /// A Rust bool.
    Bool(bool),
}

/// Emits the span-carrying constant for a literal operand, recording a conversion
/// error if it does not fit.
pub(crate) fn literal_tile<T: DType>(lit: LitValue, span: Span) -> Scalar<T> {
    let ty = Type::scalar(T::TY);
    match literal_const(T::TY, lit, &span) {
        Ok(c) => Tile::from_id(emit1(OpKind::Const(c), &[], Some(&ty), ty.clone(), span)),
        Err(e) => {
            record_error(e);
            Tile::from_id(with_builder(|b| b.push_placeholder(ty)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::internal_source;

    #[test]
    fn panics_in_tessera_sources_are_internal() {
        assert!(internal_source("dsl-ir/src/dsl/mod.rs"));
        assert!(internal_source("/home/u/tessera/dsl-ir/src/builder.rs"));
        assert!(internal_source("runtime/src/launch.rs"));
        assert!(internal_source(r"C:\src\tessera\dsl-ir\src\dsl\ops.rs"));
        assert!(!internal_source("tests/tests/macro_hardening.rs"));
        assert!(!internal_source("src/main.rs"));
        assert!(!internal_source("my-dsl-ir/src/kernels.rs"));
    }
}

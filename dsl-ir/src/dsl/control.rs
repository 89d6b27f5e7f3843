//! Control flow for traced kernels. `#[kernel]` rewrites `if`, `for` over ranges and
//! `while` into calls of [`if_else`], [`for_range`] and [`while_loop`]; which of them
//! run at comptime (plain Rust, unrolled) and which become IR (`if`, `for`, `while`
//! ops) is decided by the types: a `bool` condition or Rust integer bounds are
//! comptime, a `Scalar<bool>` condition or a `Scalar<i32>`/`Scalar<i64>` bound is
//! runtime.
//!
//! Variables assigned inside a construct are passed in and out explicitly (the macro
//! finds them), so a runtime construct turns them into loop-carried values or `if`
//! results. Only tiles (and tuples and arrays of tiles) can be carried at runtime; a
//! comptime value assigned inside a runtime construct is a build error, and so is a
//! change the macro saw but cannot carry ([`Opaque`]: `v.push(..)`, `*r = ..`).
//! Comptime loops are capped at [`MAX_COMPTIME_ITERATIONS`] each, and at
//! [`MAX_COMPTIME_ITERATIONS_PER_KERNEL`] together while one kernel is built.

use super::{DType, Int, Scalar, Tile, comptime_iteration, record_error, type_of, with_builder};
use crate::builder::BuildError;
use crate::ir::{OpKind, Span, ValueId};
use crate::types::Type;

use super::shape::Shape;

/// Values that `if`, `for` and `while` can pass through: at runtime they become IR
/// values; at comptime they are moved through as they are.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be assigned inside a kernel `if`, `for` or `while`",
    label = "only tiles, Rust numbers and bools, and tuples/arrays of them can",
    note = "at runtime only tiles can change inside a construct"
)]
pub trait Carry: Clone {
    /// Appends the IR values this holds; `Err` (a description) if it is a comptime
    /// value, which cannot change inside a runtime construct.
    fn flatten(&self, out: &mut Vec<ValueId>) -> Result<(), String>;
    /// A copy of `self` holding the next values of `vals` instead.
    fn rebuild(&self, vals: &mut dyn Iterator<Item = ValueId>) -> Self;
    /// Like `flatten`, for the tuple of a construct's variables: errors name the
    /// variable.
    fn flatten_vars(&self, names: &[&str], out: &mut Vec<ValueId>) -> Result<(), String> {
        let _ = names;
        self.flatten(out)
    }
}

impl<T: DType, S: Shape> Carry for Tile<T, S> {
    fn flatten(&self, out: &mut Vec<ValueId>) -> Result<(), String> {
        out.push(self.id());
        Ok(())
    }
    fn rebuild(&self, vals: &mut dyn Iterator<Item = ValueId>) -> Self {
        // The count always matches: rebuild follows the same structure as flatten.
        Tile::from_id(vals.next().unwrap_or(self.id()))
    }
}

macro_rules! comptime_carry {
    ($($t:ty),*) => {$(
        impl Carry for $t {
            fn flatten(&self, _out: &mut Vec<ValueId>) -> Result<(), String> {
                Err(format!("a comptime `{}`", stringify!($t)))
            }
            fn rebuild(&self, _vals: &mut dyn Iterator<Item = ValueId>) -> Self {
                self.clone()
            }
        }
    )*};
}
comptime_carry!(
    bool, i8, i16, i32, i64, isize, u8, u16, u32, u64, usize, f32, f64, String
);

impl<V: Carry, const N: usize> Carry for [V; N] {
    fn flatten(&self, out: &mut Vec<ValueId>) -> Result<(), String> {
        self.iter().try_for_each(|v| v.flatten(out))
    }
    fn rebuild(&self, vals: &mut dyn Iterator<Item = ValueId>) -> Self {
        std::array::from_fn(|i| self[i].rebuild(vals))
    }
}

impl<V: Carry> Carry for Vec<V> {
    fn flatten(&self, out: &mut Vec<ValueId>) -> Result<(), String> {
        self.iter().try_for_each(|v| v.flatten(out))
    }
    fn rebuild(&self, vals: &mut dyn Iterator<Item = ValueId>) -> Self {
        self.iter().map(|v| v.rebuild(vals)).collect()
    }
}

impl Carry for () {
    fn flatten(&self, _out: &mut Vec<ValueId>) -> Result<(), String> {
        Ok(())
    }
    fn rebuild(&self, _vals: &mut dyn Iterator<Item = ValueId>) -> Self {}
}

macro_rules! tuple_carry {
    ($($n:tt $v:ident),*) => {
        impl<$($v: Carry),*> Carry for ($($v,)*) {
            fn flatten(&self, out: &mut Vec<ValueId>) -> Result<(), String> {
                $( self.$n.flatten(out)?; )*
                Ok(())
            }
            fn rebuild(&self, vals: &mut dyn Iterator<Item = ValueId>) -> Self {
                ($( self.$n.rebuild(vals), )*)
            }
            fn flatten_vars(&self, names: &[&str], out: &mut Vec<ValueId>) -> Result<(), String> {
                $(
                    self.$n.flatten(out).map_err(|what| match names.get($n) {
                        Some(name) => format!("variable `{name}` ({what})"),
                        None => what,
                    })?;
                )*
                Ok(())
            }
        }
    };
}
tuple_carry!(0 A);
tuple_carry!(0 A, 1 B);
tuple_carry!(0 A, 1 B, 2 C);
tuple_carry!(0 A, 1 B, 2 C, 3 D);
tuple_carry!(0 A, 1 B, 2 C, 3 D, 4 E);
tuple_carry!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F);
tuple_carry!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G);
tuple_carry!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H);
tuple_carry!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I);
tuple_carry!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J);
tuple_carry!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K);
tuple_carry!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K, 11 L);

/// Flattens `v` for a runtime construct, recording an error (and returning an empty
/// list) if it holds comptime values.
fn flatten_runtime<V: Carry>(v: &V, names: &[&str], what: &str, span: &Span) -> Vec<ValueId> {
    let mut out = Vec::new();
    if let Err(desc) = v.flatten_vars(names, &mut out) {
        record_error(BuildError::new(
            span.clone(),
            format!(
                "{desc} is assigned inside a runtime {what}; only tiles can change inside a \
                 runtime construct (make it a tile, or make the condition/bounds comptime)"
            ),
        ));
        out.clear();
    }
    out
}

/// Changes inside a construct that the macro cannot pass through it (`v.push(..)`,
/// `*r = ..` on a variable declared outside): `(description, line, column)`, in the
/// construct's file.
pub type Opaque<'a> = &'a [(&'a str, u32, u32)];

/// Rejects the changes in `opaque` for a runtime construct (`what`): the construct is
/// traced once (both branches of an `if`), so they would happen once at build time,
/// whatever the runtime condition or trip count.
fn reject_opaque(opaque: Opaque<'_>, what: &str, span: &Span) {
    if let Some(&(desc, line, col)) = opaque.first() {
        record_error(BuildError::new(
            Span {
                line,
                col,
                ..span.clone()
            },
            format!(
                "{desc} changes a variable declared outside a runtime {what}, in a way the \
                 macro cannot pass through it: the construct is traced once (both branches \
                 of an `if`), so the change would happen once at build time whatever the \
                 runtime condition. Assign the variable with `=` or `op=` (only tiles can \
                 change inside a runtime construct), or make the condition/bounds comptime"
            ),
        ));
    }
}

fn types_of(vals: &[ValueId]) -> Vec<Type> {
    vals.iter().map(|&v| type_of(v)).collect()
}

fn push_yield(vals: Vec<ValueId>, span: &Span) {
    with_builder(|b| b.push_op(OpKind::Yield, vals, Vec::new(), Vec::new(), span.clone()));
}

// ---------------------------------------------------------------------------------
// if

/// Conditions of `if`: `bool` (comptime: only the taken branch is traced) or
/// `Scalar<bool>` (runtime: both branches become regions of an `if` op).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the condition of a kernel `if`",
    label = "expected a `bool` (comptime) or a `Scalar<bool>` (runtime)",
    note = "a tile condition with more than one element is not a branch; use `select`"
)]
pub trait CondBranch {
    /// Runs the construct. `arm(true, vars)` traces the then-branch, `arm(false,
    /// vars)` the else-branch; each returns the variables and the branch's value.
    fn branch<V: Carry, R: Carry>(
        self,
        vars: V,
        names: &[&str],
        opaque: Opaque<'_>,
        arm: impl FnMut(bool, V) -> (V, R),
        span: Span,
    ) -> (V, R);
}

impl CondBranch for bool {
    fn branch<V: Carry, R: Carry>(
        self,
        vars: V,
        _names: &[&str],
        _opaque: Opaque<'_>,
        mut arm: impl FnMut(bool, V) -> (V, R),
        _span: Span,
    ) -> (V, R) {
        arm(self, vars)
    }
}

/// Shapes of branch conditions: only the scalar shape `()`. A runtime `if` or `while`
/// branches on one `bool`; a tile of conditions is elementwise and needs `select`.
#[diagnostic::on_unimplemented(
    message = "a kernel `if`/`while` condition must be a scalar, but this is a tile of shape `{Self}`",
    label = "a multi-element condition: the branch would differ per element",
    note = "to choose per element, use `select(cond, a, b)`; \
            to branch, reduce the condition to a scalar first"
)]
pub trait ScalarCond: Shape {}
impl ScalarCond for () {}

impl<S: ScalarCond> CondBranch for Tile<bool, S> {
    fn branch<V: Carry, R: Carry>(
        self,
        vars: V,
        names: &[&str],
        opaque: Opaque<'_>,
        mut arm: impl FnMut(bool, V) -> (V, R),
        span: Span,
    ) -> (V, R) {
        // Check that the variables can be carried before tracing the branches.
        flatten_runtime(&vars, names, "`if`", &span);
        reject_opaque(opaque, "`if`", &span);
        let mut trace_arm = |which: bool| {
            with_builder(|b| b.open_region(&[]));
            let (v, r) = arm(which, vars.clone());
            let mut vals = flatten_runtime(&v, names, "`if`", &span);
            vals.extend(flatten_runtime(&r, &[], "`if` (its value)", &span));
            let tys = types_of(&vals);
            push_yield(vals, &span);
            let region = with_builder(|b| b.close_region());
            (region, tys, v, r)
        };
        let (then_region, then_tys, v, r) = trace_arm(true);
        let (else_region, else_tys, _, _) = trace_arm(false);
        if then_tys != else_tys {
            record_error(BuildError::new(
                span.clone(),
                "the branches of a runtime `if` produce values of different types",
            ));
        }
        let results = with_builder(|b| {
            b.push_op(
                OpKind::If,
                vec![self.id()],
                then_tys,
                vec![then_region, else_region],
                span,
            )
        });
        let mut it = results.into_iter();
        let v = v.rebuild(&mut it);
        let r = r.rebuild(&mut it);
        (v, r)
    }
}

/// `if cond { .. } else { .. }`: `arm(true, vars)` runs the then-branch and
/// `arm(false, vars)` the else-branch, each taking and returning the variables assigned
/// inside, plus the branch's value.
#[track_caller]
pub fn if_else<C: CondBranch, V: Carry, R: Carry>(
    cond: C,
    vars: V,
    names: &[&str],
    opaque: Opaque<'_>,
    arm: impl FnMut(bool, V) -> (V, R),
) -> (V, R) {
    cond.branch(vars, names, opaque, arm, Span::caller())
}

// ---------------------------------------------------------------------------------
// for

/// The most iterations a comptime `for` or `while` loop may run (they run while the
/// kernel is built, unrolled): more is a build error naming the loop, rather than a
/// build that never ends.
pub const MAX_COMPTIME_ITERATIONS: u64 = 1 << 20;

/// The most iterations of all comptime `for` and `while` loops together (nested ones,
/// and those in helpers, each iteration of an inner loop counting) while one kernel is
/// built: more is a build error at the loop that crosses it.
pub const MAX_COMPTIME_ITERATIONS_PER_KERNEL: u64 = 1 << 22;

/// Rust integers usable as comptime loop bounds.
pub trait CtInt: Copy {
    /// The value.
    fn to_i128(self) -> i128;
    /// Converts back (the caller checks the range).
    fn from_i128(v: i128) -> Self;
}
macro_rules! ct_int {
    ($($t:ty),*) => {$(
        impl CtInt for $t {
            fn to_i128(self) -> i128 { self as i128 }
            fn from_i128(v: i128) -> Self { v as $t }
        }
    )*};
}
ct_int!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

/// Integer types of runtime loop induction variables.
pub trait LoopIndex: Int {}
impl LoopIndex for i32 {}
impl LoopIndex for i64 {}

/// A runtime loop bound: a scalar of the index type, or a Rust integer.
pub trait RtBound<I: LoopIndex> {
    /// The IR value.
    fn value(self, span: &Span) -> ValueId;
}
impl<I: LoopIndex> RtBound<I> for Scalar<I> {
    fn value(self, _span: &Span) -> ValueId {
        self.id()
    }
}
impl<I: LoopIndex, C: CtInt> RtBound<I> for C {
    fn value(self, span: &Span) -> ValueId {
        super::literal_tile::<I>(super::LitValue::Int(self.to_i128()), span.clone()).id()
    }
}

/// The bounds `(start, end, step)` of a `for` loop over a range. All-comptime bounds
/// unroll the loop at comptime (the index is a Rust integer of `end`'s type); a
/// `Scalar<i32>`/`Scalar<i64>` bound makes it a runtime loop (the index is a scalar).
#[diagnostic::on_unimplemented(
    message = "`{Self}` are not valid `for` bounds in a kernel",
    label = "bounds are Rust integers (comptime) or `Scalar<i32>`/`Scalar<i64>` (runtime)"
)]
pub trait ForRange {
    /// The loop index type.
    type Idx;
    /// Runs the loop.
    fn run<V: Carry>(
        self,
        vars: V,
        names: &[&str],
        opaque: Opaque<'_>,
        body: impl FnMut(Self::Idx, V) -> V,
        span: Span,
    ) -> V;
}

impl<A: CtInt, B: CtInt, C: CtInt> ForRange for (A, B, C) {
    type Idx = B;
    fn run<V: Carry>(
        self,
        mut vars: V,
        _names: &[&str],
        _opaque: Opaque<'_>,
        mut body: impl FnMut(B, V) -> V,
        span: Span,
    ) -> V {
        let (start, end, step) = (self.0.to_i128(), self.1.to_i128(), self.2.to_i128());
        if step <= 0 {
            record_error(BuildError::new(
                span,
                format!("a `for` loop step must be positive, got {step}"),
            ));
            return vars;
        }
        let trips = if end > start {
            (end - start + step - 1) / step
        } else {
            0
        };
        if trips > i128::from(MAX_COMPTIME_ITERATIONS) {
            record_error(BuildError::new(
                span,
                format!(
                    "this comptime `for` loop over {start}..{end} (step {step}) would be \
                     unrolled {trips} times, more than the limit of {MAX_COMPTIME_ITERATIONS}: \
                     comptime loops run while the kernel is built; use runtime bounds \
                     (`Scalar<i32>`) for a long loop"
                ),
            ));
            return vars;
        }
        let mut i = start;
        while i < end {
            comptime_iteration("`for`", &span);
            vars = body(B::from_i128(i), vars);
            i += step;
        }
        vars
    }
}

fn runtime_for<I: LoopIndex, V: Carry>(
    (lb, ub, st): (ValueId, ValueId, ValueId),
    vars: V,
    names: &[&str],
    opaque: Opaque<'_>,
    mut body: impl FnMut(Scalar<I>, V) -> V,
    span: Span,
) -> V {
    let inits = flatten_runtime(&vars, names, "`for` loop", &span);
    reject_opaque(opaque, "`for` loop", &span);
    let init_tys = types_of(&inits);
    let mut arg_tys = vec![Type::scalar(I::TY)];
    arg_tys.extend(init_tys.iter().cloned());
    let args = with_builder(|b| b.open_region(&arg_tys));
    let inner = vars.rebuild(&mut args[1..].iter().copied());
    let out = body(Tile::from_id(args[0]), inner);
    let yields = flatten_runtime(&out, names, "`for` loop", &span);
    if types_of(&yields) != init_tys {
        record_error(BuildError::new(
            span.clone(),
            "a loop-carried variable changes type inside a runtime `for` loop",
        ));
    }
    push_yield(yields, &span);
    let region = with_builder(|b| b.close_region());
    let mut operands = vec![lb, ub, st];
    operands.extend(inits);
    let results = with_builder(|b| b.push_op(OpKind::For, operands, init_tys, vec![region], span));
    vars.rebuild(&mut results.into_iter())
}

macro_rules! rt_for {
    ($(($a:ty, $b:ty, $c:ty)),*) => {$(
        impl<I: LoopIndex, X: RtBound<I>, Y: RtBound<I>> ForRange for $a
        where $b: RtBound<I>, $c: RtBound<I> {
            type Idx = Scalar<I>;
            fn run<V: Carry>(
                self,
                vars: V,
                names: &[&str],
                opaque: Opaque<'_>,
                body: impl FnMut(Scalar<I>, V) -> V,
                span: Span,
            ) -> V {
                let b = (self.0.value(&span), self.1.value(&span), self.2.value(&span));
                runtime_for::<I, V>(b, vars, names, opaque, body, span)
            }
        }
    )*};
}
// One impl per position of the first runtime bound; the other two bounds may be
// either kind.
rt_for!(((Scalar<I>, X, Y), X, Y));

impl<I: LoopIndex, A: CtInt, Y: RtBound<I>> ForRange for (A, Scalar<I>, Y) {
    type Idx = Scalar<I>;
    fn run<V: Carry>(
        self,
        vars: V,
        names: &[&str],
        opaque: Opaque<'_>,
        body: impl FnMut(Scalar<I>, V) -> V,
        span: Span,
    ) -> V {
        let b = (
            RtBound::<I>::value(self.0, &span),
            self.1.id(),
            self.2.value(&span),
        );
        runtime_for::<I, V>(b, vars, names, opaque, body, span)
    }
}

impl<I: LoopIndex, A: CtInt, B: CtInt> ForRange for (A, B, Scalar<I>) {
    type Idx = Scalar<I>;
    fn run<V: Carry>(
        self,
        vars: V,
        names: &[&str],
        opaque: Opaque<'_>,
        body: impl FnMut(Scalar<I>, V) -> V,
        span: Span,
    ) -> V {
        let b = (
            RtBound::<I>::value(self.0, &span),
            RtBound::<I>::value(self.1, &span),
            self.2.id(),
        );
        runtime_for::<I, V>(b, vars, names, opaque, body, span)
    }
}

/// `for i in start..end` (stepping by `step`), with the variables assigned inside
/// passed through `body`.
#[track_caller]
pub fn for_range<R: ForRange, V: Carry>(
    bounds: R,
    vars: V,
    names: &[&str],
    opaque: Opaque<'_>,
    body: impl FnMut(R::Idx, V) -> V,
) -> V {
    bounds.run(vars, names, opaque, body, Span::caller())
}

// ---------------------------------------------------------------------------------
// while

/// Conditions of `while`: `bool` (a comptime loop) or `Scalar<bool>` (a `while` op).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the condition of a kernel `while`",
    label = "expected a `bool` (comptime) or a `Scalar<bool>` (runtime)"
)]
pub trait WhileCond: Sized {
    /// Runs the loop. `step(true, vars)` evaluates the condition (returning it in
    /// `Some`), `step(false, vars)` runs the body.
    fn run<V: Carry>(
        vars: V,
        names: &[&str],
        opaque: Opaque<'_>,
        step: impl FnMut(bool, V) -> (V, Option<Self>),
        span: Span,
    ) -> V;
}

impl WhileCond for bool {
    fn run<V: Carry>(
        mut vars: V,
        _names: &[&str],
        _opaque: Opaque<'_>,
        mut step: impl FnMut(bool, V) -> (V, Option<bool>),
        span: Span,
    ) -> V {
        for _ in 0..MAX_COMPTIME_ITERATIONS {
            comptime_iteration("`while`", &span);
            let (v, c) = step(true, vars);
            vars = v;
            if c != Some(true) {
                return vars;
            }
            vars = step(false, vars).0;
        }
        record_error(BuildError::new(
            span,
            format!(
                "this comptime `while` loop (a `bool` condition) did not end after \
                 {MAX_COMPTIME_ITERATIONS} iterations: comptime loops run while the kernel is \
                 built; check its condition, or make it a runtime loop (a `Scalar<bool>` \
                 condition)"
            ),
        ));
        vars
    }
}

impl<S: ScalarCond> WhileCond for Tile<bool, S> {
    fn run<V: Carry>(
        vars: V,
        names: &[&str],
        opaque: Opaque<'_>,
        mut step: impl FnMut(bool, V) -> (V, Option<Self>),
        span: Span,
    ) -> V {
        let inits = flatten_runtime(&vars, names, "`while` loop", &span);
        reject_opaque(opaque, "`while` loop", &span);
        let init_tys = types_of(&inits);
        let args = with_builder(|b| b.open_region(&init_tys));
        let v = vars.rebuild(&mut args.iter().copied());
        let (v, c) = step(true, v);
        let fwd = flatten_runtime(&v, names, "`while` loop", &span);
        let fwd_tys = types_of(&fwd);
        let c = match c {
            Some(c) => c.id(),
            None => {
                record_error(BuildError::new(span.clone(), "`while` condition missing"));
                with_builder(|b| b.push_placeholder(Type::scalar(crate::types::ScalarType::I1)))
            }
        };
        let mut cond_operands = vec![c];
        cond_operands.extend(fwd);
        with_builder(|b| {
            b.push_op(
                OpKind::Condition,
                cond_operands,
                Vec::new(),
                Vec::new(),
                span.clone(),
            )
        });
        let before = with_builder(|b| b.close_region());

        let args = with_builder(|b| b.open_region(&fwd_tys));
        let v = vars.rebuild(&mut args.iter().copied());
        let (out, _) = step(false, v);
        let yields = flatten_runtime(&out, names, "`while` loop", &span);
        if types_of(&yields) != init_tys {
            record_error(BuildError::new(
                span.clone(),
                "a loop-carried variable changes type inside a runtime `while` loop",
            ));
        }
        push_yield(yields, &span);
        let after = with_builder(|b| b.close_region());
        let results =
            with_builder(|b| b.push_op(OpKind::While, inits, fwd_tys, vec![before, after], span));
        vars.rebuild(&mut results.into_iter())
    }
}

/// Checks that `cond` can be the condition of a `while` (the generated code passes each
/// condition through this, so that a bad one is reported at the condition itself).
pub fn while_cond<C: WhileCond>(cond: C) -> C {
    cond
}

/// `while cond { body }`: `step(true, vars)` evaluates the condition and
/// `step(false, vars)` runs the body, each taking and returning the variables
/// assigned inside.
#[track_caller]
pub fn while_loop<V: Carry, C: WhileCond>(
    vars: V,
    names: &[&str],
    opaque: Opaque<'_>,
    step: impl FnMut(bool, V) -> (V, Option<C>),
) -> V {
    C::run(vars, names, opaque, step, Span::caller())
}

/// Values that `<`, `<=`, `>` and `>=` compare in a kernel body: Rust values (comptime
/// integers, floats, const parameters), never tiles. `#[kernel]` routes those operators
/// through [`compare`] so that a comparison of tiles names the methods to use.
#[diagnostic::on_unimplemented(
    message = "`<`, `<=`, `>` and `>=` compare Rust values, not `{Self}`",
    label = "a tile or a scalar traced in the kernel",
    note = "compare tiles elementwise with `.lt(..)`, `.le(..)`, `.gt(..)`, `.ge(..)`, `.eq(..)` or `.ne(..)`, which give a `Tile<bool, _>` (a mask for `load`/`store`/`select`, or the condition of an `if`)"
)]
pub trait RustOrd<Rhs: ?Sized> {
    /// `self OP rhs`.
    fn compare(&self, rhs: &Rhs) -> Option<std::cmp::Ordering>;
}

#[diagnostic::do_not_recommend]
impl<A: ?Sized + PartialOrd<B>, B: ?Sized> RustOrd<B> for A {
    fn compare(&self, rhs: &B) -> Option<std::cmp::Ordering> {
        self.partial_cmp(rhs)
    }
}

/// Which of `<`, `<=`, `>`, `>=` a [`compare`] call stands for.
#[derive(Clone, Copy, Debug)]
pub enum OrdOp {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// `a OP b` for Rust values, as the operator would compute it (`PartialOrd`; false
/// when unordered, e.g. a NaN).
#[inline]
pub fn compare<A: ?Sized + RustOrd<B>, B: ?Sized>(op: OrdOp, a: &A, b: &B) -> bool {
    use std::cmp::Ordering::{Equal, Greater, Less};
    matches!(
        (op, a.compare(b)),
        (OrdOp::Lt, Some(Less))
            | (OrdOp::Gt, Some(Greater))
            | (OrdOp::Le, Some(Less | Equal))
            | (OrdOp::Ge, Some(Greater | Equal))
    )
}

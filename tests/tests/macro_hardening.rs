//! The macro never miscompiles silently (issue #14, item 3): kernels whose control
//! flow the `#[kernel]` rewrite could get wrong either run correctly (checked on the
//! CPU device against plain-Rust references on random inputs, outputs poisoned first)
//! or fail to build with an error naming the kernel and the user's line. The
//! compile-time rejections are UI tests (tests/ui/).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera_tests::line_of;

const B: usize = 64;
const SOURCE: &str = include_str!("macro_hardening.rs");

/// The build error of kernel `K` for comptime arguments `ct`, as the user reads it.
fn build_error<K: Kernel>(ct: &K::Comptime) -> String {
    match tessera::kernel_ir::<K>(ct) {
        Ok(_) => panic!("kernel `{}` built, but should not", K::NAME),
        Err(e) => e.to_string(),
    }
}

/// Asserts that `err` is at `marker`'s line of this file (the line after it if the
/// marker says "(the next line)") and contains `parts`.
fn assert_error_at(err: &str, marker: &str, parts: &[&str]) {
    let next = SOURCE
        .lines()
        .any(|l| l.contains(marker) && l.contains("(the next line)"));
    let line = line_of(SOURCE, marker) + u32::from(next);
    let at = format!("tests/tests/macro_hardening.rs:{line}:");
    assert!(err.contains(&at), "error not at {at}: {err}");
    for p in parts {
        assert!(err.contains(p), "error lacks {p:?}: {err}");
    }
}

fn rand_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-8..8) as f32 * 0.5).collect()
}

// ---------------------------------------------------------------------------------
// 1. A variable assigned in a construct and shadowed later in it is still carried.

/// `acc` is assigned inside runtime `for`/`if` bodies, then shadowed by a `let acc`
/// later in the same body, in a nested block, and by a `for acc in` pattern: each
/// assignment before the shadowing updates the outer `acc`.
#[kernel]
fn shadowed_carry(x: &Global<f32>, out: &mut Global<f32>, n: i32, flag: i32) {
    let offs = arange::<B>();
    let mut acc = x.load_unmasked(offs);
    let mut other = zeros::<f32, S1<B>>();
    for _i in 0..n {
        acc = acc + 1.0;
        let acc = acc * 2.0; // shadows the outer `acc` for the rest of the body
        other = other + acc;
    }
    if flag.eq(1) {
        acc = acc * 3.0;
        {
            let acc = acc + 100.0;
            other = other + acc;
        }
    } else {
        acc = acc - 1.0;
        if flag.eq(2) {
            acc = acc * 0.5;
            let acc = 7.0f32;
            other = other + acc;
        }
    }
    for _j in 0..n {
        acc = acc + 0.25;
        for acc in 0..2 {
            other = other + acc as f32;
        }
    }
    out.store_unmasked(offs, acc);
    out.store_unmasked(offs + B as i32, other);
}

fn shadowed_reference(x: &[f32], n: i32, flag: i32) -> (Vec<f32>, Vec<f32>) {
    let mut accs = Vec::new();
    let mut others = Vec::new();
    for &x in x {
        let mut acc = x;
        let mut other = 0.0f32;
        for _ in 0..n {
            acc += 1.0;
            other += acc * 2.0;
        }
        if flag == 1 {
            acc *= 3.0;
            other += acc + 100.0;
        } else {
            acc -= 1.0;
            if flag == 2 {
                acc *= 0.5;
                other += 7.0;
            }
        }
        for _ in 0..n {
            acc += 0.25;
            other += 1.0;
        }
        accs.push(acc);
        others.push(other);
    }
    (accs, others)
}

#[test]
fn shadowed_variables_are_still_carried() {
    let dev = Device::cpu();
    for (seed, n, flag) in [(1, 3, 1), (2, 0, 0), (3, 5, 2), (4, 2, 0)] {
        let xs = rand_vec(seed, B);
        let x = dev.upload(&xs).unwrap();
        let mut out = dev.upload(&vec![f32::NAN; 2 * B]).unwrap();
        shadowed_carry::launch(&dev, 1u32, (&x, &mut out, n, flag)).unwrap();
        let got = out.download().unwrap();
        let (acc, other) = shadowed_reference(&xs, n, flag);
        assert_eq!(&got[..B], &acc[..], "acc, n={n} flag={flag}");
        assert_eq!(&got[B..], &other[..], "other, n={n} flag={flag}");
    }
}

/// The same with comptime constructs (unrolled) and comptime values.
#[kernel]
fn shadowed_comptime(out: &mut Global<i32>, #[comptime] n: i32) {
    let mut count = 0i32;
    for _i in 0..n {
        count += 2;
        let count = 1000;
        let _ = count;
    }
    if n > 1 {
        count *= 10;
        {
            let count = -1;
            let _ = count;
        }
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(count));
}

#[test]
fn shadowed_comptime_variables_are_still_carried() {
    let dev = Device::cpu();
    for n in [0, 1, 3] {
        let mut out = dev.upload(&[-99i32]).unwrap();
        shadowed_comptime::launch(&dev, 1u32, (&mut out, n)).unwrap();
        let want = if n > 1 { 2 * n * 10 } else { 2 * n };
        assert_eq!(out.download().unwrap(), vec![want], "n={n}");
    }
}

/// A comptime variable assigned in a runtime loop and then shadowed was dropped from the
/// carried list: the assignment happened once at build time, silently. It is a build
/// error now, as without the shadowing.
#[kernel]
fn shadowed_comptime_in_runtime_loop(out: &mut Global<i32>, n: i32) {
    let mut count = 0i32;
    // MARK shadowed_comptime_in_runtime_loop (the next line)
    for _i in 0..n {
        count += 1;
        let count = 5;
        let _ = count;
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(count));
}

#[test]
fn shadowed_comptime_variable_in_runtime_loop_is_rejected() {
    let err = build_error::<shadowed_comptime_in_runtime_loop>(&());
    assert_error_at(
        &err,
        "MARK shadowed_comptime_in_runtime_loop",
        &[
            "shadowed_comptime_in_runtime_loop",
            "variable `count` (a comptime `i32`) is assigned inside a runtime `for` loop",
        ],
    );
}

// ---------------------------------------------------------------------------------
// 3. Comptime values changed inside runtime constructs in ways the macro cannot carry.

#[kernel]
fn push_in_runtime_if(out: &mut Global<i32>, flag: i32) {
    let mut v: Vec<i32> = Vec::new();
    if flag.eq(1) {
        v.push(1); // MARK push_in_runtime_if
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(v.len() as i32));
}

#[kernel]
fn add_assign_in_runtime_for(out: &mut Global<i32>, n: i32) {
    use std::ops::AddAssign;
    let mut count = 0i32;
    for _i in 0..n {
        count.add_assign(1); // MARK add_assign_in_runtime_for
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(count));
}

#[kernel]
fn deref_in_runtime_while(out: &mut Global<i32>, n: i32) {
    let mut count = 0i32;
    let r = &mut count;
    let mut i = zeros::<i32, ()>();
    while i.lt(n) {
        *r += 1; // MARK deref_in_runtime_while
        i = i + 1;
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(count));
}

/// In a runtime `for` nested in a comptime `if`: the change is still inside the
/// runtime loop.
#[kernel]
fn push_in_nested_runtime_for(out: &mut Global<i32>, n: i32, #[comptime] on: bool) {
    let mut v: Vec<i32> = Vec::new();
    if on {
        for _i in 0..n {
            if on {
                v.push(2); // MARK push_in_nested_runtime_for
            }
        }
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(v.len() as i32));
}

#[test]
fn uncarried_changes_in_runtime_constructs_are_rejected() {
    let cases = [
        (
            build_error::<push_in_runtime_if>(&()),
            "MARK push_in_runtime_if",
            "`v.push(..)` changes a variable declared outside a runtime `if`",
        ),
        (
            build_error::<add_assign_in_runtime_for>(&()),
            "MARK add_assign_in_runtime_for",
            "`count.add_assign(..)` changes a variable declared outside a runtime `for` loop",
        ),
        (
            build_error::<deref_in_runtime_while>(&()),
            "MARK deref_in_runtime_while",
            "`*r += ..` (through a reference) changes a variable declared outside a runtime \
             `while` loop",
        ),
        (
            build_error::<push_in_nested_runtime_for>(&(true,)),
            "MARK push_in_nested_runtime_for",
            "`v.push(..)` changes a variable declared outside a runtime `for` loop",
        ),
    ];
    for (err, marker, what) in cases {
        assert_error_at(&err, marker, &[what, "traced once"]);
    }
}

/// The same changes in comptime constructs (and of variables declared inside the
/// runtime construct) are fine and take effect as written.
#[kernel]
fn changes_in_comptime_constructs(out: &mut Global<i32>, n: i32, #[comptime] k: usize) {
    use std::ops::AddAssign;
    let mut v: Vec<i32> = Vec::new();
    let mut count = 0i32;
    for i in 0..k {
        v.push(i as i32);
        count.add_assign(2);
    }
    if k > 2 {
        let r = &mut count;
        *r += 100;
    }
    let mut acc = zeros::<i32, ()>();
    for _i in 0..n {
        let mut local: Vec<i32> = Vec::new();
        local.push(3);
        acc = acc + local.len() as i32;
    }
    let offs = arange::<4>();
    let vals = select(offs.eq(0), v.len() as i32, select(offs.eq(1), count, 0));
    out.store_unmasked(offs, select(offs.eq(2), acc, vals));
}

#[test]
fn changes_in_comptime_constructs_still_work() {
    let dev = Device::cpu();
    for (n, k) in [(0, 0usize), (3, 2), (5, 4)] {
        let mut out = dev.upload(&[-99i32; 4]).unwrap();
        changes_in_comptime_constructs::launch(&dev, 1u32, (&mut out, n, k)).unwrap();
        let count = 2 * k as i32 + if k > 2 { 100 } else { 0 };
        assert_eq!(
            out.download().unwrap(),
            vec![k as i32, count, n, 0],
            "n={n} k={k}"
        );
    }
}

// ---------------------------------------------------------------------------------
// 4. Comptime loops are capped.

#[kernel]
fn endless_comptime_while(out: &mut Global<i32>) {
    let mut i = 0u64;
    // MARK endless_comptime_while (the next line)
    while i < 10 {
        i = i.wrapping_mul(1);
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(i as i32));
}

#[kernel]
fn huge_comptime_for(out: &mut Global<i32>) {
    let mut last = 0u64;
    // MARK huge_comptime_for (the next line)
    for i in 0..u64::MAX {
        last = i;
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(last as i32));
}

#[test]
fn endless_comptime_loops_are_build_errors() {
    let err = build_error::<endless_comptime_while>(&());
    assert_error_at(
        &err,
        "MARK endless_comptime_while",
        &[
            "endless_comptime_while",
            "comptime `while` loop",
            &format!("{}", tessera::ir::dsl::MAX_COMPTIME_ITERATIONS),
        ],
    );
    let err = build_error::<huge_comptime_for>(&());
    assert_error_at(
        &err,
        "MARK huge_comptime_for",
        &[
            "huge_comptime_for",
            "comptime `for` loop over 0..18446744073709551615",
        ],
    );
}

// ---------------------------------------------------------------------------------
// 5. Helper recursion depth is limited.

#[helper]
// MARK countdown (the next line)
fn countdown(x: Scalar<i32>, n: u32) -> Scalar<i32> {
    // The base case is `n == 0`, but `n` grows: never reached.
    if n == 0 { x } else { countdown(x + 1, n + 1) }
}

#[helper]
fn countdown_ok(x: Scalar<i32>, n: u32) -> Scalar<i32> {
    if n == 0 {
        x
    } else {
        countdown_ok(x + 1, n - 1)
    }
}

/// Recursing inside a runtime branch (traced whatever the condition): deeper frames
/// per level.
#[helper]
// MARK runtime_recursion (the next line)
fn runtime_recursion(x: Scalar<i32>) -> Scalar<i32> {
    let mut y = x;
    if x.lt(1000) {
        y = runtime_recursion(x * 2 + 1);
    }
    y
}

/// Recursing in both branches of a runtime `if` (both traced): `2^n` calls within
/// the depth limit.
#[helper]
// MARK doubling (the next line)
fn doubling(x: Scalar<i32>, n: u32) -> Scalar<i32> {
    if n == 0 {
        x
    } else {
        let mut y = x;
        if x.lt(0) {
            y = doubling(x + 1, n - 1);
        } else {
            y = doubling(x - 1, n - 1);
        }
        y
    }
}

#[kernel]
fn doubling_kernel(out: &mut Global<i32>, x: i32, #[comptime] n: u32) {
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(0) + doubling(x, n));
}

#[test]
fn helper_calls_per_kernel_are_capped() {
    let err = build_error::<doubling_kernel>(&(20,));
    assert_error_at(
        &err,
        "MARK doubling",
        &[
            "doubling_kernel",
            "more than 65536 #[helper] calls",
            "`doubling`",
        ],
    );
    // A few levels build and run (x = -3: three steps up, then down: 0 - 1 - 1 ...).
    let dev = Device::cpu();
    let mut out = dev.upload(&[7i32]).unwrap();
    doubling_kernel::launch(&dev, 1u32, (&mut out, -3, 4)).unwrap();
    assert_eq!(out.download().unwrap(), vec![-1]);
}

#[kernel]
fn recursive_at_runtime(out: &mut Global<i32>, x: i32) {
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(0) + runtime_recursion(x));
}

#[kernel]
fn recursive(out: &mut Global<i32>, #[comptime] ok: bool) {
    let x = zeros::<i32, ()>();
    let y = if ok {
        countdown_ok(x, 20)
    } else {
        countdown(x, 1)
    };
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(0) + y);
}

#[test]
fn endless_helper_recursion_is_a_build_error() {
    let err = build_error::<recursive>(&(false,));
    assert_error_at(
        &err,
        "MARK countdown",
        &[
            "recursive",
            "helper `countdown` is nested more than 256 calls deep",
        ],
    );
    let err = build_error::<recursive_at_runtime>(&());
    assert_error_at(
        &err,
        "MARK runtime_recursion",
        &[
            "recursive_at_runtime",
            "helper `runtime_recursion` is nested more than 256",
        ],
    );
    // The depth count is back to zero: a finite recursion builds and runs.
    let dev = Device::cpu();
    let mut out = dev.upload(&[-1i32]).unwrap();
    recursive::launch(&dev, 1u32, (&mut out, true)).unwrap();
    assert_eq!(out.download().unwrap(), vec![20]);
}

// ---------------------------------------------------------------------------------
// 6. Panics while building are build errors naming the kernel.

#[kernel]
fn panics(out: &mut Global<i32>, flag: i32, #[comptime] which: u32) {
    if which == 0 {
        panic!("which must not be {which}"); // MARK panic
    }
    assert!(which != 1, "which is one"); // MARK assert
    if flag.eq(12345) {
        if which == 2 {
            panic!("unreachable at run time"); // MARK runtime branch
        }
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(which as i32));
}

#[test]
fn panics_while_building_are_build_errors() {
    let err = build_error::<panics>(&(0,));
    assert_error_at(
        &err,
        "MARK panic",
        &["kernel `panics` panicked while being built: which must not be 0"],
    );
    assert!(!err.contains("runtime `if`"), "{err}");
    let err = build_error::<panics>(&(1,));
    assert_error_at(
        &err,
        "MARK assert",
        &["kernel `panics` panicked", "which is one"],
    );
    // A runtime branch is traced whatever its condition: the message says so.
    let err = build_error::<panics>(&(2,));
    assert_error_at(
        &err,
        "MARK runtime branch",
        &[
            "unreachable at run time",
            "inside a runtime `if`/`for`/`while`",
            "device_assert",
        ],
    );
    // The thread is still usable, and other comptime values build and run.
    let dev = Device::cpu();
    let mut out = dev.upload(&[-1i32]).unwrap();
    panics::launch(&dev, 1u32, (&mut out, 0, 3)).unwrap();
    assert_eq!(out.download().unwrap(), vec![3]);
}

// ---------------------------------------------------------------------------------
// 7. Hygiene: parameters named like the launch function's own, `mut` parameters,
// lint attributes and `cfg` on the kernel.

#[kernel]
#[allow(clippy::too_many_arguments)]
#[cfg(not(any()))]
fn named_like_launch(
    device: &Global<f32>,
    grid: &mut Global<f32>,
    args: i32,
    mut scale: f32,
    #[comptime] mut extra: i32,
    __tessera_ct: i32,
) {
    let offs = arange::<B>();
    scale = scale * 2.0;
    extra += 1;
    let v = device.load_unmasked(offs) * scale + (args + extra + __tessera_ct).cast::<f32>();
    grid.store_unmasked(offs, v);
}

#[test]
fn parameters_named_like_launch_internals_work() {
    let dev = Device::cpu();
    let xs = rand_vec(7, B);
    let device = dev.upload(&xs).unwrap();
    let mut grid = dev.upload(&vec![f32::NAN; B]).unwrap();
    named_like_launch::launch(&dev, 1u32, (&device, &mut grid, 3, 1.5, 10, 100)).unwrap();
    let want: Vec<f32> = xs.iter().map(|x| x * 3.0 + 114.0).collect();
    assert_eq!(grid.download().unwrap(), want);
}

// ---------------------------------------------------------------------------------
// 8. Tool attributes on a kernel are accepted; an `expect` is never left unfulfilled by
// the generated items (it is an `allow` on each of them).

#[deny(unfulfilled_lint_expectations)]
mod kernel_lint_attributes {
    use tessera::prelude::*;

    #[kernel]
    #[rustfmt::skip]
    #[clippy::msrv = "1.85"]
    #[expect(clippy::too_many_arguments)]
    #[expect(unused_variables, reason = "`unused` is never read")]
    pub fn many_params(
        out: &mut Global<i32>,
        a: i32,
        b: i32,
        c: i32,
        d: i32,
        e: i32,
        f: i32,
        g: i32,
    ) {
        let unused = 1;
        let v = full::<i32, S1<1>>(0) + a + b + c + d + e + f + g;
        out.store_unmasked(arange::<1>(), v);
    }
}

#[test]
fn tool_attributes_and_expect_on_a_kernel() {
    let dev = Device::cpu();
    let mut out = dev.upload(&[-1i32]).unwrap();
    kernel_lint_attributes::many_params::launch(&dev, 1u32, (&mut out, 1, 2, 3, 4, 5, 6, 7))
        .unwrap();
    assert_eq!(out.download().unwrap(), vec![28]);
}

// ---------------------------------------------------------------------------------
// 9. Named format arguments are allowed in format-style macros, nested ones included
// (assignments elsewhere in macro arguments are UI tests: macro_args_control_flow.rs).

#[kernel]
fn named_format_arguments(out: &mut Global<i32>, #[comptime] n: i32) {
    assert!(n >= 0, "{}", format!("n = {v}", v = n));
    assert!(n >= 0, "n = {v}", v = n);
    assert_eq!(n, n, "{a} {b}", a = n, b = format!("{c}", c = n + 1));
    debug_assert_ne!(n, n + 1, "{m}", m = n);
    let s = format!("{x}{y}", x = n, y = { n + 1 });
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(s.len() as i32));
}

#[test]
fn named_format_arguments_work() {
    let dev = Device::cpu();
    let mut out = dev.upload(&[-1i32]).unwrap();
    named_format_arguments::launch(&dev, 1u32, (&mut out, 12)).unwrap();
    assert_eq!(out.download().unwrap(), vec![4]);
}

// ---------------------------------------------------------------------------------
// 10. Destructuring assignments (`S { a, b } = ..`, `P(a, b) = ..`) in runtime
// constructs carry the variables they assign.

struct Pair<T> {
    a: T,
    b: T,
}

struct Two<T>(T, T);

#[kernel]
fn destructuring_in_runtime_constructs(x: &Global<f32>, out: &mut Global<f32>, n: i32, flag: i32) {
    let offs = arange::<B>();
    let mut a = x.load_unmasked(offs);
    let mut b = zeros::<f32, S1<B>>();
    let mut c = full::<f32, S1<B>>(1.0);
    for _i in 0..n {
        Pair { a, b } = Pair {
            a: a + 1.0,
            b: b + a,
        };
        (Two(b, c), _) = (Two(b * 0.5, c + b), 0);
    }
    if flag.eq(1) {
        Two(a, b) = Two(b, a);
        Pair { a: c, .. } = Pair { a: c * 2.0, b: a };
    }
    out.store_unmasked(offs, a);
    out.store_unmasked(offs + B as i32, b);
    out.store_unmasked(offs + 2 * B as i32, c);
}

fn destructuring_reference(x: f32, n: i32, flag: i32) -> [f32; 3] {
    let (mut a, mut b, mut c) = (x, 0.0f32, 1.0f32);
    for _ in 0..n {
        (a, b) = (a + 1.0, b + a);
        (b, c) = (b * 0.5, c + b);
    }
    if flag == 1 {
        (a, b) = (b, a);
        c *= 2.0;
    }
    [a, b, c]
}

#[test]
fn destructuring_assignments_in_runtime_constructs_are_carried() {
    let dev = Device::cpu();
    for (seed, n, flag) in [(11, 3, 1), (12, 0, 1), (13, 4, 0)] {
        let xs = rand_vec(seed, B);
        let x = dev.upload(&xs).unwrap();
        let mut out = dev.upload(&vec![f32::NAN; 3 * B]).unwrap();
        destructuring_in_runtime_constructs::launch(&dev, 1u32, (&x, &mut out, n, flag)).unwrap();
        let got = out.download().unwrap();
        for (i, &x) in xs.iter().enumerate() {
            let want = destructuring_reference(x, n, flag);
            let got = [got[i], got[B + i], got[2 * B + i]];
            assert_eq!(got, want, "element {i}, n={n} flag={flag}");
        }
    }
}

// ---------------------------------------------------------------------------------
// 11. Comptime loops are capped together while one kernel is built: nested loops each
// under the per-loop cap, but too many iterations in all, are a build error.

#[kernel]
fn nested_comptime_loops(out: &mut Global<i32>, #[comptime] outer: u32) {
    let mut count = 0u64;
    for _i in 0..outer {
        // MARK nested_comptime_loops (the next line)
        for _j in 0..4096u32 {
            count += 1;
        }
    }
    out.store_unmasked(arange::<1>(), full::<i32, S1<1>>(count as i32));
}

#[test]
fn nested_comptime_loops_are_capped_together() {
    use tessera::ir::dsl::{MAX_COMPTIME_ITERATIONS, MAX_COMPTIME_ITERATIONS_PER_KERNEL};
    let outer = 2048u32;
    assert!(u64::from(outer) * 4096 > MAX_COMPTIME_ITERATIONS_PER_KERNEL);
    assert!(u64::from(outer) <= MAX_COMPTIME_ITERATIONS);
    let err = build_error::<nested_comptime_loops>(&(outer,));
    assert_error_at(
        &err,
        "MARK nested_comptime_loops",
        &[
            "nested_comptime_loops",
            "comptime `for` loop crossed the limit of",
            &format!("{MAX_COMPTIME_ITERATIONS_PER_KERNEL}"),
        ],
    );
    // The count starts again for each build: just under the limit builds.
    let outer = 1000u32;
    assert!(u64::from(outer) * 4097 <= MAX_COMPTIME_ITERATIONS_PER_KERNEL);
    let dev = Device::cpu();
    let mut out = dev.upload(&[-1i32]).unwrap();
    nested_comptime_loops::launch(&dev, 1u32, (&mut out, outer)).unwrap();
    assert_eq!(out.download().unwrap(), vec![4096 * 1000]);
}

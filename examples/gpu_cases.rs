//! Kernels of the GPU check that no other example has: bf16 and f64 arithmetic,
//! system-scope atomics and prefix sums. Included by `gpu_check.rs` (which runs
//! them against the CPU interpreter) and `aot.rs` (which precompiles them); not an
//! example of its own.

use tessera::prelude::*;

/// `out = bf16(x * a + b)`, computed in f32 from bf16 inputs.
#[kernel]
pub fn bf16_axpb<const B: usize>(x: &Global<bf16>, out: &mut Global<bf16>, a: f32, b: f32, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.lt(n);
    let v = x.load(offs, mask).cast::<f32>() * a + b;
    out.store(offs, v.cast::<bf16>(), mask);
}

/// `out = sqrt(x * x + 1) * x - x / 3` in f64.
#[kernel]
pub fn f64_poly<const B: usize>(x: &Global<f64>, out: &mut Global<f64>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.lt(n);
    let v = x.load(offs, mask);
    out.store(offs, (v * v + 1.0f64).sqrt() * v - v / 3.0f64, mask);
}

/// `counts[keys[i]] += 1` for every `i < n`, with relaxed system-scope atomics (the
/// scope peers and the host synchronize at).
#[kernel]
pub fn histogram_system<const B: usize>(keys: &Global<i32>, counts: &mut Global<u32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.lt(n);
    let k = keys.load(offs, mask);
    let _ = counts.atomic_rmw(
        AtomicOp::Add,
        k,
        1u32,
        mask,
        MemOrder::Relaxed,
        MemScope::System,
    );
}

/// Inclusive prefix sums of each row of a `rows x cols` matrix (`cols <= C`), one
/// program per row.
#[kernel]
pub fn row_cumsum<T: Num, const C: usize>(x: &Global<T>, out: &mut Global<T>, cols: i32) {
    let c = arange::<C>();
    let mask = c.lt(cols);
    let offs = program_id(0) * cols + c;
    out.store(offs, x.load(offs, mask).cumsum::<0>(), mask);
}

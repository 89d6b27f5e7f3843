//! The interpreter's sanitizer: an access outside a buffer is an error naming the
//! kernel, the op, the user's file:line:col, the program id and the offending index.

use tessera::prelude::*;
use tessera_tests::line_of;

const SOURCE: &str = include_str!("sanitizer.rs");

/// Reads one element past the end in the last program: `n` is not a multiple of the
/// tile and there is no mask.
#[kernel]
fn unmasked_tail<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.lt(n);
    let v = x.load_unmasked(offs); // MARK: oob-load
    out.store(offs, v, mask);
}

/// Writes at a negative index.
#[kernel]
fn negative_store<const B: usize>(out: &mut Global<i32>) {
    let offs = arange::<B>() - 3;
    out.store_unmasked(offs, offs); // MARK: oob-store
}

/// The same out-of-range lanes, masked off: no error.
#[kernel]
fn masked_tail<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.lt(n);
    out.store(offs, x.load(offs, mask), mask);
}

/// A scalar atomic one past the end.
#[kernel]
fn atomic_past_end(counter: &mut Global<i32>, n: i32) {
    let one = zeros::<i32, ()>() + 1;
    counter.atomic_add(n, one, one.eq(1)); // MARK: oob-atomic
}

#[test]
fn out_of_bounds_load_names_line_index_and_program() {
    let dev = Device::cpu();
    let n = 1000usize; // the last program (id 3) covers 768..1024
    let x = dev.upload(&vec![1.0f32; n]).unwrap();
    let mut out = dev.alloc::<f32>(n).unwrap();
    let err = unmasked_tail::<256>::launch(&dev, 4u32, (&x, &mut out, n as i32))
        .expect_err("the unmasked tail must be caught")
        .to_string();
    let line = line_of(SOURCE, "MARK: oob-load");
    assert!(
        err.contains(&format!("tests/tests/sanitizer.rs:{line}:")),
        "{err}"
    );
    assert!(err.contains("unmasked_tail"), "{err}");
    assert!(err.contains("load"), "{err}");
    assert!(err.contains("1000"), "first offending index: {err}");
    assert!(err.contains("(3, 0, 0)"), "program id: {err}");
    assert!(err.contains("`x`"), "buffer name: {err}");
}

#[test]
fn out_of_bounds_store_names_negative_index() {
    let dev = Device::cpu();
    let mut out = dev.alloc::<i32>(64).unwrap();
    let err = negative_store::<64>::launch(&dev, 1u32, (&mut out,))
        .expect_err("negative index must be caught")
        .to_string();
    let line = line_of(SOURCE, "MARK: oob-store");
    assert!(
        err.contains(&format!("tests/tests/sanitizer.rs:{line}:")),
        "{err}"
    );
    assert!(err.contains("store"), "{err}");
    assert!(err.contains("-3"), "offending index: {err}");
    assert!(err.contains("negative_store"), "{err}");
}

#[test]
fn out_of_bounds_atomic_is_caught() {
    let dev = Device::cpu();
    let mut c = dev.alloc::<i32>(4).unwrap();
    let err = atomic_past_end::launch(&dev, 1u32, (&mut c, 4))
        .expect_err("index 4 of 4 must be caught")
        .to_string();
    let line = line_of(SOURCE, "MARK: oob-atomic");
    assert!(
        err.contains(&format!("tests/tests/sanitizer.rs:{line}:")),
        "{err}"
    );
    assert!(err.contains("atomic"), "{err}");
    // In bounds: every program adds once.
    atomic_past_end::launch(&dev, 5u32, (&mut c, 2)).unwrap();
    assert_eq!(c.download().unwrap(), vec![0, 0, 5, 0]);
}

#[test]
fn masked_lanes_are_never_accessed() {
    let dev = Device::cpu();
    for n in [1usize, 255, 256, 257, 1000] {
        let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let x = dev.upload(&xs).unwrap();
        let mut out = dev.upload(&vec![f32::NAN; n]).unwrap();
        masked_tail::<256>::launch(&dev, n.div_ceil(256), (&x, &mut out, n as i32)).unwrap();
        assert_eq!(out.download().unwrap(), xs, "n = {n}");
    }
}

#[test]
fn the_run_stops_without_writing_past_the_error() {
    // After an error the buffers are still usable and no write went out of bounds:
    // the launch either fails or leaves a well-formed buffer.
    let dev = Device::cpu();
    let x = dev.upload(&[2.0f32; 10]).unwrap();
    let mut out = dev.upload(&[f32::NAN; 10]).unwrap();
    assert!(unmasked_tail::<16>::launch(&dev, 1u32, (&x, &mut out, 10)).is_err());
    assert_eq!(out.download().unwrap().len(), 10);
}

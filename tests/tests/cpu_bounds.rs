//! The compiled CPU device never reads or writes outside a launch's buffers, in any
//! build: with the sanitizer off (`TESSERA_SANITIZE=0`, the release builds'
//! default) every access that happens is still checked, and an access outside its
//! buffer fails the launch as the interpreter reports it (the kernel, the buffer,
//! the index), before it touches memory. Before these checks, each case below
//! returned `Ok(())` in a release build after writing into the process's heap (or
//! reading heap garbage, or crashing).
//!
//! This file sets the process's configuration (sanitizer off) for all its tests, so
//! it is a test binary of its own.

use tessera::prelude::*;
use tessera_tests::line_of;

const SOURCE: &str = include_str!("cpu_bounds.rs");

/// The sanitizer off for this process, as a release build has it: only the
/// always-on bounds checks remain.
fn release_like() -> Device {
    let mut c = tessera::config::Config::from_env().expect("configuration");
    c.sanitize = false;
    tessera::config::set(c);
    // Every launch runs the compiled code (not the interpreter while it compiles).
    tessera_tests::compiled_cpu()
}

/// The mask is off by one (`le` for `lt`): the last lane of the last program
/// stores one element past the end.
#[kernel]
fn off_by_one<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.le(n);
    let v = x.load(offs, offs.lt(n));
    out.store(offs, v * 2.0, mask); // MARK: off-by-one
}

/// A whole tile past the end, unmasked (loads and stores by vector runs).
#[kernel]
fn unmasked_copy<const B: usize>(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = program_id(0) * B + arange::<B>();
    out.store_unmasked(offs, x.load_unmasked(offs) + 1.0); // MARK: unmasked
}

/// A load at a negative offset, its mask true everywhere.
#[kernel]
fn negative_load<const B: usize>(x: &Global<i32>, out: &mut Global<i32>, shift: i32) {
    let offs = arange::<B>();
    let v = x.load(offs - shift, offs.ge(0)); // MARK: negative
    out.store_unmasked(offs, v);
}

/// An `i32` index that wraps: `base + lane` past `i32::MAX` becomes negative.
#[kernel]
fn wrapping_index<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, base: i32) {
    let offs = arange::<B>();
    let v = x.load_unmasked(offs + base); // MARK: wrap
    out.store_unmasked(offs, v);
}

/// Reads a gathered index from `idx` (not affine: checked lane by lane).
#[kernel]
fn gather<const B: usize>(x: &Global<f32>, idx: &Global<i32>, out: &mut Global<f32>) {
    let offs = arange::<B>();
    let i = idx.load_unmasked(offs);
    out.store_unmasked(offs, x.load_unmasked(i)); // MARK: gather
}

fn random_f32(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 100.0 - 10.0
        })
        .collect()
}

/// The error on the compiled device names what the interpreter's names: the kernel,
/// the buffer, the line and the index.
fn assert_reported(err: &str, kernel: &str, buffer: &str, marker: &str, index: i64) {
    let line = line_of(SOURCE, marker);
    assert!(err.contains(kernel), "{err}");
    assert!(err.contains(&format!("`{buffer}`")), "buffer: {err}");
    assert!(
        err.contains(&format!("tests/tests/cpu_bounds.rs:{line}:")),
        "line {line}: {err}"
    );
    assert!(err.contains(&index.to_string()), "index {index}: {err}");
}

#[test]
fn an_off_by_one_mask_is_an_error_not_a_heap_write() {
    let dev = release_like();
    let n = 1000usize; // the last program covers 768..1024; lane 1000 stores
    let xs = random_f32(n, 1);
    let x = dev.upload(&xs).unwrap();
    let mut out = dev.upload(&vec![f32::NAN; n]).unwrap();
    let err = off_by_one::<256>::launch(&dev, 4u32, (&x, &mut out, n as i32))
        .expect_err("the store one past the end must be refused")
        .to_string();
    assert_reported(&err, "off_by_one", "out", "MARK: off-by-one", 1000);
    // The interpreter says the same.
    let interp = Device::interp();
    let mut out2 = interp.upload(&vec![f32::NAN; n]).unwrap();
    let ierr = off_by_one::<256>::launch(&interp, 4u32, (&x, &mut out2, n as i32))
        .expect_err("interpreter")
        .to_string();
    assert_reported(&ierr, "off_by_one", "out", "MARK: off-by-one", 1000);
    // With the mask right, every element is written (the check does not get in
    // the way of the tail tile).
    #[kernel]
    fn right<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
        let offs = program_id(0) * B + arange::<B>();
        let mask = offs.lt(n);
        out.store(offs, x.load(offs, mask) * 2.0, mask);
    }
    let mut out = dev.upload(&vec![f32::NAN; n]).unwrap();
    right::<256>::launch(&dev, 4u32, (&x, &mut out, n as i32)).unwrap();
    let got = out.download().unwrap();
    for i in 0..n {
        assert_eq!(got[i], xs[i] * 2.0, "element {i}");
    }
}

#[test]
fn an_unmasked_tile_past_the_end_is_refused_on_load_and_store() {
    let dev = release_like();
    // Loads: `x` has 64 elements, the second program reads 64..128.
    let x = dev.upload(&random_f32(64, 2)).unwrap();
    let mut out = dev.alloc::<f32>(128).unwrap();
    let err = unmasked_copy::<64>::launch(&dev, 2u32, (&x, &mut out))
        .expect_err("the load past the end must be refused")
        .to_string();
    assert_reported(&err, "unmasked_copy", "x", "MARK: unmasked", 64);
    // Stores: `out` has 64 elements.
    let x = dev.upload(&random_f32(128, 3)).unwrap();
    let mut out = dev.alloc::<f32>(64).unwrap();
    let err = unmasked_copy::<64>::launch(&dev, 2u32, (&x, &mut out))
        .expect_err("the store past the end must be refused")
        .to_string();
    assert_reported(&err, "unmasked_copy", "out", "MARK: unmasked", 64);
    // A run that starts inside and ends outside (56 elements: the run of 16 from 48
    // reaches 63): the first element outside is reported, nothing is read past it.
    for len in [56usize, 63, 49] {
        let x = dev.upload(&random_f32(len, 6)).unwrap();
        let mut out = dev.alloc::<f32>(64).unwrap();
        let err = unmasked_copy::<64>::launch(&dev, 1u32, (&x, &mut out))
            .expect_err("the run past the end must be refused")
            .to_string();
        assert_reported(&err, "unmasked_copy", "x", "MARK: unmasked", len as i64);
    }
    // A 0-length buffer: every load is outside it.
    let empty = dev.alloc::<f32>(0).unwrap();
    let mut out = dev.alloc::<f32>(64).unwrap();
    let err = unmasked_copy::<64>::launch(&dev, 1u32, (&empty, &mut out))
        .expect_err("a load from an empty buffer must be refused")
        .to_string();
    assert_reported(&err, "unmasked_copy", "x", "MARK: unmasked", 0);
}

#[test]
fn a_negative_offset_is_refused() {
    let dev = release_like();
    let x = dev.upload(&[7i32; 64]).unwrap();
    let mut out = dev.alloc::<i32>(64).unwrap();
    let err = negative_load::<64>::launch(&dev, 1u32, (&x, &mut out, 5))
        .expect_err("x[-5] must be refused")
        .to_string();
    assert_reported(&err, "negative_load", "x", "MARK: negative", -5);
    // Shift 0: in bounds, every element read.
    let xs: Vec<i32> = (0..64).map(|i| i * 3 - 50).collect();
    let x = dev.upload(&xs).unwrap();
    let mut out = dev.upload(&[i32::MIN; 64]).unwrap();
    negative_load::<64>::launch(&dev, 1u32, (&x, &mut out, 0)).unwrap();
    assert_eq!(out.download().unwrap(), xs);
}

#[test]
fn a_wrapping_i32_index_is_refused() {
    let dev = release_like();
    let x = dev.upload(&random_f32(64, 4)).unwrap();
    let mut out = dev.alloc::<f32>(64).unwrap();
    // base = i32::MAX - 3: lanes 0..=3 are far past the end, lane 4 wraps to
    // i32::MIN.
    let err = wrapping_index::<64>::launch(&dev, 1u32, (&x, &mut out, i32::MAX - 3))
        .expect_err("the wrapped index must be refused")
        .to_string();
    assert!(err.contains("wrapping_index"), "{err}");
    assert!(err.contains("`x`"), "{err}");
    let line = line_of(SOURCE, "MARK: wrap");
    assert!(
        err.contains(&format!("tests/tests/cpu_bounds.rs:{line}:")),
        "{err}"
    );
}

#[test]
fn a_gathered_index_is_checked_lane_by_lane() {
    let dev = release_like();
    let xs = random_f32(64, 5);
    let x = dev.upload(&xs).unwrap();
    let mut idx: Vec<i32> = (0..64).map(|i| (i * 7) % 64).collect();
    let ok = dev.upload(&idx).unwrap();
    let mut out = dev.upload(&[f32::NAN; 64]).unwrap();
    gather::<64>::launch(&dev, 1u32, (&x, &ok, &mut out)).unwrap();
    let got = out.download().unwrap();
    for i in 0..64 {
        assert_eq!(got[i], xs[idx[i] as usize], "element {i}");
    }
    for bad in [64, -1, 1 << 20, i32::MIN] {
        idx[37] = bad;
        let b = dev.upload(&idx).unwrap();
        let err = gather::<64>::launch(&dev, 1u32, (&x, &b, &mut out))
            .expect_err("the gathered index must be refused")
            .to_string();
        assert_reported(&err, "gather", "x", "MARK: gather", bad as i64);
    }
}

//! The emulators check every global access against the buffer its pointer was derived
//! from (the kernel parameter, as the interpreter and the compiled CPU device do), not
//! against whichever launch buffer happens to hold the address: an access past the end
//! of `x` that lands inside `out` is reported, naming `x` and the index relative to
//! `x`. The AMD flavor's buffer loads (masked loads through a buffer resource) report
//! a masked-on lane out of range (a negative index included) and leave masked-off lanes
//! alone. Each case is compared with the interpreter's message.

use std::time::Duration;

use tessera::prelude::*;
use tessera::{EmuKind, Error};
use tessera_tests::line_of;

const SOURCE: &str = include_str!("emu_provenance.rs");

/// Reads `x[start..start + B]` (no mask) and writes it to `out[0..B]`.
#[kernel]
fn load_window<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, start: i32) {
    let offs = arange::<B>();
    let v = x.load_unmasked(start + offs); // MARK: window-load
    out.store_unmasked(offs, v);
}

/// Writes `b[0..B]` to `a[start..start + B]` (no mask).
#[kernel]
fn store_window<const B: usize>(a: &mut Global<f32>, b: &Global<f32>, start: i32) {
    let offs = arange::<B>();
    a.store_unmasked(start + offs, b.load_unmasked(offs)); // MARK: window-store
}

/// `out[i] = x[i + shift]` where `i + shift >= lo`, else `-5`: a masked load (on
/// emu-amd through a buffer resource).
#[kernel]
fn shifted_load<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, shift: i32, lo: i32) {
    let offs = arange::<B>();
    let src = offs + shift;
    let v = x.load_or(src, src.ge(lo), -5.0f32); // MARK: shifted-load
    out.store_unmasked(offs, v);
}

/// Adds one to `c[start + i]` for each lane (no mask).
#[kernel]
fn atomic_window<const B: usize>(c: &mut Global<i32>, d: &Global<i32>, start: i32) {
    let offs = arange::<B>();
    let one = d.load_unmasked(offs) * 0 + 1;
    c.atomic_add(start + offs, one, offs.ge(0)); // MARK: window-atomic
}

/// Reads the next rank's `a[start..start + B]` (or, with `put`, writes it) through
/// `a.on(peer)`; `b`, allocated right after `a`, is where `a[64..]` lands in every
/// rank's heap (256-byte aligned bump allocation).
#[kernel]
fn remote_window<const B: usize>(
    a: &mut Symmetric<f32>,
    b: &Symmetric<f32>,
    out: &mut Global<f32>,
    start: i32,
    put: i32,
) {
    let offs = arange::<B>();
    let peer = (rank() + 1) % world_size();
    let mut there = a.on(peer);
    let get = offs.ge(0) & put.eq(0);
    let v = there.load_or(start + offs, get, b.load_unmasked(offs)); // MARK: remote-load
    there.store(start + offs, v, offs.ge(0) & put.ne(0)); // MARK: remote-store
    out.store_unmasked(offs, v);
}

const B: usize = 64;

fn emus() -> Vec<(&'static str, Device)> {
    vec![
        ("emu-nv", Device::emu(EmuKind::Nv).expect("the emulator")),
        ("emu-amd", Device::emu(EmuKind::Amd).expect("the emulator")),
    ]
}

/// The message of a launch that must fail on `dev` with an out-of-bounds access.
fn oob(dev: &Device, what: &str, r: Result<(), Error>) -> String {
    let e = r.expect_err(&format!("{}: {what} must be reported", dev.id()));
    let msg = e.to_string();
    assert!(msg.contains("out-of-bounds"), "{}: {msg}", dev.id());
    msg
}

/// Checks that `msg` names `buffer` (of `len` elements), `index` and the line marked
/// `mark`.
fn names(dev: &str, msg: &str, mark: &str, buffer: &str, index: i64, len: usize) {
    let line = line_of(SOURCE, mark);
    let want = format!("index {index} of buffer `{buffer}` (len {len})");
    assert!(msg.contains(&want), "{dev}: want `{want}` in: {msg}");
    assert!(
        msg.contains(&format!("tests/tests/emu_provenance.rs:{line}:")),
        "{dev}: {msg}"
    );
}

/// Allocates a 64-element `x` then an `out` of `out_len` elements until `out` holds
/// the bytes of `x[192..256]`, keeping the misses alive so the allocator moves on;
/// the pair found (or the last one tried), and whether it was found.
fn adjacent(dev: &Device, out_len: usize) -> (Buffer<f32>, Buffer<f32>, bool, Vec<Buffer<f32>>) {
    let mut keep = Vec::new();
    for _ in 0..64 {
        let x = dev.upload(&[1.0f32; B]).unwrap();
        let out = dev.alloc::<f32>(out_len).unwrap();
        let (xa, oa) = (x.device_ptr(), out.device_ptr());
        let (lo, hi) = (xa + 4 * 192, xa + 4 * 256);
        if oa <= lo && hi <= oa + 4 * out_len as u64 {
            return (x, out, true, keep);
        }
        keep.push(x);
        keep.push(out);
    }
    let x = dev.upload(&[1.0f32; B]).unwrap();
    let out = dev.alloc::<f32>(out_len).unwrap();
    (x, out, false, keep)
}

#[test]
fn interpreter_names_the_buffer_loaded_from() {
    // The expected form: the parameter the pointer came from, the index relative to it.
    let dev = Device::interp();
    let x = dev.upload(&[1.0f32; B]).unwrap();
    let mut out = dev.alloc::<f32>(4096).unwrap();
    let msg = oob(
        &dev,
        "x[192..256]",
        load_window::<B>::launch(&dev, 1u32, (&x, &mut out, 192)),
    );
    names("interp", &msg, "MARK: window-load", "x", 192, B);
    let msg = oob(
        &dev,
        "x[-64..0]",
        shifted_load::<B>::launch(&dev, 1u32, (&x, &mut out, -64, -1000)),
    );
    names("interp", &msg, "MARK: shifted-load", "x", -64, B);
    shifted_load::<B>::launch(&dev, 1u32, (&x, &mut out, -64, 0)).unwrap();
    assert_eq!(out.download().unwrap()[..B], [-5.0f32; B]);
}

#[test]
fn a_load_past_the_end_that_lands_in_another_buffer_names_the_buffer_loaded_from() {
    for (name, dev) in emus() {
        let (x, mut out, found, _keep) = adjacent(&dev, 4096);
        let r = load_window::<B>::launch(&dev, 1u32, (&x, &mut out, 192));
        let msg = oob(&dev, "x[192..256]", r);
        names(name, &msg, "MARK: window-load", "x", 192, B);
        if !found {
            // (The allocator's choice; the next test places the window by address.)
            eprintln!("{name}: no allocation put x[192..256] inside out; checked all the same");
        }
    }
}

#[test]
fn a_load_at_any_offset_into_another_buffer_names_the_buffer_loaded_from() {
    // The window starts inside `out`, wherever the allocator put it (after `x` or
    // before it: a negative index).
    for (name, dev) in emus() {
        let x = dev.upload(&[1.0f32; B]).unwrap();
        let mut out = dev.alloc::<f32>(4096).unwrap();
        let start = (out.device_ptr() as i64 - x.device_ptr() as i64) / 4 + 1024;
        let start = i32::try_from(start).expect("host buffers within 8 GiB of each other");
        let r = load_window::<B>::launch(&dev, 1u32, (&x, &mut out, start));
        let msg = oob(&dev, "a load into out through x", r);
        names(name, &msg, "MARK: window-load", "x", start as i64, B);
        // In bounds, the same kernel runs.
        load_window::<B>::launch(&dev, 1u32, (&x, &mut out, 0)).unwrap();
        assert_eq!(out.download().unwrap()[..B], [1.0f32; B], "{name}");
    }
}

#[test]
fn a_store_past_the_end_into_a_neighbour_names_the_buffer_stored_to() {
    for (name, dev) in emus() {
        let mut a = dev.alloc::<f32>(B).unwrap();
        let b = dev.upload(&[7.0f32; 4096]).unwrap();
        let start = (b.device_ptr() as i64 - a.device_ptr() as i64) / 4 + 512;
        let start = i32::try_from(start).expect("host buffers within 8 GiB of each other");
        let r = store_window::<B>::launch(&dev, 1u32, (&mut a, &b, start));
        let msg = oob(&dev, "a store into b through a", r);
        names(name, &msg, "MARK: window-store", "a", start as i64, B);
        // The neighbour was not written.
        assert!(b.download().unwrap().iter().all(|&v| v == 7.0), "{name}");
    }
    // The interpreter's form of the same error.
    let dev = Device::interp();
    let mut a = dev.alloc::<f32>(B).unwrap();
    let b = dev.upload(&[7.0f32; 4096]).unwrap();
    let msg = oob(
        &dev,
        "a[100..164]",
        store_window::<B>::launch(&dev, 1u32, (&mut a, &b, 100)),
    );
    names("interp", &msg, "MARK: window-store", "a", 100, B);
}

#[test]
fn an_atomic_past_the_end_into_a_neighbour_names_the_buffer_updated() {
    for (name, dev) in emus() {
        let mut c = dev.alloc::<i32>(B).unwrap();
        let d = dev.upload(&[0i32; 4096]).unwrap();
        let start = (d.device_ptr() as i64 - c.device_ptr() as i64) / 4 + 256;
        let start = i32::try_from(start).expect("host buffers within 8 GiB of each other");
        let r = atomic_window::<B>::launch(&dev, 1u32, (&mut c, &d, start));
        let msg = oob(&dev, "an atomic into d through c", r);
        names(name, &msg, "MARK: window-atomic", "c", start as i64, B);
        assert!(d.download().unwrap().iter().all(|&v| v == 0), "{name}");
    }
}

#[test]
fn a_masked_on_load_at_a_negative_index_is_reported() {
    for (name, dev) in emus() {
        let x = dev.upload(&[1.0f32; B]).unwrap();
        let mut out = dev.alloc::<f32>(B).unwrap();
        let r = shifted_load::<B>::launch(&dev, 1u32, (&x, &mut out, -64, -1000));
        let msg = oob(&dev, "x[-64..0] with the mask on", r);
        names(name, &msg, "MARK: shifted-load", "x", -64, B);
    }
}

#[test]
fn a_masked_off_load_at_a_negative_index_reads_other() {
    for (name, dev) in emus() {
        let xs: Vec<f32> = (0..B).map(|i| i as f32).collect();
        let x = dev.upload(&xs).unwrap();
        let mut out = dev.alloc::<f32>(B).unwrap();
        // Every lane off.
        shifted_load::<B>::launch(&dev, 1u32, (&x, &mut out, -64, 0))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(out.download().unwrap(), vec![-5.0f32; B], "{name}");
        // Half off: lanes 0..32 read -32..0 (off), lanes 32..64 read x[0..32].
        shifted_load::<B>::launch(&dev, 1u32, (&x, &mut out, -32, 0))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want: Vec<f32> = (0..B)
            .map(|i| if i < 32 { -5.0 } else { (i - 32) as f32 })
            .collect();
        assert_eq!(out.download().unwrap(), want, "{name}");
        // Past the end, off: no report either.
        shifted_load::<B>::launch(&dev, 1u32, (&x, &mut out, 1 << 20, i32::MAX))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(out.download().unwrap(), vec![-5.0f32; B], "{name}");
    }
}

/// Runs `remote_window` on 2 ranks of `dev`; the error (if any) as text.
fn remote(dev: &Device, start: i32, put: i32) -> Result<Vec<Vec<f32>>, Error> {
    World::local(2)
        .on(dev)
        .heap_bytes(1 << 20)
        .signal_bytes(4 << 10)
        .wait_timeout(Duration::from_secs(20))
        .run(|r| {
            let mut a = r.alloc::<f32>(B)?;
            let b = r.alloc::<f32>(4096)?;
            let mut out = r.device().alloc::<f32>(B)?;
            remote_window::<B>::launch(r.device(), 1u32, (&mut a, &b, &mut out, start, put))?;
            r.barrier()?;
            let got = out.download()?;
            let b_now = b.local().download()?;
            assert!(b_now.iter().all(|&v| v == 0.0), "the neighbour was written");
            Ok(got)
        })
}

#[test]
fn a_remote_access_past_the_end_names_the_peers_copy() {
    let mut devs = emus();
    devs.push(("interp", Device::interp()));
    for (name, dev) in devs {
        // In bounds: the peer's zeros.
        let got = remote(&dev, 0, 0).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, vec![vec![0.0f32; B]; 2], "{name}");
        for (put, mark) in [(0, "MARK: remote-load"), (1, "MARK: remote-store")] {
            // `a[128..192]` of the peer: inside its `b`.
            let e = remote(&dev, 128, put).expect_err(&format!("{name}: past the peer's `a`"));
            let msg = e.to_string();
            let line = line_of(SOURCE, mark);
            assert!(
                msg.contains(&format!("tests/tests/emu_provenance.rs:{line}:")),
                "{name}: {msg}"
            );
            assert!(msg.contains("out-of-bounds"), "{name}: {msg}");
            let named = (0..2).any(|r| {
                msg.contains(&format!(
                    "index 128 of buffer `a (rank {r}'s copy)` (len {B})"
                ))
            });
            assert!(named, "{name}: {msg}");
        }
    }
}

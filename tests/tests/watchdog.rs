//! Bounded launches: a launch watchdog (`Device::with_launch_timeout`,
//! `TESSERA_LAUNCH_TIMEOUT`) turns a runaway loop into an error naming the kernel and
//! the loop's line on the CPU and both emulators, while loops that finish are
//! unaffected; a grid too large to count is an error, not a panic or a no-op.

use std::time::{Duration, Instant};

use tessera::prelude::*;
use tessera_tests::{cpu_and_emulators, line_of};

const SOURCE: &str = include_str!("watchdog.rs");

/// A `while` that never ends (`i` stays 0 below `n`).
#[kernel]
fn runaway_while(out: &mut Global<i32>, n: i32) {
    let mut i = zeros::<i32, ()>();
    while i.lt(n) {
        // RUNAWAY_WHILE (the line above)
        i = i * out.load_unmasked(0);
    }
    out.store_unmasked(program_id(0) + 1, i);
}

/// A `for` of 2^31 - 1 iterations through block-local memory and barriers: every
/// thread must stop, in step, for the error to be the timeout's.
#[kernel]
fn runaway_for<const B: usize>(out: &mut Global<f32>, n: i32) {
    let mut t = Local::<f32, B>::new();
    let lanes = arange::<B>();
    let mut acc = zeros::<f32, S1<B>>();
    for k in 0..n {
        // RUNAWAY_FOR (the line above)
        t.store_unmasked(lanes, acc + k.cast::<f32>());
        barrier();
        acc = t.load_unmasked((B as i32 - 1) - lanes);
        barrier();
    }
    out.store_unmasked(program_id(0) * B + lanes, acc);
}

/// Runs `body` on a thread of its own and waits at most `limit` for it: a watchdog
/// that does not fire makes the test fail in bounded time, not hang.
fn within(limit: Duration, what: String, body: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // (The launch's thread is left running; the test process ends with it.)
        Err(_) => panic!("{what}: no result within {limit:?}: the launch watchdog did not stop it"),
    }
}

#[test]
fn a_runaway_loop_fails_naming_its_line_in_bounded_time() {
    let limit = Duration::from_millis(300);
    for dev in cpu_and_emulators() {
        let name = dev.to_string();
        within(Duration::from_secs(60), name, move || runaway(dev, limit));
    }
}

fn runaway(dev: Device, limit: Duration) {
    let d = dev.with_launch_timeout(limit);
    let mut out = d.upload(&[0i32; 8]).unwrap();
    let t = Instant::now();
    let e = runaway_while::launch(&d, 4u32, (&mut out, 10)).expect_err("never ends");
    let took = t.elapsed();
    let msg = e.to_string();
    let want = format!("{}:{}:", file!(), line_of(SOURCE, "RUNAWAY_WHILE") - 1);
    assert!(
        msg.starts_with(&want)
            && msg.contains("kernel `runaway_while` ran past its 0.300 s launch timeout")
            && msg.contains("`while` loop"),
        "{dev}: {msg}"
    );
    assert!(took < Duration::from_secs(30), "{dev}: took {took:?}");

    let mut out = d.upload(&[0f32; 2 * 64]).unwrap();
    let e = runaway_for::<64>::launch(&d, 2u32, (&mut out, i32::MAX)).expect_err("too long");
    let msg = e.to_string();
    let want = format!("{}:{}:", file!(), line_of(SOURCE, "RUNAWAY_FOR") - 1);
    assert!(
        msg.starts_with(&want) && msg.contains("`for` loop"),
        "{dev}: {msg}"
    );
    // The device is still usable, and loops that end are unaffected.
    runaway_for::<64>::launch(&d, 2u32, (&mut out, 3)).unwrap_or_else(|e| panic!("{dev}: {e}"));
    let got = out.download().unwrap();
    // acc_k = reverse(acc_{k-1} + k): after 3 steps every lane holds 0 + 1 + 2.
    assert!(got.iter().all(|&v| v == 3.0), "{dev}: {got:?}");
}

#[test]
fn a_grid_too_large_to_count_is_an_error() {
    let big = (1u64 << 31) - 1;
    let g = Grid::new(big, big, big);
    assert_eq!(g.checked_count(), None);
    assert_eq!(g.count(), u64::MAX);
    let dev = Device::cpu();
    let mut out = dev.upload(&[0i32; 8]).unwrap();
    let e = runaway_while::launch(&dev, g, (&mut out, 0)).expect_err("too many programs");
    assert!(
        e.to_string()
            .contains("has more than 2^64 program instances"),
        "{e}"
    );
}

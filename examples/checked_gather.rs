//! Debugging a kernel: `device_assert` guards a gather's indices and `device_print`
//! reports per-program summaries, both read back on the host after the launch (the
//! same lines and errors on the CPU, the emulators and GPUs).
//!
//! `cargo run --release --example checked_gather`

mod common;

use rand::Rng;
use tessera::prelude::*;

/// `out[i] = x[idx[i]]` for `i < n`, with every index checked against `len`;
/// programs 0 and 1 print their block's index sum and largest index.
#[kernel]
pub fn checked_gather<const BLOCK: usize>(
    x: &Global<f32>,
    idx: &Global<i32>,
    out: &mut Global<f32>,
    n: i32,
    len: i32,
) {
    let pid = program_id(0);
    let offs = pid * BLOCK + arange::<BLOCK>();
    let m = offs.lt(n);
    let j = idx.load(offs, m);
    let ok = j.ge(0) & j.lt(len);
    device_assert(ok, "gather index in 0..len");
    if pid.lt(2) {
        device_print("index sum, max =", (j.sum::<0>(), j.max::<0>()));
    }
    out.store(offs, x.load(j, m & ok), m);
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let (n, len) = (10_000usize, 3000usize);
        println!("checked_gather: {n} indices into {len} on {dev} (seed {seed})");
        let xs = common::uniform(&mut rng, len, -1.0, 1.0);
        let mut ids: Vec<i32> = (0..n).map(|_| rng.gen_range(0..len as i32)).collect();
        let x = dev.upload(&xs)?;
        let mut out = dev.upload(&vec![f32::NAN; n])?;
        let grid = n.div_ceil(256);
        let idx = dev.upload(&ids)?;
        checked_gather::<256>::launch(&dev, grid, (&x, &idx, &mut out, n as i32, len as i32))?;
        let got = out.download()?;
        if let Some(i) = (0..n).find(|&i| got[i] != xs[ids[i] as usize]) {
            return Err(format!("out[{i}] = {}, want {}", got[i], xs[ids[i] as usize]).into());
        }
        // One bad index: the launch fails, naming the line, program and element.
        let bad = 5 * 256 + 17;
        ids[bad] = len as i32 + 4;
        let idx = dev.upload(&ids)?;
        match checked_gather::<256>::launch(&dev, grid, (&x, &idx, &mut out, n as i32, len as i32))
        {
            Err(Error::DeviceAssert(f)) if f.program == [5, 0, 0] && f.index == [17] => {
                println!("checked_gather: caught as expected: {f}");
                Ok(())
            }
            other => {
                Err(format!("expected the assertion at index {bad} to fail, got {other:?}").into())
            }
        }
    });
}

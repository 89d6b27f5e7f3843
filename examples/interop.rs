//! Memory others own: a DLPack tensor from another library goes into a kernel and the
//! result goes back out as a DLPack tensor, on a stream of its own, with launch options.
//!
//! ```sh
//! cargo run --example interop                     # the best device present
//! TESSERA_DEVICE=cpu cargo run --example interop  # zero-copy both ways
//! ```
//!
//! The "other library" is played by `dlpark` building a tensor over a `Vec` (what
//! PyTorch's `to_dlpack` or NumPy's `__dlpack__` hand over). On the CPU and the
//! emulator the tensor's memory is used in place (`Buffer::from_dlpack`); on a GPU a
//! host tensor is uploaded first (its memory is not the GPU's), and the result is
//! handed back as a tensor on the GPU (`Buffer::into_dlpack`: `kDLCUDA`/`kDLROCM`).

mod common;

use tessera::DeviceKind;
use tessera::interop::dlpark::{self, ffi::DLDataType, ffi::DLDevice};
use tessera::prelude::*;

#[kernel]
fn saxpy<const B: usize>(x: &Global<f32>, y: &mut Global<f32>, a: f32, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    y.store(offs, x.load(offs, m) * a + y.load(offs, m), m);
}

/// A CPU tensor of `values` as another library would export it: the tensor owns the
/// memory (8-byte aligned words) and frees it in its deleter.
fn foreign_tensor(values: &[f32]) -> Result<dlpark::versioned::Dlpack, Box<dyn std::error::Error>> {
    let mut words = vec![0u64; values.len().div_ceil(2)];
    bytemuck::cast_slice_mut::<u64, f32>(&mut words)[..values.len()].copy_from_slice(values);
    let data = words.as_mut_ptr() as *mut std::ffi::c_void;
    let mut t =
        dlpark::metadata::Fixed::new([values.len() as i64], [1i64]).initialize(Box::new(words))?;
    t.set_data(data)
        .set_device(DLDevice::CPU)
        .set_dtype(DLDataType::F32);
    // SAFETY: `data` is the context's memory: `values.len()` f32s on the CPU.
    Ok(unsafe { t.finish() })
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let n = 1 << 16; // even: the CPU views whole 8-byte words
        let x = common::uniform(&mut rng, n, -1.0, 1.0);
        let y = common::uniform(&mut rng, n, -1.0, 1.0);
        println!("device {} (seed {seed}), {n} elements", dev.name());

        // In: a foreign tensor becomes a buffer (zero-copy where the memory is the
        // device's own).
        let yt = foreign_tensor(&y)?;
        let zero_copy = matches!(dev.kind(), DeviceKind::Cpu | DeviceKind::Emu);
        let mut yb = if zero_copy {
            let at = yt.validate()?.data_ptr() as u64;
            let b = Buffer::<f32>::from_dlpack(&dev, yt)?;
            assert_eq!(b.device_ptr(), at, "imported without a copy");
            b
        } else {
            // SAFETY: a CPU tensor of `n` f32s, read while `yt` lives.
            let host = unsafe { yt.validate()?.cpu_slice::<f32>()? }.to_vec();
            dev.upload(&host)?
        };
        let xb = dev.upload(&x)?;

        // A launch on a stream of its own, with options, timed with events.
        let stream = dev.stream()?;
        let opts = LaunchOptions::new().num_warps(8).stream(&stream);
        let start = stream.record()?;
        saxpy::<1024>::launch_with(&dev, n.div_ceil(1024), &opts, (&xb, &mut yb, 2.0, n as i32))?;
        let end = stream.record()?;
        println!(
            "saxpy on its stream: {:.3} ms",
            start.elapsed(&end)?.as_secs_f64() * 1e3
        );

        // Out: the buffer becomes a DLPack tensor (on the device it lives on).
        let out = yb.into_dlpack()?;
        let t = out.validate()?;
        println!(
            "result: a DLPack tensor of shape {:?} on device type {} id {}",
            t.shape(),
            t.device().device_type.0,
            t.device().device_id
        );
        let got: Vec<f32> = if t.device() == DLDevice::CPU {
            // SAFETY: CPU memory of `n` f32s, not written while the slice lives.
            unsafe { t.cpu_slice::<f32>()? }.to_vec()
        } else {
            // A GPU tensor: read it back through Tessera.
            Buffer::<f32>::from_dlpack(&dev, out)?.download()?
        };
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(a, b)| f64::from(a * 2.0 + b))
            .collect();
        let got: Vec<f64> = got.iter().map(|&v| f64::from(v)).collect();
        common::check("saxpy", &got, &want, &vec![0.0; n])?;
        Ok(())
    })
}

//! Memory others own: raw pointers, wrapped foreign memory and DLPack tensors, on the
//! CPU (zero-copy both ways, the owner kept alive exactly as long as needed).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::{Rng, SeedableRng};
use tessera::interop::dlpark;
use tessera::interop::dlpark::ffi::{DLDataType, DLDevice};
use tessera::prelude::*;

#[kernel]
fn axpy<const B: usize>(x: &Global<f32>, y: &mut Global<f32>, a: f32, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    y.store(offs, x.load(offs, m) * a + y.load(offs, m), m);
}

/// Counts drops of the owner it is attached to.
struct Owner(Arc<AtomicUsize>);
impl Drop for Owner {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0..1.0)).collect()
}

/// `n` f32s in 8-byte-aligned storage (a `Vec<u64>`), holding `values`.
fn aligned(values: &[f32]) -> Vec<u64> {
    let mut w = vec![0u64; values.len().div_ceil(2)];
    bytemuck::cast_slice_mut::<u64, f32>(&mut w)[..values.len()].copy_from_slice(values);
    w
}

#[test]
fn wrapped_host_memory_is_used_in_place_and_its_owner_outlives_the_buffer() {
    for dev in [Device::cpu(), Device::by_name("emu-nv").unwrap()] {
        let n = 1000;
        let (x, y) = (random(n, 1), random(n, 2));
        let mut mem = aligned(&y);
        let ptr = mem.as_mut_ptr() as u64;
        let drops = Arc::new(AtomicUsize::new(0));
        let xb = dev.upload(&x).unwrap();
        // SAFETY: `mem` holds `n` f32s, 8-byte aligned, and is touched only through
        // the buffer until the buffer is dropped below.
        let mut yb = unsafe { dev.wrap::<f32>(ptr, n, Owner(drops.clone())) }.unwrap();
        assert_eq!(yb.device_ptr(), ptr);
        assert_eq!(yb.download().unwrap(), y);
        axpy::<128>::launch(&dev, n.div_ceil(128), (&xb, &mut yb, 2.0, n as i32)).unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(yb);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "the owner is dropped with the buffer"
        );
        // The kernel wrote the foreign memory itself.
        let got = &bytemuck::cast_slice::<u64, f32>(&mem)[..n];
        for i in 0..n {
            assert_eq!(got[i], x[i] * 2.0 + y[i], "{} element {i}", dev.id());
        }
    }
}

#[test]
fn unaligned_or_partial_word_host_memory_is_refused() {
    let dev = Device::cpu();
    let mut mem = vec![0u64; 4];
    let base = mem.as_mut_ptr() as u64;
    for (ptr, len) in [(base + 4, 4), (base, 3), (0, 2)] {
        // SAFETY: refused before the memory is used.
        let e = unsafe { dev.wrap::<f32>(ptr, len, ()) }.unwrap_err();
        assert!(
            matches!(&e, Error::Usage(m) if m.contains("8-byte aligned")),
            "{e}"
        );
    }
}

#[test]
fn a_buffer_goes_to_dlpack_and_back_without_copies() {
    let dev = Device::cpu();
    let n = 600;
    let x = random(n, 3);
    let buf = dev.upload(&x).unwrap();
    let ptr = buf.device_ptr();
    let t = buf.into_dlpack().unwrap();
    {
        let v = t.validate().unwrap();
        assert_eq!(v.shape(), &[n as i64]);
        assert_eq!(v.strides(), Some(&[1i64][..]));
        assert!(v.dtype().matches(DLDataType::F32));
        assert_eq!(v.device(), DLDevice::CPU);
        assert_eq!(v.data_ptr() as u64, ptr, "zero-copy");
        // SAFETY: CPU memory of `n` f32s, not written while this slice lives.
        assert_eq!(unsafe { v.cpu_slice::<f32>() }.unwrap(), &x[..]);
    }
    let mut back = Buffer::<f32>::from_dlpack(&dev, t).unwrap();
    assert_eq!(back.device_ptr(), ptr, "zero-copy");
    let ones = dev.upload(&vec![1.0f32; n]).unwrap();
    axpy::<128>::launch(&dev, n.div_ceil(128), (&ones, &mut back, 0.5, n as i32)).unwrap();
    let got = back.download().unwrap();
    for i in 0..n {
        assert_eq!(got[i], 0.5 + x[i]);
    }
}

/// A tensor another library produced (here built with dlpark from a `Vec`, as a
/// producer would): imported zero-copy, its deleter run when the buffer goes.
#[test]
fn a_foreign_tensor_is_imported_and_released() {
    let dev = Device::cpu();
    let n = 256usize;
    let x = random(n, 4);
    let drops = Arc::new(AtomicUsize::new(0));
    struct Ctx(#[allow(dead_code)] Vec<u64>, #[allow(dead_code)] Owner);
    let make = |shape: [i64; 1], strides: [i64; 1], dtype: DLDataType, values: &[f32]| {
        let mut mem = aligned(values);
        let data = mem.as_mut_ptr() as *mut std::ffi::c_void;
        let mut t = dlpark::metadata::Fixed::new(shape, strides)
            .initialize(Box::new(Ctx(mem, Owner(drops.clone()))))
            .unwrap();
        t.set_data(data).set_device(DLDevice::CPU).set_dtype(dtype);
        // SAFETY: `data` is the context's memory, `shape[0]` elements of `dtype`.
        unsafe { t.finish() }
    };
    let t = make([n as i64], [1], DLDataType::F32, &x);
    let data = t.validate().unwrap().data_ptr() as u64;
    let b = Buffer::<f32>::from_dlpack(&dev, t).unwrap();
    assert_eq!(b.device_ptr(), data);
    assert_eq!(b.download().unwrap(), x);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(b);
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the deleter ran once");
    // What cannot be imported is an error naming why (and the tensor is released).
    let cases = [
        (make([n as i64], [1], DLDataType::I32, &x), "element type"),
        (
            make([n as i64 / 2], [2], DLDataType::F32, &x),
            "not contiguous",
        ),
    ];
    for (t, says) in cases {
        let e = Buffer::<f32>::from_dlpack(&dev, t).unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
    let mut t = make([n as i64], [1], DLDataType::F32, &x);
    // SAFETY: the tensor is ours; flags are plain data.
    unsafe { *t.flags_mut() |= dlpark::DlpackFlags::READ_ONLY };
    let e = Buffer::<f32>::from_dlpack(&dev, t).unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    let t = make([n as i64], [1], DLDataType::F32, &x);
    // A CUDA tensor is not a CPU buffer.
    // SAFETY: rewriting the descriptor's device only; nothing reads the data.
    unsafe { (*t.as_ptr()).dl_tensor.device = DLDevice::cuda(0) };
    let e = Buffer::<f32>::from_dlpack(&dev, t).unwrap_err();
    assert!(e.to_string().contains("not on cpu"), "{e}");
    assert_eq!(
        drops.load(Ordering::SeqCst),
        5,
        "every refused tensor was released"
    );
}

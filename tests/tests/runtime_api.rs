//! Runtime behaviour: device selection, the IR cache, typed errors, grids.

use std::sync::Arc;

use tessera::prelude::*;

#[kernel]
fn fill<T: Num, const B: usize>(out: &mut Global<T>, n: i32, #[comptime] value: i32) {
    let offs = program_id(0) * B + arange::<B>() + program_id(1) * 1000 + program_id(2) * 100_000;
    out.store(offs, zeros::<T, S1<B>>() + value, offs.lt(n));
}

#[test]
fn devices_by_name() {
    assert_eq!(Device::by_name("cpu").unwrap(), Device::cpu());
    let e = Device::by_name("tpu").unwrap_err().to_string();
    assert!(e.contains("unknown device `tpu`"), "{e}");
    for gpu in ["cuda", "hip", "cuda:1"] {
        let e = Device::by_name(gpu).unwrap_err().to_string();
        assert!(e.contains("not available"), "{gpu}: {e}");
    }
}

#[test]
fn the_emulators_run_kernels_like_the_cpu() {
    // The same kernel and buffers API on the SIMT emulator (both flavors).
    for name in ["emu-nv", "emu-amd"] {
        let dev = Device::by_name(name).unwrap();
        assert_eq!(dev.id(), name);
        let n = 1000usize;
        let mut out = dev.upload(&vec![-1i32; n + 64]).unwrap();
        fill::<i32, 128>::launch(&dev, n.div_ceil(128), (&mut out, n as i32, 9)).unwrap();
        let got = out.download().unwrap();
        assert!(got[..n].iter().all(|&v| v == 9), "{name}");
        assert!(
            got[n..].iter().all(|&v| v == -1),
            "{name}: masked lanes written"
        );
    }
    assert_ne!(
        Device::by_name("emu-nv").unwrap(),
        Device::by_name("emu-amd").unwrap()
    );
}

#[test]
fn ir_is_built_once_per_comptime_args() {
    let a = tessera::kernel_ir::<fill<f32, 64>>(&(3,)).unwrap();
    let b = tessera::kernel_ir::<fill<f32, 64>>(&(3,)).unwrap();
    assert!(Arc::ptr_eq(&a, &b), "the same comptime args hit the cache");
    let c = tessera::kernel_ir::<fill<f32, 64>>(&(4,)).unwrap();
    assert!(!Arc::ptr_eq(&a, &c), "other comptime args build again");
    let d = tessera::kernel_ir::<fill<f64, 64>>(&(3,)).unwrap();
    assert!(!Arc::ptr_eq(&a, &d), "other generic args build again");
    assert_ne!(
        tessera::ir::printer::print_function(&a),
        tessera::ir::printer::print_function(&d)
    );
}

#[test]
fn grids_of_one_two_and_three_dimensions() {
    let dev = Device::cpu();
    // 3-D grid: program (i, j, k) writes [i*64 + j*1000 + k*100000, ..+64).
    let n = 2 * 100_000 + 3 * 1000 + 2 * 64;
    let mut out = dev.upload(&vec![-1i64; n]).unwrap();
    fill::<i64, 64>::launch(&dev, (2u32, 3u32, 2u32), (&mut out, n as i32, 7)).unwrap();
    let got = out.download().unwrap();
    let mut want = vec![-1i64; n];
    for k in 0..2 {
        for j in 0..3 {
            for i in 0..2 {
                let base = i * 64 + j * 1000 + k * 100_000;
                want[base..base + 64].fill(7);
            }
        }
    }
    assert_eq!(got, want);
    // Empty grid: nothing runs.
    let mut out = dev.upload(&[-1i32; 8]).unwrap();
    fill::<i32, 8>::launch(&dev, 0usize, (&mut out, 8, 1)).unwrap();
    assert_eq!(out.download().unwrap(), vec![-1; 8]);
}

#[test]
fn oversized_grid_is_a_launch_error() {
    let dev = Device::cpu();
    let mut out = dev.alloc::<i32>(8).unwrap();
    let e = fill::<i32, 8>::launch(&dev, 1u64 << 33, (&mut out, 8, 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid launch of kernel `fill`"), "{e}");
}

#[kernel]
fn bad_reshape(out: &mut Global<f32>) {
    let t = zeros::<f32, S1<8>>().reshape::<S2<4, 4>>(); // MARK: bad-reshape
    out.store_unmasked(arange::<16>(), t.reshape::<S1<16>>());
}

#[test]
fn build_errors_name_the_line() {
    let dev = Device::cpu();
    let mut out = dev.alloc::<f32>(16).unwrap();
    let e = bad_reshape::launch(&dev, 1u32, (&mut out,))
        .unwrap_err()
        .to_string();
    let line = tessera_tests::line_of(include_str!("runtime_api.rs"), "MARK: bad-reshape");
    assert!(e.contains(&format!("runtime_api.rs:{line}:")), "{e}");
    assert!(e.contains("reshape must keep the element count"), "{e}");
    assert!(e.contains("cannot build kernel `bad_reshape`"), "{e}");
}

#[test]
fn buffers_round_trip_and_check_sizes() {
    let dev = Device::cpu();
    let data: Vec<bf16> = (0..100).map(|i| bf16::from_f32(i as f32 * 0.25)).collect();
    let mut b = dev.upload(&data).unwrap();
    assert_eq!(b.len(), 100);
    assert_eq!(b.download().unwrap(), data);
    assert!(b.copy_from(&data[..10]).is_err());
    b.fill(bf16::from_f32(2.0)).unwrap();
    assert!(b.download().unwrap().iter().all(|v| v.to_f32() == 2.0));
    let z = dev.alloc::<u16>(5).unwrap();
    assert_eq!(z.download().unwrap(), vec![0; 5]);
}

/// The devices whose buffers are host memory (the CPU device, the interpreter, the
/// emulators), and every GPU present.
fn every_device() -> Vec<Device> {
    let mut devs = vec![Device::cpu(), Device::interp()];
    for name in ["emu-nv", "emu-amd", "emu-sm90a"] {
        devs.push(Device::by_name(name).expect("the emulators are built in"));
    }
    devs.extend(Device::all().into_iter().filter(|d| {
        matches!(
            d.kind(),
            tessera::DeviceKind::Cuda | tessera::DeviceKind::Hip
        )
    }));
    devs
}

/// Checks that `e` is [`Error::OutOfMemory`] for `bytes` on `dev`, and that its
/// message names both (`u64::MAX` bytes: "or more").
fn assert_out_of_memory(e: Error, bytes: u64, dev: &Device) {
    let msg = e.to_string();
    match e {
        Error::OutOfMemory { bytes: b, device } => {
            assert_eq!((b, device.as_str()), (bytes, dev.id().as_str()), "{msg}");
        }
        e => panic!(
            "{}: expected OutOfMemory for {bytes} bytes, got {e:?}",
            dev.id()
        ),
    }
    let more = if bytes == u64::MAX { " or more" } else { "" };
    let want = format!(
        "out of memory on {}: cannot allocate {bytes} bytes{more}",
        dev.id()
    );
    assert_eq!(msg, want);
}

/// Allocations that can never succeed, on any machine, are `Error::OutOfMemory`
/// naming the size and the device instead of aborting the process: sizes beyond the
/// address space (2^62 bytes and more: 57-bit virtual addresses reach 2^57; even
/// under Linux's overcommit these are refused at once, so nothing is touched),
/// beyond `isize::MAX`, and element counts whose byte size overflows 64 bits
/// (`u64::MAX` bytes "or more"). The device stays usable afterwards.
#[test]
fn impossible_allocations_are_out_of_memory_errors() {
    for dev in every_device() {
        let big = usize::MAX / 8;
        let e = dev.alloc::<f32>(big).expect_err("2^63 bytes");
        assert_out_of_memory(e, big as u64 * 4, &dev);
        let e = dev.alloc::<u8>(1 << 62).expect_err("2^62 bytes");
        assert_out_of_memory(e, 1 << 62, &dev);
        let e = dev.alloc::<u16>(1 << 62).expect_err("2^63 bytes");
        assert_out_of_memory(e, 1 << 63, &dev);
        let e = dev
            .alloc::<F8E5M2>(usize::MAX - 1)
            .expect_err("2^64 - 2 bytes");
        assert_out_of_memory(e, u64::MAX - 1, &dev);
        let e = dev.alloc::<u32>(1 << 62).expect_err("2^64 bytes");
        assert_out_of_memory(e, u64::MAX, &dev);
        let e = dev.alloc::<f64>(usize::MAX).expect_err("beyond 64 bits");
        assert_out_of_memory(e, u64::MAX, &dev);
        // Still usable: a small buffer, zeroed, filled and read back.
        let mut b = dev.alloc::<i32>(1000).expect("small");
        assert_eq!(b.download().expect("download"), vec![0; 1000]);
        b.fill(-7).expect("fill");
        assert!(b.download().expect("download").iter().all(|&v| v == -7));
    }
}

/// A symmetric heap that can never be mapped is `Error::OutOfMemory` for the heap's
/// size on the rank's device, from `World::run`, before any rank runs.
#[test]
fn an_impossible_symmetric_heap_is_out_of_memory() {
    for dev in [Device::cpu(), Device::interp()] {
        let e = World::local(2)
            .on_each(std::slice::from_ref(&dev))
            .heap_bytes(1 << 62)
            .run(|_| -> Result<(), Error> { panic!("no rank should run") })
            .expect_err("2^62-byte heaps");
        assert_out_of_memory(e, 1 << 62, &dev);
    }
}

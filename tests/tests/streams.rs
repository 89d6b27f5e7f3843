//! Streams, events and launch options on the devices this machine has (the CPU and
//! the SIMT emulators): launches and copies on a stream, events timing them, options
//! that change the compiled code, and the errors for misuse.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera::{Event, LaunchOptions};

#[kernel]
fn scale<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, a: f32, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    out.store(offs, x.load(offs, m) * a, m);
}

/// `c = a @ b` for `m x k` and `k x n` row-major tiles of one program: the code
/// generator's warp and pipeline choices depend on `num_warps` and `num_stages`.
#[kernel]
fn mm<const M: usize, const N: usize, const K: usize, const BK: usize>(
    a: &Global<f32>,
    b: &Global<f32>,
    c: &mut Global<f32>,
) {
    let rm = arange::<M>().expand_dims::<1>();
    let rn = arange::<N>().expand_dims::<0>();
    let mut acc = zeros::<f32, S2<M, N>>();
    for k0 in (0..K).step_by(BK) {
        let rk = arange::<BK>() + k0;
        let ta = a.load_unmasked(rm * K + rk.expand_dims::<0>());
        let tb = b.load_unmasked(rk.expand_dims::<1>() * N + rn);
        acc = dot(ta, tb, acc);
    }
    c.store_unmasked(rm * N + rn, acc);
}

fn devices() -> Vec<Device> {
    let mut d = vec![Device::cpu()];
    for name in ["emu-nv", "emu-amd"] {
        d.push(Device::by_name(name).expect("the emulator (jit feature)"));
    }
    d
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0..1.0)).collect()
}

#[test]
fn launches_and_copies_on_a_stream() {
    for dev in devices() {
        let n = 1000;
        let x = random(n, 1);
        let stream = dev.stream().unwrap();
        assert!(!stream.is_default());
        assert_eq!(stream.device(), &dev);
        let xb = dev.upload(&x).unwrap();
        let mut out = dev.alloc::<f32>(n).unwrap();
        // Poison: every element must be written.
        out.copy_from_on(&vec![f32::NAN; n], &stream).unwrap();
        let opts = LaunchOptions::new().stream(&stream);
        let start = stream.record().unwrap();
        scale::<128>::launch_with(&dev, n.div_ceil(128), &opts, (&xb, &mut out, 3.0, n as i32))
            .unwrap();
        let end = stream.record().unwrap();
        stream.synchronize().unwrap();
        let got = out.download_on(&stream).unwrap();
        for (i, (g, x)) in got.iter().zip(&x).enumerate() {
            assert_eq!(*g, x * 3.0, "{} element {i}", dev.id());
        }
        let t = start.elapsed(&end).unwrap();
        assert!(t < Duration::from_secs(600), "{t:?}");
        // The default stream orders with it: a plain download sees the launch too.
        assert_eq!(out.download().unwrap(), got);
    }
}

#[test]
fn events_time_the_work_between_them() {
    let dev = Device::cpu();
    let s = dev.default_stream();
    assert!(s.is_default());
    let a = Event::new(&dev).unwrap();
    let b = Event::new(&dev).unwrap();
    // Timing before recording is an error, not a zero.
    let e = a.elapsed(&b).unwrap_err();
    assert!(e.to_string().contains("never recorded"), "{e}");
    a.record(&s).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    b.record(&s).unwrap();
    b.synchronize().unwrap();
    let t = a.elapsed(&b).unwrap();
    assert!(t >= Duration::from_millis(20), "{t:?}");
    assert_eq!(b.elapsed_since(&a).unwrap(), t);
    // `Device::time` measures the work of its closure the same way.
    let ((), t) = dev
        .time(|| {
            std::thread::sleep(Duration::from_millis(10));
            Ok(())
        })
        .unwrap();
    assert!(t >= Duration::from_millis(10), "{t:?}");
}

#[test]
fn streams_and_events_of_another_device_are_refused() {
    let cpu = Device::cpu();
    let emu = Device::by_name("emu-nv").unwrap();
    let other = emu.stream().unwrap();
    let x = cpu.upload(&[1.0f32; 8]).unwrap();
    let mut out = cpu.alloc::<f32>(8).unwrap();
    let e = scale::<8>::launch_with(
        &cpu,
        1u32,
        &LaunchOptions::new().stream(&other),
        (&x, &mut out, 2.0, 8),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("the stream is on emu-nv, the launch on cpu"),
        "{e}"
    );
    let e = out.download_on(&other).unwrap_err();
    assert!(matches!(e, Error::Usage(_)), "{e}");
    let e = out.copy_from_on(&[0.0; 8], &other).unwrap_err();
    assert!(matches!(e, Error::Usage(_)), "{e}");
    let ev = Event::new(&cpu).unwrap();
    let e = ev.record(&other).unwrap_err();
    assert!(
        e.to_string()
            .contains("an event of cpu on a stream of emu-nv"),
        "{e}"
    );
    let ev2 = Event::new(&emu).unwrap();
    ev2.record(&other).unwrap();
    ev.record(&cpu.default_stream()).unwrap();
    assert!(matches!(ev.elapsed(&ev2), Err(Error::Usage(_))));
}

#[test]
fn launch_options_are_checked() {
    let dev = Device::cpu();
    let x = dev.upload(&[1.0f32; 8]).unwrap();
    let mut out = dev.alloc::<f32>(8).unwrap();
    for (opts, says) in [
        (
            LaunchOptions::new().num_warps(3),
            "num_warps must be a power of two from 1 to 16, got 3",
        ),
        (
            LaunchOptions::new().num_warps(32),
            "num_warps must be a power of two from 1 to 16, got 32",
        ),
        (
            LaunchOptions::new().num_stages(0),
            "num_stages must be from 1 to 8, got 0",
        ),
        (
            LaunchOptions::new().num_stages(9),
            "num_stages must be from 1 to 8, got 9",
        ),
    ] {
        let e = scale::<8>::launch_with(&dev, 1u32, &opts, (&x, &mut out, 2.0, 8)).unwrap_err();
        assert!(
            matches!(&e, Error::Launch { kernel, reason } if kernel == "scale" && reason == says),
            "{e}"
        );
    }
    assert_eq!(LaunchOptions::default().num_warps, None);
}

/// Every warp count and pipeline depth gives the same product, on every device (the
/// emulators compile each option set to its own code).
#[test]
fn every_option_set_computes_the_same() {
    const M: usize = 32;
    const N: usize = 32;
    const K: usize = 64;
    let a = random(M * K, 2);
    let b = random(K * N, 3);
    let mut want = vec![0f32; M * N];
    for i in 0..M {
        for j in 0..N {
            want[i * N + j] = (0..K).map(|k| a[i * K + k] * b[k * N + j]).sum();
        }
    }
    for dev in devices() {
        let ab = dev.upload(&a).unwrap();
        let bb = dev.upload(&b).unwrap();
        for (warps, stages) in [(1, 1), (2, 2), (4, 3), (8, 1), (16, 4)] {
            let mut c = dev.upload(&vec![f32::NAN; M * N]).unwrap();
            let opts = LaunchOptions::new().num_warps(warps).num_stages(stages);
            mm::<M, N, K, 16>::launch_with(&dev, 1u32, &opts, (&ab, &bb, &mut c)).unwrap();
            let got = c.download().unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4 * K as f32,
                    "{} warps {warps} stages {stages}: element {i}: {g} vs {w}",
                    dev.id()
                );
            }
        }
    }
}

/// Precompiling with a launch's options writes the artifact under the key that
/// launch looks up (the options are part of it), not under the default options' key.
#[test]
fn precompiled_artifacts_carry_the_launch_options() {
    use tessera::artifact::{KernelOptions, Specialization, kernel_key_of};
    use tessera::codegen::{CompileOptions, Target};
    let store_dir = tempfile::tempdir().unwrap();
    let store = tessera::ArtifactStore::new(store_dir.path());
    let opts = LaunchOptions::new().num_warps(8).num_stages(2);
    let copts: CompileOptions = (&opts).try_into().unwrap();
    assert_eq!((copts.num_warps, copts.num_stages), (8, Some(2)));
    let target: Target = "sm_90".parse().unwrap();
    let file =
        tessera::aot::precompile::<scale<128>>(&(), &Specialization::None, target, &copts, &store)
            .unwrap();
    let key = |num_warps, num_stages| {
        kernel_key_of::<scale<128>>(
            &(),
            "sm_90",
            &KernelOptions {
                num_warps,
                num_stages,
                ..KernelOptions::default()
            },
        )
        .unwrap()
    };
    assert_eq!(file, store.path("scale", &key(8, Some(2))));
    assert_ne!(key(8, Some(2)), key(4, None));
    assert!(!store.path("scale", &key(4, None)).exists());
    // Options out of range are refused here as at launch.
    let bad: Result<CompileOptions, _> = (&LaunchOptions::new().num_warps(5)).try_into();
    assert!(bad.is_err());
}

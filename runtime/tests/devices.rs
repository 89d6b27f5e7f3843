//! Devices without a GPU: the clean "unavailable" paths, fallback, multi-device
//! bookkeeping, and the precompiled-artifact lookup (feature `jit` on or off).

use tessera::artifact::{KernelOptions, kernel_key_of};
use tessera::prelude::*;
use tessera::{ArtifactStore, DeviceKind, KernelBinary, Specialization};

#[kernel]
fn add_one<const BLOCK: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs.lt(n);
    out.store(offs, x.load(offs, mask) + 1.0, mask);
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-dev-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn cuda_without_a_driver_is_a_clean_error() {
    let has_driver = ["libcuda.so", "libcuda.so.1"].iter().any(|l| {
        std::path::Path::new("/usr/lib/x86_64-linux-gnu")
            .join(l)
            .exists()
    });
    match Device::cuda(0) {
        Ok(d) => assert_eq!(d.kind(), DeviceKind::Cuda),
        Err(Error::DeviceUnavailable { device, reason }) => {
            assert_eq!(device, "cuda:0");
            if !has_driver {
                assert_eq!(
                    reason,
                    "no CUDA driver found (libcuda.so could not be loaded)"
                );
            }
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
    if !has_driver {
        let msg = Device::by_name("cuda:1").unwrap_err().to_string();
        assert_eq!(
            msg,
            "device `cuda:1` is not available: no CUDA driver found (libcuda.so could not be loaded)"
        );
    }
}

#[test]
fn hip_without_a_device_is_a_clean_error() {
    match Device::hip(0) {
        Ok(d) => assert_eq!(d.kind(), DeviceKind::Hip),
        Err(Error::DeviceUnavailable { device, reason }) => {
            eprintln!("hip:0: {reason}");
            assert_eq!(device, "hip:0");
            if cfg!(feature = "hip") {
                assert!(
                    reason.contains("no HIP device found")
                        || reason.contains("no HIP runtime found"),
                    "{reason}"
                );
            } else {
                assert!(reason.contains("`hip` feature"), "{reason}");
            }
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// The shared libraries an ELF file names as `DT_NEEDED` (64-bit little-endian).
fn elf_needed(bytes: &[u8]) -> Vec<String> {
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&bytes[..5], b"\x7fELF\x02", "a 64-bit ELF");
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let sections: Vec<(usize, usize, usize, usize)> = (0..shnum)
        .map(|i| {
            let s = shoff + i * shentsize;
            // (type, offset, size, link)
            (
                u32_at(s + 4),
                u64_at(s + 0x18),
                u64_at(s + 0x20),
                u32_at(s + 0x28),
            )
        })
        .collect();
    let mut out = Vec::new();
    for &(ty, off, size, link) in &sections {
        if ty != 6 {
            continue; // SHT_DYNAMIC
        }
        let strtab = sections[link].1;
        for e in (off..off + size).step_by(16) {
            let (tag, val) = (u64_at(e), u64_at(e + 8));
            if tag == 1 {
                // DT_NEEDED
                let s = &bytes[strtab + val..];
                let end = s.iter().position(|&b| b == 0).unwrap();
                out.push(String::from_utf8_lossy(&s[..end]).into_owned());
            }
        }
    }
    out
}

/// GPU runtimes are loaded at run time, so a binary starts on any machine: this test
/// binary (built with the features under test, `hip` included in CI) names neither
/// `libcuda` nor `libamdhip64` as a needed library.
#[test]
fn binaries_do_not_link_gpu_runtimes() {
    let exe = std::env::current_exe().unwrap();
    let needed = elf_needed(&std::fs::read(&exe).unwrap());
    assert!(
        needed.iter().any(|n| n.starts_with("libc.so")),
        "{needed:?}"
    );
    for n in &needed {
        assert!(
            !n.contains("libcuda") && !n.contains("amdhip64"),
            "{} needs {n}: {needed:?}",
            exe.display()
        );
    }
}

#[test]
fn best_falls_back_and_all_ends_with_the_cpu() {
    let all = Device::all();
    assert_eq!(all.last(), Some(&Device::cpu()));
    if std::env::var_os("TESSERA_DEVICE").is_none() {
        let best = Device::best().unwrap();
        assert_eq!(&best, &all[0], "best() is the first device of all()");
    }
    let cpu = Device::cpu();
    assert!(cpu.enable_peer_access(&cpu).is_ok());
    let (v, t) = cpu.time(|| Ok(42)).unwrap();
    assert_eq!(v, 42);
    assert!(t.as_secs() < 10);
    let p = cpu.properties();
    assert_eq!(p.target, "host");
    assert!(p.multiprocessors >= 1);
}

#[test]
fn cpu_buffers_copy_between_devices() {
    let cpu = Device::cpu();
    let x = cpu.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let y = x.copy_to_device(&cpu).unwrap();
    assert_eq!(y.download().unwrap(), vec![1.0, 2.0, 3.0]);
    let mut out = cpu.alloc::<f32>(3).unwrap();
    add_one::<4>::launch(&cpu, 1u32, (&y, &mut out, 3)).unwrap();
    assert_eq!(out.download().unwrap(), vec![2.0, 3.0, 4.0]);
}

#[test]
fn artifacts_are_found_by_kernel_key_and_missing_ones_named() {
    let dir = temp_dir("store");
    let store = ArtifactStore::new(&dir);
    let opts = KernelOptions::default();
    // Missing: the error names the kernel, the target and the folder.
    let err = store
        .find::<add_one<128>>(&(), &Specialization::None, "sm_90", &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`add_one`") && err.contains("sm_90"), "{err}");
    assert!(err.contains(&dir.display().to_string()), "{err}");
    // What `tessera::aot::precompile` writes: the binary under the kernel's key.
    let key = kernel_key_of::<add_one<128>>(&(), "sm_90", &opts).unwrap();
    let bin = KernelBinary {
        name: "add_one".into(),
        target: "sm_90".into(),
        num_threads: 128,
        shared_bytes: 0,
        binary: b"// ptx".to_vec(),
    };
    store.put("add_one", &key, &bin).unwrap();
    assert_eq!(
        store
            .find::<add_one<128>>(&(), &Specialization::None, "sm_90", &opts)
            .unwrap(),
        bin
    );
    // Other comptime arguments, target or options: other keys.
    assert!(
        store
            .find::<add_one<256>>(&(), &Specialization::None, "sm_90", &opts)
            .is_err()
    );
    assert!(
        store
            .find::<add_one<128>>(&(), &Specialization::None, "sm_80", &opts)
            .is_err()
    );
    let eight = KernelOptions {
        num_warps: 8,
        ..KernelOptions::default()
    };
    assert!(
        store
            .find::<add_one<128>>(&(), &Specialization::None, "sm_90", &eight)
            .is_err()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

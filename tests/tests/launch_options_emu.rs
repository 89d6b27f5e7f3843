//! Launch options reach the emulator's compiler: each option set is compiled on its
//! own, with the warps and stages asked for. (One test in its own binary: it reads
//! the emulator's process-wide compilation cache.)

use tessera::LaunchOptions;
use tessera::codegen::emu::compiled_kernels;
use tessera::codegen::target::EmuFlavor;
use tessera::prelude::*;

#[kernel]
fn opts_probe<const B: usize>(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = arange::<B>();
    out.store_unmasked(offs, x.load_unmasked(offs) + 1.0);
}

#[test]
fn the_emulator_compiles_each_option_set() {
    let seen = |warps: u32, stages: Option<u32>| {
        compiled_kernels().iter().any(|(name, flavor, o)| {
            name == "opts_probe"
                && *flavor == EmuFlavor::Amd
                && o.num_warps == warps
                && o.num_stages == stages
        })
    };
    let dev = Device::by_name("emu-amd").unwrap();
    let x = dev.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let mut out = dev.alloc::<f32>(4).unwrap();
    opts_probe::<4>::launch(&dev, 1u32, (&x, &mut out)).unwrap();
    assert!(seen(4, None), "{:?}", compiled_kernels());
    assert!(!seen(8, Some(2)));
    let opts = LaunchOptions::new().num_warps(8).num_stages(2);
    out.fill(f32::NAN).unwrap();
    opts_probe::<4>::launch_with(&dev, 1u32, &opts, (&x, &mut out)).unwrap();
    assert!(seen(8, Some(2)), "{:?}", compiled_kernels());
    assert_eq!(out.download().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    // The interpreter ignores them (nothing compiled for the CPU).
    let cpu = Device::cpu();
    let x = cpu.upload(&[1.0f32; 4]).unwrap();
    let mut out = cpu.alloc::<f32>(4).unwrap();
    let before = compiled_kernels().len();
    opts_probe::<4>::launch_with(
        &cpu,
        1u32,
        &LaunchOptions::new().num_warps(16),
        (&x, &mut out),
    )
    .unwrap();
    assert_eq!(compiled_kernels().len(), before);
    assert_eq!(out.download().unwrap(), vec![2.0; 4]);
}

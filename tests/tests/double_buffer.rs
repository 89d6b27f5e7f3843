//! Loops whose `dot` operands are staged in shared memory through registers (AMD:
//! no `cp.async`) alternate between two copies of the `dot`'s arrays, unrolled by
//! two so each copy's addresses are constants: one barrier an iteration instead of
//! two. Checked on the AMD emulator flavours (which report any shared-memory race
//! between the copies) for every trip count parity, and where the plan takes it.

use tessera::prelude::*;

/// `c = a · b` (f16 in, f32 out) of a `BM x k` by `k x BN` product, `BK` of `k` a
/// step (`k` a multiple of it: 0 to 5 steps below).
#[kernel]
fn mm<const BM: usize, const BN: usize, const BK: usize>(
    a: &Global<f16>,
    b: &Global<f16>,
    c: &mut Global<f32>,
    k: i32,
) {
    let rm = arange::<BM>().expand_dims::<1>();
    let cn = arange::<BN>().expand_dims::<0>();
    let mut acc = zeros::<f32, S2<BM, BN>>();
    for k0 in (0..k).step_by(BK) {
        let kk = k0 + arange::<BK>();
        let a_tile = a.load_unmasked(rm * k + kk.expand_dims::<0>());
        let b_tile = b.load_unmasked(kk.expand_dims::<1>() * BN as i32 + cn);
        acc = dot(a_tile, b_tile, acc);
    }
    c.store_unmasked(rm * BN as i32 + cn, acc);
}

const BM: usize = 64;
const BN: usize = 64;
const BK: usize = 32;

/// Every trip count from 0 to 5 (the loop's tail, odd counts, and none) on every AMD
/// flavour, against an f64 reference, every element written (poisoned first).
#[test]
fn double_buffered_loops_match_the_reference_for_every_trip_count() {
    let devices = [
        tessera::EmuKind::Amd,
        tessera::EmuKind::Gfx950,
        tessera::EmuKind::Gfx1200,
    ];
    for kind in devices {
        let dev = Device::emu(kind).expect("the emulator is built in");
        for steps in 0..=5usize {
            let k = steps * BK;
            // Small integers and halves: exact products and sums in f32.
            let a: Vec<f32> = (0..BM * k)
                .map(|i| ((i * 7 + 3) % 9) as f32 * 0.5 - 2.0)
                .collect();
            let b: Vec<f32> = (0..k * BN)
                .map(|i| ((i * 5 + 1) % 7) as f32 - 3.0)
                .collect();
            let mut want = vec![0f64; BM * BN];
            for i in 0..BM {
                for p in 0..k {
                    for j in 0..BN {
                        want[i * BN + j] += a[i * k + p] as f64 * b[p * BN + j] as f64;
                    }
                }
            }
            let h = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
            // (At least one element, for an empty `k`.)
            let da = dev
                .upload(&h(&a).into_iter().chain([f16::ZERO]).collect::<Vec<_>>())
                .unwrap();
            let db = dev
                .upload(&h(&b).into_iter().chain([f16::ZERO]).collect::<Vec<_>>())
                .unwrap();
            let mut dc = dev.upload(&vec![f32::NAN; BM * BN]).unwrap();
            mm::<BM, BN, BK>::launch(&dev, 1usize, (&da, &db, &mut dc, k as i32))
                .unwrap_or_else(|e| panic!("{dev} k={k}: {e}"));
            let got = dc.download().unwrap();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g as f64, w, "{dev} k={k} [{i}]");
            }
        }
    }
}

/// The plan: gfx942 and gfx950 (and their emulators) double-buffer the loop; NVIDIA
/// (whose loops take `cp.async` rings, and which spilled unrolled) and RDNA3 (whose
/// WMMA holds A and B twice) keep one copy.
#[test]
fn amd_targets_double_buffer_staged_loops() {
    use tessera::aot::{AmdArch, CompileOptions, Target};
    use tessera::codegen::EmuFlavor;
    let f = tessera::kernel_ir::<mm<BM, BN, BK>>(&()).expect("builds");
    let opts = CompileOptions::warps(4);
    for (target, doubled) in [
        (Target::Amdgpu(AmdArch::Gfx942), true),
        (Target::Amdgpu(AmdArch::Gfx950), true),
        (Target::Amdgpu(AmdArch::Gfx1200), true),
        (Target::Emu(EmuFlavor::Gfx950), true),
        (Target::Amdgpu(AmdArch::Gfx1100), false),
        (Target::nvptx(80), false),
    ] {
        let dump = tessera::codegen::lower::lower_with_layouts(&f, target, &opts)
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(
            dump.contains("unrolled by two"),
            doubled,
            "{target}:\n{dump}"
        );
    }
}

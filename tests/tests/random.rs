//! Random numbers in kernels (`randint4x`, `randint`, `rand`, `randn`, `umulhi`):
//! Philox 4x32-10 with Triton's counter `(offset_lo, offset_hi, 0, 0)` and key
//! `(seed_lo, seed_hi)`, on the CPU (the interpreter), emu-nv and emu-amd (the real
//! GPU lowering). The integers and `rand` are compared bit for bit with a plain-Rust
//! Philox written here from the paper's round function (itself checked against the
//! Random123 known-answer vectors); `randn` within the accuracy of `log`, `sqrt` and
//! `cos`. Outputs are poisoned first; odd sizes leave a masked tail.

use tessera::EmuKind;
use tessera::prelude::*;

/// Philox 4x32 with `rounds` rounds (Salmon et al., SC'11): each round multiplies
/// words 0 and 2 by the round constants, XORs the high halves with the other two
/// words and the key, and bumps the key by the Weyl constants.
fn philox4x32(mut ctr: [u32; 4], mut key: [u32; 2], rounds: usize) -> [u32; 4] {
    for r in 0..rounds {
        if r > 0 {
            key[0] = key[0].wrapping_add(0x9E37_79B9);
            key[1] = key[1].wrapping_add(0xBB67_AE85);
        }
        let p0 = u64::from(ctr[0]) * 0xD251_1F53;
        let p1 = u64::from(ctr[2]) * 0xCD9E_8D57;
        ctr = [
            (p1 >> 32) as u32 ^ ctr[1] ^ key[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ ctr[3] ^ key[1],
            p0 as u32,
        ];
    }
    ctr
}

#[test]
fn the_reference_matches_the_random123_answers() {
    assert_eq!(
        philox4x32([0; 4], [0; 2], 10),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
    assert_eq!(
        philox4x32([u32::MAX; 4], [u32::MAX; 2], 10),
        [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
    );
    assert_eq!(
        philox4x32(
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0],
            10
        ),
        [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
    );
}

/// What Triton computes for `seed` and a 64-bit `offset`.
fn reference(seed: i64, offset: i64) -> [u32; 4] {
    let (s, o) = (seed as u64, offset as u64);
    philox4x32(
        [o as u32, (o >> 32) as u32, 0, 0],
        [s as u32, (s >> 32) as u32],
        10,
    )
}

fn uniform(x: u32) -> f32 {
    let x = x as i32;
    let x = if x < 0 { !x } else { x };
    x as f32 * (4.656_612_734_2e-10_f64 as f32)
}

/// Every stream for offsets `base + i` (64-bit when `wide`), `i < n`.
#[kernel]
#[allow(clippy::too_many_arguments)]
fn random_streams<const B: usize>(
    seed: i64,
    base: i64,
    r0: &mut Global<u32>,
    r1: &mut Global<u32>,
    r2: &mut Global<u32>,
    r3: &mut Global<u32>,
    u: &mut Global<f32>,
    g: &mut Global<f32>,
    hi: &mut Global<u32>,
    n: i32,
) {
    let i = program_id(0) * B + arange::<B>();
    let m = i.lt(n);
    let offs = i.cast::<i64>() + base;
    let r = randint4x(seed, offs);
    r0.store(i, r[0], m);
    r1.store(i, r[1], m);
    r2.store(i, r[2], m);
    r3.store(i, r[3], m);
    u.store(i, rand(seed, offs), m);
    g.store(i, randn(seed, offs), m);
    hi.store(i, umulhi(r[0], r[1]), m);
}

/// 32-bit offsets and a literal seed: the stream of `tl.rand(1234, offsets)`.
#[kernel]
fn rand_i32<const B: usize>(out: &mut Global<f32>, bits: &mut Global<u32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    out.store(offs, rand(1234, offs), m);
    bits.store(offs, randint(-7i32, offs), m);
}

fn devices() -> Vec<Device> {
    let mut v = vec![Device::cpu()];
    for k in [EmuKind::Nv, EmuKind::Amd] {
        v.push(Device::emu(k).expect("the emulator (feature jit)"));
    }
    v
}

#[test]
fn the_streams_match_philox_bit_for_bit() {
    let n = 1000usize;
    for (seed, base) in [
        (0i64, 0i64),
        (0x1234_5678_9abc_def0, 5),
        (-3, (1 << 33) + 17),
    ] {
        for dev in devices() {
            let poison_u = || dev.upload(&vec![0xA5A5_A5A5u32; n]).unwrap();
            let poison_f = || dev.upload(&vec![f32::NAN; n]).unwrap();
            let (mut r0, mut r1, mut r2, mut r3) = (poison_u(), poison_u(), poison_u(), poison_u());
            let (mut u, mut g, mut hi) = (poison_f(), poison_f(), poison_u());
            random_streams::<256>::launch(
                &dev,
                n.div_ceil(256) as u32,
                (
                    seed, base, &mut r0, &mut r1, &mut r2, &mut r3, &mut u, &mut g, &mut hi,
                    n as i32,
                ),
            )
            .unwrap();
            let got = [r0, r1, r2, r3].map(|b| b.download().unwrap());
            let (u, g, hi) = (
                u.download().unwrap(),
                g.download().unwrap(),
                hi.download().unwrap(),
            );
            let mut sum = 0.0f64;
            for i in 0..n {
                let want = reference(seed, base + i as i64);
                for w in 0..4 {
                    assert_eq!(
                        got[w][i],
                        want[w],
                        "{dev} seed {seed} offset {}: word {w}",
                        base + i as i64
                    );
                }
                assert_eq!(
                    u[i].to_bits(),
                    uniform(want[0]).to_bits(),
                    "{dev}: rand at {i}"
                );
                assert!((0.0..1.0).contains(&u[i]));
                let (u1, u2) = (uniform(want[0]).max(1.0e-7), uniform(want[1]));
                let z = (-2.0 * u1.ln()).sqrt() * ((std::f64::consts::TAU as f32) * u2).cos();
                assert!(
                    (g[i] - z).abs() <= 1e-4 * (1.0 + z.abs()),
                    "{dev}: randn at {i}: {} vs {z}",
                    g[i]
                );
                let p = u64::from(want[0]) * u64::from(want[1]);
                assert_eq!(hi[i], (p >> 32) as u32, "{dev}: umulhi at {i}");
                sum += f64::from(u[i]);
            }
            let mean = sum / n as f64;
            assert!((mean - 0.5).abs() < 0.05, "{dev}: mean of rand {mean}");
        }
    }
}

#[test]
fn literal_seeds_and_32_bit_offsets() {
    let n = 300usize;
    for dev in devices() {
        let mut out = dev.upload(&vec![f32::NAN; n]).unwrap();
        let mut bits = dev.upload(&vec![0xA5A5_A5A5u32; n]).unwrap();
        rand_i32::<128>::launch(
            &dev,
            n.div_ceil(128) as u32,
            (&mut out, &mut bits, n as i32),
        )
        .unwrap();
        let (out, bits) = (out.download().unwrap(), bits.download().unwrap());
        for i in 0..n {
            assert_eq!(
                out[i].to_bits(),
                uniform(reference(1234, i as i64)[0]).to_bits(),
                "{dev}: {i}"
            );
            // A negative seed is sign-extended to 64 bits.
            assert_eq!(bits[i], reference(-7, i as i64)[0], "{dev}: {i}");
        }
    }
}

/// The random streams compile for every GPU target: ptxas assembles the PTX (sm_80,
/// sm_90a) without spills; the AMD code objects link (gfx90a, gfx942). `umulhi`
/// becomes the hardware's high multiply (`mul.hi.u32`, `v_mul_hi_u32`), not a 64-bit
/// product.
#[test]
fn the_streams_compile_for_every_gpu_target() {
    use tessera::aot::{AmdArch, CompileOptions, Target, compile_kernel};
    use tessera::codegen::tools;
    for t in [Target::nvptx(80), Target::SM90A] {
        let art = compile_kernel::<random_streams<256>>(&(), t, &CompileOptions::default())
            .expect("compiles");
        assert!(art.asm.contains("mul.hi.u32"), "{}", art.asm);
        let r = tools::ptxas(&art.asm, &t.to_string()).expect("ptxas");
        assert_eq!((r.spill_stores_bytes, r.spill_loads_bytes), (0, 0));
    }
    for a in [AmdArch::Gfx90a, AmdArch::Gfx942] {
        let art = compile_kernel::<random_streams<256>>(
            &(),
            Target::Amdgpu(a),
            &CompileOptions::default(),
        )
        .expect("compiles");
        assert!(art.asm.contains("v_mul_hi_u32"), "{}", art.asm);
    }
}

//! `dot_batched`: `[B, M, K] × [B, K, N] + [B, M, N]`, f16 (the matrix units) and f32
//! inputs, on the CPU, emu-nv and emu-amd against an f64 reference on random inputs,
//! outputs poisoned first; then the matrix instructions every GPU target uses for it.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::ir::interp::Element;
use tessera::prelude::*;
use tessera_tests::cpu_and_emulators;

/// `out[b] = a[b] · w[b] + c[b]` for the `B` batches of one program.
#[kernel]
fn batched<
    T: DotInput<Acc = f32>,
    const B: usize,
    const M: usize,
    const K: usize,
    const N: usize,
>(
    a: &Global<T>,
    w: &Global<T>,
    c: &Global<f32>,
    out: &mut Global<f32>,
) {
    let b3 = arange::<B>().expand_dims::<1>().expand_dims::<2>();
    let m3 = arange::<M>().expand_dims::<0>().expand_dims::<2>();
    let k3 = arange::<K>().expand_dims::<0>().expand_dims::<1>();
    let kr = arange::<K>().expand_dims::<0>().expand_dims::<2>();
    let n3 = arange::<N>().expand_dims::<0>().expand_dims::<1>();
    let at = a.load_unmasked(b3 * (M * K) as i32 + m3 * K as i32 + k3);
    let wt = w.load_unmasked(b3 * (K * N) as i32 + kr * N as i32 + n3);
    let co = b3 * (M * N) as i32 + m3 * N as i32 + n3;
    out.store_unmasked(co, dot_batched(at, wt, c.load_unmasked(co)));
}

fn reference(
    a: &[f32],
    w: &[f32],
    c: &[f32],
    (b, m, k, n): (usize, usize, usize, usize),
) -> Vec<f64> {
    let mut out = vec![0.0; b * m * n];
    for bi in 0..b {
        for i in 0..m {
            for j in 0..n {
                let mut s = c[bi * m * n + i * n + j] as f64;
                for kk in 0..k {
                    s += a[bi * m * k + i * k + kk] as f64 * w[bi * k * n + kk * n + j] as f64;
                }
                out[bi * m * n + i * n + j] = s;
            }
        }
    }
    out
}

fn case<
    T: Element + DotInput<Acc = f32>,
    const B: usize,
    const M: usize,
    const K: usize,
    const N: usize,
>(
    conv: impl Fn(f32) -> T,
    back: impl Fn(T) -> f32,
) where
    Const<B>: Pow2,
    Const<M>: Pow2,
    Const<K>: Pow2,
    Const<N>: Pow2,
{
    let mut r = StdRng::seed_from_u64(23);
    let mut v = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| back(conv(r.gen_range(-1.0..1.0))))
            .collect()
    };
    let (a, w, c) = (v(B * M * K), v(B * K * N), v(B * M * N));
    let want = reference(&a, &w, &c, (B, M, K, N));
    let ta: Vec<T> = a.iter().map(|&x| conv(x)).collect();
    let tw: Vec<T> = w.iter().map(|&x| conv(x)).collect();
    for dev in cpu_and_emulators() {
        let mut out = dev.upload(&vec![f32::NAN; B * M * N]).unwrap();
        batched::<T, B, M, K, N>::launch(
            &dev,
            1u32,
            (
                &dev.upload(&ta).unwrap(),
                &dev.upload(&tw).unwrap(),
                &dev.upload(&c).unwrap(),
                &mut out,
            ),
        )
        .unwrap_or_else(|e| panic!("{dev}: {e}"));
        let got: Vec<f64> = out.download().unwrap().iter().map(|&x| x as f64).collect();
        tessera_tests::assert_close(&format!("{dev}: dot_batched"), &got, &want, |i| {
            4e-5 * K as f64 + 1e-5 * want[i].abs()
        });
    }
}

#[test]
fn batched_dot_matches_a_reference() {
    case::<f16, 4, 32, 16, 32>(f16::from_f32, f16::to_f32);
    case::<f32, 2, 16, 8, 16>(|x| x, |x| x);
}

/// The f16 batches run on the matrix units: `mma.sync` on sm_80, `wgmma` or
/// `mma.sync` on sm_90a, MFMA on gfx942; ptxas assembles it without spills.
#[test]
fn batched_dot_uses_the_matrix_units() {
    use tessera::aot::{AmdArch, CompileOptions, Target, compile_kernel};
    use tessera::codegen::tools;
    let o = CompileOptions::default();
    for t in [Target::nvptx(80), Target::SM90A] {
        let art = compile_kernel::<batched<f16, 4, 32, 16, 32>>(&(), t, &o).expect("compiles");
        assert!(
            art.asm.contains("mma.sync") || art.asm.contains("wgmma"),
            "{t}:\n{}",
            art.asm
        );
        let r = tools::ptxas(&art.asm, &t.to_string()).expect("ptxas");
        assert_eq!((r.spill_stores_bytes, r.spill_loads_bytes), (0, 0), "{t}");
    }
    for a in [AmdArch::Gfx90a, AmdArch::Gfx942] {
        let t = Target::Amdgpu(a);
        let art = compile_kernel::<batched<f16, 4, 32, 16, 32>>(&(), t, &o).expect("compiles");
        assert!(art.asm.contains("v_mfma"), "{t}:\n{}", art.asm);
    }
}

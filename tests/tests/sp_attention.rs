//! Sequence-parallel attention (`tessera::sp_attention`): the fused kernel (keys and
//! values gathered inside it, local blocks first, each peer's as it arrives) and the
//! unfused sequence (all-gather, then attention) against an f64 reference over the
//! whole sequence, on 2, 4 and 8 CPU ranks and on 4 emulated GPU ranks of each
//! flavor (the real lowering of the puts, signals and waits); causal and not, ragged
//! lengths, outputs poisoned first, each plan run twice with new data (the epochs
//! and the closing barrier make the workspace reusable). Fused and unfused agree bit
//! for bit: the same blocks in the same order through the same block code.
//!
//! Tolerance: `P` is rounded to the input type before `P V` and the sums are f32;
//! `|got - want| <= 4e-3 + |want| / 512` in f16 (relative `2^-9`, a few ulps) and
//! `1e-5 + |want| * 1e-5` in f32.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::EmuKind;
use tessera::fused::GemmElem;
use tessera::prelude::*;
use tessera::sp_attention::{
    self as sp, AllGatherThenAttention, SpAttention, SpShape, gather_kv_kernel,
    gathered_attention_kernel, sp_attention_kernel,
};

const HD: usize = 64;

trait Conv: GemmElem {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn bits(self) -> u32;
    /// (absolute, relative) tolerance.
    const TOL: (f64, f64);
}
impl Conv for f32 {
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
    const TOL: (f64, f64) = (1e-5, 1e-5);
}
impl Conv for f16 {
    fn from_f64(v: f64) -> f16 {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
    const TOL: (f64, f64) = (4e-3, 1.0 / 512.0);
}

fn random<T: Conv>(seed: u64, n: usize) -> Vec<T> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| T::from_f64(r.gen_range(-1.0..1.0)))
        .collect()
}

fn case<T: Conv>(world: World, ranks: usize, shape: SpShape, seed: u64)
where
    sp_attention_kernel<T, { sp::BM }, { sp::BN }, HD>: Kernel<Comptime = ()>,
    gather_kv_kernel<T, { sp::BN }, HD>: Kernel<Comptime = ()>,
    gathered_attention_kernel<T, { sp::BM }, { sp::BN }, HD>: Kernel<Comptime = ()>,
{
    let SpShape { heads, sq, sk, .. } = shape;
    let what = format!("{} x{ranks} {shape:?}", std::any::type_name::<T>());
    // Two runs with different data: per run, per rank, q, k, v.
    let data: Vec<Vec<[Vec<T>; 3]>> = (0..2u64)
        .map(|run| {
            (0..ranks as u64)
                .map(|r| {
                    let s = seed + 100 * run + 10 * r;
                    [
                        random(s, heads * sq * HD),
                        random(s + 1, heads * sk * HD),
                        random(s + 2, heads * sk * HD),
                    ]
                })
                .collect()
        })
        .collect();
    let scale = 1.0 / (HD as f32).sqrt();
    let nan = T::from_f64(f64::NAN);
    let out = world
        .run(|r| {
            let me = r.rank() as usize;
            let d = r.device();
            let mut fused = SpAttention::<T, HD>::new(r, shape)?;
            let mut plain = AllGatherThenAttention::<T, HD>::new(r, shape)?;
            let mut res = Vec::new();
            for run in &data {
                let [q, k, v] = &run[me];
                let (q, k, v) = (d.upload(q)?, d.upload(k)?, d.upload(v)?);
                let mut o1 = d.upload(&vec![nan; heads * sq * HD])?;
                let mut o2 = d.upload(&vec![nan; heads * sq * HD])?;
                fused.run(r, &q, &k, &v, &mut o1, scale)?;
                plain.run(r, &q, &k, &v, &mut o2, scale)?;
                res.push((o1.download()?, o2.download()?));
            }
            Ok(res)
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let f64s = |v: &[T]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    for (run, d) in data.iter().enumerate() {
        let k_all: Vec<f64> = d.iter().flat_map(|x| f64s(&x[1])).collect();
        let v_all: Vec<f64> = d.iter().flat_map(|x| f64s(&x[2])).collect();
        for (rank, res) in out.iter().enumerate() {
            let want = sp::reference(
                &f64s(&d[rank][0]),
                &k_all,
                &v_all,
                rank,
                ranks,
                shape,
                HD,
                scale as f64,
            );
            let (fused, plain) = &res[run];
            let (abs, rel) = T::TOL;
            for (i, (g, w)) in fused.iter().zip(&want).enumerate() {
                let g = g.to_f64();
                assert!(
                    (g - w).abs() <= abs + rel * w.abs(),
                    "{what} run {run} rank {rank} [{i}]: {g} vs {w}"
                );
            }
            assert!(
                fused.iter().zip(plain).all(|(a, b)| a.bits() == b.bits()),
                "{what} run {run} rank {rank}: fused and unfused differ"
            );
        }
    }
}

fn cpu_world(n: usize) -> World {
    World::local(n)
        .heap_bytes(64 << 20)
        .wait_timeout(Duration::from_secs(60))
}

fn emu_world(kind: EmuKind, n: usize) -> World {
    let d = Device::emu(kind).expect("the emulator is always available");
    World::local(n)
        .on(&d)
        .heap_bytes(16 << 20)
        .wait_timeout(Duration::from_secs(60))
}

fn shape(heads: usize, sq: usize, sk: usize, causal: bool) -> SpShape {
    SpShape {
        heads,
        sq,
        sk,
        causal,
    }
}

#[test]
fn two_cpu_ranks_ragged() {
    case::<f32>(cpu_world(2), 2, shape(1, 70, 90, false), 1);
    case::<f16>(cpu_world(2), 2, shape(2, 70, 70, true), 2);
}

#[test]
fn four_cpu_ranks() {
    case::<f16>(cpu_world(4), 4, shape(2, 96, 96, false), 3);
    case::<f16>(cpu_world(4), 4, shape(2, 96, 96, true), 4);
}

#[test]
fn eight_cpu_ranks() {
    case::<f16>(cpu_world(8), 8, shape(1, 64, 64, true), 5);
}

/// On the emulator the software pipeliner must leave the peers' loop alone: a block
/// loaded iterations ahead would be read before its chunk's signal (it was, and this
/// caught it).
#[test]
fn four_emulated_ranks_of_each_flavor() {
    for kind in [EmuKind::Nv, EmuKind::Amd, EmuKind::Sm90a] {
        case::<f16>(emu_world(kind, 4), 4, shape(1, 80, 80, true), 6);
        case::<f16>(emu_world(kind, 4), 4, shape(1, 64, 100, false), 7);
    }
}

#[test]
fn bad_shapes_and_lengths_are_errors() {
    let errs = cpu_world(2)
        .run(|r| {
            let mut e = Vec::new();
            e.push(
                SpAttention::<f32, HD>::new(r, shape(0, 8, 8, false))
                    .err()
                    .map(|e| e.to_string()),
            );
            e.push(
                SpAttention::<f32, HD>::new(r, shape(1, 8, 16, true))
                    .err()
                    .map(|e| e.to_string()),
            );
            let mut plan = SpAttention::<f32, HD>::new(r, shape(1, 8, 8, false))?;
            let d = r.device();
            let short = d.upload(&vec![0f32; 7 * HD])?;
            let ok = d.upload(&vec![0f32; 8 * HD])?;
            let mut o = d.upload(&vec![0f32; 8 * HD])?;
            e.push(
                plan.run(r, &short, &ok, &ok, &mut o, 1.0)
                    .err()
                    .map(|e| e.to_string()),
            );
            Ok(e)
        })
        .expect("runs");
    for e in errs {
        let [a, b, c] = &e[..] else { panic!("{e:?}") };
        assert!(
            a.as_deref().is_some_and(|m| m.contains("nonempty")),
            "{a:?}"
        );
        assert!(
            b.as_deref()
                .is_some_and(|m| m.contains("as many query as key rows")),
            "{b:?}"
        );
        assert!(
            c.as_deref()
                .is_some_and(|m| m.contains("holds 448 elements")),
            "{c:?}"
        );
    }
}

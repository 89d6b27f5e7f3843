//! FlashAttention-2 forward ([`tessera::attention::attention_fwd`]): causal and
//! non-causal, head dim 64 and 128, f16 and bf16, ragged sequence lengths, checked
//! against an f64 reference.
//!
//! `cargo run --release --example attention` (`TESSERA_DEVICE=emu-sm90a` runs the
//! Hopper lowering, `wgmma`, on the emulator)

mod common;

use std::time::Instant;

use tessera::attention::{LOG2_E, attention_fwd, reference};
use tessera::prelude::*;

/// Rows of queries and keys per program (4 warps).
const BM: usize = 64;
const BN: usize = 64;

struct Case {
    heads: usize,
    seq_q: usize,
    seq_k: usize,
    causal: bool,
}

fn run<T: DotInput<Acc = f32> + tessera::Element, const HD: usize>(
    dev: &Device,
    name: &str,
    c: &Case,
    (to_t, to_f64, eps): (impl Fn(f32) -> T, impl Fn(T) -> f64, f64),
) -> Result<(), Box<dyn std::error::Error>>
where
    attention_fwd<T, BM, BN, HD>: Kernel<Comptime = ()>,
{
    let (mut rng, _) = common::rng();
    let mut random = |n: usize| -> Vec<T> {
        common::uniform(&mut rng, n, -1.0, 1.0)
            .into_iter()
            .map(&to_t)
            .collect()
    };
    let (nq, nk) = (c.heads * c.seq_q * HD, c.heads * c.seq_k * HD);
    let (q, k, v) = (random(nq), random(nk), random(nk));
    let f = |x: &[T]| -> Vec<f64> { x.iter().map(|&e| to_f64(e)).collect() };
    let scale = 1.0 / (HD as f64).sqrt();
    let want = reference(
        &f(&q),
        &f(&k),
        &f(&v),
        c.heads,
        c.seq_q,
        c.seq_k,
        HD,
        scale,
        c.causal,
    );
    let (dq, dk, dv) = (dev.upload(&q)?, dev.upload(&k)?, dev.upload(&v)?);
    let mut dout = dev.upload(&vec![to_t(f32::NAN); nq])?;
    let grid = (c.seq_q.div_ceil(BM), c.heads);
    let args = |o| {
        (
            &dq,
            &dk,
            &dv,
            o,
            c.seq_q as i32,
            c.seq_k as i32,
            (scale as f32) * LOG2_E,
            i32::from(c.causal),
        )
    };
    let t = Instant::now();
    attention_fwd::<T, BM, BN, HD>::launch(dev, grid, args(&mut dout))?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{name}: {} heads, {}x{} (head dim {HD}, {}) in {:.2} ms",
        c.heads,
        c.seq_q,
        c.seq_k,
        if c.causal { "causal" } else { "non-causal" },
        secs * 1e3
    );
    let got: Vec<f64> = dout.download()?.into_iter().map(&to_f64).collect();
    // P is rounded to the input type before P·V, the output once more: a few units
    // of its rounding, relative to the output's scale (|o| <= max |v| = 1).
    let tol: Vec<f64> = want.iter().map(|w| 4.0 * eps * (1.0 + w.abs())).collect();
    common::check(name, &got, &want, &tol)?;
    Ok(())
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (_, seed) = common::rng();
        println!("attention on {dev} (seed {seed})");
        let causal = Case {
            heads: 2,
            seq_q: 150,
            seq_k: 150,
            causal: true,
        };
        let cross = Case {
            heads: 2,
            seq_q: 100,
            seq_k: 170,
            causal: false,
        };
        let f16s = (f16::from_f32, |v: f16| v.to_f64(), 1.0 / 1024.0);
        let bf16s = (bf16::from_f32, |v: bf16| v.to_f64(), 1.0 / 128.0);
        run::<f16, 64>(&dev, "attention f16 d64 causal", &causal, f16s)?;
        run::<f16, 64>(&dev, "attention f16 d64", &cross, f16s)?;
        run::<bf16, 128>(&dev, "attention bf16 d128 causal", &causal, bf16s)?;
        run::<bf16, 128>(&dev, "attention bf16 d128", &cross, bf16s)?;
        run::<f16, 128>(&dev, "attention f16 d128 causal", &causal, f16s)?;
        run::<bf16, 64>(&dev, "attention bf16 d64", &cross, bf16s)?;
        Ok(())
    });
}

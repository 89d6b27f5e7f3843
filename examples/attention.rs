//! FlashAttention-2 forward ([`tessera::attention::attention_fwd`]): causal and
//! non-causal, head dim 64 and 128, f16 and bf16, ragged sequence lengths, checked
//! against an f64 reference.
//!
//! On a GPU it then runs 32 heads of 4096 tokens (head dim 64, f16, non-causal) with
//! the fastest of several configurations (query and key block, warps, stages),
//! chosen by autotuning the first time (`tessera::autotune::Tuner`, the winner kept in
//! the kernel disk cache), and prints its TFLOP/s. `--tune HEADS SEQ` does the same on
//! any device (the emulators take minutes).
//!
//! `cargo run --release --example attention [-- --tune HEADS SEQ]`
//! (`TESSERA_DEVICE=emu-sm90a` runs the Hopper lowering, `wgmma`, on the emulator)

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

/// A configuration the tuner tries: the query and key blocks, warps and stages.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Config {
    block: (usize, usize),
    warps: u32,
    stages: u32,
}

/// Attention forward (f16, head dim 64, non-causal) over `heads` heads of `seq`
/// tokens with the tuned configuration: tunes once per device and shape, times the
/// winner, and checks 16 rows of one head against an f64 reference.
fn tuned(dev: &Device, heads: usize, seq: usize) -> Result<(), Box<dyn std::error::Error>> {
    const HD: usize = 64;
    let (mut rng, _) = common::rng();
    let n = heads * seq * HD;
    let mut random = || -> Vec<f16> {
        common::uniform(&mut rng, n, -1.0, 1.0)
            .into_iter()
            .map(f16::from_f32)
            .collect()
    };
    let (q, k, v) = (random(), random(), random());
    let (dq, dk, dv) = (dev.upload(&q)?, dev.upload(&k)?, dev.upload(&v)?);
    let mut dout = dev.upload(&vec![f16::NAN; n])?;
    let scale = 1.0 / (HD as f64).sqrt();
    let sl = (scale as f32) * LOG2_E;
    let si = seq as i32;
    let mut launch = |c: &Config| -> Result<(), tessera::Error> {
        let opts = LaunchOptions::new().num_warps(c.warps).num_stages(c.stages);
        let args = (&dq, &dk, &dv, &mut dout, si, si, sl, 0);
        let grid = |bm: usize| (seq.div_ceil(bm), heads);
        match c.block {
            (64, 64) => attention_fwd::<f16, 64, 64, HD>::launch_with(dev, grid(64), &opts, args),
            (128, 64) => {
                attention_fwd::<f16, 128, 64, HD>::launch_with(dev, grid(128), &opts, args)
            }
            _ => attention_fwd::<f16, 128, 128, HD>::launch_with(dev, grid(128), &opts, args),
        }
    };
    let mut configs = Vec::new();
    for (block, warps) in [
        ((64, 64), 4),
        ((128, 64), 4),
        ((128, 64), 8),
        ((128, 128), 8),
    ] {
        for stages in [2, 3] {
            configs.push(Config {
                block,
                warps,
                stages,
            });
        }
    }
    let (_, time) = common::tune_and_time(
        dev,
        "attention_fwd_f16_d64",
        configs,
        (
            &format!("attention f16 {heads} heads x {seq}"),
            &format!("{heads}x{seq}x{seq} d64 f16"),
        ),
        &mut launch,
    )?;
    // QK^T and PV: 2 * 2 * seq * seq * HD per head.
    let flops = 4.0 * heads as f64 * (seq as f64).powi(2) * HD as f64;
    println!(
        "attention f16 {heads} heads x {seq}: {:.3} ms, {:.1} TFLOP/s (median of 10)",
        time * 1e3,
        flops / time / 1e12
    );
    // 16 query rows of the last head against f64.
    let got = dout.download()?;
    let h = heads - 1;
    let at = |x: &[f16], t: usize, d: usize| x[(h * seq + t) * HD + d].to_f64();
    let (mut g, mut want) = (Vec::new(), Vec::new());
    for i in (0..16).map(|r| (r * 7919 + 5) % seq) {
        let s: Vec<f64> = (0..seq)
            .map(|j| (0..HD).map(|d| at(&q, i, d) * at(&k, j, d)).sum::<f64>() * scale)
            .collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        for d in 0..HD {
            want.push((0..seq).map(|j| e[j] * at(&v, j, d)).sum::<f64>() / sum);
            g.push(at(&got, i, d));
        }
    }
    let tol: Vec<f64> = want
        .iter()
        .map(|w| 4.0 / 1024.0 * (1.0 + w.abs()))
        .collect();
    common::check("attention f16 (tuned, 16 rows)", &g, &want, &tol)?;
    Ok(())
}

fn main() {
    common::run_main(|| {
        let tune = common::tune_args(2, "--tune HEADS SEQ")?.map(|v| (v[0], v[1]));
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
        match (tune, common::is_gpu(&dev)) {
            (Some((heads, seq)), _) => tuned(&dev, heads, seq)?,
            (None, true) => tuned(&dev, 32, 4096)?,
            (None, false) => {}
        }
        Ok(())
    });
}

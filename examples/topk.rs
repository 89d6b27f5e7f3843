//! Top-k routing (as a mixture-of-experts router does): for each token, the `K`
//! largest of its expert logits and their expert ids, then a softmax over those `K`
//! gates; plus a full per-row sort. One program per block of tokens; the sort is an
//! in-tile bitonic network through block-local memory.
//!
//! `cargo run --release --example topk`

mod common;

use rand::Rng;
use tessera::prelude::*;

/// For `TOKENS` tokens per program: `ids[t, :]` the `K` best experts of token `t`
/// (largest logit first), `gates[t, :]` the softmax of their logits, and `sorted[t, :]`
/// all `E` logits in descending order.
#[kernel]
pub fn route<const TOKENS: usize, const E: usize, const K: usize>(
    logits: &Global<f32>,
    ids: &mut Global<i32>,
    gates: &mut Global<f32>,
    sorted: &mut Global<f32>,
    n_tokens: i32,
) {
    let t = (program_id(0) * TOKENS + arange::<TOKENS>()).expand_dims::<1>();
    let e = arange::<E>().expand_dims::<0>();
    let m = t.lt(n_tokens);
    let x = logits.load_or(t * E as i32 + e, m, f32::NEG_INFINITY);
    let (best, which) = x.topk_with_indices::<K>();
    let g = (best - best.max_keepdims::<1>()).exp();
    let k = arange::<K>().expand_dims::<0>();
    ids.store(t * K as i32 + k, which, m);
    gates.store(t * K as i32 + k, g / g.sum_keepdims::<1>(), m);
    sorted.store(t * E as i32 + e, x.sort_descending(), m);
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        const E: usize = 64;
        const K: usize = 4;
        let n = 1000usize; // not a multiple of the 16 tokens per program
        println!("topk: {n} tokens x {E} experts, top {K}, on {dev} (seed {seed})");
        // Logits on a coarse grid, so that many tokens have ties among their best.
        let xs: Vec<f32> = (0..n * E)
            .map(|_| rng.gen_range(-40..40) as f32 * 0.125)
            .collect();
        let x = dev.upload(&xs)?;
        let mut ids = dev.upload(&vec![-1i32; n * K])?; // poison
        let mut gates = dev.upload(&vec![f32::NAN; n * K])?;
        let mut sorted = dev.upload(&vec![f32::NAN; n * E])?;
        route::<16, E, K>::launch(
            &dev,
            n.div_ceil(16),
            (&x, &mut ids, &mut gates, &mut sorted, n as i32),
        )?;
        let (ids, gates, sorted) = (ids.download()?, gates.download()?, sorted.download()?);
        let (mut want_g, mut got_g) = (Vec::new(), Vec::new());
        let mut ties = 0;
        for t in 0..n {
            let row = &xs[t * E..(t + 1) * E];
            // Largest first; equal logits in expert order (a stable sort).
            let mut order: Vec<usize> = (0..E).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            ties += usize::from(row[order[K - 1]] == row[order[K]]);
            let want_ids: Vec<i32> = order[..K].iter().map(|&i| i as i32).collect();
            if ids[t * K..(t + 1) * K] != want_ids[..] {
                return Err(format!(
                    "token {t}: experts {:?}, want {want_ids:?}",
                    &ids[t * K..(t + 1) * K]
                )
                .into());
            }
            let desc: Vec<f32> = order.iter().map(|&i| row[i]).collect();
            if sorted[t * E..(t + 1) * E] != desc[..] {
                return Err(format!("token {t}: the sorted row differs").into());
            }
            let top: Vec<f64> = order[..K].iter().map(|&i| row[i] as f64).collect();
            let s: f64 = top.iter().map(|v| (v - top[0]).exp()).sum();
            want_g.extend(top.iter().map(|v| (v - top[0]).exp() / s));
            got_g.extend(gates[t * K..(t + 1) * K].iter().map(|&g| g as f64));
        }
        let tol = vec![2e-6; want_g.len()];
        common::check("topk gates", &got_g, &want_g, &tol)?;
        println!(
            "topk: experts and sorted rows of {n} tokens match ({ties} with a tie at the k-th place)"
        );
        Ok(())
    });
}

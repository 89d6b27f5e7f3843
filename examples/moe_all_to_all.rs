//! Mixture-of-experts dispatch and combine with `Rank::all_to_all_v`: one expert per
//! rank, random top-1 routing of every token. Each rank
//!
//! 1. permutes its tokens so that those for expert `d` are contiguous (a gather
//!    kernel), and sends block `d` to rank `d` (dispatch, `all_to_all_v`);
//! 2. applies its expert, `y = x · W_e` (the tiled GEMM kernel), to every token it
//!    received;
//! 3. sends each result back to the rank the token came from (combine, `all_to_all_v`
//!    with the received counts), and un-permutes them into token order.
//!
//! Checked against a plain-Rust reference: `out[t] = x[t] · W_{expert(t)}`.
//!
//! `cargo run --release --example moe_all_to_all -- --ranks 4 --tokens 256 --hidden 64`

mod common;

use rand::Rng;
use tessera::fused::unfused::gemm_kernel;
use tessera::prelude::*;

/// `dst[i, :] = src[idx[i], :]` for `rows` rows of `hidden` values.
#[kernel]
fn gather_rows<const R: usize, const H: usize>(
    src: &Global<f32>,
    idx: &Global<i32>,
    dst: &mut Global<f32>,
    rows: i32,
    hidden: i32,
) {
    let r = program_id(0) * R as i32 + arange::<R>();
    let r_ok = r.lt(rows);
    let from = idx.load(r, r_ok).expand_dims::<1>();
    let (r2, ok2) = (r.expand_dims::<1>(), r_ok.expand_dims::<1>());
    for c0 in (0..hidden).step_by(H) {
        let c = (c0 + arange::<H>()).expand_dims::<0>();
        let mask = ok2 & c.lt(hidden);
        dst.store(r2 * hidden + c, src.load(from * hidden + c, mask), mask);
    }
}

const R: usize = 32;
const H: usize = 64;

fn main() {
    common::run_main(|| {
        let v = common::parse_args(
            "moe_all_to_all [--ranks N] [--tokens PER_RANK] [--hidden H]",
            &[
                ("ranks", 4, 1..=64),
                ("tokens", 256, 1..=1 << 16),
                ("hidden", 64, 1..=4096),
            ],
        )?;
        let (ranks, tokens, hidden) = (v[0], v[1], v[2]);
        let dev = common::comm_device();
        let (mut rng, seed) = common::rng();
        println!(
            "moe_all_to_all: {ranks} ranks on {dev}, one expert per rank, {tokens} tokens of {hidden} per rank, top-1 routing (seed {seed})"
        );
        let x: Vec<Vec<f32>> = (0..ranks)
            .map(|_| common::uniform(&mut rng, tokens * hidden, -1.0, 1.0))
            .collect();
        let route: Vec<Vec<usize>> = (0..ranks)
            .map(|_| (0..tokens).map(|_| rng.gen_range(0..ranks)).collect())
            .collect();
        let w: Vec<Vec<f32>> = (0..ranks)
            .map(|_| common::uniform(&mut rng, hidden * hidden, -0.5, 0.5))
            .collect();

        let out = common::rank_world(ranks, &dev).run(|r| {
            let me = r.rank() as usize;
            let d = r.device();
            // Dispatch order: tokens sorted by expert (stable), and the counts.
            let mut perm: Vec<usize> = (0..tokens).collect();
            perm.sort_by_key(|&t| route[me][t]);
            let mut counts = vec![0usize; ranks];
            for &t in &route[me] {
                counts[t] += 1;
            }
            let cap = ranks * tokens * hidden; // every token of every rank, at worst
            let xs = d.upload(&x[me])?;
            let perm_i: Vec<i32> = perm.iter().map(|&t| t as i32).collect();
            let perm_d = d.upload(&perm_i)?;
            let mut send = r.alloc::<f32>(tokens * hidden)?;
            let mut recv = r.alloc::<f32>(cap)?;
            let mut y = r.alloc::<f32>(cap)?;
            let mut back = r.alloc::<f32>(tokens * hidden)?;
            let (t32, h32) = (tokens as i32, hidden as i32);
            gather_rows::<R, H>::launch(
                d,
                tokens.div_ceil(R),
                (&xs, &perm_d, &mut *send, t32, h32),
            )?;

            // 1. Dispatch.
            let elems: Vec<usize> = counts.iter().map(|c| c * hidden).collect();
            let got = r.all_to_all_v(&send, &elems, &mut recv)?;
            let rows: usize = got.iter().sum::<usize>() / hidden;

            // 2. This rank's expert on every received token.
            let we = d.upload(&w[me])?;
            y.fill(f32::NAN)?;
            if rows > 0 {
                let grid = (rows.div_ceil(64), hidden.div_ceil(64));
                gemm_kernel::<f32, 64, 64, 32>::launch(
                    d,
                    grid,
                    (&*recv, &we, &mut *y, rows as i32, h32, h32),
                )?;
            }

            // 3. Combine: results go back to their sources, then into token order.
            back.fill(f32::NAN)?;
            let returned = r.all_to_all_v(&y, &got, &mut back)?;
            if returned != elems {
                return Err(tessera::Error::Comm {
                    rank: r.rank(),
                    message: format!(
                        "combine returned {returned:?} elements per expert, dispatched {elems:?}"
                    ),
                });
            }
            let mut inv = vec![0i32; tokens];
            for (j, &t) in perm.iter().enumerate() {
                inv[t] = j as i32;
            }
            let inv_d = d.upload(&inv)?;
            let mut result = d.upload(&vec![f32::NAN; tokens * hidden])?;
            gather_rows::<R, H>::launch(
                d,
                tokens.div_ceil(R),
                (&*back, &inv_d, &mut result, t32, h32),
            )?;
            Ok((counts, rows, result.download()?))
        })?;

        for (rank, (counts, rows, got)) in out.iter().enumerate() {
            let mut want = vec![0.0f64; tokens * hidden];
            let mut tol = vec![0.0f64; tokens * hidden];
            for t in 0..tokens {
                let e = route[rank][t];
                for p in 0..hidden {
                    let xv = x[rank][t * hidden + p] as f64;
                    for j in 0..hidden {
                        let prod = xv * w[e][p * hidden + j] as f64;
                        want[t * hidden + j] += prod;
                        tol[t * hidden + j] += prod.abs() * hidden as f64 * f32::EPSILON as f64;
                    }
                }
            }
            let g: Vec<f64> = got.iter().map(|&v| v as f64).collect();
            common::check(&format!("moe rank {rank}"), &g, &want, &tol)?;
            println!(
                "  rank {rank}: sent {counts:?} tokens per expert, its expert processed {rows}"
            );
        }
        Ok(())
    });
}

//! Sequence-parallel attention on a world of ranks: the sequence is sharded over the
//! ranks (each holds its slice of the queries, keys and values), and every rank
//! computes its queries' output over the whole sequence. The fused kernel
//! (`tessera::sp_attention::SpAttention`) pushes the local keys and values to the
//! peers chunk by chunk and attends to its local keys first, then to each peer's
//! as they arrive; the unfused baseline all-gathers the keys and values, then runs
//! attention. Both are checked against a plain-Rust f64 reference (causal and not,
//! f16 inputs, outputs poisoned first) and timed.
//!
//! `cargo run --release --example sp_attention -- --ranks 4 --seq 128 --heads 2`

mod common;

use tessera::bench::Bench;
use tessera::prelude::*;
use tessera::sp_attention::{self as sp, AllGatherThenAttention, SpAttention, SpShape};

const HD: usize = 64;

fn run(
    dev: &Device,
    ranks: usize,
    shape: SpShape,
    iters: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let SpShape {
        heads,
        sq,
        sk,
        causal,
    } = shape;
    let (mut rng, _) = common::rng();
    let h = |n: usize, rng: &mut _| -> Vec<f16> {
        common::uniform(rng, n, -1.0, 1.0)
            .into_iter()
            .map(f16::from_f32)
            .collect()
    };
    // Rank r's slices, `[heads][rows][HD]` each.
    let qs: Vec<Vec<f16>> = (0..ranks).map(|_| h(heads * sq * HD, &mut rng)).collect();
    let ks: Vec<Vec<f16>> = (0..ranks).map(|_| h(heads * sk * HD, &mut rng)).collect();
    let vs: Vec<Vec<f16>> = (0..ranks).map(|_| h(heads * sk * HD, &mut rng)).collect();
    let scale = 1.0 / (HD as f32).sqrt();
    let results = common::rank_world(ranks, dev).run(|r| {
        let me = r.rank() as usize;
        let d = r.device();
        let (q, k, v) = (d.upload(&qs[me])?, d.upload(&ks[me])?, d.upload(&vs[me])?);
        let mut fused = SpAttention::<f16, HD>::new(r, shape)?;
        let mut plain = AllGatherThenAttention::<f16, HD>::new(r, shape)?;
        let mut o_fused = d.upload(&vec![f16::NAN; heads * sq * HD])?;
        let mut o_plain = d.upload(&vec![f16::NAN; heads * sq * HD])?;
        fused.run(r, &q, &k, &v, &mut o_fused, scale)?;
        plain.run(r, &q, &k, &v, &mut o_plain, scale)?;
        let got = (o_fused.download()?, o_plain.download()?);
        // Fused and unfused in alternation (the first runs warmed them up); each run
        // ends with a host barrier, so that a run's time is the whole world's.
        r.barrier()?;
        let cmp = Bench::new().warmup(0).reps(iters).compare(
            d,
            || {
                fused.run(r, &q, &k, &v, &mut o_fused, scale)?;
                r.barrier()
            },
            || {
                plain.run(r, &q, &k, &v, &mut o_plain, scale)?;
                r.barrier()
            },
        )?;
        Ok((got, cmp))
    })?;
    let f64s = |v: &[f16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let k_all: Vec<f64> = ks.iter().flat_map(|k| f64s(k)).collect();
    let v_all: Vec<f64> = vs.iter().flat_map(|v| f64s(v)).collect();
    let name = format!("sp_attention{} f16", if causal { " causal" } else { "" });
    for (rank, ((fused, plain), _)) in results.iter().enumerate() {
        let want = sp::reference(
            &f64s(&qs[rank]),
            &k_all,
            &v_all,
            rank,
            ranks,
            shape,
            HD,
            scale as f64,
        );
        // P rounded to f16 before P·V, f32 sums, one output rounding.
        let tol: Vec<f64> = want.iter().map(|w| 4e-3 + w.abs() / 512.0).collect();
        common::check(
            &format!("{name} fused, rank {rank}"),
            &f64s(fused),
            &want,
            &tol,
        )?;
        common::check(
            &format!("{name} unfused, rank {rank}"),
            &f64s(plain),
            &want,
            &tol,
        )?;
        if fused
            .iter()
            .zip(plain)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(format!("{name}, rank {rank}: fused and unfused results differ").into());
        }
    }
    // Rank 0's times (every run ends with a host barrier: the world's time).
    let (_, cmp) = &results[0];
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let (fused_ms, plain_ms) = (ms(cmp.a.median()), ms(cmp.b.median()));
    println!(
        "{name}: {ranks} ranks x {heads} heads x {sq} rows, head dim {HD}: fused {fused_ms:.1} ms, unfused (all-gather, then attention) {plain_ms:.1} ms, speedup {:.2}x (medians of {iters} alternating runs, speedup = median per-pair unfused/fused)",
        1.0 / cmp.ratio
    );
    Ok(())
}

fn main() {
    common::run_main(|| {
        let v = common::parse_args(
            "sp_attention [--ranks N] [--seq ROWS_PER_RANK] [--heads H] [--iters N]",
            &[
                ("ranks", 4, 1..=64),
                ("seq", 96, 1..=1 << 14),
                ("heads", 2, 1..=64),
                ("iters", 3, 1..=1000),
            ],
        )?;
        let (ranks, seq, heads, iters) = (v[0], v[1], v[2], v[3]);
        let dev = common::comm_device();
        let (_, seed) = common::rng();
        println!("sp_attention: {ranks} ranks on {dev} (seed {seed})");
        for causal in [false, true] {
            let shape = SpShape {
                heads,
                sq: seq,
                sk: seq,
                causal,
            };
            run(&dev, ranks, shape, iters)?;
        }
        Ok(())
    });
}

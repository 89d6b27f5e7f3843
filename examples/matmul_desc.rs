//! A GEMM through tensor descriptors: `C = A · B` (f16 in, f32 out) where every
//! operand is a `&TensorDesc` and the kernel reads and writes whole blocks
//! (`a.load([m0, k0])`), with out-of-bounds elements read as zero and stores clipped
//! to the tensor, so ragged sizes need no masks. On sm_90a (and emu-sm90a) the
//! operand loads are TMA copies (`cp.async.bulk.tensor`) into the `wgmma` ring,
//! completing on one mbarrier per stage, and the C block leaves by TMA stores;
//! elsewhere they are the masked loads and stores with the same semantics. Results are checked against a plain-Rust reference.
//!
//! On a GPU it then tunes and times the product at 4096 x 4096 x 4096 over the
//! schedules sm_90a offers (warp specialization on or off, clusters of 1 or 2
//! programs with operand multicast, one program per tile or persistent; the
//! `Tuner`'s winner kept on disk), printing TFLOP/s and checking 16 rows of `C`
//! against f64; `--tune N` does the same at N x N x N on any device.
//!
//! `cargo run --release --example matmul_desc [-- --tune N]` (`TESSERA_DEVICE=emu-sm90a`
//! runs the TMA path in the emulator).

mod common;

use std::time::Instant;

use rand::Rng;
use tessera::TensorDescriptor;
use tessera::prelude::*;

/// One `BM x BN` block of `C` (`[m][n]`) per program from `A` (`[m][k]`) and `B`
/// (`[k][n]`), every operand a descriptor; `k` is `A`'s second extent.
#[kernel]
pub fn matmul_desc<const BM: usize, const BN: usize, const BK: usize>(
    a: &TensorDesc<f16, S2<BM, BK>>,
    b: &TensorDesc<f16, S2<BK, BN>>,
    c: &mut TensorDesc<f32, S2<BM, BN>>,
) {
    let m0 = program_id(0) * BM as i32;
    let n0 = program_id(1) * BN as i32;
    let mut acc = zeros::<f32, S2<BM, BN>>();
    for k0 in (0..a.extent(1)).step_by(BK) {
        acc = dot(a.load([m0, k0]), b.load([k0, n0]), acc);
    }
    c.store([m0, n0], acc);
}

/// The same product as a persistent kernel: a grid of `Grid::persistent(tiles)`
/// programs (as many as the GPU holds at once), each walking the output tiles
/// `program_id(0), + num_programs(0), ...` in grouped order (8 tile rows at a
/// time, so concurrent tiles share operands in L2). On sm_90a the loop over tiles
/// is warp-specialized as a whole: the producer warpgroup walks the same tiles and
/// issues every TMA copy, so a tile's loads overlap the previous tile's epilogue.
#[kernel]
pub fn matmul_desc_persistent<const BM: usize, const BN: usize, const BK: usize>(
    a: &TensorDesc<f16, S2<BM, BK>>,
    b: &TensorDesc<f16, S2<BK, BN>>,
    c: &mut TensorDesc<f32, S2<BM, BN>>,
) {
    let m_tiles = (c.extent(0) + (BM as i32 - 1)) / BM as i32;
    let n_tiles = (c.extent(1) + (BN as i32 - 1)) / BN as i32;
    for t in (program_id(0)..m_tiles * n_tiles).step_by(num_programs(0)) {
        let (pm, pn) = grouped_tile(t, m_tiles, n_tiles, 8);
        let (m0, n0) = (pm * BM as i32, pn * BN as i32);
        let mut acc = zeros::<f32, S2<BM, BN>>();
        for k0 in (0..a.extent(1)).step_by(BK) {
            acc = dot(a.load([m0, k0]), b.load([k0, n0]), acc);
        }
        c.store([m0, n0], acc);
    }
}

/// The same product split along K for shapes with few tiles (split-K), first
/// pass: a persistent walk over `tiles * splits` work units ([`split_k`]), each
/// the product of one tile over its part of K, stored by part into `partial`
/// (`[splits * m_pad][n]`, `m_pad` = `A`'s rows rounded up to `BM`: part `s` of
/// tile row `pm` at row `s * m_pad + pm * BM`), so `splits` times as many programs
/// share the work. On sm_90a it is warp-specialized like the persistent kernel
/// (the ring loop's trip count varies from unit to unit; an empty part stores
/// zeros). [`split_k_sum`] adds the parts.
#[kernel]
pub fn matmul_desc_split_k<const BM: usize, const BN: usize, const BK: usize>(
    a: &TensorDesc<f16, S2<BM, BK>>,
    b: &TensorDesc<f16, S2<BK, BN>>,
    partial: &mut TensorDesc<f32, S2<BM, BN>>,
    splits: i32,
) {
    let m_tiles = (a.extent(0) + (BM as i32 - 1)) / BM as i32;
    let n_tiles = (b.extent(1) + (BN as i32 - 1)) / BN as i32;
    let m_pad = m_tiles * BM as i32;
    for u in (program_id(0)..m_tiles * n_tiles * splits).step_by(num_programs(0)) {
        let (t, k_begin, k_end) = split_k(u, splits, a.extent(1), BK as i32);
        let (pm, pn) = grouped_tile(t, m_tiles, n_tiles, 8);
        let (m0, n0) = (pm * BM as i32, pn * BN as i32);
        let mut acc = zeros::<f32, S2<BM, BN>>();
        for k0 in (k_begin..k_end).step_by(BK) {
            acc = dot(a.load([m0, k0]), b.load([k0, n0]), acc);
        }
        partial.store([(u % splits) * m_pad + m0, n0], acc);
    }
}

/// Split-K, second pass: `C[i][j] = Σ_s partial[s * m_pad + i][j]` (`C` is
/// `[m][n]`), `BLOCK` elements of `C` per program, the parts added in order (the
/// result does not depend on the schedule).
#[kernel]
pub fn split_k_sum<const BLOCK: usize>(
    partial: &Global<f32>,
    c: &mut Global<f32>,
    m: i32,
    n: i32,
    m_pad: i32,
    splits: i32,
) {
    let idx = program_id(0) * BLOCK as i32 + arange::<BLOCK>();
    let mask = idx.lt(m * n);
    let (i, j) = (idx / n, idx % n);
    let mut sum = zeros::<f32, S1<BLOCK>>();
    for s in 0..splits {
        sum = sum + partial.load((s * m_pad + i) * n + j, mask);
    }
    c.store(idx, sum, mask);
}

/// `C = A · B` by split-K in `splits` parts ([`matmul_desc_split_k`], then
/// [`split_k_sum`]): `a` is `[m][k]`, `b` `[k][n]` (128x64 and 64x128 boxes), `c`
/// `[m][n]`; `partial` holds at least `splits * m.div_ceil(128) * 128 * n` floats.
pub fn split_k_matmul(
    dev: &Device,
    opts: &LaunchOptions,
    (a, b): (&TensorDescriptor<'_, f16>, &TensorDescriptor<'_, f16>),
    partial: &mut Buffer<f32>,
    c: &mut Buffer<f32>,
    (m, n, splits): (usize, usize, i32),
) -> Result<(), tessera::Error> {
    let m_pad = m.div_ceil(128) * 128;
    let tiles = (m_pad / 128 * n.div_ceil(128)) as u64;
    {
        let mut pd = TensorDescriptor::new_mut(
            partial,
            &[splits as usize * m_pad, n],
            &[n, 1],
            &[128, 128],
        )?;
        matmul_desc_split_k::<128, 128, 64>::launch_with(
            dev,
            Grid::persistent(tiles * splits as u64),
            opts,
            (a, b, &mut pd, splits),
        )?;
    }
    split_k_sum::<1024>::launch(
        dev,
        Grid::new((m * n).div_ceil(1024) as u64, 1, 1),
        (&*partial, c, m as i32, n as i32, m_pad as i32, splits),
    )
}

/// `C = A · B` in f64 (row-major `[m][k]` and `[k][n]`).
pub fn reference(a: &[f16], b: &[f16], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = f64::from(a[i * k + p].to_f32());
            for j in 0..n {
                c[i * n + j] += av * f64::from(b[p * n + j].to_f32());
            }
        }
    }
    c
}

/// A schedule the tuner tries (sm_90a's; other devices run the same product).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Config {
    warp_specialize: bool,
    /// Programs per cluster along M (1 or 2).
    cluster: u32,
    persistent: bool,
    /// Two consumer warpgroups in ping-pong (persistent, warp-specialized, no
    /// cluster): 4 warps per tile and 2 stages, so two staging boxes fit.
    ping_pong: bool,
}

/// Warp specialization on or off, clusters of 1 or 2 (when they divide the tiles
/// along M), one program per tile or persistent; and persistent ping-pong.
fn configs(m_tiles: usize) -> Vec<Config> {
    let mut v = Vec::new();
    for warp_specialize in [true, false] {
        for cluster in [1, 2] {
            if !m_tiles.is_multiple_of(cluster as usize) {
                continue;
            }
            for persistent in [false, true] {
                v.push(Config {
                    warp_specialize,
                    cluster,
                    persistent,
                    ping_pong: false,
                });
            }
        }
    }
    v.push(Config {
        warp_specialize: true,
        cluster: 1,
        persistent: true,
        ping_pong: true,
    });
    v
}

/// `C = A · B` (f16 in, f32 out, `s x s x s`) with the tuned schedule (128x128x64
/// tiles, 8 warps or two ping-pong groups of 4): tunes once per device and shape,
/// times the winner, and checks 16 rows of `C` against f64.
fn tuned(dev: &Device, s: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (mut rng, _) = common::rng();
    let a = common::uniform_f16(&mut rng, s * s, -1.0, 1.0);
    let b = common::uniform_f16(&mut rng, s * s, -1.0, 1.0);
    let (da, db) = (dev.upload(&a)?, dev.upload(&b)?);
    let mut dc = dev.upload(&vec![f32::NAN; s * s])?;
    let ad = TensorDescriptor::new(&da, &[s, s], &[s, 1], &[128, 64])?;
    let bd = TensorDescriptor::new(&db, &[s, s], &[s, 1], &[64, 128])?;
    let mut cd = TensorDescriptor::new_mut(&mut dc, &[s, s], &[s, 1], &[128, 128])?;
    let tiles = s.div_ceil(128);
    let mut launch = |c: &Config| -> Result<(), tessera::Error> {
        let opts = LaunchOptions::new()
            .warp_specialize(c.warp_specialize)
            .cluster(c.cluster, 1, 1);
        let opts = if c.ping_pong {
            opts.num_warps(4).num_stages(2).consumer_groups(2)
        } else {
            opts.num_warps(8)
        };
        if c.persistent {
            let grid = Grid::persistent((tiles * tiles) as u64);
            matmul_desc_persistent::<128, 128, 64>::launch_with(
                dev,
                grid,
                &opts,
                (&ad, &bd, &mut cd),
            )
        } else {
            matmul_desc::<128, 128, 64>::launch_with(
                dev,
                (tiles, tiles),
                &opts,
                (&ad, &bd, &mut cd),
            )
        }
    };
    let (_, time) = common::tune_and_time(
        dev,
        "matmul_desc_f16",
        configs(tiles),
        (
            &format!("matmul_desc f16 {s}x{s}x{s}"),
            &format!("{s}x{s}x{s} f16"),
        ),
        &mut launch,
    )?;
    println!(
        "matmul_desc f16 {s}x{s}x{s}: {:.3} ms, {:.1} TFLOP/s (median of 10)",
        time * 1e3,
        2.0 * (s as f64).powi(3) / time / 1e12
    );
    drop(cd);
    // 16 rows of C against f64 (f32 accumulation).
    let got = dc.download()?;
    common::check_rows(
        "matmul_desc f16",
        s,
        |i, p| a[i * s + p].to_f64(),
        |p, j| b[p * s + j].to_f64(),
        |i, j| f64::from(got[i * s + j]),
        0.0,
    )?;
    Ok(())
}

fn main() {
    common::run_main(|| {
        let tune = common::tune_args(1, "--tune N")?.map(|v| v[0]);
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        println!("matmul through tensor descriptors on {dev} (seed {seed})");
        let (m, n, k) = (300usize, 200usize, 176usize);
        let a: Vec<f16> = (0..m * k)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let b: Vec<f16> = (0..k * n)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let want = reference(&a, &b, m, n, k);
        let tol: Vec<f64> = want
            .iter()
            .map(|w| 4e-5 * k as f64 + w.abs() * 1e-3)
            .collect();
        let da = dev.upload(&a)?;
        let db = dev.upload(&b)?;
        // Poison: an element the kernel skips is caught.
        let mut dc = dev.upload(&vec![f32::NAN; m * n])?;
        let ad = TensorDescriptor::new(&da, &[m, k], &[k, 1], &[128, 64])?;
        let bd = TensorDescriptor::new(&db, &[k, n], &[n, 1], &[64, 128])?;
        let mut cd = TensorDescriptor::new_mut(&mut dc, &[m, n], &[n, 1], &[128, 128])?;
        let grid = (m.div_ceil(128), n.div_ceil(128));
        let launch = |cd: &mut TensorDescriptor<'_, f32>| {
            matmul_desc::<128, 128, 64>::launch(&dev, grid, (&ad, &bd, cd))
        };
        launch(&mut cd)?; // builds the IR
        let t = Instant::now();
        launch(&mut cd)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "matmul_desc: {m}x{n}x{k} in {:.2} ms ({:.2} GFLOP/s)",
            secs * 1e3,
            2.0 * (m * n * k) as f64 / secs / 1e9
        );
        drop(cd);
        let got: Vec<f64> = dc.download()?.into_iter().map(f64::from).collect();
        common::check("matmul_desc", &got, &want, &tol)?;
        // Persistent: a program per tile the device holds at once, tiles walked in
        // grouped order.
        let mut dc = dev.upload(&vec![f32::NAN; m * n])?;
        let mut cd = TensorDescriptor::new_mut(&mut dc, &[m, n], &[n, 1], &[128, 128])?;
        let tiles = (m.div_ceil(128) * n.div_ceil(128)) as u64;
        matmul_desc_persistent::<128, 128, 64>::launch(
            &dev,
            Grid::persistent(tiles),
            (&ad, &bd, &mut cd),
        )?;
        drop(cd);
        let got: Vec<f64> = dc.download()?.into_iter().map(f64::from).collect();
        common::check("matmul_desc_persistent", &got, &want, &tol)?;
        // Split-K: each tile's K in 3 parts, then their sum.
        let mut dc = dev.upload(&vec![f32::NAN; m * n])?;
        let splits = 3;
        let mut partial = dev.alloc::<f32>(splits * m.div_ceil(128) * 128 * n)?;
        split_k_matmul(
            &dev,
            &LaunchOptions::new(),
            (&ad, &bd),
            &mut partial,
            &mut dc,
            (m, n, splits as i32),
        )?;
        let got: Vec<f64> = dc.download()?.into_iter().map(f64::from).collect();
        common::check("matmul_desc_split_k", &got, &want, &tol)?;
        match (tune, common::is_gpu(&dev)) {
            (Some(s), _) => tuned(&dev, s)?,
            (None, true) => tuned(&dev, 4096)?,
            (None, false) => {}
        }
        Ok(())
    });
}

//! Tensor descriptors (`&TensorDesc<T, S>` parameters, `tessera::TensorDescriptor`
//! arguments): block loads with out-of-bounds zero fill and clipped block stores, on
//! the CPU (the interpreter's own `desc_load`/`desc_store`), emu-nv and emu-amd (the
//! masked loads and stores `tensor_desc::expand` makes of them) and emu-sm90a, where
//! the loads that feed a `dot` become TMA copies into the `wgmma` ring completing on
//! mbarriers (the emulator's own reading of TMA, tensor maps and mbarriers).
//! Outputs are poisoned (NaN) first, inputs random, shapes ragged; every element is
//! compared with a plain-Rust reference.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera::{EmuKind, TensorDescriptor};

fn devices() -> Vec<Device> {
    let mut v = vec![Device::cpu()];
    for k in [EmuKind::Nv, EmuKind::Amd, EmuKind::Sm90a] {
        v.push(Device::emu(k).expect("the emulator (feature jit)"));
    }
    v
}

/// `ir` specialized as a launch that built its tensor maps would run it.
fn with_tensor_maps(ir: &tessera::ir::Function) -> tessera::ir::Function {
    tessera::Specialization::for_launches(ir)
        .into_iter()
        .find(|s| matches!(s, tessera::Specialization::TensorMaps(_)))
        .expect("a specialization with tensor maps")
        .apply(ir)
}

fn rand_f32(seed: u64, n: usize) -> Vec<f32> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

/// Copies block `(i, j)` of `src`, read `shift` rows and columns up and left, plus 1,
/// to block `(i, j)` of `dst`.
#[kernel]
fn desc_copy<const BM: usize, const BN: usize>(
    src: &TensorDesc<f32, S2<BM, BN>>,
    dst: &mut TensorDesc<f32, S2<BM, BN>>,
    shift: i32,
) {
    let i = program_id(0) * BM as i32;
    let j = program_id(1) * BN as i32;
    let t = src.load([i - shift, j - shift]);
    dst.store((i, j), t + 1.0f32);
}

/// A 1-D and a 3-D copy: `dst[x] = src[x - 3] * 2` over blocks of `B`.
#[kernel]
fn desc_copy_1d<const B: usize>(src: &TensorDesc<f32, S1<B>>, dst: &mut TensorDesc<f32, S1<B>>) {
    let x = program_id(0) * B as i32;
    dst.store([x], src.load([x - 3]) * 2.0f32);
}

#[kernel]
fn desc_copy_3d<const B: usize>(
    src: &TensorDesc<f32, S3<2, B, B>>,
    dst: &mut TensorDesc<f32, S3<2, B, B>>,
) {
    let z = program_id(2) * 2;
    let y = program_id(1) * B as i32;
    let x = program_id(0) * B as i32;
    dst.store([z, y, x], src.load([z, y + 1, x - 1]));
}

#[test]
fn blocks_read_zero_outside_and_stores_are_clipped() {
    let (m, n) = (37usize, 45usize);
    // Padded rows: the row stride (48) is not the width.
    let ld = 48usize;
    let src = rand_f32(1, m * ld);
    for shift in [0i32, 5] {
        for dev in devices() {
            let s = dev.upload(&src).unwrap();
            let mut d = dev.upload(&vec![f32::NAN; m * ld]).unwrap();
            let sd = TensorDescriptor::new(&s, &[m, n], &[ld, 1], &[16, 32]).unwrap();
            let mut dd = TensorDescriptor::new_mut(&mut d, &[m, n], &[ld, 1], &[16, 32]).unwrap();
            let grid = (m.div_ceil(16) as u32, n.div_ceil(32) as u32);
            desc_copy::<16, 32>::launch(&dev, grid, (&sd, &mut dd, shift)).unwrap();
            drop(dd);
            let got = d.download().unwrap();
            for r in 0..m {
                for c in 0..ld {
                    let g = got[r * ld + c];
                    if c >= n {
                        // Outside the described tensor: never written.
                        assert!(g.is_nan(), "{dev} shift {shift}: ({r}, {c}) written: {g}");
                        continue;
                    }
                    let (sr, sc) = (r as i32 - shift, c as i32 - shift);
                    let v = if sr >= 0 && sc >= 0 {
                        src[sr as usize * ld + sc as usize]
                    } else {
                        0.0
                    };
                    assert_eq!(g, v + 1.0, "{dev} shift {shift}: ({r}, {c})");
                }
            }
        }
    }
}

#[test]
fn one_and_three_dimensional_descriptors() {
    let n = 100usize;
    let src = rand_f32(2, n);
    let (z, y, x) = (3usize, 9usize, 13usize);
    let src3 = rand_f32(3, z * y * x);
    for dev in devices() {
        let s = dev.upload(&src).unwrap();
        let mut d = dev.upload(&vec![f32::NAN; n]).unwrap();
        let sd = TensorDescriptor::new(&s, &[n], &[1], &[32]).unwrap();
        let mut dd = TensorDescriptor::new_mut(&mut d, &[n], &[1], &[32]).unwrap();
        desc_copy_1d::<32>::launch(&dev, n.div_ceil(32) as u32, (&sd, &mut dd)).unwrap();
        drop(dd);
        let got = d.download().unwrap();
        for (i, &g) in got.iter().enumerate() {
            let want = if i >= 3 { src[i - 3] * 2.0 } else { 0.0 };
            assert_eq!(g, want, "{dev}: 1-D element {i}");
        }

        let s = dev.upload(&src3).unwrap();
        let mut d = dev.upload(&vec![f32::NAN; z * y * x]).unwrap();
        let shape = [z, y, x];
        let strides = [y * x, x, 1];
        let sd = TensorDescriptor::new(&s, &shape, &strides, &[2, 8, 8]).unwrap();
        let mut dd = TensorDescriptor::new_mut(&mut d, &shape, &strides, &[2, 8, 8]).unwrap();
        let grid = (
            x.div_ceil(8) as u32,
            y.div_ceil(8) as u32,
            z.div_ceil(2) as u32,
        );
        desc_copy_3d::<8>::launch(&dev, grid, (&sd, &mut dd)).unwrap();
        drop(dd);
        let got = d.download().unwrap();
        for k in 0..z {
            for j in 0..y {
                for i in 0..x {
                    let (sj, si) = (j + 1, i as i64 - 1);
                    let want = if sj < y && si >= 0 {
                        src3[(k * y + sj) * x + si as usize]
                    } else {
                        0.0
                    };
                    assert_eq!(got[(k * y + j) * x + i], want, "{dev}: ({k}, {j}, {i})");
                }
            }
        }
    }
}

/// `C = A B` with every operand a descriptor: `A` `[m][k]`, `B` `[k][n]`, `C`
/// `[m][n]`, all row-major.
#[kernel]
fn matmul_desc<const BM: usize, const BN: usize, const BK: usize>(
    a: &TensorDesc<f16, S2<BM, BK>>,
    b: &TensorDesc<f16, S2<BK, BN>>,
    c: &mut TensorDesc<f32, S2<BM, BN>>,
    k: i32,
) {
    let m0 = program_id(0) * BM as i32;
    let n0 = program_id(1) * BN as i32;
    let mut acc = zeros::<f32, S2<BM, BN>>();
    for k0 in (0..k).step_by(BK) {
        acc = dot(a.load([m0, k0]), b.load([k0, n0]), acc);
    }
    c.store([m0, n0], acc);
}

fn check_matmul(dev: &Device, m: usize, n: usize, k: usize, seed: u64) {
    let a: Vec<f16> = rand_f32(seed, m * k)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let b: Vec<f16> = rand_f32(seed + 1, k * n)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let ab = dev.upload(&a).unwrap();
    let bb = dev.upload(&b).unwrap();
    let mut cb = dev.upload(&vec![f32::NAN; m * n]).unwrap();
    let ad = TensorDescriptor::new(&ab, &[m, k], &[k, 1], &[64, 64]).unwrap();
    // B's 64 x 128 blocks are two TMA boxes of 64 x 64 (128-byte rows).
    let bd = TensorDescriptor::new(&bb, &[k, n], &[n, 1], &[64, 128]).unwrap();
    let mut cd = TensorDescriptor::new_mut(&mut cb, &[m, n], &[n, 1], &[64, 128]).unwrap();
    let grid = (m.div_ceil(64) as u32, n.div_ceil(128) as u32);
    matmul_desc::<64, 128, 64>::launch(dev, grid, (&ad, &bd, &mut cd, k as i32)).unwrap();
    drop(cd);
    let got = cb.download().unwrap();
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p].to_f32()) * f64::from(b[p * n + j].to_f32()))
                .sum();
            let g = got[i * n + j] as f64;
            assert!(
                (g - want).abs() <= 4e-5 * k as f64 + 1e-4 * want.abs(),
                "{dev} {m}x{n}x{k}: C[{i}][{j}] = {g}, want {want}"
            );
        }
    }
}

#[test]
fn matmul_through_descriptors() {
    for dev in devices() {
        // Strides that are multiples of 16 bytes (TMA on emu-sm90a), ragged edges;
        // 10 k-steps, so every slot of the 4-slot ring is reused (mbarrier phases 0
        // and 1).
        check_matmul(&dev, 100, 136, 600, 10);
        // K not a multiple of 8: no tensor map, masked loads on every target.
        check_matmul(&dev, 70, 40, 90, 20);
    }
}

/// `C = A B` (`m x k` by `k x n`, f16 in, f32 out) on `dev` with `opts`, NaN-poisoned.
fn matmul_with(
    dev: &Device,
    opts: &LaunchOptions,
    a: &[f16],
    b: &[f16],
    (m, n, k): (usize, usize, usize),
) -> Vec<f32> {
    let ab = dev.upload(a).unwrap();
    let bb = dev.upload(b).unwrap();
    let mut cb = dev.upload(&vec![f32::NAN; m * n]).unwrap();
    let ad = TensorDescriptor::new(&ab, &[m, k], &[k, 1], &[64, 64]).unwrap();
    let bd = TensorDescriptor::new(&bb, &[k, n], &[n, 1], &[64, 128]).unwrap();
    let mut cd = TensorDescriptor::new_mut(&mut cb, &[m, n], &[n, 1], &[64, 128]).unwrap();
    let grid = (m.div_ceil(64) as u32, n.div_ceil(128) as u32);
    matmul_desc::<64, 128, 64>::launch_with(dev, grid, opts, (&ad, &bd, &mut cd, k as i32))
        .unwrap();
    drop(cd);
    cb.download().unwrap()
}

/// Warp specialization on emu-sm90a (the compiler's choice there: a producer
/// warpgroup issues the TMA copies, the consumer warps compute, slots released on
/// empty mbarriers): with 4 and 8 consumer warps it computes exactly what the same
/// kernel computes without it (the same `wgmma` steps in the same order), every
/// element written and within f16 rounding of the f64 reference, over 24 k-steps
/// (every slot of the ring refilled 5 times: both parities of both mbarriers) with
/// ragged edges. The emulator checks the slot handoffs (a copy into a slot a
/// consumer read and did not release is a race) and the named barrier.
#[test]
fn warp_specialized_matmul_matches_the_unspecialized_one() {
    let dev = Device::emu(EmuKind::Sm90a).expect("the emulator (feature jit)");
    let (m, n, k) = (130, 200, 24 * 64 - 8);
    let a: Vec<f16> = rand_f32(31, m * k).into_iter().map(f16::from_f32).collect();
    let b: Vec<f16> = rand_f32(32, k * n).into_iter().map(f16::from_f32).collect();
    for warps in [4, 8] {
        let on = LaunchOptions::new().num_warps(warps);
        let off = LaunchOptions::new().num_warps(warps).warp_specialize(false);
        let got = matmul_with(&dev, &on, &a, &b, (m, n, k));
        let base = matmul_with(&dev, &off, &a, &b, (m, n, k));
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| f64::from(a[i * k + p].to_f32()) * f64::from(b[p * n + j].to_f32()))
                    .sum();
                let g = got[i * n + j];
                assert_eq!(
                    g.to_bits(),
                    base[i * n + j].to_bits(),
                    "{warps} warps: C[{i}][{j}] = {g}, unspecialized {}",
                    base[i * n + j]
                );
                assert!(
                    (f64::from(g) - want).abs() <= 4e-5 * k as f64 + 1e-4 * want.abs(),
                    "{warps} warps: C[{i}][{j}] = {g}, want {want}"
                );
            }
        }
    }
    // The kernel was specialized: a producer warpgroup past the consumers.
    let ir = tessera::kernel_ir::<matmul_desc<64, 128, 64>>(&()).unwrap();
    let f = with_tensor_maps(&ir);
    let opts = |w| tessera::aot::CompileOptions {
        warp_specialize: w,
        ..tessera::aot::CompileOptions::warps(8)
    };
    let t = tessera::codegen::target::EMU_SM90A;
    let threads = |w| {
        tessera::aot::compile_ir(&f, t, &opts(w))
            .unwrap()
            .meta
            .num_threads
    };
    assert_eq!((threads(None), threads(Some(false))), (384, 256));
}

/// Thread-block clusters on emu-sm90a: in clusters of 2x1, 1x2 and 2x2 programs
/// the warp-specialized matmul multicasts B (the same for the programs of a
/// cluster along axis 0: its coordinates read only `program_id(1)`) and A (along
/// axis 1), each program issuing its share of the boxes into every program of its
/// group, the slots released to every block that writes them. The result is
/// bit for bit the unclustered kernel's (the same `wgmma` steps), every element
/// written, over 20 k-steps with ragged edges. The emulator runs each cluster's
/// blocks together and checks the cross-block hand-offs (a multicast into a slot a
/// peer's consumer has not released is a race; a copy into a peer whose mbarrier
/// is not initialized is an error).
#[test]
fn clustered_matmul_multicasts_and_matches() {
    let dev = Device::emu(EmuKind::Sm90a).expect("the emulator (feature jit)");
    let (m, n, k) = (250, 200, 20 * 64 - 8);
    let a: Vec<f16> = rand_f32(41, m * k).into_iter().map(f16::from_f32).collect();
    let b: Vec<f16> = rand_f32(42, k * n).into_iter().map(f16::from_f32).collect();
    let base = matmul_with(&dev, &LaunchOptions::new(), &a, &b, (m, n, k));
    for (x, y) in [(2, 1), (1, 2), (2, 2)] {
        let opts = LaunchOptions::new().cluster(x, y, 1);
        let got = matmul_with(&dev, &opts, &a, &b, (m, n, k));
        for i in 0..m {
            for j in 0..n {
                assert_eq!(
                    got[i * n + j].to_bits(),
                    base[i * n + j].to_bits(),
                    "cluster {x}x{y}: C[{i}][{j}] = {}, unclustered {}",
                    got[i * n + j],
                    base[i * n + j]
                );
            }
        }
    }
    let want = |i: usize, j: usize| -> f64 {
        (0..k)
            .map(|p| f64::from(a[i * k + p].to_f32()) * f64::from(b[p * n + j].to_f32()))
            .sum()
    };
    for (i, j) in [(0, 0), (m - 1, n - 1), (129, 77), (64, 128)] {
        let g = f64::from(base[i * n + j]);
        assert!((g - want(i, j)).abs() <= 4e-5 * k as f64 + 1e-4 * want(i, j).abs());
    }
    // On sm_90a the clustered kernel multicasts (and the unclustered one does not):
    // A and B each along their axis, the slots released across the cluster, a
    // cluster barrier after the mbarriers' initialization.
    let ir = tessera::kernel_ir::<matmul_desc<64, 128, 64>>(&()).unwrap();
    let f = with_tensor_maps(&ir);
    let ptx = |cluster| {
        let opts = tessera::aot::CompileOptions {
            cluster,
            ..tessera::aot::CompileOptions::warps(8)
        };
        tessera::aot::compile_ir(&f, tessera::codegen::Target::SM90A, &opts)
            .unwrap()
            .asm
    };
    let count = |s: &str, what: &str| s.matches(what).count();
    let (one, four) = (ptx([1, 1, 1]), ptx([2, 2, 1]));
    for what in [
        ".multicast::cluster",
        "mapa.shared::cluster",
        "barrier.cluster.arrive",
    ] {
        assert_eq!(count(&one, what), 0, "{what} without clusters");
        assert!(
            count(&four, what) > 0,
            "no {what} in a 2x2 cluster:\n{four}"
        );
    }
    // A grid the cluster does not divide (4 x 2 programs) and a cluster past 8
    // programs are refused, naming the option.
    let ab = dev.upload(&a).unwrap();
    let bb = dev.upload(&b).unwrap();
    let mut cb = dev.upload(&vec![0f32; m * n]).unwrap();
    let ad = TensorDescriptor::new(&ab, &[m, k], &[k, 1], &[64, 64]).unwrap();
    let bd = TensorDescriptor::new(&bb, &[k, n], &[n, 1], &[64, 128]).unwrap();
    let mut cd = TensorDescriptor::new_mut(&mut cb, &[m, n], &[n, 1], &[64, 128]).unwrap();
    for (opts, what) in [
        (
            LaunchOptions::new().cluster(1, 4, 1),
            "not a multiple of the cluster's 4",
        ),
        (LaunchOptions::new().cluster(4, 4, 1), "at most 8 programs"),
    ] {
        let e = matmul_desc::<64, 128, 64>::launch_with(
            &dev,
            (4u32, 2u32),
            &opts,
            (&ad, &bd, &mut cd, k as i32),
        )
        .expect_err(what)
        .to_string();
        assert!(e.contains(what), "{e}");
    }
}

/// The threads of `f`'s block on emu-sm90a with 4 warps, warp specialization `w`
/// and `g` consumer groups (the compiler's choice for `None`).
fn sm90a_threads(f: &tessera::ir::Function, w: Option<bool>, g: Option<u32>) -> u32 {
    let opts = tessera::aot::CompileOptions {
        warp_specialize: w,
        consumer_groups: g,
        ..tessera::aot::CompileOptions::warps(4)
    };
    tessera::aot::compile_ir(f, tessera::codegen::target::EMU_SM90A, &opts)
        .unwrap()
        .meta
        .num_threads
}

/// `C = A B` as a persistent kernel: each program walks the output tiles
/// `program_id(0), + num_programs(0), ...` in grouped order (8 rows of tiles at a
/// time), computing each.
#[kernel]
fn matmul_persistent<const BM: usize, const BN: usize, const BK: usize>(
    a: &TensorDesc<f16, S2<BM, BK>>,
    b: &TensorDesc<f16, S2<BK, BN>>,
    c: &mut TensorDesc<f32, S2<BM, BN>>,
    k: i32,
) {
    let m_tiles = (c.extent(0) + (BM as i32 - 1)) / BM as i32;
    let n_tiles = (c.extent(1) + (BN as i32 - 1)) / BN as i32;
    for t in (program_id(0)..m_tiles * n_tiles).step_by(num_programs(0)) {
        let (pm, pn) = grouped_tile(t, m_tiles, n_tiles, 8);
        let (m0, n0) = (pm * BM as i32, pn * BN as i32);
        let mut acc = zeros::<f32, S2<BM, BN>>();
        for k0 in (0..k).step_by(BK) {
            acc = dot(a.load([m0, k0]), b.load([k0, n0]), acc);
        }
        c.store([m0, n0], acc);
    }
}

/// The persistent matmul on every device (grids smaller than the tile count, so
/// each program computes several tiles, in grouped order; and `Grid::persistent`),
/// equal to the f64 reference, every element written. On emu-sm90a it is
/// warp-specialized across the tiles: the producer walks the same tiles issuing
/// every fill, the ring's position carried from tile to tile (both parities of
/// every slot over a program's tiles), so a tile's loads overlap the previous
/// tile's epilogue; and, as the compiler's choice, with two consumer groups in
/// ping-pong (alternate tiles, each skipping the other's fills, main loops taking
/// turns), or with one (`consumer_groups(1)`). The grids give programs no tile,
/// one, an odd and an even number of them.
#[test]
fn persistent_matmul_walks_every_tile() {
    // Warp-specialized with the loop over tiles around the ring (a producer
    // warpgroup past two groups of 4 consumer warps), as the compiler's choice.
    let ir = tessera::kernel_ir::<matmul_persistent<64, 128, 64>>(&()).unwrap();
    let f = with_tensor_maps(&ir);
    let threads = |w, g| sm90a_threads(&f, w, g);
    assert_eq!(
        (
            threads(None, None),
            threads(None, Some(2)),
            threads(None, Some(1)),
            threads(Some(false), None)
        ),
        (384, 384, 256, 128)
    );
    let (m, n, k) = (330, 296, 200);
    let a: Vec<f16> = rand_f32(51, m * k).into_iter().map(f16::from_f32).collect();
    let b: Vec<f16> = rand_f32(52, k * n).into_iter().map(f16::from_f32).collect();
    for dev in devices() {
        let tiles = (m.div_ceil(64) * n.div_ceil(128)) as u64;
        // (In clusters of 2 too: no operand is multicast, as the tiles of a
        // cluster's programs differ, but they run as a cluster.)
        let pair = LaunchOptions::new().cluster(2, 1, 1);
        let one = LaunchOptions::new().consumer_groups(1);
        for (grid, opts) in [
            (Grid::new(1, 1, 1), LaunchOptions::new()),
            (Grid::new(5, 1, 1), LaunchOptions::new()),
            (Grid::new(7, 1, 1), LaunchOptions::new()),
            (Grid::new(64, 1, 1), LaunchOptions::new()),
            (Grid::persistent(tiles), LaunchOptions::new()),
            (Grid::new(1, 1, 1), one.clone()),
            (Grid::new(5, 1, 1), one.clone()),
            (Grid::persistent(tiles), one.clone()),
            (Grid::new(6, 1, 1), pair.clone()),
            (Grid::persistent(tiles), pair.clone()),
        ] {
            let ab = dev.upload(&a).unwrap();
            let bb = dev.upload(&b).unwrap();
            let mut cb = dev.upload(&vec![f32::NAN; m * n]).unwrap();
            let ad = TensorDescriptor::new(&ab, &[m, k], &[k, 1], &[64, 64]).unwrap();
            let bd = TensorDescriptor::new(&bb, &[k, n], &[n, 1], &[64, 128]).unwrap();
            let mut cd = TensorDescriptor::new_mut(&mut cb, &[m, n], &[n, 1], &[64, 128]).unwrap();
            matmul_persistent::<64, 128, 64>::launch_with(
                &dev,
                grid,
                &opts,
                (&ad, &bd, &mut cd, k as i32),
            )
            .unwrap();
            drop(cd);
            let got = cb.download().unwrap();
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|p| {
                            f64::from(a[i * k + p].to_f32()) * f64::from(b[p * n + j].to_f32())
                        })
                        .sum();
                    let g = got[i * n + j] as f64;
                    assert!(
                        (g - want).abs() <= 4e-5 * k as f64 + 1e-4 * want.abs(),
                        "{dev}, {grid:?}, {:?}, {:?} groups: C[{i}][{j}] = {g}, want {want}",
                        opts.cluster,
                        opts.consumer_groups
                    );
                }
            }
        }
    }
}

#[path = "../../examples/matmul_desc.rs"]
#[allow(dead_code)]
mod ex_matmul_desc;

/// Split-K (`examples/matmul_desc.rs`: `matmul_desc_split_k`, a persistent walk
/// over `tiles * splits` units, each a tile's product over its part of K stored by
/// part, then `split_k_sum`) on every device equals the f64 reference, every
/// element of the partial products and of C written (both poisoned): one part,
/// parts of 3 and 2 blocks, more parts than K blocks (empty parts), over grids of
/// fewer programs than units and `Grid::persistent`. On emu-sm90a it is
/// warp-specialized with two ping-pong consumer groups (the compiler's choice: the
/// ring loop's trip count differs from unit to unit, and each group skips the
/// other's fills by it), and with one.
#[test]
fn split_k_matmul_adds_every_part() {
    let ir = tessera::kernel_ir::<ex_matmul_desc::matmul_desc_split_k<64, 128, 64>>(&()).unwrap();
    let f = with_tensor_maps(&ir);
    let threads = |g| sm90a_threads(&f, None, g);
    assert_eq!((threads(None), threads(Some(1))), (384, 256));
    // 9 blocks of K (the last one partial).
    let (m, n, k) = (150usize, 200usize, 520usize);
    let m_pad = m.div_ceil(64) * 64;
    let a: Vec<f16> = rand_f32(61, m * k).into_iter().map(f16::from_f32).collect();
    let b: Vec<f16> = rand_f32(62, k * n).into_iter().map(f16::from_f32).collect();
    let want: Vec<f64> = (0..m * n)
        .map(|ij| {
            let (i, j) = (ij / n, ij % n);
            (0..k)
                .map(|p| f64::from(a[i * k + p].to_f32()) * f64::from(b[p * n + j].to_f32()))
                .sum()
        })
        .collect();
    let tiles = (m.div_ceil(64) * n.div_ceil(128)) as u64;
    let one = LaunchOptions::new().consumer_groups(1);
    for dev in devices() {
        for (splits, grid, opts) in [
            (1, Grid::new(4, 1, 1), LaunchOptions::new()),
            (3, Grid::persistent(tiles * 3), LaunchOptions::new()),
            (5, Grid::new(7, 1, 1), LaunchOptions::new()),
            (12, Grid::new(5, 1, 1), LaunchOptions::new()),
            (3, Grid::new(5, 1, 1), one.clone()),
        ] {
            let ab = dev.upload(&a).unwrap();
            let bb = dev.upload(&b).unwrap();
            let rows = splits as usize * m_pad;
            let mut pb = dev.upload(&vec![f32::NAN; rows * n]).unwrap();
            let mut cb = dev.upload(&vec![f32::NAN; m * n]).unwrap();
            let ad = TensorDescriptor::new(&ab, &[m, k], &[k, 1], &[64, 64]).unwrap();
            let bd = TensorDescriptor::new(&bb, &[k, n], &[n, 1], &[64, 128]).unwrap();
            let mut pd =
                TensorDescriptor::new_mut(&mut pb, &[rows, n], &[n, 1], &[64, 128]).unwrap();
            ex_matmul_desc::matmul_desc_split_k::<64, 128, 64>::launch_with(
                &dev,
                grid,
                &opts,
                (&ad, &bd, &mut pd, splits),
            )
            .unwrap();
            drop(pd);
            let what = format!(
                "{dev}, {splits} parts, {grid:?}, {:?} groups",
                opts.consumer_groups
            );
            let parts = pb.download().unwrap();
            assert!(
                parts.iter().all(|v| !v.is_nan()),
                "{what}: a partial element unwritten"
            );
            ex_matmul_desc::split_k_sum::<256>::launch(
                &dev,
                Grid::new((m * n).div_ceil(256) as u64, 1, 1),
                (&pb, &mut cb, m as i32, n as i32, m_pad as i32, splits),
            )
            .unwrap();
            let got = cb.download().unwrap();
            for (ij, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 4e-5 * k as f64 + 1e-4 * w.abs(),
                    "{what}: C[{}][{}] = {g}, want {w}",
                    ij / n,
                    ij % n
                );
            }
        }
    }
}

#[test]
fn descriptors_that_do_not_describe_their_buffer_are_refused() {
    let dev = Device::cpu();
    let s = dev.upload(&vec![0.0f32; 100]).unwrap();
    let bad = |r: Result<TensorDescriptor<'_, f32>, Error>, what: &str| {
        let e = r.expect_err(what).to_string();
        assert!(e.contains("invalid tensor descriptor"), "{what}: {e}");
        e
    };
    let e = bad(
        TensorDescriptor::new(&s, &[10, 11], &[11, 1], &[8, 8]),
        "past the end",
    );
    assert!(e.contains("past the buffer"), "{e}");
    let e = bad(
        TensorDescriptor::new(&s, &[10, 10], &[1, 10], &[8, 8]),
        "column-major",
    );
    assert!(e.contains("innermost stride must be 1"), "{e}");
    bad(
        TensorDescriptor::new(&s, &[10, 10], &[10, 1], &[8, 6]),
        "block not pow2",
    );
    bad(
        TensorDescriptor::new(&s, &[10], &[1, 1], &[8]),
        "rank mismatch",
    );
    bad(
        TensorDescriptor::new(&s, &[0, 10], &[10, 1], &[8, 8]),
        "empty",
    );
    // The block must be the kernel's; a store needs `new_mut`.
    let mut d = dev.upload(&vec![0.0f32; 100]).unwrap();
    let sd = TensorDescriptor::new(&s, &[10, 10], &[10, 1], &[8, 8]).unwrap();
    let mut dd = TensorDescriptor::new_mut(&mut d, &[10, 10], &[10, 1], &[16, 32]).unwrap();
    let e = desc_copy::<16, 32>::launch(&dev, (1u32, 1u32), (&sd, &mut dd, 0)).unwrap_err();
    assert!(e.to_string().contains("blocks of [8, 8]"), "{e}");
    let s2 = dev.upload(&vec![0.0f32; 100]).unwrap();
    let sd = TensorDescriptor::new(&s2, &[10, 10], &[10, 1], &[16, 32]).unwrap();
    let mut ro = TensorDescriptor::new(&s, &[10, 10], &[10, 1], &[16, 32]).unwrap();
    let e = desc_copy::<16, 32>::launch(&dev, (1u32, 1u32), (&sd, &mut ro, 0)).unwrap_err();
    assert!(e.to_string().contains("new_mut"), "{e}");
}

/// Precompiled kernels with descriptors: the specializations a launch can look up
/// include each one with its tensor maps built (what an sm_90a launch asks for when
/// the driver encoded them), which marks exactly the `_tmap` parameters.
#[test]
fn artifacts_cover_launches_with_and_without_tensor_maps() {
    use tessera::Specialization;
    let ir = tessera::kernel_ir::<matmul_desc<64, 128, 64>>(&()).unwrap();
    let specs = Specialization::for_launches(&ir);
    let maps: Vec<_> = specs
        .iter()
        .filter(|s| matches!(s, Specialization::TensorMaps(_)))
        .collect();
    assert!(
        !maps.is_empty() && maps.len() * 2 == specs.len(),
        "{specs:?}"
    );
    let f = maps[0].apply(&ir);
    for p in &f.params {
        assert_eq!(p.attrs.tensor_map, p.name.ends_with("_tmap"), "{}", p.name);
    }
    // Without maps nothing is marked.
    let f = specs[0].apply(&ir);
    assert!(f.params.iter().all(|p| !p.attrs.tensor_map));
}

/// The emulator takes a tensor-map argument as the id of a map the launch
/// registered: a kernel specialized for TMA launched directly with a made-up id gets
/// an error naming the op, not a read of arbitrary memory.
#[test]
fn the_emulator_refuses_tensor_maps_it_did_not_build() {
    use std::sync::Arc;
    use tessera::codegen::emu;
    use tessera::codegen::target::EmuFlavor;
    use tessera::ir::ParamFacts;
    use tessera::ir::interp::{HostBuffer, KernelArg, Scalar};
    let func = tessera::kernel_ir::<desc_copy<16, 32>>(&()).unwrap();
    let facts: Vec<ParamFacts> = func
        .params
        .iter()
        .map(|p| {
            let mut f = ParamFacts::new(true, true);
            f.tensor_map = p.name.ends_with("_tmap");
            f
        })
        .collect();
    let spec = tessera::ir::passes::specialize(&func, &facts);
    let buf = || KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&vec![0.0f32; 32 * 32])));
    let sc = |v: i32| KernelArg::Scalar(Scalar::I32(v));
    let args = [
        buf(),
        KernelArg::Scalar(Scalar::U64(0)),
        sc(32),
        sc(32),
        sc(32),
        buf(),
        KernelArg::Scalar(Scalar::U64(0xdead_0000)),
        sc(32),
        sc(32),
        sc(32),
        sc(0),
    ];
    let e = emu::launch(
        &spec,
        EmuFlavor::Sm90a,
        &tessera::codegen::CompileOptions::default(),
        [2, 1, 1],
        &args,
    )
    .unwrap_err()
    .to_string();
    // The load (a TMA copy into a staging box on sm_90a) meets its made-up map first.
    assert!(
        e.contains("did not build") && e.contains("desc_load") && e.contains("0x0"),
        "{e}"
    );
}

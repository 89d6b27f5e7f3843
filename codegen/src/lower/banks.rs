//! Bank-conflict model for the shared arrays of `dot` operands (test only).
//!
//! The model is written from the vendors' documentation, not from the lowering: shared
//! memory (NVIDIA) and LDS (AMD CDNA) have 32 banks of 4 bytes. A warp's access of `w`
//! bytes per lane is served 128 bytes at a time, by groups of `128 / w` consecutive
//! lanes; a group takes one pass unless two of its lanes touch the same bank at
//! different 4-byte words (lanes on the same word share it). `ldmatrix` reads each of
//! its 8x8 matrices (8 rows of 16 bytes, row addresses from 8 lanes) in one pass when
//! the rows hit distinct banks (PTX ISA, `ldmatrix`). The MFMA operand fragments are
//! the CDNA3 ISA's: for `v_mfma_f32_32x32x8_f16` lane `l` holds `A[l % 32][4 * (l /
//! 32) ..][..4]` and `B[4 * (l / 32) ..][l % 32]`; for `16x16x16`, `A[l % 16][4 * (l /
//! 16) ..]` and likewise for B. Where the lowering pairs two k-steps
//! ([`paired_reads`]: it permutes `k` inside the pair, alike for A and B), lane `l`
//! reads `A[l % rows][8 * (l / rows) ..][..8]` of the pair's columns, 16 bytes.
//!
//! What comes from the lowering: the array layouts ([`Swizzle`], through
//! [`operand_swizzles`]), the register layouts the operand loads produce (16-byte
//! blocked; [`bt_load_layout`] for a transposed B), and the width of the staging
//! stores (one swizzle unit at most, as `write_tile` is given).

use super::arch::for_target;
use super::dot::{Swizzle, bt_load_layout, operand_swizzles, paired_reads};
use crate::layout::{Layout, coords};
use crate::target::Target;
use tessera_ir::ScalarType;

/// The passes (1 = conflict-free) a warp access takes, given each lane's byte address
/// (`None`: the lane does not take part) and the bytes each lane accesses.
fn passes(addrs: &[Option<u32>], bytes: u32) -> u32 {
    let group = (128 / bytes).max(1) as usize;
    let mut worst = 1;
    for g in addrs.chunks(group) {
        let mut words: Vec<Vec<u32>> = vec![Vec::new(); 32];
        for a in g.iter().flatten() {
            for w in 0..bytes.div_ceil(4) {
                let word = a / 4 + w;
                let bank = &mut words[(word % 32) as usize];
                if !bank.contains(&word) {
                    bank.push(word);
                }
            }
        }
        worst = worst.max(words.iter().map(|w| w.len() as u32).max().unwrap_or(1));
    }
    worst
}

/// A target's matrix instruction for a tile, whether its fragments are read with
/// `ldmatrix`, and the operand arrays.
struct Case {
    target: Target,
    ws: u32,
    nw: u32,
    m: u32,
    n: u32,
    k: u32,
    ldm: bool,
    paired: bool,
    inst: (u32, u32, u32),
    a: Swizzle,
    b: Swizzle,
}

fn case(target: &str, m: u32, n: u32, k: u32, nw: u32) -> Case {
    let target: Target = target.parse().expect("a target");
    let arch = for_target(target);
    let info = arch
        .mma_for(ScalarType::F16, m, n, k, nw)
        .expect("a matrix instruction");
    let ldm = arch.has_ldmatrix() && (info.m, info.n, info.k) == (16, 8, 16);
    let (a, b) = operand_swizzles(&info, ldm, (n, k), 2, (target.warp_size(), nw));
    Case {
        target,
        ws: target.warp_size(),
        nw,
        m,
        n,
        k,
        ldm,
        paired: paired_reads(&info, ldm, k, 2),
        inst: (info.m, info.n, info.k),
        a,
        b,
    }
}

/// The worst passes of the staging stores of a `[rows][cols]` register tile `lay`
/// into `swz` (transposed: element `(r, c)` goes to `swz(c, r)`), each store writing
/// `run` consecutive elements of the array.
fn store_passes(
    lay: &Layout,
    swz: &dyn Fn(u32, u32) -> u32,
    transposed: bool,
    run: u32,
    ws: u32,
    nw: u32,
) -> u32 {
    // Registers that start a run: the run's elements are held by consecutive register
    // bits, found the way `write_tile` does (the register whose basis is the step).
    let step = if transposed { lay.shape[1] } else { 1 };
    let run_bits: Vec<usize> = (0..run.trailing_zeros())
        .map_while(|i| lay.reg.iter().position(|&b| b == step << i))
        .collect();
    let run = 1 << run_bits.len();
    let mut worst = 1;
    for r in 0..lay.num_regs() as u32 {
        if run_bits.iter().any(|&b| r >> b & 1 == 1) {
            continue;
        }
        for w in 0..nw {
            let addrs: Vec<Option<u32>> = (0..ws)
                .map(|t| {
                    let c = coords(&lay.shape, lay.elem_index(r, t, w));
                    let (row, col) = if transposed {
                        (c[1], c[0])
                    } else {
                        (c[0], c[1])
                    };
                    Some(swz(row, col) * 2)
                })
                .collect();
            worst = worst.max(passes(&addrs, run * 2));
        }
    }
    worst
}

/// The worst passes of the fragment reads of `swz` (rows `outer`, k along the row).
fn read_passes(c: &Case, swz: &dyn Fn(u32, u32) -> u32, cols: u32, outer: u32) -> u32 {
    let mut worst = 1;
    if c.ldm {
        // Every 8x8 matrix: 8 consecutive rows (8-aligned) of one 16-byte unit.
        for r0 in (0..outer).step_by(8) {
            for col in (0..cols).step_by(8) {
                let addrs: Vec<Option<u32>> = (0..8).map(|i| Some(swz(r0 + i, col) * 2)).collect();
                worst = worst.max(passes(&addrs, 16));
            }
        }
        return worst;
    }
    // MFMA: lane l reads 4 consecutive k at row (l % rows) of the tile at k 4 * (l / rows)
    // (8 at 8 * (l / rows) of a pair of steps).
    let rows = c.inst.0;
    let (len, step) = if c.paired {
        (8, 2 * c.inst.2)
    } else {
        (4, c.inst.2)
    };
    for r0 in (0..outer).step_by(rows as usize) {
        for k0 in (0..cols).step_by(step as usize) {
            let addrs: Vec<Option<u32>> = (0..c.ws)
                .map(|l| Some(swz(r0 + l % rows, k0 + len * (l / rows)) * 2))
                .collect();
            worst = worst.max(passes(&addrs, 2 * len));
        }
    }
    worst
}

/// The passes of the A and B fragment reads and of the A and B staging stores, for the
/// arrays `a` and `b` (offset of `(row, col)`).
fn all_passes(
    c: &Case,
    a: &dyn Fn(u32, u32) -> u32,
    b: &dyn Fn(u32, u32) -> u32,
) -> ((u32, u32), (u32, u32)) {
    let (ws, nw, m, n, k) = (c.ws, c.nw, c.m, c.n, c.k);
    // B: `[k][n]` read by `ldmatrix.trans` (rows are k), else `[n][k]`.
    let (b_rows, b_cols) = if c.ldm { (k, n) } else { (n, k) };
    let reads = (read_passes(c, a, k, m), read_passes(c, b, b_cols, b_rows));
    // A: 16-byte blocked loads, stored a swizzle unit (at most 16 bytes) at a time.
    let a_lay = Layout::blocked(&[m, k], 8, ws, nw);
    let sa = store_passes(&a_lay, a, false, c.a.vec.min(8), ws, nw);
    let sb = if c.ldm {
        let b_lay = Layout::blocked(&[k, n], 8, ws, nw);
        store_passes(&b_lay, b, false, c.b.vec.min(8), ws, nw)
    } else {
        store_passes(
            &bt_load_layout(&[k, n], 8, ws, nw, c.b.vec),
            b,
            true,
            2,
            ws,
            nw,
        )
    };
    (reads, (sa, sb))
}

/// The swizzled arrays' passes.
fn swizzled_passes(c: &Case) -> ((u32, u32), (u32, u32)) {
    all_passes(c, &|r, col| c.a.offset(r, col), &|r, col| {
        c.b.offset(r, col)
    })
}

/// Both arrays are bijections onto their elements.
fn assert_bijective(c: &Case) {
    let (b_rows, b_cols) = if c.ldm { (c.k, c.n) } else { (c.n, c.k) };
    for (swz, rows, cols) in [(&c.a, c.m, c.k), (&c.b, b_rows, b_cols)] {
        assert_eq!(swz.cols, cols);
        let mut seen = vec![false; (rows * cols) as usize];
        for r in 0..rows {
            for col in 0..cols {
                let o = swz.offset(r, col) as usize;
                assert!(o < seen.len() && !seen[o], "{:?}: ({r}, {col})", c.target);
                seen[o] = true;
            }
        }
    }
}

/// The configurations the vs-Triton loop table measures, on every target.
#[test]
fn the_benchmarked_matmul_tiles_are_conflict_free() {
    for t in ["sm_80", "sm_90", "gfx90a", "gfx942"] {
        for (m, n, k, nw) in [(128, 128, 32, 4), (128, 128, 64, 8)] {
            let c = case(t, m, n, k, nw);
            assert_bijective(&c);
            assert_eq!(
                swizzled_passes(&c),
                ((1, 1), (1, 1)),
                "{t} {m}x{n}x{k}: passes of (A, B) reads, (A, B) stores"
            );
        }
    }
}

/// Every tile the matrix path takes, on every target with one: the arrays are
/// bijections, every fragment read is conflict-free, and so is every staging store
/// except one known case, at most 2-way, on AMD: a transposed B whose threads hold no
/// `k` pair (small tiles: 16-bit stores, 64 lanes to a 128-byte group).
#[test]
fn every_matrix_tile_is_conflict_free() {
    let mut bad = Vec::new();
    let (mut known, mut total) = (0, 0);
    for t in ["sm_80", "sm_90", "gfx90a", "gfx942"] {
        let target: Target = t.parse().expect("a target");
        for m in [16, 32, 64, 128, 256] {
            for n in [16, 32, 64, 128, 256] {
                for k in [16, 32, 64, 128] {
                    for nw in [1, 2, 4, 8] {
                        let arch = for_target(target);
                        let Some(info) = arch.mma_for(ScalarType::F16, m, n, k, nw) else {
                            continue;
                        };
                        if m % info.m != 0 || n % info.n != 0 || k % info.k != 0 {
                            continue;
                        }
                        let c = case(t, m, n, k, nw);
                        assert_bijective(&c);
                        let (reads, (sa, sb)) = swizzled_passes(&c);
                        let amd = !c.ldm;
                        let a_ok = sa == 1;
                        let bt = bt_load_layout(&[k, n], 8, c.ws, c.nw, c.b.vec);
                        let b_ok = sb == 1 || (amd && !bt.reg.contains(&n) && sb == 2);
                        known += usize::from(sa != 1 || sb != 1);
                        total += 1;
                        if reads != (1, 1) || !a_ok || !b_ok {
                            bad.push(format!(
                                "{t} {m}x{n}x{k} w{nw}: reads {reads:?} stores {:?}",
                                (sa, sb)
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} cases:\n{}", bad.len(), bad.join("\n"));
    assert!(total > 1000, "{total} tiles");
    eprintln!("{known} of {total} tiles have 2-way staging stores");
}

/// The arrays before the swizzle (every row padded by 8 elements) conflict where the
/// swizzled ones do not: what the swizzle buys, on the benchmarked tiles.
#[test]
fn padded_rows_conflicted() {
    let padded = |cols: u32| move |r: u32, col: u32| r * (cols + 8) + col;
    let mut seen = Vec::new();
    for (t, m, n, k, nw) in [
        ("sm_80", 128, 128, 32, 4),
        ("gfx942", 128, 128, 32, 4),
        ("gfx942", 128, 128, 64, 8),
    ] {
        let c = case(t, m, n, k, nw);
        let b_cols = if c.ldm { n } else { k };
        let p = all_passes(&c, &padded(k), &padded(b_cols));
        seen.push(format!("{t} {m}x{n}x{k}: {p:?}"));
        assert_ne!(p, ((1, 1), (1, 1)), "{t} {m}x{n}x{k}");
    }
    eprintln!("padded (reads A, B) (stores A, B): {seen:?}");
}
#[test]
fn the_model_sees_conflicts() {
    // Unswizzled 64-byte rows: the 8 rows of an ldmatrix matrix share 2 bank groups.
    let plain = Swizzle {
        cols: 32,
        vec: 8,
        per_phase: 1,
        max_phase: 1,
        mix: None,
    };
    let addrs: Vec<Option<u32>> = (0..8).map(|i| Some(plain.offset(i, 0) * 2)).collect();
    assert_eq!(passes(&addrs, 16), 4);
    // Lanes on one word share it; lanes on one bank at other words do not.
    assert_eq!(passes(&[Some(0), Some(0), Some(2)], 4), 1);
    assert_eq!(passes(&[Some(0), Some(128)], 4), 2);
    assert_eq!(passes(&[Some(0), Some(128), None], 4), 2);
}

/// The swizzle the lowering emits computes [`Swizzle::offset`], the function the bank
/// model checks (the builder folds constant operands, so each offset is a constant).
#[test]
fn the_emitted_swizzle_is_the_modelled_one() {
    let ctx = inkwell::context::Context::create();
    let cx = super::Cx {
        ctx: &ctx,
        module: ctx.create_module("swizzle"),
        b: ctx.create_builder(),
        host: false,
    };
    let f = cx
        .module
        .add_function("f", ctx.void_type().fn_type(&[], false), None);
    cx.b.position_at_end(ctx.append_basic_block(f, "entry"));
    for &(t, m, n, k, nw) in &[
        ("sm_80", 128, 128, 32, 4),
        ("gfx942", 128, 128, 32, 4),
        ("gfx942", 64, 64, 64, 8),
    ] {
        let c = case(t, m, n, k, nw);
        let b_rows = if c.ldm { k } else { n };
        for (swz, rows) in [(&c.a, m), (&c.b, b_rows)] {
            for r in 0..rows {
                for col in 0..swz.cols {
                    let v = swz
                        .emit(&cx, cx.i32(r as i64), cx.i32(col as i64))
                        .expect("emit");
                    assert_eq!(
                        v.get_zero_extended_constant(),
                        Some(swz.offset(r, col) as u64),
                        "{t} {swz:?} ({r}, {col})"
                    );
                }
            }
        }
    }
}

/// A conversion through shared memory (a 16x32 f32 transpose on 4 warps of 32): the
/// plain row-major scratch takes 4 passes per warp store and per load, the swizzle
/// [`super::convert::conversion_swizzle`] picks 1 and 2; and the swizzle is a
/// bijection.
#[test]
fn conversion_scratch_is_swizzled_conflict_free() {
    use super::convert::{conversion_swizzle, swizzled};
    use crate::layout::permute_bit_images;
    let from = Layout::blocked(&[16, 32], 4, 32, 4);
    let d = Layout::blocked(&[32, 16], 4, 32, 4);
    let to = d.compose_bits(&[16, 32], &permute_bit_images(&[16, 32], &[1, 0]));
    let sw = conversion_swizzle(&from, &to, 4, 32);
    assert!(sw.is_some());
    let warp_passes = |lay: &Layout, sw| {
        (0..lay.num_regs() as u32)
            .map(|r| {
                let addrs: Vec<Option<u32>> = (0..32)
                    .map(|t| Some(swizzled(lay.elem_index(r, t, 0), sw) * 4))
                    .collect();
                passes(&addrs, 4)
            })
            .max()
            .unwrap_or(1)
    };
    let plain = (warp_passes(&from, None), warp_passes(&to, None));
    let swz = (warp_passes(&from, sw), warp_passes(&to, sw));
    assert!(plain.0.max(plain.1) > 1, "{plain:?}");
    // One XOR slice cannot make both conflict-free here: the stores become 1 pass
    // and the loads 2 (from 4 and 4).
    assert_eq!(swz, (1, 2), "plain {plain:?}, swizzle {sw:?}");
    let mut seen = [false; 512];
    for i in 0..512 {
        let o = swizzled(i, sw) as usize;
        assert!(!seen[o]);
        seen[o] = true;
    }
}

//! The shared-memory arrays of a `dot`'s operands, shared by every strategy: the
//! XOR swizzles ([`Swizzle`]) that keep fragment reads and staging stores free of
//! bank conflicts (checked independently by `banks.rs`), the stores that write a
//! tile into them, and where they live: scratch for a `dot` on its own, or the
//! arrays (or ring slot) that the [plan](super::super::plan) gave a `dot` in a loop.

use std::collections::HashMap;

use inkwell::types::BasicTypeEnum;
use inkwell::values::IntValue;
use tessera_ir::ir::Op;

use super::{Plan, b_nk, b_transposed, bt_load_layout};
use crate::layout::Layout;
use crate::lower::arch::{FragInfo, MmaInfo};
use crate::lower::{LResult, Lowerer, Tile};

/// An XOR-swizzled row-major shared-memory array `[rows][cols]` of one `dot` operand.
///
/// A row is cut into units of `vec` consecutive elements (the width one lane reads or
/// writes at once); unit `u` of row `r` is stored at unit `u ^ phase(r)` with
/// `phase(r) = (r / per_phase) % max_phase`. The phases are chosen so that the rows an
/// access touches at the same column (8 rows of 16 bytes for `ldmatrix`, 16 rows of 8
/// bytes for MFMA fragments: 128 bytes, all 32 banks) land in distinct banks, with no
/// padding: `per_phase` rows share a 128-byte line, and `max_phase` phases cycle
/// through the line's units. Units never cross rows, and a unit's elements stay
/// consecutive, so a store or load of at most `vec` aligned elements stays one access.
///
/// A transposed B is written by stores whose lanes step 8 rows apart (each lane holds
/// 8 consecutive `n`), and the rows of a line all sit at the same phase; for it
/// [`Self::mixed`] XORs a second, higher slice of the row bits into the unit index
/// within the 128-byte line, which spreads those stores over all the banks while the
/// fragment reads stay conflict-free. Every term takes row bits above the bits it
/// flips, so the map stays a bijection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Swizzle {
    /// Elements per row.
    pub cols: u32,
    /// Elements per unit.
    pub vec: u32,
    /// Consecutive rows with the same phase.
    pub per_phase: u32,
    /// Number of distinct phases.
    pub max_phase: u32,
    /// `(shift, mask)`: the units `(row >> shift) & mask` are XORed in as well (the
    /// shift is at least the lowest set bit of the mask, see [`Self::mixed`]).
    pub mix: Option<(u32, u32)>,
}

impl Swizzle {
    /// The swizzle of rows of `cols` elements of `elem_bytes` bytes each, accessed
    /// `vec` elements at a time (all powers of two).
    pub fn new(cols: u32, elem_bytes: u32, vec: u32) -> Swizzle {
        let vec = vec.min(cols);
        let row_bytes = cols * elem_bytes;
        let units_per_line = (128 / (vec * elem_bytes)).max(1);
        let per_phase = (128 / row_bytes).max(1);
        let max_phase = (cols / vec).min(units_per_line / per_phase).max(1);
        Swizzle {
            cols,
            vec,
            per_phase,
            max_phase,
            mix: None,
        }
    }

    /// The same, with row bits `row_shift..` XORed into the units of a 128-byte line
    /// from unit bit `unit_shift` up as well (see the type's docs).
    pub fn mixed(self, row_shift: u32, unit_shift: u32, elem_bytes: u32) -> Swizzle {
        let line_units = (128 / (self.vec * elem_bytes)).max(1);
        let mask = (line_units - 1) & !((1 << unit_shift) - 1);
        // A term must take row bits above every bit it flips: the unit bits above the
        // row's own units are the low row bits.
        let unit_bits = (self.cols / self.vec).trailing_zeros();
        if row_shift < unit_shift || mask == 0 || row_shift - unit_shift + unit_bits == 0 {
            return self;
        }
        Swizzle {
            mix: Some((row_shift - unit_shift, mask)),
            ..self
        }
    }

    /// The element offset of `(row, col)`.
    pub fn offset(&self, row: u32, col: u32) -> u32 {
        let mut phase = (row / self.per_phase) % self.max_phase;
        if let Some((shift, mask)) = self.mix {
            phase ^= (row >> shift) & mask;
        }
        (row * self.cols + col) ^ (phase * self.vec)
    }

    /// [`Self::offset`] in LLVM IR.
    pub(in crate::lower) fn emit<'ctx>(
        &self,
        cx: &crate::lower::Cx<'ctx>,
        row: IntValue<'ctx>,
        col: IntValue<'ctx>,
    ) -> LResult<IntValue<'ctx>> {
        let b = &cx.b;
        let c = |x: u32| cx.i32(x as i64);
        let flat = b.build_int_add(b.build_int_mul(row, c(self.cols), "")?, col, "")?;
        let term = |shift: u32, mask: u32| -> LResult<IntValue<'ctx>> {
            let t = b.build_right_shift(row, c(shift), false, "")?;
            Ok(b.build_and(t, c(mask), "")?)
        };
        let mut phase = None;
        if self.max_phase > 1 {
            phase = Some(term(self.per_phase.trailing_zeros(), self.max_phase - 1)?);
        }
        if let Some((shift, mask)) = self.mix {
            let t = term(shift, mask)?;
            phase = Some(match phase {
                Some(p) => b.build_xor(p, t, "")?,
                None => t,
            });
        }
        let Some(phase) = phase else {
            return Ok(flat);
        };
        let sw = b.build_left_shift(phase, c(self.vec.trailing_zeros()), "")?;
        Ok(b.build_xor(flat, sw, "")?)
    }
}

/// Writes the operands of matrix-path `dot` `op` that are not in its arrays yet (not
/// staged by a loop, and A not read from registers when `a_in_regs`) with `stage`,
/// then waits at a barrier if it wrote any.
pub(in crate::lower) fn stage_operands<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    op: &Op,
    a_in_regs: bool,
    mut stage: impl FnMut(&Lowerer<'_, 'ctx>, usize, &Tile<'ctx>) -> LResult<()>,
) -> LResult<()> {
    let mut wrote = false;
    for which in 0..2 {
        if (which == 0 && a_in_regs) || l.is_staged(op, which) {
            continue;
        }
        let t = l.val(op.operands[which])?;
        stage(l, which, &t)?;
        wrote = true;
    }
    if wrote {
        l.barrier()?;
    }
    Ok(())
}

/// Writes every register of `t` to `base + offset(element index)` (in elements).
/// `runs[i]` is the element-index step that `offset` maps to `2^i` consecutive places
/// (e.g. `[1, 2, 4]` along a row-major row, `[N, 2N]` down a column stored
/// transposed): registers that differ only in those steps, when the layout holds them
/// in registers, are written as one vector store. The caller promises that a run's
/// first place is aligned to the run's size.
pub(in crate::lower) fn write_tile<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    t: &Tile<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
    runs: &[u32],
    offset: impl Fn(IntValue<'ctx>) -> LResult<IntValue<'ctx>>,
) -> LResult<()> {
    let mt = l.mem_ty(t.elem);
    if t.uniform {
        // Every thread stores its share of the (constant) tile: layout-independent.
        let lay = l.canonical(&t.layout.shape);
        for e in l.elem_indices(&lay)? {
            let p = l.smem_ptr(base, mt, offset(e)?)?;
            l.smem_store(p, t.regs[0])?;
        }
        return Ok(());
    }
    // The register bits holding the run steps, in order (as far as they are there).
    let mut run_bits: Vec<usize> = Vec::new();
    for step in runs {
        match t.layout.reg.iter().position(|b| b == step) {
            Some(bit) => run_bits.push(bit),
            None => break,
        }
    }
    // Only when the run's element bits are set by its registers alone (so a run's
    // first element, hence its first place, is aligned to the run).
    let steps: u32 = run_bits
        .iter()
        .map(|&b| t.layout.reg[b])
        .fold(0, |a, s| a | s);
    let others_clear = t
        .layout
        .reg
        .iter()
        .enumerate()
        .filter(|(i, _)| !run_bits.contains(i))
        .map(|(_, b)| b)
        .chain(&t.layout.lane)
        .chain(&t.layout.warp)
        .all(|b| b & steps == 0);
    if !others_clear {
        run_bits.clear();
    }
    let run_mask: usize = run_bits.iter().map(|&b| 1 << b).sum();
    let run = 1usize << run_bits.len();
    let idx = l.elem_indices(&t.layout)?;
    for (r, &e) in idx.iter().enumerate() {
        if crate::lower::is_dup_reg(&t.layout, r) || r & run_mask != 0 {
            continue;
        }
        let p = l.smem_ptr(base, mt, offset(e)?)?;
        if run == 1 {
            l.smem_store(p, l.store_to_mem(t.elem, t.regs[r])?)?;
            continue;
        }
        let vt: BasicTypeEnum = match mt {
            BasicTypeEnum::FloatType(f) => f.vec_type(run as u32).into(),
            BasicTypeEnum::IntType(i) => i.vec_type(run as u32).into(),
            _ => unreachable!("scalar shared-memory type"),
        };
        let BasicTypeEnum::VectorType(vty) = vt else {
            unreachable!()
        };
        let mut v = vty.get_poison();
        for i in 0..run {
            // Register `r` with run bit `j` set for every set bit `j` of `i`.
            let ri = run_bits
                .iter()
                .enumerate()
                .filter(|(j, _)| i >> j & 1 == 1)
                .fold(r, |acc, (_, &b)| acc | 1 << b);
            let x = l.store_to_mem(t.elem, t.regs[ri])?;
            v = l.cx.b.build_insert_element(v, x, l.cx.i32(i as i64), "")?;
        }
        let s = l.smem_store(p, v.into())?;
        let _ = s.set_alignment(run as u32 * crate::lower::type_bytes(t.elem));
    }
    Ok(())
}

/// Whether the fragment reads of two consecutive k-steps are one 16-byte run per
/// lane: on the matrix path without `ldmatrix`, when each lane's fragment is one run
/// of `r` consecutive `k` of 8 bytes (4 halves: the f16 MFMA; 8 bytes: gfx942's i8
/// MFMA) and `K` holds whole pairs of steps. The pair's `2 * info.k` columns are
/// then dealt out so that a lane's run `2 * lane_k .. + 2r` holds its `r` for the
/// first step and its `r` for the second: the k order inside the pair is permuted,
/// the same way for A and B (whose lanes map to `k` alike), which leaves the product
/// unchanged and makes every read 16 bytes.
pub(in crate::lower) fn paired_reads(info: &MmaInfo, ldm: bool, k: u32, elem_bytes: u32) -> bool {
    let lane_k = |f: &FragInfo| f.lane.iter().map(|l| l.1).collect::<Vec<_>>();
    let r = pair_run(info);
    !ldm && r * elem_bytes == 8
        && info.b.runs == info.a.runs
        && lane_k(&info.a) == lane_k(&info.b)
        && k.is_multiple_of(2 * info.k)
}

/// The length of the one run of `k` each lane's A fragment is (0 if it is more than
/// one run): what [`paired_reads`] pairs.
pub(super) fn pair_run(info: &MmaInfo) -> u32 {
    match info.a.runs[..] {
        [(0, 0, r)] => r,
        _ => 0,
    }
}

/// The shared arrays of `dot`'s operands on the matrix path (`a[m][k]`, and `b[k][n]`
/// when read with `ldmatrix`, else `b[n][k]`), swizzled for the width each fragment
/// read takes: 16-byte rows of 8x8 matrices for `ldmatrix`, else the fragment's
/// shortest run of consecutive `k`. `ws` and `nw` give the staging stores' layout
/// ([`bt_load_layout`] for a transposed B).
pub(in crate::lower) fn operand_swizzles(
    info: &MmaInfo,
    ldm: bool,
    (n, k): (u32, u32),
    elem_bytes: u32,
    (ws, nw): (u32, u32),
) -> (Swizzle, Swizzle) {
    if ldm {
        let v = 16 / elem_bytes;
        (
            Swizzle::new(k, elem_bytes, v),
            Swizzle::new(n, elem_bytes, v),
        )
    } else {
        let (au, bu) = (
            frag_unit(info, &info.a, ldm, k, elem_bytes),
            frag_unit(info, &info.b, ldm, k, elem_bytes),
        );
        let bt = Swizzle::new(k, elem_bytes, bu);
        (
            Swizzle::new(k, elem_bytes, au),
            mix_for_stores(
                bt,
                &bt_load_layout(&[k, n], 16 / elem_bytes, ws, nw, bu),
                elem_bytes,
                ws,
            ),
        )
    }
}

/// `swz` (the transposed B, `[n][k]`) mixed so that the stores of `lay` (the `[k][n]`
/// registers) spread over the banks too: the lanes of one store walk rows `n` 8
/// apart, which the plain phases map to few units. Tries each row slice and unit
/// offset of [`Swizzle::mixed`] and keeps the first that minimises (the passes of one
/// fragment read, then of one staging store: reads are the more frequent); the swizzle is XOR
/// linear in the row and column bits, so one aligned read group and one store
/// register stand for all of them.
pub(super) fn mix_for_stores(swz: Swizzle, lay: &Layout, elem_bytes: u32, ws: u32) -> Swizzle {
    let n = lay.shape[1];
    let unit_bytes = swz.vec * elem_bytes;
    // A fragment read: rows 0.. (one per lane of a 128-byte group) at unit 0.
    let read_rows = (128 / unit_bytes).min(n);
    let read = |z: &Swizzle| {
        let units = (0..read_rows).map(|r| z.offset(r, 0) / z.vec);
        max_share(units.map(|u| (u % (128 / unit_bytes), u)))
    };
    // A staging store: register 0 of the lanes of one 128-byte group, with the
    // consecutive `k` the registers hold (up to 32 bits).
    let k_regs = (0..2).take_while(|&j| lay.reg.contains(&(n << j))).count() as u32;
    let store_bytes = (elem_bytes << k_regs).min(4);
    let group = (128 / store_bytes).min(ws);
    let store = |z: &Swizzle| {
        let words = (0..group).map(|t| {
            let e = lay.elem_index(0, t, 0);
            let word = z.offset(e % n, e / n) * elem_bytes / 4;
            (word % 32, word)
        });
        max_share(words)
    };
    let line_bits = (128 / unit_bytes).trailing_zeros();
    let mut best = (swz, (read(&swz), store(&swz)));
    for row_shift in 1..8 {
        for unit_shift in 0..line_bits {
            let z = swz.mixed(row_shift, unit_shift, elem_bytes);
            let (r, st) = (read(&z), store(&z));
            let score = (r, st);
            if score < best.1 {
                best = (z, score);
            }
        }
    }
    best.0
}

/// The largest number of distinct values sharing a key, over `(key, value)` pairs.
pub(in crate::lower) fn max_share(pairs: impl Iterator<Item = (u32, u32)>) -> u32 {
    let mut by_key: HashMap<u32, Vec<u32>> = HashMap::new();
    for (k, v) in pairs {
        let vs = by_key.entry(k).or_default();
        if !vs.contains(&v) {
            vs.push(v);
        }
    }
    by_key.values().map(|v| v.len() as u32).max().unwrap_or(1)
}

/// The shared arrays of a `dot` on the matrix path: `a[m][k]` then `b` (`[k][n]`
/// read with `ldmatrix`, else `[n][k]`), swizzled ([`operand_swizzles`]).
pub(super) struct Arrays {
    pub(super) ldm: bool,
    /// With `ldmatrix`: B staged `[n][k]` (a B contiguous along `k`, see
    /// [`b_nk`]) and read without `.trans`.
    pub(super) b_nk: bool,
    pub(super) a_swz: Swizzle,
    pub(super) b_swz: Swizzle,
    pub(super) m: u32,
    pub(super) n: u32,
    pub(super) k: u32,
    /// Bytes of one operand element.
    pub(super) elem_bytes: u32,
}

impl Arrays {
    pub(in crate::lower) fn new(l: &Lowerer<'_, '_>, op: &Op, p: &Plan) -> Arrays {
        let a = &l.f.ty(op.operands[0]).shape;
        let (m, k, n) = (a[0], a[1], l.f.ty(op.operands[1]).shape[1]);
        let elem_bytes = crate::lower::type_bytes(l.f.ty(op.operands[0]).elem);
        // `ldmatrix` reads the NVIDIA m16n8k16 fragments; B is then row-major (16-byte
        // stores, read with `.trans`). Elsewhere B is staged transposed (`[n][k]`).
        let ldm = !b_transposed(l, p);
        let b_nk = b_nk(l, op, p);
        let (a_swz, mut b_swz) = operand_swizzles(&p.info, ldm, (n, k), elem_bytes, (l.ws, l.nw));
        if b_nk {
            // Rows of `k`, read 16 bytes at a time, as A's.
            b_swz = Swizzle::new(k, elem_bytes, 16 / elem_bytes);
        }
        Arrays {
            ldm,
            b_nk,
            a_swz,
            b_swz,
            m,
            n,
            k,
            elem_bytes,
        }
    }

    /// Elements of A (B follows).
    pub(in crate::lower) fn a_elems(&self) -> u32 {
        self.m * self.k
    }

    /// Bytes of both arrays.
    pub(in crate::lower) fn bytes(&self) -> u32 {
        (self.a_elems() + self.k * self.n) * self.elem_bytes
    }
}

/// Where (in elements from the arrays' base) operand `which`'s element `e` (its flat
/// index in the operand tile) goes: `a[m][k]` at `a_swz(m, k)`; `b[k][n]` at
/// `a_elems + b_swz(k, n)` with `ldmatrix`, else transposed at `a_elems + b_swz(n, k)`.
pub(super) fn elem_offset<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    arr: &Arrays,
    which: usize,
    e: IntValue<'ctx>,
) -> LResult<IntValue<'ctx>> {
    let bd = &l.cx.b;
    if which == 0 {
        let k = arr.k;
        let r = bd.build_right_shift(e, l.cx.i32(k.trailing_zeros() as i64), false, "")?;
        let cc = bd.build_and(e, l.cx.i32(k as i64 - 1), "")?;
        return arr.a_swz.emit(&l.cx, r, cc);
    }
    let n = arr.n;
    let kk = bd.build_right_shift(e, l.cx.i32(n.trailing_zeros() as i64), false, "")?;
    let nn = bd.build_and(e, l.cx.i32(n as i64 - 1), "")?;
    let o = if arr.ldm && !arr.b_nk {
        arr.b_swz.emit(&l.cx, kk, nn)?
    } else {
        arr.b_swz.emit(&l.cx, nn, kk)?
    };
    Ok(bd.build_int_add(o, l.cx.i32(arr.a_elems() as i64), "")?)
}

pub(super) fn stage<'ctx>(
    l: &Lowerer<'_, 'ctx>,
    arr: &Arrays,
    which: usize,
    t: &Tile<'ctx>,
    base: inkwell::values::PointerValue<'ctx>,
) -> LResult<()> {
    // A: runs along k of at most one unit stay consecutive. B: with ldmatrix runs
    // along n; transposed, a run goes down a column of the tile, steps of `n` elements
    // (pairs of k, which `operand_load_layout` puts in registers, or up to a unit of
    // consecutive k from a load walked down the columns).
    let runs = if which == 0 {
        row_runs(arr.a_swz.vec)
    } else if arr.ldm && !arr.b_nk {
        row_runs(arr.b_swz.vec)
    } else {
        row_runs(arr.b_swz.vec).iter().map(|s| s * arr.n).collect()
    };
    write_tile(l, t, base, &runs, |e| elem_offset(l, arr, which, e))
}

/// Where the shared arrays (`bytes` of them) of matrix-path `dot` `op` are: this
/// iteration's slot of its `cp.async` ring, the arrays a loop stages its operands
/// in, or scratch.
pub(in crate::lower) fn arrays_base<'ctx>(
    l: &mut Lowerer<'_, 'ctx>,
    op: &Op,
    bytes: u32,
) -> LResult<inkwell::values::PointerValue<'ctx>> {
    if l.async_dot(op).is_some() {
        return l.async_base(op, None);
    }
    Ok(match l.pipe_base(op) {
        Some(b) => b,
        None => l.scratch(bytes, &op.span),
    })
}

/// The elements of one swizzle unit of an operand array read by fragments `f`
/// without `ldmatrix`: the fragment's shortest run of `k`, twice that with paired
/// reads.
pub(super) fn frag_unit(info: &MmaInfo, f: &FragInfo, ldm: bool, k: u32, elem_bytes: u32) -> u32 {
    let r = f.runs.iter().map(|r| r.2).min().unwrap_or(1);
    if paired_reads(info, ldm, k, elem_bytes) {
        2 * r
    } else {
        r
    }
}

/// The steps `[1, 2, 4, ...]` of a run of `n` consecutive elements (`n` a power of
/// two): see [`write_tile`].
pub(super) fn row_runs(n: u32) -> Vec<u32> {
    (0..n.trailing_zeros()).map(|i| 1 << i).collect()
}

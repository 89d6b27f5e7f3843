//! The Hopper warpgroup matrix instructions as the PTX ISA defines them, for the
//! emulator: `wgmma.mma_async` (matrix descriptors, swizzle modes, the D fragment),
//! `wgmma.fence`, `wgmma.commit_group` and `wgmma.wait_group`.
//!
//! Written from the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate
//! Instructions": "Matrix Descriptor Format", "Shared Memory Matrix Layout", "Register
//! Fragments", "wgmma.wait_group"), independently of the lowering (`lower::wgmma`):
//!
//! - **Descriptor**: bits 0..14 start address `>> 4`, 16..30 leading-dimension byte
//!   offset (LBO) `>> 4`, 32..46 stride-dimension byte offset (SBO) `>> 4`, 49..52 the
//!   base offset, 62..64 the swizzle mode (0 none, 1 128B, 2 64B, 3 32B).
//! - **Swizzled canonical layouts**, swizzle width `S` bytes, `T = 16 / elem_bytes`
//!   elements per 16-byte unit (byte offsets from the start address):
//!   - K-major, element `(mn, k)`: `(mn % 8) S + (mn / 8) SBO + k elem_bytes` (a row of
//!     `S` bytes holds consecutive `k`; LBO unused);
//!   - MN-major, element `(mn, k)`: `(mn % (S / elem_bytes)) elem_bytes +
//!     (mn / (S / elem_bytes)) LBO + (k % 8) S + (k / 8) SBO`;
//!
//!   then the address bits `[4, 4 + log2(S / 16))` are XORed with the bits
//!   `[7, 7 + log2(S / 16))` (the repeating pattern starts on a multiple of `8 S`
//!   bytes; a non-zero base offset is not emulated and reported).
//! - **A from registers**: per warp of the warpgroup, the `mma.m16n8k16` A fragment
//!   of its 16 rows: lane `l`, element `i` (0..8, two per `.b32` register, the first
//!   in the low half) is `A[16 w + l / 4 + 8 ((i / 2) % 2)][2 (l % 4) + i % 2 + 8 (i / 4)]`.
//! - **D fragment** of `m64nNk16` with f32 accumulators (and of `m64nNk32` `.s8`
//!   with s32 ones): thread `t` of the warpgroup (warp `w = t / 32 % 4`, lane
//!   `l = t % 32`) holds `N / 2` registers; register `i` is
//!   `D[16 w + l / 4 + 8 ((i / 2) % 2)][8 (i / 4) + 2 (l % 4) + i % 2]`.
//! - **Types**: `.f16`/`.bf16` inputs take 16 k per instruction and accumulate in
//!   f32; `.s8` inputs take 32 and accumulate in s32 (wrapping: no `.satfinite`),
//!   `.e4m3`/`.e5m2` (OCP 8-bit floats) take 32 and accumulate in f32, with both
//!   operands K-major (8-bit types have no transpose).
//!
//! Each emulated thread computes its own D registers (the hardware computes the
//! warpgroup's tile; the sum of the threads' shares is the same thing), when a
//! `wgmma.wait_group` covers the instruction's group: that is when the operands are
//! read from shared memory, so a kernel that overwrites them too early computes with
//! the new data, as it may on a GPU. Between issue and completion the accumulator
//! registers hold [`POISON`].

use std::collections::{HashMap, VecDeque};

/// The bits every accumulator register of an in-flight `wgmma` reads as (a quiet NaN
/// with a payload): a kernel that uses them before the wait computes NaNs.
pub const POISON: u32 = 0x7fc0_dead;

/// The input types of `wgmma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgType {
    /// `.f16` (f32 accumulators).
    F16,
    /// `.bf16` (f32 accumulators).
    Bf16,
    /// `.s8` (s32 accumulators).
    S8,
    /// `.e4m3` (f32 accumulators).
    E4M3,
    /// `.e5m2` (f32 accumulators).
    E5M2,
}

impl WgType {
    /// Bytes of one input element.
    pub fn bytes(self) -> u32 {
        match self {
            WgType::S8 | WgType::E4M3 | WgType::E5M2 => 1,
            WgType::F16 | WgType::Bf16 => 2,
        }
    }

    /// `K` of one instruction.
    pub fn k(self) -> u32 {
        32 / self.bytes()
    }
}

/// One issued `wgmma.mma_async`.
#[derive(Clone, Copy, Debug)]
pub struct WgOp {
    /// Input type.
    pub ty: WgType,
    /// `N` of the instruction.
    pub n: u32,
    /// Matrix descriptors of A and B.
    pub desc_a: u64,
    pub desc_b: u64,
    /// `imm-trans-b`: B is N-major.
    pub trans_b: bool,
    /// The `scale-d` predicate: false computes `D = A·B` (the accumulators' old
    /// contents are not read).
    pub scale_d: bool,
    /// A from registers: the four `.b32` A registers of each lane of this thread's
    /// quad (lanes `4 (l / 4) ..+ 4`), in lane order; `None`: A through `desc_a`.
    pub a_quad: Option<[u32; 16]>,
    /// The accumulator tile (the lowering's slot).
    pub slot: u32,
    /// The op's site.
    pub site: i32,
}

/// A thread's warpgroup-MMA state.
#[derive(Default)]
pub struct WgState {
    /// A `wgmma.fence` since the last wait (needed before the first `wgmma` on
    /// registers that other instructions wrote).
    pub fenced: bool,
    /// The accumulators of in-flight slots (the registers' true contents, as bits).
    pub regs: HashMap<u32, Vec<u32>>,
    /// Issued since the last commit.
    pub open: Vec<WgOp>,
    /// Committed groups, oldest first.
    pub committed: VecDeque<Vec<WgOp>>,
}

impl WgState {
    /// Whether any issued, not yet completed op accumulates into `slot`.
    pub fn pending(&self, slot: u32) -> bool {
        self.open
            .iter()
            .chain(self.committed.iter().flatten())
            .any(|o| o.slot == slot)
    }
}

/// A descriptor's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    /// Start address (bytes in the shared window).
    pub start: u32,
    /// Leading-dimension byte offset.
    pub lbo: u32,
    /// Stride-dimension byte offset.
    pub sbo: u32,
    /// Swizzle bytes `S` (32, 64, 128).
    pub swizzle: u32,
}

/// Decodes a descriptor; `Err` names what the emulator does not model.
pub fn decode(d: u64) -> Result<Desc, String> {
    let field = |lo: u32| (((d >> lo) & 0x3fff) as u32) << 4;
    let base_offset = (d >> 49) & 7;
    if base_offset != 0 {
        return Err(format!(
            "matrix descriptor {d:#x} has base offset {base_offset} (not emulated)"
        ));
    }
    let swizzle = match d >> 62 {
        1 => 128,
        2 => 64,
        3 => 32,
        _ => {
            return Err(format!(
                "matrix descriptor {d:#x} uses the no-swizzle (interleaved) layout (not emulated)"
            ));
        }
    };
    Ok(Desc {
        start: field(0),
        lbo: field(16),
        sbo: field(32),
        swizzle,
    })
}

/// The shared address of element `(mn, k)` of the operand `d` describes (K-major or
/// MN-major), `eb` bytes per element.
pub fn element_address(d: &Desc, mn: u32, k: u32, mn_major: bool, eb: u32) -> u32 {
    let s = d.swizzle;
    let off = if mn_major {
        let per_row = s / eb;
        (mn % per_row) * eb + (mn / per_row) * d.lbo + (k % 8) * s + (k / 8) * d.sbo
    } else {
        (mn % 8) * s + (mn / 8) * d.sbo + k * eb
    };
    let addr = d.start.wrapping_add(off);
    let mask = s / 16 - 1;
    addr ^ (((addr >> 7) & mask) << 4)
}

/// The (row, column) of register `i` of the D fragment of thread `t` (in the block;
/// its warpgroup is `t / 128`).
pub fn d_coords(t: u32, i: u32) -> (u32, u32) {
    let (w, l) = ((t / 32) % 4, t % 32);
    (
        16 * w + l / 4 + 8 * ((i / 2) % 2),
        8 * (i / 4) + 2 * (l % 4) + i % 2,
    )
}

/// Executes `op` for thread `t`: `acc` (its `n / 2` registers, as bits: f32 or s32
/// by the type) becomes `A·B + acc`, elements read by `read(address)` (a 16-bit
/// element, or the byte of an 8-bit one; `Err` for an address outside shared
/// memory).
pub fn execute(
    op: &WgOp,
    t: u32,
    acc: &mut [u32],
    mut read: impl FnMut(u32) -> Result<u16, String>,
) -> Result<(), String> {
    let da = match op.a_quad {
        Some(_) => None,
        None => Some(decode(op.desc_a)?),
    };
    let db = decode(op.desc_b)?;
    let (ty, eb) = (op.ty, op.ty.bytes());
    if eb == 1 && (op.trans_b || op.a_quad.is_some()) {
        return Err("8-bit wgmma takes both operands K-major from shared memory".into());
    }
    if !op.scale_d {
        acc.fill(0);
    }
    for (i, c) in acc.iter_mut().enumerate().take((op.n / 2) as usize) {
        let (row, col) = d_coords(t, i as u32);
        let (mut s, mut si) = (0.0f32, 0i32);
        for k in 0..ty.k() {
            let a = match (&da, &op.a_quad) {
                (Some(da), _) => read(element_address(da, row, k, false, eb))?,
                (None, Some(q)) => a_from_quad(q, row % 16, k),
                (None, None) => unreachable!("A has a descriptor or registers"),
            };
            let b = read(element_address(&db, col, k, op.trans_b, eb))?;
            match ty {
                WgType::S8 => {
                    let p = (a as u8 as i8 as i32) * (b as u8 as i8 as i32);
                    si = si.wrapping_add(p);
                }
                _ => s += to_f32(ty, a) * to_f32(ty, b),
            }
        }
        *c = match ty {
            WgType::S8 => (*c as i32).wrapping_add(si) as u32,
            _ => (f32::from_bits(*c) + s).to_bits(),
        };
    }
    Ok(())
}

/// Whether `op` reads any shared-memory byte in `lo..hi`: every element of A (its
/// 64 rows, unless A comes from registers) and of B (its `N` columns), over the
/// instruction's K, wherever their descriptors place them — what the whole
/// warpgroup reads, not only one thread's share.
pub fn reads_any(op: &WgOp, lo: u32, hi: u32) -> Result<bool, String> {
    let eb = op.ty.bytes();
    let hit = |a: u32| a < hi && a + eb > lo;
    if op.a_quad.is_none() {
        let da = decode(op.desc_a)?;
        for row in 0..64 {
            for k in 0..op.ty.k() {
                if hit(element_address(&da, row, k, false, eb)) {
                    return Ok(true);
                }
            }
        }
    }
    let db = decode(op.desc_b)?;
    for col in 0..op.n {
        for k in 0..op.ty.k() {
            if hit(element_address(&db, col, k, op.trans_b, eb)) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Element `(row, k)` (row within the warp's 16) of A from the quad's registers: held
/// by quad lane `(k % 8) / 2` as element `k % 2 + 2 (row / 8) + 4 (k / 8)`.
fn a_from_quad(q: &[u32; 16], row: u32, k: u32) -> u16 {
    let lane = (k % 8) / 2;
    let i = k % 2 + 2 * (row / 8) + 4 * (k / 8);
    (q[(4 * lane + i / 2) as usize] >> (16 * (i % 2))) as u16
}

fn to_f32(ty: WgType, bits: u16) -> f32 {
    match ty {
        WgType::Bf16 => half::bf16::from_bits(bits).to_f32(),
        WgType::E4M3 => tessera_ir::fp8::F8E4M3::from_bits(bits as u8).to_f32(),
        WgType::E5M2 => tessera_ir::fp8::F8E5M2::from_bits(bits as u8).to_f32(),
        WgType::F16 | WgType::S8 => half::f16::from_bits(bits).to_f32(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The descriptor of `d` (its swizzle field from `d.swizzle`: 128B 1, 64B 2).
    fn encode(d: &Desc) -> u64 {
        let mode: u64 = match d.swizzle {
            128 => 1,
            64 => 2,
            32 => 3,
            _ => 0,
        };
        (u64::from(d.start) >> 4)
            | (u64::from(d.lbo >> 4) << 16)
            | (u64::from(d.sbo >> 4) << 32)
            | (mode << 62)
    }

    #[test]
    fn descriptor_fields_decode() {
        // Start 0x1230, LBO 8192, SBO 1024, 128B swizzle.
        let d = (0x1230u64 >> 4) | ((8192 >> 4) << 16) | ((1024u64 >> 4) << 32) | (1 << 62);
        let x = decode(d).expect("valid");
        assert_eq!(
            x,
            Desc {
                start: 0x1230,
                lbo: 8192,
                sbo: 1024,
                swizzle: 128
            }
        );
        assert!(decode(d | (1 << 49)).is_err());
        assert!(decode(d & !(3 << 62)).is_err());
    }

    #[test]
    fn the_128b_swizzle_permutes_units_within_rows() {
        // K-major 128B: row r's 16-byte unit u is at unit u ^ (r % 8) of the row.
        let d = Desc {
            start: 0,
            lbo: 16,
            sbo: 1024,
            swizzle: 128,
        };
        for r in 0..16 {
            for u in 0..8 {
                let a = element_address(&d, r, 8 * u, false, 2);
                assert_eq!(a, (r / 8) * 1024 + (r % 8) * 128 + 16 * (u ^ (r % 8)));
            }
        }
    }

    /// `m64n16k32.s32.s8.s8` with both operands K-major (64B swizzle): the signed
    /// bytes, all 32 `k` and the s32 accumulation, against a plain product.
    #[test]
    fn s8_wgmma_computes_the_integer_product() {
        let (n, k) = (16u32, 32u32);
        let byte = |r: u32, c: u32, s: u32| ((r * 37 + c * 11 + s * 101) % 256) as u8;
        let da = Desc {
            start: 0,
            lbo: 16,
            sbo: 8 * 64,
            swizzle: 64,
        };
        let db = Desc {
            start: 8192,
            lbo: 16,
            sbo: 8 * 64,
            swizzle: 64,
        };
        let mut smem = vec![0u8; 16384];
        for mn in 0..64 {
            for kk in 0..k {
                smem[element_address(&da, mn, kk, false, 1) as usize] = byte(mn, kk, 1);
            }
        }
        for mn in 0..n {
            for kk in 0..k {
                smem[element_address(&db, mn, kk, false, 1) as usize] = byte(kk, mn, 2);
            }
        }
        let op = WgOp {
            ty: WgType::S8,
            n,
            desc_a: encode(&da),
            desc_b: encode(&db),
            trans_b: false,
            scale_d: true,
            a_quad: None,
            slot: 0,
            site: 0,
        };
        for t in 0..128 {
            let mut acc: Vec<u32> = (0..n / 2).map(|i| 1000 * i).collect();
            execute(&op, t, &mut acc, |a| Ok(u16::from(smem[a as usize]))).expect("runs");
            for i in 0..n / 2 {
                let (r, c) = d_coords(t, i);
                let want: i32 = (0..k)
                    .map(|kk| i32::from(byte(r, kk, 1) as i8) * i32::from(byte(kk, c, 2) as i8))
                    .sum::<i32>()
                    + (1000 * i) as i32;
                assert_eq!(acc[i as usize] as i32, want, "thread {t} register {i}");
            }
        }
        // 8-bit operands have no transpose.
        let bad = WgOp {
            trans_b: true,
            ..op
        };
        assert!(execute(&bad, 0, &mut [0; 8], |_| Ok(0)).is_err());
    }

    /// `reads_any` is the union of every thread's operand reads: a span meets it
    /// exactly when some thread's `execute` reads a byte in it.
    #[test]
    fn reads_any_is_every_threads_reads() {
        let da = Desc {
            start: 0,
            lbo: 16,
            sbo: 8 * 128,
            swizzle: 128,
        };
        let db = Desc {
            start: 16384,
            lbo: 16,
            sbo: 8 * 128,
            swizzle: 128,
        };
        let op = WgOp {
            ty: WgType::F16,
            n: 64,
            desc_a: encode(&da),
            desc_b: encode(&db),
            trans_b: false,
            scale_d: true,
            a_quad: None,
            slot: 0,
            site: 0,
        };
        let mut read = std::collections::BTreeSet::new();
        for t in 0..128 {
            execute(&op, t, &mut [0; 32], |a| {
                read.insert(a);
                read.insert(a + 1);
                Ok(0)
            })
            .expect("runs");
        }
        for lo in (0..32768).step_by(96) {
            let hi = lo + 40;
            let want = read.range(lo..hi).next().is_some();
            assert_eq!(reads_any(&op, lo, hi), Ok(want), "{lo:#x}..{hi:#x}");
        }
        // Past both operands: nothing.
        assert_eq!(reads_any(&op, 1 << 20, (1 << 20) + 4096), Ok(false));
    }

    #[test]
    fn d_fragment_covers_the_tile_once() {
        let mut seen = std::collections::HashSet::new();
        for t in 0..128 {
            for i in 0..64 {
                assert!(seen.insert(d_coords(t, i)));
            }
        }
        assert_eq!(seen.len(), 64 * 128);
    }
}

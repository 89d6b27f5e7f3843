//! Layouts: how the elements of a tile are spread over the registers, lanes and warps
//! of a program instance (a GPU block).
//!
//! A [`Layout`] is a *linear layout* in the sense of Triton's `LinearLayout`: a map
//! over GF(2) from the bits of `(register, lane, warp)` to the bits of the tile's flat
//! row-major element index. Each input bit has a *basis* (an element index); the
//! element held by register `r` of lane `l` in warp `w` is the XOR of the bases of the
//! set bits of `r`, `l` and `w`. A zero basis means replication: the threads (or
//! registers) that differ only in that bit hold the same element. All tile dimensions
//! are powers of two, so a flat index's bits split into per-dimension fields
//! (the last dimension in the low bits).
//!
//! Every layout Tessera builds today has bases that are zero or a single bit (a
//! "permutation" layout); the algorithms that rely on it ([`Layout::is_bit_layout`])
//! check it. Shape ops on linear layouts are compositions with linear maps on the index
//! bits: [`Layout::sliced`] (reduction), [`Layout::compose_bits`] (broadcast,
//! permute).

/// A linear layout of a tile (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// The tile shape (empty for a scalar).
    pub shape: Vec<u32>,
    /// Bases of the register index bits.
    pub reg: Vec<u32>,
    /// Bases of the lane index bits (`log2(warp_size)` of them).
    pub lane: Vec<u32>,
    /// Bases of the warp index bits (`log2(num_warps)` of them).
    pub warp: Vec<u32>,
}

fn log2(x: u32) -> u32 {
    debug_assert!(x.is_power_of_two(), "{x} is not a power of two");
    x.trailing_zeros()
}

/// Number of elements of a shape.
pub fn numel(shape: &[u32]) -> u32 {
    shape.iter().product()
}

impl Layout {
    /// The canonical blocked layout: `vec` contiguous (flat row-major) elements per
    /// thread, then consecutive lanes, then warps, then repeated in registers. When the
    /// tile has fewer elements than `vec * threads`, the remaining lane and warp bits
    /// replicate (zero bases).
    pub fn blocked(shape: &[u32], vec: u32, warp_size: u32, num_warps: u32) -> Layout {
        let n = log2(numel(shape));
        let v = log2(vec).min(n);
        let mut next = 0u32;
        let mut take = |count: u32| -> Vec<u32> {
            (0..count)
                .map(|_| {
                    if next < n {
                        next += 1;
                        1 << (next - 1)
                    } else {
                        0
                    }
                })
                .collect()
        };
        let mut reg = take(v);
        let lane = take(log2(warp_size));
        let warp = take(log2(num_warps));
        while next < n {
            reg.push(1 << next);
            next += 1;
        }
        Layout {
            shape: shape.to_vec(),
            reg,
            lane,
            warp,
        }
    }

    /// [`Self::blocked`] of a 2-D `[rows][cols]` tile walked column-major: `vec`
    /// consecutive rows of one column per thread, then lanes and warps down the
    /// columns (a transposed operand whose rows are contiguous in memory).
    pub fn blocked_columns(shape: &[u32], vec: u32, warp_size: u32, num_warps: u32) -> Layout {
        let t = [shape[1], shape[0]];
        Layout::blocked(&t, vec, warp_size, num_warps)
            .compose_bits(shape, &permute_bit_images(shape, &[1, 0]))
    }

    /// A layout where every thread holds every element in one register each (for a
    /// scalar: one register holding the value in every thread).
    pub fn uniform(shape: &[u32], warp_size: u32, num_warps: u32) -> Layout {
        let n = log2(numel(shape));
        Layout {
            shape: shape.to_vec(),
            reg: (0..n).map(|i| 1 << i).collect(),
            lane: vec![0; log2(warp_size) as usize],
            warp: vec![0; log2(num_warps) as usize],
        }
    }

    /// A layout from bases given as coordinates (one `Vec` per basis, one entry per
    /// dimension).
    pub fn from_coords(
        shape: &[u32],
        reg: &[Vec<u32>],
        lane: &[Vec<u32>],
        warp: &[Vec<u32>],
    ) -> Layout {
        let flat = |c: &Vec<u32>| flat_index(shape, c);
        Layout {
            shape: shape.to_vec(),
            reg: reg.iter().map(flat).collect(),
            lane: lane.iter().map(flat).collect(),
            warp: warp.iter().map(flat).collect(),
        }
    }

    /// Registers per thread.
    pub fn num_regs(&self) -> usize {
        1 << self.reg.len()
    }

    /// Number of elements of the tile.
    pub fn numel(&self) -> u32 {
        numel(&self.shape)
    }

    /// The flat element index held by register `reg` of lane `lane` in warp `warp`.
    pub fn elem_index(&self, reg: u32, lane: u32, warp: u32) -> u32 {
        xor_bases(&self.reg, reg) ^ xor_bases(&self.lane, lane) ^ xor_bases(&self.warp, warp)
    }

    /// The register part of the element index of register `reg`.
    pub fn reg_offset(&self, reg: u32) -> u32 {
        xor_bases(&self.reg, reg)
    }

    /// The bits any lane or warp basis can set.
    pub fn thread_mask(&self) -> u32 {
        self.lane.iter().chain(&self.warp).fold(0, |a, b| a | b)
    }

    /// True when every basis is zero or a single bit.
    pub fn is_bit_layout(&self) -> bool {
        self.reg
            .iter()
            .chain(&self.lane)
            .chain(&self.warp)
            .all(|b| b.count_ones() <= 1)
    }

    /// True when all threads hold the same elements (lane and warp bases are zero).
    pub fn is_thread_uniform(&self) -> bool {
        self.lane.iter().chain(&self.warp).all(|&b| b == 0)
    }

    /// The same layout for a shape of equal element count whose flat row-major order
    /// is the same (`reshape`, `expand_dims`).
    pub fn with_shape(&self, shape: &[u32]) -> Layout {
        debug_assert_eq!(numel(shape), self.numel());
        Layout {
            shape: shape.to_vec(),
            ..self.clone()
        }
    }

    /// Applies a linear map `f` on flat indices (given by the image of each index bit
    /// of `self.shape`) to every basis, giving a layout of `shape`.
    pub fn compose_bits(&self, shape: &[u32], bit_images: &[u32]) -> Layout {
        let map = |b: &u32| xor_bases(bit_images, *b);
        Layout {
            shape: shape.to_vec(),
            reg: self.reg.iter().map(map).collect(),
            lane: self.lane.iter().map(map).collect(),
            warp: self.warp.iter().map(map).collect(),
        }
    }

    /// The layout of the result of reducing `axis`: register bits whose bases lie in
    /// the axis are dropped (their registers get combined), lane and warp bases in the
    /// axis become zero (the combined value is replicated there), and the remaining
    /// bases are projected onto the result shape. Requires [`Layout::is_bit_layout`].
    pub fn sliced(&self, axis: usize) -> Layout {
        let (images, axis_mask) = slice_bit_images(&self.shape, axis);
        let mut shape = self.shape.clone();
        shape.remove(axis);
        let map = |b: &u32| xor_bases(&images, *b);
        Layout {
            reg: self
                .reg
                .iter()
                .filter(|&&b| b & axis_mask == 0 || b == 0)
                .map(map)
                .collect(),
            lane: self.lane.iter().map(map).collect(),
            warp: self.warp.iter().map(map).collect(),
            shape,
        }
    }
}

impl std::fmt::Display for Layout {
    /// `[shape] reg … | lane … | warp …`, each basis as the coordinates of the element
    /// it selects (`-` for a zero basis: replication).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(u32::to_string).collect();
        write!(f, "[{}]", dims.join("x"))?;
        for (name, bases) in [
            ("reg", &self.reg),
            ("lane", &self.lane),
            ("warp", &self.warp),
        ] {
            write!(f, " {name}")?;
            for &b in bases {
                if b == 0 {
                    write!(f, " -")?;
                } else {
                    let c: Vec<String> =
                        coords(&self.shape, b).iter().map(u32::to_string).collect();
                    write!(f, " ({})", c.join(","))?;
                }
            }
            if name != "warp" {
                write!(f, " |")?;
            }
        }
        Ok(())
    }
}

/// XOR of the bases of the set bits of `x`.
pub fn xor_bases(bases: &[u32], x: u32) -> u32 {
    bases
        .iter()
        .enumerate()
        .filter(|(i, _)| x >> i & 1 == 1)
        .fold(0, |a, (_, b)| a ^ b)
}

/// Flat row-major index of coordinates `c` in `shape`.
pub fn flat_index(shape: &[u32], c: &[u32]) -> u32 {
    shape.iter().zip(c).fold(0, |a, (&d, &x)| a * d + x)
}

/// Coordinates of flat index `i` in `shape`.
pub fn coords(shape: &[u32], mut i: u32) -> Vec<u32> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d];
        i /= shape[d];
    }
    c
}

/// The first flat-index bit of each dimension (row-major: the last dim is lowest).
pub fn dim_bit_offsets(shape: &[u32]) -> Vec<u32> {
    let mut off = vec![0; shape.len()];
    let mut acc = 0;
    for d in (0..shape.len()).rev() {
        off[d] = acc;
        acc += log2(shape[d]);
    }
    off
}

/// For reducing `axis` of `shape`: the image in the result's flat index of each bit of
/// the source flat index (zero for the axis bits), and the mask of the axis bits.
pub fn slice_bit_images(shape: &[u32], axis: usize) -> (Vec<u32>, u32) {
    let n = log2(numel(shape));
    let off = dim_bit_offsets(shape);
    let lo = off[axis];
    let w = log2(shape[axis]);
    let images = (0..n)
        .map(|b| {
            if b < lo {
                1 << b
            } else if b < lo + w {
                0
            } else {
                1 << (b - w)
            }
        })
        .collect();
    (images, ((1u64 << (lo + w)) - (1u64 << lo)) as u32)
}

/// For `broadcast` from `src` to `dst` (same rank): the image in the source flat index
/// of each bit of the destination flat index (zero for broadcast dimensions).
pub fn broadcast_bit_images(src: &[u32], dst: &[u32]) -> Vec<u32> {
    let (so, dof) = (dim_bit_offsets(src), dim_bit_offsets(dst));
    let mut images = vec![0; log2(numel(dst)) as usize];
    for d in 0..dst.len() {
        if src[d] == dst[d] {
            for b in 0..log2(dst[d]) {
                images[(dof[d] + b) as usize] = 1 << (so[d] + b);
            }
        }
    }
    images
}

/// For `permute` with `order` (result dim `i` is source dim `order[i]`): the image in
/// the source flat index of each bit of the result flat index.
pub fn permute_bit_images(src: &[u32], order: &[u8]) -> Vec<u32> {
    let dst: Vec<u32> = order.iter().map(|&o| src[o as usize]).collect();
    let (so, dof) = (dim_bit_offsets(src), dim_bit_offsets(&dst));
    let mut images = vec![0; log2(numel(&dst)) as usize];
    for (i, &o) in order.iter().enumerate() {
        for b in 0..log2(dst[i]) {
            images[(dof[i] + b) as usize] = 1 << (so[o as usize] + b);
        }
    }
    images
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element is held by some (reg, lane, warp).
    fn covers(l: &Layout, ws: u32, nw: u32) -> bool {
        let mut seen = vec![false; l.numel() as usize];
        for w in 0..nw {
            for t in 0..ws {
                for r in 0..l.num_regs() as u32 {
                    seen[l.elem_index(r, t, w) as usize] = true;
                }
            }
        }
        seen.iter().all(|&s| s)
    }

    #[test]
    fn blocked_is_a_bijection_when_large() {
        let l = Layout::blocked(&[4, 1024], 4, 32, 4);
        assert_eq!(l.num_regs(), 32);
        let mut seen = vec![0u32; 4096];
        for w in 0..4 {
            for t in 0..32 {
                for r in 0..32 {
                    seen[l.elem_index(r, t, w) as usize] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&c| c == 1));
        // vec contiguous, then lanes.
        assert_eq!(l.elem_index(1, 0, 0), 1);
        assert_eq!(l.elem_index(0, 1, 0), 4);
        assert_eq!(l.elem_index(0, 0, 1), 128);
    }

    #[test]
    fn blocked_replicates_small_tiles() {
        let l = Layout::blocked(&[64], 4, 64, 4);
        assert!(covers(&l, 64, 4));
        assert_eq!(l.num_regs(), 4);
        assert_eq!(l.elem_index(0, 16, 0), 0, "lanes 16.. replicate");
        assert_eq!(l.warp, vec![0, 0]);
        let s = Layout::uniform(&[], 32, 4);
        assert_eq!(s.num_regs(), 1);
        assert!(s.is_thread_uniform());
    }

    #[test]
    fn slice_drops_axis() {
        let l = Layout::blocked(&[4, 1024], 4, 32, 4);
        let s = l.sliced(1);
        assert_eq!(s.shape, vec![4]);
        assert_eq!(s.num_regs(), 4);
        assert!(s.is_thread_uniform());
        assert!(covers(&s, 32, 4));
        let l = Layout::blocked(&[64, 4], 4, 32, 4);
        let s = l.sliced(1);
        assert_eq!(s.num_regs(), 1);
        assert!(covers(&s, 32, 4));
    }

    #[test]
    fn broadcast_and_permute_images() {
        let d = Layout::blocked(&[4, 1024], 4, 32, 4);
        let p = d.compose_bits(&[4, 1], &broadcast_bit_images(&[4, 1], &[4, 1024]));
        for r in 0..32 {
            let e = d.elem_index(r, 5, 2);
            assert_eq!(p.elem_index(r, 5, 2), e / 1024);
        }
        let src = [8u32, 16];
        let d = Layout::blocked(&[16, 8], 4, 32, 1);
        let p = d.compose_bits(&src, &permute_bit_images(&src, &[1, 0]));
        for r in 0..4 {
            for t in 0..32 {
                let c = coords(&[16, 8], d.elem_index(r, t, 0));
                assert_eq!(p.elem_index(r, t, 0), flat_index(&src, &[c[1], c[0]]));
            }
        }
    }
}

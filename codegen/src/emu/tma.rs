//! The tensor-memory accelerator and mbarriers of sm_90, for the emulator, from the
//! PTX ISA ("Tensor Memory Accelerator", "cp.async.bulk.tensor", "mbarrier") and the
//! CUDA driver's `cuTensorMapEncodeTiled`, not from the lowering.
//!
//! **Tensor maps.** A CUDA tensor map is an opaque 128-byte object the driver
//! encodes; the emulator's is [`EmuTensorMap`], which the runtime builds at launch
//! from the same fields (global address, extents and byte strides, innermost first;
//! the box; the swizzle) with the driver's documented checks.
//!
//! **A box copy** reads the box at coordinates `c` (innermost first): element `x` of
//! the box is global element `c + x` when every coordinate is inside the extents,
//! else zero (out-of-bounds fill). In shared memory the box is packed row by row
//! (`box[0] * elem` bytes per row), then swizzled: with the 128-, 64- or 32-byte
//! mode, address bits `4..` (the 16-byte chunk within the span) are XORed with bits
//! `7..` (3, 2 or 1 bits) of the same shared address.
//!
//! **A box store** reads the box from shared memory with the same packing and swizzle
//! and writes its elements inside the extents; the emulator performs it when the
//! issuing thread waits for its bulk group (`cp.async.bulk.wait_group.read`).
//!
//! **Mbarriers.** An mbarrier has a phase count, the arrivals pending in the
//! current phase (reset to the init count when a phase completes) and a transaction
//! count: `expect_tx` raises it, the bytes of a copy that lands lower it, and the
//! phase completes when both reach zero. A wait for the phase of parity `p` returns
//! once the current phase's parity is not `p`. An arrival releases the arriving
//! thread's earlier shared reads to a thread whose wait sees the phase complete (so
//! a TMA copy that thread then issues into those bytes is no race: a
//! warp-specialized producer refilling a slot its consumers released). Copies land lazily: only when a
//! thread waits for the phase they complete, so a kernel that reads a box without
//! waiting (or waits for the wrong phase) reads stale shared memory.
//!
//! **Clusters** (PTX ISA, "Cluster of Cooperative Thread Arrays", "mapa",
//! "barrier.cluster", `.multicast::cluster`). A launch in clusters runs each
//! cluster's blocks together on one worker, so they can wait for each other. A
//! multicast copy lands its box at the same shared offset in every block of its CTA
//! mask and completes its bytes on the mbarrier at the same offset there (each block
//! announces the bytes it expects itself; before its arrival, its transaction count
//! may go below zero). An arrival through `mapa` lands on another block's mbarrier.
//! Arrivals are recorded per warp of the cluster (`rank * 32 + warp`), so a producer
//! whose wait sees a phase completed by another block's consumers may overwrite what
//! they read. A copy into another block over bytes read there and not released so is
//! a race; reaching a block whose threads all exited is an error.

/// The emulator's tensor map: what `cuTensorMapEncodeTiled` encodes for a CUDA
/// launch (a tensor's address, extents and strides, the box a copy moves and its
/// swizzle), checked as the driver checks it ([`EmuTensorMap::new`]). A launch
/// reads it through an id: [`EmuTensorMap::register`] it and pass the handle's
/// [`TensorMapHandle::id`] as the kernel's tensor-map argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmuTensorMap {
    /// The tensor's global (host) address.
    pub(crate) base: u64,
    /// Rank, 1 to 3.
    pub(crate) rank: u32,
    /// Bytes of one element: 1, 2 or 4.
    pub(crate) elem_bytes: u32,
    /// The swizzle span in bytes: 0 (none), 32, 64 or 128.
    pub(crate) swizzle: u32,
    /// Extents, innermost first.
    pub(crate) dims: [u64; 3],
    /// Byte strides of dimensions 1.. (index 0 unused: the innermost stride is the
    /// element).
    pub(crate) strides: [u64; 3],
    /// The box, innermost first.
    pub(crate) box_dims: [u32; 3],
}

impl EmuTensorMap {
    /// A map of the tensor at `base` with `dims` and element `strides` (outermost
    /// first, as the language gives them; the last stride 1), copied in boxes of
    /// `box_dims` (outermost first) with a `swizzle`-byte swizzle. Checks what
    /// `cuTensorMapEncodeTiled` documents: a 16-byte aligned address, byte strides
    /// that are multiples of 16, box dimensions of 1 to 256, an inner box row that is a
    /// multiple of 16 bytes and, when swizzled, at most the swizzle span.
    pub fn new(
        base: u64,
        elem_bytes: u32,
        dims: &[u64],
        strides: &[u64],
        box_dims: &[u32],
        swizzle: u32,
    ) -> Result<EmuTensorMap, String> {
        let r = dims.len();
        if !(1..=3).contains(&r) || strides.len() != r || box_dims.len() != r {
            return Err(format!("a tensor map of rank {r}"));
        }
        if !matches!(elem_bytes, 1 | 2 | 4) || !matches!(swizzle, 0 | 32 | 64 | 128) {
            return Err(format!(
                "{elem_bytes}-byte elements with a {swizzle}-byte swizzle"
            ));
        }
        if !base.is_multiple_of(16) {
            return Err(format!("global address {base:#x} is not 16-byte aligned"));
        }
        let mut m = EmuTensorMap {
            base,
            rank: r as u32,
            elem_bytes,
            swizzle,
            dims: [1; 3],
            strides: [0; 3],
            box_dims: [1; 3],
        };
        for i in 0..r {
            let o = r - 1 - i; // outermost-first index of innermost-first `i`
            m.dims[i] = dims[o];
            m.box_dims[i] = box_dims[o];
            if !(1..=256).contains(&box_dims[o]) {
                return Err(format!("box dimension {} is not in 1..=256", box_dims[o]));
            }
            if i > 0 {
                let b = strides[o] * elem_bytes as u64;
                if !b.is_multiple_of(16) {
                    return Err(format!(
                        "stride of {} elements ({b} bytes) is not a multiple of 16 bytes",
                        strides[o]
                    ));
                }
                m.strides[i] = b;
            }
        }
        let row = m.box_dims[0] * elem_bytes;
        if !row.is_multiple_of(16) || (swizzle != 0 && row > swizzle) {
            return Err(format!(
                "an inner box row of {row} bytes with a {swizzle}-byte swizzle"
            ));
        }
        Ok(m)
    }

    /// Bytes of one box.
    pub(crate) fn box_bytes(&self) -> usize {
        self.box_dims.iter().map(|&b| b as usize).product::<usize>() * self.elem_bytes as usize
    }

    /// The shared-memory offset (from `dst`, the box's destination, whose own offset
    /// from the 1024-aligned shared base is `dst_off`) of the box's byte `linear`
    /// (row-major packing): the swizzle applies to the absolute offset's bits.
    pub(crate) fn swizzled(&self, dst_off: usize, linear: usize) -> usize {
        let a = dst_off + linear;
        let bits = match self.swizzle {
            128 => 7,
            64 => 3,
            32 => 1,
            _ => 0,
        };
        (a ^ (((a >> 7) & bits) << 4)) - dst_off
    }

    /// For each row of the box at `coords` (innermost first): its byte offset in the
    /// packed box, and the global address of its in-bounds run with the run's byte
    /// offset within the row and length (`None` when the row is entirely outside).
    pub(crate) fn rows(&self, coords: [i32; 3]) -> Vec<(usize, Option<Run>)> {
        let e = self.elem_bytes as i64;
        let bd = self.box_dims.map(|b| b as i64);
        let row_bytes = (bd[0] * e) as usize;
        let mut out = Vec::with_capacity((bd[1] * bd[2]) as usize);
        for z in 0..bd[2] {
            for y in 0..bd[1] {
                let lin = ((z * bd[1] + y) as usize) * row_bytes;
                let g = [coords[0] as i64, coords[1] as i64 + y, coords[2] as i64 + z];
                let outer_in = (1..3).all(|d| 0 <= g[d] && g[d] < self.dims[d] as i64);
                // The inner run: x in [lo, hi) of the box.
                let lo = (-g[0]).clamp(0, bd[0]);
                let hi = (self.dims[0] as i64 - g[0]).clamp(0, bd[0]);
                let run = if outer_in && hi > lo {
                    let addr = self.base as i64
                        + (g[0] + lo) * e
                        + g[1] * self.strides[1] as i64
                        + g[2] * self.strides[2] as i64;
                    Some((addr as u64, (lo * e) as usize, ((hi - lo) * e) as usize))
                } else {
                    None
                };
                out.push((lin, run));
            }
        }
        out
    }
}

/// The tensor maps of running launches, by id: a kernel's tensor-map argument is an
/// id the emulator looks up here (never an address it dereferences).
static REGISTRY: std::sync::Mutex<Option<std::collections::HashMap<u64, EmuTensorMap>>> =
    std::sync::Mutex::new(None);
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn registry() -> std::sync::MutexGuard<'static, Option<std::collections::HashMap<u64, EmuTensorMap>>>
{
    // A poisoned lock still holds a consistent map (inserts and removes are single calls).
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A registered [`EmuTensorMap`]: pass [`TensorMapHandle::id`] as the kernel's
/// tensor-map argument; dropping the handle unregisters the map.
#[derive(Debug)]
pub struct TensorMapHandle {
    id: u64,
}

impl TensorMapHandle {
    /// The value the kernel's `_tmap` parameter takes (a multiple of 64, never 0).
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for TensorMapHandle {
    fn drop(&mut self) {
        if let Some(m) = registry().as_mut() {
            m.remove(&self.id);
        }
    }
}

impl EmuTensorMap {
    /// Registers the map for launches (see [`TensorMapHandle`]).
    pub fn register(self) -> TensorMapHandle {
        let id = 64 * NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        registry()
            .get_or_insert_with(Default::default)
            .insert(id, self);
        TensorMapHandle { id }
    }
}

/// The registered map with id `id`.
pub(crate) fn lookup(id: u64) -> Option<EmuTensorMap> {
    registry().as_ref()?.get(&id).copied()
}

/// The in-bounds part of one box row: global address, byte offset in the row, bytes.
pub(crate) type Run = (u64, usize, usize);

/// A box whose bytes land in shared memory when its mbarrier phase is waited for.
pub(crate) struct Landing {
    /// Offset in shared memory and the bytes, per 16-byte chunk.
    pub chunks: Vec<(usize, [u8; 16])>,
    /// Transaction bytes it completes.
    pub bytes: i64,
}

/// One mbarrier's state (see the module docs).
pub(crate) struct Mbar {
    pub count: u32,
    pub pending: u32,
    pub tx: i64,
    pub phase: u32,
    pub landings: Vec<Landing>,
    /// The arrivals of the current phase: warp, its arrival count after arriving.
    pub arrived: Vec<(u32, u32)>,
    /// Those of the last completed phase, which a wait that sees it acquires.
    pub released: Vec<(u32, u32)>,
}

impl Mbar {
    pub(crate) fn new(count: u32) -> Mbar {
        Mbar {
            count,
            pending: count,
            tx: 0,
            phase: 0,
            landings: Vec::new(),
            arrived: Vec::new(),
            released: Vec::new(),
        }
    }

    /// Completes the current phase when no arrivals and no transaction bytes are
    /// outstanding.
    pub(crate) fn try_complete(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.phase += 1;
            self.pending = self.count;
            self.released = std::mem::take(&mut self.arrived);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_swizzle_is_the_address_bit_xor() {
        let m = EmuTensorMap::new(0, 2, &[64, 64], &[64, 1], &[64, 64], 128).unwrap();
        // Row r (128 bytes) has its 16-byte chunk c at chunk c ^ (r % 8).
        for r in 0..16usize {
            for c in 0..8usize {
                let lin = r * 128 + c * 16;
                assert_eq!(m.swizzled(0, lin), r * 128 + ((c ^ (r % 8)) * 16));
            }
        }
        let m = EmuTensorMap::new(0, 2, &[64, 32], &[32, 1], &[64, 32], 64).unwrap();
        // 64-byte rows: chunk c (of 4) XOR (r / 2) % 4.
        for r in 0..16usize {
            for c in 0..4usize {
                assert_eq!(
                    m.swizzled(0, r * 64 + c * 16),
                    r * 64 + (c ^ ((r / 2) % 4)) * 16
                );
            }
        }
    }

    #[test]
    fn rows_clip_to_the_extents() {
        let m = EmuTensorMap::new(4096, 2, &[3, 5], &[8, 1], &[4, 8], 0).unwrap();
        let rows = m.rows([-2, 1, 0]);
        assert_eq!(rows.len(), 4);
        // Row 0 is tensor row 1, columns -2..6 of which 0..5 exist: box bytes 4..14.
        assert_eq!(rows[0], (0, Some((4096 + 16, 4, 10))));
        assert_eq!(rows[1].1, Some((4096 + 32, 4, 10)));
        assert_eq!(rows[2].1, None); // tensor row 3 is past the 3 rows
        assert!(EmuTensorMap::new(8, 2, &[4, 4], &[4, 1], &[4, 8], 0).is_err());
        assert!(EmuTensorMap::new(16, 2, &[4, 4], &[4, 1], &[4, 128], 128).is_err());
    }
}

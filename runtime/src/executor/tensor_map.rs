//! A launch's tensor maps (TMA), built once, by one builder for every executor that
//! has them: the emulator (`emu-sm90a`, its own maps) and GPUs (`sm_90a`, the
//! driver's).
//!
//! Contract: [`build`] gives each tensor descriptor of the launch ([`TmaRequest`],
//! made by [`crate::launch`]'s flattening) a map when its blocks have a TMA box and
//! the tensor meets TMA's alignment (16-byte base and byte strides), and when the
//! executor's encoder makes one; the map's value (a device address, or the
//! emulator's handle id) fills the descriptor's tensor-map parameter and the
//! parameter is specialized as one (`ParamFacts::tensor_map`). A descriptor without
//! a map keeps the value 0 and reads through masked loads, with the same results.
//! What [`build`] returns keeps the maps alive: hold it until the launch is queued.

use tessera_ir::ParamFacts;
use tessera_ir::types::ScalarType;

use super::FlatArg;
use crate::backend::TensorMapSpec;
use crate::error::Error;

/// A descriptor's tensor map to build at launch: the flat argument it fills, the
/// buffer argument, and the descriptor's element type, shape, strides and block.
pub(crate) struct TmaRequest {
    /// The tensor-map parameter (0 unless a map is built).
    pub(crate) tmap_arg: usize,
    /// The descriptor's buffer parameter.
    pub(crate) buf_arg: usize,
    pub(crate) elem: ScalarType,
    /// Extents and element strides, outermost first.
    pub(crate) shape: Vec<i32>,
    pub(crate) strides: Vec<i32>,
    /// The block the kernel reads.
    pub(crate) block: Vec<u32>,
}

/// What a tensor map of a descriptor is built from (the driver's or the emulator's).
struct TmaMap {
    elem_bytes: u32,
    /// Extents and element strides, outermost first.
    dims: Vec<u64>,
    strides: Vec<u64>,
    /// The box (`TmaBox::box_dims`) and its swizzle span.
    box_dims: Vec<u32>,
    swizzle: u32,
}

impl TmaRequest {
    /// The map of this descriptor at `base`, when its blocks have a TMA box
    /// (`tessera_ir::tensor_desc::TmaBox`) and the tensor meets TMA's alignment
    /// (16-byte base and byte strides).
    fn map(&self, base: u64) -> Option<TmaMap> {
        let e = self.elem.size_bytes() as u64;
        let b = tessera_ir::tensor_desc::TmaBox::for_block(e as u32, &self.block)?;
        let strides_ok = self.strides[..self.strides.len() - 1]
            .iter()
            .all(|&s| (s as u64 * e).is_multiple_of(16));
        (base.is_multiple_of(16) && strides_ok).then(|| TmaMap {
            elem_bytes: e as u32,
            dims: self.shape.iter().map(|&v| v as u64).collect(),
            strides: self.strides.iter().map(|&v| v as u64).collect(),
            box_dims: b.box_dims,
            swizzle: b.swizzle_bytes,
        })
    }
}

/// Builds the tensor maps of `requests` for a launch with arguments `args`:
/// `address` gives a buffer argument's address on the executor's device (`None`:
/// no map), `encode` makes the map of a [`TensorMapSpec`] (`Ok(None)` where it will
/// not: the descriptor then reads through masked loads) as its parameter value and
/// what keeps it alive, and `set` writes that value to the flat argument it fills;
/// the parameter's facts in `spec` say it is a tensor map. Returns the keep-alives.
pub(crate) fn build<K>(
    args: &[FlatArg<'_>],
    requests: &[TmaRequest],
    address: impl Fn(&FlatArg<'_>) -> Option<u64>,
    spec: &mut [ParamFacts],
    mut encode: impl FnMut(&TensorMapSpec<'_>) -> Result<Option<(u64, K)>, Error>,
    mut set: impl FnMut(usize, u64),
) -> Result<Vec<K>, Error> {
    let mut keep = Vec::new();
    for t in requests {
        let Some(base) = args.get(t.buf_arg).and_then(&address) else {
            continue;
        };
        let Some(m) = t.map(base) else {
            continue;
        };
        let built = encode(&TensorMapSpec {
            base,
            elem_bytes: m.elem_bytes,
            dims: &m.dims,
            strides: &m.strides,
            box_dims: &m.box_dims,
            swizzle: m.swizzle,
        })?;
        if let Some((value, k)) = built {
            set(t.tmap_arg, value);
            spec[t.tmap_arg].tensor_map = true;
            keep.push(k);
        }
    }
    Ok(keep)
}

use tessera::prelude::*;

// A 1-D tile of 2^40 elements: its dimension is a power of two, but larger than a tile
// may be (2^20 elements). Reported as such, not as "not a power of two".
#[kernel]
fn k(y: &mut Global<f32>) {
    let offs = arange::<{ 1 << 40 }>();
    y.store_unmasked(offs, offs.cast::<f32>());
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = arange::<64>();
    let double = |t: Tile<f32, S1<64>>| t * 2.0;
    out.store_unmasked(offs, double(x.load_unmasked(offs)));
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(d: &TensorDesc<f32, S2<16, 16>>, out: &mut Global<f32>) {
    let t = d.load([0, 0, 0]);
    out.store_unmasked(arange::<16>(), t.sum::<1>());
}

fn main() {}

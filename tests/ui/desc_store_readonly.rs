use tessera::prelude::*;

#[kernel]
fn k(d: &TensorDesc<f32, S2<16, 16>>) {
    let t = d.load([0, 0]);
    d.store([0, 0], t * 2.0);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = arange::<64>();
    let y = softmax(x.load_unmasked(offs));
    out.store_unmasked(offs, y);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>, y: &Global<f16>, out: &mut Global<f32>) {
    let offs = arange::<64>();
    let v = x.load_unmasked(offs) + y.load_unmasked(offs);
    out.store_unmasked(offs, v);
}

fn main() {}

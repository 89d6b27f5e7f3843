use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>) {
    let offs = arange::<64>();
    let v = x.load_unmasked(offs);
    x.store_unmasked(offs, v * 2.0);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = arange::<64>();
    let mut v = x.load_unmasked(offs);
    if v.gt(0.0) {
        v = v * 2.0;
    }
    out.store_unmasked(offs, v);
}

fn main() {}

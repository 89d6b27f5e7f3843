use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>, out: &mut Global<u16>) {
    let offs = arange::<64>();
    out.store_unmasked(offs, x.load_unmasked(offs).bitcast::<u16>());
}

fn main() {}

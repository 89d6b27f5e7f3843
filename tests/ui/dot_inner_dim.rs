use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<f32>) {
    let a = zeros::<f16, S2<32, 64>>();
    let b = zeros::<f16, S2<32, 16>>();
    let acc = zeros::<f32, S2<32, 16>>();
    let c = dot(a, b, acc);
    let offs = arange::<32>().expand_dims::<1>() * 16 + arange::<16>().expand_dims::<0>();
    out.store_unmasked(offs, c);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(x: &mut Global<f32>) {
    let r = arange::<16>().expand_dims::<1>();
    let c = arange::<32>().expand_dims::<0>();
    let offs = r * 32 + c; // 16 x 32
    // A 16 x 1 mask broadcasts; a 32-long row does not.
    x.store(offs, offs.cast::<f32>(), r.lt(8));
    x.store(offs, offs.cast::<f32>(), arange::<32>().lt(8));
}

fn main() {}

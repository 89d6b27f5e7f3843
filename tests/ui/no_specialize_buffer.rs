use tessera::prelude::*;

#[kernel]
fn k(#[no_specialize] x: &mut Global<f32>, #[no_specialize] n: i32) {
    let offs = arange::<64>();
    x.store(offs, offs.cast::<f32>(), offs.lt(n));
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>) -> Tile<f32, S1<64>> {
    x.load_unmasked(arange::<64>())
}

fn main() {}

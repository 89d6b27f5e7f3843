use tessera::prelude::*;

// Arithmetic with a literal on either side of an 8-bit float tile: the error says to
// cast first, as for two tiles (`fp8_arithmetic.rs`). After a cast it compiles.
#[kernel]
fn k(x: &Global<F8E5M2>, y: &mut Global<F8E5M2>, z: &mut Global<f32>) {
    let offs = arange::<16>();
    let a = x.load_unmasked(offs);
    y.store_unmasked(offs, a * 2.0);
    y.store_unmasked(offs, 2.0f32 * a);
    z.store_unmasked(offs, a.cast::<f32>() * 2.0);
}

fn main() {}

use tessera::prelude::*;

// The 8-bit floats are storage and `dot` types: arithmetic on them does not compile
// (cast to f16 or f32 first).
#[kernel]
fn k(x: &Global<F8E4M3>, y: &mut Global<F8E4M3>) {
    let offs = arange::<16>();
    let m = offs.lt(16);
    let a = x.load(offs, m);
    y.store(offs, a + a, m);
}

fn main() {}

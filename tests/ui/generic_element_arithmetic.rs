use tessera::prelude::*;

// A kernel generic over its element type may bound it with just `DType` to move data
// (buffers need `Element`, which `#[kernel]` asks of `T` at launch), but arithmetic
// needs `Num`: the error says so, and suggests the bound.
#[kernel]
fn copy<T: DType>(x: &Global<T>, y: &mut Global<T>) {
    let offs = arange::<16>();
    y.store_unmasked(offs, x.load_unmasked(offs));
}

#[kernel]
fn twice<T: DType>(x: &Global<T>, y: &mut Global<T>) {
    let offs = arange::<16>();
    let a = x.load_unmasked(offs);
    y.store_unmasked(offs, a + a);
}

fn main() {}

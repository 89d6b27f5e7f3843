use tessera::prelude::*;

#[kernel]
fn k<T: Num = f32, const B: usize = 64>(x: &Global<T>, out: &mut Global<T>) {
    let offs = arange::<B>();
    out.store_unmasked(offs, x.load_unmasked(offs));
}

fn main() {}

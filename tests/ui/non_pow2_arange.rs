use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>) {
    let offs = arange::<100>();
    out.store_unmasked(offs, offs);
}

fn main() {}

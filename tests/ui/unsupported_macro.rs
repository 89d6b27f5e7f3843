use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>) {
    let offs = arange::<64>();
    todo!();
    out.store_unmasked(offs, offs);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>, n: String) {
    let offs = arange::<64>();
    out.store_unmasked(offs, offs);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>, n: i32) {
    let offs = arange::<n>();
    out.store_unmasked(offs, offs);
}

fn main() {}

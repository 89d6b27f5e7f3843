use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>) {
    let mut offs = arange::<64>();
    while offs.lt(100) {
        offs = offs * 2;
    }
    out.store_unmasked(offs, offs);
}

fn main() {}

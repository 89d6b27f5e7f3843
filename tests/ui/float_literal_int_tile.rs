use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>) {
    let offs = arange::<64>();
    out.store_unmasked(offs, offs + 0.5);
}

fn main() {}

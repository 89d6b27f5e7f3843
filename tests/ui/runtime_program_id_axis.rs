use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>, axis: i32) {
    let offs = program_id(axis) * 64 + arange::<64>();
    out.store_unmasked(offs, offs);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>) {
    let offs = arange::<64>() + arange::<128>();
    out.store_unmasked(offs, offs);
}

// A 2-D tile combined with a 1-D one: the missing `expand_dims`.
#[kernel]
fn k2(out: &mut Global<i32>) {
    let rows = arange::<32>().expand_dims::<1>() * 16;
    let offs = rows + arange::<16>();
    out.store_unmasked(offs, offs);
}

fn main() {}

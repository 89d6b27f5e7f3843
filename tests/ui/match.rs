use tessera::prelude::*;

#[kernel]
fn k<const B: usize>(out: &mut Global<i32>) {
    let offs = arange::<B>();
    let v = match B {
        64 => offs * 2,
        _ => offs,
    };
    out.store_unmasked(offs, v);
}

fn main() {}

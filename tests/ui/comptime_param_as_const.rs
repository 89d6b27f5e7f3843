use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>, #[comptime] block: usize) {
    let offs = arange::<block>();
    out.store_unmasked(offs, offs);
}

fn main() {}

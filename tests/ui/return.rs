use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>, #[comptime] skip: bool) {
    if skip {
        return;
    }
    let offs = arange::<16>();
    out.store_unmasked(offs, offs);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(out: &mut Global<i32>, #[comptime] stride: Option<i32>) {
    let offs = arange::<64>();
    if let Some(s) = stride {
        out.store_unmasked(offs * s, offs);
    }
}

fn main() {}

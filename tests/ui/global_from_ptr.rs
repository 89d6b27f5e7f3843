use tessera::prelude::*;

// A writable `Global` cannot be made from a read-only one's pointer.
#[kernel]
fn k(x: &Global<f32>) {
    let offs = arange::<64>();
    let mut w = tessera::ir::dsl::Global::<f32>::from_ptr(x.id());
    w.store_unmasked(offs, offs.cast::<f32>());
}

fn main() {}

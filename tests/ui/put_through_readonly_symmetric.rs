use tessera::prelude::*;

#[kernel]
fn k(data: &Symmetric<f32>) {
    let offs = arange::<64>();
    // `put` writes the peer's copy: it needs `&mut Symmetric<f32>`.
    data.put(1, offs, data.load_unmasked(offs), offs.lt(64));
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = arange::<B>();
    // Comparisons of Rust values still work in a kernel body.
    if B < 4096 && 1.5f32 >= 0.5 {
        let v = x.load(offs, offs < n);
        out.store_unmasked(offs, v);
    }
}

fn main() {}

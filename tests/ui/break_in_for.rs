use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = arange::<64>();
    let mut acc = zeros::<f32, S1<64>>();
    for i in 0..n {
        if i.gt(8) {
            break;
        }
        acc = acc + x.load(offs + i, offs.lt(n));
    }
    out.store_unmasked(offs, acc);
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn k(data: &Symmetric<f32>) {
    // Signals are u64 words: a buffer of f32 has no `wait_until`.
    data.wait_until(0, CmpPred::Ge, 1u64);
}

fn main() {}

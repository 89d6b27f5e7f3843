use tessera::prelude::*;

#[kernel]
extern "C" fn k1(out: &mut Global<i32>) {
    out.store_unmasked(arange::<16>(), arange::<16>());
}

#[kernel]
async fn k2(out: &mut Global<i32>) {
    out.store_unmasked(arange::<16>(), arange::<16>());
}

#[kernel]
const fn k3(out: &mut Global<i32>) {
    out.store_unmasked(arange::<16>(), arange::<16>());
}

#[kernel]
unsafe fn k4(out: &mut Global<i32>) {
    out.store_unmasked(arange::<16>(), arange::<16>());
}

#[helper]
extern "C" fn h(x: Scalar<i32>) -> Scalar<i32> {
    x
}

fn main() {}

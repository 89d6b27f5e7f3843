use tessera::prelude::*;

#[kernel]
#[comptime]
fn k1(out: &mut Global<i32>) {
    out.store_unmasked(arange::<16>(), arange::<16>());
}

#[kernel]
#[inline]
#[must_use]
#[rustfmt::skip]
#[clippy::msrv = "1.85"]
#[some_crate::attribute]
fn k2(out: &mut Global<i32>) {
    out.store_unmasked(arange::<16>(), arange::<16>());
}

#[kernel]
fn k3(
    out: &mut Global<i32>,
    #[comptime]
    #[no_specialize]
    a: i32,
    #[allow(unused)] b: i32,
    #[comptime(yes)] c: i32,
) {
    #[comptime]
    let d = a + c;
    out.store_unmasked(arange::<16>(), arange::<16>() + b + d);
}

fn main() {}

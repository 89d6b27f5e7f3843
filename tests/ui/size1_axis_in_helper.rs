use tessera::prelude::*;

// A new user writes the size-1 axis of a kept reduction as `S2<R, 1>`; that is
// `(D<R>, D<1>)`, not the broadcasting `(D<R>, One)` that `sum_keepdims` makes. The
// helper's signature is rejected with the right spelling.
#[helper]
fn scale_rows<const R: usize, const C: usize>(
    x: Tile<f32, S2<R, C>>,
    s: Tile<f32, S2<R, 1>>,
) -> Tile<f32, S2<R, C>> {
    x / s
}

#[helper]
fn row_sums<const R: usize, const C: usize>(x: Tile<f32, S2<R, C>>) -> Tile<f32, S3<1, R, 1>> {
    x.sum_keepdims::<1>().expand_dims::<0>()
}

#[kernel]
fn normalize<const R: usize, const C: usize>(x: &Global<f32>, y: &mut Global<f32>) {
    let offs = arange::<R>().expand_dims::<1>() * C as i32 + arange::<C>().expand_dims::<0>();
    let t = x.load_unmasked(offs);
    y.store_unmasked(offs, scale_rows(t, t.sum_keepdims::<1>()));
}

fn main() {}

use tessera::prelude::*;

#[kernel]
fn add<const BLOCK: usize>(x: &Global<f32>, y: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs.lt(n);
    out.store(offs, x.load(offs, mask) + y.load(offs, mask), mask);
}

#[kernel]
fn sum_loop<const B: usize>(
    x: &Global<f32>,
    out: &mut Global<f32>,
    n: i32,
    #[comptime] scale: f32,
) {
    let mut acc = zeros::<f32, S1<B>>();
    for k in (0..n).step_by(B) {
        let offs = k + arange::<B>();
        acc = acc + x.load(offs, offs.lt(n));
    }
    if n.gt(5) {
        acc = acc * scale;
    } else {
        acc = acc * 2.0;
    }
    let mut j = program_id(0);
    while j.lt(10) {
        j = j + 1;
    }
    out.store(arange::<B>(), acc, arange::<B>().lt(j));
}

#[test]
fn builds() {
    let f = tessera::kernel_ir::<add<128>>(&()).unwrap();
    println!("{f:#?}");
    let f = tessera::kernel_ir::<sum_loop<64>>(&(3.0,)).unwrap();
    println!("{}", f.num_ops());
}

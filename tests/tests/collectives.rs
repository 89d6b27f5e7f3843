use tessera::prelude::*;

#[test]
fn smoke() {
    for algo in [AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot, AllReduceAlgo::LowLatency] {
        let out = World::local(2)
            .run(|r| {
                let v: Vec<f32> = (0..1500).map(|i| (i + r.rank() as usize * 10) as f32).collect();
                let mut b = r.upload(&v)?;
                r.all_reduce_with(&mut b, ReduceOp::Sum, algo)?;
                b.download()
            })
            .unwrap();
        println!("{algo:?} {:?}", &out[0][..4]);
        assert_eq!(out[0][3], 3.0 + 13.0);
    }
}

//! Device-side communication on CPU ranks: ping-pong, ring, barriers, litmus, atomics,
//! timeouts and bad peers.

use std::time::Duration;

use tessera::prelude::*;

/// Ping-pong: rank 0 writes a tile to rank 1 and signals; rank 1 waits, adds one,
/// sends it back. `rounds` times.
#[kernel]
fn ping_pong<const B: usize>(data: &mut Symmetric<f32>, sig: &mut Symmetric<u64>, rounds: i32) {
    let me = rank();
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    for r in 0..rounds {
        let round = (r + 1).cast::<u64>();
        if me.eq(0) {
            // Serve: send my tile, wait for the return.
            let v = data.load(offs, all);
            data.put_signal(1, offs, v, all, sig, 0, round, SignalOp::Set);
            sig.wait_until(1, CmpPred::Ge, round);
        } else {
            sig.wait_until(0, CmpPred::Ge, round);
            let v = data.load(offs, all) + 1.0f32;
            data.put_signal(0, offs, v, all, sig, 1, round, SignalOp::Set);
        }
    }
}

#[test]
fn ping_pong_two_ranks() {
    const B: usize = 64;
    let init: Vec<f32> = (0..B).map(|i| i as f32 * 0.5 - 3.0).collect();
    let out = World::local(2)
        .wait_timeout(Duration::from_secs(20))
        .run(|r| {
            let mut data = r.upload(&if r.rank() == 0 {
                init.clone()
            } else {
                vec![f32::NAN; B]
            })?;
            let mut sig = r.alloc_signals(2)?;
            ping_pong::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, 10))?;
            data.download()
        })
        .unwrap();
    let want: Vec<f32> = init.iter().map(|x| x + 10.0).collect();
    assert_eq!(out[0], want);
}

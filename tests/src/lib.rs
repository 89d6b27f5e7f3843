//! Shared helpers of the test suite: references, comparisons and poisoning.

/// Asserts `|got[i] - want[i]| <= tol(i)` for every element, naming the first bad
/// index. NaN (the poison value) always fails.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let err = (got[i] - want[i]).abs();
        assert!(
            err <= tol(i),
            "{what}: element {i}: got {} want {} (|err| {err:e} > tol {:e})",
            got[i],
            want[i],
            tol(i)
        );
    }
}

/// The 1-based line of the first line of `source` containing `marker`.
pub fn line_of(source: &str, marker: &str) -> u32 {
    source
        .lines()
        .position(|l| l.contains(marker))
        .map(|i| i as u32 + 1)
        .unwrap_or_else(|| panic!("marker {marker:?} not found"))
}

/// Kernels several communication test files use.
pub mod kernels {
    use tessera::prelude::*;

    /// Ping-pong between ranks 0 and 1, `rounds` times: rank 0 puts its tile to rank 1
    /// and signals; rank 1 waits, adds one, puts it back and signals. Other ranks idle.
    #[kernel]
    pub fn ping_pong<const B: usize>(
        data: &mut Symmetric<f32>,
        sig: &mut Symmetric<u64>,
        rounds: i32,
    ) {
        let me = rank();
        let offs = arange::<B>();
        let all = offs.lt(B as i32);
        for r in 0..rounds {
            let round = (r + 1).cast::<u64>();
            if me.eq(0) {
                let v = data.load(offs, all);
                data.put_signal(1, offs, v, all, sig, 0, round, SignalOp::Set);
                sig.wait_until(1, CmpPred::Ge, round);
            }
            if me.eq(1) {
                sig.wait_until(0, CmpPred::Ge, round);
                let v = data.load(offs, all) + 1.0f32;
                data.put_signal(0, offs, v, all, sig, 1, round, SignalOp::Set);
            }
        }
    }
}

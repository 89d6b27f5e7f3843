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

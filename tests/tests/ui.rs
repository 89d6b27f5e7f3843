//! Compile-fail UI tests: the error messages a kernel author gets for unsupported
//! syntax and for type errors in the tile language. Regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p tessera-tests --test ui` and review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
}

//! Helpers of the runtime's unit tests.

use std::path::PathBuf;

/// A fresh (not yet created) folder `name` inside a new temporary folder, which the
/// returned guard removes when dropped.
pub(crate) fn temp_dir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::Builder::new()
        .prefix(&format!("tessera-{name}-"))
        .tempdir()
        .expect("a temporary folder");
    let d = t.path().join(name);
    (t, d)
}

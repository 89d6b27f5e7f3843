//! Dumps of a kernel's compilation stages (`TESSERA_DUMP`, `TESSERA_DUMP_DIR`).

use std::hash::{Hash, Hasher};

use tessera_ir::Function;

use crate::error::Error;

/// True when `TESSERA_DUMP` lists `stage` (or `all`).
pub(crate) fn dump_enabled(stage: &str) -> Result<bool, Error> {
    Ok(crate::config::get()?.dump.contains(stage))
}

/// A hash of `parts`, naming dump files.
pub(crate) fn dump_hash(parts: &[&str]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

/// Writes `<TESSERA_DUMP_DIR>/<kernel>-<hash>.<ext>`
/// when `TESSERA_DUMP` lists `stage`.
pub(crate) fn dump_text(
    stage: &str,
    kernel: &str,
    hash: u64,
    ext: &str,
    text: &[u8],
) -> Result<(), Error> {
    let config = crate::config::get()?;
    if !config.dump.contains(stage) {
        return Ok(());
    }
    let dir = &config.dump_dir;
    let path = dir.join(format!("{kernel}-{hash:016x}.{ext}"));
    let io = |source| Error::Dump {
        what: stage.into(),
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(&path, text).map_err(io)
}

/// Writes `<TESSERA_DUMP_DIR>/<kernel>-<hash>.ir` when `TESSERA_DUMP` lists `ir`.
pub(crate) fn dump_ir(func: &Function, ct_key: &str) -> Result<(), Error> {
    if !dump_enabled("ir")? {
        return Ok(());
    }
    let text = tessera_ir::printer::print_function(func);
    let hash = dump_hash(&[ct_key, &text]);
    dump_text("ir", &func.name, hash, "ir", text.as_bytes())
}

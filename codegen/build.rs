//! The build's fingerprint: a SHA-256 over this crate's sources and the IR crate's
//! (when they are beside it, as in the workspace), exported as
//! `TESSERA_CODEGEN_FINGERPRINT`. Compiled CPU code cached on disk is keyed by it, so
//! a change to the lowering never runs code an older build compiled, while users'
//! own rebuilds (which change neither) keep their cache.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut h = Sha256::new();
    h.update(std::env::var("CARGO_PKG_VERSION").unwrap_or_default());
    for dir in [here.join("src"), here.join("../dsl-ir/src")] {
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut list = Vec::new();
        files(&dir, &mut list);
        list.sort();
        for p in list {
            let rel = p.strip_prefix(&here).unwrap_or(&p);
            h.update((rel.to_string_lossy().len() as u64).to_le_bytes());
            h.update(rel.to_string_lossy().as_bytes());
            let body = std::fs::read(&p).unwrap_or_default();
            h.update((body.len() as u64).to_le_bytes());
            h.update(&body);
        }
    }
    let hex: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("cargo:rustc-env=TESSERA_CODEGEN_FINGERPRINT={hex}");
}

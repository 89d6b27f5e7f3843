//! The runtime's modules form no import cycle, and its bottom layers import nothing
//! from above them; tessera-ir's and tessera-codegen's files form no import cycle (a
//! file-level check, `file_graph`, below).
//!
//! A module is a file or folder directly under `runtime/src` (`launch.rs`, `world/`);
//! module A *uses* module B when A's code names `crate::B`, `crate::{.., B, ..}` or
//! `tessera::B` (the runtime's `#[kernel]`s expand to `::tessera::` paths), or a name
//! `lib.rs` re-exports from B (`crate::Device` is a use of `device`). Comments are not
//! code. The layering the modules follow is written in `runtime/src/lib.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `src` without comments (doc comments included) and without the contents of
/// string and character literals (raw strings included).
fn code_of(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if c.get(i + 1) == Some(&'*') => {
                i += 2;
                while i < c.len() && !(c[i] == '*' && c.get(i + 1) == Some(&'/')) {
                    i += 1;
                }
                i += 2;
            }
            // A character literal that could be taken for something else: '"', '\'', '\\'.
            '\'' if c.get(i + 1) == Some(&'\\') && c.get(i + 3) == Some(&'\'') => i += 4,
            '\'' if c.get(i + 2) == Some(&'\'') => i += 3,
            'r' if !c[..i].last().is_some_and(|&p| is_ident(p))
                && matches!(c.get(i + 1), Some('"') | Some('#')) =>
            {
                // A raw string: r"..", r#".."#, ...
                let mut j = i + 1;
                let mut hashes = 0;
                while c.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if c.get(j) != Some(&'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                while j < c.len() {
                    if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    if c[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifiers a path group `{a, b::c, d as e, {f}}` starts with (its top level).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    let mut cur = String::new();
    for c in group.chars() {
        match c {
            '{' => {
                depth += 1;
                expect_head = false;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => expect_head = true,
            c if is_ident(c) && expect_head && depth == 0 => cur.push(c),
            _ => {
                if !cur.is_empty() {
                    heads.push(std::mem::take(&mut cur));
                    expect_head = false;
                }
            }
        }
    }
    if !cur.is_empty() {
        heads.push(cur);
    }
    heads
}

/// The first path segments after every `crate::` and `tessera::` in `code`.
fn named_roots(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for prefix in ["crate::", "tessera::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(prefix) {
            let start = from + at;
            from = start + prefix.len();
            // `tessera_ir::` and `my_crate::` are other paths.
            if code[..start].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let rest = &code[from..];
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1;
                let end = group
                    .char_indices()
                    .find(|&(_, c)| {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map_or(group.len(), |(i, _)| i);
                out.extend(group_heads(&group[..end]));
            } else {
                let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
    }
    out
}

/// The modules under `src` and the `.rs` files of each.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("readable folder")
            .map(|e| e.expect("readable entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let mut all = Vec::new();
    files(src, &mut all);
    let mut mods: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for p in all {
        let rel = p.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a component");
        let name = Path::new(first.as_os_str())
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        if name != "lib" {
            mods.entry(name).or_default().push(p);
        }
    }
    mods
}

/// The names `lib.rs` re-exports from a module (`pub use device::{Device, ..}`), to
/// that module.
fn reexports(lib: &str, mods: &BTreeMap<String, Vec<PathBuf>>) -> BTreeMap<String, String> {
    let code = code_of(lib);
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        let path = stmt[at + "pub use ".len()..].trim();
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        if !mods.contains_key(module) {
            continue;
        }
        let names = match rest.strip_prefix('{') {
            Some(g) => group_heads(g.trim_end_matches('}')),
            None => vec![rest.trim().to_string()],
        };
        for n in names {
            out.insert(n, module.to_string());
        }
    }
    out
}

fn graph(src: &Path) -> Graph {
    let mods = modules(src);
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let names = reexports(&lib, &mods);
    let mut g = Graph::new();
    for (m, files) in &mods {
        let uses = g.entry(m.clone()).or_default();
        for f in files {
            let code = code_of(&std::fs::read_to_string(f).expect("readable source"));
            for root in named_roots(&code) {
                let target = if mods.contains_key(&root) {
                    Some(root)
                } else {
                    names.get(&root).cloned()
                };
                if let Some(t) = target.filter(|t| t != m) {
                    uses.insert(t);
                }
            }
        }
    }
    g
}

/// Every cycle's modules (the strongly connected components of more than one
/// module), each sorted.
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    // Kosaraju: finish order on the graph, then components on the reverse graph.
    fn visit<'a>(g: &'a Graph, v: &'a str, seen: &mut BTreeSet<&'a str>, out: &mut Vec<&'a str>) {
        if !seen.insert(v) {
            return;
        }
        for w in g.get(v).into_iter().flatten() {
            visit(g, w, seen, out);
        }
        out.push(v);
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for v in g.keys() {
        visit(g, v, &mut seen, &mut order);
    }
    let mut rev: Graph = Graph::new();
    for (v, ws) in g {
        for w in ws {
            rev.entry(w.clone()).or_default().insert(v.clone());
        }
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for v in order.into_iter().rev() {
        let mut comp = Vec::new();
        visit(&rev, v, &mut seen, &mut comp);
        if comp.len() > 1 {
            let mut c: Vec<String> = comp.into_iter().map(str::to_string).collect();
            c.sort();
            out.push(c);
        }
    }
    out
}

fn runtime_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/src")
}

#[test]
fn the_runtime_has_no_module_cycles() {
    let g = graph(&runtime_src());
    // The graph is real: the modules the layering names are there, with uses.
    for m in [
        "backend",
        "device",
        "buffer",
        "launch",
        "world",
        "collectives",
    ] {
        assert!(g.contains_key(m), "no module `{m}` in {:?}", g.keys());
    }
    assert!(g["launch"].contains("device") && g["world"].contains("launch"));
    let found = cycles(&g);
    assert!(
        found.is_empty(),
        "import cycles among runtime modules: {found:?}\nthe graph: {g:#?}"
    );
}

#[test]
fn the_bottom_layers_import_nothing_above_them() {
    let g = graph(&runtime_src());
    let allowed = |m: &str| -> &[&str] {
        match m {
            "error" | "properties" | "secure_fs" => &[],
            "config" => &["error"],
            "backend" => &["error", "properties"],
            "device" => &["config", "error", "properties", "backend"],
            _ => unreachable!(),
        }
    };
    for m in [
        "config",
        "error",
        "properties",
        "secure_fs",
        "backend",
        "device",
    ] {
        let extra: Vec<&String> = g[m]
            .iter()
            .filter(|u| !allowed(m).contains(&u.as_str()))
            .collect();
        assert!(extra.is_empty(), "`{m}` imports {extra:?} from above it");
    }
    // Launching knows nothing of worlds (they reach it through `RankLink`).
    assert!(!g["launch"].contains("world"), "launch imports world");
}

/// The check finds a cycle when there is one: through a path, a group, a re-export
/// and a `tessera::` path.
#[test]
fn the_check_finds_cycles() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let src = dir.path();
    std::fs::create_dir(src.join("world")).expect("a folder");
    let write = |p: &str, s: &str| std::fs::write(src.join(p), s).expect("written");
    write(
        "lib.rs",
        "mod a; mod b; mod c; mod world;\npub use c::{Thing, Other as O};\n",
    );
    write(
        "a.rs",
        "use crate::{b::X, error::Error};\n// crate::world in a comment\n\
         const S: &str = \"crate::world\\\" in a string\\\n crate::c\";\n\
         const R: &str = r#\"crate::world\"#; const Q: char = '\"'; /* crate::c */\n",
    );
    write("b.rs", "fn f() { let _ = tessera::world::W; }\n");
    write("c.rs", "pub struct Thing;\n");
    write("world/mod.rs", "mod inner;\n");
    write("world/inner.rs", "use crate::Thing;\nuse crate::a::A;\n");
    let g = graph(src);
    assert_eq!(g["a"], BTreeSet::from(["b".to_string()]));
    assert_eq!(g["b"], BTreeSet::from(["world".to_string()]));
    assert_eq!(
        g["world"],
        BTreeSet::from(["a".to_string(), "c".to_string()])
    );
    assert_eq!(
        cycles(&g),
        vec![vec!["a".to_string(), "b".to_string(), "world".to_string()]]
    );
    // Without the back edge, no cycle.
    write("world/inner.rs", "use crate::Thing;\n");
    assert!(cycles(&graph(src)).is_empty());
}

/// A crate's files as modules: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`, `lib.rs`
/// the root (empty path).
fn file_modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Vec<String>, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("readable folder")
            .map(|e| e.expect("readable entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, src, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(src).expect("under src");
                let mut path: Vec<String> = rel
                    .with_extension("")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
                    path.pop();
                }
                out.insert(path, p);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// The paths `code` names after `crate::`, `super::` and `self::`, and after the name
/// of one of `children` (a module's own submodules, named bare), groups expanded one
/// level (`super::{a, b::c}` is `super::a` and `super::b::c`).
fn named_paths(code: &str, children: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let path_sep = |k: usize| bytes.get(k) == Some(&':') && bytes.get(k + 1) == Some(&':');
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_alphabetic()
            || i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == ':')
        {
            i += 1;
            continue;
        }
        let word: String = bytes[i..].iter().take_while(|&&c| is_ident(c)).collect();
        let after = i + word.len();
        i = after;
        let starts =
            matches!(word.as_str(), "crate" | "super" | "self") || children.contains(&word);
        if !starts || !path_sep(after) {
            continue;
        }
        // The path: segments joined by `::`, then maybe a group.
        let mut segs = vec![word];
        let mut j = after;
        loop {
            if !path_sep(j) {
                break;
            }
            j += 2;
            if bytes.get(j) == Some(&'{') {
                let mut depth = 0;
                let mut k = j;
                while k < bytes.len() {
                    match bytes[k] {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
                let group: String = bytes[j + 1..k.min(bytes.len())].iter().collect();
                for item in group.split(',') {
                    let item: Vec<String> = item
                        .trim()
                        .split("::")
                        .map(|s| s.chars().take_while(|&c| is_ident(c)).collect::<String>())
                        .take_while(|s| !s.is_empty())
                        .collect();
                    let mut p = segs.clone();
                    p.extend(item);
                    out.push(p);
                }
                segs.clear();
                break;
            }
            let seg: String = bytes[j..].iter().take_while(|&&c| is_ident(c)).collect();
            if seg.is_empty() {
                break;
            }
            j += seg.len();
            segs.push(seg);
        }
        if !segs.is_empty() {
            out.push(segs);
        }
        i = j;
    }
    out
}

/// File-level import graph of a crate: file A uses file B when A names a path that
/// resolves to B's module (or an item in it), through `crate::`, `super::`, `self::`
/// or a bare child module, test code (`#[cfg(test)]` onwards) left out. A module's
/// uses of its own submodules (a `mod.rs` re-exporting or calling its children) are
/// not edges: a parent owns its children, which may use their ancestors; what must
/// not form a circle is everything else.
fn file_graph(src: &Path) -> Graph {
    let mods = file_modules(src);
    let name = |m: &[String]| {
        if m.is_empty() {
            "lib".to_string()
        } else {
            m.join("/")
        }
    };
    let mut g = Graph::new();
    for (m, file) in &mods {
        let src_text = std::fs::read_to_string(file).expect("readable source");
        let code = code_of(&src_text);
        let code = code.split("#[cfg(test)]").next().unwrap_or(&code);
        // The module a `super::` in this file means, and this file's children.
        let parent: Vec<String> = m[..m.len().saturating_sub(1)].to_vec();
        let children: Vec<String> = mods
            .keys()
            .filter(|k| k.len() == m.len() + 1 && k.starts_with(m))
            .map(|k| k[m.len()].clone())
            .collect();
        let uses = g.entry(name(m)).or_default();
        for path in named_paths(code, &children) {
            let mut base: Vec<String> = match path[0].as_str() {
                "crate" => Vec::new(),
                "super" => parent.clone(),
                "self" => m.clone(),
                _ => m.clone(),
            };
            let rest = if matches!(path[0].as_str(), "crate" | "super" | "self") {
                &path[1..]
            } else {
                &path[..]
            };
            let mut segs = rest.iter().peekable();
            // `super::super::..`
            while segs.peek().is_some_and(|s| *s == "super") {
                base.pop();
                segs.next();
            }
            let mut target = base;
            for s in segs {
                let mut next = target.clone();
                next.push(s.clone());
                if mods.contains_key(&next) {
                    target = next;
                } else {
                    break;
                }
            }
            let own_descendant = target.len() > m.len() && target.starts_with(m);
            if target != *m && !own_descendant && mods.contains_key(&target) {
                uses.insert(name(&target));
            }
        }
    }
    g
}

fn ir_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dsl-ir/src")
}

/// tessera-ir's files import each other in no circle.
#[test]
fn the_ir_crate_has_no_file_cycles() {
    let g = file_graph(&ir_src());
    // The graph is real: files that use each other are seen doing so.
    assert!(g["interp/exec"].contains("interp/comm"), "{g:#?}");
    assert!(g["interp/comm_ops"].contains("interp/prog"), "{g:#?}");
    assert!(
        g["interp/memory"].contains("interp/prog") && g["interp/exec"].contains("interp/prog"),
        "{g:#?}"
    );
    assert!(g["passes/specialize"].contains("ir"), "{g:#?}");
    let found = cycles(&g);
    assert!(
        found.is_empty(),
        "import cycles among tessera-ir's files: {found:?}\nthe graph: {g:#?}"
    );
}

/// The file-level check finds circles: between siblings through `super::`, a group and
/// `crate::` paths, and a child module named bare; a parent's use of its children
/// is not one.
#[test]
fn the_file_check_finds_cycles() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let src = dir.path();
    std::fs::create_dir(src.join("interp")).expect("a folder");
    let write = |p: &str, s: &str| std::fs::write(src.join(p), s).expect("written");
    write("lib.rs", "pub mod interp;\npub mod ir;\n");
    write("ir.rs", "pub struct Op;\n");
    write(
        "interp/mod.rs",
        "mod a;\nmod b;\npub use a::A;\npub struct Error;\nfn f() { b::g(); }\n",
    );
    write("interp/a.rs", "use super::{Error, b::B};\npub struct A;\n");
    write(
        "interp/b.rs",
        "use crate::ir::Op;\npub struct B;\npub fn g() {}\n",
    );
    let g = file_graph(src);
    assert!(cycles(&g).is_empty(), "{g:#?}");
    assert!(g["interp/a"].contains("interp/b") && g["interp/a"].contains("interp"));
    assert!(g["interp/b"].contains("ir") && !g["interp"].contains("interp/a"));
    // b now uses a through `crate::`: a circle.
    write(
        "interp/b.rs",
        "use crate::ir::Op;\nuse crate::interp::a::A;\npub struct B;\npub fn g() {}\n",
    );
    let found = cycles(&file_graph(src));
    assert_eq!(
        found,
        vec![vec!["interp/a".to_string(), "interp/b".to_string()]]
    );
    // ... and through `super::` with a group, in a test module it is not.
    write(
        "interp/b.rs",
        "use super::{a::A};\npub struct B;\n#[cfg(test)]\nmod tests { use super::super::a::A; }\n",
    );
    assert_eq!(cycles(&file_graph(src)).len(), 1);
    write(
        "interp/b.rs",
        "pub struct B;\n#[cfg(test)]\nmod tests { use super::super::a::A; }\n",
    );
    assert!(cycles(&file_graph(src)).is_empty());
}

fn codegen_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../codegen/src")
}

/// tessera-codegen's files import each other in no circle (the CPU device and the
/// emulator stand on the host floor, apart).
#[test]
fn the_codegen_crate_has_no_file_cycles() {
    let g = file_graph(&codegen_src());
    // Whether a file of folder `dir` (its `mod.rs` or below) uses one of `other`.
    let uses = |dir: &str, other: &str| {
        let within = |f: &str, d: &str| f == d || f.starts_with(&format!("{d}/"));
        g.iter()
            .filter(|(f, _)| within(f, dir))
            .any(|(_, used)| used.iter().any(|u| within(u, other)))
    };
    assert!(uses("cpu", "host") && uses("emu", "host"), "{g:#?}");
    assert!(!uses("cpu", "emu") && !uses("emu", "cpu"), "{g:#?}");
    // `dot`'s strategies stand on one shared-memory module, which uses none of them.
    let strategies = ["lower/dot/fma", "lower/dot/mma", "lower/dot/wgmma"];
    for s in strategies {
        assert!(g[s].contains("lower/dot/smem"), "{s}: {g:#?}");
        assert!(!uses("lower/dot/smem", s), "{g:#?}");
    }
    // The compile driver orders the leaf steps; emission knows nothing of the others.
    assert!(
        g["driver"].contains("emit") && g["driver"].contains("nvshmem"),
        "{g:#?}"
    );
    assert!(
        !uses("emit", "nvshmem") && !uses("emit", "driver"),
        "{g:#?}"
    );
    // The emulator's device ABI is one table, below both its users.
    assert!(g["lower/arch/emu"].contains("lower/arch/emu_abi"), "{g:#?}");
    assert!(uses("emu/runtime", "lower/arch/emu_abi"), "{g:#?}");
    // The host lowering has its own small arch, not the emulator's.
    assert!(!uses("lower/host", "lower/arch/emu"), "{g:#?}");
    // Plans are made before lowering: the planning files use no emitting file.
    for emitter in [
        "lower/control",
        "lower/smem",
        "lower/convert",
        "lower/entry",
    ] {
        assert!(!uses("lower/plan", emitter), "{emitter}: {g:#?}");
    }
    let found = cycles(&g);
    assert!(
        found.is_empty(),
        "import cycles among tessera-codegen's files: {found:?}\nthe graph: {g:#?}"
    );
}

//! IR filetests: every `tests/filetests/**/*.tir` file is a kernel in the IR's text
//! form, a header naming what is checked, and the expected output below it, in
//! comments. A developer adds a test for a new op, pass or layout decision by adding a
//! file; `FILETESTS_BLESS=1 cargo test -p tessera-tests --test filetests` rewrites the
//! expectations, which are reviewed like snapshots.
//!
//! A file:
//!
//! ```text
//! // test: <kind> [arguments]
//! // <what it checks, in words>
//! kernel @k(...) { ... }
//! // expected:
//! // <the output, line by line>
//! ```
//!
//! Kinds (the output each produces):
//!
//! - `roundtrip`: the kernel printed after parsing (which must parse to the same
//!   print again).
//! - `parse-error`: the parser's error.
//! - `verify`: every verifier error, one a line (`ok` when there is none).
//! - `canonicalize`, `cse`, `dce`, `optimize`: the kernel after that pass, verified,
//!   with whether the pass changed anything.
//! - `specialize <param>=<fact>,...` (facts `div16`, `one`, `small`): the kernel
//!   specialized on those launch facts (`passes::specialize`).
//! - `interp grid=X[,Y[,Z]]` with `// arg: ...` lines, one per parameter: `f32 [1, 2]`
//!   (a buffer), `f32 poison 8` (a buffer of 8 NaNs; -7777 for integer types), `i32 7`
//!   (a scalar): every buffer after the run, or the interpreter's error. The kernel and ops
//!   without a `loc(...)` are located at their line in the file (verify and interp
//!   tests).
//! - `layout <target> [warps=N]`: the lowered kernel annotated with the plan, layouts and
//!   conversions (what `TESSERA_DUMP=layout` writes).
//! - `asm <target> [warps=N]` with `// count: <text>` lines: how many lines of the
//!   PTX or AMDGCN assembly contain each text; on NVIDIA targets the PTX must assemble
//!   with `ptxas`, the bytes it spills are part of the output, and `// sass: <text>`
//!   lines count lines of the SASS (`cuobjdump`). `stages=N` sets `num_stages`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera::codegen::CompileOptions;
use tessera::codegen::target::Target;
use tessera::ir::interp::{self, HostBuffer, KernelArg, Scalar};
use tessera::ir::{Elem, Function, ParamFacts, ScalarType, passes, printer, verify};

const EXPECTED: &str = "// expected:";

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "tir") {
            out.push(p);
        }
    }
}

fn parse(src: &str) -> Result<Function, String> {
    tessera::ir::parser::parse_function(src).map_err(|e| e.to_string())
}

/// A pass's output: the kernel after it (verified) and whether it changed anything.
fn after_pass(src: &str, pass: impl FnOnce(&mut Function) -> bool) -> Result<String, String> {
    let mut f = parse(src)?;
    let changed = pass(&mut f);
    let mut out = format!("changed: {changed}\n");
    for e in verify::verify_all(&f) {
        writeln!(out, "invalid after the pass: {e}").unwrap();
    }
    out.push_str(&printer::print_function(&f));
    Ok(out)
}

fn target_args(args: &[&str]) -> Result<(Target, CompileOptions), String> {
    let target: Target = args
        .first()
        .ok_or("which target?")?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let mut opts = CompileOptions::default();
    for a in &args[1..] {
        match a.split_once('=') {
            Some(("warps", n)) => {
                opts.num_warps = n.parse().map_err(|_| format!("bad warps `{n}`"))?
            }
            Some(("stages", n)) => {
                opts.num_stages = Some(n.parse().map_err(|_| format!("bad stages `{n}`"))?)
            }
            Some(("cluster", c)) => {
                let dims: Vec<u32> = c
                    .split('x')
                    .map(|d| d.parse().map_err(|_| format!("bad cluster `{c}`")))
                    .collect::<Result<_, _>>()?;
                opts.cluster = dims
                    .try_into()
                    .map_err(|_| format!("a cluster is XxYxZ, got `{c}`"))?;
            }
            _ => return Err(format!("unknown argument `{a}`")),
        }
    }
    Ok((target, opts))
}

fn scalar(ty: ScalarType, text: &str) -> Result<Scalar, String> {
    let bad = || format!("`{text}` is not a {ty}");
    Ok(match ty {
        ScalarType::I32 => Scalar::I32(text.parse().map_err(|_| bad())?),
        ScalarType::I64 => Scalar::I64(text.parse().map_err(|_| bad())?),
        ScalarType::U32 => Scalar::U32(text.parse().map_err(|_| bad())?),
        ScalarType::U64 => Scalar::U64(text.parse().map_err(|_| bad())?),
        ScalarType::F32 => Scalar::F32(text.parse().map_err(|_| bad())?),
        ScalarType::F64 => Scalar::F64(text.parse().map_err(|_| bad())?),
        _ => return Err(format!("no {ty} scalars in filetests yet")),
    })
}

/// A buffer of `ty` from the values in `[...]`, or `poison N`.
fn buffer(ty: ScalarType, text: &str) -> Result<HostBuffer, String> {
    let list: Vec<String> = if let Some(n) = text.strip_prefix("poison ") {
        let n: usize = n.trim().parse().map_err(|_| format!("bad length `{n}`"))?;
        let p = match ty {
            ScalarType::F32 | ScalarType::F64 => "NaN",
            _ => "-7777",
        };
        vec![p.to_string(); n]
    } else {
        let inner = text
            .trim()
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .ok_or_else(|| format!("expected `[...]` or `poison N`, got `{text}`"))?;
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect()
    };
    macro_rules! buf {
        ($t:ty) => {{
            let v: Result<Vec<$t>, _> = list.iter().map(|s| s.parse::<$t>()).collect();
            HostBuffer::from_slice(&v.map_err(|_| format!("bad {ty} values in `{text}`"))?)
        }};
    }
    Ok(match ty {
        ScalarType::I32 => buf!(i32),
        ScalarType::I64 => buf!(i64),
        ScalarType::U32 => buf!(u32),
        ScalarType::U64 => buf!(u64),
        ScalarType::F32 => buf!(f32),
        ScalarType::F64 => buf!(f64),
        _ => return Err(format!("no {ty} buffers in filetests yet")),
    })
}

fn show(ty: ScalarType, b: &HostBuffer) -> String {
    macro_rules! list {
        ($t:ty) => {
            b.to_vec::<$t>()
                .map(|v| {
                    v.iter()
                        .map(|x| format!("{x:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_else(|e| e.to_string())
        };
    }
    match ty {
        ScalarType::I32 => list!(i32),
        ScalarType::I64 => list!(i64),
        ScalarType::U32 => list!(u32),
        ScalarType::U64 => list!(u64),
        ScalarType::F32 => list!(f32),
        ScalarType::F64 => list!(f64),
        _ => "?".into(),
    }
}

fn interp_run(src: &str, args: &[&str], header: &[&str]) -> Result<String, String> {
    let f = parse(src)?;
    verify::verify(&f).map_err(|e| e.to_string())?;
    let grid_text = args
        .iter()
        .find_map(|a| a.strip_prefix("grid="))
        .ok_or("interp needs grid=X[,Y[,Z]]")?;
    let mut grid = [1u32; 3];
    for (k, g) in grid_text.split(',').enumerate() {
        *grid.get_mut(k).ok_or("at most 3 grid axes")? =
            g.parse().map_err(|_| format!("bad grid `{grid_text}`"))?;
    }
    let specs: Vec<&str> = header
        .iter()
        .filter_map(|l| l.strip_prefix("// arg:"))
        .map(str::trim)
        .collect();
    if specs.len() != f.params.len() {
        return Err(format!(
            "{} `// arg:` lines for {} parameters",
            specs.len(),
            f.params.len()
        ));
    }
    let mut kargs = Vec::new();
    let mut shown = Vec::new();
    for (p, spec) in f.params.iter().zip(&specs) {
        let (ty_text, value) = spec
            .split_once(' ')
            .ok_or_else(|| format!("bad arg `{spec}`"))?;
        let ty = ScalarType::from_name(ty_text)
            .ok_or_else(|| format!("bad element type `{ty_text}`"))?;
        match f.ty(p.value).elem {
            Elem::Ptr { .. } => {
                let b = Arc::new(buffer(ty, value)?);
                shown.push((p.name.clone(), ty, Arc::clone(&b)));
                kargs.push(KernelArg::Buffer(b));
            }
            _ => kargs.push(KernelArg::Scalar(scalar(ty, value.trim())?)),
        }
    }
    let mut out = String::new();
    match interp::run(&f, grid, &kargs) {
        Ok(()) => {
            for (name, ty, b) in shown {
                writeln!(out, "%{name} = [{}]", show(ty, &b)).unwrap();
            }
        }
        Err(e) => writeln!(out, "error: {e}").unwrap(),
    }
    Ok(out)
}

fn facts(f: &Function, args: &[&str]) -> Result<Vec<ParamFacts>, String> {
    let mut facts = vec![ParamFacts::default(); f.params.len()];
    for a in args.iter().flat_map(|a| a.split(',')) {
        let (name, fact) = a.split_once('=').ok_or_else(|| format!("bad fact `{a}`"))?;
        let k = f
            .params
            .iter()
            .position(|p| p.name == name.trim_start_matches('%'))
            .ok_or_else(|| format!("no parameter `{name}`"))?;
        match fact {
            "div16" => facts[k].divisible_by_16 = true,
            "one" => facts[k].equal_to_one = true,
            "small" => facts[k].within_2gib = true,
            _ => return Err(format!("unknown fact `{fact}` (div16, one, small)")),
        }
    }
    Ok(facts)
}

/// `src` with the kernel and every op that has no `loc(...)` located at its own line
/// and column in the test file `name`, so that errors name the place in the file.
fn with_locs(src: &str, name: &str) -> String {
    let mut out = String::new();
    for (k, line) in src.lines().enumerate() {
        let body = line.trim_start();
        let first = body.split_whitespace().next().unwrap_or("");
        // `%v = op ...` or `store ...`/`yield ...` inside the kernel's body.
        let is_op = line.starts_with(' ')
            && !line.contains("loc(")
            && (first.starts_with('%') && body.contains(" = ")
                || !first.is_empty() && first.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        // The kernel's own line locates it (and the errors about its parameters).
        let is_kernel = line.starts_with("kernel @") && !line.contains("loc(");
        let is_op = is_op || is_kernel;
        if !is_op {
            out.push_str(line);
        } else {
            let col = line.len() - body.len() + 1;
            let at = format!(" loc(\"{name}\":{}:{col})", k + 1);
            match line.trim_end().strip_suffix('{') {
                Some(head) => write!(out, "{}{at} {{", head.trim_end()).unwrap(),
                None => write!(out, "{}{at}", line.trim_end()).unwrap(),
            }
        }
        out.push('\n');
    }
    out
}

/// The output of one file's test (an `Err` is a broken test file).
fn run(text: &str, name: &str) -> Result<String, String> {
    let input = text.split(EXPECTED).next().unwrap_or(text);
    let header: Vec<&str> = input.lines().filter(|l| l.starts_with("//")).collect();
    let test = header
        .first()
        .and_then(|l| l.strip_prefix("// test:"))
        .ok_or("the first line must be `// test: <kind> ...`")?;
    let mut words = test.split_whitespace();
    let kind = words.next().ok_or("no kind after `// test:`")?;
    let args: Vec<&str> = words.collect();
    match kind {
        "roundtrip" => {
            let printed = printer::print_function(&parse(input)?);
            let again = printer::print_function(&parse(&printed)?);
            if again != printed {
                return Err(format!("the print does not parse to itself:\n{again}"));
            }
            Ok(printed)
        }
        "parse-error" => match parse(input) {
            Ok(_) => Err("it parses".into()),
            Err(e) => Ok(format!("{e}\n")),
        },
        "verify" => {
            let errors = verify::verify_all(&parse(&with_locs(input, name))?);
            Ok(if errors.is_empty() {
                "ok\n".to_string()
            } else {
                errors.iter().map(|e| format!("{e}\n")).collect()
            })
        }
        "canonicalize" => after_pass(input, passes::canonicalize),
        "cse" => after_pass(input, passes::cse),
        "dce" => after_pass(input, passes::dce),
        "optimize" => after_pass(input, |f| {
            let before = printer::print_function(f);
            passes::optimize(f);
            printer::print_function(f) != before
        }),
        "specialize" => {
            let f = parse(input)?;
            let g = passes::specialize(&f, &facts(&f, &args)?);
            Ok(printer::print_function(&g))
        }
        "interp" => interp_run(&with_locs(input, name), &args, &header),
        "layout" => {
            let (target, opts) = target_args(&args)?;
            let f = parse(input)?;
            let dump = tessera::codegen::lower::lower_with_layouts(&f, target, &opts)
                .map_err(|e| e.to_string())?;
            // The dump is IR text a developer can feed back in.
            tessera::ir::parser::parse_function(&dump)
                .map_err(|e| format!("the layout dump does not parse: {e}"))?;
            Ok(dump)
        }
        "asm" => {
            let (target, opts) = target_args(&args)?;
            let f = parse(input)?;
            let art = tessera::codegen::compile(&f, target, &opts).map_err(|e| e.to_string())?;
            let mut out = String::new();
            for pat in header.iter().filter_map(|l| l.strip_prefix("// count:")) {
                let pat = pat.trim();
                let n = art.asm.lines().filter(|l| l.contains(pat)).count();
                writeln!(out, "{pat}: {n}").unwrap();
            }
            if out.is_empty() {
                return Err("an asm test needs `// count: <text>` lines".into());
            }
            // NVIDIA's assembler validates the PTX offline, and its spills are part of
            // the expectation (AMD code objects are linked by `ld.lld` in `compile`).
            let sass_pats: Vec<&str> = header
                .iter()
                .filter_map(|l| l.strip_prefix("// sass:"))
                .map(str::trim)
                .collect();
            if let Target::Nvptx { sm, .. } = target {
                let r = tessera::codegen::tools::ptxas(&art.asm, &format!("sm_{sm}"))
                    .map_err(|e| format!("ptxas refused the PTX: {e}"))?;
                let spilled = r.spill_stores_bytes + r.spill_loads_bytes;
                writeln!(out, "ptxas: assembles, {spilled} bytes spilled").unwrap();
                // C7517: ptxas serialized the wgmma pipeline.
                if r.log.contains("C7517") {
                    writeln!(out, "ptxas: wgmma serialized (C7517)").unwrap();
                }
                if !sass_pats.is_empty() {
                    let sass = tessera::codegen::tools::sass(&r.cubin)
                        .map_err(|e| format!("cuobjdump: {e}"))?;
                    for pat in &sass_pats {
                        let n = sass.lines().filter(|l| l.contains(pat)).count();
                        writeln!(out, "sass {pat}: {n}").unwrap();
                    }
                }
            } else if !sass_pats.is_empty() {
                return Err("`// sass:` lines are for NVIDIA targets".into());
            }
            Ok(out)
        }
        other => Err(format!("unknown kind `{other}`")),
    }
}

/// `text` with its expected section replaced by `output`.
fn blessed(text: &str, output: &str) -> String {
    let input = text.split(EXPECTED).next().unwrap_or(text).trim_end();
    let mut out = format!("{input}\n{EXPECTED}\n");
    for l in output.lines() {
        if l.is_empty() {
            out.push_str("//\n");
        } else {
            writeln!(out, "// {l}").unwrap();
        }
    }
    out
}

fn expected(text: &str) -> Option<String> {
    let (_, tail) = text.split_once(EXPECTED)?;
    Some(
        tail.lines()
            .skip(1)
            .map(|l| {
                let l = l.strip_prefix("//").unwrap_or(l);
                l.strip_prefix(' ').unwrap_or(l).to_string() + "\n"
            })
            .collect(),
    )
}

#[test]
fn filetests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests");
    let mut all = Vec::new();
    files(&root, &mut all);
    assert!(
        all.len() >= 60,
        "{} filetests, expected at least 60",
        all.len()
    );
    let bless = std::env::var_os("FILETESTS_BLESS").is_some();
    let mut failures = Vec::new();
    for path in &all {
        let name = path
            .strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(path).unwrap();
        let output = match run(&text, &format!("filetests/{name}")) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{name}: broken test: {e}"));
                continue;
            }
        };
        let want = expected(&text);
        let got: String = output
            .lines()
            .map(|l| l.trim_end().to_string() + "\n")
            .collect();
        if want.as_deref() == Some(got.as_str()) {
            continue;
        }
        if bless {
            std::fs::write(path, blessed(&text, &output)).unwrap();
            eprintln!("blessed {name}");
        } else {
            failures.push(format!(
                "{name}: output differs\n--- expected\n{}--- got\n{got}",
                want.unwrap_or_else(|| "(no `// expected:` section)\n".into())
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} filetests failed (FILETESTS_BLESS=1 rewrites the expectations):\n\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

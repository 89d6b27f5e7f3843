//! The Tile IR backend (`tessera::codegen::tileir`), checked offline: kernels lowered
//! to Tile IR bytecode that NVIDIA's `tileirdisasm` reads back and `tileiras`
//! compiles for Blackwell (sm_100, sm_120) and Hopper (sm_90), with the SASS read.

#![allow(clippy::duplicate_mod)]

#[path = "../../examples/aot_jobs.rs"]
mod aot_jobs;
#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/matmul_desc.rs"]
#[allow(dead_code)]
mod matmul_desc;
#[path = "../../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use std::sync::Arc;

use tessera::codegen::tileir::{self, DEFAULT_VERSION};
use tessera::codegen::{CodegenError, tools};
use tessera::ir::Function;
use tessera::kernel_ir;
use tessera::prelude::*;

/// The masked vector add: bytecode that `tileirdisasm` verifies, with the kernel's
/// masked pointer loads and store; a cubin for each GPU whose SASS loads and stores
/// global memory.
#[test]
fn vector_add_compiles_for_blackwell_and_hopper() {
    let f = kernel_ir::<vector_add::vector_add<1024>>(&()).expect("builds");
    let k = tileir::lower(&f, DEFAULT_VERSION).expect("lowers");
    assert!(
        k.bytecode.starts_with(b"\x7fTileIR\0"),
        "the bytecode's magic"
    );
    let text = tools::tileirdisasm(&k.bytecode).expect("tileirdisasm reads it back");
    for want in [
        "entry @vector_add",
        "load_ptr_tko",
        "store_ptr_tko",
        "addf",
        "cmpi",
    ] {
        assert!(text.contains(want), "no `{want}` in\n{text}");
    }
    for gpu in ["sm_100", "sm_120", "sm_90"] {
        let art = tileir::compile(&f, gpu).expect("tileiras compiles it");
        let sass = tools::sass(&art.cubin).expect("cuobjdump reads the cubin");
        let count = |p: &str| sass.lines().filter(|l| l.contains(p)).count();
        assert!(count("LDG") >= 2 && count("STG") >= 1, "{gpu}:\n{sass}");
    }
}

/// An op the backend does not lower yet is an error naming it and its line in the
/// user's source, not a silent difference.
#[test]
fn an_op_not_lowered_is_an_error_at_its_line() {
    let src = "kernel @k(%x: ptr<f16> {readonly}, %out: ptr<f16>) {
  %0 = arange 0, 64 : <64xi32>
  %1 = splat %x : <64xptr<f16>>
  %2 = addptr %1, %0 : <64xptr<f16>>
  %3 = load %2 : <64xf16>
  %5 = splat %out : <64xptr<f16>>
  %6 = addptr %5, %0 : <64xptr<f16>>
  %4 = atomic_rmw max relaxed device %6, %3 : <64xf16> loc(\"kernels/amax.rs\":7:9)
}";
    let f = tessera::ir::parser::parse_function(src).expect("parses");
    let e = tileir::lower(&f, DEFAULT_VERSION).expect_err("an f16 atomic max is not lowered");
    let CodegenError::TileIr { span, message, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!(
        (&*span.file, span.line, span.col),
        ("kernels/amax.rs", 7, 9),
        "{e}"
    );
    assert!(
        message.contains("atomic_rmw") && message.contains("max"),
        "the op is named: {e}"
    );
    assert!(
        e.to_string().starts_with("kernels/amax.rs:7:9: kernel `k`"),
        "{e}"
    );
}

/// Softmax (row max, `exp`, row sum, divide): reductions with their identities and
/// combining regions, compiled for Blackwell.
#[test]
fn softmax_compiles_for_blackwell() {
    let f = kernel_ir::<softmax::softmax<f32, 1, 1024>>(&()).expect("builds");
    let k = tileir::lower(&f, DEFAULT_VERSION).expect("lowers");
    let text = tools::tileirdisasm(&k.bytecode).expect("tileirdisasm reads it back");
    for want in ["reduce", "maxf", "exp", "divf"] {
        assert!(text.contains(want), "no `{want}` in\n{text}");
    }
    for gpu in ["sm_100", "sm_120"] {
        let art = tileir::compile(&f, gpu).expect("tileiras compiles it");
        let sass = tools::sass(&art.cubin).expect("cuobjdump reads the cubin");
        assert!(
            sass.contains("MUFU.EX2"),
            "{gpu}: no exponential in\n{sass}"
        );
    }
}

/// A load after a store to memory it may alias waits for the store's token, and a
/// store after loads waits for theirs: without the tokens, Tile IR may reorder or
/// delete the accesses (a mutation that drops them fails here).
#[test]
fn accesses_that_may_conflict_are_ordered_by_tokens() {
    let src = "kernel @k(%x: ptr<f32>, %out: ptr<f32>) {
  %0 = arange 0, 64 : <64xi32>
  %1 = splat %x : <64xptr<f32>>
  %2 = addptr %1, %0 : <64xptr<f32>>
  %3 = load %2 : <64xf32>
  %4 = splat %out : <64xptr<f32>>
  %5 = addptr %4, %0 : <64xptr<f32>>
  store %5, %3
  %6 = load %5 : <64xf32>
  %7 = add %6, %3 : <64xf32>
  store %5, %7
}";
    let f = tessera::ir::parser::parse_function(src).expect("parses");
    tessera::ir::verify::verify(&f).expect("verifies");
    let k = tileir::lower(&f, DEFAULT_VERSION).expect("lowers");
    let text = tools::tileirdisasm(&k.bytecode).expect("tileirdisasm reads it back");
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let result = |l: &str| l.split(" = ").next().unwrap_or("").trim().to_string();
    let token_of = |l: &str| {
        l.split("token=")
            .nth(1)
            .and_then(|t| t.split([' ', ':']).next())
            .unwrap_or("")
            .to_string()
    };
    let at = |pat: &str, n: usize| {
        lines
            .iter()
            .filter(|l| l.contains(pat))
            .nth(n)
            .copied()
            .unwrap_or_else(|| panic!("no {pat} #{n} in\n{text}"))
    };
    let (load0, store0, load1, store1) = (
        at("load_ptr_tko", 0),
        at("store_ptr_tko", 0),
        at("load_ptr_tko", 1),
        at("store_ptr_tko", 1),
    );
    // The first store waits for the first load (write after read).
    let first_load = result(load0);
    let first_load_token = first_load.split(", ").nth(1).unwrap_or("").to_string();
    let joined = token_of(store0);
    let join = lines
        .iter()
        .find(|l| result(l) == joined)
        .unwrap_or_else(|| panic!("no {joined} in\n{text}"));
    assert!(
        joined == first_load_token || join.contains(&first_load_token),
        "the store does not wait for the load:\n{text}"
    );
    // The second load reads what the first store wrote (read after write).
    assert_eq!(token_of(load1), result(store0), "\n{text}");
    // The last store waits for the second load.
    let last = token_of(store1);
    let second_load_token = result(load1).split(", ").nth(1).unwrap_or("").to_string();
    let join = lines
        .iter()
        .find(|l| result(l) == last)
        .copied()
        .unwrap_or("");
    assert!(
        last == second_load_token || join.contains(&second_load_token),
        "the last store does not wait for the second load:\n{text}"
    );
    for gpu in ["sm_100", "sm_90"] {
        tileir::compile(&f, gpu).expect("tileiras compiles it");
    }
}

/// A load from a `readonly` parameter (`&Global`: nothing in the kernel writes that
/// buffer) is ordered against nothing: it takes a fresh token and no store waits for
/// it, so the masked vector add's store needs no block-wide barrier after its loads
/// (the SASS loses its `BAR.SYNC`). The read of a writable buffer keeps its order.
#[test]
fn read_only_loads_are_not_ordered() {
    let f = kernel_ir::<vector_add::vector_add<1024>>(&()).expect("builds");
    let k = tileir::lower(&f, DEFAULT_VERSION).expect("lowers");
    let text = tools::tileirdisasm(&k.bytecode).expect("reads back");
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let token_of = |l: &str| {
        l.split("token=")
            .nth(1)
            .and_then(|t| t.split([' ', ':']).next())
            .unwrap_or("")
            .to_string()
    };
    let def = |name: &str| {
        lines
            .iter()
            .find(|l| {
                l.split(" = ")
                    .next()
                    .is_some_and(|r| r.split(", ").any(|x| x == name))
            })
            .copied()
            .unwrap_or("")
    };
    let loads: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("load_ptr_tko"))
        .collect();
    assert_eq!(loads.len(), 2, "{text}");
    for l in &loads {
        assert!(def(&token_of(l)).contains("make_token"), "{l}\n{text}");
    }
    let store = lines
        .iter()
        .find(|l| l.contains("store_ptr_tko"))
        .expect("a store");
    assert!(
        def(&token_of(store)).contains("make_token"),
        "the store waits for nothing but its operands:\n{text}"
    );
    assert!(!text.contains("join_tokens"), "{text}");
    let art = tileir::compile(&f, "sm_100").expect("compiles");
    let sass = tools::sass(&art.cubin).expect("reads");
    assert!(!sass.contains("BAR.SYNC"), "{sass}");
}

/// The f16 matmul (a `for` over K carrying the accumulator, `dot`, the cast to f16):
/// on Blackwell, NVIDIA's compiler takes the 5th-generation tensor cores (`UTCHMMA`,
/// tcgen05) with the accumulator in tensor memory; on Hopper, `HGMMA`; on Ampere
/// `HMMA`.
#[test]
fn matmul_takes_each_generation_s_tensor_cores() {
    let f = kernel_ir::<matmul::matmul<f16, 128, 128, 32>>(&()).expect("builds");
    for (gpu, mma) in [("sm_100", "UTCHMMA"), ("sm_90", "HGMMA"), ("sm_80", "HMMA")] {
        let art = tileir::compile(&f, gpu).expect("tileiras compiles it");
        let sass = tools::sass(&art.cubin).expect("cuobjdump reads the cubin");
        let n = sass.lines().filter(|l| l.contains(mma)).count();
        assert!(n > 0, "{gpu}: no {mma} in\n{sass}");
    }
}

/// With the launch's facts (16-byte aligned pointers, sizes that are multiples of 16)
/// as Tile IR assumptions, Blackwell's operand loads become 16-byte asynchronous
/// copies into shared memory (`LDGSTS.E.BYPASS.LTC128B.128`) and its stores 16-byte
/// stores; without them, element loads and stores. (TMA, `UTMALDG`, needs the
/// operands as tensor views: tensor descriptors, not pointer tiles.)
#[test]
fn facts_let_blackwell_take_wide_copies() {
    use tessera::ir::ParamFacts;
    let f = kernel_ir::<matmul::matmul<f16, 128, 128, 32>>(&()).expect("builds");
    let facts = vec![ParamFacts::new(true, true); f.params.len()];
    let spec = tessera::ir::passes::specialize(&f, &facts);
    let sass = |f: &tessera::ir::Function| {
        let art = tileir::compile(f, "sm_100").expect("tileiras compiles it");
        tools::sass(&art.cubin).expect("cuobjdump reads the cubin")
    };
    let count = |s: &str, p: &str| s.lines().filter(|l| l.contains(p)).count();
    let (with, without) = (sass(&spec), sass(&f));
    let wide = with
        .lines()
        .filter(|l| l.contains("LDGSTS") && l.contains(".128"))
        .count();
    assert!(wide > 0, "{with}");
    assert_eq!(count(&without, "LDGSTS"), 0, "{without}");
    assert!(
        count(&with, "STG") < count(&without, "STG"),
        "{with}\n{without}"
    );
    assert!(count(&with, "UTCHMMA") > 0, "{with}");
}

/// Every kernel the `aot` example compiles (`examples/aot_jobs.rs`, what
/// `aot --tileir sm_100` writes), communicating ones included, compiles through
/// `tileiras` for sm_100.
#[test]
fn every_example_kernel_compiles_for_blackwell() {
    let mut report = Vec::new();
    for (name, _, _, _, ir, _) in aot_jobs::JOBS {
        let f = ir().expect("builds");
        match tileir::compile(&f, "sm_100") {
            Ok(art) => assert!(art.cubin.starts_with(b"\x7fELF"), "{name}"),
            Err(e) => report.push(format!("{name}: {e}")),
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// Tensor descriptors become partition views of tensor views: with the launch's
/// facts, Blackwell's operand loads are TMA copies (`UTMALDG`) into the 5th-generation
/// tensor cores (`UTCHMMA`), and the result leaves by TMA too (`UTMASTG`).
#[test]
fn descriptor_matmul_takes_tma_on_blackwell() {
    use tessera::ir::ParamFacts;
    let f = kernel_ir::<matmul_desc::matmul_desc<128, 128, 64>>(&()).expect("builds");
    let facts = vec![ParamFacts::new(true, true); f.params.len()];
    let spec = tessera::ir::passes::specialize(&f, &facts);
    let k = tileir::lower(&spec, DEFAULT_VERSION).expect("lowers");
    let text = tools::tileirdisasm(&k.bytecode).expect("tileirdisasm reads it back");
    for want in [
        "make_tensor_view",
        "make_partition_view",
        "load_view_tko",
        "store_view_tko",
    ] {
        assert!(text.contains(want), "no `{want}` in\n{text}");
    }
    let art = tileir::compile(&spec, "sm_100").expect("tileiras compiles it");
    let sass = tools::sass(&art.cubin).expect("cuobjdump reads the cubin");
    let count = |p: &str| sass.lines().filter(|l| l.contains(p)).count();
    for p in ["UTMALDG", "UTCHMMA", "UTMASTG"] {
        assert!(count(p) > 0, "no {p} in\n{sass}");
    }
    // A block whose coordinates are not known multiples of its extent cannot be a
    // view's block: an error at the access, not a silent misread.
    let src = "kernel @k(%p: ptr<f32> {readonly}, %t: u64, %n: i32, %c: i32, %out: ptr<f32>) {
  %0 = desc_load rank=1 %p, %t, %n, %c : <64xf32> loc(\"kernels/shift.rs\":4:7)
  %1 = arange 0, 64 : <64xi32>
  %2 = splat %out : <64xptr<f32>>
  %3 = addptr %2, %1 : <64xptr<f32>>
  store %3, %0
}";
    let f = tessera::ir::parser::parse_function(src).expect("parses");
    let e = tileir::lower(&f, DEFAULT_VERSION).expect_err("an unaligned block");
    assert!(
        e.to_string().starts_with("kernels/shift.rs:4:7:") && e.to_string().contains("multiple"),
        "{e}"
    );
}

/// The Tile IR of two example kernels as `tileirdisasm` reads the bytecode back,
/// reviewed like the PTX snapshots: the elementwise kernel (pointer tiles, masks,
/// tokens) and the descriptor GEMM (views, the guarded loads, the loop carrying the
/// accumulator and the tokens, `mmaf`).
#[test]
fn tile_ir_snapshots() {
    let kernels = [
        (
            "vector_add",
            kernel_ir::<vector_add::vector_add<1024>>(&()).expect("builds"),
        ),
        (
            "matmul_desc",
            kernel_ir::<matmul_desc::matmul_desc<128, 128, 64>>(&()).expect("builds"),
        ),
        // A wait (the polling loop, its tokens, the error record) and a read after it.
        (
            "wait_then_read",
            kernel_ir::<wait_then_read<1024>>(&()).expect("builds"),
        ),
    ];
    for (name, f) in kernels {
        let k = tileir::lower(&f, DEFAULT_VERSION).expect("lowers");
        let text = tools::tileirdisasm(&k.bytecode).expect("tileirdisasm reads it back");
        insta::assert_snapshot!(format!("tileir_{name}"), text);
    }
}

/// Conversions with the interpreter's semantics spelled out in Tile IR: float to
/// integer saturating with NaN to 0 (its `ftoi` only sees values in range), to `i1`
/// as "nonzero" (NaN included), and `fma` with one rounding; all compile for Blackwell.
#[test]
fn conversions_keep_the_interpreter_s_semantics() {
    let src = "kernel @k(%x: ptr<f32> {readonly}, %i: ptr<i32>, %u: ptr<u8>, %b: ptr<i1>, %n: ptr<i1>, %y: ptr<f32>) {
  %0 = arange 0, 64 : <64xi32>
  %1 = splat %x : <64xptr<f32>>
  %2 = addptr %1, %0 : <64xptr<f32>>
  %3 = load %2 : <64xf32>
  %4 = cast %3 : <64xi32>
  %5 = cast %3 : <64xu8>
  %6 = cast %3 : <64xi1>
  %7 = cast %0 : <64xi1>
  %8 = fma %3, %3, %3 : <64xf32>
  %9 = splat %i : <64xptr<i32>>
  %10 = addptr %9, %0 : <64xptr<i32>>
  store %10, %4
  %11 = splat %u : <64xptr<u8>>
  %12 = addptr %11, %0 : <64xptr<u8>>
  store %12, %5
  %13 = splat %b : <64xptr<i1>>
  %14 = addptr %13, %0 : <64xptr<i1>>
  store %14, %6
  %15 = splat %n : <64xptr<i1>>
  %16 = addptr %15, %0 : <64xptr<i1>>
  store %16, %7
  %17 = splat %y : <64xptr<f32>>
  %18 = addptr %17, %0 : <64xptr<f32>>
  store %18, %8
}";
    let f = tessera::ir::parser::parse_function(src).expect("parses");
    tessera::ir::verify::verify(&f).expect("verifies");
    let k = tileir::lower(&f, DEFAULT_VERSION).expect("lowers");
    let text = tools::tileirdisasm(&k.bytecode).expect("tileirdisasm reads it back");
    let count = |p: &str| text.lines().filter(|l| l.contains(p)).count();
    // Two float-to-int casts, each: two range tests, a NaN test, one `ftoi` of a
    // value made safe, three selects of the result.
    assert_eq!(count("ftoi"), 2, "{text}");
    assert!(count("cmpf") >= 7, "{text}");
    assert_eq!(count(" fma "), 1, "{text}");
    assert!(
        text.contains("not_equal"),
        "`i1` casts test against zero:\n{text}"
    );
    tileir::compile(&f, "sm_100").expect("tileiras compiles it");
}

/// Every bytecode version the backend writes that this `tileiras` reads compiles the
/// kernels (a writer version `tileiras` refuses, or a field layout it misreads, fails
/// here), and the negotiated one is the newest of them.
#[test]
fn every_negotiable_bytecode_version_compiles() {
    let listed = tools::tileiras_versions().expect("tileiras lists its versions");
    let chosen = tileir::negotiate(&listed).expect("a version both know");
    assert_eq!(tileir::bytecode_version().expect("negotiates"), chosen);
    let ours: Vec<_> = tileir::versions()
        .filter(|v| listed.contains(&(u32::from(v.major), u32::from(v.minor))))
        .collect();
    assert_eq!(ours.last(), Some(&chosen), "{listed:?}");
    let kernels = [
        kernel_ir::<vector_add::vector_add<1024>>(&()).expect("builds"),
        kernel_ir::<matmul::matmul<f16, 128, 128, 32>>(&()).expect("builds"),
        kernel_ir::<matmul_desc::matmul_desc<128, 128, 64>>(&()).expect("builds"),
    ];
    for v in ours {
        for f in &kernels {
            let art = tileir::compile_version(f, "sm_100", v)
                .unwrap_or_else(|e| panic!("{} at bytecode {v}: {e}", f.name));
            assert!(art.cubin.starts_with(b"\x7fELF"), "{} at {v}", f.name);
            assert_eq!(art.kernel.version, v.to_string());
        }
    }
    // A tileiras older than the oldest version written negotiates none.
    assert_eq!(tileir::negotiate(&[(13, 1), (13, 2)]), None);
    assert_eq!(
        tools::parse_versions("13.5\n13.1\nx\n13.3\n"),
        vec![(13, 1), (13, 3), (13, 5)]
    );
}

/// The parameters of a Tile IR cubin as the driver reads them (`cuobjdump -elf`'s
/// `EIATTR_KPARAM_INFO`: ordinal, offset, size), which must be the launch's argument
/// list: the kernel's parameters in order, pointers 8 bytes and 32-bit integers 4
/// bytes, each at its natural alignment (what `cuLaunchKernel` packs from the
/// runtime's `GpuArg`s), descriptors spread as the launch spreads them.
#[test]
fn cubin_parameters_are_the_launch_s_arguments() {
    for f in [
        kernel_ir::<vector_add::vector_add<1024>>(&()).expect("builds"),
        kernel_ir::<matmul_desc::matmul_desc<128, 128, 64>>(&()).expect("builds"),
    ] {
        let art = tileir::compile(&f, "sm_100").expect("compiles");
        let params = cubin_params(&art.cubin);
        let mut offset = 0u32;
        let want: Vec<(u32, u32, u32)> = f
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let size = f
                    .ty(p.value)
                    .elem
                    .scalar()
                    .map_or(8, |s| s.size_bytes() as u32);
                offset = offset.next_multiple_of(size);
                let at = offset;
                offset += size;
                (i as u32, at, size)
            })
            .collect();
        assert_eq!(params, want, "{}", f.name);
    }
}

/// `(ordinal, offset, size)` of each `EIATTR_KPARAM_INFO` of a cubin, by ordinal.
fn cubin_params(cubin: &[u8]) -> Vec<(u32, u32, u32)> {
    let dir = std::env::temp_dir().join(format!("tessera-kparam-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("k.cubin");
    std::fs::write(&path, cubin).expect("writes");
    let tool = tools::find_tool(&["cuobjdump"]).expect("cuobjdump (scripts/setup.sh)");
    let out = std::process::Command::new(tool)
        .arg("-elf")
        .arg(&path)
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let _ = std::fs::remove_dir_all(&dir);
    let field = |l: &str, name: &str| -> Option<u32> {
        let rest = &l[l.find(name)? + name.len()..];
        let v = rest.trim_start_matches([' ', ':', '\t']);
        let end = v
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(v.len());
        let v = &v[..end];
        v.strip_prefix("0x")
            .map_or_else(|| v.parse().ok(), |h| u32::from_str_radix(h, 16).ok())
    };
    let mut params: Vec<(u32, u32, u32)> = text
        .lines()
        .filter(|l| l.contains("Ordinal") && l.contains("Offset") && l.contains("Size"))
        .filter_map(|l| Some((field(l, "Ordinal")?, field(l, "Offset")?, field(l, "Size")?)))
        .collect();
    params.sort_unstable();
    params.dedup();
    assert!(!params.is_empty(), "no EIATTR_KPARAM_INFO in\n{text}");
    params
}

/// `aot::precompile_tileir` writes a Tile IR cubin under the key a launch with the
/// Tile IR backend computes (without LLVM too): target `tileir-sm_100`, launched with
/// a block of (1, 1, 1). The key ignores the warps and stages (`tileiras` picks its
/// own) and differs from the LLVM kernel's; LLVM keys are what they were.
#[test]
fn precompiled_tile_ir_kernels_are_found_under_the_launch_s_key() {
    use tessera::artifact::{ArtifactStore, KernelOptions, Specialization, kernel_key_of};
    use tessera::{KernelBackend, aot};
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ArtifactStore::new(dir.path());
    type K = vector_add::vector_add<1024>;
    let file = aot::precompile_tileir::<K>(&(), &Specialization::None, "sm_100", &store)
        .expect("precompiles");
    let tile = |num_warps| KernelOptions {
        num_warps,
        backend: Some(KernelBackend::TileIr),
        ..KernelOptions::default()
    };
    let key = kernel_key_of::<K>(&(), "tileir-sm_100", &tile(8)).expect("keys");
    assert_eq!(file, store.path("vector_add", &key));
    assert_eq!(
        key,
        kernel_key_of::<K>(&(), "tileir-sm_100", &tile(4)).expect("keys")
    );
    let bin = store
        .find::<K>(&(), &Specialization::None, "tileir-sm_100", &tile(2))
        .expect("found");
    assert_eq!(
        (bin.target.as_str(), bin.num_threads, bin.extension()),
        ("tileir-sm_100", 1, "cubin")
    );
    assert!(bin.binary.starts_with(b"\x7fELF"));
    let sass = tools::sass(&bin.binary).expect("a cubin cuobjdump reads");
    assert!(sass.contains("LDG"), "{sass}");
    // An LLVM kernel's key: the same whether the backend is named or left to the
    // device, and not the Tile IR one.
    let llvm = |b| KernelOptions {
        backend: b,
        ..KernelOptions::default()
    };
    let a = kernel_key_of::<K>(&(), "sm_90", &llvm(None)).expect("keys");
    assert_eq!(
        a,
        kernel_key_of::<K>(&(), "sm_90", &llvm(Some(KernelBackend::Llvm))).expect("keys")
    );
    assert_eq!(
        KernelOptions::default().describe(),
        "num_warps=4,num_stages=default"
    );
    assert_eq!(tile(4).describe(), "backend=tileir");
}

/// The Tile IR backend runs on CUDA GPUs: a launch asking for it elsewhere is an
/// error saying so, and the devices here offer LLVM alone.
#[test]
fn tile_ir_is_refused_off_cuda_gpus() {
    use tessera::{Device, KernelBackend, LaunchOptions};
    let dev = Device::cpu();
    assert_eq!(KernelBackend::available(&dev), vec![KernelBackend::Llvm]);
    assert_eq!(KernelBackend::for_device(&dev), KernelBackend::Llvm);
    let (n, x) = (100usize, vec![1.5f32; 100]);
    let (a, b) = (dev.upload(&x).unwrap(), dev.upload(&x).unwrap());
    let mut out = dev.alloc::<f32>(n).unwrap();
    let opts = LaunchOptions::new().backend(KernelBackend::TileIr);
    let e = vector_add::vector_add::<1024>::launch_with(
        &dev,
        1usize,
        &opts,
        (&a, &b, &mut out, n as i32),
    )
    .expect_err("no Tile IR on the CPU");
    assert!(
        e.to_string()
            .contains("Tile IR backend compiles for CUDA GPUs"),
        "{e}"
    );
    assert_eq!("tileir".parse::<KernelBackend>(), Ok(KernelBackend::TileIr));
    assert!("ptx".parse::<KernelBackend>().is_err());
}

/// A waiting kernel in its smallest form: a remote put with a signal, a wait for
/// this rank's signal, a world barrier.
#[kernel]
fn wait_small<const B: usize>(data: &mut Symmetric<f32>, sig: &mut Symmetric<u64>) {
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    let peer = (rank() + 1) % world_size();
    let v = data.load(offs, all);
    data.put_signal(peer, offs, v, all, sig, 0, 1u64, SignalOp::Set);
    sig.wait_until(0, CmpPred::Ge, 1u64);
    let w = data.load(offs, all) * 2.0f32;
    data.store(offs, w, all);
    barrier_all();
}

/// A wait, then a read of what it waited for: the read must stay after the poll.
#[kernel]
fn wait_then_read<const B: usize>(
    data: &Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    out: &mut Global<f32>,
) {
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    sig.wait_until(0, CmpPred::Ge, 1u64);
    out.store(offs, data.load(offs, all), all);
}

/// The collectives' kernels (f32) and the fused plans' (f16, at the tiles they
/// launch with): every communicating kernel the runtime ships.
fn shipped_comm_kernels() -> Vec<Arc<Function>> {
    use tessera::fused::{BK, BM, BN, NORM_BLOCK};
    let mut v = tessera::collectives::kernel_irs::<f32>().expect("builds");
    v.extend([
        kernel_ir::<tessera::fused::ag_gemm_kernel<f16, BM, BN, BK>>(&()).expect("builds"),
        kernel_ir::<tessera::fused::gemm_rs_kernel<f16, BM, BN, BK>>(&()).expect("builds"),
        kernel_ir::<tessera::fused::allreduce_rmsnorm_kernel<f32, NORM_BLOCK>>(&())
            .expect("builds"),
    ]);
    v
}

/// [`shipped_comm_kernels`] compiled for sm_100 (once: two tests read them), two at
/// a time.
fn shipped_comm_cubins() -> &'static [(Arc<Function>, tileir::TileIrArtifact)] {
    static DONE: std::sync::OnceLock<Vec<(Arc<Function>, tileir::TileIrArtifact)>> =
        std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let kernels = shipped_comm_kernels();
        let half = kernels.len().div_ceil(2);
        std::thread::scope(|s| {
            let parts: Vec<_> = kernels
                .chunks(half)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|f| {
                                let art = tileir::compile(f, "sm_100")
                                    .unwrap_or_else(|e| panic!("{}: {e}", f.name));
                                (Arc::clone(f), art)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            parts
                .into_iter()
                .flat_map(|h| h.join().expect("compiles"))
                .collect()
        })
    })
}

/// `(address, target)` of every branch in `sass`, and the addresses of the lines
/// that contain `what`.
fn branches_and(sass: &str, what: &str) -> (Vec<(u64, u64)>, Vec<u64>) {
    let addr = |l: &str| -> Option<u64> {
        let a = l.split("/*").nth(1)?.split("*/").next()?;
        u64::from_str_radix(a.trim(), 16).ok()
    };
    let mut br = Vec::new();
    let mut hits = Vec::new();
    for l in sass.lines() {
        let Some(at) = addr(l) else { continue };
        if l.contains(what) {
            hits.push(at);
        }
        if let Some(i) = l.find("BRA") {
            let target = l[i..]
                .split([' ', ',', ';'])
                .find_map(|t| t.strip_prefix("0x"))
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            if let Some(t) = target {
                br.push((at, t));
            }
        }
    }
    (br, hits)
}

/// Every waiting kernel keeps its polling loop through `tileiras`: a system-scope
/// strong load (the acquire poll) inside a loop (a backward branch around it). Tile
/// IR orders memory by tokens, so a poll whose token fed nothing would be deleted or
/// hoisted: the lowering threads it through the loop. The signal is a system-scope
/// atomic after a system fence (the release), and the put's stores come before it.
#[test]
fn waiting_kernels_keep_their_polling_loops() {
    let small = kernel_ir::<wait_small<128>>(&()).expect("builds");
    let small = tileir::compile(&small, "sm_100").expect("compiles");
    let mut cubins = vec![("wait_small", &small.cubin)];
    for (f, art) in shipped_comm_cubins() {
        if f.uses_blocking() {
            cubins.push((&f.name, &art.cubin));
        }
    }
    assert!(cubins.len() > 10, "{}", cubins.len());
    for (name, cubin) in cubins {
        let sass = tools::sass(cubin).expect("cuobjdump reads it");
        let (br, polls) = branches_and(&sass, "STRONG.SYS");
        let in_loop = polls
            .iter()
            .any(|&p| br.iter().any(|&(at, t)| t <= p && p < at));
        assert!(in_loop, "{name}: no polling loop in\n{sass}");
    }
    // The read of the data waited for stays after the polling loop (the acquire's
    // token orders it): with the launch's facts its loads are 16-byte ones
    // (`LDG.E.128`), and each comes after the poll's loop (its backward branch).
    let f = kernel_ir::<wait_then_read<1024>>(&()).expect("builds");
    let facts = vec![tessera::ir::ParamFacts::new(true, true); f.params.len()];
    let f = tessera::ir::passes::specialize(&f, &facts);
    let art = tileir::compile(&f, "sm_100").expect("compiles");
    let sass = tools::sass(&art.cubin).expect("reads");
    let (br, polls) = branches_and(&sass, "LDG.E.64.STRONG.SYS");
    let loop_end = br
        .iter()
        .filter(|&&(at, t)| polls.iter().any(|&p| t <= p && p < at))
        .map(|&(at, _)| at)
        .min()
        .unwrap_or_else(|| panic!("no polling loop in\n{sass}"));
    let (_, data) = branches_and(&sass, "LDG.E.128");
    assert!(!data.is_empty(), "{sass}");
    assert!(
        data.iter().all(|&a| a > loop_end),
        "a read of the data was moved before the wait's polling loop (ends at {loop_end:#x}):\n{sass}"
    );
    let sass = tools::sass(&small.cubin).expect("reads");
    let pos = |p: &str| sass.lines().position(|l| l.contains(p));
    let (fence, signal) = (pos("MEMBAR.ALL.SYS"), pos("ATOMG.E.EXCH.64.STRONG.SYS"));
    assert!(
        fence.is_some() && signal.is_some() && fence < signal,
        "{sass}"
    );
    // The put's stores are issued before the signal that publishes them.
    let put = sass
        .lines()
        .position(|l| l.contains("STG.E") && !l.contains("STRONG"));
    assert!(put.is_some() && put < fence, "{sass}");
}

/// Every communicating kernel the runtime ships (the collectives and the fused plans
/// AG+GEMM, GEMM+RS, AR+RMSNorm) compiles through Tile IR for Blackwell, with the
/// hidden parameters of the SIMT path's ABI after the user's (`rank`, `world_size`,
/// `heap_bases`, `timeout_ns`), so one launcher serves both. (The sequence-parallel
/// attention's kernel compiles for sm_90; `tileiras` 13.5 fails on it for sm_100
/// without a diagnostic.)
#[test]
fn collectives_and_fused_kernels_compile_for_blackwell() {
    let cubins = shipped_comm_cubins();
    assert_eq!(cubins.len(), 23);
    for (f, art) in cubins {
        let params = cubin_params(&art.cubin);
        let n = f.params.len();
        assert_eq!(params.len(), n + 4, "{}", f.name);
        let sizes: Vec<u32> = params[n..].iter().map(|p| p.2).collect();
        assert_eq!(sizes, [4, 4, 8, 8], "{}: the hidden parameters", f.name);
    }
    use tessera::sp_attention as sp;
    let f =
        kernel_ir::<sp::sp_attention_kernel<f16, { sp::BM }, { sp::BN }, 64>>(&()).expect("builds");
    tileir::compile(&f, "sm_90").expect("compiles for sm_90");
}

/// The token pass on a wait (Tile IR orders memory by tokens, not program order): the
/// acquire poll in the `loop` waits for the loop's carried token and hands its own to
/// the `break` that ends the wait; the read of the data waited for takes a token that
/// comes out of the loop, not a fresh one. A lowering that does not thread the
/// tokens (a mutation of either) fails here, though `tileiras` 13.5 happens to keep
/// this program's order anyway (`waiting_kernels_keep_their_polling_loops`).
#[test]
fn a_wait_s_token_orders_what_follows() {
    let f = kernel_ir::<wait_then_read<1024>>(&()).expect("builds");
    let k = tileir::lower(&f, DEFAULT_VERSION).expect("lowers");
    let text = tools::tileirdisasm(&k.bytecode).expect("tileirdisasm reads it back");
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let find = |pat: &str| {
        lines
            .iter()
            .position(|l| l.contains(pat))
            .unwrap_or_else(|| panic!("no `{pat}` in\n{text}"))
    };
    let token_of = |l: &str| {
        l.split("token=")
            .nth(1)
            .and_then(|t| t.split([' ', ':']).next())
            .unwrap_or("")
            .to_string()
    };
    let defined_at = |name: &str| {
        lines.iter().position(|l| {
            l.split(" = ")
                .next()
                .is_some_and(|lhs| lhs.split(", ").any(|r| r.trim() == name))
        })
    };
    // The loop's carried token: the last of its `iter_values`.
    let lp = find(" = loop iter_values(");
    let carried = lines[lp]
        .split("iter_values(")
        .nth(1)
        .and_then(|a| a.split(')').next())
        .and_then(|a| a.split(", ").last())
        .and_then(|a| a.split(" = ").next())
        .unwrap_or("")
        .to_string();
    let acq = find("load_ptr_tko acquire");
    assert!(acq > lp, "\n{text}");
    assert_eq!(
        token_of(lines[acq]),
        carried,
        "the poll waits for the carried token\n{text}"
    );
    let acq_token = lines[acq]
        .split(" = ")
        .next()
        .and_then(|r| r.split(", ").nth(1))
        .unwrap_or("")
        .to_string();
    let brk = lp
        + lines[lp..]
            .iter()
            .position(|l| l.starts_with("break "))
            .unwrap_or_else(|| panic!("no break in\n{text}"));
    let operands = lines[brk]["break ".len()..]
        .split(" : ")
        .next()
        .unwrap_or("");
    assert_eq!(
        operands.split(", ").last(),
        Some(acq_token.as_str()),
        "the wait's break carries the acquire's token\n{text}"
    );
    let data = find("load_ptr_tko weak %");
    let data = data
        + lines[data..]
            .iter()
            .position(|l| l.contains("load_ptr_tko") && l.contains("1024xptr<f32>"))
            .unwrap_or_else(|| panic!("no data load in\n{text}"));
    let t = token_of(lines[data]);
    let def = defined_at(&t).unwrap_or_else(|| panic!("{t} undefined in\n{text}"));
    assert!(
        def > lp && !lines[def].contains("make_token"),
        "the read after the wait takes a token from before it ({})\n{text}",
        lines[def]
    );
}

/// `erf`, `popc` and `clz` (spelled out: Tile IR has no such ops; `erf` by the SIMT
/// lowering's formula) and f16 reductions lower, read back and compile for Blackwell
/// and Hopper. Their values are not checked here (no GPU runs Tile IR on this
/// machine).
#[test]
fn spelled_out_ops_compile() {
    let src = "kernel @k(%x: ptr<i32> {readonly}, %y: ptr<f32> {readonly}, %h: ptr<f16> {readonly}, %o: ptr<i32>, %p: ptr<f32>, %q: ptr<f16>, %r: ptr<i64>) {
  %0 = arange 0, 64 : <64xi32>
  %1 = splat %x : <64xptr<i32>>
  %2 = addptr %1, %0 : <64xptr<i32>>
  %3 = load %2 : <64xi32>
  %4 = popc %3 : <64xi32>
  %5 = clz %3 : <64xi32>
  %6 = add %4, %5 : <64xi32>
  %7 = splat %o : <64xptr<i32>>
  %8 = addptr %7, %0 : <64xptr<i32>>
  store %8, %6
  %9 = splat %y : <64xptr<f32>>
  %10 = addptr %9, %0 : <64xptr<f32>>
  %11 = load %10 : <64xf32>
  %12 = erf %11 : <64xf32>
  %13 = splat %p : <64xptr<f32>>
  %14 = addptr %13, %0 : <64xptr<f32>>
  store %14, %12
  %15 = splat %h : <64xptr<f16>>
  %16 = addptr %15, %0 : <64xptr<f16>>
  %17 = load %16 : <64xf16>
  %18 = reduce sum axis=0 %17 : f16
  %19 = reduce max axis=0 %17 : f16
  %20 = add %18, %19 : f16
  store %q, %20
  %21 = cast %3 : <64xi64>
  %22 = clz %21 : <64xi64>
  %23 = popc %22 : <64xi64>
  %24 = splat %r : <64xptr<i64>>
  %25 = addptr %24, %0 : <64xptr<i64>>
  store %25, %23
}";
    let f = tessera::ir::parser::parse_function(src).expect("parses");
    tessera::ir::verify::verify(&f).expect("verifies");
    let k = tileir::lower(&f, DEFAULT_VERSION).expect("lowers");
    let text = tools::tileirdisasm(&k.bytecode).expect("reads back");
    assert!(text.contains("reduce") && text.contains("f16"), "{text}");
    for gpu in ["sm_100", "sm_90"] {
        tileir::compile(&f, gpu).unwrap_or_else(|e| panic!("{gpu}: {e}"));
    }
}

/// Float atomics Tile IR has no op for: `max` and `min` of f32 and f64 as a
/// compare-and-swap loop on the bits (`maxf`/`minf` NaN-propagating, the
/// interpreter's), `add` of every float type where the GPU has it (bf16 from sm_90):
/// each compiles; bf16 `add` for sm_80 is an error at the op. Values are not checked
/// here (no GPU runs Tile IR on this machine).
#[test]
fn float_atomics_compile() {
    for (ty, op, gpus) in [
        ("f32", "max", &["sm_100", "sm_90", "sm_80"][..]),
        ("f64", "min", &["sm_100", "sm_90"][..]),
        ("f16", "add", &["sm_100", "sm_90", "sm_80"][..]),
        ("bf16", "add", &["sm_100", "sm_90"][..]),
    ] {
        let src = format!(
            "kernel @k(%x: ptr<{ty}> {{readonly}}, %out: ptr<{ty}>, %r: ptr<{ty}>) {{
  %0 = arange 0, 64 : <64xi32>
  %1 = splat %x : <64xptr<{ty}>>
  %2 = addptr %1, %0 : <64xptr<{ty}>>
  %3 = load %2 : <64x{ty}>
  %5 = splat %out : <64xptr<{ty}>>
  %6 = addptr %5, %0 : <64xptr<{ty}>>
  %4 = atomic_rmw {op} relaxed device %6, %3 : <64x{ty}> loc(\"kernels/atomics.rs\":3:5)
  %7 = splat %r : <64xptr<{ty}>>
  %8 = addptr %7, %0 : <64xptr<{ty}>>
  store %8, %4
}}"
        );
        let f = tessera::ir::parser::parse_function(&src).expect("parses");
        tessera::ir::verify::verify(&f).expect("verifies");
        for gpu in gpus {
            tileir::compile(&f, gpu).unwrap_or_else(|e| panic!("{ty} {op} {gpu}: {e}"));
        }
        if ty == "bf16" {
            let e = tileir::compile(&f, "sm_80").expect_err("no bf16 atomic add on sm_80");
            assert!(e.to_string().starts_with("kernels/atomics.rs:3:5"), "{e}");
        }
    }
}

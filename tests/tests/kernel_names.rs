//! Any valid Rust kernel name compiles for every target and runs on every host
//! device: raw identifiers (`r#match`) and non-ASCII names get object-file symbols
//! every assembler accepts (`tessera::codegen::lower::kernel_symbol`), while messages
//! keep the name as written (`match`).

use tessera::EmuKind;
use tessera::aot::{ALL_TARGETS, CompileOptions, Vendor, compile_kernel};
use tessera::codegen::lower::kernel_symbol;
use tessera::codegen::tools;
use tessera::prelude::*;

#[kernel]
fn r#match(out: &mut Global<i32>) {
    let i = arange::<64>();
    out.store(i, i + 1, i.lt(64));
}

/// Named like one of the emulator's runtime hooks.
#[kernel]
fn tessera_emu_yield(out: &mut Global<i32>) {
    let i = arange::<64>();
    out.store(i, i - 3, i.lt(64));
}

#[kernel]
fn núcleo_ñ(out: &mut Global<i32>) {
    let i = arange::<64>();
    out.store(i, i * 2, i.lt(64));
}

fn ascii_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[test]
fn odd_kernel_names_compile_for_every_target() {
    assert_eq!(
        tessera::kernel_ir::<r#match>(&()).expect("builds").name,
        "match"
    );
    assert_eq!(
        tessera::kernel_ir::<núcleo_ñ>(&()).expect("builds").name,
        "núcleo_ñ"
    );
    for t in ALL_TARGETS {
        for art in [
            compile_kernel::<r#match>(&(), t, &CompileOptions::default()),
            compile_kernel::<núcleo_ñ>(&(), t, &CompileOptions::default()),
        ] {
            let art = art.unwrap_or_else(|e| panic!("{t}: {e}"));
            let sym = &art.meta.name;
            assert!(ascii_ident(sym), "{t}: symbol {sym:?}");
            match t.vendor() {
                Vendor::Nvidia => {
                    assert!(
                        art.asm.contains(&format!(".entry {sym}(")),
                        "{t}: {}",
                        art.asm
                    );
                    tools::ptxas(&art.asm, &t.to_string()).unwrap_or_else(|e| panic!("{t}: {e}"));
                }
                Vendor::Amd => assert!(art.asm.contains(&format!("{sym}:")), "{t}"),
            }
        }
    }
}

#[test]
fn odd_kernel_names_run_on_the_cpu_and_the_emulator() {
    for dev in [
        Device::cpu(),
        Device::emu(EmuKind::Nv).expect("emulator"),
        Device::emu(EmuKind::Amd).expect("emulator"),
    ] {
        let mut out = dev.upload(&[-1i32; 64]).expect("upload");
        r#match::launch(&dev, 1u32, (&mut out,)).expect("launch");
        let want: Vec<i32> = (1..=64).collect();
        assert_eq!(out.download().expect("download"), want);
        núcleo_ñ::launch(&dev, 1u32, (&mut out,)).expect("launch");
        let want: Vec<i32> = (0..64).map(|i| 2 * i).collect();
        assert_eq!(out.download().expect("download"), want);
        tessera_emu_yield::launch(&dev, 1u32, (&mut out,)).expect("launch");
        let want: Vec<i32> = (0..64).map(|i| i - 3).collect();
        assert_eq!(out.download().expect("download"), want);
    }
}

#[test]
fn symbols_are_plain_names_or_distinct_encodings() {
    assert_eq!(kernel_symbol("matmul"), "matmul");
    assert_eq!(kernel_symbol("_x1"), "_x1");
    let odd = [
        "match",
        "núcleo_ñ",
        "núcleo",
        "n_c3_bacleo",
        "__tsr_n",
        "a-b",
        "1a",
        "__tsr_",
        "",
    ];
    let syms: Vec<String> = odd.iter().map(|n| kernel_symbol(n)).collect();
    for (i, s) in syms.iter().enumerate() {
        assert!(ascii_ident(s), "{s:?}");
        for (j, t) in syms.iter().enumerate() {
            assert!(i == j || s != t, "{:?} and {:?} share {s}", odd[i], odd[j]);
        }
    }
}

/// A kernel whose parameter has the kernel's own name (the generated struct does not
/// get in the way of the binding).
#[kernel]
fn scale(out: &mut Global<i32>, scale: i32) {
    let i = arange::<64>();
    out.store(i, i * scale, i.lt(64));
}

#[test]
fn a_parameter_may_share_the_kernels_name() {
    for dev in [Device::cpu(), Device::emu(EmuKind::Nv).unwrap()] {
        let mut out = dev.upload(&[-1i32; 64]).unwrap();
        scale::launch(&dev, 1u32, (&mut out, 3)).unwrap();
        let want: Vec<i32> = (0..64).map(|i| i * 3).collect();
        assert_eq!(out.download().unwrap(), want);
    }
}

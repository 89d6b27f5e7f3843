//! `TESSERA_DUMP=ir` writes each kernel's IR into `TESSERA_DUMP_DIR`. (One test in its
//! own binary: it sets the environment before anything else runs.)

use tessera::prelude::*;

#[kernel]
fn twice<const B: usize>(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = arange::<B>();
    out.store_unmasked(offs, x.load_unmasked(offs) * 2.0);
}

#[test]
fn dump_writes_the_ir() {
    let dir = std::env::temp_dir().join(format!("tessera-dump-test-{}", std::process::id()));
    // SAFETY: this is the only test of this binary, and no other thread reads the
    // environment while it is being set.
    unsafe {
        std::env::set_var("TESSERA_DUMP", "ir,layout");
        std::env::set_var("TESSERA_DUMP_DIR", &dir);
    }
    let dev = Device::cpu();
    let x = dev.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let mut out = dev.alloc::<f32>(4).unwrap();
    twice::<4>::launch(&dev, 1u32, (&x, &mut out)).unwrap();
    assert_eq!(out.download().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ir"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with("twice-") && name.ends_with(".ir"),
        "{name}"
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.starts_with("kernel @twice("), "{text}");
    assert!(text.contains("mul"), "{text}");
    tessera::ir::parser::parse_function(&text).expect("the dump parses");
    // A GPU compilation writes the layouts too: the IR as lowered, annotated.
    let sm80: tessera::aot::Target = "sm_80".parse().unwrap();
    tessera::aot::compile_kernel::<twice<64>>(&(), sm80, &Default::default()).unwrap();
    let layouts: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "layout"))
        .collect();
    assert_eq!(layouts.len(), 1, "{layouts:?}");
    let text = std::fs::read_to_string(&layouts[0]).unwrap();
    assert!(text.contains("// layout [64] reg (1) (2) | lane"), "{text}");
    tessera::ir::parser::parse_function(&text).expect("the layout dump parses");
    std::fs::remove_dir_all(&dir).unwrap();
}

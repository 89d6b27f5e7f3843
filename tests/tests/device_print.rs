//! `device_print` and `device_assert`: lowered before every backend to stores into a
//! hidden output buffer (`tessera_ir::debug`), decoded on the host after the launch.
//! On the CPU interpreter and both emulators (the real GPU lowering): every element
//! of random tiles of every element type, 1-D and 2-D, prints with its program id,
//! index and line; programs' lines, prints in loops, a communicating kernel's ranks;
//! a failed assertion names its file:line:col, program, element and count while the
//! kernel still completes; output past the buffer is counted, not lost silently; a
//! print before a failing access still comes out. Then the instructions every GPU
//! target compiles it to, and the lowered IR.

use std::collections::BTreeMap;
use std::time::Duration;

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::debug::capture_output;
use tessera::prelude::*;
use tessera_tests::{cpu_and_emulators, line_of};

const SOURCE: &str = include_str!("device_print.rs");

fn loc(marker: &str) -> String {
    format!("{}:{}", file!(), line_of(SOURCE, marker))
}

/// Program 1 prints its tiles (three element types and a scalar) element by element;
/// every program prints its id.
#[kernel]
fn show<const B: usize>(x: &Global<f32>, k: &Global<i32>, out: &mut Global<f32>, n: i32) {
    let pid = program_id(0);
    let offs = pid * B + arange::<B>();
    let m = offs.lt(n);
    let v = x.load(offs, m);
    let w = k.load(offs, m);
    if pid.eq(1) {
        device_print("v, w, m, pid =", (v, w, m, pid)); // SHOW_TILE
    }
    device_print("program", pid); // SHOW_PID
    out.store(offs, v * 2.0f32, m);
}

/// Groups lines by their `pid (..)` part, keeping each program's order.
fn by_program(lines: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in lines {
        let at = l.find("pid (").unwrap_or_else(|| panic!("no pid in {l:?}"));
        let end = at + l[at..].find(')').expect("closing paren") + 1;
        m.entry(l[at..end].to_string()).or_default().push(l.clone());
    }
    m
}

#[test]
fn tiles_and_scalars_print_every_element_with_program_and_index() {
    const B: usize = 64;
    let n = 150usize; // program 1 is full, program 2 partial
    let mut r = StdRng::seed_from_u64(11);
    let x: Vec<f32> = (0..n).map(|_| r.gen_range(-4.0f32..4.0)).collect();
    let k: Vec<i32> = (0..n).map(|_| r.gen_range(-1000..1000)).collect();
    for dev in cpu_and_emulators() {
        let mut out = dev.upload(&vec![f32::NAN; n]).unwrap();
        let (res, lines) = capture_output(|| {
            show::<B>::launch(
                &dev,
                3u32,
                (
                    &dev.upload(&x).unwrap(),
                    &dev.upload(&k).unwrap(),
                    &mut out,
                    n as i32,
                ),
            )
        });
        res.unwrap_or_else(|e| panic!("{dev}: {e}"));
        let progs = by_program(&lines);
        assert_eq!(progs.len(), 3, "{dev}: {lines:#?}");
        for p in 0..3 {
            let got = &progs[&format!("pid ({p}, 0, 0)")];
            let mut want = Vec::new();
            if p == 1 {
                for i in 0..B {
                    let g = B + i;
                    want.push(format!(
                        "{}: pid (1, 0, 0) idx ({i}) v, w, m, pid = {:?}, {}, true, 1",
                        loc("SHOW_TILE"),
                        x[g],
                        k[g]
                    ));
                }
            }
            want.push(format!("{}: pid ({p}, 0, 0) program {p}", loc("SHOW_PID")));
            assert_eq!(got, &want, "{dev}: program {p}");
        }
        // The kernel's own work is unchanged.
        let out = out.download().unwrap();
        for i in 0..n {
            assert_eq!(out[i], x[i] * 2.0, "{dev}: out[{i}]");
        }
    }
}

#[kernel]
fn where_am_i() {
    let (x, y, z) = (program_id(0), program_id(1), program_id(2));
    let n = num_programs(0) * num_programs(1) * num_programs(2);
    device_print("at", (x, y, z, n)); // WHERE_AM_I
}

/// Every program of a 3-D grid reports its own id, once.
#[test]
fn every_program_of_a_3d_grid_prints_its_id() {
    for dev in cpu_and_emulators() {
        let (res, lines) = capture_output(|| where_am_i::launch(&dev, (3u32, 2, 2), ()));
        res.unwrap_or_else(|e| panic!("{dev}: {e}"));
        let mut got = lines.clone();
        got.sort();
        let mut want = Vec::new();
        for x in 0..3 {
            for y in 0..2 {
                for z in 0..2 {
                    want.push(format!(
                        "{}: pid ({x}, {y}, {z}) at {x}, {y}, {z}, 12",
                        loc("WHERE_AM_I")
                    ));
                }
            }
        }
        want.sort();
        assert_eq!(got, want, "{dev}");
    }
}

/// Every element type, a 2-D tile, and a print in a runtime loop.
#[kernel]
#[allow(clippy::too_many_arguments)]
fn typed<const R: usize, const C: usize>(
    h: &Global<f16>,
    b: &Global<bf16>,
    u: &Global<u8>,
    l: &Global<i64>,
    d: &Global<f64>,
    s: &Global<i8>,
    rounds: i32,
) {
    let r = arange::<R>().expand_dims::<1>();
    let c = arange::<C>().expand_dims::<0>();
    let offs = r * C as i32 + c;
    let lv = l.load_unmasked(offs);
    let all = (
        h.load_unmasked(offs),
        b.load_unmasked(offs),
        u.load_unmasked(offs),
        lv,
        d.load_unmasked(offs),
        s.load_unmasked(offs),
        lv.lt(0i64),
    );
    device_print("", all); // TYPED_TILE
    for i in 0..rounds {
        device_print("round", (i, i.cast::<f32>() * 0.5f32)); // TYPED_LOOP
    }
}

#[test]
fn every_element_type_and_2d_tiles_and_loops_print() {
    const R: usize = 4;
    const C: usize = 8;
    let n = R * C;
    let mut g = StdRng::seed_from_u64(12);
    let h: Vec<f16> = (0..n)
        .map(|_| f16::from_f32(g.gen_range(-9.0..9.0)))
        .collect();
    let b: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(g.gen_range(-9.0..9.0)))
        .collect();
    let u: Vec<u8> = (0..n).map(|_| g.r#gen()).collect();
    let mut l: Vec<i64> = (0..n).map(|_| g.r#gen()).collect();
    l[3] = i64::MIN;
    let mut d: Vec<f64> = (0..n).map(|_| g.gen_range(-1e300..1e300)).collect();
    d[5] = f64::NAN;
    d[6] = f64::NEG_INFINITY;
    let s: Vec<i8> = (0..n).map(|_| g.r#gen()).collect();
    let rounds = 3;
    for dev in cpu_and_emulators() {
        let (res, lines) = capture_output(|| {
            typed::<R, C>::launch(
                &dev,
                1u32,
                (
                    &dev.upload(&h).unwrap(),
                    &dev.upload(&b).unwrap(),
                    &dev.upload(&u).unwrap(),
                    &dev.upload(&l).unwrap(),
                    &dev.upload(&d).unwrap(),
                    &dev.upload(&s).unwrap(),
                    rounds,
                ),
            )
        });
        res.unwrap_or_else(|e| panic!("{dev}: {e}"));
        let mut want = Vec::new();
        for i in 0..n {
            want.push(format!(
                "{}: pid (0, 0, 0) idx ({}, {}) {:?}, {:?}, {}, {}, {:?}, {}, {}",
                loc("TYPED_TILE"),
                i / C,
                i % C,
                h[i].to_f32(),
                b[i].to_f32(),
                u[i],
                l[i],
                d[i],
                s[i],
                l[i] < 0
            ));
        }
        for i in 0..rounds {
            want.push(format!(
                "{}: pid (0, 0, 0) round {i}, {:?}",
                loc("TYPED_LOOP"),
                i as f32 * 0.5
            ));
        }
        assert_eq!(lines, want, "{dev}");
    }
}

#[kernel]
fn checked<const B: usize>(x: &Global<i32>, out: &mut Global<i32>, n: i32, limit: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let v = x.load(offs, m);
    device_assert(v.lt(limit), "v below the limit"); // CHECK_TILE
    device_assert(n.gt(0), "n is positive"); // CHECK_SCALAR
    out.store(offs, v + 1, m);
}

#[test]
fn a_failed_assertion_names_its_line_program_and_element() {
    const B: usize = 32;
    let n = 100usize;
    let mut g = StdRng::seed_from_u64(13);
    let x: Vec<i32> = (0..n).map(|_| g.gen_range(-50..50)).collect();
    let run = |dev: &Device, x: &[i32], n: i32| {
        let mut out = dev.upload(&vec![i32::MIN; x.len()]).unwrap();
        let r = checked::<B>::launch(
            dev,
            (x.len().div_ceil(B)) as u32,
            (&dev.upload(x).unwrap(), &mut out, n, 50),
        );
        (r, out.download().unwrap())
    };
    for dev in cpu_and_emulators() {
        // Nothing fails.
        let (r, out) = run(&dev, &x, n as i32);
        r.unwrap_or_else(|e| panic!("{dev}: {e}"));
        assert!(out.iter().zip(&x).all(|(o, v)| *o == v + 1), "{dev}");
        // Two elements of program 2 fail; the kernel still completes.
        let mut bad = x.clone();
        bad[2 * B + 9] = 77;
        bad[2 * B + 5] = 50;
        let (r, out) = run(&dev, &bad, n as i32);
        let e = r.expect_err("the assertion fails");
        let Error::DeviceAssert(f) = &e else {
            panic!("{dev}: not an assertion failure: {e}");
        };
        assert_eq!(f.program, [2, 0, 0], "{dev}");
        assert_eq!(f.index, vec![5], "{dev}");
        assert_eq!((f.failing, f.more), (2, 0), "{dev}");
        assert_eq!(f.message, "v below the limit");
        let msg = e.to_string();
        let want = format!(
            "{}:{}: device assertion failed in kernel `checked`: v below the limit (program (2, 0, 0), element (5), 2 failing elements)",
            loc("CHECK_TILE"),
            f.span.col
        );
        assert_eq!(msg, want, "{dev}");
        assert!(out.iter().zip(&bad).all(|(o, v)| *o == v + 1), "{dev}");
        // Programs 0 and 3 fail: one is reported, the other counted.
        let mut bad = x.clone();
        bad[3] = 99;
        bad[3 * B + 1] = 60;
        let (r, _) = run(&dev, &bad, n as i32);
        let Err(Error::DeviceAssert(f)) = r else {
            panic!("{dev}: {r:?}");
        };
        let (p, i) = if f.program[0] == 0 { (0, 3) } else { (3, 1) };
        assert_eq!((f.program, f.index.clone()), ([p, 0, 0], vec![i]), "{dev}");
        assert_eq!(f.more, 1, "{dev}");
        // A scalar condition fails in every program, reported without an element.
        let (r, _) = run(&dev, &x, 0);
        let Err(e @ Error::DeviceAssert(_)) = r else {
            panic!("{dev}: {r:?}");
        };
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("{}:", loc("CHECK_SCALAR")))
                && msg.contains("n is positive (program (")
                && msg.contains("; 3 more failed assertion records"),
            "{dev}: {msg}"
        );
        assert!(!msg.contains("element"), "{dev}: {msg}");
    }
}

#[kernel]
fn flood<const B: usize>(out: &mut Global<i32>) {
    let i = arange::<B>();
    device_print("i", i);
    out.store_unmasked(program_id(0) * B + i, i);
}

/// 300 programs print 1024 elements each: 255 records fit the 2 MiB buffer, the rest
/// are counted in a last line.
#[test]
fn output_past_the_buffer_is_counted() {
    const B: usize = 1024;
    const P: usize = 300;
    for dev in cpu_and_emulators() {
        let mut out = dev.upload(&vec![-1i32; B * P]).unwrap();
        let (res, lines) = capture_output(|| flood::<B>::launch(&dev, P as u32, (&mut out,)));
        res.unwrap_or_else(|e| panic!("{dev}: {e}"));
        let fits = (((1 << 18) - 2) / (B + 3)) as u64;
        assert_eq!(lines.len() as u64, fits * B as u64 + 1, "{dev}");
        let last = lines.last().unwrap();
        let dropped = (P as u64 - fits) * (B as u64 + 3);
        assert!(
            last.contains(&format!("{dropped} words of device output did not fit")),
            "{dev}: {last}"
        );
        // Whole records, each program's elements in order.
        for (_, v) in by_program(&lines[..lines.len() - 1]) {
            assert_eq!(v.len(), B, "{dev}");
            for (j, l) in v.iter().enumerate() {
                assert!(l.ends_with(&format!("idx ({j}) i {j}")), "{dev}: {l}");
            }
        }
        assert!(out.download().unwrap().iter().all(|&v| v >= 0), "{dev}");
    }
}

#[kernel]
fn print_then_fault<const B: usize>(x: &Global<f32>, out: &mut Global<f32>) {
    let i = arange::<B>();
    device_print("before", program_id(0)); // BEFORE_FAULT
    out.store_unmasked(i, x.load_unmasked(i + 2_000_000_000));
}

/// A launch that fails still reports what it printed.
#[test]
fn a_failed_launch_still_prints() {
    for dev in cpu_and_emulators() {
        let mut out = dev.upload(&[0f32; 16]).unwrap();
        let (res, lines) = capture_output(|| {
            print_then_fault::<16>::launch(
                &dev,
                1u32,
                (&dev.upload(&[1f32; 16]).unwrap(), &mut out),
            )
        });
        let e = res.expect_err(&format!("{dev}: out of bounds, printed {lines:?}"));
        assert!(!matches!(e, Error::DeviceAssert(_)), "{dev}: {e}");
        assert_eq!(
            lines.first().map(String::as_str),
            Some(format!("{}: pid (0, 0, 0) before 0", loc("BEFORE_FAULT")).as_str()),
            "{dev}: {lines:?} ({e})"
        );
    }
}

#[kernel]
fn shapes_differ(x: &Global<f32>) {
    let a = x.load_unmasked(arange::<16>());
    let b = x.load_unmasked(arange::<8>());
    device_print("a b", (a, b)); // SHAPES_DIFFER
}

#[test]
fn tiles_of_two_shapes_are_a_build_error_at_the_call() {
    let dev = Device::cpu();
    let e = shapes_differ::launch(&dev, 1u32, (&dev.upload(&[0f32; 16]).unwrap(),))
        .expect_err("shapes differ");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("{}:", loc("SHAPES_DIFFER")))
            && msg.contains("tiles of one shape, got shapes [16] and [8]"),
        "{msg}"
    );
}

/// A communicating kernel that prints: the output buffer comes before the hidden
/// communication parameters, on every rank.
#[kernel]
fn ring_print<const B: usize>(data: &mut Symmetric<f32>, sig: &mut Symmetric<u64>) {
    let me = rank();
    let right = (me + 1) % world_size();
    let offs = arange::<B>();
    let all = offs.ge(0);
    let v = data.load(offs, all) + me.cast::<f32>();
    data.put_signal(right, offs + B as i32, v, all, sig, 0, 1u64, SignalOp::Set);
    sig.wait_until(0, CmpPred::Ge, 1u64);
    let got = data.load(offs + B as i32, all);
    device_print("rank, got", (me, got.sum()));
}

#[test]
fn ranks_of_a_world_print_their_own_lines() {
    const B: usize = 16;
    let devs = cpu_and_emulators();
    for dev in devs {
        let out = World::local(2)
            .on(&dev)
            .wait_timeout(Duration::from_secs(60))
            .run(|r| {
                let init: Vec<f32> = (0..2 * B).map(|i| i as f32).collect();
                let mut data = r.upload(&init)?;
                let mut sig = r.alloc_signals(1)?;
                let (res, lines) = capture_output(|| {
                    ring_print::<B>::launch(r.device(), 1u32, (&mut data, &mut sig))
                });
                res.map(|()| lines)
            })
            .unwrap_or_else(|e| panic!("{dev}: {e}"));
        // Each rank got the other's first half plus the sender's rank.
        let base: f32 = (0..B).map(|i| i as f32).sum();
        for (me, lines) in out.iter().enumerate() {
            let sender = 1 - me;
            let want = base + (B * sender) as f32;
            assert_eq!(lines.len(), 1, "{dev}: {lines:?}");
            assert!(
                lines[0].ends_with(&format!("pid (0, 0, 0) rank, got {me}, {want:?}")),
                "{dev}: {}",
                lines[0]
            );
        }
    }
}

/// Every GPU target compiles the output buffer's accesses: a 64-bit atomic add that
/// reserves each record, and the record's stores; ptxas accepts the PTX.
#[test]
fn printing_and_asserting_compile_for_every_gpu_target() {
    use tessera::aot::{AmdArch, CompileOptions, Target, compile_kernel};
    use tessera::codegen::tools;
    let o = CompileOptions::default();
    for t in [Target::nvptx(80), Target::SM90A] {
        for a in [
            compile_kernel::<show<128>>(&(), t, &o).expect("show compiles"),
            compile_kernel::<checked<128>>(&(), t, &o).expect("checked compiles"),
        ] {
            assert!(
                a.asm.contains("atom.global.add.u64"),
                "{t}:\n{}",
                a.asm
                    .lines()
                    .filter(|l| l.contains("atom") || l.contains("st.global"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            let st: Vec<&str> = a.asm.lines().filter(|l| l.contains("st.global")).collect();
            assert!(
                st.iter().any(|l| l.contains(".u64") || l.contains(".b64")),
                "{t}: {st:?}"
            );
            tools::ptxas(&a.asm, &t.to_string()).expect("ptxas");
        }
    }
    for a in [AmdArch::Gfx90a, AmdArch::Gfx942] {
        let t = Target::Amdgpu(a);
        for art in [
            compile_kernel::<show<128>>(&(), t, &o).expect("show compiles"),
            compile_kernel::<checked<128>>(&(), t, &o).expect("checked compiles"),
        ] {
            assert!(
                art.asm.contains("global_atomic_add_x2"),
                "{t}:\n{}",
                art.asm
            );
        }
    }
}

#[kernel]
fn tiny(x: &Global<f32>) {
    let v = x.load_unmasked(arange::<4>());
    device_print("v", v);
    device_assert(v.ge(0.0f32), "non-negative");
}

/// The lowered IR: the hidden parameter, the reservation, the capacity check and the
/// record's stores.
#[test]
fn the_lowered_ir_writes_records_into_the_hidden_buffer() {
    let f = tessera::kernel_ir::<tiny>(&()).expect("builds");
    assert_eq!(
        f.params.last().map(|p| p.name.as_str()),
        Some("__tessera_debug")
    );
    let text: String = f
        .to_string()
        .lines()
        .map(|l| match (l.find(" loc("), l.rfind(')')) {
            (Some(a), Some(b)) if b > a => format!("{}{}\n", &l[..a], &l[b + 1..]),
            _ => format!("{l}\n"),
        })
        .collect();
    assert!(
        !text.contains(" print ") && !text.contains(" assert "),
        "{text}"
    );
    insta::assert_snapshot!("tiny_debug_ir", text);
}

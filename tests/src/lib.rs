//! Shared helpers of the test suite: references, comparisons and poisoning.

pub mod emu_world;

/// Asserts `|got[i] - want[i]| <= tol(i)` for every element, naming the first bad
/// index. NaN (the poison value) always fails.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let err = (got[i] - want[i]).abs();
        assert!(
            err <= tol(i),
            "{what}: element {i}: got {} want {} (|err| {err:e} > tol {:e})",
            got[i],
            want[i],
            tol(i)
        );
    }
}

/// The devices every op test runs on: the CPU (kernels compiled for the host, every
/// launch waiting for the compiler, so that the compiled code is what runs), the
/// reference interpreter, and the SIMT emulator in both vendors' flavors (the real
/// GPU lowering).
pub fn cpu_and_emulators() -> Vec<tessera::Device> {
    let mut devs = vec![compiled_cpu(), tessera::Device::interp()];
    for k in [tessera::EmuKind::Nv, tessera::EmuKind::Amd] {
        devs.push(tessera::Device::emu(k).expect("the emulator is built in"));
    }
    devs
}

/// The CPU device with every launch running compiled code (`TESSERA_CPU_JIT=wait`;
/// by default a kernel's first launch starts on the interpreter while it compiles).
pub fn compiled_cpu() -> tessera::Device {
    tessera::Device::cpu().with_cpu_jit(tessera::config::CpuJit::Wait)
}

/// The 1-based line of the first line of `source` containing `marker`.
pub fn line_of(source: &str, marker: &str) -> u32 {
    source
        .lines()
        .position(|l| l.contains(marker))
        .map(|i| i as u32 + 1)
        .unwrap_or_else(|| panic!("marker {marker:?} not found"))
}

/// Asserts that error message `msg` starts with `file` (a test file's path, as
/// `file!()` gives it) and the line of `mark` in `source` (the user's call into the
/// library, not the library's kernel), then names the library call `call`, and still
/// holds every part of `inner` (the library's own report).
pub fn assert_names_call_site(
    (source, file): (&str, &str),
    msg: &str,
    mark: &str,
    call: &str,
    inner: &[&str],
) {
    let line = line_of(source, mark);
    let at = format!("{file}:{line}:");
    assert!(msg.starts_with(&at), "{at:?} does not start: {msg}");
    assert!(
        msg.contains(&format!("`{call}` failed: ")),
        "`{call}` missing from: {msg}"
    );
    for part in inner {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
}

/// Kernels several communication test files use.
pub mod kernels {
    use tessera::prelude::*;

    /// Causal attention forward for one head, FlashAttention style: each program
    /// takes `BM` query rows, walks the keys `BN` at a time up to its diagonal with an
    /// online softmax (running max `m`, running sum `l`), and accumulates `P · V` in
    /// f32. `q`, `k`, `v`, `o` are `seq x HD` row-major f16; `scale` multiplies `Q Kᵀ`.
    #[kernel]
    pub fn attention<const BM: usize, const BN: usize, const HD: usize>(
        q: &Global<f16>,
        k: &Global<f16>,
        v: &Global<f16>,
        o: &mut Global<f16>,
        seq: i32,
        scale: f32,
    ) {
        let pid = program_id(0);
        let rm = (pid * BM + arange::<BM>()).expand_dims::<1>(); // BM x 1
        let dc = arange::<HD>().expand_dims::<0>(); // 1 x HD
        let dr = arange::<HD>().expand_dims::<1>(); // HD x 1
        let qt = q.load(rm * HD as i32 + dc, rm.lt(seq) & dc.lt(HD as i32));
        let mut m_i = full::<f32, S1<BM>>(-1.0e30);
        let mut l_i = zeros::<f32, S1<BM>>();
        let mut acc = zeros::<f32, S2<BM, HD>>();
        let hi = (pid + 1) * BM as i32;
        for n0 in (0..hi).step_by(BN) {
            let rn = n0 + arange::<BN>();
            let kc = rn.expand_dims::<0>(); // 1 x BN
            let kr = rn.expand_dims::<1>(); // BN x 1
            let kt = k.load(kc * HD as i32 + dr, kc.lt(seq) & dr.lt(HD as i32)); // HD x BN
            let s = dot(qt, kt, zeros::<f32, S2<BM, BN>>()) * scale;
            let s = select(rm.ge(kc) & kc.lt(seq), s, -1.0e30f32);
            let m_new = m_i.maximum(s.max::<1>());
            let p = (s - m_new.expand_dims::<1>()).exp();
            let alpha = (m_i - m_new).exp();
            l_i = l_i * alpha + p.sum::<1>();
            let vt = v.load(kr * HD as i32 + dc, kr.lt(seq) & dc.lt(HD as i32)); // BN x HD
            acc = dot(p.cast::<f16>(), vt, acc * alpha.expand_dims::<1>());
            m_i = m_new;
        }
        let out = acc / l_i.expand_dims::<1>();
        o.store(
            rm * HD as i32 + dc,
            out.cast::<f16>(),
            rm.lt(seq) & dc.lt(HD as i32),
        );
    }

    /// Causal attention in f64 from the f16 inputs (the reference for [`attention`]).
    pub fn attention_reference(
        q: &[f16],
        k: &[f16],
        v: &[f16],
        seq: usize,
        d: usize,
        scale: f64,
    ) -> Vec<f64> {
        let f = |x: &f16| x.to_f64();
        let mut o = vec![0.0; seq * d];
        for i in 0..seq {
            let s: Vec<f64> = (0..=i)
                .map(|j| {
                    (0..d)
                        .map(|c| f(&q[i * d + c]) * f(&k[j * d + c]))
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for c in 0..d {
                o[i * d + c] = (0..=i).map(|j| e[j] * f(&v[j * d + c])).sum::<f64>() / l;
            }
        }
        o
    }

    /// `C = A · B + R` (f16 inputs, f32 residual and output, row-major, masked
    /// edges): a matmul whose epilogue adds a loaded tile, the commonest fused GEMM
    /// epilogue.
    #[kernel]
    pub fn matmul_residual<const BM: usize, const BN: usize, const BK: usize>(
        a: &Global<f16>,
        b: &Global<f16>,
        r: &Global<f32>,
        c: &mut Global<f32>,
        m: i32,
        n: i32,
        k: i32,
    ) {
        let rm = (program_id(0) * BM + arange::<BM>()).expand_dims::<1>();
        let rn = (program_id(1) * BN + arange::<BN>()).expand_dims::<0>();
        let rk = arange::<BK>();
        let mut acc = zeros::<f32, S2<BM, BN>>();
        for k0 in (0..k).step_by(BK) {
            let kk = k0 + rk;
            let (k_col, k_row) = (kk.expand_dims::<0>(), kk.expand_dims::<1>());
            let a_tile = a.load(rm * k + k_col, rm.lt(m) & k_col.lt(k));
            let b_tile = b.load(k_row * n + rn, k_row.lt(k) & rn.lt(n));
            acc = dot(a_tile, b_tile, acc);
        }
        let out = rm * n + rn;
        let mask = rm.lt(m) & rn.lt(n);
        c.store(out, acc + r.load(out, mask), mask);
    }

    /// Ping-pong between ranks 0 and 1, `rounds` times: rank 0 puts its tile to rank 1
    /// and signals; rank 1 waits, adds one, puts it back and signals. Other ranks idle.
    #[kernel]
    pub fn ping_pong<const B: usize>(
        data: &mut Symmetric<f32>,
        sig: &mut Symmetric<u64>,
        rounds: i32,
    ) {
        let me = rank();
        let offs = arange::<B>();
        let all = offs.lt(B as i32);
        for r in 0..rounds {
            let round = (r + 1).cast::<u64>();
            if me.eq(0) {
                let v = data.load(offs, all);
                data.put_signal(1, offs, v, all, sig, 0, round, SignalOp::Set);
                sig.wait_until(1, CmpPred::Ge, round);
            }
            if me.eq(1) {
                sig.wait_until(0, CmpPred::Ge, round);
                let v = data.load(offs, all) + 1.0f32;
                data.put_signal(0, offs, v, all, sig, 1, round, SignalOp::Set);
            }
        }
    }
}

//! Fused compute + communication kernels (`tessera::fused`) on CPU ranks: each equals
//! the unfused sequence on random inputs with ragged shapes, outputs poisoned first,
//! and plans run twice (the second run with new data checks that epochs and the
//! end-of-kernel barrier make the workspace reusable).
//!
//! Tolerances: the GEMMs accumulate in f32 over `k` terms, so `|got - want| <=
//! k * eps_f32 * Σ|a||b| + |want| * ulp(T)` against an f64 reference from the same
//! (rounded) inputs. The unfused sequences (`tessera::fused::unfused`: separate
//! all-gather / GEMM / reduce-scatter / all-reduce / RMSNorm kernels) run on the same
//! inputs: the all-gather + GEMM must equal gather-then-GEMM bit for bit in every
//! dtype (same tile code, same summation order), GEMM + reduce-scatter and
//! all-reduce + RMSNorm must equal theirs bit for bit in f32 (in f16/bf16 the unfused
//! sequence rounds intermediate results to the element type, the fused one does not).
//! RMSNorm against f64: the f32 sums' error carried through, `hidden * eps_f32`
//! relative for the statistics, one output rounding.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::fused::{AgGemm, AllReduceRmsNorm, GemmElem, GemmReduceScatter, unfused};
use tessera::prelude::*;
use unfused::{AgThenGemm, AllReduceThenRmsNorm, GemmThenReduceScatter};

/// A world on the reference interpreter: the plans are checked to round where the
/// unfused kernel sequences round (the same bits). On the compiled CPU device a
/// plan's communicating kernels run on the interpreter while the unfused sequence's
/// compute kernels are compiled, whose sums may be reassociated and whose `dot`
/// contracts products into FMAs.
fn world(n: usize) -> World {
    World::local(n)
        .on(&Device::interp())
        .heap_bytes(64 << 20)
        .wait_timeout(Duration::from_secs(60))
}

/// `count` uniform values in [-1, 1) from `seed`, rounded to `T`.
fn random<T: Conv>(seed: u64, count: usize) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| T::from_f64(rng.gen_range(-1.0..1.0)))
        .collect()
}

trait Conv: Copy {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// Half an ulp at 1.0 (relative rounding error of one conversion).
    const ULP: f64;
}
impl Conv for f32 {
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    const ULP: f64 = f32::EPSILON as f64;
}
impl Conv for f16 {
    fn from_f64(v: f64) -> f16 {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    const ULP: f64 = 1.0 / 1024.0;
}
impl Conv for bf16 {
    fn from_f64(v: f64) -> bf16 {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    const ULP: f64 = 1.0 / 128.0;
}

/// `c = a · b` in f64, and `Σ|a||b|` per element.
fn matmul_ref(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += av * b[p * n + j];
                mag[i * n + j] += (av * b[p * n + j]).abs();
            }
        }
    }
    (c, mag)
}

fn check_gemm<T: Conv>(what: &str, got: &[T], want: &[f64], mag: &[f64], k: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut bad = Vec::new();
    for (i, (&g, (&w, &s))) in got.iter().zip(want.iter().zip(mag)).enumerate() {
        let tol = 1e-30 + s * k as f64 * f32::EPSILON as f64 + w.abs() * T::ULP;
        let g = g.to_f64();
        // NaN (the poison) fails the comparison.
        let ok = (g - w).abs() <= tol;
        if !ok {
            bad.push(format!("[{i}] got {g} want {w} (tol {tol:.3e})"));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} of {} elements differ: {}",
        bad.len(),
        got.len(),
        bad[..bad.len().min(5)].join(", ")
    );
}

fn is_f32<T: 'static>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}

fn same_bits<T: Conv>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

fn to64<T: Conv>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

// ---------------------------------------------------------------------------------
// All-gather + GEMM

fn ag_gemm_case<T: GemmElem + Conv>(ranks: usize, ms: usize, n: usize, k: usize, seed: u64)
where
    tessera::fused::ag_gemm_kernel<T, 64, 64, 32>: Kernel<Comptime = ()>,
    unfused::gather_rows_kernel<T, 64, 32>: Kernel<Comptime = ()>,
    unfused::gemm_kernel<T, 64, 64, 32>: Kernel<Comptime = ()>,
{
    let m = ms * ranks;
    let what = format!(
        "ag_gemm {} ranks {ranks} {m}x{n}x{k}",
        std::any::type_name::<T>()
    );
    // Two runs with different data; B is replicated.
    let a_full: Vec<Vec<T>> = (0..2).map(|i| random(seed + i, m * k)).collect();
    let bs: Vec<Vec<T>> = (0..2).map(|i| random(seed + 10 + i, k * n)).collect();
    let nan = T::from_f64(f64::NAN);
    let out = world(ranks)
        .run(|r| {
            let me = r.rank() as usize;
            let mut plan = AgGemm::<T>::new(r, ms, n, k)?;
            let mut plain = AgThenGemm::<T>::new(r, ms, n, k)?;
            let mut res = Vec::new();
            for run in 0..2 {
                let shard = &a_full[run][me * ms * k..(me + 1) * ms * k];
                let a = r.device().upload(shard)?;
                let b = r.device().upload(&bs[run])?;
                let mut c = r.device().upload(&vec![nan; m * n])?;
                plan.run(r, &a, &b, &mut c)?;
                let mut c2 = r.device().upload(&vec![nan; m * n])?;
                plain.run(r, &a, &b, &mut c2)?;
                res.push((c.download()?, c2.download()?));
            }
            Ok(res)
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for run in 0..2 {
        let (want, mag) = matmul_ref(&to64(&a_full[run]), &to64(&bs[run]), m, n, k);
        for (rank, res) in out.iter().enumerate() {
            let (fused, plain) = &res[run];
            let w = format!("{what} run {run} rank {rank}");
            check_gemm(&w, fused, &want, &mag, k);
            assert!(
                same_bits(fused, plain),
                "{w}: fused and unfused results differ"
            );
        }
    }
}

#[test]
fn ag_gemm_f32_two_ranks_ragged() {
    // Shards of 100 rows: two chunks, the second partial; n, k not tile multiples.
    ag_gemm_case::<f32>(2, 100, 130, 70, 1);
}

#[test]
fn ag_gemm_f32_four_ranks() {
    ag_gemm_case::<f32>(4, 45, 70, 50, 2);
}

#[test]
fn ag_gemm_f16_four_ranks() {
    ag_gemm_case::<f16>(4, 70, 65, 40, 3);
}

#[test]
fn ag_gemm_f32_eight_ranks() {
    ag_gemm_case::<f32>(8, 9, 33, 17, 4);
}

#[test]
fn ag_gemm_bf16_two_ranks() {
    ag_gemm_case::<bf16>(2, 33, 64, 96, 5);
}

#[test]
fn ag_gemm_bad_lengths_are_errors() {
    let err = world(2)
        .run(|r| {
            let mut plan = AgGemm::<f32>::new(r, 8, 8, 8)?;
            let a = r.device().upload(&[1.0f32; 63])?;
            let b = r.device().upload(&[1.0f32; 64])?;
            let mut c = r.device().alloc::<f32>(128)?;
            plan.run(r, &a, &b, &mut c)
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the A shard holds 63 elements, the plan needs 64"),
        "{err}"
    );
    let err = world(1)
        .run(|r| {
            AgGemm::<f32>::new(r, 8, 8, 8)?
                .with_programs(r, 2000)
                .map(|_| ())
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("1 to 1024 program instances"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------
// GEMM + reduce-scatter

fn gemm_rs_case<T: GemmElem + Conv>(ranks: usize, m: usize, n: usize, kr: usize, seed: u64)
where
    tessera::fused::gemm_rs_kernel<T, 64, 64, 32>: Kernel<Comptime = ()>,
    unfused::gemm_kernel<T, 64, 64, 32>: Kernel<Comptime = ()>,
    unfused::reduce_scatter_rows_kernel<T, 1024>: Kernel<Comptime = ()>,
{
    let ms = m / ranks;
    let k = kr * ranks;
    let what = format!(
        "gemm_rs {} ranks {ranks} {m}x{n}x{k}",
        std::any::type_name::<T>()
    );
    // The full A (m x k) and B (k x n); rank r holds columns / rows r*kr.. of them.
    let a: Vec<Vec<T>> = (0..2).map(|i| random(seed + i, m * k)).collect();
    let b: Vec<Vec<T>> = (0..2).map(|i| random(seed + 10 + i, k * n)).collect();
    let nan = T::from_f64(f64::NAN);
    let out = world(ranks)
        .run(|r| {
            let me = r.rank() as usize;
            let mut plan = GemmReduceScatter::<T>::new(r, m, n, kr)?;
            let mut plain = GemmThenReduceScatter::<T>::new(r, m, n, kr)?;
            let mut res = Vec::new();
            for run in 0..2 {
                let a_r: Vec<T> = (0..m)
                    .flat_map(|i| a[run][i * k + me * kr..i * k + (me + 1) * kr].to_vec())
                    .collect();
                let b_r = &b[run][me * kr * n..(me + 1) * kr * n];
                let da = r.device().upload(&a_r)?;
                let db = r.device().upload(b_r)?;
                let mut out = r.device().upload(&vec![nan; ms * n])?;
                plan.run(r, &da, &db, &mut out)?;
                let mut out2 = r.device().upload(&vec![nan; ms * n])?;
                plain.run(r, &da, &db, &mut out2)?;
                res.push((out.download()?, out2.download()?));
            }
            Ok(res)
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for run in 0..2 {
        let (want, mag) = matmul_ref(&to64(&a[run]), &to64(&b[run]), m, n, k);
        for (rank, res) in out.iter().enumerate() {
            let block = rank * ms * n..(rank + 1) * ms * n;
            // One rounding of the f32 sum to T, plus f32 rounding of the rank sum.
            let w = format!("{what} run {run} rank {rank}");
            let (fused, plain) = &res[run];
            check_gemm(&w, fused, &want[block.clone()], &mag[block], k + ranks);
            // In f32 the unfused sequence does the same operations in the same order
            // (its partial products are not rounded): the same bits.
            if is_f32::<T>() {
                assert!(
                    same_bits(fused, plain),
                    "{w}: fused and unfused results differ"
                );
            }
        }
    }
}

#[test]
fn gemm_rs_f32_two_ranks_ragged() {
    gemm_rs_case::<f32>(2, 150, 70, 40, 20);
}

#[test]
fn gemm_rs_f32_four_ranks() {
    gemm_rs_case::<f32>(4, 92, 100, 19, 21);
}

#[test]
fn gemm_rs_f16_four_ranks() {
    gemm_rs_case::<f16>(4, 60, 66, 33, 22);
}

#[test]
fn gemm_rs_f32_eight_ranks() {
    gemm_rs_case::<f32>(8, 80, 40, 9, 23);
}

#[test]
fn gemm_rs_bad_shape_is_an_error() {
    let err = world(4)
        .run(|r| GemmReduceScatter::<f32>::new(r, 10, 8, 8).map(|_| ()))
        .unwrap_err();
    assert!(
        err.to_string().contains("m a multiple of the 4 ranks"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------
// All-reduce + residual add + RMSNorm

fn rmsnorm_case<T: GemmElem + Conv>(ranks: usize, rows: usize, hidden: usize, seed: u64)
where
    tessera::fused::allreduce_rmsnorm_kernel<T, 256>: Kernel<Comptime = ()>,
    unfused::all_reduce_kernel<T, 1024>: Kernel<Comptime = ()>,
    unfused::residual_rmsnorm_kernel<T, 256>: Kernel<Comptime = ()>,
{
    let what = format!(
        "allreduce_rmsnorm {} ranks {ranks} {rows}x{hidden}",
        std::any::type_name::<T>()
    );
    let eps = 1e-5f32;
    let xs: Vec<Vec<Vec<T>>> = (0..2)
        .map(|run| {
            (0..ranks)
                .map(|r| random(seed + 100 * run + r as u64, rows * hidden))
                .collect()
        })
        .collect();
    let res_in: Vec<Vec<T>> = (0..2)
        .map(|run| random(seed + 50 + run, rows * hidden))
        .collect();
    let w: Vec<T> = random::<T>(seed + 77, hidden)
        .into_iter()
        .map(|v| T::from_f64(v.to_f64() + 1.5))
        .collect();
    let nan = T::from_f64(f64::NAN);
    let out = world(ranks)
        .run(|r| {
            let me = r.rank() as usize;
            let mut plan = AllReduceRmsNorm::<T>::new(r, rows, hidden, eps)?;
            let mut plain = AllReduceThenRmsNorm::<T>::new(r, rows, hidden, eps)?;
            let mut x = r.alloc::<T>(rows * hidden)?;
            let dw = r.device().upload(&w)?;
            let mut res = Vec::new();
            for run in 0..2 {
                x.copy_from(&xs[run][me])?;
                let mut resid = r.device().upload(&res_in[run])?;
                let mut out = r.device().upload(&vec![nan; rows * hidden])?;
                plan.run(r, &x, &mut resid, &dw, &mut out)?;
                let mut resid2 = r.device().upload(&res_in[run])?;
                let mut out2 = r.device().upload(&vec![nan; rows * hidden])?;
                plain.run(r, &x, &mut resid2, &dw, &mut out2)?;
                res.push((
                    resid.download()?,
                    out.download()?,
                    resid2.download()?,
                    out2.download()?,
                ));
            }
            Ok(res)
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for run in 0..2 {
        // The unfused sequence in f64: all-reduce, add the residual, RMSNorm; and
        // the magnitude of the terms of each h (for f32 rounding of the sums).
        let mut h = to64(&res_in[run]);
        let mut mag: Vec<f64> = h.iter().map(|v| v.abs()).collect();
        for x in &xs[run] {
            for ((hv, mv), xv) in h.iter_mut().zip(mag.iter_mut()).zip(x) {
                *hv += xv.to_f64();
                *mv += xv.to_f64().abs();
            }
        }
        let eps32 = f32::EPSILON as f64;
        for (rank, res) in out.iter().enumerate() {
            let (resid, o, resid2, o2) = &res[run];
            let w_ = format!("{what} run {run} rank {rank}");
            // In f32 the unfused sequence (all-reduce kernel, then residual + RMSNorm
            // kernel) rounds at the same places: the same bits.
            if is_f32::<T>() {
                assert!(
                    same_bits(resid, resid2) && same_bits(o, o2),
                    "{w_}: fused and unfused results differ"
                );
            }
            // Every rank reads the peers in the same order: identical results.
            assert!(
                to64(o)
                    .iter()
                    .zip(to64(&out[0][run].1))
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{w_}: ranks disagree"
            );
            for row in 0..rows {
                let hr = &h[row * hidden..(row + 1) * hidden];
                let ms = hr.iter().map(|v| v * v).sum::<f64>() / hidden as f64;
                let rstd = 1.0 / (ms + eps as f64).sqrt();
                for c in 0..hidden {
                    let i = row * hidden + c;
                    let (gh, want_h) = (resid[i].to_f64(), hr[c]);
                    // f32 sum of ranks+1 terms, then one rounding to T.
                    let tol_h = mag[i] * (ranks + 1) as f64 * eps32 + want_h.abs() * T::ULP;
                    assert!(
                        (gh - want_h).abs() <= tol_h,
                        "{w_}: h[{i}] got {gh} want {want_h} (tol {tol_h:.3e})"
                    );
                    let wc = w[c].to_f64();
                    let want = want_h * rstd * wc;
                    // The error of h carried through, f32 statistics over `hidden`
                    // terms (relative), one rounding of the output to T.
                    let tol = 1e-30
                        + 2.0 * rstd * wc.abs() * tol_h
                        + want.abs() * (hidden as f64 * eps32 + T::ULP);
                    let got = o[i].to_f64();
                    assert!(
                        (got - want).abs() <= tol,
                        "{w_}: out[{i}] got {got} want {want} (tol {tol:.3e})"
                    );
                }
            }
        }
    }
}

#[test]
fn allreduce_rmsnorm_f32_two_ranks() {
    // hidden > the 256-column block: two steps, the second masked.
    rmsnorm_case::<f32>(2, 37, 300, 30);
}

#[test]
fn allreduce_rmsnorm_f32_four_ranks() {
    rmsnorm_case::<f32>(4, 19, 100, 31);
}

#[test]
fn allreduce_rmsnorm_f16_four_ranks() {
    rmsnorm_case::<f16>(4, 13, 260, 32);
}

#[test]
fn allreduce_rmsnorm_bf16_two_ranks() {
    rmsnorm_case::<bf16>(2, 8, 64, 33);
}

#[test]
fn allreduce_rmsnorm_f32_eight_ranks() {
    rmsnorm_case::<f32>(8, 10, 50, 34);
}

// ---------------------------------------------------------------------------------
// IR snapshots (after verification and optimization), as the plans launch them.

fn ir<K: Kernel<Comptime = ()>>() -> String {
    tessera::ir::printer::print_function(&tessera::kernel_ir::<K>(&()).expect("kernel builds"))
}

#[test]
fn fused_kernels_ir() {
    use tessera::fused::{BK, BM, BN, NORM_BLOCK};
    let kernels = [
        (
            "ag_gemm_f16",
            ir::<tessera::fused::ag_gemm_kernel<f16, BM, BN, BK>>(),
        ),
        (
            "gemm_rs_f32",
            ir::<tessera::fused::gemm_rs_kernel<f32, BM, BN, BK>>(),
        ),
        (
            "allreduce_rmsnorm_f32",
            ir::<tessera::fused::allreduce_rmsnorm_kernel<f32, NORM_BLOCK>>(),
        ),
    ];
    for (name, text) in kernels {
        // The printed IR parses back to the same text.
        let parsed = tessera::ir::parser::parse_function(&text).expect("parses");
        tessera::ir::verify::verify(&parsed).expect("verifies");
        assert_eq!(
            tessera::ir::printer::print_function(&parsed),
            text,
            "{name}"
        );
        insta::assert_snapshot!(name, text);
    }
}

// ---------------------------------------------------------------------------------
// Errors name the user's call

const SOURCE: &str = include_str!("fused.rs");

/// [`tessera_tests::assert_names_call_site`] for this file.
fn assert_names_call_site(msg: &str, mark: &str, call: &str, inner: &[&str]) {
    tessera_tests::assert_names_call_site((SOURCE, file!()), msg, mark, call, inner);
}

/// A fused plan run whose peer never comes (rank 1 builds the plan but never runs
/// it): rank 0's wait in the plan's kernel times out, and the error names the
/// user's `run` first (this file's line), then the wait that timed out in the
/// library's kernel.
#[test]
fn a_fused_plan_that_times_out_names_the_callers_line() {
    let errs = std::sync::Mutex::new(Vec::new());
    let start = std::time::Instant::now();
    let _ = world(2).wait_timeout(Duration::from_millis(500)).run(|r| {
        let mut plan = AgGemm::<f32>::new(r, 8, 8, 8)?;
        if r.rank() == 0 {
            let a = r.device().upload(&[1.0f32; 64])?;
            let b = r.device().upload(&[1.0f32; 64])?;
            let mut c = r.device().alloc::<f32>(128)?;
            let e = plan.run(r, &a, &b, &mut c); // MARK: lonely AgGemm::run
            errs.lock().unwrap().push(e);
        }
        Ok(())
    });
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let errs = errs.into_inner().unwrap();
    assert_eq!(errs.len(), 1);
    let e = errs
        .into_iter()
        .next()
        .unwrap()
        .expect_err("rank 0's lonely AgGemm::run succeeded");
    assert_names_call_site(
        &e.to_string(),
        "MARK: lonely AgGemm::run",
        "AgGemm::run",
        &[
            "runtime/src/fused/",
            "timed out after 0.500 s",
            "`ag_gemm_kernel",
            "on rank 0",
        ],
    );
    assert!(matches!(e, Error::Collective { .. }), "{e:?}");
    assert!(!matches!(e.inner(), Error::Collective { .. }), "{e:?}");
}

/// Invalid calls of the fused plans (and of an unfused sequence): every rank's error
/// names its own call's line first, then the call and the library's reason; the
/// library's error is reached with `Error::inner`.
#[test]
fn invalid_fused_calls_name_the_callers_line_on_every_rank() {
    let out = world(2)
        .run(|r| {
            let a = r.device().upload(&[1.0f32; 63])?;
            let b = r.device().upload(&[1.0f32; 64])?;
            let mut c = r.device().alloc::<f32>(128)?;
            let mut plan = AgGemm::<f32>::new(r, 8, 8, 8)?;
            let mut plain = AgThenGemm::<f32>::new(r, 8, 8, 8)?;
            let errs = [
                plan.run(r, &a, &b, &mut c).err(), // MARK: plan call 1
                AgGemm::<f32>::new(r, 8, 8, 8)?.with_programs(r, 2000).err(), // MARK: plan call 2
                GemmReduceScatter::<f32>::new(r, 3, 8, 8).err(), // MARK: plan call 3
                AllReduceRmsNorm::<f32>::new(r, 0, 8, 1e-5).err(), // MARK: plan call 4
                plain.run(r, &a, &b, &mut c).err(), // MARK: plan call 5
            ];
            Ok(errs)
        })
        .unwrap();
    for (rank, errs) in out.into_iter().enumerate() {
        let cases = [
            (
                "AgGemm::run",
                "the A shard holds 63 elements, the plan needs 64",
            ),
            ("AgGemm::with_programs", "1 to 1024 program instances"),
            ("GemmReduceScatter::new", "m a multiple of the 2 ranks"),
            ("AllReduceRmsNorm::new", "needs a nonempty shape"),
            (
                "AgThenGemm::run",
                "the A shard holds 63 elements, the plan needs 64",
            ),
        ];
        for (i, ((call, inner), e)) in cases.into_iter().zip(errs).enumerate() {
            let e = e.unwrap_or_else(|| panic!("rank {rank}: {call} succeeded"));
            let mark = format!("MARK: plan call {}", i + 1);
            assert_names_call_site(&e.to_string(), &mark, call, &[inner]);
            let buffer_size = matches!(e.inner(), Error::BufferSize(_));
            assert_eq!(buffer_size, call.ends_with("::run"), "rank {rank}: {e:?}");
        }
    }
}

//! The kernels the `aot` example compiles (`examples/aot.rs`): every example's, as
//! the examples (and `examples/gpu_check.rs`) instantiate them. A module of its own so
//! that the offline tests (`tests/tests/codegen_offline.rs`) check the same list.
//!
//! The example kernels are included as modules; each also has its own `main`.

#[path = "argmax.rs"]
#[allow(dead_code)]
mod argmax;
#[path = "checked_gather.rs"]
#[allow(dead_code)]
mod checked_gather;
#[path = "dropout.rs"]
#[allow(dead_code)]
mod dropout;
#[path = "gpu_cases.rs"]
#[allow(dead_code)]
mod gpu_cases;
#[path = "layernorm.rs"]
#[allow(dead_code)]
mod layernorm;
#[path = "layernorm_backward.rs"]
#[allow(dead_code)]
mod layernorm_backward;
#[path = "litmus.rs"]
#[allow(dead_code)]
mod litmus;
#[path = "matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "matmul_desc.rs"]
#[allow(dead_code)]
mod matmul_desc;
#[path = "matmul_fp8.rs"]
#[allow(dead_code)]
mod matmul_fp8;
#[path = "matmul_i8.rs"]
#[allow(dead_code)]
mod matmul_i8;
#[path = "matmul_mx.rs"]
#[allow(dead_code)]
mod matmul_mx;
#[path = "ping_pong.rs"]
#[allow(dead_code)]
mod ping_pong;
#[path = "softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "topk.rs"]
#[allow(dead_code)]
mod topk;
#[path = "vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use std::path::PathBuf;

use tessera::ArtifactStore;
use tessera::aot::{
    Artifact, CompileOptions, Specialization, Target, compile_kernel_specialized,
    precompile_launches,
};
use tessera::prelude::*;

/// One example kernel: its file name, its number of warps (`None`: `--num-warps`),
/// how to compile it, how to precompile it into an artifact store, its tile IR (for
/// the Tile IR backend, `--tileir`), and the LLVM targets it is compiled for (most:
/// every one).
pub type Job = (
    &'static str,
    Option<u32>,
    fn(&Specialization, Target, &CompileOptions) -> Result<Artifact, Error>,
    fn(Target, &CompileOptions, &ArtifactStore) -> Result<Vec<PathBuf>, Error>,
    fn() -> Result<std::sync::Arc<tessera::ir::Function>, Error>,
    fn(Target) -> bool,
);

macro_rules! job {
    // Compiled for the targets `$only` accepts.
    ($name:literal, warps = $w:literal, only = $only:expr, $k:ty) => {{
        let job: Job = job!(@ $name, Some($w), $k);
        (job.0, job.1, job.2, job.3, job.4, $only)
    }};
    ($name:literal, warps = $w:literal, $k:ty) => {
        job!(@ $name, Some($w), $k)
    };
    ($name:literal, $k:ty) => {
        job!(@ $name, None, $k)
    };
    // A kernel with tensor descriptors: its files are the launch whose tensor maps
    // were built (TMA on sm_90a), the all-divisible one with maps.
    ($name:literal, warps = $w:literal, maps, $k:ty) => {
        job!($name, warps = $w, maps, with = |_, o| o, $k)
    };
    // The same with the options `$with` (a `fn(Target, CompileOptions) ->
    // CompileOptions`) makes for a target, stored under their own key: the GPU check
    // times the variants.
    ($name:literal, warps = $w:literal, maps, with = $with:expr, $k:ty) => {
        (
            $name,
            Some($w),
            |sp, t, o| {
                let sp = match sp {
                    Specialization::AllDivisible => {
                        let n = tessera::kernel_ir::<$k>(&())?.params.len();
                        Specialization::TensorMaps(vec![true; n])
                    }
                    other => other.clone(),
                };
                let with: fn(Target, CompileOptions) -> CompileOptions = $with;
                compile_kernel_specialized::<$k>(&(), &sp, t, &with(t, o.clone()))
            },
            |t, o, s| {
                let with: fn(Target, CompileOptions) -> CompileOptions = $with;
                precompile_launches::<$k>(&(), t, &with(t, o.clone()), s)
            },
            || tessera::kernel_ir::<$k>(&()),
            |_| true,
        )
    };
    (@ $name:literal, $warps:expr, $k:ty) => {
        (
            $name,
            $warps,
            |sp, t, o| compile_kernel_specialized::<$k>(&(), sp, t, o),
            // Every specialization a launch can look up.
            |t, o, s| precompile_launches::<$k>(&(), t, o, s),
            || tessera::kernel_ir::<$k>(&()),
            |_| true,
        )
    };
}

/// The kernels of every example, as the examples (and `examples/gpu_check.rs`)
/// instantiate them.
pub const JOBS: [Job; 54] = [
    job!("vector_add", vector_add::vector_add<1024>),
    job!("softmax_f32", softmax::softmax<f32, 4, 1024>),
    job!("softmax_f16", softmax::softmax<f16, 4, 1024>),
    job!("matmul_f32", matmul::matmul<f32, 64, 64, 32>),
    job!("matmul_f16", matmul::matmul<f16, 64, 64, 32>),
    // The tile sizes of the Triton comparison (benches/vs_triton).
    job!("matmul_f16_128x128x32", matmul::matmul<f16, 128, 128, 32>),
    job!("matmul_f16_128x128x64", warps = 8, matmul::matmul<f16, 128, 128, 64>),
    // The largest tile of the AMD loop table, on CDNA3/CDNA4 (whose 64-lane waves
    // hold its accumulator: 128 registers a lane on 8 warps).
    job!(
        "matmul_f16_256x256x64",
        warps = 8,
        only = |t| matches!(
            t,
            Target::Amdgpu(tessera::aot::AmdArch::Gfx942 | tessera::aot::AmdArch::Gfx950)
        ),
        matmul::matmul<f16, 256, 256, 64>
    ),
    // ... and at the Triton baseline's own tile (scripts/gpu_bench.py: 128x256x64).
    job!("matmul_f16_128x256x64", warps = 8, matmul::matmul<f16, 128, 256, 64>),
    job!("layernorm", layernorm::layernorm<f32, 256>),
    // The GPU check's wider layernorm tile (its benchmark compares both).
    job!("layernorm_2048", layernorm::layernorm<f32, 2048>),
    job!("dropout", dropout::seeded_dropout<1024>),
    job!("argmax", argmax::row_argmax<1024>),
    job!("topk", topk::route<16, 64, 4>),
    job!("checked_gather", checked_gather::checked_gather<256>),
    job!("layernorm_bwd_dx", layernorm_backward::layernorm_bwd_dx<1024, 32>),
    job!("layernorm_bwd_dwdb", layernorm_backward::layernorm_bwd_dwdb<32, 128>),
    // FlashAttention-2 forward, 128 query rows x 64 keys per step, head dim 64
    // (examples/attention.rs launches 64x64 tiles).
    job!("attention_fwd_128x64", tessera::attention::attention_fwd<f16, 128, 64, 64>),
    // The 8-bit GEMMs (examples/matmul_i8.rs, examples/matmul_fp8.rs), and at the
    // tile of the Triton comparison (128 bytes of k per step).
    job!("matmul_i8", matmul_i8::matmul_i8<64, 64, 64>),
    job!("matmul_i8_bt", matmul_i8::matmul_i8_bt<64, 64, 64>),
    job!("quantize_e4m3", matmul_fp8::quantize<F8E4M3, 1024>),
    job!("matmul_fp8_e4m3", matmul_fp8::matmul_fp8_bt<F8E4M3, 64, 64, 64>),
    job!("matmul_i8_bt_128x128x128", warps = 8, matmul_i8::matmul_i8_bt<128, 128, 128>),
    job!("matmul_fp8_bt_128x128x128", warps = 8, matmul_fp8::matmul_fp8_bt<F8E4M3, 128, 128, 128>),
    // The block-scaled GEMM (examples/matmul_mx.rs), MXFP8, and at the Triton
    // comparison's tile on gfx950 only (its block-scaled MFMA; elsewhere the op is
    // decoded to f32, whose 128x128x128 tiles do not fit).
    job!("matmul_mx_e4m3", matmul_mx::matmul_mx<F8E4M3, 32, 32, 64, 64, 32, 2>),
    job!(
        "matmul_mx_e4m3_128x128x128",
        warps = 8,
        only = |t| t == Target::Amdgpu(tessera::aot::AmdArch::Gfx950),
        matmul_mx::matmul_mx<F8E4M3, 128, 128, 128, 128, 128, 4>
    ),
    // Device-side communication (examples/ping_pong.rs): the GPU check's ranks.
    job!("ring_pass", ping_pong::ring_pass<1024>),
    // The memory-model litmus tests (examples/litmus.rs), strong and weakened, which
    // the GPU check runs between ranks on parts of one GPU.
    job!("litmus_mp_strong", litmus::mp_strong<32>),
    job!("litmus_mp_weak", litmus::mp_weak<32>),
    job!("litmus_sb_strong", litmus::sb_strong),
    job!("litmus_sb_weak", litmus::sb_weak),
    job!("litmus_ll_strong", litmus::ll_strong),
    job!("litmus_ll_weak", litmus::ll_weak),
    // The fused all-gather + GEMM's kernel (tessera::fused::AgGemm, f16), which the
    // GPU check runs between processes.
    job!(
        "ag_gemm_f16",
        tessera::fused::ag_gemm_kernel<
            f16,
            { tessera::fused::BM },
            { tessera::fused::BN },
            { tessera::fused::BK },
        >
    ),
    // The other fused plans (f16) and the unfused sequences all three replace, which
    // the GPU check times against each other on ranks on parts of one GPU.
    job!(
        "gemm_rs_f16",
        tessera::fused::gemm_rs_kernel<
            f16,
            { tessera::fused::BM },
            { tessera::fused::BN },
            { tessera::fused::BK },
        >
    ),
    job!(
        "allreduce_rmsnorm_f16",
        tessera::fused::allreduce_rmsnorm_kernel<f16, { tessera::fused::NORM_BLOCK }>
    ),
    job!(
        "unfused_gather_rows_f16",
        tessera::fused::unfused::gather_rows_kernel<f16, { tessera::fused::BM }, { tessera::fused::BK }>
    ),
    job!(
        "unfused_gemm_f16",
        tessera::fused::unfused::gemm_kernel<
            f16,
            { tessera::fused::BM },
            { tessera::fused::BN },
            { tessera::fused::BK },
        >
    ),
    job!(
        "unfused_reduce_scatter_f16",
        tessera::fused::unfused::reduce_scatter_rows_kernel<f16, { tessera::fused::unfused::EB }>
    ),
    job!(
        "unfused_all_reduce_f16",
        tessera::fused::unfused::all_reduce_kernel<f16, { tessera::fused::unfused::EB }>
    ),
    job!(
        "unfused_residual_rmsnorm_f16",
        tessera::fused::unfused::residual_rmsnorm_kernel<f16, { tessera::fused::NORM_BLOCK }>
    ),
    // The GPU check's own cases (examples/gpu_cases.rs).
    job!("bf16_axpb", gpu_cases::bf16_axpb<1024>),
    job!("f64_poly", gpu_cases::f64_poly<256>),
    job!("histogram_system", gpu_cases::histogram_system<1024>),
    job!("row_cumsum_f32", gpu_cases::row_cumsum<f32, 1024>),
    job!("row_cumsum_i32", gpu_cases::row_cumsum<i32, 1024>),
    // Through tensor descriptors (examples/matmul_desc.rs): TMA + mbarriers on sm_90a.
    job!("matmul_desc_128x128x64", warps = 8, maps, matmul_desc::matmul_desc<128, 128, 64>),
    job!(
        "matmul_desc_128x128x64_no_ws",
        warps = 8,
        maps,
        with = |_, o| CompileOptions {
            warp_specialize: Some(false),
            ..o
        },
        matmul_desc::matmul_desc<128, 128, 64>
    ),
    // 64-row tiles, 4 consumer warps (Triton 3.9's warp-specialized form on sm_90a).
    job!("matmul_desc_ws_64x128x64", warps = 4, maps, matmul_desc::matmul_desc<64, 128, 64>),
    // Persistent: the loop over tiles warp-specialized as a whole.
    job!(
        "matmul_desc_persistent_128x128x64",
        warps = 8,
        maps,
        matmul_desc::matmul_desc_persistent<128, 128, 64>
    ),
    // Persistent with two consumer warpgroups in ping-pong (4 warps a tile, 2 stages)
    // where there is `wgmma`; elsewhere (no ping-pong, and 4 warps would spill the
    // 128x128 accumulator) the 8-warp persistent kernel.
    job!(
        "matmul_desc_pingpong_128x128x64",
        warps = 4,
        maps,
        with = |t, o| if t.has_wgmma() {
            CompileOptions {
                num_stages: Some(2),
                consumer_groups: Some(2),
                ..o
            }
        } else {
            CompileOptions { num_warps: 8, ..o }
        },
        matmul_desc::matmul_desc_persistent<128, 128, 64>
    ),
    // Split-K for shapes with few tiles: the parts (persistent), then their sum.
    job!(
        "matmul_desc_split_k_128x128x64",
        warps = 8,
        maps,
        matmul_desc::matmul_desc_split_k<128, 128, 64>
    ),
    job!("split_k_sum_1024", matmul_desc::split_k_sum<1024>),
    // In clusters of 2 along M: B multicast to both blocks.
    job!(
        "matmul_desc_128x128x64_cluster2x1",
        warps = 8,
        maps,
        with = |_, o| CompileOptions {
            cluster: [2, 1, 1],
            ..o
        },
        matmul_desc::matmul_desc<128, 128, 64>
    ),
];

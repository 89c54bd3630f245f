//! Kernel compilation: the `.cu` sources are compiled by NVRTC at first use for the
//! device's architecture and the PTX is cached on disk, keyed by source hash, architecture
//! and driver version, under `$FERRITE_HOME/cuda-cache` (default `~/.cache/ferrite/cuda-cache`).

use std::path::PathBuf;
use std::time::Instant;

use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

use crate::CudaError;

/// Every kernel source, concatenated in this order into one NVRTC program.
const SOURCES: [&str; 11] = [
    include_str!("../kernels/common.cuh"),
    include_str!("../kernels/matvec.cu"),
    include_str!("../kernels/matvec_i8.cu"),
    include_str!("../kernels/mmq.cu"),
    include_str!("../kernels/ops.cu"),
    include_str!("../kernels/attention.cu"),
    include_str!("../kernels/attn_decode.cu"),
    include_str!("../kernels/moe.cu"),
    include_str!("../kernels/topk.cu"),
    include_str!("../kernels/batch.cu"),
    include_str!("../kernels/recurrent.cu"),
];

/// The full program text.
pub(crate) fn program() -> String {
    SOURCES.join("\n")
}

/// 64-bit FNV-1a: a stable hash (std's hasher may change between releases).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How the kernels were obtained at load.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileReport {
    /// Milliseconds spent compiling (or reading the cached PTX).
    pub millis: f64,
    /// The PTX came from the disk cache.
    pub cache_hit: bool,
    /// The cache file (`None` when no cache directory could be determined).
    pub cache_file: Option<PathBuf>,
}

/// The cache directory: `cuda-cache` in ferrite's home (`ferrite_files::home`).
pub(crate) fn cache_dir() -> Option<PathBuf> {
    ferrite_files::home().map(|h| h.join("cuda-cache"))
}

/// The cache file name for `src` compiled for `sm_<arch>` under driver `driver`.
pub(crate) fn cache_name(src: &str, arch: u32, driver: i32) -> String {
    format!(
        "kernels-{:016x}-sm{arch}-drv{driver}.ptx",
        fnv1a(src.as_bytes())
    )
}

/// PTX of the kernel program for `sm_<arch>`, from the cache or freshly compiled.
pub(crate) fn kernels_ptx(arch: u32, driver: i32) -> Result<(Ptx, CompileReport), CudaError> {
    let src = program();
    let start = Instant::now();
    let file = cache_dir().map(|d| d.join(cache_name(&src, arch, driver)));
    if let Some(f) = &file
        && let Ok(text) = std::fs::read_to_string(f)
        && !text.is_empty()
    {
        let report = CompileReport {
            millis: start.elapsed().as_secs_f64() * 1e3,
            cache_hit: true,
            cache_file: file.clone(),
        };
        return Ok((Ptx::from_src(text), report));
    }
    // SAFETY: only probes whether the NVRTC shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Compile(
            "the NVRTC library is not installed".into(),
        ));
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=sm_{arch}"), "-std=c++17".into()],
        name: Some("ferrite_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(&src, opts).map_err(|e| CudaError::Compile(e.to_string()))?;
    if let Some(f) = &file {
        write_atomically(f, &ptx.to_src())?;
    }
    let report = CompileReport {
        millis: start.elapsed().as_secs_f64() * 1e3,
        cache_hit: false,
        cache_file: file,
    };
    Ok((ptx, report))
}

/// Writes the cache file atomically, so a concurrent reader never sees a torn file.
fn write_atomically(path: &std::path::Path, text: &str) -> Result<(), CudaError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| CudaError::Cache {
            path: dir.to_owned(),
            source,
        })?;
    }
    ferrite_files::write_atomic(path, |w| {
        w.write_all(text.as_bytes())
            .map_err(|e| ferrite_files::FileError::new(path, e).into())
    })
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_changes_with_source_arch_and_driver() {
        let a = cache_name("x", 90, 13000);
        assert_ne!(a, cache_name("y", 90, 13000));
        assert_ne!(a, cache_name("x", 89, 13000));
        assert_ne!(a, cache_name("x", 90, 13010));
        assert_eq!(a, cache_name("x", 90, 13000));
    }

    #[test]
    fn program_contains_every_kernel_family() {
        let p = program();
        for k in [
            "FERRITE_MATVEC(q4_k",
            "FERRITE_MATVEC(q8_0",
            "FERRITE_MATVEC_CORE(i8_q4_k",
            "FERRITE_MMQ(mmq_i8x2_q6_k",
            "quantize_q8_f32",
            "rms_norm_f32",
            "rope_f32",
            "attn_f16",
            "FERRITE_ATTN_DECODE(128",
            "FERRITE_MOE(q4_k",
            "moe_route",
            "qkv_bias_f32",
            "rope_store_scaled_f16",
            "delta_rule_f32",
            "ssm_scan_f32",
        ] {
            assert!(p.contains(k), "{k}");
        }
    }
}

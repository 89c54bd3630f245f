//! [`CudaBackend`]: probing for a device, the context and stream, the compiled kernels and
//! their launch counters (the path markers tests assert on).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchArgs, LaunchConfig};
use ferrite_gguf::GgmlType;

use crate::CudaError;
use crate::compile::{CompileReport, kernels_ptx};
use crate::gemm::{DEFAULT_PREFILL, PREFILL_ENV, PrefillProducts};

/// What was found on the machine.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// Device name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Driver version as the driver reports it (13000 = 13.0).
    pub driver_version: i32,
    /// Device memory in bytes.
    pub total_mem: usize,
}

/// Every kernel of the program, by name.
const KERNELS: &[&str] = &[
    "matvec_q4_1",
    "matvec3_q4_1",
    "matvec_gated_q4_1",
    "embed_q4_1",
    "dequant_f16_q4_1",
    "matvec_rows_q4_1",
    "moe_gated_q4_1",
    "moe_down_q4_1",
    "matvec_q8_0",
    "matvec3_q8_0",
    "matvec_gated_q8_0",
    "embed_q8_0",
    "dequant_f16_q8_0",
    "matvec_rows_q8_0",
    "moe_gated_q8_0",
    "moe_down_q8_0",
    "matvec_q4_0",
    "matvec3_q4_0",
    "matvec_gated_q4_0",
    "embed_q4_0",
    "dequant_f16_q4_0",
    "matvec_rows_q4_0",
    "moe_gated_q4_0",
    "moe_down_q4_0",
    "matvec_q5_0",
    "matvec3_q5_0",
    "matvec_gated_q5_0",
    "embed_q5_0",
    "dequant_f16_q5_0",
    "matvec_rows_q5_0",
    "moe_gated_q5_0",
    "moe_down_q5_0",
    "matvec_q4_k",
    "matvec3_q4_k",
    "matvec_gated_q4_k",
    "embed_q4_k",
    "dequant_f16_q4_k",
    "matvec_rows_q4_k",
    "moe_gated_q4_k",
    "moe_down_q4_k",
    "matvec_q6_k",
    "matvec3_q6_k",
    "matvec_gated_q6_k",
    "embed_q6_k",
    "dequant_f16_q6_k",
    "matvec_rows_q6_k",
    "moe_gated_q6_k",
    "moe_down_q6_k",
    "matvec_f32",
    "matvec3_f32",
    "matvec_gated_f32",
    "embed_f32",
    "dequant_f16_f32",
    "matvec_rows_f32",
    "moe_gated_f32",
    "moe_down_f32",
    "matvec_f16",
    "matvec3_f16",
    "matvec_gated_f16",
    "embed_f16",
    "dequant_f16_f16",
    "matvec_rows_f16",
    "moe_gated_f16",
    "moe_down_f16",
    "matvec_bf16",
    "matvec3_bf16",
    "matvec_gated_bf16",
    "embed_bf16",
    "dequant_f16_bf16",
    "matvec_rows_bf16",
    "moe_gated_bf16",
    "moe_down_bf16",
    "rms_norm_f32",
    "rope_f32",
    "gate_silu_f32",
    "gate_gelu_f32",
    "gate_swiglu_oai_f32",
    "add_f32",
    "kv_store_f16",
    "attn_f16",
    "attn_combine",
    "attn_decode_f16_64",
    "attn_decode_f16_128",
    "attn_decode_f16_256",
    "f32_to_f16",
    "residual_norm_f32",
    "rope_store_f16",
    "rope_store_scaled_f16",
    "qkv_bias_f32",
    "add_bias_f32",
    "moe_route",
    "moe_gather_f16",
    "moe_gather_f32",
    "moe_combine",
    "quantize_q8_f32",
    "argmax_f32",
    "topk_f32",
    "matvec_i8_q4_1",
    "matvec3_i8_q4_1",
    "matvec_gated_i8_q4_1",
    "matvec_i8_q8_0",
    "matvec3_i8_q8_0",
    "matvec_gated_i8_q8_0",
    "matvec_i8_q4_k",
    "matvec3_i8_q4_k",
    "matvec_gated_i8_q4_k",
    "matvec_i8_q6_k",
    "matvec3_i8_q6_k",
    "matvec_gated_i8_q6_k",
    "matvec_i8x2_q4_1",
    "matvec3_i8x2_q4_1",
    "matvec_gated_i8x2_q4_1",
    "matvec_i8x2_q8_0",
    "matvec3_i8x2_q8_0",
    "matvec_gated_i8x2_q8_0",
    "matvec_i8x2_q4_k",
    "matvec3_i8x2_q4_k",
    "matvec_gated_i8x2_q4_k",
    "matvec_i8x2_q6_k",
    "matvec3_i8x2_q6_k",
    "matvec_gated_i8x2_q6_k",
    "mmq_i8_q4_1",
    "mmq_i8_q8_0",
    "mmq_i8_q4_k",
    "mmq_i8_q6_k",
    "mmq_i8x2_q4_1",
    "mmq_i8x2_q8_0",
    "mmq_i8x2_q4_k",
    "mmq_i8x2_q6_k",
    "mmq_reduce",
];

/// Suffix of the matvec/embed kernels for a weight type; `None` when unsupported.
pub fn kernel_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q6_K => "q6_k",
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::BF16 => "bf16",
        _ => return None,
    })
}

/// The kernels of one weight type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WeightKernels {
    /// `y = W·x`.
    pub(crate) matvec: &'static str,
    /// Up to three matrices over one `x`.
    pub(crate) matvec3: &'static str,
    /// `y = act(Wg·x) · (Wu·x)`.
    pub(crate) gated: &'static str,
    /// Dequantized rows, one per token.
    pub(crate) embed: &'static str,
    /// The whole matrix as f16.
    pub(crate) dequant_f16: &'static str,
    /// One product per token row (the MoE router).
    pub(crate) rows: &'static str,
    /// Gated input of the selected experts.
    pub(crate) moe_gated: &'static str,
    /// Weighted down products of the selected experts.
    pub(crate) moe_down: &'static str,
}

macro_rules! weight_kernels {
    ($s:literal) => {
        WeightKernels {
            matvec: concat!("matvec_", $s),
            matvec3: concat!("matvec3_", $s),
            gated: concat!("matvec_gated_", $s),
            embed: concat!("embed_", $s),
            dequant_f16: concat!("dequant_f16_", $s),
            rows: concat!("matvec_rows_", $s),
            moe_gated: concat!("moe_gated_", $s),
            moe_down: concat!("moe_down_", $s),
        }
    };
}

/// The kernels of a weight type; `None` when unsupported.
pub(crate) fn weight_kernels(ty: GgmlType) -> Option<WeightKernels> {
    Some(match ty {
        GgmlType::Q4_1 => weight_kernels!("q4_1"),
        GgmlType::Q8_0 => weight_kernels!("q8_0"),
        GgmlType::Q4_0 => weight_kernels!("q4_0"),
        GgmlType::Q5_0 => weight_kernels!("q5_0"),
        GgmlType::Q4_K => weight_kernels!("q4_k"),
        GgmlType::Q6_K => weight_kernels!("q6_k"),
        GgmlType::F32 => weight_kernels!("f32"),
        GgmlType::F16 => weight_kernels!("f16"),
        GgmlType::BF16 => weight_kernels!("bf16"),
        _ => return None,
    })
}

/// The decode products of a weight type over int8 activations (matvec_i8.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct I8Kernels {
    /// `y = W·x`.
    pub(crate) matvec: &'static str,
    /// Up to three matrices over one `x`.
    pub(crate) matvec3: &'static str,
    /// `y = act(Wg·x) · (Wu·x)`.
    pub(crate) gated: &'static str,
}

macro_rules! i8_kernels {
    ($p:literal, $s:literal) => {
        I8Kernels {
            matvec: concat!("matvec_", $p, "_", $s),
            matvec3: concat!("matvec3_", $p, "_", $s),
            gated: concat!("matvec_gated_", $p, "_", $s),
        }
    };
}

/// The kernels of a weight type over int8 activations in `planes` (1 or 2) planes; `None`
/// for types that take f32 activations only.
pub(crate) fn i8_kernels(ty: GgmlType, planes: usize) -> Option<I8Kernels> {
    use GgmlType as T;
    Some(match (ty, planes) {
        (T::Q4_1, 1) => i8_kernels!("i8", "q4_1"),
        (T::Q8_0, 1) => i8_kernels!("i8", "q8_0"),
        (T::Q4_K, 1) => i8_kernels!("i8", "q4_k"),
        (T::Q6_K, 1) => i8_kernels!("i8", "q6_k"),
        (T::Q4_1, 2) => i8_kernels!("i8x2", "q4_1"),
        (T::Q8_0, 2) => i8_kernels!("i8x2", "q8_0"),
        (T::Q4_K, 2) => i8_kernels!("i8x2", "q4_k"),
        (T::Q6_K, 2) => i8_kernels!("i8x2", "q6_k"),
        _ => return None,
    })
}

/// What the decode products (Q4_1, Q8_0, Q4_K, Q6_K weights) read as their input vector;
/// prefill GEMMs (f16) and the other weight types (f32) are not affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Activations {
    /// The f32 values.
    F32,
    /// One int8 plane per block of 32 with an f32 scale: 4× fewer bytes than f32 and
    /// integer dot products, but about 0.5 % relative noise per product.
    Int8,
    /// Two int8 planes (the second holds the first one's rounding error at 1/256 of its
    /// scale): about 15 bits per block, closer to the f32 values than f16 is.
    Int8x2,
}

impl Activations {
    /// The name `FERRITE_CUDA_ACT` takes: `f32`, `int8`, `int8x2`.
    pub fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Int8 => "int8",
            Activations::Int8x2 => "int8x2",
        }
    }

    /// The setting of that name.
    pub fn from_name(name: &str) -> Option<Activations> {
        [Activations::F32, Activations::Int8, Activations::Int8x2]
            .into_iter()
            .find(|a| a.name() == name)
    }

    /// Int8 planes per value (0 for f32).
    pub(crate) fn planes(self) -> usize {
        match self {
            Activations::F32 => 0,
            Activations::Int8 => 1,
            Activations::Int8x2 => 2,
        }
    }

    fn code(self) -> u8 {
        self.planes() as u8
    }

    fn from_code(c: u8) -> Activations {
        match c {
            1 => Activations::Int8,
            2 => Activations::Int8x2,
            _ => Activations::F32,
        }
    }
}

/// The setting a backend starts with when `FERRITE_CUDA_ACT` is unset (or not a name).
pub const DEFAULT_ACTIVATIONS: Activations = Activations::Int8x2;

/// Values per quant unit a row length must be a multiple of.
pub(crate) fn row_multiple(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => 256,
        _ => 32,
    }
}

/// One CUDA device with the ferrite kernels loaded.
#[derive(Debug)]
pub struct CudaBackend {
    pub(crate) stream: Arc<CudaStream>,
    info: DeviceInfo,
    compile: CompileReport,
    funcs: BTreeMap<&'static str, (CudaFunction, AtomicU64)>,
    graph_steps: AtomicU64,
    /// cuBLAS on `stream` for batched prefill, or why it is unavailable (prefill then runs
    /// as a loop of decode steps).
    pub(crate) blas: Result<CudaBlas, String>,
    gemms: AtomicU64,
    /// The [`Activations`] code of the decode products.
    act: AtomicU8,
    /// The [`PrefillProducts`] code of batched prefill.
    prefill: AtomicU8,
}

/// The environment variable read by [`CudaBackend::new`] to choose the decode products'
/// [`Activations`] by name.
pub const ACT_ENV: &str = "FERRITE_CUDA_ACT";

/// The setting named by the environment variable `var`; `default` when it is unset or not
/// a name of one.
fn env_setting<T>(var: &str, from_name: fn(&str) -> Option<T>, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|n| from_name(&n))
        .unwrap_or(default)
}

fn no_device(e: impl std::fmt::Display) -> CudaError {
    CudaError::NoDevice(e.to_string())
}

/// Opens device 0; the driver library is probed first because cudarc panics without it.
fn open_context() -> Result<Arc<CudaContext>, CudaError> {
    // SAFETY: only tries to open the driver shared library; no CUDA call is made.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDevice(
            "the CUDA driver library (libcuda) is not installed".into(),
        ));
    }
    let n = CudaContext::device_count().map_err(no_device)?;
    if n < 1 {
        return Err(CudaError::NoDevice("the driver reports 0 devices".into()));
    }
    CudaContext::new(0).map_err(no_device)
}

fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, CudaError> {
    let (major, minor) = ctx.compute_capability()?;
    let mut driver = 0i32;
    // SAFETY: the driver library is loaded and initialised (a context exists); the call
    // writes one i32 through a valid pointer.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }.result()?;
    Ok(DeviceInfo {
        name: ctx.name()?,
        compute_capability: (
            u32::try_from(major).unwrap_or(0),
            u32::try_from(minor).unwrap_or(0),
        ),
        driver_version: driver,
        total_mem: ctx.total_mem()?,
    })
}

/// cuBLAS on `stream`; cudarc panics when the library is absent, so it is probed first.
fn open_blas(stream: &Arc<CudaStream>) -> Result<CudaBlas, String> {
    // SAFETY: only tries to open the cuBLAS shared library; no cuBLAS call is made.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err("the cuBLAS library is not installed".into());
    }
    CudaBlas::new(stream.clone()).map_err(|e| format!("cuBLAS: {e}"))
}

impl CudaBackend {
    /// Looks for a CUDA device without compiling anything.
    pub fn probe() -> Result<DeviceInfo, CudaError> {
        device_info(&open_context()?)
    }

    /// Opens device 0 and loads the kernels (compiling them on a cache miss).
    pub fn new() -> Result<Arc<CudaBackend>, CudaError> {
        let ctx = open_context()?;
        let info = device_info(&ctx)?;
        let (maj, min) = info.compute_capability;
        let (ptx, compile) = kernels_ptx(maj * 10 + min, info.driver_version)?;
        let module = ctx.load_module(ptx)?;
        let mut funcs = BTreeMap::new();
        let extras = crate::model::BATCH_KERNELS
            .iter()
            .chain(crate::recurrent::RECURRENT_KERNELS);
        for &name in KERNELS.iter().chain(extras) {
            funcs.insert(name, (module.load_function(name)?, AtomicU64::new(0)));
        }
        // SAFETY: every buffer and launch of this backend goes through the one stream made
        // below, so cudarc's cross-stream event tracking is not needed; it is turned off
        // before any buffer exists. A non-default stream is needed for graph capture.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let blas = open_blas(&stream);
        Ok(Arc::new(CudaBackend {
            stream,
            info,
            compile,
            funcs,
            graph_steps: AtomicU64::new(0),
            blas,
            gemms: AtomicU64::new(0),
            act: AtomicU8::new(
                env_setting(ACT_ENV, Activations::from_name, DEFAULT_ACTIVATIONS).code(),
            ),
            prefill: AtomicU8::new(
                env_setting(PREFILL_ENV, PrefillProducts::from_name, DEFAULT_PREFILL).code(),
            ),
        }))
    }

    /// What the decode products read: [`DEFAULT_ACTIVATIONS`] unless `FERRITE_CUDA_ACT`
    /// named another setting at [`CudaBackend::new`] or
    /// [`CudaBackend::set_activations`] changed it.
    pub fn activations(&self) -> Activations {
        Activations::from_code(self.act.load(Ordering::Relaxed))
    }

    /// Chooses the activations of later decode steps; a session captured under another
    /// setting records its step again.
    pub fn set_activations(&self, a: Activations) {
        self.act.store(a.code(), Ordering::Relaxed);
    }

    /// How batched prefill multiplies: [`DEFAULT_PREFILL`] unless `FERRITE_CUDA_PREFILL`
    /// named another setting at [`CudaBackend::new`] or
    /// [`CudaBackend::set_prefill_products`] changed it.
    pub fn prefill_products(&self) -> PrefillProducts {
        PrefillProducts::from_code(self.prefill.load(Ordering::Relaxed))
    }

    /// Chooses the products of later prefill chunks (a model loaded under the other setting
    /// may lack the f16 copies cuBLAS reads; the matrices are then dequantized per chunk).
    pub fn set_prefill_products(&self, p: PrefillProducts) {
        self.prefill.store(p.code(), Ordering::Relaxed);
    }

    /// The device found.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// How the kernels were compiled or loaded, and how long it took.
    pub fn compile_report(&self) -> &CompileReport {
        &self.compile
    }

    /// Launches so far of every kernel, by name (the path markers). Kernels recorded into a
    /// CUDA graph count once, at capture; `"graph_step"` counts the graph replays and
    /// `"gemm_f16"` the cuBLAS products of batched prefill.
    pub fn launch_counts(&self) -> BTreeMap<&'static str, u64> {
        let mut m: BTreeMap<&'static str, u64> = self
            .funcs
            .iter()
            .map(|(k, (_, c))| (*k, c.load(Ordering::Relaxed)))
            .collect();
        m.insert("graph_step", self.graph_steps.load(Ordering::Relaxed));
        m.insert("gemm_f16", self.gemms.load(Ordering::Relaxed));
        m
    }

    /// Why batched prefill is unavailable (it then runs as decode steps); `None` when cuBLAS
    /// is loaded.
    pub fn prefill_unavailable(&self) -> Option<&str> {
        self.blas.as_ref().err().map(String::as_str)
    }

    /// Counts one cuBLAS GEMM.
    pub(crate) fn count_gemm(&self) {
        self.gemms.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one replay of a captured decode-step graph.
    pub(crate) fn count_graph_step(&self) {
        self.graph_steps.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize()?;
        Ok(())
    }

    /// A launch builder for kernel `name`, counting the launch.
    pub(crate) fn kernel(&self, name: &str) -> Result<LaunchArgs<'_>, CudaError> {
        let (f, count) = self
            .funcs
            .get(name)
            .ok_or_else(|| CudaError::InvalidArgument(format!("no kernel named {name}")))?;
        count.fetch_add(1, Ordering::Relaxed);
        Ok(self.stream.launch_builder(f))
    }
}

/// A 1-D launch of `n` threads in blocks of 256.
pub(crate) fn grid_1d(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_type_has_both_kernels() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
        ] {
            let s = kernel_suffix(ty).unwrap();
            let k = weight_kernels(ty).unwrap();
            assert_eq!(k.matvec, format!("matvec_{s}"));
            for name in [
                k.matvec,
                k.matvec3,
                k.gated,
                k.embed,
                k.dequant_f16,
                k.rows,
                k.moe_gated,
                k.moe_down,
            ] {
                assert!(KERNELS.contains(&name), "{name}");
            }
        }
        assert_eq!(kernel_suffix(GgmlType::Q2_K), None);
        assert_eq!(weight_kernels(GgmlType::Q2_K), None);
    }

    #[test]
    fn probe_without_a_driver_is_an_error_not_a_panic() {
        // On machines with a driver this finds it; on CI it must return NoDevice.
        match CudaBackend::probe() {
            Ok(info) => assert!(!info.name.is_empty()),
            Err(e) => assert!(e.to_string().starts_with("no CUDA device: "), "{e}"),
        }
    }
}

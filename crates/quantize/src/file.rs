//! File-level quantization: plan every tensor's type, convert the tensors row by row on
//! several threads, copy the metadata, and write the result atomically.
//!
//! Memory: the input stays memory-mapped; each thread holds one f32 row; converted tensors
//! are held until the file is written (so peak memory is about the output size), and
//! tensors whose type does not change are written straight from the mapping.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferrite_gguf::{GgmlType, Gguf, GgufWriter, Value};

use crate::rule::{ModelInfo, Reason, choose_types};
use crate::{Mix, QuantizeError};

/// `general.quantization_version` written to every output (ggml's `GGML_QNT_VERSION`).
pub const QUANTIZATION_VERSION: u32 = 2;

/// Options of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// The mix to produce.
    pub mix: Mix,
    /// Worker threads (0 or 1: the calling thread only).
    pub threads: usize,
    /// Allow tensors that are already block-quantized to be dequantized and quantized again.
    pub allow_requantize: bool,
}

/// One tensor's plan: its input type and what the mix makes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorPlan {
    /// Tensor name.
    pub name: String,
    /// GGUF dims (`dims[0]` is the row length).
    pub dims: Vec<u64>,
    /// Type in the input.
    pub from: GgmlType,
    /// Type in the output (equal to `from` when the tensor is copied unchanged).
    pub to: GgmlType,
    /// Why the rule chose `to`.
    pub reason: Reason,
    /// The type the rule wanted before the block-size fallback.
    pub fallback_from: Option<GgmlType>,
}

/// Progress reports passed to the callback of [`quantize_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// Tensor `index` (0-based, of `count`) is done.
    Tensor {
        /// 0-based position in the file.
        index: usize,
        /// Number of tensors.
        count: usize,
        /// Its name.
        name: &'a str,
        /// Its output type.
        ty: GgmlType,
        /// Input tensor bytes processed so far, this tensor included.
        done_bytes: u64,
        /// Input tensor bytes in all.
        total_bytes: u64,
    },
    /// Every tensor is converted; the file is being written.
    Writing,
}

/// Totals for one output type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeTotals {
    /// The type.
    pub ty: GgmlType,
    /// Tensors of that type.
    pub tensors: usize,
    /// Their elements.
    pub elements: u64,
    /// Their bytes in the output.
    pub bytes: u64,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The mix produced.
    pub mix: Mix,
    /// Per output type, ordered by GGUF type id.
    pub types: Vec<TypeTotals>,
    /// Tensors converted to another type.
    pub converted: usize,
    /// Tensors copied unchanged.
    pub copied: usize,
    /// Tensors whose type fell back for their row length: (name, wanted, used).
    pub fallbacks: Vec<(String, GgmlType, GgmlType)>,
    /// Tensor data bytes of the input.
    pub input_bytes: u64,
    /// Size of the output file.
    pub output_bytes: u64,
    /// Time spent converting tensors.
    pub convert_time: Duration,
    /// Whole run, writing included.
    pub elapsed: Duration,
}

/// Whether `ty` is a block-quantized format (requantizing it loses precision).
fn is_block_quantized(ty: GgmlType) -> bool {
    ty.block_size() > 1
}

/// Whether the rule may change a tensor stored as `ty` (integer tables are never touched).
fn is_float_or_quantized(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) || is_block_quantized(ty)
}

/// The plan of every tensor of `input` under `mix`, in file order.
pub fn plan(input: &Gguf, mix: Mix) -> Vec<TensorPlan> {
    let info = ModelInfo::from_gguf(input);
    let list: Vec<(&str, &[u64])> = input
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.dims.as_slice()))
        .collect();
    let choices = choose_types(mix, &info, &list);
    input
        .tensors()
        .iter()
        .zip(choices)
        .map(|(t, c)| {
            let keep = !is_float_or_quantized(t.ty);
            let (to, reason) = match c.ty {
                Some(ty) if !keep => (ty, c.reason),
                _ => (t.ty, Reason::Kept),
            };
            TensorPlan {
                name: t.name.clone(),
                dims: t.dims.clone(),
                from: t.ty,
                to,
                reason,
                fallback_from: c.fallback_from.filter(|_| reason != Reason::Kept),
            }
        })
        .collect()
}

/// Converts one tensor's data from `from` to `to` on `threads` threads: each row is
/// dequantized to f32, checked to be finite, and quantized.
pub fn convert_tensor(
    name: &str,
    from: GgmlType,
    data: &[u8],
    dims: &[u64],
    to: GgmlType,
    threads: usize,
) -> Result<Vec<u8>, QuantizeError> {
    let quant = |source| QuantizeError::Quant {
        tensor: name.to_owned(),
        source,
    };
    let partial = |ty: GgmlType, cols: u64| {
        quant(ferrite_quant::QuantError::PartialBlock {
            ty,
            n: cols as usize,
            block: ty.block_size(),
        })
    };
    let cols = dims.first().copied().unwrap_or(0);
    let n: u64 = dims.iter().product();
    if cols == 0 {
        return Ok(Vec::new());
    }
    let rows = (n / cols) as usize;
    let src_row = from.row_bytes(cols).ok_or_else(|| partial(from, cols))? as usize;
    let dst_row = to.row_bytes(cols).ok_or_else(|| partial(to, cols))? as usize;
    if data.len() != src_row * rows {
        return Err(quant(ferrite_quant::QuantError::ByteLength {
            ty: from,
            n: n as usize,
            expected: (src_row * rows) as u64,
            got: data.len(),
        }));
    }
    let mut out = vec![0u8; dst_row * rows];
    let per = rows.div_ceil(threads.max(1)).max(1);
    let work = |first: usize, src: &[u8], dst: &mut [u8]| -> Result<(), QuantizeError> {
        let mut row = vec![0f32; cols as usize];
        for (i, (s, d)) in src.chunks(src_row).zip(dst.chunks_mut(dst_row)).enumerate() {
            ferrite_quant::dequantize(from, s, &mut row).map_err(quant)?;
            if !row.iter().all(|v| v.is_finite()) {
                return Err(QuantizeError::NonFinite {
                    tensor: name.to_owned(),
                    row: (first + i) as u64,
                });
            }
            ferrite_quant::quantize(to, &row, d).map_err(quant)?;
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = data
            .chunks(per * src_row)
            .zip(out.chunks_mut(per * dst_row))
            .enumerate()
            .map(|(t, (src, dst))| s.spawn(move || work(t * per, src, dst)))
            .collect();
        handles.into_iter().try_for_each(|h| match h.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    })?;
    Ok(out)
}

/// Metadata of the output: the input's entries in order, with `general.file_type` and
/// `general.quantization_version` replaced (or appended when absent).
fn output_metadata(input: &Gguf, mix: Mix) -> Vec<(String, Value)> {
    let set = [
        ("general.file_type", Value::U32(mix.file_type())),
        (
            "general.quantization_version",
            Value::U32(QUANTIZATION_VERSION),
        ),
    ];
    let mut out: Vec<(String, Value)> = input
        .metadata()
        .iter()
        .map(|(k, v)| {
            let v = set
                .iter()
                .find(|(key, _)| key == k)
                .map_or_else(|| v.clone(), |(_, new)| new.clone());
            (k.clone(), v)
        })
        .collect();
    for (k, v) in set {
        if input.get(k).is_none() {
            out.push((k.to_owned(), v));
        }
    }
    out
}

/// Fails early on inputs the run cannot handle: split shards, a missing output directory,
/// tensors that would need requantizing without permission.
fn preflight(
    input: &Gguf,
    out: &Path,
    plans: &[TensorPlan],
    opts: &QuantizeOptions,
) -> Result<(), QuantizeError> {
    let count = input.get_u64("split.count").unwrap_or(1);
    if count > 1 {
        return Err(QuantizeError::SplitInput {
            no: input.get_u64("split.no").unwrap_or(0),
            count,
        });
    }
    let dir = parent_dir(out);
    if !dir.is_dir() {
        return Err(QuantizeError::OutputDir {
            path: dir.display().to_string(),
        });
    }
    if !opts.allow_requantize
        && let Some(p) = plans
            .iter()
            .find(|p| p.from != p.to && is_block_quantized(p.from))
    {
        return Err(QuantizeError::Requantize {
            tensor: p.name.clone(),
            from: p.from,
            to: p.to,
        });
    }
    Ok(())
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Quantizes `input` into a new GGUF at `out` with `opts.mix`, reporting to `progress` after
/// every tensor. All metadata is copied (with `general.file_type` set to the mix's code);
/// tensors keep their order. The file appears at `out` only when complete: it is written to
/// a temporary file in the same directory and renamed.
pub fn quantize_file(
    input: &Gguf,
    out: &Path,
    opts: &QuantizeOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Summary, QuantizeError> {
    let start = Instant::now();
    let plans = plan(input, opts.mix);
    preflight(input, out, &plans, opts)?;

    let mut writer = GgufWriter::new();
    for (k, v) in output_metadata(input, opts.mix) {
        writer.add_metadata(k, v)?;
    }
    let total_bytes: u64 = input.tensors().iter().map(|t| t.n_bytes).sum();
    let mut done_bytes = 0u64;
    let mut summary = Summary {
        mix: opts.mix,
        types: Vec::new(),
        converted: 0,
        copied: 0,
        fallbacks: Vec::new(),
        input_bytes: total_bytes,
        output_bytes: 0,
        convert_time: Duration::ZERO,
        elapsed: Duration::ZERO,
    };
    let count = plans.len();
    for (index, (p, t)) in plans.iter().zip(input.tensors()).enumerate() {
        let src = input.tensor_data(t);
        let data: Cow<'_, [u8]> = if p.to == p.from {
            summary.copied += 1;
            Cow::Borrowed(src)
        } else {
            summary.converted += 1;
            Cow::Owned(convert_tensor(
                &p.name,
                p.from,
                src,
                &p.dims,
                p.to,
                opts.threads,
            )?)
        };
        if let Some(wanted) = p.fallback_from {
            summary.fallbacks.push((p.name.clone(), wanted, p.to));
        }
        add_totals(&mut summary.types, p, data.len() as u64);
        writer.add_tensor(p.name.clone(), p.to, &p.dims, data)?;
        done_bytes += t.n_bytes;
        progress(Progress::Tensor {
            index,
            count,
            name: &p.name,
            ty: p.to,
            done_bytes,
            total_bytes,
        });
    }
    summary.convert_time = start.elapsed();
    summary.types.sort_by_key(|t| t.ty.id());
    progress(Progress::Writing);
    summary.output_bytes = write_atomically(&writer, out)?;
    summary.elapsed = start.elapsed();
    Ok(summary)
}

fn add_totals(types: &mut Vec<TypeTotals>, p: &TensorPlan, bytes: u64) {
    let elements: u64 = p.dims.iter().product();
    match types.iter_mut().find(|t| t.ty == p.to) {
        Some(t) => {
            t.tensors += 1;
            t.elements += elements;
            t.bytes += bytes;
        }
        None => types.push(TypeTotals {
            ty: p.to,
            tensors: 1,
            elements,
            bytes,
        }),
    }
}

/// Writes `writer` to `out` atomically (`ferrite_files::write_atomic`): a killed or failed
/// quantization never leaves a partial model under the output name.
fn write_atomically(writer: &GgufWriter<'_>, out: &Path) -> Result<u64, QuantizeError> {
    ferrite_files::write_atomic(out, |w| {
        writer.write_to(w).map(|_| ()).map_err(|e| match e {
            ferrite_gguf::GgufError::Io { source, .. } => {
                ferrite_files::FileError::new(out, source).into()
            }
            other => QuantizeError::Gguf(other),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_input() -> Gguf {
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mat: Vec<f32> = (0..64 * 4)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0)
            .collect();
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::String("llama".into()))
            .and_then(|w| w.add_metadata("general.file_type", Value::U32(0)))
            .and_then(|w| w.add_metadata("llama.block_count", Value::U32(1)))
            .and_then(|w| {
                w.add_tensor(
                    "blk.0.attn_norm.weight",
                    GgmlType::F32,
                    &[64],
                    f32_bytes(&[1.0; 64]),
                )
            })
            .and_then(|w| {
                w.add_tensor(
                    "blk.0.attn_q.weight",
                    GgmlType::F32,
                    &[64, 4],
                    f32_bytes(&mat),
                )
            })
            .expect("build");
        Gguf::from_bytes(w.to_bytes().expect("bytes")).expect("parse")
    }

    #[test]
    fn metadata_is_copied_with_the_file_type_replaced_in_place() {
        let g = tiny_input();
        let m = output_metadata(&g, Mix::Q4_K_M);
        assert_eq!(m[0].0, "general.architecture");
        assert_eq!(m[1], ("general.file_type".into(), Value::U32(15)));
        assert_eq!(m.len(), 4);
        assert_eq!(m[3].0, "general.quantization_version");
    }

    #[test]
    fn convert_reports_the_row_holding_a_nan() {
        let mut v = vec![0.5f32; 64];
        v[40] = f32::NAN;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let err = convert_tensor("t", GgmlType::F32, &bytes, &[32, 2], GgmlType::Q8_0, 2)
            .expect_err("NaN must be refused");
        assert!(
            matches!(err, QuantizeError::NonFinite { row: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn requantizing_needs_permission_and_is_checked_before_writing() {
        let g = tiny_input();
        let dir = tempfile::tempdir().expect("tempdir");
        let q = dir.path().join("q.gguf");
        let opts = QuantizeOptions {
            mix: Mix::Q8_0,
            threads: 2,
            allow_requantize: false,
        };
        quantize_file(&g, &q, &opts, &mut |_| {}).expect("first pass");
        let g8 = Gguf::open(&q).expect("open");
        let again = dir.path().join("q4.gguf");
        let opts4 = QuantizeOptions {
            mix: Mix::Q4_0,
            ..opts
        };
        let err = quantize_file(&g8, &again, &opts4, &mut |_| {}).expect_err("needs the flag");
        assert!(err.to_string().contains("--allow-requantize"), "{err}");
        assert!(!again.exists());
        let ok = QuantizeOptions {
            allow_requantize: true,
            ..opts4
        };
        quantize_file(&g8, &again, &ok, &mut |_| {}).expect("allowed");
        // Same mix on an already quantized file: nothing changes type, no flag needed.
        let same = dir.path().join("q8.gguf");
        quantize_file(&g8, &same, &opts, &mut |_| {}).expect("no-op requantize");
    }

    #[test]
    fn a_missing_output_directory_is_refused_before_any_work() {
        let g = tiny_input();
        let opts = QuantizeOptions {
            mix: Mix::Q8_0,
            threads: 1,
            allow_requantize: false,
        };
        let err = quantize_file(&g, Path::new("/nonexistent-dir/x.gguf"), &opts, &mut |_| {})
            .expect_err("missing dir");
        assert!(matches!(err, QuantizeError::OutputDir { .. }), "{err}");
    }

    #[test]
    fn no_partial_file_is_left_behind() {
        let g = tiny_input();
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("m.gguf");
        let opts = QuantizeOptions {
            mix: Mix::F16,
            threads: 1,
            allow_requantize: false,
        };
        let s = quantize_file(&g, &out, &opts, &mut |_| {}).expect("run");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("m.gguf")]);
        assert_eq!(s.output_bytes, std::fs::metadata(&out).expect("stat").len());
    }
}

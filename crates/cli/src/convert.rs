//! `ferrite convert HF_DIR OUT.gguf`: a Hugging Face model directory to GGUF, and the cache
//! that lets every command take `-m path/to/hf_dir`.
//!
//! The output is written to a temporary file next to `OUT` and renamed into place, so an
//! interrupted or failed conversion never leaves a partial GGUF under the requested name.
//!
//! `-m HF_DIR` converts once into `$FERRITE_HOME/converted/<key>.gguf` with the stored float
//! types (no rounding) and loads that file like any other GGUF. A cache file, rather than a
//! conversion in memory, keeps one loading path (every command opens a path and memory-maps
//! it), costs the conversion once instead of on every start, and is still exact. The key is a
//! sha256 over the directory's JSON files, `tokenizer.model` and `chat_template.jinja`
//! (whole), each safetensors file's header (names, dtypes, shapes, offsets) and each weight
//! file's size and modification time: hashing every weight byte would cost seconds per
//! gigabyte on every start, and an edit of tensor data that keeps size and mtime is not
//! something ordinary tools do.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use ferrite_convert::{HfModel, OutType, Summary, TensorDone};
use ferrite_quantize::{Mix, QuantizeOptions};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// Arguments of `ferrite convert`.
#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Hugging Face model directory: config.json, *.safetensors (or a sharding index),
    /// tokenizer.json and tokenizer_config.json.
    hf_dir: PathBuf,
    /// The GGUF file to write (replaced if it exists).
    out: PathBuf,
    /// Type of the weight matrices: f32, f16, bf16, q8_0, or stored (keep each tensor's type);
    /// or a quantization mix of `ferrite quantize` (q4_0, q4_1, q5_0, q5_1, q4_k_m, q5_k_m,
    /// q6_k), applied to the stored weights. Vectors, norms, biases and MoE routers are always
    /// f32.
    #[arg(long = "type", default_value = "f16")]
    ty: String,
}

/// Run `ferrite convert`.
pub fn run(args: ConvertArgs) -> anyhow::Result<i32> {
    let direct = OutType::from_name(&args.ty);
    let mix = match direct {
        Some(_) => None,
        None => match args.ty.parse::<Mix>() {
            Ok(mix) => Some(mix),
            Err(_) => {
                let names: Vec<&str> = OutType::ALL.iter().map(|(_, n)| *n).collect();
                bail!(
                    "convert cannot write type {:?} (it writes {} and the mixes of `ferrite \
                     quantize`: {})",
                    args.ty,
                    names.join(", "),
                    Mix::ALL
                        .iter()
                        .map(|m| m.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        },
    };
    if !args.hf_dir.join("config.json").is_file() {
        bail!(
            "{} is not a Hugging Face model directory: config.json not found",
            args.hf_dir.display()
        );
    }
    let model = HfModel::open(&args.hf_dir)
        .with_context(|| format!("reading {}", args.hf_dir.display()))?;
    match (direct, mix) {
        (Some(ty), _) => {
            let summary = write_with_progress(&model, &args.out, ty, true)?;
            print_summary(&args.out, ty, &summary)?;
        }
        (None, Some(mix)) => {
            // The stored weights go to a temporary GGUF beside the output, which the
            // quantizer then rewrites with the mix (itself through a temporary file).
            let dir = out_dir(&args.out);
            let tmp = tempfile::Builder::new()
                .prefix(".ferrite-convert-")
                .tempdir_in(&dir)
                .with_context(|| format!("creating a temporary directory in {}", dir.display()))?;
            let stored = tmp.path().join("stored.gguf");
            write_with_progress(&model, &stored, OutType::Stored, true)?;
            let opts = QuantizeOptions {
                mix,
                threads: std::thread::available_parallelism().map_or(1, usize::from),
                allow_requantize: false,
            };
            crate::quantize::quantize_path(&stored, &args.out, &opts)?;
        }
        (None, None) => unreachable!("a type that is neither direct nor a mix was refused"),
    }
    Ok(0)
}

/// The directory a file is written in (`.` for a bare file name).
fn out_dir(out: &Path) -> PathBuf {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Converts `model` into `out` (atomically: `HfModel::write_gguf`), with a progress bar
/// when `show_progress`.
fn write_with_progress(
    model: &HfModel,
    out: &Path,
    ty: OutType,
    show_progress: bool,
) -> anyhow::Result<Summary> {
    let bar = if show_progress {
        ProgressBar::new(0)
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template("{msg:40!} [{bar:30}] {pos}/{len} tensors") {
        bar.set_style(style.progress_chars("=> "));
    }
    let mut progress = |p: TensorDone<'_>| {
        bar.set_length(p.total as u64);
        bar.set_position(p.index as u64);
        bar.set_message(format!("{} {:?}", p.name, p.ty));
    };
    let summary = model
        .write_gguf(out, ty, &mut progress)
        .with_context(|| format!("writing {}", out.display()))?;
    bar.finish_and_clear();
    Ok(summary)
}

fn print_summary(out: &Path, ty: OutType, s: &Summary) -> anyhow::Result<()> {
    let size = std::fs::metadata(out)
        .with_context(|| format!("reading {}", out.display()))?
        .len();
    println!(
        "wrote {} ({} bytes): arch {}, {} tensors, {} weights, type {}",
        out.display(),
        size,
        s.arch,
        s.n_tensors,
        s.n_params,
        ty.name()
    );
    for (t, (count, bytes)) in &s.by_type {
        println!(
            "  {:<6} {count:>5} tensors {bytes:>14} bytes",
            format!("{t:?}")
        );
    }
    Ok(())
}

/// The cached GGUF for the model directory `dir`, converting it on first use.
pub fn cached(dir: &Path) -> anyhow::Result<PathBuf> {
    let key = cache_key(dir)?;
    let cache = crate::models::home()?.join("converted");
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let path = cache.join(format!("{key}.gguf"));
    if path.is_file() {
        return Ok(path);
    }
    eprintln!(
        "converting {} to {} (once; the stored types are kept)",
        dir.display(),
        path.display()
    );
    let model = HfModel::open(dir).with_context(|| format!("reading {}", dir.display()))?;
    write_with_progress(&model, &path, OutType::Stored, false)?;
    Ok(path)
}

/// Files of a model directory that take part in the cache key, sorted by name.
fn keyed_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let wanted = name.ends_with(".json")
            || name.ends_with(".safetensors")
            || name == "tokenizer.model"
            || name == "chat_template.jinja";
        if wanted && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn cache_key(dir: &Path) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    // Part of the key so that a converter change that alters the output can bump it.
    h.update(b"ferrite-convert v1 stored\0");
    for path in keyed_files(dir)? {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        h.update(name.unwrap_or_default().as_bytes());
        h.update([0]);
        let meta = std::fs::metadata(&path).with_context(|| format!("{}", path.display()))?;
        h.update(meta.len().to_le_bytes());
        let mut file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        if path.extension().is_some_and(|e| e == "safetensors") {
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            h.update(mtime.to_le_bytes());
            // The header: its 8-byte length then the JSON, capped (the reader validates it).
            let mut len = [0u8; 8];
            file.read_exact(&mut len)
                .with_context(|| format!("reading {}", path.display()))?;
            let n = u64::from_le_bytes(len).min(meta.len().saturating_sub(8));
            let mut header = Vec::new();
            file.take(n.min(ferrite_safetensors::MAX_HEADER_LEN))
                .read_to_end(&mut header)
                .with_context(|| format!("reading {}", path.display()))?;
            h.update(len);
            h.update(&header);
        } else {
            let mut text = Vec::new();
            file.read_to_end(&mut text)
                .with_context(|| format!("reading {}", path.display()))?;
            h.update(&text);
        }
    }
    Ok(h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_follows_json_content_and_ignores_other_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let a = cache_key(dir.path()).unwrap();
        std::fs::write(dir.path().join("README.md"), "x").unwrap();
        assert_eq!(cache_key(dir.path()).unwrap(), a);
        std::fs::write(dir.path().join("config.json"), "{ }").unwrap();
        let b = cache_key(dir.path()).unwrap();
        assert_ne!(b, a);
        std::fs::write(dir.path().join("tokenizer.model"), "x").unwrap();
        assert_ne!(cache_key(dir.path()).unwrap(), b);
    }
}

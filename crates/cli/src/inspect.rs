//! `ferrite inspect`: what is inside a GGUF file — metadata, tensors, totals, architecture.
//!
//! Reads only through `ferrite-gguf`, so a file that inspects cleanly is a file the rest of
//! ferrite accepts; a malformed file fails here with the reader's one-line error.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use ferrite_arch::{ARCHITECTURE_KEY, Key};
use ferrite_gguf::{GgmlType, Gguf, Value};
use serde_json::json;

/// How many leading items of a long array the text view shows.
const ARRAY_PREVIEW: usize = 5;
/// Strings longer than this are cut in the text view (chat templates run to kilobytes).
const STRING_PREVIEW: usize = 120;

/// Arguments of `ferrite inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// Model: a known name, a path to a .gguf file, or a Hugging Face model directory.
    model: String,
    /// Print everything as JSON (arrays in full).
    #[arg(long)]
    json: bool,
    /// Also compute the file's sha256.
    #[arg(long)]
    hash: bool,
}

/// Run `ferrite inspect`.
pub fn run(args: InspectArgs) -> anyhow::Result<i32> {
    let path = crate::models::resolve(&args.model)?;
    let gguf = Gguf::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let sha256 = if args.hash {
        Some(crate::pull::hash_file(&path)?)
    } else {
        None
    };
    let summary = ArchSummary::of(&gguf);
    let text = if args.json {
        let doc = json_report(&path, &gguf, &summary, sha256.as_deref());
        serde_json::to_string_pretty(&doc)? + "\n"
    } else {
        render_text(&path, &gguf, &summary, sha256.as_deref())
    };
    // A reader that closes the pipe early (`inspect m | head`) is handled once, in main.
    print!("{text}");
    Ok(0)
}

/// The architecture facts a reader wants first; absent keys stay `None`.
struct ArchSummary {
    arch: Option<String>,
    layers: Option<u64>,
    heads: Option<u64>,
    kv_heads: Option<u64>,
    head_dim: Option<u64>,
    embedding: Option<u64>,
    ffn: Option<u64>,
    context: Option<u64>,
    vocab: Option<u64>,
    rope_base: Option<f32>,
    parameters: u64,
}

impl ArchSummary {
    fn of(g: &Gguf) -> Self {
        let arch = g.get_str(ARCHITECTURE_KEY).ok().map(str::to_string);
        let key = |k: Key| arch.as_ref().and_then(|a| g.get_u64(&k.of(a)).ok());
        let heads = key(Key::HeadCount);
        let embedding = key(Key::EmbeddingLength);
        let head_dim = key(Key::KeyLength).or(match (embedding, heads) {
            (Some(e), Some(h)) if h > 0 => Some(e / h),
            _ => None,
        });
        let vocab = g
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .map(|a| a.len() as u64)
            .or_else(|| key(Key::VocabSize));
        ArchSummary {
            layers: key(Key::BlockCount),
            heads,
            kv_heads: key(Key::HeadCountKv).or(heads),
            head_dim,
            embedding,
            ffn: key(Key::FeedForwardLength),
            context: key(Key::ContextLength),
            vocab,
            rope_base: arch
                .as_ref()
                .and_then(|a| g.get_f32(&Key::RopeFreqBase.of(a)).ok()),
            parameters: g.tensors().iter().map(|t| t.n_elements()).sum(),
            arch,
        }
    }
}

/// Tensor count and bytes per type, in type-id order.
fn totals_by_type(g: &Gguf) -> BTreeMap<u32, (GgmlType, usize, u64)> {
    let mut totals = BTreeMap::new();
    for t in g.tensors() {
        let entry = totals.entry(t.ty.id()).or_insert((t.ty, 0, 0));
        entry.1 += 1;
        entry.2 += t.n_bytes;
    }
    totals
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "?".to_string(), |v| v.to_string())
}

fn render_text(path: &Path, g: &Gguf, s: &ArchSummary, sha256: Option<&str>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "file: {}", path.display());
    let _ = writeln!(
        out,
        "gguf v{}  size {} bytes  alignment {}  data offset {}  tensors {}  metadata keys {}",
        g.version(),
        g.file_size(),
        g.alignment(),
        g.data_offset(),
        g.tensors().len(),
        g.metadata().len()
    );
    if let Some(h) = sha256 {
        let _ = writeln!(out, "sha256: {h}");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "architecture: {}", opt(s.arch.as_deref()));
    let _ = writeln!(
        out,
        "  layers {}  heads {}  kv heads {}  head dim {}  embedding {}  ffn {}",
        opt(s.layers),
        opt(s.heads),
        opt(s.kv_heads),
        opt(s.head_dim),
        opt(s.embedding),
        opt(s.ffn)
    );
    let _ = writeln!(
        out,
        "  context {}  vocab {}  rope base {}  parameters {}",
        opt(s.context),
        opt(s.vocab),
        opt(s.rope_base),
        s.parameters
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "metadata:");
    for (key, value) in g.metadata() {
        let _ = writeln!(out, "  {key} ({}) = {}", value.type_name(), preview(value));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "tensors:\n  {:<40} {:<8} {:<24} {:>12} {:>12}",
        "name", "type", "shape", "bytes", "offset"
    );
    for t in g.tensors() {
        let shape: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "  {:<40} {:<8} {:<24} {:>12} {:>12}",
            t.name,
            t.ty.name(),
            shape.join(" x "),
            t.n_bytes,
            t.offset
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "totals by type:");
    for (ty, count, bytes) in totals_by_type(g).values() {
        let _ = writeln!(
            out,
            "  {:<8} {count:>5} tensors {bytes:>12} bytes",
            ty.name()
        );
    }
    let _ = writeln!(out, "  total    {:>5} tensors", g.tensors().len());
    out
}

/// One-line rendering of a value: long arrays as length plus the first items.
fn preview(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let cut: String = s.chars().take(STRING_PREVIEW).collect();
            let more = if cut.len() < s.len() { "…" } else { "" };
            format!("{cut:?}{more}")
        }
        Value::Array(items) if items.len() > ARRAY_PREVIEW => {
            let head: Vec<String> = items
                .values()
                .take(ARRAY_PREVIEW)
                .map(|v| preview(&v))
                .collect();
            format!("[{} items: {}, …]", items.len(), head.join(", "))
        }
        Value::Array(items) => {
            let all: Vec<String> = items.values().map(|v| preview(&v)).collect();
            format!("[{}]", all.join(", "))
        }
        // f32 through JSON would print its f64 widening (9.999999747378752e-6 for 1e-5).
        Value::F32(x) => x.to_string(),
        other => scalar_json(other).to_string(),
    }
}

fn scalar_json(v: &Value) -> serde_json::Value {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(items) => {
            serde_json::Value::Array(items.values().map(|v| scalar_json(&v)).collect())
        }
    }
}

fn json_report(path: &Path, g: &Gguf, s: &ArchSummary, sha256: Option<&str>) -> serde_json::Value {
    let metadata: serde_json::Map<String, serde_json::Value> = g
        .metadata()
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                json!({"type": v.type_name(), "value": scalar_json(v)}),
            )
        })
        .collect();
    let tensors: Vec<serde_json::Value> = g
        .tensors()
        .iter()
        .map(|t| {
            json!({"name": t.name, "type": t.ty.name(), "shape": t.dims,
                   "bytes": t.n_bytes, "offset": t.offset})
        })
        .collect();
    let totals: Vec<serde_json::Value> = totals_by_type(g)
        .values()
        .map(|(ty, count, bytes)| json!({"type": ty.name(), "tensors": count, "bytes": bytes}))
        .collect();
    json!({
        "file": path.display().to_string(),
        "sha256": sha256,
        "gguf_version": g.version(),
        "file_size": g.file_size(),
        "alignment": g.alignment(),
        "data_offset": g.data_offset(),
        "architecture": {
            "name": s.arch, "layers": s.layers, "heads": s.heads, "kv_heads": s.kv_heads,
            "head_dim": s.head_dim, "embedding": s.embedding, "ffn": s.ffn,
            "context": s.context, "vocab": s.vocab, "rope_base": s.rope_base,
            "parameters": s.parameters,
        },
        "metadata": metadata,
        "tensors": tensors,
        "totals_by_type": totals,
    })
}

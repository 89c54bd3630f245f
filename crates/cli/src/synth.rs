//! `ferrite synth`: write a random-weight GGUF of a chosen shape, for speed work on shapes we
//! have no real file of, and for tests that need a model of an exact size.
//!
//! Owns the shape (presets and flags), the metadata the model loader reads
//! (`ferrite-model`'s `config.rs`), the tensor list and the per-tensor type rule. Weight values
//! and quantization are in `synth/weights.rs`, the tokenizer in `synth/vocab.rs`.
//!
//! Type rule for `--type q4_k_m` (our reading of llama.cpp's Q4_K_M mix): `output.weight`
//! Q6_K; `attn_v` and `ffn_down` Q6_K in the first eighth of the layers, the last eighth and
//! every third layer between, Q4_K elsewhere; every other matrix Q4_K. A matrix whose rows are
//! not a multiple of 256 falls back to Q5_0 (for Q4_K) or Q8_0 (for Q6_K); one whose rows are
//! not a multiple of 32 falls back to F16. `--type q4_1`: `token_embd` Q8_0 (as in SmolLM2's
//! Q4_1 file), every other matrix Q4_1. `q8_0`/`f16`/`f32`: every matrix that type. Norm
//! weights are always F32 ones. The output matrix is always written (untied). The head size
//! is hidden / heads for both architectures (real Gemma 3 files may store a larger one).

mod nemotron_h;
mod qwen3next;
mod vocab;
mod weights;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use ferrite_arch::{ARCHITECTURE_KEY, Arch, GlobalTensor, Key, Kind, TensorName, TensorRole};
use ferrite_gguf::{GgmlType, Gguf, GgufWriter, Value};
use ferrite_model::physical_memory;

use weights::{Init, Spec};

/// Architectures `synth` writes.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ArchArg {
    /// Llama (SmolLM2, Llama 3).
    Llama,
    /// Gemma 3.
    Gemma3,
    /// Qwen 3 dense (q/k norms, neox rope).
    Qwen3,
    /// Qwen3-Next: gated DeltaNet layers, gated attention every fourth, 8 experts (top 2)
    /// of --ffn with a gated shared one; --kv-heads key heads and --heads value heads.
    #[value(name = "qwen3next")]
    Qwen3Next,
    /// Nemotron-H: Mamba-2, squared-ReLU MLP and (every eighth block, from the seventh)
    /// attention blocks; at least 7 --layers.
    #[value(name = "nemotron_h")]
    NemotronH,
}

impl ArchArg {
    /// Its row of the architecture table.
    fn arch(self) -> Arch {
        match self {
            ArchArg::Llama => Arch::Llama,
            ArchArg::Gemma3 => Arch::Gemma3,
            ArchArg::Qwen3 => Arch::Qwen3,
            ArchArg::Qwen3Next => Arch::Qwen3Next,
            ArchArg::NemotronH => Arch::NemotronH,
        }
    }
}

/// Weight type mixes.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TypeArg {
    /// Q4_K with Q6_K for the output and some attn_v/ffn_down (llama.cpp's Q4_K_M mix).
    #[value(name = "q4_k_m")]
    Q4KM,
    /// Q4_1 matrices, Q8_0 token embedding.
    #[value(name = "q4_1")]
    Q4_1,
    /// Q8_0 matrices.
    #[value(name = "q8_0")]
    Q8_0,
    /// F16 matrices.
    F16,
    /// F32 matrices.
    F32,
}

/// Known shapes.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// 576 hidden, 30 layers, 9/3 heads, 1536 FFN, 49152 vocab.
    #[value(name = "smollm2-135m")]
    Smollm2_135m,
    /// 4096 hidden, 32 layers, 32/8 heads, 14336 FFN, 49152 vocab.
    #[value(name = "llama-8b")]
    Llama8b,
}

/// Arguments of `ferrite synth`.
#[derive(clap::Args)]
pub struct SynthArgs {
    /// Output .gguf file.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Architecture.
    #[arg(long, value_enum, default_value = "llama")]
    arch: ArchArg,
    /// Start from a known shape; explicit shape flags override its values.
    #[arg(long, value_enum)]
    preset: Option<Preset>,
    /// Residual width.
    #[arg(long)]
    hidden: Option<usize>,
    /// Transformer blocks.
    #[arg(long)]
    layers: Option<usize>,
    /// Query heads.
    #[arg(long)]
    heads: Option<usize>,
    /// Key/value heads.
    #[arg(long)]
    kv_heads: Option<usize>,
    /// FFN width.
    #[arg(long)]
    ffn: Option<usize>,
    /// Vocabulary size of the made-up byte-level tokenizer (at least 256).
    #[arg(long, conflicts_with = "tokenizer_from")]
    vocab: Option<usize>,
    /// Copy the tokenizer (every `tokenizer.*` key) from this model (name or path); the
    /// vocabulary size follows it.
    #[arg(long)]
    tokenizer_from: Option<String>,
    /// Weight type mix.
    #[arg(long = "type", value_enum, default_value = "q4_k_m")]
    ty: TypeArg,
    /// Random seed: the same seed and shape give a byte-identical file.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// A resolved shape.
struct Shape {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
    vocab: usize,
}

impl Shape {
    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

fn shape(args: &SynthArgs, tokenizer_vocab: Option<usize>) -> anyhow::Result<Shape> {
    let base = args.preset.map(|p| match p {
        Preset::Smollm2_135m => [576, 30, 9, 3, 1536, 49152],
        Preset::Llama8b => [4096, 32, 32, 8, 14336, 49152],
    });
    let pick = |v: Option<usize>, i: usize, flag: &str| -> anyhow::Result<usize> {
        v.or(base.map(|b| b[i]))
            .with_context(|| format!("--{flag} is required without --preset"))
    };
    let s = Shape {
        hidden: pick(args.hidden, 0, "hidden")?,
        layers: pick(args.layers, 1, "layers")?,
        heads: pick(args.heads, 2, "heads")?,
        kv_heads: pick(args.kv_heads, 3, "kv-heads")?,
        ffn: pick(args.ffn, 4, "ffn")?,
        vocab: match tokenizer_vocab {
            Some(v) => v,
            None => pick(args.vocab, 5, "vocab")?,
        },
    };
    if [s.hidden, s.layers, s.heads, s.kv_heads, s.ffn].contains(&0) {
        bail!("every shape value must be positive");
    }
    if !s.hidden.is_multiple_of(s.heads) || !s.head_dim().is_multiple_of(2) {
        bail!(
            "--hidden {} must be a multiple of --heads {} with an even head size",
            s.hidden,
            s.heads
        );
    }
    if !s.heads.is_multiple_of(s.kv_heads) {
        bail!("--kv-heads {} must divide --heads {}", s.kv_heads, s.heads);
    }
    if args.arch == ArchArg::NemotronH && s.layers < 7 {
        bail!(
            "--arch nemotron_h needs at least 7 --layers (its first attention block is the seventh)"
        );
    }
    Ok(s)
}

/// llama.cpp's "more bits" layers: the first and last eighth, and every third one between.
fn more_bits(layer: usize, n: usize) -> bool {
    layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2
}

/// Falls back to a type whose block fits rows of `cols` values.
fn fit(ty: GgmlType, cols: usize) -> GgmlType {
    use GgmlType as T;
    let chain: &[GgmlType] = match ty {
        T::Q4_K => &[T::Q4_K, T::Q5_0, T::F16],
        T::Q6_K => &[T::Q6_K, T::Q8_0, T::F16],
        T::F32 => &[T::F32],
        _ => &[ty, T::F16],
    };
    chain
        .iter()
        .copied()
        .find(|t| t.row_bytes(cols as u64).is_some())
        .unwrap_or(T::F32)
}

/// The type of matrix `name` in a model of `n_layer` layers.
fn matrix_type(ty: TypeArg, name: TensorName, n_layer: usize, cols: usize) -> GgmlType {
    let want = match ty {
        TypeArg::Q4KM => match name {
            TensorName::Global(GlobalTensor::Output) => GgmlType::Q6_K,
            TensorName::Layer {
                role: TensorRole::AttnV | TensorRole::FfnDown,
                layer,
                ..
            } if more_bits(layer, n_layer) => GgmlType::Q6_K,
            _ => GgmlType::Q4_K,
        },
        TypeArg::Q4_1 if name == TensorName::Global(GlobalTensor::TokenEmbd) => GgmlType::Q8_0,
        TypeArg::Q4_1 => GgmlType::Q4_1,
        TypeArg::Q8_0 => GgmlType::Q8_0,
        TypeArg::F16 => GgmlType::F16,
        TypeArg::F32 => GgmlType::F32,
    };
    fit(want, cols)
}

/// llama.cpp's `general.file_type` code of the mix.
fn file_type(ty: TypeArg) -> u32 {
    match ty {
        TypeArg::F32 => 0,
        TypeArg::F16 => 1,
        TypeArg::Q4_1 => 3,
        TypeArg::Q8_0 => 7,
        TypeArg::Q4KM => 15,
    }
}

/// The model's tensors, made one at a time as they are taken, so that a shape too large to
/// hold can be refused before its list is built.
fn tensor_specs<'a>(args: &'a SynthArgs, s: &'a Shape) -> impl Iterator<Item = Spec> + 'a {
    let hd = s.head_dim();
    let (q, kv) = (s.heads * hd, s.kv_heads * hd);
    let features = args.arch.arch().features();
    let matrix = move |name: TensorName, cols: usize, rows: usize| Spec {
        name: name.to_name(),
        dims: vec![cols as u64, rows as u64],
        ty: matrix_type(args.ty, name, s.layers, cols),
        init: Init::Normal,
    };
    let norm = |name: String, len: usize| Spec {
        name,
        dims: vec![len as u64],
        ty: GgmlType::F32,
        init: Init::Const(1.0),
    };
    let embeddings = [GlobalTensor::TokenEmbd, GlobalTensor::Output]
        .map(|t| matrix(TensorName::Global(t), s.hidden, s.vocab));
    let hybrid = matches!(args.arch, ArchArg::Qwen3Next | ArchArg::NemotronH);
    let layers = (0..s.layers).flat_map(move |l| {
        match args.arch {
            ArchArg::Qwen3Next => return qwen3next::layer(args.ty, s, l),
            ArchArg::NemotronH => return nemotron_h::layer(args.ty, s, l),
            _ => {}
        }
        let n = |role: TensorRole| TensorName::Layer {
            layer: l,
            role,
            kind: Kind::Weight,
        };
        vec![
            matrix(n(TensorRole::AttnQ), s.hidden, q),
            matrix(n(TensorRole::AttnK), s.hidden, kv),
            matrix(n(TensorRole::AttnV), s.hidden, kv),
            matrix(n(TensorRole::AttnOutput), q, s.hidden),
            matrix(n(TensorRole::FfnGate), s.hidden, s.ffn),
            matrix(n(TensorRole::FfnUp), s.hidden, s.ffn),
            matrix(n(TensorRole::FfnDown), s.ffn, s.hidden),
        ]
    });
    // A hybrid's layers list their own norms.
    let layer_norms = (0..s.layers).filter(move |_| !hybrid).flat_map(move |l| {
        let mut norms = vec![
            norm(TensorRole::AttnNorm.weight(l), s.hidden),
            norm(TensorRole::FfnNorm.weight(l), s.hidden),
        ];
        if features.qk_norm != ferrite_arch::Presence::Never {
            norms.push(norm(TensorRole::AttnQNorm.weight(l), hd));
            norms.push(norm(TensorRole::AttnKNorm.weight(l), hd));
        }
        if features.post_norms {
            norms.push(norm(TensorRole::PostAttentionNorm.weight(l), s.hidden));
            norms.push(norm(TensorRole::PostFfwNorm.weight(l), s.hidden));
        }
        norms
    });
    let output_norm = norm(GlobalTensor::OutputNorm.name().into(), s.hidden);
    embeddings
        .into_iter()
        .chain(layers)
        .chain(std::iter::once(output_norm))
        .chain(layer_norms)
}

/// The tensors of the model, once their data is known to fit in `memory` bytes (the whole
/// file is built in memory before it is written).
fn sized_specs(args: &SynthArgs, s: &Shape, memory: Option<usize>) -> anyhow::Result<Vec<Spec>> {
    let mut specs = Vec::new();
    let mut total: u64 = 0;
    for spec in tensor_specs(args, s) {
        let rows: u64 = spec.dims[1..].iter().product();
        total = spec
            .ty
            .row_bytes(spec.dims[0])
            .and_then(|b| b.checked_mul(rows))
            .and_then(|b| total.checked_add(b))
            .context("the model's size overflows: smaller --layers, --hidden, --ffn or --vocab")?;
        if let Some(m) = memory.filter(|&m| total > m as u64) {
            bail!(
                "the model's tensors would take more than {:.1} GB, this machine's memory, \
                 which holds the whole file while it is written (smaller --layers, --hidden, \
                 --ffn or --vocab)",
                m as f64 / 1e9
            );
        }
        specs.push(spec);
    }
    Ok(specs)
}

fn model_metadata(args: &SynthArgs, s: &Shape) -> Vec<(String, Value)> {
    let arch = args.arch.arch().name();
    let u = |v: usize| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    let k = |key: Key| key.of(arch);
    let mut m = vec![
        (ARCHITECTURE_KEY.to_owned(), Value::String(arch.into())),
        (
            "general.name".to_owned(),
            Value::String(format!(
                "ferrite-synth {arch} h{} l{} seed {}",
                s.hidden, s.layers, args.seed
            )),
        ),
        (
            "general.file_type".to_owned(),
            Value::U32(file_type(args.ty)),
        ),
        (k(Key::BlockCount), u(s.layers)),
        (k(Key::ContextLength), u(8192)),
        (k(Key::EmbeddingLength), u(s.hidden)),
        (k(Key::HeadCount), u(s.heads)),
        (k(Key::KeyLength), u(s.head_dim())),
        (k(Key::ValueLength), u(s.head_dim())),
    ];
    // Nemotron-H gives the FFN width and KV heads per block, and turns no heads.
    if args.arch != ArchArg::NemotronH {
        m.extend([
            (k(Key::FeedForwardLength), u(s.ffn)),
            (k(Key::HeadCountKv), u(s.kv_heads)),
            (k(Key::RopeDimensionCount), u(s.head_dim())),
        ]);
    }
    match args.arch {
        ArchArg::Llama => m.extend([
            (k(Key::LayerNormRmsEpsilon), Value::F32(1e-5)),
            (k(Key::RopeFreqBase), Value::F32(10_000.0)),
        ]),
        ArchArg::Gemma3 => m.extend([
            (k(Key::LayerNormRmsEpsilon), Value::F32(1e-6)),
            (k(Key::RopeFreqBase), Value::F32(1_000_000.0)),
            (k(Key::SlidingWindow), u(512)),
        ]),
        ArchArg::Qwen3 => m.extend([
            (k(Key::LayerNormRmsEpsilon), Value::F32(1e-6)),
            (k(Key::RopeFreqBase), Value::F32(1_000_000.0)),
        ]),
        ArchArg::Qwen3Next => {
            m.extend(
                qwen3next::metadata(s)
                    .into_iter()
                    .map(|(key, v)| (k(key), v)),
            );
        }
        ArchArg::NemotronH => {
            m.extend(
                nemotron_h::metadata(s)
                    .into_iter()
                    .map(|(key, v)| (k(key), v)),
            );
        }
    }
    m
}

/// Run `ferrite synth`; returns the process exit code.
pub fn run(args: SynthArgs) -> anyhow::Result<i32> {
    let start = Instant::now();
    let (tok_meta, tok_vocab) = match &args.tokenizer_from {
        Some(model) => {
            let path = crate::models::resolve(model)?;
            crate::outputs::check_not_an_input("--output", &args.output, &[("model", &path)])?;
            let g = Gguf::open(&path).with_context(|| format!("reading {}", path.display()))?;
            let (meta, vocab) = vocab::copy_from(&g)?;
            (Some(meta), Some(vocab))
        }
        None => (None, None),
    };
    let s = shape(&args, tok_vocab)?;
    let tok_meta = match tok_meta {
        Some(m) => m,
        None => vocab::synthesize(s.vocab)?,
    };
    let specs = sized_specs(&args, &s, physical_memory())?;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let mut writer = GgufWriter::new();
    for (k, v) in model_metadata(&args, &s).into_iter().chain(tok_meta) {
        writer.add_metadata(k, v)?;
    }
    let bar = indicatif::ProgressBar::new(specs.len() as u64);
    for spec in &specs {
        bar.set_message(spec.name.clone());
        let data = weights::make(spec, args.seed, threads)?;
        writer.add_tensor(spec.name.clone(), spec.ty, &spec.dims, data)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let bytes = writer
        .write_file(&args.output)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "wrote {} ({bytes} bytes, {} tensors, vocab {}) in {:.1} s on {threads} threads",
        args.output.display(),
        specs.len(),
        s.vocab,
        start.elapsed().as_secs_f64()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_bits_matches_the_eighths_rule() {
        let picked: Vec<usize> = (0..32).filter(|&l| more_bits(l, 32)).collect();
        assert_eq!(
            picked,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    #[test]
    fn types_fall_back_when_rows_do_not_fit_blocks() {
        assert_eq!(fit(GgmlType::Q4_K, 4096), GgmlType::Q4_K);
        assert_eq!(fit(GgmlType::Q4_K, 576), GgmlType::Q5_0);
        assert_eq!(fit(GgmlType::Q6_K, 576), GgmlType::Q8_0);
        assert_eq!(fit(GgmlType::Q4_1, 48), GgmlType::F16);
        assert_eq!(fit(GgmlType::F32, 7), GgmlType::F32);
    }

    #[test]
    fn q4_k_m_mix_uses_q6_k_for_output_and_some_layers() {
        let t = |name| matrix_type(TypeArg::Q4KM, name, 32, 4096);
        let layer = |role, layer| TensorName::Layer {
            layer,
            role,
            kind: Kind::Weight,
        };
        assert_eq!(t(TensorName::Global(GlobalTensor::Output)), GgmlType::Q6_K);
        assert_eq!(t(layer(TensorRole::AttnV, 0)), GgmlType::Q6_K);
        assert_eq!(t(layer(TensorRole::AttnV, 4)), GgmlType::Q4_K);
        assert_eq!(t(layer(TensorRole::FfnDown, 6)), GgmlType::Q6_K);
        assert_eq!(t(layer(TensorRole::AttnQ, 0)), GgmlType::Q4_K);
        let embd = TensorName::Global(GlobalTensor::TokenEmbd);
        assert_eq!(matrix_type(TypeArg::Q4_1, embd, 2, 64), GgmlType::Q8_0);
    }

    #[test]
    fn models_larger_than_memory_are_refused_before_any_data_is_made() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            synth: SynthArgs,
        }
        let args = |extra: &[&str]| {
            let base = ["synth", "-o", "x.gguf", "--heads", "2", "--kv-heads", "1"];
            Cli::parse_from(base.iter().chain(extra)).synth
        };
        let small = args(&[
            "--hidden", "64", "--layers", "2", "--ffn", "128", "--vocab", "300",
        ]);
        let s = shape(&small, None).unwrap();
        let specs = sized_specs(&small, &s, Some(1 << 20)).unwrap();
        let bytes: u64 = specs
            .iter()
            .map(|t| t.ty.row_bytes(t.dims[0]).unwrap() * t.dims[1..].iter().product::<u64>())
            .sum();
        assert!(bytes > 60_000 && bytes < 1 << 20, "{bytes}");
        let tight = sized_specs(&small, &s, Some(bytes as usize - 1)).unwrap_err();
        assert!(
            tight.to_string().contains("this machine's memory"),
            "{tight}"
        );
        assert!(sized_specs(&small, &s, Some(bytes as usize)).is_ok());
        assert_eq!(sized_specs(&small, &s, None).unwrap().len(), specs.len());
        let huge = args(&[
            "--hidden",
            "64",
            "--layers",
            "1",
            "--ffn",
            &u64::MAX.to_string(),
            "--vocab",
            "300",
        ]);
        let err = sized_specs(&huge, &shape(&huge, None).unwrap(), None).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
    }
}

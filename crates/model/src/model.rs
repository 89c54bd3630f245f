//! A loaded model: the mapped GGUF file, its configuration and a view of every weight the
//! forward pass needs, checked against the configuration once at load.
//!
//! Weights stay in the file's mapping and are handed to `ferrite_cpu::matmul` in their stored
//! type ([`Precision::Default`]), or are dequantized once to f32 copies at load
//! ([`Precision::F32`]) so that the forward pass sees exactly the weights the float32
//! reference (transformers) sees. Norm weights are always small f32 vectors. Where the CPU's
//! 16-bit products take a stored type (`ferrite_quant::kernels::q16::applies`), a matrix's rows are
//! instead packed once into their layout, on the first CPU product that reads them, and the
//! mapped pages of those rows leave the resident set, so the weights are held once.

use std::path::Path;
use std::sync::OnceLock;

use ferrite_arch::{BlockKind, GlobalTensor, LayerParts, TensorName, TensorRole};
use ferrite_backend::HostMatrix;
use ferrite_cpu::{Matrix, PackedRows, ThreadPool};
use ferrite_gguf::{GgmlType, Gguf};

use crate::ModelError;
use crate::config::ModelConfig;
use crate::delta_net::DeltaNetWeights;
use crate::mamba2::Mamba2Weights;
use crate::mla::MlaWeights;
use crate::moe::{Experts, MoeWeights};

/// How weights are held for the matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Stored (quantized) types, read straight from the mapping.
    #[default]
    Default,
    /// Every matrix dequantized to f32 at load.
    F32,
}

/// Options of [`Model::load`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadOptions {
    /// Weight precision.
    pub precision: Precision,
}

/// One weight matrix of `rows × cols` (GGUF dims `[cols, rows]`).
#[derive(Debug)]
pub struct Weight {
    /// Index into the file's tensor table.
    tensor: usize,
    /// The first of its rows in that tensor (a part of a fused projection; else 0).
    row0: usize,
    ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Dequantized copy under [`Precision::F32`].
    f32_copy: Option<Vec<f32>>,
    /// The rows packed for the CPU's 16-bit products ([`ferrite_cpu::pack`]), made on the
    /// first CPU product rather than at load, so that a model run on the GPU never holds
    /// the copy.
    packed: OnceLock<Option<PackedRows>>,
}

impl Weight {
    /// The type the products read (`F32` under [`Precision::F32`]).
    pub(crate) fn ty(&self) -> GgmlType {
        if self.f32_copy.is_some() {
            GgmlType::F32
        } else {
            self.ty
        }
    }
}

/// How a block projects its attention's inputs.
#[derive(Debug)]
pub(crate) enum Attn {
    /// Q, K and V projections (three matrices or the parts of a fused one). Both kinds
    /// are boxed, so that neither sizes the other's blocks.
    Qkv(Box<[Weight; 3]>),
    /// Multi-head latent attention.
    Mla(Box<MlaWeights>),
    /// A gated DeltaNet in place of attention (its output projection is the layer's `wo`).
    DeltaNet(Box<DeltaNetWeights>),
    /// A Mamba-2 mixer in place of attention (its output projection is the layer's `wo`).
    Mamba2(Box<Mamba2Weights>),
}

/// The weights of one transformer block: a mixer, then an FFN, each with its norm before
/// it and its residual add after it. A Nemotron-H block has one of the two.
#[derive(Debug)]
pub(crate) struct LayerWeights {
    pub(crate) mixer: Option<MixerWeights>,
    pub(crate) ffn: Option<FfnWeights>,
}

/// The first half of a block: attention, or the recurrence in its place.
#[derive(Debug)]
pub(crate) struct MixerWeights {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) attn: Attn,
    pub(crate) wo: Weight,
    pub(crate) q_norm: Option<Vec<f32>>,
    pub(crate) k_norm: Option<Vec<f32>>,
    pub(crate) post_attn_norm: Option<Vec<f32>>,
    /// Q, K, V biases (Qwen 2), all three or none.
    pub(crate) qkv_bias: Option<[Vec<f32>; 3]>,
    /// Attention output bias.
    pub(crate) out_bias: Option<Vec<f32>>,
    /// One sink logit per query head (gpt-oss).
    pub(crate) sinks: Option<Vec<f32>>,
    /// The attention heads' output gate (`attn_gate`, `q_dim × d_model`; Qwen3-Next).
    pub(crate) attn_gate: Option<Weight>,
}

/// The second half of a block.
#[derive(Debug)]
pub(crate) struct FfnWeights {
    pub(crate) norm: Vec<f32>,
    pub(crate) ffn: Ffn,
    pub(crate) post_norm: Option<Vec<f32>>,
}

/// One gated FFN: `down(act(gate · x) · (up · x))`, its width the gate's rows.
#[derive(Debug)]
pub(crate) struct DenseFfn {
    pub(crate) gate: Weight,
    pub(crate) up: Weight,
    pub(crate) down: Weight,
}

/// A block's feed-forward network.
#[derive(Debug)]
pub(crate) enum Ffn {
    /// One gated FFN.
    Dense(DenseFfn),
    /// Routed experts.
    Moe(MoeWeights),
    /// Nemotron-H's MLP, `down(relu(up · x)²)`, its width the up projection's rows.
    SquaredRelu {
        /// `ffn_up`.
        up: Weight,
        /// `ffn_down`.
        down: Weight,
    },
}

/// A model ready to run: owns the mapped file, the configuration and the weight views.
#[derive(Debug)]
pub struct Model {
    gguf: Gguf,
    config: ModelConfig,
    precision: Precision,
    pub(crate) embed: Weight,
    /// `None` when the output projection is tied to the embedding.
    pub(crate) output: Option<Weight>,
    pub(crate) output_norm: Vec<f32>,
    pub(crate) layers: Vec<LayerWeights>,
}

/// Dequantizes the whole of tensor `name` of `g` into a new f32 vector.
pub(crate) fn dequantize_tensor(g: &Gguf, name: &str) -> Result<Vec<f32>, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
    let n = usize::try_from(t.n_elements())
        .map_err(|_| ModelError::InvalidArgument(format!("{name} is too large")))?;
    let mut out = vec![0.0f32; n];
    ferrite_quant::dequantize(t.ty, g.tensor_data(t), &mut out).map_err(|source| {
        ModelError::Quant {
            name: name.to_owned(),
            source,
        }
    })?;
    Ok(out)
}

/// `n` vectors of `len` values stored as one tensor (GGUF dims `[len, n]`), dequantized.
pub(crate) fn vectors(g: &Gguf, name: &str, len: usize, n: usize) -> Result<Vec<f32>, ModelError> {
    find_tensor(g, name, &[len as u64, n as u64])?;
    dequantize_tensor(g, name)
}

pub(crate) fn vector(g: &Gguf, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
    if t.dims != [len as u64] {
        return Err(ModelError::TensorShape {
            name: name.to_owned(),
            got: t.dims.clone(),
            expected: vec![len as u64],
        });
    }
    dequantize_tensor(g, name)
}

/// Index of tensor `name` in the file's table, after checking its GGUF dims are `dims` and
/// that the CPU kernels read its type (every product and lookup dequantizes through
/// `ferrite_quant`), so that a matrix no kernel reads is refused at load, by name, rather
/// than failing the first forward pass.
pub(crate) fn find_tensor(g: &Gguf, name: &str, dims: &[u64]) -> Result<usize, ModelError> {
    let tensor = g
        .tensors()
        .iter()
        .position(|t| t.name == name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
    let t = &g.tensors()[tensor];
    if t.dims != dims {
        return Err(ModelError::TensorShape {
            name: name.to_owned(),
            got: t.dims.clone(),
            expected: dims.to_vec(),
        });
    }
    if !ferrite_quant::supports_dequantize(t.ty) {
        return Err(ModelError::Quant {
            name: name.to_owned(),
            source: ferrite_quant::QuantError::Unsupported {
                ty: t.ty,
                op: "dequantize",
            },
        });
    }
    Ok(tensor)
}

pub(crate) fn matrix(
    g: &Gguf,
    name: &str,
    rows: usize,
    cols: usize,
    precision: Precision,
) -> Result<Weight, ModelError> {
    matrix_rows(g, name, rows, 0..rows, cols, precision)
}

/// Rows `part` of the `total × cols` matrix `name`: one projection of a fused tensor
/// (Phi-3's `attn_qkv`, `ffn_up`), read in place like a whole matrix.
pub(crate) fn matrix_rows(
    g: &Gguf,
    name: &str,
    total: usize,
    part: std::ops::Range<usize>,
    cols: usize,
    precision: Precision,
) -> Result<Weight, ModelError> {
    let tensor = find_tensor(g, name, &[cols as u64, total as u64])?;
    let t = &g.tensors()[tensor];
    let f32_copy = match precision {
        Precision::Default => None,
        Precision::F32 => {
            Some(dequantize_tensor(g, name)?[part.start * cols..part.end * cols].to_vec())
        }
    };
    Ok(Weight {
        tensor,
        row0: part.start,
        ty: t.ty,
        rows: part.len(),
        cols,
        f32_copy,
        packed: OnceLock::new(),
    })
}

/// The attention output projection of layer `i`.
fn out_proj(g: &Gguf, c: &ModelConfig, i: usize, p: Precision) -> Result<Weight, ModelError> {
    let name = TensorRole::AttnOutput.weight(i);
    matrix(g, &name, c.d_model, c.attn_out_dim(), p)
}

/// The Q, K and V projections of layer `i`: three matrices, or the rows of one fused
/// `attn_qkv` (Phi-3).
fn qkv(g: &Gguf, c: &ModelConfig, i: usize, p: Precision) -> Result<[Weight; 3], ModelError> {
    let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
    if !c.arch.features().fused {
        return Ok([
            matrix(g, &TensorRole::AttnQ.weight(i), q, d, p)?,
            matrix(g, &TensorRole::AttnK.weight(i), kv, d, p)?,
            matrix(g, &TensorRole::AttnV.weight(i), kv, d, p)?,
        ]);
    }
    let name = TensorRole::AttnQkv.weight(i);
    let total = q + 2 * kv;
    Ok([
        matrix_rows(g, &name, total, 0..q, d, p)?,
        matrix_rows(g, &name, total, q..q + kv, d, p)?,
        matrix_rows(g, &name, total, q + kv..total, d, p)?,
    ])
}

/// The dense gate and up projections (`ff` wide) of layer `i`: two matrices, or the halves
/// of one `ffn_up` of twice the width, gate rows first (Phi-3).
fn gate_up(
    g: &Gguf,
    c: &ModelConfig,
    i: usize,
    ff: usize,
    p: Precision,
) -> Result<[Weight; 2], ModelError> {
    let d = c.d_model;
    if !c.arch.features().fused {
        return Ok([
            matrix(g, &TensorRole::FfnGate.weight(i), ff, d, p)?,
            matrix(g, &TensorRole::FfnUp.weight(i), ff, d, p)?,
        ]);
    }
    let name = TensorRole::FfnUp.weight(i);
    Ok([
        matrix_rows(g, &name, 2 * ff, 0..ff, d, p)?,
        matrix_rows(g, &name, 2 * ff, ff..2 * ff, d, p)?,
    ])
}

/// The FFN of layer `i`: dense (every layer of a dense model, the leading ones of an
/// expert model), or routed experts with their shared expert and selection bias where the
/// model has them.
fn ffn(g: &Gguf, c: &ModelConfig, i: usize, p: Precision) -> Result<Ffn, ModelError> {
    let n = |r: TensorRole| r.weight(i);
    let d = c.d_model;
    if c.layers[i].block == Some(BlockKind::Mlp) {
        return Ok(Ffn::SquaredRelu {
            up: matrix(g, &n(TensorRole::FfnUp), c.d_ff, d, p)?,
            down: matrix(g, &n(TensorRole::FfnDown), d, c.d_ff, p)?,
        });
    }
    let moe = match &c.moe {
        Some(m) if m.is_expert_layer(i) => m,
        dense => {
            let ff = dense.map_or(c.d_ff, |m| m.dense_ff);
            let [gate, up] = gate_up(g, c, i, ff, p)?;
            let down = matrix(g, &n(TensorRole::FfnDown), d, ff, p)?;
            return Ok(Ffn::Dense(DenseFfn { gate, up, down }));
        }
    };
    let (e, ff) = (moe.n_expert, c.d_ff);
    let f32_copy = p == Precision::F32;
    let stack =
        |r: TensorRole, rows: usize, cols: usize| Experts::load(g, &n(r), rows, cols, e, f32_copy);
    let shared = match moe.shared_ff {
        0 => None,
        sf => Some(Box::new(DenseFfn {
            gate: matrix(g, &n(TensorRole::FfnGateShexp), sf, d, p)?,
            up: matrix(g, &n(TensorRole::FfnUpShexp), sf, d, p)?,
            down: matrix(g, &n(TensorRole::FfnDownShexp), d, sf, p)?,
        })),
    };
    let shared_gate = if shared.is_some() && c.delta_net.is_some() {
        Some(Box::new(matrix(
            g,
            &n(TensorRole::FfnGateInpShexp),
            1,
            d,
            p,
        )?))
    } else {
        None
    };
    let selection_bias = if moe.selection_bias {
        Some(vector(g, &TensorRole::ExpProbsB.bias(i), e)?)
    } else {
        None
    };
    let expert_bias = c.arch.features().expert_bias;
    let (router_bias, bias) = if expert_bias {
        let b = |r: TensorRole, len: usize| vectors(g, &r.bias(i), len, e);
        (
            Some(vector(g, &TensorRole::FfnGateInp.bias(i), e)?),
            Some([
                b(TensorRole::FfnGateExps, ff)?,
                b(TensorRole::FfnUpExps, ff)?,
                b(TensorRole::FfnDownExps, d)?,
            ]),
        )
    } else {
        (None, None)
    };
    Ok(Ffn::Moe(MoeWeights {
        router: matrix(g, &n(TensorRole::FfnGateInp), e, d, p)?,
        router_bias,
        bias,
        gate: stack(TensorRole::FfnGateExps, ff, d)?,
        up: stack(TensorRole::FfnUpExps, ff, d)?,
        down: stack(TensorRole::FfnDownExps, d, ff)?,
        shared,
        selection_bias,
        shared_gate,
    }))
}

/// Layer `i`'s vector `role` of `len` values when `wanted`.
fn optional(
    g: &Gguf,
    role: TensorRole,
    i: usize,
    len: usize,
    wanted: bool,
) -> Result<Option<Vec<f32>>, ModelError> {
    if wanted {
        vector(g, &role.weight(i), len).map(Some)
    } else {
        Ok(None)
    }
}

/// The mixer of layer `i`: attention (plain or latent), or the gated DeltaNet or Mamba-2
/// mixer in its place, with its norm and output projection.
fn mixer(g: &Gguf, c: &ModelConfig, i: usize, p: Precision) -> Result<MixerWeights, ModelError> {
    let delta = c.delta_net.filter(|_| c.is_delta_net(i));
    let mamba = c
        .mamba
        .filter(|_| c.layers[i].block == Some(BlockKind::Mamba2));
    let (attn, wo) = match (&c.mla, delta, mamba) {
        (_, Some(s), _) => {
            let (w, out) = DeltaNetWeights::load(g, (&s, c.d_model), i, p)?;
            (Attn::DeltaNet(Box::new(w)), out)
        }
        (_, None, Some(s)) => {
            let (w, out) = Mamba2Weights::load(g, (&s, c.d_model), i, p)?;
            (Attn::Mamba2(Box::new(w)), out)
        }
        (None, None, None) => (Attn::Qkv(Box::new(qkv(g, c, i, p)?)), out_proj(g, c, i, p)?),
        (Some(mla), None, None) => (
            Attn::Mla(Box::new(MlaWeights::load(
                g,
                (mla, c.d_model, c.n_head),
                i,
                p,
            )?)),
            out_proj(g, c, i, p)?,
        ),
    };
    let attention = delta.is_none() && mamba.is_none();
    let qk_norm = c.qk_norm && attention;
    Ok(MixerWeights {
        attn_norm: vector(g, &TensorRole::AttnNorm.weight(i), c.d_model)?,
        attn,
        wo,
        q_norm: optional(g, TensorRole::AttnQNorm, i, c.head_dim, qk_norm)?,
        k_norm: optional(g, TensorRole::AttnKNorm, i, c.head_dim, qk_norm)?,
        post_attn_norm: optional(g, TensorRole::PostAttentionNorm, i, c.d_model, c.post_norms)?,
        qkv_bias: if c.qkv_bias {
            let b = |r: TensorRole, len: usize| vector(g, &r.bias(i), len);
            Some([
                b(TensorRole::AttnQ, c.q_dim())?,
                b(TensorRole::AttnK, c.kv_dim())?,
                b(TensorRole::AttnV, c.kv_dim())?,
            ])
        } else {
            None
        },
        out_bias: if c.out_bias {
            Some(vector(g, &TensorRole::AttnOutput.bias(i), c.d_model)?)
        } else {
            None
        },
        sinks: optional(
            g,
            TensorRole::AttnSinks,
            i,
            c.n_head,
            c.arch.features().sinks,
        )?,
        attn_gate: if attention && c.delta_net.is_some() {
            Some(matrix(
                g,
                &TensorRole::AttnGate.weight(i),
                c.q_dim(),
                c.d_model,
                p,
            )?)
        } else {
            None
        },
    })
}

impl Model {
    /// Maps the GGUF file at `path`, reads its configuration and checks every weight.
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Model, ModelError> {
        Model::from_gguf(Gguf::open(path)?, opts)
    }

    /// Like [`Model::load`] for an already opened file.
    pub fn from_gguf(gguf: Gguf, opts: LoadOptions) -> Result<Model, ModelError> {
        let config = ModelConfig::from_gguf(&gguf)?;
        let c = &config;
        let p = opts.precision;
        let g = &gguf;
        let embed = matrix(g, GlobalTensor::TokenEmbd.name(), c.n_vocab, c.d_model, p)?;
        let output = match g.tensor(GlobalTensor::Output.name()) {
            Some(_) => Some(matrix(
                g,
                GlobalTensor::Output.name(),
                c.n_vocab,
                c.d_model,
                p,
            )?),
            None => None,
        };
        let output_norm = vector(g, GlobalTensor::OutputNorm.name(), c.d_model)?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let block = c.layers[i].block;
            layers.push(LayerWeights {
                mixer: match block {
                    Some(BlockKind::Mlp) => None,
                    _ => Some(mixer(g, c, i, p)?),
                },
                ffn: match block {
                    Some(BlockKind::Mamba2 | BlockKind::Attention) => None,
                    _ => Some(FfnWeights {
                        norm: vector(g, &c.arch.features().ffn_norm.weight(i), c.d_model)?,
                        ffn: ffn(g, c, i, p)?,
                        post_norm: optional(
                            g,
                            TensorRole::PostFfwNorm,
                            i,
                            c.d_model,
                            c.post_norms,
                        )?,
                    }),
                },
            });
        }
        check_all_tensors_used(g, c)?;
        crate::weights_check::check_at_load(g)?;
        Ok(Model {
            gguf,
            config,
            precision: p,
            embed,
            output,
            output_norm,
            layers,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The underlying GGUF file (metadata for the tokenizer, raw tensors).
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// The weight precision chosen at load.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The CPU product kernels this model's weights take, as the backend lines report them:
    /// `act=q16` where some products round activations to 16 bits (the weight types of
    /// `q16::applies` at this SIMD level; never weights dequantized to f32 at load), else `act=f32`; then
    /// `amx=on` where batches of those products take the AMX tile kernel, else `amx=off`.
    pub fn cpu_kernels(&self) -> String {
        let level = ferrite_quant::simd_level();
        let q16 = self.precision == Precision::Default
            && self
                .gguf
                .tensors()
                .iter()
                .any(|t| ferrite_quant::kernels::q16::applies(level, t.ty));
        let amx = q16 && ferrite_quant::kernels::q16::amx_available();
        format!(
            "act={} amx={}",
            if q16 { "q16" } else { "f32" },
            if amx { "on" } else { "off" }
        )
    }

    /// The matrix view `ferrite_cpu::matmul` takes for weight `w`, with its packed rows
    /// (packed on the first call where the products take them).
    pub(crate) fn matrix<'a>(&'a self, w: &'a Weight) -> Matrix<'a> {
        with_packed(&self.gguf, &w.packed, self.raw_matrix(w))
    }

    /// Matrix `w` as its file stores it (or as its f32 copy under [`Precision::F32`]), for
    /// a backend to upload.
    pub fn host_matrix<'a>(&'a self, w: &'a Weight) -> HostMatrix<'a> {
        host(self.raw_matrix(w))
    }

    /// `w` as stored (or as its f32 copy), without packed rows.
    pub(crate) fn raw_matrix<'a>(&'a self, w: &'a Weight) -> Matrix<'a> {
        match &w.f32_copy {
            Some(v) => Matrix {
                ty: GgmlType::F32,
                rows: w.rows,
                cols: w.cols,
                data: f32_bytes(v),
                packed: None,
            },
            None => {
                let data = self.gguf.tensor_data(&self.gguf.tensors()[w.tensor]);
                // The file's reader checked the tensor holds whole rows of its dims, and the
                // loader that `row0 + rows` is within them.
                let row = w.ty.row_bytes(w.cols as u64).map_or(0, |b| b as usize);
                Matrix {
                    ty: w.ty,
                    rows: w.rows,
                    cols: w.cols,
                    data: &data[w.row0 * row..(w.row0 + w.rows) * row],
                    packed: None,
                }
            }
        }
    }

    /// Packs every matrix the CPU's 16-bit products take now, spread over the pool's
    /// threads, instead of on the first product that reads it: for callers that would
    /// rather pay it while loading than in their first request's latency.
    pub fn pack_weights(&self, pool: &ThreadPool) {
        let mut weights: Vec<&Weight> = vec![self.output_weight()];
        let mut experts = Vec::new();
        for mx in self.layers.iter().filter_map(|l| l.mixer.as_ref()) {
            weights.push(&mx.wo);
            match &mx.attn {
                Attn::Qkv(qkv) => weights.extend(qkv.iter()),
                Attn::Mla(w) => {
                    weights.extend(w.matrices());
                    for x in [&w.k_b, &w.v_b] {
                        experts.extend((0..x.n_expert()).map(|e| (x, e)));
                    }
                }
                Attn::DeltaNet(w) => weights.extend(w.matrices()),
                Attn::Mamba2(w) => weights.extend(w.matrices()),
            }
            weights.extend(&mx.attn_gate);
        }
        for f in self.layers.iter().filter_map(|l| l.ffn.as_ref()) {
            match &f.ffn {
                Ffn::Dense(f) => weights.extend([&f.gate, &f.up, &f.down]),
                Ffn::SquaredRelu { up, down } => weights.extend([up, down]),
                Ffn::Moe(moe) => {
                    weights.push(&moe.router);
                    weights.extend(moe.shared_gate.as_deref());
                    if let Some(f) = &moe.shared {
                        weights.extend([&f.gate, &f.up, &f.down]);
                    }
                    for x in [&moe.gate, &moe.up, &moe.down] {
                        experts.extend((0..x.n_expert()).map(|e| (x, e)));
                    }
                }
            }
        }
        let n = pool.n_threads();
        pool.run(|index, _| {
            for w in weights.iter().skip(index).step_by(n) {
                self.matrix(w);
            }
            for (x, e) in experts.iter().skip(index).step_by(n) {
                x.matrix(&self.gguf, *e);
            }
        });
    }

    /// The output projection (the embedding when tied).
    pub(crate) fn output_weight(&self) -> &Weight {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}

/// The backend contract's view of a CPU matrix's rows.
pub(crate) fn host(m: Matrix<'_>) -> HostMatrix<'_> {
    HostMatrix {
        ty: m.ty,
        rows: m.rows,
        cols: m.cols,
        data: m.data,
    }
}

/// `raw` (rows of `g`) with its packed rows, packed into `cell` on the first call where the
/// 16-bit products take them. The products read the packed copy from then on, so each
/// packed span's mapped pages are dropped; the rows are read again only for embedding
/// lookups (a tied output head), which fault their pages back in. A matrix the packing
/// refuses is one the products refuse too, with the same shape error, so the raw view loses
/// nothing.
pub(crate) fn with_packed<'a>(
    g: &Gguf,
    cell: &'a OnceLock<Option<PackedRows>>,
    raw: Matrix<'a>,
) -> Matrix<'a> {
    let packed = cell.get_or_init(|| {
        ferrite_cpu::pack(raw, |rows| g.release_pages(rows))
            .ok()
            .flatten()
    });
    Matrix {
        packed: packed.as_ref(),
        ..raw
    }
}

/// Refuses a file with tensors the forward pass would not read: each one is a feature of the
/// checkpoint (an FFN bias, a shared expert, ...) that ignoring would silently change the
/// logits. The multi-token-prediction blocks after the run ones are the exception: kept in
/// the file for speculation, whatever they hold.
fn check_all_tensors_used(g: &Gguf, c: &ModelConfig) -> Result<(), ModelError> {
    let parts = |l: usize| {
        let experts = c.moe.as_ref().filter(|m| m.is_expert_layer(l));
        LayerParts {
            experts: experts.is_some(),
            shared_expert: experts.is_some_and(|m| m.shared_ff > 0),
            selection_bias: experts.is_some_and(|m| m.selection_bias),
            qk_norm: c.qk_norm,
            post_norms: c.post_norms,
            qkv_bias: c.qkv_bias,
            out_bias: c.out_bias,
            fused: c.arch.features().fused,
            mla: c.mla.map(|m| m.q_lora_rank.is_some()),
            sinks: c.arch.features().sinks,
            expert_bias: experts.is_some() && c.arch.features().expert_bias,
            ffn_norm: c.arch.features().ffn_norm,
            delta_net: c.is_delta_net(l),
            attn_gate: c.delta_net.is_some() && !c.is_delta_net(l),
            shared_expert_gate: c.delta_net.is_some(),
            block: c.layers[l].block,
        }
        .tensors()
    };
    let layers: Vec<_> = (0..c.n_layer).map(parts).collect();
    let used = |name: &str| match TensorName::parse(name) {
        Some(TensorName::Global(_)) => true,
        Some(TensorName::Layer {
            layer: i,
            role,
            kind,
        }) if i < c.n_layer => layers[i].contains(&(role, kind)),
        _ => ferrite_arch::layer_of(name)
            .is_some_and(|i| (c.n_layer..c.n_layer + c.mtp_layers).contains(&i)),
    };
    match g.tensors().iter().find(|t| !used(&t.name)) {
        Some(t) => Err(ModelError::Unsupported {
            key: t.name.clone(),
            what: "a tensor this architecture's forward pass does not use".into(),
        }),
        None => Ok(()),
    }
}

/// Reinterprets f32 values as their little-endian bytes (the layout GGML F32 tensors use).
fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::tiny_gguf;

    #[test]
    fn missing_tensor_is_named() {
        let g =
            Gguf::from_bytes(tiny_gguf("llama", GgmlType::F32, "", "blk.1.ffn_up.weight")).unwrap();
        let err = Model::from_gguf(g, LoadOptions::default()).unwrap_err();
        assert!(matches!(err, ModelError::MissingTensor(ref n) if n == "blk.1.ffn_up.weight"));
    }

    #[test]
    fn missing_output_means_tied_embedding_and_gemma_norms_are_loaded() {
        let m = crate::testutil::tiny_model("gemma3", GgmlType::Q8_0, Precision::Default);
        assert!(m.output.is_none());
        assert!(std::ptr::eq(m.output_weight(), &m.embed));
        assert!(m.layers.iter().all(|l| {
            let (mx, f) = (l.mixer.as_ref().unwrap(), l.ffn.as_ref().unwrap());
            mx.q_norm.is_some() && f.post_norm.is_some()
        }));
        let f = crate::testutil::tiny_model("gemma3", GgmlType::Q8_0, Precision::F32);
        assert_eq!(f.matrix(&f.embed).ty, GgmlType::F32);
        assert_eq!(m.matrix(&m.embed).ty, GgmlType::Q8_0);
        // The F32 copy is the exact dequantization of the stored row.
        use crate::session::Weights;
        use ferrite_backend::Backend;
        let pool = ThreadPool::new(1).unwrap();
        let b = ferrite_cpu::CpuBackend::new(&pool);
        let (mut a, mut c) = (vec![0.0; 64], vec![0.0; 64]);
        b.embed(b.table(&m, &m.embed), &[5], 1.0, &mut a).unwrap();
        b.embed(b.table(&f, &f.embed), &[5], 1.0, &mut c).unwrap();
        assert_eq!(a, c);
        assert!(b.embed(b.table(&m, &m.embed), &[97], 1.0, &mut a).is_err());
    }

    #[test]
    fn unused_tensors_are_refused_by_name() {
        // An FFN bias (Llama `mlp_bias = true`) is not implemented: ignoring it would change
        // the logits silently.
        let bytes = crate::testutil::with_vectors(
            tiny_gguf("llama", GgmlType::F32, "", ""),
            &[("blk.1.ffn_down.bias", vec![0.5; 64])],
        );
        let err =
            Model::from_gguf(Gguf::from_bytes(bytes).unwrap(), LoadOptions::default()).unwrap_err();
        assert!(
            matches!(err, ModelError::Unsupported { ref key, .. } if key == "blk.1.ffn_down.bias"),
            "{err}"
        );
        let bytes = crate::testutil::with_vectors(
            tiny_gguf("llama", GgmlType::F32, "", ""),
            &[("blk.7.attn_norm.weight", vec![1.0; 64])],
        );
        assert!(
            Model::from_gguf(Gguf::from_bytes(bytes).unwrap(), LoadOptions::default()).is_err()
        );
    }

    #[test]
    fn llama_attention_biases_are_loaded_when_present() {
        let mut extra = Vec::new();
        for l in 0..2 {
            for (s, len) in [
                ("attn_q", 64),
                ("attn_k", 32),
                ("attn_v", 32),
                ("attn_output", 64),
            ] {
                extra.push((format!("blk.{l}.{s}.bias"), vec![0.25; len]));
            }
        }
        let extra: Vec<(&str, Vec<f32>)> =
            extra.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        let bytes =
            crate::testutil::with_vectors(tiny_gguf("llama", GgmlType::F32, "", ""), &extra);
        let m = Model::from_gguf(Gguf::from_bytes(bytes).unwrap(), LoadOptions::default()).unwrap();
        assert!(m.config().qkv_bias && m.config().out_bias);
        assert!(
            m.layers
                .iter()
                .filter_map(|l| l.mixer.as_ref())
                .all(|mx| mx.qkv_bias.is_some() && mx.out_bias.is_some())
        );
    }

    /// Regression: a weight matrix of a type no CPU kernel reads (I32 here; also I8, I16,
    /// Q8_1) loaded, and the first forward pass failed with "cpu kernel: dequantize is not
    /// implemented for I32", naming no tensor (`serve` would start and fail every request).
    #[test]
    fn matrices_of_unreadable_types_are_refused_at_load_by_name() {
        use ferrite_gguf::GgufWriter;
        for name in ["blk.0.attn_q.weight", "token_embd.weight"] {
            let g = Gguf::from_bytes(tiny_gguf("llama", GgmlType::F32, "", "")).unwrap();
            let mut w = GgufWriter::new();
            for (k, v) in g.metadata() {
                w.add_metadata(k.clone(), v.clone()).unwrap();
            }
            for t in g.tensors() {
                // I32 has F32's size, so only the type changes.
                let ty = if t.name == name { GgmlType::I32 } else { t.ty };
                w.add_tensor(t.name.clone(), ty, &t.dims, g.tensor_data(t).to_vec())
                    .unwrap();
            }
            let bytes = w.to_bytes().unwrap();
            for precision in [Precision::Default, Precision::F32] {
                let g = Gguf::from_bytes(bytes.clone()).unwrap();
                let err = Model::from_gguf(g, LoadOptions { precision }).unwrap_err();
                assert!(
                    matches!(&err, ModelError::Quant { name: n, .. } if n == name),
                    "{name} {precision:?}: {err}"
                );
            }
        }
    }

    /// Replaces one metadata value of `bytes` (a GGUF) with an extreme of its kind, or drops
    /// or renames one tensor: the lies a hand-edited or hostile file tells about its shape.
    fn lie(rng: &mut ferrite_testkit::XorShift, bytes: &[u8]) -> Vec<u8> {
        use ferrite_gguf::{GgufWriter, Value};
        let g = Gguf::from_bytes(bytes.to_vec()).expect("base parses");
        let meta = g.metadata();
        let pick = rng.below(meta.len() + g.tensors().len());
        let mut w = GgufWriter::new();
        for (i, (k, v)) in meta.iter().enumerate() {
            let v = if i != pick {
                v.clone()
            } else if v.as_f32().is_some() && v.as_integer().is_none() {
                Value::F32([f32::NAN, -1.0, 0.0, f32::INFINITY, 1e30][rng.below(5)])
            } else {
                Value::U32([0, 1, 3, 65, 1 << 20, u32::MAX][rng.below(6)])
            };
            w.add_metadata(k.clone(), v).expect("metadata");
        }
        for (i, t) in g.tensors().iter().enumerate() {
            let name = match pick.checked_sub(meta.len()) {
                Some(j) if j == i && rng.below(2) == 0 => continue,
                Some(j) if j == i => "blk.0.attn_q.bias".to_owned(),
                _ => t.name.clone(),
            };
            // A rename onto an existing name would only be refused by the writer.
            let name = if name != t.name && g.tensor(&name).is_some() {
                t.name.clone()
            } else {
                name
            };
            w.add_tensor(name, t.ty, &t.dims, g.tensor_data(t).to_vec())
                .expect("tensor");
        }
        w.to_bytes().expect("gguf bytes")
    }

    /// Whatever a damaged or lying file holds, loading returns a model or an error, never a
    /// panic or an allocation sized by a claim the file cannot back; a model that loads runs
    /// two tokens without panicking. Half the mutants flip bytes of the metadata and tensor
    /// table (the data section only changes weights), half rewrite one value with an extreme
    /// (see [`lie`]). Test of the test: with the `block_count` bound of `ModelConfig` removed,
    /// this aborted on a 64 GiB allocation.
    #[test]
    fn mutated_files_load_or_fail_cleanly() {
        use crate::{KvType, Outputs, Session};
        const MUTANTS: usize = 3000;
        let bases: Vec<Vec<u8>> = ["llama", "gemma3", "qwen3moe", "qwen2"]
            .iter()
            .map(|a| tiny_gguf(a, GgmlType::Q8_0, "", ""))
            .collect();
        let pool = ferrite_cpu::ThreadPool::new(1).unwrap();
        let mut rng = ferrite_testkit::XorShift(0x5EED_0D31);
        let (mut loaded, mut refused) = (0, 0);
        for i in 0..MUTANTS {
            let base = &bases[i % bases.len()];
            let bytes = if i % 2 == 0 {
                lie(&mut rng, base)
            } else {
                let header = Gguf::from_bytes(base.clone()).unwrap().data_offset() as usize;
                let mut b = base.clone();
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(header);
                    match rng.below(3) {
                        0 => b[at] ^= 1 << rng.below(8),
                        1 => b[at] = rng.next_u64() as u8,
                        _ => {
                            let v = [u64::MAX, u32::MAX as u64, 1 << 40, 0][rng.below(4)];
                            for (slot, byte) in b[at..].iter_mut().zip(v.to_le_bytes()) {
                                *slot = byte;
                            }
                        }
                    }
                }
                b
            };
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let Ok(g) = Gguf::from_bytes(bytes) else {
                    return false;
                };
                let Ok(m) = Model::from_gguf(g, LoadOptions::default()) else {
                    return false;
                };
                if let Ok(mut s) = Session::new(&m, &pool, 8, KvType::F16) {
                    let _ = s.eval(&[0, 1], Outputs::Last);
                }
                true
            }));
            match outcome {
                Ok(true) => loaded += 1,
                Ok(false) => refused += 1,
                Err(_) => panic!("mutant {i} panicked"),
            }
        }
        println!("{MUTANTS} mutants: {loaded} loaded and ran, {refused} refused");
        assert!(loaded > 0 && refused > MUTANTS / 4, "{loaded} / {refused}");
    }
}

//! ferrite-backend: the contract between the model, written once, and the compute
//! backends that run it.
//!
//! Key design choice: an op-level contract in the spirit of ggml-backend's function tables
//! and candle's `BackendStorage`, at the granularity the kernels already have (a quantized
//! product over 1..N rows, a norm, rope with the KV store, attention over many sessions'
//! segments, the routed experts), not a layer-level one. The layer sequence then exists
//! once, in `ferrite-model`, generic over [`Backend`]; a backend brings buffers, weight
//! handles and KV stores as associated types and fills in the ops. Fused ops
//! ([`Backend::norm_into`], [`Backend::add_norm`], [`Backend::matmul_shared`],
//! [`Backend::rope_store`]) are default methods composed from the basic ones, which a
//! backend overrides where it has a kernel. Before a model runs, the backend answers
//! [`Backend::supports`] for every [`Op`] the model needs, with a reason when it refuses: an
//! op it cannot run is an error up front, never a silent fallback.
//!
//! [`conformance`] is the backend_ops harness every backend runs: each op, each weight type
//! the backend claims, boundary shapes, against a naive f64 reference that shares no kernel
//! code (only the fixture-checked dequantizers).
//!
//! This crate never depends on a backend (no cpu, no cuda); backends depend on it.
//!
//! ```
//! use ferrite_backend::{KvType, Op, Support};
//! // What a model asks a backend before running: an op with its data type.
//! let op = Op::Attention { kv: KvType::Q8, head_dim: 48, softcap: false, values: Default::default(), sinks: false };
//! assert_eq!((op.name(), op.dtype()), ("attention", "q8 KV".to_string()));
//! assert!(!Support::Unsupported("q8 needs whole blocks".into()).runs());
//! assert_eq!(KvType::Q8.row_elems(2, 64), Some(4));
//! ```

#![deny(missing_docs)]

pub mod conformance;
mod error;
mod op;
mod routing;
mod types;

pub use error::BackendError;
pub use op::{Op, Support};
pub use routing::{Gating, RouteRule, Routing};
pub use types::{
    Act, AttnShape, ExpertBufs, ExpertFfn, HostMatrix, KvType, Rope, RopeStyle, Segment, SsmParams,
    Values,
};

/// Results of the contract's ops.
pub type Result<T> = std::result::Result<T, BackendError>;

/// A compute backend: device buffers, weight handles and KV stores, and the ops of one
/// forward pass over them.
///
/// Buffers hold f32 activations, row-major; an op reads and writes the leading values its
/// arguments name (`n` rows of the op's width) and returns [`BackendError::Shape`] when a
/// buffer is too short. Every row's result depends only on that row (and its own session's
/// KV store), never on the other rows of the call.
pub trait Backend: Sync {
    /// A buffer of f32 activations.
    type Buf: std::fmt::Debug + Send;
    /// A weight matrix the products read.
    type Weight<'a>: Copy
    where
        Self: 'a;
    /// A small f32 vector: a norm weight, a bias, rope frequency factors.
    type Vector<'a>: Copy
    where
        Self: 'a;
    /// The KV store of one session (all layers, `ctx` positions).
    type Kv: Send;
    /// Per-pass rotary state (the angles of the pass's positions), refilled by
    /// [`Backend::rope_prepare`].
    type Angles: std::fmt::Debug + Default + Send;

    /// The backend's name, as errors and backend lines print it.
    fn name(&self) -> &'static str;

    /// Whether this backend runs `op`, answered before evaluation.
    fn supports(&self, op: &Op) -> Support;

    /// `op` as [`BackendError::Unsupported`] when [`Backend::supports`] refuses it.
    fn require(&self, op: &Op) -> Result<()> {
        match self.supports(op) {
            Support::Native | Support::Composed => Ok(()),
            Support::Unsupported(reason) => Err(BackendError::Unsupported {
                op: op.name(),
                dtype: op.dtype(),
                backend: self.name(),
                reason,
            }),
        }
    }

    // ---- buffers, weights and KV stores ----

    /// A zeroed buffer of `len` values.
    fn alloc(&self, len: usize) -> Result<Self::Buf>;
    /// Copies host values `src` into `dst` at value `at`.
    fn upload(&self, src: &[f32], dst: &mut Self::Buf, at: usize) -> Result<()>;
    /// Copies `dst.len()` values of `src` from value `at` to the host.
    fn download(&self, src: &Self::Buf, at: usize, dst: &mut [f32]) -> Result<()>;
    /// Copies `len` values of `src` from `from` into `dst` at `to` (`src: None` copies
    /// within `dst`, ranges of increasing order: `from >= to`).
    fn copy(
        &self,
        src: Option<&Self::Buf>,
        from: usize,
        dst: &mut Self::Buf,
        to: usize,
        len: usize,
    ) -> Result<()>;
    /// The weight handle of a host matrix.
    fn weight<'a>(&'a self, w: HostMatrix<'a>) -> Result<Self::Weight<'a>>;
    /// The handle of a host vector.
    fn vector<'a>(&'a self, v: &'a [f32]) -> Result<Self::Vector<'a>>;
    /// A zeroed KV store of `n_layer` layers and `ctx` positions of `shape.0` heads of
    /// `shape.1` values, with value rows of its own unless `values` lie in the keys.
    fn kv(
        &self,
        ty: KvType,
        n_layer: usize,
        ctx: usize,
        shape: (usize, usize),
        values: Values,
    ) -> Result<Self::Kv>;

    // ---- products ----

    /// Rows `tokens` of the embedding table `table` (`n_vocab × d`), each times `scale`,
    /// into `x` (`tokens.len() × d`).
    fn embed(
        &self,
        table: Self::Weight<'_>,
        tokens: &[u32],
        scale: f32,
        x: &mut Self::Buf,
    ) -> Result<()>;
    /// `y[t] = W · x[t]` for `n` rows (`x`: `n × cols`, `y`: `n × rows`).
    fn matmul(&self, w: Self::Weight<'_>, x: &Self::Buf, n: usize, y: &mut Self::Buf)
    -> Result<()>;
    /// `ys[i] = ws[i] · x` (a layer's q/k/v or gate/up projections), each with the bits
    /// [`Backend::matmul`] gives it.
    fn matmul_shared<const N: usize>(
        &self,
        ws: [Self::Weight<'_>; N],
        x: &Self::Buf,
        n: usize,
        ys: [&mut Self::Buf; N],
    ) -> Result<()> {
        for (w, y) in ws.into_iter().zip(ys) {
            self.matmul(w, x, n, y)?;
        }
        Ok(())
    }
    /// The output projection of `n` rows into host logits `out` (`n × n_vocab`).
    fn logits(&self, w: Self::Weight<'_>, x: &Self::Buf, n: usize, out: &mut [f32]) -> Result<()>;

    // ---- element-wise and row-wise ----

    /// RMS normalisation of the first `len` values of `x` in rows of `dim` values, scaled
    /// by `w` (`dim` values): `x / sqrt(mean(x²) + eps) · w`.
    fn rms_norm(
        &self,
        x: &mut Self::Buf,
        len: usize,
        w: Self::Vector<'_>,
        dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// `out = rms_norm(x)` for the first `len` values, `x` unchanged.
    fn norm_into(
        &self,
        x: &Self::Buf,
        len: usize,
        w: Self::Vector<'_>,
        dim: usize,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        self.copy(Some(x), 0, out, 0, len)?;
        self.rms_norm(out, len, w, dim, eps)
    }
    /// `x += y`, then `out = rms_norm(x)`: a residual add and the next block's norm.
    #[allow(clippy::too_many_arguments)]
    fn add_norm(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        len: usize,
        w: Self::Vector<'_>,
        dim: usize,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        self.add(x, y, len)?;
        self.norm_into(x, len, w, dim, eps, out)
    }
    /// `x[i] += y[i]` for the first `len` values.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize) -> Result<()>;
    /// Adds `b` (`dim` values) to each of the first `len / dim` rows of `x`.
    fn add_bias(
        &self,
        x: &mut Self::Buf,
        len: usize,
        b: Self::Vector<'_>,
        dim: usize,
    ) -> Result<()>;
    /// `gate = act(gate) · up` for `n` rows of `width` values.
    fn gated_act(
        &self,
        act: Act,
        gate: &mut Self::Buf,
        up: &Self::Buf,
        n: usize,
        width: usize,
    ) -> Result<()>;
    /// `x[r][i] *= sigmoid(g[r])` for `n` rows of `width` values (`g`: one value a row;
    /// Qwen3-Next's shared-expert gate).
    fn row_gate(&self, x: &mut Self::Buf, g: &Self::Buf, n: usize, width: usize) -> Result<()>;
    /// `x = rms_norm(x) · w · silu(z)` in rows of `dim` values over the first `len` values
    /// (the gated DeltaNet's output norm, one row per value head).
    #[allow(clippy::too_many_arguments)]
    fn gated_norm(
        &self,
        x: &mut Self::Buf,
        z: &Self::Buf,
        len: usize,
        w: Self::Vector<'_>,
        dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// RMS normalisation of the first `len` values of `x` in rows of `width` values, each
    /// run of `group` consecutive values (`group` divides `width`) on its own, scaled by
    /// `w` (`width` values): `x[i] / sqrt(mean over its group(x²) + eps) · w[i mod width]`
    /// (Mamba-2's output norm, one group per B/C group of heads).
    fn group_norm(
        &self,
        x: &mut Self::Buf,
        len: usize,
        w: Self::Vector<'_>,
        width: usize,
        group: usize,
        eps: f32,
    ) -> Result<()>;
    /// `x = max(x, 0)²` for the first `len` values (the squared-ReLU MLP of Nemotron-H).
    fn relu_sq(&self, x: &mut Self::Buf, len: usize) -> Result<()>;

    // ---- recurrent layers ----

    /// Gives `kv` recurrent state for `slots` layers of `len` values each, zeroed (the
    /// layers of a hybrid model that keep no K/V rows). A slot's values are laid out as
    /// [`ferrite_arch::DeltaNetShape::state_len`] or [`ferrite_arch::Mamba2Shape::state_len`]
    /// says: the convolution's last inputs, then the recurrence's matrices.
    fn kv_state(&self, kv: &mut Self::Kv, slots: usize, len: usize) -> Result<()>;
    /// Copies every state slot of `kv` to the host, slot after slot, into `out` (resized
    /// to `slots × len`; empty without slots): a checkpoint of a hybrid's recurrence.
    fn state_get(&self, kv: &Self::Kv, out: &mut Vec<f32>) -> Result<()>;
    /// Replaces every state slot of `kv` with `values` (as [`Backend::state_get`] lays
    /// them out), or with zeros (`None`: the state at position 0).
    fn state_set(&self, kv: &mut Self::Kv, values: Option<&[f32]>) -> Result<()>;
    /// The causal depthwise convolution at the head of a recurrent layer (a gated
    /// DeltaNet's or a Mamba-2 mixer's), then SiLU: row `t` of a segment gets, per channel
    /// `c` of `s.channels`, `silu(bias[c] + Σ_j w[c][j] · x[t - (K-1) + j][c])` (`K =
    /// s.kernel` taps, `w`: `channels × K`; without `bias` the sum alone), where rows
    /// before the segment's first are the previous inputs kept in the first `(K-1) ×
    /// channels` values of state slot `slot` of its store (a slot of `s.state_len` values;
    /// zero at position 0); the slot then keeps the segment's last `K - 1` inputs. `x` and
    /// `out` hold `channels` values per row of the pass.
    #[allow(clippy::too_many_arguments)]
    fn conv1d(
        &self,
        s: ferrite_arch::ConvShape,
        slot: usize,
        x: &Self::Buf,
        w: Self::Vector<'_>,
        bias: Option<Self::Vector<'_>>,
        segs: &mut [Segment<'_, Self::Kv>],
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// The gated delta rule over each segment's rows, token by token, from the matrices in
    /// state slot `slot` (after the convolution's part), which keep the result. Per row,
    /// `qkv` holds the convolved queries and keys (`s.k_heads × s.k_dim` each) and values
    /// (`s.v_heads × s.v_dim`); `beta` and `alpha` one logit per value head. Value head `h`
    /// reads key head `h / (v_heads / k_heads)`: with `q`, `k` L2-normalised (ε 1e-6) and
    /// `q` scaled by `1/sqrt(k_dim)`, `g = exp(a[h] · softplus(alpha + dt_bias[h]))` and
    /// `b = sigmoid(beta)`, the matrix `S` (`k_dim × v_dim`) becomes `S' = g·S +
    /// k ⊗ b·(v - (g·S)ᵀk)` and the row's output is `S'ᵀq` (`v_dim` values) into `out`.
    #[allow(clippy::too_many_arguments)]
    fn delta_rule(
        &self,
        s: &ferrite_arch::DeltaNetShape,
        slot: usize,
        qkv: &Self::Buf,
        gates: (&Self::Buf, &Self::Buf),
        decay: (Self::Vector<'_>, Self::Vector<'_>),
        segs: &mut [Segment<'_, Self::Kv>],
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// The Mamba-2 selective scan over each segment's rows, token by token (its step form,
    /// so that a chunk and the same rows one at a time leave the same state), from the
    /// matrices in state slot `slot` (after the convolution's `(conv_kernel - 1) ×
    /// conv_channels` values), which keep the result. Per row, `xbc` holds the
    /// `s.conv_channels()` convolved values: `x` (`n_heads × head_dim`), then every group's
    /// B, then every group's C (`n_groups × d_state` each); `dt` one raw time step per head.
    /// `params` holds `a`, `d` and `dt_bias`, `n_heads` values each (`a = -exp(A_log)`),
    /// and the floor `dt_min`. Head `h` reads group `g = h / (n_heads / n_groups)` and
    /// keeps the matrix `S` (`head_dim × d_state`, row-major): with `δ =
    /// max(softplus(dt[h] + dt_bias[h]), dt_min)` (softplus `x` itself past 20) and `dA =
    /// exp(δ · a[h])`, `S[p][n] = S[p][n] · dA + δ · x[h][p] · B[g][n]`, and the
    /// row's output is `out[h][p] = Σ_n S[p][n] · C[g][n] + d[h] · x[h][p]` (`s.inner()`
    /// values a row).
    #[allow(clippy::too_many_arguments)]
    fn ssm_scan(
        &self,
        s: &ferrite_arch::Mamba2Shape,
        slot: usize,
        xbc: &Self::Buf,
        dt: &Self::Buf,
        params: SsmParams<Self::Vector<'_>>,
        segs: &mut [Segment<'_, Self::Kv>],
        out: &mut Self::Buf,
    ) -> Result<()>;

    // ---- positions, KV store, attention ----

    /// Fills `angles` for the rows of `segs` for each rope base of `bases` (the layers'
    /// bases, repeats allowed), for rotations of `rot_dim` values ([`Rope::rot_dim`]).
    fn rope_prepare(
        &self,
        angles: &mut Self::Angles,
        rot_dim: usize,
        bases: &mut dyn Iterator<Item = f32>,
        segs: &[Segment<'_, Self::Kv>],
    ) -> Result<()>;
    /// Rotates each row of `x` (`width` values: whole heads) to its position: row `t` of
    /// the pass belongs to the segment holding it, at `pos0 + t - first row of segment`.
    fn rope(
        &self,
        r: &Rope<Self::Vector<'_>>,
        angles: &Self::Angles,
        x: &mut Self::Buf,
        width: usize,
        segs: &[Segment<'_, Self::Kv>],
    ) -> Result<()>;
    /// Stores each row's key and value (`width` values each) in layer `layer` of its
    /// segment's KV store at its position. A store whose values lie in its keys
    /// ([`Values::InKeys`]) stores the keys only and does not read `v`.
    fn kv_store(
        &self,
        layer: usize,
        k: &Self::Buf,
        v: &Self::Buf,
        width: usize,
        segs: &mut [Segment<'_, Self::Kv>],
    ) -> Result<()>;
    /// [`Backend::rope`] of queries (`q_dim` wide) and keys (`kv_dim` wide), then
    /// [`Backend::kv_store`] of the rotated keys and the values.
    #[allow(clippy::too_many_arguments)]
    fn rope_store(
        &self,
        r: &Rope<Self::Vector<'_>>,
        angles: &Self::Angles,
        layer: usize,
        (q, q_dim): (&mut Self::Buf, usize),
        (k, v, kv_dim): (&mut Self::Buf, &Self::Buf, usize),
        segs: &mut [Segment<'_, Self::Kv>],
    ) -> Result<()> {
        self.rope(r, angles, q, q_dim, segs)?;
        self.rope(r, angles, k, kv_dim, segs)?;
        self.kv_store(layer, k, v, kv_dim, segs)
    }
    /// Attention of each segment's rows (queries `q`, `n_head × head_dim` per row) over
    /// layer `layer` of its own KV store, which already holds its keys and values up to
    /// its last row; writes one `n_head × v` row per query to `out`, `v` the values per
    /// head ([`Values::dim`]). With `sinks` (`n_head` logits), head `h`'s softmax also
    /// holds `sinks[h]` in its denominator, a score with no value (gpt-oss).
    fn attention(
        &self,
        shape: &AttnShape,
        layer: usize,
        q: &Self::Buf,
        sinks: Option<Self::Vector<'_>>,
        segs: &[Segment<'_, Self::Kv>],
        out: &mut Self::Buf,
    ) -> Result<()>;

    // ---- experts and selection ----

    /// Routes the `routing.rows()` tokens of the pass by their router logits (`n_expert`
    /// per row, in `logits`) under `rule` with the selection `bias`, and groups them by
    /// expert ([`Routing::route`], [`Routing::group`]).
    fn moe_route(
        &self,
        logits: &Self::Buf,
        routing: &mut Routing,
        rule: &RouteRule,
        bias: Option<&[f32]>,
    ) -> Result<()>;
    /// The gated FFN of each expert over the rows routed to it (`experts(e)` gives expert
    /// `e`'s gate, up and down matrices and their biases), and each token's weighted sum of
    /// its experts' outputs in slot order, into `out` (`rows × d_model`).
    #[allow(clippy::too_many_arguments)]
    fn moe_experts<'w>(
        &self,
        x: &Self::Buf,
        routing: &Routing,
        experts: &dyn Fn(usize) -> ExpertFfn<Self::Weight<'w>, Self::Vector<'w>>,
        act: Act,
        bufs: &mut ExpertBufs<Self::Buf>,
        out: &mut Self::Buf,
    ) -> Result<()>
    where
        Self: 'w;
    /// The `out.len()` largest values of row `row` of `logits` (`n_vocab` per row) with
    /// their ids, largest first, ties to the lower id.
    fn top_k(
        &self,
        logits: &Self::Buf,
        row: usize,
        n_vocab: usize,
        out: &mut [(u32, f32)],
    ) -> Result<()>;
}

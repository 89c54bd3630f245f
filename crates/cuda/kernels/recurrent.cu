// The recurrent layers of hybrid models on f32 activations and f32 state: the causal
// depthwise convolution at the head of a gated DeltaNet (Qwen3-Next) or a Mamba-2 mixer
// (Nemotron-H), the gated delta rule, the Mamba-2 selective scan, and the small ops beside
// them (sigmoid gate, row gate, gated norm, grouped norm, squared ReLU).
//
// The recurrences run in their step form, row after row, inside one launch per segment of a
// pass: a chunk of rows and the same rows one launch each do the same arithmetic on the same
// f32 state, so they leave the same bits. Every sum runs in one fixed order (per thread, or
// block_sum over a block size fixed by the layer's shape), so a segment's results do not
// depend on the other segments of its pass. `fresh` (the segment starts at position 0) reads
// the incoming state as zero.

static __device__ __forceinline__ float rec_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

static __device__ __forceinline__ float rec_silu(float v) { return v / (1.0f + expf(-v)); }

// ln(1 + e^v), v itself past 20 (where the two agree in f32), as torch computes it.
static __device__ __forceinline__ float rec_softplus(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

// g[i] = sigmoid(g[i]) * u[i] (Qwen3-Next's attention output gate).
extern "C" __global__ void gate_sigmoid_f32(float* g, const float* __restrict__ u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    g[i] = rec_sigmoid(g[i]) * u[i];
}

// x[r][i] *= sigmoid(g[r]) over n values in rows of `width` (the shared expert's gate).
extern "C" __global__ void row_gate_f32(float* x, const float* __restrict__ g, int width, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] *= rec_sigmoid(g[i / width]);
}

// x = rms_norm(x) * w * silu(z), one block per row of `dim` values (the DeltaNet's output
// norm, one row per value head).
extern "C" __global__ void gated_norm_f32(float* x, const float* __restrict__ z,
                                          const float* __restrict__ w, int dim, float eps) {
    __shared__ float red[32];
    float* xr = x + (unsigned long long)blockIdx.x * dim;
    const float* zr = z + (unsigned long long)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = xr[i] * inv * w[i] * rec_silu(zr[i]);
}

// RMS normalisation of each run of `group` values on its own, one block per group; rows
// of `width` values take the weight w[i mod width] (Mamba-2's output norm).
extern "C" __global__ void group_norm_f32(float* x, const float* __restrict__ w, int width,
                                          int group, float eps) {
    __shared__ float red[32];
    int per_row = width / group;
    float* xg = x + (unsigned long long)blockIdx.x * group;
    const float* wg = w + (unsigned long long)(blockIdx.x % per_row) * group;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss += xg[i] * xg[i];
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / (float)group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) xg[i] = xg[i] * inv * wg[i];
}

// x = max(x, 0)^2; a NaN stays NaN, as in torch.
extern "C" __global__ void relu_sq_f32(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    x[i] = v < 0.0f ? 0.0f : v * v;
}

// The causal convolution of one segment, one thread per channel: row t of `rows` gets
// silu(bias[ch] + sum_j w[ch][j] * in[t - (k-1) + j]), where rows before the segment's
// first are the `k - 1` previous inputs in `state` (oldest first, `c` values each); then
// `state` keeps the last `k - 1` rows of [state; x]. Without a bias the sum alone goes into
// the SiLU (no + 0, which would turn a -0 into +0).
template <bool BIAS>
static __device__ __forceinline__ void conv1d(const float* __restrict__ x,
                                              const float* __restrict__ w,
                                              const float* __restrict__ bias, float* state,
                                              float* __restrict__ out, int rows, int c, int k,
                                              int fresh) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c) return;
    int hist = k - 1;
    const float* wc = w + (unsigned long long)ch * k;
    for (int t = 0; t < rows; t++) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = t + j;
            float in = r < hist ? (fresh ? 0.0f : state[(unsigned long long)r * c + ch])
                                : x[(unsigned long long)(r - hist) * c + ch];
            acc += wc[j] * in;
        }
        if (BIAS) acc += bias[ch];
        out[(unsigned long long)t * c + ch] = rec_silu(acc);
    }
    // New row j is row rows + j of [state; x]: a later row than j, so the old state rows
    // it reads are not yet overwritten (rows >= 1).
    for (int j = 0; j < hist; j++) {
        int r = rows + j;
        state[(unsigned long long)j * c + ch] =
            r < hist ? (fresh ? 0.0f : state[(unsigned long long)r * c + ch])
                     : x[(unsigned long long)(r - hist) * c + ch];
    }
}

extern "C" __global__ void conv1d_f32(const float* __restrict__ x, const float* __restrict__ w,
                                      float* state, float* __restrict__ out, int rows, int c,
                                      int k, int fresh) {
    conv1d<false>(x, w, nullptr, state, out, rows, c, k, fresh);
}

extern "C" __global__ void conv1d_bias_f32(const float* __restrict__ x,
                                           const float* __restrict__ w,
                                           const float* __restrict__ bias, float* state,
                                           float* __restrict__ out, int rows, int c, int k,
                                           int fresh) {
    conv1d<true>(x, w, bias, state, out, rows, c, k, fresh);
}

// The gated delta rule of one segment, one block per value head h (blockDim a multiple of
// 32), token by token. Row t of `qkv` holds the queries and keys (k_heads x dk each), then
// the values (v_heads x dv); beta and alpha one logit per value head. `state` holds the
// heads' matrices S (dk x dv, row-major), head after head. Dynamic shared memory: 2 * dk
// floats (the row's normalised q and k). Thread j owns column j of S, so the update needs
// no other thread's values: S' = g*S + k (x) b*(v - (g*S)^T k), out = S'^T q.
extern "C" __global__ void delta_rule_f32(const float* __restrict__ qkv,
                                          const float* __restrict__ beta,
                                          const float* __restrict__ alpha,
                                          const float* __restrict__ a,
                                          const float* __restrict__ dt_bias, float* state,
                                          float* __restrict__ out, int rows, int k_heads,
                                          int v_heads, int dk, int dv, int fresh) {
    extern __shared__ float qk[];
    __shared__ float red[32];
    float* q = qk;
    float* kk = qk + dk;
    int h = blockIdx.x;
    int kh = h / (v_heads / k_heads);
    int c = 2 * k_heads * dk + v_heads * dv;
    float* m = state + (unsigned long long)h * dk * dv;
    float scale = 1.0f / sqrtf((float)dk);
    if (fresh)
        for (int i = threadIdx.x; i < dk * dv; i += blockDim.x) m[i] = 0.0f;
    for (int t = 0; t < rows; t++) {
        const float* row = qkv + (unsigned long long)t * c;
        // The previous row's reads of q and k (and the zeroing above) are done.
        __syncthreads();
        float sq = 0.0f, sk = 0.0f;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            float qv = row[kh * dk + i], kv = row[(k_heads + kh) * dk + i];
            q[i] = qv;
            kk[i] = kv;
            sq += qv * qv;
            sk += kv * kv;
        }
        sq = block_sum(sq, red);
        sk = block_sum(sk, red);
        float iq = 1.0f / sqrtf(sq + 1e-6f) * scale;
        float ik = 1.0f / sqrtf(sk + 1e-6f);
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            q[i] *= iq;
            kk[i] *= ik;
        }
        __syncthreads();
        unsigned long long gi = (unsigned long long)t * v_heads + h;
        float g = expf(a[h] * rec_softplus(alpha[gi] + dt_bias[h]));
        float b = rec_sigmoid(beta[gi]);
        const float* v = row + 2 * k_heads * dk + h * dv;
        float* o = out + gi * dv;
        for (int j = threadIdx.x; j < dv; j += blockDim.x) {
            float mem = 0.0f;
            for (int i = 0; i < dk; i++) {
                float s = m[i * dv + j] * g;
                m[i * dv + j] = s;
                mem += s * kk[i];
            }
            float d = (v[j] - mem) * b;
            float y = 0.0f;
            for (int i = 0; i < dk; i++) {
                float s = m[i * dv + j] + kk[i] * d;
                m[i * dv + j] = s;
                y += s * q[i];
            }
            o[j] = y;
        }
    }
}

// The Mamba-2 selective scan of one segment, one block per head h, token by token. Row t of
// `xbc` holds x (n_heads x head_dim), every group's B, then every group's C (n_groups x
// d_state each); dt one raw time step per head. `state` holds the heads' matrices S
// (head_dim x d_state, row-major), head after head. Thread p owns row p of S:
// S[p][n] = S[p][n] * exp(delta * a) + delta * x[p] * B[n], out[p] = sum_n S[p][n] * C[n]
// + d * x[p], with delta = max(softplus(dt + dt_bias), dt_min).
extern "C" __global__ void ssm_scan_f32(const float* __restrict__ xbc,
                                        const float* __restrict__ dt,
                                        const float* __restrict__ a, const float* __restrict__ d,
                                        const float* __restrict__ dt_bias, float* state,
                                        float* __restrict__ out, int rows, int n_heads,
                                        int head_dim, int n_groups, int d_state, float dt_min,
                                        int fresh) {
    int h = blockIdx.x;
    int g = h / (n_heads / n_groups);
    int inner = n_heads * head_dim;
    int c = inner + 2 * n_groups * d_state;
    float* m = state + (unsigned long long)h * head_dim * d_state;
    for (int p = threadIdx.x; p < head_dim; p += blockDim.x) {
        float* sp = m + (unsigned long long)p * d_state;
        if (fresh)
            for (int n = 0; n < d_state; n++) sp[n] = 0.0f;
        for (int t = 0; t < rows; t++) {
            const float* row = xbc + (unsigned long long)t * c;
            const float* bg = row + inner + g * d_state;
            const float* cg = row + inner + (n_groups + g) * d_state;
            float delta = rec_softplus(dt[(unsigned long long)t * n_heads + h] + dt_bias[h]);
            // Not fmaxf, which would turn a NaN step into the floor.
            if (delta < dt_min) delta = dt_min;
            float da = expf(delta * a[h]);
            float xp = row[h * head_dim + p];
            float dx = delta * xp;
            float y = 0.0f;
            for (int n = 0; n < d_state; n++) {
                float s = sp[n] * da + dx * bg[n];
                sp[n] = s;
                y += s * cg[n];
            }
            out[(unsigned long long)t * inner + h * head_dim + p] = y + d[h] * xp;
        }
    }
}

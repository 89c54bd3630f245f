// Element-wise and per-row operations of the forward pass, all on f32 activations:
// RMSNorm, rope (interleaved and half-split pairs), gated activations, residual add and the
// f16 KV-cache store.

// RMSNorm of `n` rows of `dim` values, one block per row; in place allowed (x == y).
extern "C" __global__ void rms_norm_f32(const float* x, const float* __restrict__ w,
                                        float* y, int dim, float eps) {
    __shared__ float red[32];
    const float* xr = x + (unsigned long long)blockIdx.x * dim;
    float* yr = y + (unsigned long long)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// Rope over `n_heads` heads of `head_dim` at position `pos`: pair (2i, 2i+1) when
// `half_split` is 0 (llama GGUF layout), (i, i + head_dim/2) otherwise (NeoX / Gemma).
// Angles are formed in double so long positions keep their precision.
extern "C" __global__ void rope_f32(float* x, int n_heads, int head_dim, int pos, float base,
                                    int half_split) {
    int half = head_dim / 2;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_heads * half) return;
    int h = t / half, i = t % half;
    double inv_freq = pow((double)base, -(double)(2 * i) / (double)head_dim);
    double ang = (double)pos * inv_freq;
    float s = (float)sin(ang), c = (float)cos(ang);
    int a = half_split ? i : 2 * i;
    int b = half_split ? i + half : 2 * i + 1;
    float* hx = x + (unsigned long long)h * head_dim;
    float x0 = hx[a], x1 = hx[b];
    hx[a] = x0 * c - x1 * s;
    hx[b] = x0 * s + x1 * c;
}

// g[i] = silu(g[i]) * u[i]
extern "C" __global__ void gate_silu_f32(float* g, const float* __restrict__ u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = g[i];
    g[i] = v / (1.0f + expf(-v)) * u[i];
}

// g[i] = gelu_tanh(g[i]) * u[i]
extern "C" __global__ void gate_gelu_f32(float* g, const float* __restrict__ u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = g[i];
    float t = tanhf(0.7978845608f * (v + 0.044715f * v * v * v));
    g[i] = 0.5f * v * (1.0f + t) * u[i];
}

// x[i] += y[i]
extern "C" __global__ void add_f32(float* x, const float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// Rounds one token's keys and values to f16 into row `pos` of this layer's caches.
extern "C" __global__ void kv_store_f16(const float* __restrict__ k,
                                        const float* __restrict__ v, u16* kc, u16* vc,
                                        int kv_dim, int pos) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    unsigned long long at = (unsigned long long)pos * kv_dim + i;
    kc[at] = f2h(k[i]);
    vc[at] = f2h(v[i]);
}

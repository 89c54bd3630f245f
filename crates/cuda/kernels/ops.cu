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
// Angles are formed in double so long positions keep their precision. With `factors`
// (rot_dim/2 frequency divisors: Llama 3, YaRN, LongRoPE; null otherwise) pair i turns by
// pos * base^(-2i/rot_dim) / factors[i], as rope_store does.
extern "C" __global__ void rope_f32(float* x, int n_heads, int head_dim, int rot_dim, int pos,
                                    float base, int half_split,
                                    const float* __restrict__ factors) {
    int half = rot_dim / 2;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_heads * half) return;
    int h = t / half, i = t % half;
    double inv_freq = pow((double)base, -(double)(2 * i) / (double)rot_dim);
    if (factors) inv_freq /= (double)factors[i];
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
    g[i] = gated(g[i], u[i], 0);
}

// g[i] = gelu_tanh(g[i]) * u[i]
extern "C" __global__ void gate_gelu_f32(float* g, const float* __restrict__ u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    g[i] = gated(g[i], u[i], 1);
}

// g[i] = clamped SwiGLU of g[i] and u[i] (gpt-oss; see gated)
extern "C" __global__ void gate_swiglu_oai_f32(float* g, const float* __restrict__ u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    g[i] = gated(g[i], u[i], 2);
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
    if (vc) vc[at] = f2h(v[i]);
}

// Values per thread of residual_norm_f32 (its rows are at most this × 1024 wide; three
// arrays of them fit the 64 registers a thread of a 1024-thread block has).
#define RN_PER_THREAD 8

// The end of a sub-layer, one block per token row: optionally RMS-normalise the sub-layer
// output `o` with `post_w` (Gemma's post norms, when has_post), add it to the residual `x`,
// then write the next pre-norm `xn = rms_norm(x) * next_w`. Rows of `dim` values. With
// `xq` (not null: one row, dim a multiple of 32) xn is also written as int8 blocks in
// `planes` planes for the _i8/_i8x2 products (matvec_i8.cu): a warp's 32 consecutive values
// are one block.
extern "C" __global__ void __launch_bounds__(1024) residual_norm_f32(float* x, float* o, const float* post_w,
                                             int has_post, const float* __restrict__ next_w,
                                             float* xn, int dim, float eps,
                                             u8* __restrict__ xq, int planes) {
    // The inputs are read into registers at once (RN_PER_THREAD values per thread), so the
    // kernel waits on memory once instead of once per pass (twice with post norms); the
    // launch keeps dim within RN_PER_THREAD × blockDim.
    __shared__ float red[32];
    unsigned long long base = (unsigned long long)blockIdx.x * dim;
    x += base;
    o += base;
    xn += base;
    float xv[RN_PER_THREAD], ov[RN_PER_THREAD], nw[RN_PER_THREAD];
#pragma unroll
    for (int k = 0; k < RN_PER_THREAD; k++) {
        int i = threadIdx.x + k * blockDim.x;
        bool in = i < dim;
        xv[k] = in ? x[i] : 0.0f;
        ov[k] = in ? o[i] : 0.0f;
        nw[k] = in ? next_w[i] : 0.0f;
    }
    if (has_post) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < RN_PER_THREAD; k++) ss += ov[k] * ov[k];
        ss = block_sum(ss, red);
        float inv = rsqrtf(ss / (float)dim + eps);
#pragma unroll
        for (int k = 0; k < RN_PER_THREAD; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < dim) xv[k] += ov[k] * inv * post_w[i];
        }
    } else {
#pragma unroll
        for (int k = 0; k < RN_PER_THREAD; k++) xv[k] += ov[k];
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RN_PER_THREAD; k++) ss += xv[k] * xv[k];
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < RN_PER_THREAD; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < dim) {
            float v = xv[k] * inv * nw[k];
            x[i] = xv[k];
            xn[i] = v;
            if (xq) q8_block(v, xq, dim, i >> 5, planes);
        }
    }
}

// Rope of the query heads and key heads of token `tok` at position tp[1] + tok (the
// kernels pass blockIdx.y),
// plus the f16 store of its rotated keys and its values into that row of the caches, in one
// launch. Threads 0..(nq+nk)*half rotate one pair each; threads 0..kv_dim also store one
// value (and the key value when it lies past the rotated part). q, k and v hold one row per
// token. Partial rotary turns the first `rot_dim` values of each head as a head of
// `rot_dim` would turn (pairs and frequencies of that size) and passes the others through.
// With `factors` (Llama 3 rope scaling, rot_dim/2 divisors; null otherwise) pair i turns by
// pos * base^(-2i/rot_dim) / factors[i], in double as ferrite_model's rope_scaled does.
static __device__ __forceinline__ void rope_store(float* q, float* k, const float* __restrict__ v,
                                                  u16* kc, u16* vc, int n_head, int n_kv_head,
                                                  int head_dim, int rot_dim,
                                                  const int* __restrict__ tp, float base,
                                                  int half_split,
                                                  const float* __restrict__ factors, int tok) {
    int pos = tp[1] + tok;
    int half = rot_dim / 2;
    int kv_dim = n_kv_head * head_dim;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    q += (unsigned long long)tok * n_head * head_dim;
    k += (unsigned long long)tok * kv_dim;
    v += (unsigned long long)tok * kv_dim;
    unsigned long long row = (unsigned long long)pos * kv_dim;
    if (t < kv_dim) {
        vc[row + t] = f2h(v[t]);
        // A value no pair turns: stored as it is (no thread writes it).
        if (t % head_dim >= rot_dim) kc[row + t] = f2h(k[t]);
    }
    if (t >= (n_head + n_kv_head) * half) return;
    int h = t / half, i = t % half;
    double inv_freq = pow((double)base, -(double)(2 * i) / (double)rot_dim);
    if (factors) inv_freq /= (double)factors[i];
    double ang = (double)pos * inv_freq;
    float s = (float)sin(ang), c = (float)cos(ang);
    int a = half_split ? i : 2 * i;
    int b = half_split ? i + half : 2 * i + 1;
    bool is_k = h >= n_head;
    float* hx = is_k ? k + (unsigned long long)(h - n_head) * head_dim
                     : q + (unsigned long long)h * head_dim;
    float x0 = hx[a], x1 = hx[b];
    float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    hx[a] = y0;
    hx[b] = y1;
    if (is_k) {
        unsigned long long at = row + (unsigned long long)(h - n_head) * head_dim;
        kc[at + a] = f2h(y0);
        kc[at + b] = f2h(y1);
    }
}

// rope_store with plain frequencies.
extern "C" __global__ void rope_store_f16(float* q, float* k, const float* __restrict__ v,
                                          u16* kc, u16* vc, int n_head, int n_kv_head,
                                          int head_dim, int rot_dim, const int* __restrict__ tp,
                                          float base, int half_split) {
    rope_store(q, k, v, kc, vc, n_head, n_kv_head, head_dim, rot_dim, tp, base, half_split,
               nullptr, blockIdx.y);
}

// rope_store with Llama 3 frequency divisors.
extern "C" __global__ void rope_store_scaled_f16(float* q, float* k, const float* __restrict__ v,
                                                 u16* kc, u16* vc, int n_head, int n_kv_head,
                                                 int head_dim, int rot_dim,
                                                 const int* __restrict__ tp, float base,
                                                 int half_split,
                                                 const float* __restrict__ factors) {
    rope_store(q, k, v, kc, vc, n_head, n_kv_head, head_dim, rot_dim, tp, base, half_split,
               factors, blockIdx.y);
}

// f32 activations rounded to f16 (the GEMM inputs of batched prefill).
extern "C" __global__ void f32_to_f16(const float* __restrict__ x, u16* __restrict__ y,
                                      unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2h(x[i]);
}

// Greedy choice over one logits row: out[0] = the index of the largest value in IEEE total
// order (as Rust's f32::total_cmp: -0 < +0), ties to the lowest index; out[1] = the first
// NaN's index, or -1; out[2] = the bits of the chosen value's log-probability
// log(exp(x_i) / Σ exp(x_j)), summed in f64 as the CPU sampler does. A (key, ~index) pair
// packed in 64 bits makes one max reduction pick both.
static __device__ __forceinline__ unsigned long long shfl_max_u64(unsigned long long v, int o) {
    u32 lo = __shfl_xor_sync(0xffffffffu, (u32)v, o);
    u32 hi = __shfl_xor_sync(0xffffffffu, (u32)(v >> 32), o);
    unsigned long long w = ((unsigned long long)hi << 32) | lo;
    return w > v ? w : v;
}

// Each of the grid's blocks takes a contiguous slice of the row: its best key, first NaN,
// the largest value m_b and Σ exp(x - m_b) over the slice, all written to its record in
// `out` (8 words from word 4 + 8·block: key, NaN index, pad, m_b as f64, the sum as f64).
// The last block to arrive (counted in out[3], which it resets) combines the records:
// Σ_b sum_b · exp(m_b - M) is the row's sum relative to its largest value M, so the
// chosen value's log-probability is -log of it. The f64 exponentials, the costly part,
// are spread over the grid instead of one block.
static __device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
    int k = __float_as_int(v);
    k ^= (int)((u32)(k >> 31) >> 1);
    return ((unsigned long long)((u32)k ^ 0x80000000u) << 32) | (u32)(0xffffffffu - (u32)i);
}

struct argmax_rec {
    unsigned long long key;
    int nan;
    int pad;
    double m;
    double sum;
};

extern "C" __global__ void argmax_f32(const float* __restrict__ x, int n, int* __restrict__ out) {
    __shared__ unsigned long long best[32];
    __shared__ int nan_at[32];
    __shared__ double sums[32];
    __shared__ int last;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int per = (n + gridDim.x - 1) / gridDim.x;
    int lo = min(n, (int)blockIdx.x * per), hi = min(n, lo + per);
    unsigned long long b = 0;
    int nan = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = x[i];
        if (isnan(v)) nan = min(nan, i);
        else {
            unsigned long long k = argmax_key(v, i);
            b = k > b ? k : b;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        b = shfl_max_u64(b, o);
        nan = min(nan, __shfl_xor_sync(0xffffffffu, nan, o));
    }
    if (lane == 0) {
        best[w] = b;
        nan_at[w] = nan;
    }
    __syncthreads();
    b = lane < nw ? best[lane] : 0;
    nan = lane < nw ? nan_at[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        b = shfl_max_u64(b, o);
        nan = min(nan, __shfl_xor_sync(0xffffffffu, nan, o));
    }
    // b == 0: the slice is empty or all NaN; m = -inf: all its values are -inf. Either way
    // it adds nothing to the sum (a row whose largest value is -inf or +inf gets NaN as
    // before: exp(-inf - -inf) and exp(inf - inf)).
    double m = b == 0 ? 0.0 : (double)x[(int)(0xffffffffu - (u32)b)];
    double s = 0.0;
    if (b != 0 && m != (double)FERRITE_NEG_INF) {
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float v = x[i];
            if (!isnan(v)) s += exp((double)v - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __syncthreads();
    if (lane == 0) sums[w] = s;
    __syncthreads();
    argmax_rec* rec = (argmax_rec*)(out + 4);
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int j = 0; j < nw; j++) t += sums[j];
        argmax_rec r;
        r.key = b;
        r.nan = nan;
        r.pad = 0;
        r.m = m;
        r.sum = t;
        rec[blockIdx.x] = r;
        // The grid-barrier pattern: the record is visible before the count says so.
        __threadfence();
        unsigned int prev = atomicAdd((unsigned int*)&out[3], 1u);
        last = prev == gridDim.x - 1;
        if (last) {
            out[3] = 0;
            __threadfence();
        }
    }
    __syncthreads();
    if (!last || w != 0) return;
    unsigned long long kb = 0;
    int nb = 0x7fffffff;
    double mx = __longlong_as_double(0xfff0000000000000ll);
    for (int j = lane; j < gridDim.x; j += 32) {
        unsigned long long k = __ldcg(&rec[j].key);
        kb = k > kb ? k : kb;
        nb = min(nb, __ldcg(&rec[j].nan));
        if (k != 0) mx = fmax(mx, __ldcg(&rec[j].m));
    }
    for (int o = 16; o > 0; o >>= 1) {
        kb = shfl_max_u64(kb, o);
        nb = min(nb, __shfl_xor_sync(0xffffffffu, nb, o));
        mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    double t = 0.0;
    for (int j = lane; j < gridDim.x; j += 32) {
        if (__ldcg(&rec[j].key) != 0) t += __ldcg(&rec[j].sum) * exp(__ldcg(&rec[j].m) - mx);
    }
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (lane == 0) {
        int idx = (int)(0xffffffffu - (u32)kb);
        if (kb == 0 || idx < 0 || idx >= n) idx = 0;
        out[0] = idx;
        out[1] = nb == 0x7fffffff ? -1 : nb;
        out[2] = __float_as_int((float)(-log(t)));
    }
}

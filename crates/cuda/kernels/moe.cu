// Architecture extras of the forward pass: q/k/v and output biases (Qwen 2), and the
// mixture-of-experts FFN (Mixtral, Qwen3-MoE). Follows matvec.cu in the program, whose
// per-type unit dot products (unit_<type>, xload_<type>) the expert kernels reuse.
//
// MoE routing never leaves the device, so a decode step stays one CUDA graph: the router
// logits (matvec_rows_<type>), then moe_route picks each token's experts into `sel` and
// their weights into `wts`; the expert kernels read `sel` to find the selected experts'
// matrices inside the stacked tensor. Only those experts' bytes are read. Long prompts
// instead group their (token, slot) pairs by expert on the host and run one cuBLAS GEMM per
// used expert (moe_gather_f16 before, moe_combine after).

// Adds the q, k and v biases to `n` token rows of q (qd values each), k and v (kvd each).
extern "C" __global__ void qkv_bias_f32(float* q, float* k, float* v,
                                        const float* __restrict__ bq,
                                        const float* __restrict__ bk,
                                        const float* __restrict__ bv, int qd, int kvd, int n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long per = qd + 2 * kvd;
    if (i >= per * n) return;
    long long t = i / per;
    int j = (int)(i - t * per);
    if (j < qd) {
        q[t * qd + j] += bq[j];
    } else if (j < qd + kvd) {
        j -= qd;
        k[t * kvd + j] += bk[j];
    } else {
        j -= qd + kvd;
        v[t * kvd + j] += bv[j];
    }
}

// x[t, j] += b[j] over `n` rows of `dim` values (the attention output bias).
extern "C" __global__ void add_bias_f32(float* x, const float* __restrict__ b, int dim, int n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)dim * n) return;
    x[i] += b[i % dim];
}

// Routing of token blockIdx.x (one warp per token), as ferrite_model's moe::route does it:
// softmax of the router logits in double (exp of the f32 difference to the max, summed in
// expert order), the k largest probabilities (ties to the lower expert id), and their
// weights, renormalised to sum 1 when `norm`. Dynamic shared memory: n_expert doubles.
extern "C" __global__ void moe_route(const float* __restrict__ logits, int* __restrict__ sel,
                                     float* __restrict__ wts, int n_expert, int k, int norm) {
    extern __shared__ double probs[];
    const float* l = logits + (long long)blockIdx.x * n_expert;
    float mx = FERRITE_NEG_INF;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) probs[e] = exp((double)(l[e] - mx));
    __syncwarp();
    if (threadIdx.x != 0) return;
    double sum = 0.0;
    for (int e = 0; e < n_expert; e++) sum += probs[e];
    for (int e = 0; e < n_expert; e++) probs[e] /= sum;
    int* s = sel + (long long)blockIdx.x * k;
    float* w = wts + (long long)blockIdx.x * k;
    double picked = 0.0;
    for (int slot = 0; slot < k; slot++) {
        int best = 0;
        for (int e = 1; e < n_expert; e++)
            if (probs[e] > probs[best]) best = e;
        s[slot] = best;
        picked += probs[best];
        // Probabilities are >= 0, so a taken expert is never picked again.
        probs[best] = -1.0;
    }
    double scale = norm ? 1.0 / picked : 1.0;
    // The same operations give the same bits: each picked probability again, unmarked.
    for (int slot = 0; slot < k; slot++)
        w[slot] = (float)(exp((double)(l[s[slot]] - mx)) / sum * scale);
}

// Grouped prefill: row r of `out` (f16) is the normalised row of token order[r] / k, where
// `order` lists the (token, slot) pairs grouped by expert; `rows` pairs of `cols` values.
extern "C" __global__ void moe_gather_f16(const float* __restrict__ xn,
                                          const int* __restrict__ order, u16* __restrict__ out,
                                          int cols, int k, int rows) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    long long r = i / cols;
    int c = (int)(i - r * cols);
    out[i] = f2h(xn[(long long)(order[r] / k) * cols + c]);
}

// Row r < rows of out = row order[r] / k of xn (`cols` f32 values each): the token rows of
// one expert's (token, slot) pairs, for the contract's expert products.
extern "C" __global__ void moe_gather_f32(const float* __restrict__ xn,
                                          const int* __restrict__ order, float* __restrict__ out,
                                          int cols, int k, int rows) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    long long r = i / cols;
    int c = (int)(i - r * cols);
    out[i] = xn[(long long)(order[r] / k) * cols + c];
}

// Grouped prefill's end: out[t, c] = sum over slots s (in order) of
// wts[t*k+s] * ys[pos[t*k+s], c], where pos is the grouped row of each pair; `n` tokens.
extern "C" __global__ void moe_combine(const float* __restrict__ ys, const int* __restrict__ pos,
                                       const float* __restrict__ wts, float* __restrict__ out,
                                       int cols, int k, int n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * cols) return;
    long long t = i / cols;
    int c = (int)(i - t * cols);
    float acc = 0.0f;
    for (int s = 0; s < k; s++) {
        long long p = t * k + s;
        acc += wts[p] * ys[(long long)pos[p] * cols + c];
    }
    out[i] = acc;
}

#define FERRITE_MOE(NAME, SH)                                                              \
    /* y[t, r] = W[r,:] . x[t,:] for token t = blockIdx.y: the router logits of several    \
       tokens in f32 (prefill's f16 GEMMs could flip a near-tie of the routing). One warp  \
       per row, four rows per block. */                                                    \
    extern "C" __global__ void matvec_rows_##NAME(const u8* __restrict__ w,                \
                                                  const float* __restrict__ x,             \
                                                  float* __restrict__ y, int rows, int cols,\
                                                  unsigned long long row_bytes) {          \
        int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int lane = threadIdx.x & 31;                                                       \
        if (row >= rows) return;                                                           \
        const float* xr = x + (unsigned long long)blockIdx.y * cols;                       \
        const u8* r = w + (unsigned long long)row * row_bytes;                             \
        float acc = 0.0f;                                                                  \
        int units = cols >> SH;                                                            \
        for (int u = lane; u < units; u += 32) acc += unit_##NAME(r, u, xload_##NAME(xr, 0, u));\
        acc = warp_sum(acc);                                                               \
        if (lane == 0) y[(unsigned long long)blockIdx.y * rows + row] = acc;               \
    }                                                                                      \
    /* Gated input of the selected experts: pair p = blockIdx.y (token p / k, slot p % k)  \
       uses expert sel[p] of the stacks wg, wu (expert_bytes apart):                       \
       y[p, r] = act(Wg[r,:].x[t]) * (Wu[r,:].x[t]). One warp per row. */                  \
    extern "C" __global__ void moe_gated_##NAME(                                           \
        const u8* __restrict__ wg, const u8* __restrict__ wu, const float* __restrict__ x, \
        float* __restrict__ y, const int* __restrict__ sel, int rows, int cols,            \
        unsigned long long row_bytes, unsigned long long expert_bytes, int act, int k) {   \
        int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int lane = threadIdx.x & 31;                                                       \
        if (row >= rows) return;                                                           \
        int p = blockIdx.y;                                                                \
        const float* xr = x + (unsigned long long)(p / k) * cols;                          \
        unsigned long long o = (unsigned long long)sel[p] * expert_bytes +                 \
                               (unsigned long long)row * row_bytes;                        \
        float g = 0.0f, up = 0.0f;                                                         \
        int units = cols >> SH;                                                            \
        for (int u = lane; u < units; u += 32) {                                           \
            xv_##NAME xv = xload_##NAME(xr, 0, u);                                            \
            g += unit_##NAME(wg + o, u, xv);                                               \
            up += unit_##NAME(wu + o, u, xv);                                              \
        }                                                                                  \
        g = warp_sum(g);                                                                   \
        up = warp_sum(up);                                                                 \
        if (lane == 0) y[(unsigned long long)p * rows + row] = gated(g, up, act);          \
    }                                                                                      \
    /* Down products of token t = blockIdx.y's k experts, weighted and summed in slot      \
       order: y[t, r] = sum_s wts[t,s] * (W_sel[t,s][r,:] . x[t*k+s]). One warp per row. */\
    extern "C" __global__ void moe_down_##NAME(                                            \
        const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,      \
        const int* __restrict__ sel, const float* __restrict__ wts, int rows, int cols,    \
        unsigned long long row_bytes, unsigned long long expert_bytes, int k) {            \
        int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int lane = threadIdx.x & 31;                                                       \
        if (row >= rows) return;                                                           \
        int t = blockIdx.y;                                                                \
        int units = cols >> SH;                                                            \
        float out = 0.0f;                                                                  \
        for (int s = 0; s < k; s++) {                                                      \
            int p = t * k + s;                                                             \
            const float* xr = x + (unsigned long long)p * cols;                            \
            const u8* r = w + (unsigned long long)sel[p] * expert_bytes +                  \
                          (unsigned long long)row * row_bytes;                             \
            float acc = 0.0f;                                                              \
            for (int u = lane; u < units; u += 32) acc += unit_##NAME(r, u, xload_##NAME(xr, 0, u));\
            out += wts[p] * warp_sum(acc);                                                 \
        }                                                                                  \
        if (lane == 0) y[(unsigned long long)t * rows + row] = out;                        \
    }

FERRITE_MOE(q4_1, 5)
FERRITE_MOE(q8_0, 5)
FERRITE_MOE(q4_0, 5)
FERRITE_MOE(q5_0, 5)
FERRITE_MOE(q4_k, 6)
FERRITE_MOE(q6_k, 5)
FERRITE_MOE(f32, 5)
FERRITE_MOE(f16, 5)
FERRITE_MOE(bf16, 5)

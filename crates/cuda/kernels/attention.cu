// Attention over an f16 KV cache, for decode (one query, keys split across blocks:
// flash-decoding) and for prefill (many queries, causal). Queries are `nq` consecutive
// tokens at positions pos0.. with pos0 = tp[1] (read from device memory so that a captured
// graph serves every decode step); query i attends to cached positions lo..=pos0+i, lo =
// pos0+i+1-window for sliding-window layers (window > 0), else 0.
//
// Grid: x = group of `hpb` query heads (all n_rep heads of a KV head when they fit the
// block, else a divisor of n_rep), y = tile of `qt` queries, z = key split. One block
// handles its query heads, which share KV head g, for its queries ("rows" = query × head),
// so every key and value it loads serves all of them (GQA). Values are `vd` values of each
// head's value row from `v_at` on: a head's own row of `vc` (v_at 0, vd = hd), or MLA's
// latent inside the key row (vc = kc, values after the rope part). Keys go in tiles of
// ATT_TK with an online softmax; the block's key range is split z of `splits` equal chunks
// (at least `min_chunk` keys) of the keys its queries can see. With one split the
// normalised output is written straight to `out`; with several, each block writes
// (acc[vd], max, sum) to `part` and attn_combine merges them. Scores are soft-capped when
// softcap > 0 (Gemma 2); with `sinks` (one logit per query head, gpt-oss; null otherwise)
// each head's softmax holds its sink in the denominator, folded in where the output is
// normalised.
//
// Dynamic shared memory: q (rows × head_dim), acc (rows × vd), probabilities (rows ×
// ATT_TK), and per row the running max, sum and rescale factor.
#define ATT_TK 32

static __device__ __forceinline__ float dot_f16_row(const float* __restrict__ qs,
                                                    const u16* __restrict__ kr, int hd) {
    const uint4* k4 = (const uint4*)kr;
    const float4* q4 = (const float4*)qs;
    float s = 0.0f;
    for (int c = 0; c < (hd >> 3); c++) {
        uint4 w = k4[c];
        float4 a = q4[2 * c], b = q4[2 * c + 1];
        s += a.x * h2f((u16)(w.x & 0xffffu)) + a.y * h2f((u16)(w.x >> 16)) +
             a.z * h2f((u16)(w.y & 0xffffu)) + a.w * h2f((u16)(w.y >> 16)) +
             b.x * h2f((u16)(w.z & 0xffffu)) + b.y * h2f((u16)(w.z >> 16)) +
             b.z * h2f((u16)(w.w & 0xffffu)) + b.w * h2f((u16)(w.w >> 16));
    }
    return s;
}

// The work of block (g, tile, split) of attn_f16 (also run by batch.cu's battn_f16, one
// session per grid row).
static __device__ __forceinline__ void attn_f16_block(
    const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
    float* __restrict__ out, float* __restrict__ part, int n_head, int n_kv_head, int hd,
    int hpb, int vd, int v_at, const int* __restrict__ tp, int nq, int qt, int window,
    float scale, int splits, int min_chunk, float softcap, const float* __restrict__ sinks,
    int blk, int tile, int split) {
    extern __shared__ float4 sm4[];
    float* sm = (float*)sm4;
    int h0 = blk * hpb;
    int g = h0 / (n_head / n_kv_head);
    int q0 = tile * qt;
    int nqb = min(qt, nq - q0);
    int rows = nqb * hpb;
    int cap = qt * hpb;
    int kv_dim = n_kv_head * hd;
    float* qs = sm;
    float* acc = qs + cap * hd;
    float* ps = acc + cap * vd;
    float* ms = ps + cap * ATT_TK;
    float* ls = ms + cap;
    float* al = ls + cap;
    int pos0 = tp[1];
    int first = pos0 + q0, last = pos0 + q0 + nqb - 1;
    int lo = (window > 0 && first + 1 > window) ? first + 1 - window : 0;
    int hi = last + 1;
    int chunk = max((hi - lo + splits - 1) / splits, min_chunk);
    int s_lo = lo + split * chunk;
    int s_hi = min(hi, s_lo + chunk);
    // A decode split past the visible keys does no work; its partials are marked empty
    // (attn_combine does not read them; battn_combine, which reads every split, skips them).
    if (nq == 1 && splits > 1 && s_lo >= s_hi) {
        for (int r = threadIdx.x; r < hpb; r += blockDim.x) {
            unsigned long long qh = (unsigned long long)h0 + r;
            part[(qh * splits + split) * (unsigned long long)(vd + 2) + vd] = FERRITE_NEG_INF;
        }
        return;
    }
    for (int i = threadIdx.x; i < rows * hd; i += blockDim.x) {
        int row = i / hd, d = i - row * hd;
        int qi = row / hpb, h = h0 + (row - qi * hpb);
        qs[i] = q[((unsigned long long)(q0 + qi) * n_head + h) * hd + d] * scale;
    }
    for (int i = threadIdx.x; i < rows * vd; i += blockDim.x) acc[i] = 0.0f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        ms[r] = FERRITE_NEG_INF;
        ls[r] = 0.0f;
    }
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int t0 = s_lo; t0 < s_hi; t0 += ATT_TK) {
        for (int i = threadIdx.x; i < rows * ATT_TK; i += blockDim.x) {
            int row = i / ATT_TK, j = t0 + (i - row * ATT_TK);
            int p = first + row / hpb;
            float s = FERRITE_NEG_INF;
            if (j < s_hi && j <= p && (window <= 0 || j > p - window))
                s = soft_cap(
                    dot_f16_row(qs + row * hd, kc + (unsigned long long)j * kv_dim + g * hd, hd),
                    softcap);
            ps[i] = s;
        }
        __syncthreads();
        for (int row = warp; row < rows; row += nwarps) {
            float s = ps[row * ATT_TK + lane];
            float m_old = ms[row];
            float m_new = fmaxf(m_old, warp_max(s));
            float p = (s == FERRITE_NEG_INF) ? 0.0f : expf(s - m_new);
            float a = (m_old == FERRITE_NEG_INF) ? 0.0f : expf(m_old - m_new);
            float sum = warp_sum(p);
            ps[row * ATT_TK + lane] = p;
            // Every lane has read ms[row] before lane 0 replaces it: the shuffles above
            // exchange values but do not order shared-memory accesses between lanes.
            __syncwarp();
            if (lane == 0) {
                ms[row] = m_new;
                ls[row] = ls[row] * a + sum;
                al[row] = a;
            }
        }
        __syncthreads();
        int nt = min(ATT_TK, s_hi - t0);
        for (int i = threadIdx.x; i < rows * vd; i += blockDim.x) {
            int row = i / vd, d = i - row * vd;
            const float* pr = ps + row * ATT_TK;
            const u16* vp = vc + (unsigned long long)t0 * kv_dim + g * hd + v_at + d;
            float a = acc[i] * al[row];
            for (int t = 0; t < nt; t++) a += pr[t] * h2f(vp[(unsigned long long)t * kv_dim]);
            acc[i] = a;
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < rows * vd; i += blockDim.x) {
        int row = i / vd, d = i - row * vd;
        int qi = row / hpb, h = h0 + (row - qi * hpb);
        unsigned long long qh = (unsigned long long)(q0 + qi) * n_head + h;
        if (splits == 1) {
            out[qh * vd + d] = acc[i] * attn_out_scale(ms[row], ls[row], sinks, h);
        } else {
            float* pp = part + (qh * splits + split) * (unsigned long long)(vd + 2);
            pp[d] = acc[i];
            if (d == 0) {
                pp[vd] = ms[row];
                pp[vd + 1] = ls[row];
            }
        }
    }
}

extern "C" __global__ void attn_f16(const float* __restrict__ q, const u16* __restrict__ kc,
                                    const u16* __restrict__ vc, float* __restrict__ out,
                                    float* __restrict__ part, int n_head, int n_kv_head,
                                    int hd, int hpb, int vd, int v_at,
                                    const int* __restrict__ tp, int nq, int qt, int window,
                                    float scale, int splits, int min_chunk, float softcap,
                                    const float* __restrict__ sinks) {
    attn_f16_block(q, kc, vc, out, part, n_head, n_kv_head, hd, hpb, vd, v_at, tp, nq, qt,
                   window, scale, splits, min_chunk, softcap, sinks, blockIdx.x, blockIdx.y,
                   blockIdx.z);
}

// Merges the first `ns` of the `splits` partial results of attn_f16 for (query, head) pair
// `qh` (query head `head`, whose sink logit `sinks` holds when not null), threads over
// head_dim; partials marked empty (max -inf) count for nothing. With xq
// (blockDim.x == hd, hd a multiple of 32; null otherwise) the output is also quantized to
// int8 blocks of the `n_out` outputs there (q8_block, the standalone quantizer's rounding).
static __device__ __forceinline__ void attn_combine_pair(const float* __restrict__ part,
                                                         float* __restrict__ out, int hd,
                                                         int splits, int ns,
                                                         unsigned long long qh,
                                                         u8* __restrict__ xq, int planes,
                                                         int n_out,
                                                         const float* __restrict__ sinks,
                                                         int head) {
    const float* p = part + qh * splits * (hd + 2);
    float m = FERRITE_NEG_INF;
    for (int s = 0; s < ns; s++) m = fmaxf(m, p[s * (hd + 2) + hd]);
    float l = 0.0f;
    for (int s = 0; s < ns; s++) {
        float ms = p[s * (hd + 2) + hd];
        if (ms != FERRITE_NEG_INF) l += p[s * (hd + 2) + hd + 1] * expf(ms - m);
    }
    float inv = attn_out_scale(m, l, sinks, head);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < ns; s++) {
            float ms = p[s * (hd + 2) + hd];
            if (ms != FERRITE_NEG_INF) a += p[s * (hd + 2) + d] * expf(ms - m);
        }
        float o = a * inv;
        out[qh * hd + d] = o;
        if (xq) q8_block(o, xq, n_out, (int)((qh * hd + d) >> 5), planes);
    }
}

// attn_combine_pair over every (query, head) pair: one block per pair, pair b being head
// b % n_head of its query (whose sink logit `sinks` holds when not null). With one query
// (decode) only the splits that hold keys at position tp[1] are read (attn_f16's chunking:
// ceil(n / chunk) of them), so short contexts merge one partial, not `splits`. xq: see
// attn_combine_pair (one query only).
extern "C" __global__ void attn_combine(const float* __restrict__ part, float* __restrict__ out,
                                        int hd, int splits, const int* __restrict__ tp,
                                        int window, int min_chunk, int nq,
                                        u8* __restrict__ xq, int planes, int n_head,
                                        const float* __restrict__ sinks) {
    int ns = splits;
    if (nq == 1) {
        int pos = tp[1];
        int lo = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
        int n = pos + 1 - lo;
        int chunk = max((n + splits - 1) / splits, min_chunk);
        ns = min(splits, (n + chunk - 1) / chunk);
    }
    attn_combine_pair(part, out, hd, splits, ns, blockIdx.x, xq, planes, gridDim.x * hd, sinks,
                      blockIdx.x % n_head);
}

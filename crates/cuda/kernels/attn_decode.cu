// Decode attention (one query per head, at position tp[1]) over an f16 KV cache, with the
// split merge and the int8 quantization of the output in the same launch.
//
// Grid: x = KV head g, y = key split z. The visible keys lo..=pos (lo from the sliding
// window) are cut into ns = min(splits, ceil(n / ATTD_MIN_KEYS)) equal chunks, ns computed
// from tp[1] so one captured graph serves every position; blocks z >= ns exit at once.
// Each of the ATTD_WARPS warps of a block takes 32-key tiles of the chunk in turn: lane l
// scores key t0 + l against the n_rep query heads of g (the whole key row per lane: 16-byte
// loads, q broadcast from shared memory), the warp updates its online softmax, then every
// lane accumulates its DPL dimensions of the 32 value rows (coalesced rows, the
// probabilities passed by shuffle). The V rows of a tile are prefetched into L2 when its
// keys are loaded. The warps merge in shared memory; with one split the block writes the
// output, else its partial (acc, max, sum) to `part`, and the last block of head g to
// arrive (counted in cnt[g], which it resets) merges all ns partials (splits <=
// ATTD_MAX_SPLITS). The block that
// writes the output also quantizes it to int8 blocks (q8_block, the standalone quantizer's
// rounding) when xq is not null; head_dim is a multiple of 32, so blocks never straddle
// heads.
#define ATTD_WARPS 4
#define ATTD_MAX_REP 8
#define ATTD_MIN_KEYS (32 * ATTD_WARPS)
#define ATTD_MAX_SPLITS 128

template <int DPL>
struct attd_v {
    float f[DPL];
};

// DPL f16 values of one value row at `p` (DPL × 2 bytes, aligned to that).
template <int DPL>
static __device__ __forceinline__ attd_v<DPL> attd_load_v(const u16* __restrict__ p) {
    attd_v<DPL> r;
    if (DPL == 2) {
        u32 w = *(const u32*)p;
        r.f[0] = h2f((u16)(w & 0xffffu));
        r.f[1] = h2f((u16)(w >> 16));
    } else {
#pragma unroll
        for (int c = 0; c < DPL / 4; c++) {
            uint2 w = ((const uint2*)p)[c];
            r.f[4 * c] = h2f((u16)(w.x & 0xffffu));
            r.f[4 * c + 1] = h2f((u16)(w.x >> 16));
            r.f[4 * c + 2] = h2f((u16)(w.y & 0xffffu));
            r.f[4 * c + 3] = h2f((u16)(w.y >> 16));
        }
    }
    return r;
}

template <int DPL>
static __device__ __forceinline__ void attn_decode(
    const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
    float* __restrict__ out, float* __restrict__ part, unsigned int* __restrict__ cnt,
    u8* __restrict__ xq, int planes, int n_head, int n_kv_head, const int* __restrict__ tp,
    int window, float scale, int splits) {
    const int HD = 32 * DPL;
    __shared__ float4 qs4[ATTD_MAX_REP * HD / 4];
    __shared__ float wm[ATTD_WARPS][ATTD_MAX_REP], wl[ATTD_WARPS][ATTD_MAX_REP];
    __shared__ float wacc[ATTD_WARPS][ATTD_MAX_REP * HD];
    __shared__ int last;
    int n_rep = n_head / n_kv_head;
    int g = blockIdx.x, z = blockIdx.y;
    int kv_dim = n_kv_head * HD;
    int pos = tp[1];
    int lo = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    int n = pos + 1 - lo;
    int ns = min(splits, (n + ATTD_MIN_KEYS - 1) / ATTD_MIN_KEYS);
    if (z >= ns) return;
    int chunk = (n + ns - 1) / ns;
    int s_lo = lo + z * chunk, s_hi = min(pos + 1, s_lo + chunk);
    for (int i = threadIdx.x; i < n_rep * HD; i += blockDim.x)
        ((float*)qs4)[i] = q[(unsigned long long)g * n_rep * HD + i] * scale;
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float m[ATTD_MAX_REP], l[ATTD_MAX_REP], acc[ATTD_MAX_REP][DPL];
#pragma unroll
    for (int r = 0; r < ATTD_MAX_REP; r++) {
        m[r] = FERRITE_NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[r][k] = 0.0f;
    }
    const u16* kbase = kc + g * HD;
    const u16* vbase = vc + g * HD + lane * DPL;
    for (int t0 = s_lo + 32 * warp; t0 < s_hi; t0 += 32 * ATTD_WARPS) {
        int j = t0 + lane;
        bool valid = j < s_hi;
        float s[ATTD_MAX_REP];
#pragma unroll
        for (int r = 0; r < ATTD_MAX_REP; r++) s[r] = 0.0f;
        if (valid) {
            const u16* vrow = vc + (unsigned long long)j * kv_dim + g * HD;
#pragma unroll
            for (int c = 0; c < HD * 2; c += 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"((const u8*)vrow + c));
            const uint4* k4 = (const uint4*)(kbase + (unsigned long long)j * kv_dim);
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                uint4 w = k4[c];
                float kf[8] = {h2f((u16)(w.x & 0xffffu)), h2f((u16)(w.x >> 16)),
                               h2f((u16)(w.y & 0xffffu)), h2f((u16)(w.y >> 16)),
                               h2f((u16)(w.z & 0xffffu)), h2f((u16)(w.z >> 16)),
                               h2f((u16)(w.w & 0xffffu)), h2f((u16)(w.w >> 16))};
#pragma unroll
                for (int r = 0; r < ATTD_MAX_REP; r++) {
                    if (r < n_rep) {
                        float4 a = qs4[(r * HD >> 2) + 2 * c], b = qs4[(r * HD >> 2) + 2 * c + 1];
                        s[r] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] +
                                b.x * kf[4] + b.y * kf[5] + b.z * kf[6] + b.w * kf[7];
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ATTD_MAX_REP; r++) {
            if (r < n_rep) {
                float sv = valid ? s[r] : FERRITE_NEG_INF;
                float m_new = fmaxf(m[r], warp_max(sv));
                float p = valid ? expf(sv - m_new) : 0.0f;
                float a = (m[r] == FERRITE_NEG_INF) ? 0.0f : expf(m[r] - m_new);
                l[r] = l[r] * a + warp_sum(p);
                m[r] = m_new;
#pragma unroll
                for (int k = 0; k < DPL; k++) acc[r][k] *= a;
                s[r] = p;
            }
        }
        int nt = min(32, s_hi - t0);
        const u16* vp = vbase + (unsigned long long)t0 * kv_dim;
#pragma unroll 8
        for (int t = 0; t < nt; t++) {
            attd_v<DPL> v = attd_load_v<DPL>(vp + (unsigned long long)t * kv_dim);
#pragma unroll
            for (int r = 0; r < ATTD_MAX_REP; r++) {
                if (r < n_rep) {
                    float p = __shfl_sync(0xffffffffu, s[r], t);
#pragma unroll
                    for (int k = 0; k < DPL; k++) acc[r][k] += p * v.f[k];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATTD_MAX_REP; r++) {
        if (r < n_rep) {
            if (lane == 0) {
                wm[warp][r] = m[r];
                wl[warp][r] = l[r];
            }
#pragma unroll
            for (int k = 0; k < DPL; k++) wacc[warp][r * HD + lane * DPL + k] = acc[r][k];
        }
    }
    __syncthreads();
    // The block's merged result; with one split it is the output (kept in wacc[0] for the
    // quantizer), else this split's partial.
    for (int i = threadIdx.x; i < n_rep * HD; i += blockDim.x) {
        int r = i / HD, d = i - r * HD;
        float mx = FERRITE_NEG_INF;
#pragma unroll
        for (int w = 0; w < ATTD_WARPS; w++) mx = fmaxf(mx, wm[w][r]);
        float sum = 0.0f, a = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTD_WARPS; w++) {
            if (wm[w][r] != FERRITE_NEG_INF) {
                float e = expf(wm[w][r] - mx);
                sum += wl[w][r] * e;
                a += wacc[w][i] * e;
            }
        }
        int h = g * n_rep + r;
        if (ns == 1) {
            float o = sum > 0.0f ? a / sum : 0.0f;
            out[(unsigned long long)h * HD + d] = o;
            wacc[0][i] = o;
        } else {
            float* pp = part + ((unsigned long long)h * splits + z) * (HD + 2);
            pp[d] = a;
            if (d == 0) {
                pp[HD] = mx;
                pp[HD + 1] = sum;
            }
        }
    }
    if (ns > 1) {
        // Publish the partial: bar.sync orders the block's writes before thread 0's fence
        // and count (the grid-barrier pattern); the last split to arrive merges them all,
        // reading the partials from L2.
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            unsigned int prev = atomicAdd(&cnt[g], 1u);
            last = prev == (unsigned int)(ns - 1);
            if (last) {
                cnt[g] = 0u;
                __threadfence();
            }
        }
        __syncthreads();
        if (!last) return;
        __shared__ float sw[ATTD_MAX_REP][ATTD_MAX_SPLITS];
        const float* pg = part + (unsigned long long)g * n_rep * splits * (HD + 2);
        for (int i = threadIdx.x; i < n_rep * ns; i += blockDim.x) {
            int r = i / ns, sp = i - r * ns;
            sw[r][sp] = __ldcg(pg + ((unsigned long long)r * splits + sp) * (HD + 2) + HD);
        }
        __syncthreads();
        // One warp per query head: each split's weight e^(m_s - M) / L.
        for (int r = warp; r < n_rep; r += ATTD_WARPS) {
            const float* pr = pg + (unsigned long long)r * splits * (HD + 2);
            float mx = FERRITE_NEG_INF;
            for (int sp = lane; sp < ns; sp += 32) mx = fmaxf(mx, sw[r][sp]);
            mx = warp_max(mx);
            float sum = 0.0f;
            for (int sp = lane; sp < ns; sp += 32) {
                float ms = sw[r][sp];
                float e = ms == FERRITE_NEG_INF ? 0.0f : expf(ms - mx);
                sum += __ldcg(pr + sp * (HD + 2) + HD + 1) * e;
                sw[r][sp] = e;
            }
            sum = warp_sum(sum);
            float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            for (int sp = lane; sp < ns; sp += 32) sw[r][sp] *= inv;
        }
        __syncthreads();
        // Two dimensions per thread, the splits' loads independent (unrolled).
        for (int i = threadIdx.x; i < n_rep * HD / 2; i += blockDim.x) {
            int r = i / (HD / 2), d = 2 * (i - r * (HD / 2));
            const float* pr = pg + (unsigned long long)r * splits * (HD + 2) + d;
            float ax = 0.0f, ay = 0.0f;
#pragma unroll 8
            for (int sp = 0; sp < ns; sp++) {
                float2 v = __ldcg((const float2*)(pr + sp * (HD + 2)));
                ax += sw[r][sp] * v.x;
                ay += sw[r][sp] * v.y;
            }
            unsigned long long o = (unsigned long long)(g * n_rep + r) * HD + d;
            out[o] = ax;
            out[o + 1] = ay;
            wacc[0][r * HD + d] = ax;
            wacc[0][r * HD + d + 1] = ay;
        }
    }
    if (!xq) return;
    __syncthreads();
    int blocks = n_rep * DPL;
    for (int b = warp; b < blocks; b += ATTD_WARPS)
        q8_block(wacc[0][(b << 5) + lane], xq, n_head * HD, g * blocks + b, planes);
}

#define FERRITE_ATTN_DECODE(HDIM, DPL)                                                     \
    extern "C" __global__ void __launch_bounds__(32 * ATTD_WARPS)                          \
        attn_decode_f16_##HDIM(const float* __restrict__ q, const u16* __restrict__ kc,    \
                               const u16* __restrict__ vc, float* __restrict__ out,        \
                               float* __restrict__ part, unsigned int* __restrict__ cnt,   \
                               u8* __restrict__ xq, int planes, int n_head, int n_kv_head, \
                               const int* __restrict__ tp, int window, float scale,        \
                               int splits) {                                               \
        attn_decode<DPL>(q, kc, vc, out, part, cnt, xq, planes, n_head, n_kv_head, tp,     \
                         window, scale, splits);                                           \
    }

FERRITE_ATTN_DECODE(64, 2)
FERRITE_ATTN_DECODE(128, 4)
FERRITE_ATTN_DECODE(256, 8)

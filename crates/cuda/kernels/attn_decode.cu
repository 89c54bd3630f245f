// Decode attention (one query per head, at position tp[1]) over an f16 KV cache, with the
// split merge and the int8 quantization of the output in the same launch.
//
// Grid: x = query head h (KV head h / n_rep), y = key split z. One query head per block
// keeps the per-thread state small and puts n_rep times more blocks in flight than one
// block per KV head would; the heads of a group read the same key and value rows, which
// their neighbouring blocks find in L2. The visible keys lo..=pos (lo from the sliding
// window) are cut into ns = min(splits, ceil(n / ATTD_MIN_KEYS)) equal chunks, ns computed
// from tp[1] so one captured graph serves every position; blocks z >= ns exit at once.
//
// Each of the ATTD_WARPS warps of a block takes 32-key tiles of the chunk in turn. Scores:
// every warp load reads whole key rows, LPR lanes × 16 bytes per row, so a load touches a
// few cache lines (one lane per row would touch 32, and the L1 serves lines one at a
// time); each lane dots its 8 dimensions with the query values it holds in registers, the
// row's lanes sum by shuffles, and lane j ends up with key t0 + j's score. The warp updates
// its online softmax, then every lane accumulates its DPL dimensions of the 32 value rows
// (coalesced rows, all loads of a tile issued before their use, the probabilities passed by
// shuffle; rows past the chunk are read from its last row with probability 0). The V rows
// of a tile are prefetched into L2 when its keys are loaded. The warps merge in shared
// memory; with one split the block writes the output, else its partial (acc, max, sum) to
// `part`, and the last block of head h to arrive (counted in cnt[h], which it resets)
// merges the ns partials, each thread folding every split into its dimension (online
// rescaling, the splits' loads independent). The block that writes the output also
// quantizes it to int8 blocks (q8_block, the standalone quantizer's rounding) when xq is
// not null; head_dim is a multiple of 32, so blocks never straddle heads. Scores are
// soft-capped when softcap > 0 (Gemma 2); a sink logit per query head (gpt-oss; `sinks`
// null otherwise) joins the softmax's denominator where the output is normalised.
#define ATTD_WARPS 4
#define ATTD_MIN_KEYS (32 * ATTD_WARPS)
#define ATTD_MAX_SPLITS 128

// Splits whose partials one merging thread loads together.
#define ATTD_MERGE_BATCH 8

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

// Eight f16 key values (one 16-byte word) against eight query values.
static __device__ __forceinline__ float attd_dot8(uint4 w, float4 a, float4 b) {
    return a.x * h2f((u16)(w.x & 0xffffu)) + a.y * h2f((u16)(w.x >> 16)) +
           a.z * h2f((u16)(w.y & 0xffffu)) + a.w * h2f((u16)(w.y >> 16)) +
           b.x * h2f((u16)(w.z & 0xffffu)) + b.y * h2f((u16)(w.z >> 16)) +
           b.z * h2f((u16)(w.w & 0xffffu)) + b.w * h2f((u16)(w.w >> 16));
}

// One session's attention: q, out (n_head × head_dim values), the caches, part (n_head ×
// splits partials), cnt (n_head counters) and tp ([token, position]) are that session's;
// its int8 output blocks are xq_blk0 onwards of an xq layout of xq_n values; softcap and
// sinks as described at the top.
template <int DPL>
static __device__ __forceinline__ void attn_decode(
    const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
    float* __restrict__ out, float* __restrict__ part, unsigned int* __restrict__ cnt,
    u8* __restrict__ xq, int xq_n, int xq_blk0, int planes, int n_head, int n_kv_head,
    const int* __restrict__ tp, int window, float scale, int splits, float softcap,
    const float* __restrict__ sinks) {
    const int HD = 32 * DPL;
    // Score loads: lanes per key row, key rows per warp load, warp loads per tile, and how
    // many of those are in flight at once (registers).
    const int LPR = HD / 8, RPI = 32 / LPR, NI = 32 / RPI;
    const int KB = NI < 16 ? NI : 16;
    // Value rows in flight at once.
    const int VB = DPL < 8 ? 32 : 16;
    __shared__ float wm[ATTD_WARPS], wl[ATTD_WARPS];
    __shared__ float wacc[ATTD_WARPS][HD];
    __shared__ int last;
    int h = blockIdx.x, z = blockIdx.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = h / (n_head / n_kv_head);
    int kv_dim = n_kv_head * HD;
    // This lane's eight query dimensions, loaded before the position so that both loads
    // are in flight together.
    int dq = 8 * (lane % LPR);
    const float4* q4 = (const float4*)(q + (unsigned long long)h * HD + dq);
    float4 qa = q4[0], qb = q4[1];
    int pos = tp[1];
    int lo = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    int n = pos + 1 - lo;
    int ns = min(splits, (n + ATTD_MIN_KEYS - 1) / ATTD_MIN_KEYS);
    if (z >= ns) return;
    int chunk = (n + ns - 1) / ns;
    int s_lo = lo + z * chunk, s_hi = min(pos + 1, s_lo + chunk);
    qa.x *= scale; qa.y *= scale; qa.z *= scale; qa.w *= scale;
    qb.x *= scale; qb.y *= scale; qb.z *= scale; qb.w *= scale;
    float m = FERRITE_NEG_INF, l = 0.0f, acc[DPL];
#pragma unroll
    for (int k = 0; k < DPL; k++) acc[k] = 0.0f;
    const u16* kbase = kc + g * HD + dq;
    const u16* vbase = vc + g * HD + lane * DPL;
    for (int t0 = s_lo + 32 * warp; t0 < s_hi; t0 += 32 * ATTD_WARPS) {
        int j = t0 + lane;
        bool valid = j < s_hi;
        if (valid) {
            const u8* vrow = (const u8*)(vc + (unsigned long long)j * kv_dim + g * HD);
#pragma unroll
            for (int c = 0; c < HD * 2; c += 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(vrow + c));
        }
        float s = 0.0f;
#pragma unroll
        for (int i0 = 0; i0 < NI; i0 += KB) {
            uint4 kw[KB];
#pragma unroll
            for (int i = 0; i < KB; i++) {
                int row = t0 + (i0 + i) * RPI + lane / LPR;
                kw[i] = row < s_hi
                            ? *(const uint4*)(kbase + (unsigned long long)row * kv_dim)
                            : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int i = 0; i < KB; i++) {
                float p = attd_dot8(kw[i], qa, qb);
#pragma unroll
                for (int o = LPR / 2; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffffu, p, o);
                float v = __shfl_sync(0xffffffffu, p, (lane % RPI) * LPR);
                if (lane / RPI == i0 + i) s = v;
            }
        }
        float sv = valid ? soft_cap(s, softcap) : FERRITE_NEG_INF;
        float m_new = fmaxf(m, warp_max(sv));
        float p = valid ? expf(sv - m_new) : 0.0f;
        float a = (m == FERRITE_NEG_INF) ? 0.0f : expf(m - m_new);
        l = l * a + warp_sum(p);
        m = m_new;
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[k] *= a;
#pragma unroll
        for (int tb = 0; tb < 32; tb += VB) {
            attd_v<DPL> v[VB];
#pragma unroll
            for (int t = 0; t < VB; t++) {
                int row = min(t0 + tb + t, s_hi - 1);
                v[t] = attd_load_v<DPL>(vbase + (unsigned long long)row * kv_dim);
            }
#pragma unroll
            for (int t = 0; t < VB; t++) {
                float pt = __shfl_sync(0xffffffffu, p, tb + t);
#pragma unroll
                for (int k = 0; k < DPL; k++) acc[k] += pt * v[t].f[k];
            }
        }
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int k = 0; k < DPL; k++) wacc[warp][lane * DPL + k] = acc[k];
    __syncthreads();
    // The block's merged result; with one split it is the output (kept in wacc[0] for the
    // quantizer), else this split's partial.
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float mx = FERRITE_NEG_INF;
#pragma unroll
        for (int w = 0; w < ATTD_WARPS; w++) mx = fmaxf(mx, wm[w]);
        float sum = 0.0f, av = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTD_WARPS; w++) {
            if (wm[w] != FERRITE_NEG_INF) {
                float e = expf(wm[w] - mx);
                sum += wl[w] * e;
                av += wacc[w][d] * e;
            }
        }
        if (ns == 1) {
            float o = av * attn_out_scale(mx, sum, sinks, h);
            out[(unsigned long long)h * HD + d] = o;
            wacc[0][d] = o;
        } else {
            float* pp = part + ((unsigned long long)h * splits + z) * (HD + 2);
            pp[d] = av;
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
            unsigned int prev = atomicAdd(&cnt[h], 1u);
            last = prev == (unsigned int)(ns - 1);
            if (last) {
                cnt[h] = 0u;
                __threadfence();
            }
        }
        __syncthreads();
        if (!last) return;
        const float* ph = part + (unsigned long long)h * splits * (HD + 2);
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float mx = FERRITE_NEG_INF, sum = 0.0f, av = 0.0f;
            for (int s0 = 0; s0 < ns; s0 += ATTD_MERGE_BATCH) {
                float2 ml[ATTD_MERGE_BATCH];
                float pa[ATTD_MERGE_BATCH];
#pragma unroll
                for (int k = 0; k < ATTD_MERGE_BATCH; k++) {
                    const float* pp = ph + (unsigned long long)min(s0 + k, ns - 1) * (HD + 2);
                    ml[k] = __ldcg((const float2*)(pp + HD));
                    pa[k] = __ldcg(pp + d);
                }
#pragma unroll
                for (int k = 0; k < ATTD_MERGE_BATCH; k++) {
                    if (s0 + k < ns && ml[k].x != FERRITE_NEG_INF) {
                        float m_new = fmaxf(mx, ml[k].x);
                        float c = mx == FERRITE_NEG_INF ? 0.0f : expf(mx - m_new);
                        float e = expf(ml[k].x - m_new);
                        sum = sum * c + ml[k].y * e;
                        av = av * c + pa[k] * e;
                        mx = m_new;
                    }
                }
            }
            float o = av * attn_out_scale(mx, sum, sinks, h);
            out[(unsigned long long)h * HD + d] = o;
            wacc[0][d] = o;
        }
    }
    if (!xq) return;
    __syncthreads();
    for (int b = warp; b < DPL; b += ATTD_WARPS)
        q8_block(wacc[0][(b << 5) + lane], xq, xq_n, xq_blk0 + h * DPL + b, planes);
}

// attn_decode_f16_<head_dim>: one session, with its soft cap and sinks.
// battn_decode_f16_<head_dim> (neither): session s = blockIdx.z of a batch, with its query
// and output columns, its caches (from the tables kt, vt), its [token, position] at
// tps[2s..], its own splits[s] and a region of part (n_head × max_splits partials) and cnt
// (n_head counters) of its own; its int8 output is column s of an xq layout of gridDim.z
// columns. Each session computes exactly what it computes alone.
#define FERRITE_ATTN_DECODE(HDIM, DPL)                                                     \
    extern "C" __global__ void __launch_bounds__(32 * ATTD_WARPS)                          \
        attn_decode_f16_##HDIM(const float* __restrict__ q, const u16* __restrict__ kc,    \
                               const u16* __restrict__ vc, float* __restrict__ out,        \
                               float* __restrict__ part, unsigned int* __restrict__ cnt,   \
                               u8* __restrict__ xq, int planes, int n_head, int n_kv_head, \
                               const int* __restrict__ tp, int window, float scale,        \
                               int splits, float softcap,                                  \
                               const float* __restrict__ sinks) {                          \
        attn_decode<DPL>(q, kc, vc, out, part, cnt, xq, n_head * HDIM, 0, planes, n_head,  \
                         n_kv_head, tp, window, scale, splits, softcap, sinks);            \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * ATTD_WARPS) battn_decode_f16_##HDIM( \
        const float* __restrict__ q, const unsigned long long* __restrict__ kt,            \
        const unsigned long long* __restrict__ vt, float* __restrict__ out,                \
        float* __restrict__ part, unsigned int* __restrict__ cnt, u8* __restrict__ xq,     \
        int planes, int n_head, int n_kv_head, const int* __restrict__ tps,                \
        const int* __restrict__ splits, int max_splits, int window, float scale) {         \
        int s = blockIdx.z;                                                                \
        unsigned long long col = (unsigned long long)s * n_head * HDIM;                    \
        attn_decode<DPL>(q + col, (const u16*)kt[s], (const u16*)vt[s], out + col,         \
                         part + (unsigned long long)s * n_head * max_splits * (HDIM + 2),  \
                         cnt + (unsigned long long)s * n_head, xq,                         \
                         (int)gridDim.z * n_head * HDIM, s * n_head * DPL, planes, n_head, \
                         n_kv_head, tps + 2 * s, window, scale, splits[s], 0.0f, nullptr); \
    }

FERRITE_ATTN_DECODE(64, 2)
FERRITE_ATTN_DECODE(128, 4)
FERRITE_ATTN_DECODE(256, 8)

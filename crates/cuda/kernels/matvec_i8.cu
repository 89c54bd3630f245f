// Decode products over int8 activations: x is quantized once per step, in blocks of 32
// values, to q[i] = round(x[i] / d) with d = max|x| / 127 over the block, and each weight
// unit meets it in integer dot products (dp4a: four byte products per instruction), scaled
// once per block. This moves a quarter of the f32 activation bytes and replaces four
// conversions and four FMAs per weight word by one or two integer instructions.
//
// Quantized activation layout (n values, n a multiple of 32, P planes): bytes p·n..(p+1)·n
// hold plane p's int8 values in order; from byte P·n, one float2 per block: (d, d · sum of
// the block's values in units of d). One plane: x' = d·q (8 bits). Two planes (the _i8x2
// kernels): x' = d·(q + q2/256), the second plane holding the rounding error of the first at
// a 256th of its scale (about 15 bits per block, closer to x than f16 is). The block sum
// serves the weight formats with an offset (Q4_1's m, Q4_K's mins). The result equals the
// exact product with x', up to f32 rounding of the per-block scaling and the row sum.

static __device__ __forceinline__ int dp4a(u32 a, u32 b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Quantizes the 32-value block `blk` held one value per lane of a warp (all lanes active)
// into `xq` (the layout above, n values). With two planes the rounding error r = x - d·q is
// quantized again at a 256th of the scale into the second plane, so x ≈ d·(q + q2/256).
static __device__ __forceinline__ void q8_block(float v, u8* __restrict__ xq, int n, int blk,
                                                int planes) {
    int lane = threadIdx.x & 31;
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    int q = amax > 0.0f ? (int)rintf(v / d) : 0;
    q = max(-127, min(127, q));
    float s = warp_sum((float)q);
    xq[(blk << 5) + lane] = (u8)(q & 255);
    if (planes > 1) {
        float r = fmaf(-d, (float)q, v);
        int q2 = amax > 0.0f ? (int)rintf(r / (d * 0.00390625f)) : 0;
        q2 = max(-127, min(127, q2));
        s += warp_sum((float)q2) * 0.00390625f;
        xq[n + (blk << 5) + lane] = (u8)(q2 & 255);
    }
    if (lane == 0) {
        float2 ds;
        ds.x = d;
        ds.y = d * s;
        ((float2*)(xq + planes * n))[blk] = ds;
    }
}

// x (n values, n a multiple of 32) to int8 blocks in `planes` (1 or 2) planes, one warp per
// block.
extern "C" __global__ void quantize_q8_f32(const float* __restrict__ x, u8* __restrict__ xq,
                                           int n, int planes) {
    int blk = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if ((blk << 5) >= n) return;
    q8_block(x[(blk << 5) + (threadIdx.x & 31)], xq, n, blk, planes);
}

// The integer sums of the P planes as one float: s0 + s1/256.
template <int P>
static __device__ __forceinline__ float planes_sum(const int* s) {
    float f = (float)s[0];
    if (P > 1) f += (float)s[1] * 0.00390625f;
    return f;
}

// The 32 activations of one block as eight words per plane, with (d, d·sum).
template <int P>
struct xi32 {
    u32 w[P][8];
    float2 ds;
};

template <int P>
static __device__ __forceinline__ xi32<P> xload_i32(const u8* __restrict__ x, int cols, int u) {
    xi32<P> r;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const uint4* q = (const uint4*)(x + p * cols + (u << 5));
        uint4 a = q[0], b = q[1];
        r.w[p][0] = a.x; r.w[p][1] = a.y; r.w[p][2] = a.z; r.w[p][3] = a.w;
        r.w[p][4] = b.x; r.w[p][5] = b.y; r.w[p][6] = b.z; r.w[p][7] = b.w;
    }
    r.ds = ((const float2*)(x + P * cols))[u];
    return r;
}

// Two consecutive blocks (a 64-value Q4_K unit): words of block 2u then 2u+1 per plane, and
// (d0, s0, d1, s1).
template <int P>
struct xi64 {
    u32 w[P][16];
    float4 ds;
};

template <int P>
static __device__ __forceinline__ xi64<P> xload_i64(const u8* __restrict__ x, int cols, int u) {
    xi64<P> r;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const uint4* q = (const uint4*)(x + p * cols + (u << 6));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint4 a = q[k];
            r.w[p][4 * k] = a.x; r.w[p][4 * k + 1] = a.y;
            r.w[p][4 * k + 2] = a.z; r.w[p][4 * k + 3] = a.w;
        }
    }
    r.ds = ((const float4*)(x + P * cols))[u];
    return r;
}

// Q4_1 (20-byte blocks, 4-byte aligned): d·dx·Σq·qx + m·(dx·Σqx). Byte j's low nibble is
// value j, its high nibble value j + 16.
template <int P>
static __device__ __forceinline__ float unit_i8_q4_1(const u8* __restrict__ r, int u,
                                                     const xi32<P>& xv) {
    const u32* b = (const u32*)(r + u * 20);
    u32 dm = b[0];
    int s[P];
#pragma unroll
    for (int p = 0; p < P; p++) s[p] = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 q = b[1 + k];
        u32 lo = q & 0x0f0f0f0fu, hi = (q >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int p = 0; p < P; p++) {
            s[p] = dp4a(lo, xv.w[p][k], s[p]);
            s[p] = dp4a(hi, xv.w[p][4 + k], s[p]);
        }
    }
    float d = h2f((u16)(dm & 0xffffu)), m = h2f((u16)(dm >> 16));
    return d * xv.ds.x * planes_sum<P>(s) + m * xv.ds.y;
}

// Q8_0 (34-byte blocks, 2-byte aligned: half-word loads paired into words).
template <int P>
static __device__ __forceinline__ float unit_i8_q8_0(const u8* __restrict__ r, int u,
                                                     const xi32<P>& xv) {
    const u16* b = (const u16*)(r + u * 34);
    int s[P];
#pragma unroll
    for (int p = 0; p < P; p++) s[p] = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 w = (u32)b[1 + 2 * k] | ((u32)b[2 + 2 * k] << 16);
#pragma unroll
        for (int p = 0; p < P; p++) s[p] = dp4a(w, xv.w[p][k], s[p]);
    }
    return h2f(b[0]) * xv.ds.x * planes_sum<P>(s);
}

// Q4_K unit of 64 values (see unit_q4_k): sub-block 2c from the low nibbles meets
// activation block 2u, sub-block 2c+1 from the high nibbles block 2u+1.
template <int P>
static __device__ __forceinline__ float unit_i8_q4_k(const u8* __restrict__ r, int u,
                                                     const xi64<P>& xv) {
    const u8* b = r + (u >> 2) * 144;
    int c = u & 3;
    const u32* bw = (const u32*)b;
    u32 dm = bw[0], s0 = bw[1], s1 = bw[2], s2 = bw[3];
    float sc0, m0, sc1, m1;
    scale_min_k4(2 * c, s0, s1, s2, &sc0, &m0);
    scale_min_k4(2 * c + 1, s0, s1, s2, &sc1, &m1);
    const uint4* qv = (const uint4*)(b + 16 + 32 * c);
    uint4 A = qv[0], B = qv[1];
    u32 w[8] = {A.x, A.y, A.z, A.w, B.x, B.y, B.z, B.w};
    int sl[P], sh[P];
#pragma unroll
    for (int p = 0; p < P; p++) sl[p] = sh[p] = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 lo = w[k] & 0x0f0f0f0fu, hi = (w[k] >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int p = 0; p < P; p++) {
            sl[p] = dp4a(lo, xv.w[p][k], sl[p]);
            sh[p] = dp4a(hi, xv.w[p][8 + k], sh[p]);
        }
    }
    float d = h2f((u16)(dm & 0xffffu)), dmin = h2f((u16)(dm >> 16));
    return d * (sc0 * xv.ds.x * planes_sum<P>(sl) + sc1 * xv.ds.z * planes_sum<P>(sh)) -
           dmin * (m0 * xv.ds.y + m1 * xv.ds.w);
}

// Q6_K unit of 32 values (see unit_q6_k). The 6-bit values q (0..63, one per byte) become
// the signed bytes q - 32: flipping bit 5 gives q - 32 for q >= 32 and q + 32 otherwise,
// where bits 6 and 7 must then be set too (copies of the new bit 5).
template <int P>
static __device__ __forceinline__ float unit_i8_q6_k(const u8* __restrict__ r, int u,
                                                     const xi32<P>& xv) {
    const u8* b = r + (u >> 3) * 210;
    int c = (u >> 2) & 1, k = u & 3;
    u32 ql[8], qh[8];
    ld8w(b + 64 * c + 32 * (k & 1), ql);
    ld8w(b + 128 + 32 * c, qh);
    u32 lsh = 4u * (u32)(k >> 1), hsh = 2u * (u32)k;
    int s0[P], s1[P];
#pragma unroll
    for (int p = 0; p < P; p++) s0[p] = s1[p] = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        u32 lo = (ql[i] >> lsh) & 0x0f0f0f0fu;
        u32 hi = ((qh[i] >> hsh) & 0x03030303u) << 4;
        u32 t = (lo | hi) ^ 0x20202020u;
        u32 neg = t & 0x20202020u;
        u32 q = t | (neg << 1) | (neg << 2);
#pragma unroll
        for (int p = 0; p < P; p++) {
            if (i < 4) s0[p] = dp4a(q, xv.w[p][i], s0[p]);
            else s1[p] = dp4a(q, xv.w[p][i], s1[p]);
        }
    }
    float sc0 = (float)(signed char)b[192 + 8 * c + 2 * k];
    float sc1 = (float)(signed char)b[193 + 8 * c + 2 * k];
    return h2f(ld16(b + 208)) * xv.ds.x * (sc0 * planes_sum<P>(s0) + sc1 * planes_sum<P>(s1));
}

FERRITE_MATVEC_CORE(i8_q4_1, u8, xi32<1>, xload_i32<1>, unit_i8_q4_1<1>, 5)
FERRITE_MATVEC_CORE(i8_q8_0, u8, xi32<1>, xload_i32<1>, unit_i8_q8_0<1>, 5)
FERRITE_MATVEC_CORE(i8_q4_k, u8, xi64<1>, xload_i64<1>, unit_i8_q4_k<1>, 6)
FERRITE_MATVEC_CORE(i8_q6_k, u8, xi32<1>, xload_i32<1>, unit_i8_q6_k<1>, 5)
FERRITE_MATVEC_CORE(i8x2_q4_1, u8, xi32<2>, xload_i32<2>, unit_i8_q4_1<2>, 5)
FERRITE_MATVEC_CORE(i8x2_q8_0, u8, xi32<2>, xload_i32<2>, unit_i8_q8_0<2>, 5)
FERRITE_MATVEC_CORE(i8x2_q4_k, u8, xi64<2>, xload_i64<2>, unit_i8_q4_k<2>, 6)
FERRITE_MATVEC_CORE(i8x2_q6_k, u8, xi32<2>, xload_i32<2>, unit_i8_q6_k<2>, 5)

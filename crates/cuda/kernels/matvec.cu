// Quantized matrix-vector products for decode: y[r] = W[r,:] . x with W kept in its GGUF
// block layout and dequantized in registers; x and y are f32.
//
// Work split: one warp per row (or a few rows, see matvec_), four warps per 128-thread
// block. A row is cut into units of 32 values (one legacy block, one Q6_K sixteenth-pair)
// or 64 (Q4_K: one 32-byte nibble run of a super-block); lane l takes units l, l+32, ...,
// so a warp reads consecutive blocks of the row together.

// Most rows one warp of matvec_ takes.
#define MV_MAX_ROWS 4
// Element decoders `deq_<type>(row, i)` give value i of a row (used by the embedding
// lookup and the generic unit dot product, whose unrolled loop lets the compiler load each
// block's scales once); the hot SmolLM2 formats have hand-written unit dot products with
// word loads.

// Q4_1: 20 bytes per 32 values: d (f16), m (f16), 16 bytes of nibbles (j low, j+16 high).
static __device__ __forceinline__ float deq_q4_1(const u8* __restrict__ r, int i) {
    const u8* b = r + (i >> 5) * 20;
    int j = i & 31;
    u8 q = (j < 16) ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
    return h2f(ld16(b)) * (float)q + h2f(ld16(b + 2));
}

// Q8_0: 34 bytes per 32 values: d (f16), 32 signed bytes.
static __device__ __forceinline__ float deq_q8_0(const u8* __restrict__ r, int i) {
    const u8* b = r + (i >> 5) * 34;
    return (float)(signed char)b[2 + (i & 31)] * h2f(ld16(b));
}

// Q5_0: 22 bytes per 32 values: d (f16), qh (u32 LE, bit j = fifth bit of value j), nibbles.
static __device__ __forceinline__ float deq_q5_0(const u8* __restrict__ r, int i) {
    const u8* b = r + (i >> 5) * 22;
    int j = i & 31;
    u32 qh = ld32(b + 2);
    u8 lo = (j < 16) ? (b[6 + j] & 15) : (b[6 + j - 16] >> 4);
    int q = (int)(lo | (((qh >> j) & 1) << 4)) - 16;
    return h2f(ld16(b)) * (float)q;
}

// Q4_K: 144 bytes per 256 values: d, dmin (f16), 12 bytes of packed 6-bit scales/mins,
// 128 bytes of nibbles (value 64c+l low nibble of byte 32c+l, 64c+32+l its high nibble).
static __device__ __forceinline__ float deq_q4_k(const u8* __restrict__ r, int i) {
    const u8* b = r + (i >> 8) * 144;
    int e = i & 255, s = e >> 5, l = e & 31;
    const u8* sc = b + 4;
    int scale, mn;
    if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    int c = s >> 1, shift = 4 * (s & 1);
    int q = (b[16 + 32 * c + l] >> shift) & 15;
    return h2f(ld16(b)) * (float)scale * (float)q - h2f(ld16(b + 2)) * (float)mn;
}

// Q6_K: 210 bytes per 256 values: ql[128] low nibbles, qh[64] high 2 bits, 16 signed
// scales, d (f16). x = d * sc * (q - 32).
static __device__ __forceinline__ float deq_q6_k(const u8* __restrict__ r, int i) {
    const u8* b = r + (i >> 8) * 210;
    int e = i & 255, c = e >> 7, t = e & 127;
    int lo = (b[64 * c + (t & 63)] >> (4 * (t >> 6))) & 15;
    int hi = (b[128 + 32 * c + (t & 31)] >> (2 * (t >> 5))) & 3;
    int q = (lo | (hi << 4)) - 32;
    return h2f(ld16(b + 208)) * (float)(signed char)b[192 + (e >> 4)] * (float)q;
}

// Q4_0: 18 bytes per 32 values: d (f16), 16 bytes of nibbles (j low, j+16 high); x = d·(q − 8).
static __device__ __forceinline__ float deq_q4_0(const u8* __restrict__ r, int i) {
    const u8* b = r + (i >> 5) * 18;
    int j = i & 31;
    u8 q = (j < 16) ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
    return h2f(ld16(b)) * (float)((int)q - 8);
}

// BF16: the upper half of an f32.
static __device__ __forceinline__ float deq_bf16(const u8* __restrict__ r, int i) {
    return __int_as_float((int)((u32)ld16(r + 2 * i) << 16));
}

static __device__ __forceinline__ float deq_f32(const u8* __restrict__ r, int i) {
    return __int_as_float((int)ld32(r + 4 * i));
}

static __device__ __forceinline__ float deq_f16(const u8* __restrict__ r, int i) {
    return h2f(ld16(r + 2 * i));
}

// The three decode products of one unit kind: KN names the kernels, x is XT values
// (f32, or int8 blocks for the _i8 kernels of matvec_i8.cu), XLOAD(x, cols, u) loads unit
// u's activations into an XV and UNIT(row, u, xv) is the unit's dot product.
#define FERRITE_MATVEC_CORE(KN, XT, XV, XLOAD, UNIT, SH)                                   \
    /* Each warp takes `nr` (1..MV_MAX_ROWS) consecutive rows: the activation values a     \
       lane loads serve all of them, which matters once L1 traffic for x, not DRAM, is     \
       the limit (wide matrices). `ks` (1, 2 or 4) warps of a block share those rows and   \
       split their units, so matrices with few rows still have enough warps; their sums    \
       meet in shared memory. Rows past the end repeat the last row, unwritten. */         \
    extern "C" __global__ void matvec_##KN(const u8* __restrict__ w,                     \
                                             const XT* __restrict__ x,                     \
                                             float* __restrict__ y, int rows, int cols,    \
                                             unsigned long long row_bytes, int nr, int ks) {\
        __shared__ float red[4][MV_MAX_ROWS];                                              \
        int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int wib = threadIdx.x >> 5;                                                        \
        int lane = threadIdx.x & 31;                                                       \
        int slice = wid % ks;                                                              \
        int row = (wid / ks) * nr;                                                         \
        bool live = row < rows;                                                            \
        const u8* r[MV_MAX_ROWS];                                                          \
        float acc[MV_MAX_ROWS];                                                            \
        _Pragma("unroll") for (int i = 0; i < MV_MAX_ROWS; i++) {                          \
            r[i] = w + (unsigned long long)min(row + min(i, nr - 1), rows - 1) * row_bytes;\
            acc[i] = 0.0f;                                                                 \
        }                                                                                  \
        int units = live ? cols >> SH : 0;                                                 \
        for (int u = lane + 32 * slice; u < units; u += 32 * ks) {                         \
            XV xv = XLOAD(x, cols, u);                                             \
            _Pragma("unroll") for (int i = 0; i < MV_MAX_ROWS; i++) {                      \
                if (i < nr) acc[i] += UNIT(r[i], u, xv);                            \
            }                                                                              \
        }                                                                                  \
        _Pragma("unroll") for (int i = 0; i < MV_MAX_ROWS; i++) {                          \
            if (i < nr) {                                                                  \
                float v = warp_sum(acc[i]);                                                \
                if (lane == 0) red[wib][i] = v;                                            \
            }                                                                              \
        }                                                                                  \
        if (ks > 1) __syncthreads();                                                       \
        if (lane != 0 || slice != 0 || !live) return;                                      \
        _Pragma("unroll") for (int i = 0; i < MV_MAX_ROWS; i++) {                          \
            if (i < nr && row + i < rows) {                                                \
                float v = 0.0f;                                                            \
                for (int j = 0; j < ks; j++) v += red[wib + j][i];                         \
                y[row + i] = v;                                                            \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    /* Up to three matrices of one type and width over the same x (Q, K, V): rows          \
       0..r0 go to y0, the next r1 to y1, the next r2 to y2. One row per warp. */          \
    extern "C" __global__ void matvec3_##KN(                                             \
        const u8* __restrict__ w0, const u8* __restrict__ w1, const u8* __restrict__ w2,   \
        const XT* __restrict__ x, float* __restrict__ y0, float* __restrict__ y1,       \
        float* __restrict__ y2, int r0, int r1, int r2, int cols,                          \
        unsigned long long row_bytes) {                                                    \
        int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int lane = threadIdx.x & 31;                                                       \
        const u8* w;                                                                       \
        float* y;                                                                          \
        if (row < r0) {                                                                    \
            w = w0; y = y0;                                                                \
        } else if (row < r0 + r1) {                                                        \
            row -= r0; w = w1; y = y1;                                                     \
        } else if (row < r0 + r1 + r2) {                                                   \
            row -= r0 + r1; w = w2; y = y2;                                                \
        } else {                                                                           \
            return;                                                                        \
        }                                                                                  \
        const u8* r = w + (unsigned long long)row * row_bytes;                             \
        float acc = 0.0f;                                                                  \
        int units = cols >> SH;                                                            \
        for (int u = lane; u < units; u += 32) acc += UNIT(r, u, XLOAD(x, cols, u));                \
        acc = warp_sum(acc);                                                               \
        if (lane == 0) y[row] = acc;                                                       \
    }                                                                                      \
    /* Gated FFN input: y[r] = act(Wg[r,:].x) * (Wu[r,:].x), act 0 = SiLU, 1 = GELU-tanh.  \
       Each warp takes `nr` (1 or 2) consecutive rows of both matrices. */                 \
    extern "C" __global__ void matvec_gated_##KN(                                        \
        const u8* __restrict__ wg, const u8* __restrict__ wu, const XT* __restrict__ x,    \
        float* __restrict__ y, int rows, int cols, unsigned long long row_bytes, int act,  \
        int nr) {                                                                          \
        int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * nr;                \
        int lane = threadIdx.x & 31;                                                       \
        if (row >= rows) return;                                                           \
        unsigned long long o0 = (unsigned long long)row * row_bytes;                       \
        unsigned long long o1 = (unsigned long long)min(row + nr - 1, rows - 1) * row_bytes;\
        float g0 = 0.0f, u0 = 0.0f, g1 = 0.0f, u1 = 0.0f;                                  \
        int units = cols >> SH;                                                            \
        for (int u = lane; u < units; u += 32) {                                           \
            XV xv = XLOAD(x, cols, u);                                             \
            g0 += UNIT(wg + o0, u, xv);                                              \
            u0 += UNIT(wu + o0, u, xv);                                              \
            if (nr > 1) {                                                                  \
                g1 += UNIT(wg + o1, u, xv);                                          \
                u1 += UNIT(wu + o1, u, xv);                                          \
            }                                                                              \
        }                                                                                  \
        g0 = warp_sum(g0);                                                                 \
        u0 = warp_sum(u0);                                                                 \
        if (lane == 0) y[row] = gated(g0, u0, act);                                        \
        if (nr > 1) {                                                                      \
            g1 = warp_sum(g1);                                                             \
            u1 = warp_sum(u1);                                                             \
            if (lane == 0 && row + 1 < rows) y[row + 1] = gated(g1, u1, act);              \
        }                                                                                  \
    }

// The f32-activation kernels of a weight type, its embedding lookup and f16 dequantization.
#define FERRITE_MATVEC(NAME, DEQ, SH)                                                      \
    FERRITE_MATVEC_CORE(NAME, float, xv_##NAME, xload_##NAME, unit_##NAME, SH)             \
    /* Row tokens[blockIdx.y] into row blockIdx.y of y (decode passes tp, whose first  \
       value is the token, so a captured graph serves every step). */                      \
    extern "C" __global__ void embed_##NAME(const u8* __restrict__ w, float* __restrict__ y, \
                                            const int* __restrict__ tokens, int cols,      \
                                            unsigned long long row_bytes, float scale) {   \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                     \
        int token = tokens[blockIdx.y];                                                    \
        if (i >= cols) return;                                                             \
        y[(unsigned long long)blockIdx.y * cols + i] =                                     \
            DEQ(w + (unsigned long long)token * row_bytes, i) * scale;                     \
    }                                                                                      \
    /* The whole matrix as f16, row-major (the weight operand of prefill GEMMs). */        \
    extern "C" __global__ void dequant_f16_##NAME(const u8* __restrict__ w,                \
                                                  u16* __restrict__ out, int rows, int cols, \
                                                  unsigned long long row_bytes) {          \
        unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;  \
        if (i >= (unsigned long long)rows * cols) return;                                  \
        int r = (int)(i / cols), c = (int)(i - (unsigned long long)r * cols);              \
        out[i] = f2h(DEQ(w + (unsigned long long)r * row_bytes, c));                       \
    }

// Dot product of unit u (values 32u..32u+32) of a row with x, from the element decoder.
#define FERRITE_GENERIC_UNIT(NAME, DEQ)                                                    \
    static __device__ __forceinline__ float unit_##NAME(const u8* __restrict__ r, int u,   \
                                                        const float* __restrict__ x) {     \
        float acc = 0.0f;                                                                  \
        _Pragma("unroll") for (int j = 0; j < 32; j++) {                                   \
            int i = (u << 5) + j;                                                          \
            acc += DEQ(r, i) * x[i];                                                       \
        }                                                                                  \
        return acc;                                                                        \
    }

// Q4_1 unit with word loads: a 20-byte block starts 4-byte aligned (rows are whole blocks
// and device buffers are 256-byte aligned). d·Σq·x + m·Σx.
static __device__ __forceinline__ float unit_q4_1(const u8* __restrict__ r, int u,
                                                  const float* __restrict__ x) {
    const u32* b = (const u32*)(r + u * 20);
    u32 dm = b[0];
    float d = h2f((u16)(dm & 0xffffu)), m = h2f((u16)(dm >> 16));
    const float4* xv = (const float4*)(x + (u << 5));
    float sq = 0.0f, sx = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 q = b[1 + k];
        float4 lo = xv[k], hi = xv[4 + k];
        sq += (float)(q & 15u) * lo.x + (float)((q >> 8) & 15u) * lo.y +
              (float)((q >> 16) & 15u) * lo.z + (float)((q >> 24) & 15u) * lo.w;
        sq += (float)((q >> 4) & 15u) * hi.x + (float)((q >> 12) & 15u) * hi.y +
              (float)((q >> 20) & 15u) * hi.z + (float)(q >> 28) * hi.w;
        sx += (lo.x + lo.y) + (lo.z + lo.w) + (hi.x + hi.y) + (hi.z + hi.w);
    }
    return d * sq + m * sx;
}

// Q8_0 unit with half-word loads: a 34-byte block starts 2-byte aligned.
static __device__ __forceinline__ float unit_q8_0(const u8* __restrict__ r, int u,
                                                  const float* __restrict__ x) {
    const u16* b = (const u16*)(r + u * 34);
    float d = h2f(b[0]);
    const float4* xv = (const float4*)(x + (u << 5));
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u16 a = b[1 + 2 * k], c = b[2 + 2 * k];
        float4 v = xv[k];
        s += (float)(signed char)(a & 0xff) * v.x + (float)(signed char)(a >> 8) * v.y +
             (float)(signed char)(c & 0xff) * v.z + (float)(signed char)(c >> 8) * v.w;
    }
    return d * s;
}


// Q4_K unit of 64 values (u = 4·super-block + c): the 32 nibble bytes at 16 + 32c hold
// sub-block 2c in their low and 2c+1 in their high nibbles. Super-blocks are 144 bytes, so
// they and their nibble area start 16-byte aligned: two uint4 loads.
static __device__ __forceinline__ void scale_min_k4(int j, u32 s0, u32 s1, u32 s2, float* sc,
                                                    float* mn) {
    if (j < 4) {
        *sc = (float)((s0 >> (8 * j)) & 63u);
        *mn = (float)((s1 >> (8 * j)) & 63u);
    } else {
        int k = 8 * (j - 4);
        u32 q8 = (s2 >> k) & 255u;
        *sc = (float)((q8 & 15u) | (((s0 >> k) >> 6 & 3u) << 4));
        *mn = (float)((q8 >> 4) | (((s1 >> k) >> 6 & 3u) << 4));
    }
}

// The 64 activation values of a Q4_K unit, loaded once per warp trip and applied to every
// row the warp takes (registers, not L1, serve the reuse).
struct xv_q4_k {
    float4 v[16];
};

static __device__ __forceinline__ xv_q4_k xload_q4_k(const float* __restrict__ x, int, int u) {
    xv_q4_k r;
    const float4* p = (const float4*)(x + (u << 6));
#pragma unroll
    for (int k = 0; k < 16; k++) r.v[k] = p[k];
    return r;
}

static __device__ __forceinline__ float unit_q4_k(const u8* __restrict__ r, int u,
                                                  const xv_q4_k& xv) {
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
    float sl = 0.0f, sh = 0.0f, xs_l = 0.0f, xs_h = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 q = w[k];
        float4 lo = xv.v[k], hi = xv.v[8 + k];
        sl += (float)(q & 15u) * lo.x + (float)((q >> 8) & 15u) * lo.y +
              (float)((q >> 16) & 15u) * lo.z + (float)((q >> 24) & 15u) * lo.w;
        sh += (float)((q >> 4) & 15u) * hi.x + (float)((q >> 12) & 15u) * hi.y +
              (float)((q >> 20) & 15u) * hi.z + (float)(q >> 28) * hi.w;
        xs_l += (lo.x + lo.y) + (lo.z + lo.w);
        xs_h += (hi.x + hi.y) + (hi.z + hi.w);
    }
    float d = h2f((u16)(dm & 0xffffu)), dmin = h2f((u16)(dm >> 16));
    return d * (sc0 * sl + sc1 * sh) - dmin * (m0 * xs_l + m1 * xs_h);
}

// Eight little-endian words from a 2-byte aligned address: nine aligned loads and funnel
// shifts. Callers guarantee the ninth word lies inside the buffer.
static __device__ __forceinline__ void ld8w(const u8* p, u32* w) {
    const u32* a = (const u32*)((unsigned long long)p & ~3ull);
    u32 sh = (u32)((unsigned long long)p & 3ull) * 8u;
    u32 prev = a[0];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        u32 next = a[i + 1];
        w[i] = __funnelshift_r(prev, next, sh);
        prev = next;
    }
}

// Q6_K unit of 32 values (u = 8·super-block + 4c + k): low nibbles from the 32 ql bytes at
// 64c + 32(k&1) (shifted by 4(k>>1)), two high bits from the 32 qh bytes at 128 + 32c
// (shifted by 2k), scales 192 + 8c + 2k (first 16 values) and the next. Super-blocks are
// 210 bytes (2-byte aligned), so the 32-byte runs come through ld8w; both runs end at
// least 18 bytes before the super-block does.
// The 32 activation values of a Q6_K unit (see xv_q4_k).
struct xv_q6_k {
    float4 v[8];
};

static __device__ __forceinline__ xv_q6_k xload_q6_k(const float* __restrict__ x, int, int u) {
    xv_q6_k r;
    const float4* p = (const float4*)(x + (u << 5));
#pragma unroll
    for (int k = 0; k < 8; k++) r.v[k] = p[k];
    return r;
}

static __device__ __forceinline__ float unit_q6_k(const u8* __restrict__ r, int u,
                                                  const xv_q6_k& xv) {
    const u8* b = r + (u >> 3) * 210;
    int c = (u >> 2) & 1, k = u & 3;
    u32 ql[8], qh[8];
    ld8w(b + 64 * c + 32 * (k & 1), ql);
    ld8w(b + 128 + 32 * c, qh);
    u32 lsh = 4u * (u32)(k >> 1), hsh = 2u * (u32)k;
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        u32 lo = (ql[i] >> lsh) & 0x0f0f0f0fu;
        u32 hi = ((qh[i] >> hsh) & 0x03030303u) << 4;
        u32 q = lo | hi;
        float4 v = xv.v[i];
        s[i >> 2] += (float)((int)(q & 63u) - 32) * v.x + (float)((int)((q >> 8) & 63u) - 32) * v.y +
                     (float)((int)((q >> 16) & 63u) - 32) * v.z + (float)((int)(q >> 24) - 32) * v.w;
    }
    float sc0 = (float)(signed char)b[192 + 8 * c + 2 * k];
    float sc1 = (float)(signed char)b[193 + 8 * c + 2 * k];
    return h2f(ld16(b + 208)) * (sc0 * s[0] + sc1 * s[1]);
}

FERRITE_GENERIC_UNIT(q4_0, deq_q4_0)
FERRITE_GENERIC_UNIT(q5_0, deq_q5_0)
FERRITE_GENERIC_UNIT(f32, deq_f32)
FERRITE_GENERIC_UNIT(f16, deq_f16)
FERRITE_GENERIC_UNIT(bf16, deq_bf16)

// The other types' units read x through the pointer itself.
#define FERRITE_POINTER_X(NAME)                                                            \
    typedef const float* xv_##NAME;                                                        \
    static __device__ __forceinline__ const float* xload_##NAME(const float* x, int, int) {\
        return x;                                                                          \
    }
FERRITE_POINTER_X(q4_1)
FERRITE_POINTER_X(q8_0)
FERRITE_POINTER_X(q4_0)
FERRITE_POINTER_X(q5_0)
FERRITE_POINTER_X(f32)
FERRITE_POINTER_X(f16)
FERRITE_POINTER_X(bf16)

FERRITE_MATVEC(q4_1, deq_q4_1, 5)
FERRITE_MATVEC(q8_0, deq_q8_0, 5)
FERRITE_MATVEC(q4_0, deq_q4_0, 5)
FERRITE_MATVEC(q5_0, deq_q5_0, 5)
FERRITE_MATVEC(q4_k, deq_q4_k, 6)
FERRITE_MATVEC(q6_k, deq_q6_k, 5)
FERRITE_MATVEC(f32, deq_f32, 5)
FERRITE_MATVEC(f16, deq_f16, 5)
FERRITE_MATVEC(bf16, deq_bf16, 5)

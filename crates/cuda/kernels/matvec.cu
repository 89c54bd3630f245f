// Quantized matrix-vector products for decode: y[r] = W[r,:] . x with W kept in its GGUF
// block layout and dequantized in registers; x and y are f32.
//
// Work split: one warp per row, four rows per 128-thread block. A row is cut into units of
// 32 values (one legacy block, or one sub-block of a 256-value k-quant super-block); lane l
// takes units l, l+32, ..., so a warp reads consecutive blocks of the row together.
// Element decoders `deq_<type>(row, i)` give value i of a row; the unrolled unit loop lets
// the compiler load each block's scales once.

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

static __device__ __forceinline__ float deq_f32(const u8* __restrict__ r, int i) {
    return __int_as_float((int)ld32(r + 4 * i));
}

static __device__ __forceinline__ float deq_f16(const u8* __restrict__ r, int i) {
    return h2f(ld16(r + 2 * i));
}

#define FERRITE_MATVEC(NAME, DEQ)                                                          \
    extern "C" __global__ void matvec_##NAME(const u8* __restrict__ w,                     \
                                             const float* __restrict__ x,                  \
                                             float* __restrict__ y, int rows, int cols,    \
                                             unsigned long long row_bytes) {               \
        int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int lane = threadIdx.x & 31;                                                       \
        if (row >= rows) return;                                                           \
        const u8* r = w + (unsigned long long)row * row_bytes;                             \
        float acc = 0.0f;                                                                  \
        int units = cols >> 5;                                                             \
        for (int u = lane; u < units; u += 32) {                                           \
            _Pragma("unroll") for (int j = 0; j < 32; j++) {                               \
                int i = (u << 5) + j;                                                      \
                acc += DEQ(r, i) * x[i];                                                   \
            }                                                                              \
        }                                                                                  \
        acc = warp_sum(acc);                                                               \
        if (lane == 0) y[row] = acc;                                                       \
    }                                                                                      \
    /* Up to three matrices of one type and width over the same x (Q, K, V): rows       \
       0..r0 go to y0, the next r1 to y1, the next r2 to y2. */                            \
    extern "C" __global__ void matvec3_##NAME(                                             \
        const u8* __restrict__ w0, const u8* __restrict__ w1, const u8* __restrict__ w2,   \
        const float* __restrict__ x, float* __restrict__ y0, float* __restrict__ y1,       \
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
        int units = cols >> 5;                                                             \
        for (int u = lane; u < units; u += 32) {                                           \
            _Pragma("unroll") for (int j = 0; j < 32; j++) {                               \
                int i = (u << 5) + j;                                                      \
                acc += DEQ(r, i) * x[i];                                                   \
            }                                                                              \
        }                                                                                  \
        acc = warp_sum(acc);                                                               \
        if (lane == 0) y[row] = acc;                                                       \
    }                                                                                      \
    /* Gated FFN input: y[r] = act(Wg[r,:].x) * (Wu[r,:].x), act 0 = SiLU, 1 = GELU-tanh. */ \
    extern "C" __global__ void matvec_gated_##NAME(                                        \
        const u8* __restrict__ wg, const u8* __restrict__ wu, const float* __restrict__ x, \
        float* __restrict__ y, int rows, int cols, unsigned long long row_bytes, int act) { \
        int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int lane = threadIdx.x & 31;                                                       \
        if (row >= rows) return;                                                           \
        const u8* rg = wg + (unsigned long long)row * row_bytes;                           \
        const u8* ru = wu + (unsigned long long)row * row_bytes;                           \
        float g = 0.0f, up = 0.0f;                                                         \
        int units = cols >> 5;                                                             \
        for (int u = lane; u < units; u += 32) {                                           \
            _Pragma("unroll") for (int j = 0; j < 32; j++) {                               \
                int i = (u << 5) + j;                                                      \
                g += DEQ(rg, i) * x[i];                                                    \
                up += DEQ(ru, i) * x[i];                                                   \
            }                                                                              \
        }                                                                                  \
        g = warp_sum(g);                                                                   \
        up = warp_sum(up);                                                                 \
        if (lane == 0) y[row] = gate_act(g, act) * up;                                     \
    }                                                                                      \
    extern "C" __global__ void embed_##NAME(const u8* __restrict__ w, float* __restrict__ y, \
                                            int token, int cols,                           \
                                            unsigned long long row_bytes, float scale) {   \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                     \
        if (i >= cols) return;                                                             \
        y[i] = DEQ(w + (unsigned long long)token * row_bytes, i) * scale;                  \
    }

FERRITE_MATVEC(q4_1, deq_q4_1)
FERRITE_MATVEC(q8_0, deq_q8_0)
FERRITE_MATVEC(q5_0, deq_q5_0)
FERRITE_MATVEC(q4_k, deq_q4_k)
FERRITE_MATVEC(q6_k, deq_q6_k)
FERRITE_MATVEC(f32, deq_f32)
FERRITE_MATVEC(f16, deq_f16)

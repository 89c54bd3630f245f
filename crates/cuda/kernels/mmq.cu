// Prefill products on the integer tensor cores (MMQ): y[t·rows + r] = Σ_k W[r][k]·x[t][k]
// for n token rows. The activations are the int8 blocks of matvec_i8.cu, quantized over the
// whole n × cols chunk at once (token t's block b is block t·cols/32 + b of the layout), so
// each weight block of 32 values meets each token's block in one integer product on the
// tensor cores (mma.sync m16n8k32, s8 × s8 → s32) and is scaled once per (row, token, block)
// in f32. Against dequantizing to f16 for cuBLAS this never writes an f16 copy of the weights;
// it pays with the f32 scaling per block instead.
//
// Tiling: a block of 4 warps computes 64 weight rows × 64 tokens. Warp w owns rows
// 16w..16w+15 (one m16 tile) of all 64 tokens (eight n8 tiles). The tokens' int8 values and
// block scales, MMQ_KB blocks of columns at a time, are staged in shared memory for the four
// warps; each warp reads its weight fragments from global memory (a weight byte is read by
// one warp of the block), one block ahead. Rows past `rows` repeat the last row and tokens
// past `n` read zeros; neither is stored. When rows × tokens give too few blocks to fill the
// device, the columns are split over blockIdx.z and the partial sums added by mmq_reduce.
//
// Fragments (PTX ISA, mma.m16n8k32 with .s8; g = lane / 4, c = lane % 4): A's registers hold
// row g, columns 4c..4c+3 / row g+8, the same columns / row g, columns 16+4c.. / row g+8,
// columns 16+4c..; B's two registers hold token g's columns 4c..4c+3 and 16+4c..; C holds
// (row g, tokens 2c and 2c+1) then (row g+8, tokens 2c and 2c+1). The k16 shape (Q6_K, whose
// scales cover 16 values) takes the first two A registers and the first B register.

#define MMQ_ROWS 64
#define MMQ_TOKS 64
#define MMQ_KB 8
// Bytes per staged token row: MMQ_KB blocks plus 16 bytes, so that the 8 tokens a warp reads
// at once fall in different shared-memory banks.
#define MMQ_STRIDE (MMQ_KB * 32 + 16)
// Scale pairs per staged token, padded for the same reason.
#define MMQ_DS_STRIDE (MMQ_KB + 1)

static __device__ __forceinline__ void mma_s8_k32(int* c, const u32* a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

static __device__ __forceinline__ void mma_s8_k16(int* c, u32 a0, u32 a1, u32 b0) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
#else
    __trap();
#endif
}

// One row's part of a weight block of 32 values as the fragments want it: the signed bytes of
// values 4c..4c+3 (lo) and 16+4c..16+4c+3 (hi), the scale of the block (s0; with a split
// format s0 scales lo's half and s1 hi's) and the offset per unit of activation (m: the block
// adds m · Σx).
struct wfrag {
    u32 lo, hi;
    float s0, s1, m;
};

// Q4_1 (20-byte blocks): byte 4 + i holds value i in its low nibble and i + 16 in its high.
static __device__ __forceinline__ wfrag wload_q4_1(const u8* __restrict__ row, int kb, int c) {
    const u32* b = (const u32*)(row + kb * 20);
    u32 dm = b[0], q = b[1 + c];
    wfrag f;
    f.lo = q & 0x0f0f0f0fu;
    f.hi = (q >> 4) & 0x0f0f0f0fu;
    f.s0 = h2f((u16)(dm & 0xffffu));
    f.s1 = 0.0f;
    f.m = h2f((u16)(dm >> 16));
    return f;
}

// Q8_0 (34-byte blocks, 2-byte aligned): half-word loads paired into words.
static __device__ __forceinline__ wfrag wload_q8_0(const u8* __restrict__ row, int kb, int c) {
    const u16* b = (const u16*)(row + kb * 34);
    wfrag f;
    f.lo = (u32)b[1 + 2 * c] | ((u32)b[2 + 2 * c] << 16);
    f.hi = (u32)b[9 + 2 * c] | ((u32)b[10 + 2 * c] << 16);
    f.s0 = h2f(b[0]);
    f.s1 = 0.0f;
    f.m = 0.0f;
    return f;
}

// Q4_K (144-byte super-blocks of 8 sub-blocks): sub-block s of 32 values sits in the low
// (even s) or high (odd s) nibbles of bytes 16 + 32·(s/2)...; w = d·sc·q − dmin·mn.
static __device__ __forceinline__ wfrag wload_q4_k(const u8* __restrict__ row, int kb, int c) {
    const u8* b = row + (kb >> 3) * 144;
    int s = kb & 7;
    const u32* bw = (const u32*)b;
    u32 dm = bw[0];
    float sc, mn;
    scale_min_k4(s, bw[1], bw[2], bw[3], &sc, &mn);
    const u32* q = (const u32*)(b + 16 + 32 * (s >> 1));
    u32 sh = 4u * (u32)(s & 1);
    wfrag f;
    f.lo = (q[c] >> sh) & 0x0f0f0f0fu;
    f.hi = (q[4 + c] >> sh) & 0x0f0f0f0fu;
    f.s0 = h2f((u16)(dm & 0xffffu)) * sc;
    f.s1 = 0.0f;
    f.m = -h2f((u16)(dm >> 16)) * mn;
    return f;
}

// Four bytes at an even address, as two half-word loads.
static __device__ __forceinline__ u32 ld32_even(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// Q6_K (210-byte super-blocks, 2-byte aligned; see unit_i8_q6_k): the 6-bit values become
// signed bytes q − 32; each half of the block has its own scale.
static __device__ __forceinline__ u32 q6_bytes(u32 ql, u32 qh, u32 lsh, u32 hsh) {
    u32 lo = (ql >> lsh) & 0x0f0f0f0fu;
    u32 hi = ((qh >> hsh) & 0x03030303u) << 4;
    u32 t = (lo | hi) ^ 0x20202020u;
    u32 neg = t & 0x20202020u;
    return t | (neg << 1) | (neg << 2);
}

static __device__ __forceinline__ wfrag wload_q6_k(const u8* __restrict__ row, int kb, int c) {
    const u8* b = row + (kb >> 3) * 210;
    int half = (kb >> 2) & 1, k = kb & 3;
    const u8* ql = b + 64 * half + 32 * (k & 1);
    const u8* qh = b + 128 + 32 * half;
    u32 lsh = 4u * (u32)(k >> 1), hsh = 2u * (u32)k;
    float d = h2f(ld16(b + 208));
    wfrag f;
    f.lo = q6_bytes(ld32_even(ql + 4 * c), ld32_even(qh + 4 * c), lsh, hsh);
    f.hi = q6_bytes(ld32_even(ql + 16 + 4 * c), ld32_even(qh + 16 + 4 * c), lsh, hsh);
    f.s0 = d * (float)(signed char)b[192 + 8 * half + 2 * k];
    f.s1 = d * (float)(signed char)b[193 + 8 * half + 2 * k];
    f.m = 0.0f;
    return f;
}

// The tile of one block (see the top of this file). P: activation planes; SPLIT: the weight
// block has a scale per 16 values (two k16 products instead of one k32). Block z of a split
// grid sums column blocks [z·kb_per, (z+1)·kb_per) into its own slice of `part`.
template <int P, bool SPLIT, wfrag (*LOAD)(const u8*, int, int)>
static __device__ __forceinline__ void mmq_tile(const u8* __restrict__ w,
                                                const u8* __restrict__ xq,
                                                float* __restrict__ y, float* __restrict__ part,
                                                int rows, int cols, int n, int row_bytes,
                                                int kb_per) {
    __shared__ __align__(16) u8 sx[P][MMQ_TOKS * MMQ_STRIDE];
    __shared__ float2 sds[MMQ_TOKS * MMQ_DS_STRIDE];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int t0 = blockIdx.y * MMQ_TOKS;
    const int r0 = blockIdx.x * MMQ_ROWS + warp * 16;
    const int nblk = cols >> 5;
    const int kb_begin = blockIdx.z * kb_per, kb_end = min(nblk, kb_begin + kb_per);
    const size_t plane = (size_t)n * cols;
    const float2* xds = (const float2*)(xq + P * plane);
    // The second plane carries 256ths: the integer sums are 256·s0 + s1.
    const float unit = P > 1 ? 0.00390625f : 1.0f;
    const u8* wa = w + (size_t)min(r0 + g, rows - 1) * row_bytes;
    const u8* wb = w + (size_t)min(r0 + 8 + g, rows - 1) * row_bytes;
    float acc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;

    // The next block's weight fragments are loaded while the current one is multiplied.
    wfrag fa = LOAD(wa, kb_begin, c), fb = LOAD(wb, kb_begin, c);
    for (int kb0 = kb_begin; kb0 < kb_end; kb0 += MMQ_KB) {
        const int nb = min(MMQ_KB, kb_end - kb0);
        __syncthreads();
        const int words = MMQ_TOKS * nb * 2;
        for (int i = threadIdx.x; i < P * words; i += blockDim.x) {
            int p = i / words, rem = i - p * words;
            int t = rem / (nb * 2), q = rem - t * (nb * 2);
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (t0 + t < n)
                v = *(const uint4*)(xq + p * plane + (size_t)(t0 + t) * cols + (kb0 << 5) +
                                    (q << 4));
            *(uint4*)(&sx[p][t * MMQ_STRIDE + (q << 4)]) = v;
        }
        for (int i = threadIdx.x; i < MMQ_TOKS * nb; i += blockDim.x) {
            int t = i / nb, b = i - t * nb;
            sds[t * MMQ_DS_STRIDE + b] =
                t0 + t < n ? xds[(size_t)(t0 + t) * nblk + kb0 + b] : make_float2(0.0f, 0.0f);
        }
        __syncthreads();
        for (int b = 0; b < nb; b++) {
            const int kn = min(kb0 + b + 1, kb_end - 1);
            const wfrag na = LOAD(wa, kn, c), nbf = LOAD(wb, kn, c);
            const u32 a[4] = {fa.lo, fb.lo, fa.hi, fb.hi};
            const float sa0 = fa.s0 * unit, sb0 = fb.s0 * unit;
            const float sa1 = fa.s1 * unit, sb1 = fb.s1 * unit;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                u32 bf[P][2];
#pragma unroll
                for (int p = 0; p < P; p++) {
                    const u8* sp = &sx[p][(nt * 8 + g) * MMQ_STRIDE + (b << 5) + 4 * c];
                    bf[p][0] = *(const u32*)sp;
                    bf[p][1] = *(const u32*)(sp + 16);
                }
                const float2 x0 = sds[(nt * 8 + 2 * c) * MMQ_DS_STRIDE + b];
                const float2 x1 = sds[(nt * 8 + 2 * c + 1) * MMQ_DS_STRIDE + b];
                float v[4];
                if (!SPLIT) {
                    int ci[4] = {0, 0, 0, 0};
                    mma_s8_k32(ci, a, bf[0][0], bf[0][1]);
                    if (P > 1) {
#pragma unroll
                        for (int i = 0; i < 4; i++) ci[i] <<= 8;
                        mma_s8_k32(ci, a, bf[P - 1][0], bf[P - 1][1]);
                    }
                    v[0] = sa0 * (float)ci[0];
                    v[1] = sa0 * (float)ci[1];
                    v[2] = sb0 * (float)ci[2];
                    v[3] = sb0 * (float)ci[3];
                } else {
                    int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                    mma_s8_k16(lo, a[0], a[1], bf[0][0]);
                    mma_s8_k16(hi, a[2], a[3], bf[0][1]);
                    if (P > 1) {
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            lo[i] <<= 8;
                            hi[i] <<= 8;
                        }
                        mma_s8_k16(lo, a[0], a[1], bf[P - 1][0]);
                        mma_s8_k16(hi, a[2], a[3], bf[P - 1][1]);
                    }
                    v[0] = sa0 * (float)lo[0] + sa1 * (float)hi[0];
                    v[1] = sa0 * (float)lo[1] + sa1 * (float)hi[1];
                    v[2] = sb0 * (float)lo[2] + sb1 * (float)hi[2];
                    v[3] = sb0 * (float)lo[3] + sb1 * (float)hi[3];
                }
                acc[nt][0] += x0.x * v[0] + fa.m * x0.y;
                acc[nt][1] += x1.x * v[1] + fa.m * x1.y;
                acc[nt][2] += x0.x * v[2] + fb.m * x0.y;
                acc[nt][3] += x1.x * v[3] + fb.m * x1.y;
            }
            fa = na;
            fb = nbf;
        }
    }
    float* out = gridDim.z > 1 ? part + (size_t)blockIdx.z * n * rows : y;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = r0 + g + 8 * (i >> 1);
            int t = t0 + nt * 8 + 2 * c + (i & 1);
            if (r < rows && t < n) out[(size_t)t * rows + r] = acc[nt][i];
        }
}

// Grid (ceil(rows / 64), ceil(n / 64), splits), 128 threads; cols a multiple of the format's
// block, kb_per a multiple of MMQ_KB (a Q4_K/Q6_K super-block). With one split the block
// writes y, with more its slice of `part`, summed by mmq_reduce.
#define FERRITE_MMQ(name, P, SPLIT, LOAD)                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                         \
        name(const u8* __restrict__ w, const u8* __restrict__ xq, float* __restrict__ y,      \
             float* __restrict__ part, int rows, int cols, int n, int row_bytes,              \
             int kb_per) {                                                                     \
        mmq_tile<P, SPLIT, LOAD>(w, xq, y, part, rows, cols, n, row_bytes, kb_per);            \
    }

FERRITE_MMQ(mmq_i8_q4_1, 1, false, wload_q4_1)
FERRITE_MMQ(mmq_i8_q8_0, 1, false, wload_q8_0)
FERRITE_MMQ(mmq_i8_q4_k, 1, false, wload_q4_k)
FERRITE_MMQ(mmq_i8_q6_k, 1, true, wload_q6_k)
FERRITE_MMQ(mmq_i8x2_q4_1, 2, false, wload_q4_1)
FERRITE_MMQ(mmq_i8x2_q8_0, 2, false, wload_q8_0)
FERRITE_MMQ(mmq_i8x2_q4_k, 2, false, wload_q4_k)
FERRITE_MMQ(mmq_i8x2_q6_k, 2, true, wload_q6_k)

// y[i] = Σ_z part[z·len + i] over the splits in order (so the sum does not depend on the
// schedule).
extern "C" __global__ void mmq_reduce(const float* __restrict__ part, float* __restrict__ y,
                                      int len, int splits) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float s = 0.0f;
    for (int z = 0; z < splits; z++) s += part[(size_t)z * len + i];
    y[i] = s;
}

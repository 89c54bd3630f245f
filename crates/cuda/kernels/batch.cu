// Batched decode: one new token for each of `n` sessions in one forward pass (CudaBatch,
// src/model/batch.rs). Activations are column-major by session: column c of an activation
// of `cols` values starts at c·cols (f32), or, as int8 blocks of the whole n·cols vector
// (matvec_i8.cu's layout), at unit c·cols/32 of each plane and of the scales, so the
// quantizer runs once over all columns and its blocks never straddle two columns.
//
// Bit-for-bit agreement with single decode is the design rule: for every column a product
// adds the same unit dot products (unit_<type>, from matvec.cu / matvec_i8.cu) in the same
// order as the single-column kernel it replaces — lane l of the `ks` warps sharing a row
// takes units l + 32·slice, stepping 32·ks; warp sums meet in shared memory in slice order —
// so each weight is read from DRAM once per step for up to BMV_COLS columns, and every
// column's result equals the one-session kernel's.

// Most columns one launch of the batched products takes (the host splits larger batches).
#define BMV_COLS 8

// The activations of unit u of column c: f32 columns are offset by pointer, int8 columns
// by unit (see above).
#define BMV_XLOAD(XLOAD, I8, SH, x, cols, ntot, c, u)                                      \
    XLOAD((x) + ((I8) ? 0 : (unsigned long long)(c) * (cols)), (I8) ? (ntot) : (cols),     \
          (u) + ((I8) ? (c) * ((cols) >> (SH)) : 0))

// KN names the kernels, XT is the activation element type, XV/XLOAD/UNIT/SH as in
// FERRITE_MATVEC_CORE, I8 is 1 for int8 activations.
#define FERRITE_BATCH_MATVEC(KN, XT, XV, XLOAD, UNIT, SH, I8)                              \
    /* y[c·rows + r] = W[r,:] · x_c for the `ncol` (≤ BMV_COLS) columns starting at        \
       column c0 of x (of `ntot` values in all, for the int8 layout); one row per group of \
       `ks` warps, as matvec_ with nr = 1. */                                              \
    extern "C" __global__ void bmv_##KN(const u8* __restrict__ w, const XT* __restrict__ x,\
                                         float* __restrict__ y, int rows, int cols,        \
                                         unsigned long long row_bytes, int ks, int c0,     \
                                         int ncol, int ntot) {                             \
        __shared__ float red[4][BMV_COLS];                                                 \
        int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int wib = threadIdx.x >> 5;                                                        \
        int lane = threadIdx.x & 31;                                                       \
        int slice = wid % ks;                                                              \
        int row = wid / ks;                                                                \
        bool live = row < rows;                                                            \
        const u8* r = w + (unsigned long long)min(row, rows - 1) * row_bytes;              \
        float acc[BMV_COLS];                                                               \
        _Pragma("unroll") for (int c = 0; c < BMV_COLS; c++) acc[c] = 0.0f;                \
        int units = live ? cols >> SH : 0;                                                 \
        for (int u = lane + 32 * slice; u < units; u += 32 * ks) {                         \
            _Pragma("unroll") for (int c = 0; c < BMV_COLS; c++) {                         \
                if (c < ncol) {                                                            \
                    XV xv = BMV_XLOAD(XLOAD, I8, SH, x, cols, ntot, c0 + c, u);            \
                    acc[c] += UNIT(r, u, xv);                                              \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        _Pragma("unroll") for (int c = 0; c < BMV_COLS; c++) {                             \
            if (c < ncol) {                                                                \
                float v = warp_sum(acc[c]);                                                \
                if (lane == 0) red[wib][c] = v;                                            \
            }                                                                              \
        }                                                                                  \
        if (ks > 1) __syncthreads();                                                       \
        if (lane != 0 || slice != 0 || !live) return;                                      \
        _Pragma("unroll") for (int c = 0; c < BMV_COLS; c++) {                             \
            if (c < ncol) {                                                                \
                float v = 0.0f;                                                            \
                for (int j = 0; j < ks; j++) v += red[wib + j][c];                         \
                y[(unsigned long long)(c0 + c) * rows + row] = v;                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    /* Gated FFN input of `ncol` columns: y[c·rows + r] = act(Wg[r,:]·x_c)·(Wu[r,:]·x_c), \
       one row per warp, as matvec_gated_. */                                              \
    extern "C" __global__ void bmv_gated_##KN(                                             \
        const u8* __restrict__ wg, const u8* __restrict__ wu, const XT* __restrict__ x,    \
        float* __restrict__ y, int rows, int cols, unsigned long long row_bytes, int act,  \
        int c0, int ncol, int ntot) {                                                      \
        int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);                     \
        int lane = threadIdx.x & 31;                                                       \
        if (row >= rows) return;                                                           \
        unsigned long long o = (unsigned long long)row * row_bytes;                        \
        float g[BMV_COLS], up[BMV_COLS];                                                   \
        _Pragma("unroll") for (int c = 0; c < BMV_COLS; c++) g[c] = up[c] = 0.0f;          \
        int units = cols >> SH;                                                            \
        for (int u = lane; u < units; u += 32) {                                           \
            _Pragma("unroll") for (int c = 0; c < BMV_COLS; c++) {                         \
                if (c < ncol) {                                                            \
                    XV xv = BMV_XLOAD(XLOAD, I8, SH, x, cols, ntot, c0 + c, u);            \
                    g[c] += UNIT(wg + o, u, xv);                                           \
                    up[c] += UNIT(wu + o, u, xv);                                          \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        _Pragma("unroll") for (int c = 0; c < BMV_COLS; c++) {                             \
            if (c < ncol) {                                                                \
                float gs = warp_sum(g[c]);                                                 \
                float us = warp_sum(up[c]);                                                \
                if (lane == 0)                                                             \
                    y[(unsigned long long)(c0 + c) * rows + row] = gated(gs, us, act);     \
            }                                                                              \
        }                                                                                  \
    }

FERRITE_BATCH_MATVEC(q4_1, float, xv_q4_1, xload_q4_1, unit_q4_1, 5, 0)
FERRITE_BATCH_MATVEC(q8_0, float, xv_q8_0, xload_q8_0, unit_q8_0, 5, 0)
FERRITE_BATCH_MATVEC(q4_0, float, xv_q4_0, xload_q4_0, unit_q4_0, 5, 0)
FERRITE_BATCH_MATVEC(q5_0, float, xv_q5_0, xload_q5_0, unit_q5_0, 5, 0)
FERRITE_BATCH_MATVEC(q4_k, float, xv_q4_k, xload_q4_k, unit_q4_k, 6, 0)
FERRITE_BATCH_MATVEC(q6_k, float, xv_q6_k, xload_q6_k, unit_q6_k, 5, 0)
FERRITE_BATCH_MATVEC(f32, float, xv_f32, xload_f32, unit_f32, 5, 0)
FERRITE_BATCH_MATVEC(f16, float, xv_f16, xload_f16, unit_f16, 5, 0)
FERRITE_BATCH_MATVEC(bf16, float, xv_bf16, xload_bf16, unit_bf16, 5, 0)
FERRITE_BATCH_MATVEC(i8_q4_1, u8, xi32<1>, xload_i32<1>, unit_i8_q4_1<1>, 5, 1)
FERRITE_BATCH_MATVEC(i8_q8_0, u8, xi32<1>, xload_i32<1>, unit_i8_q8_0<1>, 5, 1)
FERRITE_BATCH_MATVEC(i8_q4_k, u8, xi64<1>, xload_i64<1>, unit_i8_q4_k<1>, 6, 1)
FERRITE_BATCH_MATVEC(i8_q6_k, u8, xi32<1>, xload_i32<1>, unit_i8_q6_k<1>, 5, 1)
FERRITE_BATCH_MATVEC(i8x2_q4_1, u8, xi32<2>, xload_i32<2>, unit_i8_q4_1<2>, 5, 1)
FERRITE_BATCH_MATVEC(i8x2_q8_0, u8, xi32<2>, xload_i32<2>, unit_i8_q8_0<2>, 5, 1)
FERRITE_BATCH_MATVEC(i8x2_q4_k, u8, xi64<2>, xload_i64<2>, unit_i8_q4_k<2>, 6, 1)
FERRITE_BATCH_MATVEC(i8x2_q6_k, u8, xi32<2>, xload_i32<2>, unit_i8_q6_k<2>, 5, 1)

// Rope and KV store of session blockIdx.y's one new token: its q, k, v are column
// blockIdx.y of the batch buffers, its caches kcs[s], vcs[s] and its (token, position) the
// pair tps[2s..]. Same threads as rope_store_f16 (whole heads turn); `factors` as
// rope_store_scaled_f16's, or null for plain frequencies.
extern "C" __global__ void brope_store_f16(float* q, float* k, const float* __restrict__ v,
                                           const unsigned long long* __restrict__ kcs,
                                           const unsigned long long* __restrict__ vcs,
                                           int n_head, int n_kv_head, int head_dim,
                                           const int* __restrict__ tps, float base,
                                           int half_split, const float* __restrict__ factors) {
    int s = blockIdx.y;
    int kv_dim = n_kv_head * head_dim;
    rope_store(q + (unsigned long long)s * n_head * head_dim, k + (unsigned long long)s * kv_dim,
               v + (unsigned long long)s * kv_dim, (u16*)kcs[s], (u16*)vcs[s], n_head, n_kv_head,
               head_dim, head_dim, tps + 2 * s, base, half_split, factors, 0);
}

// Decode attention of session blockIdx.y (one query, its own position, caches and key
// splits splits[s] ≤ gridDim.z): the blocks of attn_f16 with nq = qt = 1, `hpb` query
// heads a block, values of their own. Partials of session s start at
// s·n_head·gridDim.z·(head_dim + 2).
extern "C" __global__ void battn_f16(const float* __restrict__ q,
                                     const unsigned long long* __restrict__ kcs,
                                     const unsigned long long* __restrict__ vcs,
                                     float* __restrict__ out, float* __restrict__ part,
                                     int n_head, int n_kv_head, int hd, int hpb,
                                     const int* __restrict__ tps, const int* __restrict__ splits,
                                     int window, float scale, int min_chunk) {
    int s = blockIdx.y;
    int sp = splits[s];
    if ((int)blockIdx.z >= sp) return;
    unsigned long long qo = (unsigned long long)s * n_head * hd;
    attn_f16_block(q + qo, (const u16*)kcs[s], (const u16*)vcs[s], out + qo,
                   part + (unsigned long long)s * n_head * gridDim.z * (hd + 2), n_head,
                   n_kv_head, hd, hpb, hd, 0, tps + 2 * s, 1, 1, window, scale, sp, min_chunk,
                   0.0f, nullptr, blockIdx.x, 0, blockIdx.z);
}

// Merges battn_f16's partials: block (h, s) for head h of session s; sessions of one split
// already wrote their output. `max_splits` is battn_f16's gridDim.z.
extern "C" __global__ void battn_combine(const float* __restrict__ part, float* __restrict__ out,
                                         int n_head, int hd, const int* __restrict__ splits,
                                         int max_splits) {
    int s = blockIdx.y;
    int sp = splits[s];
    if (sp <= 1) return;
    attn_combine_pair(part + (unsigned long long)s * n_head * max_splits * (hd + 2),
                      out + (unsigned long long)s * n_head * hd, hd, sp, sp, blockIdx.x,
                      nullptr, 0, 0, nullptr, 0);
}

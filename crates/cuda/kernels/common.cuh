// Shared helpers of every ferrite kernel: half conversions without cuda_fp16.h (NVRTC
// need not ship it), unaligned little-endian loads (quant blocks are 18-210 bytes, so their
// fields are only byte aligned) and warp/block reductions.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#define FERRITE_NEG_INF __int_as_float(0xff800000)

static __device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

static __device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

static __device__ __forceinline__ u16 ld16(const u8* p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}

static __device__ __forceinline__ u32 ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). `red` holds 32
// floats of shared memory. Every thread gets the result.
static __device__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = (threadIdx.x < (blockDim.x >> 5)) ? red[threadIdx.x] : 0.0f;
    if (w == 0) t = warp_sum(t);
    if (threadIdx.x == 0) red[0] = t;
    __syncthreads();
    return red[0];
}

// The FFN gate activation: 0 = SiLU, 1 = GELU with the tanh approximation.
static __device__ __forceinline__ float gate_act(float v, int act) {
    if (act == 0) return v / (1.0f + expf(-v));
    float t = tanhf(0.7978845608f * (v + 0.044715f * v * v * v));
    return 0.5f * v * (1.0f + t);
}

// Quantizes the 32-value block `blk` held one value per lane of a warp (all lanes active)
// into `xq`, the int8 layout of matvec_i8.cu (n values): d = max|x| / 127, q = x / d
// rounded. With two planes the rounding error r = x - d·q is quantized again at a 256th of
// the scale into the second plane, so x ≈ d·(q + q2/256).
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


// The end of a product whose rows (one value per row in y) are also quantized to int8
// blocks of 32 rows: every block of the launch covers `per_block` rows inside one group of
// 32, and the last block of a group to finish (counted in cnt[group], which it resets)
// quantizes the group. Called by all threads of the block after their writes to y.
static __device__ void quantize_rows_tail(const float* y, int n, u8* __restrict__ xq,
                                          int planes, unsigned int* __restrict__ cnt,
                                          int first_row, int per_block) {
    __shared__ int last;
    __syncthreads();
    int grp = first_row >> 5;
    // bar.sync orders the block's writes before thread 0's fence and count (the
    // grid-barrier pattern); the last block reads the group from L2.
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned int prev = atomicAdd(&cnt[grp], 1u);
        last = prev == (unsigned int)(32 / per_block - 1);
        if (last) {
            cnt[grp] = 0u;
            __threadfence();
        }
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    q8_block(__ldcg(y + (grp << 5) + threadIdx.x), xq, n, grp, planes);
}

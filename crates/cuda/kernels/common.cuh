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

// Limit and sigmoid slope of gpt-oss's clamped SwiGLU (ferrite_backend::Act's constants).
#define FERRITE_SWIGLU_OAI_LIMIT 7.0f
#define FERRITE_SWIGLU_OAI_ALPHA 1.702f

// One gated FFN value from its gate and up products: act(g) * u for act 0 and 1
// (gate_act), and for 2 gpt-oss's clamped SwiGLU, whose gate is capped above and whose up
// value is clamped and shifted by one.
static __device__ __forceinline__ float gated(float g, float u, int act) {
    if (act != 2) return gate_act(g, act) * u;
    float c = fminf(g, FERRITE_SWIGLU_OAI_LIMIT);
    float uc = fminf(fmaxf(u, -FERRITE_SWIGLU_OAI_LIMIT), FERRITE_SWIGLU_OAI_LIMIT);
    return c / (1.0f + expf(-FERRITE_SWIGLU_OAI_ALPHA * c)) * (uc + 1.0f);
}

// The factor that turns an online softmax's accumulated values into attention outputs,
// given the running max `m` and sum `l` relative to it: 1 / l, or, with a sink logit per
// query head (gpt-oss; `sinks` null otherwise), the same with exp(sink) joining the sum,
// rescaled to the larger of the two maxima so neither exponential overflows.
static __device__ __forceinline__ float attn_out_scale(float m, float l,
                                                       const float* __restrict__ sinks,
                                                       int head) {
    if (!sinks) return l > 0.0f ? 1.0f / l : 0.0f;
    float s = sinks[head];
    float mx = fmaxf(m, s);
    float c = m == FERRITE_NEG_INF ? 0.0f : expf(m - mx);
    return c / (l * c + expf(s - mx));
}

// A scaled attention score soft-capped (Gemma 2: cap · tanh(s / cap)); cap 0 leaves it.
static __device__ __forceinline__ float soft_cap(float s, float cap) {
    return cap > 0.0f ? cap * tanhf(s / cap) : s;
}

// Decode attention over an f16 KV cache: one block per query head, the query at position
// pos = tp[1] (read from device memory so that a captured graph serves every step) attends
// to cached positions lo..=pos, lo = pos+1-window for sliding-window layers (window > 0),
// else 0. Scores go to a global scratch row per head, so the context length is
// not bounded by shared memory. A simple first kernel: no split over the keys.
extern "C" __global__ void attn_decode_f16(const float* __restrict__ q,
                                           const u16* __restrict__ kc,
                                           const u16* __restrict__ vc, float* __restrict__ out,
                                           float* __restrict__ scores, int n_head,
                                           int n_kv_head, int head_dim,
                                           const int* __restrict__ tp, int window, int ctx,
                                           float scale) {
    int pos = tp[1];
    __shared__ float red[32];
    __shared__ float qs[512];
    int h = blockIdx.x;
    int g = h / (n_head / n_kv_head);
    int kv_dim = n_kv_head * head_dim;
    int lo = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    int hi = pos + 1;
    const float* qh = q + (unsigned long long)h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qh[d];
    __syncthreads();
    float* sc = scores + (unsigned long long)h * ctx;
    float mx = FERRITE_NEG_INF;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        const u16* kr = kc + (unsigned long long)j * kv_dim + g * head_dim;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; d++) dot += qs[d] * h2f(kr[d]);
        dot *= scale;
        sc[j] = dot;
        mx = fmaxf(mx, dot);
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        float p = expf(sc[j] - mx);
        sc[j] = p;
        sum += p;
    }
    sum = block_sum(sum, red);
    float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = lo; j < hi; j++) acc += sc[j] * h2f(vc[(unsigned long long)j * kv_dim + g * head_dim + d]);
        out[(unsigned long long)h * head_dim + d] = acc * inv;
    }
}

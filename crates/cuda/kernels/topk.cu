// Top-k candidate selection for sampling on the device: the k best logits of a row (k <=
// TOPK_MAX), largest first in f32 total order, ties to the lower id (the CPU sampler's
// order), with the row's first NaN index and its log-sum-exp in f64. One block of 1024
// threads; the host copies back 4 + 2k words instead of the row.
//
// Selection is exact: a radix select over the 32-bit total-order rank (4 passes of 8 bits)
// finds the k-th best rank T; every rank above T is taken, and of the ranks equal to T the
// lowest ids, found by giving each thread a contiguous run of ids and a block-wide prefix
// count. The k chosen 64-bit keys (rank, inverted id) are then sorted in shared memory.
//
// out: [first NaN index or -1, k taken, lse low word, lse high word, ids[k], logit bits[k]].
#define TOPK_MAX 256
#define TOPK_THREADS 1024

// The sampler's rank: increasing with f32::total_cmp.
static __device__ __forceinline__ u32 total_rank(float v) {
    u32 b = __float_as_uint(v);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}

static __device__ __forceinline__ float from_rank(u32 r) {
    return __uint_as_float((r >> 31) ? (r & 0x7fffffffu) : ~r);
}

// Exclusive prefix sum of `v` over the block, and the block total in *total.
static __device__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[w] = x;
    __syncthreads();
    if (w == 0) {
        int nw = blockDim.x >> 5;
        int s = lane < nw ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        if (lane < nw) warp_sums[lane] = s;
        if (lane == nw - 1) *total = s;
    }
    __syncthreads();
    int before = w > 0 ? warp_sums[w - 1] : 0;
    return before + x - v;
}

extern "C" __global__ void topk_f32(const float* __restrict__ x, int n, int k,
                                    u32* __restrict__ out) {
    __shared__ int hist[256];
    __shared__ int warp_i[32];
    __shared__ u32 warp_u[32];
    __shared__ double warp_d[32];
    __shared__ unsigned long long keys[TOPK_MAX];
    __shared__ int taken, valid, need_eq, total;
    __shared__ u32 prefix, mask;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;

    // First NaN, count of the others, largest rank.
    int nan = 0x7fffffff, cnt = 0;
    u32 best = 0;
    for (int i = tid; i < n; i += blockDim.x) {
        float v = x[i];
        if (isnan(v)) {
            nan = min(nan, i);
        } else {
            cnt++;
            best = max(best, total_rank(v));
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        nan = min(nan, __shfl_xor_sync(0xffffffffu, nan, o));
        cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
        best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    }
    if (lane == 0) {
        warp_i[w] = nan;
        hist[w] = cnt;
        warp_u[w] = best;
    }
    __syncthreads();
    if (tid == 0) {
        for (int j = 1; j < nw; j++) {
            warp_i[0] = min(warp_i[0], warp_i[j]);
            hist[0] += hist[j];
            warp_u[0] = max(warp_u[0], warp_u[j]);
        }
        valid = hist[0];
    }
    __syncthreads();
    int first_nan = warp_i[0];
    double m = valid > 0 ? (double)from_rank(warp_u[0]) : 0.0;
    int kk = min(k, valid);

    // Log-sum-exp of the non-NaN values, as the host computes it (max, then Σ exp(v - max)).
    double s = 0.0;
    for (int i = tid; i < n; i += blockDim.x) {
        float v = x[i];
        if (!isnan(v)) s += exp((double)v - m);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) warp_d[w] = s;
    __syncthreads();

    // Radix select of the kk-th largest rank.
    if (tid == 0) {
        prefix = 0;
        mask = 0;
        need_eq = kk;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        u32 p = prefix, mk = mask;
        for (int i = tid; i < n && kk > 0; i += blockDim.x) {
            float v = x[i];
            if (isnan(v)) continue;
            u32 r = total_rank(v);
            if ((r & mk) == p) atomicAdd(&hist[(r >> shift) & 255], 1);
        }
        __syncthreads();
        if (tid == 0 && kk > 0) {
            int cum = 0, b = 255;
            for (; b > 0; b--) {
                if (cum + hist[b] >= need_eq) break;
                cum += hist[b];
            }
            need_eq -= cum;
            prefix |= (u32)b << shift;
            mask |= 255u << shift;
        }
        __syncthreads();
    }
    u32 thr = prefix;

    // Collect: every rank above the threshold, and the need_eq lowest ids at it.
    int chunk = (n + blockDim.x - 1) / blockDim.x;
    int lo = min(n, tid * chunk), hi = min(n, lo + chunk);
    int eq = 0;
    for (int i = lo; i < hi && kk > 0; i++) {
        float v = x[i];
        if (!isnan(v) && total_rank(v) == thr) eq++;
    }
    if (tid == 0) taken = 0;
    int before = block_exclusive_scan(eq, warp_i, &total);
    for (int i = lo; i < hi && kk > 0; i++) {
        float v = x[i];
        if (isnan(v)) continue;
        u32 r = total_rank(v);
        bool take = r > thr;
        if (r == thr) take = before++ < need_eq;
        if (take) {
            int slot = atomicAdd(&taken, 1);
            if (slot < TOPK_MAX)
                keys[slot] = ((unsigned long long)r << 32) | (u32)(0xffffffffu - (u32)i);
        }
    }
    __syncthreads();

    // Bitonic sort, descending, padded with zero keys (below every real key).
    int pw = 1;
    while (pw < kk) pw <<= 1;
    for (int i = kk + tid; i < pw; i += blockDim.x) keys[i] = 0ull;
    __syncthreads();
    for (int size = 2; size <= pw; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < pw; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    unsigned long long a = keys[i], b = keys[j];
                    bool desc = (i & size) == 0;
                    if (desc ? a < b : a > b) {
                        keys[i] = b;
                        keys[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }

    if (tid == 0) {
        double t = 0.0;
        for (int j = 0; j < nw; j++) t += warp_d[j];
        double lse = valid > 0 ? m + log(t) : __longlong_as_double(0xfff0000000000000ll);
        unsigned long long lb = (unsigned long long)__double_as_longlong(lse);
        out[0] = first_nan == 0x7fffffff ? 0xffffffffu : (u32)first_nan;
        out[1] = (u32)kk;
        out[2] = (u32)(lb & 0xffffffffull);
        out[3] = (u32)(lb >> 32);
    }
    for (int i = tid; i < kk; i += blockDim.x) {
        unsigned long long key = keys[i];
        out[4 + i] = 0xffffffffu - (u32)(key & 0xffffffffull);
        out[4 + k + i] = __float_as_uint(from_rank((u32)(key >> 32)));
    }
}

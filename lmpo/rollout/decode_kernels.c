/* Decoding kernels for FastLlamaDecoder: one call per layer part instead of a dozen tensor
 * operations. Built on first use by lmpo/rollout/kernels.py with the machine's C compiler and
 * loaded with ctypes; plain C, no PyTorch headers, so it compiles in about a second.
 *
 * Everything is fp32 and row-major. Results match the PyTorch path within float rounding
 * (checked in tests/test_decode_kernels.py); the only liberty taken is reassociating sums
 * (-fassociative-math), which lets the compiler vectorise dot products. -inf and NaN keep
 * their IEEE meaning: finite-math-only is deliberately not enabled.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* e^x within a few ulp (Cody-Waite range reduction and Cephes' expf polynomial), written
 * without branches so that loops calling it vectorise, which libm's expf prevents.
 * exp(-inf) = 0 exactly, as masked attention scores need; NaN stays NaN. */
static inline float exp_vec(float x) {
    float clamped = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);  /* fminf/fmaxf do not vectorise */
    float n = floorf(clamped * 1.44269504088896341f + 0.5f);
    float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float result = x < -87.3f ? 0.0f : p * scale;
    return x != x ? x : result;
}

/* Calls `fn(args, first, last)` on row ranges covering [0, rows), shared among `threads`
 * OpenMP threads: those of the runtime PyTorch loaded (libgomp.so.1 is shared by soname), so
 * the same pool that runs PyTorch's operations, with nothing of its own spinning between calls.
 * Every row is computed the same way whichever thread does it, so results do not depend on
 * the thread count. */
typedef void (*row_range_fn)(const void *args, int64_t first, int64_t last);

static void share_rows(row_range_fn fn, const void *args, int64_t rows, int64_t threads) {
#ifdef _OPENMP
    if (threads > 1 && rows > 1) {
#pragma omp parallel num_threads(threads)
        {
            int64_t id = omp_get_thread_num(), n = omp_get_num_threads();
            fn(args, rows * id / n, rows * (id + 1) / n);
        }
        return;
    }
#endif
    (void)threads;
    fn(args, 0, rows);
}

/* Elementwise kernels on fewer elements than this run on one thread: waking a second one
 * costs more than it saves. */
static inline int64_t threads_for(int64_t elements, int64_t threads) {
    return elements >= 16384 ? threads : 1;
}

typedef struct {
    const float *x;
    float *out;
    int64_t dim;
    float eps;
} rms_norm_args;

static void rms_norm_rows(const void *args, int64_t first, int64_t last) {
    const rms_norm_args *a = args;
    const int64_t dim = a->dim;
    for (int64_t r = first; r < last; r++) {
        const float *xr = a->x + r * dim;
        float *o = a->out + r * dim;
        float sum = 0.0f;
        for (int64_t i = 0; i < dim; i++) sum += xr[i] * xr[i];
        float scale = 1.0f / sqrtf(sum / (float)dim + a->eps);
        for (int64_t i = 0; i < dim; i++) o[i] = xr[i] * scale;
    }
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps), for `rows` rows of width `dim` (RMSNorm without gain). */
void rms_norm(const float *x, float *out, int64_t rows, int64_t dim, float eps, int64_t threads) {
    rms_norm_args a = {x, out, dim, eps};
    share_rows(rms_norm_rows, &a, rows, threads_for(rows * dim, threads));
}

typedef struct {
    const float *gate_up;
    float *out;
    int64_t dim;
} silu_mul_args;

static void silu_mul_rows(const void *args, int64_t first, int64_t last) {
    const silu_mul_args *a = args;
    const int64_t dim = a->dim;
    for (int64_t r = first; r < last; r++) {
        const float *restrict g = a->gate_up + r * 2 * dim;
        const float *restrict u = g + dim;
        float *restrict o = a->out + r * dim;
        for (int64_t i = 0; i < dim; i++) o[i] = g[i] / (1.0f + exp_vec(-g[i])) * u[i];
    }
}

/* SwiGLU: gate_up[r] = [gate | up] (width 2 * dim); out[r] = silu(gate) * up. */
void silu_mul(const float *gate_up, float *out, int64_t rows, int64_t dim, int64_t threads) {
    silu_mul_args a = {gate_up, out, dim};
    share_rows(silu_mul_rows, &a, rows, threads_for(rows * dim, threads));
}

/* RoPE as transformers applies it: y = x * cos + rotate_half(x) * sin,
 * rotate_half(x) = [-x[d/2:], x[:d/2]]. */
static inline void rope(const float *x, const float *c, const float *s, float *y, int64_t d) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) y[i] = x[i] * c[i] - x[i + half] * s[i];
    for (int64_t i = half; i < d; i++) y[i] = x[i] * c[i] + x[i - half] * s[i];
}

#define LANES 16 /* keys are processed in blocks of this many; the cache length T is a multiple of it */
/* LANES floats as one vector (GCC/Clang vector extension; split into narrower registers where
 * the CPU has no 512-bit ones), loadable from any float-aligned address */
typedef float lanes __attribute__((vector_size(LANES * sizeof(float)), aligned(sizeof(float))));
typedef int32_t lanes_int __attribute__((vector_size(LANES * sizeof(int32_t)), aligned(sizeof(int32_t))));

/* where `mask` (all bits set, from a vector comparison) pick `yes`, elsewhere `no` */
static inline lanes select(lanes_int mask, lanes yes, lanes no) {
    return (lanes)(((lanes_int)yes & mask) | ((lanes_int)no & ~mask));
}

/* exp_vec on LANES floats at once, written with vector operations so that it never depends on
 * the compiler vectorising a loop. */
static inline lanes exp_lanes(lanes x) {
    lanes_int low = x < -87.3f, high = x > 88.7f;
    lanes clamped = select(low, x - x - 87.3f, select(high, x - x + 88.7f, x));
    lanes t = clamped * 1.44269504088896341f;
    /* floor(t + 0.5) by truncation of a positive number: t >= -126 */
    lanes n = __builtin_convertvector(__builtin_convertvector(t + 128.5f, lanes_int), lanes) - 128.0f;
    lanes r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    lanes poly = r * 1.9875691500e-4f + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    poly = poly * r * r + r + 1.0f;
    lanes scale = (lanes)((__builtin_convertvector(n, lanes_int) + 127) << 23);
    lanes result = select(low, x - x, poly * scale);
    return select(x != x, x, result);
}

/* Softmax attention of one query over `keys` cached keys. Keys are stored in blocks of LANES
 * positions, each block transposed: Kb [T / LANES, d, LANES], so that the scores of a block are
 * built up one query entry at a time from contiguous memory, with no horizontal sums; values
 * are V [T, d]. Scores are computed for whole blocks: the keys past `keys` in the last block are
 * masked by their -inf bias. `d` (a multiple of LANES, hence of 4) is a constant where this is inlined
 * below, so its loops compile to straight vector code. p: scratch of T floats. */
static inline __attribute__((always_inline)) void
attend(const float *restrict q, const float *restrict Kb, const float *restrict V, const float *restrict bias,
       int64_t keys, const int64_t d, float scale, float *restrict p, float *restrict out) {
    int64_t span = (keys + LANES - 1) / LANES * LANES;
    lanes best = {0}, total = {0};
    best -= INFINITY;
    for (int64_t block = 0; block < span; block += LANES) {
        /* four partial sums: one accumulator would make every multiply-add wait for the last */
        lanes part[4] = {{0}, {0}, {0}, {0}};
        const float *restrict k_block = Kb + block * d;  /* = (block / LANES) * d * LANES */
        for (int64_t i = 0; i < d; i += 4)
            for (int64_t u = 0; u < 4; u++) part[u] += q[i + u] * *(const lanes *)(k_block + (i + u) * LANES);
        lanes score = ((part[0] + part[1]) + (part[2] + part[3])) * scale + *(const lanes *)(bias + block);
        *(lanes *)(p + block) = score;
        best = select(score > best, score, best);
    }
    float top = -INFINITY, sum = 0.0f;
    for (int j = 0; j < LANES; j++) top = best[j] > top ? best[j] : top;
    for (int64_t block = 0; block < span; block += LANES) {
        lanes weight = exp_lanes(*(const lanes *)(p + block) - top);
        *(lanes *)(p + block) = weight;
        total += weight;
    }
    for (int j = 0; j < LANES; j++) sum += total[j];
    /* even and odd keys into separate accumulators, again to keep several multiply-adds in flight;
     * p is 0 past `keys` within the last block, so an odd count may take one extra key */
    lanes even[d / LANES], odd[d / LANES];
    for (int64_t c = 0; c < d / LANES; c++) even[c] = odd[c] = (lanes){0};
    for (int64_t l = 0; l < keys; l += 2)
        for (int64_t c = 0; c < d / LANES; c++) {
            even[c] += p[l] * *(const lanes *)(V + l * d + c * LANES);
            odd[c] += p[l + 1] * *(const lanes *)(V + (l + 1) * d + c * LANES);
        }
    for (int64_t c = 0; c < d / LANES; c++) *(lanes *)(out + c * LANES) = (even[c] + odd[c]) / sum;
}

typedef struct {
    const float *qkv, *cos, *sin, *key_bias;
    const int64_t *position;
    float *k_cache, *v_cache, *out;
    int64_t qkv_stride, k_offset, v_offset, bias_stride, n_heads, n_kv, d, T, length;
    float scale;
} attention_args;

static void attention_rows(const void *args, int64_t first, int64_t last) {
    const attention_args *a = args;
    const int64_t d = a->d, T = a->T, group = a->n_heads / a->n_kv, keys = a->length + 1;
    float q[d], k[d], p[T];
    for (int64_t b = first; b < last; b++) {
        const float *row = a->qkv + b * a->qkv_stride;
        const float *c = a->cos + a->position[b] * d, *s = a->sin + a->position[b] * d;
        for (int64_t h = 0; h < a->n_kv; h++) {
            int64_t cache_row = (b * a->n_kv + h) * T * d;
            rope(row + a->k_offset + h * d, c, s, k, d);
            float *k_block = a->k_cache + cache_row + (a->length / LANES) * d * LANES + a->length % LANES;
            for (int64_t i = 0; i < d; i++) k_block[i * LANES] = k[i];
            memcpy(a->v_cache + cache_row + a->length * d, row + a->v_offset + h * d, d * sizeof(float));
        }
        for (int64_t h = 0; h < a->n_heads; h++) {
            int64_t kv_row = b * a->n_kv + h / group;
            const float *Kb = a->k_cache + kv_row * T * d, *V = a->v_cache + kv_row * T * d;
            const float *bias = a->key_bias + kv_row * a->bias_stride;
            float *o = a->out + (b * a->n_heads + h) * d;
            rope(row + h * d, c, s, q, d);
            switch (d) {  /* the common head sizes get loops of constant length */
                case 32: attend(q, Kb, V, bias, keys, 32, a->scale, p, o); break;
                case 64: attend(q, Kb, V, bias, keys, 64, a->scale, p, o); break;
                case 128: attend(q, Kb, V, bias, keys, 128, a->scale, p, o); break;
                default: attend(q, Kb, V, bias, keys, d, a->scale, p, o);
            }
        }
    }
}

/* One decoding step of attention for every sequence of a batch, one new token each.
 *
 * qkv      [B, qkv_stride]: per sequence q (n_heads * d), then k and v (n_kv * d each) at
 *          k_offset and v_offset, before RoPE.
 * position [B]: each sequence's position, which selects its row of cos and sin [T_rope, d].
 * k_cache  [B * n_kv, T / LANES, d, LANES] (keys in blocks, see attend) and
 *          v_cache [B * n_kv, T, d]: this layer's cache, T a multiple of LANES; the rotated key and the value of the new token are written
 *          at position `length`, then keys 0..length are attended to.
 * key_bias [B * n_kv, bias_stride]: 0 for keys that may be seen, -inf for padding and for
 *          every position not yet written.
 * out      [B, n_heads * d]: attention output, heads concatenated (the o_proj input).
 * threads  how many threads share the sequences (see share_rows). The attention reads every
 *          layer's cache once per step, which is bound by each core's memory bandwidth: a second
 *          core nearly halves it.
 */
void decode_attention(const float *qkv, int64_t qkv_stride, int64_t k_offset, int64_t v_offset,
                      const int64_t *position, const float *cos, const float *sin,
                      float *k_cache, float *v_cache, const float *key_bias, int64_t bias_stride,
                      float *out, int64_t batch, int64_t n_heads, int64_t n_kv, int64_t d,
                      int64_t T, int64_t length, float scale, int64_t threads) {
    attention_args a = {qkv, cos, sin, key_bias, position, k_cache, v_cache, out,
                        qkv_stride, k_offset, v_offset, bias_stride, n_heads, n_kv, d, T, length, scale};
    share_rows(attention_rows, &a, batch, threads);
}

/* The next token of each row from logits [rows, vocab], as lmpo.rollout.sampling does it without
 * top-k/top-p: log-probabilities of logits * inv_temperature; with `greedy` the most likely
 * token, otherwise the first token whose cumulative probability exceeds u[row] times the total
 * (inverse-CDF sampling, one uniform number per row). Writes the token and its log-probability. */
void sample_rows(const float *logits, const float *u, float inv_temperature, int64_t rows, int64_t vocab,
                 int64_t greedy, int64_t *tokens, float *logprobs, float *scratch) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * vocab;
        float best = -INFINITY;
        int64_t arg = 0;
        for (int64_t v = 0; v < vocab; v++) {
            scratch[v] = x[v] * inv_temperature;
            if (scratch[v] > best) best = scratch[v], arg = v;
        }
        float total = 0.0f;
        for (int64_t v = 0; v < vocab; v++) {
            scratch[v] = exp_vec(scratch[v] - best);  /* unnormalised probabilities from here on */
            total += scratch[v];
        }
        int64_t token = arg;
        if (!greedy) {
            float target = u[r] * total, cumulative = 0.0f;
            for (token = 0; token < vocab - 1; token++) {
                cumulative += scratch[token];
                if (cumulative > target) break;
            }
            if (scratch[token] == 0.0f) token = arg;  /* never a token of probability 0 */
        }
        tokens[r] = token;
        logprobs[r] = x[token] * inv_temperature - (best + logf(total));
    }
}

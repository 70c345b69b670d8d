/* Integer dot-product kernels for GGUF weights on x86-64 CPUs with AVX2 and FMA (see cpu_native.py).
 *
 * The activations of a product are quantized to 15-bit integers in blocks of 32 (one float scale a
 * block, codes within +-127 * 128) and each code c is split into two int8 halves, c = 128 h + l with h
 * in -127..127 and l in 0..127. Both halves are multiplied with the weight's codes in 8-bit integer
 * lanes (vpdpbusd where the CPU has VNNI, else vpmaddubsw / vpmaddwd) and the block's integer sum,
 * 128 sum(w h) + sum(w l), is scaled by the weight's and the activation's scales in float32. The
 * activations' rounding (1/32512 of a block's largest value) is far below bfloat16's: a product is
 * within 1e-4 of the float64 one; 8-bit activations (llama.cpp's way, half the integer work) moved
 * the default model's logits by 3-4 % and flipped its greedy answers.
 *
 * Weights:
 * - q4: 4-bit codes 0..15 with a float16 scale d and offset m per (output feature, 32 inputs),
 *   w = d * q + m. Output features are stored in pairs: byte i of a pair's row holds input i's code of
 *   the even feature in its low nibble and of the odd feature in its high nibble ([n/2, k] bytes).
 * - q8: int8 codes with a float16 scale per (output feature, 32 inputs), w = d * q ([n, k] bytes).
 *
 * Each product can fuse the step around it: the input rows' RMSNorm (x * rsqrt(mean(x^2) + eps) * w),
 * SwiGLU of a [gate | up] input (silu(gate) * up), a bias, and a residual added to the output (which
 * may be the output itself). Threads: OpenMP over output features.
 *
 * llmdeploy_decode_attention is one decode step's attention for one layer over the paged KV cache:
 * RoPE of q and k, the new K/V stored in their slots, softmax attention (OpenMP over sequence and head).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define BLOCK 32
#define CODE_MAX (127.0f * 128.0f) /* |c| at most this, so that both halves fit -127..127 */

typedef struct {
    int8_t *high; /* [m, k]: h of each code c = 128 h + l */
    int8_t *low;  /* [m, k]: l, 0..127 */
    float *scale; /* [m, k / BLOCK] */
    float *sum;   /* [m, k / BLOCK]: scale * sum of the block's codes (for q4's offsets) */
} quantized;

static inline float hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

static inline float hmax(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 8 int32 lanes each of four vectors -> 32 int8 in element order (the packs work per 128-bit lane:
 * the permutation restores the order). */
static inline __m256i narrow(const __m256i c[4]) {
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One block of 32 floats -> 32 codes (round to nearest) as their high and low halves, the block's
 * scale and scale * sum(codes). */
static inline void quantize_block(const float *v, int8_t *high, int8_t *low, float *scale, float *sum) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 x[4], mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        x[i] = _mm256_loadu_ps(v + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_and_ps(x[i], abs_mask));
    }
    float d = hmax(mx) / CODE_MAX;
    __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    const __m256i seven_bits = _mm256_set1_epi32(127);
    __m256i c[4], h[4], l[4];
    for (int i = 0; i < 4; i++) {
        c[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x[i], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        h[i] = _mm256_srai_epi32(c[i], 7); /* floor(c / 128): l = c - 128 h is 0..127 */
        l[i] = _mm256_and_si256(c[i], seven_bits);
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    _mm256_storeu_si256((__m256i *)high, narrow(h));
    _mm256_storeu_si256((__m256i *)low, narrow(l));
    *scale = d;
    *sum = d * (float)_mm_cvtsi128_si32(s4);
}

/* Rows of x (row stride x_stride) -> q, through RMSNorm (norm != NULL) or SwiGLU (swiglu: x holds
 * [gate | up], each k wide) first. */
static void quantize_rows(const float *x, int64_t m, int64_t k, int64_t x_stride, const float *norm, float eps,
                          int swiglu, quantized q) {
    int64_t nb = k / BLOCK;
    float *row = (norm || swiglu) ? malloc(sizeof(float) * k) : NULL;
    for (int64_t r = 0; r < m; r++) {
        const float *v = x + r * x_stride;
        if (norm) {
            __m256 ss = _mm256_setzero_ps();
            for (int64_t i = 0; i < k; i += 8) {
                __m256 a = _mm256_loadu_ps(v + i);
                ss = _mm256_fmadd_ps(a, a, ss);
            }
            __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum(ss) / (float)k + eps));
            for (int64_t i = 0; i < k; i += 8)
                _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), inv), _mm256_loadu_ps(norm + i)));
            v = row;
        } else if (swiglu) {
            for (int64_t i = 0; i < k; i++) {
                float g = v[i];
                row[i] = g / (1.0f + expf(-g)) * v[k + i];
            }
            v = row;
        }
        for (int64_t b = 0; b < nb; b++)
            quantize_block(v + b * BLOCK, q.high + r * k + b * BLOCK, q.low + r * k + b * BLOCK, q.scale + r * nb + b,
                           q.sum + r * nb + b);
    }
    free(row);
}

static int quantized_alloc(quantized *q, int64_t m, int64_t k) {
    int64_t nb = k / BLOCK;
    q->high = malloc((size_t)(m * k));
    q->low = malloc((size_t)(m * k));
    q->scale = malloc(sizeof(float) * (size_t)(m * nb));
    q->sum = malloc(sizeof(float) * (size_t)(m * nb));
    return q->high && q->low && q->scale && q->sum;
}

static void quantized_free(quantized *q) {
    free(q->high);
    free(q->low);
    free(q->scale);
    free(q->sum);
}

/* The product's input rows quantized into q (allocated here; quantized_free releases it); 0 when out of
 * memory, with nothing left allocated. */
static int quantize_input(quantized *q, const float *x, int64_t m, int64_t k, int64_t x_stride, const float *norm,
                          float eps, int swiglu) {
    if (!quantized_alloc(q, m, k)) {
        quantized_free(q);
        return 0;
    }
    quantize_rows(x, m, k, x_stride, norm, eps, swiglu, *q);
    return 1;
}

/* float16 [n] -> float32 [n] */
static inline void widen(const uint16_t *h, float *f, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) f[i] = _cvtsh_ss(h[i]);
}

static inline float dot_floats(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void store(float *y, int64_t n, int64_t r, int64_t j, float v, const float *bias, const float *add) {
    if (bias) v += bias[j];
    if (add) v += add[r * n + j];
    y[r * n + j] = v;
}

/* The 8 int32 partial sums of one block's product of unsigned bytes w with codes c = 128 h + l:
 * 128 sum(w h) + sum(w l). With VNNI (vpdpbusd, AVX-VNNI or AVX512-VNNI; the build asks for it where
 * the CPU has it) two instructions; else pair sums through vpmaddubsw, each at most 2 * 128 * 127 in
 * size (no int16 saturation), widened by vpmaddwd. */
static inline __m256i block_dot(__m256i w, __m256i high, __m256i low) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_slli_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, high), 7), w, low);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w, high), 7), w, low);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w, high), ones), 7),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, low), ones));
#endif
}

/* q4: output features j0 .. j0 + COLS - 1 (COLS even) of rows r0 .. r0 + ROWS - 1. Always inlined,
 * so that COLS and ROWS are constants and the accumulators stay in registers. */
static inline __attribute__((always_inline)) void q4_tile(int COLS, int ROWS, int64_t j0, int64_t r0, int64_t k,
        int64_t n, const uint8_t *codes, const uint16_t *scales, const uint16_t *offsets, quantized q, float *y,
        const float *bias, const float *add) {
    int64_t nb = k / BLOCK;
    float wd[COLS][nb], wm[COLS][nb];
    for (int c = 0; c < COLS; c++) {
        widen(scales + (j0 + c) * nb, wd[c], nb);
        widen(offsets + (j0 + c) * nb, wm[c], nb);
    }
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[4][2];
    for (int c = 0; c < COLS; c++)
        for (int t = 0; t < ROWS; t++) acc[c][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i ah[2], al[2];
        __m256 da[2];
        for (int t = 0; t < ROWS; t++) {
            ah[t] = _mm256_loadu_si256((const __m256i *)(q.high + (r0 + t) * k + b * BLOCK));
            al[t] = _mm256_loadu_si256((const __m256i *)(q.low + (r0 + t) * k + b * BLOCK));
            da[t] = _mm256_broadcast_ss(q.scale + (r0 + t) * nb + b);
        }
        for (int c = 0; c < COLS; c += 2) {
            __m256i pair = _mm256_loadu_si256((const __m256i *)(codes + ((j0 + c) / 2 * k + b * BLOCK)));
            /* the next tile's rows, asked for while this one multiplies: the hardware prefetcher does
             * not run far enough ahead over interleaved rows (past the last row it is a no-op) */
            _mm_prefetch((const char *)(codes + ((j0 + COLS + c) / 2 * k + b * BLOCK)), _MM_HINT_T0);
            __m256i w0 = _mm256_and_si256(pair, low), w1 = _mm256_and_si256(_mm256_srli_epi16(pair, 4), low);
            __m256 d0 = _mm256_broadcast_ss(&wd[c][b]), d1 = _mm256_broadcast_ss(&wd[c + 1][b]);
            for (int t = 0; t < ROWS; t++) {
                __m256i p0 = block_dot(w0, ah[t], al[t]), p1 = block_dot(w1, ah[t], al[t]);
                acc[c][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(d0, da[t]), acc[c][t]);
                acc[c + 1][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(d1, da[t]), acc[c + 1][t]);
            }
        }
    }
    for (int c = 0; c < COLS; c++)
        for (int t = 0; t < ROWS; t++) {
            int64_t j = j0 + c, r = r0 + t;
            store(y, n, r, j, hsum(acc[c][t]) + dot_floats(wm[c], q.sum + r * nb, nb), bias, add);
        }
}

/* q8 (int8 x int8 through the sign trick: |w| unsigned times a * sign(w) signed). */
static inline __attribute__((always_inline)) void q8_tile(int COLS, int ROWS, int64_t j0, int64_t r0, int64_t k,
        int64_t n, const int8_t *codes, const uint16_t *scales, quantized q, float *y, const float *bias,
        const float *add) {
    int64_t nb = k / BLOCK;
    float wd[COLS][nb];
    for (int c = 0; c < COLS; c++) widen(scales + (j0 + c) * nb, wd[c], nb);
    __m256 acc[4][2];
    for (int c = 0; c < COLS; c++)
        for (int t = 0; t < ROWS; t++) acc[c][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i ah[2], al[2];
        __m256 da[2];
        for (int t = 0; t < ROWS; t++) {
            ah[t] = _mm256_loadu_si256((const __m256i *)(q.high + (r0 + t) * k + b * BLOCK));
            al[t] = _mm256_loadu_si256((const __m256i *)(q.low + (r0 + t) * k + b * BLOCK));
            da[t] = _mm256_broadcast_ss(q.scale + (r0 + t) * nb + b);
        }
        for (int c = 0; c < COLS; c++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(codes + (j0 + c) * k + b * BLOCK));
            /* the next tile's rows, as in q4_tile */
            _mm_prefetch((const char *)(codes + (j0 + COLS + c) * k + b * BLOCK), _MM_HINT_T0);
            __m256i wabs = _mm256_sign_epi8(w, w);
            __m256 dw = _mm256_broadcast_ss(&wd[c][b]);
            for (int t = 0; t < ROWS; t++) {
                __m256i p = block_dot(wabs, _mm256_sign_epi8(ah[t], w), _mm256_sign_epi8(al[t], w));
                acc[c][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, da[t]), acc[c][t]);
            }
        }
    }
    for (int c = 0; c < COLS; c++)
        for (int t = 0; t < ROWS; t++) store(y, n, r0 + t, j0 + c, hsum(acc[c][t]), bias, add);
}

/* y[m, n] = act(x)[m, k] . w[n, k]^T (+ bias[n]) (+ add[m, n]); 0 on success, -1 when out of memory.
 * q4 needs n even, both k a multiple of 32. norm and swiglu exclude each other. */
int llmdeploy_q4_linear(const float *x, int64_t m, int64_t k, int64_t x_stride, const float *norm, float eps,
                        int swiglu, const uint8_t *codes, const uint16_t *wd, const uint16_t *wm, int64_t n,
                        const float *bias, const float *add, float *y, int threads) {
    quantized q;
    if (!quantize_input(&q, x, m, k, x_stride, norm, eps, swiglu)) return -1;
    int64_t tiles = (n + 3) / 4;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < tiles; i++) {
        int64_t j0 = 4 * i;
        int64_t r0 = 0;
        if (j0 + 4 <= n) {
            for (; r0 + 2 <= m; r0 += 2) q4_tile(4, 2, j0, r0, k, n, codes, wd, wm, q, y, bias, add);
            if (r0 < m) q4_tile(4, 1, j0, r0, k, n, codes, wd, wm, q, y, bias, add);
        } else {
            for (; r0 < m; r0++) q4_tile(2, 1, j0, r0, k, n, codes, wd, wm, q, y, bias, add);
        }
    }
    quantized_free(&q);
    return 0;
}

int llmdeploy_q8_linear(const float *x, int64_t m, int64_t k, int64_t x_stride, const float *norm, float eps,
                        int swiglu, const int8_t *codes, const uint16_t *wd, int64_t n, const float *bias,
                        const float *add, float *y, int threads) {
    quantized q;
    if (!quantize_input(&q, x, m, k, x_stride, norm, eps, swiglu)) return -1;
    int64_t tiles = (n + 3) / 4;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < tiles; i++) {
        int64_t j0 = 4 * i;
        int64_t r0 = 0;
        if (j0 + 4 <= n) {
            for (; r0 + 2 <= m; r0 += 2) q8_tile(4, 2, j0, r0, k, n, codes, wd, q, y, bias, add);
            if (r0 < m) q8_tile(4, 1, j0, r0, k, n, codes, wd, q, y, bias, add);
        } else {
            for (int64_t j = j0; j < n; j++)
                for (r0 = 0; r0 < m; r0++) q8_tile(1, 1, j, r0, k, n, codes, wd, q, y, bias, add);
        }
    }
    quantized_free(&q);
    return 0;
}

/* exp(x) for x <= 0 (softmax after its max is subtracted): Cephes' degree-5 polynomial on
 * x - n ln 2, times 2^n through the exponent bits; about 1e-7 relative error. */
static inline __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* RoPE (rotate-half pairs i, i + d/2) of one head vector in place; cos, sin [d]. */
static inline void rotate(float *v, const float *cos, const float *sin, int64_t d) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* One decode step's attention for n sequences of one new token each, on a paged cache of
 * [blocks, block_size, kv_heads, d] floats per K and V:
 * - qkv [n, (heads + 2 kv_heads) d]: RoPE on its q and k heads in place (cos, sin [n, d]);
 * - the new k and v stored at slots[s] of the pools;
 * - out[s] = softmax(scale q k^T) v over the first lengths[s] keys of the blocks tables[s] names
 *   (tables [n, table_width], lengths counting the new token).
 * 0 on success, -1 out of memory, -2 when a slot, block or length is outside the pools. */
int llmdeploy_decode_attention(float *qkv, int64_t n, int64_t heads, int64_t kv_heads, int64_t d,
                               const float *cos, const float *sin, float *k_pool, float *v_pool,
                               int64_t num_blocks, int64_t block_size, const int64_t *slots,
                               const int64_t *tables, int64_t table_width, const int32_t *lengths, float scale,
                               float *out, int threads) {
    int64_t width = (heads + 2 * kv_heads) * d, row = kv_heads * d, group = heads / kv_heads;
    int64_t longest = 0;
    for (int64_t s = 0; s < n; s++) {
        if (slots[s] < 0 || slots[s] >= num_blocks * block_size || lengths[s] < 1 ||
            lengths[s] > table_width * block_size)
            return -2;
        for (int64_t b = 0; b < (lengths[s] + block_size - 1) / block_size; b++)
            if (tables[s * table_width + b] < 0 || tables[s * table_width + b] >= num_blocks) return -2;
        if (lengths[s] > longest) longest = lengths[s];
    }
    for (int64_t s = 0; s < n; s++) {
        float *q = qkv + s * width;
        for (int64_t h = 0; h < heads + kv_heads; h++) rotate(q + h * d, cos + s * d, sin + s * d, d);
        for (int64_t i = 0; i < row; i++) {
            k_pool[slots[s] * row + i] = q[heads * d + i];
            v_pool[slots[s] * row + i] = q[heads * d + row + i];
        }
    }
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *p = malloc(sizeof(float) * (size_t)longest);
        float *acc = malloc(sizeof(float) * (size_t)d);
        if (!p || !acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n * heads; i++) {
            if (!p || !acc) continue;
            int64_t s = i / heads, h = i % heads, g = h / group, len = lengths[s];
            const float *q = qkv + s * width + h * d;
            const int64_t *table = tables + s * table_width;
            float best = -INFINITY;
            for (int64_t t = 0; t < len; t++) {
                const float *key = k_pool + ((table[t / block_size] * block_size + t % block_size) * kv_heads + g) * d;
                float v = dot_floats(q, key, d) * scale;
                p[t] = v;
                if (v > best) best = v;
            }
            __m256 total = _mm256_setzero_ps(), top = _mm256_set1_ps(best);
            int64_t t = 0;
            for (; t + 8 <= len; t += 8) {
                __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(p + t), top));
                _mm256_storeu_ps(p + t, e);
                total = _mm256_add_ps(total, e);
            }
            float sum = hsum(total);
            for (; t < len; t++) {
                p[t] = expf(p[t] - best);
                sum += p[t];
            }
            for (int64_t j = 0; j < d; j++) acc[j] = 0.0f;
            for (t = 0; t < len; t++) {
                const float *value = v_pool + ((table[t / block_size] * block_size + t % block_size) * kv_heads + g) * d;
                __m256 w = _mm256_set1_ps(p[t]);
                int64_t j = 0;
                for (; j + 8 <= d; j += 8)
                    _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(w, _mm256_loadu_ps(value + j), _mm256_loadu_ps(acc + j)));
                for (; j < d; j++) acc[j] += p[t] * value[j];
            }
            float *o = out + s * heads * d + h * d;
            for (int64_t j = 0; j < d; j++) o[j] = acc[j] / sum;
        }
        free(p);
        free(acc);
    }
    return failed ? -1 : 0;
}

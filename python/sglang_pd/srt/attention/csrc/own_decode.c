/* Decode attention of each request over its own KV slots, read in place from an SGLang KV pool, merged
 * into partial results the caller already holds (the shared segments'). sglang_pd, own code.
 *
 * Why C: a decode request's own part (its prompt suffix and generated tokens) is read once per layer
 * per step. In torch that needs the slots gathered into a dense tensor first (a copy every layer) or
 * kept in a dense copy between steps (bookkeeping every step); both cost more than the read itself on
 * a CPU. Here each token's K row and V row ([kv heads, head_dim], contiguous in the pool) are read
 * once, in slot order, with an online softmax: no copy, no padding, no state between calls.
 *
 * Layout (all contiguous): q [B, Hq, D] float32, already multiplied by the softmax scale; k, v the
 * pool buffers of one layer [num_slots, Hkv, D] of `dtype` (0 float32, 1 bfloat16, 2 float16); request
 * b's own slots are slots[indptr[b] .. indptr[b+1]); query head h reads kv head h / (Hq / Hkv).
 * acc_o [B, Hq, D], acc_lse [B, Hq] float32: a partial over other keys (lse -inf: none) on entry; on
 * return the partial over both key sets (exact online-softmax merge). A request with no own slot is
 * left as it was.
 *
 * Returns 0, or (nothing written): 1 a slot outside [0, num_slots); 2 shapes it does not take; 3 no
 * memory for its scratch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PREFETCH_TOKENS 16 /* rows of token t + PREFETCH_TOKENS are requested (into L2) while token t is read */
#define MAX_HEAD_DIM 1024
#define MAX_HEADS 1024

static float bf16_to_float(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float f16_to_float(uint16_t x) {
    const uint32_t sign = (uint32_t)(x & 0x8000u) << 16, exponent = (x >> 10) & 0x1fu, mantissa = x & 0x3ffu;
    uint32_t bits;
    if (exponent == 0) {
        const float sub = ldexpf((float)mantissa, -24); /* zero or subnormal */
        return sign ? -sub : sub;
    }
    bits = exponent == 31 ? (sign | 0x7f800000u | (mantissa << 13)) : (sign | ((exponent + 112u) << 23) | (mantissa << 13));
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Row `slot` of a pool buffer as float32: a pointer into the pool for float32, else converted into `tmp`. */
static const float *row_of(const void *buf, int32_t dtype, int64_t slot, int64_t row_len, float *tmp) {
    if (dtype == 0) return (const float *)buf + slot * row_len;
    const uint16_t *src = (const uint16_t *)buf + slot * row_len;
    for (int64_t i = 0; i < row_len; i++) tmp[i] = dtype == 1 ? bf16_to_float(src[i]) : f16_to_float(src[i]);
    return tmp;
}

static void prefetch_row(const void *buf, int64_t slot, int64_t row_bytes) {
    const char *p = (const char *)buf + slot * row_bytes;
    for (int64_t c = 0; c < row_bytes; c += 64) __builtin_prefetch(p + c, 0, 2); /* L2: the L1 fill buffers are few */
}

/* exp(x) in float32 without libm, so that a loop of them vectorises: Cody-Waite range reduction to
 * x = k ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for exp(r) (Cephes' expf coefficients; about 1
 * ulp), times 2^k built in the exponent bits. exp(x) = 0 below -87.3 (there float32 turns subnormal;
 * a softmax weight that small is 0 to float32 anyway); NaN stays NaN. x <= 0 here (scores minus their max).
 * k is rounded by rintf (one vroundps with -march=native), not by adding and subtracting 1.5 x 2^23: a
 * reassociating float mode (-ffast-math) folds that pair away and leaves k unrounded (exp then off by up
 * to 2x), and it cannot fold rintf. The build passes -fno-fast-math as well, and own_decode_kernel.py
 * checks the loaded kernel against torch before it serves (a miscompile refuses the start). */
static inline float exp_nonpositive(float x) {
    const float xc = x >= -87.0f ? x : -87.0f; /* NaN too: the conversion to int below stays defined */
    const float kf = rintf(xc * 1.44269504088896341f); /* nearest integer */
    const float r = (xc - kf * 0.693359375f) - kf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)kf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float e = x < -87.3f ? 0.0f : p * scale;
    return x != x ? x : e;
}

#define BLOCK 16 /* tokens whose scores are taken, exponentiated and accumulated together */

/* One request: online softmax over its own tokens into o (unnormalised), running max m and sum l, a
 * block of BLOCK tokens at a time (one rescale of o per block and head; the block's exps vectorise). */
static void attend_own(const float *qb, const void *k, const void *v, int32_t dtype, const int32_t *sl, int64_t n,
                       int64_t Hq, int64_t Hkv, int64_t D, float *o, float *m, float *l, float *s, float *tmp_k,
                       float *tmp_v) {
    const int64_t G = Hq / Hkv, row_len = Hkv * D, row_bytes = row_len * (dtype == 0 ? 4 : 2);
    memset(o, 0, sizeof(float) * (size_t)(Hq * D));
    for (int64_t h = 0; h < Hq; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
    }
    for (int64_t t = 0; t < n && t < PREFETCH_TOKENS; t++) {
        prefetch_row(k, sl[t], row_bytes);
        prefetch_row(v, sl[t], row_bytes);
    }
    for (int64_t t0 = 0; t0 < n; t0 += BLOCK) {
        const int64_t nb = n - t0 < BLOCK ? n - t0 : BLOCK;
        for (int64_t j = 0; j < nb; j++) { /* scores s[hq * BLOCK + j] */
            const int64_t t = t0 + j;
            if (t + PREFETCH_TOKENS < n) {
                prefetch_row(k, sl[t + PREFETCH_TOKENS], row_bytes);
                prefetch_row(v, sl[t + PREFETCH_TOKENS], row_bytes);
            }
            const float *kr = row_of(k, dtype, sl[t], row_len, tmp_k);
            for (int64_t h = 0; h < Hkv; h++) {
                const float *kk = kr + h * D;
                for (int64_t g = 0; g < G; g++) {
                    const float *qq = qb + (h * G + g) * D;
                    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
                    for (int64_t d = 0; d < D; d++) acc += qq[d] * kk[d];
                    s[(h * G + g) * BLOCK + j] = acc;
                }
            }
        }
        for (int64_t hq = 0; hq < Hq; hq++) { /* new max, rescale what was accumulated, the block's weights */
            float *sh = s + hq * BLOCK, block_max = -INFINITY, sum = 0.f;
            for (int64_t j = 0; j < nb; j++) block_max = sh[j] > block_max ? sh[j] : block_max;
            if (block_max > m[hq]) {
                const float c = m[hq] == -INFINITY ? 0.f : expf(m[hq] - block_max);
                float *oo = o + hq * D;
                l[hq] *= c;
#pragma omp simd
                for (int64_t d = 0; d < D; d++) oo[d] *= c;
                m[hq] = block_max;
            }
            const float mh = m[hq];
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < nb; j++) {
                sh[j] = exp_nonpositive(sh[j] - mh);
                sum += sh[j];
            }
            l[hq] += sum;
        }
        for (int64_t j = 0; j < nb; j++) { /* o += weights x values */
            const float *vr = row_of(v, dtype, sl[t0 + j], row_len, tmp_v);
            for (int64_t h = 0; h < Hkv; h++) {
                const float *vv = vr + h * D;
                for (int64_t g = 0; g < G; g++) {
                    const float p = s[(h * G + g) * BLOCK + j];
                    float *oo = o + (h * G + g) * D;
#pragma omp simd
                    for (int64_t d = 0; d < D; d++) oo[d] += p * vv[d];
                }
            }
        }
    }
}

int sglang_pd_own_decode_merge(const float *q, const void *k, const void *v, int32_t dtype, int64_t num_slots,
                               const int64_t *indptr, const int32_t *slots, int64_t num_reqs, int64_t Hq,
                               int64_t Hkv, int64_t D, float *acc_o, float *acc_lse) {
    if (dtype < 0 || dtype > 2 || Hkv < 1 || Hq < Hkv || Hq % Hkv || Hq > MAX_HEADS || D < 1 || D > MAX_HEAD_DIM ||
        num_reqs < 0 || indptr[0] != 0)
        return 2;
    for (int64_t b = 0; b < num_reqs; b++)
        if (indptr[b + 1] < indptr[b]) return 2;
    for (int64_t i = 0; i < indptr[num_reqs]; i++)
        if (slots[i] < 0 || slots[i] >= num_slots) return 1;
    float *scratch = malloc(sizeof(float) * (size_t)(Hq * D + 2 * Hq + Hq * BLOCK + 2 * Hkv * D));
    if (scratch == NULL) return 3;
    float *o = scratch, *m = o + Hq * D, *l = m + Hq, *s = l + Hq, *tmp_k = s + Hq * BLOCK, *tmp_v = tmp_k + Hkv * D;
    for (int64_t b = 0; b < num_reqs; b++) {
        const int64_t n = indptr[b + 1] - indptr[b];
        if (n == 0) continue;
        attend_own(q + b * Hq * D, k, v, dtype, slots + indptr[b], n, Hq, Hkv, D, o, m, l, s, tmp_k, tmp_v);
        for (int64_t hq = 0; hq < Hq; hq++) {
            const float lse_own = m[hq] + logf(l[hq]), inv = 1.f / l[hq];
            float *ao = acc_o + (b * Hq + hq) * D;
            const float *oo = o + hq * D;
            const float lse_acc = acc_lse[b * Hq + hq];
            if (lse_acc == -INFINITY) {
                for (int64_t d = 0; d < D; d++) ao[d] = oo[d] * inv;
                acc_lse[b * Hq + hq] = lse_own;
            } else {
                const float mx = lse_acc > lse_own ? lse_acc : lse_own;
                const float wa = expf(lse_acc - mx), wo = expf(lse_own - mx), total = wa + wo;
                const float ca = wa / total, co = wo / total * inv;
                for (int64_t d = 0; d < D; d++) ao[d] = ca * ao[d] + co * oo[d];
                acc_lse[b * Hq + hq] = mx + logf(total);
            }
        }
    }
    free(scratch);
    return 0;
}

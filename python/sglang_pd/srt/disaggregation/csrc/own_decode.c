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

/* One request: online softmax over its own tokens into o (unnormalised), running max m and sum l. */
static void attend_own(const float *qb, const void *k, const void *v, int32_t dtype, const int32_t *sl, int64_t n,
                       int64_t Hq, int64_t Hkv, int64_t D, float *o, float *m, float *l, float *tmp_k, float *tmp_v) {
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
    for (int64_t t = 0; t < n; t++) {
        if (t + PREFETCH_TOKENS < n) {
            prefetch_row(k, sl[t + PREFETCH_TOKENS], row_bytes);
            prefetch_row(v, sl[t + PREFETCH_TOKENS], row_bytes);
        }
        const float *kr = row_of(k, dtype, sl[t], row_len, tmp_k), *vr = row_of(v, dtype, sl[t], row_len, tmp_v);
        for (int64_t h = 0; h < Hkv; h++) {
            const float *kk = kr + h * D, *vv = vr + h * D;
            for (int64_t g = 0; g < G; g++) {
                const int64_t hq = h * G + g;
                const float *qq = qb + hq * D;
                float *oo = o + hq * D;
                float s = 0.f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < D; d++) s += qq[d] * kk[d];
                if (s > m[hq]) { /* new running max: rescale what was accumulated (exp(-inf) = 0 at first) */
                    const float c = expf(m[hq] - s);
                    l[hq] = l[hq] * c + 1.f;
#pragma omp simd
                    for (int64_t d = 0; d < D; d++) oo[d] = oo[d] * c + vv[d];
                    m[hq] = s;
                } else {
                    const float p = expf(s - m[hq]);
                    l[hq] += p;
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
    float *scratch = malloc(sizeof(float) * (size_t)(Hq * D + 2 * Hq + 2 * Hkv * D));
    if (scratch == NULL) return 3;
    float *o = scratch, *m = o + Hq * D, *l = m + Hq, *tmp_k = l + Hq, *tmp_v = tmp_k + Hkv * D;
    for (int64_t b = 0; b < num_reqs; b++) {
        const int64_t n = indptr[b + 1] - indptr[b];
        if (n == 0) continue;
        attend_own(q + b * Hq * D, k, v, dtype, slots + indptr[b], n, Hq, Hkv, D, o, m, l, tmp_k, tmp_v);
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

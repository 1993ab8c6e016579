/* Fused loops for a CPU: no-grad decoding and parts of training (sat_core.native builds and loads this file).

   attention_scores: f_att's scores without the (B, k, L, A) block. Each image's projection row
   proj[b, l, :] is read once and stays in L1 while every beam of the image uses it:
       e[b, j, l] = sum_a w[a] * sigmoid(proj[b, l, a] + wh[b, j, a])
   (AttentionMLP's doubled form of w^T tanh(.)).

   exact_logits: chosen words' logits in fp32, W[word] . x + b[word], without gathering W's rows.

   top_words: each row's n best non-banned logits (bf16 or fp32) with their ids, the row's max over
   every word and sum_i exp(x_i - max): the normaliser of the softmax, in one read of the row.

   attention_scores_backward, attention_context(_backward): the scores' backward pass and the context
   vectors sum_l alpha_l a_l with their backward pass for alpha, for training.

   All split their rows over `threads` OpenMP threads. Compiled with -O3 -ffast-math (and
   -march=native where the compiler accepts it) so the inner loops run on the CPU's vector units.
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*range_fn)(void *args, int64_t start, int64_t stop);

/* Runs fn over [0, n) in `threads` contiguous parts. Built with -fopenmp, the parts run on the
   process's OpenMP threads, which are PyTorch's own where PyTorch ships the same libgomp.so.1 (it
   does on Linux): one pool, no second set of threads spinning against the first. */
static void parallel(range_fn fn, void *args, int64_t n, int threads) {
    if (threads > n) threads = (int)n;
    if (threads <= 1) {
        fn(args, 0, n);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++)
        fn(args, n * t / threads, n * (t + 1) / threads);
}

static inline float bf16_to_float(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- attention scores ---------------------------------------------------------------------- */

struct scores_args {
    const float *proj; /* (B, L, A) */
    const float *wh;   /* (B, k, A) */
    const float *w;    /* (A,) */
    float *e;          /* (B, k, L) */
    int64_t k, L, A;
};

/* exp(x) for |x| <= 87: 2^n · 2^f with n = round(x log2 e), |f| <= 1/2, and 2^f from its Taylor series
   to degree 6 (relative error below 1.3e-7, about fp32's rounding). Written out so that the compiler
   vectorises it inline: libm's expf, even vectorised, costs three times the rest of the loop. */
static inline float exp_approx(float x) {
    float t = x * 1.44269504088896341f;
    float n = __builtin_roundf(t);
    float f = t - n;
    float p = 1.5403530393381606e-04f;
    p = p * f + 1.3333558146428441e-03f;
    p = p * f + 9.618129107628477e-03f;
    p = p * f + 5.5504108664821576e-02f;
    p = p * f + 2.402265069591007e-01f;
    p = p * f + 6.931471805599453e-01f;
    p = p * f + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static float score(const float *restrict p, const float *restrict q, const float *restrict w, int64_t A) {
    float acc = 0.0f;
    for (int64_t a = 0; a < A; a++) {
        float x = p[a] + q[a];
        x = fminf(fmaxf(x, -30.0f), 30.0f); /* sigmoid is 0 or 1 to fp32 beyond; exp stays finite */
        acc += w[a] / (1.0f + exp_approx(-x));
    }
    return acc;
}

static void scores_range(void *p, int64_t start, int64_t stop) {
    const struct scores_args *s = (const struct scores_args *)p;
    const int64_t k = s->k, L = s->L, A = s->A;
    for (int64_t b = start; b < stop; b++) {
        const float *proj = s->proj + b * L * A;
        const float *wh = s->wh + b * k * A;
        float *e = s->e + b * k * L;
        for (int64_t l = 0; l < L; l++)
            for (int64_t j = 0; j < k; j++)
                e[j * L + l] = score(proj + l * A, wh + j * A, s->w, A);
    }
}

void attention_scores(const float *proj, const float *wh, const float *w, float *e,
                      int64_t B, int64_t k, int64_t L, int64_t A, int threads) {
    struct scores_args s = {proj, wh, w, e, k, L, A};
    parallel(scores_range, &s, B, threads);
}

/* The scores' backward pass for training, forming sigma again instead of storing the block. For each
   image b, position l and row j, with s = sigmoid(proj[b, l, :] + wh[b, j, :]) and g = grad_e[b, j, l]:
       grad_proj[b, l, a] (+)= sum_j g w[a] s(1 - s)      (written, or added where `accumulate`)
       grad_wh[b, j, a]     = sum_l g w[a] s(1 - s)
       grad_w[b, a]         = sum_{j, l} g s              (one row per image; the caller sums them)
   Images are split over the threads, so no two threads write the same place. */
struct scores_back_args {
    const float *proj, *wh, *w, *grad_e; /* (B, L, A), (B, k, A), (A,), (B, k, L) */
    float *grad_proj, *grad_wh, *grad_w; /* (B, L, A), (B, k, A), (B, A) */
    int accumulate;
    int64_t k, L, A;
};

static void score_back(const float *restrict p, const float *restrict q, const float *restrict w, float g,
                       float *restrict gw, float *restrict gp, float *restrict gq, int64_t A) {
    for (int64_t a = 0; a < A; a++) {
        float x = fminf(fmaxf(p[a] + q[a], -30.0f), 30.0f);
        float sg = 1.0f / (1.0f + exp_approx(-x));
        gw[a] += g * sg;
        float d = g * w[a] * sg * (1.0f - sg);
        gp[a] += d;
        gq[a] += d;
    }
}

static void scores_back_range(void *p, int64_t start, int64_t stop) {
    const struct scores_back_args *s = (const struct scores_back_args *)p;
    const int64_t k = s->k, L = s->L, A = s->A;
    const float *w = s->w;
    for (int64_t b = start; b < stop; b++) {
        float *gw = s->grad_w + b * A;
        float *gwh = s->grad_wh + b * k * A;
        memset(gw, 0, A * sizeof(float));
        memset(gwh, 0, k * A * sizeof(float));
        for (int64_t l = 0; l < L; l++) {
            const float *pr = s->proj + (b * L + l) * A;
            float *gp = s->grad_proj + (b * L + l) * A;
            if (!s->accumulate) memset(gp, 0, A * sizeof(float));
            for (int64_t j = 0; j < k; j++) {
                const float g = s->grad_e[(b * k + j) * L + l];
                if (g == 0.0f) continue;
                score_back(pr, s->wh + (b * k + j) * A, w, g, gw, gp, gwh + j * A, A);
            }
        }
    }
}

void attention_scores_backward(const float *proj, const float *wh, const float *w, const float *grad_e,
                               float *grad_proj, int accumulate, float *grad_wh, float *grad_w,
                               int64_t B, int64_t k, int64_t L, int64_t A, int threads) {
    struct scores_back_args s = {proj, wh, w, grad_e, grad_proj, grad_wh, grad_w, accumulate, k, L, A};
    parallel(scores_back_range, &s, B, threads);
}

/* ---- the context vectors for training ------------------------------------------------------ */

/* context[b, j, :] = sum_l alpha[b, j, l] feats[b, l, :], and its backward pass for alpha,
       grad_alpha[b, j, l] = feats[b, l, :] . grad[b, j, :].
   feats, context and grad are bf16 (as uint16) or fp32; alpha and grad_alpha fp32; sums in fp32. Each
   image's feature rows are read once for all its k rows, which stay in cache. */
struct context_args {
    const float *alpha;  /* (B, k, L) */
    const void *feats;   /* (B, L, D) */
    const void *grad;    /* (B, k, D), backward only */
    void *out;           /* (B, k, D) context, or (B, k, L) fp32 grad_alpha */
    int bf16;
    int64_t k, L, D;
};

static inline uint16_t float_to_bf16(float f) { /* round to nearest even */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static void axpy_bf16(float *restrict acc, const uint16_t *restrict x, float a, int64_t D) {
    for (int64_t d = 0; d < D; d++) acc[d] += a * bf16_to_float(x[d]);
}

static void axpy_f32(float *restrict acc, const float *restrict x, float a, int64_t D) {
    for (int64_t d = 0; d < D; d++) acc[d] += a * x[d];
}

static float dot_bf16(const uint16_t *restrict x, const uint16_t *restrict y, int64_t D) {
    float acc = 0.0f;
    for (int64_t d = 0; d < D; d++) acc += bf16_to_float(x[d]) * bf16_to_float(y[d]);
    return acc;
}

static float dot_f32(const float *restrict x, const float *restrict y, int64_t D) {
    float acc = 0.0f;
    for (int64_t d = 0; d < D; d++) acc += x[d] * y[d];
    return acc;
}

static void context_range(void *p, int64_t start, int64_t stop) {
    const struct context_args *s = (const struct context_args *)p;
    const int64_t k = s->k, L = s->L, D = s->D;
    float *acc = (float *)malloc((size_t)(k * D) * sizeof(float));
    if (!acc) return; /* the caller has filled the output with NaN: a failure cannot pass unnoticed */
    for (int64_t b = start; b < stop; b++) {
        memset(acc, 0, (size_t)(k * D) * sizeof(float));
        const float *alpha = s->alpha + b * k * L;
        for (int64_t l = 0; l < L; l++) {
            for (int64_t j = 0; j < k; j++) {
                const float a = alpha[j * L + l];
                if (a == 0.0f) continue;
                if (s->bf16)
                    axpy_bf16(acc + j * D, (const uint16_t *)s->feats + (b * L + l) * D, a, D);
                else
                    axpy_f32(acc + j * D, (const float *)s->feats + (b * L + l) * D, a, D);
            }
        }
        if (s->bf16) {
            uint16_t *out = (uint16_t *)s->out + b * k * D;
            for (int64_t i = 0; i < k * D; i++) out[i] = float_to_bf16(acc[i]);
        } else {
            memcpy((float *)s->out + b * k * D, acc, (size_t)(k * D) * sizeof(float));
        }
    }
    free(acc);
}

static void context_back_range(void *p, int64_t start, int64_t stop) {
    const struct context_args *s = (const struct context_args *)p;
    const int64_t k = s->k, L = s->L, D = s->D;
    for (int64_t b = start; b < stop; b++) {
        float *grad_alpha = (float *)s->out + b * k * L;
        for (int64_t l = 0; l < L; l++)
            for (int64_t j = 0; j < k; j++)
                grad_alpha[j * L + l] =
                    s->bf16 ? dot_bf16((const uint16_t *)s->feats + (b * L + l) * D,
                                       (const uint16_t *)s->grad + (b * k + j) * D, D)
                            : dot_f32((const float *)s->feats + (b * L + l) * D,
                                      (const float *)s->grad + (b * k + j) * D, D);
    }
}

void attention_context(const float *alpha, const void *feats, int bf16, void *out,
                       int64_t B, int64_t k, int64_t L, int64_t D, int threads) {
    struct context_args s = {alpha, feats, NULL, out, bf16, k, L, D};
    parallel(context_range, &s, B, threads);
}

void attention_context_backward(const void *feats, const void *grad, int bf16, float *grad_alpha,
                                int64_t B, int64_t k, int64_t L, int64_t D, int threads) {
    struct context_args s = {NULL, feats, grad, grad_alpha, bf16, k, L, D};
    parallel(context_back_range, &s, B, threads);
}

/* ---- each row's best words and its softmax normaliser ------------------------------------- */

struct top_args {
    const void *logits; /* (N, V) bf16 (as uint16) or fp32 */
    int bf16;
    const uint8_t *banned; /* (V,) 1 where a word may not be chosen (it still counts in the sum) */
    int64_t V, n_top;
    float *top;     /* (N, n_top) values, best first; -inf where fewer words are allowed */
    int64_t *words; /* (N, n_top) */
    float *row_max; /* (N,) */
    double *sum;    /* (N,) sum_i exp(x_i - row_max) */
};

/* Words per piece of a row: converted to fp32 into a buffer that stays in L1, however large V is. */
#define PIECE 2048

static void top_range(void *p, int64_t start, int64_t stop) {
    const struct top_args *s = (const struct top_args *)p;
    const int64_t V = s->V, n = s->n_top;
    float buf[PIECE];
    for (int64_t r = start; r < stop; r++) {
        float *top = s->top + r * n;
        int64_t *words = s->words + r * n;
        for (int64_t j = 0; j < n; j++) {
            top[j] = -INFINITY;
            words[j] = 0;
        }
        int64_t filled = 0;
        float m = -INFINITY, acc = 0.0f; /* running max and sum of exp(x - m), rescaled when m grows */
        for (int64_t at = 0; at < V; at += PIECE) {
            const int64_t len = V - at < PIECE ? V - at : PIECE;
            if (s->bf16) {
                const uint16_t *x = (const uint16_t *)s->logits + r * V + at;
                for (int64_t i = 0; i < len; i++) buf[i] = bf16_to_float(x[i]);
            } else {
                memcpy(buf, (const float *)s->logits + r * V + at, len * sizeof(float));
            }
            float piece_max = -INFINITY;
            for (int64_t i = 0; i < len; i++) piece_max = fmaxf(piece_max, buf[i]);
            if (piece_max > m) {
                acc = m == -INFINITY ? 0.0f : acc * expf(m - piece_max);
                m = piece_max;
            }
            float part = 0.0f;
            for (int64_t i = 0; i < len; i++) part += expf(buf[i] - m);
            acc += part;
            /* insertion into a sorted list of n: most words fail the first comparison */
            for (int64_t i = 0; i < len; i++) {
                float v = buf[i];
                if ((filled == n && !(v > top[n - 1])) || s->banned[at + i]) continue;
                int64_t j = filled < n ? filled++ : n - 1;
                while (j > 0 && top[j - 1] < v) { /* ties keep the lower id first, as a stable sort */
                    top[j] = top[j - 1];
                    words[j] = words[j - 1];
                    j--;
                }
                top[j] = v;
                words[j] = at + i;
            }
        }
        s->row_max[r] = m;
        s->sum[r] = acc;
    }
}

void top_words(const void *logits, int bf16, const uint8_t *banned, int64_t N, int64_t V, int64_t n_top,
               float *top, int64_t *words, float *row_max, double *sum, int threads) {
    struct top_args s = {logits, bf16, banned, V, n_top, top, words, row_max, sum};
    parallel(top_range, &s, N, threads);
}

/* ---- chosen words' logits in fp32 ---------------------------------------------------------- */

struct exact_args {
    const float *W, *bias, *x; /* (V, m), (V,), (N, m) */
    const int64_t *words;      /* (N, n) */
    float *out;                /* (N, n) */
    int64_t m, n;
};

static void exact_range(void *p, int64_t start, int64_t stop) {
    const struct exact_args *s = (const struct exact_args *)p;
    for (int64_t r = start; r < stop; r++) {
        const float *restrict x = s->x + r * s->m;
        for (int64_t j = 0; j < s->n; j++) {
            const int64_t word = s->words[r * s->n + j];
            const float *restrict w = s->W + word * s->m;
            float acc = 0.0f;
            for (int64_t i = 0; i < s->m; i++) acc += w[i] * x[i];
            s->out[r * s->n + j] = acc + s->bias[word];
        }
    }
}

void exact_logits(const float *W, const float *bias, const float *x, const int64_t *words, float *out,
                  int64_t N, int64_t m, int64_t n, int threads) {
    struct exact_args s = {W, bias, x, words, out, m, n};
    parallel(exact_range, &s, N, threads);
}

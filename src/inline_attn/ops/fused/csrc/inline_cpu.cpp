// Fused InLine attention core for the CPU: forward and backward.
//
// One task per sample (or per sample and head when samples are few): the key/value means, the
// centred D x D key-value products, and O = phi(Q) M + v_bar + local residual (paper Eq. 5 plus
// Sec. 4.2; phi = identity), all while the task's tokens are in cache. The two products go to the
// BLAS bundled with PyTorch (MKL's sgemm_ / dgemm_, exported by libtorch_cpu); everything else is
// plain loops over contiguous channels. Q, K, V are read once in place and O is written once,
// token-major, ready for the output projection.
//
// Layout: q, k, v are [B, N, C] with unit channel stride, any batch stride, and a token stride of
// at least C (rows do not overlap; a BLAS leading dimension must be at least the row length; the
// stride of a single-token dimension is ignored). Heads are contiguous channel blocks of size
// d = C / heads. w9 (optional) is [B, 9, C] contiguous: tap t = 3 * (dy + 1) + (dx + 1) of channel
// c's 3x3 residual kernel. Tokens [0, p) are prefix tokens (no residual); token p + y * W + x is
// grid cell (y, x). The result is [B, N, C] contiguous. inline_attn/ops/fused/cpu.py copies
// inputs that break this layout before calling cpu_forward / cpu_backward.
//
// cpu_layer is the whole layer core of an InLine layer with its residual predictor (paper
// Sec. 4.2): ctx = mean_n x, taps = W2 GELU(W1 ctx + b1) + b2 (grouped products, one group per
// head; channel c takes outputs [9c, 9c + 9)), then the core above with w9 = taps. Its autograd is
// registered here too (InlineLayer), so that an eager layer step crosses one C++ autograd node
// and no Python on this path: a small layer's step is host-bound, and the predictor's dozen aten
// ops and a Python autograd.Function cost more than the arithmetic. It takes any float dtypes and
// layouts: everything is computed in float64 when q or w1 is float64, else in float32. cpu_core is
// the core alone with its own C++ autograd node (InlineCore), for eager calls with given taps.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc);
}

namespace {

// Column-major BLAS gemm: C = alpha * op(A) op(B) + beta * C.
inline void gemm(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}
inline void gemm(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

// Row-major C [m, n] = alpha op(A) op(B) + beta C, with A, B, C row-major (leading dimensions lda,
// ldb, ldc): the column-major gemm of the transposes, C^T = op(B)^T op(A)^T.
template <typename T>
inline void gemm_rows(char ta, char tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                      const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  gemm(tb, ta, int(n), int(m), int(k), alpha, b, int(ldb), a, int(lda), beta, c, int(ldc));
}

// The token stride as a BLAS leading dimension: a single token's stride is meaningless (PyTorch
// keeps any value for a size-1 dimension), so it reads as the row length.
inline int64_t row_stride(const at::Tensor& t) { return t.size(1) > 1 ? t.stride(1) : t.size(2); }

// A [B, N, C] input as the loops read it: its data, batch stride and token stride (row_stride);
// at(b, c0) is sample b's first token at channel c0.
template <typename T>
struct Tokens {
  const T* data;
  int64_t sb, sn;
  explicit Tokens(const at::Tensor& t) : data(t.data_ptr<T>()), sb(t.stride(0)), sn(row_stride(t)) {}
  const T* at(int64_t b, int64_t c0) const { return data + b * sb + c0; }
};

// A task is one sample and a block of g consecutive heads (g * d channels): whole samples when
// there are many (windows), so the memory-bound loops run over long channel rows; single heads
// when there are few samples, so every thread gets work.
int64_t heads_per_task(int64_t B, int64_t heads) {
  const int64_t threads = at::get_num_threads();
  int64_t g = heads;
  while (g > 1 && B * (heads / g) < 4 * threads) {
    int64_t next = g - 1;
    while (heads % next != 0) --next;
    g = next;
  }
  return g;
}

// Column means of a [N, cg] block with row stride ld.
template <typename T>
void column_means(const T* x, int64_t ld, int64_t N, int64_t cg, T* mean) {
  std::fill(mean, mean + cg, T(0));
  for (int64_t n = 0; n < N; ++n) {
    const T* xn = x + n * ld;
    for (int64_t a = 0; a < cg; ++a) mean[a] += xn[a];
  }
  for (int64_t a = 0; a < cg; ++a) mean[a] /= static_cast<T>(N);
}

// dst[n] = src[n] - mean and mean (rounded to T) for a [N, cg] block (dst contiguous, src row
// stride ld). The mean is summed and subtracted in double: each centred value is then exact to its
// own rounding, so the centred columns sum to zero to within their spread's rounding, however far
// the mean is from zero. Rounded to T first, the mean's error (up to N / 2 ulps of the mean, in
// float) would shift every centred value alike, and the backward's dK = alpha Vc dM^T and
// dV = alpha Kc dM, which take sum_n Vc_n = sum_n Kc_n = 0, would carry that shift whole.
template <typename T>
void centre(const T* src, int64_t ld, int64_t N, int64_t cg, T* mean, T* dst) {
  std::vector<double> exact(cg, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const T* sn = src + n * ld;
    for (int64_t a = 0; a < cg; ++a) exact[a] += static_cast<double>(sn[a]);
  }
  for (int64_t a = 0; a < cg; ++a) {
    exact[a] /= static_cast<double>(N);
    mean[a] = static_cast<T>(exact[a]);
  }
  for (int64_t n = 0; n < N; ++n) {
    const T* sn = src + n * ld;
    T* dn = dst + n * cg;
    for (int64_t a = 0; a < cg; ++a) dn[a] = static_cast<T>(static_cast<double>(sn[a]) - exact[a]);
  }
}

// The task's key and value means and its centred keys and values (row-major [N, cg]): the
// cancellation stays out of the product, and a large value mean cannot amplify the centred keys'
// rounding. The backward recomputes them exactly as the forward did.
template <typename T>
void centre_keys_values(const T* kb, int64_t ksn, const T* vb, int64_t vsn, int64_t N, int64_t cg, T* kbar,
                        T* vbar, T* kc, T* vc) {
  centre(kb, ksn, N, cg, kbar, kc);
  centre(vb, vsn, N, cg, vbar, vc);
}

// M[a][e] = alpha * sum_n kc[n][a] vc[n][e] (row-major [d, d]) for the head whose centred keys and
// values start at kc, vc (row stride cg). Column-major that is M^T = Vc^T Kc: A = Vc (col-major
// d x N, lda = cg), B = Kc^T.
template <typename T>
inline void key_value_product(const T* kc, const T* vc, int64_t N, int64_t d, int64_t cg, T alpha, T* m) {
  gemm('N', 'T', int(d), int(d), int(N), alpha, vc, int(cg), kc, int(cg), T(0), m, int(d));
}

// Calls f(t, m) for each neighbour of token n's grid cell (y, x) = divmod(n - p, W) inside the H x W
// map: m = p + (y + dy) * W + (x + dx) is the neighbour's token and t = 3 * (dy + 1) + (dx + 1) its
// tap. Neighbours off the map are skipped (the residual's zero padding). n must be a grid token.
template <typename F>
inline void for_each_neighbour(int64_t n, int64_t p, int64_t H, int64_t W, F&& f) {
  const int64_t y = (n - p) / W, x = (n - p) % W;
  for (int64_t dy = -1; dy <= 1; ++dy) {
    const int64_t yy = y + dy;
    if (yy < 0 || yy >= H) continue;
    for (int64_t dx = -1; dx <= 1; ++dx) {
      const int64_t xx = x + dx;
      if (xx < 0 || xx >= W) continue;
      f(3 * (dy + 1) + (dx + 1), p + yy * W + xx);
    }
  }
}

template <typename T>
void inline_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const T* w9, at::Tensor& out, int64_t heads, double scale, int64_t H,
                    int64_t W, int64_t p) {
  const int64_t B = q.size(0), N = q.size(1), C = q.size(2), d = C / heads;
  const Tokens<T> Q(q), K(k), V(v);
  T* op = out.data_ptr<T>();
  const T alpha = static_cast<T>(scale / static_cast<double>(N));
  const int64_t g = heads_per_task(B, heads), blocks = heads / g, cg = g * d;

  at::parallel_for(0, B * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> kc(N * cg), vc(N * cg), m(d * d), kbar(cg), vbar(cg);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / blocks, c0 = (task % blocks) * cg;
      const T *qb = Q.at(b, c0), *kb = K.at(b, c0), *vb = V.at(b, c0);
      T* ob = op + b * N * C + c0;

      centre_keys_values(kb, K.sn, vb, V.sn, N, cg, kbar.data(), vbar.data(), kc.data(), vc.data());
      // O = v_bar, plus the 3x3 residual on grid tokens (zero padding at the map's border).
      for (int64_t n = 0; n < N; ++n) {
        T* on = ob + n * C;
        for (int64_t a = 0; a < cg; ++a) on[a] = vbar[a];
        if (w9 == nullptr || n < p) continue;
        for_each_neighbour(n, p, H, W, [&](int64_t t, int64_t m) {
          const T* wt = w9 + (b * 9 + t) * C + c0;
          const T* vm = vb + m * V.sn;
          for (int64_t a = 0; a < cg; ++a) on[a] += wt[a] * vm[a];
        });
      }
      for (int64_t i = 0; i < g; ++i) {
        const int64_t ci = i * d;
        // M = scale / N * Kc^T Vc (row-major [d, d]).
        key_value_product(kc.data() + ci, vc.data() + ci, N, d, cg, alpha, m.data());
        // O^T += M^T Q^T (column-major): A = M (lda = d), B = Q (ldb = Q.sn), C = O (ldc = C).
        gemm('N', 'N', int(d), int(N), int(d), T(1), m.data(), int(d), qb + ci, int(Q.sn), T(1), ob + ci, int(C));
      }
    }
  });
}

// Backward of inline_forward. Per head, with alpha = scale / N, Kc = K - k_bar, Vc = V - v_bar,
// M = alpha Kc^T Vc (= alpha Kc^T V) and O = Q M + v_bar + R(V, w):
//   dQ = G M^T;  dM = Q^T G;  dK = alpha Vc dM^T;  dV = alpha Kc dM + mean_n G_n + R^T(G, w);
//   dw[t] = sum_n G_n * V_{n + t}.
// The means' own gradients vanish (k_bar's is -alpha / N sum_n Vc_n dM^T, v_bar's in M the same
// with Kc): that holds of the centred values as `centre` computes them, to their rounding.
// M is recomputed (one d x d product) instead of saved.
template <typename T>
void inline_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const T* w9,
                     const at::Tensor& grad, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, T* dw9,
                     int64_t heads, double scale, int64_t H, int64_t W, int64_t p) {
  const int64_t B = q.size(0), N = q.size(1), C = q.size(2), d = C / heads;
  const Tokens<T> Q(q), K(k), V(v), G(grad);
  T* dqp = dq.data_ptr<T>();
  T* dkp = dk.data_ptr<T>();
  T* dvp = dv.data_ptr<T>();
  const T alpha = static_cast<T>(scale / static_cast<double>(N));
  const int64_t g = heads_per_task(B, heads), blocks = heads / g, cg = g * d;

  at::parallel_for(0, B * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> kc(N * cg), vc(N * cg), m(d * d), dm(d * d), kbar(cg), vbar(cg), gbar(cg);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / blocks, c0 = (task % blocks) * cg;
      const T *qb = Q.at(b, c0), *kb = K.at(b, c0), *vb = V.at(b, c0), *gb = G.at(b, c0);
      T* dqb = dqp + b * N * C + c0;
      T* dkb = dkp + b * N * C + c0;
      T* dvb = dvp + b * N * C + c0;

      centre_keys_values(kb, K.sn, vb, V.sn, N, cg, kbar.data(), vbar.data(), kc.data(), vc.data());
      column_means(gb, G.sn, N, cg, gbar.data());

      // dV = mean(G) + R^T(G, w) (the residual's transpose: V at (y, x) fed the output at its
      // neighbour (y + dy, x + dx) through the mirrored tap 8 - t, since that output read it at
      // (-dy, -dx)); dw[t] = sum over outputs of G * V at the output's neighbour t. Tasks of one
      // sample share dw9's row but each owns channels [c0, c0 + cg): the += cannot race.
      for (int64_t n = 0; n < N; ++n) {
        T* dn = dvb + n * C;
        for (int64_t a = 0; a < cg; ++a) dn[a] = gbar[a];
        if (w9 == nullptr || n < p) continue;
        const T* gn = gb + n * G.sn;
        for_each_neighbour(n, p, H, W, [&](int64_t t, int64_t m) {
          const T* wt = w9 + (b * 9 + 8 - t) * C + c0;
          const T* gm = gb + m * G.sn;
          for (int64_t a = 0; a < cg; ++a) dn[a] += wt[a] * gm[a];
          T* dwt = dw9 + (b * 9 + t) * C + c0;
          const T* vm = vb + m * V.sn;
          for (int64_t a = 0; a < cg; ++a) dwt[a] += gn[a] * vm[a];
        });
      }
      for (int64_t i = 0; i < g; ++i) {
        const int64_t ci = i * d;
        // M (row-major [d, d]) as in the forward; dM[a][e] = sum_n q[n][a] g[n][e], the same pattern.
        key_value_product(kc.data() + ci, vc.data() + ci, N, d, cg, alpha, m.data());
        gemm('N', 'T', int(d), int(d), int(N), T(1), gb + ci, int(G.sn), qb + ci, int(Q.sn), T(0), dm.data(),
             int(d));
        // dQ[n][a] = sum_e g[n][e] M[a][e]: column-major dQ^T = M G^T (A = stored M^T, transposed).
        gemm('T', 'N', int(d), int(N), int(d), T(1), m.data(), int(d), gb + ci, int(G.sn), T(0), dqb + ci, int(C));
        // dK[n][a] = alpha sum_e vc[n][e] dM[a][e]: the same pattern with Vc and dM.
        gemm('T', 'N', int(d), int(N), int(d), alpha, dm.data(), int(d), vc.data() + ci, int(cg), T(0), dkb + ci,
             int(C));
        // dV[n][e] += alpha sum_a kc[n][a] dM[a][e]: the forward's O += Q M pattern.
        gemm('N', 'N', int(d), int(N), int(d), alpha, dm.data(), int(d), kc.data() + ci, int(cg), T(1), dvb + ci,
             int(C));
      }
    }
  });
}

void check_tokens(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.dim() == 3, name, " must be [B, N, C], got ", t.sizes());
  TORCH_CHECK(t.sizes() == q.sizes(), name, " must have q's shape ", q.sizes(), ", got ", t.sizes());
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), name, " must have q's dtype");
  TORCH_CHECK(t.size(2) <= 1 || t.stride(2) == 1, name, " must have unit channel stride, got strides ", t.strides());
  TORCH_CHECK(row_stride(t) >= t.size(2), name, " must have a token stride of at least C=", t.size(2),
              " (rows must not overlap), got strides ", t.strides());
  TORCH_CHECK(t.size(1) < INT_MAX && t.size(2) < INT_MAX && row_stride(t) < INT_MAX, name,
              " is too large for the BLAS calls (32-bit sizes), got ", t.sizes());
}

// Validates the op's arguments (shared by forward and backward); returns w9 made contiguous, or an
// undefined tensor when there is no residual.
at::Tensor check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const std::optional<at::Tensor>& w9, int64_t num_heads, int64_t H, int64_t W,
                        int64_t num_prefix_tokens) {
  check_tokens(q, "q", q);
  check_tokens(k, "k", q);
  check_tokens(v, "v", q);
  const int64_t B = q.size(0), N = q.size(1), C = q.size(2);
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, "float32 or float64 only");
  TORCH_CHECK(num_heads > 0 && C % num_heads == 0, "C=", C, " must be a multiple of num_heads=", num_heads);
  TORCH_CHECK(num_prefix_tokens >= 0 && num_prefix_tokens + H * W == N, "N=", N, " must equal ",
              num_prefix_tokens, " + ", H, "*", W);
  if (!w9.has_value()) return at::Tensor();
  at::Tensor w = w9->contiguous();
  TORCH_CHECK(w.dim() == 3 && w.size(0) == B && w.size(1) == 9 && w.size(2) == C,
              "w9 must be [B, 9, C], got ", w.sizes());
  TORCH_CHECK(w.scalar_type() == q.scalar_type(), "w9 must have q's dtype");
  TORCH_CHECK(w.device().is_cpu(), "w9 must be on the CPU, got ", w.device());
  return w;
}

template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

template <typename T>
T* data_or_null(at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

at::Tensor inline_forward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& w9, int64_t num_heads, double scale,
                              int64_t H, int64_t W, int64_t num_prefix_tokens) {
  const at::Tensor w = check_inputs(q, k, v, w9, num_heads, H, W, num_prefix_tokens);
  at::Tensor out = at::empty(q.sizes(), q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "inline_forward", [&] {
    inline_forward<scalar_t>(q, k, v, data_or_null<scalar_t>(w), out, num_heads, scale, H, W, num_prefix_tokens);
  });
  return out;
}

std::vector<at::Tensor> inline_backward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const std::optional<at::Tensor>& w9, const at::Tensor& grad,
                                            int64_t num_heads, double scale, int64_t H, int64_t W,
                                            int64_t num_prefix_tokens) {
  const at::Tensor w = check_inputs(q, k, v, w9, num_heads, H, W, num_prefix_tokens);
  check_tokens(grad, "grad", q);
  at::Tensor dw = w.defined() ? at::zeros(w.sizes(), q.options()) : at::Tensor();
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(q.sizes(), q.options());
  at::Tensor dv = at::empty(q.sizes(), q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "inline_backward", [&] {
    inline_backward<scalar_t>(q, k, v, data_or_null<scalar_t>(w), grad, dq, dk, dv, data_or_null<scalar_t>(dw),
                              num_heads, scale, H, W, num_prefix_tokens);
  });
  return {dq, dk, dv, dw.defined() ? dw : at::empty({0}, q.options())};
}

// ---- The layer core with its residual predictor (cpu_layer) ----

// The residual predictor's parameters, contiguous in the compute type: w1 [C, cg] (a Conv1d
// weight [C, cg, 1] read flat), b1 [C], w2 [9C, cg], b2 [9C]; group g (one per head) owns w1's
// rows [g cg, (g + 1) cg) and w2's rows [9 g cg, 9 (g + 1) cg).
struct Params {
  at::Tensor w1, b1, w2, b2;
};

template <typename T>
struct Predictor {
  const T *w1, *b1, *w2, *b2;
  int64_t C, groups, cg;
  Predictor(const Params& p, int64_t C, int64_t groups)
      : w1(p.w1.data_ptr<T>()), b1(p.b1.data_ptr<T>()), w2(p.w2.data_ptr<T>()), b2(p.b2.data_ptr<T>()), C(C),
        groups(groups), cg(C / groups) {}
};

// Exact GELU (nn.GELU's default) and its derivative Phi(y) + y phi(y), as aten's gelu_backward.
template <typename T>
inline T gelu(T y) {
  return T(0.5) * y * (T(1) + std::erf(y * T(M_SQRT1_2)));
}
template <typename T>
inline T gelu_grad(T y) {
  const T cdf = T(0.5) * (T(1) + std::erf(y * T(M_SQRT1_2)));
  const T pdf = std::exp(T(-0.5) * y * y) * T(0.3989422804014327);  // 1 / sqrt(2 pi)
  return cdf + y * pdf;
}

// f(b) for every sample b, in parallel over the samples (Swin has thousands of windows a layer;
// one sample's work is a few hundred values, hence the grain).
template <typename F>
void for_each_sample(int64_t B, int64_t values_per_sample, F&& f) {
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, values_per_sample));
  at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) f(b);
  });
}

// sums[j] = sum_b rows[b * cols + j], in parallel over blocks of columns (each sum has one owner
// and one order, so the result does not depend on the thread count).
template <typename T>
void column_sums(const T* rows, int64_t B, int64_t cols, T* sums) {
  at::parallel_for(0, cols, 256, [&](int64_t begin, int64_t end) {
    std::fill(sums + begin, sums + end, T(0));
    for (int64_t b = 0; b < B; ++b) {
      const T* r = rows + b * cols;
      for (int64_t j = begin; j < end; ++j) sums[j] += r[j];
    }
  });
}

// y1 [B, C] = W1 ctx + b1 per group: the first product's pre-activation.
template <typename T>
void predictor_hidden(const Predictor<T>& P, const T* ctx, int64_t B, T* y1) {
  const int64_t C = P.C, cg = P.cg;
  for (int64_t g = 0; g < P.groups; ++g)
    gemm_rows('N', 'T', B, cg, cg, T(1), ctx + g * cg, C, P.w1 + g * cg * cg, cg, T(0), y1 + g * cg, C);
  for_each_sample(B, C, [&](int64_t b) {
    for (int64_t c = 0; c < C; ++c) y1[b * C + c] += P.b1[c];
  });
}

// ctx [B, C] = mean_n x and taps [B, 9, C]: taps[b, t, c] = (W2 GELU(y1) + b2)[b, 9c + t], the
// second product per group on rows [B, 9C].
template <typename T>
void predictor_forward(const Predictor<T>& P, const Tokens<T>& X, int64_t B, int64_t N, T* ctx, T* taps) {
  const int64_t C = P.C, cg = P.cg;
  for_each_sample(B, N * C, [&](int64_t b) { column_means(X.at(b, 0), X.sn, N, C, ctx + b * C); });
  std::vector<T> a(B * C), y2(B * 9 * C);
  predictor_hidden(P, ctx, B, a.data());
  for_each_sample(B, C, [&](int64_t b) {
    for (int64_t c = 0; c < C; ++c) a[b * C + c] = gelu(a[b * C + c]);
  });
  for (int64_t g = 0; g < P.groups; ++g)
    gemm_rows('N', 'T', B, 9 * cg, cg, T(1), a.data() + g * cg, C, P.w2 + 9 * g * cg * cg, cg, T(0),
              y2.data() + 9 * g * cg, 9 * C);
  for_each_sample(B, 9 * C, [&](int64_t b) {
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < 9; ++t) taps[(b * 9 + t) * C + c] = y2[b * 9 * C + 9 * c + t] + P.b2[9 * c + t];
  });
}

// Gradients of predictor_forward for the taps' gradient dtaps [B, 9, C]: dctx [B, C] already
// divided by N (every token's share of the mean), and dw1 [C, cg], db1 [C], dw2 [9C, cg], db2 [9C]
// summed over the samples. With y1 recomputed and a = GELU(y1), per group:
// dW2 = dy2^T a, da = dy2 W2, dy1 = da GELU'(y1), dW1 = dy1^T ctx, dctx = dy1 W1 / N.
template <typename T>
void predictor_backward(const Predictor<T>& P, const T* ctx, const T* dtaps, int64_t B, int64_t N, T* dctx, T* dw1,
                        T* db1, T* dw2, T* db2) {
  const int64_t C = P.C, cg = P.cg;
  std::vector<T> y1(B * C), a(B * C), dy2(B * 9 * C), dy1(B * C);
  predictor_hidden(P, ctx, B, y1.data());
  for_each_sample(B, 9 * C, [&](int64_t b) {
    for (int64_t c = 0; c < C; ++c) {
      a[b * C + c] = gelu(y1[b * C + c]);
      for (int64_t t = 0; t < 9; ++t) dy2[b * 9 * C + 9 * c + t] = dtaps[(b * 9 + t) * C + c];
    }
  });
  column_sums(dy2.data(), B, 9 * C, db2);
  for (int64_t g = 0; g < P.groups; ++g) {
    const T* dy2g = dy2.data() + 9 * g * cg;
    gemm_rows('T', 'N', 9 * cg, cg, B, T(1), dy2g, 9 * C, a.data() + g * cg, C, T(0), dw2 + 9 * g * cg * cg, cg);
    gemm_rows('N', 'N', B, cg, 9 * cg, T(1), dy2g, 9 * C, P.w2 + 9 * g * cg * cg, cg, T(0), dy1.data() + g * cg, C);
  }
  for_each_sample(B, C, [&](int64_t b) {
    for (int64_t c = 0; c < C; ++c) dy1[b * C + c] *= gelu_grad(y1[b * C + c]);
  });
  column_sums(dy1.data(), B, C, db1);
  for (int64_t g = 0; g < P.groups; ++g) {
    const T* dy1g = dy1.data() + g * cg;
    gemm_rows('T', 'N', cg, cg, B, T(1), dy1g, C, ctx + g * cg, C, T(0), dw1 + g * cg * cg, cg);
    gemm_rows('N', 'N', B, cg, cg, T(1) / T(N), dy1g, C, P.w1 + g * cg * cg, cg, T(0), dctx + g * cg, C);
  }
}

// The layer's compute type: float64 when q or the predictor's weights are float64, else float32
// (bf16 / fp16 tokens under autocast are computed in float32, as the core alone).
at::ScalarType compute_type(const at::Tensor& q, const at::Tensor& w1) {
  return q.scalar_type() == at::kDouble || w1.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor cast_to(const at::Tensor& t, at::ScalarType type) { return t.scalar_type() == type ? t : t.to(type); }

// A [B, N, C] input (q's shape) in the compute type and the layout the loops read (unit channel
// stride, rows that do not overlap: a fused qkv projection's views pass as they are).
at::Tensor as_tokens(const at::Tensor& t, const char* name, const at::Tensor& q, at::ScalarType type) {
  TORCH_CHECK(t.dim() == 3 && t.sizes() == q.sizes(), name, " must be [B, N, C] with q's shape ", q.sizes(), ", got ",
              t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), name, " must be floating point, got ", t.scalar_type());
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
  at::Tensor u = cast_to(t, type);
  const bool readable = (u.size(2) <= 1 || u.stride(2) == 1) && row_stride(u) >= u.size(2);
  return readable ? u : u.contiguous();
}

at::Tensor as_param(const at::Tensor& t, const char* name, int64_t numel, const char* shape, int64_t C, int64_t heads,
                    at::ScalarType type) {
  TORCH_CHECK(t.numel() == numel, name, " must be ", shape, " (", numel, " elements for C=", C, ", num_heads=", heads,
              "), got shape ", t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()) && t.device().is_cpu(), name,
              " must be a floating-point CPU tensor, got ", t.scalar_type(), " on ", t.device());
  return cast_to(t, type).contiguous();
}

Params as_params(const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2, int64_t C,
                 int64_t heads, at::ScalarType type) {
  TORCH_CHECK(heads > 0 && C % heads == 0, "C=", C, " must be a multiple of num_heads=", heads);
  const int64_t cg = C / heads;
  return {as_param(w1, "w1", C * cg, "[C, C/heads(, 1)]", C, heads, type),
          as_param(b1, "b1", C, "[C]", C, heads, type),
          as_param(w2, "w2", 9 * C * cg, "[9C, C/heads(, 1)]", C, heads, type),
          as_param(b2, "b2", 9 * C, "[9C]", C, heads, type)};
}

// {out [B, N, C] in q's dtype, ctx [B, C], taps [B, 9, C] in the compute type}.
std::vector<at::Tensor> layer_forward(const at::Tensor& x, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& w1, const at::Tensor& b1,
                                      const at::Tensor& w2, const at::Tensor& b2, int64_t heads, double scale,
                                      int64_t H, int64_t W, int64_t p) {
  TORCH_CHECK(q.dim() == 3, "q must be [B, N, C], got ", q.sizes());
  const at::ScalarType type = compute_type(q, w1);
  const at::Tensor xt = as_tokens(x, "x", q, type), qt = as_tokens(q, "q", q, type);
  const at::Tensor kt = as_tokens(k, "k", q, type), vt = as_tokens(v, "v", q, type);
  check_inputs(qt, kt, vt, std::nullopt, heads, H, W, p);
  const int64_t B = q.size(0), N = q.size(1), C = q.size(2);
  const Params params = as_params(w1, b1, w2, b2, C, heads, type);
  const auto opts = qt.options();
  at::Tensor ctx = at::empty({B, C}, opts), taps = at::empty({B, 9, C}, opts), out = at::empty({B, N, C}, opts);
  if (q.numel() == 0) return {cast_to(out, q.scalar_type()), ctx, taps};
  AT_DISPATCH_FLOATING_TYPES(type, "inline_layer_forward", [&] {
    predictor_forward<scalar_t>(Predictor<scalar_t>(params, C, heads), Tokens<scalar_t>(xt), B, N,
                                ctx.data_ptr<scalar_t>(), taps.data_ptr<scalar_t>());
    inline_forward<scalar_t>(qt, kt, vt, taps.data_ptr<scalar_t>(), out, heads, scale, H, W, p);
  });
  return {cast_to(out, q.scalar_type()), ctx, taps};
}

// Gradients of layer_forward from its saved ctx and taps: {dctx / N [B, C], dq, dk, dv [B, N, C],
// dw1 [C, cg], db1 [C], dw2 [9C, cg], db2 [9C]}, all in the compute type (ctx's dtype).
std::vector<at::Tensor> layer_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& ctx, const at::Tensor& taps, const Params& raw,
                                       const at::Tensor& grad, int64_t heads, double scale, int64_t H, int64_t W,
                                       int64_t p) {
  const at::ScalarType type = ctx.scalar_type();
  const at::Tensor qt = as_tokens(q, "q", q, type), kt = as_tokens(k, "k", q, type);
  const at::Tensor vt = as_tokens(v, "v", q, type), gt = as_tokens(grad, "grad", q, type);
  const at::Tensor w9 = check_inputs(qt, kt, vt, taps, heads, H, W, p);
  const int64_t B = q.size(0), N = q.size(1), C = q.size(2), cg = C / heads;
  const Params params = as_params(raw.w1, raw.b1, raw.w2, raw.b2, C, heads, type);
  const auto opts = qt.options();
  at::Tensor dq = at::empty({B, N, C}, opts), dk = at::empty({B, N, C}, opts), dv = at::empty({B, N, C}, opts);
  at::Tensor dw9 = at::zeros({B, 9, C}, opts), dctx = at::empty({B, C}, opts);
  at::Tensor dw1 = at::empty({C, cg}, opts), db1 = at::empty({C}, opts);
  at::Tensor dw2 = at::empty({9 * C, cg}, opts), db2 = at::empty({9 * C}, opts);
  if (q.numel() == 0) return {dctx, dq, dk, dv, dw1.zero_(), db1.zero_(), dw2.zero_(), db2.zero_()};
  AT_DISPATCH_FLOATING_TYPES(type, "inline_layer_backward", [&] {
    inline_backward<scalar_t>(qt, kt, vt, w9.data_ptr<scalar_t>(), gt, dq, dk, dv, dw9.data_ptr<scalar_t>(), heads,
                              scale, H, W, p);
    predictor_backward<scalar_t>(Predictor<scalar_t>(params, C, heads), ctx.data_ptr<scalar_t>(),
                                 dw9.data_ptr<scalar_t>(), B, N, dctx.data_ptr<scalar_t>(), dw1.data_ptr<scalar_t>(),
                                 db1.data_ptr<scalar_t>(), dw2.data_ptr<scalar_t>(), db2.data_ptr<scalar_t>());
  });
  return {dctx, dq, dk, dv, dw1, db1, dw2, db2};
}

// ---- The core alone (cpu_core): the C++ autograd node of an eager core call ----

// The core on any float tokens and taps, computed in float64 for float64 q, else float32:
// {out [B, N, C] in q's dtype}. w9: [B, 9, C] residual taps (any float dtype) or undefined.
at::Tensor core_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& w9,
                        int64_t heads, double scale, int64_t H, int64_t W, int64_t p) {
  TORCH_CHECK(q.dim() == 3, "q must be [B, N, C], got ", q.sizes());
  const at::ScalarType type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (q.numel() == 0) return at::empty(q.sizes(), q.options());
  const std::optional<at::Tensor> w = w9.defined() ? std::optional<at::Tensor>(cast_to(w9, type)) : std::nullopt;
  const at::Tensor out = inline_forward_cpu(as_tokens(q, "q", q, type), as_tokens(k, "k", q, type),
                                            as_tokens(v, "v", q, type), w, heads, scale, H, W, p);
  return cast_to(out, q.scalar_type());
}

// {dq, dk, dv, dw9} of core_forward in the inputs' dtypes (dw9 undefined without taps).
std::vector<at::Tensor> core_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& w9, const at::Tensor& grad, int64_t heads, double scale,
                                      int64_t H, int64_t W, int64_t p) {
  const at::ScalarType type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (q.numel() == 0)
    return {at::zeros(q.sizes(), q.options()), at::zeros(q.sizes(), q.options()), at::zeros(q.sizes(), q.options()),
            w9.defined() ? at::zeros(w9.sizes(), w9.options()) : at::Tensor()};
  const std::optional<at::Tensor> w = w9.defined() ? std::optional<at::Tensor>(cast_to(w9, type)) : std::nullopt;
  const std::vector<at::Tensor> r =
      inline_backward_cpu(as_tokens(q, "q", q, type), as_tokens(k, "k", q, type), as_tokens(v, "v", q, type), w,
                          as_tokens(grad, "grad", q, type), heads, scale, H, W, p);
  return {cast_to(r[0], q.scalar_type()), cast_to(r[1], k.scalar_type()), cast_to(r[2], v.scalar_type()),
          w9.defined() ? cast_to(r[3], w9.scalar_type()) : at::Tensor()};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_first_order() {
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "inline_attn's C++ kernels have no derivative: second-order gradients of the fused InLine kernels are "
              "not implemented (use impl='eager' for double backward)");
}

// The core's autograd node: saves q, k, v and the taps; M is recomputed in the backward.
class InlineCore : public torch::autograd::Function<InlineCore> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& w9, int64_t heads, double scale, int64_t H, int64_t W,
                            int64_t p) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor w = w9.has_value() ? *w9 : at::Tensor();
    at::Tensor out = core_forward(q, k, v, w, heads, scale, H, W, p);
    ctx->save_for_backward({q, k, v, w});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["H"] = H;
    ctx->saved_data["W"] = W;
    ctx->saved_data["p"] = p;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order();
    const variable_list s = ctx->get_saved_variables();
    auto& d = ctx->saved_data;
    std::vector<at::Tensor> r = core_backward(s[0], s[1], s[2], s[3], grads[0], d["heads"].toInt(),
                                              d["scale"].toDouble(), d["H"].toInt(), d["W"].toInt(), d["p"].toInt());
    return {r[0], r[1], r[2], r[3], at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor inline_core_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& w9, int64_t heads, double scale, int64_t H, int64_t W,
                                int64_t p) {
  return InlineCore::apply(q, k, v, w9, heads, scale, H, W, p);
}

at::Tensor inline_core_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& w9, int64_t heads, double scale, int64_t H, int64_t W,
                           int64_t p) {
  return core_forward(q, k, v, w9.has_value() ? *w9 : at::Tensor(), heads, scale, H, W, p);
}

// The layer core's autograd node: saves q, k, v, the predictor's weights and the forward's ctx
// and taps; x's gradient is dctx / N broadcast over the tokens (an expanded view, which autograd
// adds to the projection's gradient of x).
class InlineLayer : public torch::autograd::Function<InlineLayer> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                            const at::Tensor& b2, int64_t heads, double scale, int64_t H, int64_t W, int64_t p) {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::vector<at::Tensor> r = layer_forward(x, q, k, v, w1, b1, w2, b2, heads, scale, H, W, p);
    ctx->save_for_backward({q, k, v, r[1], r[2], w1, b1, w2, b2});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["H"] = H;
    ctx->saved_data["W"] = W;
    ctx->saved_data["p"] = p;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    return r[0];
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order();
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &w1 = s[5], &b1 = s[6], &w2 = s[7], &b2 = s[8];
    auto& d = ctx->saved_data;
    const std::vector<at::Tensor> r =
        layer_backward(q, k, v, s[3], s[4], Params{w1, b1, w2, b2}, grads[0], d["heads"].toInt(),
                       d["scale"].toDouble(), d["H"].toInt(), d["W"].toInt(), d["p"].toInt());
    at::Tensor dx = cast_to(r[0], d["x_dtype"].toScalarType()).unsqueeze(1).expand(q.sizes());
    return {dx,
            cast_to(r[1], q.scalar_type()),
            cast_to(r[2], k.scalar_type()),
            cast_to(r[3], v.scalar_type()),
            cast_to(r[4].view(w1.sizes()), w1.scalar_type()),
            cast_to(r[5], b1.scalar_type()),
            cast_to(r[6].view(w2.sizes()), w2.scalar_type()),
            cast_to(r[7], b2.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor inline_layer_autograd(const at::Tensor& x, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                                 const at::Tensor& b2, int64_t heads, double scale, int64_t H, int64_t W, int64_t p) {
  return InlineLayer::apply(x, q, k, v, w1, b1, w2, b2, heads, scale, H, W, p);
}

// Below autograd (inference mode, or redispatched): the forward alone.
at::Tensor inline_layer_cpu(const at::Tensor& x, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2,
                            int64_t heads, double scale, int64_t H, int64_t W, int64_t p) {
  return layer_forward(x, q, k, v, w1, b1, w2, b2, heads, scale, H, W, p)[0];
}

}  // namespace

// The schemas are defined in Python (inline_attn/ops/fused/cpu.py). The public op
// inline_attn::inline_forward (inline_attn/ops/fused/op.py) calls cpu_forward / cpu_backward as
// its CPU backend; in eager mode an InLine layer calls cpu_layer (autograd: InlineLayer) and a
// core call with given taps cpu_core (autograd: InlineCore).
TORCH_LIBRARY_IMPL(inline_attn, CPU, m) {
  m.impl("cpu_forward", &inline_forward_cpu);
  m.impl("cpu_backward", &inline_backward_cpu);
  m.impl("cpu_layer", &inline_layer_cpu);
  m.impl("cpu_core", &inline_core_cpu);
}

TORCH_LIBRARY_IMPL(inline_attn, Autograd, m) {
  m.impl("cpu_layer", &inline_layer_autograd);
  m.impl("cpu_core", &inline_core_autograd);
}

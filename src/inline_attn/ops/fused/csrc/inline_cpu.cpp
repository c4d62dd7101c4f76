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
// inputs that break this layout before calling.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <climits>
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

// dst[n] = src[n] - mean for a [N, cg] block (dst contiguous, src row stride ld).
template <typename T>
void centre(const T* src, int64_t ld, int64_t N, int64_t cg, const T* mean, T* dst) {
  for (int64_t n = 0; n < N; ++n) {
    const T* sn = src + n * ld;
    T* dn = dst + n * cg;
    for (int64_t a = 0; a < cg; ++a) dn[a] = sn[a] - mean[a];
  }
}

// The task's key and value means and its centred keys and values (row-major [N, cg]): the
// cancellation stays out of the product, and a large value mean cannot amplify the centred keys'
// rounding. The backward recomputes them exactly as the forward did.
template <typename T>
void centre_keys_values(const T* kb, int64_t ksn, const T* vb, int64_t vsn, int64_t N, int64_t cg, T* kbar,
                        T* vbar, T* kc, T* vc) {
  column_means(kb, ksn, N, cg, kbar);
  column_means(vb, vsn, N, cg, vbar);
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
//   dQ = G M^T;  dM = Q^T G;  dK = alpha Vc dM^T (centring's gradient: sum_n Kc_n = 0);
//   dV = alpha Kc dM + mean_n G_n + R^T(G, w);  dw[t] = sum_n G_n * V_{n + t}.
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

}  // namespace

// The schemas are defined in Python (inline_attn/ops/fused/cpu.py); the public op
// inline_attn::inline_forward (inline_attn/ops/fused/op.py) calls these as its CPU backend.
TORCH_LIBRARY_IMPL(inline_attn, CPU, m) {
  m.impl("cpu_forward", &inline_forward_cpu);
  m.impl("cpu_backward", &inline_backward_cpu);
}

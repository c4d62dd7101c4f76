// Fused InLine attention core for CPU inference (forward only).
//
// One task per (sample, head): the key/value means, the centred D x D key-value product, and
// O = phi(Q) M + v_bar + local residual (paper Eq. 5 plus Sec. 4.2), all while that head's
// tokens are in cache. The two products go to the BLAS bundled with PyTorch (MKL's sgemm_ /
// dgemm_, exported by libtorch_cpu); everything else is plain loops over contiguous channels.
// Eager PyTorch spends more time moving tokens between layouts than on arithmetic at small N
// (docs/benchmarks.md); this kernel reads Q, K, V once in place and writes O once, token-major,
// ready for the output projection.
//
// Layout: q, k, v are [B, N, C] with unit channel stride and any token / batch strides (views
// into a fused qkv projection); heads are contiguous channel blocks of size d = C / heads.
// w9 (optional) is [B, 9, C] contiguous: tap t = 3 * (dy + 1) + (dx + 1) of channel c's 3x3
// residual kernel. Tokens [0, p) are prefix tokens (no residual); token p + y * W + x is grid
// cell (y, x). The result is [B, N, C] contiguous.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

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

template <typename T>
void inline_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const T* w9, at::Tensor& out, int64_t heads, double scale, int64_t H,
                    int64_t W, int64_t p) {
  const int64_t B = q.size(0), N = q.size(1), C = q.size(2), d = C / heads;
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t qsb = q.stride(0), qsn = q.stride(1);
  const int64_t ksb = k.stride(0), ksn = k.stride(1);
  const int64_t vsb = v.stride(0), vsn = v.stride(1);
  const T alpha = static_cast<T>(scale / static_cast<double>(N));
  // A task is one sample and a block of g consecutive heads (cg = g * d channels): whole samples
  // when there are many (windows), so the memory-bound loops run over long channel rows; single
  // heads when there are few samples, so every thread gets work.
  const int64_t threads = at::get_num_threads();
  int64_t g = heads;
  while (g > 1 && B * (heads / g) < 4 * threads) {
    int64_t next = g - 1;
    while (heads % next != 0) --next;
    g = next;
  }
  const int64_t blocks = heads / g, cg = g * d;

  at::parallel_for(0, B * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> kc(N * cg), m(d * d), kbar(cg), vbar(cg);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / blocks, c0 = (task % blocks) * cg;
      const T* qb = qp + b * qsb + c0;
      const T* kb = kp + b * ksb + c0;
      const T* vb = vp + b * vsb + c0;
      T* ob = op + b * N * C + c0;

      // Means of K and V over the N tokens.
      std::fill(kbar.begin(), kbar.end(), T(0));
      std::fill(vbar.begin(), vbar.end(), T(0));
      for (int64_t n = 0; n < N; ++n) {
        const T* kn = kb + n * ksn;
        const T* vn = vb + n * vsn;
        for (int64_t a = 0; a < cg; ++a) {
          kbar[a] += kn[a];
          vbar[a] += vn[a];
        }
      }
      for (int64_t a = 0; a < cg; ++a) {
        kbar[a] /= static_cast<T>(N);
        vbar[a] /= static_cast<T>(N);
      }
      // Centred keys (row-major [N, cg]): the cancellation stays out of the product.
      for (int64_t n = 0; n < N; ++n) {
        const T* kn = kb + n * ksn;
        T* cn = kc.data() + n * cg;
        for (int64_t a = 0; a < cg; ++a) cn[a] = kn[a] - kbar[a];
      }
      // O = v_bar, plus the 3x3 residual on grid tokens (zero padding at the map's border).
      for (int64_t n = 0; n < N; ++n) {
        T* on = ob + n * C;
        for (int64_t a = 0; a < cg; ++a) on[a] = vbar[a];
        if (w9 == nullptr || n < p) continue;
        const int64_t y = (n - p) / W, x = (n - p) % W;
        for (int64_t dy = -1; dy <= 1; ++dy) {
          const int64_t yy = y + dy;
          if (yy < 0 || yy >= H) continue;
          for (int64_t dx = -1; dx <= 1; ++dx) {
            const int64_t xx = x + dx;
            if (xx < 0 || xx >= W) continue;
            const T* wt = w9 + (b * 9 + 3 * (dy + 1) + (dx + 1)) * C + c0;
            const T* vn = vb + (p + yy * W + xx) * vsn;
            for (int64_t a = 0; a < cg; ++a) on[a] += wt[a] * vn[a];
          }
        }
      }
      for (int64_t i = 0; i < g; ++i) {
        const int64_t ci = i * d;
        // M[a][e] = scale / N * sum_n kc[n][a] v[n][e]  (row-major [d, d]).
        // Column-major that is M^T = V^T Kc: A = V (col-major d x N, lda = vsn), B = Kc^T.
        gemm('N', 'T', int(d), int(d), int(N), alpha, vb + ci, int(vsn), kc.data() + ci, int(cg), T(0),
             m.data(), int(d));
        // O^T += M^T Q^T (column-major): A = M (lda = d), B = Q (ldb = qsn), C = O (ldc = C).
        gemm('N', 'N', int(d), int(N), int(d), T(1), m.data(), int(d), qb + ci, int(qsn), T(1), ob + ci, int(C));
      }
    }
  });
}

void check_tokens(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.dim() == 3, name, " must be [B, N, C], got ", t.sizes());
  TORCH_CHECK(t.sizes() == q.sizes(), name, " must have q's shape ", q.sizes(), ", got ", t.sizes());
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), name, " must have q's dtype");
  TORCH_CHECK(t.stride(2) == 1, name, " must have unit channel stride");
}

at::Tensor inline_forward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& w9, int64_t num_heads, double scale,
                              int64_t H, int64_t W, int64_t num_prefix_tokens) {
  check_tokens(q, "q", q);
  check_tokens(k, "k", q);
  check_tokens(v, "v", q);
  const int64_t B = q.size(0), N = q.size(1), C = q.size(2);
  TORCH_CHECK(num_heads > 0 && C % num_heads == 0, "C=", C, " must be a multiple of num_heads=", num_heads);
  TORCH_CHECK(num_prefix_tokens >= 0 && num_prefix_tokens + H * W == N, "N=", N, " must equal ",
              num_prefix_tokens, " + ", H, "*", W);
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, "float32 or float64 only");
  at::Tensor w;
  if (w9.has_value()) {
    w = w9->contiguous();
    TORCH_CHECK(w.dim() == 3 && w.size(0) == B && w.size(1) == 9 && w.size(2) == C,
                "w9 must be [B, 9, C], got ", w.sizes());
    TORCH_CHECK(w.scalar_type() == q.scalar_type(), "w9 must have q's dtype");
  }
  at::Tensor out = at::empty({B, N, C}, q.options());
  if (q.scalar_type() == at::kFloat) {
    inline_forward<float>(q, k, v, w.defined() ? w.data_ptr<float>() : nullptr, out, num_heads, scale, H, W,
                          num_prefix_tokens);
  } else {
    inline_forward<double>(q, k, v, w.defined() ? w.data_ptr<double>() : nullptr, out, num_heads, scale, H,
                           W, num_prefix_tokens);
  }
  return out;
}

}  // namespace

// The schema is defined in Python (inline_attn/ops/cpu_kernel.py) so that its FLOP formula and fake
// tensor rule exist before the kernel is built; this file provides the CPU implementation.
TORCH_LIBRARY_IMPL(inline_attn, CPU, m) { m.impl("inline_forward", &inline_forward_cpu); }

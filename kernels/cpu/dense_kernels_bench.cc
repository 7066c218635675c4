// Linear (forward and backward) next to raw cblas_sgemm calls of the same FLOPs, so the wrapper's
// overhead and the cost of the PyTorch [out, in] weight layout show up in one run; plus causal
// attention at a model-ish size. Args are rows, in, out, BLAS threads (0 = OpenBLAS default).

#include <cblas.h>

#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"

namespace tandem::cpu {
namespace {

std::vector<float> Random(size_t n) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Restores OpenBLAS's thread count when a benchmark ends.
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int threads) : previous_(threads > 0 ? SetBlasThreads(threads) : 0) {}
  ~ScopedBlasThreads() {
    if (previous_ > 0) SetBlasThreads(previous_);
  }

 private:
  int previous_;
};

struct Shape {
  explicit Shape(const benchmark::State& state)
      : rows(static_cast<int>(state.range(0))),
        in(static_cast<int>(state.range(1))),
        out(static_cast<int>(state.range(2))) {}
  double Flops() const { return 2.0 * rows * in * out; }
  int rows, in, out;
};

void SetFlops(benchmark::State& state, double flops) {
  state.counters["GFLOPS"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Linear(benchmark::State& state) {
  const Shape s(state);
  ScopedBlasThreads threads(static_cast<int>(state.range(3)));
  const std::vector<float> x = Random(s.rows * s.in), w = Random(s.out * s.in);
  std::vector<float> y(s.rows * s.out);
  for (auto _ : state) {
    Linear(x.data(), w.data(), y.data(), s.rows, s.in, s.out);
    benchmark::DoNotOptimize(y.data());
  }
  SetFlops(state, s.Flops());
}

// The same product as Linear (weight [out, in], so B transposed) straight through CBLAS.
void BM_RawSgemmNT(benchmark::State& state) {
  const Shape s(state);
  ScopedBlasThreads threads(static_cast<int>(state.range(3)));
  const std::vector<float> x = Random(s.rows * s.in), w = Random(s.out * s.in);
  std::vector<float> y(s.rows * s.out);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.rows, s.out, s.in, 1.0f, x.data(), s.in,
                w.data(), s.in, 0.0f, y.data(), s.out);
    benchmark::DoNotOptimize(y.data());
  }
  SetFlops(state, s.Flops());
}

// Same FLOPs with the weight stored [in, out]: shows what the PyTorch layout costs, if anything.
void BM_RawSgemmNN(benchmark::State& state) {
  const Shape s(state);
  ScopedBlasThreads threads(static_cast<int>(state.range(3)));
  const std::vector<float> x = Random(s.rows * s.in), w = Random(s.in * s.out);
  std::vector<float> y(s.rows * s.out);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.rows, s.out, s.in, 1.0f, x.data(),
                s.in, w.data(), s.out, 0.0f, y.data(), s.out);
    benchmark::DoNotOptimize(y.data());
  }
  SetFlops(state, s.Flops());
}

void BM_LinearBackward(benchmark::State& state) {
  const Shape s(state);
  ScopedBlasThreads threads(static_cast<int>(state.range(3)));
  const std::vector<float> x = Random(s.rows * s.in), w = Random(s.out * s.in);
  const std::vector<float> dy = Random(s.rows * s.out);
  std::vector<float> dx(s.rows * s.in), dw(s.out * s.in);
  for (auto _ : state) {
    LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), s.rows, s.in, s.out);
    benchmark::DoNotOptimize(dx.data());
    benchmark::DoNotOptimize(dw.data());
  }
  SetFlops(state, 2 * s.Flops());
}

// LinearBackward's two products (dx += dy·w, dw += dyᵀ·x) as raw CBLAS calls.
void BM_RawSgemmBackward(benchmark::State& state) {
  const Shape s(state);
  ScopedBlasThreads threads(static_cast<int>(state.range(3)));
  const std::vector<float> x = Random(s.rows * s.in), w = Random(s.out * s.in);
  const std::vector<float> dy = Random(s.rows * s.out);
  std::vector<float> dx(s.rows * s.in), dw(s.out * s.in);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.rows, s.in, s.out, 1.0f, dy.data(),
                s.out, w.data(), s.in, 1.0f, dx.data(), s.in);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s.out, s.in, s.rows, 1.0f, dy.data(),
                s.out, x.data(), s.in, 1.0f, dw.data(), s.in);
    benchmark::DoNotOptimize(dx.data());
    benchmark::DoNotOptimize(dw.data());
  }
  SetFlops(state, 2 * s.Flops());
}

void LinearShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "in", "out", "threads"});
  for (int threads : {1, 0}) {
    b->Args({512, 256, 1024, threads});
    b->Args({256, 128, 512, threads});
  }
  // Real time: CPU time would miss the BLAS worker threads.
  b->MinTime(0.1)->UseRealTime();
}

BENCHMARK(BM_Linear)->Apply(LinearShapes);
BENCHMARK(BM_RawSgemmNT)->Apply(LinearShapes);
BENCHMARK(BM_RawSgemmNN)->Apply(LinearShapes);
BENCHMARK(BM_LinearBackward)->Apply(LinearShapes);
BENCHMARK(BM_RawSgemmBackward)->Apply(LinearShapes);

// FLOPs count the full T×T score and mix products that the kernel computes (half is masked).
double AttentionFlops(int T, int H, int D) { return 4.0 * T * T * D * H; }

void BM_CausalAttention(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0)), H = static_cast<int>(state.range(1));
  const int D = static_cast<int>(state.range(2));
  const size_t n = static_cast<size_t>(T) * H * D;
  const std::vector<float> q = Random(n), k = Random(n), v = Random(n);
  std::vector<float> out(n), probs(static_cast<size_t>(H) * T * T);
  for (auto _ : state) {
    CausalAttention(q.data(), k.data(), v.data(), out.data(), probs.data(), T, H, H, D);
    benchmark::DoNotOptimize(out.data());
  }
  SetFlops(state, AttentionFlops(T, H, D));
}

void BM_CausalAttentionBackward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0)), H = static_cast<int>(state.range(1));
  const int D = static_cast<int>(state.range(2));
  const size_t n = static_cast<size_t>(T) * H * D;
  const std::vector<float> q = Random(n), k = Random(n), v = Random(n), dout = Random(n);
  std::vector<float> out(n), probs(static_cast<size_t>(H) * T * T), dq(n), dk(n), dv(n);
  CausalAttention(q.data(), k.data(), v.data(), out.data(), probs.data(), T, H, H, D);
  for (auto _ : state) {
    CausalAttentionBackward(q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(),
                            dk.data(), dv.data(), T, H, H, D);
    benchmark::DoNotOptimize(dq.data());
  }
  SetFlops(state, 2 * AttentionFlops(T, H, D));
}

// One decode step at the end of a T-token cache.
void BM_DecodeAttention(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0)), H = static_cast<int>(state.range(1));
  const int D = static_cast<int>(state.range(2));
  const size_t n = static_cast<size_t>(T) * H * D;
  const std::vector<float> q = Random(H * D), k = Random(n), v = Random(n);
  std::vector<float> out(H * D), scratch(T);
  for (auto _ : state) {
    DecodeAttention(q.data(), k.data(), v.data(), T, out.data(), H, H, D, scratch.data());
    benchmark::DoNotOptimize(out.data());
  }
  SetFlops(state, 4.0 * T * D * H);
}

BENCHMARK(BM_CausalAttention)
    ->ArgNames({"T", "H", "D"})
    ->Args({128, 4, 32})
    ->MinTime(0.1)
    ->UseRealTime();
BENCHMARK(BM_CausalAttentionBackward)
    ->ArgNames({"T", "H", "D"})
    ->Args({128, 4, 32})
    ->MinTime(0.1)
    ->UseRealTime();
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"T", "H", "D"})
    ->Args({128, 4, 32})
    ->MinTime(0.1)
    ->UseRealTime();

}  // namespace
}  // namespace tandem::cpu

BENCHMARK_MAIN();

// The 10-row x 2-vector tile of tvmrnn's CPU GEMM: C[10][32] += A[10][K] * B[K][32]
// A rows `lda` floats apart, B a panel of 32 floats a k. Time many tiles over the same data.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
__attribute__((noinline)) void tile(const float* A, long lda, const float* B, float* C, int K) {
  __m512 c[20];
  for (int i = 0; i < 20; i++) c[i] = _mm512_setzero_ps();
  for (int k = 0; k < K; k++) {
    __m512 b0 = _mm512_loadu_ps(B + 32 * k), b1 = _mm512_loadu_ps(B + 32 * k + 16);
#pragma GCC unroll 10
    for (int r = 0; r < 10; r++) {
      __m512 a = _mm512_set1_ps(A[r * lda + k]);
      c[2 * r] = _mm512_fmadd_ps(a, b0, c[2 * r]);
      c[2 * r + 1] = _mm512_fmadd_ps(a, b1, c[2 * r + 1]);
    }
  }
  for (int i = 0; i < 20; i++) _mm512_storeu_ps(C + 16 * i, c[i]);
}
int main(int argc, char** argv) {
  int K = 800; long lda = argc > 1 ? atol(argv[1]) : 12800; int panels = argc > 2 ? atoi(argv[2]) : 1;
  int rowtiles = argc > 3 ? atoi(argv[3]) : 1;
  float* A = aligned_alloc(64, sizeof(float) * (lda * 10 * rowtiles + K));
  float* B = aligned_alloc(64, sizeof(float) * 32 * K * panels);
  float C[320];
  for (long i = 0; i < lda * 10 * rowtiles + K; i++) A[i] = 1e-3f * (i % 7);
  for (long i = 0; i < 32L * K * panels; i++) B[i] = 1e-3f * (i % 5);
  long reps = 20000000L / (panels * rowtiles) / 10;
  double t0 = now();
  for (long r = 0; r < reps; r++)
    for (int p = 0; p < panels; p++)
      for (int t = 0; t < rowtiles; t++)
        tile(A + t * 10 * lda, lda, B + 32L * K * p, C, K);
  double s = now() - t0;
  printf("lda=%ld panels=%d rowtiles=%d: %.1f GFLOP/s (%g)\n", lda, panels, rowtiles, reps * panels * rowtiles * 2.0 * 10 * 32 * K / s / 1e9, C[0]);
}

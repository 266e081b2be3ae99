// AMX microkernel variants for the recurrent step: m=16 rows, a panel of 16*nt columns, K=2*k2.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

static void config(int nt, int m, int a0, int a1) {
  cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
  for (int t = 0; t < 8; t++) { c.colsb[t] = 64; c.rows[t] = 16; }
  for (int t = 0; t < nt; t++) c.rows[t] = m;
  c.rows[a0] = m; c.rows[a1] = m;
  _tile_loadconfig(&c);
}

// V0: as tvmrnn: C tiles 0..3 loaded, A tile 4 a chunk, B tiles 5,6,7 cycling
static void v0(float *C, long ldc, const uint16_t *A, long lda, const uint32_t *B, long ldb, int m, int k2) {
  config(4, m, 4, 4);
  _tile_loadd(0, (char*)C, ldc); _tile_loadd(1, (char*)C + 64, ldc);
  _tile_loadd(2, (char*)C + 128, ldc); _tile_loadd(3, (char*)C + 192, ldc);
  for (int k = 0; k < k2 / 16; k++) {
    const char *bk = (const char*)B + (long)k * 16 * ldb;
    _tile_loadd(4, (const char*)A + k * 64, lda);
    _tile_loadd(5, bk, ldb); _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, bk + 64, ldb); _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, bk + 128, ldb); _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, bk + 192, ldb); _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, (char*)C, ldc); _tile_stored(1, (char*)C + 64, ldc);
  _tile_stored(2, (char*)C + 128, ldc); _tile_stored(3, (char*)C + 192, ldc);
}

// V1: C zeroed (no load), A double-buffered (4, 5), B tiles 6, 7 alternating
static void v1(float *C, long ldc, const uint16_t *A, long lda, const uint32_t *B, long ldb, int m, int k2) {
  config(4, m, 4, 5);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int k = 0; k < k2 / 16; k += 2) {
    const char *bk = (const char*)B + (long)k * 16 * ldb;
    const char *bk1 = bk + 16 * ldb;
    _tile_loadd(4, (const char*)A + k * 64, lda);
    _tile_loadd(6, bk, ldb); _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, bk + 64, ldb); _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, (const char*)A + k * 64 + 64, lda);
    _tile_loadd(6, bk + 128, ldb); _tile_dpbf16ps(2, 4, 6);
    _tile_loadd(7, bk + 192, ldb); _tile_dpbf16ps(3, 4, 7);
    _tile_loadd(6, bk1, ldb); _tile_dpbf16ps(0, 5, 6);
    _tile_loadd(7, bk1 + 64, ldb); _tile_dpbf16ps(1, 5, 7);
    _tile_loadd(6, bk1 + 128, ldb); _tile_dpbf16ps(2, 5, 6);
    _tile_loadd(7, bk1 + 192, ldb); _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, (char*)C, ldc); _tile_stored(1, (char*)C + 64, ldc);
  _tile_stored(2, (char*)C + 128, ldc); _tile_stored(3, (char*)C + 192, ldc);
}

// V2: 2 C tiles (32 columns), A tiles 2,3 double-buffered, B tiles 4..7 (lookahead of 2)
static void v2(float *C, long ldc, const uint16_t *A, long lda, const uint32_t *B, long ldb, int m, int k2) {
  config(2, m, 2, 3);
  _tile_zero(0); _tile_zero(1);
  for (int k = 0; k < k2 / 16; k += 2) {
    const char *bk = (const char*)B + (long)k * 16 * ldb;
    const char *bk1 = bk + 16 * ldb;
    _tile_loadd(2, (const char*)A + k * 64, lda);
    _tile_loadd(4, bk, ldb); _tile_loadd(5, bk + 64, ldb);
    _tile_loadd(3, (const char*)A + k * 64 + 64, lda);
    _tile_loadd(6, bk1, ldb); _tile_loadd(7, bk1 + 64, ldb);
    _tile_dpbf16ps(0, 2, 4); _tile_dpbf16ps(1, 2, 5);
    _tile_dpbf16ps(0, 3, 6); _tile_dpbf16ps(1, 3, 7);
  }
  _tile_stored(0, (char*)C, ldc); _tile_stored(1, (char*)C + 64, ldc);
}

// V3: weights as the A operand (C^T = W h^T): 4 C tiles of (16 columns x 16 rows), B = h (VNNI), A = W tiles
// W panel stored [64 cols][k2 words] (row = a column, 64 bytes a 16-pair chunk), h as [k2][16 rows] words
static void v3(float *C, long ldc, const uint32_t *H, long ldh, const uint32_t *W, long ldw, int m, int k2) {
  config(4, 16, 4, 4);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int k = 0; k < k2 / 16; k++) {
    _tile_loadd(4, (const char*)H + (long)k * 16 * ldh, ldh);
    const char *wk = (const char*)W + k * 64;
    _tile_loadd(5, wk, ldw); _tile_dpbf16ps(0, 5, 4);
    _tile_loadd(6, wk + 16 * ldw, ldw); _tile_dpbf16ps(1, 6, 4);
    _tile_loadd(7, wk + 32 * ldw, ldw); _tile_dpbf16ps(2, 7, 4);
    _tile_loadd(5, wk + 48 * ldw, ldw); _tile_dpbf16ps(3, 5, 4);
  }
  _tile_stored(0, (char*)C, ldc); _tile_stored(1, (char*)C + 64, ldc);
  _tile_stored(2, (char*)C + 128, ldc); _tile_stored(3, (char*)C + 192, ldc);
}



// V4: 2 row tiles x 2 column tiles (C 0..3), A tiles 4,5, B tiles 6,7: each loaded tile feeds 2 products
static void v4(float *C, long ldc, const uint16_t *A, long lda, const uint32_t *B, long ldb, int m, int k2) {
  config(4, 16, 4, 5);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int k = 0; k < k2 / 16; k++) {
    const char *bk = (const char*)B + (long)k * 16 * ldb;
    _tile_loadd(4, (const char*)A + k * 64, lda);
    _tile_loadd(6, bk, ldb);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, (const char*)A + 16 * lda + k * 64, lda);
    _tile_dpbf16ps(2, 5, 6);
    _tile_loadd(7, bk + 64, ldb);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, (char*)C, ldc); _tile_stored(1, (char*)C + 64, ldc);
  _tile_stored(2, (char*)C + 16 * ldc, ldc); _tile_stored(3, (char*)C + 16 * ldc + 64, ldc);
}

// a GEMM of M rows (the projection): M x (4H) x H, panels of 64 columns, row blocks of 32
static void gemm(int H, int M, int variant) {
  int K = H, k2 = K / 2, cols = 4 * H, panels = cols / 64;
  uint32_t *W = aligned_alloc(64, (long)cols * k2 * 4); for (long i = 0; i < (long)cols * k2; i++) W[i] = 0x3f803f80u;
  uint16_t *A = aligned_alloc(64, (long)M * K * 2); for (long i = 0; i < (long)M * K; i++) A[i] = 0x3f80;
  float *C = aligned_alloc(64, (long)M * cols * 4);
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
    for (int p = 0; p < panels; p++) {
      const uint32_t *b = W + (long)p * k2 * 64; float *c = C + p * 64;
      for (int r = 0; r < M; r += 32) {
        if (variant == 0) v0(c + (long)r * cols, cols * 4, A + (long)r * K, K * 2, b, 256, 16, k2), v0(c + (long)(r + 16) * cols, cols * 4, A + (long)(r + 16) * K, K * 2, b, 256, 16, k2);
        else { v4(c + (long)r * cols, cols * 4, A + (long)r * K, K * 2, b, 256, 32, k2); v4(c + (long)r * cols + 32, cols * 4, A + (long)r * K, K * 2, b + 32, 256, 32, k2); }
      }
    }
    double t = now() - t0; if (t < best) best = t;
  }
  printf("GEMM M=%d H=%d variant %s: %.1f us, %.3f TMAC/s\n", M, H, variant ? "2x2" : "v0", best * 1e6, (double)M * cols * K / best / 1e12);
}
#include <omp.h>
// the DS2-like step on many threads: P panels of 64 columns, K = H, m rows; a barrier a step
static double step_mt(int H, int m, int threads, int variant) {
  int K = H, k2 = K / 2, cols = 4 * H, panels = cols / 64;
  long wbytes = (long)cols * k2 * 4;
  uint32_t *W = aligned_alloc(64, wbytes);
  uint16_t *A = aligned_alloc(64, (long)m * K * 2 + 64);
  float *C = aligned_alloc(64, (long)m * cols * 4);
  #pragma omp parallel num_threads(threads)
  {
    syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
    #pragma omp for schedule(static)
    for (long i = 0; i < wbytes / 4; i++) W[i] = 0x3f803f80u;  // first touch by the owner
  }
  for (long i = 0; i < (long)m * K; i++) A[i] = 0x3f80;
  memset(C, 0, (long)m * cols * 4);
  int steps = 3000; double best = 1e9;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = 0;
    #pragma omp parallel num_threads(threads)
    {
      for (int s = 0; s < steps; s++) {
        #pragma omp barrier
        #pragma omp master
        if (s == 100) t0 = now();
        #pragma omp for schedule(static) nowait
        for (int p = 0; p < panels; p++) {
          float *c = C + p * 64; const uint32_t *b = W + (long)p * k2 * 64;
          for (int r = 0; r < m; r += 16) {
            int rows = m - r < 16 ? m - r : 16;
            if (variant == 0) v0(c + (long)r * cols, cols * 4, A + (long)r * K, K * 2, b, 256, rows, k2);
            else v1(c + (long)r * cols, cols * 4, A + (long)r * K, K * 2, b, 256, rows, k2);
          }
        }
      }
    }
    double t = (now() - t0) / (steps - 100);
    if (t < best) best = t;
  }
  free(W); free(A); free(C);
  return best;
}

int main(int argc, char **argv) {
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { perror("perm"); return 1; }
  if (argc == 3) { gemm(atoi(argv[1]), atoi(argv[2]), 0); gemm(atoi(argv[1]), atoi(argv[2]), 1); return 0; }
  if (argc > 2) {  // mt H m threads...
    int H = atoi(argv[1]), m = atoi(argv[2]);
    for (int i = 3; i < argc; i++) {
      int th = atoi(argv[i]);
      double t0 = step_mt(H, m, th, 0), t1 = step_mt(H, m, th, 1);
      double macs = (double)m * 4 * H * H;
      printf("H=%d m=%d threads=%d: v0 %.2f us a step (%.3f TMAC/s), v1 %.2f us\n", H, m, th, t0 * 1e6, macs / t0 / 1e12, t1 * 1e6);
      fflush(stdout);
    }
    return 0;
  }
  int H = argc > 1 ? atoi(argv[1]) : 256, G = 4, m = 16;
  int K = H, k2 = K / 2, cols = G * H, panels = cols / 64;
  long wbytes = (long)cols * k2 * 4;
  uint32_t *W = aligned_alloc(64, wbytes);
  for (long i = 0; i < wbytes / 4; i++) W[i] = 0x3f803f80u;
  uint16_t *A = aligned_alloc(64, (long)m * K * 2);
  for (long i = 0; i < (long)m * K; i++) A[i] = 0x3f80;
  float *C = aligned_alloc(64, (long)m * cols * 4);
  memset(C, 0, (long)m * cols * 4);
  int steps = 2000;
  for (int variant = 0; variant < 4; variant++) {
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
      double t0 = now();
      for (int s = 0; s < steps; s++)
        for (int p = 0; p < panels; p++) {
          float *c = C + p * 64;
          const uint32_t *b = W + (long)p * k2 * 64;  // panel: k2 rows of 64 words (v3: 64 rows of k2 words)
          if (variant == 0) v0(c, cols * 4, A, K * 2, b, 256, m, k2);
          else if (variant == 1) v1(c, cols * 4, A, K * 2, b, 256, m, k2);
          else if (variant == 2) { v2(c, cols * 4, A, K * 2, b, 256, m, k2); v2(c + 32, cols * 4, A, K * 2, b + 32, 256, m, k2); }
          else v3(c, 64 * 4, (const uint32_t*)A, 64, b, k2 * 4, m, k2);
        }
      double t = (now() - t0) / steps;
      if (t < best) best = t;
    }
    double macs = (double)m * cols * K;
    printf("H=%d variant %d: %.2f us a step, %.3f TMAC/s\n", H, variant, best * 1e6, macs / best / 1e12);
  }
  _tile_release();
  return 0;
}

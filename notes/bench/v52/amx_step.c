// A recurrent step's bf16 GEMM on AMX, one core: C[m, 64 p] += A[m, 2K] . B (panels of 4 column tiles,
// k-pair words, AMX's B layout). "old": tvmrnn's microkernel (per 16-row tile, the 4 C tiles over the
// whole reduction, one A and one B load a product); "pairs": two row tiles at once, column tiles in
// pairs (C 2x2, A 2, B 2: each B load feeds two products).
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <time.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static void config(int rows_c0, int rows_c1) {
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  // pairs mode: tiles 0,1 C of row tile 0; 2,3 C of row tile 1; 4 A0; 5 A1; 6,7 B
  cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = rows_c0; cfg.rows[2] = cfg.rows[3] = cfg.rows[5] = rows_c1;
  _tile_loadconfig(&cfg);
}
static void config_old(int rows) {
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  for (int t = 0; t < 5; t++) cfg.rows[t] = rows;  // C 0-3, A 4; B 5-7 16 rows
  _tile_loadconfig(&cfg);
}
int main(int argc, char **argv) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;
  int H = argc > 1 ? atoi(argv[1]) : 800, m = argc > 2 ? atoi(argv[2]) : 20;
  int K2 = H / 2, panels = 4 * H / 64;   // k-pairs; panels of 64 columns
  size_t bpanel = (size_t)K2 * 64 * 4;    // bytes of a panel
  uint8_t *B = aligned_alloc(64, bpanel * panels); memset(B, 0x3f, bpanel * panels);
  uint8_t *A = aligned_alloc(64, (size_t)m * K2 * 4 + 4096); memset(A, 0x3f, (size_t)m * K2 * 4);
  float *C = aligned_alloc(64, (size_t)(m + 16) * 64 * 4 * panels);
  long lda = K2 * 4, ldb = 64 * 4, ldc = 64 * 4;
  int full = K2 / 16;
  for (int mode = 0; mode < 2; mode++) for (int rep = 0; rep < 3; rep++) {
    int steps = 200; double t0 = now();
    for (int s = 0; s < steps; s++) for (int p = 0; p < panels; p++) {
      uint8_t *b = B + p * bpanel; float *c = C + (size_t)p * (m + 16) * 64;
      if (mode == 0) {
        for (int r = 0; r < m; r += 16) {
          int h = m - r < 16 ? m - r : 16; config_old(h);
          float *cr = c + r * 64; uint8_t *ar = A + (size_t)r * lda;
          _tile_loadd(0, cr, ldc); _tile_loadd(1, cr + 16, ldc); _tile_loadd(2, cr + 32, ldc); _tile_loadd(3, cr + 48, ldc);
          for (int k = 0; k < full; k++) {
            _tile_loadd(4, ar + k * 64, lda);
            uint8_t *bk = b + (size_t)k * 16 * ldb;
            _tile_loadd(5, bk, ldb); _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, bk + 64, ldb); _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(7, bk + 128, ldb); _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, bk + 192, ldb); _tile_dpbf16ps(3, 4, 5);
          }
          _tile_stored(0, cr, ldc); _tile_stored(1, cr + 16, ldc); _tile_stored(2, cr + 32, ldc); _tile_stored(3, cr + 48, ldc);
        }
      } else {
        for (int r = 0; r < m; r += 32) {
          int h0 = m - r < 16 ? m - r : 16, h1 = m - r - 16; h1 = h1 < 0 ? 0 : h1 > 16 ? 16 : h1;
          config(h0, h1 ? h1 : 1);
          float *cr = c + r * 64; uint8_t *ar = A + (size_t)r * lda;
          for (int cp = 0; cp < 4; cp += 2) {
            _tile_loadd(0, cr + 16 * cp, ldc); _tile_loadd(1, cr + 16 * cp + 16, ldc);
            _tile_loadd(2, cr + 16 * 64 + 16 * cp, ldc); _tile_loadd(3, cr + 16 * 64 + 16 * cp + 16, ldc);
            for (int k = 0; k < full; k++) {
              uint8_t *bk = b + (size_t)k * 16 * ldb + 64 * cp;
              _tile_loadd(4, ar + k * 64, lda); _tile_loadd(5, ar + 16 * lda + k * 64, lda);
              _tile_loadd(6, bk, ldb); _tile_loadd(7, bk + 64, ldb);
              _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, cr + 16 * cp, ldc); _tile_stored(1, cr + 16 * cp + 16, ldc);
            _tile_stored(2, cr + 16 * 64 + 16 * cp, ldc); _tile_stored(3, cr + 16 * 64 + 16 * cp + 16, ldc);
          }
        }
      }
    }
    double dt = (now() - t0) / steps;
    double macs = (double)m * 4 * H * H;
    printf("H=%d m=%d %s: %.1f us a step, %.3f TMAC/s useful\n", H, m, mode ? "pairs" : "old  ", dt * 1e6, macs / dt / 1e12);
  }
  _tile_release();
  return 0;
}

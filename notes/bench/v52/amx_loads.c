// cycles per tdpbf16ps with tile loads: per k-chunk one A load and nt B loads (B streamed over a
// region of `kb` KB: L1/L2/L3), products into nt C tiles; B tile registers: 1 or several (rotating)
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
#define TDP(c, a, b) _tile_dpbf16ps(c, a, b)
int main(int argc, char **argv) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
  size_t maxb = 8 << 20;
  uint8_t *B = aligned_alloc(64, maxb), *A = aligned_alloc(64, 1 << 16);
  memset(B, 0x3f, maxb); memset(A, 0x3f, 1 << 16);
  int sizes[] = {16, 256, 1024, 4096};
  for (int si = 0; si < 4; si++) {
    size_t region = (size_t)sizes[si] << 10; size_t tiles = region / 1024;
    for (int mode = 0; mode < 3; mode++) {
      // mode 0: 4 C tiles (0-3), A in 4, B in 5 only; mode 1: B rotating 5,6,7; mode 2: 2x2: A in 4,5, B in 6,7
      long n = 4000000; double t0 = now(); size_t p = 0;
      for (long i = 0; i < n / 4; i++) {
        uint8_t *b = B + (p % tiles) * 1024 * 4; p += 1; if ((p % tiles) * 4096 + 4096 > region) p = 0;
        if (mode == 0) {
          _tile_loadd(4, A, 64);
          _tile_loadd(5, b, 64); TDP(0, 4, 5);
          _tile_loadd(5, b + 1024, 64); TDP(1, 4, 5);
          _tile_loadd(5, b + 2048, 64); TDP(2, 4, 5);
          _tile_loadd(5, b + 3072, 64); TDP(3, 4, 5);
        } else if (mode == 1) {
          _tile_loadd(4, A, 64);
          _tile_loadd(5, b, 64); TDP(0, 4, 5);
          _tile_loadd(6, b + 1024, 64); TDP(1, 4, 6);
          _tile_loadd(7, b + 2048, 64); TDP(2, 4, 7);
          _tile_loadd(5, b + 3072, 64); TDP(3, 4, 5);
        } else {  // 2x2: two row tiles of A, two column tiles of B: 2 B loads per 4 products
          _tile_loadd(4, A, 64); _tile_loadd(5, A + 1024, 64);
          _tile_loadd(6, b, 64); _tile_loadd(7, b + 1024, 64);
          TDP(0, 4, 6); TDP(1, 4, 7); TDP(2, 5, 6); TDP(3, 5, 7);
        }
      }
      double dt = now() - t0;
      printf("B over %5d KB, %s: %.1f ns per tdpbf16ps, %.3f TMAC/s\n", sizes[si],
             mode == 0 ? "1 B tile     " : mode == 1 ? "3 B tiles    " : "2x2 blocking ", dt / n * 1e9, n * 8192.0 / dt / 1e12);
    }
  }
  _tile_release();
  return 0;
}

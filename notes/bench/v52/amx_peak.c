// cycles per tdpbf16ps with no loads in the loop: nt independent C tiles, A and B preloaded
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <x86intrin.h>
#include <time.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static uint16_t A[16*32] __attribute__((aligned(64))), B[16*32] __attribute__((aligned(64)));
static float C[16*16] __attribute__((aligned(64)));
int main() {
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { puts("no amx"); return 1; }
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
  for (int i = 0; i < 512; i++) { A[i] = 0x3f80; B[i] = 0x3f80; }
  _tile_loadd(6, A, 64); _tile_loadd(7, B, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); _tile_zero(4); _tile_zero(5);
  long n = 20000000;
  for (int rep = 0; rep < 2; rep++) {
  for (int nt = 1; nt <= 6; nt++) {
    double t0 = now(); uint64_t c0 = __rdtsc();
    for (long i = 0; i < n / nt; i++) {
      _tile_dpbf16ps(0, 6, 7);
      if (nt > 1) _tile_dpbf16ps(1, 6, 7);
      if (nt > 2) _tile_dpbf16ps(2, 6, 7);
      if (nt > 3) _tile_dpbf16ps(3, 6, 7);
      if (nt > 4) _tile_dpbf16ps(4, 6, 7);
      if (nt > 5) _tile_dpbf16ps(5, 6, 7);
    }
    _tile_stored(0, C, 64);
    double dt = now() - t0; uint64_t c1 = __rdtsc();
    long ops = (n / nt) * nt;
    printf("nt=%d: %.2f ns per tdpbf16ps, %.1f TSC cycles, %.3f TMAC/s\n", nt, dt / ops * 1e9, (double)(c1 - c0) / ops, ops * 8192.0 / dt / 1e12);
  }}
  _tile_release();
  return 0;
}

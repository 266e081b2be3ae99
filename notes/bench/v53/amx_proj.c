// the bf16 projection's microkernel call as tvmrnn runs it (m=160 rows, k2=400 pairs, 4 column tiles) and variants
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
#define M 160
#define K2 400
#define KC (K2 / 16)
#define NT 4
static uint8_t *A, *B, *C, *Ap, *Bp;
static long LDA = K2 * 4, LDB = NT * 64, LDC = NT * 64;
// mode 0: as tvmrnn: rp, cp, k
static void mode0(void) {
  for (int rp = 0; rp < M / 32; rp++)
    for (int cp = 0; cp < NT / 2; cp++) {
      uint8_t *c0 = C + rp * 32 * LDC + cp * 128, *c1 = c0 + 16 * LDC;
      _tile_loadd(0, c0, LDC); _tile_loadd(1, c0 + 64, LDC); _tile_loadd(2, c1, LDC); _tile_loadd(3, c1 + 64, LDC);
      uint8_t *a0 = A + rp * 32 * LDA, *a1 = a0 + 16 * LDA;
      for (int k = 0; k < KC; k++) {
        _tile_loadd(4, a0 + k * 64, LDA); _tile_loadd(5, a1 + k * 64, LDA);
        uint8_t *b = B + k * 16 * LDB + cp * 128;
        _tile_loadd(6, b, LDB); _tile_loadd(7, b + 64, LDB);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, LDC); _tile_stored(1, c0 + 64, LDC); _tile_stored(2, c1, LDC); _tile_stored(3, c1 + 64, LDC);
    }
}
// mode 1: k blocks of KB chunks outside: kb, cp, rp, k
static int KBLK = 5;
static void mode1(void) {
  for (int kb = 0; kb < KC; kb += KBLK)
  for (int cp = 0; cp < NT / 2; cp++)
    for (int rp = 0; rp < M / 32; rp++) {
      uint8_t *c0 = C + rp * 32 * LDC + cp * 128, *c1 = c0 + 16 * LDC;
      _tile_loadd(0, c0, LDC); _tile_loadd(1, c0 + 64, LDC); _tile_loadd(2, c1, LDC); _tile_loadd(3, c1 + 64, LDC);
      uint8_t *a0 = A + rp * 32 * LDA, *a1 = a0 + 16 * LDA;
      int ke = kb + KBLK < KC ? kb + KBLK : KC;
      for (int k = kb; k < ke; k++) {
        _tile_loadd(4, a0 + k * 64, LDA); _tile_loadd(5, a1 + k * 64, LDA);
        uint8_t *b = B + k * 16 * LDB + cp * 128;
        _tile_loadd(6, b, LDB); _tile_loadd(7, b + 64, LDB);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, LDC); _tile_stored(1, c0 + 64, LDC); _tile_stored(2, c1, LDC); _tile_stored(3, c1 + 64, LDC);
    }
}
// mode 2: A and B repacked in contiguous 1 KB tiles: Ap[rowtile][k][16 x 64 B], Bp[coltile][k][16 x 64 B]; rp, cp, k
static void mode2(void) {
  for (int rp = 0; rp < M / 32; rp++)
    for (int cp = 0; cp < NT / 2; cp++) {
      uint8_t *c0 = C + rp * 32 * LDC + cp * 128, *c1 = c0 + 16 * LDC;
      _tile_loadd(0, c0, LDC); _tile_loadd(1, c0 + 64, LDC); _tile_loadd(2, c1, LDC); _tile_loadd(3, c1 + 64, LDC);
      uint8_t *a0 = Ap + (2 * rp) * KC * 1024, *a1 = a0 + KC * 1024;
      uint8_t *b0 = Bp + (2 * cp) * KC * 1024, *b1 = b0 + KC * 1024;
      for (int k = 0; k < KC; k++) {
        _tile_loadd(4, a0 + k * 1024, 64); _tile_loadd(5, a1 + k * 1024, 64);
        _tile_loadd(6, b0 + k * 1024, 64); _tile_loadd(7, b1 + k * 1024, 64);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, LDC); _tile_stored(1, c0 + 64, LDC); _tile_stored(2, c1, LDC); _tile_stored(3, c1 + 64, LDC);
    }
}
// mode 3: only B repacked (weights are packed once), A as tvmrnn's rows
static void mode3(void) {
  for (int rp = 0; rp < M / 32; rp++)
    for (int cp = 0; cp < NT / 2; cp++) {
      uint8_t *c0 = C + rp * 32 * LDC + cp * 128, *c1 = c0 + 16 * LDC;
      _tile_loadd(0, c0, LDC); _tile_loadd(1, c0 + 64, LDC); _tile_loadd(2, c1, LDC); _tile_loadd(3, c1 + 64, LDC);
      uint8_t *a0 = A + rp * 32 * LDA, *a1 = a0 + 16 * LDA;
      uint8_t *b0 = Bp + (2 * cp) * KC * 1024, *b1 = b0 + KC * 1024;
      for (int k = 0; k < KC; k++) {
        _tile_loadd(4, a0 + k * 64, LDA); _tile_loadd(5, a1 + k * 64, LDA);
        _tile_loadd(6, b0 + k * 1024, 64); _tile_loadd(7, b1 + k * 1024, 64);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, LDC); _tile_stored(1, c0 + 64, LDC); _tile_stored(2, c1, LDC); _tile_stored(3, c1 + 64, LDC);
    }
}
// mode 4: no loads of A in loop (A fixed), B as tvmrnn: is it B?
static void mode4(void) {
  for (int rp = 0; rp < M / 32; rp++)
    for (int cp = 0; cp < NT / 2; cp++) {
      uint8_t *c0 = C + rp * 32 * LDC + cp * 128, *c1 = c0 + 16 * LDC;
      _tile_loadd(0, c0, LDC); _tile_loadd(1, c0 + 64, LDC); _tile_loadd(2, c1, LDC); _tile_loadd(3, c1 + 64, LDC);
      for (int k = 0; k < KC; k++) {
        _tile_loadd(4, A, 64); _tile_loadd(5, A + 1024, 64);
        uint8_t *b = B + k * 16 * LDB + cp * 128;
        _tile_loadd(6, b, LDB); _tile_loadd(7, b + 64, LDB);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, LDC); _tile_stored(1, c0 + 64, LDC); _tile_stored(2, c1, LDC); _tile_stored(3, c1 + 64, LDC);
    }
}
int main(int argc, char **argv) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
  A = aligned_alloc(64, M * LDA); B = aligned_alloc(64, K2 * LDB); C = aligned_alloc(64, M * LDC);
  Ap = aligned_alloc(64, M * LDA); Bp = aligned_alloc(64, K2 * LDB);
  for (long i = 0; i < M * LDA / 2; i++) ((uint16_t *)A)[i] = ((uint16_t *)Ap)[i] = 0x3f80 + (i % 7);
  for (long i = 0; i < K2 * LDB / 2; i++) ((uint16_t *)B)[i] = ((uint16_t *)Bp)[i] = 0x3c00 + (i % 5);
  memset(C, 0, M * LDC);
  void (*modes[])(void) = {mode0, mode1, mode2, mode3, mode4};
  const char *names[] = {"tvmrnn (rp, cp, k)", "k-blocked (kb, cp, rp, k)", "A and B in 1 KB tiles", "B in 1 KB tiles", "A fixed (B alone)"};
  for (int rep = 0; rep < 2; rep++)
  for (int m = 0; m < 5; m++) for (int kb = (m == 1 ? 0 : 4); kb < 5; kb++) {
    int kbs[] = {1, 3, 5, 8, 25}; KBLK = kbs[kb];
    for (int i = 0; i < 20; i++) modes[m]();
    int n = 2000; double t0 = now();
    for (int i = 0; i < n; i++) modes[m]();
    double dt = (now() - t0) / n;
    printf("%-28s kb=%2d: %.2f us a call, %.3f TMAC/s\n", names[m], KBLK, dt * 1e6, (double)M * 64 * K2 * 2 / dt / 1e12);
  }
  _tile_release();
  return 0;
}

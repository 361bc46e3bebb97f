/* Links two kernels of examples/norms.tex compiled into one library or
 * object and checks each against a naive C version. Built and run by the
 * test suite:
 *   texc compile examples/norms.tex --kernel bn,ln --target x86-avx2 -o norms.so
 *   cc -I. examples/c/norms_main.c norms.so -o norms -lm && ./norms
 */
#include <math.h>
#include <stdio.h>

#include "norms.h"

enum { BN = TEXC_BN_X_DIM0, BC = TEXC_BN_X_DIM1, BHW = TEXC_BN_X_DIM2 * TEXC_BN_X_DIM3 };
enum { LN = TEXC_LN_X_DIM0, LD = TEXC_LN_X_DIM1 };

static unsigned s = 12345;
static float rnd(void) { s = s * 1103515245u + 12345u; return (float)(s >> 16) / 65536.0f - 0.5f; }

int main(void) {
    static float x[TEXC_BN_X_SIZE], y[TEXC_BN_Y_SIZE];
    float gamma[BC], beta[BC], mean[BC], var[BC];
    for (int i = 0; i < TEXC_BN_X_SIZE; i++) x[i] = rnd();
    for (int c = 0; c < BC; c++) { gamma[c] = rnd(); beta[c] = rnd(); mean[c] = rnd(); var[c] = rnd() + 0.5f; }
    if (texc_bn_run_sized(x, TEXC_BN_X_SIZE, gamma, BC, beta, BC, mean, BC, var, BC, y, TEXC_BN_Y_SIZE) != TEXC_BN_OK) {
        fprintf(stderr, "texc_bn_run failed\n");
        return 1;
    }
    double bn_err = 0.0;
    for (int n = 0; n < BN; n++)
        for (int c = 0; c < BC; c++)
            for (int i = 0; i < BHW; i++) {
                int at = (n * BC + c) * BHW + i;
                double want = (x[at] - mean[c]) / sqrt(var[c] + 1e-5) * gamma[c] + beta[c];
                bn_err = fmax(bn_err, fabs(want - y[at]));
            }

    static float lx[TEXC_LN_X_SIZE], ly[TEXC_LN_Y_SIZE];
    float lg[LD], lb[LD];
    for (int i = 0; i < TEXC_LN_X_SIZE; i++) lx[i] = rnd();
    for (int d = 0; d < LD; d++) { lg[d] = rnd(); lb[d] = rnd(); }
    if (texc_ln_run(lx, lg, lb, ly) != TEXC_LN_OK) {
        fprintf(stderr, "texc_ln_run failed\n");
        return 1;
    }
    double ln_err = 0.0;
    for (int n = 0; n < LN; n++) {
        double mu = 0.0, v = 0.0;
        for (int d = 0; d < LD; d++) mu += lx[n * LD + d];
        mu /= LD;
        for (int d = 0; d < LD; d++) v += (lx[n * LD + d] - mu) * (lx[n * LD + d] - mu);
        v /= LD;
        for (int d = 0; d < LD; d++) {
            double want = (lx[n * LD + d] - mu) / sqrt(v + 1e-5) * lg[d] + lb[d];
            ln_err = fmax(ln_err, fabs(want - ly[n * LD + d]));
        }
    }
    printf("texc_bn_run: max error %.3e; texc_ln_run: max error %.3e\n", bn_err, ln_err);
    return bn_err < 1e-4 && ln_err < 1e-4 ? 0 : 1;
}

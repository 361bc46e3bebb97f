/* Links the ahead-of-time compiled examples/matmul.tex and checks it
 * against a naive C matmul. Built and run by the test suite:
 *   texc compile examples/matmul.tex --target x86-avx2 -o matmul.o
 *   cc -I. examples/c/matmul_main.c matmul.o -o matmul && ./matmul
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "matmul.h"

/* The header gives the sizes it was compiled for. */
enum { M = TEXC_MATMUL_A_DIM0, K = TEXC_MATMUL_A_DIM1, N = TEXC_MATMUL_B_DIM1 };

int main(void) {
    static float a[M * K], b[K * N], c[M * N], ref[M * N];
    /* Pointers are checked: a NULL argument is an error code, not a crash. */
    if (texc_matmul_run(a, NULL, c) != TEXC_MATMUL_NULL_ARGUMENT) {
        fprintf(stderr, "texc_matmul_run accepted a NULL pointer\n");
        return 1;
    }
    /* The sized entry checks element counts against the compiled sizes. */
    if (texc_matmul_run_sized(a, M * K, b, K * N - 1, c, M * N) != TEXC_MATMUL_BAD_SIZE) {
        fprintf(stderr, "texc_matmul_run_sized accepted a wrong size\n");
        return 1;
    }
    if (texc_matmul_run_sized(NULL, M * K, b, K * N, c, M * N) != TEXC_MATMUL_NULL_ARGUMENT) {
        fprintf(stderr, "texc_matmul_run_sized accepted a NULL pointer\n");
        return 1;
    }
    unsigned s = 12345;
    for (int i = 0; i < M * K; i++) { s = s * 1103515245u + 12345u; a[i] = (float)(s >> 16) / 65536.0f - 0.5f; }
    for (int i = 0; i < K * N; i++) { s = s * 1103515245u + 12345u; b[i] = (float)(s >> 16) / 65536.0f - 0.5f; }
    if (texc_matmul_run_sized(a, TEXC_MATMUL_A_SIZE, b, TEXC_MATMUL_B_SIZE, c, TEXC_MATMUL_C_SIZE) != TEXC_MATMUL_OK) {
        fprintf(stderr, "texc_matmul_run failed\n");
        return 1;
    }
    double max_err = 0.0, max_ref = 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) acc += (double)a[i * K + k] * b[k * N + j];
            ref[i * N + j] = (float)acc;
            max_err = fmax(max_err, fabs(acc - c[i * N + j]));
            max_ref = fmax(max_ref, fabs(acc));
        }
    double rel = max_err / max_ref;
    printf("texc_matmul_run: max relative error %.3e\n", rel);
    return rel < 1e-5 ? 0 : 1;
}

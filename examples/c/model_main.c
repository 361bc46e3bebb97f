/* Calls a whole model compiled by texc with its weights inside the library:
 *
 *     texc compile resnet18.onnx --target host -o resnet18.so
 *     cc -I. -DMODEL_H='"resnet18.h"' -DINFER=texc_resnet18_infer -DN_IN=150528 -DN_OUT=1000 \
 *        examples/c/model_main.c resnet18.so -Wl,-rpath,. -o classify
 *     ./classify image.f32 [logits.f32]   # 1×3×224×224 floats in, 1000 out; raw, little-endian
 *
 * Without an input file it classifies a fixed pattern. Prints the five
 * largest outputs (class indices and logits) and the time of one call, and
 * writes all outputs to the second file when one is given. */
#include MODEL_H
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    static float x[N_IN], y[N_OUT];
    if (argc > 1) {
        FILE *f = fopen(argv[1], "rb");
        if (!f || fread(x, sizeof(float), N_IN, f) != N_IN) {
            fprintf(stderr, "%s: expected %d floats\n", argv[1], N_IN);
            return 1;
        }
        fclose(f);
    } else {
        for (int i = 0; i < N_IN; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int status = INFER(x, y);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (status != 0) {
        fprintf(stderr, "the model returned status %d\n", status);
        return 1;
    }
    if (argc > 2) {
        FILE *f = fopen(argv[2], "wb");
        if (!f || fwrite(y, sizeof(float), N_OUT, f) != N_OUT || fclose(f) != 0) {
            fprintf(stderr, "%s: cannot write the outputs\n", argv[2]);
            return 1;
        }
    }
    int top[5] = {0};
    for (int k = 0; k < 5; k++) {
        int best = -1;
        for (int i = 0; i < N_OUT; i++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= top[j] == i;
            if (!taken && (best < 0 || y[i] > y[best])) best = i;
        }
        top[k] = best;
        printf("class %4d  logit %9.4f\n", best, y[best]);
    }
    printf("one call: %.2f ms\n", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    return 0;
}

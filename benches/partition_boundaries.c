// What it costs two cores to share an NCHW activation, by how a parallel
// loop cuts it: the measurement behind docs/onnx.md, "Two threads and the
// layout of activations".
//
//   cc -O3 -march=native -ffast-math -pthread benches/partition_boundaries.c -o /tmp/pb
//   /tmp/pb 256 729     # 256 channels of a 27 x 27 map (SqueezeNet's fire 6-7)
//   /tmp/pb 256 784     # 28 x 28: rows a whole number of 64-byte lines
//
// A tensor of C rows (channels) of P floats (positions), written then read
// by each thread's part, 2000 times; it prints the mean time of
// each phase per thread, in microseconds:
//   - one thread, the whole tensor (the baseline: both phases in L2);
//   - positions: each row cut at the same position (a multiple of 16), as
//     a convolution's parallel loop over output positions cuts it; where P
//     is not a multiple of 16, the line at the cut holds both threads'
//     floats in most rows, and moves between the cores on every write;
//   - channels: whole rows each, as an element-wise loop over channels cuts
//     it: at most one shared line in all;
//   - channels, then positions: written by channels, read by positions (an
//     element-wise stage feeding a convolution): half of each thread's
//     reads come from the other core's cache.
// Threads are pinned to CPUs 0 and 1 (an error if they cannot be: two
// threads sharing a core measure nothing here; check that the two are not
// SMT siblings, `/sys/devices/system/cpu/cpu0/topology/thread_siblings_list`).
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROUNDS = 2000 };

static int C, P, nth;
static float *buf;
static atomic_int arrived;

typedef struct { int c0, c1, p0, p1; } Part;
typedef struct {
    int id;
    Part w, r;
    double tw, tr;
    volatile float sink; // each thread's sum, so that its reads are kept
} Job;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Every thread's n-th arrival waits for all threads' n-th.
static void barrier(int n) {
    atomic_fetch_add(&arrived, 1);
    while (atomic_load(&arrived) < n * nth) {
    }
}

static Part cut(int by_positions, int id) {
    Part p = {0, C, 0, P};
    if (by_positions) {
        // At a multiple of 16 floats, as a loop over vectors cuts it.
        p.p0 = id == 0 ? 0 : (int)((long long)P * id / nth / 16 * 16);
        p.p1 = id + 1 == nth ? P : (int)((long long)P * (id + 1) / nth / 16 * 16);
    } else {
        p.c0 = C * id / nth;
        p.c1 = C * (id + 1) / nth;
    }
    return p;
}

static void *run(void *arg) {
    Job *j = arg;
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(j->id, &cpus);
    int err = pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
    if (err) {
        fprintf(stderr, "cannot run a thread on CPU %d: %s\n", j->id, strerror(err));
        exit(1);
    }
    int n = 0;
    for (int it = 0; it < ROUNDS; it++) {
        barrier(++n);
        double t0 = now();
        for (int c = j->w.c0; c < j->w.c1; c++)
            for (int p = j->w.p0; p < j->w.p1; p++) buf[(size_t)c * P + p] = it * 0.5f + (float)p;
        j->tw += now() - t0;
        barrier(++n);
        t0 = now();
        float s = 0;
        for (int c = j->r.c0; c < j->r.c1; c++)
            for (int p = j->r.p0; p < j->r.p1; p++) s += buf[(size_t)c * P + p];
        j->sink = s;
        j->tr += now() - t0;
    }
    return NULL;
}

// Written cut by `wpos` (positions or channels), read cut by `rpos`.
static void measure(const char *name, int threads, int wpos, int rpos) {
    pthread_t t[2];
    Job jobs[2];
    nth = threads;
    atomic_store(&arrived, 0);
    for (int i = 0; i < threads; i++) {
        jobs[i] = (Job){i, cut(wpos, i), cut(rpos, i), 0, 0, 0};
        if (pthread_create(&t[i], NULL, run, &jobs[i])) {
            fprintf(stderr, "cannot start a thread\n");
            exit(1);
        }
    }
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("%-24s", name);
    for (int i = 0; i < threads; i++)
        printf("  thread %d: write %6.1f us, read %6.1f us", i, jobs[i].tw / ROUNDS * 1e6, jobs[i].tr / ROUNDS * 1e6);
    printf("\n");
}

// A whole number from `lo` to `hi`, or -1.
static long number(const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || end == s || *end || v < lo || v > hi ? -1 : v;
}

int main(int argc, char **argv) {
    // At least 32 positions: each thread's cut then holds a vector's 16.
    if (argc != 3 || (C = (int)number(argv[1], 2, 1 << 20)) < 0 || (P = (int)number(argv[2], 32, 1 << 24)) < 0 ||
        (long long)C * P > (1LL << 28)) {
        fprintf(stderr, "usage: %s CHANNELS POSITIONS (2 to 2^20 channels, 32 to 2^24 positions, 2^28 floats in all)\n",
                argv[0]);
        return 2;
    }
    buf = aligned_alloc(64, ((size_t)C * P * sizeof(float) + 63) / 64 * 64);
    if (!buf) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(buf, 0, (size_t)C * P * sizeof(float));
    printf("%d channels of %d floats (%zu KB)\n", C, P, (size_t)C * P * sizeof(float) / 1024);
    measure("one thread", 1, 0, 0);
    measure("positions", 2, 1, 1);
    measure("channels", 2, 0, 0);
    measure("channels, then positions", 2, 0, 1);
    return 0;
}

/*
 * How long first writes into a fresh shared file mapping take, per call: the probe
 * behind the commit log's MADV_RANDOM (docs/benchmarks.md, "Session 7: the stalls
 * were the kernel's read-ahead").
 *
 *   cc -O2 -o /tmp/prefault-probe bench/prefault-probe.c
 *   /tmp/prefault-probe 1024 64 ./probe.tmp            # 1 GiB in 64 KiB calls
 *   RANDOM_ADVICE=1 /tmp/prefault-probe 1024 64 ./probe.tmp
 *   rm ./probe.tmp
 *
 * Each call is MADV_POPULATE_WRITE over the next chunk (Linux 5.14+). Calls over
 * 3 ms are printed with their wall and CPU time; with the default read-ahead one
 * call per read_ahead_kb (8 MiB on our VMs) takes ~20 ms of CPU, with
 * RANDOM_ADVICE=1 (MADV_RANDOM on the mapping first) none does.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SIZE_MIB CHUNK_KIB FILE\n", argv[0]);
        return 2;
    }
    size_t size = (size_t)atol(argv[1]) << 20, chunk = (size_t)atol(argv[2]) << 10;
    int fd = open(argv[3], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        perror(argv[3]);
        return 1;
    }
    char *p = mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    if (getenv("RANDOM_ADVICE") && madvise(p, size, MADV_RANDOM) != 0)
        perror("MADV_RANDOM");
    double total = 0, worst = 0;
    for (size_t off = 0; off < size; off += chunk) {
        double w = ms(CLOCK_MONOTONIC), c = ms(CLOCK_THREAD_CPUTIME_ID);
        if (madvise(p + off, chunk, MADV_POPULATE_WRITE) != 0) {
            perror("MADV_POPULATE_WRITE");
            return 1;
        }
        double dw = ms(CLOCK_MONOTONIC) - w, dc = ms(CLOCK_THREAD_CPUTIME_ID) - c;
        total += dw;
        if (dw > worst)
            worst = dw;
        if (dw > 3.0)
            printf("call at %zu MiB: wall %.2f ms, cpu %.2f ms\n", off >> 20, dw, dc);
    }
    printf("%zu MiB in %zu KiB calls: %.1f ms, slowest call %.2f ms\n", size >> 20, chunk >> 10,
           total, worst);
    return 0;
}

/* The floor under `kfdtool queues`: the same sysfs and /proc reads as kfdtool.processes, in C, on
 * one CPU, with no parsing or output. scripts/bench_queues.py compiles and runs it next to each
 * measurement, so the Python numbers can be read against what the host's syscalls allow.
 *
 *   gcc -O2 -o scan_floor scripts/scan_floor.c && ./scan_floor /sys/class/kfd/kfd/proc
 *
 * Per process: every vram_<gpu>; queues/<qid>/{type,gpuid,size}; for each GPU in use (VRAM or a
 * queue) sdma_<gpu>, stats_<gpu>/{evicted_ms,cu_occupancy}, counters_<gpu>/{faults,page_in,page_out};
 * /proc/<pid>/{status,cmdline}.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_GPUS 256

static char buf[65536];
static long reads;

static long read_file(int dir_fd, const char *path)
{
    int fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    reads++;
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return strtol(buf, NULL, 10);
}

static void add_gpu(long *gpus, int *count, long gpu)
{
    for (int i = 0; i < *count; i++)
        if (gpus[i] == gpu)
            return;
    if (*count < MAX_GPUS)
        gpus[(*count)++] = gpu;
}

static void scan_process(int proc_root, const char *pid)
{
    long used[MAX_GPUS];
    int n_used = 0;
    char path[512];
    int dir_fd = openat(proc_root, pid, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0)
        return;
    DIR *dir = fdopendir(dup(dir_fd));
    for (struct dirent *e; dir && (e = readdir(dir));)
        if (!strncmp(e->d_name, "vram_", 5) && read_file(dir_fd, e->d_name) > 0)
            add_gpu(used, &n_used, strtol(e->d_name + 5, NULL, 10));
    if (dir)
        closedir(dir);
    int queues_fd = openat(dir_fd, "queues", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *queues = queues_fd >= 0 ? fdopendir(dup(queues_fd)) : NULL;
    for (struct dirent *q; queues && (q = readdir(queues));) {
        if (q->d_name[0] < '0' || q->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "%s/type", q->d_name);
        read_file(queues_fd, path);
        snprintf(path, sizeof path, "%s/gpuid", q->d_name);
        long gpu = read_file(queues_fd, path);
        if (gpu >= 0)
            add_gpu(used, &n_used, gpu);
        snprintf(path, sizeof path, "%s/size", q->d_name);
        read_file(queues_fd, path);
    }
    if (queues)
        closedir(queues);
    if (queues_fd >= 0)
        close(queues_fd);
    static const char *per_gpu[] = {"sdma_%ld", "stats_%ld/evicted_ms", "stats_%ld/cu_occupancy",
                                    "counters_%ld/faults", "counters_%ld/page_in", "counters_%ld/page_out"};
    for (int i = 0; i < n_used; i++)
        for (size_t k = 0; k < sizeof per_gpu / sizeof *per_gpu; k++) {
            snprintf(path, sizeof path, per_gpu[k], used[i]);
            read_file(dir_fd, path);
        }
    close(dir_fd);
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    read_file(AT_FDCWD, path);
    snprintf(path, sizeof path, "/proc/%s/cmdline", pid);
    read_file(AT_FDCWD, path);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s SYSFS/class/kfd/kfd/proc\n", argv[0]);
        return 2;
    }
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int proc_root = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *procs = proc_root >= 0 ? fdopendir(dup(proc_root)) : NULL;
    if (!procs) {
        perror(argv[1]);
        return 1;
    }
    long processes = 0;
    for (struct dirent *e; (e = readdir(procs));)
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9') {
            scan_process(proc_root, e->d_name);
            processes++;
        }
    closedir(procs);
    clock_gettime(CLOCK_MONOTONIC, &end);
    printf("{\"processes\": %ld, \"reads\": %ld, \"seconds\": %.6f}\n", processes, reads,
           (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9);
    return 0;
}

/*
 * Shifts a process's wall clock, for the partition suite's clock faults (tests/src/partition.rs,
 * FakeClock): preloaded (LD_PRELOAD) into redis-server, it adds an offset to CLOCK_REALTIME,
 * gettimeofday() and time(). The offset, in whole seconds ("+5", "-30"), is read from the file
 * FAKE_CLOCK_FILE names, at most every 100 ms, so a test moves the clock while the server runs.
 * Monotonic clocks are left alone, as when NTP steps a clock.
 *
 * Debian's libfaketime does this job for most programs, but hangs every jemalloc-linked
 * redis-server at startup (its initialisation allocates, jemalloc's reads the clock:
 * libfaketime issue #130). This shim allocates nothing and looks nothing up: raw system calls.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS 1000000000L

static _Atomic long offset_ns = 0;
static _Atomic long next_read_ns = 0;

static long real_clock(clockid_t id, struct timespec *ts) {
    return syscall(SYS_clock_gettime, id, ts);
}

/* Reads the offset again if the last reading is 100 ms old. */
static void refresh(void) {
    struct timespec now;
    if (real_clock(CLOCK_MONOTONIC, &now) != 0) {
        return;
    }
    long mono = now.tv_sec * NS + now.tv_nsec;
    if (mono < atomic_load(&next_read_ns)) {
        return;
    }
    atomic_store(&next_read_ns, mono + NS / 10);
    const char *path = getenv("FAKE_CLOCK_FILE");
    if (path == NULL) {
        return;
    }
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
    if (fd < 0) {
        return;
    }
    char text[32];
    long n = syscall(SYS_read, fd, text, sizeof text - 1);
    syscall(SYS_close, fd);
    if (n <= 0) {
        return;
    }
    text[n] = 0;
    long sign = 1, seconds = 0;
    int i = 0;
    if (text[0] == '+' || text[0] == '-') {
        sign = text[0] == '-' ? -1 : 1;
        i = 1;
    }
    for (; text[i] >= '0' && text[i] <= '9'; i++) {
        seconds = seconds * 10 + (text[i] - '0');
    }
    atomic_store(&offset_ns, sign * seconds * NS);
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    long result = real_clock(id, ts);
    if (result == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        refresh();
        long ns = ts->tv_sec * NS + ts->tv_nsec + atomic_load(&offset_ns);
        ts->tv_sec = ns / NS;
        ts->tv_nsec = ns % NS;
    }
    return (int)result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return -1;
    }
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}

/*
 * The simulated disk of the power-cut run (tests/support/powercut.rs).
 *
 * Loaded with LD_PRELOAD into every process of a round. Once a real sync of
 * a file in the watched folder has succeeded, the file's whole content is
 * copied to its durable image: what a disk that honours fsync holds after
 * that sync. At a cut the test makes the images the files.
 *
 * Environment:
 *   POWERCUT_DIR     the watched folder (canonical path)
 *   POWERCUT_DB      the database's file name in it (its -wal is the log)
 *   POWERCUT_IMAGES  where the images go (also `frozen` and `trigger`)
 *   POWERCUT_LOCK    the lock file shared by every process (and the cutter);
 *                    it also holds the sync counters
 *   POWERCUT_LOG     one line per image taken (appended)
 *   POWERCUT_ROLE    who this process is, for the log
 *   POWERCUT_AT      a sync to cut at: "<what> <n> <before|after>", what
 *                    one of any, wal, main, walaftermain, fdatasync, dir
 *   POWERCUT_LIE     "1": a disk that lies: syncs are logged, no image taken
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_syncfs)(int);
static void (*real_sync)(void);

static const char *dir, *db_name, *images, *lock_path, *role;
static size_t dir_len;
static int log_fd = -1;
static int lie;
static char cut_what[32];
static long cut_n;
static int cut_after;

enum kind { K_NONE, K_DIR, K_MAIN, K_WAL, K_OTHER };

/* Shared by every process of the round, in the lock file, read and
 * written under its flock. */
struct counters {
    long any, main, wal, walaftermain, fdatasync, dir;
    long main_since_wal;
};

__attribute__((constructor)) static void init(void) {
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    real_syncfs = (int (*)(int))dlsym(RTLD_NEXT, "syncfs");
    real_sync = (void (*)(void))dlsym(RTLD_NEXT, "sync");
    dir = getenv("POWERCUT_DIR");
    db_name = getenv("POWERCUT_DB");
    images = getenv("POWERCUT_IMAGES");
    lock_path = getenv("POWERCUT_LOCK");
    role = getenv("POWERCUT_ROLE");
    if (!role)
        role = "?";
    const char *log_path = getenv("POWERCUT_LOG");
    if (!dir || !db_name || !images || !lock_path || !log_path) {
        dir = NULL;
        return;
    }
    dir_len = strlen(dir);
    log_fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    const char *lie_env = getenv("POWERCUT_LIE");
    lie = lie_env && strcmp(lie_env, "1") == 0;
    const char *at = getenv("POWERCUT_AT");
    char when[16] = "";
    if (at && sscanf(at, "%31s %ld %15s", cut_what, &cut_n, when) == 3)
        cut_after = strcmp(when, "after") == 0;
    else
        cut_what[0] = 0;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* What `fd` is: the folder itself, its database or log, another file of
 * it (named in `name`), or nothing of ours. The -shm file is left out: it
 * is not the data, and a cut removes it. */
static enum kind classify(int fd, char *name, size_t cap) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return K_NONE;
    path[n] = 0;
    if (strncmp(path, dir, dir_len) != 0)
        return K_NONE;
    if (path[dir_len] == 0) {
        snprintf(name, cap, ".");
        return K_DIR;
    }
    if (path[dir_len] != '/')
        return K_NONE;
    const char *base = path + dir_len + 1;
    if (strchr(base, '/') || strstr(base, " (deleted)"))
        return K_NONE;
    size_t len = strlen(base);
    if (len >= 4 && strcmp(base + len - 4, "-shm") == 0)
        return K_NONE;
    snprintf(name, cap, "%s", base);
    if (strcmp(base, db_name) == 0)
        return K_MAIN;
    size_t db_len = strlen(db_name);
    if (len == db_len + 4 && strncmp(base, db_name, db_len) == 0 &&
        strcmp(base + db_len, "-wal") == 0)
        return K_WAL;
    return K_OTHER;
}

static void hang(void) {
    for (;;)
        pause();
}

static int frozen(void) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/frozen", images);
    return access(path, F_OK) == 0;
}

/* Stops every later sync and tells the cutter where this one stopped;
 * the trigger file appears whole (renamed into place). */
static void freeze(const char *name, const char *how, long count) {
    char path[PATH_MAX], tmp[PATH_MAX], text[PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/frozen", images);
    close(open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    snprintf(tmp, sizeof tmp, "%s/.trigger.%d", images, (int)getpid());
    snprintf(path, sizeof path, "%s/trigger", images);
    int n = snprintf(text, sizeof text, "%s %s %s %ld\n", role, name, how, count);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, text, (size_t)n) != n) {
            /* The cutter then cuts by its own deadline. */
        }
        close(fd);
        rename(tmp, path);
    }
}

/* Copies the file behind `fd` to its image, reading through `fd` itself:
 * opening and closing a second descriptor of a database file would drop
 * this process's POSIX locks on it. */
static long long copy_image(int fd, const char *name) {
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -1;
    char tmp[PATH_MAX], path[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.%s.%d", images, name, (int)getpid());
    snprintf(path, sizeof path, "%s/%s", images, name);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0)
        return -1;
    static __thread char buf[1 << 16];
    off_t off = 0;
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof buf, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        ssize_t done = 0;
        while (done < n) {
            ssize_t w = write(out, buf + done, (size_t)(n - done));
            if (w <= 0)
                break;
            done += w;
        }
        off += n;
    }
    close(out);
    rename(tmp, path);
    return (long long)off;
}

static void log_image(uint64_t at, const char *name, const char *how, long long size) {
    char line[PATH_MAX + 128];
    int n = snprintf(line, sizeof line, "%llu %d %s %s %s %lld\n", (unsigned long long)at,
                     (int)getpid(), role, name, how, size);
    if (log_fd >= 0 && write(log_fd, line, (size_t)n) != n) {
        /* A short log costs the report a line, not the run. */
    }
}

/* After a real sync of `fd` succeeded: counts it, takes its image, and
 * stops here if this is the sync to cut at. */
static void synced(int fd, const char *how) {
    if (!dir)
        return;
    char name[PATH_MAX];
    enum kind kind = classify(fd, name, sizeof name);
    if (kind == K_NONE)
        return;
    int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0)
        return;
    while (flock(lock, LOCK_EX) != 0 && errno == EINTR) {
    }
    if (frozen()) {
        /* The power is off: this sync never completes. */
        close(lock);
        hang();
    }
    struct counters c;
    memset(&c, 0, sizeof c);
    if (pread(lock, &c, sizeof c, 0) != (ssize_t)sizeof c)
        memset(&c, 0, sizeof c);
    long count = -1;
    c.any++;
    if (strcmp(cut_what, "any") == 0)
        count = c.any;
    if (strcmp(how, "fdatasync") == 0) {
        c.fdatasync++;
        if (strcmp(cut_what, "fdatasync") == 0)
            count = c.fdatasync;
    }
    switch (kind) {
    case K_DIR:
        c.dir++;
        if (strcmp(cut_what, "dir") == 0)
            count = c.dir;
        break;
    case K_MAIN:
        c.main++;
        c.main_since_wal = 1;
        if (strcmp(cut_what, "main") == 0)
            count = c.main;
        break;
    case K_WAL:
        c.wal++;
        if (strcmp(cut_what, "wal") == 0)
            count = c.wal;
        if (c.main_since_wal) {
            c.main_since_wal = 0;
            c.walaftermain++;
            if (strcmp(cut_what, "walaftermain") == 0)
                count = c.walaftermain;
        }
        break;
    default:
        break;
    }
    if (pwrite(lock, &c, sizeof c, 0) != (ssize_t)sizeof c) {
        /* Counts lost: the cutter then cuts by its own deadline. */
    }
    int hit = cut_what[0] && count == cut_n;
    if (hit && !cut_after) {
        freeze(name, how, count);
        close(lock);
        hang();
    }
    uint64_t at = now_ns();
    long long size = 0;
    if (kind != K_DIR && !lie)
        size = copy_image(fd, name);
    log_image(at, name, how, size);
    if (hit) {
        freeze(name, how, count);
        close(lock);
        hang();
    }
    close(lock);
}

/* sync() and syncfs(): every file of the folder, read through this
 * process's own descriptor of it when it has one (see copy_image). */
static void synced_all(const char *how) {
    if (!dir)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int fd = -1, own = 0;
        DIR *fds = opendir("/proc/self/fd");
        struct dirent *f;
        while (fds && (f = readdir(fds)) != NULL) {
            char link[64], target[PATH_MAX];
            snprintf(link, sizeof link, "/proc/self/fd/%s", f->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n > 0) {
                target[n] = 0;
                if (strcmp(target, path) == 0) {
                    fd = atoi(f->d_name);
                    break;
                }
            }
        }
        if (fds)
            closedir(fds);
        if (fd < 0) {
            /* Not open here, so this process holds no lock on it. */
            fd = open(path, O_RDONLY | O_CLOEXEC);
            own = 1;
        }
        if (fd >= 0) {
            synced(fd, how);
            if (own)
                close(fd);
        }
    }
    closedir(d);
}

int fsync(int fd) {
    int rc = real_fsync(fd);
    if (rc == 0)
        synced(fd, "fsync");
    return rc;
}

int fdatasync(int fd) {
    int rc = real_fdatasync(fd);
    if (rc == 0)
        synced(fd, "fdatasync");
    return rc;
}

int syncfs(int fd) {
    int rc = real_syncfs(fd);
    if (rc == 0)
        synced_all("syncfs");
    return rc;
}

void sync(void) {
    real_sync();
    synced_all("sync");
}

// The ceiling for a FUSE file system on this machine: every request is answered by the
// matching system call on a local directory (tmpfs), with nothing else (no network, no
// protocol, no caching beyond what the kernel keeps for a second). PostMark on this
// mount is what any FUSE client of a remote server could reach at best at 0 ms RTT.
// One thread, as `locus mount` serves FUSE.
//
//   apt-get install -y libfuse3-dev
//   cc -O2 -o /tmp/fuse_ceiling bench/fuse_passthrough_ceiling.c $(pkg-config fuse3 --cflags --libs)
//   /tmp/fuse_ceiling -s -f -o noatime BACKING_DIR MOUNTPOINT &   # fusermount3 -u to end
//
// With CEILING_TTL=SECONDS in the environment, the kernel keeps names, attributes and
// listings that long (as `locus mount` does while callbacks hold); 1 s by default.
//
// BACKING_DIR is the first argument before the mount point; paths from FUSE are joined
// to it (FUSE hands absolute paths beneath the mount, never `..`).
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <fuse3/fuse.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int backing = -1;
static double ttl = 1.0;

// The path relative to the backing directory ("." for the root).
static const char *rel(const char *path) { return path[1] ? path + 1 : "."; }

static void *ceiling_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->use_ino = 1;
    cfg->entry_timeout = cfg->attr_timeout = ttl;
    cfg->negative_timeout = ttl;
    cfg->kernel_cache = 1;
    return NULL;
}

static int ceiling_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    int r = fi ? fstat(fi->fh, st) : fstatat(backing, rel(path), st, AT_SYMLINK_NOFOLLOW);
    return r < 0 ? -errno : 0;
}

static int ceiling_opendir(const char *path, struct fuse_file_info *fi) {
    (void)path;
    fi->cache_readdir = ttl > 1.0;
    fi->keep_cache = ttl > 1.0;
    return 0;
}

static int ceiling_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                           struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off; (void)fi; (void)flags;
    int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -errno;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return -errno; }
    struct dirent *e;
    // Each entry's type goes with its name (as `locus mount` sends it), so `find` need
    // not look up every file to learn whether it is a directory.
    while ((e = readdir(d))) {
        struct stat st = {.st_ino = e->d_ino, .st_mode = (mode_t)DTTOIF(e->d_type)};
        fill(buf, e->d_name, &st, 0, 0);
    }
    closedir(d);
    return 0;
}

static int ceiling_open(const char *path, struct fuse_file_info *fi) {
    int fd = openat(backing, rel(path), fi->flags & ~O_NOFOLLOW);
    if (fd < 0) return -errno;
    fi->fh = fd;
    fi->keep_cache = 1;
    return 0;
}

static int ceiling_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int fd = openat(backing, rel(path), fi->flags | O_CREAT, mode);
    if (fd < 0) return -errno;
    fi->fh = fd;
    return 0;
}

static int ceiling_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    ssize_t n = pread(fi->fh, buf, size, off);
    return n < 0 ? -errno : (int)n;
}

static int ceiling_write(const char *path, const char *buf, size_t size, off_t off,
                         struct fuse_file_info *fi) {
    (void)path;
    ssize_t n = pwrite(fi->fh, buf, size, off);
    return n < 0 ? -errno : (int)n;
}

static int ceiling_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close(fi->fh);
    return 0;
}

static int ceiling_unlink(const char *path) { return unlinkat(backing, rel(path), 0) < 0 ? -errno : 0; }
static int ceiling_rmdir(const char *path) { return unlinkat(backing, rel(path), AT_REMOVEDIR) < 0 ? -errno : 0; }
static int ceiling_mkdir(const char *path, mode_t mode) { return mkdirat(backing, rel(path), mode) < 0 ? -errno : 0; }

static int ceiling_rename(const char *from, const char *to, unsigned int flags) {
    if (flags) return -EINVAL;
    return renameat(backing, rel(from), backing, rel(to)) < 0 ? -errno : 0;
}

static int ceiling_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    int r;
    if (fi) {
        r = ftruncate(fi->fh, size);
    } else {
        int fd = openat(backing, rel(path), O_WRONLY);
        if (fd < 0) return -errno;
        r = ftruncate(fd, size);
        close(fd);
    }
    return r < 0 ? -errno : 0;
}

static int ceiling_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
    int r = fi ? futimens(fi->fh, tv) : utimensat(backing, rel(path), tv, AT_SYMLINK_NOFOLLOW);
    return r < 0 ? -errno : 0;
}

static int ceiling_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int r = fi ? fchmod(fi->fh, mode) : fchmodat(backing, rel(path), mode, 0);
    return r < 0 ? -errno : 0;
}

static const struct fuse_operations ops = {
    .init = ceiling_init,
    .getattr = ceiling_getattr,
    .opendir = ceiling_opendir,
    .readdir = ceiling_readdir,
    .open = ceiling_open,
    .create = ceiling_create,
    .read = ceiling_read,
    .write = ceiling_write,
    .release = ceiling_release,
    .unlink = ceiling_unlink,
    .rmdir = ceiling_rmdir,
    .mkdir = ceiling_mkdir,
    .rename = ceiling_rename,
    .truncate = ceiling_truncate,
    .utimens = ceiling_utimens,
    .chmod = ceiling_chmod,
};

int main(int argc, char *argv[]) {
    // The backing directory is the last argument but one; FUSE gets the rest.
    if (argc < 3) {
        fprintf(stderr, "usage: %s [FUSE options] BACKING_DIR MOUNTPOINT\n", argv[0]);
        return 2;
    }
    if (getenv("CEILING_TTL")) ttl = atof(getenv("CEILING_TTL"));
    backing = open(argv[argc - 2], O_RDONLY | O_DIRECTORY);
    if (backing < 0) {
        perror(argv[argc - 2]);
        return 1;
    }
    argv[argc - 2] = argv[argc - 1];
    return fuse_main(argc - 1, argv, &ops, NULL);
}

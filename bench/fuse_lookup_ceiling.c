// The ceiling for walking a tree through FUSE on this machine: a file system
// that answers lookups, attributes and listings of a local directory (tmpfs) with their
// system calls and nothing else, and lets the kernel keep all of them as long as it
// likes, as `locus mount --consistency afs` does while callbacks hold: day-long entry
// and attribute timeouts, and opening directories "not implemented", so the kernel
// sends no opens or releases of directories and keeps what `readdir` answered. A `find`
// run twice on it shows what the second pass must cost any FUSE file system here.
// One thread, as `locus mount` serves FUSE; the low-level API, as the kernel speaks.
//
//   apt-get install -y libfuse3-dev
//   cc -O2 -o /tmp/fuse_lookup_ceiling bench/fuse_lookup_ceiling.c $(pkg-config fuse3 --cflags --libs)
//   /tmp/fuse_lookup_ceiling BACKING_DIR MOUNTPOINT &   # fusermount3 -u MOUNTPOINT to end
#define FUSE_USE_VERSION 34
#define _GNU_SOURCE
#include <fuse3/fuse_lowlevel.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TIMEOUT 86400.0

// Node ids are indexes into `nodes` (1 is the root); each holds an O_PATH descriptor of
// its file and the file's inode number, by which `by_ino` finds it again.
struct node {
    int fd;
    ino_t ino;
};
static struct node *nodes;
static size_t count = 1, capacity = 0;
static fuse_ino_t *by_ino; // open addressing on st_ino; 0 is empty
static size_t slots = 1 << 16;

static size_t slot_of(ino_t ino) {
    size_t i = (size_t)ino * 0x9E3779B97F4A7C15ull >> 40;
    for (i &= slots - 1; by_ino[i] && nodes[by_ino[i]].ino != ino; i = (i + 1) & (slots - 1)) {
    }
    return i;
}

// The node of the file `name` in `parent` with attributes `st`, made on first sight.
static fuse_ino_t node_for(int parent, const char *name, const struct stat *st) {
    size_t s = slot_of(st->st_ino);
    if (by_ino[s]) return by_ino[s];
    if (count * 2 >= slots) return 0; // full: the caller answers ENOMEM
    int fd = openat(parent, name, O_PATH | O_NOFOLLOW);
    if (fd < 0) return 0;
    if (count == capacity) {
        capacity = capacity ? capacity * 2 : 1024;
        nodes = realloc(nodes, capacity * sizeof *nodes);
    }
    nodes[count] = (struct node){fd, st->st_ino};
    by_ino[s] = count;
    return count++;
}

static void ceiling_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    struct fuse_entry_param e = {.attr_timeout = TIMEOUT, .entry_timeout = TIMEOUT};
    if (fstatat(nodes[parent].fd, name, &e.attr, AT_SYMLINK_NOFOLLOW) < 0) {
        // A missing name is remembered as long (a zero node id with a timeout).
        if (errno == ENOENT) {
            e.ino = 0;
            fuse_reply_entry(req, &e);
        } else {
            fuse_reply_err(req, errno);
        }
        return;
    }
    e.ino = node_for(nodes[parent].fd, name, &e.attr);
    if (!e.ino) {
        fuse_reply_err(req, errno ? errno : ENOMEM);
        return;
    }
    e.attr.st_ino = e.ino;
    fuse_reply_entry(req, &e);
}

static void ceiling_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    struct stat st;
    if (fstatat(nodes[ino].fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    st.st_ino = ino;
    fuse_reply_attr(req, &st, TIMEOUT);
}

static void ceiling_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    (void)fi;
    fuse_reply_err(req, ENOSYS); // no opens of directories; listings kept by the kernel
}

// Entries from index `off` on, as many as fit in `size` bytes; offsets are index + 1.
static void ceiling_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)fi;
    int fd = openat(nodes[ino].fd, ".", O_RDONLY | O_DIRECTORY);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0) close(fd);
        fuse_reply_err(req, errno);
        return;
    }
    char *buf = malloc(size);
    size_t used = 0;
    off_t index = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (index++ < off) continue;
        struct stat st = {.st_ino = e->d_ino, .st_mode = (mode_t)DTTOIF(e->d_type)};
        size_t need = fuse_add_direntry(req, buf + used, size - used, e->d_name, &st, index);
        if (need > size - used) break;
        used += need;
    }
    closedir(d);
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void ceiling_readlink(fuse_req_t req, fuse_ino_t ino) {
    char target[4096];
    ssize_t n = readlinkat(nodes[ino].fd, "", target, sizeof target - 1);
    if (n < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    target[n] = 0;
    fuse_reply_readlink(req, target);
}

static const struct fuse_lowlevel_ops ops = {
    .lookup = ceiling_lookup,
    .getattr = ceiling_getattr,
    .opendir = ceiling_opendir,
    .readdir = ceiling_readdir,
    .readlink = ceiling_readlink,
};

int main(int argc, char *argv[]) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s BACKING_DIR MOUNTPOINT\n", argv[0]);
        return 2;
    }
    by_ino = calloc(slots, sizeof *by_ino);
    capacity = 1024;
    nodes = calloc(capacity, sizeof *nodes);
    nodes[1].fd = open(argv[1], O_PATH | O_DIRECTORY);
    if (nodes[1].fd < 0) {
        perror(argv[1]);
        return 1;
    }
    struct stat root;
    fstat(nodes[1].fd, &root);
    nodes[1].ino = root.st_ino;
    by_ino[slot_of(root.st_ino)] = 1;
    count = 2;
    char *fuse_argv[] = {argv[0], "-o", "noatime,fsname=ceiling", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_session_mount(se, argv[2]) != 0) return 1;
    fuse_set_signal_handlers(se);
    int r = fuse_session_loop(se);
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    return r ? 1 : 0;
}

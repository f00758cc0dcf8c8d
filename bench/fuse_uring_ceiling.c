// The ceiling for FUSE over io_uring against classic FUSE on this machine: one bare
// file system, written against the kernel's FUSE protocol without libfuse, that answers
// every request with the matching system call on a local directory (tmpfs) and nothing
// else, and takes its requests by one of two transports chosen on the command line:
//
//   classic  a loop of read() and write() on /dev/fuse, in THREADS threads;
//   uring    FUSE over io_uring (kernel 6.14 and later, FUSE 7.42): after FUSE_INIT,
//            one thread per CPU, pinned to it, registers QUEUE_DEPTH ring entries
//            (a header buffer and a payload buffer each) with the kernel through
//            IORING_OP_URING_CMD on /dev/fuse, and answers each request it gets back by
//            committing the reply and fetching the next request in one submission.
//
// The code that answers requests is the same for both, so timing a workload on each
// compares the transports and nothing else. Kernel caching as `fuse_passthrough_ceiling`
// with CEILING_TTL (names, attributes and negative lookups kept that long, open files
// FOPEN_KEEP_CACHE, and listings FOPEN_CACHE_DIR when the TTL exceeds a second).
// Directories are opened (OPENDIR and RELEASEDIR), as `locus mount` answers them, where
// `fuse_lookup_ceiling` declines them; max_write is 128 KiB, as libfuse 3.14 negotiates.
// Even with io_uring the kernel sends FORGET and INTERRUPT over /dev/fuse, so the uring
// transport keeps one thread reading it; it counts what it gets (printed on exit).
// The kernel does not use the ring until every possible CPU's queue has an entry
// registered; until then requests wait (`--queues 1` on 2 CPUs shows it: a stat of the
// mount hangs until killed). The program checks the ring is used (a statfs of the mount
// must come back over it) before it says "ready" on stdout.
//
//   apt-get install -y liburing-dev
//   echo 1 > /sys/module/fuse/parameters/enable_uring              # for --transport uring
//   cc -O2 -Wall -o /tmp/fuse_uring_ceiling bench/fuse_uring_ceiling.c -luring -lpthread
//   /tmp/fuse_uring_ceiling --transport classic|uring [--threads N] BACKING_DIR MOUNTPOINT &
//   ...                                     # as root; it mounts and prints "ready"
//   umount MOUNTPOINT                       # it exits when unmounted (or on SIGINT/SIGTERM)
//
// Node ids index a table of O_PATH descriptors of the backing files (1 is the root),
// found again by inode number; ids are never reused, so renames and unlinks leave every
// id naming the file it named. Files are opened again through /proc/self/fd/N.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

// ---- FUSE over io_uring, from the kernel's include/uapi/linux/fuse.h (7.42); this
// machine's <linux/fuse.h> (7.38) predates it.

#define FUSE_OVER_IO_URING (1ULL << 41) // INIT flag: the server will take requests by ring
#define FUSE_URING_IN_OUT_HEADER_SZ 128
#define FUSE_URING_OP_IN_OUT_SZ 128

// Filled by the kernel with each request: which request (to commit it), and how many
// bytes it wrote into the payload buffer; filled by us with how many we reply.
struct fuse_uring_ent_in_out {
    uint64_t flags;
    uint64_t commit_id;
    uint32_t payload_sz;
    uint32_t padding;
    uint64_t reserved;
};

// The header buffer of a ring entry. `in_out` holds struct fuse_in_header with a request
// and our struct fuse_out_header with its reply; `op_in` holds the request's first
// argument (fuse_read_in, fuse_write_in, ...); the rest of the request (names, written
// data) and the whole reply body go in the separate payload buffer.
struct fuse_uring_req_header {
    char in_out[FUSE_URING_IN_OUT_HEADER_SZ];
    char op_in[FUSE_URING_OP_IN_OUT_SZ];
    struct fuse_uring_ent_in_out ring_ent_in_out;
};

enum fuse_uring_cmd {
    FUSE_IO_URING_CMD_INVALID = 0,
    FUSE_IO_URING_CMD_REGISTER = 1,         // give the kernel an entry; it fills it later
    FUSE_IO_URING_CMD_COMMIT_AND_FETCH = 2, // reply in the entry, and wait for the next
};

// In the command area of a 128-byte SQE (IORING_SETUP_SQE128).
struct fuse_uring_cmd_req {
    uint64_t flags;
    uint64_t commit_id; // the request replied to (COMMIT_AND_FETCH)
    uint16_t qid;       // the queue: one per CPU
    uint8_t padding[6];
};

// ---- Settings.

#define PROTOCOL_MINOR 42            // FUSE 7.42: the first with io_uring
#define MAX_WRITE (128 * 1024)       // as libfuse 3.14 negotiates, so its ceilings match
#define MAX_PAGES (MAX_WRITE / 4096)
#define REPLY_MAX MAX_WRITE          // the largest reply body: a READ of max_pages pages
#define CLASSIC_BUFFER (MAX_WRITE + 4096) // a request: headers and max_write bytes
#define QUEUE_DEPTH 8                // ring entries per queue (libfuse's default)
#define MAX_NODES (1u << 22)         // node ids ever handed out in one mount

static double ttl = 1.0; // CEILING_TTL: how long the kernel may keep what it learns
static int fuse_fd = -1;
static const char *mountpoint;

// ---- Nodes: node id -> O_PATH descriptor of the backing file, and inode -> node id.

struct node {
    int fd;           // O_PATH | O_NOFOLLOW; -1 once forgotten
    ino_t ino;        // the backing file's inode number
    uint64_t nlookup; // lookups the kernel holds (entries replied minus forgotten)
    uint64_t next;    // next node id in the same `by_ino` bucket
};
static struct node *nodes; // indexed by node id; calloc'd large, touched as used
static uint64_t node_count = 2;
#define BUCKETS (1u << 16)
static uint64_t by_ino[BUCKETS];
static pthread_mutex_t nodes_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t *bucket(ino_t ino) { return &by_ino[(ino * 0x9E3779B97F4A7C15ull) >> 48]; }

// The node of the file open (O_PATH) as `fd` with attributes `st`, one more lookup held
// by the kernel. Takes `fd`: closes it when the file already has a node. 0 when full.
static uint64_t node_hold(int fd, const struct stat *st) {
    pthread_mutex_lock(&nodes_lock);
    uint64_t id = *bucket(st->st_ino);
    while (id && nodes[id].ino != st->st_ino) id = nodes[id].next;
    if (id) {
        close(fd); // an inode known by its descriptor cannot have been reused
    } else if (node_count < MAX_NODES) {
        id = node_count++;
        nodes[id] = (struct node){.fd = fd, .ino = st->st_ino, .next = *bucket(st->st_ino)};
        *bucket(st->st_ino) = id;
    } else {
        close(fd);
    }
    if (id) nodes[id].nlookup++;
    pthread_mutex_unlock(&nodes_lock);
    return id;
}

// The kernel forgets `n` lookups of node `id`; at none, the node goes.
static void node_forget(uint64_t id, uint64_t n) {
    if (id <= 1 || id >= MAX_NODES) return; // the root is never forgotten
    pthread_mutex_lock(&nodes_lock);
    struct node *nd = &nodes[id];
    if (nd->fd >= 0) nd->nlookup -= n < nd->nlookup ? n : nd->nlookup;
    if (nd->fd >= 0 && nd->nlookup == 0) {
        uint64_t *link = bucket(nd->ino);
        while (*link != id) link = &nodes[*link].next;
        *link = nd->next;
        close(nd->fd);
        nd->fd = -1;
    }
    pthread_mutex_unlock(&nodes_lock);
}

// The O_PATH descriptor of a node the kernel holds (it sends no forget while a request
// on the node is in flight, so the descriptor stays open for the request).
static int node_fd(uint64_t id) { return id < MAX_NODES ? nodes[id].fd : -1; }

// "/proc/self/fd/N", by which an O_PATH descriptor is opened for real.
static char *proc_path(char buf[32], int fd) {
    snprintf(buf, 32, "/proc/self/fd/%d", fd);
    return buf;
}

// ---- A request, as either transport hands it to `serve`.

struct request {
    const struct fuse_in_header *in;
    const void *arg;  // the first argument: fuse_read_in, fuse_mkdir_in, ...
    const char *data; // what follows it: names, the bytes of a WRITE
    size_t data_len;
    // The reply body goes here (REPLY_MAX bytes). With io_uring this is the payload
    // buffer that holds `data`, so handlers use `data` up before they write a reply.
    char *out;
    size_t out_len;   // set by the handler
    bool no_reply;    // FORGET, BATCH_FORGET, INTERRUPT
};

static int reply(struct request *r, const void *body, size_t len) {
    memcpy(r->out, body, len);
    r->out_len = len;
    return 0;
}

static void split_ttl(uint64_t *sec, uint32_t *nsec) {
    *sec = (uint64_t)ttl;
    *nsec = (uint32_t)((ttl - (double)*sec) * 1e9);
}

static void fill_attr(struct fuse_attr *a, const struct stat *st) {
    *a = (struct fuse_attr){
        .ino = st->st_ino, .size = st->st_size, .blocks = st->st_blocks,
        .atime = st->st_atim.tv_sec, .mtime = st->st_mtim.tv_sec, .ctime = st->st_ctim.tv_sec,
        .atimensec = st->st_atim.tv_nsec, .mtimensec = st->st_mtim.tv_nsec,
        .ctimensec = st->st_ctim.tv_nsec, .mode = st->st_mode, .nlink = st->st_nlink,
        .uid = st->st_uid, .gid = st->st_gid, .rdev = st->st_rdev, .blksize = st->st_blksize,
    };
}

// The entry for `name` in the directory open as `parent`, with one more lookup held.
// A missing name becomes a negative entry (node id 0) the kernel keeps for the TTL.
static int make_entry(int parent, const char *name, struct fuse_entry_out *e) {
    *e = (struct fuse_entry_out){0};
    split_ttl(&e->entry_valid, &e->entry_valid_nsec);
    split_ttl(&e->attr_valid, &e->attr_valid_nsec);
    int fd = openat(parent, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -errno;
    struct stat st;
    if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    e->nodeid = node_hold(fd, &st);
    if (!e->nodeid) return -ENOMEM;
    fill_attr(&e->attr, &st);
    return 0;
}

// A reply with an entry that must name a file (not negative).
static int reply_entry(struct request *r, int parent, const char *name) {
    struct fuse_entry_out e;
    int err = make_entry(parent, name, &e);
    if (err) return err;
    if (!e.nodeid) return -ENOENT;
    return reply(r, &e, sizeof e);
}

static int reply_attr(struct request *r, const struct stat *st) {
    struct fuse_attr_out a = {0};
    split_ttl(&a.attr_valid, &a.attr_valid_nsec);
    fill_attr(&a.attr, st);
    return reply(r, &a, sizeof a);
}

// ---- The passthrough: one handler per request, each a system call or two.

static int do_lookup(struct request *r, int dir) {
    struct fuse_entry_out e;
    int err = make_entry(dir, r->data, &e);
    return err ? err : reply(r, &e, sizeof e);
}

static int do_getattr(struct request *r, int fd) {
    const struct fuse_getattr_in *g = r->arg;
    struct stat st;
    int res = g->getattr_flags & FUSE_GETATTR_FH ? fstat((int)g->fh, &st)
                                                : fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
    return res < 0 ? -errno : reply_attr(r, &st);
}

static int do_setattr(struct request *r, int fd) {
    const struct fuse_setattr_in *s = r->arg;
    char path[32];
    proc_path(path, fd);
    if ((s->valid & FATTR_MODE) && chmod(path, s->mode) < 0) return -errno;
    if (s->valid & (FATTR_UID | FATTR_GID)) {
        uid_t uid = s->valid & FATTR_UID ? s->uid : (uid_t)-1;
        gid_t gid = s->valid & FATTR_GID ? s->gid : (gid_t)-1;
        if (fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) return -errno;
    }
    if (s->valid & FATTR_SIZE) {
        int res = s->valid & FATTR_FH ? ftruncate((int)s->fh, s->size) : truncate(path, s->size);
        if (res < 0) return -errno;
    }
    if (s->valid & (FATTR_ATIME | FATTR_MTIME)) {
        struct timespec t[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_OMIT}};
        if (s->valid & FATTR_ATIME_NOW) t[0].tv_nsec = UTIME_NOW;
        else if (s->valid & FATTR_ATIME) t[0] = (struct timespec){s->atime, s->atimensec};
        if (s->valid & FATTR_MTIME_NOW) t[1].tv_nsec = UTIME_NOW;
        else if (s->valid & FATTR_MTIME) t[1] = (struct timespec){s->mtime, s->mtimensec};
        if (utimensat(AT_FDCWD, path, t, 0) < 0) return -errno;
    }
    struct stat st;
    if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) return -errno;
    return reply_attr(r, &st);
}

static int do_readlink(struct request *r, int fd) {
    ssize_t n = readlinkat(fd, "", r->out, REPLY_MAX);
    if (n < 0) return -errno;
    r->out_len = (size_t)n;
    return 0;
}

static int do_mknod(struct request *r, int dir) {
    const struct fuse_mknod_in *m = r->arg;
    if (mknodat(dir, r->data, m->mode, m->rdev) < 0) return -errno;
    return reply_entry(r, dir, r->data);
}

static int do_mkdir(struct request *r, int dir) {
    const struct fuse_mkdir_in *m = r->arg;
    if (mkdirat(dir, r->data, m->mode) < 0) return -errno;
    return reply_entry(r, dir, r->data);
}

static int do_symlink(struct request *r, int dir) {
    const char *name = r->data, *target = name + strlen(name) + 1;
    if (symlinkat(target, dir, name) < 0) return -errno;
    return reply_entry(r, dir, name);
}

static int do_link(struct request *r, int dir) {
    const struct fuse_link_in *l = r->arg;
    if (linkat(node_fd(l->oldnodeid), "", dir, r->data, AT_EMPTY_PATH) < 0) return -errno;
    return reply_entry(r, dir, r->data);
}

static int do_unlink(struct request *r, int dir, int flags) {
    return unlinkat(dir, r->data, flags) < 0 ? -errno : 0;
}

static int do_rename(struct request *r, int dir, uint64_t newdir, unsigned flags) {
    const char *from = r->data, *to = from + strlen(from) + 1;
    return renameat2(dir, from, node_fd(newdir), to, flags) < 0 ? -errno : 0;
}

static int reply_open(struct request *r, uint64_t fh, uint32_t open_flags) {
    struct fuse_open_out o = {.fh = fh, .open_flags = open_flags};
    return reply(r, &o, sizeof o);
}

// The kernel gives file positions itself: O_APPEND would move our writes.
static int open_flags(uint32_t flags) { return (int)(flags & ~(O_NOFOLLOW | O_APPEND)) | O_CLOEXEC; }

static int do_open(struct request *r, int fd) {
    const struct fuse_open_in *o = r->arg;
    char path[32];
    int file = open(proc_path(path, fd), open_flags(o->flags) & ~(O_CREAT | O_EXCL));
    if (file < 0) return -errno;
    return reply_open(r, (uint64_t)file, FOPEN_KEEP_CACHE);
}

static int do_create(struct request *r, int dir) {
    const struct fuse_create_in *c = r->arg;
    int file = openat(dir, r->data, open_flags(c->flags) | O_CREAT, c->mode);
    if (file < 0) return -errno;
    struct {
        struct fuse_entry_out e;
        struct fuse_open_out o;
    } out = {.o = {.fh = (uint64_t)file, .open_flags = FOPEN_KEEP_CACHE}};
    int err = make_entry(dir, r->data, &out.e);
    if (!err && !out.e.nodeid) err = -ENOENT;
    if (err) {
        close(file);
        return err;
    }
    return reply(r, &out, sizeof out);
}

static int do_read(struct request *r) {
    const struct fuse_read_in *rd = r->arg;
    size_t size = rd->size < REPLY_MAX ? rd->size : REPLY_MAX;
    ssize_t n = pread((int)rd->fh, r->out, size, (off_t)rd->offset);
    if (n < 0) return -errno;
    r->out_len = (size_t)n;
    return 0;
}

static int do_write(struct request *r) {
    const struct fuse_write_in *w = r->arg;
    size_t size = w->size < r->data_len ? w->size : r->data_len;
    ssize_t n = pwrite((int)w->fh, r->data, size, (off_t)w->offset);
    if (n < 0) return -errno;
    struct fuse_write_out out = {.size = (uint32_t)n};
    return reply(r, &out, sizeof out);
}

static int do_statfs(struct request *r, int fd) {
    struct statfs s;
    if (fstatfs(fd, &s) < 0) return -errno;
    struct fuse_statfs_out out = {.st = {
        .blocks = s.f_blocks, .bfree = s.f_bfree, .bavail = s.f_bavail, .files = s.f_files,
        .ffree = s.f_ffree, .bsize = (uint32_t)s.f_bsize, .namelen = (uint32_t)s.f_namelen,
        .frsize = (uint32_t)s.f_frsize}};
    return reply(r, &out, sizeof out);
}

static int do_access(struct request *r, int fd) {
    const struct fuse_access_in *a = r->arg;
    char path[32];
    return faccessat(AT_FDCWD, proc_path(path, fd), (int)a->mask, AT_EACCESS) < 0 ? -errno : 0;
}

// An open directory: its stream, the offset the kernel will ask for next, and an entry
// read but not sent (it did not fit in the last reply).
struct dir_handle {
    DIR *dir;
    off_t offset;
    struct dirent *entry;
};

static int do_opendir(struct request *r, int fd) {
    int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -errno;
    struct dir_handle *d = calloc(1, sizeof *d);
    if (!d || !(d->dir = fdopendir(dfd))) {
        free(d);
        close(dfd);
        return -ENOMEM;
    }
    return reply_open(r, (uintptr_t)d, ttl > 1.0 ? FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE : 0);
}

// Entries from the kernel's offset on, as many as fit; an entry's offset is where the
// stream stands after it (telldir), so the kernel can ask again from there.
static int do_readdir(struct request *r) {
    const struct fuse_read_in *rd = r->arg;
    struct dir_handle *d = (struct dir_handle *)(uintptr_t)rd->fh;
    size_t size = rd->size < REPLY_MAX ? rd->size : REPLY_MAX, used = 0;
    if ((off_t)rd->offset != d->offset) {
        seekdir(d->dir, (long)rd->offset);
        d->offset = (off_t)rd->offset;
        d->entry = NULL;
    }
    for (;;) {
        if (!d->entry) {
            errno = 0;
            d->entry = readdir(d->dir);
            if (!d->entry) {
                if (errno && !used) return -errno;
                break;
            }
        }
        size_t namelen = strlen(d->entry->d_name), len = FUSE_DIRENT_SIZE(&(struct fuse_dirent){.namelen = namelen});
        if (used + len > size) break; // kept in d->entry for the next READDIR
        struct fuse_dirent *de = (struct fuse_dirent *)(r->out + used);
        off_t next = telldir(d->dir);
        *de = (struct fuse_dirent){.ino = d->entry->d_ino, .off = (uint64_t)next, .namelen = (uint32_t)namelen,
                                   .type = d->entry->d_type};
        memcpy(de->name, d->entry->d_name, namelen);
        memset(de->name + namelen, 0, len - FUSE_NAME_OFFSET - namelen);
        used += len;
        d->offset = next;
        d->entry = NULL;
    }
    r->out_len = used;
    return 0;
}

static int do_releasedir(struct request *r) {
    const struct fuse_release_in *rl = r->arg;
    struct dir_handle *d = (struct dir_handle *)(uintptr_t)rl->fh;
    closedir(d->dir);
    free(d);
    return 0;
}

static int do_fsync(struct request *r, bool dir) {
    const struct fuse_fsync_in *f = r->arg;
    int fd = dir ? dirfd(((struct dir_handle *)(uintptr_t)f->fh)->dir) : (int)f->fh;
    int res = f->fsync_flags & FUSE_FSYNC_FDATASYNC ? fdatasync(fd) : fsync(fd);
    return res < 0 ? -errno : 0;
}

static void do_batch_forget(struct request *r) {
    const struct fuse_batch_forget_in *b = r->arg;
    const struct fuse_forget_one *f = (const struct fuse_forget_one *)r->data;
    for (uint32_t i = 0; i < b->count && (i + 1) * sizeof *f <= r->data_len; i++) node_forget(f[i].nodeid, f[i].nlookup);
}

static atomic_bool destroyed;

// Answers one request: 0 or -errno, the reply body in r->out (r->out_len bytes).
static int serve(struct request *r) {
    uint64_t id = r->in->nodeid;
    int fd = node_fd(id);
    switch (r->in->opcode) {
    case FUSE_LOOKUP: return do_lookup(r, fd);
    case FUSE_FORGET:
        node_forget(id, ((const struct fuse_forget_in *)r->arg)->nlookup);
        r->no_reply = true;
        return 0;
    case FUSE_BATCH_FORGET:
        do_batch_forget(r);
        r->no_reply = true;
        return 0;
    case FUSE_INTERRUPT: // requests here are short; they finish anyway
        r->no_reply = true;
        return 0;
    case FUSE_GETATTR: return do_getattr(r, fd);
    case FUSE_SETATTR: return do_setattr(r, fd);
    case FUSE_READLINK: return do_readlink(r, fd);
    case FUSE_SYMLINK: return do_symlink(r, fd);
    case FUSE_MKNOD: return do_mknod(r, fd);
    case FUSE_MKDIR: return do_mkdir(r, fd);
    case FUSE_UNLINK: return do_unlink(r, fd, 0);
    case FUSE_RMDIR: return do_unlink(r, fd, AT_REMOVEDIR);
    case FUSE_RENAME: return do_rename(r, fd, ((const struct fuse_rename_in *)r->arg)->newdir, 0);
    case FUSE_RENAME2: {
        const struct fuse_rename2_in *rn = r->arg;
        return do_rename(r, fd, rn->newdir, rn->flags);
    }
    case FUSE_LINK: return do_link(r, fd);
    case FUSE_OPEN: return do_open(r, fd);
    case FUSE_CREATE: return do_create(r, fd);
    case FUSE_READ: return do_read(r);
    case FUSE_WRITE: return do_write(r);
    case FUSE_RELEASE: return close((int)((const struct fuse_release_in *)r->arg)->fh) < 0 ? -errno : 0;
    case FUSE_FSYNC: return do_fsync(r, false);
    case FUSE_FSYNCDIR: return do_fsync(r, true);
    case FUSE_OPENDIR: return do_opendir(r, fd);
    case FUSE_READDIR: return do_readdir(r);
    case FUSE_RELEASEDIR: return do_releasedir(r);
    case FUSE_STATFS: return do_statfs(r, fd);
    case FUSE_ACCESS: return do_access(r, fd);
    case FUSE_DESTROY:
        atomic_store(&destroyed, true);
        return 0;
    // FLUSH: tmpfs has nothing to flush on close, and ENOSYS makes the kernel stop
    // sending it, as it does for `fuse_passthrough_ceiling` (which has no flush either).
    // Extended attributes: none. Anything else: not needed by the workloads.
    case FUSE_FLUSH:
    default: return -ENOSYS;
    }
}

// With /dev/fuse a request is one buffer: the first argument, then the rest. This is
// the size of the first argument for the requests whose rest we read (with io_uring
// the kernel splits them itself); requests of names alone (LOOKUP, UNLINK, RMDIR,
// SYMLINK) have none.
static size_t first_arg_size(uint32_t opcode) {
    switch (opcode) {
    case FUSE_WRITE: return sizeof(struct fuse_write_in);
    case FUSE_CREATE: return sizeof(struct fuse_create_in);
    case FUSE_MKNOD: return sizeof(struct fuse_mknod_in);
    case FUSE_MKDIR: return sizeof(struct fuse_mkdir_in);
    case FUSE_RENAME: return sizeof(struct fuse_rename_in);
    case FUSE_RENAME2: return sizeof(struct fuse_rename2_in);
    case FUSE_LINK: return sizeof(struct fuse_link_in);
    case FUSE_BATCH_FORGET: return sizeof(struct fuse_batch_forget_in);
    default: return 0;
    }
}

// ---- Transport 1: classic. read() a request from /dev/fuse, writev() its reply.

struct classic_thread {
    pthread_t thread;
    uint64_t served, forgets; // requests answered; FORGET and BATCH_FORGET among them
};

static void *classic_loop(void *arg) {
    struct classic_thread *t = arg;
    char *in = aligned_alloc(4096, CLASSIC_BUFFER), *out = aligned_alloc(4096, REPLY_MAX);
    for (;;) {
        ssize_t n = read(fuse_fd, in, CLASSIC_BUFFER);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ENOENT) continue; // ENOENT: interrupted
            if (errno != ENODEV) perror("read /dev/fuse"); // ENODEV: unmounted
            break;
        }
        const struct fuse_in_header *h = (const struct fuse_in_header *)in;
        size_t skip = first_arg_size(h->opcode), body = (size_t)n - sizeof *h;
        struct request r = {.in = h, .arg = in + sizeof *h, .data = in + sizeof *h + skip,
                            .data_len = body > skip ? body - skip : 0, .out = out};
        int err = serve(&r);
        t->served++;
        t->forgets += h->opcode == FUSE_FORGET || h->opcode == FUSE_BATCH_FORGET;
        if (r.no_reply) continue;
        size_t len = err ? 0 : r.out_len;
        struct fuse_out_header oh = {.len = (uint32_t)(sizeof oh + len), .error = err, .unique = h->unique};
        struct iovec iov[2] = {{&oh, sizeof oh}, {out, len}};
        // ENOENT: the request was interrupted and is gone; nothing to do.
        if (writev(fuse_fd, iov, len ? 2 : 1) < 0 && errno != ENOENT && errno != ENODEV) perror("write /dev/fuse");
        if (atomic_load(&destroyed)) break;
    }
    free(in);
    free(out);
    return NULL;
}

// ---- Transport 2: io_uring. Per CPU a queue: a ring, QUEUE_DEPTH entries, a thread.

struct ring_entry {
    struct fuse_uring_req_header *header;
    char *payload; // REPLY_MAX bytes: at least the kernel's max(max_write, max_pages pages)
    struct iovec iov[2];
    uint32_t last_cmd;
    uint64_t commit_id;
};

struct queue {
    int qid;
    pthread_t thread;
    struct io_uring ring;
    struct ring_entry ent[QUEUE_DEPTH];
    uint64_t served;
    // Start-up: 1 when registered, -errno (and the step in `failed`) when not.
    _Atomic int state;
    const char *failed;
};

// Queues one URING_CMD for entry `e`: REGISTER gives the kernel its buffers;
// COMMIT_AND_FETCH hands back the reply in them and waits for the next request.
static void queue_cmd(struct queue *q, struct ring_entry *e, uint32_t cmd) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
    if (!sqe) abort(); // one SQE per entry at most, as many SQEs as entries: cannot happen
    memset(sqe, 0, 2 * sizeof *sqe); // a 128-byte SQE (IORING_SETUP_SQE128)
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->flags = IOSQE_FIXED_FILE;
    sqe->fd = 0; // /dev/fuse, registered as file 0 of this ring
    sqe->cmd_op = cmd;
    sqe->user_data = (uintptr_t)e;
    if (cmd == FUSE_IO_URING_CMD_REGISTER) {
        sqe->addr = (uintptr_t)e->iov;
        sqe->len = 2;
    }
    struct fuse_uring_cmd_req *req = (struct fuse_uring_cmd_req *)sqe->cmd;
    req->qid = (uint16_t)q->qid;
    req->commit_id = e->commit_id;
    e->last_cmd = cmd;
}

// Sets up queue `q` and registers its entries; 0 or -errno with q->failed set.
static int queue_start(struct queue *q) {
    cpu_set_t cpu;
    CPU_ZERO(&cpu);
    CPU_SET(q->qid, &cpu);
    sched_setaffinity(0, sizeof cpu, &cpu); // requests from CPU n come to queue n

    struct io_uring_params p = {.flags = IORING_SETUP_SQE128};
    int err = io_uring_queue_init_params(QUEUE_DEPTH, &q->ring, &p);
    if (err < 0) return q->failed = "io_uring_queue_init_params(IORING_SETUP_SQE128)", err;
    err = io_uring_register_files(&q->ring, &fuse_fd, 1);
    if (err < 0) return q->failed = "io_uring_register_files(/dev/fuse)", err;
    for (int i = 0; i < QUEUE_DEPTH; i++) {
        struct ring_entry *e = &q->ent[i];
        e->header = aligned_alloc(4096, 4096);
        e->payload = aligned_alloc(4096, REPLY_MAX);
        if (!e->header || !e->payload) return q->failed = "allocating ring buffers", -ENOMEM;
        memset(e->header, 0, sizeof *e->header);
        e->iov[0] = (struct iovec){e->header, sizeof *e->header};
        e->iov[1] = (struct iovec){e->payload, REPLY_MAX};
        queue_cmd(q, e, FUSE_IO_URING_CMD_REGISTER);
    }
    err = io_uring_submit(&q->ring);
    if (err != QUEUE_DEPTH) return q->failed = "io_uring_submit(REGISTER)", err < 0 ? err : -EIO;
    // A registration the kernel refuses completes at once with the error; one it takes
    // completes only when a request comes.
    struct io_uring_cqe *cqe;
    if (io_uring_peek_cqe(&q->ring, &cqe) == 0 && cqe->res < 0)
        return q->failed = "FUSE_IO_URING_CMD_REGISTER (completion)", cqe->res;
    return 0;
}

// Answers the request the kernel put in entry `e` and queues the reply with the fetch
// of the next one.
static void queue_serve(struct queue *q, struct ring_entry *e) {
    struct fuse_uring_req_header *h = e->header;
    struct fuse_in_header in = *(struct fuse_in_header *)h->in_out;
    e->commit_id = h->ring_ent_in_out.commit_id;
    struct request r = {.in = &in, .arg = h->op_in, .data = e->payload,
                        .data_len = h->ring_ent_in_out.payload_sz, .out = e->payload};
    int err = serve(&r);
    q->served++;
    struct fuse_out_header *out = (struct fuse_out_header *)h->in_out;
    *out = (struct fuse_out_header){.len = (uint32_t)(sizeof *out + (err ? 0 : r.out_len)), .error = err,
                                    .unique = in.unique};
    h->ring_ent_in_out.payload_sz = err ? 0 : (uint32_t)r.out_len;
    queue_cmd(q, e, FUSE_IO_URING_CMD_COMMIT_AND_FETCH);
}

static void *queue_loop(void *arg) {
    struct queue *q = arg;
    int err = queue_start(q);
    atomic_store(&q->state, err ? err : 1);
    if (err) return NULL;
    for (;;) {
        // Sends the replies queued in the last pass, and waits for a request.
        err = io_uring_submit_and_wait(&q->ring, 1);
        if (err < 0 && err != -EINTR && err != -EAGAIN) {
            fprintf(stderr, "queue %d: io_uring_submit_and_wait: %s\n", q->qid, strerror(-err));
            break;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        bool done = false;
        io_uring_for_each_cqe(&q->ring, head, cqe) {
            struct ring_entry *e = (struct ring_entry *)(uintptr_t)cqe->user_data;
            seen++;
            if (cqe->res == 0) {
                queue_serve(q, e);
            } else if (cqe->res == -EINTR || cqe->res == -EAGAIN) {
                queue_cmd(q, e, e->last_cmd); // try the same command again
            } else {
                // ENOTCONN: unmounted (the kernel ends every entry so); else a failure.
                if (cqe->res != -ENOTCONN && cqe->res != -ECONNABORTED && cqe->res != -ENODEV)
                    fprintf(stderr, "queue %d: %s: %s\n", q->qid,
                            e->last_cmd == FUSE_IO_URING_CMD_REGISTER ? "REGISTER" : "COMMIT_AND_FETCH",
                            strerror(-cqe->res));
                done = true;
            }
        }
        io_uring_cq_advance(&q->ring, seen);
        if (done) break;
    }
    io_uring_queue_exit(&q->ring);
    return NULL;
}

// The kernel makes one queue per possible CPU (num_possible_cpus), and uses the ring
// only once each has an entry.
static int possible_cpus(void) {
    FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
    int count = 0, a, b;
    char sep;
    while (f && fscanf(f, "%d", &a) == 1) {
        b = a;
        if (fscanf(f, "%c", &sep) == 1 && sep == '-' && fscanf(f, "%d%c", &b, &sep) < 1) break;
        count += b - a + 1;
        if (sep != ',') break;
    }
    if (f) fclose(f);
    return count > 0 ? count : (int)sysconf(_SC_NPROCESSORS_CONF);
}

// ---- Start-up: mount, FUSE_INIT, and the end.

// Reads FUSE_INIT from /dev/fuse and replies; asks for io_uring when `uring`.
static int init_session(bool uring) {
    char *buf = malloc(CLASSIC_BUFFER);
    ssize_t n;
    while ((n = read(fuse_fd, buf, CLASSIC_BUFFER)) < 0 && errno == EINTR) {
    }
    const struct fuse_in_header *h = (const struct fuse_in_header *)buf;
    if (n < (ssize_t)(sizeof *h + sizeof(struct fuse_init_in)) || h->opcode != FUSE_INIT) {
        fprintf(stderr, "expected FUSE_INIT from /dev/fuse\n");
        return -1;
    }
    const struct fuse_init_in *in = (const struct fuse_init_in *)(buf + sizeof *h);
    uint64_t offered = in->flags | (in->flags & FUSE_INIT_EXT ? (uint64_t)in->flags2 << 32 : 0);
    fprintf(stderr, "kernel speaks FUSE %u.%u%s\n", in->major, in->minor,
            offered & FUSE_OVER_IO_URING ? ", offers io_uring" : ", does not offer io_uring");
    if (in->major != 7) return -1;
    if (uring && !(offered & FUSE_OVER_IO_URING)) {
        fprintf(stderr, "the kernel does not offer FUSE_OVER_IO_URING in FUSE_INIT: "
                        "is /sys/module/fuse/parameters/enable_uring Y?\n");
        return -1;
    }
    // libfuse 3.14's defaults for a file system like this one, and nothing more:
    // no readdirplus, no writeback cache, no splice.
    uint64_t want = FUSE_ASYNC_READ | FUSE_ATOMIC_O_TRUNC | FUSE_BIG_WRITES | FUSE_AUTO_INVAL_DATA |
                    FUSE_ASYNC_DIO | FUSE_PARALLEL_DIROPS | FUSE_MAX_PAGES | FUSE_INIT_EXT |
                    (uring ? FUSE_OVER_IO_URING : 0);
    uint64_t flags = want & offered;
    struct {
        struct fuse_out_header h;
        struct fuse_init_out o;
    } out = {
        .h = {.len = sizeof out, .unique = h->unique},
        .o = {.major = 7, .minor = in->minor < PROTOCOL_MINOR ? in->minor : PROTOCOL_MINOR,
              .max_readahead = in->max_readahead, .flags = (uint32_t)flags, .flags2 = (uint32_t)(flags >> 32),
              .max_write = MAX_WRITE, .time_gran = 1, .max_pages = MAX_PAGES},
    };
    free(buf);
    if (write(fuse_fd, &out, sizeof out) != sizeof out) {
        perror("write FUSE_INIT reply");
        return -1;
    }
    return 0;
}

static void on_signal(int sig) {
    (void)sig;
    umount2(mountpoint, MNT_DETACH); // the transports then see the end and stop
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s --transport classic|uring [--threads N] BACKING_DIR MOUNTPOINT\n", argv0);
    return 2;
}

int main(int argc, char *argv[]) {
    const char *transport = NULL;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int queues = possible_cpus();
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        if (!strcmp(argv[i], "--transport")) transport = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--queues")) queues = atoi(argv[i + 1]); // fewer: see the ring wait
        else return usage(argv[0]);
    }
    if (!transport || argc - i != 2 || threads < 1 || queues < 1) return usage(argv[0]);
    bool uring = !strcmp(transport, "uring");
    if (!uring && strcmp(transport, "classic")) return usage(argv[0]);
    mountpoint = argv[i + 1];
    if (getenv("CEILING_TTL")) ttl = atof(getenv("CEILING_TTL"));
    umask(0); // the kernel applied the caller's umask to every mode it sends

    // One O_PATH descriptor per node the kernel holds: allow as many as the system does.
    struct rlimit nofile;
    getrlimit(RLIMIT_NOFILE, &nofile);
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);

    nodes = calloc(MAX_NODES, sizeof *nodes); // untouched pages cost nothing
    nodes[1].fd = open(argv[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (nodes[1].fd < 0) {
        perror(argv[i]);
        return 1;
    }
    struct stat root;
    fstat(nodes[1].fd, &root);
    nodes[1].ino = root.st_ino;
    nodes[1].nlookup = 1;
    *bucket(root.st_ino) = 1;

    fuse_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fuse_fd < 0) {
        perror("/dev/fuse");
        return 1;
    }
    char opts[160];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other",
             fuse_fd);
    if (mount("uringceiling", mountpoint, "fuse.uringceiling", MS_NOSUID | MS_NODEV | MS_NOATIME, opts) < 0) {
        perror("mount");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (init_session(uring) < 0) {
        umount2(mountpoint, MNT_DETACH);
        return 1;
    }

    // Classic: THREADS readers. io_uring: a queue per CPU, and one reader of /dev/fuse
    // for what the kernel still sends there (FORGET, BATCH_FORGET, INTERRUPT).
    int readers = uring ? 1 : threads;
    struct classic_thread *classic = calloc((size_t)readers, sizeof *classic);
    struct queue *q = uring ? calloc((size_t)queues, sizeof *q) : NULL;
    for (int t = 0; t < readers; t++) pthread_create(&classic[t].thread, NULL, classic_loop, &classic[t]);
    int status = 0;
    for (int t = 0; uring && t < queues; t++) {
        q[t].qid = t;
        pthread_create(&q[t].thread, NULL, queue_loop, &q[t]);
        int state;
        while (!(state = atomic_load(&q[t].state))) usleep(1000);
        if (state < 0) {
            fprintf(stderr, "io_uring queue %d: %s failed: %s (errno %d)\n", t, q[t].failed, strerror(-state),
                    -state);
            status = 1;
        }
    }
    if (uring && !status && queues == possible_cpus()) {
        // Every queue has entries: the kernel now sends requests by ring. Check it does.
        struct statfs s;
        uint64_t before = 0, after = 0;
        for (int t = 0; t < queues; t++) before += q[t].served;
        statfs(mountpoint, &s);
        for (int t = 0; t < queues; t++) after += q[t].served;
        if (after == before) {
            fprintf(stderr, "io_uring queues registered, but a STATFS did not come over the ring\n");
            status = 1;
        }
    } else if (uring && !status) {
        fprintf(stderr, "%d of %d queues registered: the kernel will hold requests until all are\n", queues,
                possible_cpus());
    }
    if (status) {
        umount2(mountpoint, MNT_DETACH);
    } else {
        if (uring) printf("ready: uring transport, %d queues of %d entries\n", queues, QUEUE_DEPTH);
        else printf("ready: classic transport, %d threads reading /dev/fuse\n", readers);
        fflush(stdout);
    }

    for (int t = 0; t < readers; t++) pthread_join(classic[t].thread, NULL);
    uint64_t served = 0, forgets = 0, ring = 0;
    for (int t = 0; t < readers; t++) served += classic[t].served, forgets += classic[t].forgets;
    for (int t = 0; uring && t < queues; t++) {
        pthread_join(q[t].thread, NULL);
        ring += q[t].served;
    }
    fprintf(stderr, "served %llu requests over io_uring, %llu over /dev/fuse (%llu of them forgets)\n",
            (unsigned long long)ring, (unsigned long long)served, (unsigned long long)forgets);
    return status;
}

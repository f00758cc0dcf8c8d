// The ceiling for a scripted stat over loopback TCP on this machine: a bare C server that
// answers a plain `stat`, or runs the Lua script `return fs.stat(...)` (compiled once,
// `fs.stat` a C function making the same table of attributes as Locus's binding, with
// times as {sec, nsec}) and writes the returned table out key by key, or runs
// `return 1`. No protocol beyond a length and a path, no threads, no sandbox, no limits:
// the least a server that runs a script per call can do. The client times the three
// kinds in turns, in blocks of 50 calls, and prints each kind's p50 and its ratio to the
// plain stat.
//
// After each reply the server polls its socket for the next request for POLL_US
// microseconds (yielding between looks) before it blocks, as `locus serve` does (50 µs
// by default); with 0 it blocks at once, as Redis does. Client on CPU 0, server on CPU 1.
//
//   apt-get install -y liblua5.4-dev
//   cc -O2 -o /tmp/script_ceiling bench/script_ceiling.c $(pkg-config lua5.4 --cflags --libs)
//   /tmp/script_ceiling [POLL_US] [CALLS]    # 50 and 6000 by default
//   /tmp/script_ceiling inproc               # each answer's CPU alone, no network
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { PLAIN_STAT, SCRIPTED_STAT, RETURN_ONE, KINDS };
static const char *names[KINDS] = {"stat", "return fs.stat(...)", "return 1"};

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void full_write(int fd, const void *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) exit(1);
        p = (const char *)p + w;
        n -= (size_t)w;
    }
}

// Reads exactly n bytes; 0 at end of stream.
static int full_read(int fd, void *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r <= 0) return 0;
        p = (char *)p + r;
        n -= (size_t)r;
    }
    return 1;
}

// --- server -------------------------------------------------------------------------

static void set_int(lua_State *L, const char *key, lua_Integer v) {
    lua_pushinteger(L, v);
    lua_setfield(L, -2, key);
}

static void set_time(lua_State *L, const char *key, struct timespec t) {
    lua_createtable(L, 0, 2);
    set_int(L, "sec", t.tv_sec);
    set_int(L, "nsec", t.tv_nsec);
    lua_setfield(L, -2, key);
}

// fs.stat(path): the attributes as Locus's binding gives them, or nil, message.
static int fs_stat(lua_State *L) {
    struct stat st;
    if (stat(luaL_checkstring(L, 1), &st) < 0) {
        lua_pushnil(L);
        lua_pushstring(L, strerror(errno));
        return 2;
    }
    lua_createtable(L, 0, 13);
    set_int(L, "dev", (lua_Integer)st.st_dev);
    set_int(L, "ino", (lua_Integer)st.st_ino);
    set_int(L, "mode", st.st_mode);
    set_int(L, "nlink", (lua_Integer)st.st_nlink);
    set_int(L, "uid", st.st_uid);
    set_int(L, "gid", st.st_gid);
    set_int(L, "rdev", (lua_Integer)st.st_rdev);
    set_int(L, "size", st.st_size);
    set_int(L, "blksize", st.st_blksize);
    set_int(L, "blocks", st.st_blocks);
    set_time(L, "atime", st.st_atim);
    set_time(L, "mtime", st.st_mtim);
    set_time(L, "ctime", st.st_ctim);
    return 1;
}

// Appends the value on top of the stack to buf: integers as 8 bytes, strings with their
// length, tables as a count of pairs and each key and value in turn.
static size_t put_value(lua_State *L, char *buf, size_t at) {
    switch (lua_type(L, -1)) {
    case LUA_TNUMBER: {
        int64_t v = lua_tointeger(L, -1);
        buf[at++] = 'i';
        memcpy(buf + at, &v, 8);
        return at + 8;
    }
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, -1, &n);
        buf[at++] = 's';
        buf[at++] = (char)n;
        memcpy(buf + at, s, n);
        return at + n;
    }
    case LUA_TTABLE: {
        size_t count_at = at + 1;
        uint8_t pairs = 0;
        buf[at] = 't';
        at += 2;
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            lua_pushvalue(L, -2); // the key, copied: tolstring must not change the one next reads
            at = put_value(L, buf, at);
            lua_pop(L, 1);
            at = put_value(L, buf, at);
            lua_pop(L, 1);
            pairs++;
        }
        buf[count_at] = (char)pairs;
        return at;
    }
    default:
        buf[at++] = 'n';
        return at;
    }
}

// A Lua state with `fs.stat`, and the scripts of each kind compiled once.
static lua_State *interpreter(int scripts[KINDS]) {
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, fs_stat);
    lua_setfield(L, -2, "stat");
    lua_setglobal(L, "fs");
    const char *sources[KINDS] = {NULL, "return fs.stat(...)", "return 1"};
    for (int k = SCRIPTED_STAT; k < KINDS; k++) {
        if (luaL_loadstring(L, sources[k]) != LUA_OK) exit(1);
        scripts[k] = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    return L;
}

// The reply to a request of `kind` for `path`, written to `reply`; answers its length.
static uint16_t answer(lua_State *L, const int scripts[KINDS], int kind, const char *path, char *reply) {
    if (kind == PLAIN_STAT) {
        struct stat st;
        stat(path, &st);
        uint64_t f[16] = {st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid, st.st_gid,
                          st.st_rdev, (uint64_t)st.st_size, (uint64_t)st.st_blksize, (uint64_t)st.st_blocks,
                          (uint64_t)st.st_atim.tv_sec, (uint64_t)st.st_atim.tv_nsec,
                          (uint64_t)st.st_mtim.tv_sec, (uint64_t)st.st_mtim.tv_nsec,
                          (uint64_t)st.st_ctim.tv_sec, (uint64_t)st.st_ctim.tv_nsec};
        memcpy(reply, f, sizeof f);
        return sizeof f;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, scripts[kind]);
    lua_pushstring(L, path);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) exit(1);
    uint16_t len = (uint16_t)put_value(L, reply, 0);
    lua_pop(L, 1);
    return len;
}

static void serve(int conn, int poll_us) {
    int scripts[KINDS];
    lua_State *L = interpreter(scripts);
    int one = 1;
    setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char req[258], reply[1024];
    for (;;) {
        // Poll for the next request for poll_us, then block.
        double until = now_us() + poll_us;
        while (poll_us && now_us() < until) {
            char peek;
            if (recv(conn, &peek, 1, MSG_PEEK | MSG_DONTWAIT) > 0) break;
            sched_yield();
        }
        if (!full_read(conn, req, 2) || !full_read(conn, req + 2, (uint8_t)req[1])) break;
        req[2 + (uint8_t)req[1]] = 0;
        uint16_t len = answer(L, scripts, req[0], req + 2, reply + 2);
        memcpy(reply, &len, 2);
        full_write(conn, reply, 2 + len);
    }
    lua_close(L);
}

// What each kind costs the server's CPU alone: the answer without the network.
static void in_process(const char *path) {
    int scripts[KINDS];
    lua_State *L = interpreter(scripts);
    char reply[1024];
    printf("in process, µs per answer\n");
    for (int k = 0; k < KINDS; k++) {
        double t = now_us();
        for (int i = 0; i < 200000; i++) answer(L, scripts, k, path, reply);
        printf("%-22s %7.2f\n", names[k], (now_us() - t) / 200000);
    }
    lua_close(L);
}

// --- client -------------------------------------------------------------------------

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int poll_us = argc > 1 ? atoi(argv[1]) : 50;
    int calls = argc > 2 ? atoi(argv[2]) : 6000;
    const char *path = "/dev/shm/script_ceiling.probe";
    FILE *probe = fopen(path, "w");
    fputs("x", probe);
    fclose(probe);
    if (argc > 1 && strcmp(argv[1], "inproc") == 0) {
        pin(1);
        in_process(path);
        unlink(path);
        return 0;
    }
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t al = sizeof a;
    if (bind(l, (void *)&a, sizeof a) || getsockname(l, (void *)&a, &al) || listen(l, 1)) return 1;
    pid_t server = fork();
    if (server == 0) {
        pin(1);
        serve(accept(l, 0, 0), poll_us);
        _exit(0);
    }
    pin(0);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (void *)&a, sizeof a)) return 1;
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double *times[KINDS];
    int n[KINDS] = {0};
    for (int k = 0; k < KINDS; k++) times[k] = malloc(sizeof(double) * calls);
    char req[258], reply[1024];
    size_t plen = strlen(path);
    for (int done = 0; done < calls; done += 50) {
        for (int k = 0; k < KINDS; k++) {
            for (int i = 0; i < 50 && n[k] < calls; i++) {
                req[0] = (char)k;
                req[1] = (char)plen;
                memcpy(req + 2, path, plen);
                double t = now_us();
                full_write(s, req, 2 + plen);
                uint16_t len;
                if (!full_read(s, &len, 2) || !full_read(s, reply, len)) return 1;
                times[k][n[k]++] = now_us() - t;
            }
        }
    }
    close(s);
    waitpid(server, 0, 0);
    unlink(path);
    double base = 0;
    printf("server polls %d µs; %d calls of each kind, p50 µs\n", poll_us, calls);
    for (int k = 0; k < KINDS; k++) {
        qsort(times[k], n[k], sizeof(double), by_value);
        double p50 = times[k][n[k] / 2];
        if (k == PLAIN_STAT) base = p50;
        printf("%-22s %7.1f  %.2fx\n", names[k], p50, p50 / base);
    }
    return 0;
}

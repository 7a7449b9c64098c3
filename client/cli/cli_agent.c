/*
 * tessera CLI: the drill agent (tessera -s ADDR agent --node ID ACT [ARG...];
 * docs/operations.md "Failover drills"). Every act a drill does to a node — kill it, stop and
 * continue it, start it again, flip bytes in its chunk or blob files, fill its filesystem, cut it
 * off from its peers — is an agent act on that node's host. In the embedded mode (no --agent) the
 * drill does the acts itself (the nodes run here); with `tessera drill ... --agent TEMPLATE` it
 * runs TEMPLATE ACT [ARG...] for each, e.g. `ssh {host} tessera -s {addr} agent --node {node}`,
 * and the agent does it there.
 *
 * The agent finds its tesserad by the process id the node's STATUS gives (confirmed by /proc:
 * a tesserad; only the acts that need the running node connect to ADDR), and keeps what a
 * restart needs (executable, command line, working directory, data directory) in a state file,
 * $TMPDIR/tessera-agent-EUID/NODE.state (default /tmp; a directory private to the user),
 * written by kill, term and stop.
 *
 * The acts, and what they print:
 * - pid: "pid N", the node's tesserad here.
 * - kill, term, stop: "pid N"; SIGKILL, SIGTERM (a clean stop: it drains), SIGSTOP.
 * - cont: SIGCONT to the stopped process; gone: exits 0 once the process has exited.
 * - start LOGDIR: "pid N log FILE"; from the state file, waiting for its ready line.
 * - mark DATASET: the node's numeric id of DATASET (a .marks file beside the state).
 * - flip SINCE: "flipped ..." per file; 16 bytes spread over each of the marked dataset's chunk
 *   files, and one byte in the middle of up to 16 of its chunk values in each blob file,
 *   changed since SINCE (wall seconds).
 * - datadir: "DIR AVAIL", its data dir and the bytes free there.
 * - fill LEAVE: "BYTES DIR LEFT"; a balloon file DIR/drill-balloon until LEAVE bytes are free.
 *   unfill: the balloon removed.
 * - cut OWN PEERS: "rules N"; iptables DROP between the comma-separated IPv4 hosts OWN and
 *   PEERS, both ways (chain TESSERA_DRILL in OUTPUT). heal: the chain removed.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "cli_drill.h"
#include "ts_map.h"

#define CHAIN "TESSERA_DRILL"
#define FLIPS_PER_FILE 16

struct image {
    pid_t pid;
    char cwd[1100], data[2200], exe[1100];
    char buf[8192];
    char *argv[64];
};

static int fail(struct ctx *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct ctx *x, int rc, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(x->local, sizeof(x->local), fmt, ap);
    va_end(ap);
    return rc;
}

static void add_line(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_line(char *out, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(out);
    va_list ap;

    if (n + 1 >= cap)
        return;
    va_start(ap, fmt);
    vsnprintf(out + n, cap - n, fmt, ap);
    va_end(ap);
    n = strlen(out);
    if (n + 1 < cap) {
        out[n] = '\n';
        out[n + 1] = '\0';
    }
}

/* Node i's STATUS as a parsed document (the caller puts it), or NULL. */
static struct json_object *status_of(struct ctx *x, size_t i)
{
    struct json_object *doc;
    char *json = NULL;

    if (ts_client_node_status(x->c, i, &json) != 0)
        return NULL;
    doc = json_tokener_parse(json);
    tessera_buffer_free(json);
    return doc;
}

/* Node i's process id from its STATUS, confirmed by /proc to be a tesserad; 0 if not here. */
static pid_t node_pid(struct ctx *x, size_t i)
{
    struct json_object *doc = status_of(x, i), *v;
    char path[64], exe[512];
    pid_t pid = 0;
    ssize_t n;

    if (doc && json_object_object_get_ex(doc, "pid", &v))
        pid = (pid_t)json_object_get_int(v);
    json_object_put(doc);
    snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
    n = pid > 0 ? readlink(path, exe, sizeof(exe) - 1) : -1;
    if (n <= 0)
        return 0;
    exe[n] = '\0';
    return strstr(exe, "tesserad") ? pid : 0;
}

/*
 * The agent's own directory, $TMPDIR/tessera-agent-EUID (default /tmp): made 0700, and used only
 * when it is a directory (not a link) that this user owns and nobody else can write or read. What
 * is in it decides what `start` runs and which dataset `flip` damages: another local user must
 * not be able to plant it.
 */
static int agent_dir(struct ctx *x, char *out, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    struct stat st;

    snprintf(out, cap, "%s/tessera-agent-%u", tmp && *tmp ? tmp : "/tmp", (unsigned)geteuid());
    if (mkdir(out, 0700) != 0 && errno != EEXIST)
        return fail(x, TS_EIO, "%s: %s", out, strerror(errno));
    if (lstat(out, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077))
        return fail(x, TS_EPERM,
                    "%s is not a private directory of this user (a link, another owner, or "
                    "open to others): the agent will not trust it",
                    out);
    return 0;
}

/* Opens DIR/ID.EXT of the agent's directory for reading or writing (0600, never through a
 * link). */
static FILE *agent_file(struct ctx *x, const char *id, const char *ext, int write, char *path,
                        size_t cap)
{
    char dir[600];
    int fd;
    FILE *f;

    if (agent_dir(x, dir, sizeof(dir)) != 0)
        return NULL;
    snprintf(path, cap, "%s/%s.%s", dir, id, ext);
    fd = open(path, (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC,
              0600);
    if (fd < 0) {
        fail(x, errno == ENOENT ? TS_ENOENT : TS_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    f = fdopen(fd, write ? "w" : "r");
    if (!f)
        close(fd);
    return f;
}

/* Node id's index in the map of x's client, connecting first when the agent has no client yet
 * (a node that is down answers nothing: only the acts that need its STATUS connect). */
static int node_idx(struct ctx *x, const char *id, size_t *i)
{
    const struct ts_map *m;
    char err[256] = "";
    int k, rc;

    if (!x->c) {
        rc = ts_client_open_ex(&x->c, x->opts, err, sizeof(err));
        if (rc)
            return fail(x, rc, "cannot reach node %s at %s: %s%s%s", id, x->opts->address,
                        ts_strerror(rc), err[0] ? ": " : "", err);
    }
    m = ts_client_map(x->c);
    k = m ? ts_map_find(m, id) : -1;
    if (k < 0)
        return fail(x, TS_EINVAL, "node %s is not in the cluster map of %s", id,
                    tessera_client_node(x->c));
    *i = (size_t)k;
    return 0;
}

/* Saves what a restart of node i (process pid) needs: its command line, working directory and
 * data directory (absolute). */
static int image_save(struct ctx *x, size_t i, pid_t pid)
{
    const struct ts_map *m = ts_client_map(x->c);
    struct json_object *doc = status_of(x, i), *v;
    char path[700], data[1024] = "", cwd[1024], exe[1024], cmd[8192];
    ssize_t n, len, ne;
    FILE *f;
    int fd;

    if (doc && json_object_object_get_ex(doc, "data_dir", &v))
        snprintf(data, sizeof(data), "%s", json_object_get_string(v));
    json_object_put(doc);
    snprintf(path, sizeof(path), "/proc/%d/cwd", (int)pid);
    n = readlink(path, cwd, sizeof(cwd) - 1);
    snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid); /* argv[0] may be a bare name */
    ne = readlink(path, exe, sizeof(exe) - 1);
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    len = fd >= 0 ? read(fd, cmd, sizeof(cmd) - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (n <= 0 || ne <= 0 || len <= 0 || !data[0])
        return fail(x, TS_EIO, "cannot read node %s's command line or data dir", m->nodes[i].id);
    cwd[n] = '\0';
    exe[ne] = '\0';
    f = agent_file(x, m->nodes[i].id, "state", 1, path, sizeof(path));
    if (!f)
        return TS_EIO;
    fprintf(f, "pid %d\ncwd %s\ndata %s%s%s\nexe %s\n", (int)pid, cwd, data[0] == '/' ? "" : cwd,
            data[0] == '/' ? "" : "/", data, exe);
    fwrite(cmd, 1, (size_t)len, f);
    return fclose(f) == 0 ? 0 : fail(x, TS_EIO, "%s: %s", path, strerror(errno));
}

static int image_load(struct ctx *x, const char *id, struct image *im)
{
    char path[700], line[2300];
    size_t len, argc = 0;
    FILE *f;
    int pid = 0;

    memset(im, 0, sizeof(*im));
    f = agent_file(x, id, "state", 0, path, sizeof(path));
    if (!f)
        return fail(x, TS_ENOENT, "no agent state for node %s (%s): nothing stopped it here", id,
                    x->local);
    if (!fgets(line, sizeof(line), f) || sscanf(line, "pid %d", &pid) != 1 ||
        !fgets(line, sizeof(line), f) || strncmp(line, "cwd ", 4) != 0) {
        fclose(f);
        return fail(x, TS_EIO, "%s: not an agent state file", path);
    }
    line[strcspn(line, "\n")] = '\0';
    snprintf(im->cwd, sizeof(im->cwd), "%.1000s", line + 4);
    if (!fgets(line, sizeof(line), f) || strncmp(line, "data ", 5) != 0) {
        fclose(f);
        return fail(x, TS_EIO, "%s: not an agent state file", path);
    }
    line[strcspn(line, "\n")] = '\0';
    snprintf(im->data, sizeof(im->data), "%.2100s", line + 5);
    if (!fgets(line, sizeof(line), f) || strncmp(line, "exe ", 4) != 0) {
        fclose(f);
        return fail(x, TS_EIO, "%s: not an agent state file", path);
    }
    line[strcspn(line, "\n")] = '\0';
    snprintf(im->exe, sizeof(im->exe), "%.1000s", line + 4);
    len = fread(im->buf, 1, sizeof(im->buf) - 1, f);
    fclose(f);
    im->pid = pid;
    for (size_t k = 0; k < len && argc < 63; k += strlen(im->buf + k) + 1)
        im->argv[argc++] = im->buf + k;
    im->argv[argc] = NULL;
    return argc ? 0 : fail(x, TS_EIO, "%s: no command line", path);
}

static int wait_ready(const char *log_path, long from, int secs)
{
    for (int i = 0; i < secs * 20; i++) {
        FILE *f = fopen(log_path, "r");
        char line[1024];
        int ok = 0;
        if (f) {
            fseek(f, from, SEEK_SET);
            while (fgets(line, sizeof(line), f))
                ok |= strstr(line, "tesserad ready") != NULL;
            fclose(f);
        }
        if (ok)
            return 0;
        usleep(50000);
    }
    return TS_ETIMEDOUT;
}

static int start(struct ctx *x, const char *id, const char *logdir, char *out, size_t cap)
{
    struct image im;
    char log[1200];
    struct stat st;
    long from;
    pid_t pid;
    int rc = image_load(x, id, &im);

    if (rc)
        return rc;
    snprintf(log, sizeof(log), "%s/drill-%s.log", logdir, id);
    from = stat(log, &st) == 0 ? (long)st.st_size : 0;
    pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (chdir(im.cwd) != 0)
            _exit(126);
        setsid();
        execv(im.exe, im.argv);
        _exit(127);
    }
    if (pid < 0 || wait_ready(log, from, 30) != 0)
        return fail(x, TS_EIO, "%s did not start again (see %s)", id, log);
    add_line(out, cap, "pid %d log %s", (int)pid, log);
    return 0;
}

/* The dataset id the mark recorded (0: none). */
static uint64_t marked_id(struct ctx *x, const char *id)
{
    char path[700];
    unsigned long long v = 0;
    FILE *f = agent_file(x, id, "marks", 0, path, sizeof(path));

    if (!f)
        return 0;
    if (fscanf(f, "dataset-id %llu", &v) != 1)
        v = 0;
    fclose(f);
    return v;
}

/* Records node i's numeric id of dataset `ds` (its chunk keys start with it): flip damages
 * only that dataset's chunks. */
static int mark(struct ctx *x, const char *id, size_t i, const char *ds)
{
    struct ts_dataset_info d;
    char path[700];
    FILE *f;
    int rc = ts_client_node_dataset_stat(x->c, i, ds ? ds : "", &d);

    if (rc)
        return fail(x, rc, "mark: node %s has no dataset '%s' (%s)", id, ds ? ds : "",
                    ts_strerror(rc));
    f = agent_file(x, id, "marks", 1, path, sizeof(path));
    if (!f)
        return TS_EIO;
    fprintf(f, "dataset-id %llu\n", (unsigned long long)d.id);
    return fclose(f) == 0 ? 0 : fail(x, TS_EIO, "%s: %s", path, strerror(errno));
}

/*
 * Flips FLIPS_PER_FILE bytes spread over each chunk file of dataset dsid (DIR/chunks/DSID/, see
 * storage/chunkfile.c) changed since `since`: a chunk file holds only that shard's bytes.
 */
static void flip_chunk_files(uint64_t dsid, const char *dir, time_t since, char *out, size_t cap)
{
    char ddir[2300];
    struct dirent *e;
    DIR *dp;

    snprintf(ddir, sizeof(ddir), "%s/chunks/%016llx", dir, (unsigned long long)dsid);
    dp = opendir(ddir);
    if (!dp)
        return;
    while ((e = readdir(dp))) {
        char path[2600];
        struct stat st;
        int fd, flipped = 0;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", ddir, e->d_name);
        if (stat(path, &st) != 0 || st.st_mtime < since || st.st_size == 0)
            continue;
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue;
        for (int k = 0; k < FLIPS_PER_FILE; k++) {
            off_t at = (off_t)((uint64_t)st.st_size * (uint64_t)(2 * k + 1) / (2 * FLIPS_PER_FILE));
            uint8_t b;
            if (pread(fd, &b, 1, at) == 1) {
                b ^= 0x5a;
                flipped += pwrite(fd, &b, 1, at) == 1;
            }
        }
        if (flipped)
            fsync(fd);
        close(fd);
        if (flipped)
            add_line(out, cap, "flipped %d bytes in %s (a chunk file of the dataset)", flipped,
                     path);
    }
    closedir(dp);
}

/*
 * Flips bytes of the marked dataset's chunks: in its chunk files (flip_chunk_files), and, for
 * chunks a store keeps in RocksDB, one byte in the middle of the value of up to FLIPS_PER_FILE
 * records of the dataset in every blob file in dir changed since `since`. A blob file (RocksDB's
 * integrated BlobDB, little-endian): a 30-byte header, then records of a 32-byte header (u64 key
 * length, u64 value length, u64 expiration, u32 header CRC, u32 blob CRC), the key and the value; a
 * 32-byte footer. Chunk keys start with the dataset's id (big-endian u64). Only values are
 * touched: what a disk error in the data would do, which the chunk's CRC32C must catch.
 */
static int flip(struct ctx *x, const char *id, const char *dir, time_t since, char *out, size_t cap)
{
    uint64_t dsid = marked_id(x, id);
    struct dirent *e;
    DIR *dp;

    if (!dsid)
        return fail(x, TS_EINVAL, "flip: no mark for node %s (mark DATASET first)", id);
    flip_chunk_files(dsid, dir, since, out, cap);
    dp = opendir(dir);
    if (!dp)
        return fail(x, TS_EIO, "%s: %s", dir, strerror(errno));
    while ((e = readdir(dp))) {
        char path[2400];
        struct stat st;
        size_t len = strlen(e->d_name);
        uint64_t nrec = 0, hit = 0;
        off_t off = 30;
        int fd, flipped = 0;

        if (len < 6 || strcmp(e->d_name + len - 5, ".blob") != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || st.st_mtime < since)
            continue;
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            continue;
        /* Count the dataset's records first, to spread the flips over them. */
        for (int pass = 0; pass < 2; pass++) {
            off = 30;
            while (off + 32 + 8 <= st.st_size - 32) {
                uint8_t h[32], key[8];
                uint64_t klen, vlen;
                if (pread(fd, h, 32, off) != 32)
                    break;
                klen = ts_get_le64(h);
                vlen = ts_get_le64(h + 8);
                if (klen > 1024 || vlen > (uint64_t)st.st_size ||
                    (uint64_t)off + 32 + klen + vlen > (uint64_t)st.st_size)
                    break; /* not a record: stop at what parses */
                if (klen >= 8 && pread(fd, key, 8, off + 32) == 8 && ts_get_be64(key) == dsid &&
                    vlen) {
                    if (pass == 0) {
                        nrec++;
                    } else if (flipped < FLIPS_PER_FILE &&
                               hit++ % (nrec / FLIPS_PER_FILE + 1) == 0) {
                        off_t at = off + 32 + (off_t)klen + (off_t)(vlen / 2);
                        uint8_t b;
                        if (pread(fd, &b, 1, at) == 1) {
                            b ^= 0x5a;
                            flipped += pwrite(fd, &b, 1, at) == 1;
                        }
                    }
                }
                off += 32 + (off_t)klen + (off_t)vlen;
            }
            if (!nrec)
                break;
        }
        if (flipped)
            fsync(fd);
        close(fd);
        if (flipped)
            add_line(out, cap, "flipped %d bytes in %s (%llu of its chunks of the dataset)",
                     flipped, path, (unsigned long long)nrec);
    }
    closedir(dp);
    return 0;
}

/* Node i's data directory (absolute), from its STATUS and /proc. */
static int data_dir_of(struct ctx *x, size_t i, char *out, size_t cap)
{
    struct json_object *doc = status_of(x, i), *v;
    char dir[1024] = "", path[64], cwd[1024];
    pid_t pid = node_pid(x, i);
    ssize_t n;

    if (doc && json_object_object_get_ex(doc, "data_dir", &v))
        snprintf(dir, sizeof(dir), "%s", json_object_get_string(v));
    json_object_put(doc);
    snprintf(path, sizeof(path), "/proc/%d/cwd", (int)pid);
    n = pid ? readlink(path, cwd, sizeof(cwd) - 1) : -1;
    if (!dir[0] || n <= 0)
        return fail(x, TS_ENOENT, "node %s is not a tesserad on this host",
                    ts_client_map(x->c)->nodes[i].id);
    cwd[n] = '\0';
    if (dir[0] == '/')
        snprintf(out, cap, "%s", dir);
    else
        snprintf(out, cap, "%s/%s", cwd, dir);
    return 0;
}

static uint64_t avail_of(const char *dir)
{
    struct statvfs sv;
    return statvfs(dir, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
}

static int fill(struct ctx *x, size_t i, uint64_t leave, char *out, size_t cap)
{
    static char zeros[1 << 20];
    char dir[1100], balloon[1200];
    uint64_t bytes = 0;
    int fd, rc = data_dir_of(x, i, dir, sizeof(dir));

    if (rc)
        return rc;
    snprintf(balloon, sizeof(balloon), "%s/drill-balloon", dir);
    fd = open(balloon, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return fail(x, TS_EIO, "%s: %s", balloon, strerror(errno));
    for (;;) { /* down to `leave` free bytes */
        uint64_t avail = avail_of(dir);
        size_t chunk = avail > leave ? (size_t)TS_MIN(avail - leave, (uint64_t)sizeof(zeros)) : 0;
        ssize_t n = chunk ? write(fd, zeros, chunk) : 0;
        if (n <= 0)
            break;
        bytes += (uint64_t)n;
    }
    fsync(fd);
    close(fd);
    add_line(out, cap, "%llu %s %llu", (unsigned long long)bytes, dir,
             (unsigned long long)avail_of(dir));
    return 0;
}

static int unfill(struct ctx *x, size_t i)
{
    char dir[1100], balloon[1200];
    int rc = data_dir_of(x, i, dir, sizeof(dir));

    if (rc)
        return rc;
    snprintf(balloon, sizeof(balloon), "%s/drill-balloon", dir);
    if (unlink(balloon) != 0 && errno != ENOENT)
        return fail(x, TS_EIO, "%s: %s", balloon, strerror(errno));
    return 0;
}

static int ipt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int ipt(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(cmd))
        return -1;
    return system(cmd);
}

static void heal(void)
{
    while (ipt("iptables -w -D OUTPUT -j " CHAIN " 2>/dev/null") == 0)
        ;
    ipt("iptables -w -F " CHAIN " 2>/dev/null");
    ipt("iptables -w -X " CHAIN " 2>/dev/null");
}

/* Comma-separated IPv4 addresses into v (at most max); how many, or -1 if one is not. */
static int hosts_parse(const char *s, char (*v)[16], int max)
{
    char buf[4096], *save = NULL, *t;
    struct in_addr a;
    int n = 0;

    if (strlen(s) >= sizeof(buf))
        return -1; /* never a list cut short */
    snprintf(buf, sizeof(buf), "%s", s);
    for (t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == max || inet_pton(AF_INET, t, &a) != 1)
            return -1;
        snprintf(v[n++], 16, "%s", t);
    }
    return n;
}

static int cut(struct ctx *x, const char *own_s, const char *peers_s, char *out, size_t cap)
{
    char own[4][16], peers[256][16];
    int no = hosts_parse(own_s, own, 4), np = hosts_parse(peers_s, peers, 256), rules = 0;

    if (no <= 0 || np <= 0)
        return fail(x, TS_EINVAL, "cut: want OWN and PEERS as comma-separated IPv4 addresses");
    if (ipt("iptables -w -L OUTPUT -n >/dev/null 2>&1") != 0)
        return fail(x, TS_ENOTSUP, "cut needs iptables and root (CAP_NET_ADMIN) on this host");
    heal(); /* a chain left by a drill that was killed */
    if (ipt("iptables -w -N " CHAIN) != 0 || ipt("iptables -w -I OUTPUT -j " CHAIN) != 0)
        return fail(x, TS_EIO, "iptables refused the drill's chain");
    for (int k = 0; k < no; k++)
        for (int l = 0; l < np; l++) {
            if (ipt("iptables -w -A " CHAIN " -s %s -d %s -j DROP", own[k], peers[l]) != 0 ||
                ipt("iptables -w -A " CHAIN " -s %s -d %s -j DROP", peers[l], own[k]) != 0) {
                heal();
                return fail(x, TS_EIO, "iptables refused the drill's rules");
            }
            rules += 2;
        }
    add_line(out, cap, "rules %d", rules);
    return 0;
}

static int signal_node(struct ctx *x, size_t i, int sig, int save, char *out, size_t cap)
{
    const struct ts_map *m = ts_client_map(x->c);
    pid_t pid = node_pid(x, i);
    int rc;

    if (!pid)
        return fail(x, TS_ENOENT,
                    "node %s is not a tesserad on this host (drills act on local nodes, or "
                    "through --agent)",
                    m->nodes[i].id);
    if (save && (rc = image_save(x, i, pid)) != 0)
        return rc;
    kill(pid, sig);
    if (sig == SIGKILL)
        for (int t = 0; t < 100 && kill(pid, 0) == 0; t++)
            usleep(20000); /* gone (reaped by its parent or init) */
    add_line(out, cap, "pid %d", (int)pid);
    return 0;
}

int agent_do(struct ctx *x, const char *id, const char *act, const char *arg, const char *arg2,
             char *out, size_t cap)
{
    struct image im;
    size_t i = 0;
    int rc;

    out[0] = '\0';
    /* The acts on a node that may be down or stopped work from the state file alone. */
    if (!strcmp(act, "cont") || !strcmp(act, "gone")) {
        /* A stopped node does not answer STATUS: the state file has its pid. */
        if ((rc = image_load(x, id, &im)) != 0)
            return rc;
        if (!strcmp(act, "gone"))
            return kill(im.pid, 0) == 0 ? TS_EBUSY : 0;
        kill(im.pid, SIGCONT);
        add_line(out, cap, "pid %d", (int)im.pid);
        return 0;
    }
    if (!strcmp(act, "start"))
        return start(x, id, arg ? arg : "/tmp", out, cap);
    if (!strcmp(act, "flip")) {
        if ((rc = image_load(x, id, &im)) != 0)
            return rc;
        return flip(x, id, im.data, arg ? (time_t)strtoll(arg, NULL, 10) : 0, out, cap);
    }
    if (!strcmp(act, "cut"))
        return cut(x, arg ? arg : "", arg2 ? arg2 : "", out, cap);
    if (!strcmp(act, "heal")) {
        heal();
        return 0;
    }
    if (strcmp(act, "pid") && strcmp(act, "kill") && strcmp(act, "term") && strcmp(act, "stop") &&
        strcmp(act, "datadir") && strcmp(act, "fill") && strcmp(act, "unfill") &&
        strcmp(act, "mark"))
        return fail(x, TS_EINVAL,
                    "unknown act '%s' (pid, kill, term, gone, stop, cont, start, mark, flip, "
                    "datadir, fill, unfill, cut, heal)",
                    act);
    /* The others ask the running node (its STATUS: pid, data dir). */
    if ((rc = node_idx(x, id, &i)) != 0)
        return rc;
    if (!strcmp(act, "pid")) {
        pid_t pid = node_pid(x, i);
        if (!pid)
            return fail(x, TS_ENOENT, "node %s is not a tesserad on this host", id);
        add_line(out, cap, "pid %d", (int)pid);
        return 0;
    }
    if (!strcmp(act, "kill"))
        return signal_node(x, i, SIGKILL, 1, out, cap);
    if (!strcmp(act, "term"))
        return signal_node(x, i, SIGTERM, 1, out, cap);
    if (!strcmp(act, "stop"))
        return signal_node(x, i, SIGSTOP, 1, out, cap);
    if (!strcmp(act, "mark"))
        return mark(x, id, i, arg);
    if (!strcmp(act, "datadir")) {
        char dir[1100];
        if ((rc = data_dir_of(x, i, dir, sizeof(dir))) != 0)
            return rc;
        add_line(out, cap, "%s %llu", dir, (unsigned long long)avail_of(dir));
        return 0;
    }
    if (!strcmp(act, "fill"))
        return fill(x, i, arg ? strtoull(arg, NULL, 10) : 0, out, cap);
    return unfill(x, i);
}

int cmd_agent(struct ctx *x)
{
    char out[8192];
    int rc;

    if (!x->node)
        return fail(x, TS_EINVAL, "the agent needs --node ID (the node of this host it acts on)");
    rc = agent_do(x, x->node, x->argv[0], x->argc > 1 ? x->argv[1] : NULL,
                  x->argc > 2 ? x->argv[2] : NULL, out, sizeof(out));
    fputs(out, stdout);
    return rc;
}

#include "harness.h"
#include "ts_test.h"

#include "ts_common.h"
#include "ts_map.h"
#include "ts_proto.h"
#include "tessera/tessera.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef TESSERAD_PATH
#error "TESSERAD_PATH must be defined by the build"
#endif

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/*
 * Sanitizer reports in a daemon's log. A sanitized tesserad (TESSERA_SANITIZE) aborts on its
 * first report, which a test sees as an unclean exit where it checks tsd_stop's status; the log
 * is checked too, so that a report fails the test also where a daemon was killed, refused to
 * start or was stopped without a look at its status: tsd_cleanup prints it, and the test
 * process then exits with 1 once its tests are done (after their teardowns stopped the other
 * daemons).
 */
static int sanitizer_failed;

static void fail_on_sanitizer_report(void)
{
    if (sanitizer_failed) {
        fprintf(stderr, "harness: a tesserad's log holds a sanitizer report (printed above): "
                        "the test fails\n");
        _exit(1);
    }
}

static int log_has_sanitizer_report(const struct tsd_proc *p)
{
    FILE *f = fopen(p->log, "r");
    char line[1024];
    int found = 0;

    if (!f)
        return 0;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, "ERROR: AddressSanitizer") || strstr(line, "ERROR: LeakSanitizer") ||
                strstr(line, ": runtime error: ") ||
                strstr(line, "SUMMARY: UndefinedBehaviorSanitizer");
    fclose(f);
    return found;
}

static void check_sanitizer_report(const struct tsd_proc *p)
{
    static int registered;

    if (!log_has_sanitizer_report(p))
        return;
    fprintf(stderr, "harness: sanitizer report in %s:\n", p->log);
    tsd_dump_log(p);
    if (!registered && atexit(fail_on_sanitizer_report) == 0)
        registered = 1;
    sanitizer_failed = 1;
}

static int read_ready(struct tsd_proc *p)
{
    FILE *f = fopen(p->log, "r");
    char line[1024];
    int ok = 0;

    if (!f)
        return 0;
    fseek(f, p->log_off, SEEK_SET); /* a restart appends: only this run's lines count */
    while (fgets(line, sizeof(line), f)) {
        char *l = strstr(line, "tesserad ready ");
        if (!l)
            continue;
        char *a = strstr(l, " listen="), *t = strstr(l, " tls_listen="),
             *r = strstr(l, " rdma_listen=");
        if (a)
            sscanf(a, " listen=%63s", p->addr);
        if (t)
            sscanf(t, " tls_listen=%63s", p->tls_addr);
        p->rdma_addr[0] = '\0';
        if (r && sscanf(r, " rdma_listen=%79s", p->rdma_addr) == 1 && !strcmp(p->rdma_addr, "-"))
            p->rdma_addr[0] = '\0';
        if (!strcmp(p->addr, "-"))
            p->addr[0] = '\0';
        if (!strcmp(p->tls_addr, "-"))
            p->tls_addr[0] = '\0';
        ok = 1;
    }
    fclose(f);
    return ok;
}

int tsd_start(struct tsd_proc *p, const char *const *extra)
{
    const char *tmp = getenv("TMPDIR");
    int fd;

    if (!p->dir) {
        if (asprintf(&p->dir, "%s/tessera-it-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0 ||
            !mkdtemp(p->dir))
            return -1;
        snprintf(p->data, sizeof(p->data), "%s/data", p->dir);
        snprintf(p->log, sizeof(p->log), "%s/tesserad.log", p->dir);
        p->argc = 0;
        p->argv[p->argc++] = (char *)TESSERAD_PATH;
        p->argv[p->argc++] = (char *)"--listen";
        p->argv[p->argc++] = (char *)"127.0.0.1:0";
        p->argv[p->argc++] = (char *)"--data";
        p->argv[p->argc++] = p->data;
        p->argv[p->argc++] = (char *)"--sync";
        p->argv[p->argc++] = (char *)"none";
        for (int i = 0; extra && extra[i] && p->argc < 62; i++)
            p->argv[p->argc++] = (char *)extra[i];
        p->argv[p->argc] = NULL;
    }
    p->addr[0] = p->tls_addr[0] = '\0';
    fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0)
        return -1;
    p->log_off = lseek(fd, 0, SEEK_END);
    p->pid = fork();
    if (p->pid < 0)
        return -1;
    if (p->pid == 0) {
        dup2(fd, 2);
        dup2(fd, 1);
        execv(p->argv[0], p->argv);
        _exit(127);
    }
    close(fd);
    for (int waited = 0; waited < 30000; waited += 5) {
        int st;
        if (read_ready(p))
            return 0;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            fprintf(stderr, "tesserad exited before it was ready:\n");
            tsd_dump_log(p);
            p->pid = 0;
            return -1;
        }
        msleep(5);
    }
    fprintf(stderr, "tesserad not ready after 30 s:\n");
    tsd_dump_log(p);
    return -1;
}

int tsd_stop(struct tsd_proc *p)
{
    int st = -1;

    if (p->pid <= 0)
        return -1;
    kill(p->pid, SIGTERM);
    for (int waited = 0; waited < 15000; waited += 5) {
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            return st;
        }
        msleep(5);
    }
    fprintf(stderr, "tesserad did not stop on SIGTERM; killing it\n");
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    p->pid = 0;
    return st;
}

void tsd_kill9(struct tsd_proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
}

int tsd_alive(struct tsd_proc *p)
{
    return p->pid > 0 && waitpid(p->pid, NULL, WNOHANG) == 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    remove(path);
    return 0;
}

void tsd_cleanup(struct tsd_proc *p)
{
    if (p->pid > 0)
        tsd_kill9(p);
    if (p->dir) {
        check_sanitizer_report(p);
        nftw(p->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(p->dir);
        p->dir = NULL;
    }
}

void tsd_dump_log(const struct tsd_proc *p)
{
    FILE *f = fopen(p->log, "r");
    char line[1024];

    if (!f)
        return;
    fprintf(stderr, "---- %s ----\n", p->log);
    while (fgets(line, sizeof(line), f))
        fputs(line, stderr);
    fprintf(stderr, "---- end of log ----\n");
    fclose(f);
}

long tsd_rss_kb(const struct tsd_proc *p)
{
    char path[64], line[256];
    long kb = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)p->pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

int tsd_cluster_own_hosts;

const char *test_certs(void)
{
    static char dir[512];
    char cmd[1200];
    const char *tmp = getenv("TMPDIR");

    if (dir[0])
        return dir;
    snprintf(dir, sizeof(dir), "%s/tessera-certs-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return NULL;
    /* Node certificates for the node ids tsd_cluster_start and the TLS tests use ("n9" is in no
     * map: a certificate of the CA that is no member). */
    snprintf(cmd, sizeof(cmd),
             "TESSERA_CERT_SANS=IP:127.0.1.1,IP:127.0.1.2,IP:127.0.1.3,IP:127.0.1.4,IP:127.0.1.5,"
             "IP:127.0.1.6,IP:127.0.1.7,IP:127.0.1.8 %s %s n1 n2 n3 n4 n5 n6 n7 n8 n9 t1 t2 t3 "
             ">/dev/null",
             MKCERTS_PATH, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "conf/mkcerts failed\n");
        return NULL;
    }
    return dir;
}

int tsd_free_ports(int *ports, int n)
{
    int fds[2 * TSD_CLUSTER_MAX + 2], rc = 0;

    if (n < 1 || n > (int)(sizeof(fds) / sizeof(fds[0])))
        return -1;
    /*
     * Every socket stays bound until all are chosen, so the ports differ (one at a time, the
     * kernel handed the same port to two nodes). And they are picked below the ephemeral
     * range: a port from bind(0) is an ephemeral one, which an outgoing connection (a node's
     * replication link, started before the next node binds) may take in the meantime.
     */
    int lo = 32768, hi = 60999, below;
    FILE *pr = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (pr) {
        if (fscanf(pr, "%d %d", &lo, &hi) != 2)
            lo = 32768;
        fclose(pr);
    }
    below = lo > 12000;
    static int seeded;
    if (!seeded) { /* tests run side by side (ctest -j): each its own sequence */
        srandom((unsigned)getpid() ^ (unsigned)time(NULL) * 2654435761u);
        seeded = 1;
    }
    for (int i = 0; i < n; i++) {
        struct sockaddr_in sa;
        socklen_t len = sizeof(sa);
        ports[i] = -1;
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        for (int tries = 0; fds[i] >= 0 && tries < 200 && ports[i] < 0; tries++) {
            memset(&sa, 0, sizeof(sa));
            sa.sin_family = AF_INET;
            sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            /* below: a random port in [10000, lo); otherwise the kernel's choice */
            sa.sin_port =
                below ? htons((uint16_t)(10000 + (unsigned)random() % (unsigned)(lo - 10000))) : 0;
            if (bind(fds[i], (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
                getsockname(fds[i], (struct sockaddr *)&sa, &len) == 0)
                ports[i] = ntohs(sa.sin_port);
        }
        if (ports[i] < 0)
            rc = -1;
    }
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return rc;
}

int tsd_free_port(void)
{
    int port;
    return tsd_free_ports(&port, 1) == 0 ? port : -1;
}

int tsd_cluster_start(struct tsd_cluster *cl, int n, const char *const *domains, uint32_t pg_count,
                      const char *const *extra)
{
    return tsd_cluster_start_each(cl, n, domains, pg_count, extra, NULL);
}

/* Whether node i of cl could not start because its port was taken (by another test's daemon,
 * running side by side under ctest -j: ports are picked at random, then bound by tesserad). */
static int port_taken(const struct tsd_cluster *cl, int i)
{
    char cmd[700];

    snprintf(cmd, sizeof(cmd), "grep -q 'Address already in use' '%s' 2>/dev/null",
             cl->node[i].log);
    return system(cmd) == 0;
}

static int cluster_start_once(struct tsd_cluster *cl, int n, const char *const *domains,
                              uint32_t pg_count, const char *const *extra,
                              const char *const *const *node_extra, int *failed);

int tsd_cluster_start_each(struct tsd_cluster *cl, int n, const char *const *domains,
                           uint32_t pg_count, const char *const *extra,
                           const char *const *const *node_extra)
{
    for (int attempt = 0;; attempt++) {
        int failed = -1,
            rc = cluster_start_once(cl, n, domains, pg_count, extra, node_extra, &failed);
        if (rc == 0 || failed < 0 || attempt == 4 || !port_taken(cl, failed))
            return rc;
        fprintf(stderr,
                "harness: %s's port was taken meanwhile: the cluster starts again on "
                "other ports\n",
                cl->id[failed]);
        for (int i = 0; i < failed; i++)
            tsd_stop(&cl->node[i]);
    }
}

static int cluster_start_once(struct tsd_cluster *cl, int n, const char *const *domains,
                              uint32_t pg_count, const char *const *extra,
                              const char *const *const *node_extra, int *failed)
{
    const char *tmp = getenv("TMPDIR");
    FILE *f;

    memset(cl, 0, sizeof(*cl));
    if (n > TSD_CLUSTER_MAX)
        return -1;
    cl->n = n;
    if (asprintf(&cl->dir, "%s/tessera-cluster-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0 ||
        !mkdtemp(cl->dir))
        return -1;
    snprintf(cl->map_path, sizeof(cl->map_path), "%s/cluster.map", cl->dir);
    f = fopen(cl->map_path, "w");
    if (!f)
        return -1;
    if (!test_certs())
        return -1;
    int ports[2 * TSD_CLUSTER_MAX];
    if (tsd_free_ports(ports, 2 * n) != 0) {
        fclose(f);
        return -1;
    }
    fprintf(f, "epoch = 1;\npg_count = %u;\nnodes = (\n", pg_count);
    for (int i = 0; i < n; i++) {
        snprintf(cl->id[i], sizeof(cl->id[i]), "n%d", i + 1);
        char host[32] = "127.0.0.1";
        if (tsd_cluster_own_hosts)
            snprintf(host, sizeof(host), "127.0.1.%d", i + 1);
        snprintf(cl->listen[i], sizeof(cl->listen[i]), "%s:%d", host, ports[2 * i]);
        snprintf(cl->tls_listen[i], sizeof(cl->tls_listen[i]), "%s:%d", host, ports[2 * i + 1]);
        fprintf(f,
                "  { id = \"%s\"; addr = \"%s\"; tls_addr = \"%s\"; weight = 100; "
                "domain = \"%s\"; }%s\n",
                cl->id[i], cl->listen[i], cl->tls_listen[i], domains ? domains[i] : cl->id[i],
                i + 1 < n ? "," : "");
    }
    fprintf(f, ");\n");
    fclose(f);
    for (int i = 0; i < n; i++) {
        const char *args[48];
        char cert[32];
        int k = 0;
        /* Kept in cl: a restart (tsd_start again) reuses the arguments. */
        snprintf(cert, sizeof(cert), "node-%s", cl->id[i]);
        snprintf(cl->ca, sizeof(cl->ca), "%s", test_cert("ca", "pem"));
        snprintf(cl->cert[i], sizeof(cl->cert[i]), "%s", test_cert(cert, "pem"));
        snprintf(cl->key[i], sizeof(cl->key[i]), "%s", test_cert(cert, "key"));
        args[k++] = "--listen";
        args[k++] = cl->listen[i];
        args[k++] = "--tls-listen";
        args[k++] = cl->tls_listen[i];
        args[k++] = "--tls-cert";
        args[k++] = cl->cert[i];
        args[k++] = "--tls-key";
        args[k++] = cl->key[i];
        args[k++] = "--tls-ca";
        args[k++] = cl->ca;
        args[k++] = "--node-id";
        args[k++] = cl->id[i];
        args[k++] = "--map-file";
        args[k++] = cl->map_path;
        args[k++] = "--peer-timeout-ms";
        args[k++] = "1500";
        for (int j = 0; extra && extra[j] && k < 46; j++)
            args[k++] = extra[j];
        for (int j = 0; node_extra && node_extra[i] && node_extra[i][j] && k < 46; j++)
            args[k++] = node_extra[i][j];
        args[k] = NULL;
        if (tsd_start(&cl->node[i], args) != 0) {
            *failed = i;
            return -1;
        }
    }
    return 0;
}

int tsd_cluster_find(const struct tsd_cluster *cl, const char *id)
{
    for (int i = 0; i < cl->n; i++)
        if (!strcmp(cl->id[i], id))
            return i;
    return -1;
}

int tsd_cluster_stop_restarted(struct tsd_cluster *cl)
{
    for (int i = 0; i < cl->n; i++) {
        tessera_client *c = NULL;
        struct tessera_opts o;
        char *json = NULL;
        tessera_opts_init(&o);
        o.address = cl->listen[i];
        o.timeout_ms = 2000;
        if (tessera_client_open(&c, &o) == 0 && tessera_status(c, &json) == 0) {
            const char *p = strstr(json, "\"pid\":");
            int pid = p ? atoi(p + 6) : 0;
            if (pid > 0 && pid != cl->node[i].pid)
                kill(pid, SIGKILL);
        }
        free(json);
        tessera_client_close(c);
    }
    tsd_cluster_stop(cl);
    return 0;
}

int tsd_cluster_stop(struct tsd_cluster *cl)
{
    int bad = 0;

    for (int i = 0; i < cl->n; i++) {
        if (cl->node[i].pid > 0) {
            int st = tsd_stop(&cl->node[i]);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "%s did not exit cleanly (status %d):\n", cl->id[i], st);
                tsd_dump_log(&cl->node[i]);
                bad = 1;
            }
        }
        tsd_cleanup(&cl->node[i]);
    }
    if (cl->dir) {
        nftw(cl->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(cl->dir);
        cl->dir = NULL;
    }
    return bad ? -1 : 0;
}

void tsd_cluster_dump_logs(const struct tsd_cluster *cl)
{
    for (int i = 0; i < cl->n; i++)
        tsd_dump_log(&cl->node[i]);
}

const char *test_cert(const char *name, const char *ext)
{
    static char buf[32][600];
    static unsigned i;
    char *b = buf[i++ % 32];
    snprintf(b, 600, "%s/%s.%s", test_certs(), name, ext);
    return b;
}

struct tessera_client *tsd_connect(const struct tsd_proc *p)
{
    struct tessera_opts o;
    tessera_client *c = NULL;

    tessera_opts_init(&o);
    o.address = p->addr;
    o.timeout_ms = 20000;
    return tessera_client_open(&c, &o) == 0 ? c : NULL;
}

int tsd_put_pattern(tessera_client *c, const char *ds, uint32_t shard, size_t len, uint64_t seed)
{
    uint8_t *buf = malloc(len ? len : 1);
    int rc;

    if (!buf)
        return TS_ENOMEM;
    ts_test_fill(buf, len, seed, 0);
    rc = tessera_put(c, ds, shard, buf, len, NULL, 0);
    free(buf);
    return rc;
}

void tsd_client_opts(struct tessera_opts *o, const struct tsd_proc *p, const char *role)
{
    static char addr[16][64];
    static unsigned next;
    char *a = addr[next++ % 16];

    snprintf(a, 64, "%s", p->tls_addr);
    tessera_opts_init(o);
    o->address = a;
    o->tls_ca = test_cert("ca", "pem");
    if (role) {
        o->tls_cert = test_cert(role, "pem");
        o->tls_key = test_cert(role, "key");
    }
    o->timeout_ms = 10000;
}

int test_tls_open(struct tessera_client **c, const char *addr, const char *role, const char *ca,
                  const char *server_name)
{
    struct tessera_opts o;
    char dflt[600];

    snprintf(dflt, sizeof(dflt), "%s/ca.pem", test_certs());
    tessera_opts_init(&o);
    o.address = addr;
    o.tls_ca = ca ? ca : dflt;
    o.tls_server_name = server_name;
    o.timeout_ms = 10000;
    if (role) {
        o.tls_cert = test_cert(role, "pem");
        o.tls_key = test_cert(role, "key");
    }
    *c = NULL;
    return tessera_client_open(c, &o);
}

static int vcli(const struct tsd_cluster *cl, const char *cli_path, char *out, size_t cap, int echo,
                const char *fmt, va_list ap)
{
    char args[768], cmd[2048], line[1024];
    size_t n = 0;
    FILE *p;
    int st;

    vsnprintf(args, sizeof(args), fmt, ap);
    snprintf(cmd, sizeof(cmd), "%s -s %s --tls-ca %s --tls-cert %s --tls-key %s %s 2>&1", cli_path,
             cl->tls_listen[0], test_cert("ca", "pem"), test_cert("admin", "pem"),
             test_cert("admin", "key"), args);
    if (echo)
        fprintf(stderr, "$ tessera %s\n", args);
    p = popen(cmd, "r");
    if (!p)
        return -1;
    out[0] = '\0';
    while (fgets(line, sizeof(line), p)) { /* shown as it comes; kept up to cap */
        size_t k = strlen(line);
        if (echo)
            fputs(line, stderr);
        if (n + k < cap) {
            memcpy(out + n, line, k + 1);
            n += k;
        }
    }
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int tsd_cli(const struct tsd_cluster *cl, const char *cli_path, char *out, size_t cap,
            const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = vcli(cl, cli_path, out, cap, 1, fmt, ap);
    va_end(ap);
    return rc;
}

int tsd_cli_quiet(const struct tsd_cluster *cl, const char *cli_path, char *out, size_t cap,
                  const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = vcli(cl, cli_path, out, cap, 0, fmt, ap);
    va_end(ap);
    return rc;
}

static uint64_t chunk_bytes_sum;
static int chunk_bytes_cb(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)path;
    (void)f;
    if (flag == FTW_F)
        chunk_bytes_sum += (uint64_t)st->st_blocks * 512;
    return 0;
}

uint64_t tsd_cluster_chunk_bytes(const struct tsd_cluster *cl)
{
    chunk_bytes_sum = 0;
    for (int i = 0; i < cl->n; i++) {
        char dir[600];
        snprintf(dir, sizeof(dir), "%s/chunks", cl->node[i].data);
        if (access(dir, F_OK) == 0)
            nftw(dir, chunk_bytes_cb, 16, FTW_PHYS);
    }
    return chunk_bytes_sum;
}

static off_t size_want;
static int size_hits;
static char size_path[1600];
static int size_cb(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)f;
    if (flag == FTW_F && st->st_size == size_want) {
        snprintf(size_path, sizeof(size_path), "%s", path);
        size_hits++;
    }
    return 0;
}

int tsd_chunk_files_of_size(const char *data, off_t size, char *path, size_t cap)
{
    char dir[600];

    size_want = size;
    size_hits = 0;
    snprintf(dir, sizeof(dir), "%s/chunks", data);
    if (access(dir, F_OK) == 0)
        nftw(dir, size_cb, 16, FTW_PHYS);
    if (size_hits)
        snprintf(path, cap, "%s", size_path);
    return size_hits;
}

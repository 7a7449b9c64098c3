/*
 * A network delay between failure domains for integration tests (netdelay.h): tc netem where
 * the kernel has it, else an NFQUEUE delay line spoken to over raw netlink (nfnetlink_queue,
 * no libnetfilter_queue needed).
 */
#include "netdelay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define QUEUE_NUM 4242
#define RING (1u << 17) /* packets held at once at most */
#define MAX_IPS 8

enum { OFF, NETEM, NFQ };

static struct {
    int mode;
    int fd;
    pthread_t thread;
    atomic_int stop;
    uint64_t delay_ns;
    atomic_uint_fast64_t packets;
    uint32_t seq;
    char ips[MAX_IPS][64];
    int nips;
    /* Held packets in arrival order: ids and when each may go on. Only the thread touches
     * them while it runs. */
    uint32_t id[RING];
    uint64_t due[RING];
    size_t head, tail;
} D = {.fd = -1};

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Runs a shell command, its output dropped unless loud; its exit status. */
static int sh(int loud, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(int loud, const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    int st;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd) - 20, fmt, ap);
    va_end(ap);
    if (!loud)
        strcat(cmd, " >/dev/null 2>&1");
    st = system(cmd);
    if (st != 0 && loud)
        fprintf(stderr, "netdelay: '%s' failed (%d)\n", cmd, st);
    return st;
}

/* ---- tc netem ------------------------------------------------------------------------------ */

static int netem_start(unsigned ms)
{
    /* Probe: a kernel without sch_netem says "Specified qdisc kind is unknown" (a module that
     * is not loaded yet is loaded first). */
    sh(0, "modprobe sch_netem");
    if (sh(0, "tc qdisc add dev lo root netem delay 1ms") != 0)
        return -1;
    sh(0, "tc qdisc del dev lo root");
    if (sh(1, "tc qdisc add dev lo root handle 1: htb default 10") ||
        sh(1,
           "tc class add dev lo parent 1: classid 1:10 htb rate 10gbit burst 16mb cburst 16mb") ||
        sh(1,
           "tc class add dev lo parent 1: classid 1:20 htb rate 10gbit burst 16mb cburst 16mb") ||
        sh(1, "tc qdisc add dev lo parent 1:20 handle 20: netem delay %ums limit 1000000", ms))
        goto out_del;
    for (int i = 0; i < D.nips; i++)
        if (sh(1,
               "tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst %s/32 "
               "flowid 1:20",
               D.ips[i]) ||
            sh(1,
               "tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip src %s/32 "
               "flowid 1:20",
               D.ips[i]))
            goto out_del;
    return 0;

out_del:
    sh(0, "tc qdisc del dev lo root");
    return -1;
}

/* ---- NFQUEUE ------------------------------------------------------------------------------- */

static size_t put_attr(uint8_t *buf, size_t off, uint16_t type, const void *data, uint16_t len)
{
    struct nlattr a = {.nla_len = (uint16_t)(NLA_HDRLEN + len), .nla_type = type};

    memcpy(buf + off, &a, sizeof(a));
    memcpy(buf + off + NLA_HDRLEN, data, len);
    memset(buf + off + NLA_HDRLEN + len, 0, NLA_ALIGN(a.nla_len) - a.nla_len);
    return off + NLA_ALIGN(a.nla_len);
}

/* Sends an nfnetlink_queue message of type t with attributes attrs[alen]; with ack, waits for
 * the kernel's answer: 0 or its -errno. */
static int nfq_send(uint8_t t, const uint8_t *attrs, size_t alen, int ack)
{
    uint8_t buf[512];
    struct nlmsghdr nh = {0};
    struct nfgenmsg g = {
        .nfgen_family = AF_UNSPEC, .version = NFNETLINK_V0, .res_id = htons(QUEUE_NUM)};
    size_t off = NLMSG_HDRLEN;

    memcpy(buf + off, &g, sizeof(g));
    off += NLMSG_ALIGN(sizeof(g));
    memcpy(buf + off, attrs, alen);
    off += alen;
    nh.nlmsg_len = (uint32_t)off;
    nh.nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | t;
    nh.nlmsg_flags = NLM_F_REQUEST | (ack ? NLM_F_ACK : 0);
    nh.nlmsg_seq = ++D.seq;
    memcpy(buf, &nh, sizeof(nh));
    if (send(D.fd, buf, off, 0) != (ssize_t)off)
        return -errno;
    while (ack) {
        ssize_t n = recv(D.fd, buf, sizeof(buf), 0);
        if (n < 0)
            return -errno;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n);
             h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == NLMSG_ERROR && h->nlmsg_seq == D.seq) {
                struct nlmsgerr e;
                memcpy(&e, NLMSG_DATA(h), sizeof(e));
                return e.error;
            }
        }
    }
    return 0;
}

/* Hands every held packet up to and including the one of id back to the kernel (accepted). */
static void nfq_accept_upto(uint32_t id)
{
    struct nfqnl_msg_verdict_hdr v = {.verdict = htonl(NF_ACCEPT), .id = htonl(id)};
    uint8_t a[32];

    nfq_send(NFQNL_MSG_VERDICT_BATCH, a, put_attr(a, 0, NFQA_VERDICT_HDR, &v, sizeof(v)), 0);
}

/* Lets the packets whose time has come (a prefix: the delay is the same for all) go on. */
static void nfq_release(uint64_t now)
{
    size_t last = D.head;

    while (last != D.tail && D.due[last % RING] <= now)
        last++;
    if (last == D.head)
        return;
    nfq_accept_upto(D.id[(last - 1) % RING]);
    D.head = last;
}

/* Takes every packet the kernel queued to us so far. */
static void nfq_drain(uint8_t *buf, size_t cap)
{
    for (;;) {
        ssize_t n = recv(D.fd, buf, cap, MSG_DONTWAIT);
        uint64_t now = now_ns();
        if (n <= 0)
            return; /* EAGAIN; ENOBUFS would be packets the kernel dropped: TCP sends again */
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n);
             h = NLMSG_NEXT(h, n)) {
            size_t at = NLMSG_ALIGN(sizeof(struct nfgenmsg)), len = NLMSG_PAYLOAD(h, 0);
            const uint8_t *p = NLMSG_DATA(h);
            if (h->nlmsg_type != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET))
                continue;
            while (at + NLA_HDRLEN <= len) {
                struct nlattr a;
                memcpy(&a, p + at, sizeof(a));
                if (a.nla_len < NLA_HDRLEN || at + a.nla_len > len)
                    break;
                if ((a.nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR &&
                    a.nla_len >= NLA_HDRLEN + sizeof(struct nfqnl_msg_packet_hdr)) {
                    struct nfqnl_msg_packet_hdr ph;
                    memcpy(&ph, p + at + NLA_HDRLEN, sizeof(ph));
                    if (D.tail - D.head == RING) { /* full: the oldest goes on early */
                        nfq_accept_upto(D.id[D.head % RING]);
                        D.head++;
                    }
                    D.id[D.tail % RING] = ntohl(ph.packet_id);
                    D.due[D.tail % RING] = now + D.delay_ns;
                    D.tail++;
                    atomic_fetch_add(&D.packets, 1);
                    break;
                }
                at += NLA_ALIGN(a.nla_len);
            }
        }
    }
}

static void *nfq_main(void *arg)
{
    static uint8_t buf[1 << 16];

    (void)arg;
    while (!atomic_load(&D.stop)) {
        uint64_t now = now_ns(), wait = 20000000u;
        struct pollfd pf = {.fd = D.fd, .events = POLLIN};
        struct timespec ts;

        nfq_release(now);
        if (D.head != D.tail)
            wait = D.due[D.head % RING] > now ? D.due[D.head % RING] - now : 0;
        ts.tv_sec = (time_t)(wait / 1000000000u);
        ts.tv_nsec = (long)(wait % 1000000000u);
        if (ppoll(&pf, 1, &ts, NULL) > 0)
            nfq_drain(buf, sizeof(buf));
    }
    return NULL;
}

static void nfq_rules(const char *act)
{
    for (int i = 0; i < D.nips; i++)
        for (int k = 0; k < 2; k++)
            sh(0,
               "iptables -w -t mangle %s OUTPUT %s %s/32 -j NFQUEUE --queue-num %u --queue-bypass",
               act, k ? "-s" : "-d", D.ips[i], QUEUE_NUM);
}

static int nfq_start(unsigned ms, char *why, size_t cap)
{
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
    struct nfqnl_msg_config_cmd cmd = {.command = NFQNL_CFG_CMD_BIND, .pf = htons(AF_INET)};
    struct nfqnl_msg_config_params prm = {.copy_range = htonl(0), .copy_mode = NFQNL_COPY_META};
    uint32_t maxlen = htonl(RING - 1);
    int sz = 32 << 20, one = 1, rc;
    uint8_t a[64];

    D.fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (D.fd < 0 || bind(D.fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        snprintf(why, cap, "netlink socket: %s", strerror(errno));
        goto out_close;
    }
    (void)setsockopt(D.fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz));
    (void)setsockopt(D.fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof(one));
    if ((rc = nfq_send(NFQNL_MSG_CONFIG, a, put_attr(a, 0, NFQA_CFG_CMD, &cmd, sizeof(cmd)), 1)) ||
        (rc = nfq_send(NFQNL_MSG_CONFIG, a, put_attr(a, 0, NFQA_CFG_PARAMS, &prm, sizeof(prm)),
                       1)) ||
        (rc = nfq_send(NFQNL_MSG_CONFIG, a,
                       put_attr(a, 0, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof(maxlen)), 1))) {
        snprintf(why, cap, "binding NFQUEUE %u: %s", QUEUE_NUM, strerror(-rc));
        goto out_close;
    }
    D.delay_ns = (uint64_t)ms * 1000000u;
    D.head = D.tail = 0;
    atomic_store(&D.stop, 0);
    if (pthread_create(&D.thread, NULL, nfq_main, NULL) != 0) {
        snprintf(why, cap, "no thread");
        goto out_close;
    }
    for (int i = 0; i < D.nips; i++)
        for (int k = 0; k < 2; k++)
            if (sh(1,
                   "iptables -w -t mangle -A OUTPUT %s %s/32 -j NFQUEUE --queue-num %u "
                   "--queue-bypass",
                   k ? "-s" : "-d", D.ips[i], QUEUE_NUM)) {
                snprintf(why, cap, "iptables refused the NFQUEUE rule");
                nfq_rules("-D");
                atomic_store(&D.stop, 1);
                pthread_join(D.thread, NULL);
                goto out_close;
            }
    return 0;

out_close:
    if (D.fd >= 0)
        close(D.fd);
    D.fd = -1;
    return -1;
}

/* ---- start / stop -------------------------------------------------------------------------- */

int netdelay_start(const char *const *ips, int n, unsigned ms, char *how, size_t cap)
{
    char why[200] = "";

    if (D.mode != OFF || n < 1 || n > MAX_IPS)
        return -1;
    D.nips = n;
    for (int i = 0; i < n; i++)
        snprintf(D.ips[i], sizeof(D.ips[i]), "%s", ips[i]);
    atomic_store(&D.packets, 0);
    if (netem_start(ms) == 0) {
        D.mode = NETEM;
        snprintf(how, cap, "tc netem (htb class on lo, u32 filters by address), %u ms", ms);
        return 0;
    }
    if (nfq_start(ms, why, sizeof(why)) == 0) {
        D.mode = NFQ;
        snprintf(how, cap,
                 "NFQUEUE delay line (this kernel has no sch_netem: 'tc qdisc add dev lo root "
                 "netem' is refused), %u ms",
                 ms);
        return 0;
    }
    fprintf(stderr, "netdelay: neither tc netem nor NFQUEUE: %s\n", why);
    return -1;
}

uint64_t netdelay_packets(void)
{
    return atomic_load(&D.packets);
}

void netdelay_stop(void)
{
    if (D.mode == NETEM)
        sh(0, "tc qdisc del dev lo root");
    if (D.mode == NFQ) {
        nfq_rules("-D");
        atomic_store(&D.stop, 1);
        pthread_join(D.thread, NULL);
        {
            static uint8_t buf[1 << 16];
            nfq_drain(buf, sizeof(buf)); /* queued before the rules went */
        }
        if (D.head != D.tail)
            nfq_accept_upto(D.id[(D.tail - 1) % RING]);
        close(D.fd);
        D.fd = -1;
    }
    D.mode = OFF;
}

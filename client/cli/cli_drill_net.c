/*
 * tessera CLI: the partition drill. It cuts one node off from its peers while clients still
 * reach it: every packet between the node's addresses and the other nodes' addresses is
 * dropped (iptables, both ways, in a chain of its own, TESSERA_DRILL, hooked into OUTPUT —
 * on one host every packet passes OUTPUT). Nodes send peer traffic from their own map address
 * (replication/repl.c), so a cut by address is a cut between nodes, not between the node and
 * its clients. The drill picks the primary of the PG the load writes next: cut off, it cannot
 * reach a write quorum and must acknowledge nothing; the operator's answer (fail over) moves
 * its PGs; healed and marked up, it must catch up — every acknowledged shard it is a replica of
 * is read from it alone at the end.
 *
 * The rules go into the netfilter of the node's host (the agent's `cut` and `heal`,
 * cli_agent.c): here in the embedded mode, where the CLI then needs root (CAP_NET_ADMIN) and
 * iptables, or on the node through --agent. The nodes need addresses of their own (127.0.1.x
 * works on loopback); anything else is refused before the drill creates its dataset.
 */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_drill.h"
#include "client_internal.h"
#include "ts_map.h"

#define CHAIN "TESSERA_DRILL"

/* The host part of "host:port" or "[v6]:port" into out; 0, or -1 when there is none. */
static int host_of(const char *addr, char *out, size_t cap)
{
    const char *colon = strrchr(addr, ':');
    size_t n = colon ? (size_t)(colon - addr) : 0;

    if (!n || n >= cap)
        return -1;
    if (addr[0] == '[' && n >= 2 && addr[n - 1] == ']')
        snprintf(out, cap, "%.*s", (int)(n - 2), addr + 1);
    else
        snprintf(out, cap, "%.*s", (int)n, addr);
    return 0;
}

/* Node i's hosts (its plain and TLS listeners'): how many (1 or 2). */
static int hosts_of(const struct ts_map *m, size_t i, char h[2][64])
{
    int n = 0;

    if (host_of(m->nodes[i].addr, h[n], sizeof(h[0])) == 0)
        n++;
    if (m->nodes[i].tls_addr[0] && host_of(m->nodes[i].tls_addr, h[n], sizeof(h[0])) == 0 &&
        (n == 0 || strcmp(h[0], h[n]) != 0))
        n++;
    return n;
}

int drill_partition_check(struct drill *d)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    char hi[2][64], hj[2][64];
    struct in_addr a;

    for (size_t i = 0; m && i < m->n; i++) {
        int ni = hosts_of(m, i, hi);
        for (int k = 0; k < ni; k++)
            if (inet_pton(AF_INET, hi[k], &a) != 1) {
                snprintf(d->x->local, sizeof(d->x->local),
                         "partition cuts nodes apart by IPv4 address; node %s's host '%s' is not "
                         "one",
                         m->nodes[i].id, hi[k]);
                return -1;
            }
        for (size_t j = i + 1; j < m->n; j++) {
            int nj = hosts_of(m, j, hj);
            for (int k = 0; k < ni; k++)
                for (int l = 0; l < nj; l++)
                    if (!strcmp(hi[k], hj[l])) {
                        snprintf(d->x->local, sizeof(d->x->local),
                                 "partition cuts a node off by address, but nodes %s and %s share "
                                 "host %s: give each node an address of its own in the map "
                                 "(127.0.1.x on one host; docs/operations.md)",
                                 m->nodes[i].id, m->nodes[j].id, hi[k]);
                        return -1;
                    }
        }
    }
    if (!d->x->agent && system("iptables -w -L OUTPUT -n >/dev/null 2>&1") != 0) {
        snprintf(d->x->local, sizeof(d->x->local),
                 "partition needs iptables and root (CAP_NET_ADMIN) on this host");
        return -1;
    }
    return 0;
}

/* Drops every packet between node i's hosts and the other nodes' hosts, both ways (the
 * agent on node i's host does it). */
static int cut(struct drill *d, int i)
{
    const struct ts_map *m = ts_client_map(d->x->c);
    char hi[2][64], hj[2][64], own[160] = "", peers[4096] = "", out[256];
    int ni = hosts_of(m, (size_t)i, hi), rules = 0, rc;

    for (int k = 0; k < ni; k++)
        snprintf(own + strlen(own), sizeof(own) - strlen(own), "%s%s", k ? "," : "", hi[k]);
    for (size_t j = 0; j < m->n; j++) {
        int nj = (int)j == i ? 0 : hosts_of(m, j, hj);
        for (int l = 0; l < nj; l++)
            snprintf(peers + strlen(peers), sizeof(peers) - strlen(peers), "%s%s",
                     peers[0] ? "," : "", hj[l]);
    }
    if (strlen(peers) + 1 >= sizeof(peers)) {
        snprintf(d->x->local, sizeof(d->x->local), "partition: too many peer addresses");
        return TS_EINVAL;
    }
    rc = drill_act(d, i, "cut", own, peers, out, sizeof(out));
    if (rc)
        return rc;
    sscanf(out, "rules %d", &rules);
    drill_note(d,
               "cut %s (%s) off from its %zu peers: %d DROP rules in iptables chain " CHAIN
               "; clients still reach it",
               m->nodes[i].id, own, m->n - 1, rules);
    return 0;
}

static void heal(struct drill *d, int i)
{
    char out[64];
    drill_act(d, i, "heal", NULL, NULL, out, sizeof(out));
}

int drill_partition(struct drill *d, double dur)
{
    int i = drill_primary_next(d), rc = drill_begin(d, i, "no node leads the next PG");

    if (!rc)
        rc = cut(d, i);
    if (rc)
        return rc;
    drill_load_for(d, 1.5); /* writes to its PGs cannot reach a quorum: detection */
    rc = drill_fail_over(d, i);
    if (!rc)
        drill_load_for(d, dur / 4); /* served by the others, the node still cut off */
    heal(d, i);
    drill_note(d, "healed: the rules removed");
    if (rc)
        return rc;
    rc = drill_mark_up(d, d->node);
    if (rc)
        return rc;
    drill_load_for(d, dur / 4);
    return 0; /* drill_finish reads every acknowledged shard from each core replica alone */
}

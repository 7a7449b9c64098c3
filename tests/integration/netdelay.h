/*
 * A network delay between failure domains for integration tests, in a network namespace of the
 * test's own (root): every packet to or from one of the given loopback addresses (the nodes of
 * the "remote" domains, 127.0.1.x) waits a fixed time before it goes on, so that a round trip
 * between such an address and any other takes twice that longer, while packets between other
 * addresses (the client and the nodes of its own domain) are not held at all.
 *
 * Two ways, the first the kernel allows:
 *  - tc netem: an htb root on lo with a class whose leaf is netem, u32 filters sending those
 *    packets to it;
 *  - NFQUEUE (kernels without sch_netem, CONFIG_NET_SCH_NETEM unset): iptables (mangle OUTPUT,
 *    --queue-bypass) queues those packets to a thread of this process, which hands each back
 *    to the kernel (a batch verdict: accept) once it has waited. Packets leave in the order
 *    they came, as through netem.
 */
#ifndef TS_NETDELAY_H
#define TS_NETDELAY_H

#include <stddef.h>
#include <stdint.h>

/* Starts the delay of ms milliseconds for packets to or from ips[0..n) ("127.0.1.1"); how[cap]
 * says which way it took ("tc netem" or "NFQUEUE delay line") and why. 0, or -1 with the
 * reason on stderr. One at a time. */
int netdelay_start(const char *const *ips, int n, unsigned ms, char *how, size_t cap);
/* Packets the NFQUEUE delay line held (0 under netem). */
uint64_t netdelay_packets(void);
/* Removes the delay; packets still held go on at once. No-op when none is on. */
void netdelay_stop(void);

#endif

/*
 * A fake tessera server for the client's unit tests (fake_server.c): the far end of a
 * socketpair whose near end is a libtessera handle. Replies are scripted (written before the
 * call that reads them) or written by a thread; the server may lie, so a client's parsing and
 * checks are tested without tesserad. Never proof of a server behaviour.
 */
#ifndef TS_FAKE_SERVER_H
#define TS_FAKE_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "client_internal.h"
#include "ts_test.h"

/* Reads / writes exactly n bytes (blocking); 0 or -1 on EOF or an error. */
int read_exact(int fd, void *buf, size_t n);
int write_exact(int fd, const void *buf, size_t n);
/* One request frame from the client; *payload is malloc'ed. 0 or -1. */
int fake_recv(int fd, struct ts_frame_hdr *h, uint8_t **payload);
/* A reply frame: w's payload, then tail (tlen bytes). */
void fake_send(int fd, uint8_t op, uint64_t id, const struct ts_wr *w, const void *tail,
               size_t tlen);
/* A refusal: status rc and a message. */
void fake_error(int fd, uint8_t op, uint64_t id, int rc, const char *msg);
void fake_hello(int fd, uint64_t id);
void fake_dataset_info(int fd, uint64_t id, const char *name, uint32_t chunk);
/* A MAP_GET reply of a single node: epoch 0, no nodes. */
void fake_no_map(int fd, uint64_t id);

/* How a READ reply should lie. */
enum lie { HONEST, LIE_LONG, LIE_SUM, LIE_CRC, LIE_SIZE };
/* A READ reply for [off, off+len) of shard (size bytes), pieces of chunk bytes. */
void fake_read_reply(int fd, uint64_t id, const uint8_t *shard, uint64_t size, uint32_t chunk,
                     uint64_t off, uint32_t len, enum lie lie);

/* The first request id after HELLO (1) and MAP_GET (2). */
#define ID0 3

/*
 * The reply to a read sent once more with flag VERIFY, written only once that request came
 * (as a server would: the client receives ahead, and a reply to a request it has not sent yet
 * is a protocol error). A thread reads the client's frames until the VERIFY one.
 */
struct verify_reply {
    int fd;
    uint8_t *buf;
    size_t len;
    pthread_t th;
};
void verify_reply_start(struct verify_reply *v, int fd, uint64_t id, const uint8_t *shard,
                        uint64_t size, uint32_t chunk, uint64_t off, uint32_t len, enum lie lie);
void verify_reply_join(struct verify_reply *v);

/*
 * A client over one end of a socketpair; the other end is *peer. HELLO and MAP_GET (no map:
 * a single node) are answered first. ops, when not NULL, replaces the TCP transport's table
 * (a wrapper around it).
 */
tessera_client *open_pair_ops(int *peer, int timeout_ms, const struct ts_transport_ops *ops);
tessera_client *open_pair(int *peer, int timeout_ms);
/* The same over a TCP connection on loopback (socket options that AF_UNIX ignores). */
tessera_client *open_tcp_pair_ops(int *peer, int timeout_ms, const struct ts_transport_ops *ops);
/* Reads one request frame the client sent and checks its opcode; returns its id. */
uint64_t expect_req(int fd, uint8_t op);

#endif

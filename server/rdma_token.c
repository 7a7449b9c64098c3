/*
 * RDMA admission tokens (server/rdma.h): RDMA itself authenticates nobody, so a session is
 * admitted only with a token that an authenticated TCP/TLS connection asked for. A token is
 * 16 random bytes, bound to the asking connection's role and identity, valid for
 * TSD_RDMA_TOKEN_TTL_MS and redeemable once.
 */
#include "rdma.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_common.h"

int tsd_rdma_tokens_init(struct tsd_rdma_tokens *tt)
{
    pthread_mutex_t *m = malloc(sizeof(*m));

    memset(tt, 0, sizeof(*tt));
    if (!m)
        return TS_ENOMEM;
    pthread_mutex_init(m, NULL);
    tt->lock = m;
    return 0;
}

void tsd_rdma_tokens_fini(struct tsd_rdma_tokens *tt)
{
    if (!tt->lock)
        return;
    pthread_mutex_destroy(tt->lock);
    free(tt->lock);
    OPENSSL_cleanse(tt->t, sizeof(tt->t));
    tt->lock = NULL;
}

int tsd_rdma_token_issue(struct tsd_rdma_tokens *tt, int role, const char *who, uint64_t now_ns,
                         uint8_t out[16])
{
    struct tsd_rdma_token *slot = NULL;

    if (RAND_bytes(out, 16) != 1)
        return TS_EIO;
    pthread_mutex_lock(tt->lock);
    /* A free or expired slot, else the one that expires first. */
    for (size_t i = 0; i < TSD_RDMA_TOKENS; i++) {
        struct tsd_rdma_token *t = &tt->t[i];
        if (t->expires_ns <= now_ns) {
            slot = t;
            break;
        }
        if (!slot || t->expires_ns < slot->expires_ns)
            slot = t;
    }
    memcpy(slot->tok, out, 16);
    slot->expires_ns = now_ns + (uint64_t)TSD_RDMA_TOKEN_TTL_MS * 1000000u;
    slot->role = role;
    snprintf(slot->who, sizeof(slot->who), "%s", who ? who : "");
    pthread_mutex_unlock(tt->lock);
    return 0;
}

int tsd_rdma_token_redeem(struct tsd_rdma_tokens *tt, const uint8_t tok[16], uint64_t now_ns,
                          int *role, char *who, size_t cap, const char **why)
{
    int rc = TS_EPERM;

    *why = "unknown token (never issued, or already used)";
    pthread_mutex_lock(tt->lock);
    for (size_t i = 0; i < TSD_RDMA_TOKENS; i++) {
        struct tsd_rdma_token *t = &tt->t[i];
        if (!t->expires_ns || CRYPTO_memcmp(t->tok, tok, 16) != 0)
            continue;
        if (t->expires_ns <= now_ns) {
            *why = "expired token";
        } else {
            *role = t->role;
            snprintf(who, cap, "%s", t->who);
            *why = NULL;
            rc = 0;
        }
        /* Used or expired: gone either way (a replay finds nothing). */
        OPENSSL_cleanse(t, sizeof(*t));
        break;
    }
    pthread_mutex_unlock(tt->lock);
    return rc;
}

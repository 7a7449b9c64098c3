/* TLS 1.3 for tesserad: the server context, client verification, roles from certificates. */
#include "server_internal.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static void log_ssl_errors(const char *what)
{
    unsigned long e;
    char buf[256];

    while ((e = ERR_get_error()) != 0) {
        ERR_error_string_n(e, buf, sizeof(buf));
        TS_ERROR(FAC, TS_ETLS, "%s: %s", what, buf);
    }
}

int tsd_tls_init(struct tsd_server *s)
{
    const struct tsd_config *c = s->cfg;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());

    if (!ctx)
        goto out_err;
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_set_ciphersuites(ctx, c->tls_ciphersuites) != 1) {
        TS_ERROR(FAC, TS_ECONFIG, "tls.ciphersuites '%s' is not usable", c->tls_ciphersuites);
        goto out_free;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, c->tls_cert) != 1) {
        log_ssl_errors(c->tls_cert);
        goto out_free;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, c->tls_key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        log_ssl_errors(c->tls_key);
        goto out_free;
    }
    if (c->tls_ca[0]) {
        if (SSL_CTX_load_verify_locations(ctx, c->tls_ca, NULL) != 1) {
            log_ssl_errors(c->tls_ca);
            goto out_free;
        }
        /* Ask for a certificate; without require_client_cert one is optional (and the
         * connection gets anonymous_role), but a presented certificate must verify. */
        SSL_CTX_set_verify(ctx,
                           SSL_VERIFY_PEER |
                               (c->tls_require_client_cert ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
                           NULL);
        SSL_CTX_set_verify_depth(ctx, 4);
    }
    s->ssl_ctx = ctx;
    TS_INFO(FAC, "TLS 1.3 ready: cert %s, client certificates %s", c->tls_cert,
            c->tls_require_client_cert ? "required"
            : c->tls_ca[0]             ? "optional"
                                       : "not asked for");
    return 0;

out_free:
    SSL_CTX_free(ctx);
out_err:
    log_ssl_errors("TLS setup");
    return TS_ETLS;
}

void tsd_tls_fini(struct tsd_server *s)
{
    SSL_CTX_free(s->ssl_ctx);
    s->ssl_ctx = NULL;
}

/* The CN of a certificate's subject, "" if none or not a valid node name. */
static void subject_cn(X509 *cert, char *out, size_t cap)
{
    X509_NAME *nm = X509_get_subject_name(cert);
    int idx = X509_NAME_get_index_by_NID(nm, NID_commonName, -1);
    const char *cn;

    out[0] = '\0';
    if (idx < 0)
        return;
    cn =
        (const char *)ASN1_STRING_get0_data(X509_NAME_ENTRY_get_data(X509_NAME_get_entry(nm, idx)));
    if (cn && strlen(cn) < cap && ts_name_valid(cn))
        snprintf(out, cap, "%s", cn);
}

/* The role a certificate's OU entries give: the highest of reader|writer|admin, or node (which
 * must stand alone: a certificate naming node and another role gets none). */
static int cert_role(X509 *cert)
{
    X509_NAME *nm = X509_get_subject_name(cert);
    int role = TS_ROLE_NONE, node = 0, idx = -1;

    while ((idx = X509_NAME_get_index_by_NID(nm, NID_organizationalUnitName, idx)) >= 0) {
        ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(nm, idx));
        int r = ts_role_parse((const char *)ASN1_STRING_get0_data(d));
        if (r == TS_ROLE_NODE)
            node = 1;
        else if (r > role)
            role = r;
    }
    if (node)
        return role == TS_ROLE_NONE ? TS_ROLE_NODE : TS_ROLE_NONE;
    return role;
}

int tsd_tls_peer_role(SSL *ssl, struct tsd_conn *c, int anon_role)
{
    X509 *cert = SSL_get1_peer_certificate(ssl);
    int role;

    c->subject[0] = c->node_id[0] = '\0';
    c->anonymous = 0;
    if (!cert) {
        c->anonymous = 1;
        return anon_role;
    }
    if (SSL_get_verify_result(ssl) != X509_V_OK) {
        X509_free(cert);
        return TS_ROLE_NONE;
    }
    X509_NAME_oneline(X509_get_subject_name(cert), c->subject, (int)sizeof(c->subject));
    role = cert_role(cert);
    if (role == TS_ROLE_NODE) {
        /* A node is who its certificate's CN says, and the name must also be a subjectAltName
         * (peers check the name when they connect to it). */
        subject_cn(cert, c->node_id, sizeof(c->node_id));
        if (!c->node_id[0] || X509_check_host(cert, c->node_id, 0, 0, NULL) != 1) {
            TS_WARN(FAC, TS_EPERM,
                    "node certificate %s: its CN must be the node id and a DNS subjectAltName",
                    c->subject);
            c->node_id[0] = '\0';
            role = TS_ROLE_NONE;
        }
    } else if (role == TS_ROLE_NONE) {
        TS_WARN(FAC, TS_EPERM, "certificate %s names no role (OU=reader|writer|admin|node)",
                c->subject);
    }
    X509_free(cert);
    return role;
}

int tsd_tls_node_cert_check(const char *path, const char *node_id, char *why, size_t cap)
{
    FILE *f = fopen(path, "r");
    X509 *cert = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    char cn[64];
    int rc = 0;

    if (f)
        fclose(f);
    if (!cert) {
        snprintf(why, cap, "cannot read a certificate from %s", path);
        ERR_clear_error();
        return TS_ECONFIG;
    }
    subject_cn(cert, cn, sizeof(cn));
    if (cert_role(cert) != TS_ROLE_NODE) {
        snprintf(why, cap,
                 "%s is not a node certificate (its subject needs OU=node and no other "
                 "role)",
                 path);
        rc = TS_ECONFIG;
    } else if (strcmp(cn, node_id) || X509_check_host(cert, node_id, 0, 0, NULL) != 1) {
        snprintf(why, cap,
                 "%s is the certificate of node '%s', not of '%s' (CN and a DNS "
                 "subjectAltName must be the node id)",
                 path, cn[0] ? cn : "?", node_id);
        rc = TS_ECONFIG;
    }
    X509_free(cert);
    return rc;
}

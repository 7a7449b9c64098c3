/* TLS 1.3 for tesserad: the server context, client verification, roles from certificates. */
#include "server_internal.h"

#include <openssl/err.h>
#include <openssl/x509.h>
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

int tsd_tls_peer_role(SSL *ssl, int anon_role, char *subject, size_t cap)
{
    X509 *cert = SSL_get1_peer_certificate(ssl);
    X509_NAME *nm;
    int role = TS_ROLE_NONE, idx = -1;

    subject[0] = '\0';
    if (!cert)
        return anon_role;
    if (SSL_get_verify_result(ssl) != X509_V_OK) {
        X509_free(cert);
        return TS_ROLE_NONE;
    }
    nm = X509_get_subject_name(cert);
    X509_NAME_oneline(nm, subject, (int)cap);
    /* The highest role among the certificate's OU entries. */
    while ((idx = X509_NAME_get_index_by_NID(nm, NID_organizationalUnitName, idx)) >= 0) {
        ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(nm, idx));
        const char *ou = (const char *)ASN1_STRING_get0_data(d);
        int r = ts_role_parse(ou);
        if (!strcasecmp(ou, "node"))
            r = TS_ROLE_ADMIN; /* node-to-node traffic (replication) */
        if (r > role)
            role = r;
    }
    X509_free(cert);
    if (role == TS_ROLE_NONE)
        TS_WARN(FAC, TS_EPERM, "certificate %s names no role (OU=reader|writer|admin)", subject);
    return role;
}

/* Shared helpers for the cmocka test binaries: temp dirs, deterministic data. */
#ifndef TS_TEST_H
#define TS_TEST_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

/* Makes a fresh directory under $TMPDIR (or /tmp); returns a malloc'ed path. */
char *ts_test_tmpdir(const char *tag);
/* Removes a directory tree (best effort) and frees the path. */
void ts_test_rmtree(char *path);
/* Fills buf with bytes that depend on (seed, offset): any range can be re-derived. */
void ts_test_fill(void *buf, size_t len, uint64_t seed, uint64_t offset);
/* Flips byte `at` of the file at path (XOR 0x10): damage behind a store's back; fails the test
 * when the file cannot be read or written there. Twice puts it back. */
void ts_test_flip_file_byte(const char *path, uint64_t at);
/* Installs a stderr logger at the level named by $TS_TEST_LOG (default: error). */
void ts_test_log_init(void);

#endif

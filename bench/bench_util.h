/*
 * Helpers shared by the benchmark tools (tsload.c, tsplanread.c): dying with a message, sizes
 * with K/M/G suffixes, and the splitmix64 mixer that generates their data sets. Define
 * BENCH_TOOL (the tool's name, for messages) before including it.
 */
#ifndef TS_BENCH_UTIL_H
#define TS_BENCH_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, BENCH_TOOL ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* "64", "4K", "1.5M", "2G" (powers of 1024) in bytes; dies on anything else. */
static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);

    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024;
        break;
    case 'm':
    case 'M':
        v *= 1024 * 1024;
        break;
    case 'g':
    case 'G':
        v *= 1024.0 * 1024 * 1024;
        break;
    case '\0':
        break;
    default:
        die("bad size '%s'", s);
    }
    if (v < 0)
        die("bad size '%s'", s);
    return (uint64_t)v;
}

/* splitmix64's output function. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#endif

/*
 * Plans: which units (shards or records) of a dataset one rank of a training job reads in an
 * epoch, and in which order; docs/client.md "Plans".
 *
 * A plan is pure arithmetic: it needs no connection, allocates nothing per unit (a dataset of
 * 2^40 units costs what one of 10 does), and gives the same answer on every machine and build
 * for the same options. Unit k of a rank is computed on demand (tessera_plan_unit), so a reader
 * can start anywhere.
 *
 * The epoch's order is the units 0..N-1, shuffled (or not) by a keyed permutation of (seed,
 * epoch); the ranks then split that order:
 *   assignment  CONTIGUOUS: rank r reads one block of it (skip/take splitting);
 *               STRIDED: rank r reads positions r, r+W, r+2W, ... (tf.data's shard(W, r) and
 *               PyTorch's DistributedSampler(shuffle=False) order).
 *   remainder   UNEVEN: an exact cover, ranks differ by at most one unit;
 *               DROP: every rank reads floor(N/W) units, the last N mod W positions are left out;
 *               PAD: every rank reads ceil(N/W) units, the order is extended by repeating it from
 *               its start (DistributedSampler's padding).
 *
 * Resume: a plan position is what every rank of the job has consumed of its plan
 * (tessera_plan_state, from the counts of all ranks). A plan resumed from it
 * (tessera_plan_resume) yields exactly the units not yet read: at the same world size each rank
 * continues its own list; at another world size the remaining units are redistributed over the
 * new ranks (by the same assignment, as an exact cover), none lost, none repeated. States chain:
 * a resumed plan can be saved and resumed again.
 */
#ifndef TESSERA_PLAN_H
#define TESSERA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum tessera_assign { TESSERA_ASSIGN_CONTIGUOUS = 0, TESSERA_ASSIGN_STRIDED = 1 };
enum tessera_remainder {
    TESSERA_REMAINDER_UNEVEN = 0,
    TESSERA_REMAINDER_DROP = 1,
    TESSERA_REMAINDER_PAD = 2,
};
enum tessera_shuffle {
    TESSERA_SHUFFLE_NONE = 0,   /* the units in their order */
    TESSERA_SHUFFLE_GLOBAL = 1, /* a permutation of all units */
    TESSERA_SHUFFLE_WINDOW = 2, /* groups (e.g. the shards) shuffled, then the units shuffled
                                   within each window of `window` consecutive groups: a reader
                                   touches one window's groups at a time (bounded memory) */
    TESSERA_SHUFFLE_GIVEN = 3,  /* the caller's order (e.g. torch.randperm's): `order` */
};

struct tessera_plan_opts {
    uint64_t units;              /* N: units in the dataset */
    const uint64_t *group_sizes; /* WINDOW: units per group, in unit order (e.g. records per
                                    shard), summing to units; NULL: groups of one unit */
    size_t ngroups;
    uint64_t seed, epoch;
    uint32_t rank, world;  /* 0 <= rank < world */
    int assign;            /* enum tessera_assign */
    int remainder;         /* enum tessera_remainder */
    int shuffle;           /* enum tessera_shuffle */
    uint32_t window;       /* WINDOW: groups per window (>= 1) */
    const uint64_t *order; /* GIVEN: the epoch's order, a permutation of [0, units) (copied;
                              memory per unit, unlike the other orders) */
};

typedef struct tessera_plan tessera_plan;

/* Defaults: no units, world 1, CONTIGUOUS, UNEVEN, no shuffle, window 16. */
void tessera_plan_opts_init(struct tessera_plan_opts *o);
/* TS_EINVAL for options that do not make a plan (rank >= world, group sizes not summing to
 * units, unknown modes, ...); TS_ENOMEM. */
int tessera_plan_new(tessera_plan **out, const struct tessera_plan_opts *o);
void tessera_plan_free(tessera_plan *p); /* NULL ok */
/* How many units this rank reads. */
uint64_t tessera_plan_len(const tessera_plan *p);
/* The k-th unit (0 <= k < len) this rank reads: a unit index in [0, N). TS_ERANGE past len. */
int tessera_plan_unit(const tessera_plan *p, uint64_t k, uint64_t *unit);

/* The job's position: consumed[i] units of its plan read by rank i, for every rank of this
 * plan's world (world must equal the plan's). *state (malloc'ed, *len bytes) is opaque,
 * portable, checksummed, and includes the positions of earlier resumes. */
int tessera_plan_state(const tessera_plan *p, const uint64_t *consumed, uint32_t world,
                       void **state, size_t *len);
/* A plan for o->rank of o->world that reads exactly what the saved job had not read. The
 * other options must be those the state was saved with (TS_EINVAL otherwise, as for a
 * damaged state). */
int tessera_plan_resume(tessera_plan **out, const struct tessera_plan_opts *o, const void *state,
                        size_t len);

#ifdef __cplusplus
}
#endif
#endif
